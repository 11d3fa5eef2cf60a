"""tofu_mx.tdl.shares: which strategies' shares run as the operator itself, and the search's
strategy lists that follow from it."""
import mxnet as mx
import pytest

from nnvm_passes.ir import FrozenDict
from nnvm_passes.importer import import_symbol
from tofu_mx.search.cut import View, op_strategies
from tofu_mx.tdl.analysis import strategies
from tofu_mx.tdl.registry import Attrs, lookup, trace
from tofu_mx.tdl.shares import runs_as_operator


def offered(sym, **shapes):
    """The strategy names the search offers for the one operator of ``sym`` (2 parts), and
    those the analysis derives."""
    graph = import_symbol(sym, **shapes)
    (i,) = [i for i, n in enumerate(graph.nodes) if not n.is_variable]
    node = graph.nodes[i]
    traced = trace(lookup(node.op, node.params), Attrs(node.attrs),
                   [graph.tensor(e).shape for e in node.inputs], [t.shape for t in node.outputs])
    derived = {s.name for s in strategies(traced, 2)}
    return {s.name for s in op_strategies(graph, i, View.of(graph), 2)}, derived


X = mx.sym.var("data")


def test_layer_norm_is_not_split_on_its_normalised_axis():
    """Each output column reads its whole row (the analysis is right) but only its slice of
    gamma and beta: no LayerNorm computes that share, so the search does not offer it."""
    sym = mx.sym.LayerNorm(X, mx.sym.var("g"), mx.sym.var("b"), name="ln")
    found, derived = offered(sym, data=(4, 6, 8))
    # i0..i2 are the output's axes; the analysis derives a split of each
    assert {"split i0", "split i1", "split i2"} <= derived
    assert found == derived - {"split i2"}
    found, derived = offered(mx.sym.LayerNorm(X, mx.sym.var("g"), mx.sym.var("b"), axis=1,
                                              name="ln"), data=(4, 6, 8))
    assert found == derived - {"split i1"}


@pytest.mark.parametrize("sym,shape,variables", [
    (mx.sym.BatchNorm(X, name="bn"), (4, 6, 3, 3), ("i0", "i2", "i3")),   # batch and space
    (mx.sym.softmax(X, axis=1, name="sm"), (4, 6), ("i1",)),              # its own axis
])
def test_shares_reading_whole_inputs_are_not_offered(sym, shape, variables):
    """Each part reads the whole input to compute its slice, which the operator cannot do:
    run whole on every device, it would repeat the work and keep whole tensors per device."""
    found, derived = offered(sym, data=shape)
    unrunnable = {f"split {v}" for v in variables}
    assert found == derived - unrunnable and unrunnable <= derived


@pytest.mark.parametrize("conv", [dict(kernel=(3, 3), pad=(1, 1)),
                                  dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1))])
def test_convolution_keeps_every_strategy(conv):
    found, derived = offered(mx.sym.Convolution(X, num_filter=4, name="c", **conv),
                             data=(2, 4, 8, 8))
    assert found == derived and len(found) == 5


@pytest.mark.parametrize("global_pool", [False, True])
def test_runs_as_operator_asks_the_hook(global_pool):
    """Average pooling's partial sums over window rows or columns: the hook runs them for a
    global pool only (as a rescaled global pool), not for an 8x8 window."""
    sym = mx.sym.Pooling(X, kernel=(8, 8), stride=(8, 8), pool_type="avg",
                         global_pool=global_pool, name="p")
    graph = import_symbol(sym, data=(2, 4, 8, 8))
    node = graph.nodes[1]
    entry = lookup(node.op, node.params)
    traced = trace(entry, Attrs(node.attrs), [(2, 4, 8, 8)], [(2, 4, 1, 1)])
    verdict = {s.name: runs_as_operator(entry, node.op, FrozenDict(node.attrs), traced, s)
               for s in strategies(traced, 2)}
    assert verdict == {"split b": True, "split c": True,
                       "reduce d0": global_pool, "reduce d1": global_pool}


def test_a_reshape_share_must_read_as_many_elements_as_it_writes():
    """(1, 3, 8) -> (24,) cut in two: each half starts or ends inside a row of 8, so the box it
    reads holds 16 elements for 12 written. MXNet's Reshape infers the share's shape anyway and
    its kernel fails at run time (found on BERT at k=4), so the split is not offered."""
    from tests.tofu_mx.ops.helpers import offered as offered_names
    flat = mx.sym.Reshape(X, shape=(-1,), name="r")
    assert "split i0" not in offered_names(flat, data=(1, 3, 8))
    assert "split i0" in offered_names(flat, data=(2, 3, 8))
    assert "split i1" not in offered_names(mx.sym.Flatten(X), data=(2, 3, 5))
    assert "split i1" in offered_names(mx.sym.Flatten(X), data=(2, 4, 5))
