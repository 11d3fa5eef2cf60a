"""Creation operators: _zeros, _ones, _full, _arange, zeros_like, ones_like,
_contrib_arange_like, shape_array, size_array.

None of them passes a gradient on (MXNet gives ``*_like``, ``arange_like``, ``shape_array``
and ``size_array`` zero gradients, or none). The ones without inputs fix their output's shape in an
attribute, so a share that creates a slice runs with the slice's ``shape`` (and, for an
``arange``, the slice's own ``start``). The ``*_like`` operators read their input only for its
shape: the description says so with ``depends``, so that a share gets the matching slice of the
input and MXNet infers the share's shape from it.
"""
import numpy as np

from tofu_mx.tdl import Shard, depends, in_range, index, lam, op, where
from tofu_mx.tdl.lang import lift


def _own_shape(attrs, ctx):
    """A share of a creation op: the shape of the slice it creates."""
    return Shard({"shape": ctx.size(ctx.outputs[0])})


def _fill(name, value_of, examples):
    op(name, shard=_own_shape, gradient=False, examples=examples)(
        lambda attrs: lam(len(attrs.output_shapes[0]), lambda *i: value_of(attrs)))


_fill("_zeros", lambda attrs: 0.0, [({"shape": (4, 6)}, []), ({"shape": (3,)}, []),
                                    ({"shape": (2, 3, 4), "dtype": "int32"}, []),
                                    ({"shape": (2, 2), "dtype": "float64"}, [])])
_fill("_ones", lambda attrs: 1.0, [({"shape": (4, 6)}, []),
                                   ({"shape": (2, 3), "dtype": "int64"}, [])])
_fill("_full", lambda attrs: float(attrs["value"]),
      [({"shape": (4, 6), "value": 2.5}, []), ({"shape": (3,), "value": -1.0}, []),
       ({"shape": (2, 3), "value": 7, "dtype": "int32"}, [])])


def _range(attrs):
    """``_arange``'s (start, step, repeat), with MXNet's reading of a missing ``stop``:
    ``arange(n)`` is ``arange(0, n)``."""
    start, step = float(attrs.get("start", 0.0)), float(attrs.get("step", 1.0))
    if attrs.get("stop", None) is None and not attrs.get("infer_range", False):
        start = 0.0
    return start, step, int(attrs.get("repeat", 1))


def _arange_shard(attrs, ctx):
    """A slice ``[lo, lo + n)`` of ``start, start + step, ...`` (each value ``repeat`` times)
    is itself an arange when it starts and ends on a whole group of repeats. ``stop`` is put
    half a step past the slice's last value, so that MXNet's ``ceil((stop - start) / step)``
    gives the slice's length whatever the rounding."""
    start, step, repeat = _range(attrs)
    (lo, hi), = ctx.outputs[0]
    n = hi - lo + 1
    if lo % repeat or n % repeat:
        return None
    first = start + (lo // repeat) * step
    return Shard({"start": first, "stop": first + (n // repeat - 0.5) * step,
                  "infer_range": False})


@op("_arange", shard=_arange_shard, gradient=False, examples=[
    ({"start": 0, "stop": 6}, []), ({"start": 1.5, "stop": 7.5, "step": 0.5}, []),
    ({"start": 2, "stop": 8, "step": 2, "repeat": 3}, []), ({"start": 5}, []),
    ({"start": 10, "stop": 1, "step": -3}, []),
    ({"start": 0, "stop": 5, "dtype": "int32"}, [])])
def arange(attrs):
    """out[i] = start + (i // repeat) * step."""
    start, step, repeat = _range(attrs)
    return lambda i: start + lift(i // repeat) * step


op("zeros_like", gradient=False, examples=[({}, [(2, 3, 4)]), ({}, [(5,)])])(
    lambda attrs, data: lam(data.ndim, lambda *i: depends(0.0, data[i])))
op("ones_like", gradient=False, examples=[({}, [(2, 3, 4)]), ({}, [(5,)])])(
    lambda attrs, data: lam(data.ndim, lambda *i: depends(1.0, data[i])))


def _strides(shape):
    return [int(np.prod(shape[a + 1:], dtype=np.int64)) for a in range(len(shape))]


def _arange_like_axis(attrs, ndim):
    axis = attrs.get("axis", None)
    return None if axis is None else int(axis) % ndim


def _arange_like_shard(attrs, ctx):
    """A share of ``arange_like`` numbers its own elements from ``start``: right when its box
    is one contiguous run of the row-major order (the axes before the cut axis one wide in the
    share, those after it whole) that starts on a whole group of repeats."""
    start, step = float(attrs.get("start", 0.0)), float(attrs.get("step", 1.0))
    repeat = int(attrs.get("repeat", 1))
    box, shape = ctx.outputs[0], ctx.output_shapes[0]
    wide = [a for a, (lo, hi) in enumerate(box) if lo != hi]
    if wide and any(box[a] != (0, shape[a] - 1) for a in range(wide[0] + 1, len(shape))):
        return None
    offset = sum(lo * s for (lo, _), s in zip(box, _strides(shape)))
    if offset % repeat:
        return None
    return Shard({"start": start + (offset // repeat) * step})


@op("_contrib_arange_like", shard=_arange_like_shard, gradient=False, examples=[
    ({}, [(2, 3, 4)]), ({"start": 1.0, "step": 0.5, "repeat": 2}, [(3, 4)]),
    ({"axis": -1, "start": 2.0}, [(2, 5)]), ({"axis": 0, "step": 3.0, "repeat": 2}, [(4, 3)]),
    ({"axis": 1}, [(2, 6, 3)])])
def arange_like(attrs, data):
    """Without ``axis``: data's shape, numbered in row-major order, start + (n // repeat) *
    step. With ``axis``: 1-d, as long as that axis. The values never read data; the share
    reads the slice whose shape it needs (one element wide across the other axes)."""
    start, step = float(attrs.get("start", 0.0)), float(attrs.get("step", 1.0))
    repeat = int(attrs.get("repeat", 1))
    axis = _arange_like_axis(attrs, data.ndim)
    if axis is not None:
        return lambda i: depends(start + lift(i // repeat) * step,
                                 data[tuple(i if a == axis else 0 for a in range(data.ndim))])
    strides = _strides(data.shape)

    def out(*i):
        linear = sum((x * s for x, s in zip(i, strides)), 0)
        return depends(start + lift(linear // repeat) * step, data[i])
    return lam(data.ndim, out)


def _whole(data):
    """An access reading all of ``data`` (its shape is what is read): every axis indexed by a
    data-dependent index, which the analysis takes as the whole axis."""
    return data[tuple(index(lift(0)) for _ in range(data.ndim))]


@op("shape_array", gradient=False, examples=[({}, [(2, 3, 4)]), ({}, [(5,)]),
                                            ({}, [(2, 1, 3, 2)])])
def shape_array(attrs, data):
    """out[j] = data.shape[j] (int64)."""
    def dim(j, a=0):
        if a == data.ndim - 1:
            return float(data.shape[a])
        return where(in_range(j, a, a + 1), float(data.shape[a]), dim(j, a + 1))
    return lambda j: depends(dim(j), _whole(data))


@op("size_array", gradient=False, examples=[({}, [(2, 3, 4)]), ({}, [(5,)])])
def size_array(attrs, data):
    """out[0] = data.size (int64)."""
    return lambda j: depends(float(np.prod(data.shape, dtype=np.int64)), _whole(data))
