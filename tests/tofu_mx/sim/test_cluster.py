"""project_to_machines(): one machine's simulated step on N machines, and the network link."""
import dataclasses

import mxnet as mx
import pytest

from tofu_mx import sim
from tofu_mx.errors import InvalidArgumentError
from tofu_mx.sim import GB, Link, SimResult

#: the MLP's weights: fc1 6x8 + 8, fc2 8x3 + 3 float32 numbers
MLP_WEIGHT_BYTES = (6 * 8 + 8 + 8 * 3 + 3) * 4         # 332


def _mlp():
    data = mx.sym.var("data")
    hidden = mx.sym.relu(mx.sym.FullyConnected(data, num_hidden=8, name="fc1"))
    out = mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2")
    return mx.sym.SoftmaxOutput(out, name="softmax"), dict(data=(4, 6), softmax_label=(4,))


def _two_gpus(network=Link(1 * GB, 2e-6)):
    return dataclasses.replace(sim.machine("8xV100-16GB-PCIe"), num_devices=2, group_size=2,
                               host_shared=2, network=network)


@pytest.fixture(scope="module")
def mlp_results():
    sym, shapes = _mlp()
    machine = _two_gpus()
    return machine, {s: sim.simulate(sym, machine, s, **shapes)
                     for s in ("ideal", "data_parallel", "tofu")}


def _stub(**changes) -> SimResult:
    """A step of 0.5 s on batch 32 (64 samples/s), each of 8 devices owning 1 GB of gradient."""
    fields = dict(strategy="tofu", machine="8xV100-16GB-PCIe", fits=True, step_time=0.5,
                  throughput=64.0, peak_memory=(1 << 30,) * 8, gradient_bytes=(GB,) * 8)
    return SimResult(**{**fields, **changes})


def test_the_network_all_reduce_is_its_closed_form():
    """8 GB a machine over one 10 GB/s, 5 us link, 4 machines: 2 * 3 steps of 2 GB each."""
    machine = sim.machine("8xV100-16GB-PCIe")
    assert machine.network == Link(10 * GB, 5e-6)
    assert sim.network_all_reduce_time(8 * GB, machine, 4) == pytest.approx(
        6 * (5e-6 + 2e9 / 10e9))                                     # 1.20003 s
    assert sim.network_all_reduce_time(8 * GB, machine, 1) == 0.0
    assert sim.network_all_reduce_time(0, machine, 4) == 0.0          # nothing to send


def test_a_projection_by_hand():
    """The stub on 4 machines: 1.20003 s of all-reduce after its 0.5 s step."""
    got = sim.project_to_machines(_stub(), sim.machine("8xV100-16GB-PCIe"), 4)
    all_reduce = 2 * 3 * (5e-6 + 8e9 / 4 / 10e9)
    assert got.num_machines == 4 and got.strategy == "tofu"
    assert got.gradient_bytes == 8 * GB
    assert got.all_reduce_time == pytest.approx(all_reduce)
    assert got.step_time == pytest.approx(0.5 + all_reduce)
    assert got.throughput == pytest.approx(4 * 32 / (0.5 + all_reduce))    # 75.3 samples/s
    assert got.efficiency == pytest.approx(0.5 / (0.5 + all_reduce))        # 0.294


def test_each_strategy_reports_the_gradient_each_device_owns(mlp_results):
    """Ideal: one device, every weight; data parallelism: half of the summed gradient each
    (what the reduce-scatter leaves); tofu: its shards, which together are every weight once."""
    _, results = mlp_results
    assert results["ideal"].gradient_bytes == (MLP_WEIGHT_BYTES,)
    assert results["data_parallel"].gradient_bytes == (MLP_WEIGHT_BYTES // 2,) * 2
    tofu = results["tofu"].gradient_bytes
    assert len(tofu) == 2 and sum(tofu) == MLP_WEIGHT_BYTES


def test_a_simulated_tofu_step_on_four_machines_by_hand(mlp_results):
    """332 B a machine over a 1 GB/s, 2 us link: 2 * 3 steps of 2 us + 83 ns, in one bucket
    sent once the last weight's gradient is complete."""
    machine, results = mlp_results
    tofu = results["tofu"]
    got = sim.project_to_machines(tofu, machine, 4)
    all_reduce = 2 * 3 * (2e-6 + 332 / 4 / 1e9)                    # 12.498 us
    assert got.overlapped and got.all_reduce_time == pytest.approx(all_reduce)
    last = max(t for t, _ in tofu.gradient_ready)
    step = max(tofu.step_time, last + all_reduce)
    assert got.step_time == pytest.approx(step)
    assert got.throughput == pytest.approx(4 * 4 / step)
    assert got.exposed == pytest.approx(step - tofu.step_time)


def test_each_weights_gradient_is_ready_within_the_step(mlp_results):
    """Tofu's and the ideal's steps say when each weight's gradient is complete (every weight
    once, within the backward pass); data parallelism's ends with its own all-reduce."""
    _, results = mlp_results
    for name in ("ideal", "tofu"):
        result = results[name]
        assert sum(b for _, b in result.gradient_ready) == sum(result.gradient_bytes)
        times = [t for t, _ in result.gradient_ready]
        assert times == sorted(times) and 0 < times[0] and times[-1] <= result.step_time
    assert results["data_parallel"].gradient_ready == ()


def test_gradients_are_all_reduced_in_buckets_as_they_are_ready():
    """40 MiB ready at 0.1, 0.2 and 0.3 s of a 0.5 s step, 2 machines: the first two fused
    (80 MiB >= 64 MiB) and sent at 0.2 s, the last alone once the first bucket is done."""
    machine = sim.machine("8xV100-16GB-PCIe")
    mib = 2**20
    stub = _stub(gradient_bytes=(120 * mib,), gradient_ready=(
        (0.1, 40 * mib), (0.2, 40 * mib), (0.3, 40 * mib)))

    def ring(nbytes):
        return 2 * 1 * (5e-6 + nbytes / 2 / 10e9)
    first = 0.2 + ring(80 * mib)                               # 0.2084 s
    end = max(first, 0.3) + ring(40 * mib)                     # 0.3042 s
    got = sim.project_to_machines(stub, machine, 2)
    assert got.overlapped and got.step_time == pytest.approx(max(0.5, end)) == 0.5
    assert got.all_reduce_time == pytest.approx(ring(80 * mib) + ring(40 * mib))
    assert got.exposed == 0 and got.efficiency == 1.0          # hidden behind the backward
    late = _stub(step_time=0.3, gradient_bytes=(120 * mib,), gradient_ready=(
        (0.1, 40 * mib), (0.2, 40 * mib), (0.3, 40 * mib)))
    got = sim.project_to_machines(late, machine, 2)
    assert got.step_time == pytest.approx(end) and got.exposed == pytest.approx(end - 0.3)


def test_overlapping_is_never_slower_than_all_reducing_after_the_step(mlp_results):
    machine, results = mlp_results
    tofu = results["tofu"]
    for n in (2, 4, 16):
        overlapped = sim.project_to_machines(tofu, machine, n)
        after = sim.project_to_machines(dataclasses.replace(tofu, gradient_ready=()), machine, n)
        assert not after.overlapped
        assert tofu.step_time <= overlapped.step_time <= after.step_time


def test_one_machine_is_exactly_the_simulated_step(mlp_results):
    machine, results = mlp_results
    for result in results.values():
        got = sim.project_to_machines(result, machine, 1)
        assert got.all_reduce_time == 0.0
        assert got.step_time == result.step_time and got.throughput == result.throughput
        assert got.efficiency == 1.0


def test_more_machines_train_faster_but_never_more_than_linearly():
    """1 GB of gradient a machine (0.1 s at most over its link) after a 0.5 s step."""
    machine = sim.machine("8xV100-16GB-PCIe")
    light = _stub(gradient_bytes=(GB // 8,) * 8)
    got = [sim.project_to_machines(light, machine, n) for n in (1, 2, 4, 8, 16)]
    throughputs = [g.throughput for g in got]
    assert throughputs == sorted(throughputs) and len(set(throughputs)) == 5
    assert all(0 < g.efficiency <= 1 for g in got)
    assert [g.efficiency for g in got] == sorted((g.efficiency for g in got), reverse=True)
    for g in got:
        assert g.efficiency == pytest.approx(g.throughput / (g.num_machines * 64.0))


def test_a_step_shorter_than_its_all_reduce_is_slower_on_two_machines():
    """8 GB of gradient a machine: 0.8 s over the link on 2 machines, after a 0.5 s step."""
    two = sim.project_to_machines(_stub(), sim.machine("8xV100-16GB-PCIe"), 2)
    assert two.throughput == pytest.approx(2 * 32 / (0.5 + 2 * (5e-6 + 4e9 / 10e9)))
    assert two.throughput < 64.0 and two.efficiency < 0.5


def test_the_gpu_presets_have_a_network_and_the_cpu_has_none():
    assert all(m.network is not None for name, m in sim.PRESETS.items() if name != "cpu")
    assert sim.machine("cpu").network is None


@pytest.mark.parametrize("num_machines, match", [
    (0, "num_machines must be at least 1, got 0"),
    (2.0, "num_machines must be an int, got float 2.0"),
    (True, "num_machines must be an int, got bool"),
])
def test_a_bad_number_of_machines_is_refused_clearly(num_machines, match):
    with pytest.raises(InvalidArgumentError, match=match):
        sim.project_to_machines(_stub(), sim.machine("8xV100-16GB-PCIe"), num_machines)


def test_bad_results_and_machines_are_refused_clearly():
    pcie = sim.machine("8xV100-16GB-PCIe")
    alone = dataclasses.replace(pcie, network=None)
    with pytest.raises(InvalidArgumentError, match="'8xV100-16GB-PCIe' has no network link.*"
                                                   "network=tofu_mx.sim.Link"):
        sim.project_to_machines(_stub(), alone, 2)
    with pytest.raises(InvalidArgumentError, match="network must be a tofu_mx.sim.Link or "
                                                   "None, got \\(10000000000.0, 5e-06\\)"):
        dataclasses.replace(pcie, network=(10e9, 5e-6))
    with pytest.raises(InvalidArgumentError, match="simulated on machine 'cpu', not "
                                                   "'8xV100-16GB-PCIe'"):
        sim.project_to_machines(_stub(machine="cpu"), pcie, 2)
    with pytest.raises(InvalidArgumentError, match="does not fit one machine.*over 16 GiB"):
        sim.project_to_machines(_stub(fits=False, note="over 16 GiB"), pcie, 2)
    with pytest.raises(InvalidArgumentError, match="carries no gradient_bytes"):
        sim.project_to_machines(_stub(gradient_bytes=()), pcie, 2)
    with pytest.raises(InvalidArgumentError, match="result must be a tofu_mx.sim.SimResult"):
        sim.project_to_machines(0.5, pcie, 2)
    with pytest.raises(InvalidArgumentError, match="machine must be a tofu_mx.sim.Machine"):
        sim.project_to_machines(_stub(), "8xV100-16GB-PCIe", 2)
