"""tofu_mx.sim.schedule: tasks on a machine's resources, on hand-computed cases."""
import dataclasses
import math

import mxnet as mx
import pytest

from nnvm_passes import import_symbol
from tofu_mx import sim
from tofu_mx.errors import InvalidArgumentError
from tofu_mx.sim.schedule import Task, finish_times, roofline_seconds, step_tasks


def test_tasks_on_different_resources_overlap_and_on_one_resource_queue():
    """A (1 s on device 0), its value to device 1 (0.5 s), B on device 1 after it (1 s), C on
    device 0 after A (2 s): C runs while the value crosses and B runs: all done at 3 s."""
    tasks = [Task("A", ("device", 0), 1.0), Task("A->1", ("link", 0, 1), 0.5, (0,)),
             Task("B", ("device", 1), 1.0, (1,)), Task("C", ("device", 0), 2.0, (0,))]
    assert finish_times(tasks) == [1.0, 1.5, 2.5, 3.0]
    # two values over one link queue; over the opposite direction they do not
    tasks = [Task("A", ("device", 0), 1.0), Task("x", ("link", 0, 1), 2.0, (0,)),
             Task("y", ("link", 0, 1), 2.0, (0,)), Task("z", ("link", 1, 0), 2.0)]
    assert finish_times(tasks) == [1.0, 3.0, 5.0, 2.0]
    with pytest.raises(ValueError, match="not given before it"):
        finish_times([Task("A", ("device", 0), 1.0, (1,)), Task("B", ("device", 0), 1.0)])


def test_a_device_runs_a_ready_task_before_one_given_earlier_that_waits():
    """As MXNet's engine: B (given first) waits 6 s for its value; C, ready at once, runs in
    the meantime on the same device; D, ready at 1 s like E, goes first as it was given
    first."""
    tasks = [Task("A", ("device", 0), 1.0), Task("A->1", ("link", 0, 1), 5.0, (0,)),
             Task("B", ("device", 1), 1.0, (1,)), Task("C", ("device", 1), 1.0),
             Task("D", ("device", 1), 2.0, (0,)), Task("E", ("device", 1), 1.0, (0,))]
    assert finish_times(tasks) == [1.0, 6.0, 7.0, 1.0, 3.0, 4.0]


def test_a_step_crosses_devices_forward_and_sends_the_gradient_back(two_devices):
    graph, device_of = two_devices
    m = sim.machine("8xV100-16GB-PCIe")
    tasks = step_tasks(graph, device_of, m)
    assert [(t.name, t.resource) for t in tasks] == [
        ("fc", ("device", 0)), ("fc->1", ("link", 0, 1)), ("relu", ("device", 1)),
        ("total", ("device", 1)), ("loss", ("device", 1)),
        ("dloss", ("device", 1)), ("dtotal", ("device", 1)), ("drelu", ("device", 1)),
        ("dfc<-1", ("link", 1, 0)), ("dfc", ("device", 0))]
    seconds = {t.name: t.seconds for t in tasks}
    # the fc's output (4 x 3 float32) crosses the peer link both ways
    assert seconds["fc->1"] == seconds["dfc<-1"] == pytest.approx(10e-6 + 48 / 10e9)
    # fc: 4 * 3 * (2 * 6 + 1) FLOPs, 4 * (24 + 18 + 3 + 12) bytes, launch-bound on a V100
    assert seconds["fc"] == pytest.approx(5e-6 + max(156 / 14e12, 228 / 900e9))
    assert seconds["dfc"] == pytest.approx(5e-6 + max(2 * 156 / 14e12, 2 * 228 / 900e9))
    # everything is one chain here: the step is the sum of its tasks
    assert finish_times(tasks)[-1] == pytest.approx(sum(seconds.values()))
    assert step_tasks(graph, device_of, m, backward=False) == tasks[:5]


def test_a_weight_placed_away_from_its_reader_crosses_over_and_its_gradient_back(two_devices):
    """fc_weight (3 x 6 float32: 72 B) on dev1, its reader fc on dev0."""
    graph, placed = two_devices
    weight = [n.name for n in graph.nodes].index("fc_weight")
    tasks = step_tasks(graph, lambda i: 1 if i == weight else placed(i),
                       sim.machine("8xV100-16GB-PCIe"))
    names = [t.name for t in tasks]
    sent, back = tasks[names.index("fc_weight->0")], tasks[names.index("dfc_weight<-0")]
    assert sent.resource == ("link", 1, 0) and sent.after == ()
    assert back.resource == ("link", 0, 1) and back.after == (names.index("dfc"),)
    assert sent.seconds == back.seconds == pytest.approx(10e-6 + 72 / 10e9)
    assert names.index("fc_weight->0") in tasks[names.index("fc")].after


def test_transfers_between_pcie_switches_share_the_switches_uplink(two_devices):
    """fc on device 0 (first switch), relu on device 4 (second switch): on the PCIe machine
    every transfer from the first switch to the second takes one resource, the uplink, so
    such transfers queue; on a machine with a link per pair they do not."""
    graph, placed = two_devices
    pcie = sim.machine("8xV100-16GB-PCIe")
    on = lambda i: 4 * placed(i)      # noqa: E731
    assert pcie.bridge_shared
    resources = {t.name: t.resource for t in step_tasks(graph, on, pcie)}
    assert resources["fc->4"] == ("link", "bridge", 0, 1)
    assert resources["dfc<-4"] == ("link", "bridge", 1, 0)
    own = dataclasses.replace(pcie, bridge_shared=False)
    assert {t.name: t.resource for t in step_tasks(graph, on, own)}["fc->4"] == ("link", 0, 4)
    # within a switch, each pair its own link
    assert {t.name: t.resource for t in step_tasks(graph, placed, pcie)}["fc->1"] == \
        ("link", 0, 1)


def test_a_kernel_run_per_sample_reads_its_weight_once_per_sample():
    """MXNet's CPU convolution: one matrix product per sample, each reading the weight
    (3 x 2 x 3 x 3 float32: 216 B). On a machine whose bytes bound every operator, a batch
    of 4 reads it 3 more times: 648 B more, forward (and twice that backward)."""
    conv = mx.sym.Convolution(mx.sym.var("data"), num_filter=3, kernel=(3, 3), no_bias=True,
                              name="conv")
    graph = import_symbol(mx.sym.MakeLoss(mx.sym.sum(conv), name="loss"), data=(4, 2, 8, 8))
    i = [n.name for n in graph.nodes].index("conv")
    m = sim.Machine("bytes-bound", 1, 1 << 30, 1e15, 1e6, 0.0, 1, sim.Link(1e9, 0),
                    sim.Link(1e9, 0), sim.Link(1e9, 0))
    looped = dataclasses.replace(m, per_sample=(("Convolution", 1),))
    plain, per_sample = roofline_seconds(graph, i, m), roofline_seconds(graph, i, looped)
    assert per_sample[0] - plain[0] == pytest.approx(648 / 1e6)
    assert per_sample[1] - plain[1] == pytest.approx(2 * 648 / 1e6)
    assert sim.machine("cpu").per_sample == (("Convolution", 1),)


def test_a_mirrored_operator_runs_again_and_fetches_its_input_again():
    """relu on dev1, marked for mirroring: its gradient reads its output, built again from
    fc's output, which is sent from dev0 again."""
    with mx.AttrScope(ctx_group="dev0"):
        fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="fc")
    with mx.AttrScope(ctx_group="dev1"):
        relu = mx.sym.relu(fc, name="relu", attr={"__force_mirroring__": "True"})
        loss = mx.sym.MakeLoss(mx.sym.sum(relu, name="total"), name="loss")
    graph = import_symbol(loss, data=(4, 6))
    tasks = step_tasks(graph, lambda i: int(graph.nodes[i].ctx_group[3:]),
                       sim.machine("8xV100-16GB-PCIe"))
    names = [t.name for t in tasks]
    sent, rerun = names.index("fc->1 again"), names.index("relu again")
    assert tasks[sent].resource == ("link", 0, 1) and tasks[rerun].after == (sent,)
    assert tasks[rerun].seconds == tasks[names.index("relu")].seconds
    assert rerun in tasks[names.index("drelu")].after
    assert names.count("fc again") == 0           # not marked: kept, not built again


def test_devices_sharing_a_processor_run_one_operator_at_a_time(two_devices):
    graph, device_of = two_devices
    m = sim.machine("8xV100-16GB-PCIe")
    shared = dataclasses.replace(m, shared_compute=True)
    tasks = step_tasks(graph, device_of, shared)
    assert {t.resource for t in tasks} == {("device", 0)}      # the copies too
    assert [t.name for t in tasks] == [t.name for t in step_tasks(graph, device_of, m)]
    a, b = Task("a", ("device", 0), 1.0), Task("b", ("device", 0), 1.0)
    assert finish_times([a, b]) == [1.0, 2.0]      # independent, yet one after the other


def test_one_device_moves_nothing(two_devices):
    graph, _ = two_devices
    tasks = step_tasks(graph, lambda i: 0, sim.machine("8xA100-40GB-NVLink"))
    assert all(t.resource == ("device", 0) for t in tasks) and len(tasks) == 8


def wide_layer():
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=2048, name="fc")
    return mx.sym.LinearRegressionOutput(fc, name="loss"), dict(data=(512, 2048),
                                                               loss_label=(512, 2048))


def test_tofu_on_two_devices_beats_one_on_a_compute_bound_layer():
    """A 2048 x 2048 layer on a batch of 512, on a slow-compute machine with fast links: two
    devices share the work, so the step takes well under one device's. One device computes
    the product forward and the weight's gradient backward (the data needs none): two
    products. Each of two computes half of each, and the default plan runs its half of the
    forward product again (re-fetching): three halves, 3/4 of one device's step."""
    m = sim.Machine("slow", 2, 1 << 40, 1e11, 1e12, 1e-6, 2, sim.Link(1e12, 1e-6),
                    sim.Link(1e12, 1e-6), sim.Link(1e10, 1e-6))
    sym, shapes = wide_layer()
    ideal = sim.simulate(sym, m, "ideal", **shapes)
    tofu = sim.simulate(sym, m, "tofu", **shapes)
    assert ideal.fits and tofu.fits and len(tofu.peak_memory) == 2
    assert tofu.step_time == pytest.approx(0.75 * ideal.step_time, rel=0.01)
    assert ideal.throughput == pytest.approx(512 / ideal.step_time)
    # fits: against the device's memory
    small = sim.Machine("small", 2, 1 << 20, 1e11, 1e12, 1e-6, 2, sim.Link(1e12, 1e-6),
                        sim.Link(1e12, 1e-6), sim.Link(1e10, 1e-6))
    assert not sim.simulate(sym, small, "tofu", **shapes).fits
    assert sim.simulate(sym, small, "ideal", **shapes).fits      # unlimited memory


def test_simulate_refuses_what_it_cannot_do_clearly():
    sym, shapes = wide_layer()
    with pytest.raises(InvalidArgumentError, match="no strategy 'pipeline'.*ideal, "
                                                   "data_parallel, swap, placement, tofu, "):
        sim.simulate(sym, sim.machine("8xV100-16GB-PCIe"), "pipeline", **shapes)
    with pytest.raises(InvalidArgumentError, match="machine must be a tofu_mx.sim.Machine"):
        sim.simulate(sym, "8xV100-16GB-PCIe", **shapes)


def machines():
    """Slow compute and fast links; ``big`` holds the layer whole, ``small`` (1 MiB) does not."""
    def make(name, memory):
        return sim.Machine(name, 2, memory, 1e11, 1e12, 1e-6, 2, sim.Link(1e12, 1e-6),
                           sim.Link(1e12, 1e-6), sim.Link(1e10, 1e-6))
    return make("big", 1 << 40), make("small", 1 << 20)


def test_data_parallelism_is_a_share_of_the_batch_then_a_gradient_all_reduce():
    big, small = machines()
    sym, shapes = wide_layer()
    dp = sim.simulate(sym, big, "data_parallel", **shapes)
    half = sim.simulate(sym, big, "ideal", data=(256, 2048), loss_label=(256, 2048))
    weights = 4 * (2048 * 2048 + 2048)
    assert dp.step_time == pytest.approx(half.step_time +
                                         sim.ring_all_reduce_time(weights, big, [0, 1]))
    assert dp.fits and dp.peak_memory == (half.peak_memory[0],) * 2
    # one device: one chain of operators, no link; the all-reduce keeps every link busy
    assert half.busiest_device == pytest.approx(half.step_time) and half.busiest_link == 0
    assert dp.busiest_link == pytest.approx(sim.ring_all_reduce_time(weights, big, [0, 1]))
    assert dp.throughput == pytest.approx(512 / dp.step_time)
    assert not sim.simulate(sym, small, "data_parallel", **shapes).fits   # 16 MiB of weights


def test_data_parallelism_all_reduces_gradients_as_the_backward_pass_completes_them():
    """Four 4096 x 4096 layers (64 MiB of weight each, one bucket each): the last layer's
    gradient is complete first and its all-reduce runs while the backward pass computes the
    others', so the step ends at the last bucket's all-reduce, not the whole all-reduce
    after the replica's step; the link carries all of it either way."""
    big, _ = machines()
    x = mx.sym.var("data")
    for i in range(4):
        x = mx.sym.FullyConnected(x, num_hidden=4096, name=f"fc{i}")
    sym = mx.sym.LinearRegressionOutput(x, name="loss")
    dp = sim.simulate(sym, big, "data_parallel", data=(64, 4096), loss_label=(64, 4096))
    half = sim.simulate(sym, big, "ideal", data=(32, 4096), loss_label=(32, 4096))
    weights = 4 * 4 * (4096 * 4096 + 4096)
    assert sum(b for _, b in half.gradient_ready) == weights
    times = [t for t, _ in half.gradient_ready]
    assert len(times) == 8 and times[0] < times[-1] == pytest.approx(half.step_time)

    def ring(nbytes):
        return sim.ring_all_reduce_time(nbytes, big, [0, 1])
    end, busy = sim.bucketed_all_reduce(half.gradient_ready, ring)
    assert busy >= ring(weights)                      # four buckets: four rings' latencies
    assert dp.step_time == pytest.approx(max(half.step_time, end))
    assert dp.step_time < half.step_time + ring(weights)
    assert dp.busiest_link == pytest.approx(busy)
    assert dp.gradient_ready == ()                    # every gradient summed at its end
    # swapping with room to spare is the same step
    assert sim.simulate(sym, big, "swap", data=(64, 4096),
                        loss_label=(64, 4096)).step_time == pytest.approx(dp.step_time)


def test_data_parallelism_on_some_of_a_machines_devices_and_on_a_shared_processor():
    """``data_parallel_step`` on the first k devices is data parallelism on a k-device
    machine; where the devices share one processor (cpu(i)), the replicas take turns on it,
    so data parallelism is never faster than one device doing all the work."""
    sym, shapes = wide_layer()
    big, _ = machines()
    four = dataclasses.replace(big, name="four", num_devices=4)
    on_two = sim.data_parallel_step(sym, four, 2, **shapes)
    whole = sim.simulate(sym, big, "data_parallel", **shapes)
    assert on_two.step_time == pytest.approx(whole.step_time)
    assert on_two.peak_memory == whole.peak_memory
    with pytest.raises(InvalidArgumentError, match="has 4 device.*fewer than num_devices=5"):
        sim.data_parallel_step(sym, four, 5, **shapes)
    shared = dataclasses.replace(big, name="shared", shared_compute=True)
    one = sim.simulate(sym, shared, "ideal", **shapes)
    half = sim.simulate(sym, shared, "ideal", data=(256, 2048), loss_label=(256, 2048))
    dp = sim.simulate(sym, shared, "data_parallel", **shapes)
    assert dp.step_time == pytest.approx(2 * half.step_time +
                                         sim.ring_all_reduce_time(4 * (2048 * 2048 + 2048),
                                                                  shared, [0, 1]))
    assert dp.step_time > one.step_time


def two_layers():
    x = mx.sym.var("data")
    for name in ("fc1", "fc2"):
        x = mx.sym.FullyConnected(x, num_hidden=2048, name=name)
    return mx.sym.LinearRegressionOutput(x, name="loss"), dict(data=(512, 2048),
                                                              loss_label=(512, 2048))


def test_swapping_moves_the_excess_out_and_in_over_the_shared_host_links():
    """Two devices sharing one host link: each sends out and fetches back what exceeds its
    memory, overlapped with the replica's compute, then the all-reduce."""
    big, _ = machines()
    sym, shapes = two_layers()
    half = sim.simulate(sym, big, "ideal", data=(256, 2048), loss_label=(256, 2048))
    weights = 2 * 4 * (2048 * 2048 + 2048)
    excess = 8 << 20
    m = dataclasses.replace(big, memory=half.peak_memory[0] - excess, host_shared=2)
    swap = sim.simulate(sym, m, "swap", **shapes)
    assert swap.fits and swap.peak_memory == (m.memory,) * 2
    assert swap.note == "swaps 8.00 MiB out and in per device and step"
    assert sim.swap_time(2 * excess, m) == pytest.approx(m.host.latency + 4 * excess / 1e10)
    assert swap.step_time == pytest.approx(
        max(half.step_time, sim.swap_time(2 * excess, m)) +
        sim.ring_all_reduce_time(weights, m, [0, 1]))
    # with room to spare it is data parallelism
    assert sim.simulate(sym, big, "swap", **shapes).step_time == pytest.approx(
        sim.simulate(sym, big, "data_parallel", **shapes).step_time)
    # one layer's working set (its 16 MiB weight, 2 MiB in and out, and their gradients)
    tiny = dataclasses.replace(big, memory=30 << 20)
    none = sim.simulate(sym, tiny, "swap", **shapes)
    assert not none.fits and none.step_time == math.inf
    assert "one operator's or one weight's update's working set takes" in none.note


def test_the_memory_constrained_plan_fits_or_says_it_cannot():
    big, small = machines()
    sym, shapes = wide_layer()
    fitted = sim.simulate(sym, big, "tofu-memory", **shapes)
    assert fitted.fits and math.isfinite(fitted.step_time)
    none = sim.simulate(sym, small, "tofu-memory", **shapes)
    assert not none.fits and none.step_time == math.inf and none.throughput == 0
    assert min(none.peak_memory) > small.memory      # the smallest footprint found
