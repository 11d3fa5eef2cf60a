"""Shared helpers: partition and verify in float64 (so summation order cannot matter)."""
import warnings

import mxnet as mx

import tofu_mx
from nnvm_passes.importer import import_symbol
from tofu_mx.runtime.partitioned import apply_plan
from tofu_mx.search.baselines import forced
from tofu_mx.search.plan import lower_graph, plan_graph


def float64(shapes):
    return {name: "float64" for name in shapes}


def partition_and_verify(sym, k, dtypes=None, choose=None, options=None, arrays=None,
                         oracle=None, **shapes):
    """Partition ``sym`` over k CPU devices and verify it against one device (outputs, every
    gradient, every aux state); returns (PartitionedSymbol, VerificationReport)."""
    ctx = [mx.cpu(i) for i in range(k)]
    dtypes = dtypes if dtypes is not None else float64(shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if choose is None:
            ptd = tofu_mx.partition(sym, ctx, dtypes=dtypes, options=options, **shapes)
        else:
            graph = lower_graph(import_symbol(sym, dtypes=dtypes, **shapes), k)
            ptd = apply_plan(sym, graph, plan_graph(graph, k, choose=forced(choose)), ctx)
    report = tofu_mx.verify(sym, ptd, ctx, rtol=1e-4, atol=1e-5, dtypes=dtypes, arrays=arrays,
                            oracle=oracle, **shapes)
    return ptd, report
