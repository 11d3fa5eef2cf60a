"""Export the IR of :mod:`nnvm_passes.ir` back to an ``mx.sym.Symbol``.

The exporter writes MXNet's JSON graph format and loads it with ``mx.sym.load_json``, so an
imported graph exports to a symbol whose JSON equals the original's.
"""
from __future__ import annotations

import json

import mxnet as mx

from nnvm_passes.ir import Graph
from tofu_mx.errors import TofuError


def _check_order(graph: Graph) -> None:
    for i, node in enumerate(graph.nodes):
        for entry in node.inputs:
            if not 0 <= entry.node < i:
                raise TofuError(
                    f"node {node.name!r} (#{i}) reads node #{entry.node}, which does not come "
                    f"before it: the graph's nodes must be in topological order")
            producer = graph.nodes[entry.node]
            if entry.index >= len(producer.outputs):
                raise TofuError(
                    f"node {node.name!r} reads output {entry.index} of {producer.name!r}, which "
                    f"has {len(producer.outputs)} outputs")


def graph_to_json(graph: Graph) -> dict:
    """MXNet's JSON graph (as a dict) for ``graph``."""
    _check_order(graph)
    nodes, row_ptr = [], [0]
    for node in graph.nodes:
        jn = {"op": node.op, "name": node.name}
        if node.attrs:
            jn["attrs"] = dict(node.attrs)
        jn["inputs"] = [e.to_json() for e in node.inputs]
        jn.update({k: json.loads(v) for k, v in node.extra.items()})
        nodes.append(jn)
        row_ptr.append(row_ptr[-1] + len(node.outputs))
    return {
        "nodes": nodes,
        "arg_nodes": [i for i, n in enumerate(graph.nodes) if n.is_variable],
        "node_row_ptr": row_ptr,
        "heads": [e.to_json() for e in graph.heads],
        "attrs": {k: json.loads(v) for k, v in graph.attrs.items()},
    }


def symbol_from_json(js: dict) -> mx.sym.Symbol:
    """MXNet's Symbol of a JSON graph (a dict). Names stay as they are, not escaped: MXNet's
    JSON reader knows no ``\\u`` escape, and names may be any text (``données``)."""
    return mx.sym.load_json(json.dumps(js, ensure_ascii=False))


def export_symbol(graph: Graph) -> mx.sym.Symbol:
    """An ``mx.sym.Symbol`` computing ``graph``."""
    return symbol_from_json(graph_to_json(graph))
