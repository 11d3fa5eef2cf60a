"""Neural-network layers: Deconvolution, UpSampling, adaptive pooling, bilinear resizing, LRN,
instance/group/L2 normalisation, SoftmaxActivation, Correlation and the legacy ``*_v1``
operators (softmin is described with softmax in :mod:`tofu_mx.ops.reduce`).

Normalisations (InstanceNorm, GroupNorm, L2Normalization, LRN) are offered only the splits whose
shares are the operator itself: a share's statistics must cover whole normalised groups, so
splitting a normalised axis (the spatial axes of InstanceNorm, the channel window of LRN...) is
derived by the analysis but not offered (:mod:`tofu_mx.tdl.shares`).
"""
from tofu_mx.ops.conv import _conv_shard, _pool_v1_shard, _spatial, convolution, describe_pooling
from tofu_mx.ops.norm import _normalise, describe_batch_norm, moments
from tofu_mx.tdl import (Max, Shard, Sum, TDLError, absolute, depends, equal, exp, in_range,
                         lam, less, op, rsqrt, sqrt, where)


# --- Deconvolution ----------------------------------------------------------------------------

def _deconv_geometry(attrs, spatial_in):
    """kernel, stride, dilate and the (pad, adj) MXNet uses per spatial axis: ``target_shape``
    (when any entry is nonzero) overrides pad and adj with the smallest symmetric pad that
    gives it, the odd remainder going to adj."""
    n = len(spatial_in)
    kernel = tuple(attrs["kernel"])
    stride, dilate = _spatial(attrs, "stride", n, 1), _spatial(attrs, "dilate", n, 1)
    target = tuple(attrs.get("target_shape", ()) or ())
    if any(target):
        pads, adjs = [], []
        for size, k, s, dl, t in zip(spatial_in, kernel, stride, dilate, target):
            total = s * (size - 1) + (k - 1) * dl + 1 - t
            pads.append((total + 1) // 2)
            adjs.append(total % 2)
        return kernel, stride, dilate, tuple(pads), tuple(adjs)
    return (kernel, stride, dilate, _spatial(attrs, "pad", n, 0), _spatial(attrs, "adj", n, 0))


def _deconv_pads(ctx, kernel, stride, dilate, pad):
    """Per spatial axis, the (pad, adj) a share of a deconvolution runs with, and the axes whose
    input is read in its unclipped window (zeros materialised): out[y] = full[y + pad], full
    being the uncropped transposed convolution, so a share starting at output row ``lo`` over
    input rows from ``x0`` needs pad' = pad + lo - x0 * stride, and its size fixes adj'."""
    pads, adjs, explicit = [], [], []
    for a, (k, s, dl, p) in enumerate(zip(kernel, stride, dilate, pad), start=2):
        lo, hi = ctx.outputs[0][a]
        want = hi - lo + 1
        k_eff = (k - 1) * dl + 1
        inside = () if ctx.inputs[0] is None else ((ctx.inputs[0][a], False),)
        for (x0, x1), materialise in inside + ((ctx.windows[0][a], True),):
            p_share = p + lo - x0 * s
            adj = want - ((x1 - x0) * s + k_eff - 2 * p_share)
            if p_share >= 0 and 0 <= adj < s:
                break
        else:
            return None
        pads.append(p_share)
        adjs.append(adj)
        if materialise:
            explicit.append(a)
    return tuple(pads), tuple(adjs), tuple(explicit)


def _deconv_shard(attrs, ctx):
    """A share's filters (num_filter), groups (num_group, from how many filters per group the
    share reads of the weight), pad and adj; batch, filter, group and input-channel splits and,
    where a symmetric pad can say it, spatial splits."""
    n = len(ctx.input_shapes[0]) - 2
    kernel, stride, dilate, pad, _ = _deconv_geometry(attrs, ctx.input_shapes[0][2:])
    found = _deconv_pads(ctx, kernel, stride, dilate, pad)
    if found is None:
        return None
    pads, adjs, explicit = found
    filters = ctx.size(ctx.outputs[0])[1]
    channels, rows, per_group = (ctx.size(ctx.windows[0])[1], ctx.size(ctx.inputs[1])[0],
                                 ctx.size(ctx.inputs[1])[1])
    groups = filters // per_group
    if groups * per_group != filters or channels % groups or rows != channels:
        return None
    changes = {"num_filter": filters, "num_group": groups, "pad": pads, "adj": adjs}
    if any(attrs.get("target_shape", ()) or ()):
        changes["target_shape"] = (0,) * n
    if len(ctx.inputs) > 2 and ctx.inputs[2] is None:
        changes["no_bias"] = True
    return Shard(changes, {0: explicit} if explicit else {})


def transposed_convolution(data, weight, bias, kernel, stride, dilate, pad, groups):
    """y[b, co, x..] = sum over input channels ci of co's group and taps d with
    x + pad = i * stride + d * dilate of data[b, ci, i..] * weight[ci, co mod per-group, d..]
    (+ bias[co]): the gradient of a convolution with respect to its input."""
    n = data.ndim - 2
    in_per_group, out_per_group = data.shape[1] // groups, weight.shape[1]
    padded = data.padded(0.0)

    def out(b, co, *xs):
        def tap(ci, *ds):
            shifted = [x + p - d * dl for x, d, p, dl in zip(xs, ds, pad, dilate)]
            channel = (co // out_per_group) * in_per_group + ci
            value = padded[(b, channel, *(z // s for z, s in zip(shifted, stride)))] * \
                weight[(channel, co % out_per_group, *ds)]
            for z, s in zip(shifted, stride):
                if s > 1:   # only taps landing on a multiple of the stride contribute
                    value = where(equal(z % s, 0), value, 0.0)
            return value
        total = Sum(lam(["ci"] + [f"d{k}" for k in range(n)], tap), in_per_group, *kernel)
        return total + bias[co] if bias is not None else total
    return lam(["b", "co"] + [f"x{k}" for k in range(n)], out)


@op("Deconvolution", shard=_deconv_shard, examples=[
    ({"kernel": (3, 3), "num_filter": 4}, [(2, 3, 4, 4), (3, 4, 3, 3)]),
    ({"kernel": (4, 4), "stride": (2, 2), "pad": (1, 1), "num_filter": 3, "no_bias": False},
     [(2, 2, 3, 4), (2, 3, 4, 4), (3,)]),
    ({"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "adj": (1, 0), "num_filter": 2},
     [(1, 3, 3, 4), (3, 2, 3, 3)]),
    ({"kernel": (3, 3), "stride": (2, 2), "target_shape": (8, 7), "num_filter": 2},
     [(1, 2, 4, 4), (2, 2, 3, 3)]),
    ({"kernel": (3, 3), "stride": (3, 2), "pad": (2, 1), "adj": (2, 1), "num_filter": 2},
     [(1, 2, 3, 3), (2, 2, 3, 3)]),
    ({"kernel": (3, 3), "num_filter": 6, "num_group": 3, "pad": (1, 1), "no_bias": False},
     [(2, 6, 4, 4), (6, 2, 3, 3), (6,)]),
    ({"kernel": (2, 3), "dilate": (2, 2), "num_filter": 2}, [(1, 2, 3, 4), (2, 2, 2, 3)]),
    ({"kernel": (3,), "stride": (2,), "pad": (1,), "adj": (1,), "num_filter": 3,
      "no_bias": False}, [(2, 2, 5), (2, 3, 3), (3,)]),
    ({"kernel": (4,), "stride": (2,), "target_shape": (9,), "num_filter": 2},
     [(2, 3, 4), (3, 2, 4)]),
])
def deconvolution(attrs, data, weight, bias=None):
    """The transposed convolution, cropped by ``pad`` on both sides and extended by ``adj``
    zero-contribution rows at the end (or padded to ``target_shape``). MXNet's ``no_bias``
    defaults to True here, unlike Convolution's. 1-D and 2-D: MXNet's CPU kernel has no 3-D
    (the description would trace, the check could not run it)."""
    kernel, stride, dilate, pad, _ = _deconv_geometry(attrs, data.shape[2:])
    with_bias = bias is not None and not attrs.get("no_bias", True)
    return transposed_convolution(data, weight, bias if with_bias else None, kernel, stride,
                                  dilate, pad, int(attrs.get("num_group", 1)))


# --- UpSampling -------------------------------------------------------------------------------

def _bilinear_upsampling_geometry(scale):
    """UpSampling's bilinear mode is a depthwise Deconvolution: kernel 2s - s % 2, stride s,
    pad ceil((s - 1) / 2), one group per channel, no bias."""
    return (2 * scale - scale % 2,) * 2, (scale,) * 2, (1, 1), (scale // 2,) * 2


def _upsampling_shard(attrs, ctx):
    """Nearest: the share upsamples the inputs it reads (a channel split may skip some of a
    concatenation's), each by its own factor, so every split output axis must start and end
    on a multiple of every factor. Bilinear: filters and groups follow the channels; a spatial
    share must need exactly the operator's pad (or its zeros materialised) and no adj."""
    out = ctx.outputs[0]
    if attrs.get("sample_type") == "bilinear":
        kernel, stride, dilate, pad = _bilinear_upsampling_geometry(int(attrs["scale"]))
        found = _deconv_pads(ctx, kernel, stride, dilate, pad)
        if found is None or found[0] != pad or any(found[1]):
            return None
        channels = ctx.size(ctx.inputs[0])[1]
        explicit = found[2]
        return Shard({"num_filter": channels}, {0: explicit} if explicit else {})
    read = [(box, shape) for box, shape in zip(ctx.inputs, ctx.input_shapes) if box is not None]
    height = ctx.output_shapes[0][2]
    for _, shape in read:
        factor = height // shape[2]
        for a in (2, 3):
            lo, hi = out[a]
            if lo % factor or (hi + 1) % factor:
                return None
    first = ctx.size(read[0][0])
    rows = ctx.size(out)[2]
    if rows % first[2]:
        return None
    return Shard({"num_args": len(read), "scale": rows // first[2]})


@op("UpSampling", shard=_upsampling_shard, examples=[
    ({"scale": 2, "sample_type": "nearest", "num_args": 1}, [(2, 3, 3, 4)]),
    ({"scale": 3, "sample_type": "nearest", "num_args": 1}, [(1, 2, 2, 3)]),
    ({"scale": 2, "sample_type": "nearest", "num_args": 3},
     [(2, 2, 4, 4), (2, 3, 2, 2), (2, 1, 8, 8)]),
    ({"scale": 2, "sample_type": "nearest", "num_args": 2, "multi_input_mode": "sum"},
     [(1, 3, 2, 4), (1, 3, 1, 2)]),
    ({"scale": 2, "sample_type": "bilinear", "num_filter": 3, "num_args": 2},
     [(2, 3, 3, 4), (3, 1, 4, 4)]),
    ({"scale": 3, "sample_type": "bilinear", "num_filter": 2, "num_args": 2},
     [(1, 2, 3, 2), (2, 1, 5, 5)]),
])
def upsampling(attrs, *inputs):
    """Nearest: out[b, c, y, x] = in[b, c', y // s, x // s], each input upsampled to the
    first's size times ``scale`` by its own factor s (MXNet takes it from the heights, for
    both axes), concatenated on channels or summed. Bilinear: a depthwise transposed
    convolution of ``data`` with the given ``weight`` (MXNet names these two inputs)."""
    scale = int(attrs["scale"])
    if attrs.get("sample_type") == "bilinear":
        data, weight = inputs
        kernel, stride, dilate, pad = _bilinear_upsampling_geometry(scale)
        return transposed_convolution(data, weight, None, kernel, stride, dilate, pad,
                                      data.shape[1])
    height = inputs[0].shape[2] * scale
    summed = attrs.get("multi_input_mode", "concat") == "sum"
    begins = [sum(t.shape[1] for t in inputs[:k]) for k in range(len(inputs))]

    def out(b, c, y, x):
        value = None
        for t, begin in reversed(list(zip(inputs, begins))):
            factor = height // t.shape[2]
            if summed:
                read = t[b, c, y // factor, x // factor]
                value = read if value is None else read + value
            else:
                value = where(in_range(c, begin, begin + t.shape[1]),
                              t[b, c - begin, y // factor, x // factor],
                              0.0 if value is None else value)
        return value
    return out


# --- adaptive pooling and bilinear resizing ---------------------------------------------------

def _adaptive_bounds(o, size, out_size):
    """MXNet's adaptive window of output position ``o``: [floor(o * size / out_size),
    ceil((o + 1) * size / out_size)), as index expressions (or ints for int ``o``)."""
    return (o * size) // out_size, (o * size + size + out_size - 1) // out_size


def _adaptive_shard(attrs, ctx):
    """A share pools its rows and columns adaptively to its own output size: right only where
    every window of the share is the window of the whole at the same output position."""
    out, box = ctx.outputs[0], ctx.inputs[0]
    for a in (2, 3):
        size, out_size = ctx.input_shapes[0][a], ctx.output_shapes[0][a]
        (lo, hi), (in_lo, in_hi) = out[a], box[a]
        mine, mine_out = in_hi - in_lo + 1, hi - lo + 1
        for o in range(mine_out):
            local = _adaptive_bounds(o, mine, mine_out)
            whole = _adaptive_bounds(o + lo, size, out_size)
            if (local[0] + in_lo, local[1] + in_lo) != whole:
                return None
    return Shard({"output_size": ctx.size(out)[2:]})


@op("_contrib_AdaptiveAvgPooling2D", shard=_adaptive_shard, examples=[
    ({"output_size": (2, 3)}, [(2, 3, 4, 6)]),
    ({"output_size": 3}, [(1, 2, 5, 7)]),
    ({"output_size": (4, 2)}, [(1, 2, 7, 3)]),
    ({}, [(2, 2, 3, 4)]),
    ({"output_size": (5, 6)}, [(1, 1, 3, 4)]),
])
def adaptive_avg_pooling(attrs, data):
    """out[b, c, y, x] averages data over rows [floor(y H / OH), ceil((y + 1) H / OH)) and the
    like columns: windows of varying size (and overlapping where OH does not divide H)."""
    spatial, out_size = data.shape[2:], attrs.output_shapes[0][2:]
    widest = [max(hi - lo for lo, hi in (_adaptive_bounds(o, n, m) for o in range(m)))
              for n, m in zip(spatial, out_size)]

    def out(b, c, y, x):
        (y0, y1), (x0, x1) = (_adaptive_bounds(v, n, m)
                              for v, n, m in zip((y, x), spatial, out_size))
        total = Sum(lambda dy, dx: where(less(y0 + dy, y1), where(
            less(x0 + dx, x1), data[b, c, y0 + dy, x0 + dx], 0.0), 0.0), *widest)
        return total / (y1 - y0) / (x1 - x0)
    return out


def _interpolate(read, v, size, out_size, align_corners):
    """Linear interpolation along one axis at output position ``v``, as MXNet's resize computes
    it: source coordinate src = v (size - 1) / (out_size - 1) with aligned corners, else
    max((v + 1/2) size / out_size - 1/2, 0); the row below it and the next (the same row at
    the last), weighted by the fraction. The weights are exact rationals of the shapes: src
    is num(v) / den with an integer numerator, so floor and fraction are ``//`` and ``%``."""
    if out_size == 1:
        return read(0)
    if align_corners:
        num, den = v * (size - 1), out_size - 1
    else:
        num, den = v * (2 * size) + (size - out_size), 2 * out_size
    row, frac = num // den, (num % den) / float(den)
    below = row + 1
    value = (1.0 - frac) * read(row) + frac * where(in_range(below, 0, size), read(below),
                                                    read(row))
    if align_corners or size >= out_size:
        return value     # the source coordinate is never negative
    return where(in_range(num, 0, 2 * size * out_size), value, read(0))


def _resize_shard(attrs, ctx):
    """A share's weights depend on the whole input's size: only batch and channel splits,
    reading every row and column (shrinking without aligned corners skips the edge ones)."""
    out = ctx.outputs[0]
    if any(out[a] != (0, ctx.output_shapes[0][a] - 1) for a in (2, 3)):
        return None
    return Shard(whole={0: (2, 3)})


@op("_contrib_BilinearResize2D", shard=_resize_shard, examples=[
    ({"height": 5, "width": 7}, [(2, 3, 3, 4)]),
    ({"height": 2, "width": 3}, [(1, 2, 5, 7)]),
    ({"height": 6, "width": 5, "align_corners": False}, [(2, 2, 3, 4)]),
    ({"height": 3, "width": 2, "align_corners": False}, [(1, 2, 7, 5)]),
    ({"height": 3, "width": 3, "align_corners": False}, [(1, 3, 9, 7)]),
    ({"scale_height": 2.0, "scale_width": 1.5}, [(1, 2, 3, 4)]),
    ({"scale_height": 0.5, "scale_width": 2.0, "align_corners": False}, [(1, 2, 6, 3)]),
    ({"height": 1, "width": 4}, [(1, 1, 3, 4)]),
    ({"mode": "to_even_up"}, [(1, 2, 3, 5)]),
])
def bilinear_resize(attrs, data):
    """Separable linear interpolation of rows then columns; the output size is MXNet's (from
    height/width, the scales, or the mode). Mode "like" (the size of a second input) is not
    described."""
    if attrs.get("mode", "size") == "like":
        raise TDLError("BilinearResize2D mode='like' reads only its second input's shape")
    align = bool(attrs.get("align_corners", True))
    (h, w), (oh, ow) = data.shape[2:], attrs.output_shapes[0][2:]

    def out(b, c, y, x):
        if (h, w) == (oh, ow):
            return data[b, c, y, x]
        return _interpolate(lambda r: _interpolate(lambda s: data[b, c, r, s], x, w, ow, align),
                            y, h, oh, align)
    return out


# --- normalisation ----------------------------------------------------------------------------

@op("LRN", examples=[
    ({"nsize": 3}, [(2, 5, 3, 3)]),
    ({"nsize": 5, "alpha": 0.01, "beta": 0.5, "knorm": 1.0}, [(1, 7, 2, 3)]),
    ({"nsize": 1, "alpha": 0.1}, [(1, 3, 2, 2)]),
])
def lrn(attrs, data):
    """out = x / (knorm + alpha / nsize * sum of x^2 over the nsize channels centred on x's,
    zeros beyond the ends) ^ beta. A channel split is derived (with a halo) but not offered:
    a share reading the halo would normalise and output those channels too."""
    size = int(attrs["nsize"])
    alpha, beta = float(attrs.get("alpha", 1e-4)), float(attrs.get("beta", 0.75))
    knorm = float(attrs.get("knorm", 2.0))
    padded = data.padded(0.0)

    def out(b, c, y, x):
        window = Sum(lambda j: padded[b, c + j - size // 2, y, x] *
                     padded[b, c + j - size // 2, y, x], size)
        return data[b, c, y, x] * (knorm + window * (alpha / size)) ** (-beta)
    return out


@op("InstanceNorm", examples=[
    ({}, [(2, 3, 4, 4), (3,), (3,)]),
    ({"eps": 1e-5}, [(2, 3, 5), (3,), (3,)]),
    ({"eps": 0.01}, [(1, 2, 2, 3, 2), (2,), (2,)]),
])
def instance_norm(attrs, data, gamma, beta):
    """Normalised over the spatial axes of each (sample, channel), then scaled and shifted
    per channel: split on the batch and channels, never on a spatial axis."""
    eps = float(attrs.get("eps", 1e-3))
    mean, inv_std, _ = _normalise(data, [0, 1], eps)

    def out(*i):
        b, c = i[:2]
        return (data[i] - mean([b, c], "m")) * inv_std([b, c]) * gamma[c] + beta[c]
    return lam(data.ndim, out)


def _group_norm_shard(attrs, ctx):
    """A share holding whole groups is a GroupNorm of those groups (gamma and beta are per
    group in MXNet 1.9)."""
    return Shard({"num_groups": ctx.size(ctx.inputs[1])[0]})


@op("GroupNorm", shard=_group_norm_shard, examples=[
    ({"num_groups": 2}, [(2, 4, 3, 3), (2,), (2,)]),
    ({"num_groups": 1, "eps": 1e-3}, [(2, 3, 5), (1,), (1,)]),
    ({"num_groups": 3, "output_mean_var": True}, [(2, 6, 2, 3), (3,), (3,)]),
    ({"num_groups": 4}, [(1, 4, 2, 2, 2), (4,), (4,)]),
])
def group_norm(attrs, data, gamma, beta):
    """Channels in ``num_groups`` consecutive groups, each normalised with its sample over its
    channels and the spatial axes. In MXNet 1.9.1 gamma and beta have one entry per *group*
    (not per channel). With ``output_mean_var`` the mean and the standard deviation
    sqrt(var + eps) are outputs too, shaped (batch, groups)."""
    eps = float(attrs.get("eps", 1e-5))
    # channels per group from gamma (one entry per group), not from num_groups: below the
    # search's first cut the view holds a part's channels and groups, with the original
    # attributes (as Convolution's per-group sizes)
    per_group = data.shape[1] // gamma.shape[0]
    spatial = data.shape[2:]

    def read(kept, free):
        b, g = kept
        return data[(b, g * per_group + free[0], *free[1:])]
    mean, variance = moments(read, [per_group, *spatial])

    def out(b, c, *xs):
        g = c // per_group
        return (data[(b, c, *xs)] - mean([b, g], "m")) * rsqrt(variance([b, g]) + eps) * \
            gamma[g] + beta[g]
    out = lam(["b", "c"] + [f"x{k}" for k in range(len(spatial))], out)
    if not attrs.get("output_mean_var", False):
        return out
    return (out, lambda b, g: mean([b, g], "m"), lambda b, g: sqrt(variance([b, g]) + eps))


def _l2_axes(mode, ndim):
    return {"instance": list(range(1, ndim)), "channel": [1],
            "spatial": list(range(2, ndim))}[mode]


@op("L2Normalization", examples=[
    ({}, [(2, 3, 4)]),
    ({"mode": "instance"}, [(3, 5)]),
    ({"mode": "channel", "eps": 1e-4}, [(2, 3, 2, 2)]),
    ({"mode": "spatial"}, [(2, 3, 2, 3)]),
    ({"mode": "spatial"}, [(2, 2, 5)]),
])
def l2_normalization(attrs, data):
    """x / sqrt(sum of x^2 + eps) over every axis but the batch (instance), over the channels
    (channel) or over the spatial axes (spatial)."""
    axes = _l2_axes(attrs.get("mode", "instance"), data.ndim)
    eps = float(attrs.get("eps", 1e-10))

    def out(*i):
        def square(*r):
            index = list(i)
            for a, v in zip(axes, r):
                index[a] = v
            return data[tuple(index)] * data[tuple(index)]
        return data[i] * rsqrt(Sum(lam(len(axes), square, prefix="r")) + eps)
    return lam(data.ndim, out)


# --- SoftmaxActivation ------------------------------------------------------------------------

def softmax_over(data, axes):
    """softmax over ``axes`` jointly (one or several), shifted by their maximum."""
    def out(*i):
        def along(r):
            index = list(i)
            for a, v in zip(axes, r):
                index[a] = v
            return data[tuple(index)]
        top = Max(lam(len(axes), lambda *r: along(r), prefix="m"))
        total = Sum(lam(len(axes), lambda *r: exp(along(r) - top), prefix="s"))
        return exp(data[i] - top) / total
    return lam(data.ndim, out)


@op("SoftmaxActivation", examples=[({}, [(2, 5)]), ({"mode": "instance"}, [(2, 3, 4)]),
                                   ({"mode": "channel"}, [(2, 3, 4)]),
                                   ({"mode": "channel"}, [(2, 3, 2, 2)])])
def softmax_activation(attrs, data):
    """softmax over the channels at each position (channel), or (instance) over the last axis:
    MXNet's kernel views the input as 2-D with its last axis as the columns, so on inputs of
    rank > 2 "instance" is *not* over every non-batch axis as its documentation says. MXNet
    computes it in float32 only."""
    if attrs.get("mode", "instance") == "channel":
        return softmax_over(data, [1])
    return softmax_over(data, [data.ndim - 1])


# --- Correlation ------------------------------------------------------------------------------

def _correlation_geometry(attrs):
    kernel = int(attrs.get("kernel_size", 1))
    displacement = int(attrs.get("max_displacement", 1))
    stride1, stride2 = int(attrs.get("stride1", 1)), int(attrs.get("stride2", 1))
    return kernel, displacement, stride1, stride2, int(attrs.get("pad_size", 0))


def _correlation_shard(attrs, ctx):
    """Batch splits, and partial sums over data channels (MXNet divides by the channels it
    sees, so a share's partial is rescaled by its fraction of them). A spatial or displacement
    share would need another padding for each input."""
    out = ctx.outputs[0]
    if any(out[a] != (0, ctx.output_shapes[0][a] - 1) for a in (1, 2, 3)):
        return None
    if ctx.partial is None:
        return Shard()
    return Shard(scale=ctx.size(ctx.windows[0])[1] / ctx.input_shapes[0][1])


@op("Correlation", shard=_correlation_shard, examples=[
    ({}, [(2, 3, 5, 5), (2, 3, 5, 5)]),
    ({"kernel_size": 3, "max_displacement": 2, "pad_size": 2}, [(1, 2, 5, 6), (1, 2, 5, 6)]),
    ({"kernel_size": 1, "max_displacement": 2, "stride1": 2, "stride2": 2, "pad_size": 1},
     [(1, 2, 7, 6), (1, 2, 7, 6)]),
    ({"is_multiply": False, "max_displacement": 1, "pad_size": 1}, [(2, 2, 4, 4), (2, 2, 4, 4)]),
])
def correlation(attrs, data1, data2):
    """out[b, t, y, x] = mean over channels and a kernel window of data1 at (y, x) times (or
    minus, in absolute value) data2 displaced by t's offset: rows of displacement
    (t // width - radius) * stride2, columns (t % width - radius) * stride2, width the
    displacement grid's (2 * (max_displacement // stride2) + 1); coordinates are in the
    inputs padded by pad_size with zeros, windows start at max_displacement."""
    kernel, displacement, stride1, stride2, pad = _correlation_geometry(attrs)
    radius = displacement // stride2
    grid = 2 * radius + 1
    count = kernel * kernel * data1.shape[1]
    first, second = data1.padded(0.0), data2.padded(0.0)
    multiply = attrs.get("is_multiply", True)

    def out(b, t, y, x):
        y1, x1 = y * stride1 + displacement - pad, x * stride1 + displacement - pad
        y2 = y1 + (t // grid) * stride2 - radius * stride2
        x2 = x1 + (t % grid) * stride2 - radius * stride2

        def term(ch, h, w):
            a, z = first[b, ch, y1 + h, x1 + w], second[b, ch, y2 + h, x2 + w]
            return a * z if multiply else absolute(a - z)
        return Sum(term, data1.shape[1], kernel, kernel) / count
    return out


# --- identity with a sparseness penalty -------------------------------------------------------

@op("IdentityAttachKLSparseReg", examples=[({}, [(4, 3), (3,)]),
                                           ({"penalty": 0.01, "momentum": 0.5}, [(2, 5), (5,)])])
def identity_attach_kl_sparse_reg(attrs, data, moving_avg):
    """The identity forward, on (batch, features) (MXNet's moving average has one entry per
    ``shape[1]`` and its gradient flattens all but the last axis: only 2-D inputs agree).
    The gradient adds a penalty of the moving average, an auxiliary state updated from the
    feature's mean over the batch, so every sample's gradient reads the whole batch: declared
    as a read (of value 0) of the feature's column, which keeps the batch from being split;
    the features split."""
    if data.ndim != 2:
        raise TDLError("IdentityAttachKLSparseReg is described for 2-D (batch, features) input")

    def out(b, f):
        batch = Sum(lambda r: depends(0.0, data[r, f]))
        return depends(data[b, f], moving_avg[f]) + batch
    return out


# --- legacy (v1) operators --------------------------------------------------------------------

op("Convolution_v1", shard=_conv_shard, examples=[
    ({"kernel": (3, 3), "num_filter": 4, "pad": (1, 1)}, [(2, 3, 5, 5), (4, 3, 3, 3), (4,)]),
    ({"kernel": (3, 3), "num_filter": 4, "stride": (2, 2), "no_bias": True},
     [(2, 3, 7, 7), (4, 3, 3, 3)]),
    ({"kernel": (3, 3), "num_filter": 6, "num_group": 3, "pad": (1, 1), "dilate": (2, 2)},
     [(1, 6, 6, 6), (6, 2, 3, 3), (6,)]),
])(convolution)


@op("Pooling_v1", shard=_pool_v1_shard, examples=[
    ({"kernel": (2, 2), "stride": (2, 2), "pool_type": "max"}, [(2, 3, 4, 4)]),
    ({"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "pool_type": "avg"}, [(1, 2, 5, 5)]),
    ({"kernel": (3, 3), "stride": (3, 3), "pad": (2, 2), "pool_type": "max"}, [(1, 3, 4, 4)]),
    ({"kernel": (2, 2), "stride": (2, 2), "pool_type": "max", "pooling_convention": "full"},
     [(1, 4, 5, 5)]),
    ({"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1), "pool_type": "avg",
      "pooling_convention": "full"}, [(1, 2, 6, 6)]),
    ({"kernel": (2, 2), "pool_type": "sum"}, [(1, 2, 3, 3)]),
    ({"global_pool": True, "kernel": (1, 1), "pool_type": "avg"}, [(2, 3, 3, 4)]),
])
def pooling_v1(attrs, data):
    """Pooling's legacy kernel (2-D only): zeros pad every kind, max included, and average
    divides by the kernel's area, pad or not."""
    return describe_pooling(attrs, data, legacy=True)


def batch_norm_v1(attrs, data, gamma, beta, moving_mean, moving_var):
    """BatchNorm's legacy kernel: its third output is the variance, not its inverse root."""
    return describe_batch_norm(attrs, data, gamma, beta, moving_mean, moving_var, "var")


op("BatchNorm_v1", examples=[
    ({"fix_gamma": False}, [(4, 3, 2, 2), (3,), (3,), (3,), (3,)]),
    ({}, [(4, 3, 2, 2), (3,), (3,), (3,), (3,)]),
    ({"fix_gamma": False, "use_global_stats": True}, [(2, 3, 2, 2), (3,), (3,), (3,), (3,)]),
    ({"fix_gamma": False, "output_mean_var": True}, [(4, 3, 2, 2), (3,), (3,), (3,), (3,)]),
])(batch_norm_v1)
