"""Gluon's training semantics kept by PartitionedBlock and Trainer, each against plain Gluon
on one device in float64 (losses and every parameter after several steps), or refused with a
clear error: grad_req 'add' with zero_grad, frozen parameters (also one named like another's
shard), two calls in one autograd.record(), ignore_stale_grad, lr_mult/wd_mult changed
between steps, set_learning_rate, shared parameters, and checkpoint names."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import tofu_mx
import tofu_mx.gluon as tg

LOSS = gluon.loss.L2Loss()
B = 6


def mlp(prefix="m_", shared=False):
    net = nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        second = nn.Dense(8, activation="tanh", in_units=8)
        net.add(nn.Dense(8, activation="tanh", in_units=5), second)
        net.add(nn.Dense(8, in_units=8, params=second.params) if shared else
                nn.Dense(8, in_units=8))
        net.add(nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu(0))
    net.cast("float64")
    return net


def pair(**kw):
    """Two identical nets: the reference and the one to partition."""
    ref, net = mlp(**kw), mlp(**kw)
    for (_, a), (_, b) in zip(sorted(ref.collect_params().items()),
                              sorted(net.collect_params().items())):
        b.set_data(a.data())
    return ref, net


def data(step):
    rng = np.random.default_rng(step)
    return (mx.nd.array(rng.standard_normal((B, 5)), dtype="float64"),
            mx.nd.array(rng.standard_normal((B, 3)), dtype="float64"))


def same_params(pnet, ref, tmp_path):
    path = str(tmp_path / "p.params")
    pnet.export_parameters(path)
    got = {k: v.asnumpy() for k, v in mx.nd.load(path).items()}
    for k, p in ref._collect_params_with_prefix().items():
        np.testing.assert_allclose(got[k], p.data().asnumpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=k)


def trainers(pnet, ref, optimizer, opts):
    """tofu_mx's Trainer of ``pnet`` and gluon's of ``ref``, with the same options."""
    return (tg.Trainer(pnet, optimizer, dict(opts)),
            gluon.Trainer(ref.collect_params(), optimizer, dict(opts)))


def step_both(pnet, trainer, ref, ref_trainer, step):
    """One step of each on batch ``step``: pnet.step, and Gluon's autograd loop."""
    x, y = data(step)
    pnet.step(x, y)
    trainer.step(B)
    with autograd.record():
        LOSS(ref(x), y).backward()
    ref_trainer.step(B)


def partition(net, k=3):
    return tg.partition(net, [mx.cpu(i) for i in range(k)], loss=LOSS, data=(B, 5),
                        label=(B, 3))


def test_grad_req_add_accumulates_until_zero_grad(tmp_path):
    """Seen: 'add' silently treated as 'write' (only the last micro-batch's gradient used)."""
    ref, net = pair()
    for n in (ref, net):
        n.collect_params().setattr("grad_req", "add")
    pnet = partition(net)
    trainer, ref_trainer = trainers(pnet, ref, "sgd", {"learning_rate": 0.1})
    for step in range(3):
        for micro in range(2):
            x, y = data(10 * step + micro)
            with autograd.record():
                loss = pnet(x, y)
            loss.backward()
            with autograd.record():
                want = LOSS(ref(x), y)
            want.backward()
            np.testing.assert_allclose(loss.asnumpy(), want.asnumpy(), rtol=1e-9)
        trainer.step(2 * B)
        ref_trainer.step(2 * B)
        pnet.zero_grad()
        ref.collect_params().zero_grad()
    same_params(pnet, ref, tmp_path)


def test_frozen_parameters_stay_and_the_rest_train(tmp_path):
    ref, net = pair()
    for n in (ref, net):
        n[0].weight.grad_req = "null"
    pnet = partition(net)
    frozen = net[0].weight.data().asnumpy()
    trainer, ref_trainer = trainers(pnet, ref, "adam", {"learning_rate": 0.01})
    for step in range(3):
        step_both(pnet, trainer, ref, ref_trainer, step)
    same_params(pnet, ref, tmp_path)
    got = mx.nd.load(str(tmp_path / "p.params"))["0.weight"].asnumpy()
    np.testing.assert_array_equal(got, frozen)


def test_a_frozen_variable_named_like_a_shard_does_not_freeze_that_shard():
    """Seen: a frozen parameter 'w@dev1' next to 'w' gave w's shard on dev1 its grad_req."""
    x = mx.sym.var("data")
    w, frozen = mx.sym.var("w"), mx.sym.var("w@dev1")
    y = mx.sym.FullyConnected(x, w, num_hidden=6, no_bias=True, name="fc")
    y = mx.sym.FullyConnected(y, frozen, num_hidden=4, no_bias=True, name="fc2")
    sym = mx.sym.MakeLoss(mx.sym.sum(y * y))
    ctx = [mx.cpu(0), mx.cpu(1)]
    ptd = tofu_mx.partition(sym, ctx, data=(4, 5))
    exe = ptd.simple_bind(grad_req={"w": "write", "w@dev1": "null", "data": "null"})
    shards_of_w = [s.name for s in ptd.shards if s.source == "w"]
    assert len(shards_of_w) > 1
    assert all(exe.grad_dict.get(n) is not None for n in shards_of_w)
    assert all(exe.grad_dict.get(s.name) is None for s in ptd.shards if s.source == "w@dev1")


def test_two_calls_in_one_record_are_refused():
    """Seen: the second forward replaced the first's state; losses right, gradients wrong."""
    _, net = pair()
    pnet = partition(net)
    (x1, y1), (x2, y2) = data(0), data(1)
    with pytest.raises(tofu_mx.InvalidArgumentError, match="called again inside "
                                                           "autograd.record"):
        with autograd.record():
            pnet(x1, y1)
            pnet(x2, y2)
    pnet(x1, y1)            # outside record: the block is usable again
    with autograd.record():
        loss = pnet(x1, y1)
    loss.backward()


def test_ignore_stale_grad_skips_the_update(tmp_path):
    """Seen: the previous step's gradient applied again; Gluon skips a stale gradient."""
    ref, net = pair()
    pnet = partition(net)
    trainer, ref_trainer = trainers(pnet, ref, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    step_both(pnet, trainer, ref, ref_trainer, 0)
    ref_trainer.step(B, ignore_stale_grad=True)
    trainer.step(B, ignore_stale_grad=True)
    same_params(pnet, ref, tmp_path)


def test_lr_and_wd_mult_and_learning_rate_changes_between_steps(tmp_path):
    ref, net = pair()
    pnet = partition(net)
    trainer, ref_trainer = trainers(pnet, ref, "sgd", {"learning_rate": 0.1, "wd": 0.01})
    for step in range(4):
        if step == 2:
            for n in (ref, net):
                n[1].weight.lr_mult = 0.0
                n[2].weight.wd_mult = 5.0
            trainer.set_learning_rate(0.05)
            ref_trainer.set_learning_rate(0.05)
        step_both(pnet, trainer, ref, ref_trainer, step)
    same_params(pnet, ref, tmp_path)


def test_shared_parameters_train_as_in_gluon(tmp_path):
    ref, net = pair(shared=True)
    pnet = partition(net)
    trainer, ref_trainer = trainers(pnet, ref, "sgd", {"learning_rate": 0.1})
    for step in range(3):
        step_both(pnet, trainer, ref, ref_trainer, step)
    same_params(pnet, ref, tmp_path)


def test_gluons_deduplicated_file_of_shared_parameters_loads(tmp_path):
    """Seen: refused ('missing 2.bias, 2.weight'), though Gluon reads it."""
    ref, net = pair(shared=True)
    path = str(tmp_path / "dedup.params")
    ref.save_parameters(path, deduplicate=True)
    pnet = partition(net)
    pnet.load_parameters(path)
    x, y = data(0)
    with autograd.record():
        want = LOSS(ref(x), y)
    np.testing.assert_allclose(pnet(x, y).asnumpy(), want.asnumpy(), rtol=1e-12)


def test_a_params_file_naming_one_parameter_twice_is_refused(tmp_path):
    y = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="fc")
    sym = mx.sym.MakeLoss(mx.sym.sum(y * y))
    ptd = tofu_mx.partition(sym, [mx.cpu(0), mx.cpu(1)], data=(4, 5))
    path = str(tmp_path / "twice.params")
    mx.nd.save(path, {"arg:fc_weight": mx.nd.ones((3, 5)), "fc_weight": mx.nd.zeros((3, 5)),
                      "arg:fc_bias": mx.nd.ones((3,))})
    with pytest.raises(tofu_mx.CheckpointError, match="'fc_weight' twice, as "
                                                      "'arg:fc_weight' and 'fc_weight'"):
        ptd.load_params(path)


def test_the_users_block_is_never_reached_through_the_partitioned_one(tmp_path):
    """hybridize() and cast() of pnet leave the user's net as it was; Gluon's own Trainer and
    initialize() are refused with what to use; save_parameters writes what the net's
    load_parameters reads; fallbacks is there (none for Dense layers)."""
    ref, net = pair()
    pnet = partition(net)
    pnet.hybridize()
    assert not net._active and all(not c._active for c in net._children.values())
    before = {k: p.data().asnumpy().copy() for k, p in net.collect_params().items()}
    for call in (lambda: gluon.Trainer(pnet.collect_params(), "sgd"),
                 lambda: pnet.collect_params()):
        with pytest.raises(tofu_mx.InvalidArgumentError,
                           match=r"shards on 3 devices, not Gluon Parameters: train with "
                                 r"tofu_mx\.gluon\.Trainer\(pnet"):
            call()
    with pytest.raises(tofu_mx.InvalidArgumentError, match=r"pass init= to "
                                                           r"tofu_mx\.gluon\.partition"):
        pnet.initialize()
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1})
    x, y = data(0)
    pnet.step(x, y)
    trainer.step(B)
    path = str(tmp_path / "trained.params")
    pnet.save_parameters(path)
    assert all(np.array_equal(p.data().asnumpy(), before[k])     # the user's net untouched
               for k, p in net.collect_params().items())
    ref.load_parameters(path)                                   # the trained values
    trained = {k: v.asnumpy() for k, v in mx.nd.load(path).items()}
    for k, p in ref._collect_params_with_prefix().items():
        assert np.array_equal(p.data().asnumpy(), trained[k])
    assert not np.array_equal(trained["0.weight"], before[net[0].weight.name])
    assert pnet.fallbacks == {}
