"""Indexing: take, batch_take (opaque), pick (alias choose_element_0index), one_hot,
gather_nd, where, diag.

An index read from a tensor is data-dependent (``index(...)``): the analysis needs the indexed
axis whole, so these operators split along the axes the indices or the output carry, never
along the axis they index. MXNet truncates a float index towards zero (a C cast) before it
clips or wraps it; the descriptions do the same with ``trunc``.
"""
import numpy as np

from tofu_mx.tdl import (Shard, equal, in_range, index, lam, maximum, minimum, not_equal, op,
                         opaque, trunc, where)


def _axis(attrs, ndim, default=0):
    return int(attrs.get("axis", default)) % ndim


def _clipped(value, n):
    """Index ``value`` truncated and clipped to [0, n)."""
    return index(minimum(maximum(trunc(value), 0.0), float(n - 1)))


def _wrapped(value, n):
    """Index ``value`` truncated and wrapped into [0, n) (Python's modulo, as MXNet's
    ``j % n`` followed by ``+ n`` when negative)."""
    return index(trunc(value)) % n


def _take_range(attrs, shapes):
    """take's indices: any integer under clip or wrap (a few outside the axis, to exercise
    the mode), inside the axis under raise (MXNet raises an error otherwise)."""
    n = shapes[0][_axis(attrs, len(shapes[0]))]
    mode = attrs.get("mode", "clip")
    return {"clip": (-2, n + 2), "wrap": (-n, 2 * n)}.get(mode, (0, n))


@op("take", index_inputs={1: _take_range}, examples=[
    ({}, [(6, 4), (4,)]), ({"axis": 1}, [(3, 5, 2), (2, 3)]),
    ({"axis": -1, "mode": "wrap"}, [(2, 5), (4,)]), ({"mode": "wrap"}, [(5, 3), (2, 2)]),
    ({"mode": "raise"}, [(5, 3), (4,)]), ({"axis": 1, "mode": "clip"}, [(2, 4, 3), (5,)])])
def take(attrs, a, indices):
    """out[pre, k..., post] = a[pre, mode(indices[k...]), post] along ``axis``."""
    axis = _axis(attrs, a.ndim)
    n, mode = a.shape[axis], attrs.get("mode", "clip")
    fix = _clipped if mode == "clip" else _wrapped   # raise: in range, where wrap is exact
    k = indices.ndim

    def out(*i):
        picked = fix(indices[i[axis:axis + k]], n)
        return a[i[:axis] + (picked,) + i[axis + k:]]
    return lam(a.ndim + k - 1, out)


def _batch_take_range(attrs, shapes):
    return -2, shapes[0][-1] + 2


# batch_take: out[n] = a[n, clip(indices[n], 0, M - 1)] for 2-d ``a`` (MXNet's kernel is
# wrong beyond 2-d). MXNet logs "batch_take is deprecated" whenever it infers its shape, so a
# description (whose examples are traced at registration) would print that on every import of
# tofu_mx: it is registered with its batch axis only. MXNet registers no gradient for it.
opaque("batch_take", "deprecated by MXNet in favour of pick, which is described; split on its "
       "batch axis", batch_axes=(0, 0), output_batch_axes=(0,),
       index_inputs={1: _batch_take_range}, gradient=False)


def _pick_range(attrs, shapes):
    n = shapes[0][_axis(attrs, len(shapes[0]), -1)]
    return (-2, n + 2) if attrs.get("mode", "clip") == "clip" else (-n, 2 * n)


_PICK_EXAMPLES = [({}, [(3, 5), (3,)]), ({"axis": 0}, [(4, 3), (3,)]),
                  ({"axis": 1, "keepdims": True}, [(2, 4, 3), (2, 1, 3)]),
                  ({"axis": 1}, [(2, 4, 3), (2, 1, 3)]),
                  ({"axis": -1, "keepdims": True, "mode": "wrap"}, [(3, 4), (3,)]),
                  ({"axis": 2, "mode": "wrap"}, [(2, 3, 4), (2, 3)])]


def pick(attrs, data, index):
    """out[..] = data[.., mode(index[..]), ..] along ``axis`` (``axis=None`` is refused by
    MXNet). The output keeps the axis as 1 with ``keepdims``; the index may have either rank
    (the same elements in the same order). The input is named as MXNet names it, hiding the
    TDL's ``index()``, which ``_clipped``/``_wrapped`` call."""
    axis = _axis(attrs, data.ndim, -1)
    n = data.shape[axis]
    fix = _clipped if attrs.get("mode", "clip") == "clip" else _wrapped
    keepdims = bool(attrs.get("keepdims", False))

    def out(*o):
        rest = o[:axis] + o[axis + 1:] if keepdims else o
        at = rest[:axis] + (0,) + rest[axis:]
        j = fix(index[at] if index.ndim == data.ndim else index[rest], n)
        return data[rest[:axis] + (j,) + rest[axis:]]
    return lam(data.ndim if keepdims else data.ndim - 1, out)


op("pick", index_inputs={1: _pick_range}, examples=_PICK_EXAMPLES)(pick)


def _depth(attrs):
    return int(attrs["depth"])


def _one_hot_shard(attrs, ctx):
    """A share of the one-hot axis starting at 0 is a shallower one_hot (indices past its
    depth give rows of off_value, as they should); any other slice would need the indices
    shifted, which no attribute does."""
    lo, hi = ctx.outputs[0][-1]
    return Shard({"depth": hi - lo + 1}) if lo == 0 else None


@op("one_hot", shard=_one_hot_shard, gradient=False,
    index_inputs={0: lambda attrs, shapes: (-1, _depth(attrs) + 1)},
    examples=[({"depth": 5}, [(4,)]), ({"depth": 3, "on_value": 2.0, "off_value": -1.0}, [(2, 3)]),
              ({"depth": 4, "dtype": "int32"}, [(3,)]),
              ({"depth": 6, "dtype": "float64", "on_value": 0.5}, [(2, 2)])])
def one_hot(attrs, indices):
    """out[k..., d] = on_value if trunc(indices[k...]) == d else off_value (an index outside
    [0, depth) gives a row of off_value)."""
    on, off = float(attrs.get("on_value", 1.0)), float(attrs.get("off_value", 0.0))
    k = indices.ndim
    return lam(k + 1, lambda *i: where(equal(trunc(indices[i[:k]]), i[k]), on, off))


def _gather_range(attrs, shapes):
    """Each index row m addresses data's axis m: 0 up to the smallest of those axes.
    (MXNet's forward also wraps -n..-1, its backward does not: they are left out.)"""
    return 0, min(shapes[0][:shapes[1][0]])


@op("gather_nd", index_inputs={1: _gather_range}, examples=[
    ({}, [(4, 5), (2, 3)]), ({}, [(3, 4, 2), (1, 2, 2)]), ({}, [(3, 4, 5), (2, 6)]),
    ({}, [(3, 4), (2, 2, 3)])])
def gather_nd(attrs, data, indices):
    """out[y..., x...] = data[indices[0, y...], ..., indices[M-1, y...], x...], M being
    indices.shape[0]; a negative index counts from the end of its axis."""
    m = indices.shape[0]
    ny = indices.ndim - 1

    def out(*i):
        y, x = i[:ny], i[ny:]
        lead = tuple(index(indices[(d,) + y] + float(data.shape[d])) % data.shape[d]
                     for d in range(m))
        return data[lead + x]
    return lam(ny + data.ndim - m, out)


def _where_range(attrs, shapes):
    return 0, 2


@op("where", index_inputs={0: _where_range}, examples=[
    ({}, [(2, 3, 4), (2, 3, 4), (2, 3, 4)]), ({}, [(4,), (4, 3), (4, 3)]),
    ({}, [(3,), (3, 2, 2), (3, 2, 2)]), ({}, [(5,), (5,), (5,)])])
def where_(attrs, condition, x, y):
    """out = x where condition != 0, else y: condition has x's shape, or is 1-d and selects
    whole rows (x's first axis). The check draws conditions from {0, 1}."""
    if condition.ndim == x.ndim:
        return lam(x.ndim, lambda *i: where(not_equal(condition[i], 0.0), x[i], y[i]))
    return lam(x.ndim, lambda *i: where(not_equal(condition[i[0]], 0.0), x[i], y[i]))


def _diag_axes(attrs, ndim):
    return int(attrs.get("axis1", 0)) % ndim, int(attrs.get("axis2", 1)) % ndim


def _diag_shard(attrs, ctx):
    """A share reads the bounding box of its piece of the diagonal (axis1 from row0, axis2
    from col0): in the box's own coordinates that piece is the diagonal ``k - col0 + row0``,
    the main one (a box starts where its piece starts). The 1-d form needs no change: a
    share of its square output is no diag of a slice, and MXNet's shapes say so."""
    box = ctx.inputs[0]
    if box is None:          # output rows with no diagonal element: no diag computes them
        return None
    if len(box) == 1:
        return Shard()
    a1, a2 = _diag_axes(attrs, len(box))
    return Shard({"k": int(attrs.get("k", 0)) - box[a2][0] + box[a1][0]})


@op("diag", shard=_diag_shard, examples=[
    ({}, [(4, 4)]), ({"k": 1}, [(3, 5)]), ({"k": -2}, [(5, 3)]), ({"k": 2}, [(4, 4)]),
    ({}, [(4,)]), ({"k": 2}, [(3,)]), ({"k": -1}, [(3,)]),
    ({"axis1": 1, "axis2": 2}, [(2, 3, 4)]), ({"k": -1, "axis1": 2, "axis2": 0}, [(3, 2, 4)]),
    ({"k": 1, "axis1": 0, "axis2": 2}, [(3, 2, 4, 2)])])
def diag(attrs, data):
    """1-d data: the 2-d matrix with data on diagonal ``k``. n-d: the diagonal ``k`` of the
    (axis1, axis2) planes, on a new last axis after the remaining axes: out[rest..., d] =
    data[axis1 = d + max(-k, 0), axis2 = d + max(k, 0), rest...] (NumPy's diagonal)."""
    k = int(attrs.get("k", 0))
    if data.ndim == 1:
        def square(i, j):
            return where(in_range(j - i, k, k + 1), data[i if k >= 0 else j], 0.0)
        return square
    a1, a2 = _diag_axes(attrs, data.ndim)
    rest = [a for a in range(data.ndim) if a not in (a1, a2)]

    def out(*o):
        at = dict(zip(rest, o[:-1]))
        at[a1], at[a2] = o[-1] + max(-k, 0), o[-1] + max(k, 0)
        return data[tuple(at[a] for a in range(data.ndim))]
    return lam(data.ndim - 1, out)
