"""Axes an operator passes through element for element, read off its traced description.

:func:`passed_axes` answers, for one output axis of a traced operator, which axis of which
input each of its elements is read at: where the output's index variable for that axis
appears only as a plain index of those inputs' axes (never offset, scaled, compared, used
as a number, or beside another read of the same input axis at another position), permuting
that axis of the inputs permutes the output's alike (FullyConnected's output features and
its weight's rows and bias; every axis of an elementwise operator). :func:`block_split`
recognises an operator whose outputs are the equal consecutive blocks of one input axis
(``split`` without ``squeeze_axis``). :mod:`nnvm_passes.interleave` reads both to store an
LSTM's gates interleaved (each device then holds a slice of every gate).
"""
from __future__ import annotations

from tofu_mx.tdl.lang import Access, Affine, IndexValue, InRange, Where, index_nodes
from tofu_mx.tdl.registry import Traced, walk


def _mentions(index, name: str) -> bool:
    return any(isinstance(n, Affine) and any(v == name for v, _ in n.terms)
               for n in index_nodes((index,)))


def passed_axes(traced: Traced, k: int, axis: int) -> dict[int, int] | None:
    """``{input position: input axis}`` where output ``k``'s element at position ``i`` of
    ``axis`` reads those inputs at position ``i`` of those axes, and nothing else depends on
    ``i``; None where it is not so (see the module docstring). Inputs not read along the
    axis (a bias broadcast over it, a weight of a per-sample operator) are not listed."""
    out = traced.outputs[k]
    var = out.vars[axis].name
    extent = out.shape[axis]
    found: dict[int, int] = {}
    accesses = []
    for e in walk(out.expr):
        if isinstance(e, IndexValue) and _mentions(e.index, var):
            return None
        if isinstance(e, Where) and isinstance(e.cond, InRange) and _mentions(e.cond.index, var):
            return None
        if not isinstance(e, Access):
            continue
        accesses.append(e)
        at = [b for b, i in enumerate(e.indices) if _mentions(i, var)]
        if len(at) > 1:
            return None
        for b in at:
            if (not isinstance(e.indices[b], Affine) or e.indices[b].single_var() != var
                    or e.tensor.shape[b] != extent):
                return None
            if found.setdefault(e.tensor.position, b) != b:
                return None
    # an input read along that axis at its element's position must be read so everywhere
    for e in accesses:
        b = found.get(e.tensor.position)
        if b is not None and not _mentions(e.indices[b], var):
            return None
    return found


def block_split(traced: Traced) -> tuple[int, int] | None:
    """``(axis, blocks)`` where the operator's outputs are, in order, the ``blocks`` equal
    consecutive blocks of its input 0 along ``axis`` (2 or more, each output that input's
    rank); None otherwise."""
    outputs = traced.outputs
    if len(outputs) < 2:
        return None
    source = traced.inputs[0]
    if source is None:
        return None
    axis = None
    for k, out in enumerate(outputs):
        e = out.expr
        if (not isinstance(e, Access) or e.tensor.position != 0 or e.pad is not None
                or len(e.indices) != len(out.vars) or len(out.shape) != len(source.shape)):
            return None
        for b, (i, v) in enumerate(zip(e.indices, out.vars)):
            if not isinstance(i, Affine):
                return None
            if i.single_var() == v.name:
                continue
            size = out.shape[b]
            if (i.terms != ((v.name, 1),) or i.const != k * size or axis not in (None, b)
                    or source.shape[b] != len(outputs) * size):
                return None
            axis = b
        if axis is None and k > 0:
            return None
    return None if axis is None else (axis, len(outputs))


__all__ = ["block_split", "passed_axes"]
