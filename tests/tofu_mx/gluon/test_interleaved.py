"""A Gluon LSTM (gluon.rnn.LSTMCell unrolled) partitioned with its gates interleaved
(nnvm_passes.interleave: the weights laid out otherwise than the block's) trains as plain
Gluon does on one device, in float64: losses, parameters, optimizer states; initialised by
the partition (LSTMBias writes the forget gate's part of the bias), saved and loaded at
another device count."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

import tofu_mx.gluon as tg
from tests.tofu_mx.gluon.test_gluon import (assert_same_params, assert_same_states, devices,
                                             train_alike)

B, T, H, IN = 6, 3, 8, 5
LOSS = gluon.loss.L2Loss()


class Lstm(gluon.HybridBlock):
    def __init__(self, dtype="float64"):
        super().__init__(prefix="lstm_")
        self.dtype = dtype
        with self.name_scope():
            self.cell = gluon.rnn.LSTMCell(H, input_size=IN,
                                           i2h_bias_initializer=mx.init.LSTMBias(1.0))
            self.out = gluon.nn.Dense(2, in_units=H)

    def hybrid_forward(self, F, x):
        begin = self.cell.begin_state(batch_size=B, func=F.zeros, dtype=self.dtype)
        out, _ = self.cell.unroll(T, x, begin_state=begin, layout="NTC", merge_outputs=False)
        return self.out(out[-1])


def lstm(initialize=True):
    mx.random.seed(0)
    net = Lstm("float64" if initialize else "float32")
    if initialize:
        net.initialize(mx.init.Xavier(), ctx=mx.cpu(0))
        net.cast("float64")
    return net


def rows(step):
    rng = np.random.default_rng(step)
    return (mx.nd.array(rng.standard_normal((B, T, IN)), dtype="float64"),
            mx.nd.array(rng.standard_normal((B, 2)), dtype="float64"))


def twins():
    ref, net = lstm(), lstm()
    for p, q in zip(ref.collect_params().values(), net.collect_params().values()):
        q.set_data(p.data())
    return ref, net


@pytest.mark.parametrize("k", [2, 4])
def test_an_interleaved_lstm_trains_as_gluon_does(k, tmp_path):
    ref, net = twins()
    pnet = tg.partition(net, devices(k), loss=LOSS, data=(B, T, IN), label=(B, 2),
                        dtype="float64")
    layouts = pnet.partitioned.graph.layouts
    assert {n.rsplit("_", 2)[-2] for n in layouts} == {"i2h", "h2h"}, dict(layouts)
    trainer = tg.Trainer(pnet, "adam", {"learning_rate": 0.01})
    ref_trainer = gluon.Trainer(ref.collect_params(), "adam", {"learning_rate": 0.01})
    train_alike(pnet, trainer, ref, ref_trainer, map(rows, range(3)), LOSS)
    assert_same_params(pnet, ref, tmp_path)
    ours, _ = assert_same_states(trainer, ref_trainer, tmp_path, rtol=1e-7, atol=1e-12)
    # saved at k devices, loaded at another count: the same parameters and states
    other = 3 if k == 4 else 4
    pnet.save_parameters(str(tmp_path / "p.params"))
    again = tg.partition(lstm(), devices(other), loss=LOSS, data=(B, T, IN), label=(B, 2),
                         dtype="float64")
    again.load_parameters(str(tmp_path / "p.params"))
    assert_same_params(again, ref, tmp_path)
    moved = tg.Trainer(again, "adam", {"learning_rate": 0.01})
    moved.load_states(ours)
    assert_same_states(moved, ref_trainer, tmp_path, rtol=1e-7, atol=1e-12)


def test_the_partition_initialises_interleaved_weights_as_the_block_would():
    """Deferred initialisation, done by the partition: LSTMBias's forget gate of 1 and zeros
    elsewhere land where the block's layout puts them."""
    net = lstm(initialize=False)
    pnet = tg.partition(net, devices(4), loss=LOSS, data=(B, T, IN), label=(B, 2),
                        init=mx.init.Xavier())
    assert all(p._data is None for p in net.collect_params().values())
    name = "lstm_lstm0_i2h_bias"
    assert name in pnet.partitioned.graph.layouts
    bias = pnet.partitioned.merge_arrays(
        {s.name: a.asnumpy() for s, a, _ in pnet.shard_arrays(("param",)) if s.source == name},
        ("param",))[name]
    np.testing.assert_array_equal(bias, np.r_[np.zeros(H), np.ones(H), np.zeros(2 * H)])
