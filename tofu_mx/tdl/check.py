"""Check a description against MXNet's own kernel on every one of its examples.

For each example: build the one-operator symbol, feed it seeded random inputs (integers in
range where the operator reads indices), run MXNet's forward pass (training mode unless the
description says otherwise) and evaluate the description with the NumPy interpreter over
every output coordinate. Every described output must agree within the description's
tolerances.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from nnvm_passes.exporter import export_symbol
from nnvm_passes.ir import Entry, FrozenDict
from tofu_mx.errors import TofuError
from tofu_mx.tdl.interpret import evaluate
from tofu_mx.tdl.registry import (Attrs, Description, Example, Traced, example_graph,
                                  single_op_symbol, trace)
from tofu_mx.values import index_range, random_inputs


@dataclass(frozen=True)
class CheckResult:
    op: str
    example: Example
    max_abs_err: float
    ok: bool
    message: str = ""

    def __str__(self) -> str:
        status = "ok" if self.ok else "MISMATCH"
        return (f"{self.op} {dict(self.example.attrs)} {list(self.example.shapes)}: {status} "
                f"(max abs err {self.max_abs_err:.3g}){' ' + self.message if self.message else ''}")


def check_example(desc: Description, example: Example, seed: int = 0) -> CheckResult:
    mx_op, _, op_type = desc.op.partition(":")
    attrs = dict(example.attrs, op_type=op_type) if op_type else dict(example.attrs)
    graph = example_graph(mx_op, dataclasses.replace(example, attrs=attrs))
    node = graph.nodes[-1]
    values = random_inputs(graph, seed)
    names = [graph.nodes[e.node].name for e in node.inputs]
    if desc.domain is not None:       # float inputs redrawn where the operator is defined
        rng = np.random.default_rng([seed, 2])
        low, high = desc.domain
        for name in names:
            if np.issubdtype(values[name].dtype, np.floating) and \
                    index_range(graph, graph.index(name)) is None:
                values[name] = rng.uniform(low, high, values[name].shape).astype(
                    values[name].dtype)
    traced = trace(desc, Attrs(attrs), [graph.tensor(e).shape for e in node.inputs],
                   [t.shape for t in node.outputs])
    # every output the description describes is a head, so every one is compared
    heads = [Entry(len(graph.nodes) - 1, k) for k in range(len(traced.outputs))]
    exe = export_symbol(graph.replace(heads=tuple(heads))).bind(
        mx.cpu(), {n: mx.nd.array(values[n], dtype=values[n].dtype) for n in graph.arg_names},
        aux_states={n: mx.nd.array(values[n]) for n in graph.aux_names})
    mxnet_out = [o.asnumpy() for o in exe.forward(is_train=desc.train)]
    ours = evaluate(traced, [values[n] for n in names])
    if len(mxnet_out) != len(ours):
        return CheckResult(desc.op, example, np.inf, False,
                           f"{len(ours)} outputs described, MXNet gives {len(mxnet_out)}")
    worst, message = 0.0, ""
    for k, (theirs, mine) in enumerate(zip(mxnet_out, ours)):
        if theirs.shape != mine.shape:
            return CheckResult(desc.op, example, np.inf, False,
                               f"output {k} shape {mine.shape}, MXNet's {theirs.shape}")
        if np.issubdtype(theirs.dtype, np.floating) and theirs.dtype.itemsize < 4:
            mine = mine.astype(theirs.dtype).astype(np.float64)   # stored as the output is
        err = float(np.max(np.abs(theirs.astype(np.float64) - mine))) if mine.size else 0.0
        worst = max(worst, err)
        if not np.allclose(mine, theirs, rtol=desc.rtol, atol=desc.atol, equal_nan=True):
            message = f"output {k} differs"
    return CheckResult(desc.op, example, worst, not message, message)


def check_description(desc: Description, seed: int = 0) -> list[CheckResult]:
    """One :class:`CheckResult` per example of ``desc``."""
    return [check_example(desc, ex, seed) for ex in desc.examples]


@dataclass(frozen=True)
class ShareCheck:
    """One share of an operator (``part`` of ``strategy`` cut into ``parts``; None: all the
    parts, combined) run as the operator on its inputs' boxes, against the whole operator
    there: its outputs (:func:`check_shares`) or its input's gradient
    (:func:`check_loss_gradients`)."""

    op: str
    example: Example
    strategy: str
    parts: int
    part: int | None
    max_abs_err: float
    ok: bool

    def __str__(self) -> str:
        status = "ok" if self.ok else "MISMATCH"
        which = "" if self.part is None else f", part {self.part}"
        return (f"{self.op} {dict(self.example.attrs)} {list(self.example.shapes)} "
                f"{self.strategy} in {self.parts}{which}: {status} "
                f"(max abs err {self.max_abs_err:.3g})")


@dataclass(frozen=True)
class _Values:
    """An example's operator, seeded inputs (float64 where MXNet's kernel has it, else the
    example's dtypes) and trace, and the tolerance those dtypes allow."""

    op: str
    attrs: FrozenDict
    inputs: list
    traced: Traced
    rtol: float
    atol: float

    @staticmethod
    def of(desc: Description, example: Example, seed: int,
           float64_tolerance: tuple[float, float]) -> "_Values":
        mx_op = desc.op.partition(":")[0]
        wide = dataclasses.replace(example, dtypes=FrozenDict(
            {i: "float64" for i in range(len(example.shapes))}))
        for chosen, (rtol, atol) in ((wide, float64_tolerance),
                                     (example, (desc.rtol, desc.atol))):
            try:
                graph = example_graph(mx_op, chosen)
                values = random_inputs(graph, seed)
                node = graph.nodes[-1]
                inputs = [values[graph.nodes[e.node].name] for e in node.inputs]
                _forward(mx_op, example.attrs, inputs, len(node.outputs), desc.train)
                break
            except (TofuError, mx.base.MXNetError):
                if chosen is example:       # no kernel for the example's own dtypes either
                    raise
        attrs = FrozenDict(example.attrs)
        traced = trace(desc, Attrs(attrs), [graph.tensor(e).shape for e in node.inputs],
                       [t.shape for t in node.outputs])
        return _Values(mx_op, attrs, inputs, traced, rtol, atol)


def _gradients(op: str, attrs: Mapping[str, str], values: list[np.ndarray]) -> list[np.ndarray]:
    """MXNet's gradient of every input of one ``op`` node at ``values``, after a training
    forward pass; a loss head ignores the head gradient, so ones are fed."""
    sym = single_op_symbol(op, attrs, len(values))
    args = {f"in{i}": mx.nd.array(v, dtype=v.dtype) for i, v in enumerate(values)}
    grads = {n: mx.nd.zeros_like(a) for n, a in args.items()}
    exe = sym.bind(mx.cpu(), args, args_grad=grads)
    out = exe.forward(is_train=True)
    exe.backward([mx.nd.ones_like(o) for o in out])
    return [grads[f"in{i}"].asnumpy() for i in range(len(values))]


def _forward(op: str, attrs: Mapping[str, str], values: list[np.ndarray], n_out: int,
             train: bool) -> list[np.ndarray]:
    sym = single_op_symbol(op, attrs, len(values), n_out)
    args = {f"in{i}": mx.nd.array(v, dtype=v.dtype) for i, v in enumerate(values)}
    names = sym.list_arguments()
    aux = {n: args.pop(n) for n in list(args) if n not in names}
    exe = sym.bind(mx.cpu(), {n: args[n] for n in names}, aux_states=aux or None)
    return [o.asnumpy() for o in exe.forward(is_train=train)]


def _box(box) -> tuple[slice, ...]:
    return tuple(slice(lo, hi + 1) for lo, hi in box)


def _read(value: np.ndarray, box, pad: float | None) -> np.ndarray:
    """``value`` in ``box`` (inclusive), ``pad`` outside its bounds."""
    shape = tuple(hi - lo + 1 for lo, hi in box)
    out = np.full(shape, 0.0 if pad is None else pad, dtype=value.dtype)
    src, dst = [], []
    for (lo, hi), n in zip(box, value.shape):
        a, b = max(lo, 0), min(hi, n - 1)
        if a > b:
            return out
        src.append(slice(a, b + 1))
        dst.append(slice(a - lo, b - lo + 1))
    out[tuple(dst)] = value[tuple(src)]
    return out


def _err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b))) if a.size and a.shape == b.shape else \
        (0.0 if a.shape == b.shape else np.inf)


def check_loss_gradients(desc: Description, example: Example, parts: int,
                         seed: int = 0) -> list[ShareCheck]:
    """Run every share that the search may give one device of a loss head (each output
    strategy cut into ``parts``, as :func:`~tofu_mx.tdl.shares.resolve` runs it) and compare
    the gradient of its data input with the whole operator's gradient there, in float64.
    A head's gradient often divides by a count of what its kernel sees (the batch, the values
    per sample): a share sees less, and its hook must rescale."""
    from tofu_mx.tdl.analysis import part_interval, strategies, work_regions
    from tofu_mx.tdl.shares import resolve
    v = _Values.of(desc, example, seed, (1e-9, 1e-12))
    whole = _gradients(v.op, v.attrs, v.inputs)[0]
    results = []
    for strategy in strategies(v.traced, parts):
        if strategy.kind != "output":
            continue
        for p in range(parts):
            work = work_regions(v.traced, {strategy.var: part_interval(strategy.extent, parts,
                                                                       p)})
            run = resolve(desc, v.op, v.attrs, v.traced, work)
            if isinstance(run, str):
                continue      # not offered to the search
            pieces = [x[_box(box)] for x, box in zip(v.inputs, run.inputs) if box is not None]
            mine = _gradients(v.op, run.attrs, pieces)[0]
            theirs = whole[_box(run.inputs[0])]
            results.append(ShareCheck(desc.op, example, strategy.name, parts, p,
                                      _err(mine, theirs),
                                      bool(np.allclose(mine, theirs, rtol=v.rtol, atol=v.atol))))
    return results


def check_shares(desc: Description, example: Example, parts: int,
                 seed: int = 0) -> list[ShareCheck]:
    """Run every share that the search may give one device of ``desc``'s operator (each
    strategy cut into ``parts``, as :func:`~tofu_mx.tdl.shares.resolve` runs it: its
    attributes, its inputs' boxes, padding materialised) through MXNet's kernel, in float64
    where MXNet has it, and compare its outputs with the whole operator's over its boxes; a
    partition-n-reduce's parts are combined first. A share the hook refuses is not offered,
    so not checked."""
    from tofu_mx.tdl.analysis import pad_values, part_interval, strategies, work_regions
    from tofu_mx.tdl.shares import resolve
    v = _Values.of(desc, example, seed, (1e-7, 1e-9))
    n_out = len(v.traced.outputs)
    whole = _forward(v.op, v.attrs, v.inputs, n_out, desc.train)
    pads = pad_values(v.traced)
    combine = {"sum": np.add, "max": np.maximum, "min": np.minimum}
    results = []
    for strategy in strategies(v.traced, parts):
        found, total = [], None
        for p in range(parts):
            reduced = [strategy.var] if strategy.kind == "reduce" else []
            work = work_regions(v.traced, {strategy.var: part_interval(strategy.extent, parts,
                                                                       p)},
                                reduced, reduced if p else [])
            run = resolve(desc, v.op, v.attrs, v.traced, work)
            if isinstance(run, str) or (run.shard.views is not None
                                        and not run.shard.also_runs):
                found = None
                break
            pieces = [_read(x, box, pad) for x, box, pad in zip(v.inputs, run.inputs, pads)
                      if box is not None]
            outs = _forward(v.op, run.attrs, pieces, n_out, desc.train)
            if run.shard.scale is not None:
                outs = [o * run.shard.scale for o in outs]
            if work.partial is not None:
                total = outs if total is None else [combine[work.partial](t, o)
                                                    for t, o in zip(total, outs)]
                continue
            found += [(o, w[_box(box)]) for o, box, w in zip(outs, work.outputs, whole)]
        if found is None:
            continue
        if total is not None:
            found = list(zip(total, whole))
        ok = all(a.shape == b.shape and np.allclose(a, b, rtol=v.rtol, atol=v.atol,
                                                    equal_nan=True) for a, b in found)
        results.append(ShareCheck(desc.op, example, strategy.name, parts, None,
                                  max((_err(a, b) for a, b in found), default=0.0), ok))
    return results
