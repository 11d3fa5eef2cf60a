"""Bytes moved against memory per device: the plans the search finds as the memory weight
grows, each measured after the rewrite, and the fewest-bytes plan that fits a budget.

A plan either keeps the converted inputs a gradient reads until the backward pass, or
fetches them again there (``SearchOptions.refetch``: less memory, more bytes, and the
operators reading them run twice). A keeping plan's memory weight prices each byte kept in
bytes moved: weight 0 moves the fewest bytes (Tofu's objective), larger weights keep less
and move more. Memory is :meth:`PartitionedSymbol.memory_per_device` (with the optimizer
state the options expect), so it counts the converted copies the rewrite really keeps.

**Under a budget** (:func:`fit_budget`) the weight is searched, not laddered: the given
weight first; if its plan does not fit, the weight is multiplied by 4 until one fits (up to
:data:`MAX_WEIGHT`), then bisected (geometrically) between the last weight that did not fit
and the first that did, keeping the fewest-bytes plan that fits (among these and the
re-fetching plan, when it is allowed).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from tofu_mx.errors import NoFeasiblePlanError
from tofu_mx.summary import format_bytes

#: the largest memory weight tried under a budget (a kept byte costs this many bytes moved)
MAX_WEIGHT = 4096.0
#: geometric bisection steps between a weight that does not fit and one that does
BISECTION_STEPS = 4
#: the weights frontier() tries by default
FRONTIER_WEIGHTS = (0.0, 0.25, 1.0, 4.0, 16.0, 64.0, 256.0)


@dataclass(frozen=True)
class TradeOff:
    """One plan: its memory weight, the bytes it moves per step and each device's memory."""

    memory_weight: float
    bytes_moved: float
    memory: tuple[int, ...]          # bytes per device, optimizer state included
    detail: tuple = ()               # per device, what the bytes are (DeviceMemory rows)
    refetch: bool = False            # converted inputs fetched again in the backward pass
    keep_share: float = 0.0          # ... but for those kept within this share of memory

    @property
    def worst(self) -> int:
        return max(self.memory)

    @property
    def backward(self) -> str:
        """What the backward pass does with converted inputs, for display."""
        if not self.refetch:
            return "keep"
        return f"re-fetch, keep {self.keep_share:.0%}" if self.keep_share else "re-fetch all"


@dataclass(frozen=True)
class Frontier:
    """The Pareto front of the plans found: none of them moves fewer bytes *and* holds less."""

    points: tuple[TradeOff, ...]     # fewest bytes first (so most memory first)
    ideal: float                     # one device's memory / k

    def report(self) -> str:
        lines = ["bytes moved against memory per device (Pareto front of the plans found):",
                 f"  {'backward':>17}  {'memory weight':>13}  {'bytes moved':>12}  "
                 f"{'worst device':>12}  {'/ ideal':>7}"]
        for p in self.points:
            lines.append(f"  {p.backward:>17}  {p.memory_weight:>13g}  {format_bytes(p.bytes_moved):>12}"
                         f"  {format_bytes(p.worst):>12}  {p.worst / self.ideal:>7.3f}")
        lines.append(f"  (ideal: one device's memory / k = {format_bytes(self.ideal)})")
        return "\n".join(lines)


def pareto(points: Sequence[TradeOff]) -> tuple[TradeOff, ...]:
    """The points no other point beats in both bytes and memory, fewest bytes first (ties:
    the smaller weight)."""
    ordered = sorted(points, key=lambda p: (p.bytes_moved, p.worst, p.refetch, p.memory_weight,
                                            -p.keep_share))
    front, least = [], math.inf
    for p in ordered:
        if p.worst < least:
            front.append(p)
            least = p.worst
    return tuple(front)


Measure = Callable[[float], "tuple[TradeOff, object]"]   # weight -> (its trade-off, its result)


def fit_budget(measure: Measure, budgets: Sequence[float], start: float = 0.0,
               others: Sequence[tuple[TradeOff, object]] = ()):
    """The result of ``measure(weight)`` moving the fewest bytes among those whose every
    device fits its budget, searching the weight as the module says, or of ``others`` (plans
    measured already: the re-fetching one) when one of them fits and moves fewer;
    NoFeasiblePlanError (the smallest footprint found) if none fits up to
    :data:`MAX_WEIGHT`."""
    seen: dict[float, tuple[TradeOff, object]] = {}

    def fits(weight: float) -> bool:
        if weight not in seen:
            seen[weight] = measure(weight)
        return all(m <= b for m, b in zip(seen[weight][0].memory, budgets))
    low, high = None, start
    while not fits(high):
        low, high = high, max(high * 4, 1.0)
        if high > MAX_WEIGHT:
            break
    if high <= MAX_WEIGHT and low is not None:
        for _ in range(BISECTION_STEPS):
            middle = math.sqrt(max(low, 0.25) * high) if low else high / 4
            if middle <= low or middle >= high:
                break
            if fits(middle):
                high = middle
            else:
                low = middle
    tried = [*seen.values(), *others]
    fitting = [(t, r) for t, r in tried if all(m <= b for m, b in zip(t.memory, budgets))]
    if fitting:
        return min(fitting, key=lambda tr: (tr[0].bytes_moved, tr[0].memory_weight))[1]
    best = min(tried, key=lambda tr: tr[0].worst)[0]
    device = max(range(len(budgets)), key=lambda d: best.memory[d] - budgets[d])
    what = ""
    if best.detail:
        m = best.detail[device]
        what = (f" (weights {format_bytes(m.weights)}, gradients {format_bytes(m.gradients)}, "
                f"optimizer {format_bytes(m.optimizer)}, activations "
                f"{format_bytes(m.activations)})")
    how = best.backward if best.refetch else f"memory weight {best.memory_weight:g}"
    raise NoFeasiblePlanError(
        f"no partition fits: the plan holding least ({how}, "
        f"{format_bytes(best.bytes_moved)} moved per step) needs {format_bytes(best.memory[device])}"
        f"{what} on device {device} but its budget is {format_bytes(budgets[device])}; use more "
        f"devices, a smaller batch, or a larger budget", best.worst)


def trade_off(ptd, weight: float, optimizer_state: float, keep_share: float = 0.0) -> TradeOff:
    """A partitioned symbol's bytes moved and memory per device (optimizer state as the
    options expect: that many bytes per weight byte); ``keep_share``: its plan's
    (SearchOptions.keep_share), when it re-fetches."""
    rows = tuple(dataclasses.replace(m, optimizer=int(m.weights * optimizer_state))
                 for m in ptd.memory_per_device())
    return TradeOff(weight, ptd.plan.exact_bytes, tuple(m.total for m in rows), rows,
                    ptd.plan.refetch, keep_share if ptd.plan.refetch else 0.0)


__all__ = ["FRONTIER_WEIGHTS", "Frontier", "MAX_WEIGHT", "TradeOff", "fit_budget", "pareto",
           "trade_off"]
