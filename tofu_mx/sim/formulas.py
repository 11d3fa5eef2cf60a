"""The simulator's cost formulas: small named functions of a :class:`~tofu_mx.sim.Machine`,
each a closed form tested on hand-computed cases.

- :func:`compute_time`: one operator on one device, by the roofline: its launch, then the
  longer of its FLOPs at the rate the device reaches for it and its bytes at the bandwidth
  it reaches (the device's peak and memory bandwidth, or less where the machine measured
  less for that operator); or their sum where the machine's kernels do not overlap the two
  (``Machine.memory_overlap``: MXNet's CPU kernels).
- :func:`transfer_time`: bytes from one device to another (or to host memory) over the link
  the transfer crosses: the link's latency, then the bytes at its bandwidth.
- :func:`swap_time`: bytes every device moves to and from host memory at once, where
  ``Machine.host_shared`` devices share each host link, so one link carries all of theirs.
- :func:`ring_all_reduce_time`: the ring all-reduce of a buffer over a set of devices (what
  data parallelism pays for its gradients): ``2 (n - 1)`` steps, each moving ``1/n`` of the
  buffer over every link of the ring at once, so each step takes as long as its slowest link.
- :func:`network_all_reduce_time`: the ring all-reduce of every device's gradient with the
  same device of ``N`` machines, over the machines' ``network`` links: ``2 (N - 1)`` steps,
  each moving ``1/N`` of every device's buffer through its machine's one network link, so
  each step costs the link's latency once and ``1/N`` of the machine's bytes at its bandwidth:
  ``2 (N - 1) (latency + bytes / (N bandwidth))``.
- :func:`bucketed_all_reduce`: gradients all-reduced as the backward pass completes them,
  fused in that order into buckets of :data:`FUSION_BYTES` (Horovod's tensor fusion), the
  buckets one after another: when the last one ends.
"""
from __future__ import annotations

from typing import Callable, Sequence

from tofu_mx import arguments
from tofu_mx.errors import InvalidArgumentError
from tofu_mx.sim.machine import Link, Machine

#: the bytes of gradients all-reduced together (Horovod's default fusion threshold, 64 MiB)
FUSION_BYTES = 64 * 2**20


def compute_time(flops: float, nbytes: float, machine: Machine, op: str | None = None) -> float:
    """Seconds one operator of ``flops`` floating-point operations that reads and writes
    ``nbytes`` of device memory takes on one of ``machine``'s devices; ``op``: the MXNet
    operator, for the FLOP/s and bandwidth it reaches there (:meth:`Machine.rate`,
    :meth:`Machine.bandwidth`)."""
    flops = arguments.real(flops, "flops", minimum=0)
    nbytes = arguments.real(nbytes, "nbytes", minimum=0)
    arithmetic, traffic = flops / machine.rate(op), nbytes / machine.bandwidth(op)
    return machine.launch + (max(arithmetic, traffic) if machine.memory_overlap
                             else arithmetic + traffic)


def transfer_time(nbytes: float, link: Link) -> float:
    """Seconds ``nbytes`` take over ``link`` (nothing for no bytes: no transfer is made)."""
    nbytes = arguments.real(nbytes, "nbytes", minimum=0)
    return 0.0 if nbytes == 0 else link.latency + nbytes / link.bandwidth


def swap_time(nbytes: float, machine: Machine) -> float:
    """Seconds every device of ``machine`` takes to move ``nbytes`` (each) over the host links
    at once."""
    nbytes = arguments.real(nbytes, "nbytes", minimum=0)
    return transfer_time(machine.host_shared * nbytes, machine.host)


def ring_all_reduce_time(nbytes: float, machine: Machine, devices: Sequence[int]) -> float:
    """Seconds a ring all-reduce of an ``nbytes`` buffer over ``devices`` (in ring order)
    takes on ``machine``."""
    nbytes = arguments.real(nbytes, "nbytes", minimum=0)
    devices = list(devices)
    if len(set(devices)) != len(devices):
        raise InvalidArgumentError(f"the ring {devices} visits a device twice; give each "
                                   f"device once")
    n = len(devices)
    if n < 2 or nbytes == 0:
        return 0.0
    slowest = max((machine.link(a, b) for a, b in zip(devices, devices[1:] + devices[:1])),
                  key=lambda link: transfer_time(nbytes / n, link))
    return 2 * (n - 1) * transfer_time(nbytes / n, slowest)


def network_all_reduce_time(nbytes: float, machine: Machine, num_machines: int) -> float:
    """Seconds ``num_machines`` machines like ``machine`` take to all-reduce, over their
    ``network`` links, ``nbytes`` per machine (all its devices' buffers together, each ring
    of same-numbered devices running at once)."""
    nbytes = arguments.real(nbytes, "nbytes", minimum=0)
    n = arguments.count(num_machines, "num_machines", example="num_machines=4")
    if machine.network is None:
        raise InvalidArgumentError(
            f"Machine {machine.name!r} has no network link to other machines; give it one, "
            f"e.g. dataclasses.replace(machine, network=tofu_mx.sim.Link(10e9, 5e-6)) for one "
            f"100 Gb/s InfiniBand EDR adapter")
    if n < 2:
        return 0.0
    return 2 * (n - 1) * transfer_time(nbytes / n, machine.network)


def bucketed_all_reduce(ready: Sequence[tuple[float, int]],
                        all_reduce: Callable[[int], float]) -> tuple[float, float]:
    """When the last bucket's all-reduce ends, and the seconds the buckets take in all, for
    gradients ``ready`` as ``(seconds, bytes)`` in the order they are complete: fused in that
    order into buckets of :data:`FUSION_BYTES` (a bucket goes once its last gradient is
    ready, the last, smaller one once the last gradient is), the buckets one after another,
    each taking ``all_reduce(bytes)`` seconds."""
    free = busy = 0.0
    bucket, last = 0, 0.0

    def send(nbytes: int, at: float) -> None:
        nonlocal free, busy
        seconds = all_reduce(nbytes)
        free, busy = max(free, at) + seconds, busy + seconds

    for at, nbytes in ready:
        bucket, last = bucket + nbytes, at
        if bucket >= FUSION_BYTES:
            send(bucket, last)
            bucket = 0
    if bucket:
        send(bucket, last)
    return free, busy


__all__ = ["FUSION_BYTES", "bucketed_all_reduce", "compute_time", "network_all_reduce_time",
           "ring_all_reduce_time", "swap_time", "transfer_time"]
