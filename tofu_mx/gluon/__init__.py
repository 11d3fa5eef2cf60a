"""Gluon: partition a ``HybridBlock`` over several devices and train it.

::

    pnet = tofu_mx.gluon.partition(net, ctx=[mx.gpu(i) for i in range(8)],
                                   loss=gluon.loss.SoftmaxCrossEntropyLoss(),
                                   data=(32, 3, 224, 224), label=(32,))
    trainer = tofu_mx.gluon.Trainer(pnet, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    for x, y in batches:
        loss = pnet.step(x, y)          # forward + backward, per-sample losses
        trainer.step(x.shape[0])        # each device updates its own shards

or the plain Gluon loop (``with autograd.record(): loss = pnet(x, y)``, then
``loss.backward(); trainer.step(batch_size)``). See :func:`partition`,
:class:`PartitionedBlock` and :class:`Trainer`.
"""
from tofu_mx.gluon.block import PartitionedBlock, partition, trace
from tofu_mx.gluon.trainer import Trainer

__all__ = ["PartitionedBlock", "Trainer", "partition", "trace"]
