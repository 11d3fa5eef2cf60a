"""partition(..., join_outputs=False): each output returned as the pieces the plan stores it
in, on their devices, instead of joined whole on device 0. Verified in float64 against one
device (outputs joined, every gradient with random head gradients split into the pieces),
and the memory device 0 no longer holds."""
import warnings

import mxnet as mx
import numpy as np
import pytest

import tofu_mx
from nnvm_passes.program import route
from tofu_mx import models
from tests.tofu_mx.runtime.helpers import float64, partition_and_verify
from tests.tofu_mx.runtime.test_fuzz import random_graph
from tests.tofu_mx.runtime.test_unread_shares import half_used


def devices(k):
    return [mx.cpu(i) for i in range(k)]


def without_loss(seed):
    """A fuzzed graph with its loss head taken off: its outputs' head gradients matter."""
    sym, k, shapes = random_graph(seed)
    body = sym.get_children()[0]
    return body, k, {n: s for n, s in shapes.items() if n in body.list_arguments()}


@pytest.mark.parametrize("seed", [pytest.param(s, marks=() if s < 40 else pytest.mark.slow)
                                  for s in range(200)], ids=lambda s: f"seed_{s}")
def test_fuzzed_graphs_return_pieces_that_join_to_the_outputs(seed):
    sym, k, shapes = without_loss(seed)
    ptd, report = partition_and_verify(sym, k, pieces=True, **shapes)
    assert report.ok, f"seed {seed}, k={k}: {report}"
    covered = {}        # every element of every output in exactly one piece
    for out, where in ptd.output_pieces:
        mark = covered.setdefault(out, np.zeros(ptd.graph.output_infos[out].shape, int))
        mark[where] += 1
    assert sorted(covered) == list(range(len(ptd.graph.output_infos)))
    assert all((m == 1).all() for m in covered.values())


@pytest.mark.parametrize("name,build,shapes", [
    ("transformer", lambda: models.transformer(2, 64, 4, 8, 50),
     models.input_shapes("transformer", 8, seq_len=8)),
    ("rnn", lambda: models.rnn(2, 32, 3, 40), models.input_shapes("rnn", 8, seq_len=3)),
    ("wresnet", lambda: models.wresnet(14, 1, 10),
     models.input_shapes("wresnet", 8, image_size=16)),
    ("unread cells", lambda: half_used()[0], half_used()[1])])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_the_builders_return_pieces(name, build, shapes, k):
    """(The language models in float32 against a float64 oracle, as their Embedding is
    float32; a net with unread weight cells, whose zero is added to a piece.)"""
    floats = name in ("wresnet", "unread cells")
    ptd, report = partition_and_verify(build(), k, pieces=True,
                                       dtypes=None if floats else {},
                                       oracle=None if floats else "float64", **shapes)
    assert report.ok, report
    # each piece on a device that stores it; none joined on device 0
    stored = ptd.assignment.stored
    for ref, (out, where) in zip(ptd.program.heads, ptd.program.pieces):
        entry = ptd.graph.heads[out]
        device = ptd.program.steps[ref.step].device
        box = tuple((s.start, s.stop - 1) for s in ptd.output_pieces[
            ptd.program.pieces.index((out, where))][1])
        assert stored[(entry.node, entry.index)][device] == box


def test_device_0_no_longer_holds_the_whole_output():
    """A language model's probabilities (batch x steps, vocabulary) split over 4 devices:
    joined, device 0 plans a whole copy and the remote pieces' copies; as pieces, it holds
    what the others do, as MXNet would plan it (planned_memory()). The others hold at most
    their piece more: an output's buffer is never reused for another value."""
    sym, shapes = models.transformer(2, 64, 4, 16, 2000), \
        models.input_shapes("transformer", 8, seq_len=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joined = tofu_mx.partition(sym, devices(4), **shapes)
    pieces = joined.with_output_pieces()
    assert joined.output_pieces is None and pieces.output_pieces is not None
    assert "outputs returned as the pieces the plan stores (join_outputs=False): 4 piece(s) " \
        "of 1 output(s)" in pieces.report() and "join_outputs=False" not in joined.report()
    probabilities = 8 * 16 * 2000 * 4
    before, after = joined.planned_memory(), pieces.planned_memory()
    assert before[0] - after[0] >= probabilities // 2
    assert after[0] <= 1.05 * max(after[1:]) and before[0] > 1.15 * max(before[1:])
    assert max(after) < max(before)
    assert all(a <= b + probabilities // 4 + 4096 for a, b in zip(after[1:], before[1:]))
    # the operators the join took are gone from device 0
    assert pieces.operators_per_device()[0] < joined.operators_per_device()[0]


def test_bound_pieces_join_and_take_head_gradients():
    """What a user of the executor does: forward, join the pieces (equal to the joined
    partition's outputs), backward with whole head gradients split by head_gradients."""
    x = mx.sym.var("data")
    h = mx.sym.FullyConnected(x, num_hidden=12, name="fc1")
    out = mx.sym.Group([mx.sym.FullyConnected(mx.sym.tanh(h), num_hidden=6, name="fc2"), h])
    shapes = dict(data=(8, 10))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joined = tofu_mx.partition(out, devices(3), dtypes=float64(shapes), **shapes)
        pieces = tofu_mx.partition(out, devices(3), dtypes=float64(shapes), join_outputs=False,
                                   **shapes)
    rng = np.random.default_rng(0)
    args = {n: rng.standard_normal(s) for n, s in zip(
        out.list_arguments(), out.infer_shape(**shapes)[0])}
    heads = [rng.standard_normal(t.shape) for t in joined.graph.output_infos]
    results = []
    for ptd in (joined, pieces):
        exe = ptd.simple_bind(grad_req={n: "write" for n in args if n != "data"})
        ptd.set_params({n: v for n, v in args.items() if n != "data"})
        for s in ptd.shards:
            if s.source == "data":
                exe.arg_dict[s.name][:] = args["data"][s.slices]
        exe.forward(is_train=True)
        grads = ptd.head_gradients([mx.nd.array(g, dtype="float64") for g in heads])
        assert [g.context for g in grads] == [o.context for o in exe.outputs]
        exe.backward(out_grads=grads)
        outs = [o.asnumpy() for o in ptd.join_outputs(exe.outputs)]
        weights = ptd.merge_params({s.name: exe.grad_dict[s.name] for s in ptd.shards
                                    if s.kind == "param"})
        results.append((outs, {k: v.asnumpy() for k, v in weights[0].items()}))
    assert len(pieces.output_pieces) > 2 and len(joined.symbol.list_outputs()) == 2
    for a, b in zip(results[0][0], results[1][0]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    for name in results[0][1]:
        np.testing.assert_allclose(results[0][1][name], results[1][1][name], rtol=1e-12,
                                   atol=1e-12)
    with pytest.raises(tofu_mx.InvalidArgumentError, match="takes the .* outputs"):
        pieces.join_outputs(exe.outputs[:1])
    with pytest.raises(tofu_mx.InvalidArgumentError, match="one gradient per output"):
        pieces.head_gradients(heads[:1])
    with pytest.raises(tofu_mx.InvalidArgumentError, match="join_outputs"):
        tofu_mx.partition(out, devices(2), join_outputs="no", **shapes)


def test_route_returns_each_stored_piece_once():
    """route(..., join_outputs=False) on the assignment of a joined partition: its heads are
    the output's stored pieces (one per distinct box, replicas once), in the plan's cells."""
    sym, shapes = half_used()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ptd = tofu_mx.partition(sym, devices(4), **shapes)
    program = route(ptd.graph, ptd.assignment, join_outputs=False)
    t = (ptd.graph.heads[0].node, ptd.graph.heads[0].index)
    boxes = set(ptd.assignment.stored[t])
    assert sorted(box for _, box in program.pieces) == sorted(boxes)
    assert route(ptd.graph, ptd.assignment).pieces == ()


def test_pieces_keep_the_routing_through_groups():
    """A partition routed through groups of 4 (machine='s relayed reads) returns its pieces
    routed alike."""
    from tofu_mx.runtime.partitioned import _routed
    sym, shapes = models.rnn(2, 32, 3, 40), models.input_shapes("rnn", 16, seq_len=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        relayed = _routed(tofu_mx.partition(sym, devices(8), **shapes), 4)
    pieces = relayed.with_output_pieces()
    assert pieces.program.group_size == 4 and pieces.output_pieces
    report = tofu_mx.verify(sym, pieces, devices(8), oracle="float64", **shapes)
    assert report.ok, report


def routings(monkeypatch):
    """Every routing partition() makes from now on: its ``join_outputs``, in a list."""
    import tofu_mx.runtime.partitioned as partitioned
    import tofu_mx.runtime.unlower as unlower
    made = []

    def recorded(*args, join_outputs=True, **kwargs):
        made.append(join_outputs)
        return route(*args, join_outputs=join_outputs, **kwargs)
    monkeypatch.setattr(partitioned, "route", recorded)
    monkeypatch.setattr(unlower, "route", recorded)
    return made


@pytest.mark.parametrize("machine", [None, "8xV100-16GB-PCIe"])
def test_pieces_are_routed_as_pieces_only(monkeypatch, machine):
    """partition(..., join_outputs=False) routes each plan it weighs (machine='s too, through
    groups as well) with pieces only: no joined routing made first and routed again, and the
    plan machine= chose is the one returned, checked against one device."""
    sym, shapes = models.transformer(2, 64, 4, 8, 50), models.input_shapes("transformer", 8,
                                                                             seq_len=8)
    made = routings(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ptd = tofu_mx.partition(sym, devices(8), join_outputs=False, machine=machine,
                                **shapes)
    assert made and not any(made), made
    assert ptd.output_pieces
    if machine:     # the relayed candidates were weighed, as pieces
        assert any(c.group_size for c in ptd.machine_choice.candidates)
        assert ptd.program.group_size == ptd.machine_choice.chosen.group_size
    report = tofu_mx.verify(sym, ptd, devices(8), oracle="float64", **shapes)
    assert report.ok, report


def test_the_gluon_block_routes_as_pieces_only(monkeypatch):
    from mxnet.gluon import nn
    import tofu_mx.gluon as tg
    net = nn.HybridSequential()
    net.add(nn.Dense(32, activation="relu", in_units=16), nn.Dense(10, in_units=32))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu(0))
    made = routings(monkeypatch)
    pnet = tg.partition(net, devices(4), data=(8, 16))
    assert made and not any(made), made
    assert pnet.partitioned.output_pieces
