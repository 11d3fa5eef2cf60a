"""Operator placement, the alternative Tofu is measured against: every operator runs whole
on one device, as hand-written ``group2ctx`` or ParDNN place them.

:func:`place_operators` is a list scheduler in the manner of HEFT (Topcuoglu et al., 2002)
under per-device memory caps:

- each operator's weight is its forward and backward roofline time on the machine; its
  *rank* is its weight plus the largest, over its readers, of the transfer of the value it
  sends them (over the ``peer`` link) and the reader's rank: the length of the critical path
  from it to the end;
- operators are placed by decreasing rank (a topological order: an operator outranks its
  readers), each on the device where its forward pass would finish first, given when each
  device is free and when its inputs arrive there;
- a device is a candidate only while what it holds at the end of the forward pass stays
  within the cap: the weights it reads there for the first time (with their gradients and
  optimizer state), the inputs, and the outputs the backward pass keeps, counted as
  :func:`tofu_mx.sim.memory.held_at_forward_end` does;
- a weight lives on the device of its first reader, and every other reader of it goes
  there too: MXNet binds a variable on one device, and sums its gradient there. An LSTM
  layer's time steps, which share their weights, thus stay together.

It gives None when some operator fits no device.
"""
from __future__ import annotations

from typing import Sequence

from nnvm_passes.backward import kept_for_backward
from nnvm_passes.ir import Graph
from tofu_mx.search.structure import needs_grad_of
from tofu_mx.sim.formulas import transfer_time
from tofu_mx.sim.machine import Machine
from tofu_mx.sim.schedule import inputs_needing_gradients, roofline_seconds


def place_operators(graph: Graph, machine: Machine, cap: float,
                    optimizer_state: float = 0.0) -> tuple[int, ...] | None:
    """The device of every node of ``graph`` (variables included), each device holding at
    most ``cap`` bytes at the end of the forward pass, or None when none fits (see the
    module's docstring)."""
    k = machine.num_devices
    ops = [i for i, n in enumerate(graph.nodes) if not n.is_variable]
    grads = needs_grad_of(graph)
    seconds = {i: roofline_seconds(graph, i, machine, inputs_needing_gradients(graph, grads, i))
               for i in ops}
    rank = _ranks(graph, ops, seconds, machine)
    kept = kept_for_backward(graph, grads)
    kept_by = {}                               # gradient node -> the values it keeps
    for value, readers in kept.items():
        for r in readers:
            kept_by.setdefault(r, []).append(value)
    device: dict[int, int] = {}
    held = [0.0] * k
    free = [0.0] * k
    finish: dict[int, float] = {}
    counted: set = set()
    for i in sorted(ops, key=lambda i: (-rank[i], i)):
        node = graph.nodes[i]
        pinned = [device[e.node] for e in node.inputs
                  if graph.nodes[e.node].kind == "param" and e.node in device]
        best = None
        for d in pinned[:1] or range(k):
            need = _new_bytes(graph, i, d, device, kept_by, counted, optimizer_state)
            if held[d] + need > cap:
                continue
            arrive = max([finish[e.node] + _transfer(graph, e, device[e.node], d, machine)
                          for e in node.inputs if e.node in finish] + [0.0])
            end = max(free[d], arrive) + seconds[i][0]
            if best is None or end < best[0]:
                best = (end, d, need)
        if best is None:
            return None
        finish[i], d, need = best
        free[d], held[d], device[i] = finish[i], held[d] + need, d
        counted.update((value, d) for value in kept_by.get(i, ()))
        for e in node.inputs:
            if graph.nodes[e.node].is_variable:
                device.setdefault(e.node, d)
    return tuple(device.get(i, 0) for i in range(len(graph.nodes)))


def _ranks(graph: Graph, ops: Sequence[int], seconds, machine: Machine) -> dict[int, float]:
    readers: dict[int, list] = {}
    for i in ops:
        for e in graph.nodes[i].inputs:
            readers.setdefault(e.node, []).append((i, e))
    rank: dict[int, float] = {}
    for i in reversed(ops):
        rank[i] = sum(seconds[i]) + max(
            [transfer_time(graph.tensor(e).nbytes, machine.peer) + rank[r]
             for r, e in readers.get(i, ())] + [0.0])
    return rank


def _transfer(graph: Graph, e, src: int, dst: int, machine: Machine) -> float:
    return 0.0 if src == dst else transfer_time(graph.tensor(e).nbytes, machine.link(src, dst))


def _new_bytes(graph: Graph, i: int, d: int, device: dict[int, int], kept_by,
               counted: set, optimizer_state: float) -> float:
    """What placing operator ``i`` on device ``d`` adds to ``d``'s bytes at the end of the
    forward pass: the variables it reads first, and the values its gradient keeps there
    that nothing kept there before (``counted``: (value, device))."""
    total = 0.0
    for e in dict.fromkeys(graph.nodes[i].inputs):
        node = graph.nodes[e.node]
        if node.is_variable and e.node not in device:
            total += node.outputs[0].nbytes * ((2 + optimizer_state) if node.kind == "param"
                                               else 1)
    for value in kept_by.get(i, ()):
        if (value, d) not in counted:
            total += graph.nodes[value[0]].outputs[value[1]].nbytes
    return total


__all__ = ["place_operators"]
