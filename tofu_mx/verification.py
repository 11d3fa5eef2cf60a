"""Prove a multi-device graph correct: run it and its single-device reference on the same
seeded inputs, forward and backward, and compare every output, gradient and auxiliary state."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import mxnet as mx
import numpy as np

from nnvm_passes.exporter import export_symbol
from nnvm_passes.importer import check_symbol
from nnvm_passes.ir import Graph
from nnvm_passes.transforms import disable_dropout
from tofu_mx.devices import (check_contexts, no_subgraph_backend, resolve_group2ctx,
                             warn_if_mkldnn_across_cpus)
from tofu_mx.errors import BindError, InvalidArgumentError, VerificationError
from tofu_mx.tdl.annotate import import_graph
from tofu_mx.tdl.registry import facts
from tofu_mx.values import index_range, random_inputs


@dataclass(frozen=True)
class TensorComparison:
    """How one tensor of the candidate compares with the reference's."""

    name: str            # "output softmax_output", "grad fc1_weight", "aux bn_moving_mean"
    shape: tuple[int, ...]
    max_abs_err: float
    max_rel_err: float   # max |cand - ref| / max(|ref|, atol)
    violation: float     # max |cand - ref| / (atol + rtol * |ref|); <= 1 means within tolerance
    worst_index: tuple[int, ...] = ()
    reference_value: float = 0.0
    candidate_value: float = 0.0
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.violation <= 1.0

    def describe(self) -> str:
        if self.note:
            return f"{self.name}: {self.note}"
        return (f"{self.name}: max abs err {self.max_abs_err:.3g}, max rel err "
                f"{self.max_rel_err:.3g}, worst at {self.worst_index} (reference "
                f"{self.reference_value:.6g}, candidate {self.candidate_value:.6g})")


@dataclass(frozen=True)
class VerificationReport:
    """Every comparison ``verify`` made, with the tolerances it used."""

    comparisons: tuple[TensorComparison, ...]
    rtol: float
    atol: float
    seed: int
    devices: tuple[str, ...]

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
        lines = [f"{'tensor':<{width}}  {'shape':<20} {'max abs err':>11} {'max rel err':>11}  ok"]
        for c in self.comparisons:
            lines.append(f"{c.name:<{width}}  {str(c.shape):<20} {c.max_abs_err:>11.3g} "
                         f"{c.max_rel_err:>11.3g}  {'yes' if c.ok else 'NO'}")
        lines.append(f"{len(self.comparisons)} tensors on {', '.join(self.devices)}, "
                     f"rtol={self.rtol:g} atol={self.atol:g} seed={self.seed}: "
                     f"{'all agree' if self.ok else f'{len(self.failures)} differ'}")
        return "\n".join(lines)


def _compare(name: str, ref: np.ndarray, got: np.ndarray, rtol: float,
             atol: float) -> TensorComparison:
    if ref.shape != got.shape:
        return TensorComparison(name, ref.shape, np.inf, np.inf, np.inf,
                                note=f"shape {got.shape} where the reference has {ref.shape}")
    ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
    if ref.size == 0:
        return TensorComparison(name, ref.shape, 0.0, 0.0, 0.0)
    with np.errstate(invalid="ignore"):
        diff = np.abs(got64 - ref64)
    both_nan = np.isnan(ref64) & np.isnan(got64)
    diff = np.where(both_nan, 0.0, np.where(np.isnan(diff), np.inf, diff))
    violation = diff / (atol + rtol * np.abs(ref64))
    worst = np.unravel_index(int(np.argmax(violation)), ref.shape)
    return TensorComparison(
        name, ref.shape, float(diff.max()),
        float((diff / np.maximum(np.abs(ref64), atol)).max()), float(violation.max()),
        tuple(int(i) for i in worst), float(ref64[worst]), float(got64[worst]))


def _unpack_candidate(candidate: Any, group2ctx: Mapping[str, Any] | None):
    if isinstance(candidate, tuple) and len(candidate) == 2:
        candidate, group2ctx = candidate[0], {**candidate[1], **(group2ctx or {})}
    elif hasattr(candidate, "symbol") and hasattr(candidate, "group2ctx"):
        candidate, group2ctx = candidate.symbol, {**candidate.group2ctx, **(group2ctx or {})}
    return check_symbol(candidate, "candidate"), group2ctx


_SAME_INTERFACE = ("verify() feeds both the same named arrays, so both symbols need the same "
                   "inputs (names and shapes) and outputs.")


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


def _groups(graph: Graph) -> list[str]:
    return list(dict.fromkeys(n.ctx_group for n in graph.nodes if n.ctx_group is not None))


def _grad_req(graph: Graph) -> dict[str, str]:
    """Gradients of every float input that no operator reads as an index."""
    consumers = graph.consumers()
    return {n.name: "write" if np.issubdtype(np.dtype(n.outputs[0].dtype), np.floating)
            and index_range(graph, i, consumers) is None else "null"
            for i, n in enumerate(graph.nodes) if n.is_variable and n.kind != "aux"}


def _run(graph: Graph, ctx0: mx.Context, group2ctx: dict | None, values: dict,
         head_grads: list[np.ndarray], output_names: list[str],
         grad_req: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """Forward (training mode) and backward once; every output, gradient and aux state."""
    args = {i: n for i, n in enumerate(graph.nodes) if n.is_variable and n.kind != "aux"}
    shapes = {n.name: n.outputs[0].shape for n in args.values()}
    types = {n.name: n.outputs[0].dtype for n in args.values()}
    grad_req = grad_req or _grad_req(graph)
    # MKLDNN's subgraph passes are inference-only: they can drop ctx groups, and MXNet skips
    # them when any gradient is requested, so they are switched off only for such binds.
    no_grad = all(req == "null" for req in grad_req.values())
    try:
        with no_subgraph_backend() if no_grad else contextlib.nullcontext():
            exe = export_symbol(graph).simple_bind(ctx=ctx0, grad_req=grad_req,
                                                   type_dict=types, group2ctx=group2ctx, **shapes)
    except (mx.base.MXNetError, RuntimeError) as e:
        cause = [line for line in str(e).splitlines() if "Error" in line or "failed" in line]
        raise BindError(
            f"MXNet cannot bind the {'candidate' if group2ctx else 'reference'} on "
            f"{sorted(set(map(str, (group2ctx or {}).values()))) or [str(ctx0)]}: "
            f"{(cause or [str(e)])[-1].strip()}. Give every variable the ctx group of the "
            f"operator that reads it (nnvm_passes.place does this).") from e
    for name, array in list(exe.arg_dict.items()) + list(exe.aux_dict.items()):
        array[:] = values[name]
    exe.forward(is_train=True)
    if not no_grad:
            exe.backward(out_grads=[mx.nd.array(g, ctx=o.context, dtype=o.dtype)
                                for g, o in zip(head_grads, exe.outputs)])
    mx.nd.waitall()
    result = {f"output {name}": out.asnumpy() for name, out in zip(output_names, exe.outputs)}
    result.update({f"grad {n}": g.asnumpy() for n, g in exe.grad_dict.items() if g is not None})
    result.update({f"aux {n}": a.asnumpy() for n, a in exe.aux_dict.items()})
    return result


def _values(graph: Graph, seed: int, arrays: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    values = random_inputs(graph, seed)
    for name, given in (arrays or {}).items():
        if name not in values:
            raise InvalidArgumentError(f"arrays has {name!r}, which is not an input of the "
                                       f"reference; its inputs are {', '.join(values)}")
        given = given.asnumpy() if isinstance(given, mx.nd.NDArray) else np.array(given)
        if given.shape != values[name].shape:
            raise InvalidArgumentError(f"arrays[{name!r}] has shape {given.shape}, the graph "
                                       f"needs {values[name].shape}")
        values[name] = given.astype(values[name].dtype)  # a copy: the caller's array is untouched
    return values


def _run_sharded(sharded: Any, ref_graph: Graph, cand_graph: Graph, ctx0, placement, values,
                 head_grads, output_names) -> dict[str, np.ndarray]:
    """Run a partitioned candidate (variables are shards of the reference's): the inputs are
    split into shards, and gradients and aux states merged back to the reference's names."""
    ref_req = _grad_req(ref_graph)
    grad_req = {s.name: ref_req.get(s.source, "null") for s in sharded.shards if s.kind != "aux"}
    got = _run(cand_graph, ctx0, placement, sharded.split_arrays(values), head_grads,
               output_names, grad_req)
    out = {k: v for k, v in got.items() if k.startswith("output ")}
    for prefix in ("grad ", "aux "):
        merged = sharded.merge_arrays({k[len(prefix):]: v for k, v in got.items()
                                       if k.startswith(prefix)})
        out.update({prefix + k: v for k, v in merged.items()
                    if prefix == "aux " or ref_req.get(k) == "write"})
    return out


def verify(reference: mx.sym.Symbol, candidate: Any, ctx: Sequence[mx.Context],
           rtol: float = 1e-4, atol: float = 1e-5, seed: int = 0, *,
           group2ctx: Mapping[str, Any] | None = None, arrays: Mapping[str, Any] | None = None,
           dtypes: Mapping[str, Any] | None = None, **shapes: Any) -> VerificationReport:
    """Check that ``candidate`` computes what ``reference`` computes, outputs and gradients.

    ``reference`` is bound on ``ctx[0]`` alone. ``candidate`` is a Symbol whose nodes carry
    ctx groups (a ``(symbol, group2ctx)`` pair, or anything with ``.symbol`` and
    ``.group2ctx``, also works); it is bound across ``ctx`` with ``group2ctx``, where a group
    ``dev<i>`` not named there goes to ``ctx[i]``. Both get the same seeded inputs and
    parameters (``arrays`` overrides some by name; integer ranges where an op reads indices),
    run one forward pass in training mode and one backward pass with the same seeded head
    gradients. Every output, every argument's gradient and every auxiliary state after the
    forward pass is compared with ``numpy.allclose(candidate, reference, rtol, atol)``.

    Dropout is the one random operator: it is replaced by the identity in *both* graphs
    (its inference behaviour), so the runs are deterministic and comparable; every other
    operator runs in training mode (BatchNorm uses batch statistics and updates its moving
    statistics, which are compared too).

    Returns a :class:`VerificationReport`; raises :class:`tofu_mx.VerificationError` naming
    the worst tensor (and carrying the report) when anything differs. Neither symbol nor
    any array of the caller's is modified.
    """
    reference = check_symbol(reference, "reference")
    sharded = candidate if hasattr(candidate, "split_arrays") else None
    candidate, group2ctx = _unpack_candidate(candidate, group2ctx)
    ctx = check_contexts(ctx)
    def random(op):
        return facts(op).random
    ref_graph = disable_dropout(import_graph(reference, dtypes=dtypes, **shapes), random)
    if sharded is None:
        _check_input_names(reference, candidate)
        cand_graph = disable_dropout(import_graph(candidate, dtypes=dtypes, **shapes), random)
        _check_shapes(ref_graph, cand_graph)
    else:
        cand_graph = disable_dropout(sharded.shard_graph, random)
    values = _values(ref_graph, seed, arrays)
    rng = np.random.default_rng([seed, 1])
    head_grads = [rng.standard_normal(t.shape).astype(t.dtype) for t in ref_graph.output_infos]
    output_names = reference.list_outputs()
    expected = _run(ref_graph, ctx[0], None, values, head_grads, output_names)
    placement = resolve_group2ctx(_groups(cand_graph), ctx, group2ctx)
    warn_if_mkldnn_across_cpus([ctx[0], *placement.values()])
    if sharded is None:
        got = _run(cand_graph, ctx[0], placement, values, head_grads, output_names)
    else:
        got = _run_sharded(sharded, ref_graph, cand_graph, ctx[0], placement, values,
                           head_grads, output_names)
    comparisons = tuple(_compare(name, ref, got[name], rtol, atol)
                        for name, ref in expected.items())
    report = VerificationReport(comparisons, rtol, atol, seed, tuple(str(c) for c in ctx))
    if not report.ok:
        failures = report.failures
        worst = max(failures, key=lambda c: (c.violation, c.name))
        raise VerificationError(
            f"the candidate differs from the reference in {len(failures)} of "
            f"{len(comparisons)} tensors (rtol={rtol:g}, atol={atol:g}, seed={seed}); worst: "
            f"{worst.describe()}. Differing: {', '.join(c.name for c in failures[:10])}"
            f"{' ...' if len(failures) > 10 else ''}", report)
    return report
