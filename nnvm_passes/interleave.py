"""Interleave the blocks a split cuts, back to the weights they are computed from.

An LSTM cell computes its four gates as one FullyConnected output of ``4 * hidden``
features, cut into four consecutive blocks by ``split``; the cell update then combines the
gates element by element. A plan splitting that output's features over k devices gives each
device whole gates (at k = 4, device j gate j), and every cell converts: the cell update
needs, on each device, the same hidden units of all four gates.

This pass stores the weights that output is computed from with the blocks *interleaved*
(:class:`~nnvm_passes.ir.Interleave`: feature ``h * 4 + j`` is gate ``j``'s unit ``h``), so
that the output comes out interleaved too, and reads the gates back as
``split(Reshape(x, (..., hidden, 4)), axis=-1, squeeze_axis=True)``: a contiguous slice of
the features is then a slice of every gate, and the plan can split the cell without
converting it. The graph computes the same outputs from the caller's arrays laid out as
:attr:`Graph.layouts <nnvm_passes.ir.Graph.layouts>` says (the runtime lays them out and
back, :class:`~nnvm_passes.program.VarShard`).

Which operators carry the interleaving is read off their descriptions, not their names
(injected as ``passes`` and ``splits``, :mod:`tofu_mx.tdl.axes`): from each split's input,
backwards through operators that pass the axis element for element (FullyConnected's output
features to its weight's rows and bias, elementwise operators to their operands) to the
weights; and forwards to every other reader of those values, which must pass it on too or
be a split into the same blocks. Anything else (a graph output, a data input, an operator
mixing the axis's positions, a split into other blocks) leaves that whole connected part as
it is.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Mapping

from nnvm_passes.ir import Entry, FrozenDict, Graph, Interleave, Node, TensorInfo, \
    format_attr_value, is_hidden_attr

#: ``(node, output, axis)`` -> ``{input position: its axis}`` (the output's elements along the
#: axis read those inputs' elements at the same positions and nothing else depends on them),
#: or None
Passes = Callable[[Node, int, int], "Mapping[int, int] | None"]
#: node -> ``(axis, blocks)`` where its outputs are its input 0's equal consecutive blocks
#: along the axis, or None
Splits = Callable[[Node], "tuple[int, int] | None"]

Value = tuple[int, int]     # (node, output)


def interleave(graph: Graph, passes: Passes, splits: Splits) -> Graph:
    """``graph`` with every split that can read its blocks interleaved doing so, and the
    weights they come from laid out interleaved (:attr:`Graph.layouts`); ``graph`` itself
    where none can."""
    readers: dict[Value, list[tuple[int, int]]] = {}
    for i, node in enumerate(graph.nodes):
        for p, e in enumerate(node.inputs):
            readers.setdefault((e.node, e.index), []).append((i, p))
    heads = {(e.node, e.index) for e in graph.heads}
    seen: set[int] = set()
    terminals: dict[int, tuple[int, int]] = {}
    layouts: dict[str, Interleave] = {}
    for i, node in enumerate(graph.nodes):
        if i in seen or node.is_variable:
            continue
        split = splits(node)
        if split is None:
            continue
        ok, ends, weights = _component(graph, readers, heads, passes, splits, i, *split)
        seen.update(ends)       # a part fails or not whichever of its splits it is found from
        if ok and weights:
            terminals.update({t: split for t in ends})
            layouts.update({name: Interleave(axis, split[1]) for name, axis in weights.items()})
    if not terminals:
        return graph
    return _rewritten(graph, terminals, layouts)


def _component(graph: Graph, readers, heads, passes: Passes, splits: Splits, start: int,
               axis: int, blocks: int) -> tuple[bool, set[int], dict[str, int]]:
    """Whether the part of the graph connected to split ``start``'s input through values
    whose ``axis``-th elements pass on one for one (see the module docstring) can be
    interleaved, its splits (those found, where not) and its weights with their axes."""
    nodes = graph.nodes
    axis_of: dict[Value, int] = {}
    ends: set[int] = {start}
    weights: dict[str, int] = {}
    queue: deque[Value] = deque()

    def want(value: Value, a: int) -> bool:
        if value in axis_of:
            return axis_of[value] == a
        axis_of[value] = a
        queue.append(value)
        return True

    first = nodes[start].inputs[0]
    want((first.node, first.index), axis)
    while queue:
        value = queue.popleft()
        a = axis_of[value]
        node = nodes[value[0]]
        if value in heads or node.outputs[value[1]].shape[a] % blocks:
            return False, ends, weights
        if node.is_variable:                # a weight, laid out interleaved
            if node.kind != "param":
                return False, ends, weights
            weights[node.name] = a
        else:                               # what it is computed from
            read = passes(node, 0, a) if len(node.outputs) == 1 else None
            if read is None:
                return False, ends, weights
            for p, b in read.items():
                e = node.inputs[p]
                if not want((e.node, e.index), b):
                    return False, ends, weights
        for r, p in readers.get(value, ()):      # what reads it
            reader = nodes[r]
            if p == 0 and splits(reader) == (a, blocks):
                ends.add(r)
                continue
            out = [c for c in range(len(reader.outputs[0].shape))
                   if (passes(reader, 0, c) or {}).get(p) == a] \
                if len(reader.outputs) == 1 else []
            if len(out) != 1 or not want((r, 0), out[0]):
                return False, ends, weights
    return True, ends, weights


def _rewritten(graph: Graph, terminals: Mapping[int, tuple[int, int]],
               layouts: Mapping[str, Interleave]) -> Graph:
    """Each split of ``terminals`` replaced by a Reshape of its input to ``(..., length //
    blocks, blocks, ...)`` and a split of the new axis (its outputs squeezed: the same
    shapes), keeping its name and hidden attributes; the nodes after it moved along."""
    nodes: list[Node] = []
    position: dict[int, int] = {}

    def entry(e: Entry) -> Entry:
        return Entry(position[e.node], e.index, e.version)
    names = {n.name for n in graph.nodes}
    for i, node in enumerate(graph.nodes):
        inputs = tuple(entry(e) for e in node.inputs)
        if i not in terminals:
            position[i] = len(nodes)
            nodes.append(node.replace(inputs=inputs))
            continue
        axis, blocks = terminals[i]
        source = graph.tensor(node.inputs[0])
        shape = source.shape[:axis] + (source.shape[axis] // blocks, blocks) + \
            source.shape[axis + 1:]
        hidden = {k: v for k, v in node.attrs.items() if is_hidden_attr(k)}
        name = _free(names, f"{node.name}_interleaved")
        nodes.append(Node(name, "Reshape", FrozenDict(
            {"shape": format_attr_value(shape), **hidden}), inputs[:1],
            (TensorInfo(shape, source.dtype),)))
        position[i] = len(nodes)
        nodes.append(Node(node.name, "SliceChannel", FrozenDict(
            {"num_outputs": str(blocks), "axis": str(axis + 1), "squeeze_axis": "True",
             **hidden}), (Entry(len(nodes) - 1, 0),), node.outputs))
    return graph.replace(nodes=tuple(nodes), heads=tuple(entry(e) for e in graph.heads),
                         layouts=FrozenDict({**graph.layouts, **layouts}))


def _free(names: set[str], name: str) -> str:
    """``name``, or ``name_<n>`` for the first n not taken; claimed in ``names``."""
    found, n = name, 1
    while found in names:
        found, n = f"{name}_{n}", n + 1
    names.add(found)
    return found


__all__ = ["interleave"]
