"""Multi-head attention's interleaved matrix products (GluonNLP's BERT and Transformer) and
div_sqrt_dim.

Layout (MXNet's ``transformer.cc``): with ``heads`` H and head size D, the self-attention
projection ``queries_keys_values`` is (L, B, 3*H*D), each head's block of 3D channels holding
its query, key and value in turn: head h's query is channels [3Dh, 3Dh+D), its key the next D,
its value the next D. Encoder-decoder attention has ``queries`` (Lq, B, H*D), one block of D
per head, and ``keys_values`` (Lk, B, 2*H*D), per head its key then its value. The attention
maps are (B*H, Lq, Lk), map ``n`` being batch ``n // H`` and head ``n % H``; the ``valatt``
outputs are (Lq, B, H*D), head h at channels [Dh, Dh+D).

``qk`` is scaled by 1/sqrt(D) (its documentation's "equivalent code" applies div_sqrt_dim to the
queries); ``valatt`` is not.

Splitting the maps' first axis (B*H) in whole batches splits the projections on their batch
axis; within one batch it splits them by heads. MXNet's kernels derive D from the width of the
projection they are given, so every share must get whole head blocks: each description also
declares (with ``depends``) the last channel of each head's block it reads, which the kernel
is handed although its product does not use it (a ``qk`` never reads the last head's values).
"""
import math

from tofu_mx.tdl import Shard, Sum, depends, lam, op


def _heads(attrs):
    return int(attrs.get("heads", 1))


def _batches_and_heads(attrs, ctx, D, maps_out):
    """The (batch, head) pairs a share computes, as ``(b0, b1, h0, h1)``, or None when they
    are not every pair of a batch range and a head range (no operator computes that)."""
    H = _heads(attrs)
    out = ctx.outputs[0]
    if maps_out:                                         # a qk: maps n = b * H + h
        n0, n1 = out[0]
        b0, b1, h0, h1 = n0 // H, n1 // H, n0 % H, n1 % H
    else:                                                # a valatt: (L, B, H * D)
        (b0, b1), (e0, e1) = out[1], out[2]
        if e0 % D or (e1 + 1) % D:
            return None
        h0, h1 = e0 // D, e1 // D
    if b0 != b1 and (h0, h1) != (0, H - 1):
        return None
    return b0, b1, h0, h1


def _interleaved_shard(width, D_of, maps_out):
    """A share runs with ``heads`` = its number of heads, on whole head blocks of the
    interleaved input ``width[0]``, ``width[1]`` * D channels per head (3D, 2D).
    ``maps_out``: the output is the attention maps (a qk), else a valatt's."""
    def shard(attrs, ctx):
        D = D_of(attrs, ctx.input_shapes)
        found = _batches_and_heads(attrs, ctx, D, maps_out)
        if found is None:
            return None
        _, _, h0, h1 = found
        box = ctx.inputs[width[0]]
        if box is not None and box[2] != (h0 * width[1] * D, (h1 + 1) * width[1] * D - 1):
            return None
        return Shard({"heads": h1 - h0 + 1})
    return shard


def _selfatt_D(attrs, shapes):
    return shapes[0][2] // 3 // _heads(attrs)


def _encdec_qk_D(attrs, shapes):
    return shapes[0][2] // _heads(attrs)


def _encdec_valatt_D(attrs, shapes):
    return shapes[0][2] // 2 // _heads(attrs)


@op("_contrib_interleaved_matmul_selfatt_qk",
    shard=_interleaved_shard((0, 3), _selfatt_D, True),
    examples=[({"heads": 2}, [(3, 2, 12)]), ({"heads": 1}, [(4, 3, 6)]),
              ({"heads": 3}, [(2, 1, 18)])])
def selfatt_qk(attrs, queries_keys_values):
    """out[n, i, j] = Sum_d q[i, b, h, d] k[j, b, h, d] / sqrt(D), b = n // H, h = n % H."""
    qkv = queries_keys_values
    H = _heads(attrs)
    D = qkv.shape[2] // 3 // H
    scale = 1.0 / math.sqrt(D)

    def out(n, i, j):
        b, block = n // H, (n % H) * (3 * D)
        return scale * Sum(lambda d: depends(qkv[i, b, block + d] * qkv[j, b, block + D + d],
                                             qkv[j, b, block + 3 * D - 1]), D)
    return out


@op("_contrib_interleaved_matmul_selfatt_valatt",
    shard=_interleaved_shard((0, 3), _selfatt_D, False),
    examples=[({"heads": 2}, [(3, 2, 12), (4, 3, 3)]), ({"heads": 1}, [(4, 3, 6), (3, 4, 4)]),
              ({"heads": 3}, [(2, 1, 18), (3, 2, 2)])])
def selfatt_valatt(attrs, queries_keys_values, attention):
    """out[i, b, h*D + d] = Sum_l attention[b*H + h, i, l] v[l, b, h, d]."""
    qkv = queries_keys_values
    H = _heads(attrs)
    D = qkv.shape[2] // 3 // H

    def out(i, b, e):
        h = e // D
        block = h * (3 * D)
        return Sum(lambda l: depends(
            attention[b * H + h, i, l] * qkv[l, b, block + 2 * D + e % D], qkv[l, b, block]))
    return out


@op("_contrib_interleaved_matmul_encdec_qk",
    shard=_interleaved_shard((1, 2), _encdec_qk_D, True),
    examples=[({"heads": 2}, [(3, 2, 4), (5, 2, 8)]), ({"heads": 1}, [(2, 3, 3), (4, 3, 6)]),
              ({"heads": 3}, [(2, 1, 6), (3, 1, 12)])])
def encdec_qk(attrs, queries, keys_values):
    """out[n, i, j] = Sum_d q[i, b, h, d] k[j, b, h, d] / sqrt(D), b = n // H, h = n % H."""
    H = _heads(attrs)
    D = queries.shape[2] // H
    scale = 1.0 / math.sqrt(D)

    def out(n, i, j):
        b, h = n // H, n % H
        return scale * Sum(lambda d: depends(
            queries[i, b, h * D + d] * keys_values[j, b, h * (2 * D) + d],
            keys_values[j, b, h * (2 * D) + 2 * D - 1]), D)
    return out


@op("_contrib_interleaved_matmul_encdec_valatt",
    shard=_interleaved_shard((0, 2), _encdec_valatt_D, False),
    examples=[({"heads": 2}, [(5, 2, 8), (4, 3, 5)]), ({"heads": 1}, [(3, 2, 6), (2, 4, 3)]),
              ({"heads": 3}, [(2, 1, 12), (3, 4, 2)])])
def encdec_valatt(attrs, keys_values, attention):
    """out[i, b, h*D + d] = Sum_l attention[b*H + h, i, l] v[l, b, h, d]."""
    H = _heads(attrs)
    D = keys_values.shape[2] // 2 // H

    def out(i, b, e):
        h = e // D
        block = h * (2 * D)
        return Sum(lambda l: depends(
            attention[b * H + h, i, l] * keys_values[l, b, block + D + e % D],
            keys_values[l, b, block]))
    return out


def _whole_last_axis(attrs, ctx):
    """The divisor is the square root of the last axis's size: a share must hold all of it."""
    box = ctx.inputs[0]
    return Shard() if box is None or ctx.size(box)[-1] == ctx.input_shapes[0][-1] else None


@op("_contrib_div_sqrt_dim", shard=_whole_last_axis,
    examples=[({}, [(2, 3, 4)]), ({}, [(5, 9)]), ({}, [(7,)])])
def div_sqrt_dim(attrs, data):
    """out = data / sqrt(data.shape[-1])."""
    return lam(data.ndim, lambda *i: data[i] / math.sqrt(data.shape[-1]))
