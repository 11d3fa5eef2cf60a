"""Loss heads. Their forward pass ignores the label; the gradient reads it, which the
descriptions declare with ``depends`` so the label gets a region like the data's."""
import math

from tofu_mx.tdl import (Max, Shard, Sum, depends, exp, index, lam, log, maximum, op,
                         sigmoid)


def _prod(shape) -> int:
    return int(math.prod(shape))


def _rescaled(divisor):
    """A shard hook for a loss head whose gradient MXNet divides by ``divisor(attrs, data
    shape, label shape)``, a count of the tensors the kernel sees (None: a count of the values
    themselves, e.g. the labels that are not ignored). A share sees its own boxes, so its
    ``grad_scale`` is multiplied by share count / whole count: every share's gradient is the
    whole operator's. A data-dependent count runs whole only."""
    def shard(attrs, ctx):
        def shape(j, whole):
            box = ctx.inputs[j] if j < len(ctx.inputs) else None
            return ctx.size(box) if box is not None else tuple(whole)
        whole_shapes = ctx.input_shapes
        local_shapes = tuple(shape(j, s) for j, s in enumerate(whole_shapes))
        if local_shapes == tuple(map(tuple, whole_shapes)):
            return Shard()
        whole, local = divisor(attrs, *whole_shapes), divisor(attrs, *local_shapes)
        if whole is None or local is None:
            return None
        if whole == local:
            return Shard()
        return Shard({"grad_scale": float(attrs.get("grad_scale", 1.0)) * local / whole})
    return shard


def _softmax_output_divisor(attrs, data, label=None):
    """What SoftmaxOutput's gradient is divided by: nothing for a probability label; with
    ``multi_output`` the positions per sample (``prod(data[2:])``, times the batch with
    ``normalization='batch'``); else the labels' count with ``'batch'``. ``'valid'`` counts
    the labels not ignored: data-dependent."""
    norm = attrs.get("normalization", "null")
    if label is not None and tuple(label) == tuple(data):
        return 1
    if norm == "valid":
        return None
    if attrs.get("multi_output", False):
        return _prod(data[2:]) * (data[0] if norm == "batch" else 1)
    return _prod(label) if norm == "batch" and label is not None else 1


def _make_loss_divisor(attrs, data):
    """MakeLoss divides its gradient by the batch with ``normalization='batch'``, by the count
    of values above ``valid_thresh`` with ``'valid'`` (data-dependent)."""
    norm = attrs.get("normalization", "null")
    return None if norm == "valid" else data[0] if norm == "batch" else 1


def _regression_divisor(attrs, data, label):
    """The regression outputs divide their gradient by the label's values per sample,
    ``label.size / label.shape[0]`` (so a label split on a non-batch axis changes it)."""
    return _prod(label) // label[0] if label and label[0] else 1


def _classes(attrs, shapes):
    """Class labels index the class axis: 1 with multi_output, else the last."""
    return 0, shapes[0][1 if attrs.get("multi_output", False) else -1]


@op("SoftmaxOutput", shard=_rescaled(_softmax_output_divisor), labels=(1,), loss=True,
    index_inputs={1: _classes}, examples=[({}, [(3, 5), (3,)]), ({"multi_output": True}, [(2, 3, 4), (2, 4)]),
                               ({"preserve_shape": True}, [(2, 3, 4), (2, 3)]),
                               ({}, [(2, 3, 2), (2, 3)]), ({"grad_scale": 2.0}, [(4, 3), (4,)]),
                               ({"multi_output": True}, [(2, 3, 4, 5), (2, 4, 5)]),
                               ({"multi_output": True, "normalization": "batch"},
                                [(3, 3, 5), (3, 5)]),
                               ({"normalization": "batch"}, [(4, 3), (4,)]),
                               ({"preserve_shape": True, "normalization": "batch"},
                                [(2, 3, 4), (2, 3)]),
                               ({"normalization": "valid"}, [(4, 3), (4,)]),
                               ({}, [(3, 4), (3, 4)])])
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
    op(name, labels=(1,), loss=True, shard=_rescaled(_regression_divisor),
       examples=[({}, [(3, 4), (3, 4)]), ({"grad_scale": 0.5}, [(2, 3), (2, 3)]),
                 ({}, [(4, 5), (4, 5)]), ({}, [(2, 3, 4), (2, 3, 4)])])(
        lambda attrs, data, label: lam(data.ndim, lambda *i: depends(f(data[i]), label[i])))


_regression("LinearRegressionOutput", lambda x: x)
_regression("MAERegressionOutput", lambda x: x)
_regression("LogisticRegressionOutput", sigmoid)


# MakeLoss: its forward is the identity; its gradient (grad_scale, normalised like
# SoftmaxOutput's) ignores the head's: a loss head.
op("MakeLoss", shard=_rescaled(_make_loss_divisor), loss=True,
   examples=[({}, [(2, 3)]), ({"grad_scale": 2.0}, [(2, 3)]),
             ({"normalization": "batch"}, [(4, 3)]), ({"normalization": "valid"}, [(4, 3)])])(
    lambda attrs, data: lam(data.ndim, lambda *i: data[i]))


# make_loss (lowercase): the identity, whose gradient is ones_like(data) whatever the head's
# gradient (no grad_scale, no normalisation, unlike MakeLoss): a loss head.
op("make_loss", loss=True, examples=[({}, [(2, 3)]), ({}, [(4,)])])(
    lambda attrs, data: lam(data.ndim, lambda *i: data[i]))


def _last_axis_classes(attrs, shapes):
    return 0, shapes[0][-1]


def _whole_classes(attrs, ctx):
    """The SVM gradient compares each class's position with the label: a share must hold
    every class (the label is not offset into a slice of them)."""
    data = ctx.inputs[0]
    if data is not None and ctx.size(data)[-1] != ctx.input_shapes[0][-1]:
        return None
    return Shard()


@op("SVMOutput", shard=_whole_classes, labels=(1,), loss=True,
    index_inputs={1: _last_axis_classes},
    examples=[({}, [(3, 5), (3,)]), ({"margin": 0.5, "use_linear": True}, [(4, 3), (4,)]),
              ({"regularization_coefficient": 2.0}, [(2, 3, 4), (2, 3)])])
def svm_output(attrs, data, label):
    """The identity forward; the (L1 or L2) hinge gradient, computed from the label alone
    (the head's gradient is ignored), reads the label of each row: classes on the last axis,
    the label shaped like the other axes."""
    lead = data.ndim - 1
    return lam(data.ndim, lambda *i: depends(data[i], label[i[:lead]]))


@op("softmax_cross_entropy", labels=(1,), index_inputs={1: lambda a, s: (0, s[0][1])},
    examples=[({}, [(3, 5), (3,)]), ({}, [(4, 2), (4,)]), ({}, [(1, 6), (1,)])])
def softmax_cross_entropy(attrs, data, label):
    """out[0] = Sum_b -log(max(softmax(data[b])[label[b]], 1e-8)): a sum over the batch, so
    the batch partitions and reduces. Not a loss head: MXNet's gradient multiplies
    (softmax - onehot) by the head's gradient."""
    def loss(b):
        top = Max(lambda m: data[b, m])
        total = Sum(lambda c: exp(data[b, c] - top))
        picked = exp(data[b, index(label[b])] - top) / total
        return -log(maximum(picked, 1e-8))
    return lambda o: Sum(lambda b: loss(b))


# CTCLoss is not described: its loss is a log-sum over every alignment of the label with
# the time steps, computed by the forward-backward recursion over time, which no finite
# TDL sum of products expresses (TDL has no loops or recursion).
