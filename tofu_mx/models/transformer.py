"""A Transformer encoder language model from FullyConnected(flatten=False), batch_dot, softmax,
LayerNorm and reshape/transpose: the operators an encoder block is made of in MXNet 1.x."""
from __future__ import annotations

import math

import mxnet as mx

from tofu_mx.errors import InvalidArgumentError


def _dense(x, units, name):
    return mx.sym.FullyConnected(x, num_hidden=units, flatten=False, name=name)


def _heads_first(x, heads, name):
    """(B, T, U) -> (B*heads, T, U/heads)."""
    x = mx.sym.reshape(x, shape=(0, 0, heads, -1), name=name + "_split_heads")
    x = mx.sym.transpose(x, axes=(0, 2, 1, 3), name=name + "_heads_first")
    return mx.sym.reshape(x, shape=(-3, 0, 0), name=name + "_merge_batch")


def _attention(x, units, heads, dropout, name):
    q, k, v = (_heads_first(_dense(x, units, f"{name}_{n}"), heads, f"{name}_{n}")
               for n in ("query", "key", "value"))
    scores = mx.sym.batch_dot(q, k, transpose_b=True, name=name + "_scores")
    scores = mx.sym._internal._mul_scalar(scores, scalar=1.0 / math.sqrt(units // heads),
                                name=name + "_scale")
    att = mx.sym.softmax(scores, axis=-1, name=name + "_softmax")
    if dropout > 0:
        att = mx.sym.Dropout(att, p=dropout, name=name + "_att_drop")
    ctx = mx.sym.batch_dot(att, v, name=name + "_context")
    ctx = mx.sym.reshape(ctx, shape=(-4, -1, heads, 0, 0), name=name + "_split_batch")
    ctx = mx.sym.transpose(ctx, axes=(0, 2, 1, 3), name=name + "_time_first")
    ctx = mx.sym.reshape(ctx, shape=(0, 0, -3), name=name + "_merge_heads")
    return _dense(ctx, units, name + "_proj")


def _encoder_layer(x, units, heads, hidden, dropout, name):
    att = _attention(x, units, heads, dropout, name + "_att")
    if dropout > 0:
        att = mx.sym.Dropout(att, p=dropout, name=name + "_att_out_drop")
    x = mx.sym.LayerNorm(mx.sym.elemwise_add(x, att, name=name + "_res1"), axis=-1,
                         name=name + "_ln1")
    ffn = mx.sym.Activation(_dense(x, hidden, name + "_ffn1"), act_type="relu",
                            name=name + "_relu")
    ffn = _dense(ffn, units, name + "_ffn2")
    if dropout > 0:
        ffn = mx.sym.Dropout(ffn, p=dropout, name=name + "_ffn_drop")
    return mx.sym.LayerNorm(mx.sym.elemwise_add(x, ffn, name=name + "_res2"), axis=-1,
                            name=name + "_ln2")


def transformer(num_layers: int = 2, units: int = 64, heads: int = 4, seq_len: int = 8,
                vocab: int = 1000, hidden: int | None = None,
                dropout: float = 0.0) -> mx.sym.Symbol:
    """Encoder-only Transformer LM over ``data=(batch, seq_len)`` token ids.

    Embedding plus a learned position table -> ``num_layers`` post-norm encoder layers
    (multi-head self-attention, FFN of width ``hidden``, default ``4 * units``) ->
    FullyConnected to ``vocab`` -> ``SoftmaxOutput`` named ``softmax`` with
    ``softmax_label=(batch, seq_len)``.
    """
    for key, value in (("num_layers", num_layers), ("units", units), ("heads", heads),
                       ("seq_len", seq_len), ("vocab", vocab)):
        if not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"transformer {key} must be a positive int, got {value!r}")
    if units % heads:
        raise InvalidArgumentError(
            f"transformer units ({units}) must be a multiple of heads ({heads})")
    if not 0.0 <= dropout < 1.0:
        raise InvalidArgumentError(f"transformer dropout must be in [0, 1), got {dropout!r}")
    hidden = 4 * units if hidden is None else hidden
    with mx.name.NameManager():
        data = mx.sym.var("data")
        x = mx.sym.Embedding(data, input_dim=vocab, output_dim=units, name="embed")
        pos = mx.sym.var("position_weight", shape=(1, seq_len, units))
        x = mx.sym.broadcast_add(x, pos, name="add_position")
        for layer in range(num_layers):
            x = _encoder_layer(x, units, heads, hidden, dropout, f"layer{layer}")
        logits = _dense(x, vocab, "decoder")
        logits = mx.sym.reshape(logits, shape=(-3, 0), name="flatten_steps")
        label = mx.sym.reshape(mx.sym.var("softmax_label"), shape=(-1,), name="flatten_label")
        return mx.sym.SoftmaxOutput(logits, label, name="softmax")
