"""Convolution and pooling (NCHW-style layouts, 1-D to 3-D)."""
import math

from tofu_mx.tdl import Max, Shard, Sum, in_range, lam, op, where


def _spatial(attrs, key, n, default):
    value = attrs.get(key, ())
    return tuple(value) if value else (default,) * n


def _window_pads(ctx, axes, kernel, stride, out_size, explicit_ok):
    """Per spatial axis, the pad attribute one share runs with, and the axes whose input is
    read in its unclipped window with the pad values materialised (a share at a border needs
    padding on one side only, which MXNet's symmetric ``pad`` cannot say)."""
    pads, explicit = [], []
    for a, k, s in zip(axes, kernel, stride):
        (wlo, whi), box = ctx.windows[0][a], ctx.inputs[0]
        want = ctx.size(ctx.outputs[0])[a]
        # a share reading nothing but padding (no box) reads its whole window materialised
        (clo, chi) = box[a] if box is not None else (wlo, whi)
        lo, hi = clo - wlo, whi - chi
        if box is not None and hi <= lo and out_size(chi - clo + 1, lo, k, s) == want:
            pads.append(lo)
        elif explicit_ok and out_size(whi - wlo + 1, 0, k, s) == want:
            pads.append(0)
            explicit.append(a)
        else:
            return None
    return tuple(pads), tuple(explicit)


def _conv_size(length, pad, kernel, stride):
    return (length + 2 * pad - kernel) // stride + 1


def _conv_shard(attrs, ctx):
    n = len(ctx.input_shapes[0]) - 2
    kernel = tuple(attrs["kernel"])
    dilate, stride = _spatial(attrs, "dilate", n, 1), _spatial(attrs, "stride", n, 1)
    k_eff = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilate))
    found = _window_pads(ctx, range(2, n + 2), k_eff, stride, _conv_size, True)
    if found is None:
        return None
    pads, explicit = found
    filters, per_group = ctx.size(ctx.outputs[0])[1], ctx.size(ctx.inputs[1])[1]
    in_channels = ctx.size(ctx.windows[0])[1]
    groups = in_channels // per_group
    if groups * per_group != in_channels or filters % groups:
        return None
    changes = {"num_filter": filters, "num_group": groups, "pad": pads}
    if len(ctx.inputs) > 2 and ctx.inputs[2] is None:
        changes["no_bias"] = True
    return Shard(changes, {0: explicit} if explicit else {})


@op("Convolution", shard=_conv_shard, examples=[
    ({"kernel": (3, 3), "num_filter": 4, "pad": (1, 1)}, [(2, 3, 5, 5), (4, 3, 3, 3), (4,)]),
    ({"kernel": (3, 3), "num_filter": 4, "stride": (2, 2), "no_bias": True},
     [(2, 3, 7, 7), (4, 3, 3, 3)]),
    ({"kernel": (3, 3), "num_filter": 4, "dilate": (2, 2), "pad": (2, 2), "no_bias": True},
     [(1, 2, 6, 6), (4, 2, 3, 3)]),
    ({"kernel": (3, 3), "num_filter": 6, "num_group": 3, "pad": (1, 1)},
     [(2, 6, 4, 4), (6, 2, 3, 3), (6,)]),
    ({"kernel": (3, 3), "num_filter": 4, "num_group": 4, "pad": (1, 1), "no_bias": True},
     [(1, 4, 5, 5), (4, 1, 3, 3)]),
    ({"kernel": (3,), "num_filter": 3, "pad": (1,), "stride": (2,)}, [(2, 2, 7), (3, 2, 3), (3,)]),
    ({"kernel": (7, 1), "num_filter": 2, "pad": (3, 0), "no_bias": True},
     [(1, 2, 8, 3), (2, 2, 7, 1)]),
])
def convolution(attrs, data, weight, bias=None):
    """y[b, co, x..] = sum_{ci, d..} data[b, g(co)*Cg + ci, x*stride + d*dilate - pad]
    * weight[co, ci, d..] (+ bias[co]); g(co) = co // (filters per group)."""
    n = data.ndim - 2
    stride, dilate = _spatial(attrs, "stride", n, 1), _spatial(attrs, "dilate", n, 1)
    pad = _spatial(attrs, "pad", n, 0)
    groups = int(attrs.get("num_group", 1))
    # per group from the attributes and the weight, not from the data's and weight's channel
    # counts: below the search's first cut those are a part's (a depthwise convolution's
    # half has half the channels, but as many groups in its attributes)
    in_per_group = weight.shape[1]
    out_per_group = int(attrs.get("num_filter", weight.shape[0])) // groups
    padded = data.padded(0.0)
    with_bias = bias is not None and not attrs.get("no_bias", False)

    def out(b, co, *xs):
        def window(ci, *ds):
            pos = tuple(x * s + d * dl - p for x, d, s, dl, p in zip(xs, ds, stride, dilate, pad))
            return padded[(b, (co // out_per_group) * in_per_group + ci, *pos)] * \
                weight[(co, ci, *ds)]
        total = Sum(lam(["ci"] + [f"d{k}" for k in range(n)], window))
        return total + bias[co] if with_bias else total
    return lam(["b", "co"] + [f"x{k}" for k in range(n)], out)


def _pool_window_count(shape, xs, kernel, stride, pad, include_pad):
    """How many window elements avg pooling divides by at output position ``xs``."""
    n = len(kernel)

    def inside(*ds):
        value = 1.0
        for x, d, k, s, p, size in zip(xs, ds, kernel, stride, pad, shape):
            lo, hi = (-p, size + p) if include_pad else (0, size)
            value = where(in_range(x * s + d - p, lo, hi), value, 0.0)
        return value
    return Sum(lam([f"c{k}" for k in range(n)], inside), *kernel)


def _pool_shard(attrs, ctx, legacy=False):
    n = len(ctx.input_shapes[0]) - 2
    kind = attrs.get("pool_type", "max")
    if attrs.get("global_pool", False):
        if ctx.partial is None or kind != "avg":
            return Shard()
        whole = ctx.input_shapes[0][2:]
        return Shard(scale=math.prod(ctx.size(ctx.inputs[0])[2:]) / math.prod(whole))
    kernel = tuple(attrs["kernel"])
    stride = _spatial(attrs, "stride", n, 1)
    full = attrs.get("pooling_convention", "valid") == "full"

    def size(length, pad, k, s):
        return -((length + 2 * pad - k) // -s) + 1 if full else _conv_size(length, pad, k, s)
    # Materialised pads are read like data: right for max (its pad value is -inf) and for an
    # average that counts the pad; not for one that skips it, nor past the "full" border.
    # Pooling_v1 pads with zeros for every kind and divides by the kernel's area: right
    # except past the "full" border, which it skips.
    if legacy:
        explicit_ok = not full
    else:
        explicit_ok = kind == "max" or (attrs.get("count_include_pad", True) and not full)
    found = _window_pads(ctx, range(2, n + 2), kernel, stride, size, explicit_ok)
    if found is None:
        return None
    pads, explicit = found
    return Shard({"pad": pads}, {0: explicit} if explicit else {})


def _pool_v1_shard(attrs, ctx):
    return _pool_shard(attrs, ctx, legacy=True)


def describe_pooling(attrs, data, legacy=False):
    """Pooling, or (``legacy``) Pooling_v1: its pad is zeros for max too, positions past the
    padded input ("full" convention) are skipped, and average divides by the kernel's area."""
    n = data.ndim - 2
    spatial = data.shape[2:]
    if attrs.get("global_pool", False):
        kernel, stride, pad = tuple(spatial), (1,) * n, (0,) * n
    else:
        kernel = tuple(attrs["kernel"])
        stride, pad = _spatial(attrs, "stride", n, 1), _spatial(attrs, "pad", n, 0)
    kind = attrs.get("pool_type", "max")
    source = data.padded(-math.inf if kind == "max" and not legacy else 0.0)

    def out(b, c, *xs):
        def window(*ds):
            pos = tuple(x * s + d - p for x, d, s, p in zip(xs, ds, stride, pad))
            value = source[(b, c, *pos)]
            if legacy and kind == "max":
                for i, p, size in zip(pos, pad, spatial):
                    value = where(in_range(i, -p, size + p), value, -math.inf)
            return value
        names = [f"d{k}" for k in range(n)]
        if kind == "max":
            return Max(lam(names, window), *kernel)
        total = Sum(lam(names, window), *kernel)
        if kind == "sum":
            return total
        if legacy:
            return total / math.prod(kernel)
        include = attrs.get("count_include_pad", True)
        return total / _pool_window_count(spatial, xs, kernel, stride, pad, include)
    return lam(["b", "c"] + [f"x{k}" for k in range(n)], out)


@op("Pooling", shard=_pool_shard, examples=[
    ({"kernel": (2, 2), "stride": (2, 2), "pool_type": "max"}, [(2, 3, 4, 4)]),
    ({"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "pool_type": "max"}, [(1, 2, 5, 5)]),
    ({"kernel": (3, 3), "stride": (1, 1), "pad": (1, 1), "pool_type": "avg"}, [(1, 2, 4, 4)]),
    ({"kernel": (3, 3), "stride": (1, 1), "pad": (1, 1), "pool_type": "avg",
      "count_include_pad": False}, [(1, 2, 4, 4)]),
    ({"kernel": (3, 3), "stride": (2, 2), "pool_type": "max", "pooling_convention": "full"},
     [(1, 2, 6, 6)]),
    ({"kernel": (3, 3), "stride": (2, 2), "pool_type": "avg", "pooling_convention": "full"},
     [(1, 2, 6, 6)]),
    ({"kernel": (2, 2), "pool_type": "sum", "stride": (2, 2)}, [(1, 2, 4, 4)]),
    ({"global_pool": True, "kernel": (1, 1), "pool_type": "avg"}, [(2, 3, 3, 4)]),
    ({"global_pool": True, "kernel": (1, 1), "pool_type": "max"}, [(2, 3, 3, 4)]),
    ({"global_pool": True, "kernel": (1, 1), "pool_type": "sum"}, [(2, 3, 3, 4)]),
    ({"kernel": (3,), "stride": (2,), "pool_type": "avg"}, [(2, 2, 7)]),
])
def pooling(attrs, data):
    """Max, average or sum over a window; windows reach into the pad (and, with the "full"
    convention, past it), which max ignores and average counts as MXNet does."""
    return describe_pooling(attrs, data)
