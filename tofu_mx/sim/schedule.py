"""One training step as tasks on a machine's resources, and the time they take.

:func:`step_tasks` turns a graph whose nodes carry ctx groups (the partitioned Symbol's shard
graph, or an unpartitioned one on one device) into tasks:

- each operator is a compute task on its device, timed by the roofline of its work
  (:func:`tofu_mx.sim.work.operator_work`; an operator without a description by its bytes);
- each value read on another device than its maker's (an operator's output, or a variable
  placed elsewhere) is a transfer on the link between them, once per value and destination
  (as MXNet copies it);
- the backward pass mirrors the forward one: each operator that carries a gradient is a task
  on its device, after its own forward task and the backward tasks of its readers, costing
  the operations its inputs' gradients repeat (``Work.input_flops``, for the inputs that need
  one) and ``BACKWARD_RATIO`` times its forward bytes (an opaque operator: that ratio of its
  forward bytes); a gradient crossing devices is a transfer back (a
  weight's too, summed on each reading device first);
- an operator the rewrite marks for mirroring (``__force_mirroring__``: re-fetching) runs
  again before the gradients that read it, fetching again what it reads from other devices,
  as MXNet's gradient pass builds it again.

:func:`finish_times` runs them as MXNet's engine does: a task is ready once the tasks it
waits for are done; each resource (a device's compute, one direction of a link) runs one
task at a time, always the one ready first (ties: the one given first), and never idles
while a task of its own is ready. Compute and transfers on different resources
overlap, as MXNet's engine overlaps a device's kernels with its copies; on a machine whose
devices share one processor (``Machine.shared_compute``: MXNet's ``cpu(i)`` devices) every
operator, and every copy between devices (a copy in memory, made by the processor), runs on
that one.

Not modelled yet: the optimizer's update, several links sharing one switch, and the
executor's fixed cost per step (each operator's share of the engine's work is its launch).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from nnvm_passes.backward import backward_reads, mirrored_nodes
from nnvm_passes.ir import Entry, Graph
from tofu_mx.search.structure import needs_grad_of
from tofu_mx.sim.formulas import compute_time, transfer_time
from tofu_mx.sim.machine import Machine
from tofu_mx.sim.work import operator_bytes, operator_work

#: the backward pass of an operator against its forward memory traffic (a matrix product's
#: gradient is two products as large: one for its input, one for its weight); its arithmetic
#: is counted per input from the description (``Work.input_flops``)
BACKWARD_RATIO = 2.0


@dataclass(frozen=True)
class Task:
    """``seconds`` of work on ``resource`` (``("device", d)`` or ``("link", src, dst)``),
    started once the tasks at positions ``after`` are done. ``gradients``: the weights
    (variable nodes) whose gradient on their own device is complete only once this task is
    (a backward task on that device reading the weight, or a reader's sum sent there)."""

    name: str
    resource: tuple
    seconds: float
    after: tuple[int, ...] = ()
    gradients: tuple[int, ...] = ()


def finish_times(tasks: Sequence[Task]) -> list[float]:
    """When each task finishes (see the module's docstring); tasks wait only for tasks
    given before them."""
    waiting = [len(set(task.after)) for task in tasks]
    readers: list[list[int]] = [[] for _ in tasks]
    for k, task in enumerate(tasks):
        if any(not 0 <= a < k for a in task.after):
            raise ValueError(f"task {task.name!r} waits for a task not given before it: "
                             f"{task.after}")
        for a in set(task.after):
            readers[a].append(k)
    ready = [0.0] * len(tasks)
    done = [0.0] * len(tasks)
    queued: dict[tuple, list] = {}      # resource -> its ready tasks, (ready time, position)
    free: dict[tuple, float] = {}       # resource -> when it is next free
    due: dict[tuple, float] = {}        # resource -> when it starts its next task
    starts: list = []                   # (start, resource index, resource), some stale
    order = {r: i for i, r in enumerate(dict.fromkeys(task.resource for task in tasks))}

    def offer(k: int) -> None:
        resource = tasks[k].resource
        heapq.heappush(queued.setdefault(resource, []), (ready[k], k))
        start = max(free.get(resource, 0.0), queued[resource][0][0])
        if due.get(resource) != start:
            due[resource] = start
            heapq.heappush(starts, (start, order[resource], resource))

    for k, n in enumerate(waiting):
        if n == 0:
            offer(k)
    while starts:
        start, _, resource = heapq.heappop(starts)
        if due.get(resource) != start or not queued.get(resource):
            continue                    # superseded
        _, k = heapq.heappop(queued[resource])
        done[k] = start + tasks[k].seconds
        free[resource] = done[k]
        del due[resource]
        if queued[resource]:
            due[resource] = max(done[k], queued[resource][0][0])
            heapq.heappush(starts, (due[resource], order[resource], resource))
        for r in readers[k]:
            ready[r] = max(ready[r], done[k])
            waiting[r] -= 1
            if not waiting[r]:
                offer(r)
    return done


def step_tasks(graph: Graph, device_of: Callable[[int], int], machine: Machine,
               backward: bool = True,
               op_seconds: Callable[[int], tuple[float, float]] | None = None) -> list[Task]:
    """The tasks of one training step of ``graph`` on ``machine`` (forward, then, with
    ``backward``, the backward pass); ``device_of(node)``: the device an operator node runs
    on; ``op_seconds(node)``: its forward and backward seconds, when known otherwise (measured)
    than by the roofline."""
    grads = needs_grad_of(graph)

    def needed(i: int) -> tuple[bool, ...]:
        return inputs_needing_gradients(graph, grads, i)
    timed = op_seconds or _alike_once(
        graph, lambda i: roofline_seconds(graph, i, machine, needed(i)), needed)
    tasks: list[Task] = []
    forward: dict[int, int] = {}               # operator node -> its forward task
    sent: dict[tuple[Entry, int], int] = {}    # (value, destination) -> its transfer task
    readers: dict[int, list[tuple[int, Entry]]] = {}
    ops = [i for i, n in enumerate(graph.nodes) if not n.is_variable]
    for i in ops:
        d, after = device_of(i), []
        for e in graph.nodes[i].inputs:
            readers.setdefault(e.node, []).append((i, e))
            src, made = device_of(e.node), forward.get(e.node)
            if src == d:
                if made is not None:
                    after.append(made)
                continue
            if (e, d) not in sent:
                tasks.append(Task(f"{graph.nodes[e.node].name}->{d}", _carrier(machine, src, d),
                                  transfer_time(graph.tensor(e).nbytes, machine.link(src, d)),
                                  () if made is None else (made,)))
                sent[(e, d)] = len(tasks) - 1
            after.append(sent[(e, d)])
        tasks.append(Task(graph.nodes[i].name, _processor(machine, d),
                          timed(i)[0], tuple(after)))
        forward[i] = len(tasks) - 1
    if not backward:
        return tasks
    back: dict[int, int] = {}
    returned: dict[tuple[Entry, int], int] = {}   # (value, reader's device) -> gradient sent
    mirrored = mirrored_nodes(graph)
    again: dict[int, int] = {}                    # mirrored node -> its task run again

    def rebuild(m: int) -> int:
        """Node ``m`` built again for the backward pass (mirroring), from its inputs: those
        marked too built again first, those on other devices fetched again."""
        if m not in again:
            d, after = device_of(m), []
            for e in graph.nodes[m].inputs:
                if graph.nodes[e.node].is_variable:
                    continue
                made = rebuild(e.node) if e.node in mirrored else forward[e.node]
                if device_of(e.node) != d:
                    src = device_of(e.node)
                    tasks.append(Task(f"{graph.nodes[e.node].name}->{d} again",
                                      _carrier(machine, src, d),
                                      transfer_time(graph.tensor(e).nbytes,
                                                    machine.link(src, d)), (made,)))
                    made = len(tasks) - 1
                after.append(made)
            tasks.append(Task(f"{graph.nodes[m].name} again", _processor(machine, d),
                              timed(m)[0], tuple(after)))
            again[m] = len(tasks) - 1
        return again[m]

    for i in reversed(ops):
        node = graph.nodes[i]
        if not any(grads[(i, j)] for j in range(len(node.outputs))):
            continue
        d, after = device_of(i), [forward[i]]
        if i in mirrored:            # its gradient reads its copy, built again
            after.append(rebuild(i))
        elif any(e.node in mirrored for e in node.inputs):
            after.extend(rebuild(node.inputs[p].node)
                         for p in backward_reads(node, graph)[0]
                         if node.inputs[p].node in mirrored)
        for reader, e in readers.get(i, ()):
            if reader not in back or not grads[(e.node, e.index)]:
                continue
            src = device_of(reader)
            if src == d:
                after.append(back[reader])
                continue
            if (e, src) not in returned:    # the reading device's gradient sum, sent back
                gathered = tuple(back[r] for r, x in readers[i] if x == e and r in back and
                                 device_of(r) == src)
                tasks.append(Task(f"d{node.name}<-{src}", _carrier(machine, src, d),
                                  transfer_time(graph.tensor(e).nbytes, machine.link(src, d)),
                                  gathered))
                returned[(e, src)] = len(tasks) - 1
            after.append(returned[(e, src)])
        weights = tuple(e.node for e in node.inputs if graph.nodes[e.node].kind == "param"
                        and grads[(e.node, 0)] and device_of(e.node) == d)
        tasks.append(Task(f"d{node.name}", _processor(machine, d),
                          timed(i)[1], tuple(sorted(set(after))), tuple(dict.fromkeys(weights))))
        back[i] = len(tasks) - 1
    for v, node in enumerate(graph.nodes):      # weights' gradients summed where read
        if node.kind != "param" or not grads[(v, 0)]:
            continue
        by_device: dict[int, list[int]] = {}
        for reader, _ in readers.get(v, ()):
            if reader in back:
                by_device.setdefault(device_of(reader), []).append(back[reader])
        for src, gathered in by_device.items():
            if src != device_of(v):
                tasks.append(Task(f"d{node.name}<-{src}", _carrier(machine, src, device_of(v)),
                                  transfer_time(node.outputs[0].nbytes,
                                                machine.link(src, device_of(v))),
                                  tuple(gathered), (v,)))
    return tasks


def gradients_ready(graph: Graph, tasks: Sequence[Task], done: Sequence[float]
                    ) -> tuple[tuple[float, int], ...]:
    """When each weight's gradient is complete on its device, with its bytes, in that order:
    ``(seconds, bytes)`` per weight that gets a gradient (``done``: the tasks' finish times,
    :func:`finish_times`)."""
    ready: dict[int, float] = {}
    for task, end in zip(tasks, done):
        for v in task.gradients:
            ready[v] = max(ready.get(v, 0.0), end)
    return tuple(sorted((t, graph.nodes[v].outputs[0].nbytes) for v, t in ready.items()))


def inputs_needing_gradients(graph: Graph, grads: Mapping[tuple[int, int], bool],
                             i: int) -> tuple[bool, ...]:
    """Per input of operator ``i``, whether its gradient is needed (``grads``:
    :func:`tofu_mx.search.structure.needs_grad_of`), the flags :func:`roofline_seconds`
    reads."""
    return tuple(grads[(e.node, e.index)] for e in graph.nodes[i].inputs)


def roofline_seconds(graph: Graph, i: int, machine: Machine,
                     needed: Sequence[bool] | None = None) -> tuple[float, float]:
    """Operator ``i``'s forward and backward seconds on ``machine``, by the roofline of its
    work: backward, the operations the gradients of its inputs ``needed`` (a flag per input;
    None: all) repeat, and ``BACKWARD_RATIO`` times its bytes; an operator without a
    description by its bytes alone. Where the machine runs the operator one sample at a
    time (``Machine.per_sample``), the input it names is read once per sample."""
    node = graph.nodes[i]
    work = operator_work(graph, i)
    if work is None:
        flops, back, nbytes, op = 0.0, 0.0, operator_bytes(graph, i), None
    else:
        flops, nbytes, op = work.flops, work.nbytes, node.op
        back = work.backward_flops((True,) * len(node.inputs) if needed is None else needed)
    position = dict(machine.per_sample).get(node.op)
    if position is not None and position < len(node.inputs) and node.outputs[0].shape:
        nbytes += graph.tensor(node.inputs[position]).nbytes * (node.outputs[0].shape[0] - 1)
    return (compute_time(flops, nbytes, machine, op),
            compute_time(back, BACKWARD_RATIO * nbytes, machine, op))


def _alike_once(graph: Graph, seconds: Callable[[int], tuple[float, float]],
                needed: Callable[[int], tuple]):
    """``seconds``, computed once for operators alike (the same operator, attributes, input
    and output shapes and types, inputs needing gradients): a partitioned graph holds many
    alike shards."""
    known: dict[tuple, tuple[float, float]] = {}

    def timed(i: int) -> tuple[float, float]:
        node = graph.nodes[i]
        key = (node.op, node.attrs, tuple(graph.tensor(e) for e in node.inputs), node.outputs,
               needed(i))
        if key not in known:
            known[key] = seconds(i)
        return known[key]
    return timed


def _processor(machine: Machine, device: int) -> tuple:
    """The resource a device's operators run on: its own, or the one shared processor."""
    return ("device", 0 if machine.shared_compute else device)


def _carrier(machine: Machine, src: int, dst: int) -> tuple:
    """The resource a copy from ``src`` to ``dst`` takes: one direction of their link; one
    direction of the bridge between their groups where the machine's groups share it
    (``Machine.bridge_shared``: a PCIe switch's uplink); or, where the devices share one
    processor (``cpu(i)``), that processor, which copies."""
    if machine.shared_compute:
        return ("device", 0)
    g = machine.group_size
    if machine.bridge_shared and src // g != dst // g:
        return ("link", "bridge", src // g, dst // g)
    return ("link", src, dst)


__all__ = ["BACKWARD_RATIO", "Task", "finish_times", "inputs_needing_gradients",
           "roofline_seconds", "step_tasks"]
