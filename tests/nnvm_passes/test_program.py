"""route() on hand-built assignments: the steps each device runs, the moves between them and
their bytes; emit() of those programs runs in MXNet and computes the unpartitioned result.
(Whole-model equivalence of route + emit is tested everywhere partition() is.)"""
import mxnet as mx
import numpy as np

from nnvm_passes.emit import emit
from nnvm_passes.exporter import symbol_from_json
from nnvm_passes.ir import FrozenDict
from nnvm_passes.program import Account, Combine, Purpose, Ref, StepKind, route
from tofu_mx.runtime.assign import Assignment, OpAssignment, Share
from tofu_mx.tdl.annotate import import_graph

ROWS0, ROWS1 = ((0, 1), (0, 2)), ((2, 3), (0, 2))


def run(program, arrays, k=2):
    """Bind the emitted graph on k CPU devices, every shard cut from ``arrays``; outputs."""
    result = emit(program)
    sym = symbol_from_json(result.json)
    args = {s.name: mx.nd.array(arrays[s.source][s.slices], dtype="float64",
                                ctx=mx.cpu(s.device)) for s in result.shards}
    exe = sym.bind(mx.cpu(0), args, group2ctx={f"dev{d}": mx.cpu(d) for d in range(k)})
    return [o.asnumpy() for o in exe.forward()], result


def relu_program():
    """relu over 2 devices, each its half of the batch; the output joined on device 0."""
    graph = import_graph(mx.sym.relu(mx.sym.var("data"), name="act"), data=(4, 3),
                         dtypes={"data": "float64"})
    shares = tuple(Share(FrozenDict(), (box,), (None,), (box,), None, (0,))
                   for box in (ROWS0, ROWS1))
    assignment = Assignment(2, {1: OpAssignment(shares)},
                            {(0, 0): (ROWS0, ROWS1), (1, 0): (ROWS0, ROWS1)})
    return graph, route(graph, assignment)


def test_a_batch_split_operator_runs_a_share_per_device_and_joins_on_device_0():
    graph, program = relu_program()
    assert [(s.kind, s.device) for s in program.steps] == [
        (StepKind.VARIABLE, 0), (StepKind.SHARE, 0), (StepKind.VARIABLE, 1),
        (StepKind.SHARE, 1), (StepKind.STACK, 0)]
    assert program.heads == (Ref(4),) and program.placement == {1: (0, 1)}
    assert [(s.name, s.box) for s in program.shards] == [("data@dev0", ROWS0),
                                                        ("data@dev1", ROWS1)]
    (crossing,) = program.crossings()       # device 1's half of the output, 2 x 3 float64
    assert (crossing.ref, crossing.source, crossing.device, crossing.nbytes) == \
        (Ref(3), 1, 0, 48)
    assert crossing.account == Account(Purpose.OUTPUT, 0)
    assert program.steps_per_device() == [{StepKind.SHARE: 1, StepKind.STACK: 1},
                                          {StepKind.SHARE: 1}]
    x = np.random.RandomState(0).randn(4, 3)
    (out,), result = run(program, {"data": x})
    assert np.array_equal(out, np.maximum(x, 0))
    assert result.counts == {"concat": 1, "operator": 2}
    assert [n["op"] for n in result.json["nodes"]] == ["null", "relu", "null", "relu", "stack",
                                                       "Reshape"]


def fc_program():
    """FullyConnected split on its reduction: each device reads half the input features and
    makes a partial sum of the whole output, stored in halves of its rows."""
    sym = mx.sym.FullyConnected(mx.sym.var("data"), mx.sym.var("weight"), num_hidden=5,
                                no_bias=True, name="fc")
    graph = import_graph(sym, data=(4, 6), weight=(5, 6),
                         dtypes={"data": "float64", "weight": "float64"})
    cols = [((0, 3), (0, 2)), ((0, 3), (3, 5))]
    wcols = [((0, 4), (0, 2)), ((0, 4), (3, 5))]
    out_rows = [((0, 1), (0, 4)), ((2, 3), (0, 4))]
    whole = ((0, 3), (0, 4))
    shares = tuple(Share(FrozenDict(num_hidden="5", no_bias="True"), (c, w), (None, None),
                         (whole,), "sum", (0,)) for c, w in zip(cols, wcols))
    fc = graph.index("fc")
    stored = {(graph.index("data"), 0): tuple(cols), (graph.index("weight"), 0): tuple(wcols),
              (fc, 0): tuple(out_rows)}
    return graph, route(graph, Assignment(2, {fc: OpAssignment(shares)}, stored))


def test_partial_sums_are_cut_where_they_are_made_and_combined_where_they_are_stored():
    graph, program = fc_program()
    kinds = [(s.kind, s.device) for s in program.steps]
    assert kinds.count((StepKind.SHARE, 0)) == kinds.count((StepKind.SHARE, 1)) == 1
    combines = [s for s in program.steps if s.kind is StepKind.COMBINE]
    assert [(s.device, s.combine) for s in combines] == [(0, Combine.SUM), (1, Combine.SUM)]
    slices = [s for s in program.steps if s.kind is StepKind.SLICE]
    assert [(s.device, s.axis, s.parts) for s in slices] == [(0, 0, 2), (1, 0, 2)]
    assert [h.shape for s in slices for h in s.outputs] == [(2, 5)] * 4
    # device 1's sum is read on device 0: a SEND on device 1 (its gradient is summed there)
    (send,) = [s for s in program.steps if s.kind is StepKind.SEND]
    assert (send.device, send.to) == (1, 0)
    crossings = program.crossings()
    fc = graph.index("fc")
    assert sorted((c.source, c.device, c.nbytes, c.account.purpose.value) for c in crossings) == [
        (0, 1, 80, "combine"), (1, 0, 80, "combine"), (1, 0, 80, "output")]
    assert {c.account.node for c in crossings if c.account.purpose is Purpose.COMBINE} == {fc}
    rng = np.random.RandomState(1)
    x, w = rng.randn(4, 6), rng.randn(5, 6)
    (out,), result = run(program, {"data": x, "weight": w})
    assert np.allclose(out, x @ w.T, rtol=1e-12, atol=1e-12)
    assert result.counts == {"combine": 2, "concat": 1, "operator": 2, "send": 1, "split": 2}


def test_a_program_and_its_graph_are_the_same_whatever_the_order_asked():
    """emit(ordered=True) adds control dependencies only: the same nodes, the same result."""
    _, program = fc_program()
    plain, ordered = emit(program), emit(program, ordered=True)
    strip = [{k: v for k, v in n.items() if k != "control_deps"} for n in ordered.json["nodes"]]
    assert strip == plain.json["nodes"]
    (share,) = [n for n in ordered.json["nodes"] if n["op"] == "FullyConnected"][1:]
    assert "control_deps" not in share         # one operator: nothing before it


def test_routing_is_deterministic():
    """The same graph and assignment give the same program, step for step."""
    assert fc_program()[1] == fc_program()[1]
