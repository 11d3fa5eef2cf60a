"""tofu_mx.gluon.partition(..., replicas=G): data parallelism across G groups of devices,
Tofu inside each. Judged in float64 against Gluon's own data parallelism over G devices
(the same rows per group, BatchNorm over each group's rows), and on a net without
BatchNorm against one device on the whole batch."""
import dataclasses
import threading
import warnings

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn
from mxnet.gluon.model_zoo import vision

import tofu_mx
import tofu_mx.gluon as tg
from tests.tofu_mx.gluon.test_gluon import (B, LOSS, SIZE, assert_same_params, assert_same_states,
                                            batch, devices, zoo_net)
from tests.tofu_mx.runtime.test_partition_models import ZOO


def gluon_data_parallel(net, trainer, x, y, groups):
    """One step of Gluon's data parallelism over ``groups`` contexts: the reference."""
    ctx = net.collect_params().list_ctx()
    xs, ys = (gluon.utils.split_and_load(a, ctx) for a in (x, y))
    assert len(ctx) == groups
    with autograd.record():
        outs = [LOSS(net(a), b) for a, b in zip(xs, ys)]
    for out in outs:
        out.backward()
    trainer.step(x.shape[0])
    return np.concatenate([o.asnumpy() for o in outs])


@pytest.mark.parametrize("k,groups", [(4, 2), (6, 3)])
def test_zoo_net_trains_as_gluons_data_parallelism(k, groups, tmp_path):
    """resnet18_v1 (BatchNorm in every block) in ``groups`` groups of k / groups devices,
    stepping through pnet.step and through autograd in turn, SGD with momentum: losses,
    parameters and the first group's moving statistics as Gluon's data parallelism over
    ``groups`` contexts (whose saved values are its first context's)."""
    ref, net = zoo_net(), zoo_net()
    ref.collect_params().reset_ctx([mx.cpu(i) for i in range(groups)])
    pnet = tg.partition(net, devices(k), loss=LOSS, data=(B * groups // 2, 3, SIZE, SIZE),
                        label=(B * groups // 2,), replicas=groups)
    assert len(pnet.replicas) == groups and pnet.contexts == devices(k)
    assert pnet.partitioned.contexts == devices(k // groups)
    assert [r.contexts for r in pnet.replicas] == [devices(k)[g * (k // groups):
                                                               (g + 1) * (k // groups)]
                                                     for g in range(groups)]
    opts = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}
    trainer = tg.Trainer(pnet, "sgd", opts)
    ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", dict(opts))
    for step in range(3):
        x, y = (mx.nd.concat(*parts, dim=0) for parts in
                zip(*(batch(10 * step + g) for g in range(groups // 2 + groups % 2))))
        x, y = x[:B * groups // 2], y[:B * groups // 2]
        if step == 1:
            with autograd.record():
                loss = pnet(x, y)
            loss.backward()
        else:
            loss = pnet.step(x, y)
        trainer.step(x.shape[0])
        want = gluon_data_parallel(ref, ref_trainer, x, y, groups)
        np.testing.assert_allclose(loss.asnumpy(), want, rtol=1e-7, atol=1e-10)
    assert_same_params(pnet, ref, tmp_path)
    # every group holds the same parameters; each its own moving statistics
    for s, first, _ in pnet.shard_arrays(("param",)):
        for g in range(1, groups):
            mine = dict((t.name, v) for t, v, _ in pnet.shard_arrays(("param",), g))
            np.testing.assert_array_equal(mine[s.name].asnumpy(), first.asnumpy())
    moving = [{t.name: v.asnumpy() for t, v, _ in pnet.shard_arrays(("aux",), g)}
              for g in range(groups)]
    assert any(not np.array_equal(moving[0][n], moving[1][n]) for n in moving[0])


def mlp(dtype="float64"):
    net = nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        net.add(nn.Dense(64, activation="tanh", in_units=20),
                nn.Dense(48, activation="relu", in_units=64), nn.Dense(10, in_units=48))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu(0))
    net.cast(dtype)
    return net


def twin_mlps(dtype="float64"):
    """Two MLPs holding the same values: the reference and the one to partition."""
    ref, net = mlp(dtype), mlp(dtype)
    for p, q in zip(ref.collect_params().values(), net.collect_params().values()):
        q.set_data(p.data())
    return ref, net


def rows(rng, n=12, dtype="float64"):
    """A batch of ``n`` random rows of the MLP's input and labels."""
    return (mx.nd.array(rng.standard_normal((n, 20)), dtype=dtype),
            mx.nd.array(rng.integers(0, 10, n), dtype=dtype))


def one_device(net, x, y, trainer=None):
    """Forward and backward of plain Gluon on one device (and ``trainer.step``); the
    per-sample losses."""
    with autograd.record():
        losses = LOSS(net(x), y)
    losses.backward()
    if trainer is not None:
        trainer.step(x.shape[0])
    return losses


def test_without_batchnorm_it_trains_as_one_device_on_the_whole_batch(tmp_path):
    """No BatchNorm: the groups' summed gradients are the whole batch's, so Adam over 2
    groups of 2 devices steps as one device does on the joined batch; and the states file
    is Gluon's (one state per parameter), which loads back into every group."""
    ref, net = twin_mlps()
    pnet = tg.partition(net, devices(4), loss=LOSS, data=(12, 20), label=(12,), replicas=2)
    trainer = tg.Trainer(pnet, "adam", {"learning_rate": 0.01})
    ref_trainer = gluon.Trainer(ref.collect_params(), "adam", {"learning_rate": 0.01})
    rng = np.random.default_rng(0)
    for step in range(3):
        x, y = rows(rng)
        loss = pnet.step(x, y)
        trainer.step(12)
        want = one_device(ref, x, y, ref_trainer)
        np.testing.assert_allclose(loss.asnumpy(), want.asnumpy(), rtol=1e-9, atol=1e-12)
    assert_same_params(pnet, ref, tmp_path)
    _, theirs = assert_same_states(trainer, ref_trainer, tmp_path, rtol=1e-9, atol=1e-15)
    # Gluon's states into a fresh two-group trainer: it continues as the reference does
    again = tg.partition(mlp(), devices(4), loss=LOSS, data=(12, 20), label=(12,), replicas=2)
    path = str(tmp_path / "model.params")
    pnet.export_parameters(path)
    again.load_parameters(path)
    again_trainer = tg.Trainer(again, "adam", {"learning_rate": 0.01})
    again_trainer.load_states(theirs)
    x, y = rows(rng)
    again.step(x, y)
    again_trainer.step(12)
    one_device(ref, x, y, ref_trainer)
    assert_same_params(again, ref, tmp_path)


def test_memory_and_arrays_count_every_group():
    pnet = tg.partition(mlp(), devices(4), loss=LOSS, data=(12, 20), label=(12,), replicas=2)
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    rows = pnet.memory_per_device()
    assert [m.device for m in rows] == [str(c) for c in devices(4)]
    assert [m.weights for m in rows[2:]] == [m.weights for m in rows[:2]]
    held = pnet.bytes_per_device()
    weights = sum(p.data().size for p in mlp().collect_params().values()) * 8
    assert sum(r["weights"] for r in held[:2]) == sum(r["weights"] for r in held[2:]) == weights
    # momentum in each group, and on each device a buffer for its peers' gradient shards:
    # as large as the largest shard it sums, at most its largest
    state = trainer.state_bytes_per_device()
    momentum = [0] * 4
    largest = [0] * 4
    for g in range(2):
        for _, w, _ in pnet.shard_arrays(("param",), g):
            d = devices(4).index(w.context)
            momentum[d] += w.size * 8
            largest[d] = max(largest[d], w.size * 8)
    assert sum(momentum) == 2 * weights
    assert all(0 < s - m <= big for s, m, big in zip(state, momentum, largest))
    assert "2 data-parallel groups" in repr(pnet)


def test_bad_replicas_are_refused_with_what_to_do():
    net = mlp()
    for replicas, k, batch_, words in [(3, 4, 12, "divide the 4 devices"),
                                       (4, 4, 12, "groups of two or more"),
                                       (2, 4, 9, "does not divide by 2"),
                                       (0, 4, 12, "at least 1"),
                                       ("2", 4, 12, "must be an int")]:
        with pytest.raises(tofu_mx.InvalidArgumentError, match=words):
            tg.partition(net, devices(k), loss=LOSS, data=(batch_, 20), label=(batch_,),
                         replicas=replicas)

    class Total(gluon.HybridBlock):     # one value for the whole batch: cannot be joined
        def hybrid_forward(self, F, x):
            return F.sum(x, axis=0)
    with pytest.raises(tofu_mx.InvalidArgumentError, match="batch .12. as their first axis"):
        tg.partition(Total(), devices(4), data=(12, 20), replicas=2)

    class Stated(gluon.HybridBlock):    # a begin state laid out (layers, batch, hidden)
        def hybrid_forward(self, F, x, state):
            return F.broadcast_add(x, F.sum(state, axis=0))
    with pytest.raises(tofu_mx.InvalidArgumentError,
                       match=r"data1 \(2, 12, 20\) has another first axis"):
        tg.partition(Stated(), devices(4), data=[(12, 20), (2, 12, 20)], replicas=2)
    pnet = tg.partition(net, devices(4), loss=LOSS, data=(12, 20), label=(12,), replicas=2)
    with pytest.raises(tofu_mx.InvalidArgumentError, match="partitioned for .12, 20."):
        pnet.step(mx.nd.zeros((6, 20), dtype="float64"), mx.nd.zeros((6,), dtype="float64"))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="replica must be between 0 and 1"):
        pnet.shard_arrays(("param",), 2)


def test_grad_req_add_and_frozen_parameters_in_groups(tmp_path):
    """grad_req='add' over two micro-batches (zero_grad between steps) with the first
    layer's weight frozen, in 2 groups of 2 devices: as one device on the whole batches."""
    ref, net = twin_mlps()
    for n in (ref, net):
        n.collect_params().setattr("grad_req", "add")
        n[0].weight.grad_req = "null"
    frozen = net[0].weight.data().asnumpy()
    pnet = tg.partition(net, devices(4), loss=LOSS, data=(8, 20), label=(8,), replicas=2)
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1, "momentum": 0.5})
    ref_trainer = gluon.Trainer(ref.collect_params(), "sgd",
                                {"learning_rate": 0.1, "momentum": 0.5})
    rng = np.random.default_rng(3)
    for step in range(3):
        for micro in range(2):
            x, y = rows(rng, 8)
            with autograd.record():
                loss = pnet(x, y)
            loss.backward()
            want = one_device(ref, x, y)
            np.testing.assert_allclose(loss.asnumpy(), want.asnumpy(), rtol=1e-9, atol=1e-12)
        trainer.step(16)
        ref_trainer.step(16)
        pnet.zero_grad()
        ref.collect_params().zero_grad()
    assert_same_params(pnet, ref, tmp_path)
    path = str(tmp_path / "after.params")
    pnet.export_parameters(path)
    np.testing.assert_array_equal(mx.nd.load(path)["0.weight"].asnumpy(), frozen)


def test_autograds_backward_pass_runs_on_the_callers_thread(tmp_path):
    """loss.backward() reaches the executors through autograd's custom-function thread;
    entered from there while this thread used MXNet too, they hung at random (every engine
    thread idle; seen in this file's grad_req test about once in 30 repetitions). The pass
    runs on the caller's thread at the block's next use (the gradients' values: the grad_req
    test below and test_gluon's autograd tests)."""
    _, net = twin_mlps()
    pnet = tg.partition(net, devices(4), loss=LOSS, data=(8, 20), label=(8,), replicas=2)
    threads = []
    for exe in pnet._exes:
        def recording(*args, _backward=exe.backward, **kwargs):
            threads.append(threading.current_thread())
            return _backward(*args, **kwargs)
        exe.backward = recording
    x, y = rows(np.random.default_rng(5), 8)
    with autograd.record():
        loss = pnet(x, y)
    loss.backward()
    mx.nd.waitall()
    grads = [g.asnumpy() for _, _, g in pnet.shard_arrays(("param",))]
    assert threads == [threading.main_thread()] * 2     # one backward pass per group
    assert all(np.isfinite(g).all() for g in grads) and any(np.abs(g).sum() for g in grads)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_autograd_steps_in_groups_do_not_hang(tmp_path):
    """The grad_req test's pattern (autograd in 2 groups, plain Gluon between backward and
    reading the loss) 200 times in one process: it hung within about 30 before."""
    for i in range(200):
        (tmp_path / str(i)).mkdir()
        test_grad_req_add_and_frozen_parameters_in_groups(tmp_path / str(i))


def test_machine_chooses_each_groups_plan():
    """With machine=, the plan each group runs is chosen by simulated step time for one
    group's devices and share of the batch."""
    pnet = tg.partition(mlp(), devices(4), loss=LOSS, data=(12, 20), label=(12,), replicas=2,
                        machine="8xV100-16GB-PCIe")
    choice = pnet.partitioned.machine_choice
    assert choice is not None and choice.chosen in choice.candidates
    assert pnet.replicas[1].machine_choice is choice
    assert pnet.partitioned.graph.node("data").outputs[0].shape == (6, 20)


def test_auto_takes_the_hybrid_only_where_machine_predicts_it_fastest(monkeypatch):
    """replicas='auto' follows machine='s comparison over all the devices: one partition of
    them all where it (or nothing) is faster; the hybrid's groups where the hybrid fits and
    is the fastest. The comparison is taken as simulated, then (second case) its hybrid made
    faster than everything, to see the other branch."""
    import tofu_mx.gluon.block as block_module
    from tofu_mx.runtime.partitioned import Candidate
    machine = dataclasses.replace(tofu_mx.sim.machine("8xV100-16GB-PCIe"), name="two pairs",
                                  num_devices=4, group_size=2, host_shared=2)
    kwargs = dict(loss=LOSS, data=(12, 20), label=(12,), machine=machine, replicas="auto")
    pnet = tg.partition(mlp(), devices(4), **kwargs)
    choice = pnet.machine_choice
    assert choice.hybrid is not None and choice.hybrid.groups == 2
    assert choice.fastest_elsewhere is not choice.hybrid      # as simulated: not faster
    assert len(pnet.replicas) == 1 and pnet.partitioned.contexts == devices(4)
    real = block_module.partition_symbol

    def hybrid_fastest(*args, **kw):
        ptd = real(*args, **kw)
        if ptd.machine_choice is not None and ptd.machine_choice.hybrid is not None:
            fast = dataclasses.replace(ptd.machine_choice.hybrid, step=1e-9, fits=True)
            ptd.machine_choice = dataclasses.replace(ptd.machine_choice, hybrid=fast)
        return ptd
    monkeypatch.setattr(block_module, "partition_symbol", hybrid_fastest)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pnet = tg.partition(mlp(), devices(4), **kwargs)
    assert isinstance(pnet.machine_choice.hybrid, Candidate)
    assert pnet.machine_choice.chosen is pnet.machine_choice.hybrid
    assert pnet.machine_choice.fastest_elsewhere is None
    report = pnet.report()
    assert report.startswith("data parallel across 2 groups of 2 devices (cpu(0), cpu(1); "
                             "cpu(2), cpu(3)), each running the partition below on 6 samples")
    assert "over all 4 devices:\nchosen for two pairs" in report
    assert pnet.machine_choice.lines()[0].startswith(
        "chosen for two pairs by simulated step time (the fastest that fits its memory): "
        "data parallelism across 2 groups of 2 devices, Tofu inside each")
    assert len(pnet.replicas) == 2 and pnet.partitioned.contexts == devices(2)
    assert pnet.partitioned.machine_choice is not None
    assert not [w for w in caught if issubclass(w.category, tofu_mx.DataParallelFasterWarning)]
    with pytest.raises(tofu_mx.InvalidArgumentError, match="give machine= too"):
        tg.partition(mlp(), devices(4), loss=LOSS, data=(12, 20), label=(12,), replicas="auto")


def test_float32_groups_train_as_float32_gluon_does(tmp_path):
    """The float32 path (what users run): two steps in 2 groups of 2 against one device's
    float32 Gluon; the two differ only in summation order (judged at float32's rounding)."""
    ref, net = twin_mlps("float32")
    pnet = tg.partition(net, devices(4), loss=LOSS, data=(12, 20), label=(12,), replicas=2)
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1})
    ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", {"learning_rate": 0.1})
    rng = np.random.default_rng(5)
    for step in range(2):
        x, y = rows(rng, dtype="float32")
        loss = pnet.step(x, y)
        trainer.step(12)
        want = one_device(ref, x, y, ref_trainer)
        assert loss.dtype == np.float32
        np.testing.assert_allclose(loss.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)
    path = str(tmp_path / "f32.params")
    pnet.export_parameters(path)
    got = {k: v.asnumpy() for k, v in mx.nd.load(path).items()}
    want = {k: p.data().asnumpy() for k, p in ref._collect_params_with_prefix().items()}
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == np.float32
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_machines_advice_points_at_the_callers_line():
    """DataParallelFasterWarning is raised three calls deep from tofu_mx.gluon.partition (and
    two from tofu_mx.partition): it names the caller's file, not the package's."""
    net = nn.HybridSequential(prefix="small_")
    net.add(nn.Dense(10, in_units=20))
    net.initialize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tg.partition(net, devices(2), loss=gluon.loss.L2Loss(), data=(64, 20), label=(64, 10),
                     machine="8xV100-16GB-PCIe")
    advice = [w for w in caught if issubclass(w.category, tofu_mx.DataParallelFasterWarning)]
    assert advice and all(w.filename == __file__ for w in advice)


def test_outputs_without_a_loss_take_their_head_gradients_by_group():
    """Partitioned without a loss, in 2 groups of 3 devices: pnet(x) returns the groups'
    outputs joined (each from its devices' pieces); a loss applied outside hands each group
    its rows' head gradients, split into the pieces (a weighted loss, so they differ per
    row), and a prediction outside autograd is joined too."""
    ref, net = twin_mlps()
    pnet = tg.partition(net, devices(6), data=(12, 20), replicas=2)
    # the executor returns the output's pieces (batch rows on each device): the block joins
    pieces = pnet.partitioned.output_pieces
    assert len(pieces) == 3 and all(k == 0 for k, _ in pieces)
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1})
    ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", {"learning_rate": 0.1})
    rng = np.random.default_rng(7)
    weights = mx.nd.array(np.arange(1, 13).reshape(12, 1), dtype="float64")
    for step in range(2):
        x, y = rows(rng)
        with autograd.record():
            loss = LOSS(pnet(x), y, weights)
        loss.backward()
        trainer.step(12)
        with autograd.record():
            want = LOSS(ref(x), y, weights)
        want.backward()
        ref_trainer.step(12)
        np.testing.assert_allclose(loss.asnumpy(), want.asnumpy(), rtol=1e-9, atol=1e-12)
    x, _ = rows(rng)
    np.testing.assert_allclose(pnet(x).asnumpy(), ref(x).asnumpy(), rtol=1e-9, atol=1e-12)


def blocks(net):
    """``net`` and every block inside it."""
    yield net
    for child in net._children.values():
        yield from blocks(child)


def zoo_pair(name, seed=0):
    """The model-zoo net ``name`` (10 classes, float64) twice, with the same values (the
    reference and the one to partition), Dropout switched off (its masks are random), and
    the image size: the partition tests' (``ZOO``), twice that for nets with BatchNorm (so
    that their last BatchNorms see 32 values a channel, not 8: over a few values, float64
    rounding grows past the comparison's 1e-9). The final average poolings sized for 224 px
    and more (7, 8 and 13 wide) pool globally, as in the partition tests."""
    nets, size = [], ZOO[name]
    for _ in range(2):
        mx.random.seed(seed)
        with mx.name.NameManager():
            net = vision.get_model(name, classes=10)
        for block in blocks(net):
            if isinstance(block, nn.Dropout):
                block._rate = 0.0
            if isinstance(block, nn.BatchNorm):
                size = 2 * ZOO[name]
            if isinstance(block, nn.AvgPool2D) and \
                    tuple(block._kwargs["kernel"]) in ((7, 7), (8, 8), (13, 13)):
                block._kwargs["global_pool"] = True
        net.initialize(mx.init.Xavier(), ctx=mx.cpu(0))
        net.cast("float64")
        net(mx.nd.zeros((1, 3, size, size), dtype="float64"))
        nets.append(net)
    return nets[0], nets[1], size


#: the nets whose data parallelism holds several GB in float64 (measured at 4 groups and
#: Gluon's 4 devices: vgg11_bn 14 GB, vgg16 13 GB, inceptionv3 9 GB): in 2 groups only
LARGE = ("alexnet", "vgg11_bn", "vgg16", "inceptionv3")


@pytest.mark.parametrize("name,k,groups", [
    pytest.param(name, k, groups, marks=() if (name, k) == ("mobilenet1.0", 8) else
                 pytest.mark.slow)
    for name in ZOO for k, groups in [(4, 2), (6, 2), (8, 4)]
    if name not in LARGE or groups == 2])
def test_the_zoo_in_groups_trains_as_gluons_data_parallelism(name, k, groups, tmp_path):
    """Every model-zoo net of the partition tests, in 2 groups of 2 or 3 devices or 4 of 2,
    8 samples a group (images as :func:`zoo_pair` says), two SGD steps: as Gluon's data
    parallelism over ``groups`` devices."""
    ref, net, size = zoo_pair(name)
    ref.collect_params().reset_ctx([mx.cpu(i) for i in range(groups)])
    batch_ = 8 * groups
    pnet = tg.partition(net, devices(k), loss=LOSS, data=(batch_, 3, size, size),
                        label=(batch_,), replicas=groups)
    opts = {"learning_rate": 0.01, "momentum": 0.9}
    trainer = tg.Trainer(pnet, "sgd", opts)
    ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", dict(opts))
    rng = np.random.default_rng(11)
    for step in range(2):
        x = mx.nd.array(rng.standard_normal((batch_, 3, size, size)), dtype="float64")
        y = mx.nd.array(rng.integers(0, 10, batch_), dtype="float64")
        loss = pnet.step(x, y)
        trainer.step(batch_)
        want = gluon_data_parallel(ref, ref_trainer, x, y, groups)
        np.testing.assert_allclose(loss.asnumpy(), want, rtol=1e-7, atol=1e-10)
    assert_same_params(pnet, ref, tmp_path)
