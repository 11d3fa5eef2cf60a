"""Mixed precision as MXNet's AMP writes it (``amp_cast``, ``amp_multicast``): the casts are
kept in the imported graph, partitioned like any elementwise operator, verified against a
float64 oracle, and the plan counts the narrow tensors at their own width. (MXNet 1.9.1 has
no float16 GEMM or convolution on CPU, and bfloat16 kernels only with MKLDNN, so the narrow
part here is elementwise.)"""
import json
import math

import mxnet as mx
import pytest

from nnvm_passes.importer import import_symbol
from tests.tofu_mx.runtime.helpers import partition_and_verify


def mixed():
    x = mx.sym.var("data")
    h = mx.sym.FullyConnected(x, num_hidden=8, name="fc0")
    low = mx.sym.Activation(mx.sym.amp_cast(h, dtype="float16"), act_type="tanh", name="act")
    low = mx.sym.broadcast_mul(low, mx.sym.amp_cast(mx.sym.var("scale"), dtype="float16"),
                               name="scaled")
    a, c = mx.sym.amp_multicast(low, h, num_outputs=2, name="widen")
    h = mx.sym.FullyConnected(a + c, num_hidden=5, name="fc")
    return mx.sym.MakeLoss(mx.sym.sum(mx.sym.square(h)))


def test_amp_casts_are_kept_by_the_import():
    """MXNet's ``tojson()`` drops amp_cast nodes (the float16 activation would then read
    float32 data); the import keeps them, and the user's symbol still saves as before."""
    sym = mixed()
    g = import_symbol(sym, data=(12, 6), scale=(1, 8))
    assert [n.op for n in g.nodes].count("amp_cast") == 2
    assert g.node("act").outputs[0].dtype == "float16"
    assert "amp_cast" not in json.dumps(json.loads(sym.tojson()))


@pytest.mark.parametrize("k", [2, 3, 4])
def test_a_mixed_precision_graph_partitions_and_verifies(k):
    ptd, report = partition_and_verify(mixed(), k, dtypes={"data": "float32"},
                                       oracle="float64", data=(12, 6), scale=(1, 8))
    assert report.ok, report
    assert not ptd.fallbacks
    act = ptd.plan.tensor("act:0")
    assert act.dtype == "float16"
    assert act.shard_bytes == 2 * math.prod(act.shard) < 2 * 12 * 8     # two bytes an element
