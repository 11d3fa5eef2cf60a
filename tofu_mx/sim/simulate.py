"""``simulate()``: one training step of a Symbol on a modelled machine, by strategy.

Built so far, two strategies:

- ``"ideal"``: one device with unlimited memory (it always fits), every operator on it;
- ``"tofu"``: the default plan over the machine's devices; the graph simulated is the
  partitioned Symbol ``partition()`` really produces (its shard graph, with every
  conversion), not the plan's byte count.

Per device, ``peak_memory`` is what :meth:`PartitionedSymbol.memory_per_device` counts
(weights, gradients, aux states, inputs, the activations the backward pass keeps: what a
device holds at the end of the forward pass); temporary buffers and optimizer state are not
counted yet. The step time is :func:`tofu_mx.sim.schedule.finish_times` of the step's tasks.
Not built yet: ``"data_parallel"``, ``"swap"``, ``"placement"``, ``"tofu-memory"``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import mxnet as mx

from nnvm_passes.ir import Graph
from tofu_mx.errors import InvalidArgumentError
from tofu_mx.sim.machine import Machine
from tofu_mx.sim.schedule import finish_times, step_tasks

#: the strategies :func:`simulate` knows
STRATEGIES = ("ideal", "tofu")


@dataclass(frozen=True)
class SimResult:
    """One simulated training step."""

    strategy: str
    machine: str
    fits: bool                      # every device's peak memory within the machine's
    step_time: float                # seconds
    throughput: float               # samples per second
    peak_memory: tuple[int, ...]    # bytes per device


def simulate(symbol: mx.sym.Symbol, machine: Machine, strategy: str = "tofu", *,
             options=None, dtypes: Mapping[str, Any] | None = None, **shapes) -> SimResult:
    """One training step of ``symbol`` (with input ``shapes`` as for ``partition``) on
    ``machine`` by ``strategy`` (see the module's docstring)."""
    from tofu_mx.runtime.partitioned import partition

    if not isinstance(machine, Machine):
        raise InvalidArgumentError(f"machine must be a tofu_mx.sim.Machine, got "
                                   f"{type(machine).__name__}; e.g. "
                                   f"tofu_mx.sim.machine('8xV100-16GB-PCIe')")
    if strategy not in STRATEGIES:
        raise InvalidArgumentError(f"no strategy {strategy!r}; simulate() knows "
                                   f"{', '.join(STRATEGIES)}")
    k = 1 if strategy == "ideal" else machine.num_devices
    ptd = partition(symbol, [mx.cpu(i) for i in range(k)], options=options, dtypes=dtypes,
                    **shapes)
    graph = ptd.shard_graph
    index = {group: d for d, group in enumerate(ptd.group2ctx)}
    tasks = step_tasks(graph, lambda i: index.get(_group(graph, i), 0), machine)
    step = max(finish_times(tasks), default=0.0)
    peak = tuple(m.total for m in ptd.memory_per_device())
    batch = ptd.graph.variables("data")[0].outputs[0].shape[0] if \
        ptd.graph.variables("data") else 1
    return SimResult(strategy, machine.name,
                     strategy == "ideal" or max(peak) <= machine.memory, step,
                     batch / step if step else float("inf"), peak)


def _group(graph: Graph, i: int) -> str | None:
    """An operator's ctx group; an untagged one runs where its first input is (as MXNet
    places it)."""
    node = graph.nodes[i]
    while node.ctx_group is None and not node.is_variable and node.inputs:
        node = graph.nodes[node.inputs[0].node]
    return node.ctx_group


__all__ = ["STRATEGIES", "SimResult", "simulate"]
