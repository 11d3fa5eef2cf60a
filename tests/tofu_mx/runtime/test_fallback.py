"""An operator nobody described is not refused: it runs whole on one device, its inputs
gathered there and its outputs handed to their readers, and the partitioned graph computes
what the unpartitioned one does (outputs, every gradient). ``strict=True`` refuses it."""
import json
import warnings

import mxnet as mx
import pytest

import tofu_mx
from tests.tofu_mx.runtime.custom_ops import cube, scaled_cube, sign
from tests.tofu_mx.runtime.helpers import partition_and_verify
from tofu_mx.tdl.annotate import analyse, import_graph

X = mx.sym.var("data")


def middle(op):
    h = mx.sym.FullyConnected(X, num_hidden=8, name="fc1")
    y = mx.sym.FullyConnected(op(mx.sym.tanh(h)), num_hidden=4, name="fc2")
    return mx.sym.MakeLoss(mx.sym.sum(y * y))


def custom_nodes(ptd):
    return [n for n in json.loads(ptd.symbol.tojson())["nodes"] if n["op"] == "Custom"]


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("op", [lambda x: cube(x, name="cube"),
                                lambda x: scaled_cube(x, 0.5, name="cube")],
                         ids=["prop-without-keywords", "prop-with-keywords"])
def test_undescribed_operator_in_the_middle(op, k):
    ptd, report = partition_and_verify(middle(op), k, data=(12, 6))
    assert report.ok, report
    assert list(ptd.fallbacks) == ["cube"] and "runs whole on device 0" in ptd.fallbacks["cube"]
    # one node, on device 0, placed through its input: MXNet never hands it __ctx_group__
    (node,) = custom_nodes(ptd)
    assert "__ctx_group__" not in node.get("attrs", {})
    assert "runs whole (fallback): cube" in ptd.report()


def test_undescribed_operators_with_and_without_a_gradient():
    h = mx.sym.FullyConnected(X, num_hidden=8, name="fc1")
    y = mx.sym.FullyConnected(cube(h, name="cube") + sign(h, name="sign") * h, num_hidden=4,
                              name="fc2")
    ptd, report = partition_and_verify(mx.sym.MakeLoss(mx.sym.sum(y * y)), 3, data=(12, 6))
    assert report.ok, report
    assert set(ptd.fallbacks) == {"cube", "sign"}
    assert {c.name for c in report.comparisons} >= {
        "grad fc1_weight", "grad fc1_bias", "grad fc2_weight", "grad fc2_bias"}


def test_undescribed_operator_at_the_graph_output():
    h = mx.sym.FullyConnected(X, num_hidden=8, name="fc1")
    out = mx.sym.Group([cube(h, name="cube"), mx.sym.relu(h, name="relu")])
    for k in (2, 4):
        ptd, report = partition_and_verify(out, k, data=(8, 6))
        assert report.ok, report
        assert list(ptd.fallbacks) == ["cube"]


def test_one_warning_names_every_fallback():
    h = mx.sym.FullyConnected(X, num_hidden=8, name="fc1")
    sym = mx.sym.MakeLoss(mx.sym.sum(cube(h, name="c1") + sign(h, name="s1")))
    with pytest.warns(RuntimeWarning) as caught:
        tofu_mx.partition(sym, [mx.cpu(0), mx.cpu(1)], data=(4, 6))
    (w,) = [w for w in caught if "run whole" in str(w.message)]
    assert "c1: no description of Custom:tofu_test_cube" in str(w.message)
    assert "s1: no description of Custom:tofu_test_sign" in str(w.message)


def test_strict_refuses_an_undescribed_operator():
    with pytest.raises(tofu_mx.UnsupportedOperatorError,
                       match=r"cube \(Custom:tofu_test_cube\).*strict=False"):
        tofu_mx.partition(middle(lambda x: cube(x, name="cube")), [mx.cpu(0), mx.cpu(1)],
                          strict=True, data=(4, 6))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="strict must be True or False"):
        tofu_mx.partition(middle(mx.sym.relu), [mx.cpu(0), mx.cpu(1)], strict="yes",
                          data=(4, 6))
    # a described graph is not refused
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ptd = tofu_mx.partition(middle(mx.sym.relu), [mx.cpu(0), mx.cpu(1)], strict=True,
                                data=(4, 6))
    assert not ptd.fallbacks


def test_an_operator_reading_no_tensor_runs_replicated():
    """Nothing to gather: every part makes it (a random sampler here, out of scope)."""
    sym = mx.sym.random.uniform(shape=(4, 6)) * X
    found = {r.op: r for r in analyse(import_graph(sym, data=(4, 6)))}
    (sampler,) = [r for op, r in found.items() if "uniform" in op]
    assert sampler.status == "unknown"
    assert [s.name for s in sampler.strategies] == ["replicate all"]


def test_describing_the_operator_is_seen_at_once_and_removes_the_fallback():
    """The annotation cache follows the registry: after a description of the custom operator
    is registered the same graph splits it (and verifies); after it is removed it runs whole
    again. (A cache keyed on names alone kept the old strategies.)"""
    from tofu_mx import tdl
    from tofu_mx.tdl.registry import unregister
    sym = middle(lambda x: cube(x, name="cube"))
    before = tofu_mx.plan(sym, 2, data=(12, 6))
    assert dict((o.name, tuple(map(str, o.strategies))) for o in before.ops)["cube"] == ("whole",)

    @tdl.op("Custom:tofu_test_cube", examples=[({}, [(4, 3)])])
    def cube_description(attrs, data):
        return tdl.lam(data.ndim, lambda *i: data[i] * data[i] * data[i])
    try:
        after = tofu_mx.plan(sym, 2, data=(12, 6))
        assert dict((o.name, o.strategies) for o in after.ops)["cube"][0].kind == "split"
        ptd, report = partition_and_verify(sym, 2, data=(12, 6))
        assert report.ok and not ptd.fallbacks
        assert len(custom_nodes(ptd)) == 2       # one share per device now
    finally:
        unregister("Custom:tofu_test_cube")
    again = tofu_mx.plan(sym, 2, data=(12, 6))
    assert dict((o.name, tuple(map(str, o.strategies))) for o in again.ops)["cube"] == ("whole",)


def test_an_undescribed_custom_operator_reading_no_tensor_runs_once():
    """Placed through no input (it has none), it lands on the bind's default device: it runs
    once, there, not once per device."""
    from tests.tofu_mx.runtime.custom_ops import ramp
    h = mx.sym.FullyConnected(X, num_hidden=8, name="fc1")
    sym = mx.sym.MakeLoss(mx.sym.sum(h * ramp((12, 8), name="ramp")))
    for k in (2, 3):
        ptd, report = partition_and_verify(sym, k, data=(12, 6))
        assert report.ok, report
        assert list(ptd.fallbacks) == ["ramp"] and len(custom_nodes(ptd)) == 1
