"""What one operator costs a device, read from its TDL description: its floating-point
operations and the bytes it reads and writes (the inputs of :func:`formulas.compute_time`).

The description already says what each output element is; its FLOPs are counted on that
expression, so no operator is known here by name:

- an arithmetic operation, a comparison, or a function call (``exp``, ``rsqrt``) is one;
- a reduction (``Sum``, ``Max``) adds one accumulation per element it reduces;
- reading a tensor, a constant or an index costs nothing;

and each operation is counted once per distinct value of the index variables beneath it, as
a kernel computes it: BatchNorm's mean over (batch, height, width) is summed once per
channel, not once per output element. A fully connected layer of
batch B, I inputs and O outputs with a bias is ``B O (2 I + 1)``. The bytes are every input
read once and every output written once (the roofline's memory traffic). Operators without
a description (opaque ones) are not costed here: :func:`operator_work` gives None.

The backward pass is costed from the same expression: an input's gradient repeats each
operation that reads the input, directly or beneath it (the chain rule takes one step back
through each), so ``Work.input_flops`` counts, per input, the operations whose operands
reach it. A fully connected layer's data and weight are each ``B O (2 I + 1)`` (a matrix
product as large as the forward one), its bias ``B O``; a ReLU's input, one per element.
An input that needs no gradient (the data of the first layer) costs its operator nothing
backward.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Mapping

from nnvm_passes.ir import FrozenDict, Graph
from tofu_mx.tdl.annotate import described
from tofu_mx.tdl.lang import (Access, Affine, Bin, Cmp, Const, DataIndex, Depends, Expr,
                              IndexValue, InRange, Reduce, Unary, Where, index_nodes)
from tofu_mx.tdl.registry import TDLError, Traced, generation


@dataclass(frozen=True)
class Work:
    """One operator's forward work: ``flops`` and the ``nbytes`` it reads and writes; and per
    input position, the FLOPs of the operations that read it (``input_flops``: what its
    gradient repeats, see the module's docstring)."""

    flops: float
    nbytes: int
    input_flops: tuple[float, ...] = ()

    def backward_flops(self, needed) -> float:
        """FLOPs of the gradients of the inputs ``needed`` says (a flag per input)."""
        return sum(f for f, n in zip(self.input_flops, needed) if n)


def expression_flops(expr: Expr, extents: Mapping[str, int]) -> float:
    """FLOPs of evaluating ``expr`` at every value of the index variables it depends on
    (see the module's docstring); ``extents``: every variable's extent. A subexpression
    the expression holds twice (the same object) is computed once."""
    return _Counter(extents).count(expr)[0]


class _Counter:
    """Each node costs its own operation once per distinct value of the variables its
    subtree reads; ``count`` gives ``(FLOPs, free variables)``. ``by_input``: per input
    position, the FLOPs of the operations whose subtree reads it."""

    def __init__(self, extents: Mapping[str, int]):
        self.extents, self.seen = dict(extents), {}
        self.by_input: dict[int, float] = {}
        self._reads: dict[int, tuple[object, frozenset]] = {}

    def own(self, expr, flops: float) -> float:
        """``flops`` of ``expr``'s own operation, charged to every input beneath it."""
        for position in self.reads(expr):
            self.by_input[position] = self.by_input.get(position, 0.0) + flops
        return flops

    def reads(self, obj) -> frozenset:
        """The input positions a part of an expression reads (its accesses, at any depth)."""
        if isinstance(obj, tuple):
            return frozenset().union(*(self.reads(x) for x in obj))
        if not dataclasses.is_dataclass(obj):
            return frozenset()
        if id(obj) not in self._reads:
            found = {obj.tensor.position} if isinstance(obj, Access) else set()
            for f in dataclasses.fields(obj):
                found |= self.reads(getattr(obj, f.name))
            self._reads[id(obj)] = (obj, frozenset(found))   # kept alive: its id stays its own
        return self._reads[id(obj)][1]

    def count(self, expr: Expr) -> tuple[float, frozenset]:
        if id(expr) in self.seen:          # computed once already: its value is reused
            return 0.0, self.seen[id(expr)][1]
        found = self._count(expr)
        self.seen[id(expr)] = (expr, found[1])   # the object kept alive: its id stays its own
        return found

    def _count(self, expr: Expr) -> tuple[float, frozenset]:
        if isinstance(expr, Const):
            return 0.0, frozenset()
        if isinstance(expr, IndexValue):
            return self.indices([expr.index])
        if isinstance(expr, Access):
            return self.indices(expr.indices)
        if isinstance(expr, Depends):
            return self.count(expr.value)
        if isinstance(expr, Reduce):
            self.extents.update((v.name, e) for v, e in zip(expr.vars, expr.extents)
                                if e is not None)
            flops, free = self.count(expr.body)
            names = frozenset(v.name for v in expr.vars)
            return flops + self.own(expr, self.times(free | names)), free - names
        if isinstance(expr, Where):
            parts = [self.condition(expr.cond), self.count(expr.a), self.count(expr.b)]
        elif isinstance(expr, Bin):
            parts = [self.count(expr.a), self.count(expr.b)]
        elif isinstance(expr, Unary):
            parts = [self.count(expr.a)]
        else:
            raise TDLError(f"cannot count the FLOPs of {type(expr).__name__} {expr!r}")
        free = frozenset().union(*(v for _, v in parts))
        return sum(f for f, _ in parts) + self.own(expr, self.times(free)), free

    def condition(self, cond: Cmp | InRange) -> tuple[float, frozenset]:
        if isinstance(cond, InRange):
            flops, free = self.indices([cond.index])
            return flops + self.own(cond, self.times(free)), free
        (fa, va), (fb, vb) = self.count(cond.a), self.count(cond.b)
        return fa + fb + self.own(cond, self.times(va | vb)), va | vb

    def indices(self, indices) -> tuple[float, frozenset]:
        """The variables index expressions read (and the FLOPs of data-dependent ones)."""
        flops, free = 0.0, set()
        for i in index_nodes(indices):
            if isinstance(i, Affine):
                free.update(name for name, _ in i.terms)
            elif isinstance(i, DataIndex):
                f, v = self.count(i.value)
                flops += f
                free |= v
        return flops, frozenset(free)

    def times(self, names: frozenset) -> float:
        return float(math.prod(self.extents[n] for n in names))


def traced_flops(traced: Traced) -> float:
    """FLOPs of a traced description: every output's expression, its output variables
    ranging over the output's shape."""
    return _traced_work(traced)[0]


def _traced_work(traced: Traced) -> tuple[float, tuple[float, ...]]:
    """FLOPs of a traced description, and per input position those of the operations that
    read it."""
    total, by_input = 0.0, {}
    for o in traced.outputs:
        counter = _Counter({**traced.extents, **{v.name: n for v, n in zip(o.vars, o.shape)}})
        total += counter.count(o.expr)[0]
        for position, flops in counter.by_input.items():
            by_input[position] = by_input.get(position, 0.0) + flops
    return total, tuple(by_input.get(p, 0.0) for p in range(len(traced.inputs)))


def operator_work(graph: Graph, index: int) -> Work | None:
    """The forward work of operator ``index`` of ``graph``, or None when it has no
    description."""
    node = graph.nodes[index]
    found = _flops(node.op, node.attrs,
                   tuple(graph.tensor(e).shape for e in node.inputs),
                   tuple(t.shape for t in node.outputs), generation())
    if found is None:
        return None
    flops, by_input = found
    return Work(flops, operator_bytes(graph, index),
                by_input + (0.0,) * (len(node.inputs) - len(by_input)))


@functools.lru_cache(maxsize=1 << 14)
def _flops(op: str, attrs: FrozenDict, ins: tuple, outs: tuple,
           _generation: int) -> tuple[float, tuple[float, ...]] | None:
    """A partitioned graph holds many alike shards: each is traced and counted once."""
    found = described(op, attrs, ins, outs)
    return None if found is None else _traced_work(found[1])


def operator_bytes(graph: Graph, index: int) -> int:
    """Bytes operator ``index`` reads and writes: each input once, each output once."""
    node = graph.nodes[index]
    return sum(graph.tensor(e).nbytes for e in node.inputs) + \
        sum(t.nbytes for t in node.outputs)


__all__ = ["Work", "expression_flops", "operator_bytes", "operator_work", "traced_flops"]
