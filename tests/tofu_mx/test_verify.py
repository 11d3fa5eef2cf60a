"""verify() on hand-placed graphs, as MXNet's own test_model_parallel.py places them."""
import re

import mxnet as mx
import numpy as np
import pytest

import tofu_mx
from nnvm_passes import export_symbol, import_symbol, place
from tofu_mx import models

SHAPES = {"data": (4, 5), "softmax_label": (4,)}


def mlp(placed=False, swap_halves=False, block_grad=False, relu_on_dev1="relu"):
    """fc1 -> split in two halves -> relu each -> concat -> fc2 -> softmax.

    Placed: fc1 and the first half on dev0, the second half and the rest on dev1.
    ``swap_halves`` concatenates the halves in the wrong order (a wrong partition);
    ``block_grad`` stops the gradient after the concat (forward right, backward wrong).
    """
    scope = (lambda i: mx.AttrScope(ctx_group=f"dev{i}")) if placed else (lambda i: mx.AttrScope())
    with scope(0):
        fc1 = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc1")
        halves = mx.sym.split(fc1, num_outputs=2, axis=1, name="halves")
        a0 = mx.sym.Activation(halves[0], act_type="relu", name="act0")
    with scope(1):
        a1 = mx.sym.Activation(halves[1], act_type=relu_on_dev1, name="act1")
        h = mx.sym.concat(*([a1, a0] if swap_halves else [a0, a1]), dim=1, name="cat")
        if block_grad:
            h = mx.sym.BlockGrad(h, name="stop")
        fc2 = mx.sym.FullyConnected(h, num_hidden=3, name="fc2")
        return mx.sym.SoftmaxOutput(fc2, name="softmax")


def test_right_graph_passes_and_reports_every_tensor(cpus):
    report = tofu_mx.verify(mlp(), mlp(placed=True), cpus(2), **SHAPES)
    assert report.ok
    names = [c.name for c in report.comparisons]
    assert names == ["output softmax_output", "grad data", "grad fc1_weight", "grad fc1_bias",
                     "grad fc2_weight", "grad fc2_bias"]
    assert report.worst.max_abs_err == 0.0
    assert "6 tensors on cpu(0), cpu(1)" in str(report) and "all agree" in str(report)


def test_wrong_partition_is_caught(cpus):
    with pytest.raises(tofu_mx.VerificationError,
                       match=r"differs from the reference in \d+ of 6 tensors.*worst: ") as info:
        tofu_mx.verify(mlp(), mlp(placed=True, swap_halves=True), cpus(2), **SHAPES)
    report = info.value.report
    assert not report["output softmax_output"].ok
    assert {c.name for c in report.failures} >= {"output softmax_output", "grad fc2_weight"}


def test_wrong_gradient_with_right_forward_is_caught(cpus):
    with pytest.raises(tofu_mx.VerificationError, match="grad fc1") as info:
        tofu_mx.verify(mlp(), mlp(placed=True, block_grad=True), cpus(2), **SHAPES)
    report = info.value.report
    assert report["output softmax_output"].ok and report["grad fc2_weight"].ok
    assert not report["grad fc1_weight"].ok and not report["grad data"].ok


def test_tolerance_is_applied(cpus):
    # softrelu differs from relu by at most log(2) at 0: far above the default tolerance,
    # within a tolerance of 1.
    with pytest.raises(tofu_mx.VerificationError):
        tofu_mx.verify(mlp(), mlp(placed=True, relu_on_dev1="softrelu"), cpus(2), **SHAPES)
    assert tofu_mx.verify(mlp(), mlp(placed=True, relu_on_dev1="softrelu"), cpus(2),
                          rtol=0, atol=10, **SHAPES).ok


def by_block(k):
    """Operator placement for the builders: block i (stage/layer number in the name) on dev i%k."""
    def group_of(node):
        m = re.match(r"(stage|l|layer)(\d+)", node.name)
        return f"dev{int(m.group(2)) % k if m else 0}"
    return group_of


@pytest.mark.parametrize("name, build, shapes, k", [
    ("wresnet", lambda: models.wresnet(14, widen=1, num_classes=10),
     models.input_shapes("wresnet", 2, image_size=32), 4),
    ("rnn", lambda: models.rnn(3, hidden=16, seq_len=3, vocab=20, dropout=0.5),
     models.input_shapes("rnn", 2, seq_len=3), 3),
    ("transformer", lambda: models.transformer(2, 16, 4, seq_len=5, vocab=20, dropout=0.3),
     models.input_shapes("transformer", 2, seq_len=5), 2),
])
def test_builders_placed_across_devices_verify(cpus, name, build, shapes, k):
    """Covers BatchNorm's aux states, Embedding's integer input, and Dropout in both graphs."""
    sym = build()
    candidate = export_symbol(place(import_symbol(sym, **shapes), by_block(k)))
    report = tofu_mx.verify(sym, candidate, cpus(k), **shapes)
    kinds = {c.name.split()[0] for c in report.comparisons}
    assert kinds == ({"output", "grad", "aux"} if name == "wresnet" else {"output", "grad"})
    # Token ids and labels are read as indices and get no gradient; images and every
    # parameter do.
    assert ("grad data" in [c.name for c in report.comparisons]) == (name == "wresnet")
    params = [n.name for n in import_symbol(sym, **shapes).variables("param")]
    assert {f"grad {p}" for p in params} <= {c.name for c in report.comparisons}


def dropout_fc(group=None, tag_data=True):
    with mx.AttrScope(**({"ctx_group": group} if group and tag_data else {})):
        data = mx.sym.var("data")
    with mx.AttrScope(**({"ctx_group": group} if group else {})):
        return mx.sym.FullyConnected(mx.sym.Dropout(data, p=0.5, name="d"), num_hidden=3,
                                     name="fc")


def test_dropout_is_deterministic_in_both_runs(cpus):
    report = tofu_mx.verify(dropout_fc(), dropout_fc("dev1"), cpus(2), data=(8, 6))
    assert report.worst.max_abs_err == 0.0


def test_untagged_variable_read_on_another_device_is_a_bind_error(cpus):
    with pytest.raises(tofu_mx.BindError,
                       match=r"cannot bind the candidate on \['cpu\(1\)'\]: .*Trying to save "
                             r"gradient to cpu\(0\).*nnvm_passes.place"):
        tofu_mx.verify(dropout_fc(), dropout_fc("dev1", tag_data=False), cpus(2), data=(8, 6))


def test_explicit_group2ctx_and_candidate_pairs(cpus):
    with mx.AttrScope(ctx_group="right"):
        cand = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=2, name="fc")
    ref = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=2, name="fc")
    assert tofu_mx.verify(ref, cand, cpus(2), group2ctx={"right": mx.cpu(1)}, x=(2, 3)).ok
    assert tofu_mx.verify(ref, (cand, {"right": 1}), cpus(2), x=(2, 3)).ok
    with pytest.raises(tofu_mx.ContextError, match=r"ctx group 'right' has no device.*group2ctx"):
        tofu_mx.verify(ref, cand, cpus(2), x=(2, 3))


def test_arrays_override_and_are_not_mutated(cpus):
    x = np.ones((4, 5), dtype=np.float32)
    nd = mx.nd.ones((8, 5))
    report = tofu_mx.verify(mlp(), mlp(placed=True), cpus(2),
                            arrays={"data": x, "fc1_weight": nd}, **SHAPES)
    assert report.ok
    assert (x == 1).all() and (nd.asnumpy() == 1).all()
    with pytest.raises(tofu_mx.InvalidArgumentError, match=r"arrays\['data'\] has shape \(2, 5\)"):
        tofu_mx.verify(mlp(), mlp(placed=True), cpus(2), arrays={"data": np.ones((2, 5))},
                       **SHAPES)
    with pytest.raises(tofu_mx.InvalidArgumentError, match="arrays has 'bogus'"):
        tofu_mx.verify(mlp(), mlp(placed=True), cpus(2), arrays={"bogus": x}, **SHAPES)


def test_symbols_are_not_mutated(cpus):
    ref, cand = mlp(), mlp(placed=True)
    before = ref.tojson(), cand.tojson()
    tofu_mx.verify(ref, cand, cpus(2), **SHAPES)
    assert (ref.tojson(), cand.tojson()) == before


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("ctx, message", [
    ([], "ctx is empty"),
    ([mx.cpu(0), mx.cpu(1), mx.cpu(0)], r"ctx lists cpu\(0\) twice \(positions 0 and 2\)"),
    (["cpu0"], "ctx must hold mx.Context objects, got 'cpu0'"),
    ("cpu", "ctx must be a list of mx.Context, got str"),
])
def test_bad_ctx(ctx, message):
    with pytest.raises(tofu_mx.ContextError, match=message):
        tofu_mx.verify(mlp(), mlp(placed=True), ctx, **SHAPES)


def test_not_symbols(cpus):
    with pytest.raises(tofu_mx.NotASymbolError, match="reference must be"):
        tofu_mx.verify("mlp", mlp(placed=True), cpus(2), **SHAPES)
    with pytest.raises(tofu_mx.NotASymbolError, match="candidate must be"):
        tofu_mx.verify(mlp(), 42, cpus(2), **SHAPES)


def test_candidate_with_other_inputs(cpus):
    other = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="other")
    with pytest.raises(tofu_mx.InvalidArgumentError,
                       match=r"inputs differ.*missing \['fc1_weight'.*extra \['other_weight'"):
        tofu_mx.verify(mlp(), mx.sym.SoftmaxOutput(other, name="softmax"), cpus(2), **SHAPES)


def test_candidate_with_other_output_shape(cpus):
    ref = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=4, name="fc", flatten=False)
    cand = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=4, name="fc", flatten=True)
    with pytest.raises(tofu_mx.InvalidArgumentError, match=r"output shapes \[\(2, 4\)\]"):
        tofu_mx.verify(ref, cand, cpus(1), x=(2, 1, 3))


def test_unknown_shape_name(cpus):
    with pytest.raises(tofu_mx.UnknownInputError, match="did you mean 'data'"):
        tofu_mx.verify(mlp(), mlp(placed=True), cpus(2), dat=(4, 5))


def test_mkldnn_warning_when_enabled(cpus, monkeypatch):
    monkeypatch.setenv("MXNET_MKLDNN_ENABLED", "1")
    from tofu_mx.devices import warn_if_mkldnn_across_cpus
    if not mx.runtime.Features().is_enabled("MKLDNN"):
        pytest.skip("this MXNet build has no MKLDNN")
    with pytest.warns(RuntimeWarning, match="MXNET_MKLDNN_ENABLED=0"):
        warn_if_mkldnn_across_cpus(cpus(2))
