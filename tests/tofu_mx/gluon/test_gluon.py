"""tofu_mx.gluon: a model-zoo net partitioned over CPU devices trains as plain Gluon does on
one device (losses, every parameter and aux state), in float64."""
import pickle

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn
from mxnet.gluon.model_zoo import vision

import tofu_mx
import tofu_mx.gluon as tg

B, SIZE = 8, 64
LOSS = gluon.loss.SoftmaxCrossEntropyLoss()


def zoo_net(seed=0):
    """resnet18_v1 (10 classes) in float64, initialised and materialised on cpu(0). At 64px
    and batch 8 the last BatchNorms see 32 values a channel: at 32px and batch 4 they see 4,
    and training is so ill-conditioned that float64 rounding grows 30-100x a step."""
    mx.random.seed(seed)
    net = vision.get_model("resnet18_v1", classes=10)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu(0))
    net.cast("float64")
    net(mx.nd.zeros((1, 3, SIZE, SIZE), dtype="float64"))   # deferred shapes
    return net


def batch(step):
    rng = np.random.default_rng(step)
    x = mx.nd.array(rng.standard_normal((B, 3, SIZE, SIZE)), dtype="float64")
    y = mx.nd.array(rng.integers(0, 10, B), dtype="float64")
    return x, y


def devices(k):
    return [mx.cpu(i) for i in range(k)]


def params_of(net):
    return {k: p.data().asnumpy() for k, p in net._collect_params_with_prefix().items()}


def gluon_step(net, trainer, x, y, loss=LOSS):
    """One step of plain Gluon on one device: the reference."""
    with autograd.record():
        out = loss(net(x), y)
    out.backward()
    trainer.step(x.shape[0])
    return out


def train_alike(pnet, trainer, ref, ref_trainer, batches, loss=LOSS, rtol=1e-9, atol=0.0):
    """Each ``(x, y)`` of ``batches``: a step of the partitioned block (``pnet.step``, then
    ``trainer``) and one of plain Gluon (:func:`gluon_step`), their losses compared."""
    for x, y in batches:
        got = pnet.step(x, y)
        trainer.step(x.shape[0])
        want = gluon_step(ref, ref_trainer, x, y, loss)
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=rtol, atol=atol)


def assert_same_params(pnet, net, tmp_path):
    path = str(tmp_path / "exported.params")
    pnet.export_parameters(path)
    got = {k: v.asnumpy() for k, v in mx.nd.load(path).items()}
    want = params_of(net)
    assert sorted(got) == sorted(want)
    for k in want:
        # float64: only summation orders differ (split reductions); judged against each
        # array's scale (Adam's 1/sqrt(v) magnifies rounding in near-zero gradients)
        scale = max(np.abs(want[k]).max(), 1e-3)
        np.testing.assert_allclose(got[k], want[k], rtol=1e-7, atol=1e-9 * scale, err_msg=k)


def assert_same_states(trainer, ref_trainer, tmp_path, rtol, atol) -> tuple[str, str]:
    """Both trainers' states files (written to ``tmp_path``) hold the same states and update
    counts; returns their paths (ours, Gluon's)."""
    ours, theirs = str(tmp_path / "ours.states"), str(tmp_path / "theirs.states")
    trainer.save_states(ours)
    ref_trainer.save_states(theirs)
    a, b = (pickle.loads(open(p, "rb").read()) for p in (ours, theirs))
    assert sorted(a[0]) == sorted(b[0])
    assert a[1]._index_update_count == b[1]._index_update_count
    for i in b[0]:
        for x_, y_ in zip(a[0][i], b[0][i]):
            np.testing.assert_allclose(x_.asnumpy(), y_.asnumpy(), rtol=rtol, atol=atol)
    return ours, theirs


@pytest.mark.parametrize("k", [2, 4])
def test_sgd_momentum_through_step_matches_gluon(k, tmp_path):
    ref, net = zoo_net(), zoo_net()
    pnet = tg.partition(net, devices(k), loss=LOSS, data=(B, 3, SIZE, SIZE), label=(B,))
    assert not pnet.partitioned.fallbacks
    opts = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}
    trainer = tg.Trainer(pnet, "sgd", opts)
    ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", dict(opts))
    train_alike(pnet, trainer, ref, ref_trainer, map(batch, range(4)), rtol=1e-7, atol=1e-10)
    assert_same_params(pnet, ref, tmp_path)
    # the user's block keeps its own values
    untouched = params_of(zoo_net())
    for k_, v in params_of(net).items():
        np.testing.assert_array_equal(v, untouched[k_])


@pytest.mark.parametrize("k", [2, 4])
def test_adam_through_the_autograd_loop_matches_gluon(k, tmp_path):
    ref, net = zoo_net(), zoo_net()
    pnet = tg.partition(net, devices(k), loss=LOSS, data=(B, 3, SIZE, SIZE), label=(B,))

    def schedule():
        return mx.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.01)
    trainer = tg.Trainer(pnet, "adam", {"learning_rate": 0.01, "lr_scheduler": schedule()})
    ref_trainer = gluon.Trainer(ref.collect_params(), "adam",
                                {"learning_rate": 0.01, "lr_scheduler": schedule()})
    for step in range(4):
        x, y = batch(step)
        with autograd.record():
            loss = pnet(x, y)
        loss.backward()
        trainer.step(B)     # no mx.nd.waitall() needed here: Trainer.step waits itself
        want = gluon_step(ref, ref_trainer, x, y)
        np.testing.assert_allclose(loss.asnumpy(), want.asnumpy(), rtol=1e-7, atol=1e-10)
        assert trainer.learning_rate == ref_trainer.learning_rate
    assert_same_params(pnet, ref, tmp_path)


def test_loss_applied_outside_the_partitioned_block():
    ref, net = zoo_net(), zoo_net()
    pnet = tg.partition(net, devices(2), data=(B, 3, SIZE, SIZE))
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.05})
    ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", {"learning_rate": 0.05})
    for step in range(2):
        x, y = batch(step)
        with autograd.record():
            loss = LOSS(pnet(x), y)
        loss.backward()
        trainer.step(B)
        want = gluon_step(ref, ref_trainer, x, y)
        np.testing.assert_allclose(loss.asnumpy(), want.asnumpy(), rtol=1e-7, atol=1e-10)
    x, _ = batch(9)
    np.testing.assert_allclose(pnet(x).asnumpy(), ref(x).asnumpy(), rtol=1e-7, atol=1e-10)


def test_exported_parameters_load_into_the_plain_net_and_give_its_outputs(tmp_path):
    net = zoo_net()
    pnet = tg.partition(net, devices(3), loss=LOSS, data=(B, 3, SIZE, SIZE), label=(B,))
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.05, "momentum": 0.9})
    for step in range(2):
        pnet.step(*batch(step))
        trainer.step(B)
    path = str(tmp_path / "model.params")
    pnet.export_parameters(path)
    plain = vision.get_model("resnet18_v1", classes=10)
    plain.cast("float64")
    plain.load_parameters(path, ctx=mx.cpu())
    x, y = batch(7)
    # predict mode (outside autograd.record): BatchNorm uses the trained moving statistics
    np.testing.assert_allclose(pnet(x, y).asnumpy(), LOSS(plain(x), y).asnumpy(),
                               rtol=1e-7, atol=1e-10)
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    # and back into a partition at another device count
    again = tg.partition(zoo_net(seed=5), devices(2), loss=LOSS, data=(B, 3, SIZE, SIZE),
                         label=(B,))
    again.load_parameters(path)
    np.testing.assert_allclose(again(x, y).asnumpy(), LOSS(plain(x), y).asnumpy(),
                               rtol=1e-7, atol=1e-10)


def test_trainer_states_load_into_gluon_and_back_at_another_device_count(tmp_path):
    ref, net = zoo_net(), zoo_net()
    pnet = tg.partition(net, devices(4), loss=LOSS, data=(B, 3, SIZE, SIZE), label=(B,))
    trainer = tg.Trainer(pnet, "adam", {"learning_rate": 0.01})
    ref_trainer = gluon.Trainer(ref.collect_params(), "adam", {"learning_rate": 0.01})
    for step in range(2):
        x, y = batch(step)
        pnet.step(x, y)
        trainer.step(B)
        gluon_step(ref, ref_trainer, x, y)
    ours, theirs = assert_same_states(trainer, ref_trainer, tmp_path, rtol=1e-7, atol=1e-12)
    # our states into a plain Gluon trainer, Gluon's into a partition over 2 devices:
    # both continue as the reference does
    params = str(tmp_path / "model.params")
    pnet.export_parameters(params)
    plain = zoo_net(seed=3)
    plain.load_parameters(params, ctx=mx.cpu(0))
    plain_trainer = gluon.Trainer(plain.collect_params(), "adam", {"learning_rate": 0.01})
    plain_trainer.load_states(ours)
    two = tg.partition(zoo_net(seed=4), devices(2), loss=LOSS, data=(B, 3, SIZE, SIZE),
                       label=(B,))
    two.load_parameters(params)
    two_trainer = tg.Trainer(two, "adam", {"learning_rate": 0.01})
    two_trainer.load_states(theirs)
    for step in range(2, 4):
        x, y = batch(step)
        for model, tr in ((ref, ref_trainer), (plain, plain_trainer)):
            gluon_step(model, tr, x, y)
        two.step(x, y)
        two_trainer.step(B)
    assert_same_params(two, ref, tmp_path)
    np.testing.assert_allclose(params_of(plain)["output.weight"], params_of(ref)["output.weight"],
                               rtol=1e-7, atol=1e-10)


def wide_mlp():
    net = nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        net.add(nn.Dense(512, activation="relu", in_units=256), nn.Dense(256, in_units=512))
    return net


def test_shards_are_initialised_directly_and_no_device_holds_a_whole_parameter():
    net = nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        net.add(nn.Dense(512, activation="relu"), nn.Dense(256))
    net.initialize(mx.init.Xavier(magnitude=3))   # deferred: the shapes are not known yet
    k = 4
    pnet = tg.partition(net, devices(k), data=(8, 256), memory_budget=64 << 20)
    for p in net.collect_params().values():       # the block's deferred weights stay so:
        assert (p._data is None) == p.name.endswith("weight")   # not initialised by us
    whole = {p.name: pnet.partitioned.graph.node(p.name).outputs[0].shape
             for p in net.collect_params().values()}
    for s, value, grad in pnet.shard_arrays():
        if len(whole[s.source]) == 2:             # the weights are split, never whole
            assert value.shape != whole[s.source], s
    held = pnet.bytes_per_device()
    total = sum(int(np.prod(shape)) * 4 for shape in whole.values())
    assert max(row["weights"] for row in held) <= total / k * 1.01
    assert [row["weights"] for row in held] == [m.weights for m in pnet.memory_per_device()]
    # Xavier drew from the whole weight's fans: |w| <= sqrt(3 / ((fan_in + fan_out) / 2))
    values = [(s, v.asnumpy()) for s, v, _ in pnet.shard_arrays() if s.source == "mlp_dense0_weight"]
    bound = np.sqrt(3 / ((256 + 512) / 2))
    top = max(np.abs(v).max() for _, v in values)
    assert 0.97 * bound < top <= bound
    biases = [v.asnumpy() for s, v, _ in pnet.shard_arrays() if s.source.endswith("bias")]
    assert all((b == 0).all() for b in biases)
    trainer = tg.Trainer(pnet, "adam", {"learning_rate": 0.01})
    mem = trainer.memory_per_device()
    assert [m.optimizer for m in mem] == [2 * m.weights for m in mem]
    assert all(m.total == pnet.memory_per_device()[d].total + m.optimizer
               for d, m in enumerate(mem))


def test_an_uninitialised_block_uses_the_init_given_and_trains():
    net = wide_mlp()
    pnet = tg.partition(net, devices(2), loss=gluon.loss.L2Loss(), data=(8, 256),
                        label=(8, 256), init=mx.init.Constant(0.01))
    weights = [v.asnumpy() for s, v, _ in pnet.shard_arrays() if s.source.endswith("weight")]
    assert all((w == np.float32(0.01)).all() for w in weights)
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1})
    x = mx.nd.ones((8, 256))
    first = pnet.step(x, x * 0).mean().asscalar()
    trainer.step(8)
    assert pnet.step(x, x * 0).mean().asscalar() < first


def test_shared_parameters_work():
    class Tied(gluon.HybridBlock):
        def __init__(self):
            super().__init__(prefix="tied_")
            with self.name_scope():
                self.a = nn.Dense(16, in_units=16, use_bias=False)
                self.b = nn.Dense(16, in_units=16, use_bias=False, params=self.a.params)

        def hybrid_forward(self, F, x):
            return self.b(F.relu(self.a(x)))
    net = Tied()
    net.initialize(ctx=mx.cpu(0))
    net.cast("float64")
    ref = Tied()
    ref.initialize(ctx=mx.cpu(0))
    ref.cast("float64")
    ref.a.weight.set_data(net.a.weight.data())
    pnet = tg.partition(net, devices(2), loss=gluon.loss.L2Loss(), data=(4, 16), label=(4, 16))
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1})
    ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", {"learning_rate": 0.1})
    x = mx.nd.array(np.random.default_rng(0).standard_normal((4, 16)), dtype="float64")
    for _ in range(2):
        loss = pnet.step(x, x)
        trainer.step(4)
        want = gluon_step(ref, ref_trainer, x, x, gluon.loss.L2Loss())
        np.testing.assert_allclose(loss.asnumpy(), want.asnumpy(), rtol=1e-9)


def test_errors():
    class Plain(gluon.Block):
        def forward(self, x):
            return x * 2

    class Dynamic(gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return F.reshape(x, (x.shape[0], -1))

    with pytest.raises(tofu_mx.InvalidArgumentError, match="needs a gluon.HybridBlock"):
        tg.partition(Plain(), devices(2), data=(4, 4))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="cannot trace the block .*Dynamic"):
        tg.partition(Dynamic(), devices(2), data=(4, 4))
    net = wide_mlp()
    with pytest.raises(tofu_mx.InvalidArgumentError, match="give both loss= and label="):
        tg.partition(net, devices(2), loss=LOSS, data=(8, 256))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="data must be a shape"):
        tg.partition(net, devices(2), data="8,256")
    pnet = tg.partition(net, devices(2), loss=gluon.loss.L2Loss(), data=(8, 256), label=(8, 256))
    with pytest.raises(tofu_mx.InvalidArgumentError, match=r"data has shape \(7, 256\), the "
                                                            r"block was partitioned for \(8, 256\)"):
        pnet.step(mx.nd.ones((7, 256)), mx.nd.ones((7, 256)))
    trainer = tg.Trainer(pnet, "sgd")
    with pytest.raises(tofu_mx.InvalidArgumentError, match="gradients have not been computed"):
        trainer.step(8)
    with pytest.raises(tofu_mx.InvalidArgumentError,
                       match="optimizer 'sgd' takes no parameter 'learning_rat'; use one of "
                             "begin_num_update, clip_gradient"):
        tg.Trainer(pnet, "sgd", {"learning_rat": 0.1})
    with pytest.raises(tofu_mx.InvalidArgumentError, match="takes the block"):
        tg.Trainer(net, "sgd")


def test_autograd_steps_back_to_back_need_no_waitall():
    """loss.backward() returns before the executor's backward pass (run on an engine thread)
    is done; the next call must wait for it (without the wait: 'Cannot find attribute shape
    in the graph' at k=4)."""
    net = nn.HybridSequential(prefix="m_")
    with net.name_scope():
        net.add(nn.Dense(64, activation="relu", in_units=32), nn.BatchNorm(in_channels=64),
                nn.Dense(10, in_units=64))
    net.initialize(ctx=mx.cpu(0))
    pnet = tg.partition(net, devices(4), loss=LOSS, data=(8, 32), label=(8,))
    x, y = mx.nd.ones((8, 32)), mx.nd.array(np.arange(8))
    losses = []
    for _ in range(10):
        with autograd.record():
            loss = pnet(x, y)
        loss.backward()
        losses.append(loss)
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1})
    trainer.step(8)
    assert all(np.allclose(a.asnumpy(), losses[0].asnumpy()) for a in losses)


def test_the_memory_budget_counts_the_optimizer_state():
    def mlp():
        net = nn.HybridSequential(prefix="mlp_")
        with net.name_scope():
            net.add(nn.Dense(1024, activation="relu", in_units=1024), nn.Dense(1024, in_units=1024))
        net.initialize(ctx=mx.cpu(0))
        return net
    kwargs = dict(loss=gluon.loss.L2Loss(), data=(8, 1024), label=(8, 1024),
                  memory_budget=9 << 20)
    pnet = tg.partition(mlp(), devices(2), **kwargs)      # fits without optimizer state
    assert max(m.total for m in pnet.memory_per_device()) <= 9 << 20
    with pytest.raises(tofu_mx.NoFeasiblePlanError, match="optimizer 8.0"):
        tg.partition(mlp(), devices(2), options=tofu_mx.SearchOptions(optimizer_state=2),
                     **kwargs)


def test_saved_files_get_the_permissions_gluon_gives(tmp_path):
    import os
    net = wide_mlp()
    net.initialize(ctx=mx.cpu(0))
    pnet = tg.partition(net, devices(2), loss=gluon.loss.L2Loss(), data=(8, 256),
                        label=(8, 256))
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    pnet.export_parameters(str(tmp_path / "ours.params"))
    trainer.save_states(str(tmp_path / "ours.states"))
    net.save_parameters(str(tmp_path / "gluon.params"))
    modes = {p.name: os.stat(p).st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes["ours.params"] == modes["ours.states"] == modes["gluon.params"], modes


def test_gpus_mxnet_cannot_see_are_one_line_errors():
    if mx.context.num_gpus() >= 2:
        pytest.skip("this machine has the GPUs")
    net = wide_mlp()
    net.initialize(ctx=mx.cpu(0))
    with pytest.raises(tofu_mx.ContextError, match=r"cannot bind on gpu\(\d\).*MXNet sees"):
        tg.partition(net, [mx.gpu(0), mx.gpu(1)], data=(8, 256))
