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
   one structure (:mod:`tofu_mx.search.ties`). (Tying every structurally identical group,
   ResNet units say, would keep far-apart nodes in the DP's frontier: measured, it made
   WResNet's states 32x larger.)

**Choices.** A group's choice is its leader's strategy and the layout its outputs are stored
in: as computed when the strategy splits them, else (partial sums, replicated computation)
one choice per axis to store them split on. Every operator can also run *replicated* (each
part computes it whole): the fallback for opaque operators and indivisible shapes.

**Work done once per structure.** Graphs repeat themselves (ResNet units, RNN steps,
Transformer layers), so a cut works per distinct structure, not per operator: operators
with one operator, attributes and work view are one *kind*, analysed once; copies whose
members have the same kinds, stored shards, dtypes and wiring are resolved once per
choice, with one producer cost; edges whose ends resolve alike share one cost matrix
(read-only). What no level changes (which operators may follow, which tensors carry a
gradient, the ties of a coarsening already seen) is a
:class:`~tofu_mx.search.structure.GraphStructure`, made once per graph and shared by every cut
of every factor order.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Mapping, Sequence

import numpy as np

from nnvm_passes.ir import Graph
from tofu_mx.search import ties
from tofu_mx.search.cost import (consumer_bytes, converted_bytes, intersect,
                                  producer_bytes, stored_regions, volume)
from tofu_mx.search.problem import (Problem, by_first_appearance, distinct_rows,
                                    make_indexed_problem)
from tofu_mx.search.structure import GraphStructure, itemsize_of, needs_grad_of
from tofu_mx.tdl.analysis import Layout, Strategy
from tofu_mx.tdl.annotate import annotate, replicate_strategy

Shape = tuple[int, ...]
StoreLayout = tuple  # ("split", axis) or ("replicated",)
REPLICATED: StoreLayout = ("replicated",)


@dataclass(frozen=True)
class View:
    """Shapes at one level: each operator's work view (its largest part's), each variable's
    stored shard, and the stored shard of each operator output (which a partial or replicated
    computation's work view may exceed). A stored shard is the smallest part's: a cut may
    only split what every part stores along an axis at least as long as the cut."""

    op_in: dict[int, tuple[Shape, ...]]
    op_out: dict[int, tuple[Shape, ...]]
    var: dict[int, Shape]
    shard: dict[int, tuple[Shape, ...]]     # operator -> the stored shard of each output
    #: operator -> its loop variables that an earlier cut split unevenly: the work view has
    #: their largest part, and some part may be one shorter
    short: Mapping[int, frozenset[str]] = field(default_factory=dict)
    #: operator -> a class: operators of one class have one operator, attributes, work view,
    #: stored shards and short variables (None: not known)
    classes: Mapping[int, int] | None = None

    @staticmethod
    def of(graph: Graph) -> "View":
        """The graph's own shapes (what is computed is stored), with classes: operators of
        one operator, attribute object and input and output TensorInfo objects (shared, alive
        in the graph), whose work views are one tuple."""
        nodes = graph.nodes
        op_in, op_out, var, classes = {}, {}, {}, {}
        found: dict[tuple, tuple] = {}     # class key -> (class, work-view ins, outs)
        for i, n in enumerate(nodes):
            outputs = n.outputs
            if n.is_variable:
                var[i] = outputs[0].shape
                continue
            ins = [nodes[e.node].outputs[e.index] for e in n.inputs]
            key = (n.op, id(n.attrs), *map(id, outputs), None, *map(id, ins))
            known = found.get(key)
            if known is None:
                known = found[key] = (len(found), tuple([t.shape for t in ins]),
                                      tuple([t.shape for t in outputs]), n.attrs, outputs, ins)
            classes[i], op_in[i], op_out[i] = known[:3]
        return View(op_in, op_out, var, op_out, classes=classes)


def op_strategies(graph: Graph, index: int, view: View, parts: int) -> list[Strategy]:
    """The strategies of one operator at its work view (:func:`tofu_mx.tdl.annotate.annotate`),
    less those that would leave a part empty: splitting a variable an earlier cut split
    unevenly, whose shortest part may be one less than the work view's."""
    node = graph.nodes[index]
    return list(annotate(node.op, node.attrs, view.op_in[index], view.op_out[index], parts,
                         view.short.get(index)).strategies)


def store_layouts(shape: Shape, parts: int) -> list[StoreLayout]:
    """Layouts a tensor may be stored in: split on any axis at least ``parts`` long (into
    parts that differ by at most one), else whole."""
    return list(_store_layouts(tuple(shape), parts))


@functools.lru_cache(maxsize=1 << 14)
def _store_layouts(shape: Shape, parts: int) -> tuple[StoreLayout, ...]:
    found = [("split", a) for a, n in enumerate(shape) if n >= parts]
    return tuple(found) or (REPLICATED,)


@functools.lru_cache(maxsize=1 << 16)
def _storable(shape: Shape, shard: Shape, parts: int) -> tuple[StoreLayout, ...]:
    """Layouts an output of work-view ``shape`` whose stored shard is ``shard`` may be stored
    in: axes at least as long as the cut in both."""
    ok = tuple(lay for lay in _store_layouts(shape, parts)
               if lay == REPLICATED or shard[lay[1]] >= parts)
    return ok or (REPLICATED,)


def layout_name(layout: StoreLayout) -> str:
    return "replicated" if layout[0] == "replicated" else f"split({layout[1]})"


@dataclass
class Group:
    """Operators sharing one choice: ``copies[c]`` is one copy's members in graph order."""

    copies: list[list[int]]
    choices: tuple[tuple[int, StoreLayout | None], ...] = ()
    labels: tuple[str, ...] = ()


def _preserves_layout(strats: list[Strategy], in_shape: Shape, out_shape: Shape,
                      parts: int) -> dict[int, int] | None:
    """axis -> index of the strategy reading input 0 and writing output 0 split on it."""
    if in_shape != out_shape:
        return None
    first: dict[int, int] = {}      # axis -> the first such strategy
    for k, s in enumerate(strats):
        if s.kind == "output" and len(s.output_layouts) == 1:
            read = s.input_layouts[0]
            if read.kind == "split" and read == Layout("split", read.axis) and \
                    s.output_layouts[0] == read and read.axis not in first:
                first[read.axis] = k
    found = {}
    for a, n in enumerate(in_shape):
        if n < parts:
            continue
        if a not in first:
            return None
        found[a] = first[a]
    return found


class Cut:
    """The problem of one cut into ``parts`` at one view, and how to read its solution.

    Per-structure tables (see the module's docstring): ``_kind_of`` (operator -> kind),
    ``_shape_id`` (operator -> kind and stored shards), ``_copy_keys`` (a copy's first
    member -> its structure id), and the memos ``_rows`` and ``_bytes`` (a structure and a
    choice -> its members' resolution, its producer bytes), ``_choice_sets`` (shape id of a
    leader -> its choices), ``_resolutions`` (a group's choices and copy structures -> its
    rows and producer costs), ``_interned`` (each distinct tuple of layouts or regions, by
    id), ``_ends`` (a copy structure -> the ids of what its members hold and read),
    ``_matrices`` (an edge's ends -> its cost matrices), ``_kept`` and ``_fetched`` (an
    edge's ends and choices -> :meth:`kept_copies`, :meth:`second_fetches`)."""

    def __init__(self, graph: Graph, view: View, parts: int, tie: bool = True,
                 needs_grad: dict | None = None, memory_weight: float = 0.0,
                 refetch: bool = False, structure: GraphStructure | None = None,
                 kept_tensors: frozenset = frozenset(), conversion_bytes: float = 0.0):
        self.graph, self.view, self.parts = graph, view, parts
        self.memory_weight, self.refetch = memory_weight, refetch
        self.conversion_bytes = conversion_bytes    # SearchOptions.conversion_bytes
        self.kept_tensors = kept_tensors    # (node, output): copies kept even when refetching
        self.structure = structure if structure is not None else \
            GraphStructure.of(graph, needs_grad)
        self.needs_grad = self.structure.needs_grad
        self.ops = list(self.structure.ops)
        self.variables = list(self.structure.variables)
        self._classify()
        self.follow: dict[int, dict[int, int]] = {}   # follower -> its rule (_coarsen)
        self._copy_keys: dict[int, int] = {}
        self._choice_sets: dict[int, tuple] = {}
        self.groups = self._coarsen(tie)
        self._rows: dict[tuple, tuple] = {}
        self._bytes: dict[tuple, int] = {}
        self._excess: dict[tuple, float] = {}   # with a memory weight: bytes stored above 1/p
        self._conversions: dict[tuple, int] = {}    # passes converting (conversion_bytes)
        self._resolutions: dict[tuple, tuple] = {}
        self._interned: list[tuple] = []
        self._intern_ids: dict[tuple, int] = {}
        self._ends: dict[tuple, int | tuple] = {}
        self._matrices: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._kept: dict[tuple, tuple[int, bool]] = {}
        self._fetched: dict[tuple, int] = {}

    def _classify(self) -> None:
        """Each operator's kind (one analysis per operator, attributes and work view) and
        shape id (its kind and the stored shards of its outputs), computed once per class
        of the view where it has them."""
        nodes, view = self.graph.nodes, self.view
        kinds: dict[tuple, int] = {}
        shapes: dict[tuple, int] = {}
        strategies: list[list[Strategy]] = []
        op_in, op_out, shard, short = view.op_in, view.op_out, view.shard, view.short
        ops = self.ops
        if view.classes is not None and ops:    # the first operator of each class, in order
            which, first = by_first_appearance(
                np.fromiter(map(view.classes.__getitem__, ops), np.int64, len(ops)))
            picked = [ops[k] for k in first.tolist()]
        else:
            picked, which = ops, None
        found_kind, found_shape = [], []
        for i in picked:
            node = nodes[i]
            kind = kinds.setdefault((node.op, node.attrs, op_in[i], op_out[i],
                                     short.get(i) if short else None), len(kinds))
            if kind == len(strategies):
                strategies.append(op_strategies(self.graph, i, view, self.parts))
            found_kind.append(kind)
            found_shape.append(shapes.setdefault((kind, shard[i]), len(shapes)))
        if which is not None:
            at = which.tolist()
            found_kind = list(map(found_kind.__getitem__, at))
            found_shape = list(map(found_shape.__getitem__, at))
        self._kind_of = dict(zip(ops, found_kind))
        self._shape_id = dict(zip(ops, found_shape))
        self.strats = dict(zip(ops, map(strategies.__getitem__, found_kind)))

    # --- coarsening -------------------------------------------------------------------------
    def _coarsen(self, tie: bool) -> list[Group]:
        """The groups: each operator that keeps its first input's layout (under one rule
        per kind) joins the copy of that input's producer, the others lead a copy; copies
        are ordered by leader, members by graph order. Then the ties (:meth:`_tie`)."""
        ops, (candidate, source) = self.structure.op_arrays()
        view, kind_of = self.view, self._kind_of
        # each candidate's rule, once per kind
        kinds = np.fromiter(map(kind_of.__getitem__, candidate.tolist()), np.int64,
                            len(candidate))
        _, first, which = np.unique(kinds, return_index=True, return_inverse=True)
        rules = [_preserves_layout(self.strats[i], view.op_in[i][0], view.op_out[i][0],
                                   self.parts) for i in candidate[first].tolist()]
        follows = np.array([r is not None for r in rules], dtype=bool)[which.reshape(-1)] \
            if len(rules) else np.zeros(0, dtype=bool)
        followers, producer = candidate[follows], source[follows]
        self.follow = dict(zip(followers.tolist(),
                               map(rules.__getitem__, which.reshape(-1)[follows].tolist())))
        # each operator's leader: its producers' chain followed up (pointer jumping)
        leader = np.arange(len(self.graph.nodes), dtype=np.int64)
        leader[followers] = producer
        while True:
            up = leader[leader]
            if np.array_equal(up, leader):
                break
            leader = up
        order = np.argsort(leader[ops], kind="stable")   # by copy, then graph order
        members = ops[order]
        roots = leader[members]
        start = np.flatnonzero(np.concatenate([[True], roots[1:] != roots[:-1]])) \
            if len(members) else np.zeros(0, dtype=np.int64)
        end = np.append(start[1:], len(members))
        copy_of = np.zeros(len(self.graph.nodes), dtype=np.int64)     # operator -> its copy
        copy_of[members] = np.repeat(np.arange(len(start)), end - start)
        at = np.zeros(len(self.graph.nodes), dtype=np.int64)  # operator -> its place there
        at[members] = np.arange(len(members)) - np.repeat(start, end - start)
        # each member's wiring: the place in its copy of its first input's producer (-1: the
        # leader)
        wired = np.full(len(self.graph.nodes), -1, dtype=np.int64)
        wired[followers] = at[producer]
        spans = list(zip(start.tolist(), end.tolist()))
        listed, wiring = members.tolist(), wired[members]
        copies = [listed[a:b] for a, b in spans]
        self._key_copies(copies, spans, members, wiring)
        if not tie or not self.structure.shared_params:
            return self._groups([[c] for c in copies])     # no parameter is read twice
        ids: dict[tuple, int] = {}
        listed_wiring = wiring.tolist()

        def signature(k: int) -> int:
            """Copy ``k``'s signature: its members' kinds and wiring."""
            a, b = spans[k]
            return ids.setdefault(tuple(zip(map(kind_of.__getitem__, copies[k]),
                                            listed_wiring[a:b])), len(ids))
        if not self._may_tie(copy_of, signature):
            return self._groups([[c] for c in copies])
        ids.clear()     # numbered in copy order
        return self._tie(copies, [signature(k) for k in range(len(copies))])

    def _may_tie(self, copy_of: np.ndarray, signature) -> bool:
        """Whether two copies of one signature (``signature(copy)``) read one parameter:
        where ties start (:func:`tofu_mx.search.ties.tie` ties nothing otherwise)."""
        for readers in self.structure.shared_params:
            seen: dict[int, int] = {}
            for m in readers:
                k = int(copy_of[m])
                if k not in seen.values() and seen.setdefault(signature(k), k) != k:
                    return True
        return False

    def _key_copies(self, copies: list[list[int]], spans: list[tuple[int, int]],
                    members: np.ndarray, wiring: np.ndarray) -> None:
        """Each copy's structure id: its members' shape ids, dtypes, gradients and wiring
        (``members``: the copies' members, copy after copy, ``spans`` each copy's; ``wiring``:
        each member's, the position in its copy of its first input's producer, -1 for the
        leader)."""
        if not copies:
            return
        listed = members.tolist()
        shape = np.fromiter(map(self._shape_id.__getitem__, listed), np.int64, len(listed))
        outputs = np.fromiter(map(self.structure.outputs_id.__getitem__, listed), np.int64,
                              len(listed))
        # one integer per member for the three (each within its range)
        code = ((shape * (int(outputs.max()) + 1) + outputs) * (int(wiring.max()) + 2) +
                wiring + 1).tolist()
        ids: dict[tuple, int] = {}
        self._copy_keys = dict(zip([c[0] for c in copies],
                                   [ids.setdefault(tuple(code[a:b]), len(ids))
                                    for a, b in spans]))

    def _tie(self, copies: list[list[int]], signature: list[int]) -> list[Group]:
        """Tie the copies of an unrolled RNN step (:func:`tofu_mx.search.ties.tie`), or reuse
        the ties of an earlier level with the same followers and signatures."""
        key = (tuple(self.follow), tuple(signature))
        families = self.structure.tie_memo.get(key)
        if families is None:
            params, producers = self._inputs_by_copy(copies)
            families = ties.tie(signature, ties.readers(params), producers)
            self.structure.remember_ties(key, families)
        return self._groups([[copies[k] for k in family] for family in families])

    def _inputs_by_copy(self, copies: list[list[int]]) -> tuple[list[list[int]],
                                                                list[list[int]]]:
        """The parameters each copy reads, and the copies it reads from (itself left out),
        in member and input order."""
        nodes = self.graph.nodes
        of_node = {m: k for k, c in enumerate(copies) for m in c}
        params: list[list[int]] = []
        producers: list[list[int]] = []
        for k, c in enumerate(copies):
            params.append([])
            producers.append([])
            for m in c:
                for e in nodes[m].inputs:
                    src = nodes[e.node]
                    if src.is_variable and src.kind == "param":
                        params[-1].append(e.node)
                    elif not src.is_variable and of_node[e.node] != k:
                        producers[-1].append(of_node[e.node])
        return params, producers

    def _layouts_for(self, member: int, j: int) -> tuple[StoreLayout, ...]:
        """Layouts output ``j`` may be stored in: axes the cut divides in its work view and in
        its stored shard alike."""
        return _storable(self.view.op_out[member][j], self.view.shard[member][j], self.parts)

    def _as_computed(self, s: Strategy, j: int, member: int) -> StoreLayout | None:
        """The split output ``j`` is computed in, when it can be stored that way (no move)."""
        produced = s.output_layouts[j]
        layout = ("split", produced.axis)
        if produced.kind == "split" and produced.halo == (0, 0) and \
                layout in self._layouts_for(member, j):
            return layout
        return None

    def _groups(self, copies: list[list[list[int]]]) -> list[Group]:
        """A group of each list of copies, with its choices (:meth:`_choice_set`)."""
        shape_id, sets = self._shape_id, self._choice_sets
        groups = []
        for c in copies:
            found = sets.get(shape_id[c[0][0]])
            if found is None:
                found = self._choice_set(c[0][0])
            groups.append(Group(c, *found))
        return groups

    def _choice_set(self, leader: int) -> tuple[tuple, tuple[str, ...]]:
        """The choices of a group led by ``leader``, and their labels (computed once per
        leader shape id; shared, immutable)."""
        shape_id = self._shape_id[leader]
        if shape_id not in self._choice_sets:
            choices, labels = [], []
            for k, s in enumerate(self.strats[leader]):
                if self._as_computed(s, 0, leader) is not None:
                    choices.append((k, None))
                    labels.append(f"{s.name}")
                    continue
                for layout in self._layouts_for(leader, 0):
                    choices.append((k, layout))
                    labels.append(f"{s.name} -> {layout_name(layout)}")
            self._choice_sets[shape_id] = (tuple(choices), tuple(labels))
        return self._choice_sets[shape_id]

    # --- resolving a choice -----------------------------------------------------------------
    def resolve(self, group: Group, choice: int) -> dict[int, tuple[Strategy, tuple]]:
        """member -> (its strategy, the stored layout of each of its outputs)."""
        found = {}
        for copy in group.copies:
            found.update(zip(copy, self._row(copy, group.choices[choice])))
        return found

    def _row(self, copy: list[int], choice: tuple) -> tuple:
        """The copy's members' (strategy, stored layouts) under ``choice``, in copy order:
        resolved once per copy structure and choice."""
        key = (self._copy_keys[copy[0]], choice)
        if key not in self._rows:
            row = self._resolve_copy(copy, choice)
            self._rows[key] = row
            self._bytes[key], self._conversions[key] = self._producer_costs(copy, row)
            if self.memory_weight:
                self._excess[key] = sum(
                    _excess(layout, self.view.op_out[m][j], self._itemsize(m, j),
                            self.parts)
                    for m, (_, stored) in zip(copy, row) for j, layout in enumerate(stored))
        return self._rows[key]

    def _resolve_copy(self, copy: list[int], choice: tuple) -> tuple:
        """Each member's (strategy, stored layouts): the leader's from ``choice``, each
        follower's from how its first input is stored."""
        k, store = choice
        leader = copy[0]
        s = self.strats[leader][k]
        result = {leader: (s, self._stored_all(leader, s, store))}
        for m in copy[1:]:
            src = self.graph.nodes[m].inputs[0].node
            src_layout = result[src][1][self.graph.nodes[m].inputs[0].index]
            rule = self.follow[m]
            if src_layout[0] == "split" and src_layout[1] in rule and \
                    src_layout in self._layouts_for(m, 0):
                fs = self.strats[m][rule[src_layout[1]]]
                result[m] = (fs, (src_layout,))
            else:   # its input is stored whole: read it whole, compute all of it
                fs = _replicated(self.view.op_in[m], self.view.op_out[m], self.parts)
                result[m] = (fs, self._stored_all(m, fs, None))
        return tuple(result[m] for m in copy)

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

    def _producer_costs(self, copy: list[int], row: tuple) -> tuple[int, int]:
        """Bytes to bring what the copy's members compute into their stored layouts, and the
        passes converting them (each output that moves bytes: the forward pass, and the
        backward pass where it has a gradient; priced with ``conversion_bytes``)."""
        total = passes = 0
        for m, (s, stored) in zip(copy, row):
            for j, layout in enumerate(stored[:len(s.outputs)]):
                grad = self.needs_grad[(m, j)]
                moved = _producer(layout, self.view.op_out[m][j], s.outputs[j],
                                  s.output_layouts[j].kind == "partial",
                                  self._itemsize(m, j), grad)
                total += moved
                passes += (1 + bool(grad)) if moved else 0
        return total, passes

    def _itemsize(self, member: int, j: int) -> int:
        """Bytes of one element of operator ``member``'s output ``j``."""
        return itemsize_of(self.graph.nodes[member].outputs[j].dtype)

    def _resolution(self, group: Group) -> tuple["Resolution", np.ndarray, np.ndarray]:
        """The group's :class:`Resolution` (shared by the groups whose copies have its
        structures), the producer cost of each of its choices and, with a memory weight,
        that cost plus the weighted bytes its outputs are stored above an even share (with
        ``conversion_bytes``, plus that for each pass converting them) (computed once per
        choice set and copy structures; read-only)."""
        copy_keys = self._copy_keys
        keys = tuple([copy_keys[copy[0]] for copy in group.copies])
        choices_id = self._shape_id[group.copies[0][0]]
        found = self._resolutions.get((choices_id, keys))
        if found is None:
            rows, unary, excess, conversions = [], [], [], []
            for choice in group.choices:
                rows.append(tuple(self._row(copy, choice) for copy in group.copies))
                unary.append(float(sum(self._bytes[(key, choice)] for key in keys)))
                if self.memory_weight:
                    excess.append(sum(self._excess[(key, choice)] for key in keys))
                if self.conversion_bytes:
                    conversions.append(sum(self._conversions[(key, choice)] for key in keys))
            cost = np.array(unary, dtype=np.float64)
            weighted = cost + self.memory_weight * np.array(excess) if excess else cost
            if conversions:
                weighted = weighted + self.conversion_bytes * np.array(conversions)
            cost.flags.writeable = weighted.flags.writeable = False
            found = self._resolutions[(choices_id, keys)] = (
                Resolution(tuple(rows), keys, choices_id), cost, weighted)
        return found

    # --- the problem ------------------------------------------------------------------------
    def problem(self) -> "CutProblem":
        """The labelling problem of this cut: one node per group and per variable, in graph
        order, with the bytes each choice moves (and, with a memory weight, what it keeps)."""
        groups, variables = self.groups, self.variables
        copies = _Copies.of(groups, self._copy_keys)
        leaders = copies.members[copies.member_start[:-1]]
        group_leader = leaders[copies.start[:-1]]     # its first copy's: names it
        # groups (in order of their first member) and variables (in graph order) merged
        first = np.minimum.reduceat(leaders, copies.start[:-1]) if groups else leaders
        order = np.argsort(np.concatenate([first, np.array(variables, dtype=np.int64)]),
                           kind="stable")
        slot_at = np.empty(len(order), dtype=np.int64)
        slot_at[order] = np.arange(len(order))
        # each distinct resolution once (groups whose copies have one structure share it),
        # then each distinct variable row, as one pool the slots index
        representative, resolution_of = np.unique(copies.group_keys(), return_index=True,
                                                  return_inverse=True)[1:]
        found = [self._resolution(groups[g]) for g in representative.tolist()]
        var_rows, var_row_of = self._variable_rows()
        pool = np.concatenate([resolution_of.reshape(-1), len(found) + var_row_of])[order]
        pick = pool.tolist()
        found += var_rows
        resolved = list(map([x[0] for x in found].__getitem__, pick))
        unary = list(map([x[1] for x in found].__getitem__, pick))
        weighted_unary = list(map([x[2] for x in found].__getitem__, pick))
        labels = [groups[g].labels for g in representative.tolist()] + \
            [row[3] for row in var_rows]
        choices = list(map(labels.__getitem__, pick))
        slots = tuple(map((groups + variables).__getitem__, order.tolist()))
        names = list(map(self.structure.names(self.graph).__getitem__,
                         np.concatenate([group_leader, variables])[order].tolist()))
        where = np.full(len(self.graph.nodes), -1, dtype=np.int64)     # graph node -> slot
        where[copies.members] = np.repeat(slot_at[:len(groups)], copies.group_sizes())
        where[variables] = slot_at[len(groups):]
        batches = self._batches(copies, slot_at, [x[0] for x in found[:len(representative)]],
                                resolution_of.reshape(-1))
        (source, target, which, costs, weights), refetched = \
            self._edges(batches, where, var_rows, var_row_of)
        bytes_problem = make_indexed_problem(names, choices, unary, source, target, which,
                                             costs)
        weighted = bytes_problem if not self.weighted else make_indexed_problem(
            names, choices, weighted_unary, source, target, which, weights)
        return CutProblem(weighted, bytes_problem, slots, where, tuple(resolved), refetched)

    def _variable_rows(self) -> tuple[list[tuple], np.ndarray]:
        """Each distinct variable row ``(layouts, cost, weighted cost, labels)``, and which
        each variable has: its choices are the layouts it may be stored in (a parameter's
        holds its gradient too), one row per shape, itemsize and kind."""
        variables, var_shape = self.variables, self.view.var
        if not variables:
            return [], np.zeros(0, dtype=np.int64)
        facts = self.structure.variable_facts
        # by the identities of the shape and the facts (shared, alive in the view and the
        # structure), then by value
        ids = np.stack([np.fromiter((id(var_shape[v]) for v in variables), np.int64,
                                    len(variables)),
                        np.fromiter(map(id, facts), np.int64, len(variables))], axis=1)
        _, first, which = np.unique(ids, axis=0, return_index=True, return_inverse=True)
        rows: dict[tuple, int] = {}
        found, row_of = [], []
        for k in first.tolist():
            v = variables[k]
            key = (var_shape[v], *facts[k])
            if key not in rows:
                layouts = _store_layouts(key[0], self.parts)
                rows[key] = len(found)
                found.append((
                    tuple(layouts), np.zeros(len(layouts)), self.memory_weight * key[2] *
                    np.array([_excess(x, key[0], key[1], self.parts) for x in layouts]),
                    tuple([layout_name(x) for x in layouts])))
            row_of.append(rows[key])
        return found, np.array(row_of, dtype=np.int64)[which.reshape(-1)]

    def _edges(self, batches: list[tuple], where: np.ndarray, var_rows: list[tuple],
               var_row_of: np.ndarray) -> tuple[tuple, "RefetchedEdges"]:
        """The problem's edges, one for each input of each member, as arrays ``(source slot,
        slot, matrix index)`` in reading order (slot, copy, member, input), with the bytes
        moved and the weighted cost of each distinct matrix, indexed by the source's and
        this slot's choices; and the edges priced with a second fetch for the backward pass
        (:class:`RefetchedEdges`). Tied copies (RNN steps) reading the same tensor in the same
        region share one fetched copy, and sum their gradients before reducing it: one
        edge, the first in reading order. Copies of one structure are taken together:
        what they read and hold comes from their structure, computed once (``batches``:
        :meth:`_batches`; ``var_rows``, ``var_row_of``: :meth:`_variable_rows`)."""
        ports = self.structure.ports(self.graph)
        port_again, port_kept = self.structure.port_flags(
            self.graph, self.refetch, self.kept_tensors, bool(self.memory_weight))
        held = self._held(batches, var_rows, var_row_of, ports)
        slot, copy_at, position, port, read = [], [], [], [], []
        for resolution, c, ks, cs, copies in batches:
            member_at, inputs, reads = self._reads(resolution, c, copies[0].tolist())
            if not len(member_at):
                continue
            n, width = len(copies), len(member_at)
            port.append((ports.start[copies[:, member_at]] + inputs).ravel())
            read.append(np.broadcast_to(reads, (n, width)).ravel())
            slot.append(np.repeat(ks, width))
            copy_at.append(np.repeat(cs, width))
            position.append(np.tile(np.arange(width), n))
        if not port:
            return (np.zeros(0, np.int64),) * 3 + ([], []), RefetchedEdges.none()
        slot, copy_at, position, port, read = map(np.concatenate,
                                                  (slot, copy_at, position, port, read))
        order = np.lexsort((position, copy_at, slot))       # reading order
        slot, port, read = slot[order], port[order], read[order]
        tensor = ports.tensor[port]
        # the readers of one tensor in one region by one slot, each group in reading order
        by = np.lexsort((np.arange(len(slot)), read, tensor, slot))
        starts = np.ones(len(by), dtype=bool)
        starts[1:] = (slot[by[1:]] != slot[by[:-1]]) | (tensor[by[1:]] != tensor[by[:-1]]) | \
            (read[by[1:]] != read[by[:-1]])
        starts = np.flatnonzero(starts)
        ends = np.append(starts[1:], len(by))
        first = by[starts]
        edge_order = np.argsort(first, kind="stable")
        first, starts, ends = first[edge_order], starts[edge_order], ends[edge_order]
        edge_port = port[first]
        source, target = where[ports.source[edge_port]], slot[first]
        again, edge_held = port_again[edge_port], held[tensor[first]]
        if len(source) and (source.min() < 0 or edge_held.min() < 0):
            raise RuntimeError("a cut's problem reads a tensor no slot holds (a bug)")
        key = np.stack([edge_held, read[first], ports.facts[edge_port],
                        port_kept[edge_port], again, source == target], axis=1)
        found, which = _once_per_row(
            key, self._matrices, lambda held, read, facts, kept, again, inside:
            self._edge_matrices(held, read, facts, bool(kept), bool(again), bool(inside)))
        costs, weights = [m[0] for m in found], [m[1] for m in found]
        chosen = np.flatnonzero(again)
        counts = ends[chosen] - starts[chosen]
        reader_start = np.zeros(len(chosen) + 1, dtype=np.int64)
        np.cumsum(counts, out=reader_start[1:])
        # each chosen edge's group of readers (positions in ``by``), in reading order
        at = by[np.repeat(starts[chosen] - reader_start[:-1], counts) +
                np.arange(reader_start[-1])]
        refetched = RefetchedEdges(source[chosen], target[chosen], key[chosen, 0],
                                   key[chosen, 1], key[chosen, 2], reader_start,
                                   port[at])
        return (source, target, which, costs, weights), refetched

    @property
    def weighted(self) -> bool:
        """Whether the search minimises more than the bytes moved (a memory weight, or
        conversions priced)."""
        return bool(self.memory_weight or self.conversion_bytes)

    def kept_copies(self, edges: "RefetchedEdges", assignment: Sequence[int]
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Per edge, what keeping its copy until the backward pass holds on a part under
        ``assignment``, at most: the largest region a part reads and the pieces it received
        to join it (a joining operator's gradient may read them); and whether any part reads
        other than exactly what it stores (a copy: joined, cut or padded, even with nothing
        moved). Computed once per distinct edge and choices."""
        def one(layout, shape, need, itemsize):
            stored = stored_regions(layout, shape, len(need))
            largest = max((2 * volume(n) - volume(intersect(n, h))
                           for h, n in zip(stored, need)), default=0) * itemsize
            return largest, _buffer(layout, shape, need, itemsize) > 0
        values, which = self._per_edge(edges, assignment, self._kept, one)
        return (np.array([x[0] for x in values], dtype=np.float64).reshape(-1)[which],
                np.array([x[1] for x in values], dtype=bool).reshape(-1)[which])

    def second_fetches(self, edges: "RefetchedEdges", assignment: Sequence[int]) -> np.ndarray:
        """Per edge, the bytes the backward pass fetches again over it under ``assignment``
        (what keeping the converted copy instead saves): its forward fetch. Computed once
        per distinct edge and choices."""
        def one(layout, shape, need, itemsize):
            return _consumer(layout, shape, need, itemsize, False, False)
        values, which = self._per_edge(edges, assignment, self._fetched, one)
        return np.array(values, dtype=np.float64).reshape(-1)[which]

    def _per_edge(self, edges: "RefetchedEdges", assignment: Sequence[int], memo: dict,
                  compute) -> tuple[list, np.ndarray]:
        """``compute(layout held in, shape, regions read, itemsize)`` of each distinct edge
        and choices under ``assignment`` (remembered in ``memo``), and which of them each
        edge has."""
        if not len(edges):
            return [], np.zeros(0, dtype=np.int64)

        def one(held, read, facts, source_choice, choice):
            layouts, (regions, shape) = self._interned[held], self._interned[read]
            itemsize, _ = self.structure.facts_of_tensors[facts]
            return compute(layouts[source_choice], shape, regions[choice], itemsize)
        chosen = np.asarray(assignment, dtype=np.int64)
        return _once_per_row(
            np.stack([edges.held, edges.read, edges.facts, chosen[edges.source],
                      chosen[edges.slot]], axis=1), memo, one)

    def _batches(self, copies: "_Copies", slot_at: np.ndarray, resolutions: list,
                 resolution_of: np.ndarray) -> list[tuple]:
        """The groups' copies by structure (choice set and copy structure): ``(a resolution
        holding one, its copy index, the slots, the copy indices, the copies)``, the last
        three as arrays (the copies' members one row each), in group and copy order, the
        batches in order of their first copy (``slot_at``: the slot of each group, in order,
        then of each variable; ``resolutions``: the distinct ones, ``resolution_of``: each
        group's)."""
        if not len(copies.key):
            return []
        choices_id = np.array([r.choices_id for r in resolutions], dtype=np.int64)
        combined = choices_id[resolution_of[copies.group]] * (int(copies.key.max()) + 1) + \
            copies.key
        which, first = by_first_appearance(combined)    # batches by their first copy
        by_batch = np.argsort(which, kind="stable")
        bounds = np.zeros(len(first) + 1, dtype=np.int64)
        np.cumsum(np.bincount(which), out=bounds[1:])
        sizes = np.diff(copies.member_start)
        batches = []
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            at = by_batch[a:b]
            f = int(at[0])
            group = copies.group[at]
            members = copies.members[copies.member_start[at][:, None] +
                                     np.arange(int(sizes[f]))]
            batches.append((resolutions[int(resolution_of[group[0]])], int(copies.index[f]),
                            slot_at[group], copies.index[at], members))
        return batches

    def _held(self, batches: list[tuple], var_rows: list[tuple], var_row_of: np.ndarray,
              ports) -> np.ndarray:
        """Tensor (numbered as in :class:`~tofu_mx.search.structure.Ports`) -> id of the
        layouts it is stored in, per choice of its slot."""
        held = np.full(int(ports.tensor_start[-1]), -1, dtype=np.int64)
        for resolution, c, _, _, copies in batches:
            key = ("held", resolution.choices_id, resolution.keys[c])
            if key not in self._ends:
                rows, copy = resolution.rows, copies[0].tolist()
                self._ends[key] = _columns(
                    [(p, i, self._intern(tuple(row[c][p][1][i] for row in rows)))
                     for p, m in enumerate(copy)
                     for i in range(len(self.graph.nodes[m].outputs))])
            member_at, output, ids = self._ends[key]
            held[ports.tensor_start[copies[:, member_at]] + output] = ids
        if var_rows:    # a variable: its layouts are its choices
            ids = np.array([self._intern(row[0]) for row in var_rows], dtype=np.int64)
            held[ports.tensor_start[self.variables]] = ids[var_row_of]
        return held

    def _reads(self, resolution: "Resolution", c: int, copy: list[int]
               ) -> tuple[np.ndarray, ...]:
        """``(member position, input, read id)`` arrays over the inputs of the members of
        copy ``c`` (one of its structure: ``copy``), in member and input order: the id of
        what each reads of the input under each choice, and the input's work-view shape.
        Computed once per choice set and copy structure."""
        key = ("reads", resolution.choices_id, resolution.keys[c])
        if key not in self._ends:
            rows, op_in = resolution.rows, self.view.op_in
            self._ends[key] = _columns(
                [(p, j, self._intern((tuple(row[c][p][0].inputs[j] for row in rows),
                                      op_in[m][j])))
                 for p, m in enumerate(copy) for j in range(len(op_in[m]))])
        return self._ends[key]

    def _intern(self, value: tuple) -> int:
        """One id per distinct value (layouts or regions per choice)."""
        if value not in self._intern_ids:
            self._intern_ids[value] = len(self._interned)
            self._interned.append(value)
        return self._intern_ids[value]

    def _edge_matrices(self, held: int, read: int, facts: int, kept: bool, again: bool,
                       inside: bool) -> tuple[np.ndarray, np.ndarray]:
        """``(bytes moved, weighted cost)`` from the layouts a tensor is held in (``held``, per
        choice of its slot) to what a member reads of it (``read``: per choice, and the
        tensor's shape); ``facts``: its itemsize and gradient; ``kept``: a converted copy
        lives until the backward pass; ``again``: the backward pass fetches it again (its
        reader re-fetches, :func:`~tofu_mx.search.structure.refetches_inputs`); ``inside``:
        both in one group, moving together. With ``conversion_bytes``, the weighted cost
        adds that for each pass converting the tensor where the reader fetches bytes or reads
        a converted copy (the forward pass; the backward pass's mirror where it has a
        gradient; the second fetch where ``again``).
        Computed once per distinct edge; the matrices are shared, read-only."""
        layouts, (regions, shape) = self._interned[held], self._interned[read]
        itemsize, grad = self.structure.facts_of_tensors[facts]
        weigh = kept and self.memory_weight     # the converted copy's bytes, weighted
        priced = self.conversion_bytes
        if inside:
            cost = np.diag(np.array([_consumer(layouts[c], shape, regions[c], itemsize, grad,
                                               again) for c in range(len(regions))],
                                    dtype=np.float64))
            if weigh or priced:
                buf = np.diag(np.array([_buffer(layouts[c], shape, regions[c], itemsize)
                                        for c in range(len(regions))], dtype=np.float64))
        else:
            cost = np.array([[_consumer(a, shape, need, itemsize, grad, again)
                              for need in regions] for a in layouts], dtype=np.float64)
            if weigh or priced:
                buf = np.array([[_buffer(a, shape, need, itemsize) for need in regions]
                                for a in layouts], dtype=np.float64)
        weighted = cost + self.memory_weight * buf if weigh else cost
        if priced:
            passes = 1 + bool(grad) + bool(again)
            weighted = weighted + (priced * passes) * ((cost > 0) | (buf > 0))
        cost.flags.writeable = weighted.flags.writeable = False
        return cost, weighted


@dataclass(frozen=True)
class Resolution:
    """A choice set resolved for copies of given structures: ``rows[choice][c]`` holds each
    member of copy ``c`` as ``(Strategy, stored layouts)``, in copy order. The groups whose
    copies have these structures share it (each row is computed once), so a group costs one
    reference."""

    rows: tuple[tuple[tuple, ...], ...]
    keys: tuple[int, ...]       # each copy's structure id
    choices_id: int             # its choices' id (the shape id of its leader)


@dataclass(frozen=True)
class _Copies:
    """The groups' copies as arrays, in group order and each group's copy order."""

    group: np.ndarray           # copy -> its group
    index: np.ndarray           # copy -> its position in its group
    key: np.ndarray             # copy -> its structure id
    start: np.ndarray           # group -> its first copy (one more entry: the end)
    members: np.ndarray         # the copies' members, copy after copy
    member_start: np.ndarray    # copy -> its first member in ``members`` (one more entry)

    @staticmethod
    def of(groups: list[Group], copy_keys: Mapping[int, int]) -> "_Copies":
        copies = list(chain.from_iterable(g.copies for g in groups))
        start = np.zeros(len(groups) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, (g.copies for g in groups)), np.int64, len(groups)),
                  out=start[1:])
        member_start = np.zeros(len(copies) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, copies), np.int64, len(copies)), out=member_start[1:])
        members = np.fromiter(chain.from_iterable(copies), np.int64, int(member_start[-1]))
        group = np.repeat(np.arange(len(groups), dtype=np.int64), np.diff(start))
        key = np.fromiter(map(copy_keys.__getitem__, members[member_start[:-1]].tolist()),
                          np.int64, len(copies))
        return _Copies(group, np.arange(len(copies)) - start[group], key, start, members,
                       member_start)

    def group_keys(self) -> np.ndarray:
        """Per group, an id of its copies' structures (in order)."""
        if not len(self.key) or int(np.diff(self.start).max()) == 1:
            return self.key
        ids: dict[tuple, int] = {}
        keys = self.key.tolist()
        return np.array([ids.setdefault(tuple(keys[a:b]), len(ids)) for a, b in
                         zip(self.start[:-1].tolist(), self.start[1:].tolist())],
                        dtype=np.int64)

    def group_sizes(self) -> np.ndarray:
        """Per group, its members."""
        return np.add.reduceat(np.diff(self.member_start), self.start[:-1]) if \
            len(self.start) > 1 else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class RefetchedEdges:
    """The edges priced with a second fetch for the backward pass, one row per edge in
    reading order (arrays: a cut has hundreds of thousands in a large graph). The operator
    inputs reading edge ``e``'s tensor, re-run in the backward pass, are the ports
    (:class:`~tofu_mx.search.structure.Ports`) ``reader_port[reader_start[e]:reader_start[e
    + 1]]``, in reading order."""

    source: np.ndarray                # problem node holding the tensor
    slot: np.ndarray                  # problem node reading it
    held: np.ndarray                  # interned layouts of the tensor, per source choice
    read: np.ndarray                  # interned regions read, per reader choice, and shape
    facts: np.ndarray                 # the tensor's itemsize and gradient
    reader_start: np.ndarray          # edge -> its first reader (one more entry: the end)
    reader_port: np.ndarray           # the readers, edge by edge

    def __len__(self) -> int:
        return len(self.source)

    @staticmethod
    def none() -> "RefetchedEdges":
        empty = np.zeros(0, dtype=np.int64)
        return RefetchedEdges(empty, empty, empty, empty, empty, np.zeros(1, dtype=np.int64),
                              empty)


@dataclass(frozen=True)
class CutProblem:
    """One cut's search problem, and how to read a solution of it."""

    problem: Problem                  # what the search minimises (bytes + weighted memory)
    bytes_problem: Problem            # the same choices, costed in bytes moved alone
    slots: tuple                      # problem node -> its Group, or a variable's node index
    where: np.ndarray                 # graph node -> its problem node (-1: none)
    resolved: tuple                   # problem node -> a group's Resolution, or a variable's
    #                                   layout per choice
    refetched: RefetchedEdges = field(default_factory=RefetchedEdges.none)
    #                                   the edges fetched again for the backward pass

    def members(self, assignment: Sequence[int]) -> dict[int, tuple[Strategy, tuple]]:
        """Every operator's strategy and stored output layouts under ``assignment``."""
        found = {}
        for slot, obj in enumerate(self.slots):
            if isinstance(obj, Group):
                for copy, row in zip(obj.copies, self.resolved[slot].rows[assignment[slot]]):
                    found.update(zip(copy, row))
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
            return self.resolved[slot].rows[choice][0][0][1][0]
        return self.resolved[slot][choice]


def _columns(triples: list[tuple[int, int, int]]) -> tuple[np.ndarray, ...]:
    """Three integer arrays, the columns of ``triples``."""
    return tuple(np.array(column, dtype=np.int64).reshape(-1)
                 for column in (zip(*triples) if triples else ((), (), ())))


def _once_per_row(rows: np.ndarray, memo: dict, compute) -> tuple[list, np.ndarray]:
    """``compute(*row)`` of each distinct row of ``rows`` (integers), remembered in ``memo``
    by the row as a tuple, and which of them each row is (:func:`~tofu_mx.search.problem.distinct_rows`)."""
    distinct, which = distinct_rows(rows)
    values = []
    for row in map(tuple, distinct.tolist()):
        found = memo.get(row)
        if found is None:
            found = memo[row] = compute(*row)
        values.append(found)
    return values, which


@functools.lru_cache(maxsize=1 << 18)
def _consumer(layout, shape, need, itemsize, grad, again):
    return consumer_bytes(layout, shape, need, itemsize, grad, again)


@functools.lru_cache(maxsize=1 << 18)
def _excess(layout: StoreLayout, shape: Shape, itemsize: int, parts: int) -> float:
    """Bytes a tensor of ``shape`` stored in ``layout`` holds on its largest part above an
    even share (``1 / parts`` of it): a split's remainder, or a whole copy's rest."""
    size = float(math.prod(shape)) * itemsize
    if layout[0] == "replicated":
        return size - size / parts
    n = shape[layout[1]]
    return size * (-(-n // parts)) / n - size / parts


@functools.lru_cache(maxsize=1 << 18)
def _buffer(layout, shape, need, itemsize):
    return converted_bytes(layout, shape, need, itemsize)


@functools.lru_cache(maxsize=1 << 18)
def _producer(layout, shape, produced, partial, itemsize, grad):
    return producer_bytes(layout, shape, produced, partial, itemsize, grad)


@functools.lru_cache(maxsize=1 << 12)
def _replicated(in_shapes: tuple, out_shapes: tuple, parts: int) -> Strategy:
    return replicate_strategy(in_shapes, out_shapes, parts)


def next_view(cut: Cut, resolved_by_member: dict[int, tuple[Strategy, tuple]],
              var_layout: dict[int, StoreLayout]) -> View:
    """The work view of one part after this cut: what each operator reads and computes.
    Operators of one shape id resolved alike get one computation (keyed by the strategy's
    identity, as hashing a Strategy is slow: they are all alive in ``resolved_by_member``)."""
    short = dict(cut.view.short)
    ops = cut.ops
    # by the identity of the (strategy, stored layouts) chosen (shared by the members
    # resolved alike, all alive in ``resolved_by_member``) and the shape id. An operator's
    # shape id and choice determine its next view, and its short variables (the shape
    # id's, and the choice's): the key's number is the operator's class
    chosen = list(map(resolved_by_member.__getitem__, ops))
    if ops:
        ids = np.unique(np.fromiter(map(id, chosen), np.int64, len(ops)),
                        return_inverse=True)[1].reshape(-1)
        shape_ids = np.fromiter(map(cut._shape_id.__getitem__, ops), np.int64, len(ops))
        which, first = by_first_appearance(
            distinct_rows(np.stack([shape_ids, ids], axis=1))[1])
        which, first = which.tolist(), first.tolist()
    else:
        which, first = [], []
    found = [_next_shapes(cut, ops[k], *chosen[k]) for k in first]
    shard = dict(zip(ops, map(itemgetter(0), map(found.__getitem__, which))))
    op_in = dict(zip(ops, map(itemgetter(1), map(found.__getitem__, which))))
    op_out = dict(zip(ops, map(itemgetter(2), map(found.__getitem__, which))))
    uneven = [k for k, c in enumerate(first) if chosen[c][0].uneven]
    if uneven:
        spread = np.isin(np.array(which, dtype=np.int64), uneven)
        for k in np.flatnonzero(spread).tolist():
            i = ops[k]
            short[i] = short.get(i, frozenset()) | {chosen[k][0].var}
    shapes: dict[tuple[int, int], tuple] = {}
    var = {}
    for v in cut.variables:
        before, layout = cut.view.var[v], var_layout[v]
        key = (id(before), id(layout))
        if key not in shapes:
            shape = list(before)
            if layout[0] == "split":
                shape[layout[1]] //= cut.parts
            shapes[key] = (tuple(shape), before, layout)    # (the shape, kept alive)
        var[v] = shapes[key][0]
    return View(op_in, op_out, var, shard, short, dict(zip(ops, which)))


def _next_shapes(cut: Cut, i: int, s: Strategy, stored: tuple) -> tuple:
    """``(stored shards, work-view inputs, work-view outputs)`` of operator ``i`` next level."""
    shards = []
    for k, layout in enumerate(stored):
        shape = list(cut.view.shard[i][k])
        if layout[0] == "split":
            shape[layout[1]] //= cut.parts
        shards.append(tuple(shape))
    ins = tuple(_box_shape(s.inputs[j], cut.view.op_in[i][j])
                for j in range(len(cut.view.op_in[i])))
    outs = tuple(_box_shape(s.outputs[k], cut.view.op_out[i][k])
                 if k < len(s.outputs) and s.output_layouts[k].kind != "partial"
                 else cut.view.op_out[i][k] for k in range(len(cut.view.op_out[i])))
    return tuple(shards), ins, outs


def _box_shape(regions, fallback: Shape) -> Shape:
    boxes = [r for r in regions if r is not None]
    if not boxes:
        return fallback
    return tuple(max(b[a][1] - b[a][0] + 1 for b in boxes) for a in range(len(fallback)))


__all__ = ["Cut", "CutProblem", "GraphStructure", "Group", "REPLICATED", "Resolution", "View",
           "layout_name", "next_view", "op_strategies", "replicate_strategy", "store_layouts",
           "needs_grad_of"]
