"""Check a partition on the user's own model before training with it.

A model worth partitioning is too large to run whole on one device, so the check runs a small
copy: the same symbol at a small batch (the data and label inputs' first axis, where they
share it, cut to ``batch``), partitioned over k CPU devices with the same cuts in the same
order and, at every cut, each operator given the strategy the plan gave it (where the small
graph has it), then :func:`tofu_mx.verify`: outputs, every gradient and aux state against one
device, in float64 where MXNet runs the graph in float64 (every float input and weight
cast, as Gluon pins its weights' dtype), else in its own dtypes against a float64 oracle, or
against itself where MXNet has no float64 kernels.

Its cost: one import and a search restricted to the plan's strategies at the small batch (a
fraction of the partition's own time), one rewrite, and a forward and backward pass of the
small graph on one device and on k devices (a few more with the oracle).
"""
from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from typing import Any

import mxnet as mx
import numpy as np

from nnvm_passes.transforms import cast_floats
from tofu_mx import arguments
from tofu_mx.errors import InvalidArgumentError, ShapeInferenceError, TofuError
from tofu_mx.search.baselines import forced
from tofu_mx.search.plan import Plan, SearchOptions, lower_graph, plan_graph
from tofu_mx.tdl.annotate import import_graph


def small_shapes(shapes: dict[str, tuple[int, ...]], batch: int) -> dict[str, tuple[int, ...]]:
    """``shapes`` with the first axis of every input whose first axis is the most common one
    (the batch) cut to ``batch`` (never grown)."""
    firsts = Counter(s[0] for s in shapes.values() if s)
    if not firsts:
        return dict(shapes)
    common = firsts.most_common(1)[0][0]
    return {n: (min(batch, s[0]),) + tuple(s[1:]) if s and s[0] == common else s
            for n, s in shapes.items()}


def same_strategies(plan: Plan):
    """A chooser (``plan_graph``'s ``choose``) giving each operator, at each cut in turn, the
    strategy ``plan`` gave it there."""
    wanted = [{o.name: str(o.strategies[level]) for o in plan.ops}
              for level in range(len(plan.levels))]
    levels = itertools.count()

    def choose(cut, problem):
        return forced(wanted[next(levels)])(cut, problem)
    return choose


def check_partition(ptd: Any, batch: int | None = None, seed: int = 0, rtol: float = 1e-4,
                    atol: float = 1e-5):
    """The :class:`~tofu_mx.verification.VerificationReport` of the module docstring's check
    of ``ptd`` (a :class:`~tofu_mx.PartitionedSymbol`); :class:`tofu_mx.VerificationError`
    when the small copy differs. ``batch``: the small batch (default: twice the devices)."""
    from tofu_mx.runtime.partitioned import apply_plan
    from tofu_mx.verification import verify
    k = len(ptd.contexts)
    batch = arguments.count(2 * k if batch is None else batch, "batch", minimum=1,
                            example="batch=4")
    inputs = [n for n in ptd.graph.variables() if n.kind in ("data", "label")]
    shapes = small_shapes({n.name: n.outputs[0].shape for n in inputs}, batch)
    own = {n.name: n.outputs[0].dtype for n in inputs}
    wide = {n: "float64" if np.issubdtype(np.dtype(d), np.floating) else d
            for n, d in own.items()}
    cpus = [mx.cpu(i) for i in range(k)]
    failure: Exception | None = None
    # float64 throughout (weights Gluon pinned to float32 included), else the model's dtypes
    wide_symbol = cast_floats(ptd.reference, "float64")[0]
    for symbol, dtypes, oracle in ((wide_symbol, wide, None), (ptd.reference, own, "float64"),
                                   (ptd.reference, own, None)):
        try:      # MXNet refuses a dtype its kernels lack when it infers the graph's types
            graph = lower_graph(import_graph(symbol, dtypes=dtypes, **shapes), k,
                                keep=ptd.plan.unlowered, interleave=bool(ptd.graph.layouts))
        except ShapeInferenceError as e:
            failure = e
            continue
        plan = dataclasses.replace(plan_graph(
            graph, k, options=SearchOptions(refetch=ptd.plan.refetch),
            choose=same_strategies(ptd.plan), factors=ptd.plan.factors),
            unlowered=ptd.plan.unlowered)
        small = apply_plan(symbol, graph, plan, cpus)
        try:
            return verify(symbol, small, cpus, rtol=rtol, atol=atol, seed=seed,
                          dtypes=dtypes, oracle=oracle, **shapes)
        except InvalidArgumentError as e:     # the float64 oracle cannot run this graph
            failure = e
    raise TofuError(f"checking the partition on a copy at batch {batch} failed: MXNet cannot "
                    f"run it ({str(failure).splitlines()[0]}); check it with tofu_mx.verify "
                    f"at the full size instead") from failure
