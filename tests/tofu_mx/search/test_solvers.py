"""The DP against brute force and the integer program."""
import numpy as np
import pytest

from tofu_mx.search.baselines import solve_greedy
from tofu_mx.search.dp import SearchTooLargeError, solve_dp
from tofu_mx.search.exact import solve_brute_force, solve_ilp
from tofu_mx.search.problem import distinct_rows, make_indexed_problem, make_problem


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


def test_indexed_problem_is_make_problem_to_the_last_bit():
    """Parallel, reversed and self edges over shared matrices with fractional costs: the
    same edges in the same order, the same values bit for bit, and the caller's unary
    costs and matrices left as they were."""
    for seed in range(40):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 5))     # few nodes: many parallel edges, summed in order
        choices = [tuple(f"c{k}" for k in range(rng.integers(1, 4))) for _ in range(n)]
        unary = [rng.random(len(c)) / 3 for c in choices]
        for i in range(1, n):       # nodes sharing one cost array, as a cut's do
            same = [j for j in range(i) if len(choices[j]) == len(choices[i])]
            if same and rng.random() < 0.5:
                unary[i] = unary[int(rng.choice(same))]
        before = [u.copy() for u in unary]
        matrices, u, v, which = [], [], [], []
        for _ in range(int(rng.integers(0, 8 * n + 1))):
            a, b = int(rng.integers(0, n)), int(rng.integers(0, n))
            reuse = [k for k, m in enumerate(matrices) if m.shape == (len(choices[a]),
                                                                         len(choices[b]))]
            if reuse and rng.random() < 0.5:
                k = int(rng.choice(reuse))
            else:
                k = len(matrices)
                matrices.append(rng.random((len(choices[a]), len(choices[b]))) / 7 *
                                10.0 ** rng.integers(-4, 5))
            u.append(a), v.append(b), which.append(k)
        copies = [m.copy() for m in matrices]
        names = [f"n{i}" for i in range(n)]
        expected = make_problem(names, choices, unary, [(a, b, matrices[k])
                                                        for a, b, k in zip(u, v, which)])
        found = make_indexed_problem(names, choices, unary, np.array(u, dtype=np.int64),
                                     np.array(v, dtype=np.int64),
                                     np.array(which, dtype=np.int64), matrices)
        assert found.names == expected.names and found.choices == expected.choices
        assert all(np.array_equal(a, b) for a, b in zip(found.unary, expected.unary)), seed
        assert [(a, b) for a, b, _ in found.edges] == [(a, b) for a, b, _ in expected.edges]
        assert all(np.array_equal(x, y) for (_, _, x), (_, _, y) in
                   zip(found.edges, expected.edges)), seed
        assert all(np.array_equal(a, b) for a, b in zip(unary, before))
        assert all(np.array_equal(a, b) for a, b in zip(matrices, copies))


@pytest.mark.parametrize("big", [False, True])
def test_distinct_rows_are_numpy_unique_rows(big):
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 4, (500, 6))
    if big:     # columns whose ranges multiply past 2**62 take numpy's own way
        rows[:, 0] *= 1 << 40
        rows[:, 1] *= 1 << 30
    distinct, which = distinct_rows(rows)
    expected, inverse = np.unique(rows, axis=0, return_inverse=True)
    assert np.array_equal(distinct, expected) and np.array_equal(which, inverse.reshape(-1))
    assert np.array_equal(distinct[which], rows)


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


@pytest.mark.parametrize("indexed", [False, True])
def test_a_matrix_that_does_not_fit_its_edge_is_refused(indexed):
    names, choices, unary = ["a", "b"], [("x", "y"), ("x", "y", "z")], [np.zeros(2), np.zeros(3)]
    for wrong in (np.zeros((2, 2)), np.zeros((3, 2))):
        with pytest.raises(ValueError, match=r"edge \(0, 1\) with matrix .* does not fit"):
            if indexed:
                make_indexed_problem(names, choices, unary, np.array([0]), np.array([1]),
                                     np.array([0]), [wrong])
            else:
                make_problem(names, choices, unary, [(0, 1, wrong)])
    fits = make_indexed_problem(names, choices, unary, np.array([1]), np.array([0]),
                                np.array([0]), [np.zeros((3, 2))])     # read from b to a
    assert fits.edges[0][:2] == (0, 1) and fits.indexed.which.tolist() == [1]


def test_a_node_without_a_fitting_unary_cost_is_refused():
    with pytest.raises(ValueError, match="node 'b': 3 choices, unary cost of shape \\(2,\\)"):
        make_problem(["a", "b"], [("x", "y"), ("x", "y", "z")], [np.zeros(2)] * 2, [])
    with pytest.raises(ValueError, match="2 nodes' choices, 1 unary costs"):
        make_problem(["a", "b"], [("x", "y")] * 2, [np.zeros(2)], [])


@pytest.mark.parametrize("shape", [(3,), (4, 4), (2, 3, 4, 5), (4, 4, 8, 8, 4), (2048, 2),
                                   (4, 2048), (7, 1, 5, 3)])
def test_the_dps_minimum_over_an_axis_is_numpys(shape):
    """_min_at gathers a large table's minima from its argmin: the same entries as
    ``table.min(axis)``, ties and infinities too, over every axis."""
    from tofu_mx.search.dp import _min_at
    rng = np.random.default_rng(len(shape))
    table = rng.integers(0, 3, shape).astype(float)       # many ties
    table[tuple(rng.integers(0, n) for n in shape)] = np.inf
    for axis in range(len(shape)):
        found = _min_at(table, axis, table.argmin(axis))
        assert found.shape == table.min(axis).shape and np.array_equal(found, table.min(axis))


def test_labels_are_numbered_by_first_appearance():
    from tofu_mx.search.problem import by_first_appearance
    which, first = by_first_appearance(np.array([7, 3, 7, 9, 3, 3]))
    assert which.tolist() == [0, 1, 0, 2, 1, 1] and first.tolist() == [0, 1, 3]
    which, first = by_first_appearance(np.zeros(0, dtype=np.int64))
    assert which.tolist() == [] and first.tolist() == []
