"""Random networks of real Gluon layers, for the model-level fuzzer (test_gluon_fuzz.py).

:func:`random_net` draws, from one seed, a device count from 2 to 8 and a network in one of
three families, at odd and prime sizes:

- images ``(B, C, H, W)``: Conv2D (groups, dilation, stride), Conv2DTranspose, max/avg
  pooling (ceil mode, padding), global pooling, BatchNorm, LayerNorm, GroupNorm, Dropout,
  activations, Pad (constant, edge, reflect), slicing, nearest upsampling,
  BilinearResize2D, PixelShuffle (depth_to_space), and skips (added or concatenated);
- sequences ``(B, T, C)``, from float features or from tokens through an Embedding: Conv1D
  and 1-D pooling, fused RNN/LSTM/GRU layers (bidirectional, with or without begin states,
  TNC or NTC), attention (batch_dot, softmax, causal masks), LayerNorm, Dense per step;
- volumes ``(B, C, D, H, W)``: Conv3D, 3-D pooling, BatchNorm.

Every network ends in a Dense layer and a sum of squares (MakeLoss). Everything is float64
(InstanceNorm, which MXNet runs in float32 only, is left to the real-model tests). The
description printed by :class:`FuzzNet` (``repr``) names every layer drawn.
"""
from __future__ import annotations

import math
import random

import mxnet as mx
from mxnet import gluon
from mxnet.gluon import nn, rnn


class FuzzNet(gluon.HybridBlock):
    """A straight program over earlier results: each step applies one layer (or function
    of ``F``) to the values it names, so skips read any earlier value."""

    def __init__(self, steps):
        super().__init__()
        self.steps = steps     # [(name, block or fn(F, *values), inputs)]: an input is the
        #                        index of an earlier value (0: the data) or ("state", i)
        with self.name_scope():
            for i, (_, layer, _) in enumerate(steps):
                if isinstance(layer, gluon.Block):
                    self.register_child(layer, f"l{i}")

    def hybrid_forward(self, F, x, *states):
        values = [x]
        for _, layer, inputs in self.steps:
            args = [states[j[1]] if isinstance(j, tuple) else values[j] for j in inputs]
            values.append(layer(*args) if isinstance(layer, gluon.Block) else layer(F, *args))
        return values[-1]

    def __repr__(self):
        return " -> ".join(name for name, _, _ in self.steps)


class _Builder:
    def __init__(self, rnd: random.Random):
        self.rnd = rnd
        self.steps = []
        self.shapes = []                # the shape of each value, inputs first

    def add(self, name, layer, shape, inputs=None):
        self.steps.append((name, layer, [len(self.shapes) - 1] if inputs is None else inputs))
        self.shapes.append(tuple(shape))

    @property
    def shape(self):
        return self.shapes[-1]

    def pick(self, *options):
        return self.rnd.choice(options)


ODD = (3, 5, 7)
SPATIAL = (5, 7, 9, 11)


def _conv_out(n, k, s, p, d=1):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _image_step(b: _Builder) -> None:
    B, C, H, W = b.shape
    kind = b.pick("conv", "conv", "deconv", "pool", "bn", "ln", "gn", "act", "dropout", "pad",
                  "slice", "skip", "up", "bilinear", "shuffle")
    r = b.rnd
    if kind == "conv":
        k, s, d = b.pick(1, 3), b.pick(1, 1, 2), b.pick(1, 1, 2)
        p = r.choice([0, (d * (k - 1)) // 2])
        if _conv_out(min(H, W), k, s, p, d) < 1:
            return
        groups = b.pick(1, C) if C > 1 else 1
        ch = C * b.pick(1, 2) if groups > 1 else b.pick(*ODD, 4)
        b.add(f"Conv2D({ch}, k{k} s{s} p{p} d{d} g{groups})",
              nn.Conv2D(ch, k, strides=s, padding=p, dilation=d, groups=groups,
                        in_channels=C, use_bias=r.random() < 0.7),
              (B, ch, _conv_out(H, k, s, p, d), _conv_out(W, k, s, p, d)))
    elif kind == "deconv" and H * W <= 64:
        k, s = b.pick(2, 3), b.pick(1, 2)
        p = b.pick(0, 1) if k == 3 else 0
        ch = b.pick(*ODD)
        b.add(f"Conv2DTranspose({ch}, k{k} s{s} p{p})",
              nn.Conv2DTranspose(ch, k, strides=s, padding=p, in_channels=C),
              (B, ch, (H - 1) * s - 2 * p + k, (W - 1) * s - 2 * p + k))
    elif kind == "pool":
        if r.random() < 0.2:
            layer = b.pick(nn.GlobalAvgPool2D, nn.GlobalMaxPool2D)()
            b.add(type(layer).__name__, layer, (B, C, 1, 1))
            return
        k = b.pick(2, 3)
        s, ceil = b.pick(1, 2), r.random() < 0.5
        p = b.pick(0, 1) if k == 3 else 0
        if min(H, W) + 2 * p < k:
            return
        cls = b.pick(nn.MaxPool2D, nn.AvgPool2D)

        def size(n):
            return (-((n + 2 * p - k) // -s) if ceil else (n + 2 * p - k) // s) + 1
        b.add(f"{cls.__name__}(k{k} s{s} p{p} ceil={ceil})",
              cls(k, s, p, ceil_mode=ceil), (B, C, size(H), size(W)))
    elif kind == "bn":
        b.add("BatchNorm", nn.BatchNorm(in_channels=C, center=r.random() < 0.8), b.shape)
    elif kind == "ln":
        b.add("LayerNorm(axis=1)", nn.LayerNorm(axis=1, in_channels=C), b.shape)
    elif kind == "gn" and C % 2 == 0 or kind == "gn" and C > 2 and C % 3 == 0:
        groups = 2 if C % 2 == 0 else 3
        b.add(f"GroupNorm({groups})", nn.GroupNorm(groups), b.shape)
    elif kind == "act":
        act = b.pick("relu", "tanh", "sigmoid", "softrelu")
        b.add(f"Activation({act})", nn.Activation(act), b.shape)
    elif kind == "dropout":
        b.add("Dropout(0.3)", nn.Dropout(0.3), b.shape)
    elif kind == "pad":
        mode = b.pick("constant", "edge", "reflect")
        lo, hi = b.pick(0, 1, 2), b.pick(1, 2)
        if mode == "reflect" and max(lo, hi) >= min(H, W):
            return
        b.add(f"pad({mode}, {lo}, {hi})",
              lambda F, x: F.pad(x, mode=mode, pad_width=(0, 0, 0, 0, lo, hi, hi, lo)),
              (B, C, H + lo + hi, W + lo + hi))
    elif kind == "slice" and H > 2:
        axis = b.pick(2, 3)
        n = (H, W)[axis - 2]
        begin = r.randint(0, n // 2)
        end = r.randint(begin + 1, n)
        shape = list(b.shape)
        shape[axis] = end - begin
        b.add(f"slice_axis({axis}, {begin}:{end})",
              lambda F, x: F.slice_axis(x, axis=axis, begin=begin, end=end), shape)
    elif kind == "skip":
        same = [j for j, s in enumerate(b.shapes[:-1]) if s == b.shape]
        spatial = [j for j, s in enumerate(b.shapes[:-1]) if s[0] == B and s[2:] == (H, W)
                   and len(s) == 4]
        if same and r.random() < 0.5:
            j = r.choice(same)
            b.add(f"add(#{j})", lambda F, x, y: x + y, b.shape, [len(b.shapes) - 1, j])
        elif spatial:
            j = r.choice(spatial)
            b.add(f"concat(#{j})", lambda F, x, y: F.concat(x, y, dim=1),
                  (B, C + b.shapes[j][1], H, W), [len(b.shapes) - 1, j])
    elif kind == "up" and H * W <= 49:
        b.add("UpSampling(2, nearest)",
              lambda F, x: F.UpSampling(x, scale=2, sample_type="nearest"), (B, C, 2 * H, 2 * W))
    elif kind == "bilinear":
        h, w = b.pick(3, 5, 6, 7), b.pick(3, 4, 7)
        align = r.random() < 0.5
        b.add(f"BilinearResize2D({h}, {w})",
              lambda F, x: F.contrib.BilinearResize2D(x, height=h, width=w,
                                                      align_corners=align), (B, C, h, w))
    elif kind == "shuffle" and C % 4 == 0 and H * W <= 49:
        b.add("PixelShuffle(2)", lambda F, x: F.depth_to_space(x, block_size=2),
              (B, C // 4, 2 * H, 2 * W))


def _sequence_step(b: _Builder, states: list) -> None:
    B, T, C = b.shape
    kind = b.pick("rnn", "rnn", "attention", "conv1d", "pool1d", "ln", "dense", "act")
    r = b.rnd
    if kind == "rnn":
        cls = b.pick(rnn.LSTM, rnn.GRU, rnn.RNN)
        hidden, bi, ntc = b.pick(*ODD, 4), r.random() < 0.5, r.random() < 0.5
        layers = b.pick(1, 1, 2)
        layer = cls(hidden, layers, layout="NTC" if ntc else "TNC", bidirectional=bi,
                    input_size=C)
        dirs = 2 if bi else 1
        if r.random() < 0.5:        # begin states as inputs of the graph
            n = 2 if cls is rnn.LSTM else 1
            first = len(states)
            states.extend([(layers * dirs, B, hidden)] * n)

            def run(F, x, *s, layer=layer, ntc=ntc):
                y = layer(x if ntc else F.transpose(x, axes=(1, 0, 2)), list(s))[0]
                return y if ntc else F.transpose(y, axes=(1, 0, 2))
            inputs = [len(b.shapes) - 1] + [("state", i) for i in range(first, first + n)]
        else:
            def run(F, x, layer=layer, ntc=ntc):
                y = layer(x if ntc else F.transpose(x, axes=(1, 0, 2)))
                return y if ntc else F.transpose(y, axes=(1, 0, 2))
            inputs = None
        step = _Layer(layer, run)
        b.add(f"{cls.__name__}({hidden}, layers={layers}, bi={bi}, {'NTC' if ntc else 'TNC'}, "
              f"states={inputs is not None})", step, (B, T, hidden * dirs), inputs)
    elif kind == "attention":
        d = b.pick(*ODD, 4)
        causal = r.random() < 0.5
        q, k, v = (nn.Dense(d, flatten=False, in_units=C) for _ in range(3))

        def attend(F, x, q=q, k=k, v=v, causal=causal, d=d, T=T):
            scores = F.batch_dot(q(x), k(x), transpose_b=True) / math.sqrt(d)
            if causal:
                steps = F.arange(T, dtype="float64")
                mask = F.broadcast_greater_equal(F.reshape(steps, (-1, 1)),
                                                 F.reshape(steps, (1, -1)))
                scores = F.broadcast_add(scores, F.expand_dims((1 - mask) * -1e9, 0))
            return F.batch_dot(F.softmax(scores, axis=-1), v(x))
        b.add(f"attention({d}, causal={causal})", _Layer([q, k, v], attend), (B, T, d))
    elif kind == "conv1d":
        k, s = b.pick(1, 3), b.pick(1, 2)
        p = (k - 1) // 2
        ch = b.pick(*ODD)
        conv = nn.Conv1D(ch, k, strides=s, padding=p, in_channels=C)
        b.add(f"Conv1D({ch}, k{k} s{s})", _Layer(conv, lambda F, x, conv=conv: F.transpose(
            conv(F.transpose(x, axes=(0, 2, 1))), axes=(0, 2, 1))),
            (B, _conv_out(T, k, s, p), ch))
    elif kind == "pool1d" and T >= 3:
        cls = b.pick(nn.MaxPool1D, nn.AvgPool1D)
        pool = cls(2, 1)
        b.add(f"{cls.__name__}(2, 1)", _Layer(pool, lambda F, x, pool=pool: F.transpose(
            pool(F.transpose(x, axes=(0, 2, 1))), axes=(0, 2, 1))), (B, T - 1, C))
    elif kind == "ln":
        b.add("LayerNorm", nn.LayerNorm(in_channels=C), b.shape)
    elif kind == "dense":
        units = b.pick(*ODD, 6)
        b.add(f"Dense({units}, per step)", nn.Dense(units, flatten=False, in_units=C),
              (B, T, units))
    elif kind == "act":
        b.add("tanh", nn.Activation("tanh"), b.shape)


class _Layer(gluon.HybridBlock):
    """A function of ``F`` over child blocks: registers them so their parameters exist."""

    def __init__(self, children, fn):
        super().__init__()
        self.fn = fn
        for i, child in enumerate(children if isinstance(children, list) else [children]):
            self.register_child(child, f"c{i}")

    def hybrid_forward(self, F, *args):
        return self.fn(F, *args)


def _volume_step(b: _Builder) -> None:
    B, C, D, H, W = b.shape
    kind = b.pick("conv", "conv", "pool", "bn", "act")
    if kind == "conv":
        k = b.pick(1, 3)
        s = b.pick(1, 2) if min(D, H, W) > 2 else 1
        p = (k - 1) // 2
        ch = b.pick(*ODD)
        b.add(f"Conv3D({ch}, k{k} s{s})", nn.Conv3D(ch, k, strides=s, padding=p, in_channels=C),
              (B, ch) + tuple(_conv_out(n, k, s, p) for n in (D, H, W)))
    elif kind == "pool" and min(D, H, W) >= 2:
        cls = b.pick(nn.MaxPool3D, nn.AvgPool3D)
        b.add(f"{cls.__name__}(2)", cls(2, 2), (B, C) + tuple(n // 2 for n in (D, H, W)))
    elif kind == "bn":
        b.add("BatchNorm", nn.BatchNorm(in_channels=C), b.shape)
    elif kind == "act":
        b.add("relu", nn.Activation("relu"), b.shape)


def random_net(seed: int):
    """``(symbol, shapes, k, description)`` for ``seed``: the loss symbol over inputs
    ``data`` (and ``state<i>`` begin states), their shapes, the device count and the net."""
    rnd = random.Random(seed)
    k = rnd.randint(2, 8)
    b = _Builder(rnd)
    family = rnd.choice(["image", "image", "sequence", "sequence", "volume"])
    batch = rnd.choice([1, 2, 3, 5, 7])
    states: list = []
    tokens = False
    if family == "image":
        b.shapes.append((batch, rnd.choice(ODD), rnd.choice(SPATIAL), rnd.choice(SPATIAL)))
        step = _image_step
    elif family == "volume":
        b.shapes.append((batch, rnd.choice((2, 3)), rnd.choice((3, 4, 5)), rnd.choice((5, 6)),
                         rnd.choice((5, 7))))
        step = _volume_step
    else:
        steps, width = rnd.choice((3, 5, 7)), rnd.choice(ODD)
        tokens = rnd.random() < 0.4
        if tokens:
            b.shapes.append((batch, steps))
            vocab = rnd.choice((7, 11, 13))
            b.add(f"Embedding({vocab}, {width})", nn.Embedding(vocab, width),
                  (batch, steps, width))
        else:
            b.shapes.append((batch, steps, width))
        step = _sequence_step
    for _ in range(rnd.randint(2, 6)):
        before = len(b.steps)
        (step(b, states) if family == "sequence" else step(b))
        if family == "image" and len(b.steps) > before and b.shape[2] * b.shape[3] > 144:
            b.add("MaxPool2D(2, 2)", nn.MaxPool2D(2, 2), b.shape[:2] + tuple(
                n // 2 for n in b.shape[2:]))
    units = rnd.choice(ODD) + k      # some axis at least k long, whatever the sizes drawn
    b.add(f"Dense({units})", nn.Dense(units), ())
    net = FuzzNet(b.steps)
    net.initialize()
    net.cast("float64")
    net.hybridize()
    names = [f"state{i}" for i in range(len(states))]
    out = net(mx.sym.var("data"), *(mx.sym.var(n) for n in names))
    shapes = {"data": b.shapes[0], **dict(zip(names, states))}
    return mx.sym.MakeLoss(mx.sym.sum(mx.sym.square(out))), shapes, k, repr(net), tokens
