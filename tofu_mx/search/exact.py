"""Exact references for the DP: brute force (tiny problems) and an integer program.

The integer program is the usual one over the local polytope: ``x[v, c]`` in {0, 1} with one
choice per node, and per edge ``y[e, a, b] >= 0`` whose row sums are ``x[u, a]`` and column
sums ``x[v, b]``; minimise ``sum unary * x + sum pair * y``. With integral ``x`` it is exact.
It is solved with PuLP's bundled CBC.
"""
from __future__ import annotations

import contextlib
import itertools
import time
import warnings

import numpy as np
import pulp

from tofu_mx.search.dp import Solution
from tofu_mx.search.problem import Problem


def solve_brute_force(problem: Problem, limit: int = 2_000_000) -> Solution:
    sizes = [len(c) for c in problem.choices]
    if int(np.prod(sizes, dtype=np.float64)) > limit:
        raise ValueError(f"brute force over {np.prod(sizes, dtype=np.float64):.3g} assignments "
                         f"is over the limit {limit:,}")
    best, best_x = np.inf, None
    for x in itertools.product(*(range(s) for s in sizes)):
        cost = problem.cost(x)
        if cost < best:
            best, best_x = cost, x
    return Solution(best, tuple(best_x), len(sizes), int(np.prod(sizes)))


@contextlib.contextmanager
def _pulp_3():
    """PuLP 3.3+ warns on every ``LpVariable(name, ...)`` and on ``PULP_CBC_CMD`` (both go in
    PuLP 4, which setup.py keeps out; ``COIN_CMD`` would need CBC installed apart): one
    DeprecationWarning per variable, tens of thousands for one search of a large net."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Constructing LpVariable", DeprecationWarning)
        warnings.filterwarnings("ignore", "PULP_CBC_CMD is deprecated", DeprecationWarning)
        yield


def _model(problem: Problem, integral: bool) -> tuple[pulp.LpProblem, list]:
    """The integer program of the module's docstring (``integral``), or its relaxation with
    ``x`` in [0, 1]; and the ``x`` variables, per node."""
    model = pulp.LpProblem("tofu_cut", pulp.LpMinimize)
    x = [[pulp.LpVariable(f"x_{v}_{c}", cat="Binary") if integral else
          pulp.LpVariable(f"x_{v}_{c}", lowBound=0, upBound=1) for c in range(len(cs))]
         for v, cs in enumerate(problem.choices)]
    objective = []
    for v, cost in enumerate(problem.unary):
        model += pulp.lpSum(x[v]) == 1
        objective += [float(cost[c]) * x[v][c] for c in range(len(cost)) if cost[c]]
    for e, (u, v, m) in enumerate(problem.edges):
        y = [[pulp.LpVariable(f"y_{e}_{a}_{b}", lowBound=0) for b in range(m.shape[1])]
             for a in range(m.shape[0])]
        for a in range(m.shape[0]):
            model += pulp.lpSum(y[a]) == x[u][a]
        for b in range(m.shape[1]):
            model += pulp.lpSum(y[a][b] for a in range(m.shape[0])) == x[v][b]
        objective += [float(m[a, b]) * y[a][b] for a in range(m.shape[0])
                      for b in range(m.shape[1]) if m[a, b]]
    model += pulp.lpSum(objective)
    return model, x


def solve_ilp(problem: Problem, time_limit: float = 60.0) -> tuple[Solution | None, float, str]:
    """(solution or None, seconds, status). ``None`` when CBC proves nothing in time."""
    start = time.perf_counter()
    with _pulp_3():
        model, x = _model(problem, integral=True)
        status = model.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit))
    seconds = time.perf_counter() - start
    name = pulp.LpStatus[status]
    if name != "Optimal":
        return None, seconds, name
    assignment = tuple(int(np.argmax([pulp.value(var) or 0 for var in xs])) for xs in x)
    return Solution(problem.cost(assignment), assignment, 0, 0), seconds, name


def lp_relaxation(problem: Problem, time_limit: float = 60.0
                  ) -> tuple[float, list[np.ndarray]] | None:
    """The integer program's linear relaxation (``x`` in [0, 1]): its optimum, a lower bound
    on every solution's cost, and each node's ``x`` per choice; None where CBC does not solve
    it in time."""
    with _pulp_3():
        model, x = _model(problem, integral=False)
        status = model.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit))
    if pulp.LpStatus[status] != "Optimal":
        return None
    return (float(pulp.value(model.objective) or 0.0),
            [np.array([pulp.value(var) or 0.0 for var in xs]) for xs in x])
