"""The search where the exact DP does not fit in max_states: a few nodes fixed, the rest solved
exactly, the LP relaxation bounding the distance to the optimum."""

import mxnet as mx
import numpy as np
import pytest

from tests.tofu_mx.search.test_solvers import random_problem
from tofu_mx.search.bounded import restrict, solve_bounded
from tofu_mx.search.dp import SearchTooLargeError, solve_dp
from tofu_mx.search.exact import lp_relaxation, solve_ilp
from tofu_mx.search.plan import Plan, SearchOptions


def _wide(seed):
    """Random problems whose DP needs more than 64 states at once."""
    rng = np.random.default_rng(seed)
    return random_problem(rng, 24, max_choices=4, density=2.5)


@pytest.mark.parametrize("seed", range(12))
def test_bounded_search_is_feasible_and_within_its_stated_gap(seed):
    p = _wide(seed)
    with pytest.raises(SearchTooLargeError):
        solve_dp(p, max_states=64)
    found = solve_bounded(p, max_states=64)
    best = solve_dp(p, max_states=10 ** 9).cost
    assert found.fixed and p.cost(found.solution.assignment) == pytest.approx(found.solution.cost)
    assert found.solution.cost >= best - 1e-9
    assert found.lower_bound <= best + 1e-6
    assert found.solution.cost - best <= found.gap * found.solution.cost + 1e-6


def test_restrict_keeps_one_choice_and_its_costs():
    p = _wide(0)
    r = restrict(p, {3: 1})
    assert r.choices[3] == (p.choices[3][1],) and list(r.unary[3]) == [p.unary[3][1]]
    x = solve_dp(r, max_states=10 ** 9).assignment
    full = tuple(1 if v == 3 else c for v, c in enumerate(x))
    assert r.cost(x) == pytest.approx(p.cost(full))


def test_the_relaxation_bounds_the_integer_optimum():
    for seed in range(4):
        p = random_problem(np.random.default_rng(500 + seed), 30, max_choices=3, density=1.5,
                           local=3)
        bound, fractions = lp_relaxation(p)
        ilp, _, status = solve_ilp(p)
        assert status == "Optimal" and bound <= ilp.cost + 1e-6
        assert all(abs(f.sum() - 1) < 1e-6 for f in fractions)


def branches(n=6):
    """Parallel branches joined at the end: their tensors are all alive at once."""
    x = mx.sym.var("data")
    outs = []
    for i in range(n):
        h = mx.sym.FullyConnected(x, num_hidden=8, name=f"fc{i}")
        h = mx.sym.FullyConnected(mx.sym.Activation(h, act_type="tanh"), num_hidden=8,
                                  name=f"fc{i}b")
        outs.append(h)
    return mx.sym.MakeLoss(mx.sym.sum(mx.sym.add_n(*outs) ** 2))


@pytest.mark.parametrize("k", [2, 3, 4])
def test_a_cut_too_large_for_the_dp_gives_a_plan_that_says_so_and_verifies(k):
    from tests.tofu_mx.runtime.helpers import partition_and_verify
    options = SearchOptions(max_states=64)
    ptd, report = partition_and_verify(branches(), k, options=options, data=(12, 10))
    assert report.ok, report
    level = ptd.plan.levels[0]
    assert level.fixed > 0 and level.gap is not None and level.gap >= 0
    assert "not the exact optimum" in ptd.plan.report()
    again = Plan.from_json(ptd.plan.to_json())
    assert again.levels == ptd.plan.levels


def test_an_exact_plans_json_has_no_bounded_fields():
    import tofu_mx
    plan = tofu_mx.plan(branches(2), 2, data=(12, 10))
    assert plan.levels[0].fixed == 0 and '"fixed"' not in plan.to_json()
