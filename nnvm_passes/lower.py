"""Lowering: replace operators by equivalent subgraphs of other operators (graph in, graph out).

Some operators split badly as a whole but well as their parts: BatchNorm's statistics sum
over the batch, so the operator cannot be split on the batch, while the sums it is made of
can (each device sums its slice; the small sums are added across devices). The pass
replaces each node that ``lowering_of(node)`` gives a hook for by what the hook emits; the
search then partitions the parts.

A hook is called as ``hook(emit, params, shapes, *inputs)``: ``emit`` (an :class:`Emitter`)
adds operator nodes, ``params`` are the node's parsed attributes, ``shapes`` its inputs'
shapes and ``inputs`` are :class:`Ref` values standing for the node's inputs. It returns one :class:`Ref` per output of
the node, or None to keep the node as it is. Every variable the node read must still be read
(the graph's inputs do not change), and emitted nodes carry the node's hidden attributes
(placement). The pass knows no operator by name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import mxnet as mx

from nnvm_passes.exporter import graph_to_json
from nnvm_passes.importer import import_symbol
from nnvm_passes.ir import Graph, format_attr_value, is_hidden_attr
from tofu_mx.errors import TofuError


@dataclass(frozen=True)
class Ref:
    """Output ``index`` of emitted node ``node`` (a position in the new graph's nodes)."""

    node: int
    index: int = 0

    def __getitem__(self, index: int) -> "Ref":
        return Ref(self.node, index)


class Emitter:
    """Adds operator nodes for one lowered node, named after it, with its hidden attributes."""

    def __init__(self, nodes: list[dict], base: str, hidden: Mapping[str, str],
                 names: set[str]):
        self._nodes, self._base, self._hidden, self._names = nodes, base, dict(hidden), names

    def __call__(self, op: str, *inputs: Ref, name: str, **attrs: Any) -> Ref:
        """Emit ``op`` reading ``inputs``; returns its output 0 (index it for the others)."""
        full = f"{self._base}/{name}"
        if full in self._names:
            raise TofuError(f"lowering {self._base!r} emits two nodes named {full!r}")
        self._names.add(full)
        node_attrs = {k: v if isinstance(v, str) else format_attr_value(v)
                      for k, v in attrs.items()}
        node_attrs.update(self._hidden)
        self._nodes.append({"op": op, "name": full, "attrs": node_attrs,
                            "inputs": [[r.node, r.index, 0] for r in inputs]})
        return Ref(len(self._nodes) - 1)


Hook = Callable[..., "tuple[Ref, ...] | None"]


def lower(graph: Graph, lowering_of: Callable[[Any], Hook | None]) -> Graph:
    """``graph`` with each node that ``lowering_of`` gives a hook for replaced by the hook's
    subgraph (``graph`` itself when no hook lowers anything). Shapes and dtypes are inferred
    afresh; variables keep their names, shapes, dtypes and kinds."""
    hooks = {i: lowering_of(node) for i, node in enumerate(graph.nodes) if not node.is_variable}
    if not any(hooks.values()):
        return graph            # nothing to lower: no JSON round trip
    js = graph_to_json(graph)
    nodes: list[dict] = []
    where: dict[tuple[int, int], Ref] = {}       # (old node, output) -> new entry
    names = {n.name for n in graph.nodes}
    lowered = False
    for i, node in enumerate(graph.nodes):
        inputs = [where[(e.node, e.index)] for e in node.inputs]
        hook = hooks.get(i)
        outs = None
        if hook is not None:
            hidden = {k: v for k, v in node.attrs.items() if is_hidden_attr(k)}
            try:
                shapes = tuple(graph.tensor(e).shape for e in node.inputs)
                outs = hook(Emitter(nodes, node.name, hidden, names), node.params, shapes,
                            *inputs)
            except Exception as e:  # noqa: BLE001  (re-raised with the node named)
                raise TofuError(f"lowering {node.name!r} ({node.op}) failed: "
                                f"{type(e).__name__}: {e}") from e
        if outs is None:
            jn = dict(js["nodes"][i])
            jn["inputs"] = [[r.node, r.index, 0] for r in inputs]
            nodes.append(jn)
            outs = tuple(Ref(len(nodes) - 1, k) for k in range(len(node.outputs)))
        elif len(outs) != len(node.outputs):
            raise TofuError(f"lowering {node.name!r} ({node.op}) gave {len(outs)} outputs for "
                            f"its {len(node.outputs)}")
        else:
            lowered = True
        where.update(((i, k), r) for k, r in enumerate(outs))
    if not lowered:
        return graph
    heads = [[where[(e.node, e.index)].node, where[(e.node, e.index)].index, 0]
             for e in graph.heads]
    return _reimport(graph, {**js, "nodes": nodes, "heads": heads,
                             "arg_nodes": [k for k, n in enumerate(nodes) if n["op"] == "null"]})


def _reimport(graph: Graph, js: dict) -> Graph:
    js = dict(js)
    js.pop("node_row_ptr", None)
    symbol = mx.sym.load_json(json.dumps(js))
    variables = {n.name: n for n in graph.variables()}
    kept = symbol.list_arguments() + symbol.list_auxiliary_states()
    if sorted(kept) != sorted(variables):
        raise TofuError(f"lowering changed the graph's inputs: {sorted(set(variables) - set(kept))}"
                        f" no longer read, {sorted(set(kept) - set(variables))} new")
    result = import_symbol(symbol, dtypes={k: v.outputs[0].dtype for k, v in variables.items()},
                           data_names=[n.name for n in graph.variables("data")],
                           **{k: v.outputs[0].shape for k, v in variables.items()})
    return result.replace(nodes=tuple(n.replace(kind=variables[n.name].kind) if n.is_variable
                                      else n for n in result.nodes))


__all__ = ["Emitter", "Ref", "lower"]
