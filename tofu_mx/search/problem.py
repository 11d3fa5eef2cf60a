"""The search problem of one cut, as plain data: a labelling problem.

Each node (a coarsened group of operators and tensors) picks one of its choices; the cost is
the sum of a per-node cost of that choice and, for each edge, a cost that depends on the
choices at both ends::

    cost(x) = sum_v unary[v][x_v] + sum_(u, v) pair[u, v][x_u, x_v]

The solvers (:mod:`tofu_mx.search.dp`, :mod:`tofu_mx.search.exact`) see nothing else: no
MXNet, no shapes. :mod:`tofu_mx.search.cut` builds this problem from an analysed graph.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Problem:
    names: tuple[str, ...]                         # one per node
    choices: tuple[tuple[str, ...], ...]           # labels of each node's choices
    unary: tuple[np.ndarray, ...]                  # unary[v][c]
    edges: tuple[tuple[int, int, np.ndarray], ...]  # (u, v, pair[c_u, c_v]), u < v, no repeats

    def __post_init__(self):
        counts = [len(labels) for labels in self.choices]
        for v, (count, cost) in enumerate(zip(counts, self.unary)):
            if count == 0 or cost.shape != (count,):
                raise ValueError(f"node {self.names[v]!r}: {count} choices, unary cost "
                                 f"of shape {cost.shape}")
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
    only where a self edge adds to it; the matrices are used as given (read-only)."""
    unary = list(unary)
    u, v, which = (np.asarray(x, dtype=np.int64) for x in (u, v, which))
    self_edge = u == v
    copied = set()
    for node, m in zip(u[self_edge].tolist(), which[self_edge].tolist()):
        if node not in copied:
            unary[node] = np.array(unary[node], dtype=np.float64)
            copied.add(node)
        unary[node] += matrices[m].diagonal()
    u, v, which = u[~self_edge], v[~self_edge], which[~self_edge]
    low, high, flip = np.minimum(u, v), np.maximum(u, v), u > v
    order = np.lexsort((np.arange(len(low)), high, low))    # by (u, v), then as given
    low, high, flip, which = low[order], high[order], flip[order], which[order]
    first = np.ones(len(low), dtype=bool)
    first[1:] = (low[1:] != low[:-1]) | (high[1:] != high[:-1])
    starts = np.flatnonzero(first).tolist()
    ends = starts[1:] + [len(low)]
    low_, high_, which_ = low.tolist(), high.tolist(), which.tolist()
    # each matrix as float64 once, and its transpose (shared, as the matrices are)
    oriented = ([np.asarray(m, dtype=np.float64) for m in matrices],)
    oriented += ([m.T for m in oriented[0]],)
    side = flip.astype(np.int64).tolist()
    edges = []
    for a, b in zip(starts, ends):
        m = oriented[side[a]][which_[a]]
        for e in range(a + 1, b):
            m = m + oriented[side[e]][which_[e]]
        edges.append((low_[a], high_[a], m))
    return Problem(tuple(names), tuple(tuple(c) for c in choices),
                   tuple(np.asarray(c, dtype=np.float64) for c in unary), tuple(edges))
