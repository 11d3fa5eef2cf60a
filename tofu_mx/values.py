"""Seeded random values for every input of a graph, in the range each input is read in.

Most inputs get floats; an input that an operator reads as an index (Embedding's tokens, a
loss's class labels, SequenceMask's lengths) gets integers in that operator's range. The
ranges are declared with each operator's description (``@tdl.op(..., index_inputs=...)``),
found by following the variable through operators that only move values (a label reshaped
before the loss, say).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from nnvm_passes.ir import Graph
from tofu_mx.tdl.annotate import moves_values
from tofu_mx.tdl.registry import Attrs, facts


def index_range(graph: Graph, var_index: int,
                consumers: Mapping[int, list[tuple[int, int]]] | None = None
                ) -> tuple[int, int] | None:
    """The integer range variable ``var_index`` is read in, or ``None`` if it is read as floats."""
    consumers = graph.consumers() if consumers is None else consumers
    frontier, seen = [var_index], set()
    while frontier:
        i = frontier.pop()
        if i in seen:
            continue
        seen.add(i)
        for ci, pos in consumers[i]:
            node = graph.nodes[ci]
            in_shapes = tuple(graph.tensor(e).shape for e in node.inputs)
            rule = facts(node.op, node.params).index_inputs.get(pos)
            if rule is not None:
                low, high = rule(Attrs(node.attrs), in_shapes)
                return int(low), int(high)
            if pos == 0 and moves_values(node.op, node.attrs, in_shapes,
                                         [t.shape for t in node.outputs]):
                frontier.append(ci)
    return None


def _uniform(rng: np.random.Generator, low: float, high: float, shape) -> np.ndarray:
    return rng.random(size=shape, dtype=np.float32) * np.float32(high - low) + np.float32(low)


def random_value(graph: Graph, var_index: int, rng: np.random.Generator,
                 consumers: Mapping[int, list[tuple[int, int]]] | None = None) -> np.ndarray:
    """A seeded value for one variable of ``graph``.

    Index inputs: integers in their range. Weights (2-d and more): uniform with variance
    1/fan-in, so deep nets without normalisation stay finite. ``*gamma`` and auxiliary
    states (moving variances must be positive): uniform in [0.5, 1.5). Everything else:
    uniform in [-1, 1).
    """
    node = graph.nodes[var_index]
    info = node.outputs[0]
    bounds = index_range(graph, var_index, consumers)
    if bounds is not None:
        value = rng.integers(bounds[0], max(bounds[1], bounds[0] + 1), size=info.shape)
    elif node.kind == "aux" or node.name.endswith("gamma"):
        value = _uniform(rng, 0.5, 1.5, info.shape)
    elif node.kind == "param" and len(info.shape) >= 2:
        fan_in = int(np.prod(info.shape[1:]))
        limit = np.sqrt(3.0 / fan_in)
        value = _uniform(rng, -limit, limit, info.shape)
    else:
        value = _uniform(rng, -1.0, 1.0, info.shape)
    return value.astype(info.dtype, copy=False)


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded values for every variable of ``graph`` (arguments and auxiliary states), by name."""
    rng = np.random.default_rng(seed)
    consumers = graph.consumers()
    return {node.name: random_value(graph, i, rng, consumers)
            for i, node in enumerate(graph.nodes) if node.is_variable}
