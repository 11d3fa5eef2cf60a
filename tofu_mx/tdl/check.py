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
from tofu_mx.tdl.interpret import evaluate
from tofu_mx.tdl.registry import (Attrs, Description, Example, example_graph, single_op_symbol,
                                  trace)
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
        err = float(np.max(np.abs(theirs.astype(np.float64) - mine))) if mine.size else 0.0
        worst = max(worst, err)
        if not np.allclose(mine, theirs, rtol=desc.rtol, atol=desc.atol, equal_nan=True):
            message = f"output {k} differs"
    return CheckResult(desc.op, example, worst, not message, message)


def check_description(desc: Description, seed: int = 0) -> list[CheckResult]:
    """One :class:`CheckResult` per example of ``desc``."""
    return [check_example(desc, ex, seed) for ex in desc.examples]


@dataclass(frozen=True)
class GradientCheck:
    """A loss head's input gradient computed by one share against the whole operator's."""

    op: str
    example: Example
    strategy: str
    part: int
    max_abs_err: float
    ok: bool

    def __str__(self) -> str:
        status = "ok" if self.ok else "MISMATCH"
        return (f"{self.op} {dict(self.example.attrs)} {list(self.example.shapes)} "
                f"{self.strategy} part {self.part}: {status} (max abs err {self.max_abs_err:.3g})")


def _gradients(op: str, attrs: Mapping[str, str], values: list[np.ndarray]) -> list[np.ndarray]:
    """MXNet's gradient of every input of one ``op`` node at ``values`` (float64), after a
    training forward pass; a loss head ignores the head gradient, so ones are fed."""
    sym = single_op_symbol(op, attrs, len(values))
    args = {f"in{i}": mx.nd.array(v, dtype=v.dtype) for i, v in enumerate(values)}
    grads = {n: mx.nd.zeros_like(a) for n, a in args.items()}
    exe = sym.bind(mx.cpu(), args, args_grad=grads)
    out = exe.forward(is_train=True)
    exe.backward([mx.nd.ones_like(o) for o in out])
    return [grads[f"in{i}"].asnumpy() for i in range(len(values))]


def check_loss_gradients(desc: Description, example: Example, parts: int,
                         seed: int = 0) -> list[GradientCheck]:
    """Run every share that the search may give one device of a loss head (each output
    strategy cut into ``parts``, as :func:`~tofu_mx.tdl.shares.resolve` runs it) and compare
    the gradient of its data input with the whole operator's gradient there, in float64.
    A head's gradient often divides by a count of what its kernel sees (the batch, the values
    per sample): a share sees less, and its hook must rescale."""
    from tofu_mx.tdl.analysis import part_interval, strategies, work_regions
    from tofu_mx.tdl.shares import resolve
    mx_op = desc.op.partition(":")[0]
    wide = dataclasses.replace(example, dtypes=FrozenDict(
        {i: "float64" for i in range(len(example.shapes))}))
    graph = example_graph(mx_op, wide)
    node = graph.nodes[-1]
    values = random_inputs(graph, seed)
    inputs = [values[graph.nodes[e.node].name] for e in node.inputs]
    whole = _gradients(mx_op, example.attrs, inputs)[0]
    attrs = FrozenDict(example.attrs)
    traced = trace(desc, Attrs(attrs), [graph.tensor(e).shape for e in node.inputs],
                   [t.shape for t in node.outputs])
    results = []
    for strategy in strategies(traced, parts):
        if strategy.kind != "output":
            continue
        for p in range(parts):
            work = work_regions(traced, {strategy.var: part_interval(strategy.extent, parts, p)})
            runnable = resolve(desc, mx_op, attrs, traced, work)
            if isinstance(runnable, str):
                continue      # not offered to the search
            pieces = [v[tuple(slice(lo, hi + 1) for lo, hi in box)]
                      for v, box in zip(inputs, runnable.inputs) if box is not None]
            mine = _gradients(mx_op, runnable.attrs, pieces)[0]
            theirs = whole[tuple(slice(lo, hi + 1) for lo, hi in runnable.inputs[0])]
            err = float(np.max(np.abs(mine - theirs))) if mine.size else 0.0
            results.append(GradientCheck(desc.op, example, strategy.name, p, err,
                                         bool(np.allclose(mine, theirs, rtol=1e-9, atol=1e-12))))
    return results
