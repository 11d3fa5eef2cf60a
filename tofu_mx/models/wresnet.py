"""Wide ResNet with bottleneck units (pre-activation, as in MXNet's ImageNet ResNet symbols).

Every filter count, the stem's included, is multiplied by ``widen``, so parameters grow as
``widen**2``: the family Tofu partitions (WResNet-50/101/152, widen 4-10).
"""
from __future__ import annotations

import mxnet as mx

from tofu_mx.errors import InvalidArgumentError

#: Bottleneck units per stage for each supported depth (depth = 3 * sum(units) + 2).
UNITS_BY_DEPTH = {14: (1, 1, 1, 1), 26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3),
                  152: (3, 8, 36, 3)}
#: Filters of the stem and of the output of each stage, before widening.
BASE_FILTERS = (64, 256, 512, 1024, 2048)


def _bn_relu(data: mx.sym.Symbol, name: str) -> mx.sym.Symbol:
    bn = mx.sym.BatchNorm(data, fix_gamma=False, eps=2e-5, momentum=0.9, name=name + "_bn")
    return mx.sym.Activation(bn, act_type="relu", name=name + "_relu")


def _conv(data, num_filter, kernel, stride, name):
    pad = (kernel // 2, kernel // 2)
    return mx.sym.Convolution(data, num_filter=num_filter, kernel=(kernel, kernel),
                              stride=(stride, stride), pad=pad, no_bias=True, name=name)


def _bottleneck(data, num_filter, stride, dim_match, name):
    act1 = _bn_relu(data, name + "_1")
    conv1 = _conv(act1, num_filter // 4, 1, 1, name + "_conv1")
    conv2 = _conv(_bn_relu(conv1, name + "_2"), num_filter // 4, 3, stride, name + "_conv2")
    conv3 = _conv(_bn_relu(conv2, name + "_3"), num_filter, 1, 1, name + "_conv3")
    shortcut = data if dim_match else _conv(act1, num_filter, 1, stride, name + "_sc")
    return mx.sym.elemwise_add(conv3, shortcut, name=name + "_add")


def wresnet(depth: int = 50, widen: int = 1, num_classes: int = 1000) -> mx.sym.Symbol:
    """WResNet-``depth``-``widen`` for ImageNet-style input ``data=(batch, 3, H, W)``, H, W >= 32.

    The head is ``SoftmaxOutput`` named ``softmax`` (label ``softmax_label=(batch,)``).
    Nothing is allocated: the result is a Symbol.
    """
    if depth not in UNITS_BY_DEPTH:
        raise InvalidArgumentError(
            f"wresnet depth must be one of {sorted(UNITS_BY_DEPTH)}, got {depth!r}")
    if not isinstance(widen, int) or widen < 1:
        raise InvalidArgumentError(f"wresnet widen must be a positive int, got {widen!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise InvalidArgumentError(f"num_classes must be a positive int, got {num_classes!r}")
    filters = [f * widen for f in BASE_FILTERS]
    with mx.name.NameManager():
        data = mx.sym.var("data")
        body = mx.sym.BatchNorm(data, fix_gamma=True, eps=2e-5, momentum=0.9, name="bn_data")
        body = _conv(body, filters[0], 7, 2, "conv0")
        body = _bn_relu(body, "stem")
        body = mx.sym.Pooling(body, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max",
                              name="pool0")
        for stage, units in enumerate(UNITS_BY_DEPTH[depth]):
            stride = 1 if stage == 0 else 2
            for unit in range(units):
                body = _bottleneck(body, filters[stage + 1], stride if unit == 0 else 1,
                                   dim_match=unit > 0, name=f"stage{stage + 1}_unit{unit + 1}")
        body = _bn_relu(body, "final")
        pool = mx.sym.Pooling(body, global_pool=True, kernel=(7, 7), pool_type="avg", name="pool1")
        flat = mx.sym.Flatten(pool, name="flatten")
        fc = mx.sym.FullyConnected(flat, num_hidden=num_classes, name="fc")
        return mx.sym.SoftmaxOutput(fc, name="softmax")
