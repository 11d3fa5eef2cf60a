"""verify() on hand-placed graphs, as MXNet's own test_model_parallel.py places them."""
import re
import resource
import warnings

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
    raises_and_changes_nothing(
        tofu_mx.BindError, r"cannot bind the candidate on \['cpu\(0\)', 'cpu\(1\)'\]: .*Trying "
                           r"to save gradient to cpu\(0\).*nnvm_passes.place",
        dropout_fc(), dropout_fc("dev1", tag_data=False), cpus(2), data=(8, 6))


def test_other_bind_errors_get_no_placement_hint(cpus, monkeypatch):
    def refuse(*args, **kwargs):
        raise mx.base.MXNetError("MXNetError: Check failed: something else went wrong")
    monkeypatch.setattr(mx.sym.Symbol, "simple_bind", refuse)
    raises_and_changes_nothing(
        tofu_mx.BindError, r"^MXNet cannot bind the reference on \['cpu\(0\)'\]: MXNetError: "
                           r"Check failed: something else went wrong\.$",
        mlp(), mlp(placed=True), cpus(2), **SHAPES)


def test_explicit_group2ctx_and_candidate_pairs(cpus):
    with mx.AttrScope(ctx_group="right"):
        cand = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=2, name="fc")
    ref = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=2, name="fc")
    assert tofu_mx.verify(ref, cand, cpus(2), group2ctx={"right": mx.cpu(1)}, x=(2, 3)).ok
    assert tofu_mx.verify(ref, (cand, {"right": 1}), cpus(2), x=(2, 3)).ok
    with pytest.raises(tofu_mx.ContextError, match=r"ctx group 'right' has no device.*group2ctx"):
        tofu_mx.verify(ref, cand, cpus(2), x=(2, 3))


def state(*given):
    """What a call was given, to compare after it: symbols as JSON, arrays as bytes, dicts,
    lists and partitions followed. A call that fails must leave all of it as it was."""
    def snap(x):
        if isinstance(x, mx.sym.Symbol):
            return "symbol", x.tojson()
        if isinstance(x, mx.nd.NDArray):
            return "ndarray", x.shape, str(x.dtype), x.context, x.asnumpy().tobytes()
        if isinstance(x, np.ndarray):
            return "array", x.shape, str(x.dtype), x.tobytes()
        if isinstance(x, dict):
            return "dict", [(k, snap(v)) for k, v in x.items()]
        if isinstance(x, (list, tuple)):
            return type(x).__name__, [snap(v) for v in x]
        if hasattr(x, "shards"):
            return ("partition", x.symbol.tojson(), snap(list(x.contexts)),
                    snap(dict(x.group2ctx)), x.executor is None, snap(x.reference))
        return "value", repr(x)
    return [snap(x) for x in given]


def test_arrays_override_and_are_not_mutated(cpus):
    x = np.ones((4, 5), dtype=np.float32)
    nd = mx.nd.ones((8, 5))
    report = tofu_mx.verify(mlp(), mlp(placed=True), cpus(2),
                            arrays={"data": x, "fc1_weight": nd}, **SHAPES)
    assert report.ok
    assert (x == 1).all() and (nd.asnumpy() == 1).all()
    for arrays, message in [({"data": np.ones((2, 5))}, r"arrays\['data'\] has shape \(2, 5\)"),
                            ({"bogus": x}, "arrays has 'bogus'")]:
        ref, cand = mlp(), mlp(placed=True)
        before = state(ref, cand, arrays, SHAPES)
        with pytest.raises(tofu_mx.InvalidArgumentError, match=message):
            tofu_mx.verify(ref, cand, cpus(2), arrays=arrays, **SHAPES)
        assert state(ref, cand, arrays, SHAPES) == before


def test_a_float64_graph_is_its_own_oracle(cpus):
    """In float64 the oracle is the reference run itself: no rounding allowance, the same
    verdict as the default mode."""
    dtypes = {"data": "float64", "softmax_label": "float64"}
    for cand in (mlp(placed=True), mlp(placed=True, swap_halves=True)):
        reports = []
        for oracle in (None, "float64"):
            try:
                reports.append(tofu_mx.verify(mlp(), cand, cpus(2), dtypes=dtypes,
                                              oracle=oracle, **SHAPES))
            except tofu_mx.VerificationError as e:
                reports.append(e.report)
        default, judged = reports
        assert default.ok == judged.ok and not default.diagnosis
        for d, o in zip(default.comparisons, judged.comparisons):
            assert (o.name, o.max_abs_err, o.ok) == (d.name, d.max_abs_err, d.ok)
            assert o.reference_abs_err == 0 == o.rounding_abs_err


def test_symbols_are_not_mutated(cpus):
    ref, cand = mlp(), mlp(placed=True)
    before = ref.tojson(), cand.tojson()
    tofu_mx.verify(ref, cand, cpus(2), **SHAPES)
    assert (ref.tojson(), cand.tojson()) == before


# --- bad input ------------------------------------------------------------------------------

def raises_and_changes_nothing(error, match, *args, **kwargs):
    """``tofu_mx.verify(*args, **kwargs)`` raises ``error`` matching ``match`` and leaves
    every argument as it was."""
    before = state(args, kwargs)
    with pytest.raises(error, match=match) as info:
        tofu_mx.verify(*args, **kwargs)
    assert state(args, kwargs) == before
    return info.value


@pytest.mark.parametrize("ctx, message", [
    ([], "ctx is empty"),
    ([mx.cpu(0), mx.cpu(1), mx.cpu(0)], r"ctx lists cpu\(0\) twice \(positions 0 and 2\)"),
    (["cpu0"], "ctx must hold mx.Context objects, got 'cpu0'"),
    ("cpu", "ctx must be a list of mx.Context, got str"),
])
def test_bad_ctx(ctx, message):
    raises_and_changes_nothing(tofu_mx.ContextError, message, mlp(), mlp(placed=True), ctx,
                               **SHAPES)


NAN = float("nan")


@pytest.mark.parametrize("options, message", [
    ({"rtol": "1e-4"}, r"rtol must be a number, got str '1e-4'; e.g. rtol=1e-4"),
    ({"rtol": -1e-4}, r"rtol must be >= 0, got -0.0001"),
    ({"rtol": NAN}, r"rtol must be a finite number, got nan"),
    ({"atol": -1}, r"atol must be >= 0, got -1"),
    ({"atol": NAN}, r"atol must be a finite number, got nan"),
    ({"seed": 1.5}, r"seed must be an int, got float 1.5"),
    ({"seed": True}, r"seed must be an int, got bool True"),
    ({"seed": -1}, r"seed must be at least 0, got -1"),
    ({"oracle": "float16"}, r"oracle must be None or one of 'float64', got 'float16'.*float64 "
                            r"is the widest"),
    ({"oracle": True}, r"oracle must be None or one of 'float64', got True"),
    ({"arrays": [np.ones((4, 5))]}, r"arrays must be a dict, got list"),
    ({"arrays": {"data": "ones"}}, r"arrays\['data'\] must hold numbers, got an array of dtype "
                                   r"<U4"),
    ({"arrays": {"data": [["a"] * 5] * 4}}, r"arrays\['data'\] must hold numbers"),
    ({"arrays": {0: np.ones((4, 5))}}, r"arrays must be keyed by names \(str\), got key 0"),
    ({"group2ctx": [mx.cpu(1)]}, r"group2ctx must be a dict, got list"),
])
def test_bad_options(cpus, options, message):
    raises_and_changes_nothing(tofu_mx.InvalidArgumentError, message, mlp(), mlp(placed=True),
                               cpus(2), **options, **SHAPES)


def test_not_symbols(cpus):
    raises_and_changes_nothing(tofu_mx.NotASymbolError, "reference must be", "mlp",
                               mlp(placed=True), cpus(2), **SHAPES)
    raises_and_changes_nothing(tofu_mx.NotASymbolError, "candidate must be", mlp(), 42,
                               cpus(2), **SHAPES)


def test_candidate_with_other_inputs(cpus):
    other = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3,
                                                       name="other"), name="softmax")
    raises_and_changes_nothing(
        tofu_mx.InvalidArgumentError,
        r"inputs differ.*missing \['fc1_weight'.*extra \['other_weight'", mlp(), other,
        cpus(2), **SHAPES)


def test_candidate_with_other_output_shape(cpus):
    ref = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=4, name="fc", flatten=False)
    cand = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=4, name="fc", flatten=True)
    raises_and_changes_nothing(tofu_mx.InvalidArgumentError, r"output shapes \[\(2, 4\)\]",
                               ref, cand, cpus(1), x=(2, 1, 3))


def test_unknown_shape_name(cpus):
    raises_and_changes_nothing(tofu_mx.UnknownInputError, "did you mean 'data'", mlp(),
                               mlp(placed=True), cpus(2), dat=(4, 5))


# --- a PartitionedSymbol made for something else ---------------------------------------------

def partition(sym, ctx, **shapes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return tofu_mx.partition(sym, ctx, **shapes)


def test_partition_checked_when_right(cpus):
    ptd = partition(mlp(), cpus(2), **SHAPES)
    assert tofu_mx.verify(mlp(), ptd, cpus(2), **SHAPES).ok
    assert tofu_mx.verify(mlp(), ptd, ptd.contexts, oracle="float64", **SHAPES).ok


def with_extra_output():
    net = mlp()
    return mx.sym.Group([net, mx.sym.sum(net.get_internals()["fc1_output"], name="extra")])


@pytest.mark.parametrize("partitioned, shapes, message", [
    # the partition's batch is 8, verify's 4
    (mlp, {"data": (8, 5), "softmax_label": (8,)},
     r"made for other inputs than the reference and shapes given to verify\(\): input 'data' is "
     r"\(8, 5\) float32 in the partition, \(4, 5\) float32 here; input 'softmax_label' is "
     r"\(8,\) float32 in the partition, \(4,\) float32 here\. .*partition this reference with "
     r"these shapes \(tofu_mx\.partition\(reference, ctx, data=\(4, 5\), "
     r"softmax_label=\(4,\)\)\)"),
    # a sigmoid where the reference has a ReLU: same inputs, other values
    (lambda: mlp(relu_on_dev1="sigmoid"), SHAPES,
     r"the operators differ \(8 in the partition's graph, 8 in the reference\); first: 'act1' "
     r"Activation\(\{'act_type': 'sigmoid'\}\) reading \['halves'\] in the partition, 'act1' "
     r"Activation\(\{'act_type': 'relu'\}\) .* in the reference"),
    # another network
    (lambda: mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3,
                                                        name="fc"), name="softmax"), SHAPES,
     r"input 'fc1_weight' is not in the partition.*the partition has input 'fc_weight', the "
     r"reference does not"),
    # one more output
    (with_extra_output, SHAPES,
     r"the operators differ \(8 in the partition's graph, 7 in the reference\)"),
])
def test_partition_of_other_inputs(cpus, partitioned, shapes, message):
    ptd = partition(partitioned(), cpus(2), **shapes)
    raises_and_changes_nothing(tofu_mx.InvalidArgumentError, message, mlp(), ptd, cpus(2),
                               **SHAPES)


def test_partition_runs_on_its_own_devices(cpus):
    ptd = partition(mlp(), cpus(2), **SHAPES)
    raises_and_changes_nothing(
        tofu_mx.ContextError,
        r"ctx is \[cpu\(1\), cpu\(0\)\], but the PartitionedSymbol was partitioned for "
        r"\[cpu\(0\), cpu\(1\)\], where verify\(\) runs it .* pass ctx=ptd.contexts, or "
        r"partition the reference for \[cpu\(1\), cpu\(0\)\]",
        mlp(), ptd, [mx.cpu(1), mx.cpu(0)], **SHAPES)
    raises_and_changes_nothing(tofu_mx.ContextError, r"ctx is \[cpu\(0\), gpu\(0\)\], but",
                               mlp(), ptd, [mx.cpu(0), mx.gpu(0)], **SHAPES)
    raises_and_changes_nothing(tofu_mx.ContextError, r"group2ctx=\{'dev1': cpu\(2\)\} given "
                               r"with a PartitionedSymbol.*leave group2ctx out", mlp(), ptd,
                               cpus(2), group2ctx={"dev1": mx.cpu(2)}, **SHAPES)


@pytest.mark.skipif(mx.context.num_gpus() > 0, reason="MXNet sees a GPU here")
def test_gpu_mxnet_cannot_see_is_a_context_error(cpus):
    mixed = [mx.cpu(0), mx.gpu(0)]
    error = raises_and_changes_nothing(tofu_mx.ContextError,
                                       r"cannot bind on gpu\(0\): MXNet sees 0 GPU", mlp(),
                                       mlp(placed=True), mixed, **SHAPES)
    assert "ctx group" not in str(error)
    # a device named but not used by the candidate's groups is refused too, not ignored
    raises_and_changes_nothing(tofu_mx.ContextError, r"cannot bind on gpu\(0\)", mlp(), mlp(),
                               mixed, **SHAPES)
    ptd = partition(mlp(), mixed, **SHAPES)     # planning needs no device
    raises_and_changes_nothing(tofu_mx.ContextError, r"cannot bind on gpu\(0\)", mlp(), ptd,
                               mixed, **SHAPES)


def fc(placed=False, **attrs):
    with mx.AttrScope(**({"ctx_group": "dev1"} if placed else {})):
        return mx.sym.FullyConnected(mx.sym.var("data"), name="fc", **attrs)


@pytest.mark.skipif(mx.runtime.Features().is_enabled("INT64_TENSOR_SIZE"),
                    reason="this MXNet has int64 tensor sizes")
@pytest.mark.parametrize("shape, attrs, message", [
    ((2 ** 16, 2 ** 15), {"num_hidden": 2}, r"tensor 'data' \(input\) has shape \(65536, 32768\)"),
    ((2 ** 16, 4), {"num_hidden": 2 ** 15},
     r"tensor 'fc' \(output 0 of FullyConnected\) has shape \(65536, 32768\)"),
])
def test_tensor_of_2_31_elements_is_refused_before_allocating(cpus, shape, attrs, message):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss    # KiB
    raises_and_changes_nothing(
        tofu_mx.InvalidArgumentError,
        message + r": 2,147,483,648 elements, 2\*\*31 or more\. This MXNet \(1\.9\.1\) is built "
                  r"without int64 tensor sizes .* use a smaller batch or input shape",
        fc(**attrs), fc(placed=True, **attrs), cpus(2), data=shape)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 2 ** 20   # < 1 GiB


def test_mkldnn_warning_when_enabled(cpus, monkeypatch):
    monkeypatch.setenv("MXNET_MKLDNN_ENABLED", "1")
    from tofu_mx.devices import warn_if_mkldnn_across_cpus
    if not mx.runtime.Features().is_enabled("MKLDNN"):
        pytest.skip("this MXNet build has no MKLDNN")
    with pytest.warns(RuntimeWarning, match="MXNET_MKLDNN_ENABLED=0"):
        warn_if_mkldnn_across_cpus(cpus(2))


def logistic(steps, form="product", wrong=0.0):
    """``steps`` of the logistic map y <- 4 y (1 - y) from the input (in (0, 1)): doubles an
    error at every step, so one ulp of the input grows to about 2**steps ulps. ``form``
    ``"expanded"``: the same map as 4y - 4y^2 (other roundings, the same function)."""
    y = mx.sym.var("data")
    for _ in range(steps):
        y = 4 * y * (1 - y) if form == "product" else 4 * y - 4 * mx.sym.square(y)
    return mx.sym.MakeLoss(y + wrong)


CHAOS_START = {"data": np.random.default_rng(5).uniform(0.1, 0.9, (8, 8))}


def test_a_chaotic_float64_graph_is_judged_by_its_measured_sensitivity(cpus):
    """Rounded otherwise, the map differs from the reference by more than the tolerance after
    36 steps, and so does the reference on inputs one ulp away: the report says so and passes."""
    report = tofu_mx.verify(logistic(36), logistic(36, "expanded"), cpus(1),
                            dtypes={"data": "float64"}, data=(8, 8), arrays=CHAOS_START)
    assert report.ok and report.sensitive and "chaotic" in report.diagnosis
    for name in report.sensitive:       # each failed the plain comparison (that is why)
        c = report[name]
        assert 0 < c.max_abs_err <= 4 * c.rounding_abs_err


def test_a_wrong_candidate_of_a_chaotic_graph_still_fails(cpus):
    with pytest.raises(tofu_mx.VerificationError, match="differs from the reference"):
        tofu_mx.verify(logistic(36), logistic(36, "expanded", wrong=0.5), cpus(1),
                       dtypes={"data": "float64"}, data=(8, 8), arrays=CHAOS_START)


def test_a_well_conditioned_float64_graph_is_not_excused(cpus):
    """One ulp moves a plain MLP by about one ulp: nothing is excused."""
    with pytest.raises(tofu_mx.VerificationError) as info:
        tofu_mx.verify(mlp(), mlp(placed=True, relu_on_dev1="softrelu"), cpus(2),
                       dtypes={"data": "float64", "softmax_label": "float64"}, **SHAPES)
    assert not info.value.report.sensitive
