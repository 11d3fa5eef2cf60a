"""Train a Wide ResNet, partitioned over several devices by tofu_mx, on scikit-learn's digits.

The network is a Gluon HybridBlock written here, unit for unit the pre-activation bottleneck
WResNet of tofu_mx.models.wresnet (every filter count x --widen), with a Dense head: Gluon's
SoftmaxCrossEntropyLoss is the loss. Every operator of it partitions (no fallback).
The digits (8x8 grey) are upsampled to --image-size and repeated over 3 channels.

Small, on CPU devices (the defaults: 5 steps in a few seconds on 2 cores):
    python examples/train_wresnet.py --devices cpu:2 --compare --dtype float64
The paper's WResNet-152-10 over 8 GPUs:
    python examples/train_wresnet.py --devices gpu:8 --depth 152 --widen 10 \\
        --image-size 224 --batch-size 32 --steps-total 100 --init shards
"""
from __future__ import annotations

import sys

import common
import data
import mxnet as mx
from mxnet import gluon
from mxnet.gluon import nn

from tofu_mx.models.wresnet import BASE_FILTERS, UNITS_BY_DEPTH


def batch_norm(**kwargs) -> nn.BatchNorm:
    return nn.BatchNorm(epsilon=2e-5, momentum=0.9, **kwargs)


def conv(channels: int, kernel: int, stride: int) -> nn.Conv2D:
    return nn.Conv2D(channels, kernel, strides=stride, padding=kernel // 2, use_bias=False)


class Bottleneck(gluon.HybridBlock):
    """BN-ReLU-conv1x1 (channels/4), BN-ReLU-conv3x3 (stride), BN-ReLU-conv1x1 (channels),
    plus the input, or a strided 1x1 convolution of the first activation where the shape
    changes."""

    def __init__(self, channels: int, stride: int, dim_match: bool, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.bn1, self.conv1 = batch_norm(), conv(channels // 4, 1, 1)
            self.bn2, self.conv2 = batch_norm(), conv(channels // 4, 3, stride)
            self.bn3, self.conv3 = batch_norm(), conv(channels, 1, 1)
            self.shortcut = None if dim_match else conv(channels, 1, stride)

    def hybrid_forward(self, F, x):
        act1 = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(act1))))
        out = self.conv3(F.relu(self.bn3(out)))
        return out + (x if self.shortcut is None else self.shortcut(act1))


class WideResNet(gluon.HybridBlock):
    def __init__(self, depth: int, widen: int, classes: int, **kwargs):
        super().__init__(**kwargs)
        filters = [f * widen for f in BASE_FILTERS]
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(batch_norm(scale=False), conv(filters[0], 7, 2),
                              batch_norm(), nn.Activation("relu"),
                              nn.MaxPool2D(3, 2, 1))
            for stage, units in enumerate(UNITS_BY_DEPTH[depth]):
                for unit in range(units):
                    stride = 2 if stage > 0 and unit == 0 else 1
                    self.features.add(Bottleneck(filters[stage + 1], stride, unit > 0))
            self.features.add(batch_norm(), nn.Activation("relu"), nn.GlobalAvgPool2D())
            self.output = nn.Dense(classes)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def build_task(args) -> common.Task:
    digits = data.Digits(args.batch_size, args.image_size, args.seed, args.dtype)
    return common.Task(
        name="train_wresnet", title=f"WResNet-{args.depth}-{args.widen} ({args.image_size}px)",
        make_net=lambda: WideResNet(args.depth, args.widen, digits.classes, prefix="wresnet_"),
        init=mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(), data=digits,
        config=dict(depth=args.depth, widen=args.widen, image_size=args.image_size))


def main(argv=None) -> int:
    p = common.parser(__doc__, batch_size=8, lr=0.01)
    p.add_argument("--depth", type=int, choices=sorted(UNITS_BY_DEPTH), default=14)
    p.add_argument("--widen", type=common.positive_int, default=1)
    p.add_argument("--image-size", type=common.positive_int, default=32,
                   help="side of the square input")
    return common.run(p, build_task, argv)


if __name__ == "__main__":
    sys.exit(main())
