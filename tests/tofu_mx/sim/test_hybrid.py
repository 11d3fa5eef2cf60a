"""simulate(..., "hybrid") / hybrid_step(): data parallelism across a machine's device groups,
Tofu's plan inside each group, the shards' gradients all-reduced across the groups."""
import dataclasses
import math

import mxnet as mx
import pytest

from tofu_mx import sim
from tofu_mx.errors import InvalidArgumentError

SHAPES = dict(data=(64, 1024), loss_label=(64, 1024))
HALF = dict(data=(32, 1024), loss_label=(32, 1024))


def three_layers():
    x = mx.sym.var("data")
    for i in range(3):
        x = mx.sym.FullyConnected(x, num_hidden=1024, name=f"fc{i}")
    return mx.sym.LinearRegressionOutput(x, name="loss")


def two_pairs(bridge_shared: bool) -> sim.Machine:
    """Four V100s in two groups of two."""
    return dataclasses.replace(sim.machine("8xV100-16GB-PCIe"), name="two pairs",
                               num_devices=4, group_size=2, host_shared=2,
                               bridge_shared=bridge_shared)


def one_group_of(machine: sim.Machine) -> sim.Machine:
    return dataclasses.replace(machine, name=f"{machine.name}, one group of 2", num_devices=2)


def one_group(sym, group: sim.Machine) -> sim.SimResult:
    """One group's step as the hybrid runs it (``tofu-machine`` with pieces and the receive
    buffer)."""
    from tofu_mx.runtime.partitioned import SearchOptions
    from tofu_mx.sim.simulate import _tofu
    return _tofu(sym, group, "tofu-machine", SearchOptions(), None, HALF, groups=2)


def test_a_group_runs_as_the_gluon_hybrid_runs_it():
    """Each group's plan returns its outputs as pieces (tofu_mx.gluon.partition's blocks
    do), and each device also holds the Trainer's receive buffer: at most its largest weight
    shard (here half a 1024 x 1024 weight)."""
    from tofu_mx.runtime.partitioned import choose_by_step_time
    sym, group = three_layers(), one_group_of(two_pairs(True))
    inner = one_group(sym, group)
    ptd = choose_by_step_time(sym, [mx.cpu(0), mx.cpu(1)], group, compare=False,
                              join_outputs=False, **HALF)
    assert ptd.output_pieces
    buffer = 1024 * 1024 * 4 // 2
    assert inner.peak_memory == tuple(p + buffer for p in ptd.planned_memory())
    assert inner.step_time == pytest.approx(sim.partitioned_step(ptd, group)[0])


@pytest.mark.parametrize("bridge_shared", [True, False])
def test_each_group_runs_tofu_on_its_half_and_the_shards_are_all_reduced_across(bridge_shared):
    """The step is the one-group plan's on half the batch, or the end of the last bucket of
    the all-reduce across the two groups if later: device d's shard with device d + 2's, the
    two rings at once over the bridge (one bridge each way carrying both where it is
    shared)."""
    sym, machine = three_layers(), two_pairs(bridge_shared)
    hybrid = sim.simulate(sym, machine, "hybrid", **SHAPES)
    inner = one_group(sym, one_group_of(machine))
    weights = 3 * 4 * (1024 * 1024 + 1024)
    assert sum(inner.gradient_bytes) == weights == sum(b for _, b in inner.gradient_ready)
    share = 1.0 if bridge_shared else max(inner.gradient_bytes) / weights

    def across(nbytes):         # a ring of 2: its 2 steps move half the bytes each
        return 2 * sim.transfer_time(nbytes * share / 2, machine.bridge)
    end, busy = sim.bucketed_all_reduce(inner.gradient_ready, across)
    assert hybrid.fits and hybrid.step_time == pytest.approx(max(inner.step_time, end))
    assert hybrid.busiest_link == pytest.approx(inner.busiest_link + busy)
    assert hybrid.throughput == pytest.approx(64 / hybrid.step_time)
    assert hybrid.peak_memory == inner.peak_memory * 2
    assert hybrid.gradient_bytes == inner.gradient_bytes * 2
    assert hybrid.note.startswith("2 groups of 2 devices, data parallel; in each: ")
    assert sim.hybrid_step(sym, machine, 4, **SHAPES) == hybrid


def test_shared_bridge_is_slower_and_the_all_reduce_can_set_the_step():
    """On a slow bridge the all-reduce outlasts the group's step; sharing the bridge between
    the rings makes it longer still."""
    sym = three_layers()
    slow = {shared: dataclasses.replace(two_pairs(shared), bridge=sim.Link(1e8, 15e-6))
            for shared in (True, False)}
    steps = {shared: sim.simulate(sym, m, "hybrid", **SHAPES).step_time
             for shared, m in slow.items()}
    inner = sim.simulate(sym, one_group_of(slow[True]), "tofu-machine", **HALF)
    assert inner.step_time < steps[False] < steps[True]


def test_not_run_on_one_group_or_without_a_batch_for_every_group():
    sym = three_layers()
    one = sim.simulate(sym, sim.machine("cpu"), "hybrid", **SHAPES)
    assert not one.fits and one.step_time == math.inf
    assert "are not two or more whole groups of 2" in one.note
    machine = two_pairs(True)
    small = sim.simulate(sym, machine, "hybrid", data=(1, 1024), loss_label=(1, 1024))
    assert not small.fits and "no batch of 2 or more samples" in small.note
    with pytest.raises(InvalidArgumentError, match="has 4 device.*fewer than num_devices=8"):
        sim.hybrid_step(sym, machine, 8, **SHAPES)
    three = sim.hybrid_step(sym, machine, 3, **SHAPES)       # not whole groups
    assert not three.fits and "3 device(s)" in three.note


def test_a_label_shape_left_to_inference_is_split_too():
    """Only the data's shape given (the label's inferred): the same step as with both (was a
    KeyError for the label)."""
    sym, machine = three_layers(), two_pairs(True)
    both = sim.simulate(sym, machine, "hybrid", **SHAPES)
    assert sim.simulate(sym, machine, "hybrid", data=SHAPES["data"]) == both
