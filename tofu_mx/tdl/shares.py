"""Can one share of an operator run as the operator itself?

A share is what one device computes of an operator: the interval analysis gives the regions it
reads and the outputs it computes (:class:`~tofu_mx.tdl.analysis.Work`). It runs as the operator
when the description's ``shard`` hook says how (attributes, padding, or views of its input) and
MXNet, given the share's input shapes and those attributes, infers the share's output shapes.
Splitting the normalised axis of LayerNorm's output, say, reads whole rows but only a slice of
``gamma``: the analysis is right, but no LayerNorm computes that share.

Used by the search (a strategy any share of which cannot run is not offered) and by
:mod:`tofu_mx.runtime.assign` (which then runs the operator whole where a share cannot run).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
from dataclasses import dataclass

import mxnet as mx

from nnvm_passes.ir import FrozenDict, format_attr_value
from tofu_mx.tdl.analysis import Strategy, Work, part_interval, work_regions
from tofu_mx.tdl.lang import TDLError
from tofu_mx.tdl.registry import (Attrs, Description, Shard, ShardContext, Traced,
                                  single_op_symbol)

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Runnable:
    """How a share runs: the operator's attributes, the box of each input to read (an unclipped
    window where the hook asks for materialised padding) and the hook's answer."""

    attrs: FrozenDict
    inputs: tuple[Box | None, ...]
    shard: Shard


@functools.lru_cache(maxsize=1 << 14)
def inferred_shapes(op: str, attrs: FrozenDict, shapes: tuple, n_outputs: int) -> tuple | None:
    """The shapes MXNet infers for the first ``n_outputs`` outputs of one ``op`` node."""
    try:
        sym = single_op_symbol(op, dict(attrs), len(shapes), n_outputs)
        known = {f"in{i}": s for i, s in enumerate(shapes)}
        args = {n: known[n] for n in sym.list_arguments() if n in known}
        with contextlib.redirect_stdout(io.StringIO()):   # MXNet prints failed inferences
            _, found, _ = sym.infer_shape(**args)
    except (TDLError, mx.base.MXNetError):
        return None
    return tuple(tuple(s) for s in found) if found else None


def resolve(entry: Description, op: str, attrs: FrozenDict, traced: Traced,
            work: Work) -> Runnable | str:
    """How the share ``work`` of one ``op`` node runs, or why it cannot run as the operator."""
    in_shapes = tuple(r.shape for r in traced.inputs)
    ctx = ShardContext(work.inputs, work.windows, work.outputs, in_shapes,
                       tuple(o.shape for o in traced.outputs), work.partial)
    shard = entry.shard(Attrs(attrs), ctx) if entry.shard else Shard()
    if shard is None:
        return f"its description's shard hook cannot run the share {work.outputs}"
    boxes = []
    for j, (box, window) in enumerate(zip(work.inputs, work.windows)):
        if window is not None and j in shard.padded:
            # read only in its padding (no box): the window, materialised, is all it reads
            box = window if box is None else \
                tuple(window[a] if a in shard.padded[j] else box[a] for a in range(len(box)))
        if box is not None and j in shard.whole:
            box = tuple((0, in_shapes[j][a] - 1) if a in shard.whole[j] else box[a]
                        for a in range(len(box)))
        boxes.append(box)
    merged = dict(attrs)
    merged.update({name: format_attr_value(v) for name, v in shard.attrs.items()})
    runnable = Runnable(FrozenDict(merged), tuple(boxes), shard)
    if shard.views is not None and not shard.also_runs:
        return runnable
    shapes = tuple(ShardContext.size(b) for b in boxes if b is not None)
    want = tuple(ShardContext.size(b) for b in work.outputs)
    got = inferred_shapes(op, runnable.attrs, shapes, len(want))
    if got is None or got[:len(want)] != want:
        if shard.views is not None:      # the views alone, then
            return dataclasses.replace(runnable, shard=dataclasses.replace(shard,
                                                                           also_runs=False))
        return (f"MXNet computes {got and got[:len(want)]} from inputs {shapes} with "
                f"{dict(shard.attrs)}, the share needs {want}")
    return runnable


def runs_as_operator(entry: Description, op: str, attrs: FrozenDict, traced: Traced,
                     strategy: Strategy) -> bool:
    """Whether every share of a one-level ``strategy`` runs as the operator. The search's work
    views below the first cut keep the operator's original attributes (a ``slice``'s bounds
    may then lie outside its view), so a hook that fails on such a share answers "unknown",
    taken as yes: assign checks the composed share again and runs the operator whole if it
    cannot run."""
    for p in range(strategy.parts):
        ranges = {strategy.var: part_interval(traced.extents[strategy.var], strategy.parts, p)}
        reduced = [strategy.var] if strategy.kind == "reduce" else []
        try:
            work = work_regions(traced, ranges, reduced, reduced if p else [])
            found = resolve(entry, op, attrs, traced, work)
        except Exception:  # noqa: BLE001  (a hook meeting an approximate view: unknown)
            return True
        if isinstance(found, str):
            return False
    return True
