"""verify(..., oracle="float64") on a model whose float32 run is ill-conditioned: ResNet-18 at
32 px and batch 3 (its last stages normalise over 3 values), partitioned over 2 devices. The
default mode rejects the right partition, saying why; the oracle accepts it, and both modes
reject partitions with plausible bugs written into the partitioned graph."""
import copy
import json
import re
import warnings

import mxnet as mx
import numpy as np
import pytest

import tofu_mx
from tofu_mx import verification

SHAPES = {"data": (3, 3, 32, 32)}
CTX = [mx.cpu(0), mx.cpu(1)]


@pytest.fixture(scope="module")
def resnet():
    """(reference symbol, its PartitionedSymbol over cpu(0), cpu(1))."""
    with mx.name.NameManager():     # Gluon numbers blocks per manager: names fixed
        net = mx.gluon.model_zoo.vision.resnet18_v1(classes=10)
    net.initialize()
    net.hybridize()
    sym = mx.sym.SoftmaxOutput(net(mx.sym.var("data")), name="softmax")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return sym, tofu_mx.partition(sym, CTX, **SHAPES)


def test_default_mode_fails_and_says_the_reference_is_ill_conditioned(resnet):
    sym, ptd = resnet
    with pytest.raises(tofu_mx.VerificationError,
                       match=r"The float32 reference is itself outside the tolerance of a float64 "
                             r"run .* in \d+ of the \d+ differing tensors .* ill-conditioned in "
                             r"float32.* with oracle='float64' .*every tensor passes") as info:
        tofu_mx.verify(sym, ptd, CTX, **SHAPES)
    # (nearly) every tensor that differs does so where the reference is off float64 itself
    outside, differing = map(int, re.search(r"in (\d+) of the (\d+) differing",
                                            str(info.value)).groups())
    assert outside >= 0.9 * differing
    report = info.value.report
    assert report.oracle is None and len(report.failures) > 10
    assert "ill-conditioned" in report.diagnosis and "ill-conditioned" in str(report)


def test_oracle_mode_passes_the_right_partition(resnet):
    sym, ptd = resnet
    report = tofu_mx.verify(sym, ptd, CTX, oracle="float64", **SHAPES)
    assert report.ok and report.oracle == "float64" and len(report.comparisons) == 104
    # Every tensor carries both errors; float32's own error is far above the tolerance in
    # some (that is why the default mode fails), and the candidate stays within twice it:
    # half the allowance ORACLE_FACTOR = 4 gives.
    worst = report.worst
    assert worst.violation < 0.5
    assert all(c.reference_abs_err is not None and c.rounding_abs_err >= c.reference_abs_err
               for c in report.comparisons)
    off = [c for c in report.comparisons
           if c.rounding_abs_err > 10 * (report.atol + report.rtol * abs(c.oracle_value))]
    assert off, "the model is no longer ill-conditioned in float32: pick another for this test"
    text = str(report)
    assert "cand-oracle" in text and "ref-oracle" in text and "float64 oracle" in text
    assert f"{worst.max_abs_err:.3g}" in worst.describe()
    assert f"{worst.reference_abs_err:.3g}" in worst.describe()


def edited(ptd, edit):
    """``ptd`` with ``edit(nodes)`` applied to its partitioned symbol's JSON: a rewrite bug."""
    js = json.loads(ptd.symbol.tojson())
    nodes = {n["name"]: n for n in js["nodes"]}
    edit(nodes)
    wrong = copy.copy(ptd)
    wrong.symbol = mx.sym.load_json(json.dumps(js))
    wrong.__dict__.pop("shard_graph", None)     # computed from the symbol
    assert wrong.symbol.tojson() != ptd.symbol.tojson()
    return wrong


def sigmoid_on_dev1(nodes):
    """One device's share of a ReLU computes a sigmoid."""
    node = nodes["resnetv10_stage2_activation0@dev1"]
    assert node["attrs"]["act_type"] == "relu"
    node["attrs"]["act_type"] = "sigmoid"


def copy_of_first_input(name):
    def edit(nodes):
        node = nodes[name]
        assert node["op"] in ("elemwise_add", "add_n") and len(node["inputs"]) == 2
        node.update(op="_copy", inputs=node["inputs"][:1],
                    attrs={"__ctx_group__": node["attrs"]["__ctx_group__"]})
    return edit


@pytest.mark.parametrize("edit", [
    sigmoid_on_dev1,
    # a residual connection dropped on one device
    copy_of_first_input("resnetv10_stage2__plus1@dev1"),
    # a partial sum not added: dev0 keeps its own half of a convolution's input channels
    copy_of_first_input("resnetv10_stage2_conv0_fwd@dev0@sum"),
], ids=["relu->sigmoid", "residual dropped", "partial sum dropped"])
def test_a_wrong_partition_fails_in_both_modes(resnet, edit):
    sym, ptd = resnet
    wrong = edited(ptd, edit)
    before = sym.tojson(), ptd.symbol.tojson(), wrong.symbol.tojson()
    with pytest.raises(tofu_mx.VerificationError) as default:
        tofu_mx.verify(sym, wrong, CTX, **SHAPES)
    with pytest.raises(tofu_mx.VerificationError, match="judged against the float64 oracle") \
            as oracle:
        tofu_mx.verify(sym, wrong, CTX, oracle="float64", **SHAPES)
    # Not a borderline call: the output itself is off by far more than any allowance.
    for report in (default.value.report, oracle.value.report):
        assert report["output softmax_output"].violation > 10
    assert oracle.value.report.worst.violation > 100
    assert (sym.tojson(), ptd.symbol.tojson(), wrong.symbol.tojson()) == before


def test_the_factor_is_applied_not_a_loose_tolerance(resnet):
    """A candidate off the oracle by exactly float32's error passes; by ORACLE_FACTOR + 1 times
    it, in one element of a tensor where that is above the tolerance, fails."""
    name = "grad resnetv10_stage1_conv0_weight"
    truth = np.full((3, 3), 1.0)
    ref = truth + np.array([[1e-3, 0, 0], [0, 0, 0], [0, 0, 0]])
    ok = verification._compare_to_oracle(name, truth, [ref], ref[::-1].copy(), 1e-4, 1e-5)
    assert ok.ok and ok.rounding_abs_err == pytest.approx(1e-3)
    bad = truth.copy()
    bad[2, 2] += (verification.ORACLE_FACTOR + 1) * 1e-3
    judged = verification._compare_to_oracle(name, truth, [ref], bad, 1e-4, 1e-5)
    assert not judged.ok and judged.worst_index == (2, 2)
    factor = verification.ORACLE_FACTOR
    assert judged.violation == pytest.approx((factor + 1) / factor)
    # The largest error over the runs sets the floor; the tolerance is the floor's floor.
    exact = verification._compare_to_oracle(name, truth, [truth, truth], truth + 2e-5, 0, 1e-5)
    assert not exact.ok and exact.violation == pytest.approx(2.0)


def test_a_tensor_float_rounding_cannot_compute_is_named():
    """Where the reference's own rounding error is a sizeable part of the values, a failure
    says so instead of passing it (here 20% of the largest value, 5 times over)."""
    truth = np.array([1.0, -1.0, 0.5])
    noisy = verification._compare_to_oracle("grad w", truth, [truth + 0.2], truth + 1.0, 1e-4,
                                            1e-5)
    assert not noisy.ok and noisy.rounding_rel_err == pytest.approx(0.2)
    assert "20.00% of its largest value" in noisy.describe()
    clean = verification._compare_to_oracle("grad v", truth, [truth + 1e-7], truth + 1.0, 1e-4,
                                            1e-5)
    assert not clean.ok
    note = verification._noise_note([noisy, clean], "the differing tensors")
    assert note.startswith("1 of the differing tensors is computed by the reference itself "
                           "with a rounding error of 10% or more of the tensor's largest value "
                           "(up to 20%, in grad w)")
    assert verification._noise_note([clean], "them") == ""
