"""A plan for a cut whose exact DP does not fit in ``max_states``: fix a few nodes, solve the
rest exactly.

Where the DP's state overflows, the frontier there names the nodes alive at once (parallel
branches, the lowered BatchNorm's sums). Each round fixes one of them, the one with the most
choices, and runs the exact DP on what is left; it stops at the first DP that fits. The
answer is a feasible plan, optimal given the fixed choices.

Where the problem is small enough (``relax_variables``), the relaxation of the integer
program over the local polytope (:func:`tofu_mx.search.exact.lp_relaxation`) is solved
first: a node is fixed to its largest ``x`` there, and the relaxation's optimum bounds the
true optimum from below, so ``gap = (cost - bound) / cost``. Elsewhere a node is fixed to
the choice that looks cheapest from where it stands (:func:`_local_choice`) and the gap is
unknown.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tofu_mx.search.dp import SearchTooLargeError, Solution, solve_dp
from tofu_mx.search.problem import Problem, make_problem


@dataclass(frozen=True)
class Bounded:
    """A bounded search's answer: the solution, the nodes fixed before the exact DP (by
    name, in the order fixed) and the LP relaxation's lower bound (None: not computed)."""

    solution: Solution
    fixed: tuple[str, ...]
    lower_bound: float | None

    @property
    def gap(self) -> float | None:
        """``(cost - bound) / cost``, the most the cost can be above the optimum's."""
        if self.lower_bound is None:
            return None
        cost = self.solution.cost
        return 0.0 if cost <= 0 else max(0.0, (cost - self.lower_bound) / cost)


def restrict(problem: Problem, fixed: dict[int, int]) -> Problem:
    """``problem`` with each node ``v`` of ``fixed`` given its one choice ``fixed[v]``."""
    def keep(v):
        return [fixed[v]] if v in fixed else slice(None)
    choices = [tuple(np.asarray(c, dtype=object)[keep(v)]) for v, c in
               enumerate(problem.choices)]
    unary = [u[keep(v)] for v, u in enumerate(problem.unary)]
    edges = [(u, v, m[keep(u)][:, keep(v)]) for u, v, m in problem.edges]
    return make_problem(problem.names, choices, unary, edges)


def _local_choice(problem: Problem, v: int) -> int:
    """The choice of ``v`` whose unary cost plus, on each edge, the neighbour's cheapest
    answer to it is least (ties: the first)."""
    total = problem.unary[v].astype(np.float64).copy()
    for a, b, m in problem.edges:
        if a == v:
            total += m.min(axis=1)
        elif b == v:
            total += m.min(axis=0)
    return int(np.argmin(total))


def solve_bounded(problem: Problem, max_states: int, progress=None,
                  relax_variables: int = 200_000) -> Bounded:
    """A feasible solution of ``problem`` within ``max_states`` (see the module docstring)."""
    relaxed = None
    if _lp_size(problem) <= relax_variables:
        from tofu_mx.search.exact import lp_relaxation
        relaxed = lp_relaxation(problem)
    index = {name: v for v, name in enumerate(problem.names)}
    fixed: dict[int, int] = {}
    order: list[str] = []
    while True:
        current = restrict(problem, fixed) if fixed else problem
        try:
            found = solve_dp(current, max_states, progress)
            break
        except SearchTooLargeError as e:
            free = [index[n] for n in e.frontier if index[n] not in fixed and
                    len(problem.choices[index[n]]) > 1]
            if not free:
                raise
            v = max(free, key=lambda u: (len(problem.choices[u]), -u))
            fixed[v] = int(np.argmax(relaxed[1][v])) if relaxed else _local_choice(current, v)
            order.append(problem.names[v])
    assignment = tuple(fixed.get(v, c) for v, c in enumerate(found.assignment))
    solution = Solution(problem.cost(assignment), assignment, found.max_frontier,
                        found.max_states)
    return Bounded(solution, tuple(order), relaxed[0] if relaxed else None)


def solve_within(problem: Problem, max_states: int, progress=None
                 ) -> tuple[Solution, Bounded | None]:
    """The exact DP's solution, or where its state would not fit in ``max_states`` the
    bounded search's (and how it was found)."""
    try:
        return solve_dp(problem, max_states, progress), None
    except SearchTooLargeError:
        found = solve_bounded(problem, max_states)
        return found.solution, found


def _lp_size(problem: Problem) -> int:
    """The LP relaxation's variables: one per choice and one per pair of choices on an edge."""
    return sum(map(len, problem.choices)) + sum(m.size for _, _, m in problem.edges)
