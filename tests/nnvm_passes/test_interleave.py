"""nnvm_passes.interleave (through tofu_mx.search.plan.lower_graph, which gives it the
descriptions' facts): splits read their blocks interleaved, the weights they come from are laid
out interleaved, the graph computes the same from the caller's arrays laid out so; and every
kind of part that cannot be interleaved is left as it is."""
import mxnet as mx
import numpy as np
import pytest

from nnvm_passes.exporter import export_symbol
from nnvm_passes.ir import Interleave
from nnvm_passes.program import VarShard
from tofu_mx import models
from tofu_mx.tdl.annotate import import_graph
from tofu_mx.search.plan import lower_graph

H, B = 3, 2


def gates(out=None, head=False):
    """An LSTM-like cell step: one FullyConnected of 4 * H features plus a recurrent one, cut
    into 4 gates, combined element by element (``out(c, pre, weight)``: what else reads them;
    ``head``: the pre-activation is an output of the graph too)."""
    x, w = mx.sym.var("data"), mx.sym.var("w")
    i2h = mx.sym.FullyConnected(x, weight=w, bias=mx.sym.var("b"), num_hidden=4 * H, name="i2h")
    h2h = mx.sym.FullyConnected(mx.sym.var("h"), weight=mx.sym.var("u"), no_bias=True,
                                num_hidden=4 * H, name="h2h")
    pre = i2h + h2h
    g = mx.sym.split(pre, num_outputs=4, axis=1, name="gates")
    c = mx.sym.sigmoid(g[0]) * mx.sym.tanh(g[2]) + mx.sym.sigmoid(g[1]) * g[3]
    loss = mx.sym.make_loss(mx.sym.sum(c if out is None else out(c, pre, w)))
    return mx.sym.Group([loss, mx.sym.BlockGrad(pre)]) if head else loss


SHAPES = dict(data=(B, 5), h=(B, H))


def lowered(sym, **shapes):
    return lower_graph(import_graph(sym, **(shapes or SHAPES)), 2)


def run(graph, values):
    exe = export_symbol(graph).simple_bind(mx.cpu(), grad_req="null", type_dict={
        n: "float64" for n in values}, **{n: v.shape for n, v in values.items()})
    for n, v in values.items():
        exe.arg_dict[n][:] = v
    return exe.forward()[0].asnumpy()


def test_the_gates_come_out_interleaved_and_the_cell_computes_the_same():
    sym = gates()
    got = lowered(sym)
    assert dict(got.layouts) == {"w": Interleave(0, 4), "b": Interleave(0, 4),
                                 "u": Interleave(0, 4)}
    split = got.node("gates")
    assert split.op == "SliceChannel" and split.params["axis"] == 2
    source = got.nodes[split.inputs[0].node]
    assert source.op == "Reshape" and source.outputs[0].shape == (B, H, 4)
    rng = np.random.default_rng(0)
    values = {"data": rng.standard_normal((B, 5)), "h": rng.standard_normal((B, H)),
              "w": rng.standard_normal((4 * H, 5)), "b": rng.standard_normal(4 * H),
              "u": rng.standard_normal((4 * H, H))}
    laid = {n: v[Interleave(0, 4).order(4 * H)] if n in got.layouts else v
            for n, v in values.items()}
    np.testing.assert_allclose(run(got, laid), run(import_graph(sym, **SHAPES), values),
                               rtol=1e-12)


def test_the_builders_lstm_weights_are_interleaved_and_nothing_else():
    got = lowered(models.rnn(2, 8, 3, 20), **models.input_shapes("rnn", 4, seq_len=3))
    assert dict(got.layouts) == {f"l{i}_{w}_{p}": Interleave(0, 4) for i in range(2)
                                 for w in ("i2h", "h2h") for p in ("weight", "bias")}


@pytest.mark.parametrize("why,sym", [
    ("the gates' sum is also read across its features",
     gates(lambda c, pre, w: mx.sym.broadcast_add(c, mx.sym.sum(pre, axis=1, keepdims=True)))),
    ("the pre-activation is an output of the graph", gates(head=True)),
    ("the weight is also read transposed",
     gates(lambda c, pre, w: mx.sym.broadcast_add(c, mx.sym.slice_axis(
         mx.sym.sum(mx.sym.dot(w, w, transpose_b=True), axis=1, keepdims=True), axis=0,
         begin=0, end=1)))),
    ("the same value is also split into 2", gates(
        lambda c, pre, w: c + mx.sym.slice_axis(mx.sym.split(pre, num_outputs=2, axis=1)[0],
                                                axis=1, begin=0, end=H))),
    ("the features come from a data input",
     mx.sym.make_loss(mx.sym.sum(mx.sym.split(mx.sym.var("data") * 2, num_outputs=4,
                                              axis=1)[1]))),
])
def test_a_part_that_cannot_be_interleaved_is_left_as_it_is(why, sym):
    shapes = SHAPES if "data" not in why else dict(data=(B, 4 * H))
    graph = import_graph(sym, **shapes)
    got = lowered(sym, **shapes)
    assert not got.layouts, why
    assert [n.op for n in got.operators()] == [n.op for n in graph.operators()], why


def test_a_shard_is_taken_from_and_put_into_the_callers_array():
    layout = Interleave(1, 4)
    assert list(layout.order(8)) == [0, 2, 4, 6, 1, 3, 5, 7]
    whole = np.arange(3 * 8).reshape(3, 8)
    shards = [VarShard(f"w@dev{d}", "w", "param", d, ((0, 2), (4 * d, 4 * d + 3)), "int64",
                       layout) for d in range(2)]
    # device 0 holds positions 0-1 of every gate, device 1 positions 2-3
    np.testing.assert_array_equal(shards[0].take(whole), whole[:, [0, 2, 4, 6]])
    np.testing.assert_array_equal(shards[1].take(whole), whole[:, [1, 3, 5, 7]])
    back = np.zeros_like(whole)
    for s in shards:
        s.put(back, s.take(whole))
    np.testing.assert_array_equal(back, whole)
