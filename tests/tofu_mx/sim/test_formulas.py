"""tofu_mx.sim: machines, presets and the cost formulas, each on hand-computed cases."""
import pytest

from tofu_mx import sim
from tofu_mx.errors import InvalidArgumentError
from tofu_mx.sim import GB, GiB, Link, Machine


def toy(**changes):
    """4 devices in groups of 2: 1 TFLOP/s, 100 GB/s memory, 1 us launch; 10 GB/s and 1 us
    within a group, 2 GB/s and 3 us across, 1 GB/s and 5 us to host."""
    fields = dict(name="toy", num_devices=4, memory=8 * GiB, flops=1e12,
                  memory_bandwidth=100 * GB, launch=1e-6, group_size=2,
                  peer=Link(10 * GB, 1e-6), bridge=Link(2 * GB, 3e-6), host=Link(1 * GB, 5e-6))
    fields.update(changes)
    return Machine(**fields)


def test_compute_time_is_the_launch_and_the_roofline():
    m = toy()
    # 2 GFLOP and 10 MB: 2 ms of arithmetic against 0.1 ms of memory traffic
    assert sim.compute_time(2e9, 10e6, m) == pytest.approx(1e-6 + 2e-3)
    # 1 MFLOP and 1 GB: memory bound, 10 ms
    assert sim.compute_time(1e6, 1e9, m) == pytest.approx(1e-6 + 1e-2)
    assert sim.compute_time(0, 0, m) == pytest.approx(1e-6)


def test_where_memory_does_not_overlap_arithmetic_the_two_add_up():
    m = toy(memory_overlap=False)
    assert sim.compute_time(2e9, 10e6, m) == pytest.approx(1e-6 + 2e-3 + 1e-4)
    assert sim.compute_time(1e6, 1e9, m) == pytest.approx(1e-6 + 1e-6 + 1e-2)
    with pytest.raises(InvalidArgumentError, match="memory_overlap"):
        toy(memory_overlap="no")


def test_an_operator_measured_slower_runs_at_its_own_rate():
    m = toy(efficiency=(("Convolution", 0.25),))
    assert m.rate("Convolution") == 0.25e12 and m.rate("FullyConnected") == m.rate() == 1e12
    assert sim.compute_time(2e9, 0, m, "Convolution") == pytest.approx(1e-6 + 8e-3)
    assert sim.compute_time(2e9, 0, m, "FullyConnected") == pytest.approx(1e-6 + 2e-3)
    # its memory traffic at the device's bandwidth: 1 GB at 100 GB/s
    assert sim.compute_time(0, 1e9, m, "Convolution") == pytest.approx(1e-6 + 1e-2)
    # an operator measured short of the bandwidth (a normalisation's reductions) moves its
    # bytes at its own, its arithmetic at the peak
    slow = toy(bandwidth_efficiency=(("LayerNorm", 0.1),))
    assert slow.bandwidth("LayerNorm") == 10e9 and slow.bandwidth("relu") == 100e9
    assert sim.compute_time(2e9, 1e9, slow, "LayerNorm") == pytest.approx(1e-6 + 1e-1)
    assert sim.compute_time(2e9, 1e9, slow, "relu") == pytest.approx(1e-6 + 1e-2)
    with pytest.raises(InvalidArgumentError, match="bandwidth_efficiency\\['LayerNorm'\\]"):
        toy(bandwidth_efficiency=(("LayerNorm", 0),))
    with pytest.raises(InvalidArgumentError, match="efficiency\\['Convolution'\\] must be"):
        toy(efficiency=(("Convolution", 1.5),))


def test_a_transfer_crosses_the_link_between_its_devices():
    m = toy()
    assert m.link(0, 1) == m.peer and m.link(2, 3) == m.peer
    assert m.link(1, 2) == m.bridge and m.link(3, 0) == m.bridge
    assert sim.transfer_time(20e6, m.link(0, 1)) == pytest.approx(1e-6 + 2e-3)
    assert sim.transfer_time(20e6, m.link(0, 2)) == pytest.approx(3e-6 + 1e-2)
    assert sim.transfer_time(1e9, m.host) == pytest.approx(5e-6 + 1.0)
    assert sim.transfer_time(0, m.bridge) == 0.0


def test_devices_sharing_a_host_link_swap_over_it_together():
    # each device 100 MB at 1 GB/s: alone 0.1 s; 2 devices to a link: 0.2 s
    assert sim.swap_time(100e6, toy()) == pytest.approx(5e-6 + 0.1)
    assert sim.swap_time(100e6, toy(host_shared=2)) == pytest.approx(5e-6 + 0.2)
    assert sim.swap_time(0, toy(host_shared=4)) == 0.0
    assert sim.machine("8xV100-16GB-PCIe").host_shared == 4


def test_ring_all_reduce_steps_at_its_slowest_link():
    m = toy()
    # within a group: 2 (2 - 1) = 2 steps of 40 MB / 2 = 20 MB over the peer link
    assert sim.ring_all_reduce_time(40e6, m, [0, 1]) == pytest.approx(2 * (1e-6 + 2e-3))
    # all 4: 6 steps of 10 MB; the ring 0-1-2-3 crosses the bridge (1-2 and 3-0)
    assert sim.ring_all_reduce_time(40e6, m, [0, 1, 2, 3]) == pytest.approx(6 * (3e-6 + 5e-3))
    assert sim.ring_all_reduce_time(40e6, m, [2]) == 0.0
    assert sim.ring_all_reduce_time(0, m, [0, 1]) == 0.0
    with pytest.raises(InvalidArgumentError, match="visits a device twice"):
        sim.ring_all_reduce_time(1.0, m, [0, 1, 0])


def test_presets_describe_the_papers_machine_and_its_successors():
    assert sorted(sim.PRESETS) == ["8xA100-40GB-NVLink", "8xH100-80GB-NVLink",
                                   "8xV100-16GB-PCIe", "8xV100-32GB-NVLink", "cpu"]
    cpu = sim.machine("cpu")
    assert cpu.shared_compute and "calibrate" in cpu.source and cpu.rate("Convolution") < cpu.flops
    v100 = sim.machine("8xV100-16GB-PCIe")
    assert v100.num_devices == 8 and v100.memory == 16 * GiB and v100.group_size == 4
    assert v100.link(0, 3) == v100.peer and v100.link(3, 4) == v100.bridge
    assert v100.bridge.bandwidth < v100.peer.bandwidth
    for m in sim.PRESETS.values():
        assert m.source and m.num_devices == (2 if m.name == "cpu" else 8)
        assert m.bridge.bandwidth <= m.peer.bandwidth and m.host.bandwidth > 0
    # each generation is faster than the last
    order = ["8xV100-16GB-PCIe", "8xA100-40GB-NVLink", "8xH100-80GB-NVLink"]
    assert [sim.PRESETS[n].flops for n in order] == sorted(sim.PRESETS[n].flops for n in order)


@pytest.mark.parametrize("changes, match", [
    (dict(num_devices=0), "num_devices must be at least 1"),
    (dict(memory=-1), "memory must be at least 1"),
    (dict(flops=0), "flops must be > 0"),
    (dict(memory_bandwidth="fast"), "memory_bandwidth must be a number"),
    (dict(launch=-1e-6), "launch must be >= 0"),
    (dict(group_size=3), "4 devices do not make groups of 3"),
    (dict(host_shared=3), "4 devices do not share host links 3 each"),
    (dict(per_sample=(("Convolution", -1),)), "per_sample\\['Convolution'\\] must be"),
    (dict(peer=(10e9, 1e-6)), "peer must be a tofu_mx.sim.Link"),
])
def test_a_bad_machine_is_refused_clearly(changes, match):
    with pytest.raises(InvalidArgumentError, match=match):
        toy(**changes)


def test_bad_links_devices_and_names_are_refused_clearly():
    with pytest.raises(InvalidArgumentError, match="bandwidth must be > 0"):
        Link(0, 1e-6)
    with pytest.raises(InvalidArgumentError, match="latency must be >= 0"):
        Link(1e9, -1)
    m = toy()
    with pytest.raises(InvalidArgumentError, match="device must be between 0 and 3"):
        m.link(0, 4)
    with pytest.raises(InvalidArgumentError, match="to itself"):
        m.link(1, 1)
    with pytest.raises(InvalidArgumentError, match="no machine preset.*8xV100-16GB-PCIe"):
        sim.machine("8xV100")
    with pytest.raises(InvalidArgumentError, match="flops must be >= 0"):
        sim.compute_time(-1, 0, m)


def test_a_conversions_fixed_cost_in_bytes_is_a_transfers_latency_and_three_launches():
    # (1 us + 3 x 1 us) at 10 GB/s: 40 kB; the V100 PCIe preset (10 us + 3 x 5 us) at 10 GB/s
    assert toy().conversion_bytes == pytest.approx(40e3)
    assert toy(launch=0, peer=Link(10 * GB, 0)).conversion_bytes == 0
    assert sim.machine("8xV100-16GB-PCIe").conversion_bytes == pytest.approx(250e3)
