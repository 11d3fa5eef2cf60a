"""Linear algebra: FullyConnected, dot, batch_dot, the _linalg_* products and khatri_rao."""
import numpy as np

from tofu_mx.tdl import (Shard, Sum, equal, greater_equal, lam, less_equal, log, op,
                         where)
from tofu_mx.tdl.lang import lift


def _fc_shard(attrs, ctx):
    changes = {"num_hidden": ctx.size(ctx.outputs[0])[-1]}
    if len(ctx.inputs) > 2 and ctx.inputs[2] is None:
        changes["no_bias"] = True
    return Shard(changes)


@op("FullyConnected", shard=_fc_shard, examples=[
    ({"num_hidden": 4}, [(2, 3), (4, 3), (4,)]),
    ({"num_hidden": 4, "no_bias": True}, [(2, 3), (4, 3)]),
    ({"num_hidden": 6, "flatten": False}, [(2, 3, 5), (6, 5), (6,)]),
    ({"num_hidden": 5}, [(2, 3, 2, 2), (5, 12), (5,)]),
])
def fully_connected(attrs, data, weight, bias=None):
    def plus_bias(value, o):
        return value if bias is None or attrs.get("no_bias", False) else value + bias[o]

    if not attrs.get("flatten", True) or data.ndim == 2:
        # y[..., o] = sum_i x[..., i] * w[o, i]
        lead = data.ndim - 1
        return lam(data.ndim, lambda *ix: plus_bias(
            Sum(lambda i: data[(*ix[:lead], i)] * weight[ix[lead], i]), ix[lead]))
    # flatten=True: every axis after the first is one input feature; weight's column index
    # is the row-major linear index of those axes (affine in the reduction variables).
    trailing = data.shape[1:]
    strides = [int(np.prod(trailing[k + 1:], dtype=np.int64)) for k in range(len(trailing))]

    def column(ks):
        return sum((k * s for k, s in zip(ks, strides)), 0)
    return lambda b, o: plus_bias(
        Sum(lam(len(trailing), lambda *ks: data[(b, *ks)] * weight[o, column(ks)], prefix="k")),
        o)


@op("dot", examples=[({}, [(2, 3), (3, 4)]), ({"transpose_a": True}, [(3, 2), (3, 4)]),
                     ({"transpose_b": True}, [(2, 3), (4, 3)]),
                     ({"transpose_a": True, "transpose_b": True}, [(3, 2), (4, 3)])])
def dot(attrs, lhs, rhs):
    """2-D: y[i, j] = sum_k a[i, k] * b[k, j], either side optionally transposed."""
    def a(i, k):
        return lhs[k, i] if attrs.get("transpose_a", False) else lhs[i, k]

    def b(k, j):
        return rhs[j, k] if attrs.get("transpose_b", False) else rhs[k, j]
    return lambda i, j: Sum(lambda k: a(i, k) * b(k, j))


@op("batch_dot", examples=[({}, [(2, 3, 4), (2, 4, 5)]), ({"transpose_b": True}, [(2, 3, 4), (2, 5, 4)]),
                           ({"transpose_a": True}, [(2, 4, 3), (2, 4, 5)])])
def batch_dot(attrs, lhs, rhs):
    """y[n, i, j] = sum_k a[n, i, k] * b[n, k, j], either side optionally transposed."""
    def a(n, i, k):
        return lhs[n, k, i] if attrs.get("transpose_a", False) else lhs[n, i, k]

    def b(n, k, j):
        return rhs[n, j, k] if attrs.get("transpose_b", False) else rhs[n, k, j]
    return lambda n, i, j: Sum(lambda k: a(n, i, k) * b(n, k, j))


# --- _linalg_*: the operators whose results are explicit sums ----------------------------------
# (Factorisations and solves -- potrf, potri, trsm, gelqf, syevd, inverse, det, slogdet -- are
# not sums of products of their inputs, and are not described.)

def _matrix(t, batch, row_axis, row, col, transpose=False):
    """``t`` at batch coordinates ``batch`` (the output's, whose row and last axes are
    replaced), row ``row`` on ``row_axis`` and column ``col`` on the last axis; swapped when
    ``transpose``."""
    if transpose:
        row, col = col, row
    index = list(batch)
    index[row_axis], index[-1] = row, col
    return t[tuple(index)]


def _row_axis(attrs, ndim):
    return int(attrs.get("axis", -2)) % ndim


def _product(attrs, A, B, i):
    """Sum_k op(A)[i row, k] * op(B)[k, i col] at output coordinates ``i``, rows on
    ``axis`` (default -2), columns on the last axis, every other axis a batch."""
    r = _row_axis(attrs, A.ndim)
    ta, tb = attrs.get("transpose_a", False), attrs.get("transpose_b", False)
    return Sum(lambda k: _matrix(A, i, r, i[r], k, ta) * _matrix(B, i, r, k, i[-1], tb))


def _gemm_shard(attrs, ctx):
    """A partial share of the product (a split of k) reads no C, so it cannot run as gemm."""
    return None if ctx.partial is not None and ctx.inputs[2] is None else Shard()


@op("_linalg_gemm", shard=_gemm_shard, examples=[
    ({}, [(3, 4), (4, 2), (3, 2)]),
    ({"alpha": 2.0, "beta": 0.5, "transpose_a": True}, [(4, 3), (4, 2), (3, 2)]),
    ({"transpose_b": True, "beta": -1.0}, [(2, 3, 4), (2, 5, 4), (2, 3, 5)]),
    ({"axis": 1, "alpha": 0.5}, [(2, 3, 4, 5), (2, 5, 4, 6), (2, 3, 4, 6)]),
])
def linalg_gemm(attrs, A, B, C):
    """out = alpha * op(A) op(B) + beta * C."""
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    return lam(A.ndim, lambda *i: alpha * _product(attrs, A, B, i) + beta * C[i], prefix="o")


@op("_linalg_gemm2", examples=[
    ({}, [(3, 4), (4, 2)]), ({"alpha": 2.0, "transpose_a": True}, [(4, 3), (4, 2)]),
    ({"transpose_a": True, "transpose_b": True}, [(2, 4, 3), (2, 5, 4)]),
    ({"axis": 1}, [(2, 3, 4, 5), (2, 5, 4, 6)]),
])
def linalg_gemm2(attrs, A, B):
    """out = alpha * op(A) op(B)."""
    alpha = float(attrs.get("alpha", 1.0))
    return lam(A.ndim, lambda *i: alpha * _product(attrs, A, B, i), prefix="o")


@op("_linalg_syrk", examples=[({}, [(3, 4)]), ({"transpose": True, "alpha": 2.0}, [(3, 4)]),
                              ({"alpha": 0.5}, [(2, 3, 5)])])
def linalg_syrk(attrs, A):
    """out = alpha * A A^T (A^T A with ``transpose``), over the last two axes."""
    alpha, t = float(attrs.get("alpha", 1.0)), attrs.get("transpose", False)
    r = A.ndim - 2

    def out(*i):
        return alpha * Sum(lambda k: _matrix(A, i, r, i[r], k, t) *
                           _matrix(A, i, r, i[r + 1], k, t))
    return lam(A.ndim, out, prefix="o")


@op("_linalg_trmm", examples=[
    ({}, [(3, 3), (3, 2)]), ({"transpose": True, "alpha": 2.0}, [(3, 3), (3, 2)]),
    ({"rightside": True}, [(3, 3), (2, 3)]), ({"lower": False}, [(3, 3), (3, 4)]),
    ({"lower": False, "rightside": True, "transpose": True}, [(2, 3, 3), (2, 4, 3)]),
])
def linalg_trmm(attrs, A, B):
    """out = alpha * op(T) B (B op(T) with ``rightside``), T the lower (upper) triangle of A:
    the other triangle is never read."""
    alpha = float(attrs.get("alpha", 1.0))
    lower, t = attrs.get("lower", True), attrs.get("transpose", False)
    right = attrs.get("rightside", False)
    r = A.ndim - 2

    def tri(i, row, col):
        """op(T)[row, col]: the mask is on A's own coordinates."""
        a_row, a_col = (col, row) if t else (row, col)
        keep = greater_equal(a_row, a_col) if lower else less_equal(a_row, a_col)
        return where(keep, _matrix(A, i, r, a_row, a_col), 0.0)

    def out(*i):
        if right:
            return alpha * Sum(lambda k: _matrix(B, i, r, i[r], k) * tri(i, k, i[r + 1]))
        return alpha * Sum(lambda k: tri(i, i[r], k) * _matrix(B, i, r, k, i[r + 1]))
    return lam(A.ndim, out, prefix="o")


def _positive_diagonal_examples():
    # random test data are in [-1, 1): a negative diagonal entry makes the log NaN (in both);
    # many 1x1 and 2x2 matrices give rows with finite sums to compare.
    return [({}, [(8, 1, 1)]), ({}, [(6, 2, 2)]), ({}, [(3, 3)]), ({}, [(2, 2, 3, 3)])]


@op("_linalg_sumlogdiag", examples=_positive_diagonal_examples())
def linalg_sumlogdiag(attrs, A):
    """out[b] = Sum_i log A[b, i, i]; a single matrix gives shape (1,)."""
    lead = A.ndim - 2
    if lead == 0:
        return lambda o: Sum(lambda d: log(A[d, d]))
    return lam(lead, lambda *b: Sum(lambda d: log(A[(*b, d, d)])), prefix="o")


def _diagonal_block(attrs, ctx):
    """A share reads the block of A whose main diagonal is the share's part of diagonal k
    (rows shifted by -min(k, 0), columns by max(k, 0)): it extracts that with offset 0."""
    return Shard({"offset": 0})


@op("_linalg_extractdiag", shard=_diagonal_block,
    examples=[({}, [(3, 3)]), ({"offset": 1}, [(2, 4, 4)]), ({"offset": -2}, [(2, 4, 4)])])
def linalg_extractdiag(attrs, A):
    """out[.., t] = A[.., t - min(k, 0), t + max(k, 0)] for offset k."""
    k = int(attrs.get("offset", 0))
    lead = A.ndim - 2
    return lam(lead + 1, lambda *i: A[(*i[:lead], i[lead] - min(k, 0), i[lead] + max(k, 0))],
               prefix="o")


@op("_linalg_makediag", examples=[({}, [(3,)]), ({"offset": 1}, [(2, 3)]),
                                  ({"offset": -2}, [(2, 3)])])
def linalg_makediag(attrs, A):
    """An (n+|k|) square matrix, zero but for A on diagonal k."""
    k = int(attrs.get("offset", 0))
    lead = A.ndim - 1

    def out(*i):
        r, c = i[lead], i[lead + 1]
        along = r if k >= 0 else c       # the position on the diagonal
        return where(equal(c - r, k), A[(*i[:lead], along)], 0.0)
    return lam(lead + 2, out, prefix="o")


def _trian_side(attrs):
    """(|k|, upper): upper for k > 0, or k = 0 with lower=False."""
    k = int(attrs.get("offset", 0))
    return abs(k), k > 0 or (k == 0 and not attrs.get("lower", True))


def _packed(p, q):
    """The position of (p, q), q <= p, in a row-major packed lower triangle, as a value."""
    return lift(p) * (lift(p) + 1.0) / 2.0 + lift(q)


def _whole_triangle(attrs, ctx):
    """A share extracts whole triangles (of some matrices of the batch): a sub-block of a
    matrix packs another triangle."""
    box, shape = ctx.outputs[0], ctx.output_shapes[0]
    return Shard() if box[-1] == (0, shape[-1] - 1) else None


@op("_linalg_extracttrian", shard=_whole_triangle, examples=[({}, [(3, 3)]), ({"lower": False}, [(2, 3, 3)]),
                                      ({"offset": 1}, [(2, 4, 4)]),
                                      ({"offset": -1}, [(4, 4)])])
def linalg_extracttrian(attrs, A):
    """The triangle, packed row by row: out[.., t] is A at the (p, q), q <= p < m, with
    p(p+1)/2 + q = t (of the lower triangle below diagonal -|k|; the upper one read
    transposed)."""
    shift, upper = _trian_side(attrs)
    lead = A.ndim - 2
    m = A.shape[-1] - shift

    def at(b, p, q):
        row, col = p + shift, q
        return A[(*b, col, row)] if upper else A[(*b, row, col)]

    def out(*i):
        b, t = i[:lead], i[lead]
        return Sum(lambda p, q: where(less_equal(q, p), where(
            equal(_packed(p, q), t), at(b, p, q), 0.0), 0.0), m, m)
    return lam(lead + 1, out, prefix="o")


@op("_linalg_maketrian", examples=[({}, [(6,)]), ({"lower": False}, [(2, 3)]),
                                   ({"offset": 1}, [(2, 6)]), ({"offset": -2}, [(3,)])])
def linalg_maketrian(attrs, A):
    """The inverse of extracttrian: an (m+|k|) square matrix, zero outside the triangle."""
    shift, upper = _trian_side(attrs)
    lead = A.ndim - 1

    def out(*i):
        b, r, c = i[:lead], i[lead], i[lead + 1]
        if upper:
            r, c = c, r
        p, q = r - shift, c
        return where(less_equal(q, p), Sum(lambda t: where(
            equal(lift(t), _packed(p, q)), A[(*b, t)], 0.0)), 0.0)
    return lam(lead + 2, out, prefix="o")


@op("khatri_rao", examples=[({"num_args": 2}, [(2, 3), (4, 3)]),
                            ({"num_args": 3}, [(2, 2), (3, 2), (2, 2)]),
                            ({"num_args": 1}, [(3, 4)])])
def khatri_rao(attrs, *matrices):
    """The column-wise Kronecker product: out[r, c] = prod_i M_i[r_i, c], r the row-major
    index of (r_0, r_1, ..) (the first matrix's row varies slowest)."""
    rows = [m.shape[0] for m in matrices]
    strides = [int(np.prod(rows[k + 1:], dtype=np.int64)) for k in range(len(rows))]

    def out(r, c):
        value = None
        for m, n, s in zip(matrices, rows, strides):
            read = m[(r // s) % n, c]
            value = read if value is None else value * read
        return value
    return out
