"""tofu_mx.sim.work: an operator's FLOPs counted on its TDL description, and its bytes."""
import mxnet as mx
import pytest

from nnvm_passes import import_symbol
from tofu_mx import sim
from tofu_mx.sim.work import Work, operator_work


def work_of(sym, name, **shapes):
    graph = import_symbol(sym, **shapes)
    return operator_work(graph, graph.index(name))


def test_a_fully_connected_layer_costs_two_flops_per_weight_and_sample():
    """Batch 4, 6 inputs, 3 outputs, with a bias: each of the 4 x 3 outputs is a sum of 6
    products (6 multiplies, 6 accumulations) plus the bias: 4 * 3 * (2 * 6 + 1) = 156. Bytes:
    data 4x6, weight 3x6, bias 3 and output 4x3, float32: (24 + 18 + 3 + 12) * 4 = 228."""
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="fc")
    assert work_of(fc, "fc", data=(4, 6)) == Work(156.0, 228, (156.0, 156.0, 12.0))
    no_bias = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, no_bias=True, name="fc")
    assert work_of(no_bias, "fc", data=(4, 6)) == Work(4 * 3 * 12.0, (24 + 18 + 12) * 4,
                                                       (144.0, 144.0))


def test_each_input_s_gradient_repeats_the_operations_that_read_it():
    """A fully connected layer's data and weight gradients are each a product as large as the
    forward one (every multiply, accumulation and the bias add reads them); the bias's is
    one add per output. The first layer's data needs no gradient: its backward pass is one
    product, not two."""
    fc = work_of(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="fc"), "fc",
                 data=(4, 6))
    assert fc.backward_flops((True, True, True)) == 2 * 156 + 12
    assert fc.backward_flops((False, True, True)) == 156 + 12
    assert fc.backward_flops((False, False, False)) == 0
    conv = work_of(mx.sym.Convolution(mx.sym.var("data"), num_filter=5, kernel=(3, 3),
                                      pad=(1, 1), name="conv"), "conv", data=(1, 2, 4, 4))
    assert conv.input_flops == (80 * 37, 80 * 37, 80)
    # BatchNorm: the data reaches every operation; gamma, beta and the moving statistics
    # (aux states, which get no gradient) only the per-channel ones
    bn = work_of(mx.sym.BatchNorm(mx.sym.var("x"), fix_gamma=False, name="bn"), "bn",
                 x=(4, 3, 5, 5))
    assert bn.input_flops[0] == bn.flops and max(bn.input_flops[1:]) < bn.flops / 4


def test_a_convolution_costs_two_flops_per_tap():
    """1 image, 2 channels in, 5 out, 3x3 kernel, padded: 5 x 4 x 4 outputs, each 2 * 3 * 3
    products and accumulations plus the bias: 80 * (2 * 18 + 1) = 2960."""
    conv = mx.sym.Convolution(mx.sym.var("data"), num_filter=5, kernel=(3, 3), pad=(1, 1),
                              name="conv")
    w = work_of(conv, "conv", data=(1, 2, 4, 4))
    assert w.flops == 80 * 37
    assert w.nbytes == 4 * (2 * 16 + 5 * 2 * 9 + 5 + 80)


@pytest.mark.parametrize("act, per_element", [("relu", 1), ("tanh", 1), ("sigmoid", 1)])
def test_an_elementwise_operator_costs_its_expression_per_element(act, per_element):
    a = mx.sym.Activation(mx.sym.var("x"), act_type=act, name="a")
    assert work_of(a, "a", x=(3, 7)) == Work(21.0 * per_element, 2 * 21 * 4,
                                             (21.0 * per_element,))
    add = mx.sym.elemwise_add(mx.sym.var("x"), mx.sym.var("y"), name="add")
    assert work_of(add, "add", x=(3, 7), y=(3, 7)) == Work(21.0, 3 * 21 * 4, (21.0, 21.0))


def test_a_reshape_moves_bytes_and_computes_nothing():
    r = mx.sym.reshape(mx.sym.var("x"), shape=(6, 2), name="r")
    assert work_of(r, "r", x=(3, 4)) == Work(0.0, 2 * 12 * 4, (0.0,))


def test_an_opaque_operator_is_not_costed():
    x = mx.sym.var("x")
    custom = mx.sym.RNN(x, mx.sym.var("p"), mx.sym.var("s"), state_size=4, num_layers=1,
                        mode="rnn_tanh", name="rnn")
    graph = import_symbol(custom, x=(2, 3, 5))
    assert operator_work(graph, graph.index("rnn")) is None


def test_the_roofline_of_a_costed_operator():
    """The work feeds compute_time: 156 FLOPs at 1 TFLOP/s against 228 bytes at 100 GB/s."""
    m = sim.Machine("toy", 2, 1 << 30, 1e12, 100e9, 1e-6, 2, sim.Link(1e9, 0), sim.Link(1e9, 0),
                    sim.Link(1e9, 0))
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="fc")
    w = work_of(fc, "fc", data=(4, 6))
    assert sim.compute_time(w.flops, w.nbytes, m) == pytest.approx(1e-6 + 228 / 100e9)


def test_statistics_are_computed_once_per_channel_not_per_element():
    """BatchNorm's mean and variance sum over (batch, height, width) once per channel: its
    FLOPs grow with the batch, not with its square (counted per output element, doubling
    the batch would quadruple them)."""
    def bn_flops(batch):
        bn = mx.sym.BatchNorm(mx.sym.var("x"), fix_gamma=False, name="bn")
        return work_of(bn, "bn", x=(batch, 3, 4, 4)).flops
    assert 1.9 < bn_flops(8) / bn_flops(4) <= 2.0
    assert bn_flops(4) < 20 * 4 * 3 * 16     # a few operations per element


def test_a_subexpression_held_twice_is_computed_once():
    """(x + 1) * (x + 1) as one object squared: one add and one multiply per element."""
    from tofu_mx.sim.work import expression_flops
    from tofu_mx.tdl.lang import TensorRef, Var
    x, i = TensorRef("x", 0, (5,)), Var("i0")
    shared = x[i] + 1
    assert expression_flops(shared * shared, {"i0": 5}) == 10.0
    assert expression_flops((x[i] + 1) * (x[i] + 1), {"i0": 5}) == 15.0
