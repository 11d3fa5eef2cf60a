import dataclasses
import gc
import importlib
import json
import math
import types

import mxnet as mx
import numpy as np
import pytest

import tofu_mx
from nnvm_passes import import_symbol
from tofu_mx import models
from tofu_mx.search import Plan, SearchOptions, plan, plan_graph
from tofu_mx.search.baselines import POLICIES, baseline_plan
from tofu_mx.search.cut import Cut, RefetchedEdges, View
from tofu_mx.search.dp import solve_dp
from tofu_mx.errors import InvalidArgumentError
from tofu_mx.search.exact import solve_ilp
from tofu_mx.search.layouts import OpaqueOp, OpStrategy, StoredLayout
from tofu_mx.search.cost import consumer_bytes, converted_bytes, intersect, stored_regions, \
    volume
from tofu_mx.search.plan import (_Shared, _keep_small, _small_weights, collector_paused,
                                 factor_orders, ideal_memory, lower_graph, prime_factors,
                                 search_levels)
from tofu_mx.runtime.assign import assign, device_parts, stored_box

BATCH = 960   # divisible by every device count tested


def mlp(hidden=(16, 16), classes=8):
    x = mx.sym.var("data")
    for i, n in enumerate(hidden):
        x = mx.sym.Activation(mx.sym.FullyConnected(x, num_hidden=n, name=f"fc{i}"),
                              act_type="relu", name=f"relu{i}")
    return mx.sym.SoftmaxOutput(mx.sym.FullyConnected(x, num_hidden=classes, name="out"),
                                name="softmax")


def mlp_param_bytes(inputs=32, hidden=(16, 16), classes=8):
    sizes, prev = 0, inputs
    for n in list(hidden) + [classes]:
        sizes += prev * n + n
        prev = n
    return 4 * sizes


@pytest.mark.parametrize("refetch", [False, True])
@pytest.mark.parametrize("k", [2, 3, 4, 6, 8])
def test_data_parallel_mlp_costs_exactly_its_gradient_all_reduce(k, refetch):
    """A wide batch and small weights: the best plan is data parallelism, which moves exactly
    what a ring all-reduce of the parameter gradients moves, 2 (k - 1) x parameter bytes
    (as an all-gather of each weight forward and a reduce-scatter of its gradient). Fetching
    every weight again for the backward pass, not keeping it (``keep_share=0``), adds one
    more all-gather: 3 (k - 1) x parameter bytes (as ZeRO's stage 3)."""
    p = plan(mlp(), k, data=(BATCH, 32), softmax_label=(BATCH,),
             options=SearchOptions(refetch=refetch, keep_share=0))
    assert p.refetch == refetch and p.kept == ()
    assert p.total_bytes == (3 if refetch else 2) * (k - 1) * mlp_param_bytes()
    assert all(str(t.layouts[0]) == "split(0)" for t in p.tensors if t.kind in ("data", "activation"))
    assert all(s[0].kind == "split" for o in p.ops for s in [o.strategies])
    dp = baseline_plan(import_symbol(mlp(), data=(BATCH, 32), softmax_label=(BATCH,)), k,
                       "data_parallel")
    assert dp.total_bytes * (1.5 if refetch else 1) == p.total_bytes


@pytest.mark.parametrize("k", [2, 3])
def test_small_gathered_weights_are_kept_not_fetched_again(k):
    """By default (``keep_share=0.03``) the re-fetching plan keeps the gathered copies
    that add little memory: the MLP's weights (3.7 KB, against its batch's activations),
    gathered whole for the batch split, are kept (with the pieces they are joined from, they
    add under 3% to a device's memory), so the plan moves what data parallelism
    moves, 2 (k - 1) x parameter bytes. With a share too small
    for any of them, every one is fetched again."""
    shapes = dict(data=(8 * BATCH, 32), softmax_label=(8 * BATCH,))
    p = plan(mlp(), k, **shapes)
    copies = 4 * (32 * 16 + 16 * 16 + 16 * 8)   # the weights their gradients read (no bias)
    assert 2 * copies <= SearchOptions().keep_share * p.memory[0].total  # copy and pieces
    assert p.refetch and {(name, 1) for name in ("fc0", "fc1", "out")} <= set(p.kept)
    assert p.total_bytes == 2 * (k - 1) * mlp_param_bytes()
    graph = import_symbol(mlp(), **shapes)
    ops = {graph.nodes[i].name: a for i, a in assign(graph, p).ops.items()}
    assert all(1 in ops[name].kept for name in ("fc0", "fc1", "out"))
    tight = SearchOptions(keep_share=0.99 * copies / p.memory[0].total)
    q = plan(mlp(), k, **shapes, options=tight)
    weights_kept = {name for name, j in q.kept if j == 1}
    assert weights_kept and len(weights_kept) < 3 and q.total_bytes > p.total_bytes
    none = plan(mlp(), k, **shapes, options=SearchOptions(keep_share=1e-9))
    assert none.kept == () and none.total_bytes == 3 * (k - 1) * mlp_param_bytes()
    assert Plan.from_json(p.to_json()) == p


def _edges_from_the_cost_model(graph, r):
    """Per re-fetched edge of level ``r``: its readers (operator, input), the bytes fetched
    again, the largest region kept and whether it is a converted copy, from the cost model."""
    ports, e, a = r.cut.structure.ports(graph), r.problem.refetched, r.solution.assignment
    for k in range(len(e)):
        readers = tuple((int(ports.member[x]), int(ports.input[x]))
                        for x in e.reader_port[e.reader_start[k]:e.reader_start[k + 1]])
        layouts, (regions, shape) = r.cut._interned[e.held[k]], r.cut._interned[e.read[k]]
        itemsize, _ = r.cut.structure.facts_of_tensors[e.facts[k]]
        layout, need = layouts[a[e.source[k]]], regions[a[e.slot[k]]]
        held = stored_regions(layout, shape, len(need))
        largest = max(2 * volume(n) - volume(intersect(n, h)) for h, n in zip(held, need))
        yield readers, consumer_bytes(layout, shape, need, itemsize, False, False), \
            largest * itemsize, converted_bytes(layout, shape, need, itemsize) > 0


def _keep_small_one_edge_at_a_time(graph, results, budget, edges=_edges_from_the_cost_model):
    """:func:`_keep_small` as first written: one edge at a time, readers as (operator,
    input) pairs in a dictionary union-find."""
    if budget <= 0:
        return (), [0.0] * len(results)
    parent = {}

    def root(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x
    saved, moved = {}, set()
    for level, r in enumerate(results):
        for readers, b, _, _ in edges(graph, r):
            first = root(readers[0])
            for reader in readers[1:]:
                parent[root(reader)] = first
            if b:
                moved.update(readers)
                saved.setdefault(readers[0], [0.0] * len(results))[level] += b
    by_class = {}
    for reader, per_level in saved.items():
        total = by_class.setdefault(root(reader), [0.0] * len(results))
        by_class[root(reader)] = [t + s for t, s in zip(total, per_level)]
    size = {}
    for readers, _, largest, converted in edges(graph, results[-1]):
        if converted or moved.intersection(readers):
            size[root(readers[0])] = size.get(root(readers[0]), 0.0) + largest
    members = {}
    for reader in list(parent):
        members.setdefault(root(reader), []).append(reader)
    kept, used, total = [], 0.0, [0.0] * len(results)
    for c in sorted(by_class, key=lambda c: (size.get(c, 0.0) / sum(by_class[c]), c)):
        if used + size.get(c, 0.0) <= budget:
            used += size.get(c, 0.0)
            kept += members[c]
            total = [t + s for t, s in zip(total, by_class[c])]
    return tuple(sorted((graph.nodes[m].name, j) for m, j in kept)), total


BUDGETS = (0.0, 1.0, 1e3, 3e3, 1e4, 3e4, 1e5, 1e6, 1e7, math.inf)


@pytest.mark.parametrize("net, k", [("rnn", 3), ("rnn", 4), ("wresnet", 8)])
def test_keep_small_keeps_what_one_edge_at_a_time_keeps(net, k):
    """The copies kept after the search, worked out over arrays of edges, are those the
    first, edge-by-edge way kept, at budgets from none to all: RNN steps (tied: one fetched
    copy serves several readers) and a ResNet over three cuts."""
    if net == "rnn":
        sym, shapes = models.rnn(2, 64, 5, 50), models.input_shapes("rnn", 12, seq_len=5)
    else:
        sym, shapes = models.wresnet(50, 1), dict(models.input_shapes("wresnet", 16),
                                                   data=(16, 3, 32, 32))
    graph = lower_graph(import_symbol(sym, **shapes), k)
    order = factor_orders(k, False)[0]
    results = search_levels(graph, order, SearchOptions(), structure=_Shared.of(graph).structure)
    if net == "rnn":
        assert any(len(r.problem.refetched.reader_port) > len(r.problem.refetched)
                   for r in results)    # some edge has several readers
    kept = [_keep_small(graph, results, budget) for budget in BUDGETS]
    assert len({len(found) for found, _ in kept}) > 2 and any(kept[-1][1])
    for budget, found in zip(BUDGETS, kept):
        assert found == _keep_small_one_edge_at_a_time(graph, results, budget)


@pytest.mark.parametrize("seed", range(6))
def test_keep_small_merges_the_readers_of_one_copy_over_the_cuts(seed):
    """Readers that share a fetched copy at some cut are kept, or not, together, as one class
    with the savings of all its edges (at every cut), against the edge-by-edge way: random
    edges over a few readers, several readers each, at three cuts."""
    rng = np.random.default_rng(seed)
    n_ports, levels = 12, 3
    names = [types.SimpleNamespace(name=f"op{m}") for m in range(n_ports)]
    graph = types.SimpleNamespace(nodes=names)
    ports = types.SimpleNamespace(member=np.arange(n_ports), input=np.arange(n_ports) % 3)
    structure = types.SimpleNamespace(ports=lambda _: ports)
    results, rows = [], {}
    for level in range(levels):
        count = int(rng.integers(2, 7))
        groups = [rng.choice(n_ports, size=int(rng.integers(1, 4)), replace=False)
                  for _ in range(count)]
        b = rng.integers(0, 3, count) * rng.integers(1, 1000, count).astype(float)
        largest = rng.integers(1, 5000, count).astype(float)
        converted = rng.random(count) < 0.5
        starts = np.concatenate([[0], np.cumsum([len(g) for g in groups])])
        zeros = np.zeros(count, dtype=np.int64)
        edges = RefetchedEdges(zeros, zeros, zeros, zeros, zeros, starts, np.concatenate(groups))
        cut = types.SimpleNamespace(
            structure=structure, second_fetches=lambda e, a, b=b: b,
            kept_copies=lambda e, a, x=(largest, converted): x)
        r = types.SimpleNamespace(cut=cut, problem=types.SimpleNamespace(refetched=edges),
                                  solution=types.SimpleNamespace(assignment=None))
        rows[id(r)] = [(tuple((int(x), int(x) % 3) for x in g), b[k], largest[k], converted[k])
                       for k, g in enumerate(groups)]
        results.append(r)
    assert any(len(g) > 1 and b for r in results for g, b, _, _ in rows[id(r)])
    for budget in (0.0, 500.0, 2000.0, 5000.0, 1e4, math.inf):
        assert _keep_small(graph, results, budget) == _keep_small_one_edge_at_a_time(
            graph, results, budget, lambda _, r: rows[id(r)])


def test_small_weights_are_kept_before_the_search_smallest_first():
    """The weights whose gradients read them are kept before the search, smallest first,
    counted whole, while they fit ``keep_share`` of the ideal memory: the search then prices
    gathering them once, as data parallelism does."""
    shapes = dict(data=(8 * BATCH, 32), softmax_label=(8 * BATCH,))
    graph = import_symbol(mlp(), **shapes)
    shared = _Shared.of(graph)
    ideal = ideal_memory(graph, shared.kept, SearchOptions(), 2)
    sizes = {"out_weight": 4 * 16 * 8, "fc1_weight": 4 * 16 * 16, "fc0_weight": 4 * 32 * 16}
    share = (sizes["out_weight"] + sizes["fc1_weight"]) / ideal
    kept, used = _small_weights(graph, 2, SearchOptions(keep_share=share), shared, ideal)
    assert {graph.nodes[i].name for i, _ in kept} == {"out_weight", "fc1_weight"}
    assert used == sizes["out_weight"] + sizes["fc1_weight"]
    assert _small_weights(graph, 2, SearchOptions(keep_share=0.99 * share), shared, ideal)[0] == \
        {(graph.index("out_weight"), 0)}
    for off in (SearchOptions(refetch=False), SearchOptions(keep_share=0)):
        assert _small_weights(graph, 2, off, shared, ideal) == (frozenset(), 0.0)
    p = plan_graph(graph, 2, options=SearchOptions(keep_share=share))
    assert {("out", 1), ("fc1", 1)} <= set(p.kept)


def test_a_net_of_small_weights_moves_what_data_parallelism_moves():
    """SqueezeNet (5 MB of weights, batch 32) at k = 5: priced as fetched twice, its weights
    led the search to a plan moving 1.10x data parallelism's bytes; kept before the search,
    the default plan moves exactly what the plan keeping every copy moves, as data
    parallelism does."""
    with mx.name.NameManager():
        net = mx.gluon.model_zoo.vision.get_model("squeezenet1.0")
        sym = mx.sym.SoftmaxOutput(net(mx.sym.var("data")), name="softmax")
    graph = lower_graph(import_symbol(sym, data=(32, 3, 224, 224), softmax_label=(32,)), 5)
    default = plan_graph(graph, 5)
    keeping = plan_graph(graph, 5, options=SearchOptions(refetch=False))
    dp = baseline_plan(graph, 5, "data_parallel")
    assert default.refetch and default.total_bytes == keeping.total_bytes == dp.total_bytes
    assert plan_graph(graph, 5, options=SearchOptions(keep_share=0)).total_bytes > \
        1.4 * dp.total_bytes


def test_a_tall_layer_is_partitioned_not_replicated():
    """A 4096 x 4096 layer on a batch of 8: fetching the weight would move 64 MiB; splitting
    it by rows and gathering the small activations moves far less."""
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4096, name="fc")
    p = plan(mx.sym.LinearRegressionOutput(fc, name="loss"), 2, data=(8, 4096),
             loss_label=(8, 4096))
    weight_bytes = 4096 * 4096 * 4
    assert p.total_bytes < weight_bytes / 8
    assert str(p.tensor("fc_weight").layouts[0]) in ("split(0)", "split(1)")


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7, 8])
def test_any_device_count(k):
    sym = models.transformer(1, 16, 4, 6, 20)
    p = plan(sym, k, **models.input_shapes("transformer", 12, seq_len=6))
    assert math.prod(p.factors) == k and len(p.memory) == k
    assert (p.total_bytes == 0) == (k == 1)


def test_prime_factor_orders():
    assert prime_factors(12) == [2, 2, 3] and prime_factors(7) == [7] and prime_factors(1) == []
    assert factor_orders(6, True) == [(2, 3), (3, 2)]
    assert factor_orders(8, True) == [(2, 2, 2)]
    assert factor_orders(12, False) == [(3, 2, 2)]


@pytest.mark.parametrize("sym, shapes, k", [
    (models.wresnet(14, 1, 10), models.input_shapes("wresnet", 6, image_size=32), 6),
    (models.wresnet(14, 1, 10), models.input_shapes("wresnet", 4, image_size=32), 8),
    (models.rnn(2, 24, 3, 36), models.input_shapes("rnn", 6, seq_len=3), 12),
    (models.transformer(1, 24, 4, 6, 36), models.input_shapes("transformer", 2, seq_len=6), 8),
    (mlp((12, 12)), {"data": (2, 32), "softmax_label": (2,)}, 8),   # a tiny batch: partials
    (models.wresnet(14, 1, 10), models.input_shapes("wresnet", 7, image_size=32), 6),
    (mlp((10, 7)), {"data": (5, 13), "softmax_label": (5,)}, 7),
    (models.rnn(2, 20, 3, 30), models.input_shapes("rnn", 5, seq_len=3), 5),
])
def test_uneven_splits_give_every_device_a_piece_within_one(sym, shapes, k):
    """Axes a cut does not divide are split at floor boundaries: every device stores a
    non-empty piece, the pieces of an axis differ by at most one element, together they
    tile the tensor, and the plan's shard is the largest piece."""
    check_pieces(plan(sym, k, **shapes))


def check_pieces(p) -> int:
    """Checks the pieces of every tensor of plan ``p``; the number of uneven axes."""
    k = p.num_devices
    parts = device_parts(k, p.factors)
    uneven = 0
    for t in p.tensors:
        boxes = {stored_box(t.shape, t.layouts, p.factors, q) for q in parts}
        sizes = [tuple(hi - lo + 1 for lo, hi in box) for box in boxes]
        assert all(min(size) >= 1 for size in sizes), (t.name, t.layouts, sizes)
        for axis in range(len(t.shape)):
            extents = {size[axis] for size in sizes}
            assert max(extents) - min(extents) <= 1, (t.name, t.layouts, sizes)
            uneven += len(extents) > 1
        assert sum(math.prod(size) for size in sizes) == math.prod(t.shape) or \
            len(boxes) < k, (t.name, t.layouts)          # pieces tile the tensor (or repeat)
        assert t.shard == tuple(max(size[a] for size in sizes) for a in range(len(t.shape)))
    return uneven


def test_uneven_splits_are_used():
    """k = 3 on 32 channels, batch 8 and 10 classes: the plan splits axes 3 does not divide."""
    sym, shapes = models.wresnet(14, 1, 10), models.input_shapes("wresnet", 8, image_size=32)
    assert check_pieces(plan(sym, 3, **shapes)) > 0


def test_plan_is_plain_deterministic_data():
    shapes = models.input_shapes("rnn", 4, seq_len=3)
    a = plan(models.rnn(2, 16, 3, 20), 4, **shapes)
    b = plan(models.rnn(2, 16, 3, 20), 4, **shapes)
    assert a.to_json() == b.to_json()
    assert Plan.from_json(a.to_json()) == a
    text = a.report()
    assert "level 1: 2-way cut" in text and "coarsening:" in text
    assert "per device, stored shards:" in text


def test_plan_data_is_typed_and_its_json_is_text():
    """Layouts and strategies are values (StoredLayout, OpStrategy), written as their text."""
    p = plan(mlp(), 4, data=(BATCH, 32), softmax_label=(BATCH,))
    assert all(isinstance(l, StoredLayout) for t in p.tensors for l in t.layouts)
    assert all(isinstance(s, OpStrategy) for o in p.ops for s in o.strategies)
    d = json.loads(p.to_json())
    assert all(isinstance(l, str) for t in d["tensors"] for l in t["layouts"])
    assert d["tensors"][0]["layouts"] == [str(l) for l in p.tensors[0].layouts]
    assert [OpStrategy.parse(s) for s in d["ops"][0]["strategies"]] == list(p.ops[0].strategies)
    assert StoredLayout.parse("split(3)") == StoredLayout(3) and str(StoredLayout(3)) == "split(3)"
    assert StoredLayout.parse("replicated").replicated
    assert OpStrategy.parse("reduce ci") == OpStrategy("reduce", "ci")
    assert OpStrategy.parse("whole") == OpStrategy("whole")
    for bad in ("split(x)", "split(-1)", "sideways", 3):
        with pytest.raises(InvalidArgumentError, match="stored layout"):
            StoredLayout.parse(bad)
    for bad in ("shuffle b", "whole b", "split", 7):
        with pytest.raises(InvalidArgumentError, match="strateg"):
            OpStrategy.parse(bad)
    d["tensors"][0]["layouts"][0] = "split(x)"
    with pytest.raises(InvalidArgumentError, match="'tensors'.*split\\(x\\)"):
        Plan.from_json(json.dumps(d))


def test_plans_say_whether_they_refetch_and_older_plans_do_not():
    p = plan(mlp(), 2, data=(BATCH, 32), softmax_label=(BATCH,))
    assert p.refetch and Plan.from_json(p.to_json()) == p
    d = json.loads(p.to_json())
    del d["refetch"]    # written before re-fetching existed: made and priced without it
    assert not Plan.from_json(json.dumps(d)).refetch
    d["refetch"] = "yes"
    with pytest.raises(InvalidArgumentError, match="refetch"):
        Plan.from_json(json.dumps(d))


def test_total_bytes_is_a_whole_number_of_the_exact_sum():
    """``total_bytes`` (what users print) is an int, the levels' sum rounded; ``exact_bytes``
    is the sum itself. Neither is a field: the JSON round trip is as before."""
    p = plan(mlp(), 6, data=(BATCH, 32), softmax_label=(BATCH,))
    assert isinstance(p.total_bytes, int) and isinstance(p.exact_bytes, float)
    assert p.exact_bytes == sum(lv.bytes for lv in p.levels)
    assert p.total_bytes == round(sum(lv.bytes for lv in p.levels))
    assert "total_bytes" not in p.to_json() and Plan.from_json(p.to_json()) == p
    level = dataclasses.replace(p.levels[0], groups=1, bytes_per_group=1234.6)
    assert dataclasses.replace(p, levels=(level,)).total_bytes == 1235
    assert f"{dataclasses.replace(p, levels=(level,)).total_bytes}" == "1235"


def test_candidates_are_sorted_by_the_exact_bytes_not_the_rounded(monkeypatch):
    """Two factor orders whose bytes round to the same whole number: the plan moving fewer
    exact bytes wins, though the other's factors come first (the tie-break of equal costs)."""
    plan_module = importlib.import_module("tofu_mx.search.plan")   # (.plan is the function)
    exact = {(2, 3): 10.4, (3, 2): 10.2}    # both 10 bytes, rounded

    def assemble(graph, k, order, results, *rest):
        level = plan_module.Level(order[0], 1, exact[tuple(order)], 1, 1, 1)
        return Plan(k, tuple(order), (level,), (), (), (), ())
    monkeypatch.setattr(plan_module, "search_levels", lambda *a, **kw: [])
    monkeypatch.setattr(plan_module, "_assemble", assemble)
    graph = import_symbol(mlp(), data=(BATCH, 32), softmax_label=(BATCH,))
    best = plan_graph(graph, 6, options=SearchOptions(balance=0))
    assert best.factors == (3, 2) and best.exact_bytes == 10.2 and best.total_bytes == 10


def test_plans_say_whether_the_graph_has_no_loss_head():
    """A graph none of whose outputs is a loss head needs the outputs' gradients given to
    backward(): the plan says so (its JSON only then holds the flag; older plans did not)."""
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc")
    p = plan(fc, 2, data=(BATCH, 32))
    assert p.no_loss_head and Plan.from_json(p.to_json()) == p
    assert "no loss head: no output is made by a loss operator" in p.report()
    assert "exe.backward(out_grads=[...])" in p.report() and "grad_req='null'" in p.report()
    d = json.loads(p.to_json())
    del d["no_loss_head"]       # written before the flag existed
    assert not Plan.from_json(json.dumps(d)).no_loss_head
    d["no_loss_head"] = "yes"
    with pytest.raises(InvalidArgumentError, match="no_loss_head must be true or false"):
        Plan.from_json(json.dumps(d))
    with_loss = plan(mlp(), 2, data=(BATCH, 32), softmax_label=(BATCH,))
    assert not with_loss.no_loss_head and "no_loss_head" not in with_loss.to_json()
    assert "no loss head" not in with_loss.report()
    # outputs that carry no gradient need none given; nor is an undescribed operator judged
    assert not plan(mx.sym.BlockGrad(fc), 2, data=(BATCH, 32)).no_loss_head
    from tests.tofu_mx.runtime.custom_ops import cube
    assert not plan(cube(fc, name="cube"), 2, data=(4, 3)).no_loss_head
    made = mx.sym.MakeLoss(mx.sym.sum(fc))
    assert not plan(made, 2, data=(BATCH, 32)).no_loss_head


def test_opaque_operators_read_from_older_plans():
    """Plans written before opaque operators were typed held ``"name (op): reason"``."""
    from tests.tofu_mx.runtime.custom_ops import cube
    x = cube(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc"), name="cube")
    p = plan(x, 2, data=(4, 3))
    assert p.opaque == (OpaqueOp("cube", "Custom", "no description"),)
    d = json.loads(p.to_json())
    assert d["opaque"] == [["cube", "Custom", "no description"]]
    d["opaque"] = ["cube (Custom): no description"]
    assert Plan.from_json(json.dumps(d)).opaque == p.opaque


def test_rnn_time_steps_share_one_choice():
    counts = {}
    for steps in (4, 8):
        g = import_symbol(models.rnn(2, 16, steps, 20), **models.input_shapes("rnn", 4,
                                                                              seq_len=steps))
        cut = Cut(g, View.of(g), 2)
        counts[steps] = (len(cut.ops), len(cut.groups))
    assert counts[8][0] > counts[4][0]                  # twice the operators ...
    assert counts[8][1] == counts[4][1]                 # ... the same number of choices


def test_memory_per_device_and_budget():
    shapes = {"data": (BATCH, 32), "softmax_label": (BATCH,)}
    p = plan(mlp(), 4, **shapes)
    assert p.memory[0].weights == mlp_param_bytes() // 4 == p.memory[0].gradients
    adam = plan(mlp(), 4, options=SearchOptions(optimizer_state=2.0), **shapes)
    assert adam.memory[0].optimizer == 2 * adam.memory[0].weights
    need = p.memory[0].total
    assert plan(mlp(), 4, memory_budget=need, **shapes) == p
    assert plan(mlp(), 4, memory_budget=[need] * 4, **shapes) == p
    assert need % 2 == 0 and all(not t.layouts[0].replicated for t in p.tensors)
    with pytest.raises(tofu_mx.NoFeasiblePlanError, match=r"device 0 needs .* about 8 devices "
                                                          r"would fit") as info:
        plan(mlp(), 4, memory_budget=need // 2, **shapes)   # everything is sharded: 4 * 2
    assert info.value.footprint == need and info.value.devices_needed == 8
    with pytest.raises(tofu_mx.NoFeasiblePlanError, match="device 2 needs"):
        plan(mlp(), 4, memory_budget=[need, need, need // 2, need], **shapes)
    with pytest.raises(tofu_mx.InvalidArgumentError, match="lists 3 budgets for 4 devices"):
        plan(mlp(), 4, memory_budget=[need] * 3, **shapes)


def test_bad_device_count():
    with pytest.raises(tofu_mx.InvalidArgumentError, match="num_devices must be between 1 and"):
        plan(mlp(), 0, data=(4, 32), softmax_label=(4,))


def test_unknown_operators_are_listed_and_run_whole():
    from tests.tofu_mx.runtime.custom_ops import cube
    x = cube(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc"), name="cube")
    for k in (2, 4, 6):
        p = plan(x, k, data=(12, 8))
        assert tuple(map(str, p.opaque)) == ("cube (Custom): no description",)
        assert dict((o.name, tuple(map(str, o.strategies))) for o in p.ops)["cube"] == \
            ("whole",) * len(p.factors)
        # its input is gathered on one device and its output scattered: both are counted
        described = plan(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc") ** 3,
                         k, data=(12, 8))
        assert p.total_bytes > described.total_bytes


@pytest.mark.parametrize("name, sym, shapes", [
    ("wresnet", models.wresnet(14, 2, 10), models.input_shapes("wresnet", 8, image_size=32)),
    ("rnn", models.rnn(2, 64, 4, 50), models.input_shapes("rnn", 8, seq_len=4)),
    ("transformer", models.transformer(2, 32, 4, 8, 50), models.input_shapes("transformer", 4,
                                                                              seq_len=8)),
])
def test_search_is_optimal_and_beats_the_baselines(name, sym, shapes):
    graph = import_symbol(sym, **shapes)
    cut = Cut(graph, View.of(graph), 2)
    problem = cut.problem().problem
    ilp, _, status = solve_ilp(problem, time_limit=60)
    assert status == "Optimal" and solve_dp(problem).cost == pytest.approx(ilp.cost)
    for refetch in (False, True):
        options = SearchOptions(refetch=refetch)
        best = plan_graph(graph, 2, options=options).total_bytes
        for policy in POLICIES:
            assert best <= baseline_plan(graph, 2, policy, options).total_bytes + 1e-6, policy


def test_a_weight_shared_by_tied_steps_is_fetched_once():
    """Data parallelism on an unrolled LSTM: each layer's weights are read by every step,
    which share one choice; the weight is gathered (and its gradient reduced) once."""
    shapes = models.input_shapes("rnn", 8, seq_len=6)
    graph = import_symbol(models.rnn(1, 16, 6, 12), **shapes)
    dp = baseline_plan(graph, 2, "data_parallel")
    params = sum(t.shard_bytes * (2 if not t.layouts[0].replicated else 1)
                 for t in dp.tensors if t.kind == "param")
    # at most one all-reduce's worth (2 (k-1) S, k = 2) per parameter, not one per step
    assert dp.total_bytes <= 2 * params + 6 * 8 * 16 * 4 * 8


ZOO_PLANS = ["alexnet", "vgg11_bn", "resnet18_v1", "resnet50_v2", "densenet121",
             "squeezenet1.0", "inceptionv3", "mobilenet1.0", "mobilenetv2_1.0"]


@pytest.mark.parametrize("name", ZOO_PLANS)
def test_every_zoo_net_plans_at_2_3_and_4_devices(name):
    from mxnet.gluon.model_zoo import vision

    from tofu_mx.tdl.coverage import ZOO
    with mx.name.NameManager():
        sym = vision.get_model(name, classes=12)(mx.sym.var("data"))
    size = ZOO[name]
    graph = import_symbol(sym, data=(12, 3, size, size))
    for k in (2, 3, 4):
        p = plan_graph(graph, k)
        assert math.prod(p.factors) == k and p.opaque == ()
        for t in p.tensors:
            assert all(s >= 1 for s in t.shard), t
        assert Plan.from_json(p.to_json()) == p
    # no more than data parallelism holding as much: keeping its gathered weights (classic
    # data parallelism), or fetching them again for the backward pass (as ZeRO's stage 3)
    for refetch in (False, True):
        options = SearchOptions(refetch=refetch)
        assert plan_graph(graph, 2, options=options).total_bytes <= \
            baseline_plan(graph, 2, "data_parallel", options).total_bytes


def test_stored_excess_prices_a_remainder_and_a_whole_copy():
    """What a memory weight prices of a stored tensor: the bytes its largest part holds
    above an even share. 6 rows in 4 parts: pieces of 2, 2, 1, 1, so 2/6 against 1.5/6."""
    from tofu_mx.search.cut import _excess
    size = 6 * 10 * 4
    assert _excess(("split", 0), (6, 10), 4, 4) == pytest.approx(size * (2 / 6 - 1 / 4))
    assert _excess(("split", 1), (6, 10), 4, 2) == 0            # 10 in 2: even
    assert _excess(("replicated",), (6, 10), 4, 4) == pytest.approx(size * 3 / 4)


@pytest.mark.parametrize("bad", [0.5, -1, "1.15", float("nan")])
def test_balance_must_be_off_or_a_multiple_of_the_ideal(bad):
    with pytest.raises(InvalidArgumentError, match="balance"):
        SearchOptions(balance=bad)


def _fingerprint_as_json_dumps(graph) -> str:
    """graph_fingerprint as first written (saved plans store it): one json.dumps per node."""
    import hashlib
    h = hashlib.sha256()
    for n in graph.nodes:
        h.update(json.dumps([n.name, n.op, sorted(n.attrs.items()), [e.to_json() for e in n.inputs],
                             [[list(t.shape), t.dtype] for t in n.outputs], n.kind]).encode())
    h.update(json.dumps([e.to_json() for e in graph.heads]).encode())
    return h.hexdigest()[:16]


def test_graph_fingerprint_is_the_digest_saved_plans_hold():
    """The quick fingerprint equals the one json.dumps per node gives: on the zoo's graphs,
    lowered and not, and on names and attributes json.dumps escapes (quotes, non-ASCII),
    non-string attribute values and a node with no kind."""
    from nnvm_passes.ir import FrozenDict
    from tofu_mx.search.plan import graph_fingerprint, lower_graph
    from tofu_mx.tdl.coverage import builtin_graphs
    seen = set()
    for name, sym, shapes in builtin_graphs():
        graph = import_symbol(sym, **shapes)
        for g in (graph, lower_graph(graph, 2)):
            assert graph_fingerprint(g) == _fingerprint_as_json_dumps(g), name
            seen.add(graph_fingerprint(g))
    x = mx.sym.var("dätä \"q\"")
    sym = mx.sym.FullyConnected(x, num_hidden=3, name="fc\\ü\u2603")
    graph = import_symbol(sym, **{"dätä \"q\"": (2, 4)})
    odd = dataclasses.replace(graph, nodes=tuple(
        dataclasses.replace(n, kind=None, attrs=FrozenDict(n.attrs, extra=1.5, flag=True))
        for n in graph.nodes))
    for g in (graph, odd):
        assert graph_fingerprint(g) == _fingerprint_as_json_dumps(g)
    assert len(seen | {graph_fingerprint(graph), graph_fingerprint(odd)}) == len(seen) + 2


@pytest.mark.parametrize("sym, shapes", [
    (models.wresnet(50, 1), models.input_shapes("wresnet", 8)),
    (models.rnn(2, 32, 4, 50), models.input_shapes("rnn", 8, seq_len=4)),
    (models.transformer(1, 32, 4, 8, 50), models.input_shapes("transformer", 8, seq_len=8)),
])
def test_the_refetching_operators_are_those_refetches_inputs_names(sym, shapes):
    from tofu_mx.search.structure import GraphStructure, refetches_inputs
    graph = lower_graph(import_symbol(sym, **shapes), 4)
    structure = GraphStructure.of(graph)
    one_by_one = {i for i in structure.ops if refetches_inputs(graph, i, structure.needs_grad)}
    assert structure.refetching == one_by_one
    assert one_by_one and len(one_by_one) < len(structure.ops)   # both answers occur


@pytest.mark.parametrize("sym, shapes", [
    (models.wresnet(50, 1), models.input_shapes("wresnet", 8)),
    (models.rnn(2, 32, 4, 50), models.input_shapes("rnn", 8, seq_len=4)),
])
def test_ports_and_their_flags_are_each_inputs_own(sym, shapes):
    from tofu_mx.search.structure import GraphStructure
    graph = lower_graph(import_symbol(sym, **shapes), 4)
    structure = GraphStructure.of(graph)
    ports = structure.ports(graph)
    read = [(i, j, e) for i in structure.ops for j, e in enumerate(graph.nodes[i].inputs)]
    tensors = [(i, k) for i, n in enumerate(graph.nodes) for k in range(len(n.outputs))]
    assert ports.member.tolist() == [i for i, _, _ in read]
    assert ports.input.tolist() == [j for _, j, _ in read]
    assert ports.source.tolist() == [e.node for _, _, e in read]
    assert [tensors[t] for t in ports.tensor.tolist()] == [(e.node, e.index) for _, _, e in read]
    facts = [structure.facts_of_tensors[f] for f in ports.facts.tolist()]
    assert facts == [(np.dtype(graph.tensor(e).dtype).itemsize, structure.needs_grad[(e.node, e.index)])
                     for _, _, e in read]
    assert ports.facts.tolist() == [structure.tensor_facts[ports.tensor_start[e.node] + e.index]
                                    for _, _, e in read]
    assert all(ports.start[i] + j == p for p, (i, j, _) in enumerate(read))
    by_gradient = [structure.keeps_input(graph, i, j) for i, j, _ in read]
    assert structure.read_by_gradient(graph).tolist() == by_gradient and any(by_gradient)
    assert structure.refetches(graph).tolist() == [i in structure.refetching
                                                   for i in range(len(graph.nodes))]
    some = frozenset((e.node, e.index) for _, _, e in read[::7])
    for refetch in (False, True):
        for kept_tensors in (frozenset(), some):
            for weighted in (False, True):
                again, kept = structure.port_flags(graph, refetch, kept_tensors, weighted)
                twice = [refetch and i in structure.refetching and
                         (e.node, e.index) not in kept_tensors for i, _, e in read]
                assert again.tolist() == twice
                assert kept.tolist() == [weighted and not t and
                                         structure.keeps_input(graph, i, j)
                                         for t, (i, j, _) in zip(twice, read)]
                assert any(twice) == refetch    # both answers occur
                assert any(kept) == (weighted and not refetch) or refetch


@pytest.mark.parametrize("weight", [0.0, 0.3])
def test_a_levels_bytes_are_the_bytes_problems_sum(weight):
    """A level's bytes are the search's own cost where it minimised the bytes alone with
    exact sums, else the bytes problem's sum: the two agree wherever both are defined."""
    from tofu_mx.search.plan import _bytes_moved
    graph = lower_graph(import_symbol(models.wresnet(14, 1), **models.input_shapes("wresnet", 4)), 4)
    options = SearchOptions(memory_weight=weight)
    results = search_levels(graph, (2, 2), options)
    for r in results:
        assert r.solution.exact == (weight == 0.0)
        assert _bytes_moved(r) == r.problem.bytes_problem.cost(r.solution.assignment)
        if weight == 0.0:
            assert _bytes_moved(r) == r.solution.cost


def test_with_conversions_priced_the_factor_order_is_chosen_by_the_priced_cost():
    """At k = 6 the two orders of 2 and 3 are searched; with conversions priced the plan is
    the order whose bytes and conversions, as the search priced them, cost least, not the
    one moving fewer bytes (here they differ)."""
    sym, shapes = models.wresnet(14, 1, 10), models.input_shapes("wresnet", 12, image_size=32)
    graph = lower_graph(import_symbol(sym, **shapes), 6)
    options = SearchOptions(refetch=False, conversion_bytes=250e3)

    def priced(order):
        groups = [math.prod(order[:k]) for k in range(len(order))]
        return sum(n * r.problem.problem.cost(r.solution.assignment)
                   for n, r in zip(groups, search_levels(graph, order, options)))
    orders = {order: (priced(order), plan_graph(graph, 6, options=options, factors=order))
              for order in [(2, 3), (3, 2)]}
    cheapest = min(orders, key=lambda o: orders[o][0])
    fewest = min(orders, key=lambda o: orders[o][1].exact_bytes)
    assert cheapest != fewest       # the case the rule is for
    assert plan_graph(graph, 6, options=options).factors == cheapest
    assert plan_graph(graph, 6, options=dataclasses.replace(
        options, conversion_bytes=0)).exact_bytes <= orders[fewest][1].exact_bytes


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_and_restored_as_it_was(enabled):
    """collector_paused() as a context manager and as a decorator: the collector is off
    inside, and after as it was before, also where the body raises."""
    was = gc.isenabled()

    @collector_paused()
    def inside():
        return gc.isenabled()

    def failing():
        with collector_paused():
            raise ValueError("body")
    try:
        (gc.enable if enabled else gc.disable)()
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
        assert inside() is False and gc.isenabled() == enabled
        with pytest.raises(ValueError):
            failing()
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()
