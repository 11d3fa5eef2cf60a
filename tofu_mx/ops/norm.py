"""Normalisation: BatchNorm (training mode: batch statistics) and LayerNorm.

BatchNorm as one operator cannot be split on the batch axis: its output at one sample
depends on every sample through the batch mean and variance, and the interval analysis sees
exactly that (a batch split needs the whole input). Per-device statistics would compute a
different function. So, with more than one device, BatchNorm is *lowered*
(:func:`lower_batch_norm`) into the sums its statistics are made of, which split on the
batch: each device sums its slice, and only the per-channel sums cross devices. Splitting
the channel axis is exact and cheap either way. LayerNorm is not split on its normalised axis.
"""
import math

import numpy as np

from tofu_mx.tdl import Sum, depends, lam, op, rsqrt

#: BatchNorm's default eps: MXNet's ``1e-3f``, a float32 constant widened to double
BATCH_NORM_EPS = float(np.float32(1e-3))


def lower_batch_norm(emit, attrs, shapes, data, gamma, beta, moving_mean, moving_var):
    """Training-mode BatchNorm from operators that split on the batch, exactly.

    ``mean = sum(x) / M`` and ``var = sum(d^2) / M`` over the deviations ``d = x - mean`` per
    channel (M: elements per channel) are sums the search splits on the batch (partial sums,
    then added across devices), computed in two passes as MXNet's kernel does (``sum(x^2) / M
    - mean^2`` loses ``(mean/std)^2`` times the dtype's precision: 0.8 % in float64 at mean 1e6,
    std 1); ``y = d * a + beta`` with ``a = gamma / sqrt(var + eps)`` keeps only ``d`` for
    the backward pass, as BatchNorm keeps only ``x``.

    The moving statistics are updated, and inference uses them, through a real BatchNorm
    on a *pseudo-batch* of two rows ``mean -/+ sqrt(var)`` per channel: its batch mean and
    (biased) variance are the whole batch's, so it updates ``moving_mean``/``moving_var``
    exactly as BatchNorm on the whole batch does (in its backward pass, which therefore
    must stay on a gradient path), and its outputs are MXNet's own switch between the batch
    statistics (training) and the moving ones (inference):

    - the mean of its two output rows is ``shift = beta + (mean - m) * s * gamma``, with
      ``m`` and ``s`` the mean and inverse std it used: ``beta`` in training (``m`` is the
      pseudo-batch's mean, ``mean``: rounding), ``beta + (mean - moving_mean) * s * gamma``
      in inference, so ``y = d * scale + shift`` is BatchNorm's output either way. Its
      gradient is ``beta``'s alone: the rows' gradients are equal and their normalised
      values opposite, so BatchNorm hands ``mean``, ``var`` and ``gamma`` none;
    - its output 2 (``s``) with ``inv_std``'s gradient makes ``scale = gamma * s``:
      ``BlockGrad(s) + (t - BlockGrad(t))`` takes the value of ``s`` and the gradient of
      ``t``, so gradients flow through the batch statistics as in BatchNorm's.

    Not lowered (None): global statistics (a per-sample operator, split on the batch
    already) and a channel axis on the batch.
    """
    ndim = len(shapes[0])
    axis = int(attrs.get("axis", 1)) % ndim
    if attrs.get("use_global_stats", False) or axis == 0:
        return None
    fix_gamma = bool(attrs.get("fix_gamma", True))
    eps = float(attrs.get("eps", BATCH_NORM_EPS))
    reduced = tuple(a for a in range(ndim) if a != axis)
    count = math.prod(shapes[0][a] for a in reduced)
    broadcast = tuple(-1 if a == axis else 1 for a in range(ndim))

    def value_of(shown, grad, name):
        """``shown``'s value with ``grad``'s gradient."""
        frozen = emit("BlockGrad", grad, name=f"{name}_const")
        return emit("elemwise_add", shown,
                    emit("elemwise_sub", grad, frozen, name=f"{name}_delta"),
                    name=f"{name}_used")
    # channels first with spatial axes (NCW, NCHW, NCDHW): the output as a depthwise 1x1
    # convolution, and the sums over the spatial axes first. MXNet's CPU gradient of a
    # broadcast operator computes even the full-size operand's through its generic reduction
    # (about 25 times the forward); its reduction over the last axes is about twice as fast
    # as over (0, 2, 3) (bench/results/partition.md). (Global sum-pooling sums faster still,
    # but its gradient reads its input, which would then be kept for the backward pass.)
    spatial = axis == 1 and ndim in (3, 4, 5)
    channels, kernel = shapes[0][axis], (1,) * (ndim - 2)

    def channel_sum(x, name):
        if not spatial:
            return emit("sum", x, name=name, axis=reduced)
        return emit("sum", emit("sum", x, name=f"{name}_spatial", axis=tuple(range(2, ndim))),
                    name=name, axis=0)
    mean = emit("_div_scalar", channel_sum(data, "sum"), name="mean", scalar=count)
    deviation = emit("broadcast_sub", data, emit("reshape", mean, name="mean_b",
                                                 shape=broadcast), name="deviation")
    var = emit("_div_scalar", channel_sum(emit("square", deviation, name="square"), "sum_sq"),
               name="var", scalar=count)
    inv_std = emit("rsqrt", emit("_plus_scalar", var, name="var_eps", scalar=eps),
                   name="inv_std")
    # the pseudo-batch's spread carries no gradient (sqrt'(0) would make a NaN of a zero);
    # a sum of squares is never negative
    spread = emit("sqrt", emit("BlockGrad", var, name="var_const"), name="std")
    pseudo = emit("stack", emit("elemwise_sub", mean, spread, name="low"),
                  emit("elemwise_add", mean, spread, name="high"), name="pseudo_batch",
                  axis=0, num_args=2)
    stats = emit("BatchNorm", pseudo, gamma, beta, moving_mean, moving_var, name="stats",
                 **{k: v for k, v in attrs.items() if k in ("eps", "momentum")},
                 fix_gamma=fix_gamma, axis=1, output_mean_var=True, cudnn_off=True,
                 use_global_stats=False)
    shift = emit("mean", stats[0], name="shift", axis=0)
    used_inv_std = value_of(emit("BlockGrad", stats[2], name="stats_inv_std"), inv_std,
                            "inv_std")
    scale = used_inv_std if fix_gamma else emit("elemwise_mul", gamma, used_inv_std,
                                                 name="scale")
    if spatial:     # d * scale + shift, one channel per group
        out = emit("Convolution", deviation,
                   emit("reshape", scale, name="scale_w", shape=(-1,) + (1,) * (ndim - 1)),
                   shift, name="out", kernel=kernel, num_filter=channels, num_group=channels)
    else:
        out = emit("broadcast_add",
                   emit("broadcast_mul", deviation,
                        emit("reshape", scale, name="scale_b", shape=broadcast), name="scaled"),
                   emit("reshape", shift, name="shift_b", shape=broadcast), name="out")
    return out, emit("BlockGrad", stats[1], name="out_mean"), \
        emit("BlockGrad", stats[2], name="out_inv_std")


def moments(read, extents):
    """Statistics over a block of ``extents`` (the reduced coordinates): ``read(kept, free)``
    is the element at kept coordinates ``kept`` and reduced coordinates ``free``. Returns
    ``mean(kept, prefix)`` and ``variance(kept)`` (biased), functions of the kept coordinates;
    reductions are named ``{prefix}0..`` (mean) and ``s0..`` (variance), extents given, so
    a reduced coordinate may be part of a larger index (GroupNorm's channel in its group)."""
    count = math.prod(extents)

    def mean(kept, prefix):
        return Sum(lam(len(extents), lambda *free: read(kept, free), prefix=prefix),
                   *extents) / count

    def variance(kept):
        m = mean(kept, "r")
        return Sum(lam(len(extents), lambda *free: (read(kept, free) - m) * (read(kept, free) - m),
                       prefix="s"), *extents) / count
    return mean, variance


def _normalise(data, axes_kept, eps):
    """mean, inverse standard deviation and (biased) variance over every axis but
    ``axes_kept`` (as functions of the kept coordinates), using reduction variables named
    r0.. and s0.."""
    reduced = [a for a in range(data.ndim) if a not in axes_kept]

    def at(kept, free):
        index = [None] * data.ndim
        for a, v in zip(axes_kept, kept):
            index[a] = v
        for a, v in zip(reduced, free):
            index[a] = v
        return data[tuple(index)]

    mean, variance = moments(at, [data.shape[a] for a in reduced])
    return mean, lambda kept: rsqrt(variance(kept) + eps), variance


def describe_batch_norm(attrs, data, gamma, beta, moving_mean, moving_var, third: str):
    """BatchNorm's outputs: the normalised data, the mean used, and (``third``) the inverse
    standard deviation (BatchNorm) or the variance (BatchNorm_v1) used."""
    axis = int(attrs.get("axis", 1)) % data.ndim
    eps = float(attrs.get("eps", BATCH_NORM_EPS))
    mean, inv_std, variance = _normalise(data, [axis], eps)
    global_stats = attrs.get("use_global_stats", False)

    def out(*i):
        c = i[axis]
        # With fix_gamma MXNet ignores gamma's values, but still takes it (shaped like beta).
        scale = depends(1.0, gamma[c]) if attrs.get("fix_gamma", True) else gamma[c]
        if global_stats:
            normed = (data[i] - moving_mean[c]) * rsqrt(moving_var[c] + eps)
        else:
            # The moving statistics are updated in place from the batch statistics.
            normed = depends((data[i] - mean([c], "m")) * inv_std([c]),
                             moving_mean[c], moving_var[c])
        return normed * scale + beta[c]

    # outputs 1 and 2 (read with output_mean_var): the statistics used
    def used_mean(c):
        return moving_mean[c] if global_stats else mean([c], "m")

    def used_inv_std(c):
        return rsqrt(moving_var[c] + eps) if global_stats else inv_std([c])

    def used_var(c):
        return moving_var[c] if global_stats else variance([c])
    channel = [f"i{axis}"]
    return lam(data.ndim, out), lam(channel, used_mean), \
        lam(channel, used_inv_std if third == "inv_std" else used_var)


@op("BatchNorm", examples=[
    ({"fix_gamma": False}, [(4, 3, 2, 2), (3,), (3,), (3,), (3,)]),
    ({"fix_gamma": True, "eps": 2e-5}, [(4, 3, 2, 2), (3,), (3,), (3,), (3,)]),
    ({"fix_gamma": False, "axis": 1}, [(5, 2), (2,), (2,), (2,), (2,)]),
    ({"fix_gamma": False, "axis": -1}, [(2, 3, 4), (4,), (4,), (4,), (4,)]),
    ({"fix_gamma": False, "use_global_stats": True}, [(2, 3, 2, 2), (3,), (3,), (3,), (3,)]),
    ({"fix_gamma": False, "output_mean_var": True}, [(4, 3, 2, 2), (3,), (3,), (3,), (3,)]),
    ({"use_global_stats": True, "output_mean_var": True}, [(2, 3, 2), (3,), (3,), (3,), (3,)]),
], rtol=1e-3, atol=1e-4, lowering=lower_batch_norm)
def batch_norm(attrs, data, gamma, beta, moving_mean, moving_var):
    return describe_batch_norm(attrs, data, gamma, beta, moving_mean, moving_var, "inv_std")


@op("LayerNorm", examples=[({}, [(2, 3, 4), (4,), (4,)]), ({"axis": 1}, [(2, 3, 4), (3,), (3,)]),
                           ({"eps": 1e-3}, [(3, 5), (5,), (5,)])], rtol=1e-3, atol=1e-4)
def layer_norm(attrs, data, gamma, beta):
    axis = int(attrs.get("axis", -1)) % data.ndim
    eps = float(attrs.get("eps", 1e-5))
    kept = [a for a in range(data.ndim) if a != axis]
    mean, inv_std, _ = _normalise(data, kept, eps)

    def out(*i):
        k = [i[a] for a in kept]
        return (data[i] - mean(k, "m")) * inv_std(k) * gamma[i[axis]] + beta[i[axis]]
    return lam(data.ndim, out)
