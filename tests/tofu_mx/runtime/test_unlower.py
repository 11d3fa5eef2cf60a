"""Un-lowering (tofu_mx.runtime.unlower): a BatchNorm the plan splits on its channels runs as
BatchNorm, moving the same bytes and computing the same values as its lowering."""
import json

import mxnet as mx
import pytest

import tofu_mx
from nnvm_passes.program import StepKind, finished, route
from tests.tofu_mx.runtime.helpers import partition_quietly
from tofu_mx import models
from tofu_mx.runtime.assign import assign
from tofu_mx.runtime.partitioned import apply_plan, runnable_plan
from tofu_mx.runtime.unlower import lowered_groups, moved, unlower
from tofu_mx.search.plan import Plan, SearchOptions, check_plan, lower_graph
from tofu_mx.tdl.annotate import import_graph

CTX = [mx.cpu(0), mx.cpu(1)]


def net(channels):
    x = mx.sym.var("data")
    x = mx.sym.Convolution(x, num_filter=channels, kernel=(3, 3), pad=(1, 1), name="conv0")
    x = mx.sym.BatchNorm(x, fix_gamma=False, name="bn0")
    x = mx.sym.Activation(x, act_type="relu", name="relu0")
    x = mx.sym.Convolution(x, num_filter=channels, kernel=(3, 3), pad=(1, 1), name="conv1")
    x = mx.sym.BatchNorm(x, fix_gamma=False, name="bn1")
    x = mx.sym.Pooling(x, global_pool=True, kernel=(1, 1), pool_type="avg", name="pool")
    return mx.sym.SoftmaxOutput(mx.sym.FullyConnected(x, num_hidden=5, name="fc"),
                                name="softmax")


#: weights outweigh activations: the plan splits channels, so BatchNorm runs whole
WIDE = dict(data=(2, 64, 4, 4), softmax_label=(2,))
#: activations outweigh weights: the plan splits the batch, so BatchNorm stays lowered
DEEP = dict(data=(16, 8, 16, 16), softmax_label=(16,))
F64 = {"data": "float64", "softmax_label": "float64"}


def lowered_parts(shapes, k=2, dtypes=None):
    whole = import_graph(net(shapes["data"][1]), dtypes=dtypes, **shapes)
    graph = lower_graph(whole, k)
    plan, assignment = runnable_plan(graph, k, SearchOptions())
    return whole, graph, plan, assignment, route(graph, assignment)


def test_a_channel_split_batchnorm_runs_as_batchnorm_moving_the_same_bytes():
    whole, graph, plan, assignment, program = lowered_parts(WIDE)
    assert sorted(lowered_groups(whole, graph)) == ["bn0", "bn1"]
    kept, new_plan, new_assignment, new_program = unlower(whole, graph, plan, assignment)
    assert new_plan.unlowered == ("bn0", "bn1")
    assert [n.op for n in kept.operators() if n.name in ("bn0", "bn1")] == ["BatchNorm"] * 2
    assert len(kept.operators()) == len(whole.operators()) < len(graph.operators())
    assert moved(new_program) == moved(program) > 0
    ops = {o.name: o for o in new_plan.ops}
    assert [str(s) for s in ops["bn0"].strategies] == ["split i1"]
    assert new_plan.tensor("bn0:0").layouts == plan.tensor("bn0/out:0").layouts
    assert new_plan.levels == plan.levels and new_plan.fingerprint != plan.fingerprint
    check_plan(new_plan, lower_graph(whole, 2, keep=new_plan.unlowered), 2)
    assert sum(len(devices) for devices in new_program.placement.values()) < \
        sum(len(devices) for devices in program.placement.values())


def test_a_batch_split_batchnorm_stays_lowered():
    whole, graph, plan, assignment, program = lowered_parts(DEEP)
    found = unlower(whole, graph, plan, assignment)
    assert found[0] is graph and found[1] is plan and found[2] is assignment
    assert tofu_mx.partition(net(8), CTX, **DEEP).plan.unlowered == ()


@pytest.mark.parametrize("k", [2, 3, 4])
def test_the_unlowered_partition_computes_what_one_device_computes(k):
    ctx = [mx.cpu(i) for i in range(k)]
    shapes = dict(data=(2, 48, 4, 4), softmax_label=(2,))
    ptd = tofu_mx.partition(net(48), ctx, dtypes=F64, **shapes)
    assert ptd.plan.unlowered                                   # the case under test
    report = tofu_mx.verify(net(48), ptd, ctx, dtypes=F64, **shapes)
    assert {"aux bn0_moving_mean", "aux bn1_moving_var", "grad bn0_gamma"} <= \
        {c.name for c in report.comparisons}
    assert ptd.check().comparisons                              # the self-check lowers alike


def test_the_plan_says_what_it_left_unlowered_and_loads_again():
    ptd = tofu_mx.partition(net(64), CTX, **WIDE)
    text = ptd.plan.to_json()
    assert json.loads(text)["unlowered"] == ["bn0", "bn1"]
    assert "run as themselves, not lowered (split as they split): 2 operator(s): bn0, bn1" \
        in ptd.report()
    again = Plan.from_json(text)
    assert again == ptd.plan
    whole = import_graph(net(64), **WIDE)
    with pytest.raises(tofu_mx.InvalidArgumentError,
                       match=r"runs 2 operator\(s\) unlowered, so lower the graph with "
                             r"lower_graph\(graph, k, keep=plan.unlowered\)"):
        apply_plan(net(64), lower_graph(whole, 2), again, CTX)
    applied = apply_plan(net(64), lower_graph(whole, 2, keep=again.unlowered), again, CTX)
    assert applied.symbol.tojson() == ptd.symbol.tojson()


def test_plans_without_the_field_load_and_bad_values_are_refused():
    d = json.loads(tofu_mx.partition(net(8), CTX, **DEEP).plan.to_json())
    assert "unlowered" not in d                   # written only when something is kept
    assert Plan.from_json(json.dumps(d)).unlowered == ()
    for bad in ("bn0", [1], {"bn0": 1}):
        with pytest.raises(tofu_mx.InvalidArgumentError, match="'unlowered' must be a list"):
            Plan.from_json(json.dumps(dict(d, unlowered=bad)))


def test_an_unlowered_batchnorm_is_one_share_per_device():
    ptd = tofu_mx.partition(net(64), CTX, **WIDE)
    lowered = tofu_mx.plan(net(64), 2, **WIDE)
    assert lowered.unlowered == ()                # the search alone plans the lowered graph
    index = {n.name: i for i, n in enumerate(ptd.graph.nodes)}
    assert ptd.program.placement[index["bn0"]] == (0, 1)
    assert len(ptd.graph.operators()) == 8
    assert assign(ptd.graph, ptd.plan).ops[index["bn0"]].shares[1].outputs[0] == \
        ((0, 1), (32, 63), (0, 3), (0, 3))


@pytest.mark.parametrize("model,shapes,k", [
    ("wresnet", dict(data=(8, 3, 32, 32), softmax_label=(8,)), 3),
    ("rnn", dict(data=(4, 12), softmax_label=(4, 12)), 4),
    ("transformer", dict(data=(4, 8), softmax_label=(4, 8)), 3),
])
def test_route_passes_keep_the_bytes_copied(model, shapes, k):
    """unlower() compares programs as routed, before route's passes (bounded_reads,
    cropped_cuts): the passes change what runs, not the bytes MXNet copies between devices.
    At a gradient-sum cap of 3, so that values read by 3 or more are relayed (on these
    models 130-180 relays), and at k = 3, where the WResNet's and the Transformer's uneven
    cuts are cropped (140-180 crops)."""
    sym = {"wresnet": lambda: models.wresnet(14, 1, 10),
           "rnn": lambda: models.rnn(2, 16, 12, 50),
           "transformer": lambda: models.transformer(2, 16, 2, 8, 30)}[model]()
    ptd = partition_quietly(sym, k, **shapes)
    raw = route(ptd.graph, ptd.assignment, passes=False)
    done = route(ptd.graph, ptd.assignment, cap=3)
    kinds = {step.kind for step in done.steps}
    assert StepKind.RELAY in kinds and StepKind.RELAY not in {s.kind for s in raw.steps}
    assert (StepKind.CROP in kinds) == (model != "rnn")
    assert finished(ptd.graph, raw, cap=3) == done
    assert sorted((c.source, c.device, c.nbytes) for c in raw.crossings()) == \
        sorted((c.source, c.device, c.nbytes) for c in done.crossings())
