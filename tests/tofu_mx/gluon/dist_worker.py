"""A worker of the distributed tests (test_distributed.py), run by ``tofu_mx.launch``, and
the model and data the tests' one-process reference shares with it.

``python dist_worker.py OUT OPTIMIZER KVSTORE``: a small net in float64, partitioned over
cpu(0) and cpu(1) for a batch of B per worker, trains STEPS steps on this worker's rows of
each global batch of B x workers, ``trainer.step(global batch)``. Each worker starts from
its own random values (its pid seeds them): the Trainer's broadcast must make them worker
0's. Worker 0 writes ``OUT/init.params`` (the values every worker starts from) and every
worker ``OUT/worker-<rank>.params`` and ``OUT/worker-<rank>.json`` (its per-sample losses).

``python dist_worker.py OUT OPTIMIZER KVSTORE 2``: the same, each worker in 2 data-parallel
groups (``replicas=2``) of cpu(0..1) and cpu(2..3), B / 2 rows each.

``python dist_worker.py OUT mismatch dist_sync``: the first worker to start partitions for
batch B, the others for B + 2; every worker must refuse to train.

``python dist_worker.py OUT float32-servers dist_sync`` (servers that keep float64 in
float32): every worker gathers ``1/3 + rank``, then builds the float64 Trainer, and writes
``OUT/worker-<rank>.json`` with what it gathered and the Trainer's error.
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon import nn

import tofu_mx.gluon as tg
from tofu_mx.errors import TofuError
from tofu_mx.gluon import distributed

B, STEPS, FEATURES, CLASSES = 4, 3, 12, 5
DEVICES = [mx.cpu(0), mx.cpu(1)]
LOSS = gluon.loss.SoftmaxCrossEntropyLoss()
OPTIMIZERS = {"sgd": {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3},
              "adam": {"learning_rate": 0.01, "wd": 1e-3}}


def make_net(seed: int) -> gluon.HybridBlock:
    mx.random.seed(seed)
    net = nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(nn.Dense(16, activation="relu"), nn.Dense(10, activation="tanh"),
                nn.Dense(CLASSES))
    net.initialize(mx.init.Xavier())
    net.cast("float64")
    net(mx.nd.zeros((1, FEATURES), dtype="float64"))
    return net


def global_batch(step: int, workers: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return (rng.standard_normal((B * workers, FEATURES)),
            rng.integers(0, CLASSES, B * workers).astype(np.float64))


def main(out: str, optimizer: str, kvstore: str, replicas: str = "1") -> None:
    mismatch = optimizer == "mismatch"
    batch = B
    if mismatch:
        try:
            os.close(os.open(os.path.join(out, "first"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            batch = B + 2
    net = make_net(seed=os.getpid())
    groups = int(replicas)
    devices = [mx.cpu(i) for i in range(len(DEVICES) * groups)]
    pnet = tg.partition(net, devices, loss=LOSS, data=(batch, FEATURES), label=(batch,),
                        replicas=groups)
    if optimizer == "float32-servers":
        collective = distributed.connect(kvstore)
        gathered = distributed.all_gather(collective, 1 / 3 + collective.rank)
        try:
            tg.Trainer(pnet, "sgd", kvstore=collective)
            error = None
        except TofuError as e:
            error = str(e)
        with open(os.path.join(out, f"worker-{collective.rank}.json"), "w") as f:
            json.dump({"gathered": gathered, "error": error}, f)
        return
    trainer = tg.Trainer(pnet, "sgd" if mismatch else optimizer,
                         OPTIMIZERS.get(optimizer, {}), kvstore=kvstore)
    rank, workers = trainer.rank, trainer.num_workers
    if rank == 0:
        pnet.export_parameters(os.path.join(out, "init.params"))
    losses = []
    for step in range(STEPS):
        x, y = global_batch(step, workers)
        rows = slice(rank * B, (rank + 1) * B)
        loss = pnet.step(mx.nd.array(x[rows], dtype="float64"),
                         mx.nd.array(y[rows], dtype="float64"))
        trainer.step(B * workers)
        losses.append(loss.asnumpy().tolist())
    pnet.export_parameters(os.path.join(out, f"worker-{rank}.params"))
    with open(os.path.join(out, f"worker-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "workers": workers, "losses": losses}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
