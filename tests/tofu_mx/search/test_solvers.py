"""The DP against brute force and the integer program."""
import numpy as np
import pytest

from tofu_mx.search.baselines import solve_greedy
from tofu_mx.search.dp import SearchTooLargeError, solve_dp
from tofu_mx.search.exact import solve_brute_force, solve_ilp
from tofu_mx.search.problem import make_problem


def random_problem(rng, n, max_choices=3, density=2.0, local=None):
    choices = [tuple(f"c{k}" for k in range(rng.integers(1, max_choices + 1))) for _ in range(n)]
    unary = [rng.integers(0, 20, len(c)).astype(float) for c in choices]
    edges = []
    for _ in range(int(density * n)):
        u = int(rng.integers(0, n))
        v = int(rng.integers(max(0, u - local), min(n, u + local + 1))) if local else \
            int(rng.integers(0, n))
        edges.append((u, v, rng.integers(0, 20, (len(choices[u]), len(choices[v]))).astype(float)))
    return make_problem([f"n{i}" for i in range(n)], choices, unary, edges)


def test_dp_equals_brute_force_on_random_small_problems():
    for seed in range(300):
        rng = np.random.default_rng(seed)
        p = random_problem(rng, int(rng.integers(1, 8)))
        dp, brute = solve_dp(p), solve_brute_force(p)
        assert dp.cost == pytest.approx(brute.cost), f"reproduce: random_problem(default_rng({seed}))"
        assert p.cost(dp.assignment) == pytest.approx(dp.cost)


def test_dp_equals_ilp_on_medium_problems():
    for seed in range(6):
        rng = np.random.default_rng(1000 + seed)
        p = random_problem(rng, 60, max_choices=4, density=1.5, local=3)
        dp = solve_dp(p)
        ilp, _, status = solve_ilp(p, time_limit=60)
        assert status == "Optimal"
        assert dp.cost == pytest.approx(ilp.cost), f"reproduce: seed {1000 + seed}"


def test_greedy_is_never_better_than_dp():
    for seed in range(50):
        rng = np.random.default_rng(seed)
        p = random_problem(rng, 10, density=1.5)
        assert solve_greedy(p).cost >= solve_dp(p).cost - 1e-9


def test_parallel_and_self_edges_are_merged():
    p = make_problem(["a", "b"], [("x", "y"), ("x", "y")], [np.zeros(2), np.zeros(2)],
                     [(0, 1, np.eye(2)), (1, 0, np.eye(2)), (0, 0, np.array([[5, 0], [0, 1]]))])
    assert len(p.edges) == 1 and list(p.unary[0]) == [5, 1]
    assert solve_dp(p).cost == pytest.approx(1.0)


def test_state_bound_names_the_frontier():
    rng = np.random.default_rng(0)
    names = [f"n{i}" for i in range(12)]
    choices = [("a", "b", "c", "d")] * 12
    edges = [(i, 11, rng.random((4, 4))) for i in range(11)]  # everything meets at the end
    p = make_problem(names, choices, [np.zeros(4)] * 12, edges)
    with pytest.raises(SearchTooLargeError, match=r"at 'n4' would hold 1,024 states \(frontier "
                                                  r"\['n0', 'n1', 'n2', 'n3', 'n4'\]\), over "
                                                  r"max_states=1,000"):
        solve_dp(p, max_states=1000, order="index")
    assert solve_dp(p, max_states=4 ** 12, order="index").max_frontier == 12


def test_greedy_order_keeps_a_star_small_and_stays_exact():
    """A hub read by many nodes that come before it: in index order all of them wait for the
    hub; taking the hub early leaves a frontier of two."""
    rng = np.random.default_rng(1)
    n = 14
    edges = [(i, n - 1, rng.random((3, 3))) for i in range(n - 1)]
    p = make_problem([f"n{i}" for i in range(n)], [("a", "b", "c")] * n,
                     [rng.random(3) for _ in range(n)], edges)
    greedy = solve_dp(p, order="greedy")
    assert greedy.max_frontier == 2
    assert solve_dp(p, order="best").max_frontier == 2
    assert greedy.cost == pytest.approx(solve_dp(p, order="index", max_states=10 ** 8).cost)


@pytest.mark.parametrize("order", ["greedy", "best"])
def test_dp_orders_equal_brute_force(order):
    for seed in range(100):
        rng = np.random.default_rng(500 + seed)
        p = random_problem(rng, int(rng.integers(1, 8)))
        assert solve_dp(p, order=order).cost == pytest.approx(solve_brute_force(p).cost), seed
