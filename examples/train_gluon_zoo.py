"""Train any network of Gluon's model zoo (vision.get_model(name, classes=10)), partitioned over
several devices by tofu_mx, on scikit-learn's digits (8x8 grey, upsampled to --image-size and
repeated over 3 channels). Nothing is downloaded: the network starts from random values.

Operators without a partitioning description run whole on one device (fallbacks); the
script prints them.

Small, on CPU devices:
    python examples/train_gluon_zoo.py --model resnet18_v1 --devices cpu:2 --compare \\
        --dtype float64
At ImageNet size over 8 GPUs:
    python examples/train_gluon_zoo.py --model resnet152_v2 --devices gpu:8 \\
        --image-size 224 --batch-size 64 --steps-total 100 --init shards
"""
from __future__ import annotations

import argparse
import sys

import common
import data
import mxnet as mx
from mxnet import gluon
from mxnet.gluon.model_zoo import vision

import tofu_mx
from tofu_mx.models.zoo import zoo_name


def model_name(text: str) -> str:
    try:
        return zoo_name(text)
    except tofu_mx.TofuError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def build_task(args) -> common.Task:
    digits = data.Digits(args.batch_size, args.image_size, args.seed, args.dtype)
    return common.Task(
        name="train_gluon_zoo", title=f"{args.model} ({args.image_size}px)",
        make_net=lambda: vision.get_model(args.model, classes=digits.classes),
        init=mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(), data=digits,
        config=dict(model=args.model, image_size=args.image_size))


def main(argv=None) -> int:
    p = common.parser(__doc__, batch_size=8, lr=0.01)
    p.add_argument("--model", type=model_name, default="resnet18_v1",
                   help="a model-zoo name: " + ", ".join(tofu_mx.models.ZOO_MODELS))
    p.add_argument("--image-size", type=common.positive_int, default=32,
                   help="side of the square input; networks that end in a fixed-size pooling "
                        "need about their ImageNet size (densenet, squeezenet: 224; "
                        "inceptionv3: 299)")
    return common.run(p, build_task, argv)


if __name__ == "__main__":
    sys.exit(main())
