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

from dataclasses import dataclass

import heapq
import math

import numpy as np

from tofu_mx.errors import TofuError
from tofu_mx.search.problem import Problem, make_problem


_SMALL_STATE = 4096   # below this, the graph's own order is kept without looking further


class SearchTooLargeError(TofuError):
    """The DP's frontier holds more states than allowed."""


@dataclass(frozen=True)
class Solution:
    cost: float
    assignment: tuple[int, ...]
    max_frontier: int       # most nodes in the frontier at once
    max_states: int         # most states (product of their choice counts) at once


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


def largest_state(problem: Problem, order: list[int]) -> float:
    """log of the largest DP state (frontier choice counts multiplied) along ``order``."""
    position = {v: k for k, v in enumerate(order)}
    last = {v: position[v] for v in order}
    for u, v, _ in problem.edges:
        last[u] = max(last[u], position[v])
        last[v] = max(last[v], position[u])
    closing: dict[int, list[int]] = {}
    for v, k in last.items():
        closing.setdefault(k, []).append(v)
    size = [math.log(max(len(c), 1)) for c in problem.choices]
    current = worst = 0.0
    for k, v in enumerate(order):
        current += size[v]
        worst = max(worst, current)
        current -= sum(size[u] for u in closing.get(k, ()))
    return worst


def solve_dp(problem: Problem, max_states: int = 4_000_000, progress=None,
             order: str = "best") -> Solution:
    """Exact minimum of ``problem``. ``order``: ``"index"`` (the nodes' own order),
    ``"greedy"`` (:func:`elimination_order`) or ``"best"`` (the nodes' own order when its
    largest state is small, else whichever of the two has the smaller one)."""
    if order in ("greedy", "best") and len(problem.names) > 1:
        index = list(range(len(problem.names)))
        own = largest_state(problem, index) if order == "best" else math.inf
        perm = index if own <= math.log(_SMALL_STATE) else elimination_order(problem)
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
            return Solution(found.cost, tuple(assignment), found.max_frontier, found.max_states)
    n = len(problem.names)
    neighbours: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]
    last = list(range(n))
    for u, v, m in problem.edges:
        neighbours[v].append((u, m))       # m[x_u, x_v]
        last[u] = max(last[u], v)
    leaving: list[list[int]] = [[] for _ in range(n)]
    for u in range(n):
        leaving[last[u]].append(u)

    table = np.zeros(())                  # D over the frontier's axes
    frontier: list[int] = []
    eliminated: list[tuple[int, tuple[int, ...], np.ndarray]] = []  # (node, axes left, argmin)
    widest, most = 0, 1
    for v in range(n):
        k = len(problem.choices[v])
        states = table.size * k
        if states > max_states:
            raise SearchTooLargeError(
                f"the search state at {problem.names[v]!r} would hold {states:,} states "
                f"(frontier {[problem.names[u] for u in frontier] + [problem.names[v]]}), "
                f"over max_states={max_states:,}")
        # A node with one choice takes no axis: its edges act on its neighbours alone.
        fixed = k == 1
        if fixed:
            table = table + problem.unary[v][0]
        else:
            table = table[..., None] + problem.unary[v]
            frontier.append(v)
        for u, m in neighbours[v]:
            if len(problem.choices[u]) == 1 and fixed:
                table = table + m[0, 0]
            elif len(problem.choices[u]) == 1:
                table = table + m[0].reshape([1] * (len(frontier) - 1) + [m.shape[1]])
            elif fixed:
                shape = [1] * len(frontier)
                shape[frontier.index(u)] = m.shape[0]
                table = table + m[:, 0].reshape(shape)
            else:
                shape = [1] * len(frontier)
                shape[frontier.index(u)], shape[-1] = m.shape
                table = table + m.reshape(shape)
        widest, most = max(widest, len(frontier)), max(most, table.size)
        for u in leaving[v]:
            if len(problem.choices[u]) == 1:
                continue
            axis = frontier.index(u)
            eliminated.append((u, tuple(frontier[:axis] + frontier[axis + 1:]),
                               np.argmin(table, axis=axis)))
            table = np.min(table, axis=axis)
            frontier.pop(axis)
        if progress is not None:
            progress(1)
    assignment = [0] * n
    for u, axes, argmin in reversed(eliminated):
        assignment[u] = int(argmin[tuple(assignment[a] for a in axes)])
    return Solution(float(table), tuple(assignment), widest, most)
