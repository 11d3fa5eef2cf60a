"""Build the search problem of one cut from an analysed graph (policy: what to search).

**Views.** At each level of the recursion every operator has a *work view*: the shapes of
the input regions it reads and of the outputs it computes for one part of the previous cut
(at level 1, the graph's own shapes). Variables have the shape of their stored shard. Each
operator is analysed afresh at its work view, so a split at one level halves the shapes the
next level sees (Tofu's recursion).

**Coarsening**, with no user tags:

1. an operator and its gradient share one choice: only the forward graph is searched, and
   the cost model carries the mirrored backward conversions;
2. *followers*: an operator that keeps the layout of its first input (elementwise ops,
   activations: for every axis it has a strategy reading that input split on the axis and
   writing its output split the same way) joins the group of that input's producer and
   follows its layout;
3. *ties*: the time steps of an unrolled RNN get one choice: groups that read the same
   parameter with the same structure (operators, attributes, shapes) are tied, and so,
   repeatedly, are the groups that each copy of a tied family alone feeds or is fed by with
   one structure. (Tying every structurally identical group, ResNet units say, would keep
   far-apart nodes in the DP's frontier: measured, it made WResNet's states 32x larger.)

**Choices.** A group's choice is its leader's strategy and the layout its outputs are stored
in: as computed when the strategy splits them, else (partial sums, replicated computation)
one choice per axis to store them split on. Every operator can also run *replicated* (each
part computes it whole): the fallback for opaque operators and indivisible shapes.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from nnvm_passes.backward import backward_reads
from nnvm_passes.ir import Graph
from tofu_mx.search.cost import consumer_bytes, converted_bytes, producer_bytes
from tofu_mx.search.problem import Problem, make_problem
from tofu_mx.tdl.analysis import Layout, Strategy
from tofu_mx.tdl.annotate import annotate, replicate_strategy
from tofu_mx.tdl.registry import facts

Shape = tuple[int, ...]
StoreLayout = tuple  # ("split", axis) or ("replicated",)
REPLICATED: StoreLayout = ("replicated",)


@dataclass(frozen=True)
class View:
    """Shapes at one level: each operator's work view, each variable's stored shard, and the
    stored shard of each operator output (which a partial or replicated computation's work
    view may exceed: a cut may only split what is stored along an axis it divides)."""

    op_in: dict[int, tuple[Shape, ...]]
    op_out: dict[int, tuple[Shape, ...]]
    var: dict[int, Shape]
    shard: dict[tuple[int, int], Shape]

    @staticmethod
    def of(graph: Graph) -> "View":
        ops = [i for i, n in enumerate(graph.nodes) if not n.is_variable]
        return View({i: tuple(graph.tensor(e).shape for e in graph.nodes[i].inputs) for i in ops},
                    {i: tuple(t.shape for t in graph.nodes[i].outputs) for i in ops},
                    {i: n.outputs[0].shape for i, n in enumerate(graph.nodes) if n.is_variable},
                    {(i, k): t.shape for i in ops for k, t in enumerate(graph.nodes[i].outputs)})


def op_strategies(graph: Graph, index: int, view: View, parts: int) -> list[Strategy]:
    """The strategies of one operator at its work view (:func:`tofu_mx.tdl.annotate.annotate`)."""
    node = graph.nodes[index]
    return list(annotate(node.op, node.attrs, view.op_in[index], view.op_out[index],
                         parts).strategies)


def store_layouts(shape: Shape, parts: int) -> list[StoreLayout]:
    """Layouts a tensor may be stored in: split on any axis ``parts`` divides, else whole."""
    return list(_store_layouts(tuple(shape), parts))


@functools.lru_cache(maxsize=1 << 14)
def _store_layouts(shape: Shape, parts: int) -> tuple[StoreLayout, ...]:
    found = [("split", a) for a, n in enumerate(shape) if n % parts == 0 and n >= parts]
    return tuple(found) or (REPLICATED,)


def layout_name(layout: StoreLayout) -> str:
    return "replicated" if layout[0] == "replicated" else f"split({layout[1]})"


@dataclass
class Group:
    """Operators sharing one choice: ``copies[c]`` is one copy's members in graph order."""

    copies: list[list[int]]
    choices: list[tuple[int, StoreLayout | None]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)

    @property
    def first(self) -> int:
        return min(m for copy in self.copies for m in copy)


def _preserves_layout(strats: list[Strategy], in_shape: Shape, out_shape: Shape,
                      parts: int) -> dict[int, int] | None:
    """axis -> index of the strategy reading input 0 and writing output 0 split on it."""
    if in_shape != out_shape:
        return None
    found = {}
    for a, n in enumerate(in_shape):
        if n % parts or n < parts:
            continue
        for k, s in enumerate(strats):
            if s.kind == "output" and len(s.output_layouts) == 1 and \
                    s.input_layouts[0] == Layout("split", a) and \
                    s.output_layouts[0] == Layout("split", a):
                found[a] = k
                break
        else:
            return None
    return found


class Cut:
    """The problem of one cut into ``parts`` at one view, and how to read its solution."""

    def __init__(self, graph: Graph, view: View, parts: int, tie: bool = True,
                 needs_grad: dict | None = None, memory_weight: float = 0.0):
        self.graph, self.view, self.parts = graph, view, parts
        self.memory_weight = memory_weight
        self.ops = [i for i, n in enumerate(graph.nodes) if not n.is_variable]
        self.strats = {i: op_strategies(graph, i, view, parts) for i in self.ops}
        self.needs_grad = needs_grad_of(graph) if needs_grad is None else needs_grad
        self.follow: dict[int, dict[int, int]] = {}
        self.groups = self._coarsen(tie)
        self.variables = [i for i, n in enumerate(graph.nodes) if n.is_variable]
        self.var_layouts = {v: store_layouts(view.var[v], parts) for v in self.variables}
        for g in self.groups:
            self._enumerate_choices(g)

    # --- coarsening -------------------------------------------------------------------------
    def _coarsen(self, tie: bool) -> list[Group]:
        owner: dict[int, list[int]] = {}
        copies: list[list[int]] = []
        for i in self.ops:
            node = self.graph.nodes[i]
            src = node.inputs[0].node if node.inputs else None
            rule = None
            if src is not None and not self.graph.nodes[src].is_variable and \
                    len(node.outputs) == 1 and node.inputs[0].index == 0:
                rule = _preserves_layout(self.strats[i], self.view.op_in[i][0],
                                         self.view.op_out[i][0], self.parts)
            if rule is not None:
                self.follow[i] = rule
                owner[i] = owner[src]
                owner[i].append(i)
            else:
                owner[i] = [i]
                copies.append(owner[i])
        if not tie:
            return [Group([c]) for c in copies]
        return self._tie(copies)

    def _tie(self, copies: list[list[int]]) -> list[Group]:
        """Tie the copies of an unrolled RNN step: groups that read the same parameter with the
        same structure, then, repeatedly, the groups that each copy of a tied family feeds
        (or is fed by) alone with one structure."""
        signatures: dict[int, int] = {}
        interned: dict[tuple, int] = {}

        def sig(k: int) -> int:   # computed only for the copies that ties can reach, as an id
            if k not in signatures:
                signatures[k] = interned.setdefault(self._signature(copies[k]), len(interned))
            return signatures[k]
        of_node = {m: k for k, c in enumerate(copies) for m in c}
        parent = list(range(len(copies)))

        def find(a):
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        def union(a, b):
            a, b = find(a), find(b)
            if a != b and sig(a) == sig(b):
                parent[max(a, b)] = min(a, b)
                return True
            return False

        readers: dict[int, list[int]] = {}
        succ: list[set[int]] = [set() for _ in copies]
        pred: list[set[int]] = [set() for _ in copies]
        for k, c in enumerate(copies):
            for m in c:
                for e in self.graph.nodes[m].inputs:
                    src = self.graph.nodes[e.node]
                    if src.is_variable and src.kind == "param":
                        readers.setdefault(e.node, []).append(k)
                    elif not src.is_variable and of_node[e.node] != k:
                        succ[of_node[e.node]].add(k)
                        pred[k].add(of_node[e.node])
        for ks in readers.values():
            first_of: dict[int, int] = {}
            for k in ks:
                union(first_of.setdefault(sig(k), k), k)
        changed = True
        while changed:
            changed = False
            families: dict[int, list[int]] = {}
            for k in range(len(copies)):
                families.setdefault(find(k), []).append(k)
            for members in families.values():
                if len(members) < 2:
                    continue
                for links in (succ, pred):
                    by_sig: dict[int, list[int]] = {}
                    for k in members:
                        for n in links[k]:
                            by_sig.setdefault(sig(n), []).append(n)
                    for ns in by_sig.values():
                        if len(ns) == len(members) and len(set(map(find, ns))) == len(ns):
                            for n in ns[1:]:
                                changed |= union(ns[0], n)
        groups: dict[int, Group] = {}
        for k, c in enumerate(copies):
            groups.setdefault(find(k), Group([])).copies.append(c)
        return list(groups.values())

    def _signature(self, members: list[int]) -> tuple:
        position = {m: k for k, m in enumerate(members)}
        parts = []
        for m in members:
            node = self.graph.nodes[m]
            parts.append((node.op, node.attrs, self.view.op_in[m], self.view.op_out[m],
                          position.get(node.inputs[0].node) if node.inputs else None))
        return tuple(parts)

    def _layouts_for(self, member: int, j: int) -> list[StoreLayout]:
        """Layouts output ``j`` may be stored in: axes the cut divides in its work view and in
        its stored shard alike."""
        shard = self.view.shard[(member, j)]
        ok = [lay for lay in store_layouts(self.view.op_out[member][j], self.parts)
              if lay == REPLICATED or shard[lay[1]] % self.parts == 0]
        return ok or [REPLICATED]

    def _as_computed(self, s: Strategy, j: int, member: int) -> StoreLayout | None:
        """The split output ``j`` is computed in, when it can be stored that way (no move)."""
        produced = s.output_layouts[j]
        layout = ("split", produced.axis)
        if produced.kind == "split" and produced.halo == (0, 0) and \
                layout in self._layouts_for(member, j):
            return layout
        return None

    def _enumerate_choices(self, group: Group) -> None:
        leader = group.copies[0][0]
        for k, s in enumerate(self.strats[leader]):
            if self._as_computed(s, 0, leader) is not None:
                group.choices.append((k, None))
                group.labels.append(f"{s.name}")
                continue
            for layout in self._layouts_for(leader, 0):
                group.choices.append((k, layout))
                group.labels.append(f"{s.name} -> {layout_name(layout)}")

    # --- resolving a choice -----------------------------------------------------------------
    def resolve(self, group: Group, choice: int) -> dict[int, tuple[Strategy, tuple]]:
        """member -> (its strategy, the stored layout of each of its outputs)."""
        k, store = group.choices[choice]
        result = {}
        for copy in group.copies:
            leader = copy[0]
            s = self.strats[leader][k]
            result[leader] = (s, self._stored_all(leader, s, store))
            for m in copy[1:]:
                src = self.graph.nodes[m].inputs[0].node
                src_layout = result[src][1][self.graph.nodes[m].inputs[0].index]
                rule = self.follow[m]
                if src_layout[0] == "split" and src_layout[1] in rule and \
                        src_layout in self._layouts_for(m, 0):
                    fs = self.strats[m][rule[src_layout[1]]]
                    result[m] = (fs, (src_layout,))
                else:   # its input is stored whole: read it whole, compute all of it
                    fs = replicate_strategy(self.view.op_in[m], self.view.op_out[m], self.parts)
                    result[m] = (fs, self._stored_all(m, fs, None))
        return result

    def _stored_all(self, member: int, s: Strategy, store: StoreLayout | None) -> tuple:
        """Stored layout of every output; a hidden output the description does not cover (a
        pooling workspace, BatchNorm's saved statistics) lives with the operator's shard: it
        follows output 0 when it has its shape, and is kept whole (it is small) otherwise."""
        shapes = self.view.op_out[member]
        described = [self._stored(s, j, store, member) for j in range(len(s.outputs))]
        hidden = [described[0] if shapes[j] == shapes[0] else REPLICATED
                  for j in range(len(s.outputs), len(shapes))]
        return tuple(described + hidden)

    def _stored(self, s: Strategy, j: int, store: StoreLayout | None, member: int) -> StoreLayout:
        computed = self._as_computed(s, j, member)
        if computed is not None:
            return computed
        options = self._layouts_for(member, j)
        if store is not None and store in options:
            return store
        return options[0]

    # --- the problem ------------------------------------------------------------------------
    def problem(self) -> "CutProblem":
        """The labelling problem of this cut: one node per group and per variable, in graph
        order, with the bytes each choice moves (and, with a memory weight, what it keeps)."""
        nodes: list[tuple[int, Group | int]] = [(g.first, g) for g in self.groups]
        nodes += [(v, v) for v in self.variables]
        nodes.sort(key=lambda t: t[0])
        slots = tuple(obj for _, obj in nodes)
        slot_of: dict[int, int] = {}
        for k, obj in enumerate(slots):
            members = [m for copy in obj.copies for m in copy] if isinstance(obj, Group) else [obj]
            slot_of.update((m, k) for m in members)
        names, choices, unary, resolved = [], [], [], []
        for obj in slots:
            if isinstance(obj, Group):
                names.append(self.graph.nodes[obj.copies[0][0]].name)
                choices.append(obj.labels)
                rs = tuple(self.resolve(obj, c) for c in range(len(obj.choices)))
                resolved.append(rs)
                unary.append(np.array([self._producer_cost(r) for r in rs], dtype=np.float64))
            else:
                names.append(self.graph.nodes[obj].name)
                choices.append([layout_name(x) for x in self.var_layouts[obj]])
                resolved.append(tuple(self.var_layouts[obj]))
                unary.append(np.zeros(len(self.var_layouts[obj])))
        edges, seen = [], set()
        for k, obj in enumerate(slots):
            if not isinstance(obj, Group):
                continue
            for copy in obj.copies:
                for m in copy:
                    for j, entry in enumerate(self.graph.nodes[m].inputs):
                        # Tied copies (RNN steps) reading the same tensor in the same region
                        # share one fetched copy, and sum their gradients before reducing it.
                        key = (k, entry.node, entry.index, self.view.op_in[m][j],
                               tuple(r[m][0].inputs[j] for r in resolved[k]))
                        if key not in seen:
                            seen.add(key)
                            edges.append(self._edge(k, m, j, entry, slot_of, resolved))
        bytes_problem = make_problem(names, choices, unary, [e[:3] for e in edges])
        weighted = bytes_problem if not self.memory_weight else make_problem(
            names, choices, unary,
            [(u, v, b + self.memory_weight * kept) for u, v, b, kept in edges])
        return CutProblem(weighted, bytes_problem, slots, slot_of, tuple(resolved))

    def _edge(self, k: int, member: int, j: int, entry, slot_of: dict[int, int],
              resolved: list):
        """``(source slot, slot, bytes moved, bytes of converted copies the backward pass
        keeps)``, each matrix indexed by the source's and this slot's choices."""
        src_slot = slot_of[entry.node]
        tensor = self.graph.nodes[entry.node].outputs[entry.index]
        grad = self.needs_grad[(entry.node, entry.index)]
        shape = self.view.op_in[member][j]
        itemsize = np.dtype(tensor.dtype).itemsize
        if self.graph.nodes[entry.node].is_variable:
            src_layouts = resolved[src_slot]
        else:
            src_layouts = [r[entry.node][1][entry.index] for r in resolved[src_slot]]
        needs = [r[member][0].inputs[j] for r in resolved[k]]
        kept = self.memory_weight and self._keeps_input(member, j)
        if src_slot == k:   # inside the group: both ends move together
            cost = [_consumer(src_layouts[c], shape, needs[c], itemsize, grad)
                    for c in range(len(needs))]
            buf = [_buffer(src_layouts[c], shape, needs[c], itemsize) if kept else 0
                   for c in range(len(needs))]
            return (k, k, np.diag(np.array(cost, dtype=np.float64)),
                    np.diag(np.array(buf, dtype=np.float64)))
        m = np.array([[_consumer(a, shape, need, itemsize, grad) for need in needs]
                      for a in src_layouts], dtype=np.float64)
        buf = np.array([[_buffer(a, shape, need, itemsize) if kept else 0 for need in needs]
                        for a in src_layouts], dtype=np.float64)
        return (src_slot, k, m, buf)

    def _keeps_input(self, member: int, j: int) -> bool:
        """Whether operator ``member``'s gradient reads its input ``j`` (so a converted copy
        of it lives until the backward pass)."""
        node = self.graph.nodes[member]
        if not any(self.needs_grad[(member, o)] for o in range(len(node.outputs))):
            return False
        return j in backward_reads(node, self.graph)[0]

    def _producer_cost(self, resolved: dict) -> float:
        total = 0
        for m, (s, stored) in resolved.items():
            for j, layout in enumerate(stored):
                tensor = self.graph.nodes[m].outputs[j]
                if j >= len(s.outputs):
                    continue
                total += _producer(layout, self.view.op_out[m][j], s.outputs[j],
                                   s.output_layouts[j].kind == "partial",
                                   np.dtype(tensor.dtype).itemsize, self.needs_grad[(m, j)])
        return float(total)


@dataclass(frozen=True)
class CutProblem:
    """One cut's search problem, and how to read a solution of it."""

    problem: Problem                  # what the search minimises (bytes + weighted memory)
    bytes_problem: Problem            # the same choices, costed in bytes moved alone
    slots: tuple                      # problem node -> its Group, or a variable's node index
    slot_of: Mapping[int, int]        # graph node -> problem node
    resolved: tuple                   # problem node -> per choice: a group's
    #                                   {member: (Strategy, stored layouts)}, a variable's layout

    def members(self, assignment: Sequence[int]) -> dict[int, tuple[Strategy, tuple]]:
        """Every operator's strategy and stored output layouts under ``assignment``."""
        found = {}
        for slot, obj in enumerate(self.slots):
            if isinstance(obj, Group):
                found.update(self.resolved[slot][assignment[slot]])
        return found

    def var_layouts(self, assignment: Sequence[int]) -> dict[int, StoreLayout]:
        """Every variable's stored layout under ``assignment``."""
        return {obj: self.resolved[slot][assignment[slot]]
                for slot, obj in enumerate(self.slots) if not isinstance(obj, Group)}

    def stored_output(self, slot: int, choice: int) -> StoreLayout:
        """The stored layout of the slot's first tensor (a group leader's output 0, or the
        variable) under ``choice``."""
        obj = self.slots[slot]
        if isinstance(obj, Group):
            return self.resolved[slot][choice][obj.copies[0][0]][1][0]
        return self.resolved[slot][choice]


@functools.lru_cache(maxsize=1 << 18)
def _consumer(layout, shape, need, itemsize, grad):
    return consumer_bytes(layout, shape, need, itemsize, grad)


@functools.lru_cache(maxsize=1 << 18)
def _buffer(layout, shape, need, itemsize):
    return converted_bytes(layout, shape, need, itemsize)


@functools.lru_cache(maxsize=1 << 18)
def _producer(layout, shape, produced, partial, itemsize, grad):
    return producer_bytes(layout, shape, produced, partial, itemsize, grad)


def needs_grad_of(graph: Graph) -> dict[tuple[int, int], bool]:
    """Whether each tensor carries a gradient: parameters do, and whatever is computed from
    them, except through an operator that declares no gradient (BlockGrad, argmax)."""
    grad: dict[tuple[int, int], bool] = {}
    for i, node in enumerate(graph.nodes):
        if node.is_variable:
            grad[(i, 0)] = node.kind == "param"
            continue
        flows = facts(node.op, node.params).gradient and \
            any(grad[(e.node, e.index)] for e in node.inputs)
        for k in range(len(node.outputs)):
            grad[(i, k)] = flows
    return grad


def next_view(cut: Cut, resolved_by_member: dict[int, tuple[Strategy, tuple]],
              var_layout: dict[int, StoreLayout]) -> View:
    """The work view of one part after this cut: what each operator reads and computes."""
    op_in, op_out, var, shard = {}, {}, {}, {}
    for i in cut.ops:
        s, stored = resolved_by_member[i]
        for k, layout in enumerate(stored):
            shape = list(cut.view.shard[(i, k)])
            if layout[0] == "split":
                shape[layout[1]] //= cut.parts
            shard[(i, k)] = tuple(shape)
        op_in[i] = tuple(_box_shape(s.inputs[j], cut.view.op_in[i][j])
                         for j in range(len(cut.view.op_in[i])))
        op_out[i] = tuple(_box_shape(s.outputs[k], cut.view.op_out[i][k])
                          if k < len(s.outputs) and s.output_layouts[k].kind != "partial"
                          else cut.view.op_out[i][k] for k in range(len(cut.view.op_out[i])))
    for v in cut.variables:
        shape = list(cut.view.var[v])
        layout = var_layout[v]
        if layout[0] == "split":
            shape[layout[1]] //= cut.parts
        var[v] = tuple(shape)
    return View(op_in, op_out, var, shard)


def _box_shape(regions, fallback: Shape) -> Shape:
    boxes = [r for r in regions if r is not None]
    if not boxes:
        return fallback
    return tuple(max(b[a][1] - b[a][0] + 1 for b in boxes) for a in range(len(fallback)))


__all__ = ["Cut", "CutProblem", "Group", "REPLICATED", "View", "layout_name", "next_view", "op_strategies",
           "replicate_strategy", "store_layouts", "needs_grad_of"]
