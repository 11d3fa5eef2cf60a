"""Exact dynamic programming over a :class:`~tofu_mx.search.problem.Problem`.

Nodes are taken in an elimination order (by default chosen greedily to keep the frontier
small, :func:`elimination_order`; the result is exact for any order). The state after node
``v`` is the *frontier* ``F_v``: the nodes taken so far that have an edge to a node not yet
taken (Tofu's "tensors still live"); a node with a single choice takes no axis, its edges
acting on its neighbours alone. With ``D_v(x_F)`` the cheapest cost of the nodes taken
so far given the frontier's choices ``x_F``:

    D_v(x_{F_v}) = min over x of eliminated nodes [ D_{v-1}(x_{F_{v-1}}) + unary_v(x_v)
                    + sum_{u in F_{v-1}, (u, v) an edge} pair_uv(x_u, x_v) ]

where the minimum runs over the nodes that leave the frontier at ``v`` (their last neighbour
is ``v``). ``D`` is held as a dense array with one axis per frontier node, so each step is a
broadcast add and a ``min`` along the leaving axes; the ``argmin`` tables give the choices
back in reverse. The answer is exact. Its size is the product of the frontier's choice counts:
``max_states`` bounds it, and :class:`SearchTooLargeError` names the frontier when it does not
fit (coarsen more, or cut the graph differently).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import functools
import heapq
import math

import numpy as np

from tofu_mx.errors import TofuError
from tofu_mx.search.problem import Problem, distinct_rows, make_problem


_SMALL_STATE = 4096   # below this, the graph's own order is kept without looking further
_PROGRESS_STEP = 4096     # nodes the DP takes between updates of its progress bar
_MIN_PLUS_ELEMENTS = 1 << 22    # the most elements a batch of min-plus products adds at once


class SearchTooLargeError(TofuError):
    """The DP's frontier holds more states than allowed; ``frontier``: the names of the
    nodes it held where it overflowed (the node being taken last)."""

    def __init__(self, message: str, frontier: tuple[str, ...] = ()):
        super().__init__(message)
        self.frontier = frontier


@dataclass(frozen=True)
class Solution:
    cost: float
    assignment: tuple[int, ...]
    max_frontier: int       # most nodes in the frontier at once
    max_states: int         # most states (product of their choice counts) at once
    #: the cost is exact (every cost an integer, their sum below 2**52: :func:`_exact`), so
    #: the problem's own sum (:meth:`~tofu_mx.search.problem.Problem.cost`) is the same
    exact: bool = field(default=False, compare=False)


def elimination_order(problem: Problem) -> list[int]:
    """A node order that keeps the frontier small: repeatedly take the node that grows the
    frontier's log-size least (taking it may close frontier nodes whose last neighbour it
    is), preferring nodes next to the frontier, then the lower index."""
    n = len(problem.names)
    size = [math.log(max(len(c), 1)) for c in problem.choices]
    adj: list[set[int]] = [set() for _ in range(n)]
    for u, v, _ in problem.edges:
        adj[u].add(v)
        adj[v].add(u)
    left = [len(a) for a in adj]          # neighbours not yet taken
    taken = [False] * n
    touching = [0] * n                    # taken neighbours (0: not next to the frontier)

    def score(x: int) -> tuple:
        opens = size[x] if left[x] > 0 else 0.0
        closes = sum(size[u] for u in adj[x] if taken[u] and left[u] == 1)
        return (0 if touching[x] else 1, opens - closes, x)

    heap = [score(x) for x in range(n)]
    heapq.heapify(heap)
    order = []
    while heap:
        entry = heapq.heappop(heap)
        x = entry[2]
        if taken[x] or entry != score(x):
            if not taken[x]:
                heapq.heappush(heap, score(x))
            continue
        taken[x] = True
        order.append(x)
        stale = set()
        for u in adj[x]:
            left[u] -= 1
            touching[u] += 1
            stale.add(u)
            stale.update(adj[u])
        for y in stale:
            if not taken[y]:
                heapq.heappush(heap, score(y))
    return order


def largest_state(problem: Problem, order: list[int]) -> int:
    """The largest DP state (frontier choice counts multiplied) along ``order``."""
    n = len(problem.names)
    order = np.asarray(order, dtype=np.int64)
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    u, v = _ends(problem)
    last = position.copy()          # node -> the position of its last neighbour (or its own)
    np.maximum.at(last, u, position[v])
    np.maximum.at(last, v, position[u])
    counts = np.array([len(c) for c in problem.choices], dtype=np.int64)
    return _States.of(counts[order], last[order]).most


def solve_dp(problem: Problem, max_states: int = 4_000_000, progress=None,
             order: str = "best") -> Solution:
    """Exact minimum of ``problem``. ``order``: ``"index"`` (the nodes' own order),
    ``"greedy"`` (:func:`elimination_order`) or ``"best"`` (the nodes' own order when its
    largest state is small, else whichever of the two has the smaller one)."""
    schedule = _Schedule.of(problem)
    if order in ("greedy", "best") and len(problem.names) > 1:
        index = list(range(len(problem.names)))
        own = schedule.states.most if order == "best" else math.inf
        perm = index if own <= _SMALL_STATE else elimination_order(problem)
        if order == "best" and perm is not index and own <= largest_state(problem, perm):
            perm = index
        if perm != index:
            where = {old: new for new, old in enumerate(perm)}
            reordered = make_problem([problem.names[o] for o in perm],
                                     [problem.choices[o] for o in perm],
                                     [problem.unary[o] for o in perm],
                                     [(where[u], where[v], m) for u, v, m in problem.edges])
            found = solve_dp(reordered, max_states, progress, order="index")
            assignment = [0] * len(perm)
            for new, old in enumerate(perm):
                assignment[old] = found.assignment[new]
            return Solution(found.cost, tuple(assignment), found.max_frontier, found.max_states,
                            found.exact)
    return _eliminate(problem, schedule, max_states, progress)


def _ends(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Each edge's ``(u, v)`` as arrays."""
    if problem.indexed is not None:
        return problem.indexed.u, problem.indexed.v
    edges = problem.edges
    return (np.fromiter([e[0] for e in edges], dtype=np.int64, count=len(edges)),
            np.fromiter([e[1] for e in edges], dtype=np.int64, count=len(edges)))


@dataclass(frozen=True)
class _States:
    """The DP's states along an order, from the choice counts alone: at each position, once
    its node has joined the frontier, how many nodes the frontier holds and how many states
    (their choice counts multiplied, exact). A node of more than one choice joins at its
    own position and leaves after its last neighbour's. Computed in bulk: each prime's
    exponent in the state summed along the order, so that sizes stay exact integers."""

    widest: int              # the most nodes in the frontier at once
    sizes: list[int]         # the distinct state sizes met
    size_at: np.ndarray      # position -> its state size (an index into ``sizes``)

    @property
    def most(self) -> int:
        return max(self.sizes)

    @staticmethod
    def of(counts: np.ndarray, last: np.ndarray) -> "_States":
        n = len(counts)
        nodes = np.flatnonzero(counts > 1)
        if not len(nodes):
            return _States(0, [1], np.zeros(n, dtype=np.int64))
        leaves = last[nodes]

        def along(amount: np.ndarray) -> np.ndarray:
            """Per position, ``amount`` summed over the frontier's nodes."""
            joined = np.zeros(n, dtype=np.int64)
            joined[nodes] = amount
            gone = np.bincount(leaves, weights=amount, minlength=n).astype(np.int64)
            return np.cumsum(joined) - (np.cumsum(gone) - gone)
        widest = int(along(np.ones(len(nodes), dtype=np.int64)).max())
        kinds = sorted(set(counts[nodes].tolist()))
        primes = sorted({p for k in kinds for p in prime_factors(k)})
        exponents = []
        for p in primes:
            of_count = np.zeros(kinds[-1] + 1, dtype=np.int64)
            for k in kinds:
                of_count[k] = prime_factors(k).count(p)
            exponents.append(along(of_count[counts[nodes]]))
        distinct, size_at = distinct_rows(np.stack(exponents, axis=1))
        sizes = [math.prod(p ** e for p, e in zip(primes, row)) for row in distinct.tolist()]
        return _States(widest, sizes, size_at)


def prime_factors(k: int) -> list[int]:
    """``k``'s prime factors, with repeats, smallest first."""
    found, p = [], 2
    while p * p <= k:
        while k % p == 0:
            found.append(p)
            k //= p
        p += 1
    return found + ([k] if k > 1 else [])


@dataclass(frozen=True)
class _Schedule:
    """The bookkeeping of the problem's own node order (arrays where a problem has hundreds
    of thousands of nodes)."""

    counts: list[int]                     # choices of each node
    count_array: np.ndarray               # the same, as an array
    ends: tuple[np.ndarray, np.ndarray]   # each edge's (u, v), u < v, in the problem's order
    last: np.ndarray                      # each node's last neighbour (or itself)
    states: _States                       # the states along the order

    @staticmethod
    def of(problem: Problem) -> "_Schedule":
        n = len(problem.names)
        counts = list(map(len, problem.choices))
        count_array = np.array(counts, dtype=np.int64)
        u, v = _ends(problem)
        last = np.arange(n, dtype=np.int64)
        np.maximum.at(last, u, v)
        return _Schedule(counts, count_array, (u, v), last, _States.of(count_array, last))

    def neighbours(self, problem: Problem) -> list[list[tuple[int, np.ndarray]]]:
        """v -> (u, m[x_u, x_v]) for each edge (u, v), u < v, in edge order."""
        found: list[list[tuple[int, np.ndarray]]] = [[] for _ in self.counts]
        for u, v, m in problem.edges:
            found[v].append((u, m))
        return found


def _eliminate(problem: Problem, schedule: "_Schedule", max_states: int,
               progress) -> Solution:
    """The recurrence of the module's docstring, in the problem's own node order (with the
    nodes :class:`_Folding` takes out beforehand when the arithmetic is exact)."""
    widest, most = _frontier_bounds(problem, schedule, max_states)
    exact = _exact(problem)
    folding = _Folding.of(problem, schedule) if exact else _Folding.none(problem, schedule)
    n = len(problem.names)
    table = np.zeros(())                  # D over the frontier's axes
    frontier: list[int] = []
    eliminated: list = []     # (node, axes left, argmin), or a run of chain steps
    kept = folding.kept
    unary, neighbours, counts = folding.unary, folding.neighbours, schedule.counts
    chains = folding.chains
    run_at, starts = chains.run_at, []      # the table where each run of chain steps starts
    all_leaving, reported = folding.leaving, 0
    for v in folding.steps:
        if progress is not None and v - reported >= _PROGRESS_STEP:
            progress(v - reported)
            reported = v
        if kept[v]:
            r = run_at[v]
            if r >= 0:      # a run of chain steps, taken at its first
                starts.append(table)
                table = np.minimum.reduce(table[:, None] + chains.product[r][:len(table)],
                                          0)[:chains.width[r]]
                frontier[0] = chains.end[r]
                eliminated.append(r)
                continue
            table = _add_node(table, frontier, v, unary[v], neighbours[v], counts)
        for u in all_leaving[v]:
            axis = frontier.index(u)
            argmin = table.argmin(axis)
            eliminated.append((u, tuple(frontier[:axis] + frontier[axis + 1:]), argmin))
            table = _min_at(table, axis, argmin)
            frontier.pop(axis)
    if progress is not None and n > reported:
        progress(n - reported)
    choose = chains.choices(starts)
    assignment = [0] * n
    for entry in reversed(eliminated):
        if type(entry) is int:
            choose(entry, assignment)
        else:
            u, axes, argmin = entry
            assignment[u] = int(argmin[tuple(assignment[a] for a in axes)])
    if folding.leaves:
        assignment = np.array(assignment, dtype=np.int64)
        for us, vs, argmin in folding.leaves:
            assignment[us] = argmin[np.arange(len(us)), assignment[vs]]
        assignment = assignment.tolist()
    return Solution(float(table) + folding.constant, tuple(assignment), widest, most, exact)


def _min_at(table: np.ndarray, axis: int, argmin: np.ndarray) -> np.ndarray:
    """``table.min(axis)``, given ``table.argmin(axis)``: the entries it picks, gathered, but
    for a small table. NumPy's reduction over a short axis of a large table is slow,
    whichever the axis (it took 5 to 20 times as long); the values are the same entries."""
    if table.size <= _GATHER_FROM:
        return np.minimum.reduce(table, axis)      # table.min(axis), without its wrapper
    shape = table.shape
    inner = math.prod(shape[axis + 1:])
    n = shape[axis]
    return table.ravel()[_gather_base(table.size // (n * inner), n, inner) +
                         argmin.ravel() * inner].reshape(argmin.shape)


#: the smallest table whose minimum over an inner axis :func:`_min_at` gathers
_GATHER_FROM = 128


@functools.lru_cache(maxsize=1 << 10)
def _gather_base(outer: int, n: int, inner: int) -> np.ndarray:
    """The flat index of entry 0 along the middle axis of a ``(outer, n, inner)`` array, for
    each outer and inner index (read-only)."""
    base = (np.arange(outer, dtype=np.int64)[:, None] * (n * inner) +
            np.arange(inner, dtype=np.int64)).ravel()
    base.flags.writeable = False
    return base


def _leaving(nodes: np.ndarray, last: np.ndarray, n: int) -> list:
    """v -> those of ``nodes`` (in index order) whose last neighbour is v, in index order (an
    empty tuple: none)."""
    leaving: list = [()] * n
    by_last = nodes[np.argsort(last[nodes], kind="stable")]
    for x, at in zip(by_last.tolist(), last[by_last].tolist()):
        if leaving[at]:
            leaving[at].append(x)
        else:
            leaving[at] = [x]
    return leaving


def _frontier_bounds(problem: Problem, schedule: _Schedule, max_states: int
                     ) -> tuple[int, int]:
    """``(most frontier nodes, most states)`` at once along the order, from the choice
    counts alone; :class:`SearchTooLargeError` where the state would exceed ``max_states``."""
    states = schedule.states
    over = np.array([size > max_states for size in states.sizes])
    if over.any():
        at = np.flatnonzero(over[states.size_at] & (schedule.count_array > 1))
        if len(at):
            v = int(at[0])
            before = np.flatnonzero(schedule.count_array[:v] > 1)
            frontier = before[schedule.last[before] >= v].tolist()
            names = [problem.names[u] for u in frontier] + [problem.names[v]]
            raise SearchTooLargeError(
                f"the search state at {problem.names[v]!r} would hold "
                f"{states.sizes[states.size_at[v]]:,} states (frontier {names}), over "
                f"max_states={max_states:,}", tuple(names))
    return states.widest, states.most


#: below this, a sum of integers in float64 is exact whatever the order of its additions
_EXACT_BOUND = 2.0 ** 52


def _exact(problem: Problem) -> bool:
    """Whether every cost is an integer and their absolute values sum below 2**52: then every
    value the DP computes is exact, whatever the order of the additions (costs in bytes are
    such; a fractional memory weight may not be)."""
    if not problem.unary:
        return True
    unary = np.concatenate(problem.unary)
    if not np.array_equal(unary, np.floor(unary)):
        return False
    total = float(np.abs(unary).sum())
    # each distinct matrix once (edges share them), with the number of edges using it
    matrices, which = _edge_matrices(problem)
    count = np.bincount(which, minlength=len(matrices))
    used = np.flatnonzero(count)
    if not len(used):
        return total < _EXACT_BOUND
    distinct, count = [matrices[k] for k in used.tolist()], count[used]
    values = np.concatenate([m.ravel() for m in distinct])
    if not np.array_equal(values, np.floor(values)):
        return False
    sums = np.add.reduceat(np.abs(values), np.cumsum([0] + [m.size for m in distinct[:-1]]))
    return total + float(np.dot(count, sums)) < _EXACT_BOUND


@dataclass(frozen=True)
class _Folding:
    """Nodes taken out of the DP beforehand, their costs moved onto the nodes it keeps.

    A node of one choice adds a constant and, through each edge, a cost of one neighbour's
    choice. A *leaf* (one edge, to ``v``) of more than one choice adds ``min over x_u of
    (unary_u + pair(x_u, x_v))``, and takes its first best choice given ``v``'s; taken out
    only when that is where the full DP eliminates it: at ``v``'s step if it comes before
    ``v``, else at its own step, which must come before ``v`` leaves (or ``v`` has one
    choice). The kept nodes leave the frontier at the steps the full DP gives them, in the
    same order. With exact arithmetic (:func:`_exact`) every value and every choice is
    then the full DP's; ``max_frontier`` and ``max_states`` come from :func:`_frontier_bounds`.
    """

    kept: list[bool]                     # node -> whether the DP takes it
    steps: list[int]                     # the nodes where the DP does something, in order:
    #                                      those it takes (a run of chain steps: its first)
    #                                      and those where some leave
    leaving: list                        # v -> the kept nodes of more than one choice whose
    #                                      last neighbour is v, in index order (or empty)
    unary: list                          # node -> its unary cost, with what was moved onto it
    neighbours: list                     # v -> edges (u, m) between kept nodes, by later end
    #                                      (an empty tuple: none)
    leaves: list[tuple[np.ndarray, np.ndarray, np.ndarray]]    # (leaves, their v, each
    #                                      leaf's best choice per x_v), by shape
    constant: float
    chains: "_Chains"                    # the steps along chains, taken a run at a time

    @staticmethod
    def none(problem: Problem, schedule: _Schedule) -> "_Folding":
        n = len(problem.names)
        several = np.flatnonzero(schedule.count_array > 1)  # one choice takes no axis
        return _Folding([True] * n, list(range(n)), _leaving(several, schedule.last, n),
                        list(problem.unary), schedule.neighbours(problem), [], 0.0,
                        _Chains.none(n))

    @staticmethod
    def of(problem: Problem, schedule: _Schedule) -> "_Folding":
        count = schedule.count_array
        n, (eu, ev) = len(count), schedule.ends
        matrices, which = _edge_matrices(problem)
        leaf, leaf_edge, leaf_first, target = _leaves(schedule)
        is_leaf = np.zeros(n, dtype=bool)
        is_leaf[leaf] = True
        flat, starts = _flat(problem.unary)
        one = count == 1
        constant = float(flat[starts[:-1][one]].sum())
        additions: list[tuple[np.ndarray, np.ndarray]] = []    # (targets, rows) to add
        # the leaves, those of one shape at once: each adds its best cost per choice of v
        chosen = []
        shapes = count[leaf] * (int(count.max(initial=0)) + 1) + count[target]
        for shape in np.unique(shapes).tolist():
            group = np.flatnonzero(shapes == shape)
            us, vs = leaf[group], target[group]
            pairs = _stack(matrices, which[leaf_edge[group]], leaf_first[group])
            costs, at = _distinct(problem.unary, us)
            cost = _stack(costs, at)[:, :, None] + pairs
            best, argmin = cost.min(axis=1), cost.argmin(axis=1)      # [leaf, x_v]
            fixed = one[vs]
            constant += float(best[fixed, 0].sum())
            additions.append((vs[~fixed], best[~fixed]))
            chosen.append((us, vs, argmin))
        # the other edges: those with an end of one choice add to the other end, or to the
        # constant; the rest stay, by their later end
        stays = ~(is_leaf[eu] | is_leaf[ev])
        one_u, one_v = one[eu], one[ev]
        for e in np.flatnonzero(stays & one_u & one_v).tolist():
            constant += float(matrices[which[e]][0, 0])
        for ends, first, other in ((ev, True, one_u & ~one_v), (eu, False, one_v & ~one_u)):
            edges = np.flatnonzero(stays & other)
            by_length: dict[int, list[int]] = {}
            for e, length in zip(edges.tolist(), count[ends[edges]].tolist()):
                by_length.setdefault(length, []).append(e)
            for es in by_length.values():    # each matrix's row (first) or column of choice 0
                stacked = _stack(matrices, which[es], np.full(len(es), first))
                additions.append((ends[es], stacked[:, 0, :]))
        for targets, rows in additions:     # (exact sums: the order of the additions is free)
            if len(targets):
                at = (starts[targets][:, None] + np.arange(rows.shape[1])).ravel()
                flat += np.bincount(at, weights=rows.ravel(), minlength=len(flat))
        inner = np.flatnonzero(stays & ~one_u & ~one_v)
        taken = ~one & ~is_leaf
        kept_nodes = np.flatnonzero(taken)
        leave = np.bincount(schedule.last[kept_nodes], minlength=n)    # kept leaving at v
        chains = _Chains.of(taken, schedule.last, leave, eu[inner], ev[inner], which[inner],
                            matrices, flat, starts, count)
        # the nodes taken one at a time (not in a run of chain steps): their edges and costs
        alone = taken.copy()
        alone[chains.members] = False
        neighbours: list = [()] * n
        inner = inner[alone[ev[inner]]]
        for k, u, v in zip(which[inner].tolist(), eu[inner].tolist(), ev[inner].tolist()):
            if neighbours[v]:
                neighbours[v].append((u, matrices[k]))
            else:
                neighbours[v] = [(u, matrices[k])]
        unary = list(problem.unary)
        bounds = starts.tolist()
        for v in np.flatnonzero(alone).tolist():
            unary[v] = flat[bounds[v]:bounds[v + 1]]
        inside = np.zeros(n, dtype=bool)     # a run's steps after its first
        inside[chains.members] = True
        inside[chains.firsts] = False
        steps = np.flatnonzero((taken & ~inside) | ((leave > 0) & ~taken)).tolist()
        return _Folding(taken.tolist(), steps, _leaving(kept_nodes, schedule.last, n), unary,
                        neighbours, chosen, constant, chains)


@dataclass(frozen=True)
class _Chains:
    """The DP's steps along chains, a run at a time (exact sums only: :func:`_exact`).

    A *chain step* takes a node ``v`` whose one edge goes to the frontier's one node ``u``,
    which leaves at ``v``: ``D'(x_v) = min over x_u of (D(x_u) + pair(x_u, x_v)) + unary(x_v)``,
    a min-plus product of the table with ``pair + unary``. A *run* is a chain of such steps
    (each ``u`` the step before's ``v``). Before the DP, each run's matrices are multiplied
    (min-plus), all runs side by side, their ``t``-th steps at once; the DP then takes a run
    in one product, from the table where it starts. Afterwards, the steps are taken again
    from those tables, all runs side by side, for the choices (``argmin``). With exact sums
    every value is the one step-by-step DP computes, so every choice is too. Runs are
    grouped by the most choices their nodes have, and padded to it with infinite costs."""

    run_at: list            # node -> the run starting there, else -1
    product: list           # run -> its matrices' product [x_u, x_v] (padded)
    width: list             # run -> the choices of its last node
    end: list               # run -> its last node
    choices_of: tuple       # per group of runs: (its runs, longest first; their padded
    #                         matrices; per step, the matrices (indices into those) and the
    #                         padded unary costs of the runs that are that long)
    nodes: list             # run -> its nodes, the source (the frontier's node before) first
    members: np.ndarray     # the nodes of every run (not their sources)
    firsts: np.ndarray      # run -> its first node

    @staticmethod
    def none(n: int) -> "_Chains":
        return _Chains([-1] * n, [], [], [], (), [], *[np.zeros(0, dtype=np.int64)] * 2)

    @staticmethod
    def of(taken: np.ndarray, last: np.ndarray, leave: np.ndarray, eu: np.ndarray,
           ev: np.ndarray, which: np.ndarray, matrices: list, flat: np.ndarray,
           starts: np.ndarray, count: np.ndarray) -> "_Chains":
        """``taken``: the nodes the DP takes; ``leave``: how many of them leave at each
        node (their last neighbour's); ``eu``, ``ev``, ``which``: the edges between them;
        ``flat``, ``starts``: their unary costs (:func:`_flat`)."""
        n = len(taken)
        edges_in = np.bincount(ev, minlength=n)
        single = edges_in[ev] == 1
        source = np.full(n, -1, dtype=np.int64)
        matrix = np.full(n, -1, dtype=np.int64)
        source[ev[single]], matrix[ev[single]] = eu[single], which[single]
        # the frontier's size before each node: those taken before it less those gone
        size = np.cumsum(taken) - taken - (np.cumsum(leave) - leave)
        chain = taken & (size == 1) & (edges_in == 1) & (leave == 1)
        at = np.flatnonzero(chain)
        at = at[last[source[at]] == at]      # the one leaving is its edge's other end
        if not len(at):
            return _Chains.none(n)
        chain[:] = False
        chain[at] = True
        # a run goes on from the step before when no other node is taken in between (one
        # that is joins the frontier, and may leave before the next step)
        taken_by = np.cumsum(taken)
        first = np.flatnonzero(~chain[source[at]] | (taken_by[at - 1] != taken_by[source[at]]))
        length = np.diff(np.append(first, len(at)))
        rest = np.setdiff1d(np.arange(len(at)), first)
        if np.any(source[at[rest]] != at[rest - 1]):
            raise RuntimeError("a run of chain steps is not contiguous (a bug)")
        begin, end = at[first], at[first + length - 1]
        width = np.maximum(np.maximum.reduceat(count[at], first), count[source[begin]])
        run_at = np.full(n, -1, dtype=np.int64)
        run_at[begin] = np.arange(len(first))
        flat_at = at.tolist()
        nodes = [[s] + flat_at[a:a + k] for s, a, k in
                 zip(source[begin].tolist(), first.tolist(), length.tolist())]
        product: list = [None] * len(first)
        groups = []
        for k in np.unique(width).tolist():
            runs = np.flatnonzero(width == k)
            runs = runs[np.argsort(-length[runs], kind="stable")]
            active = np.searchsorted(-length[runs], -np.arange(int(length[runs[0]])), "left")
            steps = [at[first[runs[:m]] + t] for t, m in enumerate(active.tolist())]
            used, index = np.unique(matrix[np.concatenate(steps)], return_inverse=True)
            padded = np.full((len(used), k, k), np.inf)
            for j, m in enumerate(used.tolist()):
                rows, cols = matrices[m].shape
                padded[j, :rows, :cols] = matrices[m]
            bounds = np.cumsum([0] + [len(x) for x in steps])
            costs = [(index[a:b], _padded_rows(flat, starts, count, x, k))
                     for x, a, b in zip(steps, bounds[:-1].tolist(), bounds[1:].tolist())]
            total = padded[costs[0][0]] + costs[0][1][:, None, :]
            for m, (mats, unary) in zip(active[1:].tolist(), costs[1:]):
                total[:m] = _min_plus(total[:m], padded[mats] + unary[:, None, :])
            for j, r in enumerate(runs.tolist()):
                product[r] = total[j]
            groups.append((runs.tolist(), padded, costs))
        return _Chains(run_at.tolist(), product,
                       count[end].tolist(), end.tolist(), tuple(groups), nodes, at, begin)

    def choices(self, starts: list[np.ndarray]):
        """``choose(run, assignment)``, which sets the choices of a run's nodes but its last
        from the last's: ``starts``, the table where each run starts."""
        found: list = [None] * len(self.product)     # run -> each step's argmin rows
        for runs, padded, costs in self.choices_of:
            k = padded.shape[1]
            table = np.full((len(runs), k), np.inf)
            for j, r in enumerate(runs):
                table[j, :len(starts[r])] = starts[r]
            argmins = []
            for mats, unary in costs:
                step = table[:len(mats), :, None] + padded[mats]
                argmins.append(step.argmin(1).tolist())
                table = np.minimum.reduce(step, 1) + unary
            for j, r in enumerate(runs):
                found[r] = [rows[j] for rows in argmins[:len(self.nodes[r]) - 1]]
        nodes = self.nodes

        def choose(r: int, assignment: list[int]) -> None:
            run, rows = nodes[r], found[r]
            for t in range(len(rows) - 1, -1, -1):
                assignment[run[t]] = rows[t][assignment[run[t + 1]]]
        return choose


def _padded_rows(flat: np.ndarray, starts: np.ndarray, count: np.ndarray, nodes: np.ndarray,
                 k: int) -> np.ndarray:
    """The unary costs of ``nodes`` (:func:`_flat`) as rows of ``k``, padded with inf."""
    columns = np.arange(k)
    index = starts[nodes][:, None] + columns
    valid = columns < count[nodes][:, None]
    return np.where(valid, flat[np.where(valid, index, 0)], np.inf)


def _min_plus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The min-plus products ``a[i] * b[i]`` (``min over y of a[i, x, y] + b[i, y, z]``), a
    few at a time where they are large."""
    batch = max(1, _MIN_PLUS_ELEMENTS // max(1, a.shape[1] * a.shape[2] * b.shape[2]))
    return np.concatenate([np.minimum.reduce(a[i:i + batch, :, :, None] +
                                             b[i:i + batch, None, :, :], 2)
                           for i in range(0, len(a), batch)])


def _edge_matrices(problem: Problem) -> tuple[list[np.ndarray], np.ndarray]:
    """The problem's distinct edge matrices, and which of them each edge has: from its
    arrays (:class:`~tofu_mx.search.problem.EdgeArrays`) where it has them, else each
    matrix object once."""
    if problem.indexed is not None:
        return problem.indexed.matrices, problem.indexed.which
    return _distinct([m for _, _, m in problem.edges], np.arange(len(problem.edges)))


def _distinct(arrays, picked: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct objects among ``arrays[picked]``, and which of them each is."""
    objects = [arrays[k] for k in picked.tolist()]
    ids = np.fromiter(map(id, objects), dtype=np.int64, count=len(objects))
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    return [objects[k] for k in first.tolist()], inverse.reshape(-1)


def _stack(arrays: list[np.ndarray], index: np.ndarray, as_given: np.ndarray | None = None
           ) -> np.ndarray:
    """``np.stack([arrays[k] for k in index])``, each transposed where ``as_given`` is
    False, stacking each distinct one once (stacking tens of thousands of small arrays one
    by one was most of folding's time)."""
    keys = index * 2 + (1 if as_given is None else as_given.astype(np.int64))
    distinct, inverse = np.unique(keys, return_inverse=True)
    stacked = np.stack([arrays[k // 2] if k % 2 else arrays[k // 2].T
                        for k in distinct.tolist()])
    return stacked[inverse.reshape(-1)]


def _flat(unary: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The unary costs end to end (a copy), and where each node's start (one more: the
    end). Each distinct array is copied once, then spread (nodes share them)."""
    lengths = np.fromiter(map(len, unary), dtype=np.int64, count=len(unary))
    starts = np.zeros(len(unary) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    if not len(unary):
        return np.zeros(0), starts
    distinct, which = _distinct(unary, np.arange(len(unary)))
    pieces = np.concatenate(distinct).astype(np.float64)
    offsets = np.cumsum([0] + [len(d) for d in distinct[:-1]])
    spread = np.repeat(offsets[which] - starts[:-1], lengths) + np.arange(int(starts[-1]))
    return pieces[spread], starts


def _leaves(schedule: _Schedule) -> tuple[np.ndarray, ...]:
    """The leaves :class:`_Folding` takes out, in index order: ``(leaf, its edge, whether
    the leaf is the edge's first end, its neighbour v)``."""
    count, last, (eu, ev) = schedule.count_array, schedule.last, schedule.ends
    n = len(count)
    degree = np.bincount(eu, minlength=n) + np.bincount(ev, minlength=n)
    edge_of = np.full(n, -1, dtype=np.int64)
    for ends in (eu, ev):
        single = np.flatnonzero(degree[ends] == 1)
        edge_of[ends[single]] = single
    candidates = np.flatnonzero((degree == 1) & (count > 1))
    edge = edge_of[candidates]
    first = eu[edge] == candidates
    other = np.where(first, ev[edge], eu[edge])
    # a leaf after its neighbour is taken out only where the full DP eliminates it at its own
    # step: its neighbour has one choice, or leaves after it
    ok = first | (count[other] == 1) | (last[other] > candidates)
    return candidates[ok], edge[ok], first[ok], other[ok]


def _add_node(table: np.ndarray, frontier: list[int], v: int, unary: np.ndarray,
              edges: list[tuple[int, np.ndarray]], counts: list[int]) -> np.ndarray:
    """``table`` plus node ``v``'s unary cost and its edges to the frontier; ``v`` joins the
    frontier, as its first axis (NumPy broadcasts a short axis quickest outermost), unless
    it has one choice (then its edges act on its neighbours alone)."""
    fixed = counts[v] == 1
    if fixed:
        table = table + unary[0]
    else:
        table = unary.reshape((-1,) + (1,) * table.ndim) + table
        frontier.insert(0, v)
    for u, m in edges:
        if counts[u] == 1 and fixed:
            table = table + m[0, 0]
        elif counts[u] == 1:
            table = table + m[0].reshape((-1,) + (1,) * (len(frontier) - 1))
        elif fixed:
            shape = [1] * len(frontier)
            shape[frontier.index(u)] = m.shape[0]
            table = table + m[:, 0].reshape(shape)
        else:
            shape = [1] * len(frontier)
            shape[0], shape[frontier.index(u)] = m.shape[1], m.shape[0]
            table = table + m.T.reshape(shape)
    return table
