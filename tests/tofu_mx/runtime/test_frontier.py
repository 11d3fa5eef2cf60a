"""Bytes against memory: the Pareto front, and the weight search under a budget."""
import types

import mxnet as mx
import pytest

import tofu_mx
from tofu_mx import models
from tofu_mx.errors import NoFeasiblePlanError
from tofu_mx.runtime.frontier import MAX_WEIGHT, TradeOff, fit_budget, pareto, trade_off
from tofu_mx.runtime.partitioned import DeviceMemory
from tofu_mx.search.plan import Level, Plan


def point(weight, moved, *memory):
    return TradeOff(weight, moved, tuple(memory))


def test_pareto_keeps_the_points_nothing_beats_on_both():
    points = [point(0, 10, 9, 8), point(1, 12, 7, 7), point(2, 12, 8, 6), point(4, 20, 7, 7),
              point(8, 30, 5, 5), point(16, 9.5, 50, 1)]
    assert [p.memory_weight for p in pareto(points)] == [16, 0, 1, 8]


def fake(memory_of_weight, calls):
    """A plan whose memory falls and bytes grow with the weight."""
    def measure(weight):
        calls.append(weight)
        m = memory_of_weight(weight)
        return point(weight, 100 + weight, m, m), ("plan", weight)
    return measure


def test_a_trade_off_weighs_a_plans_exact_bytes():
    """Plans are compared by the bytes the search priced, not by ``total_bytes`` rounded."""
    plan = Plan(2, (2,), (Level(2, 1, 10.4, 1, 1, 1),), (), (), (), ())
    ptd = types.SimpleNamespace(plan=plan, memory_per_device=lambda: [
        DeviceMemory("cpu(0)", 8, 8, 0, 0, 0)])
    assert trade_off(ptd, 0.0, 1.0).bytes_moved == 10.4 and plan.total_bytes == 10


def test_the_default_weight_is_kept_when_it_fits():
    calls = []
    assert fit_budget(fake(lambda w: 10, calls), [10, 10]) == ("plan", 0.0)
    assert calls == [0.0]


def test_the_weight_grows_then_is_bisected_to_the_fewest_bytes_that_fit():
    calls = []
    # fits from weight 5 on: grows 0 -> 1 -> 4 -> 16, then bisects between 4 and 16
    result = fit_budget(fake(lambda w: 100 if w < 5 else 50, calls), [60, 60])
    assert calls[:4] == [0.0, 1.0, 4.0, 16.0]
    assert len(calls) == 4 + 4
    fitted = result[1]
    assert 5 <= fitted < 16 and all(c < 5 or c >= fitted for c in calls)


def test_no_weight_fits():
    calls = []
    with pytest.raises(NoFeasiblePlanError, match="needs 100 B on device 1.*budget is 60 B") \
            as e:
        fit_budget(fake(lambda w: 100, calls), [200, 60])
    assert max(calls) == MAX_WEIGHT and e.value.footprint == 100


def test_plans_measured_already_join_the_fitting_and_the_refusal():
    """The re-fetching plan (``others``) competes on bytes with the keeping plans found."""
    refetching = TradeOff(0.0, 130, (50, 50), refetch=True), ("re-fetch",)
    calls = []
    # a keeping plan fits from weight 5 on (moving 105 or more): the re-fetching one moves more
    result = fit_budget(fake(lambda w: 100 if w < 5 else 50, calls), [60, 60], 0.0,
                        [refetching])
    assert result[0] == "plan" and 5 <= result[1] < 16
    # it moves fewer than the keeping plans that fit
    cheap = TradeOff(0.0, 101, (50, 50), refetch=True), ("re-fetch",)
    assert fit_budget(fake(lambda w: 100 if w < 5 else 50, []), [60, 60], 0.0,
                      [cheap]) == ("re-fetch",)
    # nothing fits: the refusal reports the smallest footprint, the re-fetching plan's
    small = TradeOff(0.0, 130, (70, 70), refetch=True), ("re-fetch",)
    with pytest.raises(NoFeasiblePlanError, match="re-fetch all.*needs 70 B") as e:
        fit_budget(fake(lambda w: 100, []), [60, 60], 0.0, [small])
    assert e.value.footprint == 70


def test_frontier_of_a_wresnet():
    sym = models.wresnet(14, 1, 10)
    shapes = models.input_shapes("wresnet", 8, image_size=32)
    front = tofu_mx.frontier(sym, [mx.cpu(i) for i in range(4)], weights=(0, 1, 16), **shapes)
    assert 1 <= len(front.points) <= 5
    # fetching every converted input again holds least
    least = min(front.points, key=lambda p: p.worst)
    assert least.refetch and least.keep_share == 0 and least.backward == "re-fetch all"
    moved = [p.bytes_moved for p in front.points]
    worst = [p.worst for p in front.points]
    assert moved == sorted(moved) and worst == sorted(worst, reverse=True)
    assert front.points[0].worst < 1.3 * front.ideal
    text = front.report()
    assert "Pareto front" in text and "/ ideal" in text and "re-fetch" in text


def test_a_plan_that_several_weights_give_is_rewritten_once(monkeypatch):
    """partition(memory_budget=...) and frontier() rewrite and measure each distinct plan
    once: the weights they try often give the same plan."""
    from tofu_mx.runtime import partitioned
    from tofu_mx.search.plan import SearchOptions, lower_graph, plan_graph
    from tofu_mx.tdl.annotate import import_graph
    sym, shapes = models.wresnet(14, 1, 10), models.input_shapes("wresnet", 4, image_size=16)
    ctx = [mx.cpu(0), mx.cpu(1)]
    whole = import_graph(sym, **shapes)
    graph = lower_graph(whole, 2)
    from tofu_mx.runtime.assign import assign
    calls = []
    real = partitioned._built
    monkeypatch.setattr(partitioned, "_built",
                        lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    applied = partitioned._Applied(sym, whole, graph, ctx)
    fewest = plan_graph(graph, 2, options=SearchOptions(refetch=False))
    again = plan_graph(graph, 2, options=SearchOptions(refetch=False))
    other = plan_graph(graph, 2)
    assert again is not fewest and again == fewest and other != fewest
    first = applied(fewest, assign(graph, fewest))
    assert applied(again, assign(graph, again)) is first and len(calls) == 1
    assert applied(other, assign(graph, other)) is not first and len(calls) == 2
    assert calls == [fewest, other]
    assert first.plan.levels == fewest.levels    # BatchNorms split on channels run unlowered
    assert applied(other, assign(graph, other)).plan.levels == other.levels
