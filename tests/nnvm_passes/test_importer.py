import json

import mxnet as mx
import numpy as np
import pytest

import tofu_mx
from nnvm_passes import export_symbol, import_symbol, importer


def small_net():
    data = mx.sym.var("data")
    x = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), pad=(1, 1), name="c1")
    x = mx.sym.BatchNorm(x, fix_gamma=False, name="bn1")
    x = mx.sym.Dropout(x, p=0.5, name="drop")
    x = mx.sym.FullyConnected(x, num_hidden=3, name="fc")
    return mx.sym.SoftmaxOutput(x, name="softmax")


def test_every_entry_has_its_shape_and_dtype_hidden_outputs_included():
    g = import_symbol(small_net(), data=(2, 3, 5, 5))
    assert g.node("c1").outputs[0].shape == (2, 4, 5, 5)
    bn = g.node("bn1")
    # BatchNorm has three outputs; the batch mean and variance are hidden from list_outputs.
    assert [t.shape for t in bn.outputs] == [(2, 4, 5, 5), (4,), (4,)]
    assert [t.shape for t in g.node("drop").outputs] == [(2, 4, 5, 5), (2, 4, 5, 5)]
    assert g.node("fc_weight").outputs[0].shape == (3, 100)
    assert all(t.dtype == "float32" for n in g.nodes for t in n.outputs)
    assert g.output_infos[0].shape == (2, 3)


@pytest.mark.parametrize("hidden", [False, True])
def test_entries_are_inferred_through_mxnets_internals(hidden):
    """get_internals() is inferred, not a JSON copy with every entry a head: as it is where
    it lists every entry, with the hidden outputs to add where it leaves them out (Dropout's
    mask here); either way the import is the same as through the copy."""
    x = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc1")
    x = mx.sym.Activation(x, act_type="relu", name="relu")
    if hidden:
        x = mx.sym.Dropout(x, p=0.5, name="drop")
    sym = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(x, num_hidden=3, name="fc2"), name="sm")
    js = json.loads(sym.tojson())
    internals = importer.internals_of(sym)
    entries, extra = importer._entries_symbol(js, internals)
    assert entries is internals[0] and (extra is not None) is hidden
    copy = importer.all_entries_symbol(js)
    assert (entries.list_outputs() == copy.list_outputs()) is not hidden
    if not hidden:
        shapes = {"data": (2, 5)}
        assert entries.infer_shape_partial(**shapes) == copy.infer_shape_partial(**shapes)
        assert entries.infer_type_partial(data="float64") == \
            copy.infer_type_partial(data="float64")


def hidden_nets():
    """Graphs whose get_internals() leaves outputs out: BatchNorm's saved statistics (also
    shown, with output_mean_var), Dropout's mask, in float16 too; a node named like another's
    output."""
    x = mx.sym.Convolution(mx.sym.var("data"), num_filter=4, kernel=(3, 3), name="c")
    bn = mx.sym.BatchNorm(x, output_mean_var=True, fix_gamma=False, name="c_output")
    y = mx.sym.Dropout(mx.sym.BatchNorm(bn[0], name="bn2"), p=0.3, name="drop")
    shown = mx.sym.Group([mx.sym.SoftmaxOutput(mx.sym.FullyConnected(y, num_hidden=3,
                                                                     name="fc"), name="sm"),
                          bn[1], bn[2]])
    return [(small_net(), {"data": (2, 3, 5, 5)}, None),
            (shown, {"data": (2, 3, 6, 6)}, None),
            (shown, {"data": (2, 3, 6, 6)}, {"data": "float16"})]


@pytest.mark.parametrize("case", range(3))
def test_hidden_outputs_inferred_alone_are_the_copys(monkeypatch, case):
    """Where get_internals() leaves out hidden outputs, the listed entries are inferred and
    each hidden one alone (per operator, attributes and inputs): every node as the import
    through the JSON copy with every entry a head gives it; the same where inferring one
    alone fails (the copy then)."""
    sym, shapes, dtypes = hidden_nets()[case]
    fast = import_symbol(sym, dtypes=dtypes, **shapes)
    assert importer._Hidden.of(json.loads(sym.tojson()), sym.get_internals().list_outputs())
    with monkeypatch.context() as m:
        m.setattr(importer._Hidden, "of", staticmethod(lambda js, names: None))
        copy = import_symbol(sym, dtypes=dtypes, **shapes)
    assert fast.nodes == copy.nodes and fast.heads == copy.heads
    with monkeypatch.context() as m:
        m.setattr(importer, "_node_outputs", lambda *args: None)
        assert import_symbol(sym, dtypes=dtypes, **shapes).nodes == copy.nodes
    assert any(len(n.outputs) > 1 for n in fast.nodes)


def test_variables_are_classified():
    g = import_symbol(small_net(), data=(2, 3, 5, 5))
    kinds = {n.name: n.kind for n in g.variables()}
    assert kinds == {"data": "data", "c1_weight": "param", "c1_bias": "param",
                     "bn1_gamma": "param", "bn1_beta": "param", "bn1_moving_mean": "aux",
                     "bn1_moving_var": "aux", "fc_weight": "param", "fc_bias": "param",
                     "softmax_label": "label"}
    assert all(n.kind is None for n in g.operators())
    sym = small_net()
    assert g.arg_names == sym.list_arguments()
    assert g.aux_names == sym.list_auxiliary_states()


def test_label_found_through_the_loss_op_whatever_its_name():
    """The importer asks ``label_inputs(op, attrs)`` which inputs are labels; tofu_mx's
    import_graph answers from the operator descriptions (``@tdl.op(..., labels=(1,))``)."""
    from tofu_mx.tdl.annotate import import_graph
    x = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=3, name="fc")
    out = mx.sym.SoftmaxOutput(x, mx.sym.var("targets"), name="loss")
    g = import_graph(out, x=(2, 5))
    assert g.node("targets").kind == "label" and g.node("x").kind == "data"
    asked = []
    g = import_symbol(out, x=(2, 5), label_inputs=lambda op, attrs: asked.append(op) or ())
    assert g.node("targets").kind == "param" and asked == ["FullyConnected", "SoftmaxOutput"]


def test_data_names_override_which_inputs_are_data():
    g = import_symbol(small_net(), data=(2, 3, 5, 5), fc_weight=(3, 100), data_names=["data"])
    assert g.node("fc_weight").kind == "param"
    g = import_symbol(small_net(), data=(2, 3, 5, 5), fc_weight=(3, 100),
                      data_names=["data", "fc_weight"])
    assert g.node("fc_weight").kind == "data"


def test_a_shape_given_for_a_weight_leaves_it_a_parameter():
    """MXNet infers fc_weight's shape from data's, so giving it does not make it data (a
    checkpoint would lose it); data, which nothing else determines, stays data. When every
    given shape follows from the others (a * b), all are data."""
    g = import_symbol(small_net(), data=(2, 3, 5, 5), fc_weight=(3, 100))
    assert g.node("fc_weight").kind == "param" and g.node("data").kind == "data"
    a, b = mx.sym.var("a"), mx.sym.var("b")
    g = import_symbol(mx.sym.MakeLoss(mx.sym.sum(a * b)), a=(2, 3), b=(2, 3))
    assert g.node("a").kind == "data" and g.node("b").kind == "data"


def test_dtypes_propagate():
    g = import_symbol(small_net(), data=(2, 3, 5, 5), dtypes={"data": "float16"})
    assert g.node("c1").outputs[0].dtype == "float16"
    assert g.node("fc_weight").outputs[0].dtype == "float16"


def test_round_trip_is_exact_and_symbol_untouched():
    sym = small_net()
    before = sym.tojson()
    g = import_symbol(sym, data=(2, 3, 5, 5))
    assert json.loads(export_symbol(g).tojson()) == json.loads(sym.tojson())
    assert sym.tojson() == before


def test_ctx_groups_and_hidden_attrs_survive_the_round_trip():
    with mx.AttrScope(ctx_group="dev1"):
        fc = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=2, name="fc", lr_mult=2.0)
    g = import_symbol(fc, x=(1, 3))
    assert g.node("fc").ctx_group == "dev1"
    assert json.loads(export_symbol(g).tojson()) == json.loads(fc.tojson())


# --- bad input ------------------------------------------------------------------------------

def test_not_a_symbol():
    with pytest.raises(tofu_mx.NotASymbolError, match="must be an mx.sym.Symbol, got dict"):
        import_symbol({"op": "null"}, data=(1,))
    net = mx.gluon.nn.Dense(3)
    with pytest.raises(tofu_mx.NotASymbolError, match=r"net\(mx.sym.var\('data'\)\)"):
        import_symbol(net, data=(1, 2))


def test_unknown_input_name_suggests_the_close_one():
    with pytest.raises(tofu_mx.UnknownInputError,
                       match=r"'dta' \(did you mean 'data'\?\).*Its inputs are: data, c1_weight"):
        import_symbol(small_net(), dta=(2, 3, 5, 5))
    with pytest.raises(tofu_mx.UnknownInputError, match="dtype given for 'nope'"):
        import_symbol(small_net(), data=(2, 3, 5, 5), dtypes={"nope": "float16"})


@pytest.mark.parametrize("shape", [(), (2, 0, 5), (2, -1), "abc", (2.5, 3), None])
def test_bad_shape_values(shape):
    with pytest.raises(tofu_mx.InvalidArgumentError, match="shape of input 'data' must be"):
        import_symbol(small_net(), data=shape)


def test_shapes_that_cannot_be_inferred():
    with pytest.raises(tofu_mx.ShapeInferenceError, match="cannot be inferred.*data"):
        import_symbol(small_net())
    with pytest.raises(tofu_mx.ShapeInferenceError, match="cannot infer the graph's shapes"):
        import_symbol(small_net(), data=(2, 3, 5, 5), fc_weight=(3, 7))  # fc needs (3, 100)
    assert issubclass(tofu_mx.ShapeInferenceError, tofu_mx.TofuError)


def mixed_net():
    """Outputs of several ranks and dtypes, an unknown-rank-free graph with an int output."""
    data = mx.sym.var("data")
    x = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), pad=(1, 1), name="c1")
    x = mx.sym.BatchNorm(x, name="bn1")
    pooled = mx.sym.mean(x, axis=(2, 3), name="gap")
    idx = mx.sym.argmax(pooled, axis=1, name="am")
    cast = mx.sym.Cast(idx, dtype="int32", name="cast")
    fc = mx.sym.FullyConnected(pooled, num_hidden=3, name="fc")
    return mx.sym.Group([mx.sym.SoftmaxOutput(fc, name="softmax"), cast])


@pytest.mark.parametrize("wrapped", [False, True])
def test_inferred_arrays_are_mxnets_own(monkeypatch, wrapped):
    """Shapes read from MXNet's buffer (or, where it is not one piece, through its wrapper)
    and dtypes read as codes are what MXNet's Python wrapper gives, unknown ones included."""
    if wrapped:
        monkeypatch.setattr(importer, "_one_buffer", lambda *a: False)
    sym = mixed_net()
    everything = sym.get_internals()
    # an unknown batch (0) in a declared shape: known ranks with unknown dims
    half = mx.sym.FullyConnected(mx.sym.var("x", shape=(0, 5)), num_hidden=3).get_internals()
    for net, shapes in ((everything, {"data": (2, 3, 5, 5)}), (everything, {}),
                        (everything, {"softmax_label": (2,)}), (half, {})):
        got = importer._infer_shape_arrays(net, shapes)
        for arrays, want in zip(got, net.infer_shape_partial(**shapes)):
            seen = [tuple(arrays.dims[a:b].tolist())
                    for a, b in zip(arrays.start[:-1].tolist(), arrays.start[1:].tolist())]
            assert seen == [tuple(s) for s in want]
            assert arrays.unknown().tolist() == [importer._unknown(s) for s in want]
            if net is half and want:
                assert any(0 in s for s in want) and not all(map(importer._unknown, want))
    codes = importer._infer_dtypes(everything, {"data": "float64"})
    _, want, _ = everything.infer_type_partial(data="float64")
    assert [np.dtype(importer._DTYPE_MX_TO_NP[c]) for c in codes.tolist()] == \
        [np.dtype(t) for t in want]
    assert {np.dtype(t).name for t in want} >= {"float64", "int32"}


def test_tensor_infos_are_one_per_shape_and_dtype():
    g = import_symbol(mixed_net(), data=(2, 3, 5, 5), dtypes={"data": "float64"})
    infos = [t for n in g.nodes for t in n.outputs]
    by_value: dict = {}
    for t in infos:
        assert by_value.setdefault((t.shape, t.dtype), t) is t     # shared where equal
        assert all(type(d) is int for d in t.shape)
    assert g.node("cast").outputs[0].dtype == "int32" and g.node("gap").outputs[0].shape == (2, 4)
    assert g.node("am").outputs[0].shape == (2,)


def test_duplicate_variable_names_are_reported_before_bad_shapes():
    """MXNet cannot bind two variables of one name either."""
    b = mx.sym.var("x") + mx.sym.var("x")
    with pytest.raises(tofu_mx.InvalidArgumentError, match="two variables named 'x'"):
        import_symbol(b, x=(0, 3))


def test_repeated_operator_names_are_made_unique_and_the_symbol_kept():
    """A Gluon block called at two places gives two nodes one name; MXNet binds that graph.
    Later operators get ``name#2``, ``name#3``; a variable keeps its name (it binds by it)."""
    x = mx.sym.var("x")
    y = mx.sym.Activation(x, act_type="relu", name="relu")
    y = mx.sym.FullyConnected(y, num_hidden=3, name="x")          # an operator named 'x'
    y = mx.sym.Activation(y, act_type="relu", name="relu")
    y = mx.sym.Activation(y, act_type="tanh", name="relu")
    before = y.tojson()
    g = import_symbol(y, x=(2, 3))
    assert y.tojson() == before
    names = [n.name for n in g.nodes]
    assert len(set(names)) == len(names)
    assert [n for n in names if n.startswith("relu")] == ["relu", "relu#2", "relu#3"]
    assert "x" in names and g.node("x").is_variable and "x#2" in names
    assert g.node("relu#3").attrs["act_type"] == "tanh"
