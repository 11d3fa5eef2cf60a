"""The DP with nodes folded beforehand (exact costs) gives what the full DP gives: the same
cost, the same choices among equal ones, the same frontier and state counts."""
import numpy as np
import pytest

from tofu_mx.search import dp
from tofu_mx.search.problem import make_indexed_problem, make_problem


def leafy_problem(rng, n, shared=False):
    """Small integer costs (many ties); a chain with nodes of one choice and leaves hanging
    before and after their neighbours, as variables hang off a graph's operators.
    ``shared``: nodes and edges share cost arrays and matrices, as a cut's problem does."""
    choices = [tuple(f"c{k}" for k in range(rng.integers(1, 4))) for _ in range(n)]
    pool: dict[tuple, list] = {}

    def cost(shape):
        found = pool.setdefault(shape, [])
        if shared and found and rng.random() < 0.7:
            return found[int(rng.integers(len(found)))]
        found.append(rng.integers(0, 3, shape).astype(float))
        return found[-1]
    unary = [cost((len(c),)) for c in choices]
    edges = []
    for v in range(1, n):
        u = int(rng.integers(max(0, v - 3), v)) if rng.random() < 0.5 else int(rng.integers(0, n))
        if u != v:
            edges.append((u, v, cost((len(choices[u]), len(choices[v])))))
    names = [f"n{i}" for i in range(n)]
    if not shared:
        return make_problem(names, choices, unary, edges)
    matrices = list({id(m): m for _, _, m in edges}.values())
    index = {id(m): k for k, m in enumerate(matrices)}
    return make_indexed_problem(names, choices, unary, np.array([u for u, _, _ in edges], int),
                                np.array([v for _, v, _ in edges], int),
                                np.array([index[id(m)] for _, _, m in edges], int), matrices)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("order", ["index", "best"])
def test_folding_changes_nothing(monkeypatch, order, shared):
    for seed in range(1500):
        rng = np.random.default_rng(seed)
        p = leafy_problem(rng, int(rng.integers(2, 30)), shared)
        try:
            folded = dp.solve_dp(p, max_states=100_000, order=order)
        except dp.SearchTooLargeError:
            continue
        with monkeypatch.context() as m:
            m.setattr(dp, "_exact", lambda problem: False)
            full = dp.solve_dp(p, max_states=100_000, order=order)
        assert folded == full, f"reproduce: seed {seed}: rng = np.random.default_rng({seed}); " \
            f"leafy_problem(rng, int(rng.integers(2, 30)), {shared})"


def test_only_exact_costs_are_folded():
    p = make_problem(["a", "b"], [("x", "y"), ("x", "y")], [np.zeros(2), np.array([0.5, 1])],
                     [(0, 1, np.eye(2))])
    assert not dp._exact(p)
    assert dp._exact(make_problem(["a"], [("x",)], [np.array([3.0])], []))
    assert not dp._exact(make_problem(["a"], [("x",)], [np.array([2.0 ** 60])], []))
    # a fractional pair cost; a matrix shared by edges, counted once per edge
    two = [("x", "y")] * 2
    assert not dp._exact(make_problem(["a", "b"], two, [np.zeros(2)] * 2,
                                      [(0, 1, np.array([[0, 1], [2, 2.5]]))]))
    big = np.full((2, 2), 2.0 ** 48)      # 4 * 2**48 = 2**50 per edge
    for edges, exact in ((3, True), (4, False)):
        p = make_indexed_problem(["v"] + [f"u{k}" for k in range(edges)], two[:1] * (edges + 1),
                                 [np.zeros(2)] * (edges + 1), np.zeros(edges, dtype=int),
                                 np.arange(1, edges + 1), np.zeros(edges, dtype=int), [big])
        assert len({id(m) for _, _, m in p.edges}) == 1 and dp._exact(p) == exact


def chain_problem(rng, n):
    """Runs of chain steps (each node's one edge to the node before), of 1 to 6 choices,
    broken by nodes of one choice, by leaves, and by edges that skip ahead."""
    counts = rng.integers(1, 7, n)
    counts[rng.random(n) < 0.7] = int(rng.integers(2, 7))     # long runs of one width
    choices = [tuple(f"c{k}" for k in range(c)) for c in counts]
    unary = [rng.integers(0, 4, c).astype(float) for c in counts]
    edges = []
    for v in range(1, n):
        r = rng.random()
        u = v - 1 if r < 0.85 else int(rng.integers(max(0, v - 5), v))
        edges.append((u, v, rng.integers(0, 4, (counts[u], counts[v])).astype(float)))
        if rng.random() < 0.05 and v + 3 < n:       # a skip over a few nodes
            w = int(rng.integers(v + 1, min(n, v + 4)))
            edges.append((v, w, rng.integers(0, 4, (counts[v], counts[w])).astype(float)))
    return make_problem([f"n{i}" for i in range(n)], choices, unary, edges)


@pytest.mark.parametrize("batch", [None, 7])
def test_chain_runs_change_nothing(monkeypatch, batch):
    """The runs of chain steps, taken a run at a time (all runs' products side by side, then
    their choices), give what the full DP gives, step by step; ``batch``: min-plus products
    taken a few at a time."""
    if batch is not None:
        monkeypatch.setattr(dp, "_MIN_PLUS_ELEMENTS", batch)
    runs = 0
    for seed in range(300):
        rng = np.random.default_rng(seed)
        p = chain_problem(rng, int(rng.integers(2, 80)))
        schedule = dp._Schedule.of(p)
        runs += len(dp._Folding.of(p, schedule).chains.product)
        batched = dp.solve_dp(p, order="index")
        with monkeypatch.context() as m:
            m.setattr(dp, "_exact", lambda problem: False)
            full = dp.solve_dp(p, order="index")
        assert batched == full, f"reproduce: seed {seed}"
    assert runs > 1000      # the runs were taken


@pytest.mark.parametrize("exact", [True, False])
def test_progress_counts_every_node_once(monkeypatch, exact):
    monkeypatch.setattr(dp, "_PROGRESS_STEP", 5)
    rng = np.random.default_rng(0)
    p = chain_problem(rng, 60)
    if not exact:
        monkeypatch.setattr(dp, "_exact", lambda problem: False)
    seen = []
    dp.solve_dp(p, order="index", progress=seen.append)
    assert sum(seen) == 60 and len(seen) > 3 and min(seen) > 0
