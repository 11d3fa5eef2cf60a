"""Layout: operators that move, repeat or pad values without computing on them: tile, repeat,
Pad, SwapAxis, reverse, depth_to_space, space_to_depth, slice_like, reshape_like,
broadcast_axis, broadcast_like, Crop, _split_v2, _rnn_param_concat,
_identity_with_attr_like_rhs.

Each output element is a read of one input element (Pad's constant mode reads a pad value);
what a share of the output reads follows from the index expressions. The ``shard`` hooks say
how a share runs as the operator where an attribute fixes an output size or an offset (tile's
reps, repeat's repeats, Pad's widths, broadcast_axis's size, Crop's window). Operators whose
output shape comes from a second input (slice_like, reshape_like, broadcast_like, Crop with
``crop_like``) read that input with ``depends`` at the output's coordinates, so that a share
reads a region of it of the share's own size, and MXNet infers the share's shape from it.
"""
import numpy as np

from tofu_mx.ops.shape import _read_count, concat, same_count, same_order
from tofu_mx.tdl import Shard, depends, in_range, lam, op, where


def _ints(value):
    """An attribute that MXNet takes as an int or a tuple of ints, as a tuple."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _size(box):
    return box[1] - box[0] + 1


# --- tile -------------------------------------------------------------------------------------

def _tile_shard(attrs, ctx):
    """Per output axis, the share runs with reps 1 when it lies inside one repetition (its
    input box is then exactly what it reads), with fewer reps when it is a whole number of
    repetitions starting at one; a share wrapping around a repetition's end cannot run.
    Leading output axes that tile added (reps longer than the input's rank) are repeated
    the share's size times."""
    in_shape, out_box, box = ctx.input_shapes[0], ctx.outputs[0], ctx.inputs[0]
    lead = len(out_box) - len(in_shape)
    reps = []
    for a, (lo, hi) in enumerate(out_box):
        size = hi - lo + 1
        if a < lead:
            reps.append(size)
            continue
        n, have = in_shape[a - lead], box[a - lead]
        if lo % n + size <= n and have == (lo % n, hi % n):
            reps.append(1)
        elif lo % n == 0 and size % n == 0 and have == (0, n - 1):
            reps.append(size // n)
        else:
            return None
    return Shard({"reps": tuple(reps)})


@op("tile", shard=_tile_shard, examples=[
    ({"reps": (2, 3)}, [(2, 3)]), ({"reps": (2,)}, [(2, 3)]),
    ({"reps": (2, 1, 2)}, [(3, 2)]), ({"reps": (1, 3, 1)}, [(2, 1, 3)]),
    ({"reps": (3,)}, [(4,)]),
])
def tile(attrs, data):
    """out[i] = data[i % n] on each axis; reps shorter than the rank tile the last axes,
    longer ones add leading axes (the input read as if of shape (1, .., 1, *shape))."""
    rank = len(attrs.output_shapes[0]) if attrs.output_shapes else \
        max(data.ndim, len(_ints(attrs.get("reps"))))
    lead = rank - data.ndim
    return lam(rank, lambda *i: data[tuple(i[lead + k] % n for k, n in enumerate(data.shape))])


# --- repeat -----------------------------------------------------------------------------------

def _repeat_axis(attrs, ndim):
    axis = attrs.get("axis", None)
    return None if axis is None else int(axis) % ndim


def _repeat_count(lo, hi, r):
    """The repeats a share of output positions lo..hi runs with: every element it holds must
    appear the same number of times (inside one element's run, or whole runs); else None."""
    if lo // r == hi // r:
        return hi - lo + 1
    if lo % r == 0 and (hi + 1) % r == 0:
        return r
    return None


def _repeat_shard(attrs, ctx):
    r = int(attrs["repeats"])
    shape, box = ctx.input_shapes[0], ctx.inputs[0]
    axis = _repeat_axis(attrs, len(shape))
    a = 0 if axis is None else axis
    lo, hi = ctx.outputs[0][a]
    count = _repeat_count(lo, hi, r)
    if count is None:
        return None
    if axis is None:
        # the share's elements, flattened, must be exactly the box it reads
        if int(np.prod([_size(b) for b in box])) != hi // r - lo // r + 1:
            return None
    return Shard({"repeats": count})


@op("repeat", shard=_repeat_shard, examples=[
    ({"repeats": 2, "axis": 1}, [(2, 3)]), ({"repeats": 3, "axis": 0}, [(2, 3)]),
    ({"repeats": 2, "axis": -1}, [(2, 2, 3)]), ({"repeats": 2}, [(2, 3)]),
    ({"repeats": 3, "axis": None}, [(2, 2, 2)]),
])
def repeat(attrs, data):
    """out[.., i, ..] = data[.., i // r, ..] along ``axis``; with no axis, the input is
    flattened first: out[i] = flat(data)[i // r]."""
    r = int(attrs["repeats"])
    axis = _repeat_axis(attrs, data.ndim)
    if axis is not None:
        return lam(data.ndim, lambda *i: data[tuple(x // r if a == axis else x
                                                    for a, x in enumerate(i))])
    strides = [int(np.prod(data.shape[a + 1:], dtype=np.int64)) for a in range(data.ndim)]

    def read(i):
        j = i // r
        return data[tuple(j // s if a == 0 else (j // s) % n
                          for a, (s, n) in enumerate(zip(strides, data.shape)))]
    return lam(1, read)


# --- Pad --------------------------------------------------------------------------------------

def _pads(attrs, ndim):
    width = _ints(attrs["pad_width"])
    width = width + (0,) * (2 * ndim - len(width))
    return [(width[2 * a], width[2 * a + 1]) for a in range(ndim)]


def _pad_shard(attrs, ctx):
    """Per axis, the share pads by the number of its positions inside each pad region; the
    input box must be exactly its positions in the middle (constant and edge modes always,
    reflect when the reflected reads fall inside it). A share lying wholly in one pad region
    runs in edge mode (from the one edge element it reads), not in the others (constant
    reads nothing of the input, reflect reads elements it does not hold)."""
    shape, box = ctx.input_shapes[0], ctx.inputs[0]
    mode = attrs.get("mode", "constant")
    if box is None:
        return None
    widths = []
    for a, ((before, after), (lo, hi)) in enumerate(zip(_pads(attrs, len(shape)),
                                                        ctx.outputs[0])):
        n, size = shape[a], hi - lo + 1
        p_lo = max(0, min(hi, before - 1) - lo + 1)
        p_hi = max(0, hi - max(lo, before + n) + 1)
        if p_lo + p_hi == size:             # no middle position
            if mode != "edge" or _size(box[a]) != 1:
                return None
            widths += [size - 1, 0] if p_lo else [0, size - 1]
            continue
        middle = (max(lo, before) - before, min(hi, before + n - 1) - before)
        if box[a] != middle:
            return None
        if mode == "reflect" and max(p_lo, p_hi) >= _size(middle):
            return None
        widths += [p_lo, p_hi]
    return Shard({"pad_width": tuple(widths)})


@op("Pad", shard=_pad_shard, examples=[
    ({"mode": "constant", "pad_width": (0, 0, 0, 0, 1, 2, 2, 1), "constant_value": 1.5},
     [(2, 2, 3, 4)]),
    ({"mode": "edge", "pad_width": (0, 0, 0, 0, 2, 1, 1, 3)}, [(1, 2, 3, 4)]),
    ({"mode": "reflect", "pad_width": (0, 0, 0, 0, 2, 1, 1, 3)}, [(1, 2, 4, 5)]),
    ({"mode": "constant", "pad_width": (0, 0, 0, 0, 1, 1, 0, 2, 2, 1)}, [(1, 2, 2, 3, 3)]),
    ({"mode": "edge", "pad_width": (0, 0, 0, 0, 1, 2, 2, 0, 1, 1)}, [(1, 2, 2, 3, 3)]),
    ({"mode": "reflect", "pad_width": (0, 0, 0, 0, 1, 2, 2, 1, 1, 2)}, [(1, 2, 3, 4, 3)]),
])
def pad(attrs, data):
    """constant: the input read with the pad value outside it; edge: the nearest edge element;
    reflect: mirrored about the edge element (which is not repeated), as numpy.pad's
    "reflect". Each padded axis picks its low pad, high pad or middle with ``in_range``,
    so a share reads only what its positions need."""
    mode = attrs.get("mode", "constant")
    pads = _pads(attrs, data.ndim)
    if mode == "constant":
        source = data.padded(float(attrs.get("constant_value", 0.0)))
        return lam(data.ndim, lambda *i: source[tuple(x - p for x, (p, _) in zip(i, pads))])

    def read(*i):
        def build(a, index):
            if a == data.ndim:
                return data[tuple(index)]
            (before, after), n, x = pads[a], data.shape[a], i[a]
            if before == 0 and after == 0:
                return build(a + 1, index + [x])
            low = 0 if mode == "edge" else before - x
            high = n - 1 if mode == "edge" else 2 * (n - 1) + before - x
            value = build(a + 1, index + [x - before])
            if after:
                value = where(in_range(x, before + n, before + n + after),
                              build(a + 1, index + [high]), value)
            if before:
                value = where(in_range(x, 0, before), build(a + 1, index + [low]), value)
            return value
        return build(0, [])
    return lam(data.ndim, read)


# --- axis permutations ------------------------------------------------------------------------

@op("SwapAxis", examples=[({"dim1": 0, "dim2": 2}, [(2, 3, 4)]), ({"dim1": 1, "dim2": 0}, [(3, 5)]),
                          ({"dim1": -1, "dim2": 1}, [(2, 3, 4)]), ({}, [(2, 3)])])
def swap_axis(attrs, data):
    d1 = int(attrs.get("dim1", 0)) % data.ndim
    d2 = int(attrs.get("dim2", 0)) % data.ndim
    where_from = {d1: d2, d2: d1}
    return lam(data.ndim, lambda *i: data[tuple(i[where_from.get(a, a)]
                                                for a in range(data.ndim))])


@op("reverse", examples=[({"axis": 0}, [(4, 3)]), ({"axis": (0, 2)}, [(2, 3, 4)]),
                         ({"axis": 1}, [(2, 5)])])
def reverse(attrs, data):
    """out[i] = data[n - 1 - i] on each reversed axis. (MXNet 1.9.1 accepts a negative axis
    when building the symbol but its kernel fails on it.)"""
    axes = {a % data.ndim for a in _ints(attrs.get("axis"))}
    return lam(data.ndim, lambda *i: data[tuple(data.shape[a] - 1 - x if a in axes else x
                                                for a, x in enumerate(i))])


# --- depth_to_space, space_to_depth -----------------------------------------------------------

def _depth_to_space_shard(attrs, ctx):
    """A share holding every output channel and whole blocks of rows and columns reads the
    matching input region; a slice of the channels reads channels spread over the input."""
    b = int(attrs["block_size"])
    out = ctx.outputs[0]
    if out[1] != (0, ctx.output_shapes[0][1] - 1):
        return None
    if any(lo % b or (hi + 1) % b for lo, hi in out[2:]):
        return None
    return Shard()


@op("depth_to_space", shard=_depth_to_space_shard, examples=[
    ({"block_size": 2}, [(1, 8, 2, 3)]), ({"block_size": 3}, [(2, 9, 2, 2)]),
    ({"block_size": 2}, [(2, 4, 3, 2)])])
def depth_to_space(attrs, data):
    """out[n, c, h, w] = data[n, ((h % b) * b + w % b) * C' + c, h // b, w // b] with
    C' = C / b^2 (the input's channels as (b, b, C'), "DCR")."""
    b = int(attrs["block_size"])
    per = data.shape[1] // (b * b)
    return lambda n, c, h, w: data[n, ((h % b) * b + w % b) * per + c, h // b, w // b]


def _space_to_depth_shard(attrs, ctx):
    """A share holding every output channel reads whole blocks of rows and columns; a slice
    of the channels reads every b-th row or column."""
    if ctx.outputs[0][1] != (0, ctx.output_shapes[0][1] - 1):
        return None
    return Shard()


@op("space_to_depth", shard=_space_to_depth_shard, examples=[
    ({"block_size": 2}, [(1, 2, 4, 6)]), ({"block_size": 3}, [(2, 1, 3, 6)]),
    ({"block_size": 2}, [(2, 3, 2, 4)])])
def space_to_depth(attrs, data):
    """out[n, q * C + c, h, w] = data[n, c, h * b + q // b, w * b + q % b]: channel
    ``q * C + c`` holds the offset ``q`` within each b x b block."""
    b = int(attrs["block_size"])
    channels = data.shape[1]

    def read(n, c, h, w):
        q = c // channels
        return data[n, c % channels, h * b + q // b, w * b + q % b]
    return read


# --- shapes taken from a second input ---------------------------------------------------------

def _like_index(i, rank, mapping):
    """An index of the second input: ``mapping[axis]`` (an output variable's position) where
    it fixes an output size, else 0 (its size there does not matter)."""
    return tuple(i[mapping[a]] if a in mapping else 0 for a in range(rank))


@op("slice_like", examples=[
    ({}, [(4, 5), (2, 3)]), ({"axes": (0, -2)}, [(4, 5, 6), (2, 3)]),
    ({"axes": (2,)}, [(2, 3, 6), (1, 1, 4, 7)]), ({"axes": (1,)}, [(3, 5, 2), (3, 4, 2)])])
def slice_like(attrs, data, shape_like):
    """out = data[:m0, :m1, ..] on the sliced axes (their size in ``shape_like``, at the same
    axis number, normalised against data's rank). shape_like is read at the output's
    coordinates on those axes, so a share's region of it has the share's size there."""
    axes = _ints(attrs.get("axes"))
    sliced = sorted({a % data.ndim for a in axes}) if axes else list(range(data.ndim))
    mapping = {a: a for a in sliced}
    return lam(data.ndim, lambda *i: depends(data[i], shape_like[_like_index(
        i, shape_like.ndim, mapping)]))


def _reshape_like_ranges(attrs, lhs_rank, rhs_rank):
    def canon(begin, end, rank):
        begin = 0 if begin is None else int(begin)
        end = rank if end is None else int(end)
        return (begin + rank if begin < 0 else begin), (end + rank if end < 0 else end)
    lb, le = canon(attrs.get("lhs_begin"), attrs.get("lhs_end"), lhs_rank)
    rb, re = canon(attrs.get("rhs_begin"), attrs.get("rhs_end"), rhs_rank)
    return lb, le, rb, re


def _reshape_like_shard(attrs, ctx):
    return Shard() if same_count(ctx) else None


@op("reshape_like", shard=_reshape_like_shard, examples=[
    ({}, [(2, 6), (3, 4)]), ({}, [(6,), (2, 3)]),
    ({"lhs_begin": 0, "lhs_end": 1, "rhs_begin": 0, "rhs_end": 2}, [(30, 7), (15, 2, 4)]),
    ({"lhs_begin": -2, "lhs_end": -1, "rhs_begin": 1, "rhs_end": None}, [(2, 12, 3), (5, 3, 4)]),
    ({"lhs_begin": 1, "lhs_end": None, "rhs_begin": 0, "rhs_end": 1}, [(4, 2, 3), (6, 9)])])
def reshape_like(attrs, lhs, rhs):
    """lhs reshaped (row-major order kept) to lhs[:lb] + rhs[rb:re] + lhs[le:]; rhs read at the
    output's coordinates on the axes it gives, so a share's region of rhs has its sizes."""
    out_shape = attrs.output_shapes[0]
    lb, _, rb, re = _reshape_like_ranges(attrs, lhs.ndim, rhs.ndim)
    moved = same_order(lhs, out_shape)
    mapping = {rb + k: lb + k for k in range(re - rb)}
    return lam(len(out_shape), lambda *i: depends(moved(*i), rhs[_like_index(
        i, rhs.ndim, mapping)]))


def _broadcast_axes(attrs, ndim):
    return tuple(a % ndim for a in _ints(attrs.get("axis")))


def _broadcast_axis_shard(attrs, ctx):
    """A share runs with its own size on each broadcast axis."""
    axes = _broadcast_axes(attrs, len(ctx.input_shapes[0]))
    out = ctx.size(ctx.outputs[0])
    return Shard({"axis": axes, "size": tuple(out[a] for a in axes)})


@op("broadcast_axis", shard=_broadcast_axis_shard, examples=[
    ({"axis": 1, "size": 3}, [(2, 1)]), ({"axis": (0, 2), "size": (2, 4)}, [(1, 3, 1)]),
    ({"axis": (2,), "size": (5,)}, [(2, 3, 1)])])
def broadcast_axis(attrs, data):
    """out[i] = data[i with 0 on each broadcast axis]. (MXNet 1.9.1 rejects negative axes.)"""
    axes = set(_broadcast_axes(attrs, data.ndim))
    return lam(data.ndim, lambda *i: data[tuple(0 if a in axes else x for a, x in enumerate(i))])


@op("broadcast_like", examples=[
    ({}, [(1, 3), (4, 3)]), ({}, [(2, 1, 1), (2, 3, 4)]),
    ({"lhs_axes": (0, -1), "rhs_axes": (1, 0)}, [(1, 3, 1), (5, 4, 2)]),
    ({"lhs_axes": (1,), "rhs_axes": (-1,)}, [(2, 1), (3, 6)])])
def broadcast_like(attrs, lhs, rhs):
    """lhs broadcast along its size-1 axes to rhs's sizes: all axes (same rank) when no axes
    are given, else lhs_axes[k] to the size of rhs's rhs_axes[k]. rhs is read at the output's
    coordinates on the axes that give sizes."""
    lhs_axes, rhs_axes = _ints(attrs.get("lhs_axes")), _ints(attrs.get("rhs_axes"))
    if lhs_axes and rhs_axes:
        pairs = {r % rhs.ndim: a % lhs.ndim for a, r in zip(lhs_axes, rhs_axes)}
        broadcast = set(pairs.values())
    else:
        pairs = {a: a for a in range(rhs.ndim)}
        broadcast = {a for a in range(lhs.ndim) if lhs.shape[a] == 1}

    def read(*i):
        value = lhs[tuple(0 if a in broadcast else x for a, x in enumerate(i))]
        return depends(value, rhs[_like_index(i, rhs.ndim, pairs)])
    return lam(lhs.ndim, read)


# --- Crop -------------------------------------------------------------------------------------

def _crop_offset(attrs, data_shape, out_shape):
    """The window's offset; MXNet rejects one past the room the window leaves, so bounding it
    by that room changes nothing, except at the search's views below a first cut (which keep
    the attributes but read just the window): there it is 0, as the share runs."""
    room = (data_shape[2] - out_shape[2], data_shape[3] - out_shape[3])
    if attrs.get("center_crop", False):
        return room[0] // 2, room[1] // 2
    offset = _ints(attrs.get("offset")) or (0, 0)
    return min(offset[0], room[0]), min(offset[1], room[1])


def _crop_shard(attrs, ctx):
    """The share's input box starts where its window does: no offset, its own size."""
    size = ctx.size(ctx.outputs[0])
    changes = {"offset": (0, 0), "center_crop": False}
    if int(attrs.get("num_args", 1)) == 1:
        changes["h_w"] = (size[2], size[3])
    return Shard(changes)


@op("Crop", shard=_crop_shard, examples=[
    ({"num_args": 1, "h_w": (2, 3), "offset": (1, 2)}, [(2, 3, 5, 6)]),
    ({"num_args": 1, "h_w": (2, 3), "center_crop": True}, [(1, 2, 5, 6)]),
    ({"num_args": 1, "h_w": (3, 3), "center_crop": True}, [(1, 2, 6, 6)]),
    ({"num_args": 2, "offset": (1, 1)}, [(2, 3, 5, 6), (2, 1, 2, 4)]),
    ({"num_args": 2, "center_crop": True}, [(1, 2, 5, 6), (3, 4, 2, 3)])])
def crop(attrs, arg0, arg1=None):
    """out[n, c, y, x] = data[n, c, y + oy, x + ox] (MXNet names the inputs arg0, arg1); the
    window is h_w, or crop_like's last two sizes; the offset is given or centres it
    (rounded down). crop_like is read at the output's rows and columns (and its batch and
    channel where they match data's)."""
    out_shape = attrs.output_shapes[0]
    oy, ox = _crop_offset(attrs, arg0.shape, out_shape)

    def read(n, c, y, x):
        value = arg0[n, c, y + oy, x + ox]
        if arg1 is None:
            return value
        like = (n if arg1.shape[0] == arg0.shape[0] else 0,
                c if arg1.shape[1] == arg0.shape[1] else 0, y, x)
        return depends(value, arg1[like])
    return read


# --- split_v2 ---------------------------------------------------------------------------------

def _split_v2_pieces(attrs, shape):
    """(axis, [(start, end) of each piece], squeeze_axis)."""
    axis = int(attrs.get("axis", 0)) % len(shape)
    n = shape[axis]
    sections = int(attrs.get("sections", 0) or 0)
    if sections > 0:
        width = n // sections
        bounds = [k * width for k in range(sections)] + [n]
    else:
        bounds = list(_ints(attrs.get("indices"))) + [n]
    pieces = [(bounds[k], bounds[k + 1]) for k in range(len(bounds) - 1)]
    return axis, pieces, bool(attrs.get("squeeze_axis", False))


def _split_v2_shard(attrs, ctx):
    """As SliceChannel: a share holding parts of pieces reads each output's region of the
    input (``views``); one holding whole pieces runs as the operator or reads them so
    (``also_runs``)."""
    axis, pieces, squeeze = _split_v2_pieces(attrs, ctx.input_shapes[0])
    views = []
    for (start, end), box in zip(pieces, ctx.outputs):
        box = list(box)
        if squeeze:
            box.insert(axis, (0, 0))
        lo, hi = box[axis]
        box[axis] = (start + lo, start + hi)
        views.append(tuple(box))
    whole = all(v[axis] == (start, end - 1) for v, (start, end) in zip(views, pieces))
    if not whole:
        return Shard(views=tuple(views))
    # a squeezed output is not a region's shape: it runs as the operator
    return Shard() if squeeze else Shard(views=tuple(views), also_runs=True)


@op("_split_v2", shard=_split_v2_shard, examples=[
    ({"indices": (0, 1, 3), "axis": 1}, [(2, 5)]),
    ({"indices": (), "sections": 2, "axis": 0}, [(4, 3)]),
    ({"indices": (), "sections": 3, "axis": -1, "squeeze_axis": True}, [(2, 2, 3)]),
    ({"indices": (0, 2), "axis": 2}, [(2, 3, 4)]),
    ({"indices": (0, 1, 2), "axis": 0, "squeeze_axis": True}, [(3, 2)])])
def split_v2(attrs, data):
    """Output k is piece k along ``axis`` (from ``indices``, which the front end starts with
    0, or ``sections`` equal pieces). Equal pieces share the axis variable, so one split
    divides every piece; unequal ones have one each."""
    axis, pieces, squeeze = _split_v2_pieces(attrs, data.shape)
    equal = len({end - start for start, end in pieces}) == 1

    def piece(k):
        start = pieces[k][0]
        names = [(f"i{a}" if a != axis or equal else f"p{k}") for a in range(data.ndim)
                 if not (squeeze and a == axis)]

        def read(*i):
            i = list(i)
            if squeeze:
                i.insert(axis, 0)
            i[axis] = start + i[axis]
            return data[tuple(i)]
        return lam(names, read)
    return tuple(piece(k) for k in range(len(pieces)))


# --- Concat variants and identities -----------------------------------------------------------

op("_rnn_param_concat", shard=_read_count, examples=[
    ({"dim": 0, "num_args": 2}, [(6,), (4,)]),
    ({"dim": 0, "num_args": 3}, [(12,), (8,), (4,)]),
    ({"dim": 1, "num_args": 2}, [(2, 3), (2, 4)])])(concat)


@op("_identity_with_attr_like_rhs", examples=[({}, [(2, 3), (2, 3)]), ({}, [(4,), (4,)])])
def identity_with_attr_like_rhs(attrs, lhs, rhs):
    """lhs unchanged (rhs only lends its storage type; it has lhs's shape)."""
    return lam(lhs.ndim, lambda *i: depends(lhs[i], rhs[i]))
