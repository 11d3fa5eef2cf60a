import json

import mxnet as mx
import numpy as np
import pytest

import tofu_mx
from nnvm_passes import disable_dropout, export_symbol, import_symbol, place
from nnvm_passes.transforms import cast_floats
from tofu_mx import TofuError


def dropout_net():
    with mx.AttrScope(ctx_group="dev1"):
        x = mx.sym.Dropout(mx.sym.var("x"), p=0.9, name="drop")
    return mx.sym.FullyConnected(x, num_hidden=2, name="fc")


def DROPOUT(op):
    return op == "Dropout"


def test_disable_dropout_makes_an_identity_and_keeps_the_group():
    g = disable_dropout(import_symbol(dropout_net(), x=(4, 3)), DROPOUT)
    node = g.node("drop")
    assert node.op == "_copy" and node.ctx_group == "dev1" and len(node.outputs) == 1
    exe = export_symbol(g).simple_bind(mx.cpu(), x=(4, 3))
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    exe.arg_dict["x"][:] = x
    exe.arg_dict["fc_weight"][:] = 1
    exe.arg_dict["fc_bias"][:] = 0
    out = exe.forward(is_train=True)[0].asnumpy()  # p=0.9 would zero most inputs
    np.testing.assert_array_equal(out, np.repeat(x.sum(1, keepdims=True), 2, axis=1))


def test_disable_dropout_without_dropout_is_the_same_graph():
    g = import_symbol(mx.sym.relu(mx.sym.var("x")), x=(2,))
    assert disable_dropout(g, DROPOUT) is g


def test_place_tags_operators_and_their_variables():
    x = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc1")
    y = mx.sym.FullyConnected(x, num_hidden=2, name="fc2")
    g = place(import_symbol(y, data=(2, 3)), lambda n: "dev1" if n.name == "fc2" else "dev0")
    groups = {n.name: n.ctx_group for n in g.nodes}
    assert groups == {"data": "dev0", "fc1_weight": "dev0", "fc1_bias": "dev0", "fc1": "dev0",
                      "fc2_weight": "dev1", "fc2_bias": "dev1", "fc2": "dev1"}
    exported = json.loads(export_symbol(g).tojson())
    assert all(n.get("attrs", {}).get("__ctx_group__") for n in exported["nodes"])


def test_place_rejects_a_variable_read_on_two_devices():
    w = mx.sym.var("w")
    a = mx.sym.FullyConnected(mx.sym.var("x"), weight=w, no_bias=True, num_hidden=3, name="a")
    b = mx.sym.FullyConnected(a, weight=w, no_bias=True, num_hidden=3, name="b")
    g = import_symbol(b, x=(2, 3))
    with pytest.raises(TofuError, match=r"variable 'w' is read in groups \['dev0', 'dev1'\]"):
        place(g, lambda n: "dev0" if n.name == "a" else "dev1")


def test_cast_floats_makes_float64_flow_through_a_gluon_graph():
    """Gluon writes __dtype__=float32 on every parameter; cast, every tensor is float64."""
    from tofu_mx.tdl.annotate import import_graph
    symbol = tofu_mx.models.zoo_symbol("resnet18_v1", classes=10)
    with pytest.raises(tofu_mx.ShapeInferenceError, match="float32"):
        import_graph(symbol, dtypes={"data": "float64"}, data=(2, 3, 32, 32))
    cast, dtypes = cast_floats(symbol, "float64")
    assert set(dtypes.values()) == {"float64"}
    assert set(dtypes) == set(symbol.list_arguments() + symbol.list_auxiliary_states())
    graph = import_graph(cast, dtypes=dtypes, data=(2, 3, 32, 32))
    floats = {t.dtype for n in graph.nodes for t in n.outputs if np.dtype(t.dtype).kind == "f"}
    assert floats == {"float64"}
    assert json.loads(symbol.tojson()) != json.loads(cast.tojson())   # the caller's is kept


def test_cast_floats_keeps_integer_inputs():
    tokens = mx.sym.var("tokens", dtype="int32")
    out = mx.sym.Embedding(tokens, mx.sym.var("embed_weight", dtype="float32"), input_dim=5,
                           output_dim=3, dtype="float32", name="embed")
    cast, dtypes = cast_floats(out, "float64")
    assert dtypes == {"tokens": "int32", "embed_weight": "float64"}
    (node,) = [n for n in json.loads(cast.tojson())["nodes"] if n["op"] == "Embedding"]
    assert node["attrs"]["dtype"] == "float64"
