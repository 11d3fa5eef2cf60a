"""Synthetic graphs for the search benchmark: seeded random MLP-like chains of about N
operators (FullyConnected of random widths, activations) with residual adds, like ResNet's,
from two layers back wherever the widths agree."""
import mxnet as mx
import numpy as np


def synthetic(num_ops: int, seed: int = 0, batch: int = 64):
    rng = np.random.default_rng(seed)
    widths = [256, 512, 1024, 2048]
    with mx.name.NameManager():
        x = mx.sym.var("data")
        history = [(256, x)]
        made, layer = 0, 0
        while made < num_ops - 2:
            new = int(rng.choice(widths))
            x = mx.sym.FullyConnected(x, num_hidden=new, name=f"fc{layer}")
            x = mx.sym.Activation(x, act_type=str(rng.choice(["relu", "tanh"])),
                                  name=f"act{layer}")
            made += 2
            if len(history) >= 2 and history[-2][0] == new and rng.random() < 0.5:
                x = mx.sym.elemwise_add(x, history[-2][1], name=f"skip{layer}")
                made += 1
            history = (history + [(new, x)])[-2:]
            layer += 1
        out = mx.sym.FullyConnected(x, num_hidden=10, name="head")
        return mx.sym.SoftmaxOutput(out, name="softmax"), {"data": (batch, 256),
                                                           "softmax_label": (batch,)}
