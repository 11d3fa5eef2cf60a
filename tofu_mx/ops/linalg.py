"""Linear algebra: FullyConnected, dot, batch_dot."""
import numpy as np

from tofu_mx.tdl import Shard, Sum, lam, op


def _fc_shard(attrs, ctx):
    changes = {"num_hidden": ctx.size(ctx.outputs[0])[-1]}
    if len(ctx.inputs) > 2 and ctx.inputs[2] is None:
        changes["no_bias"] = True
    return Shard(changes)


@op("FullyConnected", shard=_fc_shard, examples=[
    ({"num_hidden": 4}, [(2, 3), (4, 3), (4,)]),
    ({"num_hidden": 4, "no_bias": True}, [(2, 3), (4, 3)]),
    ({"num_hidden": 6, "flatten": False}, [(2, 3, 5), (6, 5), (6,)]),
    ({"num_hidden": 5}, [(2, 3, 2, 2), (5, 12), (5,)]),
])
def fully_connected(attrs, data, weight, bias=None):
    def plus_bias(value, o):
        return value if bias is None or attrs.get("no_bias", False) else value + bias[o]

    if not attrs.get("flatten", True) or data.ndim == 2:
        # y[..., o] = sum_i x[..., i] * w[o, i]
        lead = data.ndim - 1
        return lam(data.ndim, lambda *ix: plus_bias(
            Sum(lambda i: data[(*ix[:lead], i)] * weight[ix[lead], i]), ix[lead]))
    # flatten=True: every axis after the first is one input feature; weight's column index
    # is the row-major linear index of those axes (affine in the reduction variables).
    trailing = data.shape[1:]
    strides = [int(np.prod(trailing[k + 1:], dtype=np.int64)) for k in range(len(trailing))]

    def column(ks):
        return sum((k * s for k, s in zip(ks, strides)), 0)
    return lambda b, o: plus_bias(
        Sum(lam(len(trailing), lambda *ks: data[(b, *ks)] * weight[o, column(ks)], prefix="k")),
        o)


@op("dot", examples=[({}, [(2, 3), (3, 4)]), ({"transpose_a": True}, [(3, 2), (3, 4)]),
                     ({"transpose_b": True}, [(2, 3), (4, 3)]),
                     ({"transpose_a": True, "transpose_b": True}, [(3, 2), (4, 3)])])
def dot(attrs, lhs, rhs):
    """2-D: y[i, j] = sum_k a[i, k] * b[k, j], either side optionally transposed."""
    def a(i, k):
        return lhs[k, i] if attrs.get("transpose_a", False) else lhs[i, k]

    def b(k, j):
        return rhs[j, k] if attrs.get("transpose_b", False) else rhs[k, j]
    return lambda i, j: Sum(lambda k: a(i, k) * b(k, j))


@op("batch_dot", examples=[({}, [(2, 3, 4), (2, 4, 5)]), ({"transpose_b": True}, [(2, 3, 4), (2, 5, 4)]),
                           ({"transpose_a": True}, [(2, 4, 3), (2, 4, 5)])])
def batch_dot(attrs, lhs, rhs):
    """y[n, i, j] = sum_k a[n, i, k] * b[n, k, j], either side optionally transposed."""
    def a(n, i, k):
        return lhs[n, k, i] if attrs.get("transpose_a", False) else lhs[n, i, k]

    def b(n, k, j):
        return rhs[n, j, k] if attrs.get("transpose_b", False) else rhs[n, k, j]
    return lambda n, i, j: Sum(lambda k: a(n, i, k) * b(n, k, j))
