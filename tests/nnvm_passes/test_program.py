"""route() on hand-built assignments: the steps each device runs, the moves between them and
their bytes; emit() of those programs runs in MXNet and computes the unpartitioned result.
(Whole-model equivalence of route + emit is tested everywhere partition() is.)"""
import dataclasses
import json

import mxnet as mx
import numpy as np
import pytest

from nnvm_passes.emit import DISTINCT, emit
from nnvm_passes.exporter import symbol_from_json
from nnvm_passes.ir import FrozenDict
from nnvm_passes.program import (Account, Combine, Held, Program, Purpose, Ref, Step,
                                 StepKind, VarShard, bounded_reads, cropped_cuts,
                                 inplace_sum_cap, route)
from tofu_mx.errors import TofuError
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
    assert [n["op"] for n in result.json["nodes"]] == ["null", "relu", "null", "relu",
                                                       "_npi_concatenate"]


def test_pieces_are_joined_by_one_node_but_along_the_last_axis():
    """One _npi_concatenate along axis 0, along an inner axis with axes after it, and along
    the last axis after only axes of size 1; along the last axis after a larger one,
    stack + Reshape (MXNet's concatenation there is about twice as slow on CPU)."""
    for shape, box_of, op in [((4, 3), lambda d: ((2 * d, 2 * d + 1), (0, 2)), "_npi_concatenate"),
                              ((1, 4, 3), lambda d: ((0, 0), (2 * d, 2 * d + 1), (0, 2)),
                               "_npi_concatenate"),
                              ((2, 4, 3), lambda d: ((0, 1), (2 * d, 2 * d + 1), (0, 2)),
                               "_npi_concatenate"),
                              ((1, 3, 4), lambda d: ((0, 0), (0, 2), (2 * d, 2 * d + 1)),
                               "stack"),
                              ((3, 4), lambda d: ((0, 2), (2 * d, 2 * d + 1)), "stack")]:
        graph = import_graph(mx.sym.relu(mx.sym.var("data"), name="act"), data=shape,
                             dtypes={"data": "float64"})
        boxes = tuple(box_of(d) for d in range(2))
        shares = tuple(Share(FrozenDict(), (b,), (None,), (b,), None, (d,))
                       for d, b in enumerate(boxes))
        program = route(graph, Assignment(2, {1: OpAssignment(shares)},
                                          {(0, 0): boxes, (1, 0): boxes}))
        x = np.random.RandomState(0).randn(*shape)
        (out,), result = run(program, {"data": x})
        assert np.array_equal(out, np.maximum(x, 0))
        ops = [n["op"] for n in result.json["nodes"][4:]]
        assert ops == ([op] if op != "stack" else ["stack", "Reshape"]), shape


@pytest.mark.parametrize("kind", [StepKind.SPLIT, StepKind.SLICE])
def test_a_cut_of_which_one_piece_is_read_copies_that_piece_alone(kind):
    """A SPLIT or SLICE whose one piece is read (a convolution's halo rows) becomes a CROP,
    one slice_axis of that piece; with both read, it stays one _split_v2 / SliceChannel."""
    whole = ((0, 3), (0, 2))
    shard = VarShard("data", "data", "data", 0, whole, "float64")
    cut = dict(cuts=(0, 1)) if kind is StepKind.SPLIT else dict(parts=2)
    rows = [(1, 3), (3, 3)] if kind is StepKind.SPLIT else [(2, 3), (2, 3)]
    steps = (Step(StepKind.VARIABLE, 0, (), (Held((0, 0), (4, 3), "float64"),), None, "data",
                  node=0, shard=shard),
             Step(kind, 0, (Ref(0),), tuple(Held((0, 0), r, "float64") for r in rows), None,
                  "@split0", axis=0, **cut))
    x = np.random.RandomState(3).randn(4, 3)
    pieces = np.split(x, [1]) if kind is StepKind.SPLIT else np.split(x, 2)
    for heads, kinds, ops in [
            ((Ref(1, 1),), [StepKind.CROP], ["slice_axis"]),
            ((Ref(1, 0), Ref(1, 1)), [kind], ["_split_v2" if kind is StepKind.SPLIT
                                              else "SliceChannel"])]:
        program = cropped_cuts(Program(steps, heads, 1, {}))
        assert [s.kind for s in program.steps[1:]] == kinds
        outs, result = run(program, {"data": x}, k=1)
        assert [n["op"] for n in result.json["nodes"][1:]] == ops
        assert all(np.array_equal(o, pieces[h.output]) for o, h in zip(outs, heads))


def cut_chain(again=(False, False), devices=(0, 0), also_read=False):
    """A (6, 5) variable cut into rows 1..4 (a SPLIT into three pieces, the middle one
    read), then those rows into columns 3..4 (a SPLIT at 3, the second piece read), as
    routing cuts a box out of a stored one axis by axis; ``also_read``: the rows are also
    an output."""
    shard = VarShard("data", "data", "data", 0, ((0, 5), (0, 4)), "float64")
    held = lambda shape: Held((0, 0), shape, "float64")   # noqa: E731
    steps = (Step(StepKind.VARIABLE, 0, (), (held((6, 5)),), None, "data", node=0,
                  shard=shard),
             Step(StepKind.SPLIT, devices[0], (Ref(0),), (held((1, 5)), held((4, 5)),
                                                          held((1, 5))),
                  None, "@split0", again=again[0], axis=0, cuts=(0, 1, 5)),
             Step(StepKind.SPLIT, devices[1], (Ref(1, 1),), (held((4, 3)), held((4, 2))),
                  None, "@split1", again=again[1], axis=1, cuts=(0, 3)))
    heads = (Ref(2, 1),) + ((Ref(1, 1),) if also_read else ())
    return Program(steps, heads, max(devices) + 1, {})


def test_a_chain_of_cuts_each_with_one_piece_read_is_one_slice():
    """Rows, then columns: one CROP of both, emitted as one ``slice``, computing the piece."""
    program = cropped_cuts(cut_chain())
    assert [s.kind for s in program.steps] == [StepKind.VARIABLE, StepKind.CROP]
    assert program.steps[1].region == ((1, 4), (3, 4)) and program.heads == (Ref(1),)
    assert program.steps[1].inputs == (Ref(0),)
    x = np.random.RandomState(5).randn(6, 5)
    (out,), result = run(program, {"data": x}, k=1)
    assert [n["op"] for n in result.json["nodes"][1:]] == ["slice"]
    assert np.array_equal(out, x[1:5, 3:5])


@pytest.mark.parametrize("case", [dict(also_read=True), dict(again=(True, False)),
                                  dict(devices=(0, 1))])
def test_a_chain_stays_two_crops_where_the_first_is_read_elsewhere_marked_or_moved(case):
    """The first cut's piece also an output, only one cut built again in the backward pass
    (its MXNet node marked to run again), or the second cut on another device: two CROPs,
    each still cutting its one axis, and the results the same."""
    program = cropped_cuts(cut_chain(**case))
    assert [s.kind for s in program.steps] == [StepKind.VARIABLE, StepKind.CROP,
                                                StepKind.CROP]
    assert [s.region for s in program.steps[1:]] == [((1, 4), (0, 4)), ((0, 3), (3, 4))]
    x = np.random.RandomState(6).randn(6, 5)
    outs, result = run(program, {"data": x}, k=program.num_devices)
    assert [n["op"] for n in result.json["nodes"][1:]] == ["slice_axis", "slice_axis"]
    assert np.array_equal(outs[0], x[1:5, 3:5])
    if case.get("also_read"):
        assert np.array_equal(outs[1], x[1:5])


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


def slice_channel_program(data_cells):
    """SliceChannel of a (4, 6) variable into 2 pieces of 3 columns, each device its half of
    the batch (whole pieces: the share may run or be read as views), the variable stored in
    ``data_cells``; both outputs joined on device 0."""
    sym = mx.sym.SliceChannel(mx.sym.var("data"), num_outputs=2, axis=1, name="sc")
    graph = import_graph(sym, data=(4, 6), dtypes={"data": "float64"})
    sc = graph.index("sc")
    shares = tuple(Share(FrozenDict(num_outputs="2", axis="1"), ((rows, (0, 5)),), (None,),
                         ((rows, (0, 2)), (rows, (0, 2))), None, (d,),
                         views=((rows, (0, 2)), (rows, (3, 5))), runs=True)
                   for d, rows in enumerate(((0, 1), (2, 3))))
    halves = (ROWS0, ROWS1)
    stored = {(graph.index("data"), 0): data_cells, (sc, 0): halves, (sc, 1): halves}
    return graph, route(graph, Assignment(2, {sc: OpAssignment(shares)}, stored))


def test_whole_pieces_lying_in_different_devices_parts_are_cut_out_not_joined_and_cut():
    x = np.random.RandomState(2).randn(4, 6)
    by_columns = (((0, 3), (0, 2)), ((0, 3), (3, 5)))     # each piece in one device's part
    graph, program = slice_channel_program(by_columns)
    kinds = [s.kind for s in program.steps]
    assert StepKind.SHARE not in kinds            # read as views: no SliceChannel of a join
    assert [(s.device, s.axis, s.parts) for s in program.steps if s.kind is StepKind.SLICE] \
        == [(0, 0, 2), (1, 0, 2)]                  # each part cut in rows where it lives
    outs, _ = run(program, {"data": x})
    assert all(np.array_equal(o, w) for o, w in zip(outs, np.split(x, 2, axis=1)))
    # the same pieces in one device's part (rows stored): the operator runs, nothing joined
    graph, program = slice_channel_program((((0, 1), (0, 5)), ((2, 3), (0, 5))))
    shares = [s for s in program.steps if s.kind is StepKind.SHARE]
    assert [(s.device, s.op) for s in shares] == [(0, "SliceChannel"), (1, "SliceChannel")]
    outs, _ = run(program, {"data": x})
    assert all(np.array_equal(o, w) for o, w in zip(outs, np.split(x, 2, axis=1)))


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


def fan_program(readers_per_device, k=2, sends=False):
    """``v = FullyConnected(x, w)`` on device 0, read by ``tanh`` shares on every device
    (``readers_per_device[d]`` of them on device d), summed on device 0 into a loss: a
    value read many times, on several devices, as an unrolled RNN's weights are.
    ``sends``: the readers on other devices read it through a SEND each (as a variable's)."""
    f64 = "float64"
    x = Held(None, (4, 5), f64)
    w = Held(None, (6, 5), f64)
    v = Held(None, (4, 6), f64)
    steps = [Step(StepKind.VARIABLE, 0, (), (x,), None, "x", node=0, shard=VarShard(
                 "x", "x", "data", 0, ((0, 3), (0, 4)), f64)),
             Step(StepKind.VARIABLE, 0, (), (w,), None, "w", node=1, shard=VarShard(
                 "w", "w", "param", 0, ((0, 5), (0, 4)), f64)),
             Step(StepKind.SHARE, 0, (Ref(0), Ref(1)), (v,), None, "v", node=2,
                  op="FullyConnected", attrs=FrozenDict(num_hidden="6", no_bias="True"),
                  reads=(0, 1))]
    outs = []
    for d, n in enumerate(readers_per_device):
        source = Ref(2)
        if sends and d:
            steps.append(Step(StepKind.SEND, 0, (Ref(2),), (v,), None, f"@to{d}", to=d))
            source = Ref(len(steps) - 1)
        for j in range(n):
            steps.append(Step(StepKind.SHARE, d, (source,), (v,), None, f"t{d}_{j}",
                              node=3 + len(outs), op="tanh", reads=(0,)))
            outs.append(Ref(len(steps) - 1))
    node = 3 + len(outs)
    steps.append(Step(StepKind.SHARE, 0, tuple(outs), (v,), None, "total", node=node,
                      op="add_n", attrs=FrozenDict(num_args=str(len(outs))),
                      reads=tuple(range(len(outs)))))
    steps.append(Step(StepKind.SHARE, 0, (Ref(len(steps) - 1),), (v,), None, "loss",
                      node=node + 1, op="MakeLoss", reads=(0,)))
    return Program(tuple(steps), (Ref(len(steps) - 1),), k, {})


def gradients(program, k):
    result = emit(program)
    sym = symbol_from_json(result.json)
    rng = np.random.RandomState(0)
    arrays = {"x": rng.randn(4, 5), "w": rng.randn(6, 5)}
    args = {s.name: mx.nd.array(arrays[s.source], dtype="float64", ctx=mx.cpu(s.device))
            for s in result.shards}
    grads = {name: mx.nd.zeros_like(a) for name, a in args.items()}
    exe = sym.bind(mx.cpu(0), args, args_grad=grads,
                   group2ctx={f"dev{d}": mx.cpu(d) for d in range(k)})
    exe.forward(is_train=True)
    exe.backward()
    return {name: g.asnumpy() for name, g in grads.items()}


def reads(program):
    count = {}
    for step in program.steps:
        for ref in step.inputs:
            count[ref] = count.get(ref, 0) + 1
    for ref in program.heads:
        count[ref] = count.get(ref, 0) + 1
    return count


@pytest.mark.parametrize("readers", [(10, 10), (0, 20), (3, 9, 9), (1, 8, 1, 8, 1, 8, 1, 8, 1)])
def test_a_value_read_many_times_is_read_through_relays_and_its_gradient_is_right(readers):
    """MXNet adds 8 or more gradient pieces with a chain of in-place adds, wrong when they
    come from several devices (test_gradient_sums.py): every value is read fewer than
    MXNet's cap times, the bytes crossing devices do not change, and the gradients are the
    one-device ones under the cap this process runs with."""
    k, cap = len(readers), inplace_sum_cap()
    program = fan_program(readers, k)
    bounded = bounded_reads(program, cap)
    assert max(reads(program).values()) >= cap > max(reads(bounded).values())
    relays = [s for s in bounded.steps if s.kind is StepKind.RELAY]
    assert relays and len(bounded.steps) == len(program.steps) + len(relays)
    # every share reads what it read, through relays on its own device or one per device
    crossed = sorted((c.source, c.device, c.nbytes) for c in program.crossings())
    assert sorted((c.source, c.device, c.nbytes) for c in bounded.crossings()) == crossed
    assert [s for s in bounded.steps if s.kind is not StepKind.RELAY] == [
        dataclasses.replace(s, inputs=s2.inputs) for s, s2 in zip(
            program.steps, [s for s in bounded.steps if s.kind is not StepKind.RELAY])]
    one = dataclasses.replace(program, steps=tuple(dataclasses.replace(s, device=0)
                                                   for s in program.steps), num_devices=1)
    want, got = gradients(one, 1), gradients(bounded, k)
    assert want.keys() == got.keys()
    for name in want:
        assert np.allclose(got[name], want[name], rtol=1e-12, atol=1e-12), name


def test_copies_of_one_value_on_one_device_stay_apart_in_mxnet():
    """MXNet's common-expression elimination merges nodes of one operator, inputs and
    attributes: the relays (and the SENDs to each device) are told apart by an attribute,
    or MXNet would make them one node read by all their readers again."""
    result = emit(bounded_reads(fan_program((0, 20, 20), 3), 8))
    seen = set()
    for node in result.json["nodes"]:
        if node["op"] != "null":
            key = (node["op"], json.dumps(node["inputs"]), json.dumps(node["attrs"],
                                                                        sort_keys=True))
            assert key not in seen, node["name"]
            seen.add(key)


def test_a_value_read_below_the_cap_is_left_alone_and_a_cap_below_3_is_refused():
    program = fan_program((3, 3))
    assert bounded_reads(program, 8) is program
    graph, _ = relu_program()
    shares = tuple(Share(FrozenDict(), (box,), (None,), (box,), None, (0,))
                   for box in (ROWS0, ROWS1))
    assignment = Assignment(2, {1: OpAssignment(shares)},
                            {(0, 0): (ROWS0, ROWS1), (1, 0): (ROWS0, ROWS1)})
    with pytest.raises(TofuError, match="MXNET_EXEC_INPLACE_GRAD_SUM_CAP=2.*3 or more"):
        route(graph, assignment, cap=2)


@pytest.mark.parametrize("value, cap", [(None, 8), ("12", 12), (" 5 ", 5), ("0", 0),
                                        ("many", 8)])
def test_the_cap_is_read_as_mxnet_reads_it(monkeypatch, value, cap):
    """Unset: MXNet's default, 8. ``0`` is a cap of 0 for MXNet (every sum in place), which
    a partitioned graph refuses, not MXNet's default."""
    if value is None:
        monkeypatch.delenv("MXNET_EXEC_INPLACE_GRAD_SUM_CAP", raising=False)
    else:
        monkeypatch.setenv("MXNET_EXEC_INPLACE_GRAD_SUM_CAP", value)
    assert inplace_sum_cap() == cap


def test_a_value_read_many_times_where_it_is_made_keeps_mxnets_in_place_sum():
    """Read 20 times on its own device by operators making their gradient pieces there (an
    unrolled RNN's weights), the value keeps its readers: MXNet adds the pieces in place, on
    one device, which frees each as it is added; the gradients are right. The same readers
    with one on another device are read through relays."""
    cap = inplace_sum_cap()
    own = lambda step: step.kind is StepKind.SHARE and step.op == "tanh"   # noqa: E731
    program = fan_program((20, 0))
    assert bounded_reads(program, cap, own) is program
    want, got = gradients(dataclasses.replace(program, num_devices=1), 1), gradients(program, 2)
    for name in want:
        assert np.allclose(got[name], want[name], rtol=1e-12, atol=1e-12), name
    mixed = bounded_reads(fan_program((19, 1)), cap, own)
    assert any(s.kind is StepKind.RELAY for s in mixed.steps)
    assert max(reads(mixed).values()) < cap


def test_the_sends_of_one_value_are_counted_together_as_mxnet_merges_them():
    """The SENDs of one value to several devices are alike, and MXNet makes them one node:
    three devices reading 3 times each are 9 reads of one copy, read through relays."""
    k, cap = 4, inplace_sum_cap()
    program = fan_program((0, 3, 3, 3), k, sends=True)
    assert max(reads(program).values()) < cap <= 9
    bounded = bounded_reads(program, cap)
    assert any(s.kind is StepKind.RELAY for s in bounded.steps)
    copies = [n for n in emit(bounded).json["nodes"] if n["op"] == "_copy"
              and DISTINCT not in n["attrs"] and n["attrs"]["__ctx_group__"] == "dev0"]
    assert len(copies) == 3          # the SENDs: alike, so one node in MXNet
    one = dataclasses.replace(program, steps=tuple(dataclasses.replace(s, device=0)
                                                   for s in program.steps), num_devices=1)
    want, got = gradients(one, 1), gradients(bounded, k)
    for name in want:
        assert np.allclose(got[name], want[name], rtol=1e-12, atol=1e-12), name
