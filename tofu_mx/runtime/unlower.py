"""Un-lowering: run a lowered operator as itself where the plan splits it as the operator splits.

The search partitions the *lowered* graph (:func:`tofu_mx.search.plan.lower_graph`): each
BatchNorm becomes about 30 small operators (its per-channel sums and arithmetic), so that it
can be split on the batch. Where the plan does not split it on the batch but on its channels
(or replicates it) at every cut, the operator itself, split the same way, computes the same
values from the same reads: one share per device instead of about 30.

:func:`unlower` finds such operators and returns the graph with them kept whole (lowered
with ``keep``), the plan translated to it, its assignment and its Program, when the Program
moves exactly the bytes the lowered one moves; else everything as it was. An operator is a
candidate when

- no part of its lowering reduces (partial sums added across devices) or runs whole, and
- at every cut, the layout its output 0 is stored in is replicated or a split its own
  description offers (a strategy splitting a loop variable into that layout: BatchNorm's
  channel split), the strategy the translated plan gives it;

and the candidates are kept together only if every share they get can run and the bytes
MXNet copies are unchanged (the check after the translation: the operator reads what its
lowering read). Nothing here knows an operator by name: what lowers is
:attr:`tofu_mx.tdl.OpFacts.lowering`, and how an operator splits, its description.

The translated plan keeps the search's levels (bytes per cut), coarsening and memory
estimate; its tensors and operators are the kept graph's, its fingerprint the kept graph's,
and :attr:`~tofu_mx.search.plan.Plan.unlowered` names the operators kept, so that
:func:`~tofu_mx.search.plan.lower_graph` with ``keep=plan.unlowered`` makes the graph it
fits again (the self-check, ``verify``, a saved plan).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from nnvm_passes.ir import Graph
from nnvm_passes.lower import lowered_from
from nnvm_passes.program import Program, finished, route
from tofu_mx.runtime.assign import Assignment, assign
from tofu_mx.search.cut import View, op_strategies
from tofu_mx.search.layouts import REPLICATED_LAYOUT, OpStrategy, StoredLayout
from tofu_mx.search.plan import OpPlan, Plan, TensorPlan, check_plan, graph_fingerprint, \
    lower_graph


def unlower(whole: Graph, graph: Graph, plan: Plan, assignment: Assignment,
            join_outputs: bool = True) -> tuple[Graph, Plan, Assignment, Program | None]:
    """``graph`` (``whole`` lowered), ``plan`` and ``assignment`` with the operators the plan
    splits as they split run as themselves (see the module docstring), and the Program
    where it was routed (None: route it), with ``join_outputs`` as
    :func:`~nnvm_passes.program.route`'s."""
    if graph is whole or plan.num_devices == 1:
        return graph, plan, assignment, None
    groups = lowered_groups(whole, graph)
    if not groups:
        return graph, plan, assignment, None
    where, found = _Entries(whole, graph, plan), {}
    view = View.of(whole)
    for name, members in groups.items():
        strategies = _as_operator(whole, view, graph, plan, where, name, members)
        if strategies is not None:
            found[name] = strategies
    if not found:
        return graph, plan, assignment, None
    kept = lower_graph(whole, plan.num_devices, keep=frozenset(found),
                       interleave=bool(graph.layouts))
    translated = _translated(plan, graph, kept, where, found)
    check_plan(translated, kept, plan.num_devices)
    new_assignment = assign(kept, translated)
    index = {n.name: i for i, n in enumerate(kept.nodes)}
    if any(new_assignment.ops[index[name]].unrunnable or
           new_assignment.ops[index[name]].fallback for name in found):
        return graph, plan, assignment, None
    # compared as routed: route's passes do not change the bytes copied
    new_program = route(kept, new_assignment, join_outputs=join_outputs, passes=False)
    program = route(graph, assignment, join_outputs=join_outputs, passes=False)
    if moved(new_program) != moved(program):
        return graph, plan, assignment, finished(graph, program)
    return kept, translated, new_assignment, finished(kept, new_program)


def moved(program: Program) -> int:
    """Bytes MXNet copies between devices in one forward pass of ``program``."""
    return sum(c.nbytes for c in program.crossings())


def lowered_groups(whole: Graph, graph: Graph) -> dict[str, list[int]]:
    """Each operator of ``whole`` that ``graph`` lowered, with the nodes of ``graph`` its
    lowering emitted (named ``<name>/<part>``), in order."""
    names = {n.name for n in whole.operators()}
    present = {n.name for n in graph.operators()}
    groups: dict[str, list[int]] = {}
    for i, node in enumerate(graph.nodes):
        base = None if node.is_variable else lowered_from(node.name, names)
        if base is not None and base not in present:
            groups.setdefault(base, []).append(i)
    return groups


def _as_operator(whole: Graph, view: View, graph: Graph, plan: Plan, where: "_Entries",
                 name: str, members: Sequence[int]) -> list | None:
    """Per cut, the strategy of ``whole``'s operator ``name`` (a
    :class:`~tofu_mx.tdl.analysis.Strategy`) storing its output 0 as ``plan`` stores its
    lowering's, or None if it has none at some cut or its lowering reduces or runs whole."""
    if any(s.kind in ("reduce", "whole") for m in members
           for s in where.ops[graph.nodes[m].name].strategies):
        return None
    entry = where.of(name, 0)
    if entry is None:
        return None
    layouts = where.tensors[f"{graph.nodes[entry[0]].name}:{entry[1]}"].layouts
    chosen = []
    for layout, parts in zip(layouts, plan.factors):
        strategies = op_strategies(whole, where.whole_index[name], view, parts)
        fits = [s for s in strategies if _stores(s, layout)]
        if not fits:
            return None
        chosen.append(fits[0])
    return chosen


def _stores(strategy, layout: StoredLayout) -> bool:
    """Whether ``strategy`` leaves output 0 as ``layout`` stores it (no combining)."""
    if layout.replicated:
        return strategy.kind == "replicate"
    out = strategy.output_layouts[0]
    return strategy.kind == "output" and out.kind == "split" and out.axis == layout.axis and \
        out.halo == (0, 0)


class _Entries:
    """Where ``graph`` (``whole`` lowered) holds each output of ``whole``'s operators, and
    ``plan``'s tensors and operators by name."""

    def __init__(self, whole: Graph, graph: Graph, plan: Plan):
        self.tensors = {t.name: t for t in plan.tensors}
        self.ops = {o.name: o for o in plan.ops}
        self.whole_index = {n.name: i for i, n in enumerate(whole.nodes)}
        at = {n.name: i for i, n in enumerate(graph.nodes)}
        self._entries: dict[tuple[int, int], tuple[int, int]] = {}
        for node in whole.nodes:        # what a reader kept in graph reads there
            if node.name in at:
                for p, e in enumerate(node.inputs):
                    found = graph.nodes[at[node.name]].inputs[p]
                    self._entries.setdefault((e.node, e.index), (found.node, found.index))
        for h, e in enumerate(whole.heads):        # or the graph output it is
            self._entries.setdefault((e.node, e.index),
                                     (graph.heads[h].node, graph.heads[h].index))

    def of(self, name: str, j: int) -> tuple[int, int] | None:
        """The entry of ``graph`` standing for output ``j`` of ``whole``'s operator
        ``name``; None where nothing reads it."""
        return self._entries.get((self.whole_index[name], j))


def _translated(plan: Plan, graph: Graph, kept: Graph, where: _Entries, found: dict) -> Plan:
    """``plan`` for ``kept`` (the graph lowered except ``found``'s operators, each given its
    strategy per cut)."""
    tensors, ops = where.tensors, where.ops
    new_tensors, new_ops = [], []
    for node in kept.nodes:
        if node.is_variable:
            new_tensors.append(tensors[node.name])
            continue
        if node.name not in found:
            new_tensors += [tensors[f"{node.name}:{j}"] for j in range(len(node.outputs))]
            new_ops.append(ops[node.name])
            continue
        chosen = found[node.name]
        for j, info in enumerate(node.outputs):
            entry = where.of(node.name, j)
            layouts = tensors[f"{graph.nodes[entry[0]].name}:{entry[1]}"].layouts \
                if entry is not None else tuple(_stored(s, j) for s in chosen)
            new_tensors.append(TensorPlan(f"{node.name}:{j}", "activation", info.shape,
                                          info.dtype, tuple(layouts),
                                          _shard(info.shape, layouts, plan.factors)))
        new_ops.append(OpPlan(node.name, node.op, tuple(OpStrategy.of(s) for s in chosen)))
    names = {n.name for n in kept.operators()}
    return dataclasses.replace(
        plan, tensors=tuple(new_tensors), ops=tuple(new_ops),
        fingerprint=graph_fingerprint(kept),
        kept=tuple(x for x in plan.kept if x[0] in names),
        unlowered=tuple(sorted(found)))


def _stored(strategy, j: int) -> StoredLayout:
    """How ``strategy`` leaves output ``j`` (one it does not describe: replicated)."""
    if j >= len(strategy.output_layouts):
        return REPLICATED_LAYOUT
    out = strategy.output_layouts[j]
    return StoredLayout(out.axis) if strategy.kind == "output" and out.kind == "split" else \
        REPLICATED_LAYOUT


def _shard(shape: Sequence[int], layouts: Sequence[StoredLayout],
           factors: Sequence[int]) -> tuple[int, ...]:
    """The largest piece one device stores (as :func:`~tofu_mx.search.plan.check_plan`
    computes it)."""
    shard = list(shape)
    for layout, parts in zip(layouts, factors):
        if not layout.replicated:
            shard[layout.axis] = -(-shard[layout.axis] // parts)
    return tuple(shard)
