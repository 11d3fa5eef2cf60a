"""From a :class:`~tofu_mx.search.plan.Plan` to what each device runs (no MXNet graph yet).

Devices are numbered in mixed radix over the plan's cuts: with cuts ``(p1, p2, ...)``,
device ``d`` is part ``d // (k / p1)`` of the first cut, and so on. Composing the levels:

- a **tensor** is stored, on device ``d``, in the box its per-level layouts narrow it to
  (``split(a)`` cuts axis ``a`` of what the previous level stored into ``p`` parts that
  differ by at most one, at floor boundaries; ``replicated`` keeps it);
- an **operator**'s loop variables are narrowed the same way by its per-level strategies
  (``split v`` / ``reduce v``); the interval analysis then gives, exactly, what that share
  reads and computes (:func:`tofu_mx.tdl.analysis.work_regions`), and the description's
  ``shard`` hook says how to run it (attributes, padding). Shares differing only in the
  parts of ``reduce`` levels compute partial outputs that are combined.

A share that cannot run as the operator (no hook answer, or MXNet infers other output
shapes than the analysis) makes the whole operator run whole on every device instead: a
``fallback``, reported, never a wrong result. An operator planned ``whole`` at every level (it
has no description) runs once, on device 0 (part 0 of every cut), and the other devices have
no share of it: also reported as a fallback.

With :attr:`Plan.refetch`, an operator whose gradient reads its inputs and that may run
again (:func:`~tofu_mx.search.structure.refetches_inputs`) is marked ``refetch``: the
rewrite builds its converted inputs, but those the plan keeps (:attr:`Plan.kept`), so that
the backward pass fetches them again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import tofu_mx.ops  # noqa: F401  (registers the built-in descriptions)
from nnvm_passes.ir import FrozenDict, Graph
from tofu_mx.errors import InvalidArgumentError, TofuError
from tofu_mx.search.layouts import OpStrategy, StoredLayout
from tofu_mx.search.plan import Plan
from tofu_mx.search.structure import needs_grad_of, refetches_inputs
from tofu_mx.tdl.analysis import pad_values, part_interval, work_regions
from tofu_mx.tdl.annotate import described
from tofu_mx.tdl.registry import Description, Opaque, facts, lookup, registry_key
from tofu_mx.tdl.shares import resolve

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Share:
    """One device's share of one operator."""

    attrs: FrozenDict                    # the operator's attributes for this share (raw)
    inputs: tuple[Box | None, ...]       # box read of each input (beyond bounds: padding)
    pads: tuple[float | None, ...]       # the value read beyond each input's bounds
    outputs: tuple[Box | None, ...]      # box computed of each output (None: not tracked)
    partial: str | None                  # sum | max | min: outputs are partial
    key: tuple[int, ...]                 # shares with one key and partial outputs combine
    scale: float | None = None           # multiply the outputs by this
    views: tuple[Box, ...] | None = None # no operator: output j is input 0's box views[j]
    runs: bool = False                   # with views: the operator computes it too (attrs,
    #                                      inputs); the rewrite picks (Shard.also_runs)


@dataclass(frozen=True)
class OpAssignment:
    shares: tuple[Share | None, ...]     # one per device (None: the device runs none of it)
    fallback: str | None = None          # why the operator runs whole on every device
    loss: bool = False                   # its gradient ignores the head's: one share per box
    placed_by_input: bool = False        # emitted without __ctx_group__ (see OpFacts)
    refetch: bool = False                # its converted inputs are fetched again, and it runs
    #                                      again, in the backward pass (Plan.refetch) ...
    kept: frozenset[int] = frozenset()   # ... but for these inputs', kept (Plan.kept)
    unrunnable: bool = False             # a share the plan gives it cannot run: it runs
    #                                      whole (``fallback``), or its last cuts replicated


@dataclass(frozen=True)
class Assignment:
    num_devices: int
    ops: dict[int, OpAssignment]
    stored: dict[tuple[int, int], tuple[Box, ...]]   # tensor -> box stored on each device

    @property
    def fallbacks(self) -> dict[int, str]:
        return {i: a.fallback for i, a in self.ops.items() if a.fallback}


def device_parts(num_devices: int, factors: Sequence[int]) -> list[tuple[int, ...]]:
    """The part each device is in at each level (mixed radix, first cut most significant)."""
    out = []
    for d in range(num_devices):
        parts, rest, width = [], d, num_devices
        for p in factors:
            width //= p
            parts.append(rest // width)
            rest %= width
        out.append(tuple(parts))
    return out


def narrow(box: Box, axis: int, parts: int, part: int) -> Box:
    """Part ``part`` of ``box`` cut in ``parts`` along ``axis`` (:func:`part_interval`)."""
    return box[:axis] + (_narrow(box[axis], parts, part),) + box[axis + 1:]


def _narrow(interval: tuple[int, int], parts: int, part: int) -> tuple[int, int]:
    lo, hi = interval
    if hi - lo + 1 < parts:
        raise TofuError(f"internal: the range {lo}..{hi} cannot be cut in {parts} parts")
    a, b = part_interval(hi - lo + 1, parts, part)
    return lo + a, lo + b


def whole(shape: Sequence[int]) -> Box:
    return tuple((0, n - 1) for n in shape)


def stored_box(shape: Sequence[int], layouts: Sequence[StoredLayout], factors: Sequence[int],
               parts: Sequence[int]) -> Box:
    box = whole(shape)
    for layout, p, part in zip(layouts, factors, parts):
        if not layout.replicated:
            box = narrow(box, layout.axis, p, part)
    return box


def assign(graph: Graph, plan: Plan) -> Assignment:
    """Every operator's share on every device, and every tensor's stored box."""
    k = plan.num_devices
    parts = device_parts(k, plan.factors)
    by_name = {t.name: t for t in plan.tensors}
    stored = {}
    for i, node in enumerate(graph.nodes):
        names = [node.name] if node.is_variable else \
            [f"{node.name}:{j}" for j in range(len(node.outputs))]
        for j, name in enumerate(names):
            t = by_name[name]
            stored[(i, j)] = tuple(stored_box(t.shape, t.layouts, plan.factors, p) for p in parts)
    strategies = {o.name: o.strategies for o in plan.ops}
    consumers = graph.consumers()
    grads = needs_grad_of(graph) if plan.refetch else {}
    kept: dict[str, set[int]] = {}
    for name, j in plan.kept:
        kept.setdefault(name, set()).add(j)
    ops: dict[int, OpAssignment] = {}
    # one assignment per operator, attributes, shapes, strategies and outputs read (repeated
    # units share it; nothing in it names the node)
    alike: dict[tuple, OpAssignment] = {}
    for i, node in enumerate(graph.nodes):
        if node.is_variable:
            continue
        read = {e.index for c, _ in consumers.get(i, []) for e in graph.nodes[c].inputs
                if e.node == i}
        try:
            key = (node.op, node.attrs, tuple(graph.tensor(e).shape for e in node.inputs),
                   tuple(t.shape for t in node.outputs),
                   tuple((s.kind, s.var) for s in strategies[node.name]), frozenset(read))
            op = alike.get(key)
            if op is None:
                op = alike[key] = _assign_op(graph, i, strategies[node.name], plan.factors,
                                             parts, read)
            ops[i] = dataclasses.replace(
                op, placed_by_input=not facts(node.op).group_attr,
                refetch=plan.refetch and refetches_inputs(graph, i, grads),
                kept=frozenset(kept.get(node.name, ())))
        except TofuError:
            raise
        except Exception as e:  # noqa: BLE001  (re-raised with the node named)
            raise TofuError(f"assigning {node.name!r} ({node.op}) to devices failed: "
                            f"{type(e).__name__}: {e}") from e
    return Assignment(k, ops, stored)


def _whole_op(graph: Graph, i: int, k: int, reason: str | None, loss: bool) -> OpAssignment:
    node = graph.nodes[i]
    ins = tuple(whole(graph.tensor(e).shape) for e in node.inputs)
    outs = tuple(whole(t.shape) for t in node.outputs)
    share = Share(node.attrs, ins, (None,) * len(ins), outs, None, ())
    return OpAssignment(tuple(share for _ in range(k)), reason, loss)


def _on_one_device(graph: Graph, i: int, k: int, loss: bool) -> OpAssignment:
    """The operator runs whole on device 0 alone (no description to split it by)."""
    node = graph.nodes[i]
    share = _whole_op(graph, i, 1, None, loss).shares[0]
    reason = f"no description of {registry_key(node.op, node.params)}: runs whole on device 0"
    return OpAssignment((share,) + (None,) * (k - 1), reason, loss)


def _assign_op(graph: Graph, i: int, strategies: Sequence[OpStrategy], factors: Sequence[int],
               parts: list[tuple[int, ...]], read: set[int]) -> OpAssignment:
    node = graph.nodes[i]
    k = len(parts)
    in_shapes = [graph.tensor(e).shape for e in node.inputs]
    out_shapes = [t.shape for t in node.outputs]
    entry = lookup(node.op, node.params)
    loss = facts(node.op, node.params).loss
    levels = [(s.kind, s.var) for s in strategies]
    if any(verb == "whole" for verb, _ in levels):
        return _on_one_device(graph, i, k, loss)
    if all(verb == "replicate" for verb, _ in levels):
        return _whole_op(graph, i, k, None, loss)
    if isinstance(entry, Opaque):
        return OpAssignment(tuple(_opaque_share(node, entry, in_shapes, out_shapes, levels,
                                                factors, p) for p in parts), None, loss)
    entry, traced = described(node.op, node.attrs, in_shapes, out_shapes)
    if max(read, default=0) >= len(traced.outputs):
        return _whole_op(graph, i, k, f"output {max(read)} is read but not described: runs "
                                      f"whole on every device", loss)
    pads = pad_values(traced)
    shares = _described_shares(node, entry, traced, pads, levels, factors, parts)
    if not isinstance(shares, str):
        return OpAssignment(tuple(shares), None, loss)
    # a share that cannot run: its last cuts run replicated instead, from the last one back
    # (each device computes its earlier cuts' share whole, a superset of what it stores)
    splitting = [j for j, (verb, _) in enumerate(levels) if verb != "replicate"]
    for j in reversed(splitting[1:]):
        demoted = levels[:j] + [("replicate", None)] * (len(levels) - j)
        found = _described_shares(node, entry, traced, pads, demoted, factors, parts)
        if not isinstance(found, str):
            return OpAssignment(tuple(found), None, loss, unrunnable=True)
    return dataclasses.replace(_whole_op(
        graph, i, k, f"a planned share cannot run ({shares}): runs whole on every device",
        loss), unrunnable=True)


def _described_shares(node, entry: Description, traced, pads, levels, factors,
                      parts) -> list[Share] | str:
    """Every device's share, or why the first that cannot run cannot."""
    shares = []
    for p in parts:
        share = _described_share(node, entry, traced, pads, levels, factors, p)
        if isinstance(share, str):
            return share
        shares.append(share)
    return shares


def _described_share(node, entry: Description, traced, pads, levels, factors,
                     part: tuple[int, ...]) -> Share | str:
    ranges = {v: (0, n - 1) for v, n in traced.extents.items()}
    reduced, not_first, key = [], [], []
    for (verb, var), p, q in zip(levels, factors, part):
        if verb == "replicate":
            key.append(q)
            continue
        if var not in ranges:
            raise InvalidArgumentError(
                f"the plan has {node.name!r} ({node.op}) {verb} {var!r}, which its description "
                f"does not have (its loop variables: {', '.join(ranges)}); make the plan with "
                f"tofu_mx.plan() for this graph")
        ranges[var] = _narrow(ranges[var], p, q)
        if verb == "reduce":
            reduced.append(var)
            if q:
                not_first.append(var)
        else:
            key.append(q)
    work = work_regions(traced, ranges, reduced, not_first)
    run = resolve(entry, node.op, node.attrs, traced, work)
    if isinstance(run, str):
        return run
    outputs = tuple(work.outputs) + (None,) * (len(node.outputs) - len(work.outputs))
    if run.shard.views is not None:
        return Share(run.attrs, run.inputs, pads, outputs, work.partial, tuple(key),
                     views=tuple(run.shard.views), runs=run.shard.also_runs)
    return Share(run.attrs, run.inputs, pads, outputs, work.partial, tuple(key), run.shard.scale)


def _opaque_share(node, entry: Opaque, in_shapes, out_shapes, levels, factors, part) -> Share:
    n = None
    for shape, axis in list(zip(in_shapes, entry.batch_axes)) + \
            list(zip(out_shapes, entry.output_batch_axes)):
        if axis is not None:
            n = shape[axis]
    lo, hi, key = 0, n - 1, []
    for (verb, _), p, q in zip(levels, factors, part):
        key.append(q)
        if verb != "replicate":
            lo, hi = _narrow((lo, hi), p, q)

    def box(shape, axis):
        b = whole(shape)
        return b if axis is None else b[:axis] + ((lo, hi),) + b[axis + 1:]
    in_axes = (list(entry.batch_axes) + [None] * len(in_shapes))[:len(in_shapes)]
    out_axes = (list(entry.output_batch_axes) + [None] * len(out_shapes))[:len(out_shapes)]
    return Share(node.attrs, tuple(box(s, a) for s, a in zip(in_shapes, in_axes)),
                 (None,) * len(in_shapes), tuple(box(s, a) for s, a in zip(out_shapes, out_axes)),
                 None, tuple(key))
