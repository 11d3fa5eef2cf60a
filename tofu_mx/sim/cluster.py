"""One simulated machine's step, projected to ``N`` alike machines: data parallelism across
machines, the one-machine strategy (Tofu's plan, say) inside each.

Every machine runs the one-machine step of a :class:`~tofu_mx.sim.SimResult` on its own
batch (the batch the result was simulated with: the global batch is ``N`` times it); then
each device all-reduces the summed weight gradient it owns (``SimResult.gradient_bytes``)
with the same device of the other machines, a ring over the ``N`` machines, every device of
a machine sharing that machine's ``network`` link
(:func:`~tofu_mx.sim.formulas.network_all_reduce_time`)::

    all_reduce(b) = 2 (N - 1) (latency + b / (N bandwidth))      for b bytes
    throughput    = N batch / step
    efficiency    = throughput / (N one machine's throughput) = one machine's step / step

The all-reduce overlaps the backward pass: each weight's gradient is all-reduced once it is
complete on its device (``SimResult.gradient_ready``, from the simulated schedule), the
gradients fused in that order into buckets of
:data:`~tofu_mx.sim.formulas.FUSION_BYTES` (Horovod's tensor fusion;
a bucket goes once its last gradient is ready, the last, smaller one once the last gradient
is), the buckets one after another over the network::

    step = max(one machine's step, when the last bucket's all-reduce ends)

A result without ready times (data parallelism and swapping end their step with their own
all-reduce inside the machine) all-reduces after its step: ``step = one machine's step +
all_reduce(sum_d gradient_bytes[d])``. Not modelled: the all-reduce's traffic on the
machine's own links (the gradients reach the network adapters directly, as GPUDirect RDMA
does), the optimizer's update, congestion in the network's switches, and stragglers.
"""
from __future__ import annotations

from dataclasses import dataclass

from tofu_mx import arguments
from tofu_mx.errors import InvalidArgumentError
from tofu_mx.sim.formulas import bucketed_all_reduce, network_all_reduce_time
from tofu_mx.sim.machine import Machine
from tofu_mx.sim.simulate import SimResult


@dataclass(frozen=True)
class ClusterResult:
    """One training step on ``num_machines`` machines (see the module's docstring)."""

    strategy: str               # the strategy inside each machine
    machine: str                # the machine's name
    num_machines: int
    step_time: float            # seconds: one machine's step and the all-reduce's exposed part
    throughput: float           # samples per second over all machines
    all_reduce_time: float      # seconds the network carries the all-reduce across machines
    efficiency: float           # throughput / (num_machines x one machine's throughput)
    gradient_bytes: int         # bytes each machine all-reduces (all its devices')
    overlapped: bool = False    # all-reduced during the backward pass (as gradients are ready)

    @property
    def exposed(self) -> float:
        """Seconds the step waits for the all-reduce after its own work (the all-reduce's
        part not hidden behind the backward pass)."""
        return self.step_time * (1.0 - self.efficiency)


def project_to_machines(result: SimResult, machine: Machine, num_machines: int
                        ) -> ClusterResult:
    """``result``, a step simulated on ``machine``, on ``num_machines`` such machines joined by
    their ``network`` links (see the module's docstring)."""
    if not isinstance(result, SimResult):
        raise InvalidArgumentError(f"result must be a tofu_mx.sim.SimResult, got "
                                   f"{arguments.show(result)}; e.g. "
                                   f"tofu_mx.sim.simulate(symbol, machine, 'tofu', ...)")
    if not isinstance(machine, Machine):
        raise InvalidArgumentError(f"machine must be a tofu_mx.sim.Machine, got "
                                   f"{arguments.show(machine)}; e.g. "
                                   f"tofu_mx.sim.machine('8xV100-16GB-PCIe')")
    num_machines = arguments.count(num_machines, "num_machines", example="num_machines=4")
    if result.machine != machine.name:
        raise InvalidArgumentError(
            f"the result was simulated on machine {result.machine!r}, not {machine.name!r}; "
            f"give the machine it was simulated on")
    if not result.fits:
        raise InvalidArgumentError(
            f"the {result.strategy!r} step does not fit one machine {machine.name!r} "
            f"({result.note or 'over its memory'}), so no number of machines runs it; "
            f"project a strategy that fits (e.g. 'tofu-memory')")
    if not result.gradient_bytes:
        raise InvalidArgumentError(
            f"the {result.strategy!r} result carries no gradient_bytes per device; project "
            f"a result of tofu_mx.sim.simulate(), or give gradient_bytes=(...) when building "
            f"one")
    nbytes = sum(result.gradient_bytes)
    overlapped = bool(result.gradient_ready) and num_machines > 1
    if overlapped:
        end, all_reduce = bucketed_all_reduce(
            result.gradient_ready,
            lambda nbytes: network_all_reduce_time(nbytes, machine, num_machines))
        step = max(result.step_time, end)
    else:
        all_reduce = network_all_reduce_time(nbytes, machine, num_machines)
        step = result.step_time + all_reduce
    speedup = result.step_time / step if step else 1.0   # exactly 1.0 without an all-reduce
    return ClusterResult(result.strategy, machine.name, num_machines, step,
                         num_machines * result.throughput * speedup, all_reduce, speedup,
                         nbytes, overlapped)


__all__ = ["ClusterResult", "project_to_machines"]
