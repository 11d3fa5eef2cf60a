"""The search problem of one cut, as plain data: a labelling problem.

Each node (a coarsened group of operators and tensors) picks one of its choices; the cost is
the sum of a per-node cost of that choice and, for each edge, a cost that depends on the
choices at both ends::

    cost(x) = sum_v unary[v][x_v] + sum_(u, v) pair[u, v][x_u, x_v]

The solvers (:mod:`tofu_mx.search.dp`, :mod:`tofu_mx.search.exact`) see nothing else: no
MXNet, no shapes. :mod:`tofu_mx.search.cut` builds this problem from an analysed graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import repeat
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class EdgeArrays:
    """A problem's edges as arrays: edge ``e`` is ``(u[e], v[e], matrices[which[e]])``
    (problems of hundreds of thousands of edges share a few matrices)."""

    u: np.ndarray
    v: np.ndarray
    which: np.ndarray
    matrices: list[np.ndarray]


@dataclass(frozen=True)
class Problem:
    names: tuple[str, ...]                         # one per node
    choices: tuple[tuple[str, ...], ...]           # labels of each node's choices
    unary: tuple[np.ndarray, ...]                  # unary[v][c]
    edges: tuple[tuple[int, int, np.ndarray], ...]  # (u, v, pair[c_u, c_v]), u < v, no repeats
    #: the same edges as arrays, where :func:`make_indexed_problem` made them
    indexed: EdgeArrays | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        counts = list(map(len, self.choices))
        if 0 in counts or [c.shape for c in self.unary] != [(k,) for k in counts]:
            for v, (count, cost) in enumerate(zip(counts, self.unary)):
                if count == 0 or cost.shape != (count,):
                    raise ValueError(f"node {self.names[v]!r}: {count} choices, unary cost "
                                     f"of shape {cost.shape}")
            raise ValueError(f"{len(counts)} nodes' choices, {len(self.unary)} unary costs")
        if self.indexed is not None:     # checked over the arrays, each matrix once
            u, v, which, matrices = (self.indexed.u, self.indexed.v, self.indexed.which,
                                     self.indexed.matrices)
            shapes = np.array([m.shape for m in matrices], dtype=np.int64).reshape(-1, 2)
            count = np.array(counts, dtype=np.int64)
            bad = np.flatnonzero((u >= v) | (shapes[which, 0] != count[u]) |
                                 (shapes[which, 1] != count[v]))
            if len(bad) or len(u) != len(self.edges):
                e = int(bad[0]) if len(bad) else 0
                raise ValueError(f"edge ({u[e]}, {v[e]}) with matrix "
                                 f"{matrices[which[e]].shape} does not fit")
            return
        for u, v, m in self.edges:
            if not u < v or m.shape != (counts[u], counts[v]):
                raise ValueError(f"edge ({u}, {v}) with matrix {m.shape} does not fit")

    def cost(self, assignment: Sequence[int]) -> float:
        """Total cost of one choice per node."""
        total = sum(float(c[x]) for c, x in zip(self.unary, assignment))
        return total + sum(float(m[assignment[u], assignment[v]]) for u, v, m in self.edges)


def make_problem(names: Sequence[str], choices: Sequence[Sequence[str]],
                 unary: Sequence[np.ndarray],
                 edges: Sequence[tuple[int, int, np.ndarray]]) -> Problem:
    """A :class:`Problem`, with edges oriented ``u < v``, parallel edges summed and self
    edges folded into the unary costs."""
    unary = [np.array(c, dtype=np.float64) for c in unary]
    merged: dict[tuple[int, int], np.ndarray] = {}
    for u, v, m in edges:
        m = np.asarray(m, dtype=np.float64)
        if u == v:
            unary[u] += m.diagonal()     # unary[u] is this function's own copy
            continue
        if u > v:
            u, v, m = v, u, m.T
        merged[(u, v)] = merged[(u, v)] + m if (u, v) in merged else m
    return Problem(tuple(names), tuple(tuple(c) for c in choices), tuple(unary),
                   tuple((u, v, m) for (u, v), m in sorted(merged.items())))


def make_indexed_problem(names: Sequence[str], choices: Sequence[Sequence[str]],
                         unary: Sequence[np.ndarray], u: np.ndarray, v: np.ndarray,
                         which: np.ndarray, matrices: Sequence[np.ndarray]) -> Problem:
    """:func:`make_problem` of the edges ``(u[e], v[e], matrices[which[e]])``, summed in the
    same order (so the same floating-point values), with the edges as arrays: for problems
    of hundreds of thousands of edges sharing a few matrices. A node's unary cost is copied
    only where a self edge adds to it (once per distinct cost and self edges: the result is
    shared, read-only); the matrices are used as given (read-only)."""
    unary = list(unary)
    u, v, which = (np.asarray(x, dtype=np.int64) for x in (u, v, which))
    self_edge = u == v
    _add_self_edges(unary, u[self_edge], which[self_edge], matrices)
    u, v, which = u[~self_edge], v[~self_edge], which[~self_edge]
    low, high, flip = np.minimum(u, v), np.maximum(u, v), u > v
    order = np.lexsort((np.arange(len(low)), high, low))    # by (u, v), then as given
    low, high, flip, which = low[order], high[order], flip[order], which[order]
    first = np.ones(len(low), dtype=bool)
    first[1:] = (low[1:] != low[:-1]) | (high[1:] != high[:-1])
    starts = np.flatnonzero(first)
    # each matrix as float64 once, then each transposed (shared, as the matrices are): an
    # edge's oriented matrix is number ``which`` (+ the count, flipped) of these
    oriented = [np.asarray(m, dtype=np.float64) for m in matrices]
    oriented += [m.T for m in oriented]
    pick = which + flip * (len(oriented) // 2)
    chosen = list(map(oriented.__getitem__, pick.tolist()))
    found = [chosen[a] for a in starts.tolist()]
    final = pick[starts]        # each edge's matrix in ``oriented`` (summed ones appended)
    # parallel edges (the rest of a run of one (u, v)) summed onto its first, in order
    counts = np.diff(np.append(starts, len(low)))
    for k in np.flatnonzero(counts > 1).tolist():
        a = int(starts[k])
        m = chosen[a]
        for e in range(a + 1, a + int(counts[k])):
            m = m + chosen[e]
        found[k] = m
        final[k] = len(oriented)
        oriented.append(m)
    first_u, first_v = low[starts], high[starts]
    edges = list(zip(first_u.tolist(), first_v.tolist(), found))
    return Problem(tuple(names), tuple(map(tuple, choices)),
                   tuple(map(np.asarray, unary, repeat(np.float64))), tuple(edges),
                   EdgeArrays(first_u, first_v, final, oriented))


def distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True)`` for rows of non-negative integers,
    through one integer per row where the columns' ranges allow (sorting rows as bytes is
    slow)."""
    if not len(rows):
        return rows, np.zeros(0, dtype=np.int64)
    ranges = [int(x) + 1 for x in rows.max(axis=0)]
    if math.prod(ranges) >= 1 << 62:
        distinct, which = np.unique(rows, axis=0, return_inverse=True)
        return distinct, which.reshape(-1)
    combined = np.zeros(len(rows), dtype=np.int64)
    for column, n in zip(rows.T, ranges):
        combined = combined * n + column
    _, first, which = np.unique(combined, return_index=True, return_inverse=True)
    return rows[first], which.reshape(-1)


def by_first_appearance(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each item's label (integers) as a number counting the distinct labels in order of
    their first item, and that first item of each, in that order."""
    _, first, which = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[which.reshape(-1)], first[order]


def _add_self_edges(unary: list, nodes: np.ndarray, which: np.ndarray,
                    matrices: Sequence[np.ndarray]) -> None:
    """``unary[node]`` plus the diagonal of each of its self edges' matrices (``nodes``,
    ``which``), in order, for each node with some. Nodes sharing a unary cost (one array)
    and self edges share the sum too (read-only): made once per distinct pair."""
    if not len(nodes):
        return
    count = np.bincount(nodes)
    single = count[nodes] == 1
    # one self edge (most nodes): by (their unary array, the matrix), all at once
    ones, ms = nodes[single], which[single]
    _, array_of = np.unique(np.fromiter((id(unary[x]) for x in ones.tolist()), np.int64,
                                        len(ones)), return_inverse=True)
    pairs, pair_of = distinct_rows(np.stack([array_of.reshape(-1), ms], axis=1))
    firsts = np.zeros(len(pairs), dtype=np.int64)
    firsts[pair_of[::-1]] = np.arange(len(ones))[::-1]      # the first node of each pair
    totals = []
    for x, m in zip(ones[firsts].tolist(), pairs[:, 1].tolist()):
        total = np.array(unary[x], dtype=np.float64)
        total += matrices[m].diagonal()
        total.flags.writeable = False
        totals.append(total)
    for x, k in zip(ones.tolist(), pair_of.tolist()):
        unary[x] = totals[k]
    # several: each node's matrices in order, keyed alike (the memo keeps each array it is
    # keyed by alive, so that the id stays its own)
    adds: dict[int, list[int]] = {}
    for x, m in zip(nodes[~single].tolist(), which[~single].tolist()):
        adds.setdefault(x, []).append(m)
    summed: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for x, ms in adds.items():
        key = (id(unary[x]), tuple(ms))
        found = summed.get(key)
        if found is None:
            total = np.array(unary[x], dtype=np.float64)
            for m in ms:
                total += matrices[m].diagonal()
            total.flags.writeable = False
            found = summed[key] = (total, unary[x])
        unary[x] = found[0]
