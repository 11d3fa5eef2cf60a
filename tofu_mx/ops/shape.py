"""Shape and layout: Reshape (every special code), Flatten, expand_dims, squeeze, transpose,
slice, slice_axis, SliceChannel (split), Concat, stack."""
import numpy as np

from tofu_mx.tdl import Shard, in_range, lam, op, where


def _runs(out_shape, in_shape):
    """Pair runs of output axes with runs of input axes of equal total size. A reshape keeps
    row-major order, so each output run is read from its partner run alone."""
    runs, i, j = [], 0, 0
    while i < len(out_shape) or j < len(in_shape):
        outs, ins, po, pi = [], [], 1, 1
        if i < len(out_shape):
            outs.append(i)
            po, i = po * out_shape[i], i + 1
        if j < len(in_shape):
            ins.append(j)
            pi, j = pi * in_shape[j], j + 1
        while po != pi:
            if po < pi:
                outs.append(i)
                po, i = po * out_shape[i], i + 1
            else:
                ins.append(j)
                pi, j = pi * in_shape[j], j + 1
        runs.append((outs, ins))
    return runs


def _strides(shape, axes):
    return [int(np.prod([shape[b] for b in axes[k + 1:]], dtype=np.int64)) for k in range(len(axes))]


def same_order(data, out_shape):
    """The lambda of any reshape: out[i] = data[j], j being i re-read in data's shape."""
    in_shape = data.shape
    runs = _runs(tuple(out_shape), in_shape)

    def read(*i):
        index = [0] * len(in_shape)
        for outs, ins in runs:
            linear = sum((i[a] * s for a, s in zip(outs, _strides(out_shape, outs))), 0)
            for k, (a, stride) in enumerate(zip(ins, _strides(in_shape, ins))):
                part = linear // stride
                index[a] = part if k == 0 else part % in_shape[a]
        return data[tuple(index)]
    return lam(len(out_shape), read)


def same_count(ctx) -> bool:
    """Whether a reshaping share reads exactly as many elements as it writes. The analysis
    gives the bounding box of what it reads; when a share's output starts or ends inside an
    input row, that box holds more (MXNet's Reshape does not check the count, its kernel
    fails)."""
    return np.prod(ctx.size(ctx.inputs[0])) == np.prod(ctx.size(ctx.outputs[0]))


def _count_kept(attrs, ctx):
    return Shard() if same_count(ctx) else None


def _reshaping(name, examples, shard=_count_kept):
    op(name, examples=examples, shard=shard)(
        lambda attrs, data: same_order(data, attrs.output_shapes[0]))


def _target_shape(attrs, ctx):
    """A reshape's share: the share's output shape, spelled out (no special codes)."""
    if not same_count(ctx):
        return None
    return Shard({"shape": ctx.size(ctx.outputs[0]), "reverse": False})


_reshaping("Reshape", shard=_target_shape, examples=[
    ({"shape": (-1, 4)}, [(2, 3, 4)]), ({"shape": (0, 0, 2, -1)}, [(2, 3, 4)]),
    ({"shape": (-3, 0)}, [(2, 3, 4)]), ({"shape": (-4, -1, 2, 0, 0)}, [(4, 3, 5)]),
    ({"shape": (0, -2)}, [(2, 3, 4)]), ({"shape": (0, 0, -3)}, [(2, 3, 2, 2)]),
    ({"shape": (6, 4)}, [(4, 6)]), ({"shape": (-1,)}, [(3, 1, 2)]),
    ({"shape": (2, 3, 1)}, [(6,)]), ({"shape": (-1, 2), "reverse": True}, [(3, 4)]),
])
_reshaping("Flatten", [({}, [(2, 3, 4)]), ({}, [(2, 5)])])
_reshaping("expand_dims", [({"axis": 1}, [(2, 3)]), ({"axis": -1}, [(2, 3)]), ({"axis": 0}, [(4,)])])
_reshaping("squeeze", [({}, [(2, 1, 3, 1)]), ({"axis": 1}, [(2, 1, 3)])])


@op("transpose", examples=[({"axes": (0, 2, 1, 3)}, [(2, 3, 4, 5)]), ({}, [(2, 3, 4)]),
                           ({"axes": (1, 0)}, [(3, 5)])])
def transpose(attrs, data):
    axes = tuple(attrs.get("axes", ())) or tuple(reversed(range(data.ndim)))

    def read(*i):
        index = [None] * data.ndim
        for k, a in enumerate(axes):
            index[a] = i[k]
        return data[tuple(index)]
    return lam(data.ndim, read)


def _bound(value, n, default):
    if value is None:
        return default
    return value + n if value < 0 else value


def _slice_shard(attrs, ctx):
    """Begin and end move with the share's offsets (unit steps only)."""
    n = len(ctx.input_shapes[0])
    begin = tuple(attrs["begin"])
    if any(s not in (None, 1) for s in tuple(attrs.get("step", ()) or ())):
        return None
    box, out = ctx.inputs[0], ctx.outputs[0]
    new_begin, new_end = [], []
    for a in range(n):
        start = _bound(begin[a], ctx.input_shapes[0][a], 0) if a < len(begin) else 0
        lo = start + out[a][0] - box[a][0]
        new_begin.append(lo)
        new_end.append(lo + out[a][1] - out[a][0] + 1)
    return Shard({"begin": tuple(new_begin), "end": tuple(new_end), "step": ()})


@op("slice", shard=_slice_shard, examples=[({"begin": (1, 0), "end": (3, 4)}, [(4, 5)]),
                       ({"begin": (0, None, 1), "end": (None, 4, 5), "step": (1, 2, 2)}, [(2, 5, 6)]),
                       ({"begin": (-3,), "end": (-1,)}, [(6, 2)]),
                       ({"begin": (4,), "end": (0,), "step": (-2,)}, [(6, 2)])])
def slice_(attrs, data):
    begin, step = tuple(attrs["begin"]), tuple(attrs.get("step", ()) or ())
    step = step + (None,) * (len(begin) - len(step))

    def read(*i):
        index = list(i)
        for a, (b, s) in enumerate(zip(begin, step)):
            s = 1 if s is None else s
            start = _bound(b, data.shape[a], 0 if s > 0 else data.shape[a] - 1)
            index[a] = start + i[a] * s
        return data[tuple(index)]
    return lam(data.ndim, read)


def _slice_axis_shard(attrs, ctx):
    axis = int(attrs["axis"]) % len(ctx.input_shapes[0])
    start = _bound(attrs["begin"], ctx.input_shapes[0][axis], 0)
    lo = start + ctx.outputs[0][axis][0] - ctx.inputs[0][axis][0]
    return Shard({"begin": lo, "end": lo + ctx.size(ctx.outputs[0])[axis]})


@op("slice_axis", shard=_slice_axis_shard, examples=[({"axis": 1, "begin": 1, "end": 3}, [(2, 4)]),
                            ({"axis": 0, "begin": -2, "end": None}, [(5, 2)])])
def slice_axis(attrs, data):
    axis = int(attrs["axis"]) % data.ndim
    start = _bound(attrs["begin"], data.shape[axis], 0)
    return lam(data.ndim, lambda *i: data[tuple(start + x if a == axis else x
                                                for a, x in enumerate(i))])


def _pieces(attrs, shape):
    """SliceChannel's geometry: (outputs, axis, width of each piece, squeeze_axis)."""
    n = int(attrs["num_outputs"])
    axis = int(attrs.get("axis", 1)) % len(shape)
    return n, axis, shape[axis] // n, bool(attrs.get("squeeze_axis", False))


def _slice_channel_shard(attrs, ctx):
    """A share holding parts of pieces (each device a slice of every LSTM gate) reads each
    output's region of the input directly (``views``); one holding whole pieces runs as the
    SliceChannel or reads them so (``also_runs``: where they lie in different devices'
    parts of the input, each piece is taken from its part rather than the parts joined
    first to be cut again)."""
    _, axis, width, squeeze = _pieces(attrs, ctx.input_shapes[0])
    views = []
    for k, box in enumerate(ctx.outputs):
        box = list(box)
        if squeeze:
            box.insert(axis, (0, 0))
        lo, hi = box[axis]
        box[axis] = (k * width + lo, k * width + hi)
        views.append(tuple(box))
    whole = all(v[axis] == (k * width, (k + 1) * width - 1) for k, v in enumerate(views))
    if not whole:
        return Shard(views=tuple(views))
    # a squeezed output is not a region's shape: it runs as the operator
    return Shard() if squeeze else Shard(views=tuple(views), also_runs=True)


@op("SliceChannel", shard=_slice_channel_shard, examples=[({"num_outputs": 2}, [(2, 4, 3)]),
                              ({"num_outputs": 3, "axis": 1, "squeeze_axis": True}, [(2, 3, 4)]),
                              ({"num_outputs": 2, "axis": -1}, [(2, 3, 4)]),
                              ({"num_outputs": 4, "axis": 0}, [(8, 2)])])
def slice_channel(attrs, data):
    """Output k is the k-th equal piece along ``axis``; every output shares the variables."""
    n, axis, width, squeeze = _pieces(attrs, data.shape)
    names = [f"i{a}" for a in range(data.ndim) if not (squeeze and a == axis)]

    def piece(k):
        def read(*i):
            i = list(i)
            if squeeze:
                i.insert(axis, 0)
            i[axis] = k * width + i[axis]
            return data[tuple(i)]
        return lam(names, read)
    return tuple(piece(k) for k in range(n))


def _read_count(attrs, ctx):
    """Concat/stack along the split axis: a share reads only some of the inputs."""
    return Shard({"num_args": sum(box is not None for box in ctx.inputs)})


@op("Concat", shard=_read_count, examples=[({"dim": 1, "num_args": 2}, [(2, 3), (2, 4)]),
                        ({"dim": 1, "num_args": 3}, [(1, 2, 2, 2), (1, 3, 2, 2), (1, 1, 2, 2)]),
                        ({"dim": 0, "num_args": 2}, [(2, 3), (1, 3)])])
def concat(attrs, *data):
    axis = int(attrs.get("dim", 1)) % data[0].ndim
    offsets = np.cumsum([0] + [d.shape[axis] for d in data]).tolist()

    def read(*i):
        def piece(k):
            index = tuple(x - offsets[k] if a == axis else x for a, x in enumerate(i))
            if k == len(data) - 1:
                return data[k][index]
            return where(in_range(i[axis], offsets[k], offsets[k + 1]), data[k][index], piece(k + 1))
        return piece(0)
    return lam(data[0].ndim, read)


@op("stack", shard=_read_count, examples=[({"axis": 1, "num_args": 3}, [(2, 4)] * 3), ({"axis": 0, "num_args": 2}, [(3,)] * 2),
                       ({"axis": -1, "num_args": 2}, [(2, 3)] * 2)])
def stack(attrs, *data):
    rank = data[0].ndim + 1
    axis = int(attrs.get("axis", 0)) % rank

    def read(*i):
        rest = tuple(x for a, x in enumerate(i) if a != axis)

        def piece(k):
            if k == len(data) - 1:
                return data[k][rest]
            return where(in_range(i[axis], k, k + 1), data[k][rest], piece(k + 1))
        return piece(0)
    return lam(rank, read)
