"""Memory: plans that trade bytes moved for memory (SearchOptions.memory_weight), proven
equivalent like every plan, and partition()'s memory budget."""
import mxnet as mx
import pytest

import tofu_mx
from tests.tofu_mx.runtime.helpers import partition_and_verify
from tests.tofu_mx.runtime.test_partition_models import BUILDERS, zoo_symbol
from tofu_mx import models
from tofu_mx.search.cost import converted_bytes
from tofu_mx.search.plan import SearchOptions

WEIGHTED = SearchOptions(memory_weight=16.0)


def test_converted_bytes():
    shape = (8, 4)
    # split on axis 0 in 2, read whole by both parts: two new whole copies
    whole = ((0, 7), (0, 3))
    assert converted_bytes(("split", 0), shape, [whole, whole], 4) == 2 * 32 * 4
    # read exactly what each part holds: no copy
    assert converted_bytes(("split", 0), shape, [((0, 3), (0, 3)), ((4, 7), (0, 3))], 4) == 0
    # read along the other axis: each part gets a new half
    halves = [((0, 7), (0, 1)), ((0, 7), (2, 3))]
    assert converted_bytes(("split", 0), shape, halves, 4) == 2 * 16 * 4
    # replicated storage read whole: nothing converted; a part that reads nothing: nothing
    assert converted_bytes(("replicated",), shape, [whole, None], 4) == 0


@pytest.mark.parametrize("k", [4, 8])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_memory_weighted_plans_are_equivalent(name, k):
    sym, shapes = BUILDERS[name](24 if k == 8 else 12)
    dtypes = {"data": "float64", "softmax_label": "float64"} if name == "wresnet" else {}
    _, report = partition_and_verify(sym, k, dtypes=dtypes, options=WEIGHTED, **shapes)
    assert report.ok


@pytest.mark.parametrize("name", ["resnet18_v1", "densenet121", "mobilenetv2_1.0"])
def test_memory_weighted_zoo_nets_are_equivalent(name):
    _, report = partition_and_verify(zoo_symbol(name), 4, options=WEIGHTED,
                                     data=(12, 3, 32, 32), softmax_label=(12,))
    assert report.ok


def _wresnet():
    return models.wresnet(26, 2, 100), models.input_shapes("wresnet", 16, image_size=64)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_memory_weight_buys_memory_with_bytes():
    sym, shapes = _wresnet()
    ctx = [mx.cpu(i) for i in range(4)]
    ideal = tofu_mx.partition(sym, [mx.cpu(0)], **shapes).memory_per_device()[0].total / 4
    fewest = tofu_mx.partition(sym, ctx, **shapes)
    weighted = tofu_mx.partition(sym, ctx, options=WEIGHTED, **shapes)
    worst = [max(m.total for m in p.memory_per_device()) for p in (fewest, weighted)]
    # the plan moving the fewest bytes is near 1/k already (BatchNorm split on the batch)
    assert worst[0] <= 1.15 * ideal
    assert worst[1] < worst[0]
    assert weighted.plan.total_bytes > fewest.plan.total_bytes
    # the plan reports bytes moved, not the weighted objective (which counts each kept
    # converted byte 16 times over)
    assert weighted.plan.total_bytes < 4 * fewest.plan.total_bytes


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_memory_budget_is_met_or_refused():
    sym, shapes = _wresnet()
    ctx = [mx.cpu(i) for i in range(4)]
    fewest = tofu_mx.partition(sym, ctx, **shapes)
    worst = max(m.total for m in fewest.memory_per_device())
    budget = int(0.95 * worst)   # the default plan is near 1/k: a little less is left to buy
    fitted = tofu_mx.partition(sym, ctx, memory_budget=budget, **shapes)
    assert max(m.total for m in fitted.memory_per_device()) <= budget
    with pytest.raises(tofu_mx.NoFeasiblePlanError, match="budget") as e:
        tofu_mx.partition(sym, ctx, memory_budget=int(0.5 * worst), **shapes)
    assert e.value.footprint > int(0.5 * worst)
    with pytest.raises(tofu_mx.InvalidArgumentError, match="memory_budget"):
        tofu_mx.partition(sym, ctx, memory_budget=[1e9, 1e9], **shapes)

