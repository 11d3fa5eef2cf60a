"""nnvm_passes.lower: operators replaced by what a hook emits; inputs, kinds and placement kept."""
import mxnet as mx
import numpy as np
import pytest

from nnvm_passes.exporter import export_symbol
from nnvm_passes.importer import import_symbol
from nnvm_passes.ir import FrozenDict
from nnvm_passes.lower import lower
from tofu_mx.search.plan import graph_fingerprint, lower_graph
from tofu_mx.errors import TofuError
from tofu_mx.tdl.registry import Attrs, facts


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


def conv_bn_net():
    x = mx.sym.var("data")
    for i, channels in enumerate((4, 6, 4)):
        x = mx.sym.Convolution(x, num_filter=channels, kernel=(3, 3), pad=(1, 1), name=f"conv{i}")
        x = mx.sym.BatchNorm(x, fix_gamma=i == 1, name=f"bn{i}")
        x = mx.sym.relu(x, name=f"relu{i}")
    return import_symbol(mx.sym.sum(x, name="loss"), data=(2, 3, 5, 5))


def through_json(g):
    """``g`` with a JSON field the IR does not model on a node: lowering it goes through
    MXNet's JSON and a fresh import, as graphs with control dependencies do."""
    last = g.nodes[-1].replace(extra=FrozenDict({"control_deps": "[]"}))
    return g.replace(nodes=g.nodes[:-1] + (last,))


def without_extra(g):
    return g.replace(nodes=tuple(n.replace(extra=FrozenDict()) for n in g.nodes))


def test_lowering_builds_the_graph_mxnet_would_import():
    """Built directly (shapes inferred once per distinct emitted subgraph), the lowered graph
    equals the one MXNet's JSON round trip and a fresh import give: the same nodes in the
    same order, MXNet's operator names (reshape is Reshape), shapes and dtypes, and the same
    fingerprint (so saved plans of lowered graphs still load)."""
    g = conv_bn_net()
    direct = lower_graph(g, 2)
    assert len(direct.nodes) > 3 * len(g.nodes)
    ops = {n.op for n in direct.nodes}
    assert "Reshape" in ops and "reshape" not in ops
    via_json = without_extra(lower_graph(through_json(g), 2))
    assert direct.nodes == via_json.nodes and direct.heads == via_json.heads
    assert graph_fingerprint(direct) == graph_fingerprint(via_json)


def test_lowering_drops_unread_nodes_and_orders_them_as_mxnet():
    """A hook's unread node is dropped and its nodes are put in MXNet's depth-first order,
    whatever order it emitted them in, as the JSON round trip does."""
    def scrambled(emit, attrs, shapes, x):
        emit("exp", x, name="unread")
        b = emit("_plus_scalar", x, name="b", scalar=1.0)
        a = emit("_mul_scalar", x, name="a", scalar=2.0)
        return (emit("elemwise_mul", a, b, name="product"),)
    direct = lower(graph(), hooks(square=scrambled))
    via_json = without_extra(lower(through_json(graph()), hooks(square=scrambled)))
    assert direct.nodes == via_json.nodes and direct.heads == via_json.heads
    names = [n.name for n in direct.nodes]
    assert "sq/unread" not in names and names.index("sq/a") < names.index("sq/b")


def test_nodes_alike_are_lowered_from_one_hook_call_each_with_its_own_inputs_and_placement():
    """The hook runs once per operator, parameters and input shapes; the nodes alike get
    its nodes again, named after each, reading each one's inputs (one entry read as two
    inputs stays one entry) and placed as each is. The graph is the one MXNet's JSON round
    trip gives."""
    x, gamma = mx.sym.var("data"), mx.sym.var("shared_gamma")
    for i in range(3):
        x = mx.sym.Convolution(x, num_filter=4, kernel=(3, 3), pad=(1, 1), name=f"conv{i}")
        with mx.AttrScope(ctx_group=f"dev{i}"):
            x = mx.sym.BatchNorm(x, gamma, gamma, fix_gamma=False, name=f"bn{i}") if i == 2 \
                else mx.sym.BatchNorm(x, fix_gamma=False, name=f"bn{i}")
    g = import_symbol(mx.sym.sum(x, name="loss"), data=(2, 4, 5, 5))
    bn = next(n for n in g.nodes if n.op == "BatchNorm")
    real = facts(bn.op, Attrs(bn.attrs)).lowering      # the registry's hook
    calls = []

    def counted(emit, attrs, shapes, *inputs):
        calls.append(shapes)
        return real(emit, attrs, shapes, *inputs)
    lowering = hooks(BatchNorm=counted)
    direct = lower(g, lowering)
    assert len(calls) == 1      # bn2 reads other inputs, but of the same shapes
    via_json = without_extra(lower(through_json(g), lowering))
    assert direct.nodes == via_json.nodes and direct.heads == via_json.heads
    for i in range(3):
        emitted = [n for n in direct.nodes if n.name.startswith(f"bn{i}/")]
        assert len(emitted) > 10 and {n.ctx_group for n in emitted} == {f"dev{i}"}
    stats = direct.node("bn2/stats")
    read = [direct.nodes[e.node].name for e in stats.inputs]
    assert read[1:3] == ["shared_gamma", "shared_gamma"] and read[0] == "bn2/pseudo_batch"
    assert [direct.nodes[e.node].name for e in direct.node("bn1/stats").inputs][1:3] == \
        ["bn1_gamma", "bn1_beta"]


def test_a_hook_may_read_another_output_of_an_input_producer():
    """An input ``x`` reads its own entry; ``x[j]`` output ``j`` of the node producing it
    (for every node lowered from the same hook call)."""
    parts = mx.sym.split(mx.sym.var("x"), num_outputs=2, axis=1, name="parts")
    out = mx.sym.relu(parts[1], name="r1") + mx.sym.relu(parts[0], name="r0")
    g = import_symbol(out, x=(2, 4))

    def plus_first(emit, attrs, shapes, x):
        return (emit("elemwise_add", x, x[0], name="sum"),)
    lowered = lower(g, hooks(relu=plus_first))
    for name, own in (("r1/sum", 1), ("r0/sum", 0)):
        assert [(lowered.nodes[e.node].name, e.index) for e in lowered.node(name).inputs] == \
            [("parts", own), ("parts", 0)]


def test_an_emitted_name_the_graph_has_already_is_refused_on_both_routes():
    """A lowered node's emitted name (``sq/product``) that another node has is refused,
    whether the graph is built directly or through MXNet's JSON."""
    with mx.AttrScope(ctx_group="dev1"):
        sq = mx.sym.square(mx.sym.var("x"), name="sq")
    y = mx.sym.relu(sq, name="sq/product") + sq
    g = import_symbol(y, x=(2, 4))
    for route in (g, through_json(g)):
        with pytest.raises(TofuError, match="'sq' emits two nodes named 'sq/product'"):
            lower(route, hooks(square=square_as_product))
