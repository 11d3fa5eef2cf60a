"""Symbolic interval analysis: from a traced description to its partition strategies.

A strategy splits one loop variable ``v`` of the operator into ``parts`` equal ranges. Every
other variable keeps its whole range ``[0, N)``. Evaluating each input access with interval
arithmetic (:func:`index_interval`) gives, per part, the bounding box of each input the part
reads. Then:

- ``v`` an **output** variable: each part computes a disjoint slice of every output indexed by
  ``v`` (an output without ``v`` is computed whole by every part);
- ``v`` a **reduction** variable: allowed when every output is *linear* in a top-level
  ``Sum`` over ``v`` (``Sum(..) + bias``, ``Sum(..) * scale``, ``Sum(..) / n``) or is exactly
  a top-level ``Max``/``Min``, and every input that ``v`` indexes is cleanly split along it
  (so the operator itself, run on the slices, computes the partials); each part computes a
  partial output, combined by a sum (or max/min): partition-n-reduce. Terms added outside
  the sum are computed by part 0 only.

An index the analysis cannot bound (a data-dependent index) makes its axis needed whole: the
fallback is always conservative, never wrong. :class:`Layout` names what a part needs of each
tensor: a matching slice (``split``, maybe with a ``halo``), the whole (``replicated``), part 0
only (``first``), nothing (``none``), or a region with no such name (``irregular``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from tofu_mx.tdl.lang import (Access, Affine, Bin, Cmp, DataIndex, Depends, Expr, FloorDiv,
                              IAdd, Index, IScale, Mod, Reduce, TDLError, Unary, Where,
                              index_nodes)
from tofu_mx.tdl.registry import Opaque, Traced, walk

Interval = tuple[int, int]                 # inclusive bounds
Region = tuple[Interval, ...] | None       # one interval per axis; None: not read


def index_interval(i: Index, env: Mapping[str, Interval]) -> Interval | None:
    """Bounds of an index expression when each variable ranges over ``env``; None if unbounded."""
    if isinstance(i, Affine):
        lo = hi = i.const
        for name, c in i.terms:
            a, b = env[name]
            lo, hi = (lo + c * a, hi + c * b) if c > 0 else (lo + c * b, hi + c * a)
        return lo, hi
    if isinstance(i, IAdd):
        parts = [index_interval(p, env) for p in i.parts]
        if any(p is None for p in parts):
            return None
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if isinstance(i, IScale):
        inner = index_interval(i.inner, env)
        if inner is None:
            return None
        a, b = inner[0] * i.factor, inner[1] * i.factor
        return min(a, b), max(a, b)
    if isinstance(i, FloorDiv):
        inner = index_interval(i.inner, env)
        return None if inner is None else (inner[0] // i.divisor, inner[1] // i.divisor)
    if isinstance(i, Mod):
        inner = index_interval(i.inner, env)
        if inner is None:
            return None
        k = i.modulus
        if inner[1] - inner[0] + 1 >= k or inner[0] % k > inner[1] % k:
            return 0, k - 1
        return inner[0] % k, inner[1] % k
    if isinstance(i, DataIndex):
        return None
    raise TDLError(f"unknown index form {i!r}")


class _Regions:
    """Bounding boxes of what one part reads, per input position."""

    def __init__(self, n_inputs: int):
        self.boxes: list[list[list[int]] | None] = [None] * n_inputs
        self.windows: list[list[list[int]] | None] = [None] * n_inputs

    def add(self, access: Access, env: Mapping[str, Interval]) -> None:
        shape = access.tensor.shape
        box, window = [], []
        for axis, i in enumerate(access.indices):
            iv = index_interval(i, env)
            iv = (0, shape[axis] - 1) if iv is None else iv
            lo, hi = max(iv[0], 0), min(iv[1], shape[axis] - 1)
            if lo > hi:
                if access.pad is None:
                    return
                box = None     # reads only padding: a window, no box
            if box is not None:
                box.append([lo, hi])
            window.append(list(iv) if access.pad is not None else [lo, hi])
        for store, new in ((self.boxes, box), (self.windows, window)):
            if new is None:
                continue
            mine = store[access.tensor.position]
            if mine is None:
                store[access.tensor.position] = new
            else:
                for have, more in zip(mine, new):
                    have[0], have[1] = min(have[0], more[0]), max(have[1], more[1])

    def result(self) -> tuple[Region, ...]:
        return tuple(None if b is None else tuple((lo, hi) for lo, hi in b) for b in self.boxes)

    def result_windows(self) -> tuple[Region, ...]:
        """The boxes before clipping to the tensors' bounds (reaching into their padding); an
        input read only in its padding has a window and no box."""
        return tuple(None if b is None else tuple((lo, hi) for lo, hi in b)
                     for b in self.windows)


def _collect(e: Expr, env: dict[str, Interval], split: Mapping[str, Interval],
             extents: Mapping[str, int], out: _Regions) -> None:
    if isinstance(e, Access):
        out.add(e, env)
        for sub in index_nodes(e.indices):
            if isinstance(sub, DataIndex):
                _collect(sub.value, env, split, extents, out)
    elif isinstance(e, Bin):
        _collect(e.a, env, split, extents, out)
        _collect(e.b, env, split, extents, out)
    elif isinstance(e, Unary):
        _collect(e.a, env, split, extents, out)
    elif isinstance(e, Depends):
        for sub in (e.value, *e.on):
            _collect(sub, env, split, extents, out)
    elif isinstance(e, Reduce):
        inner = dict(env)
        for v in e.vars:
            inner[v.name] = split.get(v.name, (0, extents[v.name] - 1))
        _collect(e.body, inner, split, extents, out)
    elif isinstance(e, Where):
        _collect_where(e, env, split, extents, out)


def _collect_where(e: Where, env, split, extents, out: _Regions) -> None:
    if isinstance(e.cond, Cmp):
        for sub in (e.cond.a, e.cond.b, e.a, e.b):
            _collect(sub, env, split, extents, out)
        return
    iv = index_interval(e.cond.index, env)
    lo, hi = e.cond.lo, e.cond.hi - 1
    if iv is None or not (iv[1] < lo or iv[0] > hi):     # the then-branch may be taken
        then_env = dict(env)
        var = e.cond.index.single_var() if isinstance(e.cond.index, Affine) else None
        if var is not None and iv is not None:
            then_env[var] = (max(iv[0], lo), min(iv[1], hi))
        _collect(e.a, then_env, split, extents, out)
    if iv is None or iv[0] < lo or iv[1] > hi:           # the else-branch may be taken
        _collect(e.b, env, split, extents, out)


def _uses(e: Expr, var: str) -> bool:
    return any(isinstance(s, Reduce) and var in (v.name for v in s.vars) for s in walk(e))


def _linear(e: Expr, var: str) -> bool:
    """Is ``e`` a linear function of a top-level ``Sum`` over ``var``?"""
    if isinstance(e, Reduce):
        return e.kind == "sum" and var in (v.name for v in e.vars)
    if isinstance(e, Bin) and e.op in "+-":
        sides = [(_linear(s, var), not _uses(s, var)) for s in (e.a, e.b)]
        return all(lin or free for lin, free in sides) and any(lin for lin, _ in sides)
    if isinstance(e, Bin) and e.op == "*":
        return (_linear(e.a, var) and not _uses(e.b, var)) or \
               (_linear(e.b, var) and not _uses(e.a, var))
    if isinstance(e, Bin) and e.op == "/":
        return _linear(e.a, var) and not _uses(e.b, var)
    if isinstance(e, Unary) and e.fn == "neg":
        return _linear(e.a, var)
    return False


def _collect_partial(e: Expr, var: str | Sequence[str], env, split, extents,
                     out: _Regions) -> None:
    """What a part other than the first reads: additive terms free of ``var`` are skipped
    (with several reduction variables, terms free of any of them)."""
    names = (var,) if isinstance(var, str) else tuple(var)

    def uses_all(side):
        return all(_uses(side, v) for v in names)
    if isinstance(e, Bin) and e.op in "+-":
        for side in (e.a, e.b):
            if uses_all(side):
                _collect_partial(side, names, env, split, extents, out)
    elif isinstance(e, Bin):
        lin, other = (e.a, e.b) if any(_uses(e.a, v) for v in names) else (e.b, e.a)
        _collect_partial(lin, names, env, split, extents, out)
        _collect(other, env, split, extents, out)
    elif isinstance(e, Unary):
        _collect_partial(e.a, names, env, split, extents, out)
    else:
        _collect(e, env, split, extents, out)


@dataclass(frozen=True)
class Layout:
    """What one part holds or needs of one tensor under a strategy."""

    kind: str                     # split | replicated | partial | first | none | irregular
    axis: int | None = None
    halo: tuple[int, int] = (0, 0)
    combine: str | None = None    # for partial: sum | max | min

    def __str__(self) -> str:
        if self.kind == "split":
            halo = f"+halo{self.halo}" if self.halo != (0, 0) else ""
            return f"split({self.axis}){halo}"
        if self.kind == "partial":
            return f"partial({self.combine})"
        return self.kind


def classify(regions: Sequence[Region], shape: Sequence[int]) -> Layout:
    """Name the per-part regions of one tensor (see :class:`Layout`)."""
    parts = len(regions)
    if all(r is None for r in regions):
        return Layout("none")
    whole = tuple((0, n - 1) for n in shape)
    if regions[0] == whole and all(r is None for r in regions[1:]):
        return Layout("first")
    if any(r is None for r in regions):
        return Layout("irregular")
    cut = [a for a in range(len(shape)) if any(r[a] != whole[a] for r in regions)]
    if not cut:
        return Layout("replicated")
    if len(cut) > 1 or shape[cut[0]] < parts:
        return Layout("irregular")
    axis, n = cut[0], shape[cut[0]]
    bounds = [part_interval(n, parts, p) for p in range(parts)]
    lo_ext = max(max(b[0] - r[axis][0], 0) for b, r in zip(bounds, regions))
    hi_ext = max(max(r[axis][1] - b[1], 0) for b, r in zip(bounds, regions))
    if max(lo_ext, hi_ext) >= n // parts:
        return Layout("irregular")
    return Layout("split", axis, (lo_ext, hi_ext))


@dataclass(frozen=True)
class Strategy:
    """One way to run an operator in ``parts`` parts: split loop variable ``var``, whose
    extent is ``extent`` (0 for replicate and whole), into parts that differ by at most one
    (:func:`part_interval`)."""

    var: str
    kind: str                                   # "output" | "reduce" | "replicate" | "whole"
    parts: int
    inputs: tuple[tuple[Region, ...], ...]      # [input][part] -> what the part reads
    outputs: tuple[tuple[Region, ...], ...]     # [output][part] -> what the part computes
    input_layouts: tuple[Layout, ...]
    output_layouts: tuple[Layout, ...]
    extent: int = 0

    @property
    def uneven(self) -> bool:
        """Whether its parts differ in size (``parts`` does not divide the extent)."""
        return bool(self.extent % self.parts)

    @property
    def name(self) -> str:
        if self.kind == "whole":       # part 0 computes it all (an operator with no description)
            return "whole"
        verb = {"output": "split", "reduce": "reduce", "replicate": "replicate"}[self.kind]
        return f"{verb} {self.var}"

    def describe(self) -> str:
        ins = ", ".join(map(str, self.input_layouts))
        outs = ", ".join(map(str, self.output_layouts))
        return f"{self.name}: inputs [{ins}] -> outputs [{outs}]"


def part_interval(n: int, parts: int, p: int) -> Interval:
    """Part ``p`` of ``0..n-1`` cut in ``parts``: equal when ``parts`` divides ``n``, else
    at floor boundaries (sizes differ by at most one; part 0 is a smallest)."""
    return p * n // parts, (p + 1) * n // parts - 1



def _output_strategy(traced: Traced, var: str, parts: int) -> Strategy:
    n = traced.extents[var]
    per_input: list[list[Region]] = [[] for _ in traced.inputs]
    per_output: list[list[Region]] = [[] for _ in traced.outputs]
    for p in range(parts):
        regions = _Regions(len(traced.inputs))
        for k, out in enumerate(traced.outputs):
            env = {v.name: (0, s - 1) for v, s in zip(out.vars, out.shape)}
            if var in env:
                env[var] = part_interval(n, parts, p)
            _collect(out.expr, env, {var: part_interval(n, parts, p)}, traced.extents, regions)
            per_output[k].append(tuple(env[v.name] for v in out.vars))
        for i, r in enumerate(regions.result()):
            per_input[i].append(r)
    return _strategy(traced, var, "output", parts, per_input, per_output, None)


def _reduce_strategy(traced: Traced, var: str, parts: int, combine: str) -> Strategy:
    n = traced.extents[var]
    per_input: list[list[Region]] = [[] for _ in traced.inputs]
    for p in range(parts):
        regions = _Regions(len(traced.inputs))
        split = {var: part_interval(n, parts, p)}
        for out in traced.outputs:
            env = {v.name: (0, s - 1) for v, s in zip(out.vars, out.shape)}
            if p == 0 or combine != "sum":
                _collect(out.expr, env, split, traced.extents, regions)
            else:
                _collect_partial(out.expr, var, env, split, traced.extents, regions)
        for i, r in enumerate(regions.result()):
            per_input[i].append(r)
    per_output = [[tuple((0, s - 1) for s in out.shape)] * parts for out in traced.outputs]
    return _strategy(traced, var, "reduce", parts, per_input, per_output, combine)


def _strategy(traced, var, kind, parts, per_input, per_output, combine) -> Strategy:
    in_layouts = tuple(classify(r, ref.shape) for r, ref in zip(per_input, traced.inputs))
    if kind == "reduce":
        out_layouts = tuple(Layout("partial", combine=combine) for _ in traced.outputs)
    else:
        out_layouts = tuple(classify(r, out.shape) for r, out in zip(per_output, traced.outputs))
    return Strategy(var, kind, parts, tuple(map(tuple, per_input)), tuple(map(tuple, per_output)),
                    in_layouts, out_layouts, traced.extents[var])


def _reduce_combine(traced: Traced, var: str) -> str | None:
    """The combine of a valid partition-n-reduce over ``var``, or None if there is none."""
    kinds = set()
    for out in traced.outputs:
        if _linear(out.expr, var):
            kinds.add("sum")
        elif isinstance(out.expr, Reduce) and out.expr.kind in ("max", "min") and \
                var in (v.name for v in out.expr.vars):
            kinds.add(out.expr.kind)
        else:
            return None
    return kinds.pop() if len(kinds) == 1 else None


def _mentions(i: Index, var: str) -> bool:
    return any(isinstance(n, Affine) and any(name == var for name, _ in n.terms)
               for n in index_nodes((i,)))


def _runnable_on_slices(traced: Traced, strategy: Strategy) -> bool:
    """A partition-n-reduce runs the operator itself on input slices, so every input that
    the reduction variable indexes must be cleanly split along it. (LayerNorm's mean is
    linear in its sum, but the variance reduces the same axis: no slice computes a partial.)"""
    indexed = {a.tensor.position for out in traced.outputs for e in walk(out.expr)
               if isinstance(e, Reduce) and strategy.var in (v.name for v in e.vars)
               for a in walk(e.body) if isinstance(a, Access)
               and any(_mentions(i, strategy.var) for i in a.indices)}
    return all(strategy.input_layouts[p].kind == "split" and
               strategy.input_layouts[p].halo == (0, 0) for p in indexed)


def strategies(traced: Traced, parts: int = 2) -> list[Strategy]:
    """Every strategy of a traced operator for a cut into ``parts``, output variables first.

    A variable whose extent ``parts`` does not divide is split into parts that differ by at
    most one (:func:`part_interval`); one shorter than ``parts`` is not split.
    """
    out_vars = list(dict.fromkeys(v.name for out in traced.outputs for v in out.vars))
    red_vars = list(dict.fromkeys(v.name for out in traced.outputs for e in walk(out.expr)
                                  if isinstance(e, Reduce) for v in e.vars))
    result = []
    for var in out_vars:
        if traced.extents[var] >= parts:
            result.append(_output_strategy(traced, var, parts))
    for var in red_vars:
        if var in out_vars or traced.extents[var] < parts:
            continue
        combine = _reduce_combine(traced, var)
        if combine is not None:
            strategy = _reduce_strategy(traced, var, parts, combine)
            if _runnable_on_slices(traced, strategy):
                result.append(strategy)
    return result


@dataclass(frozen=True)
class Work:
    """One device's share of an operator once every level's cut is applied: the operator's
    loop variables narrowed to sub-ranges (``ranges``), what that share reads and computes."""

    inputs: tuple[Region, ...]      # box of each input read, within bounds (None: not read)
    windows: tuple[Region, ...]     # the same boxes before clipping (reaching into padding)
    outputs: tuple[Region, ...]     # box of each output computed
    partial: str | None             # sum | max | min when the outputs are partial, else None


def work_regions(traced: Traced, ranges: Mapping[str, Interval], reduced: Sequence[str] = (),
                 not_first: Sequence[str] = ()) -> Work:
    """What one share of ``traced`` reads and computes when each variable in ``ranges`` runs
    over that sub-range only (the composition of several cuts). ``reduced``: the variables
    split by partition-n-reduce (the outputs are then partial); ``not_first``: those of them
    whose first part this share is not (it skips the terms added outside their sum)."""
    regions = _Regions(len(traced.inputs))
    split = {v: ranges[v] for v in ranges}
    outputs = []
    for out in traced.outputs:
        env = {v.name: ranges.get(v.name, (0, s - 1)) for v, s in zip(out.vars, out.shape)}
        if not_first:
            _collect_partial(out.expr, tuple(not_first), env, split, traced.extents, regions)
        else:
            _collect(out.expr, env, split, traced.extents, regions)
        outputs.append(tuple(env[v.name] for v in out.vars))
    partial = None
    if reduced:
        combines = {_reduce_combine(traced, v) for v in reduced}
        if len(combines) != 1 or None in combines:
            raise TDLError(f"{traced.op}: no single partition-n-reduce over {list(reduced)}")
        partial = combines.pop()
    return Work(regions.result(), regions.result_windows(), tuple(outputs), partial)


def pad_values(traced: Traced) -> tuple[float | None, ...]:
    """The value each input reads outside its bounds (``TensorRef.padded``), or None."""
    found: list[float | None] = [None] * len(traced.inputs)
    for out in traced.outputs:
        for e in walk(out.expr):
            if isinstance(e, Access) and e.pad is not None:
                found[e.tensor.position] = e.pad
    return tuple(found)


def opaque_strategies(entry: Opaque, input_shapes: Sequence[Sequence[int]],
                      output_shapes: Sequence[Sequence[int]], parts: int = 2) -> list[Strategy]:
    """The one strategy of an opaque operator with a batch axis: split that axis everywhere."""
    # a node may have fewer inputs (or outputs) than the entry names axes for
    in_axes = (list(entry.batch_axes) + [None] * len(input_shapes))[:len(input_shapes)]
    out_axes = (list(entry.output_batch_axes) + [None] * len(output_shapes))[:len(output_shapes)]
    if all(a is None for a in in_axes + out_axes):
        return []
    sizes = {s[a] for s, a in zip(list(input_shapes) + list(output_shapes), in_axes + out_axes)
             if a is not None}
    if len(sizes) != 1 or next(iter(sizes)) < parts:
        return []

    def regions(shape, axis):
        whole = tuple((0, n - 1) for n in shape)
        if axis is None:
            return tuple(whole for _ in range(parts))
        return tuple(whole[:axis] + (part_interval(shape[axis], parts, p),) + whole[axis + 1:]
                     for p in range(parts))

    ins = tuple(regions(s, a) for s, a in zip(input_shapes, in_axes))
    outs = tuple(regions(s, a) for s, a in zip(output_shapes, out_axes))
    return [Strategy("batch", "output", parts, ins, outs,
                     tuple(classify(r, s) for r, s in zip(ins, input_shapes)),
                     tuple(classify(r, s) for r, s in zip(outs, output_shapes)),
                     next(iter(sizes)))]
