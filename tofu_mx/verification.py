"""Prove a multi-device graph correct: run it and its single-device reference on the same
seeded inputs, forward and backward, and compare every output, gradient and auxiliary state.

Each tensor is judged in one of two ways.

- **Default**: the candidate equals the reference within the tolerance, elementwise
  ``|candidate - reference| <= atol + rtol * |reference|`` (``numpy.allclose``).
- **Oracle** (``oracle="float64"``): the reference also runs in float64 on the same values
  (the float32 ones cast up: all runs see identical numbers); that run is the oracle. A float32
  reference is itself off the oracle by its rounding error, which in an ill-conditioned graph
  (BatchNorm over a few values, sums that cancel) can be far above the tolerance, and a
  candidate doing the same sums in another order (split over devices, then added) is off by
  an error of the same size, yet right. So the candidate is judged by its error against the
  oracle, next to the error float32 itself makes on the same tensor. Every element must have::

      |candidate - oracle| <= max(ORACLE_FACTOR * E, atol + rtol * |oracle|)

  where ``E`` is float32's rounding error on the tensor: the largest ``max |r - oracle|``
  over the reference run ``r`` and ``ROUNDING_RUNS`` more runs of the reference on the
  inputs moved by one unit in the last place (up or down at random per element; inputs read
  as indices are not moved). The allowance is never below the default tolerance, and where
  the reference is exact (a graph wholly in float64 is its own oracle) it is that tolerance.
  ``E`` is measured, not chosen: it is what the single-device implementation does on inputs
  float32 cannot tell apart. One run is not enough: in a chaotic graph the error is a random
  projection of the roundings, and one run's can be many times smaller than another's (30
  times, on MobileNetV2 at 32 px); the largest of four is a steadier measure.
  ``ORACLE_FACTOR`` leaves room for the candidate's own extra roundings (partial sums added
  across devices) and for that spread. A wrong graph is off by the size of the values
  themselves. The rule cannot see a bug smaller than float32's own error on a tensor, and
  where that error is a sizeable part of the values (``NOISE_LEVEL``) float32 computes the
  tensor to no significant digit: a failure there is reported as such, and only a float64
  run of the graph can judge it. Where the reference is not finite but the oracle is (or the
  reverse), ``E`` measures nothing: the candidate must match the oracle or the reference
  within the tolerance there.

A graph wholly in float64 is its own oracle, and a chaotic one (BatchNorm over a few values,
deep stacks at small sizes) moves by more than the tolerance when its inputs move by one ulp.
So where a float64 graph's default comparison fails, the reference is also run on inputs one
ulp away and each differing tensor is judged again by the oracle rule, ``E`` being how far the
reference itself moved: the tensors that then pass are named in the report's ``sensitive``,
and its ``diagnosis`` says the graph is chaotic at this size. A wrong graph is still off by the
size of the values.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import mxnet as mx
import numpy as np

from nnvm_passes.exporter import export_symbol
from nnvm_passes.importer import check_symbol, import_symbol
from nnvm_passes.ir import Graph
from nnvm_passes.transforms import cast_floats, disable_dropout
from tofu_mx import arguments
from tofu_mx.devices import (check_available, check_contexts, no_subgraph_backend,
                             resolve_group2ctx, warn_if_mkldnn_across_cpus)
from tofu_mx.errors import (BindError, ContextError, InvalidArgumentError, TofuError,
                            VerificationError)
from tofu_mx.tdl.annotate import import_graph
from tofu_mx.search.plan import lower_graph
from tofu_mx.tdl.registry import facts
from tofu_mx.values import index_range, random_inputs

#: Oracle mode: how many times float32's own rounding error on a tensor (see the module
#: docstring) the candidate may be off the float64 oracle: room for the candidate's extra
#: roundings and for the spread of a maximum of random errors. Split over 2 or 4 devices,
#: ResNet-18's candidate error is within 1.6 times float32's, MobileNetV2's (at 32 px) within
#: 2.5 times except in tensors float32 computes to no digit (``NOISE_LEVEL``);
#: tests/tofu_mx/test_verify_oracle.py checks the margin. A wrong graph's is thousands of times.
ORACLE_FACTOR = 4.0
#: Oracle mode: runs of the reference on inputs one ulp away, besides the reference itself.
ROUNDING_RUNS = 3
ORACLES = ("float64",)
#: Oracle mode: float rounding's error on a tensor at or above this fraction of its largest
#: value leaves it under one significant digit: a difference there is no evidence of a bug.
NOISE_LEVEL = 0.1


@dataclass(frozen=True)
class TensorComparison:
    """How one tensor of the candidate compares with what it should be: the reference's
    (default mode) or the float64 oracle's (oracle mode; see the module docstring)."""

    name: str            # "output softmax_output", "grad fc1_weight", "aux bn_moving_mean"
    shape: tuple[int, ...]
    max_abs_err: float   # max |cand - expected|, expected: the reference (default) or oracle
    max_rel_err: float   # max |cand - expected| / max(|expected|, atol)
    violation: float     # max over elements of |cand - expected| / allowance; <= 1: passes.
    #                      allowance: atol + rtol*|ref| (default); max(ORACLE_FACTOR *
    #                      rounding_abs_err, atol + rtol*|oracle|) (oracle mode)
    worst_index: tuple[int, ...] = ()
    reference_value: float = 0.0
    candidate_value: float = 0.0
    note: str = ""
    reference_abs_err: float | None = None   # oracle mode: max |reference - oracle|
    rounding_abs_err: float | None = None    # oracle mode: float32's error E (module doc)
    rounding_rel_err: float | None = None    # oracle mode: E / max |oracle|
    oracle_value: float | None = None        # oracle mode: the oracle at worst_index

    @property
    def ok(self) -> bool:
        return self.violation <= 1.0

    def describe(self) -> str:
        if self.note:
            return f"{self.name}: {self.note}"
        if self.reference_abs_err is not None:
            return (f"{self.name}: max abs err against the oracle {self.max_abs_err:.3g} "
                    f"(the reference's {self.reference_abs_err:.3g}, float rounding's "
                    f"{self.rounding_abs_err:.3g}, {self.rounding_rel_err:.2%} of its "
                    f"largest value), {self.violation:.3g} times its "
                    f"allowance, worst at {self.worst_index} (oracle "
                    f"{self.oracle_value:.6g}, reference {self.reference_value:.6g}, candidate "
                    f"{self.candidate_value:.6g})")
        return (f"{self.name}: max abs err {self.max_abs_err:.3g}, max rel err "
                f"{self.max_rel_err:.3g}, worst at {self.worst_index} (reference "
                f"{self.reference_value:.6g}, candidate {self.candidate_value:.6g})")


@dataclass(frozen=True)
class VerificationReport:
    """Every comparison ``verify`` made, with the tolerances it used. ``oracle`` is the
    oracle's dtype (``None``: judged against the reference). ``diagnosis``, after a failure,
    says what was measured about rounding: in the default mode, for a graph not in float64,
    whether the reference's own error against a float64 run is outside the tolerance on the
    differing tensors, and what oracle mode concludes; in oracle mode, which differing
    tensors float rounding leaves without a significant digit."""

    comparisons: tuple[TensorComparison, ...]
    rtol: float
    atol: float
    seed: int
    devices: tuple[str, ...]
    oracle: str | None = None
    diagnosis: str = ""
    #: a float64 graph's tensors that differ from the reference by more than the tolerance
    #: but within what the reference itself moves on inputs one ulp away (see ``diagnosis``)
    sensitive: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.comparisons)

    @property
    def failures(self) -> list[TensorComparison]:
        return [c for c in self.comparisons if not c.ok]

    @property
    def worst(self) -> TensorComparison:
        return max(self.comparisons, key=lambda c: (c.violation, c.name))

    def __getitem__(self, name: str) -> TensorComparison:
        for c in self.comparisons:
            if c.name == name:
                return c
        raise KeyError(name)

    def __str__(self) -> str:
        width = max([len(c.name) for c in self.comparisons] + [6])
        if self.oracle is None:
            lines = [f"{'tensor':<{width}}  {'shape':<20} {'max abs err':>11} "
                     f"{'max rel err':>11}  ok"]
            lines += [f"{c.name:<{width}}  {str(c.shape):<20} {c.max_abs_err:>11.3g} "
                      f"{c.max_rel_err:>11.3g}  {'yes' if c.ok else 'NO'}"
                      for c in self.comparisons]
            rule = ""
        else:
            lines = [f"{'tensor':<{width}}  {'shape':<20} {'cand-oracle':>11} "
                     f"{'ref-oracle':>11} {'rounding':>9} {'/allowance':>10}  ok"]
            lines += [f"{c.name:<{width}}  {str(c.shape):<20} {c.max_abs_err:>11.3g} "
                      f"{_or_nan(c.reference_abs_err):>11.3g} "
                      f"{_or_nan(c.rounding_abs_err):>9.3g} {c.violation:>10.3g}  "
                      f"{'yes' if c.ok else 'NO'}" for c in self.comparisons]
            rule = (f" against the {self.oracle} oracle (|cand - oracle| <= max("
                    f"{ORACLE_FACTOR:g} * rounding, atol + rtol*|oracle|))")
        lines.append(f"{len(self.comparisons)} tensors on {', '.join(self.devices)}{rule}, "
                     f"rtol={self.rtol:g} atol={self.atol:g} seed={self.seed}: "
                     f"{'all agree' if self.ok else f'{len(self.failures)} differ'}")
        if self.diagnosis:
            lines.append(self.diagnosis)
        return "\n".join(lines)


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


# --- comparing arrays -------------------------------------------------------------------------

def _abs_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| elementwise in float64; 0 where equal (the same infinity too) or both NaN,
    inf where only one is NaN."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(np.subtract(a, b, dtype=np.float64))
    if np.isfinite(diff).all():
        return diff
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    return np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))


def _magnitude(a: np.ndarray) -> np.ndarray:
    """|a| where finite, else 0: an infinite value gives no relative allowance."""
    magnitude = np.abs(a, dtype=np.float64)
    return magnitude if np.isfinite(magnitude).all() else np.where(np.isfinite(a), magnitude, 0)


def _ratio(err: np.ndarray, allowance: np.ndarray) -> np.ndarray:
    """err / allowance, 0 where err is 0 (a zero tolerance still accepts equality)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = err / allowance
    return ratio if (np.min(allowance) > 0) else np.where(err == 0, 0.0, ratio)


def _finite_max(a: np.ndarray) -> float:
    finite = np.isfinite(a)
    return float(a.max()) if finite.all() else float(a[finite].max()) if finite.any() else 0.0


def _shape_note(name: str, expected: np.ndarray, got: np.ndarray | None
                ) -> TensorComparison | None:
    if got is not None and expected.shape == got.shape:
        return None
    return TensorComparison(name, expected.shape, np.inf, np.inf, np.inf, note=(
        "the candidate computes no such tensor, or not all its shards" if got is None else
        f"shape {got.shape} where the reference has {expected.shape}"))


def _compare(name: str, ref: np.ndarray, got: np.ndarray | None, rtol: float,
             atol: float) -> TensorComparison:
    """Default mode: ``|got - ref| <= atol + rtol * |ref|`` elementwise."""
    mismatch = _shape_note(name, ref, got)
    if mismatch is not None:
        return mismatch
    if ref.size == 0:
        return TensorComparison(name, ref.shape, 0.0, 0.0, 0.0)
    ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
    diff = _abs_diff(got64, ref64)
    violation = _ratio(diff, atol + rtol * _magnitude(ref64))
    worst = np.unravel_index(int(np.argmax(violation)), ref.shape)
    return TensorComparison(
        name, ref.shape, float(diff.max()),
        float(_ratio(diff, np.maximum(_magnitude(ref64), atol)).max()), float(violation.max()),
        tuple(int(i) for i in worst), float(ref64[worst]), float(got64[worst]))


def _compare_to_oracle(name: str, truth: np.ndarray, refs: list[np.ndarray],
                       got: np.ndarray | None, rtol: float, atol: float) -> TensorComparison:
    """Oracle mode (the module docstring's rule): ``refs`` are the reference's run and the
    runs on inputs one ulp away."""
    mismatch = _shape_note(name, refs[0], got)
    if mismatch is not None:
        return mismatch
    if got.size == 0:
        return TensorComparison(name, got.shape, 0.0, 0.0, 0.0, reference_abs_err=0.0,
                                rounding_abs_err=0.0, rounding_rel_err=0.0)
    o, c, runs = truth, got, refs
    cand_err, errs = _abs_diff(c, o), [_abs_diff(r, o) for r in runs]
    rounding = max(_finite_max(e) for e in errs)
    top = _finite_max(np.abs(o))
    tolerance = atol + rtol * _magnitude(o)
    violation = _ratio(cand_err, np.maximum(ORACLE_FACTOR * rounding, tolerance))
    measured = np.isfinite(errs[0])
    if not measured.all():   # no rounding measure there: the oracle or the reference, tightly
        either = np.minimum(_ratio(cand_err, tolerance),
                            _ratio(_abs_diff(c, runs[0]), atol + rtol * _magnitude(runs[0])))
        violation = np.where(measured, violation, either)
    worst = np.unravel_index(int(np.argmax(violation)), got.shape)
    return TensorComparison(
        name, got.shape, float(cand_err.max()),
        float(_ratio(cand_err, np.maximum(_magnitude(o), atol)).max()), float(violation.max()),
        tuple(int(i) for i in worst), float(runs[0][worst]), float(c[worst]),
        reference_abs_err=float(errs[0].max()), rounding_abs_err=rounding,
        rounding_rel_err=rounding / top if top else float(rounding > 0) * np.inf,
        oracle_value=float(o[worst]))


def _judge(expected: dict, got: dict, truth: dict, nudged: list[dict], rtol: float,
           atol: float) -> tuple[TensorComparison, ...]:
    return tuple(_compare_to_oracle(name, truth[name], [ref] + [r[name] for r in nudged],
                                    got.get(name), rtol, atol) for name, ref in expected.items())


# --- arguments --------------------------------------------------------------------------------

_SAME_INTERFACE = ("verify() feeds both the same named arrays, so both symbols need the same "
                   "inputs (names and shapes) and outputs.")


def _check_oracle(oracle: Any) -> str | None:
    if oracle is None or (isinstance(oracle, str) and oracle in ORACLES):
        return oracle
    raise InvalidArgumentError(
        f"oracle must be None or one of {', '.join(map(repr, ORACLES))}, got {oracle!r}: the "
        f"oracle runs the reference in a wider float type than the graph's, and float64 is "
        f"the widest MXNet has; e.g. oracle='float64'")


def _unpack_candidate(candidate: Any, group2ctx: Mapping[str, Any]):
    if isinstance(candidate, tuple) and len(candidate) == 2:
        candidate, group2ctx = candidate[0], {**candidate[1], **group2ctx}
    elif hasattr(candidate, "symbol") and hasattr(candidate, "group2ctx"):
        candidate, group2ctx = candidate.symbol, {**candidate.group2ctx, **group2ctx}
    return check_symbol(candidate, "candidate"), group2ctx


def _check_input_names(reference: mx.sym.Symbol, candidate: mx.sym.Symbol) -> None:
    ref = reference.list_arguments() + reference.list_auxiliary_states()
    cand = candidate.list_arguments() + candidate.list_auxiliary_states()
    missing = [n for n in ref if n not in cand]
    extra = [n for n in cand if n not in ref]
    if missing or extra:
        raise InvalidArgumentError(f"the candidate's inputs differ from the reference's: "
                                   f"missing {missing}, extra {extra}. {_SAME_INTERFACE}")


def _check_shapes(ref: Graph, cand: Graph) -> None:
    cand_vars = {n.name: n.outputs[0].shape for n in cand.variables()}
    reshaped = [f"{n.name} {cand_vars[n.name]} vs {n.outputs[0].shape}" for n in ref.variables()
                if cand_vars[n.name] != n.outputs[0].shape]
    ref_out = [t.shape for t in ref.output_infos]
    cand_out = [t.shape for t in cand.output_infos]
    if reshaped or ref_out != cand_out:
        raise InvalidArgumentError(
            f"the candidate's shapes differ from the reference's: inputs {reshaped}, output "
            f"shapes {cand_out} vs {ref_out}. {_SAME_INTERFACE}")


def _listed(items: list[str], limit: int = 5) -> str:
    return "; ".join(items[:limit]) + (f"; ... ({len(items) - limit} more)"
                                       if len(items) > limit else "")


def _graph_differences(theirs: Graph, ours: Graph) -> list[str]:
    """How the graph a partition was made from differs from the reference's (imported with
    verify's shapes and dtypes): inputs, their shapes and dtypes, operators, output shapes."""
    a = {n.name: n.outputs[0] for n in theirs.variables()}
    b = {n.name: n.outputs[0] for n in ours.variables()}
    out = [f"input {n!r} is not in the partition" for n in b if n not in a]
    out += [f"the partition has input {n!r}, the reference does not" for n in a if n not in b]
    out += [f"input {n!r} is {a[n].shape} {a[n].dtype} in the partition, {b[n].shape} "
            f"{b[n].dtype} here" for n in b if n in a and a[n] != b[n]]

    mine, yours = _operators(theirs), _operators(ours)
    if not out and mine != yours:
        first = next((i for i, (x, y) in enumerate(zip(mine, yours)) if x != y),
                     min(len(mine), len(yours)))

        def show(ops: list[tuple]) -> str:
            if first >= len(ops):
                return "nothing"
            name, op, params, inputs = ops[first]
            return f"{name!r} {op}({params}) reading {[i for i, _ in inputs]}"
        out.append(f"the operators differ ({len(mine)} in the partition's graph, {len(yours)} "
                   f"in the reference); first: {show(mine)} in the partition, {show(yours)} "
                   f"in the reference")
    outputs = [t.shape for t in theirs.output_infos], [t.shape for t in ours.output_infos]
    if not out and outputs[0] != outputs[1]:
        out.append(f"output shapes {outputs[0]} in the partition, {outputs[1]} here")
    return out


def _operators(graph: Graph) -> list[tuple]:
    """Each operator as (name, op, parameters, inputs by producer name and output index)."""
    return [(n.name, n.op, n.params, tuple((graph.nodes[e.node].name, e.index)
                                           for e in n.inputs)) for n in graph.operators()]


def _check_partition(partitioned: Any, reference: mx.sym.Symbol, ref_graph: Graph,
                     ctx: list[mx.Context], group2ctx: Mapping[str, Any],
                     shapes: Mapping[str, Any]) -> None:
    """A PartitionedSymbol runs on the reference's inputs split into its shards and on the
    devices it was partitioned for: both must be the ones verify() was given."""
    made_for = getattr(partitioned, "graph", None)
    problems = [] if made_for is None else _graph_differences(made_for, ref_graph)
    if problems:     # partition() searches and rewrites the lowered graph
        plan = getattr(partitioned, "plan", None)
        lowered = lower_graph(ref_graph, len(partitioned.contexts),
                              keep=getattr(plan, "unlowered", ()),
                              interleave=bool(made_for.layouts))
        if lowered is not ref_graph:     # what the partition searched: said against it
            problems = _graph_differences(made_for, lowered)
    theirs = getattr(partitioned, "reference", None)
    if not problems and theirs is not None and theirs.list_outputs() != reference.list_outputs():
        problems.append(f"outputs {theirs.list_outputs()} in the partition, "
                        f"{reference.list_outputs()} in the reference")
    if problems:
        given = ", ".join(f"{k}={tuple(v) if isinstance(v, list) else v}"
                          for k, v in shapes.items())
        raise InvalidArgumentError(
            f"the PartitionedSymbol was made for other inputs than the reference and shapes "
            f"given to verify(): {_listed(problems)}. verify() splits the reference's inputs "
            f"into the partition's shards, so both must come from the same graph at the same "
            f"shapes: partition this reference with these shapes (tofu_mx.partition("
            f"reference, ctx, {given})) and verify that")
    contexts = getattr(partitioned, "contexts", None)
    if contexts is not None and list(ctx) != list(contexts):
        raise ContextError(
            f"ctx is [{', '.join(map(str, ctx))}], but the PartitionedSymbol was partitioned "
            f"for [{', '.join(map(str, contexts))}], where verify() runs it (its group2ctx) "
            f"and runs the reference on the first; pass ctx=ptd.contexts, or partition the "
            f"reference for [{', '.join(map(str, ctx))}]")
    if group2ctx:
        raise ContextError(
            f"group2ctx={dict(group2ctx)!r} given with a PartitionedSymbol, which places its "
            f"groups itself (ptd.group2ctx); leave group2ctx out")


def _graphs(reference: mx.sym.Symbol, candidate: Any, sharded: Any, ctx: list[mx.Context],
            group2ctx: Mapping[str, Any], dtypes: Mapping[str, Any] | None,
            shapes: Mapping[str, Any]) -> tuple[Graph, Graph, dict[str, mx.Context]]:
    """The reference's and the candidate's graphs (Dropout made the identity), checked
    against each other, and where the candidate's groups go; nothing allocated yet."""
    ref_graph = import_graph(reference, dtypes=dtypes, **shapes)
    arguments.check_tensor_sizes(ref_graph, "the reference")
    if sharded is not None:
        _check_partition(sharded, reference, ref_graph, ctx, group2ctx, shapes)
    candidate, group2ctx = _unpack_candidate(candidate, group2ctx)
    ref_graph = disable_dropout(ref_graph, _random)
    if sharded is None:
        _check_input_names(reference, candidate)
        cand_graph = disable_dropout(import_graph(candidate, dtypes=dtypes, **shapes), _random)
        _check_shapes(ref_graph, cand_graph)
    else:
        cand_graph = disable_dropout(_shard_graph(sharded), _random)
    arguments.check_tensor_sizes(cand_graph, "the candidate")
    placement = resolve_group2ctx(_groups(cand_graph), ctx, group2ctx)
    check_available(list(dict.fromkeys([*ctx, *placement.values()])))  # all that was named
    warn_if_mkldnn_across_cpus([ctx[0], *placement.values()])
    return ref_graph, cand_graph, placement


# --- running ----------------------------------------------------------------------------------

def _random(op: str) -> bool:
    return facts(op).random


def _groups(graph: Graph) -> list[str]:
    return list(dict.fromkeys(n.ctx_group for n in graph.nodes if n.ctx_group is not None))


def _grad_req(graph: Graph) -> dict[str, str]:
    """Gradients of every float input that no operator reads as an index."""
    consumers = graph.consumers()
    return {n.name: "write" if np.issubdtype(np.dtype(n.outputs[0].dtype), np.floating)
            and index_range(graph, i, consumers) is None else "null"
            for i, n in enumerate(graph.nodes) if n.is_variable and n.kind != "aux"}


#: MXNet's message when a variable lives on another device than the operator reading it
_MISPLACED = "Trying to save gradient to"


def _bind(graph: Graph, ctx0: mx.Context, group2ctx: dict | None, grad_req: dict[str, str],
          what: str) -> mx.executor.Executor:
    args = [n for n in graph.nodes if n.is_variable and n.kind != "aux"]
    shapes = {n.name: n.outputs[0].shape for n in args}
    types = {n.name: n.outputs[0].dtype for n in args}
    # MKLDNN's subgraph passes are inference-only: they can drop ctx groups, and MXNet skips
    # them when any gradient is requested, so they are switched off only for such binds.
    no_grad = all(req == "null" for req in grad_req.values())
    try:
        with no_subgraph_backend() if no_grad else contextlib.nullcontext():
            return export_symbol(graph).simple_bind(ctx=ctx0, grad_req=grad_req,
                                                    type_dict=types, group2ctx=group2ctx,
                                                    **shapes)
    except (mx.base.MXNetError, RuntimeError) as e:
        cause = [line for line in str(e).splitlines() if "Error" in line or "failed" in line]
        devices = sorted({str(ctx0), *map(str, (group2ctx or {}).values())})
        hint = (" Give every variable the ctx group of the operator that reads it "
                "(nnvm_passes.place does this)." if group2ctx and _MISPLACED in str(e) else "")
        raise BindError(f"MXNet cannot bind the {what} on {devices}: "
                        f"{(cause or [str(e)])[-1].strip().rstrip('.')}.{hint}") from e


def _run(graph: Graph, ctx0: mx.Context, group2ctx: dict | None, values: dict,
         head_grads: list[np.ndarray], output_names: list[str],
         grad_req: dict[str, str] | None = None, what: str = "reference"
         ) -> dict[str, np.ndarray]:
    """Forward (training mode) and backward once; every output, gradient and aux state."""
    grad_req = grad_req or _grad_req(graph)
    exe = _bind(graph, ctx0, group2ctx, grad_req, what)
    for name, array in list(exe.arg_dict.items()) + list(exe.aux_dict.items()):
        array[:] = values[name]
    exe.forward(is_train=True)
    if any(req != "null" for req in grad_req.values()):
        exe.backward(out_grads=[mx.nd.array(g, ctx=o.context, dtype=o.dtype)
                                for g, o in zip(head_grads, exe.outputs)])
    mx.nd.waitall()
    result = {f"output {name}": out.asnumpy() for name, out in zip(output_names, exe.outputs)}
    result.update({f"grad {n}": g.asnumpy() for n, g in exe.grad_dict.items() if g is not None})
    result.update({f"aux {n}": a.asnumpy() for n, a in exe.aux_dict.items()})
    return result


def _values(graph: Graph, seed: int, arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    values = random_inputs(graph, seed)
    for name, given in arrays.items():
        if name not in values:
            raise InvalidArgumentError(f"arrays has {name!r}, which is not an input of the "
                                       f"reference; give arrays by input name, one of "
                                       f"{', '.join(values)}")
        given = arguments.numeric_array(given, f"arrays[{name!r}]")   # a copy
        if given.shape != values[name].shape:
            raise InvalidArgumentError(f"arrays[{name!r}] has shape {given.shape}, the graph "
                                       f"needs {values[name].shape}: give an array of that "
                                       f"shape, or verify at {name}={given.shape}")
        values[name] = given.astype(values[name].dtype)
    return values


def _shard_graph(sharded: Any) -> Graph:
    """``sharded.shard_graph``; when the symbol no longer reads some shards (a rewrite bug
    that verify must report, not trip on), imported with the shards it reads."""
    symbol = sharded.symbol
    read = set(symbol.list_arguments() + symbol.list_auxiliary_states())
    if all(s.name in read for s in sharded.shards):
        return sharded.shard_graph
    shards = [s for s in sharded.shards if s.name in read]
    graph = import_symbol(symbol, dtypes={s.name: s.dtype for s in shards}, data_names=[],
                          **{s.name: s.shape for s in shards})
    kinds = {s.name: s.kind for s in shards}
    return graph.replace(nodes=tuple(n.replace(kind=kinds[n.name]) if n.is_variable else n
                                     for n in graph.nodes))


def _run_sharded(sharded: Any, ref_graph: Graph, cand_graph: Graph, ctx0, placement, values,
                 head_grads, output_names) -> dict[str, np.ndarray]:
    """Run a partitioned candidate (variables are shards of the reference's): the inputs are
    split into shards, and gradients and aux states merged back to the reference's names."""
    ref_req = _grad_req(ref_graph)
    args = set(cand_graph.arg_names)   # a shard no operator reads is not an argument
    grad_req = {s.name: ref_req.get(s.source, "null") for s in sharded.shards if s.name in args}
    pieces = getattr(sharded, "output_pieces", None)    # outputs returned as their pieces
    names = output_names if pieces is None else [f"{i}" for i in range(len(pieces))]
    got = _run(cand_graph, ctx0, placement, sharded.split_arrays(values),
               head_grads if pieces is None else sharded.head_gradients(head_grads),
               names, grad_req, "candidate")
    out = {k: v for k, v in got.items() if k.startswith("output ")}
    if pieces is not None:
        wholes = sharded.join_outputs([out[f"output {i}"] for i in range(len(pieces))])
        out = {f"output {name}": whole for name, whole in zip(output_names, wholes)}
    for prefix in ("grad ", "aux "):
        parts = {k[len(prefix):]: v for k, v in got.items() if k.startswith(prefix)}
        # an array some of whose shards the candidate lacks is left out: reported missing
        lacking = {s.source for s in sharded.shards if s.name not in parts
                   and (s.kind == "aux") == (prefix == "aux ")}
        by_name = {s.name: s.source for s in sharded.shards}
        merged = sharded.merge_arrays({n: v for n, v in parts.items()
                                       if by_name[n] not in lacking})
        out.update({prefix + k: v for k, v in merged.items()
                    if prefix == "aux " or ref_req.get(k) == "write"})
    return out


def _is_float(dtype: Any) -> bool:
    return np.dtype(dtype).kind == "f"


def _narrow_floats(graph: Graph) -> list[str]:
    """The float dtypes narrower than float64 that any tensor of ``graph`` has."""
    return sorted({t.dtype for n in graph.nodes for t in n.outputs
                   if _is_float(t.dtype) and np.dtype(t.dtype) != np.float64})


def _one_ulp_away(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each element moved to a neighbouring float, towards or away from zero at random (its
    bit pattern plus or minus one); zeros and values next to infinity stay."""
    bits = np.dtype(f"int{a.dtype.itemsize * 8}")
    step = rng.integers(0, 2, size=a.shape, dtype=np.int8) * np.int8(2) - np.int8(1)
    moved = (a.view(bits) + step.astype(bits)).view(a.dtype)
    stay = (a == 0) | ~np.isfinite(moved)
    return np.where(stay, a, moved) if stay.any() else moved


def _run_oracle(reference: mx.sym.Symbol, ref_graph: Graph, shapes: Mapping[str, Any],
                ctx0: mx.Context, values: dict, head_grads: list[np.ndarray],
                output_names: list[str], seed: int) -> tuple[dict, list[dict]]:
    """The reference in float64 on ``values`` cast up (integer inputs keep their dtype), and
    ``ROUNDING_RUNS`` runs of the reference on its float inputs moved by one ulp."""
    wide = {n.name: "float64" if _is_float(n.outputs[0].dtype) else n.outputs[0].dtype
            for n in ref_graph.variables()}
    graph = disable_dropout(import_graph(cast_floats(reference, "float64")[0], dtypes=wide,
                                         **shapes), _random)
    truth = _run(graph, ctx0, None,
                 {k: v.astype(wide[k]) for k, v in values.items()},
                 [g.astype(np.float64) if _is_float(g.dtype) else g for g in head_grads],
                 output_names, None, "reference in float64 (the oracle)")
    return truth, _nudged_runs(ref_graph, ctx0, values, head_grads, output_names, seed)


def _nudged_runs(ref_graph: Graph, ctx0: mx.Context, values: dict,
                 head_grads: list[np.ndarray], output_names: list[str], seed: int) -> list[dict]:
    """``ROUNDING_RUNS`` runs of the reference on its float inputs (not those read as
    indices) and head gradients moved by one ulp."""
    consumers = ref_graph.consumers()
    movable = {n.name for i, n in enumerate(ref_graph.nodes) if n.is_variable
               and _is_float(n.outputs[0].dtype) and index_range(ref_graph, i, consumers) is None}
    rng = np.random.default_rng([seed, 2])
    return [_run(ref_graph, ctx0, None,
                 {k: _one_ulp_away(v, rng) if k in movable else v for k, v in values.items()},
                 [_one_ulp_away(g, rng) if _is_float(g.dtype) else g for g in head_grads],
                 output_names) for _ in range(ROUNDING_RUNS)]


def _judged_by_sensitivity(report: "VerificationReport", expected: dict, got: dict,
                           nudged: list[dict]) -> "VerificationReport":
    """A float64 graph whose default comparison failed: each differing tensor judged again by
    the oracle rule, with the reference as its own oracle and the runs one ulp away measuring
    how far the reference itself moves (a chaotic graph: BatchNorm over a few values, deep
    stacks at small sizes). The tensors that then pass are named in ``sensitive``."""
    again = {c.name: _compare_to_oracle(c.name, expected[c.name],
                                        [expected[c.name]] + [r[c.name] for r in nudged],
                                        got.get(c.name), report.rtol, report.atol)
             for c in report.failures}
    passed = tuple(name for name, c in again.items() if c.ok)
    comparisons = tuple(again[c.name] if c.name in passed else c for c in report.comparisons)
    moved = max((again[n].rounding_rel_err for n in passed), default=0.0)
    note = ""
    if passed:
        note = (f"The float64 reference itself moves by up to {moved:.2g} of a tensor's largest "
                f"value when its inputs move by one ulp (a chaotic graph at this size: "
                f"BatchNorm over a few values, long products); {len(passed)} of the "
                f"{len(again)} tensors that differ from it are within {ORACLE_FACTOR:g} times "
                f"that measured sensitivity and pass"
                f"{'' if len(passed) == len(again) else '; the rest do not'}.")
    return dataclasses.replace(report, comparisons=comparisons, sensitive=passed,
                               diagnosis=note)


# --- verdicts ---------------------------------------------------------------------------------

def _diagnose(failures: list[TensorComparison], expected: dict, truth: dict,
              judged: tuple[TensorComparison, ...], narrow: str, rtol: float,
              atol: float) -> str:
    """Whether the reference's own error against ``truth`` (its float64 run) is outside the
    tolerance on the tensors the default mode found different, and what oracle mode says."""
    off = []
    for c in failures:
        ref, exact = expected[c.name].astype(np.float64), truth[c.name].astype(np.float64)
        if ref.shape == exact.shape and ref.size:
            own = float(_ratio(_abs_diff(ref, exact), atol + rtol * _magnitude(exact)).max())
            if own > 1:
                off.append((own, c.name))
    still = [c for c in judged if not c.ok]
    note = _noise_note(still, "them")
    outcome = (f"{len(still)} of {len(judged)} tensors still differ{'; ' + note if note else ''}"
               if still else "every tensor passes: the differences are within float rounding")
    verdict = (f"with oracle='float64' (judged against the float64 run, allowed "
               f"{ORACLE_FACTOR:g} times {narrow}'s own rounding error) {outcome}")
    if not off:
        return (f"The {narrow} reference is within the tolerance of a float64 run of the same "
                f"graph on the same values in every differing tensor, so its rounding does not "
                f"explain the differences; {verdict}.")
    own, name = max(off)
    return (f"The {narrow} reference is itself outside the tolerance of a float64 run of the "
            f"same graph on the same values in {len(off)} of the {len(failures)} differing "
            f"tensors (worst: {name}, {own:.3g} times the tolerance): at this tolerance the "
            f"graph is ill-conditioned in {narrow}, and a right candidate may differ from the "
            f"reference about as much as the reference differs from float64; {verdict}.")


def _diagnosis(failures, expected, got, narrow, oracle_runs, rtol, atol) -> str:
    if not narrow:
        return ""
    try:
        truth, nudged = oracle_runs()
    except (TofuError, mx.base.MXNetError) as e:
        return (f"The reference is in {'/'.join(narrow)}, whose rounding in an ill-conditioned "
                f"graph can exceed the tolerance; running it in float64 to measure that failed "
                f"({str(e).splitlines()[0]}).")
    judged = _judge(expected, got, truth, nudged, rtol, atol)
    return _diagnose(failures, expected, truth, judged, "/".join(narrow), rtol, atol)


def _noise_note(failures: list[TensorComparison], of: str) -> str:
    """Which differing tensors float rounding alone leaves without a significant digit."""
    noise = [c for c in failures if (c.rounding_rel_err or 0) >= NOISE_LEVEL]
    if not noise:
        return ""
    worst = max(noise, key=lambda c: (c.rounding_rel_err, c.name))
    return (f"{len(noise)} of {of} {'is' if len(noise) == 1 else 'are'} computed by the "
            f"reference itself with a rounding error of {NOISE_LEVEL:.0%} or more of the "
            f"tensor's largest value (up to {worst.rounding_rel_err:.0%}, in {worst.name}): "
            f"less than one significant digit, so a difference there is no evidence of a bug; "
            f"to judge those, verify in float64 (partition and verify with float64 dtypes)")


def _failure_message(report: VerificationReport) -> str:
    failures = report.failures
    worst = max(failures, key=lambda c: (c.violation, c.name))
    judged = (f", judged against the {report.oracle} oracle: farther from it than both "
              f"{ORACLE_FACTOR:g} times float rounding's error and the tolerance"
              if report.oracle else "")
    more = f" and {len(failures) - 10} more" if len(failures) > 10 else ""
    return (f"the candidate differs from the reference in {len(failures)} of "
            f"{len(report.comparisons)} tensors{judged} (rtol={report.rtol:g}, "
            f"atol={report.atol:g}, seed={report.seed}); worst: {worst.describe()}. Differing: "
            f"{', '.join(c.name for c in failures[:10])}{more}."
            f"{' ' + report.diagnosis if report.diagnosis else ''}")


def verify(reference: mx.sym.Symbol, candidate: Any, ctx: Sequence[mx.Context],
           rtol: float = 1e-4, atol: float = 1e-5, seed: int = 0, *,
           group2ctx: Mapping[str, Any] | None = None, arrays: Mapping[str, Any] | None = None,
           dtypes: Mapping[str, Any] | None = None, oracle: str | None = None,
           **shapes: Any) -> VerificationReport:
    """Check that ``candidate`` computes what ``reference`` computes, outputs and gradients.

    ``reference`` is bound on ``ctx[0]`` alone. ``candidate`` is a Symbol whose nodes carry
    ctx groups (a ``(symbol, group2ctx)`` pair, or anything with ``.symbol`` and
    ``.group2ctx``, also works); it is bound across ``ctx`` with ``group2ctx``, where a group
    ``dev<i>`` not named there goes to ``ctx[i]``. A :class:`tofu_mx.PartitionedSymbol`
    runs where it was partitioned for: ``ctx`` must be its ``contexts`` (else
    :class:`tofu_mx.ContextError`; no ``group2ctx``), and it must have been partitioned from
    this reference at these shapes and dtypes (else :class:`tofu_mx.InvalidArgumentError`
    naming the differences). Every device named (``ctx``, ``group2ctx``) must be one MXNet
    can see (:func:`tofu_mx.devices.check_available`), and, unless MXNet was built with int64
    tensor sizes, every tensor must have fewer than 2**31 elements; both are checked before
    anything is allocated.

    Both get the same seeded inputs and parameters (``arrays`` overrides some by name;
    integer ranges where an op reads indices), run one forward pass in training mode and one
    backward pass with the same seeded head gradients. Every output, every argument's
    gradient and every auxiliary state after the forward pass is compared. By default,
    elementwise with ``numpy.allclose(candidate, reference, rtol, atol)``. With
    ``oracle="float64"``, by the candidate's error against the reference run in float64 on
    the same values, allowed the tolerance or ``ORACLE_FACTOR`` times float rounding's own
    error on that tensor, whichever is larger; that error is measured as the largest of the
    reference's and of ``ROUNDING_RUNS`` more runs of it on inputs one ulp away (the rule
    and its reasons: this module's docstring). When the default mode fails on a graph not
    wholly in float64, these runs are made too, and the error (and ``report.diagnosis``)
    says whether the reference's own error against float64 is outside the tolerance there
    and what oracle mode concludes.

    Dropout is the one random operator: it is replaced by the identity in *both* graphs
    (its inference behaviour), so the runs are deterministic and comparable; every other
    operator runs in training mode (BatchNorm uses batch statistics and updates its moving
    statistics, which are compared too).

    ``rtol``, ``atol``: finite, >= 0. ``seed``: an int >= 0. Returns a
    :class:`VerificationReport`; raises :class:`tofu_mx.VerificationError` naming the worst
    tensor (and carrying the report) when anything differs. Neither symbol nor any array or
    dict of the caller's is modified.
    """
    reference = check_symbol(reference, "reference")
    rtol = arguments.real(rtol, "rtol", minimum=0, example="rtol=1e-4")
    atol = arguments.real(atol, "atol", minimum=0, example="atol=1e-5")
    seed = arguments.count(seed, "seed", minimum=0, example="seed=0")
    oracle = _check_oracle(oracle)
    arrays = arguments.mapping(arrays, "arrays", "arrays={'data': np.ones((4, 5))}")
    group2ctx = arguments.mapping(group2ctx, "group2ctx", "group2ctx={'dev1': mx.cpu(1)}")
    ctx = check_contexts(ctx)
    sharded = candidate if hasattr(candidate, "split_arrays") else None
    ref_graph, cand_graph, placement = _graphs(reference, candidate, sharded, ctx, group2ctx,
                                               dtypes, shapes)
    values = _values(ref_graph, seed, arrays)
    rng = np.random.default_rng([seed, 1])
    head_grads = [rng.standard_normal(t.shape).astype(t.dtype) for t in ref_graph.output_infos]
    output_names = reference.list_outputs()
    expected = _run(ref_graph, ctx[0], None, values, head_grads, output_names)
    if sharded is None:
        got = _run(cand_graph, ctx[0], placement, values, head_grads, output_names,
                   what="candidate")
    else:
        got = _run_sharded(sharded, ref_graph, cand_graph, ctx[0], placement, values,
                           head_grads, output_names)
    narrow = _narrow_floats(ref_graph)

    def oracle_runs() -> tuple[dict, list[dict]]:
        return _run_oracle(reference, ref_graph, shapes, ctx[0], values, head_grads,
                           output_names, seed)
    if oracle is None:
        comparisons = tuple(_compare(name, ref, got.get(name), rtol, atol)
                            for name, ref in expected.items())
    else:   # a graph wholly in float64 is its own oracle: the same run, the same numbers
        try:
            truth, nudged = oracle_runs() if narrow else (expected, [])
        except (TofuError, mx.base.MXNetError) as e:
            raise InvalidArgumentError(
                f"oracle={oracle!r} runs the reference in {oracle}, which MXNet cannot do for "
                f"this graph: {str(e).splitlines()[0]}; verify without the oracle") from e
        comparisons = _judge(expected, got, truth, nudged, rtol, atol)
    report = VerificationReport(comparisons, rtol, atol, seed, tuple(str(c) for c in ctx),
                                oracle)
    if report.ok:
        return report
    if oracle:
        note = _noise_note(report.failures, "the differing tensors")
        diagnosis = note[0].upper() + note[1:] + "." if note else ""
    elif not narrow:
        report = _judged_by_sensitivity(report, expected, got, _nudged_runs(
            ref_graph, ctx[0], values, head_grads, output_names, seed))
        if report.ok:
            return report
        diagnosis = report.diagnosis
    else:
        diagnosis = _diagnosis(report.failures, expected, got, narrow, oracle_runs, rtol, atol)
    report = dataclasses.replace(report, diagnosis=diagnosis)
    raise VerificationError(_failure_message(report), report)
