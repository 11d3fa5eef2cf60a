"""Normalisation: BatchNorm (training mode: batch statistics) and LayerNorm.

BatchNorm split on the batch axis is *not* offered as a cheap strategy: its output at one
sample depends on every sample through the batch mean and variance, and the interval analysis
sees exactly that (a batch split needs the whole input). No BatchNorm computes such a share, so
the search does not offer it (:mod:`tofu_mx.tdl.shares`). Per-device statistics would compute a
different function, so synchronised statistics are left to a later strategy. Splitting the
channel axis is exact and cheap. LayerNorm, likewise, is not split on its normalised axis.
"""
import math

from tofu_mx.tdl import Sum, depends, lam, op, rsqrt


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
    """mean and inverse standard deviation over every axis but ``axes_kept`` (as functions of
    the kept coordinates), using reduction variables named r0.. and s0.."""
    reduced = [a for a in range(data.ndim) if a not in axes_kept]

    def at(kept, free):
        index = [None] * data.ndim
        for a, v in zip(axes_kept, kept):
            index[a] = v
        for a, v in zip(reduced, free):
            index[a] = v
        return data[tuple(index)]

    mean, variance = moments(at, [data.shape[a] for a in reduced])
    return mean, lambda kept: rsqrt(variance(kept) + eps)


@op("BatchNorm", examples=[
    ({"fix_gamma": False}, [(4, 3, 2, 2), (3,), (3,), (3,), (3,)]),
    ({"fix_gamma": True, "eps": 2e-5}, [(4, 3, 2, 2), (3,), (3,), (3,), (3,)]),
    ({"fix_gamma": False, "axis": 1}, [(5, 2), (2,), (2,), (2,), (2,)]),
    ({"fix_gamma": False, "axis": -1}, [(2, 3, 4), (4,), (4,), (4,), (4,)]),
    ({"fix_gamma": False, "use_global_stats": True}, [(2, 3, 2, 2), (3,), (3,), (3,), (3,)]),
], rtol=1e-3, atol=1e-4)
def batch_norm(attrs, data, gamma, beta, moving_mean, moving_var):
    axis = int(attrs.get("axis", 1)) % data.ndim
    eps = float(attrs.get("eps", 1e-3))
    mean, inv_std = _normalise(data, [axis], eps)

    def out(*i):
        c = i[axis]
        # With fix_gamma MXNet ignores gamma's values, but still takes it (shaped like beta).
        scale = depends(1.0, gamma[c]) if attrs.get("fix_gamma", True) else gamma[c]
        if attrs.get("use_global_stats", False):
            normed = (data[i] - moving_mean[c]) * rsqrt(moving_var[c] + eps)
        else:
            # The moving statistics are updated in place from the batch statistics.
            normed = depends((data[i] - mean([c], "m")) * inv_std([c]),
                             moving_mean[c], moving_var[c])
        return normed * scale + beta[c]
    return lam(data.ndim, out)


@op("LayerNorm", examples=[({}, [(2, 3, 4), (4,), (4,)]), ({"axis": 1}, [(2, 3, 4), (3,), (3,)]),
                           ({"eps": 1e-3}, [(3, 5), (5,), (5,)])], rtol=1e-3, atol=1e-4)
def layer_norm(attrs, data, gamma, beta):
    axis = int(attrs.get("axis", -1)) % data.ndim
    eps = float(attrs.get("eps", 1e-5))
    kept = [a for a in range(data.ndim) if a != axis]
    mean, inv_std = _normalise(data, kept, eps)

    def out(*i):
        k = [i[a] for a in kept]
        return (data[i] - mean(k, "m")) * inv_std(k) * gamma[i[axis]] + beta[i[axis]]
    return lam(data.ndim, out)
