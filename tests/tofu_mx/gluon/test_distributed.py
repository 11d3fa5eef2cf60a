"""tofu_mx.gluon.Trainer across workers: two workers x 2 CPU devices, on batch B each, train
as one process x 2 CPU devices on batch 2B (every parameter and every loss, in float64),
with dist_sync (launched by tofu_mx.launch) and with Horovod (launched by horovodrun; skipped
where Horovod is not installed: ``make test-horovod`` installs it and runs them); workers that
partitioned differently refuse to train."""
import json
import os
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
import pytest

import tofu_mx.gluon as tg
from tofu_mx.errors import InvalidArgumentError
from tofu_mx.gluon import distributed

sys.path.insert(0, os.path.dirname(__file__))
import dist_worker as W  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")
#: float64; the two runs differ only in where the batch's gradient sum is split
RTOL, ATOL = 1e-10, 1e-12


def horovod_missing() -> str | None:
    try:
        import horovod.mxnet  # noqa: F401
    except ImportError as e:
        return (f"Horovod with MXNet support does not import ({e}); make test-horovod "
                f"installs it")
    return None


def launch(tmp_path, optimizer, kvstore="dist_sync", workers=2, timeout=110, env=None,
           replicas=1):
    if kvstore == "horovod":
        launcher = [sys.executable, "-m", "horovod.runner.launch", "-np", str(workers), "-H",
                    f"localhost:{workers}", "--gloo"]
    else:
        launcher = [sys.executable, "-m", "tofu_mx.launch", "-n", str(workers), "--"]
    start = time.monotonic()
    done = subprocess.run([*launcher, sys.executable, WORKER, str(tmp_path), optimizer, kvstore,
                           str(replicas)],
                          capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})
    return done, time.monotonic() - start


def reference(tmp_path, optimizer, workers=2):
    """One process, the same 2 devices, batch B x workers, from worker 0's initial values."""
    net = W.make_net(seed=0)
    net.load_parameters(str(tmp_path / "init.params"), ctx=mx.cpu(0))
    pnet = tg.partition(net, W.DEVICES, loss=W.LOSS, data=(W.B * workers, W.FEATURES),
                        label=(W.B * workers,))
    trainer = tg.Trainer(pnet, optimizer, W.OPTIMIZERS[optimizer])
    losses = []
    for step in range(W.STEPS):
        x, y = W.global_batch(step, workers)
        losses.append(pnet.step(mx.nd.array(x, dtype="float64"),
                                mx.nd.array(y, dtype="float64")).asnumpy())
        trainer.step(W.B * workers)
    path = tmp_path / "reference.params"
    pnet.export_parameters(str(path))
    return np.array(losses), {k: v.asnumpy() for k, v in mx.nd.load(str(path)).items()}


@pytest.mark.parametrize("kvstore,optimizer,replicas", [
    ("dist_sync", "sgd", 1), ("dist_sync", "adam", 1), ("horovod", "sgd", 1),
    ("horovod", "adam", 1), ("dist_sync", "adam", 2)])
def test_two_workers_train_as_one_process_on_their_joint_batch(optimizer, kvstore, replicas,
                                                               tmp_path):
    """(replicas=2: each worker in two groups of 2 devices, its gradients summed over its
    groups, then over the workers.)"""
    if kvstore == "horovod" and horovod_missing():
        pytest.skip(horovod_missing())
    done, seconds = launch(tmp_path, optimizer, kvstore, replicas=replicas)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert seconds < 120
    want_losses, want = reference(tmp_path, optimizer)
    runs = [json.loads((tmp_path / f"worker-{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["workers"]) for r in runs] == [(0, 2), (1, 2)]
    # each worker's losses are its rows of the joint batch's
    got_losses = np.concatenate([np.array(r["losses"]) for r in runs], axis=1)
    np.testing.assert_allclose(got_losses, want_losses, rtol=RTOL, atol=ATOL)
    start = {k: v.asnumpy() for k, v in mx.nd.load(str(tmp_path / "init.params")).items()}
    for r in range(2):
        got = {k: v.asnumpy() for k, v in
               mx.nd.load(str(tmp_path / f"worker-{r}.params")).items()}
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL, err_msg=k)
            assert not np.allclose(got[k], start[k]), f"{k} was not trained"


def test_workers_that_partitioned_differently_refuse_to_train(tmp_path):
    done, _ = launch(tmp_path, "mismatch")
    assert done.returncode != 0
    assert "did not partition alike: worker(s) [" in done.stdout, done.stdout[-3000:]
    assert not list(tmp_path.glob("worker-*"))


def test_servers_that_would_sum_float64_in_float32_are_refused_and_all_gather_stays_exact(
        tmp_path):
    """Servers handed memory filled with 0xfe (glibc's perturb byte 1, after the launcher's
    own tunables) read MXNet 1.9.1's uninitialised multi_precision_ flag as true and keep
    float64 in float32: every worker's float64 Trainer refuses to start, with the way out,
    while all_gather still returns every worker's float64 exactly."""
    done, _ = launch(tmp_path, "float32-servers", env={"GLIBC_TUNABLES": "glibc.malloc.perturb=1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for r in range(2):
        run = json.loads((tmp_path / f"worker-{r}.json").read_text())
        assert run["gathered"] == [1 / 3, 1 / 3 + 1]
        assert run["error"] is not None, "float64 through float32 servers was accepted"
        assert "would keep and sum this model's float64 parameters in float32" in run["error"]
        assert "got back 0.3333333432674408" in run["error"]
        assert "python -m tofu_mx.launch" in run["error"] and "GLIBC_TUNABLES=" in run["error"]


def test_kvstore_errors_are_clear(monkeypatch):
    for var in distributed.DMLC_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    net = W.make_net(seed=0)
    pnet = tg.partition(net, W.DEVICES, loss=W.LOSS, data=(W.B, W.FEATURES), label=(W.B,))
    for kvstore, match in [("dist_sync", "no DMLC_ROLE, DMLC_PS_ROOT_URI"),
                           ("dist_async", "is asynchronous"),
                           ("nccl2", "unknown kvstore 'nccl2'"),
                           (3, "kvstore must be None, a name")]:
        with pytest.raises(InvalidArgumentError, match=match):
            tg.Trainer(pnet, "sgd", kvstore=kvstore)
    trainer = tg.Trainer(pnet, "sgd", kvstore=mx.kv.create("local"))
    assert (trainer.rank, trainer.num_workers, trainer.kvstore) == (0, 1, None)
    assert trainer.all_gather(np.float64(2.5)) == [2.5]
    assert np.isnan(trainer.all_gather(float("nan"))[0])     # a diverging loss passes
    with pytest.raises(InvalidArgumentError, match="all_gather takes a number, got str"):
        trainer.all_gather("2.5")


def test_horovod_is_refused_clearly_where_it_does_not_import():
    if not horovod_missing():
        pytest.skip("Horovod imports here: the equivalence tests run it")
    net = W.make_net(seed=0)
    pnet = tg.partition(net, W.DEVICES, loss=W.LOSS, data=(W.B, W.FEATURES), label=(W.B,))
    with pytest.raises(InvalidArgumentError, match="needs Horovod with MXNet support"):
        tg.Trainer(pnet, "sgd", kvstore="horovod")


class _OneWorker(distributed.Collective):
    """A run of one worker (sums and broadcasts change nothing), to test the Trainer's use of
    an engine without starting a distributed run."""

    name, rank, num_workers = "one-worker", 0, 1

    def __init__(self):
        self.calls = []

    def broadcast(self, keys, arrays):
        self.calls.append(("broadcast", tuple(keys)))

    def all_reduce(self, keys, arrays):
        self.calls.append(("all_reduce", tuple(keys)))


def test_an_engine_serves_one_trainer_with_its_own_keys():
    net = W.make_net(seed=0)
    pnet = tg.partition(net, W.DEVICES, loss=W.LOSS, data=(W.B, W.FEATURES), label=(W.B,))
    engine = _OneWorker()
    assert distributed.connect(engine) is engine
    trainer = tg.Trainer(pnet, "sgd", kvstore=engine)
    shards = len(pnet.shard_arrays(("param",)))
    keys = tuple(range(distributed.SHARD_KEYS, distributed.SHARD_KEYS + shards))
    assert engine.calls == [("broadcast", (distributed.FINGERPRINT_KEY,)),
                            ("all_reduce", (distributed.GATHER_KEY,)),
                            ("broadcast", keys)]
    x, y = W.global_batch(0, 1)
    pnet.step(mx.nd.array(x, dtype="float64"), mx.nd.array(y, dtype="float64"))
    trainer.step(W.B)
    assert engine.calls[-1] == ("all_reduce", keys)
    with pytest.raises(InvalidArgumentError, match="serves another tofu_mx Trainer"):
        tg.Trainer(pnet, "sgd", kvstore=engine)


def test_the_trainer_sends_gradients_without_waiting_for_the_backward_pass(monkeypatch):
    """After pnet.step, trainer.step queues the sums across workers at once (MXNet's engine
    runs each once the backward pass has made its gradient); after an autograd forward whose
    backward pass may not have reached the executor, it waits first."""
    net = W.make_net(seed=0)
    pnet = tg.partition(net, W.DEVICES, loss=W.LOSS, data=(W.B, W.FEATURES), label=(W.B,))
    engine = _OneWorker()
    trainer = tg.Trainer(pnet, "sgd", kvstore=engine)
    x, y = (mx.nd.array(a, dtype="float64") for a in W.global_batch(0, 1))
    waited = []
    real = mx.nd.waitall
    monkeypatch.setattr(mx.nd, "waitall", lambda: (waited.append(len(engine.calls)), real()))
    pnet.step(x, y)
    waited.clear()
    trainer.step(W.B)
    assert engine.calls[-1][0] == "all_reduce" and waited == []
    with mx.autograd.record():
        pnet(x, y)
    waited.clear()
    with pytest.raises(InvalidArgumentError, match="gradients have not been computed"):
        trainer.step(W.B)       # recorded, no backward: it waits, then says so
    assert waited == [len(engine.calls)]
