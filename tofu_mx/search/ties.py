"""Tying the copies of an unrolled RNN step (coarsening rule 3 of :mod:`tofu_mx.search.cut`),
as plain data: no graph, no shapes.

Input: a ``signature`` id per copy of a group of operators (copies with one structure
have one id), the copies reading each parameter, and the copies each copy reads from. Two
copies may be tied only when their signatures are equal. The rule:

1. copies that read the same parameter with the same signature are tied;
2. repeatedly, for each *family* (a set of tied copies) of two or more and for each
   signature, the copies its members feed (or are fed by) with that signature are tied
   when there are exactly as many as the family has members and no two of them are tied
   already; until no pass ties anything.

The passes are order-dependent (a tie made early in a pass can stop a later one), so the
order is fixed: families in increasing order of their smallest copy, successors before
predecessors. (Within one family's examination the order does not matter: neighbours of
different signatures are never tied together.) A family whose
membership has not changed since it was last examined cannot tie anything new (its
candidate sets are the same, and ties only ever make them less distinct), so each pass
examines only the families that grew in the previous one; the result is that of
examining every family in every pass.
"""
from __future__ import annotations

from typing import Sequence


def readers(params_of: Sequence[Sequence[int]]) -> list[list[int]]:
    """For each parameter (in order of first reading), the copies reading it, in order, with
    repeats. ``params_of[c]``: the parameters copy ``c`` reads, in input order."""
    found: dict[int, list[int]] = {}
    for c, params in enumerate(params_of):
        for p in params:
            found.setdefault(p, []).append(c)
    return list(found.values())


def _neighbours(producers_of: Sequence[Sequence[int]]) -> tuple[list[set[int]], list[set[int]]]:
    """``(successors, predecessors)`` of each copy; ``producers_of[c]``: the copies whose
    outputs copy ``c`` reads, in input order (``c`` itself left out)."""
    succ: list[set[int]] = [set() for _ in producers_of]
    pred: list[set[int]] = [set() for _ in producers_of]
    for c, producers in enumerate(producers_of):
        for u in producers:
            succ[u].add(c)
            pred[c].add(u)
    return succ, pred


class _Families:
    """Union-find over the copies; a union joins two families of one signature only."""

    def __init__(self, signature: Sequence[int]):
        self.signature = signature
        self.parent = list(range(len(signature)))
        self.members: dict[int, list[int]] = {}    # root -> its family, families of 2 or more
        self.grown: set[int] = set()               # roots of families that grew

    def find(self, a: int) -> int:
        parent = self.parent
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def union(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a == b or self.signature[a] != self.signature[b]:
            return
        a, b = min(a, b), max(a, b)
        self.parent[b] = a
        self.members[a] = self.members.pop(a, [a]) + self.members.pop(b, [b])
        self.grown.add(a)


def tie(signature: Sequence[int], readers: Sequence[Sequence[int]],
        producers_of: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """The families of tied copies (each in increasing order; the families in increasing
    order of their first copy; every copy in one). ``readers``: :func:`readers`;
    ``producers_of[c]``: the copies copy ``c`` reads from, in input order, itself left out."""
    families = _Families(signature)
    for ks in readers:
        first_of: dict[int, int] = {}
        for k in ks:
            families.union(first_of.setdefault(signature[k], k), k)
    examined: dict[int, int] = {}     # root -> size of its family when last examined
    pending = sorted(families.members)
    succ, pred = _neighbours(producers_of) if pending else ([], [])
    while pending:
        snapshot = [(r, sorted(families.members[r])) for r in pending]
        families.grown = set()
        for root, members in snapshot:
            if examined.get(root) == len(members):
                continue
            examined[root] = len(members)
            for neighbours in (succ, pred):
                _tie_neighbours(families, members, neighbours)
        pending = sorted({families.find(r) for r in families.grown})
    found: dict[int, list[int]] = {}
    for k in range(len(signature)):
        found.setdefault(families.find(k), []).append(k)
    return tuple(tuple(f) for f in found.values())


def _tie_neighbours(families: _Families, members: list[int],
                    neighbours: Sequence[set[int]]) -> None:
    """Tie, per signature, the neighbours of a family's members when there is one per member
    and no two are tied yet."""
    by_signature: dict[int, list[int]] = {}
    for k in members:
        for n in neighbours[k]:
            by_signature.setdefault(families.signature[n], []).append(n)
    for ns in by_signature.values():
        if len(ns) == len(members) and len(set(map(families.find, ns))) == len(ns):
            for n in ns[1:]:
                families.union(ns[0], n)
