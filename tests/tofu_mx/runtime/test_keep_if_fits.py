"""SearchOptions.keep_if_fits (on by default): partition() keeps the converted inputs for the
backward pass, rather than fetching them again and running their shares again, where the
plan keeping them holds at most ``balance`` times the ideal as MXNet plans the step, or no
more than the re-fetching plan."""
import pytest

from nnvm_passes.program import StepKind
from tests.tofu_mx.runtime.helpers import float64, partition_and_verify, partition_quietly
from tofu_mx import models
from tofu_mx.runtime.partitioned import ONE_DEVICE_PLANNED
from tofu_mx.search.plan import SearchOptions
from tofu_mx.sim.memory import peak_memory
from tofu_mx.tdl.annotate import import_graph

REFETCH = SearchOptions(keep_if_fits=False)


def wresnet():
    return models.wresnet(14, 1, 10), models.input_shapes("wresnet", 8, image_size=32)


def partitioned(sym, k, options, shapes):
    return partition_quietly(sym, k, options=options, dtypes=float64(shapes), **shapes)


def ideal(sym, k, shapes):
    """The unpartitioned graph's bytes as planned_memory() estimates MXNet's plan, over k."""
    whole = import_graph(sym, dtypes=float64(shapes), **shapes)
    return max(peak_memory(whole, lambda i: 0, 1)) / k


def reruns(ptd):
    return sum(s.kind is StepKind.RERUN for s in ptd.program.steps)


@pytest.mark.parametrize("k", [2, 4])
def test_the_keeping_plan_is_taken_where_it_fits_and_computes_the_same(k):
    """A WResNet at k = 2 and 4 (float64): the keeping plan holds under 1.15x the ideal
    (as planned_memory() estimates MXNet's, the one device's scaled by ONE_DEVICE_PLANNED),
    so the default takes it: no input is fetched again and no share runs again, it moves fewer
    bytes than the re-fetching plan, and it computes every output, gradient and aux state
    one device does."""
    sym, shapes = wresnet()
    ptd, report = partition_and_verify(sym, k, **shapes)
    assert report.ok, report
    assert not ptd.plan.refetch and reruns(ptd) == 0
    assert not any(s.again for s in ptd.program.steps)
    assert max(ptd.planned_memory()) <= 1.15 * ONE_DEVICE_PLANNED * ideal(sym, k, shapes)
    fetched = partitioned(sym, k, REFETCH, shapes)
    assert fetched.plan.refetch and reruns(fetched) > 0
    assert ptd.plan.total_bytes < fetched.plan.total_bytes


def test_over_the_target_the_plan_holding_less_is_taken():
    """With the target at the ideal itself (``balance=1``), neither plan fits: the default
    takes the one holding less as MXNet plans the step, which here is the re-fetching one;
    with ``keep_if_fits=False`` the re-fetching plan is taken without looking."""
    sym, shapes = wresnet()
    tight = partitioned(sym, 2, SearchOptions(balance=1.0), shapes)
    kept = partitioned(sym, 2, SearchOptions(refetch=False), shapes)
    fetched = partitioned(sym, 2, REFETCH, shapes)
    held = [max(p.planned_memory()) for p in (kept, fetched)]
    assert min(held) > ideal(sym, 2, shapes)        # over the target, both
    assert tight.plan.to_json() == (kept if held[0] <= held[1] else fetched).plan.to_json()
    assert held[1] < held[0] and tight.plan.refetch


def test_without_refetch_or_on_one_device_nothing_else_is_searched(monkeypatch):
    """``refetch=False`` and ``keep_if_fits=False`` search one plan each, as before; so does
    one device."""
    from tofu_mx.runtime import partitioned as module
    searched = []
    real = module.runnable_plan
    monkeypatch.setattr(module, "runnable_plan",
                        lambda graph, k, options: searched.append(options) or
                        real(graph, k, options))
    sym, shapes = wresnet()
    for k, options in [(2, SearchOptions(refetch=False)), (2, REFETCH), (1, None)]:
        searched.clear()
        partitioned(sym, k, options, shapes)
        assert len(searched) == 1
    searched.clear()
    partitioned(sym, 2, None, shapes)           # the keeping plan fits: searched alone
    assert [o.refetch for o in searched] == [False]
