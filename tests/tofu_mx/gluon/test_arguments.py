"""tofu_mx.gluon's argument checks that tests/tofu_mx/test_hostile.py does not reach: failures
that must leave the executor's inputs and the trainer's states as they were, optimizer
parameters beyond the learning rate, paths to write, and the smaller public methods."""
import pickle

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.gluon import nn

import tofu_mx
import tofu_mx.gluon as tg

CPUS = [mx.cpu(0), mx.cpu(1)]
LOSS = gluon.loss.SoftmaxCrossEntropyLoss()


def mlp(hidden=8, initialize=True):
    mx.random.seed(0)
    net = nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        net.add(nn.Dense(hidden, in_units=6, activation="relu"), nn.Dense(4, in_units=hidden))
    if initialize:
        net.initialize(mx.init.Xavier(), ctx=mx.cpu(0))
    return net


@pytest.fixture(scope="module")
def pnet():
    return tg.partition(mlp(), CPUS, data=(4, 6), label=(4,), loss=LOSS)


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return mx.nd.array(rng.standard_normal((4, 6))), mx.nd.array([0, 1, 2, 3])


def snapshot(arrays):
    return {k: v.asnumpy().copy() for k, v in arrays.items()}


def test_a_step_with_a_bad_label_writes_no_input(pnet):
    x, y = batch(0)
    pnet.step(x, y)
    before = snapshot(pnet.executor.arg_dict)
    other, _ = batch(1)
    with pytest.raises(tofu_mx.InvalidArgumentError, match=r"label has shape \(5,\)"):
        pnet.step(other, mx.nd.zeros((5,)))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="label must hold numbers"):
        pnet.step(other, "abc")
    after = snapshot(pnet.executor.arg_dict)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_numpy_and_list_inputs_give_what_ndarrays_give(pnet):
    x, y = batch(2)
    want = pnet.step(x, y).asnumpy()
    np.testing.assert_array_equal(pnet.step(x.asnumpy(), y.asnumpy()).asnumpy(), want)
    np.testing.assert_array_equal(pnet.step(x.asnumpy().tolist(), [0, 1, 2, 3]).asnumpy(), want)


def states_of(trainer):
    return {i: [a.asnumpy().copy() for a in tg.trainer._leaves(s)]
            for i, s in trainer._updater.states.items()}


def test_states_of_another_net_change_nothing(pnet, tmp_path):
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    pnet.step(*batch(3))
    trainer.step(4)
    wider = tg.partition(mlp(hidden=5), CPUS, data=(4, 6), label=(4,), loss=LOSS)
    other = tg.Trainer(wider, "adam", {"learning_rate": 0.5})
    path = str(tmp_path / "wider.states")
    other.save_states(path)
    before, optimizer = states_of(trainer), trainer.optimizer
    with pytest.raises(tofu_mx.CheckpointError,
                       match=r"state of shape \(5, 6\) for parameter 'mlp_dense0_weight' "
                             r"\(index 1\), whose shape is \(8, 6\)"):
        trainer.load_states(path)
    after = states_of(trainer)
    assert trainer.optimizer is optimizer and trainer.learning_rate == 0.1
    assert before.keys() == after.keys()
    assert all(np.array_equal(a, b) for i in before for a, b in zip(before[i], after[i]))
    # a file whose states are not keyed by parameter index, or whose optimizer is not one
    for bad, says in [(({"a": 1}, None), "not trainer states"),
                      (({}, "sgd"), "holds a str where the optimizer belongs"),
                      (({99: None}, None), r"indices \[99\], but mlp has 4 parameters")]:
        with open(path, "wb") as f:
            f.write(pickle.dumps(bad))
        with pytest.raises(tofu_mx.CheckpointError, match=says):
            trainer.load_states(path)


def test_own_states_load_back(pnet, tmp_path):
    trainer = tg.Trainer(pnet, "adam", {"learning_rate": 0.01})
    pnet.step(*batch(4))
    trainer.step(4)
    path = str(tmp_path / "own.states")
    trainer.save_states(path)
    before = states_of(trainer)
    again = tg.Trainer(pnet, "adam", {"learning_rate": 0.01})
    again.load_states(path)
    after = states_of(again)
    assert all(np.array_equal(a, b) for i in before for a, b in zip(before[i], after[i]))


@pytest.mark.parametrize("params, says", [
    ({"momentum": "x"}, r"optimizer_params\['momentum'\] must be a number, got str 'x'"),
    ({"wd": float("nan")}, r"optimizer_params\['wd'\] must be a finite number"),
    ({"clip_gradient": float("inf")}, r"optimizer_params\['clip_gradient'\] must be a finite"),
    ({"rescale_grad": True}, r"optimizer_params\['rescale_grad'\] must be a number, got bool"),
    ({"learning_rate": 0}, r"optimizer_params\['learning_rate'\] must be > 0, got 0"),
    ({"learning_rate": -1.0}, r"optimizer_params\['learning_rate'\] must be > 0"),
    ({"param_dict": {}}, "must not set param_dict"),
    ({1: 0.1}, "must be keyed by names"),
])
def test_optimizer_parameters_are_checked(pnet, params, says):
    with pytest.raises(tofu_mx.InvalidArgumentError, match=says):
        tg.Trainer(pnet, "sgd", params)


def test_adam_parameters_and_names_in_any_case(pnet):
    trainer = tg.Trainer(pnet, "Adam", {"learning_rate": np.float32(0.01), "beta1": 0.8,
                                        "clip_gradient": None})
    assert isinstance(trainer.optimizer, mx.optimizer.Adam) and trainer.optimizer.beta1 == 0.8
    with pytest.raises(tofu_mx.InvalidArgumentError, match=r"optimizer_params\['beta2'\]"):
        tg.Trainer(pnet, "adam", {"beta2": "0.9"})
    with pytest.raises(tofu_mx.InvalidArgumentError, match="'adam' takes no parameter 'momentum'"):
        tg.Trainer(pnet, "adam", {"momentum": 0.9})


def test_trainer_methods_check_their_arguments(pnet, tmp_path):
    trainer = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1})
    pnet.step(*batch(5))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="ignore_stale_grad must be True or"):
        trainer.step(4, ignore_stale_grad="yes")
    trainer.step(np.int64(4))
    for lr, says in [("0.1", "lr must be a number"), (float("nan"), "lr must be a finite"),
                     (0, "lr must be > 0")]:
        with pytest.raises(tofu_mx.InvalidArgumentError, match=says):
            trainer.set_learning_rate(lr)
    trainer.set_learning_rate(0.05)
    assert trainer.learning_rate == 0.05
    scheduled = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1, "lr_scheduler":
                                         mx.lr_scheduler.FactorScheduler(step=10)})
    with pytest.raises(tofu_mx.InvalidArgumentError, match="has an lr_scheduler"):
        scheduled.set_learning_rate(0.05)
    with pytest.raises(tofu_mx.InvalidArgumentError, match="does not exist; create it first"):
        trainer.save_states(str(tmp_path / "no" / "such" / "x.states"))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="must be a path"):
        trainer.save_states(5)


def test_block_methods_check_their_arguments(pnet, tmp_path):
    with pytest.raises(tofu_mx.InvalidArgumentError, match="it is a folder"):
        pnet.export_parameters(str(tmp_path))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="must be a path"):
        pnet.export_parameters(None)
    with pytest.raises(tofu_mx.CheckpointError, match="must be a path"):
        pnet.load_parameters(["a.params"])
    with pytest.raises(tofu_mx.InvalidArgumentError, match="kinds must be a list of variable"):
        pnet.shard_arrays("param")
    assert len(pnet.shard_arrays(["param"])) == len(pnet.shard_arrays(("param",)))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="on each of the 2 devices"):
        pnet.memory_per_device([1, 2, 3])
    with pytest.raises(tofu_mx.InvalidArgumentError, match=r"optimizer_bytes\[1\] must be at "):
        pnet.memory_per_device([0, -1])


def test_init_by_name_and_unknown_names():
    pnet = tg.partition(mlp(initialize=False), CPUS, data=(4, 6), init="zeros")
    assert all((v.asnumpy() == 0).all() for _, v, _ in pnet.shard_arrays())
    with pytest.raises(tofu_mx.InvalidArgumentError, match="init='nosuch' is no initializer"
                                                           ".*use one of bilinear"):
        tg.partition(mlp(initialize=False), CPUS, data=(4, 6), init="nosuch")


def test_trace_checks_its_arguments():
    with pytest.raises(tofu_mx.InvalidArgumentError, match="data_names must be a non-empty"):
        tg.trace(mlp(), "data", "float32")
    with pytest.raises(tofu_mx.InvalidArgumentError, match="dtype 'f33' is not a data type"):
        tg.trace(mlp(), ["data"], "f33")
    assert tg.trace(mlp(), ["data"], np.float32).list_arguments()[0] == "data"


def test_bare_states_must_be_laid_out_as_the_optimizer_keeps_them(pnet, tmp_path):
    """A pickled dict of states without the optimizer (Updater.get_states(False)) must fit
    the trainer's own optimizer: SGD without momentum keeps None, with momentum an array."""
    plain = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1})
    path = str(tmp_path / "bare.states")
    with open(path, "wb") as f:
        f.write(pickle.dumps(pickle.loads(open(_saved(plain, tmp_path), "rb").read())[0]))
    momentum = tg.Trainer(pnet, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    with pytest.raises(tofu_mx.CheckpointError, match="holds no optimizer.*laid out as NoneType"
                                                      ".*create the Trainer with the optimizer"):
        momentum.load_states(path)
    tg.Trainer(pnet, "sgd", {"learning_rate": 0.2}).load_states(path)


def _saved(trainer, tmp_path):
    path = str(tmp_path / "full.states")
    trainer.save_states(path)
    return path


def test_machine_reaches_partition_and_the_chosen_plan_runs():
    """``machine=`` chooses the plan by simulated step time, as ``tofu_mx.partition`` (whose
    tests verify the chosen plans); the block computes the plain net's losses on it."""
    net = tg.partition(mlp(), CPUS, data=(4, 6), label=(4,), loss=LOSS,
                       machine="8xV100-16GB-PCIe")
    choice = net.partitioned.machine_choice
    assert choice is not None and choice.machine == "8xV100-16GB-PCIe"
    x, y = batch()
    with mx.autograd.record():
        got = net(x, y)
    got.backward()
    assert np.allclose(got.asnumpy(), LOSS(mlp()(x), y).asnumpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(tofu_mx.InvalidArgumentError, match="no machine preset called"):
        tg.partition(mlp(), CPUS, data=(4, 6), label=(4,), loss=LOSS, machine="V100")
