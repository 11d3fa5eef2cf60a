"""Attention's interleaved products, the order statistics, the extra reductions, losses and
linear algebra: the strategies they offer, and partitioned nets built from them computing
what one device computes."""
import mxnet as mx
import pytest

import tofu_mx.ops  # noqa: F401
from nnvm_passes.importer import import_symbol
from tests.tofu_mx.ops.helpers import offered
from tests.tofu_mx.runtime.helpers import partition_and_verify
from tofu_mx.tdl.analysis import strategies
from tofu_mx.tdl.registry import Attrs, lookup, trace

X = mx.sym.var("x")


def traced_of(sym, **shapes):
    graph = import_symbol(sym, **shapes)
    node = graph.nodes[-1]
    return trace(lookup(node.op, node.params), Attrs(node.attrs),
                 [graph.tensor(e).shape for e in node.inputs], [t.shape for t in node.outputs])


def layouts(sym, var, parts=2, **shapes):
    (s,) = [s for s in strategies(traced_of(sym, **shapes), parts) if s.var == var]
    return [str(x) for x in s.input_layouts], [str(x) for x in s.output_layouts]


# --- attention --------------------------------------------------------------------------------

def test_selfatt_qk_splits_batch_times_heads_only():
    """qkv (L=4, B=2, 3*H*D with H=2, D=4): the maps' first axis (B*H) is the one split; a
    split of whole batches is a clean split of qkv's batch axis."""
    qk = mx.sym.contrib.interleaved_matmul_selfatt_qk(X, heads=2)
    assert offered(qk, x=(4, 2, 24)) == {"split n"}
    assert layouts(qk, "n", x=(4, 2, 24)) == (["split(1)"], ["split(0)"])


def test_selfatt_qk_splits_heads_within_one_batch():
    """With one sequence the split of B*H is a split of heads: qkv splits on whole head
    blocks of its last axis, and each share runs with half the heads."""
    qk = mx.sym.contrib.interleaved_matmul_selfatt_qk(X, heads=4)
    assert offered(qk, x=(4, 1, 24)) == {"split n"}
    assert layouts(qk, "n", x=(4, 1, 24)) == (["split(2)"], ["split(0)"])
    assert offered(qk, parts=4, x=(4, 1, 24)) == {"split n"}


def test_selfatt_valatt_splits_batch_or_heads():
    att = mx.sym.var("att")
    val = mx.sym.contrib.interleaved_matmul_selfatt_valatt(X, att, heads=2)
    assert offered(val, x=(4, 2, 24), att=(4, 4, 4)) == {"split b"}
    assert layouts(val, "b", x=(4, 2, 24), att=(4, 4, 4)) == (["split(1)", "split(0)"],
                                                              ["split(1)"])
    # one sequence: the heads (channels of the output, blocks of qkv, maps) split
    val1 = mx.sym.contrib.interleaved_matmul_selfatt_valatt(X, att, heads=4)
    assert offered(val1, x=(4, 1, 24), att=(4, 4, 4)) == {"split e"}
    assert layouts(val1, "e", x=(4, 1, 24), att=(4, 4, 4)) == (["split(2)", "split(0)"],
                                                               ["split(2)"])


def test_encdec_ops_split_queries_and_reduce_over_keys():
    kv, att = mx.sym.var("kv"), mx.sym.var("att")
    qk = mx.sym.contrib.interleaved_matmul_encdec_qk(X, kv, heads=2)
    assert offered(qk, x=(4, 2, 8), kv=(6, 2, 16)) == {"split n", "split i", "split j"}
    val = mx.sym.contrib.interleaved_matmul_encdec_valatt(kv, att, heads=2)
    # a slice of the keys with the matching columns of the maps gives a partial sum
    assert offered(val, kv=(6, 2, 16), att=(4, 4, 6)) == {"split b", "split i", "reduce l"}


def test_div_sqrt_dim_keeps_its_last_axis_whole():
    assert offered(mx.sym.contrib.div_sqrt_dim(X), x=(4, 8)) == {"split i0"}


# --- order statistics and reductions ------------------------------------------------------------

@pytest.mark.parametrize("sym, shape, want", [
    (mx.sym.sort(X), (4, 6, 8), {"split i0", "split i1"}),
    (mx.sym.sort(X, axis=1), (4, 6, 8), {"split i0", "split i2"}),
    (mx.sym.argsort(X, is_ascend=False), (4, 8), {"split i0"}),
    (mx.sym.topk(X, k=2, ret_typ="both"), (4, 8), {"split i0"}),
    (mx.sym.topk(X, k=2, ret_typ="mask", axis=0), (4, 8), {"split i1"}),
    (mx.sym.argmax(X, axis=1), (4, 8), {"split i0"}),
    (mx.sym.cumsum(X, axis=1), (4, 8), {"split i0"}),
])
def test_order_statistics_split_only_other_axes(sym, shape, want):
    assert offered(sym, x=shape) == want


@pytest.mark.parametrize("sym, reduces", [
    (mx.sym.sum(X, axis=1), True),
    (mx.sym.nansum(X, axis=1), True),
    (mx.sym.prod(X, axis=1), False),          # a product's partials are not summed
    (mx.sym.nanprod(X, axis=1), False),
    (mx.sym.norm(X, ord=1, axis=1), True),
    (mx.sym.norm(X, axis=1), False),          # sqrt of a sum
    (mx.sym.moments(X, axes=(1,))[0], False),  # the variance reduces the axis again
])
def test_reductions_partition_and_reduce_only_when_linear(sym, reduces):
    assert offered(sym, x=(4, 8)) == ({"split i0", "reduce r0"} if reduces else {"split i0"})


def test_losses():
    y = mx.sym.var("y")
    # the cross entropy is a sum over the batch: partial sums over batch slices
    assert offered(mx.sym.softmax_cross_entropy(X, y), x=(4, 8), y=(4,)) == {"reduce b"}
    # the SVM gradient compares class positions with the label: classes stay whole
    assert offered(mx.sym.SVMOutput(X, y), x=(4, 8), y=(4,)) == {"split i0"}
    assert lookup("softmax_cross_entropy").facts.loss is False
    assert lookup("SVMOutput").facts.loss and lookup("make_loss").facts.loss


def test_linalg():
    A, B, C = mx.sym.var("a"), mx.sym.var("b"), mx.sym.var("c")
    s = dict(a=(2, 4, 6), b=(2, 6, 8))
    assert offered(mx.sym.linalg.gemm2(A, B), **s) == {"split o0", "split o1", "split o2",
                                                       "reduce k"}
    # gemm's partial products would need a C to add: no partition-n-reduce
    assert offered(mx.sym.linalg.gemm(A, B, C), c=(2, 4, 8), **s) == {"split o0", "split o1",
                                                                      "split o2"}
    assert offered(mx.sym.linalg.syrk(A), a=(2, 4, 6)) == {"split o0", "reduce k"}
    assert offered(mx.sym.linalg.trmm(A, B), a=(2, 4, 4), b=(2, 4, 6)) == {"split o0",
                                                                            "split o2"}
    # a slice of a diagonal is the main diagonal of a block
    assert offered(mx.sym.linalg.extractdiag(A, offset=1), a=(2, 5, 5)) == {"split o0",
                                                                             "split o1"}


# --- end to end -----------------------------------------------------------------------------------

def self_attention(units=8, heads=2):
    """BERT's self-attention block with the interleaved operators (GluonNLP's layout)."""
    data = mx.sym.var("data")                                    # (L, B, units)
    qkv = mx.sym.FullyConnected(data, num_hidden=3 * units, flatten=False, name="qkv")
    scores = mx.sym.contrib.interleaved_matmul_selfatt_qk(qkv, heads=heads, name="qk")
    att = mx.sym.softmax(mx.sym.contrib.div_sqrt_dim(scores, name="scale"), axis=-1,
                         name="att")
    context = mx.sym.contrib.interleaved_matmul_selfatt_valatt(qkv, att, heads=heads,
                                                               name="valatt")
    out = mx.sym.FullyConnected(context, num_hidden=units, flatten=False, name="proj")
    return mx.sym.MakeLoss(mx.sym.sum(out * out), name="loss")


def float32(**shapes):
    return {name: "float32" for name in shapes}


@pytest.mark.parametrize("k, batch, choose", [
    (2, 2, None),
    (2, 1, {"qk": "split n", "valatt": "split e"}),      # heads split: one sequence
    (4, 4, None),
])
def test_self_attention_block_partitions_exactly(k, batch, choose):
    """MXNet's interleaved kernels are float32 only on CPU, so this net runs in float32
    (the shares compute the same sums as the whole operators)."""
    shapes = dict(data=(4, batch, 8))
    ptd, report = partition_and_verify(self_attention(), k, dtypes=float32(**shapes),
                                       choose=choose, **shapes)
    assert report.ok, report
    assert not ptd.fallbacks


def normalised_classifier():
    data, label = mx.sym.var("data"), mx.sym.var("label")
    x = mx.sym.FullyConnected(data, num_hidden=8, name="fc1")
    x = mx.sym.broadcast_div(x, mx.sym.norm(x, axis=1, keepdims=True, name="l2"))
    mean, var = mx.sym.moments(x, axes=(1,), keepdims=True, name="stats")
    x = mx.sym.broadcast_div(mx.sym.broadcast_sub(x, mean), mx.sym.sqrt(var + 1e-3))
    logits = mx.sym.FullyConnected(x, num_hidden=5, name="fc2")
    return mx.sym.MakeLoss(mx.sym.softmax_cross_entropy(logits, label, name="xent"),
                           name="loss")


@pytest.mark.parametrize("k", [2, 3])
def test_norm_moments_cross_entropy_net_partitions_exactly(k):
    ptd, report = partition_and_verify(normalised_classifier(), k, data=(12, 6), label=(12,))
    assert report.ok, report
    assert not ptd.fallbacks


def linalg_net():
    a, b, c = mx.sym.var("a"), mx.sym.var("b"), mx.sym.var("c")
    x = mx.sym.linalg.gemm2(a, b, transpose_b=True, alpha=0.5, name="gemm2")    # (4, 6, 6)
    x = mx.sym.linalg.trmm(x, c, lower=False, name="trmm")                       # (4, 6, 5)
    d = mx.sym.linalg.extractdiag(mx.sym.linalg.syrk(x, name="syrk"), offset=1,
                                  name="diag")                                   # (4, 5)
    s = mx.sym.sort(d, axis=-1, is_ascend=False, name="sorted")
    return mx.sym.MakeLoss(mx.sym.sum(mx.sym.cumsum(s, axis=1, name="cum")) +
                           mx.sym.sum(mx.sym.prod(x, axis=2, name="prod")), name="loss")


@pytest.mark.parametrize("k", [2, 4])
def test_linalg_and_sort_net_partitions_exactly(k):
    ptd, report = partition_and_verify(linalg_net(), k, a=(4, 6, 3), b=(4, 6, 3),
                                       c=(4, 6, 5))
    assert report.ok, report
    assert not ptd.fallbacks
