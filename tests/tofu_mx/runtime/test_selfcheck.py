"""partition(check=True) and PartitionedSymbol.check(): the plan checked on a small copy of
the user's own model, with the same strategies, before training with it."""
import dataclasses

import mxnet as mx
import pytest

import tofu_mx
from tofu_mx.runtime.selfcheck import same_strategies, small_shapes
from tofu_mx.search.plan import lower_graph, plan_graph
from tofu_mx.tdl import registry
from tofu_mx.tdl.annotate import import_graph


def regression():
    """FullyConnected(5) -> LinearRegressionOutput at batch 2 over 3 devices: the label splits
    on its second axis."""
    y = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=5, name="fc")
    return mx.sym.LinearRegressionOutput(y, mx.sym.var("label"), name="lro")


def test_small_shapes_cut_the_common_first_axis():
    assert small_shapes({"data": (32, 3, 8), "label": (32,), "state": (2, 32, 4)}, 4) == \
        {"data": (4, 3, 8), "label": (4,), "state": (2, 32, 4)}
    assert small_shapes({"data": (3, 5)}, 8) == {"data": (3, 5)}


def test_check_passes_on_a_right_partition_and_keeps_the_strategies():
    ctx = [mx.cpu(i) for i in range(3)]
    ptd = tofu_mx.partition(regression(), ctx, data=(12, 8), label=(12, 5), check=True)
    report = ptd.check(batch=3)
    assert report.ok and report.devices == ("cpu(0)", "cpu(1)", "cpu(2)")
    graph = lower_graph(import_graph(regression(), data=(3, 8), label=(3, 5)), 3)
    small = plan_graph(graph, 3, choose=same_strategies(ptd.plan), factors=ptd.plan.factors)
    assert [str(o.strategies[0]) for o in small.ops] == \
        [str(o.strategies[0]) for o in ptd.plan.ops]


def test_check_catches_a_wrong_partition(monkeypatch):
    """Without its gradient rescaling (the bug LSTNet met), the regression head's shares are
    wrong when the label splits: the check says so before any training."""
    real = registry.lookup("LinearRegressionOutput")
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry._store("LinearRegressionOutput", dataclasses.replace(real, shard=None))
    try:
        with pytest.raises(tofu_mx.VerificationError, match="grad"):
            tofu_mx.partition(regression(), [mx.cpu(i) for i in range(3)], data=(2, 8),
                              label=(2, 5), check=True)
    finally:
        registry._store("LinearRegressionOutput", real)


def test_check_runs_a_float32_only_model_in_its_own_dtype():
    """InstanceNorm has no float64 kernel: the copy runs in float32 (here against itself:
    MXNet cannot make a float64 oracle of it either)."""
    h = mx.sym.InstanceNorm(mx.sym.Convolution(mx.sym.var("data"), num_filter=4, kernel=(3, 3),
                                               pad=(1, 1), name="conv"), name="norm")
    sym = mx.sym.MakeLoss(mx.sym.sum(mx.sym.square(h)))
    ptd = tofu_mx.partition(sym, [mx.cpu(0), mx.cpu(1)], data=(8, 3, 6, 6))
    assert ptd.check().ok


def test_bad_batch():
    ptd = tofu_mx.partition(regression(), [mx.cpu(0), mx.cpu(1)], data=(4, 8), label=(4, 5))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="batch"):
        ptd.check(batch=0)


def test_check_runs_a_float32_gluon_model_in_float64():
    """Gluon pins its weights' dtype (float32) in the symbol: the copy is cast to float64 as
    a whole, so the check judges it in float64, not against a float32 reference."""
    from mxnet import gluon
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Dense(3))
    net.initialize()
    net.hybridize()
    sym = mx.sym.MakeLoss(mx.sym.sum(mx.sym.square(net(mx.sym.var("data")))))
    ptd = tofu_mx.partition(sym, [mx.cpu(i) for i in range(4)], data=(16, 3, 8, 8))
    report = ptd.check()
    assert report.ok and report.oracle is None


def test_a_partitioned_graph_mxnet_refuses_is_an_internal_error_naming_the_operator(
        monkeypatch):
    """partition() infers the rewritten graph's shapes and dtypes before returning it: one
    that MXNet refuses (here, a share given a wrong attribute) is reported, not returned."""
    from nnvm_passes.emit import emit as real

    def broken(program, ordered=False):
        result = real(program, ordered)
        for node in result.json["nodes"]:
            if node["op"] == "FullyConnected":
                node["attrs"]["num_hidden"] = "7"
        return result
    monkeypatch.setattr("tofu_mx.runtime.partitioned.emit", broken)
    with pytest.raises(tofu_mx.TofuError, match="internal: MXNet refuses the partitioned "
                                                "graph.*fc"):
        tofu_mx.partition(regression(), [mx.cpu(0), mx.cpu(1)], data=(4, 8), label=(4, 5))
