"""SearchOptions.conversion_bytes: each conversion priced besides the bytes it moves, so the
search trades bytes for fewer conversions (fewer operators per device), and the plans it
finds compute what one device does."""
import warnings

import mxnet as mx
import pytest

import tofu_mx
from tests.tofu_mx.runtime.helpers import float64, partition_and_verify, partition_quietly
from tests.tofu_mx.runtime.test_partition_models import zoo_symbol
from tofu_mx import models, sim
from tofu_mx.search.plan import SearchOptions

#: about a conversion's fixed cost on 8 V100s over PCIe (sim.Machine.conversion_bytes)
PRICED = SearchOptions(refetch=False, conversion_bytes=250e3)
FEWEST = SearchOptions(refetch=False)


def fewest_bytes(sym, k, dtypes, shapes):
    """The fewest-bytes keeping plan's partition, to set the priced one against."""
    return partition_quietly(sym, k, options=FEWEST, dtypes=dtypes, **shapes)


def wresnet():
    return models.wresnet(14, 1, 10), models.input_shapes("wresnet", 8, image_size=32)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_priced_conversions_run_fewer_operators_and_compute_the_same(k):
    """A WResNet's fewest-bytes plan mixes layouts, converting between them (and lowering
    each batch-split BatchNorm into its sums); priced, the plan converts less. It moves
    more bytes (the fewest-bytes plan moves the fewest), runs under half the operators on
    its busiest device, and computes every output, gradient and aux state one device does
    (float64)."""
    sym, shapes = wresnet()
    priced, report = partition_and_verify(sym, k, options=PRICED, **shapes)
    assert report.ok, report
    fewest = fewest_bytes(sym, k, float64(shapes), shapes)
    assert priced.plan.total_bytes > fewest.plan.total_bytes
    assert max(priced.operators_per_device()) < 0.5 * max(fewest.operators_per_device())


@pytest.mark.parametrize("name", ["resnet18_v1", "mobilenet1.0", "LSTM"])
def test_priced_plans_of_other_models_compute_the_same(name):
    """Two model-zoo nets (float64) and an LSTM with its gates interleaved (float32, as in
    test_partition_models), at k = 3 (uneven splits): each priced plan is another plan than
    the fewest-bytes one (the zoo nets' run a third of the operators or fewer), and computes
    what one device does."""
    if name == "LSTM":
        sym, shapes, dtypes = models.rnn(2, 64, 3, 50), models.input_shapes("rnn", 8, seq_len=3), {}
    else:
        sym, shapes = zoo_symbol(name), {"data": (12, 3, 32, 32), "softmax_label": (12,)}
        dtypes = float64(shapes)
    priced, report = partition_and_verify(sym, 3, dtypes=dtypes, options=PRICED, **shapes)
    assert report.ok, report
    fewest = fewest_bytes(sym, 3, dtypes, shapes)
    assert priced.plan.total_bytes > fewest.plan.total_bytes
    if name != "LSTM":
        assert max(priced.operators_per_device()) < max(fewest.operators_per_device()) / 3


def test_machine_weighs_the_plan_with_its_conversions_priced():
    """partition(machine=) searches a plan with each conversion priced at the machine's
    Machine.conversion_bytes too, says so in the candidate's label, and returns the
    partition that plan makes when it is the fastest."""
    sym, shapes = wresnet()
    machine = sim.machine("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ptd = tofu_mx.partition(sym, [mx.cpu(0), mx.cpu(1)], machine=machine, **shapes)
    choice = ptd.machine_choice
    priced = [c for c in choice.candidates if c.conversion_bytes]
    assert len(priced) == 1 and not priced[0].refetch
    assert priced[0].conversion_bytes == machine.conversion_bytes
    assert "each conversion priced at 400.50 KiB" in priced[0].label
    options = SearchOptions(refetch=choice.chosen.refetch,
                            conversion_bytes=choice.chosen.conversion_bytes)
    plain = tofu_mx.partition(sym, [mx.cpu(0), mx.cpu(1)], options=options, **shapes)
    assert plain.plan.to_json() == ptd.plan.to_json()
