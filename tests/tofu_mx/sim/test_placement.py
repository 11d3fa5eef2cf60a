"""tofu_mx.sim.place_operators: critical-path placement under per-device memory caps."""
import mxnet as mx

from nnvm_passes import import_symbol
from tofu_mx import sim
from tofu_mx.sim import GiB, Link, Machine


def toy(num_devices=2):
    return Machine("toy", num_devices, 1 * GiB, 1e12, 100e9, 1e-6, num_devices,
                   peer=Link(10e9, 1e-6), bridge=Link(10e9, 1e-6), host=Link(1e9, 1e-6))


def chain():
    """data (8, 256) -> fc1 (256 -> 256) -> fc2 (256 -> 256) -> loss, float32: each weight
    256 KiB (262,144 B), each bias 1 KiB."""
    x = mx.sym.var("data")
    for name in ("fc1", "fc2"):
        x = mx.sym.FullyConnected(x, num_hidden=256, name=name)
    return import_symbol(mx.sym.MakeLoss(mx.sym.sum(x), name="loss"), data=(8, 256))


def named(graph, devices):
    return {n.name: d for n, d in zip(graph.nodes, devices)}


def test_a_chain_stays_on_one_device_while_it_fits():
    """Sending fc1's output to another device only delays fc2: all on device 0."""
    graph = chain()
    devices = named(graph, sim.place_operators(graph, toy(), cap=1 * GiB))
    assert set(devices.values()) == {0}


def test_the_cap_moves_operators_to_the_next_device_and_weights_with_them():
    """Each weight with its gradient (and momentum: 3 copies) is 786,432 B plus its bias'
    3,072 B; data 8 KiB; fc1's gradient keeps its input (data: a variable, not counted) and
    fc2's keeps fc1's output (8 KiB). A cap of 800,000 B holds fc1's weights and the data
    (797,696 B) but not fc2's on top: fc2 goes to device 1, with its weights."""
    graph = chain()
    devices = named(graph, sim.place_operators(graph, toy(), cap=800_000, optimizer_state=1))
    assert devices["fc1"] == devices["fc1_weight"] == devices["fc1_bias"] == devices["data"] == 0
    assert devices["fc2"] == devices["fc2_weight"] == devices["fc2_bias"] == 1
    # held at the end of the forward pass, as the simulator's memory counts it
    rows = sim.held_at_forward_end(graph, [devices[n.name] for n in graph.nodes].__getitem__, 2,
                                   optimizer_state=1)
    assert all(sum(r.values()) <= 800_000 for r in rows)


def test_no_placement_when_one_operator_fits_no_device():
    graph = chain()
    assert sim.place_operators(graph, toy(), cap=500_000, optimizer_state=1) is None


def test_readers_of_one_weight_share_its_device():
    """Two time steps reading one weight (as an RNN's do) go where the weight is, though the
    second could start at once elsewhere."""
    w = mx.sym.var("w")
    a = mx.sym.FullyConnected(mx.sym.var("x1"), weight=w, no_bias=True, num_hidden=64, name="a")
    b = mx.sym.FullyConnected(mx.sym.var("x2"), weight=w, no_bias=True, num_hidden=64, name="b")
    graph = import_symbol(mx.sym.MakeLoss(mx.sym.sum(a) + mx.sym.sum(b), name="loss"),
                          x1=(512, 512), x2=(512, 512))
    devices = named(graph, sim.place_operators(graph, toy(), cap=1 * GiB))
    assert devices["a"] == devices["b"] == devices["w"]
