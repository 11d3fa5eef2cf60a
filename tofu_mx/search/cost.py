"""The cost model: bytes moved to convert a tensor between layouts, for one cut into ``p``
parts. Every figure is the total over all parts, in bytes.

A tensor is *stored* split along one axis (each part holds ``1/p``), or replicated when it is
small and the option allows. An operator's strategy says which region of each input each
part reads (:mod:`tofu_mx.tdl.analysis`); the part fetches what it does not hold. The
backward pass mirrors each conversion (the gradient of a fetch is a reduction of the same
bytes; of a reduce-scatter, an all-gather), so a tensor that needs a gradient pays twice. A
converted input that a gradient reads and that the backward pass fetches again
(``SearchOptions.refetch``) pays its forward fetch once more.

These are the bytes moved. The search may minimise more: with ``SearchOptions.memory_weight``
the converted copies kept and the bytes stored above an even share, weighted; with
``SearchOptions.conversion_bytes`` a fixed price for each pass that runs a conversion (a
reader fetching bytes or reading a converted copy, an output brought into its stored
layout), what a transfer's latency and its operators' launches cost whatever the bytes
(:meth:`tofu_mx.search.cut.Cut._edge_matrices`). ``Plan.total_bytes`` stays the bytes.

Closed forms (``S`` the tensor's bytes), each tested:

==============================  ===========================
split(a) -> split(a)            0
split(a) -> split(b), b != a    S (p - 1) / p
split -> replicated             S (p - 1)               (all-gather)
partial -> split                S (p - 1)               (reduce-scatter)
partial -> replicated           2 S (p - 1)             (all-reduce)
split -> split + halo h         2 h r (p - 1)           (r: bytes of one slice of the axis)
replicated, gradient, read      2 S (p - 1)             (backward all-reduce)
whole by every part
replicated, gradient, read      S (p - 1)               (backward all-gather)
in disjoint slices
==============================  ===========================
"""
from __future__ import annotations

from typing import Sequence

from tofu_mx.tdl.analysis import part_interval

Interval = tuple[int, int]
Box = tuple[Interval, ...]


def volume(box: Box | None) -> int:
    """Elements in a box of inclusive intervals (0 for None or an empty box)."""
    if box is None:
        return 0
    n = 1
    for lo, hi in box:
        if hi < lo:
            return 0
        n *= hi - lo + 1
    return n


def intersect(a: Box | None, b: Box | None) -> Box | None:
    if a is None or b is None:
        return None
    return tuple((max(x[0], y[0]), min(x[1], y[1])) for x, y in zip(a, b))


def stored_regions(layout: tuple, shape: Sequence[int], parts: int) -> list[Box]:
    """What each part holds of a tensor stored as ``("split", axis)`` or ``("replicated",)``."""
    whole = tuple((0, n - 1) for n in shape)
    if layout[0] == "replicated":
        return [whole] * parts
    axis = layout[1]
    return [whole[:axis] + (part_interval(shape[axis], parts, p),) + whole[axis + 1:]
            for p in range(parts)]


def fetch_elements(held: Sequence[Box | None], needed: Sequence[Box | None]) -> int:
    """Elements the parts must receive: what each needs and does not hold."""
    return sum(volume(n) - volume(intersect(n, h)) for h, n in zip(held, needed))


def reduce_scatter_bytes(size: int, parts: int) -> int:
    """Partial sums (full size on every part) summed into a split layout."""
    return size * (parts - 1)


def all_gather_bytes(size: int, parts: int) -> int:
    """A split tensor made whole on every part."""
    return size * (parts - 1)


def all_reduce_bytes(size: int, parts: int) -> int:
    """Partial sums summed into a whole copy on every part (reduce-scatter + all-gather)."""
    return 2 * size * (parts - 1)


def partial_to_stored_bytes(size: int, parts: int, layout: tuple) -> int:
    if layout[0] == "replicated":
        return all_reduce_bytes(size, parts)
    return reduce_scatter_bytes(size, parts)


def replicated_gradient_elements(shape: Sequence[int], needed: Sequence[Box | None]) -> int:
    """Keeping a tensor stored whole on every part consistent when a consumer computes its
    gradient: the parts' contributions that overlap are reduced (twice: reduce-scatter and
    all-gather), and what a part did not compute it receives."""
    size = volume(tuple((0, n - 1) for n in shape))
    read = [volume(n) for n in needed]
    overlap = max(sum(read) - size, 0)
    return 2 * overlap + sum(size - r for r in read)


def consumer_bytes(layout: tuple, shape: Sequence[int], needed: Sequence[Box | None],
                   itemsize: int, needs_grad: bool, again: bool = False) -> int:
    """Forward fetch of what a consumer's strategy reads, plus its backward mirror (for a
    tensor stored whole: the reduction that keeps its replicas' gradients equal); ``again``:
    the backward pass fetches it once more (re-fetched, not kept)."""
    forward = fetch_elements(stored_regions(layout, shape, len(needed)), needed) * itemsize
    refetched = forward if again else 0
    if not needs_grad:
        return forward + refetched
    if layout[0] == "replicated":
        return forward + refetched + replicated_gradient_elements(shape, needed) * itemsize
    return 2 * forward + refetched


def converted_bytes(layout: tuple, shape: Sequence[int], needed: Sequence[Box | None],
                    itemsize: int) -> int:
    """Bytes of the converted copies a consumer reads: every part that needs anything but
    exactly what it holds reads a new tensor (joined, cut or padded) of the needed size."""
    held = stored_regions(layout, shape, len(needed))
    return sum(volume(n) for h, n in zip(held, needed)
               if n is not None and tuple(n) != tuple(h)) * itemsize


def producer_bytes(layout: tuple, shape: Sequence[int], produced: Sequence[Box | None],
                   partial: bool, itemsize: int, needs_grad: bool) -> int:
    """Bytes to bring what a strategy computes into the stored layout, and back in backward.

    A partial output is reduce-scattered (all-reduced when stored whole); backward broadcasts
    the gradient the same way. Otherwise the forward fetch is what the storage needs and the
    computation did not produce, and the backward fetch is what the computation produced and
    the storage does not hold (a replicated computation needs its whole output gradient).
    """
    parts = len(produced)
    if partial:
        size = volume(tuple((0, n - 1) for n in shape)) * itemsize
        forward = partial_to_stored_bytes(size, parts, layout)
        return forward * (2 if needs_grad else 1)
    stored = stored_regions(layout, shape, parts)
    forward = fetch_elements(produced, stored) * itemsize
    backward = fetch_elements(stored, produced) * itemsize if needs_grad else 0
    return forward + backward
