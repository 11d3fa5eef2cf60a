"""What each device holds during a training step: at the end of the forward pass, and at
its peak over the step (liveness).

Both count, per device, the variables placed there (weights, one gradient array per weight,
the optimizer's state at ``optimizer_state`` bytes per weight byte as
:class:`~tofu_mx.search.SearchOptions` says, aux states, inputs) and the
operator outputs alive at each moment:

- an output is allocated on its maker's device when the operator runs, and a copy on each
  other device that reads it (as MXNet copies it across), at its first reader there;
- in the forward pass a buffer is freed after its last reader on its device, unless the
  backward pass reads it there (:func:`nnvm_passes.backward.kept_for_backward`); the
  graph's outputs stay;
- in the backward pass, run in the reverse order, each operator that carries a gradient
  allocates its inputs' gradients (summed into one buffer per value and device; a weight's
  gradient goes to its gradient array), receives the gradients of its outputs read on
  other devices (a copy each), and then frees its outputs' gradients and the kept buffers
  it was the last to read.

:func:`peak_memory` is the largest total over that walk, per device. Not counted: the
operators' temporary workspace, the outputs re-built by mirroring in the backward pass,
and any reuse MXNet's memory planner finds beyond freeing dead buffers.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

from nnvm_passes.backward import kept_for_backward
from nnvm_passes.ir import Graph
from tofu_mx import arguments
from tofu_mx.search.structure import needs_grad_of

#: the rows :func:`held_at_forward_end` counts
ROWS = ("weights", "gradients", "optimizer", "aux", "inputs", "activations")


def held_at_forward_end(graph: Graph, device_of: Callable[[int], int], num_devices: int,
                        optimizer_state: float = 0.0) -> list[dict[str, int]]:
    """Bytes each device holds at the end of the forward pass, by :data:`ROWS`: its
    variables, and the operator outputs the backward pass reads there. ``device_of(node)``:
    the device of every node, variables included."""
    kept = kept_for_backward(graph, needs_grad_of(graph))
    rows = _static(graph, device_of, num_devices, optimizer_state)
    for i, node in enumerate(graph.nodes):
        if node.is_variable:
            continue
        for j, t in enumerate(node.outputs):
            for d in {device_of(r) for r in kept[(i, j)]}:
                rows[d]["activations"] += t.nbytes
    return rows


def gradients_per_device(graph: Graph, device_of: Callable[[int], int], num_devices: int
                         ) -> tuple[int, ...]:
    """Bytes of weight gradients each device holds: one gradient array per weight placed
    there (the ``"gradients"`` row of :func:`held_at_forward_end`)."""
    return tuple(row["gradients"] for row in _static(graph, device_of, num_devices, 0.0))


def peak_memory(graph: Graph, device_of: Callable[[int], int], num_devices: int,
                optimizer_state: float = 0.0) -> tuple[int, ...]:
    """Each device's largest total over one training step (see the module's docstring)."""
    grads = needs_grad_of(graph)
    kept = kept_for_backward(graph, grads)
    base = [sum(row.values()) for row in _static(graph, device_of, num_devices,
                                                  optimizer_state)]
    walk = _Walk(graph, num_devices)
    ops = [i for i, n in enumerate(graph.nodes) if not n.is_variable]
    heads = {(e.node, e.index) for e in graph.heads}
    # forward: when each buffer (value, device) is read for the last time there
    last: dict[tuple[tuple[int, int], int], int] = {}
    for i in ops:
        for e in graph.nodes[i].inputs:
            last[((e.node, e.index), device_of(i))] = i
    # backward: how many gradient nodes on each device still read a kept buffer
    readers_left: dict[tuple[tuple[int, int], int], int] = defaultdict(int)
    reads: dict[int, list[tuple[int, int]]] = defaultdict(list)   # gradient node -> kept
    for value, readers in kept.items():
        for r in readers:
            readers_left[(value, device_of(r))] += 1
            reads[r].append(value)

    def dead(value, d: int) -> bool:
        return readers_left[(value, d)] == 0 and value not in heads

    for i in ops:
        d = device_of(i)
        for e in graph.nodes[i].inputs:
            if not graph.nodes[e.node].is_variable:
                walk.hold((e.node, e.index), d)
        for j in range(len(graph.nodes[i].outputs)):
            walk.hold((i, j), d)
        walk.mark()
        for e in graph.nodes[i].inputs:
            key = ((e.node, e.index), d)
            if last.get(key) == i and not graph.nodes[e.node].is_variable and dead(*key):
                walk.drop(*key)
        for j in range(len(graph.nodes[i].outputs)):
            if ((i, j), d) not in last and dead((i, j), d):
                walk.drop((i, j), d)
    sent: dict[tuple[int, int], set[int]] = defaultdict(set)   # gradient -> its devices
    for i in reversed(ops):
        node, d = graph.nodes[i], device_of(i)
        if not any(grads[(i, j)] for j in range(len(node.outputs))):
            continue
        for e in node.inputs:
            value = (e.node, e.index)
            if grads[value] and not graph.nodes[e.node].is_variable:
                walk.hold(("grad", value), d)
                sent[value].add(d)
        for j in range(len(node.outputs)):
            for src in sent.get((i, j), ()):
                if src != d:
                    walk.hold(("grad", (i, j)), d)     # the copy received from src
        walk.mark()
        for j in range(len(node.outputs)):
            for src in sent.pop((i, j), set()) | {d}:
                walk.drop(("grad", (i, j)), src)
        for value in reads.get(i, ()):
            readers_left[(value, d)] -= 1
            if dead(value, d):
                walk.drop(value, d)
    return tuple(b + p for b, p in zip(base, walk.peak))


class _Walk:
    """Live bytes per device, and their peak."""

    def __init__(self, graph: Graph, num_devices: int):
        self.graph = graph
        self.live: dict[tuple, int] = {}           # (buffer, device) -> bytes
        self.total = [0] * num_devices
        self.peak = [0] * num_devices

    def nbytes(self, key) -> int:
        if key[0] == "grad":
            key = key[1]
        return self.graph.nodes[key[0]].outputs[key[1]].nbytes

    def hold(self, key, d: int) -> None:
        if (key, d) not in self.live:
            self.live[(key, d)] = self.nbytes(key)
            self.total[d] += self.live[(key, d)]

    def drop(self, key, d: int) -> None:
        self.total[d] -= self.live.pop((key, d), 0)

    def mark(self) -> None:
        self.peak = [max(p, t) for p, t in zip(self.peak, self.total)]


def _static(graph: Graph, device_of, num_devices: int, optimizer_state: float
            ) -> list[dict[str, int]]:
    optimizer_state = arguments.real(optimizer_state, "optimizer_state", minimum=0,
                                     example="optimizer_state=1 for SGD with momentum")
    rows = [dict.fromkeys(ROWS, 0) for _ in range(num_devices)]
    for i, node in enumerate(graph.nodes):
        if not node.is_variable:
            continue
        row, nbytes = rows[device_of(i)], node.outputs[0].nbytes
        if node.kind == "param":
            row["weights"] += nbytes
            row["gradients"] += nbytes
            row["optimizer"] += int(optimizer_state * nbytes)
        else:
            row["aux" if node.kind == "aux" else "inputs"] += nbytes
    return rows


__all__ = ["ROWS", "gradients_per_device", "held_at_forward_end", "peak_memory"]
