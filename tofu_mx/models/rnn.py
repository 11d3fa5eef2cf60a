"""An unrolled multi-layer LSTM language model built from FullyConnected and elementwise ops.

This is the RNN of Tofu's evaluation (4-10 layers, hidden 4K-10K, 20 steps). Each layer's
weights are one set of variables shared by every time step, as in an unrolled RNN.
"""
from __future__ import annotations

import mxnet as mx

from tofu_mx.errors import InvalidArgumentError

CELLS = ("lstm",)


def _lstm_step(x, h, c, weights, hidden, name):
    i2h_w, i2h_b, h2h_w, h2h_b = weights
    gates = mx.sym.FullyConnected(x, weight=i2h_w, bias=i2h_b, num_hidden=4 * hidden,
                                  name=name + "_i2h")
    if h is not None:
        h2h = mx.sym.FullyConnected(h, weight=h2h_w, bias=h2h_b, num_hidden=4 * hidden,
                                    name=name + "_h2h")
        gates = mx.sym.elemwise_add(gates, h2h, name=name + "_gates")
    g = mx.sym.split(gates, num_outputs=4, axis=1, name=name + "_slice")
    in_gate = mx.sym.Activation(g[0], act_type="sigmoid", name=name + "_i")
    forget_gate = mx.sym.Activation(g[1], act_type="sigmoid", name=name + "_f")
    in_transform = mx.sym.Activation(g[2], act_type="tanh", name=name + "_g")
    out_gate = mx.sym.Activation(g[3], act_type="sigmoid", name=name + "_o")
    c_new = mx.sym.elemwise_mul(in_gate, in_transform, name=name + "_ig")
    if c is not None:
        c_new = mx.sym.elemwise_add(mx.sym.elemwise_mul(forget_gate, c, name=name + "_fc"),
                                    c_new, name=name + "_c")
    h_new = mx.sym.elemwise_mul(out_gate, mx.sym.Activation(c_new, act_type="tanh",
                                                            name=name + "_tc"), name=name + "_h")
    return h_new, c_new


def rnn(num_layers: int = 2, hidden: int = 256, seq_len: int = 5, vocab: int = 1000,
        cell: str = "lstm", dropout: float = 0.0) -> mx.sym.Symbol:
    """LSTM language model over ``data=(batch, seq_len)`` token ids (float32, as MXNet's Embedding).

    Embedding -> ``num_layers`` LSTM layers unrolled over ``seq_len`` steps (zero initial
    state; the first step has no recurrent term) -> FullyConnected to ``vocab`` at every step
    -> ``SoftmaxOutput`` named ``softmax`` with ``softmax_label=(batch, seq_len)``.
    ``dropout`` > 0 puts Dropout between layers.
    """
    if cell not in CELLS:
        raise InvalidArgumentError(f"rnn cell must be one of {CELLS}, got {cell!r}")
    for key, value in (("num_layers", num_layers), ("hidden", hidden), ("seq_len", seq_len),
                       ("vocab", vocab)):
        if not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"rnn {key} must be a positive int, got {value!r}")
    if not 0.0 <= dropout < 1.0:
        raise InvalidArgumentError(f"rnn dropout must be in [0, 1), got {dropout!r}")
    with mx.name.NameManager():
        data = mx.sym.var("data")
        label = mx.sym.var("softmax_label")
        embed = mx.sym.Embedding(data, input_dim=vocab, output_dim=hidden, name="embed")
        steps = mx.sym.split(embed, num_outputs=seq_len, axis=1, squeeze_axis=True,
                             name="steps")
        xs = [steps[t] for t in range(seq_len)]
        for layer in range(num_layers):
            p = f"l{layer}"
            weights = [mx.sym.var(p + s) for s in ("_i2h_weight", "_i2h_bias", "_h2h_weight",
                                                   "_h2h_bias")]
            h = c = None
            outs = []
            for t, x in enumerate(xs):
                if dropout > 0 and layer > 0:
                    x = mx.sym.Dropout(x, p=dropout, name=f"{p}_t{t}_drop")
                h, c = _lstm_step(x, h, c, weights, hidden, f"{p}_t{t}")
                outs.append(h)
            xs = outs
        stacked = mx.sym.stack(*xs, axis=1, name="stack")
        flat = mx.sym.Reshape(stacked, shape=(-1, hidden), name="flatten_steps")
        logits = mx.sym.FullyConnected(flat, num_hidden=vocab, name="decoder")
        label = mx.sym.Reshape(label, shape=(-1,), name="flatten_label")
        return mx.sym.SoftmaxOutput(logits, label, name="softmax")
