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

:func:`peak_memory` follows MXNet 1.9.1's executor instead (docs/mxnet-facts.md, "Memory
plan"): the same walk asks for blocks of a static plan (``MXPlanMemory``), which are never
given back, so a device holds its variables plus the sum of its blocks' largest sizes. Its
backward pass runs in MXNet's order: depth first from the weights' gradients, in argument
order, so a weight's pieces are summed (one ElementWiseSum below MXNet's in-place cap)
only when its output is reached, at the end of the pass (at or above the cap they are
added one by one into the first, each maker waiting for the previous add). It also counts
what MXNet's backward graph holds beyond the walk above: each reader's piece of a
gradient, the gradients of inputs that need none (made, never read), zeros for outputs no
reader differentiates, and a head gradient array where the backward pass reads one; it
leaves out the gradient nodes no weight's gradient needs (a loss reads no output
gradient). Not modelled: in-place outputs (``FInplaceOption``: MXNet's peak is lower by
them), temporary workspace.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Callable

from nnvm_passes.backward import kept_for_backward
from nnvm_passes.ir import Graph
from nnvm_passes.program import inplace_sum_cap
from tofu_mx import arguments
from tofu_mx.search.structure import needs_grad_of
from tofu_mx.tdl.registry import Attrs, facts

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


def largest_weight_per_device(graph: Graph, device_of: Callable[[int], int],
                              num_devices: int) -> tuple[int, ...]:
    """Bytes of the largest weight placed on each device (0 where none is)."""
    out = [0] * num_devices
    for i, node in enumerate(graph.nodes):
        if node.is_variable and node.kind == "param":
            out[device_of(i)] = max(out[device_of(i)], node.outputs[0].nbytes)
    return tuple(out)


def peak_memory(graph: Graph, device_of: Callable[[int], int], num_devices: int,
                optimizer_state: float = 0.0) -> tuple[int, ...]:
    """Each device's bytes held in one training step (see the module's docstring): its
    variables, a head gradient per graph output, and the blocks of MXNet's memory plan."""
    base = [sum(row.values()) for row in _static(graph, device_of, num_devices,
                                                  optimizer_state)]
    plan = _Plan(graph, num_devices, MATCH_RANGE)
    _plan_step(graph, device_of, plan, inplace_sum_cap())
    return tuple(b + p for b, p in zip(base, plan.total))


#: MXNet's NNVM_EXEC_MATCH_RANGE default: a free block is reused for a request within this
#: factor of its size (src/nnvm/plan_memory.cc, MXPlanMemory)
MATCH_RANGE = 16


def _plan_step(graph: Graph, device_of, plan: "_Plan", cap: int) -> None:
    grads = needs_grad_of(graph)
    kept = kept_for_backward(graph, grads)
    nodes = graph.nodes
    ops = [i for i, n in enumerate(nodes) if not n.is_variable]
    heads = {(e.node, e.index) for e in graph.heads}
    wanted, has_grad = _gradient_nodes(graph, grads)
    # forward: when each buffer (value, device) is read for the last time there
    last: dict[tuple[tuple[int, int], int], int] = {}
    for i in ops:
        for e in nodes[i].inputs:
            last[((e.node, e.index), device_of(i))] = i
    loss = {i: facts(nodes[i].op, Attrs(nodes[i].attrs)).loss for i in has_grad}
    for i, j in heads:    # a head gradient array where the backward pass reads one
        if i in has_grad and not loss[i]:
            plan.total[device_of(i)] += nodes[i].outputs[j].nbytes
    readers_left: dict[tuple[tuple[int, int], int], int] = defaultdict(int)
    reads: dict[int, list[tuple[int, int]]] = defaultdict(list)   # gradient node -> kept
    for value, readers in kept.items():
        for r in readers:
            if r not in has_grad:       # a gradient node MXNet leaves out
                continue
            readers_left[(value, device_of(r))] += 1
            reads[r].append(value)
    # the gradient pieces each value receives, in MXNet's order (its gradient pass walks the
    # operators in reverse topological order): (reader, input position)
    pieces: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for i in sorted(has_grad, reverse=True):
        for p, e in enumerate(nodes[i].inputs):
            if (e.node, e.index) in wanted:
                pieces[(e.node, e.index)].append((i, p))

    def dead(value, d: int) -> bool:
        return readers_left[(value, d)] == 0 and value not in heads

    for i in ops:
        d = device_of(i)
        for e in nodes[i].inputs:
            if not nodes[e.node].is_variable:
                plan.request((e.node, e.index), d, (e.node, e.index))     # copy, if remote
        for j in range(len(nodes[i].outputs)):
            plan.request((i, j), d, (i, j))
        for e in nodes[i].inputs:
            key = ((e.node, e.index), d)
            if last.get(key) == i and not nodes[e.node].is_variable and dead(*key):
                plan.release(*key)
        for j in range(len(nodes[i].outputs)):
            if ((i, j), d) not in last and dead((i, j), d):
                plan.release((i, j), d)
    arrived: dict[tuple[int, int], list[tuple[tuple, int]]] = defaultdict(list)
    ograds: dict[tuple[int, int], tuple[tuple, int]] = {}
    read = {i: [(i, j) for j in range(len(nodes[i].outputs))
                if (i, j) not in heads and not loss[i]] for i in has_grad}
    weights = [(i, 0) for i, n in enumerate(nodes) if n.is_variable and (i, 0) in wanted]
    for kind, item in _backward_order(weights, read, pieces, cap):
        if kind == "sum":
            if nodes[item[0]].is_variable:    # a weight's pieces: summed into its gradient
                for key, dev in arrived.pop(item, ()):
                    plan.release(key, dev)
            else:
                ograds[item] = _output_gradient(plan, item, device_of(item[0]),
                                                arrived.pop(item, []))
            continue
        i = item
        node, d = nodes[i], device_of(i)
        used = [ograds.pop(value) for value in read[i]]
        made, after = [], []
        for p, e in enumerate(node.inputs):
            value = (e.node, e.index)
            if value not in wanted:
                made.append((("nograd", i, p), value))    # made, never read
                after.append((("nograd", i, p), d))
            elif not (nodes[e.node].is_variable and len(pieces[value]) == 1):
                made.append((("piece", i, p), value))
                if len(pieces[value]) >= cap and arrived[value]:    # added into the chain
                    after.append((("piece", i, p), d))
                else:
                    arrived[value].append((("piece", i, p), d))
        for key, value in made:
            plan.request(key, d, value)
        for key, dev in used + after:
            plan.release(key, dev)
        for value in reads.get(i, ()):
            readers_left[(value, d)] -= 1
            if dead(value, d):
                plan.release(value, d)


def _backward_order(weights: list[tuple[int, int]], read: dict[int, list[tuple[int, int]]],
                    pieces: dict[tuple[int, int], list[tuple[int, int]]], cap: int
                    ) -> list[tuple[str, object]]:
    """The order in which MXNet runs the backward graph: ``("node", i)``, operator ``i``'s
    gradient node; ``("sum", value)``, the sum of ``value``'s gradient pieces. The
    executor orders its graph depth-first from its outputs (``IndexedGraph``'s post-order,
    inputs before control dependencies), and the backward graph's outputs are the weights'
    gradients in argument order: a weight's sum runs when its output is reached, after
    everything its pieces need, so below the cap every weight's pieces wait for the sums at
    the end of the pass. A gradient node reads its outputs' summed gradients (each summed
    right after its pieces); at or above the cap, piece ``k``'s maker also waits for the
    sum of pieces ``0..k-1`` (a control dependency, src/executor/graph_executor.cc,
    AggregateGradient)."""
    after: dict[int, list[int]] = defaultdict(list)    # the control dependencies
    for ps in pieces.values():
        if len(ps) >= cap:
            for (c, _), (before, _) in zip(ps[1:], ps):
                if c != before:
                    after[c].append(before)
    order: list[tuple[str, object]] = []
    done: set = set()

    def children(item):
        kind, x = item
        if kind == "sum":
            return [("node", c) for c, _ in pieces.get(x, ())]
        return [("sum", v) for v in read[x]] + [("node", c) for c in after.get(x, ())]

    for root in weights:
        stack = [(("sum", root), iter(children(("sum", root))))]
        done.add(("sum", root))
        while stack:
            item, rest = stack[-1]
            child = next(rest, None)
            if child is None:
                stack.pop()
                order.append(item)
            elif child not in done:
                done.add(child)
                stack.append((child, iter(children(child))))
    return order


def _gradient_nodes(graph: Graph, grads) -> tuple[set[tuple[int, int]], set[int]]:
    """``(wanted, nodes)``: the values whose gradient MXNet's backward graph computes, and
    the operators whose gradient node it holds. MXNet keeps only what the weights' gradients
    depend on: a weight's gradient is wanted; an operator's gradient node is there when it
    makes a wanted gradient; its outputs' gradients are then wanted, except a loss
    operator's, whose gradient does not read them (``OpFacts.loss``)."""
    nodes = graph.nodes
    wanted = {(i, 0) for i, n in enumerate(nodes) if n.is_variable and grads[(i, 0)]}
    made: set[int] = set()
    for i, node in enumerate(nodes):
        if node.is_variable or not any(grads[(i, j)] for j in range(len(node.outputs))):
            continue
        if any((e.node, e.index) in wanted for e in node.inputs):
            made.add(i)
            if not facts(node.op, Attrs(node.attrs)).loss:
                wanted.update((i, j) for j in range(len(node.outputs)) if grads[(i, j)])
    return wanted, made


def _output_gradient(plan: "_Plan", value: tuple[int, int], d: int,
                     pieces: list[tuple[tuple, int]]) -> tuple[tuple, int]:
    """The summed gradient of ``value`` on device ``d``, from its ``pieces``; returns its
    key there."""
    if not pieces:      # no reader made one: MXNet's zeros of the output's size
        plan.request(("zeros", value), d, value)
        return ("zeros", value), d
    first, where = pieces[0]
    for key, dev in pieces[1:]:
        if dev != where:
            plan.request(("to", key), where, value)
            plan.release(key, dev)
            key = ("to", key)
        plan.release(key, where)      # ElementWiseSum writes into the first piece
    if where != d:
        plan.request(("to", first), d, value)
        plan.release(first, where)
        return ("to", first), d
    return first, d


class _Plan:
    """MXNet's static memory plan (MXGraphAllocator in src/nnvm/plan_memory.cc), device by
    device: a buffer takes a free block within :data:`MATCH_RANGE` of its size (the
    smallest as large, else the largest smaller one, which grows), or a new block; a block
    is never given back, so a device holds the sum of its blocks' largest sizes."""

    def __init__(self, graph: Graph, num_devices: int, match_range: int):
        self.graph = graph
        self.match_range = match_range
        self.free: list[list[tuple[int, int]]] = [[] for _ in range(num_devices)]
        self.plan_size: list[int] = []      # per block: MXNet's size (4 bytes an element)
        self.nbytes: list[int] = []         # per block: the largest buffer's bytes
        self.live: dict[tuple, int] = {}    # (buffer, device) -> block
        self.total = [0] * num_devices

    def request(self, key, d: int, value: tuple[int, int]) -> None:
        if (key, d) in self.live:
            return
        info = self.graph.nodes[value[0]].outputs[value[1]]
        size, nbytes = info.size * 4, info.nbytes
        free = self.free[d]
        mid = bisect.bisect_left(free, (size, -1))
        end = bisect.bisect_right(free, (size * self.match_range, 1 << 62))
        begin = bisect.bisect_left(free, (size // self.match_range, -1))
        if mid < end:
            _, block = free.pop(mid)
        elif mid > begin:
            _, block = free.pop(mid - 1)
        else:
            block = len(self.nbytes)
            self.plan_size.append(0)
            self.nbytes.append(0)
        self.plan_size[block] = max(self.plan_size[block], size)
        self.total[d] += max(0, nbytes - self.nbytes[block])
        self.nbytes[block] = max(self.nbytes[block], nbytes)
        self.live[(key, d)] = block

    def release(self, key, d: int) -> None:
        block = self.live.pop((key, d), None)
        if block is not None:
            bisect.insort(self.free[d], (self.plan_size[block], block))


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


__all__ = ["ROWS", "gradients_per_device", "held_at_forward_end", "largest_weight_per_device",
           "peak_memory"]
