"""Reductions, softmax, and the order statistics (arg-extrema, sort, topk, cumsum).

Index-valued and order-statistic outputs need no primitive of their own: an element's rank
along an axis is the count of elements before it in the order, ``rank(m) = Sum_n [x[n] < x[m]]``
(ties do not occur in random data); the j-th sorted value is ``Sum_m [rank(m) == j] * x[m]``,
and its index the same sum of ``m``. The analysis then sees, correctly, that a sorted axis
reads its whole row, so only the other axes split.
"""
import math

import numpy as np

from tofu_mx.tdl import (Max, Min, Shard, Sum, absolute, equal, exp, greater, lam, less,
                         less_equal, log, not_equal, op, sqrt, square, where)
from tofu_mx.tdl.lang import lift

_KINDS = {"sum": Sum, "mean": Sum, "max": Max, "min": Min}
_EXAMPLES = [({"axis": 1}, [(2, 3, 4)]), ({"axis": (0, 2), "keepdims": True}, [(2, 3, 4)]),
             ({}, [(2, 3)]), ({"axis": 1, "exclude": True}, [(2, 3, 4)]),
             ({"axis": -1}, [(3, 5)])]


def _reduced_axes(attrs, ndim, key="axis"):
    axis = attrs.get(key, None)
    if axis is None or axis == ():
        axes = set(range(ndim))
    else:
        axes = {a % ndim for a in (axis if isinstance(axis, tuple) else (axis,))}
    if attrs.get("exclude", False):
        axes = set(range(ndim)) - axes
    return sorted(axes)


def _over_axes(attrs, data, axes, total):
    """The lambda of a reduction of ``axes``: ``total(read)`` builds one output value, where
    ``read(*r)`` is ``data`` at the output's coordinates and the reduced coordinates ``r``.
    The output keeps the other axes, every axis with ``keepdims``, or is ``(1,)``."""
    kept = [a for a in range(data.ndim) if a not in axes]
    positions = list(range(data.ndim)) if attrs.get("keepdims", False) else kept
    out_rank = len(attrs.output_shapes[0])

    def out(*i):
        coords = dict(zip(positions, i)) if out_rank == len(positions) else {}

        def read(*r):
            index = [coords.get(a) for a in range(data.ndim)]
            for a, v in zip(axes, r):
                index[a] = v
            return data[tuple(index)]
        return total(read)
    return lam(out_rank, out)


def _count(data, axes):
    return int(np.prod([data.shape[a] for a in axes], dtype=np.int64))


def _reduction(name):
    def shard(attrs, ctx):
        """A mean's partial is a sum over the share's slice divided by its own count."""
        if name != "mean" or ctx.partial is None:
            return Shard()
        axes = _reduced_axes(attrs, len(ctx.input_shapes[0]))
        size = ctx.size(ctx.inputs[0])
        return Shard(scale=float(np.prod([size[a] for a in axes]) /
                                 np.prod([ctx.input_shapes[0][a] for a in axes])))

    @op(name, examples=_EXAMPLES, shard=shard)
    def describe(attrs, data):
        axes = _reduced_axes(attrs, data.ndim)
        count = _count(data, axes)

        def total(read):
            value = _KINDS[name](lam(len(axes), read, prefix="r"))
            return value / count if name == "mean" else value
        return _over_axes(attrs, data, axes, total)
    return describe


for _name in _KINDS:
    _reduction(_name)


def _product(read, n, nan_as=None):
    """The product of ``read`` over n variables, as exp(sum of log|x|) times the sign
    (-1)^(count of negatives): a product's partials are not summed, so no partition-n-reduce
    is offered. ``nan_as``: NaNs read as this value (nanprod)."""
    def value(*r):
        x = read(*r)
        return x if nan_as is None else where(not_equal(x, x), nan_as, x)
    magnitude = exp(Sum(lam(n, lambda *r: log(absolute(value(*r))), prefix="r")))
    negatives = Sum(lam(n, lambda *s: where(less(value(*s), 0.0), 1.0, 0.0), prefix="s"))
    return magnitude * lift(-1.0) ** negatives


def _simple(name, total, examples=_EXAMPLES):
    @op(name, examples=examples)
    def describe(attrs, data):
        axes = _reduced_axes(attrs, data.ndim)
        return _over_axes(attrs, data, axes, lambda read: total(read, len(axes)))
    return describe


_simple("prod", lambda read, n: _product(read, n))
_simple("nanprod", lambda read, n: _product(read, n, nan_as=1.0))
_simple("nansum", lambda read, n: Sum(lam(
    n, lambda *r: where(not_equal(read(*r), read(*r)), 0.0, read(*r)), prefix="r")))


@op("norm", examples=[({}, [(2, 3, 4)]), ({"ord": 1, "axis": 1}, [(2, 3, 4)]),
                      ({"ord": 2, "axis": (1, 2)}, [(2, 3, 4)]),
                      ({"ord": 1, "axis": -1, "keepdims": True}, [(3, 5)]),
                      ({"axis": 0, "keepdims": True}, [(4, 3)])])
def norm(attrs, data):
    """ord 2: sqrt(Sum x^2), not linear in its sum (no partition-n-reduce); ord 1: Sum |x|."""
    axes = _reduced_axes(attrs, data.ndim)
    ord_ = int(attrs.get("ord", 2))
    if ord_ == 1:
        return _over_axes(attrs, data, axes, lambda read: Sum(
            lam(len(axes), lambda *r: absolute(read(*r)), prefix="r")))
    return _over_axes(attrs, data, axes, lambda read: sqrt(Sum(
        lam(len(axes), lambda *r: square(read(*r)), prefix="r"))))


@op("moments", examples=[({"axes": (1,)}, [(2, 3, 4)]),
                         ({"axes": (0, 2), "keepdims": True}, [(2, 3, 4)]),
                         ({"axes": (0, 1)}, [(3, 5)])])
def moments(attrs, data):
    """Two outputs: the mean and the biased variance over ``axes``. The variance reduces the
    same axes again (its own variables), so no partition-n-reduce is offered."""
    axes = _reduced_axes(attrs, data.ndim, key="axes")
    count = _count(data, axes)
    n = len(axes)

    def mean(read, prefix):
        return Sum(lam(n, read, prefix=prefix)) / count

    def variance(read):
        m = mean(read, "m")
        return Sum(lam(n, lambda *s: square(read(*s) - m), prefix="s")) / count
    return (_over_axes(attrs, data, axes, lambda read: mean(read, "r")),
            _over_axes(attrs, data, axes, variance))


# --- index-valued outputs and order statistics ------------------------------------------

def _strides(shape):
    return [int(np.prod(shape[k + 1:], dtype=np.int64)) for k in range(len(shape))]


def _arg_extremum(attrs, data, axis, kind):
    """The position of the largest (smallest) element along ``axis`` (None: the flattened
    array, counted row-major): Sum over m of [x[m] == top] * m (MXNet takes the first of
    tied extrema; random data have no ties)."""
    axes = list(range(data.ndim)) if axis is None else [axis % data.ndim]
    strides = _strides([data.shape[a] for a in axes])

    def total(read):
        top = kind(lam(len(axes), read, prefix="n"))
        return Sum(lam(len(axes), lambda *m: where(
            equal(read(*m), top), lift(sum((v * s for v, s in zip(m, strides)), 0)), 0.0),
            prefix="m"))
    return _over_axes(attrs, data, axes, total)


_ARG_EXAMPLES = [({"axis": 1}, [(2, 3, 4)]), ({"axis": -1, "keepdims": True}, [(3, 5)]),
                 ({}, [(2, 3, 4)]), ({"axis": 0}, [(4, 3)]), ({"keepdims": True}, [(2, 3)])]


@op("argmax", gradient=False, examples=_ARG_EXAMPLES)
def argmax(attrs, data):
    return _arg_extremum(attrs, data, attrs.get("axis", None), Max)


@op("argmin", gradient=False, examples=_ARG_EXAMPLES)
def argmin(attrs, data):
    return _arg_extremum(attrs, data, attrs.get("axis", None), Min)


@op("argmax_channel", gradient=False, examples=[({}, [(3, 5)]), ({}, [(2, 3, 4)])])
def argmax_channel(attrs, data):
    """argmax over axis 1 (whatever the rank), dropping it."""
    return _arg_extremum(attrs, data, 1, Max)


def _sorting(data, axis, ascending):
    """``(at, rank, position, pick)`` for sorting along ``axis`` (None: the flattened
    array). ``at(i, m)``: data at output coordinates ``i`` with the sorted coordinate(s)
    ``m``; ``rank(i, m)``: how many elements of the row come before it in the order;
    ``position(m)``: its (row-major) index in the row, as a value; ``pick(i, value)``: the
    ``value(m)`` of the element whose rank is the output's sorted coordinate."""
    axes = list(range(data.ndim)) if axis is None else [axis % data.ndim]
    strides = _strides([data.shape[a] for a in axes])
    before = less if ascending else greater
    sorted_at = 0 if axis is None else axis % data.ndim

    def at(i, m):
        if axis is None:
            return data[tuple(m)]
        index = list(i)
        index[axes[0]] = m[0]
        return data[tuple(index)]

    def rank(i, m):
        return Sum(lam(len(axes), lambda *n: where(before(at(i, n), at(i, m)), 1.0, 0.0),
                       prefix="n"))

    def position(m):
        return lift(sum((v * s for v, s in zip(m, strides)), 0))

    def pick(i, value):
        """Output coordinates ``i`` (the sorted one at ``sorted_at``): the element of rank
        i[sorted_at], or ``value(m)`` of it."""
        j = i[sorted_at]
        return Sum(lam(len(axes), lambda *m: where(equal(rank(i, m), j), value(m), 0.0),
                       prefix="m"))
    return at, rank, position, pick


def _sort_axis(attrs, default=-1):
    axis = attrs.get("axis", default)
    return None if axis is None else int(axis)


_SORT_EXAMPLES = [({}, [(2, 3, 4)]), ({"axis": 1}, [(2, 3, 4)]),
                  ({"is_ascend": False}, [(3, 5)]), ({"axis": None}, [(2, 3)]),
                  ({"axis": 0, "is_ascend": False}, [(4, 3)])]


@op("sort", examples=_SORT_EXAMPLES)
def sort(attrs, data):
    at, _, _, pick = _sorting(data, _sort_axis(attrs), attrs.get("is_ascend", True))
    rank = len(attrs.output_shapes[0])
    return lam(rank, lambda *i: pick(i, lambda m: at(i, m)))


@op("argsort", gradient=False, examples=_SORT_EXAMPLES)
def argsort(attrs, data):
    _, _, position, pick = _sorting(data, _sort_axis(attrs), attrs.get("is_ascend", True))
    rank = len(attrs.output_shapes[0])
    return lam(rank, lambda *i: pick(i, position))


@op("topk", examples=[({"k": 2}, [(2, 3, 4)]), ({"k": 2, "ret_typ": "value"}, [(2, 3, 4)]),
                      ({"k": 3, "ret_typ": "both", "axis": 1, "is_ascend": True}, [(2, 4, 3)]),
                      ({"k": 2, "ret_typ": "mask"}, [(3, 5)]),
                      ({"k": 2, "ret_typ": "mask", "axis": 0, "is_ascend": True}, [(4, 3)]),
                      ({"k": 3, "ret_typ": "value", "axis": None}, [(2, 3)]),
                      ({"k": 4, "ret_typ": "mask", "axis": None}, [(2, 3)]),
                      ({"k": 0, "ret_typ": "both"}, [(2, 4)])])
def topk(attrs, data):
    """The k first elements along ``axis`` in the order (largest first unless ``is_ascend``;
    k < 1: all of them): their values, indices, both, or a 0/1 mask of the input's shape."""
    axis = _sort_axis(attrs)
    at, rank, position, pick = _sorting(data, axis, attrs.get("is_ascend", False))
    ret = attrs.get("ret_typ", "indices")
    if ret == "mask":
        n = data.shape[axis % data.ndim] if axis is not None else int(np.prod(data.shape))
        k = int(attrs.get("k", 1))
        k = n if k < 1 else min(k, n)
        if axis is None:
            return lam(data.ndim, lambda *i: where(less(rank(i, i), k), 1.0, 0.0))
        return lam(data.ndim, lambda *i: where(
            less(rank(i, (i[axis % data.ndim],)), k), 1.0, 0.0))
    rank_ = len(attrs.output_shapes[0])
    values = lam(rank_, lambda *i: pick(i, lambda m: at(i, m)))
    indices = lam(rank_, lambda *i: pick(i, position))
    return {"value": values, "indices": indices, "both": (values, indices)}[ret]


@op("_np_cumsum", examples=[({"axis": 1}, [(2, 3, 4)]), ({"axis": 2}, [(2, 3, 4)]),
                            ({}, [(2, 3)]), ({"axis": 0}, [(4, 2)])])
def cumsum(attrs, data):
    """out[.., t, ..] = Sum over s <= t of x[.., s, ..]; no axis: over the flattened array."""
    axis = attrs.get("axis", None)
    if axis is None:
        strides = _strides(data.shape)
        return lambda t: Sum(lam(data.ndim, lambda *r: where(
            less_equal(sum((v * s for v, s in zip(r, strides)), 0), t), data[r], 0.0),
            prefix="r"))
    axis = int(axis) % data.ndim

    def out(*i):
        def read(s):
            return data[tuple(s if a == axis else x for a, x in enumerate(i))]
        return Sum(lambda s: where(less_equal(s, i[axis]), read(s), 0.0))
    return lam(data.ndim, out)


# --- softmax --------------------------------------------------------------------------------

def _softmax_over(data, axis, temperature, use_log, sign=1.0, length=None):
    """softmax (log_softmax) of ``sign * data / temperature`` along ``axis``; ``sign=-1``
    is softmin. ``length``: only the first ``length[...]`` entries along ``axis`` take part;
    the others are 0."""
    axis %= data.ndim
    scale = sign / temperature

    def out(*i):
        def along(v):
            return data[tuple(v if a == axis else x for a, x in enumerate(i))] * scale
        if length is None:
            top = Max(lambda m: along(m))
            total = Sum(lambda j: exp(along(j) - top))
        else:
            limit = length[tuple(x for a, x in enumerate(i) if a != axis)]
            top = Max(lambda m: where(less(m, limit), along(m), -math.inf))
            total = Sum(lambda j: where(less(j, limit), exp(along(j) - top), 0.0))
        shifted = data[i] * scale - top
        value = shifted - log(total) if use_log else exp(shifted) / total
        return value if length is None else where(less(i[axis], limit), value, 0.0)
    return lam(data.ndim, out)


def _lengths(attrs, shapes):
    """softmax's lengths: 1 up to the size of its axis."""
    return 1, shapes[0][int(attrs.get("axis", -1))] + 1


def _temperature(attrs):
    return float(attrs.get("temperature", None) or 1.0)


@op("softmax", index_inputs={1: _lengths},
    examples=[({"axis": -1}, [(2, 3, 4)]), ({"axis": 1}, [(2, 3, 4)]), ({}, [(3, 5)]),
              ({"axis": -1, "temperature": 2.0}, [(2, 4)]),
              ({"axis": -1, "use_length": True}, [(2, 3, 4), (2, 3)], {1: "int32"}),
              ({"axis": 1, "use_length": True}, [(2, 5, 3), (2, 3)], {1: "int64"})])
def softmax(attrs, data, length=None):
    """``use_length``: each slice along ``axis`` is a softmax over its first ``length``
    entries (an attention mask); later entries are 0."""
    return _softmax_over(data, int(attrs.get("axis", -1)), _temperature(attrs), use_log=False,
                         length=length if attrs.get("use_length", False) else None)


@op("log_softmax", examples=[({"axis": -1}, [(2, 3, 4)]), ({"axis": 0}, [(3, 5)])])
def log_softmax(attrs, data):
    return _softmax_over(data, int(attrs.get("axis", -1)), _temperature(attrs), use_log=True)


@op("softmin", examples=[({"axis": -1}, [(2, 3, 4)]), ({"axis": 1}, [(2, 3, 4)]),
                         ({"axis": 0, "temperature": 0.5}, [(3, 5)])])
def softmin(attrs, data):
    """softmax of -data."""
    return _softmax_over(data, int(attrs.get("axis", -1)), _temperature(attrs), use_log=False,
                         sign=-1.0)
