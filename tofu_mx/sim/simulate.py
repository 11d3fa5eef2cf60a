"""``simulate()``: one training step of a Symbol on a modelled machine, by strategy.

- ``"ideal"``: one device with unlimited memory (it always fits), every operator on it;
- ``"tofu"``: the default plan over the machine's devices; the graph simulated is the
  partitioned Symbol ``partition()`` really produces (its shard graph, with every
  conversion), not the plan's byte count;
- ``"tofu-memory"``: the plan moving the fewest bytes that fits the machine's memory
  (``partition(memory_budget=machine.memory)``); when none fits, the result does not fit,
  with the smallest footprint found on every device;
- ``"data_parallel"``: every device runs the whole graph on its share of the batch (the
  first axis of every data and label input, split as evenly as it goes), then the
  gradients are summed by a ring all-reduce over all devices, after the backward pass (not
  overlapped with it). It does not fit when the whole model and a share of the batch do
  not fit one device.

Per device, ``peak_memory`` is what :meth:`PartitionedSymbol.memory_per_device` counts
(weights, gradients, aux states, inputs, the activations the backward pass keeps: what a
device holds at the end of the forward pass); temporary buffers and optimizer state are not
counted yet. The step time is :func:`tofu_mx.sim.schedule.finish_times` of the step's tasks.
Not built yet: ``"swap"`` and ``"placement"``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import mxnet as mx

from nnvm_passes.ir import Graph
from nnvm_passes.placement import placed_group
from tofu_mx.errors import InvalidArgumentError, NoFeasiblePlanError
from tofu_mx.sim.formulas import ring_all_reduce_time
from tofu_mx.sim.machine import Machine
from tofu_mx.sim.schedule import finish_times, step_tasks

#: the strategies :func:`simulate` knows
STRATEGIES = ("ideal", "tofu", "tofu-memory", "data_parallel")


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
    if strategy == "data_parallel":
        return _data_parallel(symbol, machine, options, dtypes, shapes)
    k = 1 if strategy == "ideal" else machine.num_devices
    budget = machine.memory if strategy == "tofu-memory" else None
    try:
        ptd = partition(symbol, [mx.cpu(i) for i in range(k)], options=options, dtypes=dtypes,
                        memory_budget=budget, **shapes)
    except NoFeasiblePlanError as e:
        return SimResult(strategy, machine.name, False, math.inf, 0.0, (e.footprint,) * k)
    graph = ptd.shard_graph
    index = {group: d for d, group in enumerate(ptd.group2ctx)}
    step = _step_time(graph, lambda i: index.get(placed_group(graph, i), 0), machine)
    peak = tuple(m.total for m in ptd.memory_per_device())
    return SimResult(strategy, machine.name, strategy == "ideal" or max(peak) <= machine.memory,
                     step, _batch(ptd.graph) / step if step else math.inf, peak)


def _data_parallel(symbol, machine: Machine, options, dtypes, shapes) -> SimResult:
    from tofu_mx.runtime.partitioned import partition
    from tofu_mx.tdl.annotate import import_graph

    k = machine.num_devices
    whole = import_graph(symbol, dtypes=dtypes, **shapes)
    split = {n.name for n in whole.variables() if n.kind in ("data", "label")}
    share = {name: (-(-shape[0] // k),) + tuple(shape[1:]) if name in split else shape
             for name, shape in shapes.items()}
    one = partition(symbol, [mx.cpu(0)], options=options, dtypes=dtypes, **share)
    params = sum(n.outputs[0].nbytes for n in one.graph.variables("param"))
    step = _step_time(one.shard_graph, lambda i: 0, machine) + \
        ring_all_reduce_time(params, machine, range(k))
    peak = one.memory_per_device()[0].total
    return SimResult("data_parallel", machine.name, peak <= machine.memory, step,
                     _batch(whole) / step if step else math.inf, (peak,) * k)


def _step_time(graph: Graph, device_of, machine: Machine) -> float:
    return max(finish_times(step_tasks(graph, device_of, machine)), default=0.0)


def _batch(graph: Graph) -> int:
    """Samples per step: the first axis of the first data input (1 without one)."""
    data = graph.variables("data")
    return data[0].outputs[0].shape[0] if data and data[0].outputs[0].shape else 1


__all__ = ["STRATEGIES", "SimResult", "simulate"]
