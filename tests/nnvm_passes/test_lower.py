"""nnvm_passes.lower: operators replaced by what a hook emits; inputs, kinds and placement kept."""
import mxnet as mx
import numpy as np
import pytest

from nnvm_passes.exporter import export_symbol
from nnvm_passes.importer import import_symbol
from nnvm_passes.lower import lower
from tofu_mx.errors import TofuError


def square_as_product(emit, attrs, shapes, x):
    return (emit("elemwise_mul", x, x, name="product"),)


def graph():
    with mx.AttrScope(ctx_group="dev1"):
        sq = mx.sym.square(mx.sym.var("x"), name="sq")
    y = mx.sym.FullyConnected(sq, num_hidden=3, name="fc")
    return import_symbol(mx.sym.relu(y, name="out"), x=(2, 4))


def hooks(**by_op):
    return lambda node: by_op.get(node.op)


def test_a_lowered_node_computes_the_same_and_keeps_inputs_and_placement():
    g = graph()
    lowered = lower(g, hooks(square=square_as_product))
    assert [n.op for n in lowered.operators()] == ["elemwise_mul", "FullyConnected", "relu"]
    product = lowered.node("sq/product")
    assert product.ctx_group == "dev1" and product.outputs[0].shape == (2, 4)
    assert [(n.name, n.kind) for n in lowered.variables()] == \
        [(n.name, n.kind) for n in g.variables()]
    x = np.random.RandomState(0).randn(2, 4)
    w, b = np.ones((3, 4)), np.zeros(3)
    outs = [export_symbol(h).eval(x=mx.nd.array(x), fc_weight=mx.nd.array(w),
                                  fc_bias=mx.nd.array(b))[0].asnumpy() for h in (g, lowered)]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6)


def test_nothing_lowered_is_the_same_graph():
    g = graph()
    assert lower(g, hooks()) is g
    assert lower(g, hooks(square=lambda emit, attrs, shapes, x: None)) is g


def test_a_hook_that_drops_an_input_or_an_output_is_refused():
    g = graph()

    def drops_weight(emit, attrs, shapes, data, weight, bias):
        return (emit("relu", data, name="r"),)
    with pytest.raises(TofuError, match="inputs.*fc_weight"):
        lower(g, hooks(FullyConnected=drops_weight))
    with pytest.raises(TofuError, match="gave 2 outputs for its 1"):
        lower(g, hooks(square=lambda emit, attrs, shapes, x: (x, x)))
    with pytest.raises(TofuError, match="'sq'.*square.*ZeroDivisionError"):
        lower(g, hooks(square=lambda emit, attrs, shapes, x: (1 / 0,)))
