"""Baseline plans in the same format and under the same cost model, for comparison.

- ``data_parallel``: every operator splits its batch (output axis 0); weights are fetched
  whole for each use and their gradients reduced back (sharded data parallelism);
- ``row`` / ``column``: every tensor split on its first / second axis where it can be, each
  operator taking its cheapest strategy under that rule;
- ``greedy`` (Spartan-style): operators in order, each taking the choice cheapest given the
  choices already made.

The first three are the DP restricted to the choices the rule allows (a node whose choices
the rule excludes entirely keeps all of them), so each is the best plan of its family.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from nnvm_passes.ir import Graph
from tofu_mx.errors import InvalidArgumentError
from tofu_mx.search.cut import Cut, CutProblem, Group
from tofu_mx.search.bounded import solve_within
from tofu_mx.search.dp import Solution
from tofu_mx.search.problem import Problem
from tofu_mx.search.plan import Plan, SearchOptions, choice_name, plan_graph, restricted
from tofu_mx.tdl.analysis import Layout

Rule = Callable[[Cut, CutProblem, int, int], bool]   # (cut, its problem, slot, choice) -> allowed


def _batch_split(cut: Cut, problem: CutProblem, slot: int, choice: int) -> bool:
    obj = problem.slots[slot]
    if not isinstance(obj, Group):
        return True
    strategy = cut.strats[obj.copies[0][0]][obj.choices[choice][0]]
    return strategy.kind == "output" and strategy.output_layouts[0] == Layout("split", 0)


def _stored_on(axis: int) -> Rule:
    def rule(cut: Cut, problem: CutProblem, slot: int, choice: int) -> bool:
        return problem.stored_output(slot, choice) == ("split", axis)
    return rule


def solve_greedy(problem: Problem) -> Solution:
    """Each node in order takes the choice cheapest given the nodes already decided."""
    before: list[list[tuple[int, np.ndarray]]] = [[] for _ in problem.names]
    for u, v, m in problem.edges:
        before[v].append((u, m))
    x: list[int] = []
    for v, cost in enumerate(problem.unary):
        total = cost.copy()
        for u, m in before[v]:
            total = total + m[x[u]]
        x.append(int(np.argmin(total)))
    return Solution(problem.cost(x), tuple(x), 1, 1)


def _dp_under(rule: Rule):
    def choose(cut: Cut, problem: CutProblem) -> Solution:
        solution, _ = solve_within(restricted(cut, problem, rule), SearchOptions().max_states)
        return Solution(problem.problem.cost(solution.assignment), solution.assignment,
                        solution.max_frontier, solution.max_states)
    return choose


def forced(strategies: dict[str, str]):
    """A chooser (for :func:`~tofu_mx.search.plan.plan_graph`'s ``choose``) that gives the
    named operators the named strategy (``{"conv0": "split x0"}``) wherever they have it,
    and everything else its best choice: for tests that need a particular plan."""
    def rule(cut: Cut, problem: CutProblem, slot: int, choice: int) -> bool:
        named = choice_name(cut, problem, slot, choice)
        return named is None or strategies.get(named[0], named[1]) == named[1]
    return _dp_under(rule)


POLICIES = {
    "data_parallel": _dp_under(_batch_split),
    "row": _dp_under(_stored_on(0)),
    "column": _dp_under(_stored_on(1)),
    "greedy": lambda cut, problem: solve_greedy(problem.problem),
}


def baseline_plan(graph: Graph, num_devices: int, policy: str,
                  options: SearchOptions = SearchOptions(refetch=False)) -> Plan:
    """The ``policy``'s plan. By default its converted inputs are kept for the backward pass,
    as these systems do (data parallelism keeps whole weights), not fetched again."""
    if policy not in POLICIES:
        raise InvalidArgumentError(f"unknown baseline {policy!r}; choose one of {sorted(POLICIES)}")
    return plan_graph(graph, num_devices, options=options, choose=POLICIES[policy])
