"""A Gluon convolutional net with BatchNorm partitioned by the plan searched with each
conversion priced (SearchOptions.conversion_bytes: its channels split throughout, every
BatchNorm running as itself) trains as plain Gluon does on one device, in float64: losses,
parameters, BatchNorm's running statistics and the optimizer's states."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

import tofu_mx.gluon as tg
from tests.tofu_mx.gluon.test_gluon import (assert_same_params, assert_same_states, devices,
                                             train_alike)
from tofu_mx.search.plan import SearchOptions

B, C, S = 8, 3, 16
LOSS = gluon.loss.SoftmaxCrossEntropyLoss()
PRICED = SearchOptions(refetch=False, conversion_bytes=250e3)


def net():
    mx.random.seed(0)
    body = gluon.nn.HybridSequential(prefix="conv_")
    with body.name_scope():
        for before, width in ((C, 16), (16, 32), (32, 32)):
            body.add(gluon.nn.Conv2D(width, 3, padding=1, use_bias=False, in_channels=before),
                     gluon.nn.BatchNorm(in_channels=width), gluon.nn.Activation("relu"))
        body.add(gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10, in_units=32))
    body.initialize(mx.init.Xavier(), ctx=mx.cpu(0))
    body.cast("float64")
    return body


def rows(step):
    rng = np.random.default_rng(step)
    return (mx.nd.array(rng.standard_normal((B, C, S, S)), dtype="float64"),
            mx.nd.array(rng.integers(0, 10, B), dtype="float64"))


@pytest.mark.parametrize("k", [2, 3])
def test_a_priced_plan_trains_as_gluon_does(k, tmp_path):
    ref, mine = net(), net()
    for p, q in zip(ref.collect_params().values(), mine.collect_params().values()):
        q.set_data(p.data())
    pnet = tg.partition(mine, devices(k), loss=LOSS, data=(B, C, S, S), label=(B,),
                        dtype="float64", options=PRICED)
    fewest = tg.partition(net(), devices(k), loss=LOSS, data=(B, C, S, S), label=(B,),
                          dtype="float64", options=SearchOptions(refetch=False))
    # another plan than the fewest-bytes one, with fewer operators on its busiest device
    assert max(pnet.partitioned.operators_per_device()) < \
        max(fewest.partitioned.operators_per_device())
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    ref_trainer = gluon.Trainer(ref.collect_params(), "sgd",
                                {"learning_rate": 0.1, "momentum": 0.9})
    train_alike(pnet, trainer, ref, ref_trainer, map(rows, range(3)), LOSS)
    assert_same_params(pnet, ref, tmp_path)     # BatchNorm's running statistics among them
    assert_same_states(trainer, ref_trainer, tmp_path, rtol=1e-7, atol=1e-12)
