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
(placement). What a hook emits depends on the operator, its parameters and its inputs'
shapes alone: it is called once for each such kind of node, and its nodes are emitted again
for the others (a network's BatchNorms share a handful). The pass knows no operator by name.

The lowered graph is built directly: MXNet infers the shapes and dtypes of each distinct
emitted subgraph once, and the nodes are put in the order, and with the operator names,
that MXNet's own import of the lowered graph would give (so a graph's fingerprint does not
depend on the route). A graph whose nodes carry JSON fields the IR does not model (control
dependencies, subgraphs) goes through MXNet's JSON and a fresh import instead.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Callable, Container, Mapping

import mxnet as mx
import numpy as np

from nnvm_passes.exporter import graph_to_json, symbol_from_json
from nnvm_passes.importer import _VERSION, all_entries_symbol, import_symbol
from nnvm_passes.ir import Entry, FrozenDict, Graph, Node, TensorInfo, format_attr_value, \
    is_hidden_attr
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
        full = _claim(self._names, self._base, name)
        node_attrs = {k: v if isinstance(v, str) else format_attr_value(v)
                      for k, v in attrs.items()}
        node_attrs.update(self._hidden)
        self._nodes.append({"op": op, "name": full, "attrs": node_attrs,
                            "inputs": [[r.node, r.index, 0] for r in inputs]})
        return Ref(len(self._nodes) - 1)


Hook = Callable[..., "tuple[Ref, ...] | None"]


def lowered_from(name: str, names: Container[str]) -> str | None:
    """The operator among ``names`` whose lowering emitted the node ``name`` (the
    :class:`Emitter` names it ``<operator>/<part>``): ``name`` itself where it is one of
    ``names``; None where it comes from none of them."""
    base = name
    while base not in names and "/" in base:
        base = base.rsplit("/", 1)[0]
    return base if base in names else None


def _claim(names: set[str], base: str, suffix: str) -> str:
    """The name ``base/suffix`` of a node lowering ``base`` emits, added to ``names`` (the
    graph's); TofuError if a node has it already."""
    full = f"{base}/{suffix}"
    if full in names:
        raise TofuError(f"lowering {base!r} emits two nodes named {full!r}")
    names.add(full)
    return full


def lower(graph: Graph, lowering_of: Callable[[Any], Hook | None]) -> Graph:
    """``graph`` with each node that ``lowering_of`` gives a hook for replaced by the hook's
    subgraph (``graph`` itself when no hook lowers anything). Variables keep their names,
    shapes, dtypes and kinds; the nodes come in the order MXNet's own import would give
    them (see :func:`_mxnet_order`), and emitted nodes' shapes and dtypes are MXNet's."""
    hooks = {i: lowering_of(node) for i, node in enumerate(graph.nodes) if not node.is_variable}
    if not any(hooks.values()):
        return graph            # nothing to lower
    templates = _Templates(graph, hooks)
    if any(node.extra for node in graph.nodes):   # control deps, subgraphs: through JSON
        return _lower_through_json(graph, templates)
    return _lower_direct(graph, templates)


class _Templates:
    """The :class:`_Template` of each lowered node, recorded once per hook, operator,
    parameters and input shapes (None: its hook keeps it), across graphs (:data:`_RECORDED`)."""

    def __init__(self, graph: Graph, hooks: Mapping[int, Hook | None]):
        self._graph, self._hooks = graph, hooks

    def of(self, i: int) -> "_Template | None":
        hook = self._hooks.get(i)
        if hook is None:
            return None
        node, graph = self._graph.nodes[i], self._graph
        shapes = tuple(graph.tensor(e).shape for e in node.inputs)
        visible = tuple((k, v) for k, v in node.attrs.items() if not is_hidden_attr(k))
        key = (hook, node.op, visible, shapes, len(node.inputs))
        found = _RECORDED.get(key, _UNKNOWN)
        if found is _UNKNOWN:       # a hook is a function of its key alone
            found = _record(hook, node, shapes, len(node.inputs))
            if len(_RECORDED) >= _RECORDED_MOST:
                _RECORDED.clear()
            _RECORDED[key] = found
        return found


#: the templates recorded so far, by hook, operator, parameters and input shapes (a graph's
#: BatchNorms share a few, and a graph planned again shares them all)
_RECORDED: dict[tuple, "_Template | None"] = {}
_RECORDED_MOST = 1 << 12
_UNKNOWN = object()


def _walk(graph: Graph, templates: "_Templates", keep, emit) -> list[tuple[int, int]]:
    """Each node of ``graph`` in order, kept (``keep(index, node, inputs)``) or lowered by its
    template (``emit(node, template, inputs)``), both given the node's inputs as new entries
    ``(position, output)`` and giving its outputs'; the heads' new entries."""
    where: dict[tuple[int, int], tuple[int, int]] = {}    # (old node, output) -> new entry
    for i, node in enumerate(graph.nodes):
        inputs = [where[(e.node, e.index)] for e in node.inputs]
        template = templates.of(i)
        if template is None:
            outs = keep(i, node, inputs)
        else:
            outs = emit(node, template, inputs)
            if len(outs) != len(node.outputs):
                raise TofuError(f"lowering {node.name!r} ({node.op}) gave {len(outs)} outputs "
                                f"for its {len(node.outputs)}")
        where.update(((i, k), r) for k, r in enumerate(outs))
    return [where[(e.node, e.index)] for e in graph.heads]


def _lower_direct(graph: Graph, templates: "_Templates") -> Graph:
    """The lowered graph built directly: each new node made once, at its final position,
    its shapes and dtypes inferred once per template and inputs read."""
    kept: list[Node | None] = []          # new position -> the node kept (None: emitted)
    reads: list[tuple] = []               # new position -> its inputs, (position, output)
    infos: list = []                      # new position -> its outputs' TensorInfo
    spans: list[tuple] = []   # (first position, template, inputs, the lowered node)
    names = {n.name for n in graph.nodes}

    def keep(i: int, node: Node, inputs: list) -> tuple:
        kept.append(node)
        reads.append(tuple(inputs))
        infos.append(node.outputs)
        return tuple((len(kept) - 1, k) for k in range(len(node.outputs)))

    def emit(node: Node, template: _Template, inputs: list) -> tuple:
        first = len(kept)
        for suffix in template.suffixes:
            _claim(names, node.name, suffix)
        n = len(template.nodes)
        kept.extend([None] * n)
        infos.extend([None] * n)
        reads.extend(template.reads_at(first, inputs))
        spans.append((first, template, inputs, node))
        return tuple(template.entry(first, inputs, k, j) for k, j in template.outs)
    heads = _walk(graph, templates, keep, emit)
    made = _typed_spans(spans, infos)
    order = _mxnet_order(reads, heads)
    position = [-1] * len(kept)
    for new, old in enumerate(order):
        position[old] = new
    _check_inputs(graph, [kept[k].name for k in order
                          if kept[k] is not None and kept[k].is_variable])
    nodes = []
    for k in order:
        inputs = tuple([Entry(position[src], index) for src, index in reads[k]])
        node = kept[k]
        if node is not None:
            nodes.append(node.replace(inputs=inputs))
        else:
            name, op, attrs = made[k]
            nodes.append(Node(name=name, op=op, attrs=attrs, inputs=inputs, outputs=infos[k]))
    return graph.replace(nodes=tuple(nodes),
                         heads=tuple(Entry(position[src], index) for src, index in heads))


def _typed_spans(spans: list[tuple], infos: list) -> dict[int, tuple[str, str, FrozenDict]]:
    """Fill ``infos`` for the emitted nodes, inferred by MXNet once per template and what
    it reads (the same operator on the same shapes emits the same nodes: a network's
    BatchNorms share a handful); each emitted node's ``(name, operator, attributes)`` by
    position (MXNet's operator names: ``concat`` is ``Concat``)."""
    signatures: dict[tuple, tuple] = {}     # template and what it reads -> its signature
    attrs_of: dict[tuple, tuple[FrozenDict, ...]] = {}   # (template, hidden) -> each node's
    shared: dict[tuple, FrozenDict] = {}                 # attributes -> one FrozenDict
    made = {}
    for first, template, inputs, node in spans:
        entries = [template.entry(first, inputs, k, j) for k, j in template.outside]
        read = tuple([infos[src][index] for src, index in entries])
        same: dict = {}    # entries read (two inputs may be one entry), numbered in read order
        numbering = tuple([same.setdefault(e, len(same)) for e in entries])
        key = (id(template), read, numbering)
        if key not in signatures:
            signatures[key] = template.signature(first, inputs, infos)
        found = _template_infos(signatures[key])
        hidden = tuple((k, v) for k, v in node.attrs.items() if is_hidden_attr(k))
        attrs_key = (id(template), hidden)
        if attrs_key not in attrs_of:
            frozen = []
            for _, _, attrs, _ in template.nodes:
                items = dict(attrs)
                items.update(hidden)
                frozen.append(shared.setdefault(tuple(items.items()), FrozenDict(items)))
            attrs_of[attrs_key] = tuple(frozen)
        base = node.name
        for k, ((op, outs), (_, suffix, _, _), attrs) in enumerate(
                zip(found, template.nodes, attrs_of[attrs_key])):
            infos[first + k] = outs
            made[first + k] = (f"{base}/{suffix}", op, attrs)
    return made


def _lower_through_json(graph: Graph, templates: "_Templates") -> Graph:
    """The lowered graph through MXNet's JSON and a fresh import (for nodes carrying JSON
    fields the IR does not model)."""
    js = graph_to_json(graph)
    nodes: list[dict] = []
    names = {n.name for n in graph.nodes}

    def keep(i: int, node: Node, inputs: list) -> tuple:
        nodes.append(dict(js["nodes"][i], inputs=[[src, k, 0] for src, k in inputs]))
        return tuple((len(nodes) - 1, k) for k in range(len(node.outputs)))

    def emit(node: Node, template: _Template, inputs: list) -> tuple:
        hidden = {k: v for k, v in node.attrs.items() if is_hidden_attr(k)}
        return template.emit(nodes, node, hidden, names, inputs)
    heads = _walk(graph, templates, keep, emit)
    return _reimport(graph, {**js, "nodes": nodes,
                             "heads": [[src, k, 0] for src, k in heads],
                             "arg_nodes": [k for k, n in enumerate(nodes) if n["op"] == "null"]})


@dataclass(frozen=True)
class _Template:
    """What a hook emitted for one operator, parameters and input shapes, to emit again for
    every node that has them (hooks are functions of those alone): each emitted node's
    operator, name after the lowered node's, attributes (its hidden ones left out) and
    reads, and the lowered node's outputs. A read ``(k, j)`` is emitted node ``k``'s output
    ``j``, or for ``k < 0`` the node's input ``-k - 1`` (its own entry for ``j = -1``, else
    output ``j`` of the node producing it)."""

    nodes: tuple[tuple[str, str, tuple, tuple[tuple[int, int], ...]], ...]
    outs: tuple[tuple[int, int], ...]
    outside: tuple[tuple[int, int], ...]     # the reads of inputs, each once, in read order

    @property
    def suffixes(self) -> tuple[str, ...]:
        """The emitted nodes' names after the lowered node's (``name/suffix``)."""
        return tuple(suffix for _, suffix, _, _ in self.nodes)

    @staticmethod
    def entry(first: int, inputs: list[tuple[int, int]], k: int, j: int) -> tuple[int, int]:
        """The entry ``(position, output)`` a read ``(k, j)`` stands for, the template's
        nodes placed from ``first`` on and the lowered node reading ``inputs``."""
        if k >= 0:
            return (first + k, j)
        source = inputs[-k - 1]
        return source if j == -1 else (source[0], j)

    def reads_at(self, first: int, inputs: list[tuple[int, int]]) -> list[tuple]:
        """Each emitted node's inputs as entries (:meth:`entry`)."""
        entry = self.entry
        return [tuple([entry(first, inputs, k, j) for k, j in reads])
                for _, _, _, reads in self.nodes]

    def signature(self, first: int, inputs: list[tuple[int, int]], infos: list) -> tuple:
        """What :func:`_template_infos` infers the emitted nodes from: per node its operator,
        attributes (hidden ones left out) and reads, a read of the inputs given as ``("in",
        number, shape, dtype)`` (entries numbered in read order), the others as ``(node,
        output)`` in the template; ``infos``: each position's outputs' TensorInfo."""
        outside: dict[tuple[int, int], int] = {}
        signature = []
        for op, _, attrs, reads in self.nodes:
            found = []
            for k, j in reads:
                if k >= 0:
                    found.append((k, j))
                    continue
                e = self.entry(first, inputs, k, j)
                t = infos[e[0]][e[1]]
                found.append(("in", outside.setdefault(e, len(outside)), t.shape, t.dtype))
            signature.append((op, tuple((a, v) for a, v in attrs if not is_hidden_attr(a)),
                              tuple(found)))
        return tuple(signature)

    def emit(self, nodes: list, node: Node, hidden: Mapping[str, str], names: set[str],
             inputs: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
        """Append the template's nodes for ``node`` (reading ``inputs``) to ``nodes``, as
        JSON nodes carrying ``hidden``; its outputs."""
        first = len(nodes)
        emit = Emitter(nodes, node.name, hidden, names)
        for (op, suffix, attrs, _), reads in zip(self.nodes, self.reads_at(first, inputs)):
            emit(op, *(Ref(*r) for r in reads), name=suffix, **dict(attrs))
        return tuple(self.entry(first, inputs, k, j) for k, j in self.outs)


def _record(hook: Hook, node: Node, shapes: tuple, n_inputs: int) -> _Template | None:
    """The :class:`_Template` of ``hook`` on ``node`` (None: the hook keeps the node)."""
    emitted: list[dict] = []
    start = len(node.name) + 1
    try:
        outs = hook(Emitter(emitted, node.name, {}, set()), node.params, shapes,
                    *(Ref(-1 - k, -1) for k in range(n_inputs)))
        if outs is None:
            return None
        reads = [(src, index) for jn in emitted for src, index, _ in jn["inputs"] if src < 0]
        return _Template(tuple((jn["op"], jn["name"][start:], tuple(jn["attrs"].items()),
                                tuple((src, index) for src, index, _ in jn["inputs"]))
                               for jn in emitted),
                         tuple((r.node, r.index) for r in outs), tuple(dict.fromkeys(reads)))
    except Exception as e:  # noqa: BLE001  (re-raised with the node named)
        raise TofuError(f"lowering {node.name!r} ({node.op}) failed: "
                        f"{type(e).__name__}: {e}") from e


@functools.lru_cache(maxsize=256)
def _template_infos(signature: tuple) -> tuple[tuple[str, tuple[TensorInfo, ...]], ...]:
    """Each emitted node's operator as MXNet names it (``concat`` is ``Concat``) and its
    output shapes and dtypes, as MXNet infers them for ``signature``: per node ``(op,
    attributes, reads)``, a read either ``(node, output)`` in the subgraph or ``("in",
    input, shape, dtype)``."""
    inputs = {}
    for _, _, reads in signature:
        for r in reads:
            if r[0] == "in":
                inputs[r[1]] = r[2:]
    n = len(inputs)
    js_nodes = [{"op": "null", "name": f"in{k}", "inputs": []} for k in range(n)]
    for k, (op, attrs, reads) in enumerate(signature):
        js_nodes.append({"op": op, "name": f"n{k}", "attrs": dict(attrs),
                         "inputs": [[r[1], 0, 0] if r[0] == "in" else [n + r[0], r[1], 0]
                                    for r in reads]})
    # every emitted node a head (its outputs counted by MXNet: load, then read back)
    symbol = symbol_from_json({"nodes": js_nodes, "arg_nodes": list(range(n)),
                               "heads": [[n + k, 0, 0] for k in range(len(signature))],
                               "attrs": {"mxnet_version": ["int", _VERSION]}})
    js = json.loads(symbol.tojson())
    everything = all_entries_symbol(js)
    try:
        _, out_shapes, _ = everything.infer_shape_partial(
            **{f"in{k}": s for k, (s, _) in inputs.items()})
        _, out_types, _ = everything.infer_type_partial(
            **{f"in{k}": t for k, (_, t) in inputs.items()})
    except mx.base.MXNetError as e:
        raise TofuError(f"MXNet cannot infer the shapes of a lowering's nodes "
                        f"{[op for op, _, _ in signature]}: {str(e).strip()[:300]}") from e
    rows, row_ptr = {}, js["node_row_ptr"]
    for p, jn in enumerate(js["nodes"]):
        rows[jn["name"]] = range(row_ptr[p], row_ptr[p + 1])
    ops = {jn["name"]: jn["op"] for jn in js["nodes"]}
    return tuple((ops[f"n{k}"], tuple(TensorInfo(tuple(int(d) for d in out_shapes[r]),
                                                 np.dtype(out_types[r]).name)
                                      for r in rows[f"n{k}"]))
                 for k in range(len(signature)))


def _mxnet_order(reads: list[tuple], heads: list[tuple[int, int]]) -> list[int]:
    """The nodes reachable from ``heads`` in nnvm's post-order depth-first order (from each
    head in turn, inputs in order), the order a symbol's JSON lists them in; ``reads``:
    each node's inputs as ``(node, output)``."""
    order, seen = [], [False] * len(reads)
    for head, _ in heads:
        if seen[head]:
            continue
        seen[head] = True
        stack = [(head, iter(reads[head]))]     # each node's inputs, resumed where left
        while stack:
            k, pending = stack[-1]
            for src, _ in pending:
                if not seen[src]:
                    seen[src] = True
                    stack.append((src, iter(reads[src])))
                    break
            else:
                order.append(k)
                stack.pop()
    return order


def _reimport(graph: Graph, js: dict) -> Graph:
    js = dict(js)
    js.pop("node_row_ptr", None)
    symbol = symbol_from_json(js)
    variables = {n.name: n for n in graph.variables()}
    _check_inputs(graph, symbol.list_arguments() + symbol.list_auxiliary_states())
    result = import_symbol(symbol, dtypes={k: v.outputs[0].dtype for k, v in variables.items()},
                           data_names=[n.name for n in graph.variables("data")],
                           **{k: v.outputs[0].shape for k, v in variables.items()})
    return result.replace(nodes=tuple(n.replace(kind=variables[n.name].kind) if n.is_variable
                                      else n for n in result.nodes))


def _check_inputs(graph: Graph, names: list[str]) -> None:
    """TofuError unless the lowered graph reads exactly ``graph``'s variables (``names``)."""
    variables, kept = {n.name for n in graph.variables()}, set(names)
    if kept != variables:
        raise TofuError(f"lowering changed the graph's inputs: {sorted(variables - kept)} no "
                        f"longer read, {sorted(kept - variables)} new")


__all__ = ["Emitter", "Ref", "lower"]
