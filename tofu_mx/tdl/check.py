"""Check a description against MXNet's own kernel on every one of its examples.

For each example: build the one-operator symbol, feed it seeded random inputs (integers in
range where the operator reads indices), run MXNet's forward pass (training mode unless the
description says otherwise) and evaluate the description with the NumPy interpreter over
every output coordinate. Every described output must agree within the description's
tolerances.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from nnvm_passes.exporter import export_symbol
from nnvm_passes.ir import Entry
from tofu_mx.tdl.interpret import evaluate
from tofu_mx.tdl.registry import Attrs, Description, Example, example_graph, trace
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
