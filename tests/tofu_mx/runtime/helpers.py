"""Shared helpers: partition and verify in float64 (so summation order cannot matter)."""
import importlib
import warnings

import mxnet as mx

import tofu_mx
from nnvm_passes.importer import import_symbol
from tofu_mx.runtime.partitioned import _routed, apply_plan
from tofu_mx.search.baselines import baseline_plan, forced
from tofu_mx.search.plan import lower_graph, plan_graph


def float64(shapes):
    return {name: "float64" for name in shapes}


def partition_quietly(sym, k, **kwargs):
    """``tofu_mx.partition`` over cpu(0..k-1), its fallback warnings (RuntimeWarning) not
    shown; ``kwargs``: partition()'s (options, dtypes, shapes, ...)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return tofu_mx.partition(sym, [mx.cpu(i) for i in range(k)], **kwargs)


def partition_and_verify(sym, k, dtypes=None, choose=None, options=None, arrays=None,
                         oracle=None, policy=None, group_size=0, pieces=False, **shapes):
    """Partition ``sym`` over k CPU devices and verify it against one device (outputs, every
    gradient, every aux state); returns (PartitionedSymbol, VerificationReport). ``choose``:
    strategies forced (:func:`~tofu_mx.search.baselines.forced`); ``policy``: a baseline's
    plan instead; ``group_size``: routed with each value several devices of a group of that
    many read sent to the group once (``nnvm_passes.program.relayed_reads``); ``pieces``:
    the outputs returned as their stored pieces (``PartitionedSymbol.with_output_pieces``)."""
    ctx = [mx.cpu(i) for i in range(k)]
    dtypes = dtypes if dtypes is not None else float64(shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if choose is None and policy is None:
            ptd = tofu_mx.partition(sym, ctx, dtypes=dtypes, options=options, **shapes)
        else:
            graph = lower_graph(import_symbol(sym, dtypes=dtypes, **shapes), k)
            plan = baseline_plan(graph, k, policy) if policy is not None else \
                plan_graph(graph, k, choose=forced(choose))
            ptd = apply_plan(sym, graph, plan, ctx)
        if group_size:
            ptd = _routed(ptd, group_size)
        if pieces:
            ptd = ptd.with_output_pieces()
    report = tofu_mx.verify(sym, ptd, ctx, rtol=1e-4, atol=1e-5, dtypes=dtypes, arrays=arrays,
                            oracle=oracle, **shapes)
    return ptd, report


def blocks_one_after_another(monkeypatch):
    """Turn :mod:`nnvm_passes.interleave` off for a test: the blocks a split cuts (an LSTM's
    gates) stay stored one after another, as the routing tests of that layout need."""
    monkeypatch.setattr(importlib.import_module("tofu_mx.search.plan"), "interleave_blocks",
                        lambda graph, passes, splits: graph)
