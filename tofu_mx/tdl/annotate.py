"""Annotate and analyse a graph: each operator node gets its description and strategies.

This is the pipeline's ``annotate -> analyse`` step: ``analyse(graph, parts)`` returns one
:class:`NodeAnalysis` per operator node, with the strategies derived from its description
(or the batch split of an opaque operator that declares one).
"""
from __future__ import annotations

from dataclasses import dataclass

import tofu_mx.ops  # noqa: F401  (registers the built-in descriptions)
from nnvm_passes.ir import Graph
from tofu_mx.tdl.analysis import Strategy, opaque_strategies, strategies
from tofu_mx.tdl.lang import TDLError
from tofu_mx.tdl.registry import Attrs, Description, lookup, registry_key, trace

#: What the analysis knows of an operator.
DESCRIBED, OPAQUE, UNKNOWN = "described", "opaque", "unknown"


@dataclass(frozen=True)
class NodeAnalysis:
    index: int
    name: str
    op: str
    status: str                      # described | opaque | unknown
    reason: str                      # why an operator is opaque or unknown
    strategies: tuple[Strategy, ...]


def analyse_node(graph: Graph, index: int, parts: int = 2) -> NodeAnalysis:
    node = graph.nodes[index]
    entry = lookup(node.op, node.params)
    in_shapes = [graph.tensor(e).shape for e in node.inputs]
    out_shapes = [t.shape for t in node.outputs]
    if entry is None:
        return NodeAnalysis(index, node.name, node.op, UNKNOWN,
                            f"no description registered for {registry_key(node.op, node.params)}",
                            ())
    if not isinstance(entry, Description):
        found = opaque_strategies(entry, in_shapes, out_shapes, parts)
        return NodeAnalysis(index, node.name, node.op, OPAQUE, entry.reason, tuple(found))
    try:
        traced = trace(entry, Attrs(node.attrs), in_shapes, out_shapes)
        found = strategies(traced, parts)
    except TDLError as e:
        raise TDLError(f"while analysing node {node.name!r} ({node.op}): {e}") from e
    return NodeAnalysis(index, node.name, node.op, DESCRIBED, "", tuple(found))


def analyse(graph: Graph, parts: int = 2) -> tuple[NodeAnalysis, ...]:
    """The analysis of every operator node of ``graph`` for a cut into ``parts``."""
    return tuple(analyse_node(graph, i, parts) for i, n in enumerate(graph.nodes)
                 if not n.is_variable)
