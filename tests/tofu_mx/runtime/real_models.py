"""Models nobody on this project wrote, as their users build them: GluonNLP 0.10's BERT,
Transformer encoder and language model, Gluon's RNN layers and unrolled cells, MXNet's legacy
``mx.rnn`` cells, a model-zoo net exported and loaded back, the layer stacks of MXNet's LSTNet
and LipNet examples, and a Gluon block called at two places (GluonCV's zoo:
``gluoncv_models.py``). Each builder returns
``(symbol, shapes, arrays, dtype)``: the graph, its input shapes, realistic values for the
inputs that need them (lengths, positions), and its dtype: float64, except BERT, whose
interleaved attention kernels run only in float32 on CPU, and the fused RNN layers run as users
run them, in float32."""
import os
import tempfile
import warnings

import mxnet as mx
import numpy as np
from mxnet import gluon

BATCH, STEPS, VOCAB = 12, 6, 20


def _symbol(block, *inputs, dtype="float64"):
    block.initialize()
    block.cast(dtype)
    block.hybridize()
    out = block(*inputs)
    if isinstance(out, (list, tuple)):
        out = mx.sym.Group([o for o in _flatten(out)])
    return out


def _flatten(items):
    for item in items:
        if isinstance(item, (list, tuple)):
            yield from _flatten(item)
        else:
            yield item


def _loss(out):
    """A scalar to train: the sum of squares of every output."""
    return mx.sym.MakeLoss(mx.sym.add_n(*[mx.sym.sum(o * o) for o in out]))


def _lengths(rng):
    return rng.integers(1, STEPS + 1, size=(BATCH,)).astype("float64")


def bert():
    import gluonnlp as nlp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder = nlp.model.bert.BERTEncoder(num_layers=2, units=16, hidden_size=32,
                                             max_length=STEPS, num_heads=2, dropout=0.1)
        net = nlp.model.BERTModel(encoder, vocab_size=VOCAB, token_type_vocab_size=2, units=16,
                                  embed_size=16, use_pooler=True, use_decoder=True,
                                  use_classifier=True)
    names = ("data", "token_types", "valid_length", "masked_positions")
    out = _symbol(net, *(mx.sym.var(n) for n in names), dtype="float32")
    rng = np.random.default_rng(0)
    shapes = {"data": (BATCH, STEPS), "token_types": (BATCH, STEPS), "valid_length": (BATCH,),
              "masked_positions": (BATCH, 2)}
    arrays = {"valid_length": _lengths(rng),
              "token_types": rng.integers(0, 2, size=(BATCH, STEPS)).astype("float64"),
              "masked_positions": rng.integers(0, STEPS, size=(BATCH, 2)).astype("float64")}
    return _loss(out), shapes, arrays, "float32"


def transformer_encoder():
    import gluonnlp as nlp
    net = nlp.model.transformer.TransformerEncoder(num_layers=2, units=16, hidden_size=32,
                                                   num_heads=2, max_length=STEPS)
    out = _symbol(net, mx.sym.var("data"), None, mx.sym.var("valid_length"))
    shapes = {"data": (BATCH, STEPS, 16), "valid_length": (BATCH,)}
    return _loss(out), shapes, {"valid_length": _lengths(np.random.default_rng(1))}, "float64"


def language_model():
    import gluonnlp as nlp
    net = nlp.model.language_model.StandardRNN("lstm", VOCAB, 16, 16, 2, 0.0, False)
    net.initialize()
    net.cast("float64")
    net.hybridize()
    states = net.begin_state(batch_size=BATCH, func=mx.sym.zeros, dtype="float64")
    out, _ = net(mx.sym.var("data"), states)
    return _loss([out]), {"data": (STEPS, BATCH)}, {}, "float64"


def gluon_rnn_layer(kind, dtype="float64"):
    layer = {"lstm": gluon.rnn.LSTM, "gru": gluon.rnn.GRU}[kind](16, num_layers=2)
    out = _symbol(layer, mx.sym.var("data"), dtype=dtype)
    return _loss([out]), {"data": (STEPS, BATCH, 8)}, {}, dtype


def gluon_bidirectional_float32(kind):
    """The fused layers as users run them: float32, bidirectional, batch-major (NTC), with
    begin states given (MXNet's float32 RNN kernel differs from its float64 one on CPU)."""
    cls = {"lstm": gluon.rnn.LSTM, "gru": gluon.rnn.GRU}[kind]
    layer = cls(12, num_layers=1, bidirectional=True, layout="NTC", input_size=8)
    layer.initialize()
    layer.hybridize()
    states = [mx.sym.var(f"state{i}") for i in range(2 if kind == "lstm" else 1)]
    out, _ = layer(mx.sym.var("data"), states)
    shapes = {"data": (BATCH - 1, STEPS - 1, 8), **{s.name: (2, BATCH - 1, 12) for s in states}}
    return _loss([out]), shapes, {}, "float32"


def gluon_lstm_cell_unrolled():
    cell = gluon.rnn.LSTMCell(16)
    cell.initialize()
    cell.cast("float64")
    begin = cell.begin_state(batch_size=BATCH, func=mx.sym.zeros, dtype="float64")
    out, _ = cell.unroll(STEPS, mx.sym.var("data"), begin_state=begin, layout="NTC",
                         merge_outputs=True)
    return _loss([out]), {"data": (BATCH, STEPS, 8)}, {}, "float64"


def legacy_rnn_cells():
    """mx.rnn's LSTM and GRU stacked and unrolled, with explicit zero begin states."""
    stack = mx.rnn.SequentialRNNCell()
    stack.add(mx.rnn.LSTMCell(16, prefix="lstm_"))
    stack.add(mx.rnn.GRUCell(16, prefix="gru_"))
    begin = stack.begin_state(func=mx.sym.zeros, dtype="float64", shape=(BATCH, 16))
    out, _ = stack.unroll(STEPS, mx.sym.var("data"), begin_state=begin, layout="NTC",
                          merge_outputs=True)
    return _loss([out]), {"data": (BATCH, STEPS, 8)}, {}, "float64"


def exported_zoo_net():
    """A model-zoo net, exported with net.export() and loaded back with mx.sym.load."""
    from mxnet.gluon.model_zoo import vision
    net = vision.get_model("resnet18_v1", classes=10)
    net.initialize()
    net.cast("float64")
    net.hybridize()
    net(mx.nd.zeros((1, 3, 32, 32), dtype="float64"))
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "net")
        net.export(prefix)
        sym = mx.sym.load(prefix + "-symbol.json")
    label = mx.sym.var("softmax_label")
    return mx.sym.SoftmaxOutput(sym, label), {"data": (BATCH, 3, 32, 32)}, {}, "float64"


def block_called_twice():
    """One ``self.relu`` (and one ``self.conv``) used at two places, as GluonCV's R(2+1)D
    does: the exported graph has two nodes of each name."""
    from mxnet.gluon import nn

    class Residual(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2D(4, 3, padding=1, in_channels=4)
            self.bn = nn.BatchNorm(in_channels=4)
            self.relu = nn.Activation("relu")

        def hybrid_forward(self, F, x):
            y = self.relu(self.conv(x))
            return self.relu(self.bn(self.conv(y)) + x)
    out = _symbol(Residual(), mx.sym.var("data"))
    return _loss([out]), {"data": (3, 4, 5, 5)}, {}, "float64"


def lstnet():
    """The shape of MXNet's LSTNet example (multivariate time series): a convolution over
    time across every series, ``mx.rnn`` GRU cells unrolled over its output, a skip GRU over
    every p-th step, an autoregressive linear part over the last steps, regressed with
    LinearRegressionOutput on a label of every series (its gradient divides by the series)."""
    series, steps, window, skip = 5, 12, 3, 2
    x = mx.sym.var("data")                                       # (batch, steps, series)
    conv = mx.sym.Convolution(mx.sym.reshape(x, shape=(0, 1, steps, series)), num_filter=6,
                              kernel=(window, series), name="cnn")
    conv = mx.sym.Activation(mx.sym.Pad(conv, mode="constant", pad_width=(0, 0, 0, 0, 2, 0, 0, 0)),
                             act_type="relu")
    frames = steps - window + 3
    seq = mx.sym.transpose(mx.sym.reshape(conv, shape=(0, 6, frames)), axes=(0, 2, 1))
    batch = 2          # fewer samples than devices: the series axis gets split too
    gru = mx.rnn.GRUCell(8, prefix="gru_")
    _, last = gru.unroll(frames, seq, layout="NTC", merge_outputs=False,
                         begin_state=gru.begin_state(func=mx.sym.zeros, dtype="float64",
                                                     shape=(batch, 8)))
    picked = mx.sym.slice_axis(seq, axis=1, begin=frames - skip * 3, end=frames)
    skipped = mx.sym.reshape(mx.sym.transpose(mx.sym.reshape(picked, shape=(0, 3, skip, 6)),
                                              axes=(0, 2, 1, 3)), shape=(-1, 3, 6))
    skip_gru = mx.rnn.GRUCell(4, prefix="skip_gru_")
    _, skip_last = skip_gru.unroll(3, skipped, layout="NTC", merge_outputs=False,
                                   begin_state=skip_gru.begin_state(
                                       func=mx.sym.zeros, dtype="float64",
                                       shape=(batch * skip, 4)))
    skip_out = mx.sym.reshape(skip_last[0], shape=(-1, skip * 4))
    neural = mx.sym.FullyConnected(mx.sym.concat(last[0], skip_out, dim=1), num_hidden=series,
                                   name="fc")
    recent = mx.sym.slice_axis(x, axis=1, begin=steps - 4, end=steps)
    ar = mx.sym.FullyConnected(mx.sym.reshape(mx.sym.transpose(recent, axes=(0, 2, 1)),
                                              shape=(-3, 4)), num_hidden=1, name="ar")
    pred = neural + mx.sym.reshape(ar, shape=(-1, series))
    out = mx.sym.LinearRegressionOutput(pred, mx.sym.var("label"), name="lro")
    return out, {"data": (batch, steps, series), "label": (batch, series)}, {}, "float64"


def lipnet_float32():
    """The shape of MXNet's Gluon LipNet example: Conv3D over frames, InstanceNorm, 3-D
    pooling, a bidirectional fused GRU over time (float32, as the example trains: MXNet's
    InstanceNorm has no float64), a dense layer per frame and a softmax over characters per
    frame."""
    from mxnet.gluon import nn, rnn

    class LipNet(gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.conv = nn.Conv3D(4, kernel_size=(3, 3, 3), padding=(1, 1, 1),
                                      in_channels=3)
                self.norm = nn.InstanceNorm(in_channels=4)
                self.pool = nn.MaxPool3D(pool_size=(1, 2, 2), strides=(1, 2, 2))
                self.gru = rnn.GRU(8, bidirectional=True, input_size=4 * 3 * 4)
                self.dense = nn.Dense(7, flatten=False, in_units=16)

        def hybrid_forward(self, F, x):
            h = self.pool(F.relu(self.norm(self.conv(x))))        # (B, C, T, H, W)
            h = F.reshape(F.transpose(h, axes=(2, 0, 1, 3, 4)), shape=(0, 0, -1))
            return F.softmax(self.dense(self.gru(h)), axis=-1)
    out = _symbol(LipNet(), mx.sym.var("data"), dtype="float32")
    return _loss([out]), {"data": (3, 3, 5, 6, 8)}, {}, "float32"


#: float32 models MXNet cannot run in float64 (no float64 oracle for them)
FLOAT32_ONLY = {"bert", "lipnet_float32"}     # interleaved attention, InstanceNorm

MODELS = {"bert": bert, "transformer_encoder": transformer_encoder,
          "language_model": language_model, "gluon_lstm": lambda: gluon_rnn_layer("lstm"),
          "gluon_gru": lambda: gluon_rnn_layer("gru"),
          "gluon_lstm_float32": lambda: gluon_rnn_layer("lstm", "float32"),
          "gluon_bilstm_float32": lambda: gluon_bidirectional_float32("lstm"),
          "gluon_bigru_float32": lambda: gluon_bidirectional_float32("gru"),
          "gluon_lstm_cell": gluon_lstm_cell_unrolled, "block_called_twice": block_called_twice,
          "lstnet": lstnet, "lipnet_float32": lipnet_float32, "mx_rnn_cells": legacy_rnn_cells,
          "exported_resnet18": exported_zoo_net}
