"""Which tensors the backward pass keeps: read from MXNet's own gradient graphs.

MXNet keeps a forward tensor alive until the backward pass when some backward node reads
it: a convolution's gradient reads its input, a ReLU's its output, an addition's nothing.
Rather than a hand-written table, :func:`backward_reads` binds the operator alone (its
attributes, the graph's shapes and dtypes, a gradient for every floating input) and reads
the gradient nodes' inputs from the executor's graph (``Executor.debug_str``). Binding only
plans memory (nothing is computed, and untouched pages cost nothing), and the answer is
cached per operator, attributes and input ranks.

:func:`kept_for_backward` applies it to a graph: the operator outputs some backward node
reads. Their bytes are the activations a device holds at the end of the forward pass.

:func:`passes_gradient_through` reads the same graph for another fact the rewrite needs: an
operator like ``elemwise_add`` has no gradient node of its own, its inputs' gradients *are*
its output's gradient, wherever MXNet happened to place that.
"""
from __future__ import annotations

import functools
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Mapping

import mxnet as mx
import numpy as np

from nnvm_passes.ir import FrozenDict, Graph, Node

#: the attribute asking MXNet's gradient pass to build a node again in the backward pass
MIRROR = "__force_mirroring__"

_REF = re.compile(r"^\s*arg\[(\d+)\]=(.+)\((\d+)\)")
_OP = re.compile(r"^Op:(\S+), Name=(.+)$", re.M)
_OUTPUT = re.compile(r"^\s*output\[\d+\]=(.*)\(\d+\)$", re.M)
#: gradient helpers that read an input only for its shape and type (MXNet's FIgnoreInputs):
#: the input positions they ignore
_SHAPE_ONLY = {"_identity_with_attr_like_rhs": {1}, "zeros_like": {0}, "ones_like": {0}}


@dataclass(frozen=True)
class _Gradient:
    inputs: frozenset[int]      # input positions the gradient reads
    outputs: frozenset[int]     # output positions the gradient reads
    passes_through: bool        # some input's gradient is made where the output's is summed


def _gradient(node: Node, graph: Graph) -> _Gradient:
    nodes = graph.nodes
    infos = [nodes[e.node].outputs[e.index] for e in node.inputs]
    dtypes = tuple([i.dtype for i in infos])
    # first by the node's own attribute mapping (hashed once, shared by nodes)
    quick = (node.op, node.attrs, tuple([len(i.shape) for i in infos]), dtypes,
             len(node.outputs))
    found = _BY_NODE_ATTRS.get(quick)
    if found is not None:
        return found
    attrs = _visible(node.attrs)
    shapes = tuple(i.shape for i in infos)
    key = (node.op, attrs, quick[2], dtypes, len(node.outputs))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        found = _CACHE[key]
    else:
        found = _CACHE[key] = _derive(node.op, attrs, shapes, dtypes, len(node.outputs))
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    if len(_BY_NODE_ATTRS) >= _CACHE_SIZE:
        _BY_NODE_ATTRS.clear()
    _BY_NODE_ATTRS[quick] = found
    return found


@functools.lru_cache(maxsize=1 << 12)
def _visible(attrs: FrozenDict) -> tuple[tuple[str, str], ...]:
    """A node's operator attributes, sorted (cached: nodes share their attributes)."""
    return tuple(sorted((k, str(v)) for k, v in attrs.items() if not k.startswith("__")))


def backward_reads(node: Node, graph: Graph) -> tuple[frozenset[int], frozenset[int]]:
    """``(inputs, outputs)``: the positions of ``node``'s inputs and outputs that its
    gradient reads, as MXNet builds it."""
    g = _gradient(node, graph)
    return g.inputs, g.outputs


def passes_gradient_through(node: Node, graph: Graph) -> bool:
    """Whether some input's gradient is made on the device where ``node``'s output gradient
    is summed, not on ``node``'s: the output gradient itself, with no gradient node of
    ``node``'s own between them (``elemwise_add``, ``add_n``), or made by operators MXNet
    places with their inputs (``transpose``, whose gradient is a ``transpose``; only
    ``_backward_*`` operators are placed with their forward node). True when unknown."""
    return _gradient(node, graph).passes_through


#: gradient structures derived, by operator, attributes, input ranks, dtypes and output count
#: (the structure does not depend on sizes); the least recently used is dropped past the size
_CACHE: OrderedDict[tuple, _Gradient] = OrderedDict()
_CACHE_SIZE = 1 << 12
#: the same, by a node's raw attribute mapping (hidden attributes included): a dict lookup
#: per node, where the key above sorts the attributes (emptied when full)
_BY_NODE_ATTRS: dict[tuple, _Gradient] = {}


def _derive(op: str, attrs: tuple, shapes: tuple, dtypes: tuple, n_outputs: int) -> _Gradient:
    from tofu_mx.tdl.registry import single_op_symbol

    n = len(shapes)
    floating = [np.issubdtype(np.dtype(t), np.floating) for t in dtypes]
    if not any(floating):
        return _Gradient(frozenset(), frozenset(), False)
    # the upper bound when MXNet cannot tell: reads everything, may pass through
    everything = _Gradient(frozenset(range(n)), frozenset(range(n_outputs)), True)
    sym = single_op_symbol(op, dict(attrs), n, n_outputs)
    req = {f"in{i}": "write" if f else "null" for i, f in enumerate(floating)}
    types = {f"in{i}": t for i, t in enumerate(dtypes)}
    shapes = _small_shapes(op, attrs, n_outputs, shapes, types)
    if shapes is None:   # too big to bind and no smaller batch fits: an upper bound
        return everything
    text = _gradient_graph_text(sym, dict(zip(types, shapes)), types, req)
    if text is None:     # cannot bind it alone: the gradient reads everything (an upper bound)
        return everything
    # the executor's outputs: the forward outputs, then one gradient per floating input,
    # each made by a node MXNet names after the operator ("op_backward", ...) unless the
    # head gradient itself is handed on (maybe through an unnamed copy)
    grads = _OUTPUT.findall(text.split("Variable:", 1)[0])[n_outputs:]
    passes = any(not name.startswith("op") for name in grads)
    ins, outs = set(), set()
    forward_done = False
    gradient_ops = []
    for section in text.split("--------------------"):
        head = _OP.search(section)
        if head is None:
            continue
        if head.group(2) == "op":
            forward_done = True
            continue
        if forward_done and head.group(1) not in _SHAPE_ONLY:
            gradient_ops.append(head.group(1))
        ignored = _SHAPE_ONLY.get(head.group(1), set())
        for line in section.splitlines():
            m = _REF.match(line)
            if not forward_done or not m or int(m.group(1)) in ignored:
                continue
            name, index = m.group(2), int(m.group(3))
            if name == "op":
                outs.add(index)
            elif re.fullmatch(r"in\d+", name):
                ins.add(int(name[2:]))
    # MXNet places a backward operator (``_backward_*``) with its forward node, any other
    # operator with its inputs: a gradient made only of those (transpose's is a transpose)
    # is made wherever the output's gradient was summed, as a handed-on gradient is
    follows = bool(gradient_ops) and not any("backward" in op for op in gradient_ops)
    return _Gradient(frozenset(ins), frozenset(outs), passes or follows)


def _gradient_graph_text(sym: mx.sym.Symbol, shapes: dict, types: dict, req: dict) -> str | None:
    """``Executor.debug_str()`` of ``sym`` bound on the CPU with a gradient for each input
    ``req`` marks "write"; None when MXNet cannot bind it.

    Every array is ``nd.empty``: its pages are never touched, so binding costs address space,
    not memory. ``simple_bind`` zero-fills its arrays on MXNet's engine threads after it
    returns, which holds their bytes (gigabytes for one WResNet's operators) until the engine
    drains; it is used only where MXNet refuses a dense gradient array (a sparse gradient:
    Embedding with ``sparse_grad``), and then waited for."""
    try:
        return _bind_unfilled(sym, shapes, types, req).debug_str()
    except (mx.base.MXNetError, RuntimeError):
        pass
    try:
        text = sym.simple_bind(mx.cpu(), grad_req=req, type_dict=types, **shapes).debug_str()
    except (mx.base.MXNetError, RuntimeError):     # simple_bind re-raises as RuntimeError
        return None
    mx.nd.waitall()      # the executor is gone: its arrays' fills, then their frees, run now
    return text


def _bind_unfilled(sym: mx.sym.Symbol, shapes: dict, types: dict,
                   req: dict) -> mx.executor.Executor:
    arg_shapes, _, aux_shapes = sym.infer_shape(**shapes)
    arg_types, _, aux_types = sym.infer_type(**types)
    if arg_shapes is None or arg_types is None:
        raise mx.base.MXNetError(f"cannot infer the shapes or dtypes from {shapes}, {types}")
    names = sym.list_arguments()
    args = {n: mx.nd.empty(s, dtype=t) for n, s, t in zip(names, arg_shapes, arg_types)}
    grads = {n: mx.nd.empty(s, dtype=t) for n, s, t in zip(names, arg_shapes, arg_types)
             if req.get(n) == "write"}
    aux = [mx.nd.empty(s, dtype=t) for s, t in zip(aux_shapes, aux_types)]
    return sym.bind(mx.cpu(), args, args_grad=grads,
                    grad_req={n: req.get(n, "null") for n in names}, aux_states=aux)


#: largest input bytes bound as they are, and with the batch cut to 1 (binding reserves address
#: space for the arrays, their gradients and the executor's buffers; weights cannot be cut)
_BIND_LIMIT, _SMALL_LIMIT = 256 << 20, 2 << 30


def _small_shapes(op: str, attrs: tuple, n_outputs: int, shapes: tuple,
                  types: dict) -> tuple | None:
    """Shapes to bind the operator with: the graph's when small, else the same with the
    leading (batch) axis cut to 1 on every input that shares the first input's leading size,
    when MXNet accepts that; None when neither fits. The gradient's structure does not
    depend on shapes."""
    from tofu_mx.tdl.shares import inferred_shapes

    def nbytes(ss):
        return sum(int(np.prod(x)) * np.dtype(t).itemsize for x, t in zip(ss, types.values()))
    if nbytes(shapes) <= _BIND_LIMIT:
        return shapes
    lead = shapes[0][0] if shapes and shapes[0] else None
    small = tuple((1,) + tuple(x[1:]) if x and x[0] == lead else x for x in shapes)
    if nbytes(small) > _SMALL_LIMIT or \
            inferred_shapes(op, FrozenDict(attrs), small, n_outputs) is None:
        return None
    return small


def gradient_reads(graph: Graph, grads: Mapping[tuple[int, int], bool]
                   ) -> dict[int, tuple[frozenset[int], frozenset[int]]]:
    """:func:`backward_reads` of every operator with a gradient node (one of its outputs
    carries a gradient: ``grads``), by node index."""
    found = {}
    nodes = graph.nodes
    # by operator, attributes and input tensors' infos (objects alive in the graph, shared)
    known: dict[tuple, tuple[frozenset[int], frozenset[int]]] = {}
    for i, node in enumerate(nodes):
        if node.is_variable:
            continue
        outputs = node.outputs
        if grads[(i, 0)] if len(outputs) == 1 else \
                any(grads[(i, j)] for j in range(len(outputs))):
            key = (node.op, id(node.attrs), len(outputs),
                   *[id(nodes[e.node].outputs[e.index]) for e in node.inputs])
            reads = known.get(key)
            if reads is None:
                g = _gradient(node, graph)
                reads = known[key] = (g.inputs, g.outputs)
            found[i] = reads
    return found


def kept_for_backward(graph: Graph, grads: Mapping[tuple[int, int], bool],
                      reads: Mapping[int, tuple[frozenset[int], frozenset[int]]] | None = None
                      ) -> dict[tuple[int, int], frozenset[int]]:
    """For every operator output ``(node, index)``: the nodes whose gradient reads it (the
    producer itself when its gradient reads its output; empty when the tensor is not kept).
    A tensor read on another device is held there, in the copy MXNet makes for that device.
    ``grads``: whether each tensor carries a gradient (an operator has a gradient node when
    one of its outputs does); ``reads``: :func:`gradient_reads` of the graph, if made already.

    A node marked ``__force_mirroring__`` is built again in the backward pass, from its
    inputs, and MXNet's gradient pass reads that copy instead: its gradient holds none of its
    own outputs, and what it reads is built again in turn where marked; the unmarked tensors
    beneath are held, by the marked node reading them."""
    kept = kept_tensors(graph, grads, reads)
    none: frozenset[int] = frozenset()
    return {(i, j): kept.get((i, j), none)
            for i, n in enumerate(graph.nodes) if n.op != "null" for j in range(len(n.outputs))}


def kept_tensors(graph: Graph, grads: Mapping[tuple[int, int], bool],
                 reads: Mapping[int, tuple[frozenset[int], frozenset[int]]] | None = None
                 ) -> dict[tuple[int, int], frozenset[int]]:
    """The operator outputs :func:`kept_for_backward` keeps (those alone: a large graph's
    plan counts them without a key per tensor), with the nodes whose gradient reads each."""
    mirrored = mirrored_nodes(graph)
    nodes = graph.nodes
    kept: dict[tuple[int, int], set[int]] = {}     # the tensors some gradient reads
    held: set[tuple[int, int]] = set()    # (mirrored node, input position) already followed

    def hold(e, reader: int) -> None:
        """``reader`` (or, when marked, its copy) reads entry ``e`` in the backward pass.
        (A loop over pending reads, not recursion: a recursive inner function would make a
        reference cycle, keeping the graph alive until the garbage collector finds it.)"""
        pending = [(e, reader)]
        while pending:
            e, reader = pending.pop()
            if nodes[e.node].op == "null":      # a variable
                continue
            if reader not in mirrored or e.node not in mirrored:
                kept.setdefault((e.node, e.index), set()).add(reader)
                continue
            for p, inner in enumerate(nodes[e.node].inputs):   # the copy's input, in turn
                if (e.node, p) not in held:
                    held.add((e.node, p))
                    pending.append((inner, e.node))

    if reads is None:
        reads = gradient_reads(graph, grads)
    for i, (ins, outs) in reads.items():
        node = nodes[i]
        if i in mirrored:     # its copy runs again, from all its inputs
            for p, e in enumerate(node.inputs):
                if (i, p) not in held:
                    held.add((i, p))
                    hold(e, i)
            continue
        for j in outs:
            kept.setdefault((i, j), set()).add(i)
        inputs = node.inputs
        for p in ins:       # hold(), for a reader not marked: it reads the tensor itself
            e = inputs[p]
            if nodes[e.node].op != "null":
                kept.setdefault((e.node, e.index), set()).add(i)
    return {tensor: frozenset(readers) for tensor, readers in kept.items()}


def mirrored_nodes(graph: Graph) -> frozenset[int]:
    """The operators marked ``__force_mirroring__``: MXNet builds them again in the backward
    pass instead of keeping their outputs."""
    return frozenset(i for i, n in enumerate(graph.nodes)
                     if not n.is_variable and _flag(n.attrs.get(MIRROR)))


def _flag(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("true", "1")
