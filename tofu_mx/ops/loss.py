"""Loss heads. Their forward pass ignores the label; the gradient reads it, which the
descriptions declare with ``depends`` so the label gets a region like the data's."""
from tofu_mx.tdl import Max, Shard, Sum, depends, exp, lam, op, sigmoid


def _softmax_output_shard(attrs, ctx):
    """``normalization='batch'`` divides the gradient by the batch a share sees, so the share
    scales it back; ``'valid'`` counts valid labels over the whole batch: whole only."""
    norm = attrs.get("normalization", "null")
    whole = ctx.input_shapes[0][0]
    local = ctx.size(ctx.inputs[0])[0]
    if norm == "valid" and local != whole:
        return None
    if norm == "batch" and local != whole:
        return Shard({"grad_scale": float(attrs.get("grad_scale", 1.0)) * local / whole})
    return Shard()


@op("SoftmaxOutput", shard=_softmax_output_shard, examples=[({}, [(3, 5), (3,)]), ({"multi_output": True}, [(2, 3, 4), (2, 4)]),
                               ({"preserve_shape": True}, [(2, 3, 4), (2, 3)]),
                               ({}, [(2, 3, 2), (2, 3)]), ({"grad_scale": 2.0}, [(4, 3), (4,)])])
def softmax_output(attrs, data, label):
    """softmax over axis 1 (multi_output), the last axis (preserve_shape), or every axis but
    the first (the default: MXNet flattens the trailing axes into one)."""
    if attrs.get("multi_output", False):
        axes = [1]
    elif attrs.get("preserve_shape", False):
        axes = [data.ndim - 1]
    else:
        axes = list(range(1, data.ndim))
    kept = [a for a in range(data.ndim) if a not in axes]

    def out(*i):
        def along(r):
            return data[tuple(r[axes.index(a)] if a in axes else i[a] for a in range(data.ndim))]
        top = Max(lam(len(axes), lambda *r: along(r), prefix="m"))
        total = Sum(lam(len(axes), lambda *r: exp(along(r) - top), prefix="s"))
        # The label has the kept axes, or (default mode) a prefix of data's axes.
        label_index = tuple(i[a] for a in kept) if label.ndim == len(kept) else i[:label.ndim]
        return depends(exp(data[i] - top) / total, label[label_index])
    return lam(data.ndim, out)


def _regression(name, f):
    op(name, examples=[({}, [(3, 4), (3, 4)]), ({"grad_scale": 0.5}, [(2, 3), (2, 3)])])(
        lambda attrs, data, label: lam(data.ndim, lambda *i: depends(f(data[i]), label[i])))


_regression("LinearRegressionOutput", lambda x: x)
_regression("MAERegressionOutput", lambda x: x)
_regression("LogisticRegressionOutput", sigmoid)


# MakeLoss: its forward is the identity; its gradient (grad_scale, normalised like
# SoftmaxOutput's) ignores the head's, which is why it lives with the losses.
op("MakeLoss", shard=_softmax_output_shard,
   examples=[({}, [(2, 3)]), ({"grad_scale": 2.0}, [(2, 3)])])(
    lambda attrs, data: lam(data.ndim, lambda *i: data[i]))
