"""Exact dynamic programming over a :class:`~tofu_mx.search.problem.Problem`.

Nodes are taken in index order (the builder numbers them topologically). The state after
node ``v`` is the *frontier* ``F_v``: the nodes up to ``v`` with an edge to a node after
``v`` (Tofu's "tensors still live"). With ``D_v(x_F)`` the cheapest cost of nodes ``0..v``
given the frontier's choices ``x_F``:

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

import numpy as np

from tofu_mx.errors import TofuError
from tofu_mx.search.problem import Problem


class SearchTooLargeError(TofuError):
    """The DP's frontier holds more states than allowed."""


@dataclass(frozen=True)
class Solution:
    cost: float
    assignment: tuple[int, ...]
    max_frontier: int       # most nodes in the frontier at once
    max_states: int         # most states (product of their choice counts) at once


def solve_dp(problem: Problem, max_states: int = 4_000_000, progress=None) -> Solution:
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
        table = table[..., None] + problem.unary[v]
        frontier.append(v)
        for u, m in neighbours[v]:
            axis = frontier.index(u)
            shape = [1] * len(frontier)
            shape[axis], shape[-1] = m.shape
            table = table + m.reshape(shape)
        widest, most = max(widest, len(frontier)), max(most, table.size)
        for u in leaving[v]:
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
