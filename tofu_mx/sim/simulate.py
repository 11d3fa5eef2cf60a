"""``simulate()``: one training step of a Symbol on a modelled machine, by strategy.

- ``"ideal"``: one device with unlimited memory (it always fits), every operator on it;
- ``"data_parallel"``: every device runs the whole graph on its share of the batch (the
  first axis of every data and label input, split as evenly as it goes), and the
  gradients are summed by a ring all-reduce over all devices as the backward pass
  completes them, overlapping the rest of it (MXNet's engine runs a kvstore's push once
  its gradient is written, and Horovod does the same), in buckets
  (:func:`~tofu_mx.sim.formulas.bucketed_all_reduce`): the step ends when the replica's
  step and the last bucket have. Where the devices share one processor
  (``Machine.shared_compute``: ``cpu(i)``), the replicas take turns on it, and the
  all-reduce (copies and sums on that processor too) follows them. It does not fit when the
  whole model and a share of the batch do not fit one device;
- ``"swap"``: data parallelism, each device moving to host memory and back what exceeds its
  memory, in the spirit of SwapAdvisor: every step, each device sends out and fetches back
  its peak's excess over its memory, ``host_shared`` devices sharing a host link
  (:func:`~tofu_mx.sim.formulas.swap_time`). The swapping is taken to overlap the compute
  perfectly (the replica's step, and with it when each gradient is complete, stretched to
  the longer of the two), then the all-reduce as for data parallelism: an upper bound of
  its speed. It does not fit when one operator's working set (its inputs and outputs, and
  their gradients), or one weight's update (the weight, its gradient and its optimizer
  state), does not fit a device;
- ``"placement"``: every operator whole on one device, placed by
  :func:`~tofu_mx.sim.placement.place_operators` (critical-path list scheduling under the
  devices' memory); the cap is lowered (by 5% at least) and the placement made again (up
  to ``3 RETRIES`` times) while the placed graph's peak exceeds the memory;
- ``"tofu"``: the default plan over the machine's devices; the graph simulated is the
  partitioned Symbol ``partition()`` really produces (its shard graph, with every
  conversion), not the plan's byte count;
- ``"tofu-machine"``: the plan ``partition(machine=...)`` chooses by this simulator's step
  time (the fastest of its candidates that fits, each plan routed as it is and through the
  machine's device groups; the note names it);
- ``"hybrid"``: data parallelism across the machine's device groups (PCIe switches, NVLink
  quads), Tofu inside each: every group runs the plan ``partition(machine=...)`` chooses
  for one group's devices (``"tofu-machine"`` on a machine of ``group_size`` devices) on
  its share of the batch, its outputs returned as their pieces, and each device's summed
  gradient shard is all-reduced with the same device of the other groups (one ring per
  device of a group, all at once, over the ``bridge``, sharing it where ``bridge_shared``),
  in buckets as the backward pass completes them, as for data parallelism; each device
  also holds the buffer it receives its peers' shards in (counted as its largest weight).
  What it runs: ``tofu_mx.gluon.partition(..., replicas=G)`` (each shard's copies summed on
  one group's device and copied back, as its gradient is written: the same bytes over each
  link as the ring for two groups).
  Not run (``fits`` False, says why) where the machine is one group;
- ``"tofu-memory"``: the plan moving the fewest bytes that fits the machine's memory
  (``partition(memory_budget=...)``); as the plan counts what a device holds at the end of
  the forward pass and the simulation its peak, the budget is lowered (up to ``RETRIES``
  times) while the peak exceeds the memory. When no plan fits, the result does not fit,
  with the smallest footprint found on every device.

Per device, ``peak_memory`` is :func:`tofu_mx.sim.memory.peak_memory` of the graph run:
weights, gradients, the optimizer's state (``options.optimizer_state`` bytes per weight
byte), aux states, inputs, and the operators' outputs by liveness over the step. The step
time is :func:`tofu_mx.sim.schedule.finish_times` of the step's tasks. ``gradient_bytes``,
per device, is the summed weight gradient the device owns at the end of the step, which
:func:`tofu_mx.sim.cluster.project_to_machines` all-reduces with the other machines: its
weights' gradients where weights are placed (``"ideal"``, ``"placement"``, the tofu plans:
:func:`tofu_mx.sim.memory.gradients_per_device`), and an even ``1/k`` of the whole where
every device holds every weight (``"data_parallel"``, ``"swap"``: the part the ring
all-reduce's reduce-scatter leaves each device, before its all-gather). ``gradient_ready``
says when, in the step's schedule, each weight's gradient is complete on its device (what
``project_to_machines`` overlaps with the rest of the backward pass); empty for
``"data_parallel"`` and ``"swap"``, whose steps end with their own all-reduce.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import mxnet as mx

from nnvm_passes.ir import Graph
from tofu_mx import arguments
from tofu_mx.errors import InvalidArgumentError, NoFeasiblePlanError
from tofu_mx.search.plan import SearchOptions
from tofu_mx.sim.formulas import (bucketed_all_reduce, ring_all_reduce_time, swap_time,
                                  transfer_time)
from tofu_mx.sim.machine import Machine
from tofu_mx.sim.memory import gradients_per_device, largest_weight_per_device, peak_memory
from tofu_mx.sim.placement import place_operators
from tofu_mx.sim.schedule import finish_times, gradients_ready, step_tasks
from tofu_mx.sim.work import operator_bytes
from tofu_mx.summary import format_bytes
from tofu_mx.tdl.annotate import import_graph

#: the strategies :func:`simulate` knows
STRATEGIES = ("ideal", "data_parallel", "swap", "placement", "tofu", "tofu-memory",
              "tofu-machine", "hybrid")
#: how many times ``"placement"`` and ``"tofu-memory"`` lower their cap to fit the peak
RETRIES = 3


@dataclass(frozen=True)
class SimResult:
    """One simulated training step."""

    strategy: str
    machine: str
    fits: bool                      # every device's peak memory within the machine's
    step_time: float                # seconds (inf when it does not fit at all)
    throughput: float               # samples per second
    peak_memory: tuple[int, ...]    # bytes per device
    note: str = ""                  # for display: why it does not fit, what it swaps
    busiest_device: float = 0.0     # seconds the busiest device computes in the step
    busiest_link: float = 0.0       # seconds the busiest link (one direction) carries
    gradient_bytes: tuple[int, ...] = ()   # summed weight gradient each device owns (above)
    #: when each weight's gradient is complete on its device in the step, with its bytes
    #: (``(seconds, bytes)``, in that order; empty where a whole-step all-reduce ends the
    #: step: data parallelism, swapping): :func:`~tofu_mx.sim.project_to_machines` all-reduces
    #: each across machines from then on
    gradient_ready: tuple[tuple[float, int], ...] = ()


def simulate(symbol: mx.sym.Symbol, machine: Machine, strategy: str = "tofu", *,
             options: SearchOptions | None = None, dtypes: Mapping[str, Any] | None = None,
             **shapes) -> SimResult:
    """One training step of ``symbol`` (with input ``shapes`` as for ``partition``) on
    ``machine`` by ``strategy`` (see the module's docstring)."""
    _check_machine(machine)
    if strategy not in STRATEGIES:
        raise InvalidArgumentError(f"no strategy {strategy!r}; simulate() knows "
                                   f"{', '.join(STRATEGIES)}")
    options = SearchOptions.of(options)
    run = {"ideal": _ideal, "data_parallel": _data_parallel, "swap": _swap,
           "placement": _placement, "tofu": _tofu, "tofu-memory": _tofu,
           "tofu-machine": _tofu, "hybrid": _hybrid}[strategy]
    return run(symbol, machine, strategy, options, dtypes, shapes)


def _check_machine(machine) -> None:
    if not isinstance(machine, Machine):
        raise InvalidArgumentError(f"machine must be a tofu_mx.sim.Machine, got "
                                   f"{type(machine).__name__}; e.g. "
                                   f"tofu_mx.sim.machine('8xV100-16GB-PCIe')")


def _first_devices(machine, num_devices) -> int:
    """``num_devices``, checked: a count no larger than the machine's."""
    _check_machine(machine)
    k = arguments.count(num_devices, "num_devices", example="num_devices=8")
    if k > machine.num_devices:
        raise InvalidArgumentError(f"machine {machine.name!r} has {machine.num_devices} "
                                   f"device(s), fewer than num_devices={k}")
    return k


def _ideal(symbol, machine: Machine, strategy, options, dtypes, shapes) -> SimResult:
    graph = import_graph(symbol, dtypes=dtypes, **shapes)
    peak = peak_memory(graph, lambda i: 0, 1, options.optimizer_state)
    return _result(strategy, machine, graph, _step_time(graph, lambda i: 0, machine), peak,
                   gradients_per_device(graph, lambda i: 0, 1), fits=True)


def _data_parallel(symbol, machine: Machine, strategy, options, dtypes, shapes,
                   k: int | None = None) -> SimResult:
    k = machine.num_devices if k is None else k
    whole, one, step, peak = _replica(symbol, machine, options, dtypes, shapes, k)
    params = _replica_gradient_bytes(one)
    return _result(strategy, machine, whole, _all_reduced(step, params, machine, k),
                   (peak,) * k, _reduce_scattered(params, k))


def data_parallel_step(symbol: mx.sym.Symbol, machine: Machine, num_devices: int, *,
                       options: SearchOptions | None = None,
                       dtypes: Mapping[str, Any] | None = None, **shapes) -> SimResult:
    """``simulate(symbol, machine, "data_parallel", ...)`` on the machine's first
    ``num_devices`` devices (the batch split over them, the ring all-reduce through them):
    what :func:`tofu_mx.partition` with ``machine=`` weighs its plans against."""
    k = _first_devices(machine, num_devices)
    return _data_parallel(symbol, machine, "data_parallel", SearchOptions.of(options), dtypes,
                          shapes, k)


def _swap(symbol, machine: Machine, strategy, options, dtypes, shapes) -> SimResult:
    k = machine.num_devices
    whole, one, step, peak = _replica(symbol, machine, options, dtypes, shapes, k)
    excess = max(0, peak - machine.memory)
    working = _working_set(one, options.optimizer_state)
    if working > machine.memory:
        return SimResult(strategy, machine.name, False, math.inf, 0.0, (working,) * k,
                         f"one operator's or one weight's update's working set takes "
                         f"{format_bytes(working)} of {format_bytes(machine.memory)}")
    swapping = swap_time(2 * excess, machine)
    params = _replica_gradient_bytes(one)
    stretch = max(step.seconds, swapping) / step.seconds if step.seconds else 1.0
    step = _all_reduced(_Step(step.seconds * stretch, step.busiest_device,
                              max(step.busiest_link, swapping),
                              tuple((t * stretch, b) for t, b in step.gradient_ready)),
                        params, machine, k)
    return _result(strategy, machine, whole, step, (min(peak, machine.memory),) * k,
                   _reduce_scattered(params, k),
                   note=f"swaps {format_bytes(excess)} out and in per device and step"
                   if excess else "swaps nothing")


def _placement(symbol, machine: Machine, strategy, options, dtypes, shapes) -> SimResult:
    graph = import_graph(symbol, dtypes=dtypes, **shapes)
    k, cap = machine.num_devices, float(machine.memory)
    for _ in range(3 * RETRIES + 1):          # a placement is quick to make again
        devices = place_operators(graph, machine, cap, options.optimizer_state)
        if devices is None:
            return SimResult(strategy, machine.name, False, math.inf, 0.0, (0,) * k,
                             f"no placement keeps every device within "
                             f"{format_bytes(int(cap))} at the end of the forward pass")
        peak = peak_memory(graph, devices.__getitem__, k, options.optimizer_state)
        if max(peak) <= machine.memory:
            break
        cap *= min(0.95, machine.memory / max(peak))
    step = _step_time(graph, devices.__getitem__, machine)
    return _result(strategy, machine, graph, step, peak,
                   gradients_per_device(graph, devices.__getitem__, k),
                   note=f"{len(set(devices))} of {k} devices run operators")


def _tofu(symbol, machine: Machine, strategy, options, dtypes, shapes, groups: int = 1
          ) -> SimResult:
    """``strategy`` (a Tofu one) on ``machine``; ``groups`` > 1: as one of that many groups
    of a hybrid runs it (:func:`tofu_mx.gluon.partition` with ``replicas=``): outputs
    returned as their pieces, and each device also holding the buffer the Trainer receives
    its peers' gradient shards in (at most its largest weight's bytes)."""
    from tofu_mx.runtime.partitioned import choose_by_step_time, partition

    k = machine.num_devices
    budget = machine.memory if strategy == "tofu-memory" else None
    ctx = [mx.cpu(i) for i in range(k)]
    for _ in range(RETRIES + 1):
        try:
            if strategy == "tofu-machine":  # simulate() weighs the other strategies itself
                ptd = choose_by_step_time(symbol, ctx, machine, options=options,
                                          dtypes=dtypes, compare=False,
                                          join_outputs=groups == 1, **shapes)
            else:
                ptd = partition(symbol, ctx, options=options, dtypes=dtypes,
                                memory_budget=budget, join_outputs=groups == 1, **shapes)
        except NoFeasiblePlanError as e:
            return SimResult(strategy, machine.name, False, math.inf, 0.0, (e.footprint,) * k,
                             "no plan fits the memory")
        graph, device_of = _shard_devices(ptd)
        peak = peak_memory(graph, device_of, k, options.optimizer_state)
        if groups > 1:
            peak = tuple(p + b for p, b in zip(peak, largest_weight_per_device(
                graph, device_of, k)))
        if budget is None or max(peak) <= machine.memory:
            break
        budget = int(budget * machine.memory / max(peak))
    note = ptd.machine_choice.chosen.label if ptd.machine_choice is not None else ""
    return _result(strategy, machine, ptd.graph, _step_time(graph, device_of, machine), peak,
                   gradients_per_device(graph, device_of, k), note=note)


def _hybrid(symbol, machine: Machine, strategy, options, dtypes, shapes) -> SimResult:
    return _hybrid_on(symbol, machine, machine.num_devices, strategy, options, dtypes, shapes)


def hybrid_step(symbol: mx.sym.Symbol, machine: Machine, num_devices: int, *,
                options: SearchOptions | None = None,
                dtypes: Mapping[str, Any] | None = None, **shapes) -> SimResult:
    """``simulate(symbol, machine, "hybrid", ...)`` on the machine's first ``num_devices``
    devices (whole groups of ``machine.group_size``): data parallelism across their groups,
    Tofu inside each, as :func:`tofu_mx.partition` with ``machine=`` weighs it."""
    k = _first_devices(machine, num_devices)
    return _hybrid_on(symbol, machine, k, "hybrid", SearchOptions.of(options), dtypes, shapes)


def _hybrid_on(symbol, machine: Machine, k: int, strategy, options, dtypes, shapes
               ) -> SimResult:
    size = machine.group_size
    groups = k // size if k % size == 0 else 1
    whole = import_graph(symbol, dtypes=dtypes, **shapes)
    if groups < 2:
        return SimResult(strategy, machine.name, False, math.inf, 0.0, (0,) * k,
                         f"{k} device(s) of {machine.name!r} are not two or more whole "
                         f"groups of {size}: nothing to be data parallel across")
    batch = [v.outputs[0].shape for v in _batched(whole)]
    if not batch or any(not shape or shape[0] < groups for shape in batch):
        return SimResult(strategy, machine.name, False, math.inf, 0.0, (0,) * k,
                         f"no batch of {groups} or more samples to split over {groups} groups")
    share = _batch_share(whole, shapes, groups)
    group = dataclasses.replace(machine, name=f"{machine.name}, one group of {size}",
                                num_devices=size, host_shared=math.gcd(machine.host_shared, size))
    inner = _tofu(symbol, group, "tofu-machine", options, dtypes, share, groups)
    if not inner.fits:
        return dataclasses.replace(inner, strategy=strategy, machine=machine.name,
                                   peak_memory=inner.peak_memory * groups)
    # one ring per device of a group through the same device of every other group; where
    # the rings share one bridge each way, it carries all of them
    gradients = sum(inner.gradient_bytes)
    fraction = 1.0 if machine.bridge_shared else max(inner.gradient_bytes) / max(gradients, 1)

    def across(nbytes: float) -> float:
        return 2 * (groups - 1) * transfer_time(nbytes * fraction / groups, machine.bridge)
    end, busy = bucketed_all_reduce(inner.gradient_ready, across)
    step = _Step(max(inner.step_time, end), inner.busiest_device, inner.busiest_link + busy)
    return _result(strategy, machine, whole, step, inner.peak_memory * groups,
                   inner.gradient_bytes * groups,
                   note=f"{groups} groups of {size} devices, data parallel; in each: "
                        f"{inner.note}")


def partitioned_step(ptd, machine: Machine, optimizer_state: float = 0.0
                     ) -> tuple[float, tuple[int, ...]]:
    """Seconds one training step of the partitioned symbol ``ptd`` takes on ``machine`` (its
    shard graph, every conversion included; device ``i`` of ``ptd`` on the machine's device
    ``i``), and each device's peak memory (``optimizer_state`` bytes per weight byte)."""
    graph, device_of = _shard_devices(ptd)
    return (_step_time(graph, device_of, machine).seconds,
            peak_memory(graph, device_of, len(ptd.group2ctx), optimizer_state))


def _shard_devices(ptd) -> tuple[Graph, Callable[[int], int]]:
    """The partitioned symbol's shard graph, and the device each of its nodes runs on."""
    return ptd.shard_graph, ptd.node_devices().__getitem__


def _replica(symbol, machine: Machine, options, dtypes, shapes, k: int):
    """The whole graph, one device's replica on its share of the batch (over the machine's
    first ``k`` devices), the replica's step (without the all-reduce) and its peak."""
    whole = import_graph(symbol, dtypes=dtypes, **shapes)
    one = import_graph(symbol, dtypes=dtypes, **_batch_share(whole, shapes, k))
    peak = peak_memory(one, lambda i: 0, 1, options.optimizer_state)[0]
    step = _step_time(one, lambda i: 0, machine)
    if machine.shared_compute:      # the k replicas take turns on the one processor
        step = _Step(step.seconds * k, step.busiest_device * k, step.busiest_link)
    return whole, one, step, peak


def _batched(whole: Graph) -> list:
    """The graph's data and label inputs: what a replica takes a share of."""
    return [n for n in whole.variables() if n.kind in ("data", "label")]


def _batch_share(whole: Graph, shapes, parts: int) -> dict:
    """The input ``shapes`` of one of ``parts`` shares of the batch: the first axis of every
    data and label input given, divided rounding up (the others as given)."""
    split = {n.name for n in _batched(whole)}
    return {name: (-(-shape[0] // parts),) + tuple(shape[1:]) if name in split else shape
            for name, shape in shapes.items()}


def _working_set(graph: Graph, optimizer_state: float) -> int:
    """What must be on a device at once however much is swapped: the largest operator's
    inputs and outputs with their gradients, or the largest weight with its gradient and
    optimizer state (its update)."""
    ops = (2 * operator_bytes(graph, i) for i, n in enumerate(graph.nodes) if not n.is_variable)
    updates = (int(n.outputs[0].nbytes * (2 + optimizer_state)) for n in graph.variables("param"))
    return max(*ops, *updates, 0)


def _replica_gradient_bytes(graph: Graph) -> int:
    """Bytes of the weight gradients a replica (the whole graph on one device) holds."""
    return gradients_per_device(graph, lambda i: 0, 1)[0]


def _all_reduced(step: _Step, params: int, machine: Machine, k: int) -> _Step:
    """A replica's ``step`` with the ring all-reduce of its ``params`` gradient bytes over
    the machine's first ``k`` devices: in buckets as its backward pass completes them
    (``step.gradient_ready``), or after the step where the devices share one processor.
    The result has no ``gradient_ready``: every gradient is summed at its end."""
    def ring(nbytes: float) -> float:
        return ring_all_reduce_time(nbytes, machine, range(k))
    if machine.shared_compute or not step.gradient_ready:
        return step.then_all_reduce(ring(params))
    end, busy = bucketed_all_reduce(step.gradient_ready, ring)
    return _Step(max(step.seconds, end), step.busiest_device, step.busiest_link + busy)


def _reduce_scattered(params: int, k: int) -> tuple[int, ...]:
    """``params`` gradient bytes in ``k`` even parts, as a reduce-scatter leaves them (the
    first ``params % k`` devices a byte more)."""
    return tuple(params // k + (d < params % k) for d in range(k))


def _result(strategy: str, machine: Machine, graph: Graph, step: _Step, peak,
            gradients: tuple[int, ...], note: str = "", fits: bool | None = None
            ) -> SimResult:
    fits = max(peak) <= machine.memory if fits is None else fits
    return SimResult(strategy, machine.name, fits, step.seconds,
                     _batch(graph) / step.seconds if step.seconds else math.inf, tuple(peak),
                     note, step.busiest_device, step.busiest_link, gradients,
                     step.gradient_ready)


@dataclass(frozen=True)
class _Step:
    seconds: float
    busiest_device: float
    busiest_link: float
    gradient_ready: tuple[tuple[float, int], ...] = ()

    def then_all_reduce(self, seconds: float) -> "_Step":
        """This step, then an all-reduce of ``seconds`` over every link (after which every
        gradient is ready at once: no ``gradient_ready``)."""
        return _Step(self.seconds + seconds, self.busiest_device, self.busiest_link + seconds)


def _step_time(graph: Graph, device_of: Callable[[int], int], machine: Machine) -> _Step:
    tasks = step_tasks(graph, device_of, machine)
    busy: dict[tuple, float] = {}
    for task in tasks:
        busy[task.resource] = busy.get(task.resource, 0.0) + task.seconds
    done = finish_times(tasks)
    return _Step(max(done, default=0.0),
                 max((b for r, b in busy.items() if r[0] == "device"), default=0.0),
                 max((b for r, b in busy.items() if r[0] == "link"), default=0.0),
                 gradients_ready(graph, tasks, done))


def _batch(graph: Graph) -> int:
    """Samples per step: the first axis of the first data input (1 without one)."""
    data = graph.variables("data")
    return data[0].outputs[0].shape[0] if data and data[0].outputs[0].shape else 1


__all__ = ["RETRIES", "STRATEGIES", "SimResult", "data_parallel_step", "hybrid_step",
           "partitioned_step", "simulate"]
