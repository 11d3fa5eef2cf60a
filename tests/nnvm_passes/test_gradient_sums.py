"""MXNet 1.9.1's in-place gradient sums across devices (docs/mxnet-facts.md, "Gradient sums").

A value read by n operators gets its gradient summed by MXNet: one ``ElementWiseSum`` when
n < ``MXNET_EXEC_INPLACE_GRAD_SUM_CAP`` (default 8), else a chain of in-place ``_grad_add``.
Pinned here, each in a fresh process (MXNet latches the cap on first use), against the same
graph on one device in float64: the chain is wrong when the pieces it adds come from
several devices, and right when they all come from one. This is why the Program reads no
value the cap's number of times (``nnvm_passes.program.bounded_reads``, tested in
test_program.py and by every equivalence test, which run at MXNet's default cap).
"""
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import sys, numpy as np, mxnet as mx
copies = sys.argv[1] == "copies"
def build(two):
    g0 = {"__ctx_group__": "dev0"}; g1 = {"__ctx_group__": "dev1"} if two else g0
    x, w = mx.sym.var("x"), mx.sym.var("w")
    with mx.AttrScope(**g0):
        v = mx.sym.FullyConnected(x, w, num_hidden=6, no_bias=True, name="v")
        local = mx.sym.identity(v, name="vloc") if copies else v
    with mx.AttrScope(**g1):
        remote = mx.sym.identity(v, name="vrem") if copies else v
    outs = []
    for i in range(10):          # 5 readers on each device
        src, grp = (local, g0) if i < 5 else (remote, g1)
        with mx.AttrScope(**grp):
            outs.append(mx.sym.sum(mx.sym.tanh(src * (0.3 + 0.1 * i)), name=f"r{i}"))
    with mx.AttrScope(**g0):
        return mx.sym.MakeLoss(mx.sym.add_n(*outs), name="loss")
rng = np.random.default_rng(0)
X, W = rng.standard_normal((4, 5)), rng.standard_normal((6, 5))
grads = []
for two in (False, True):
    exe = build(two).simple_bind(mx.cpu(0), group2ctx={"dev0": mx.cpu(0), "dev1": mx.cpu(1)},
                                 x=(4, 5), w=(6, 5), type_dict={"x": "float64", "w": "float64"})
    exe.arg_dict["x"][:] = X
    exe.arg_dict["w"][:] = W
    exe.forward(is_train=True)
    exe.backward()
    grads.append(np.concatenate([exe.grad_dict["x"].asnumpy().ravel(),
                                 exe.grad_dict["w"].asnumpy().ravel()]))
print(float(np.abs(grads[0] - grads[1]).max()))
"""


def largest_difference(cap: int, variant: str) -> float:
    env = dict(os.environ, MXNET_EXEC_INPLACE_GRAD_SUM_CAP=str(cap), MXNET_MKLDNN_ENABLED="0")
    done = subprocess.run([sys.executable, "-c", SCRIPT, variant], env=env, check=True,
                          capture_output=True, text=True, timeout=120)
    return float(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("cap, variant, right", [
    (1000000, "plain", True),    # what import tofu_mx sets: one ElementWiseSum of 10 pieces
    (8, "plain", False),         # MXNet's default: 10 pieces from 2 devices, added in place
    (3, "copies", True),         # a copy per device: 5-piece chains on one device each
    (2, "copies", False),        # ... but the copies' own 2 pieces, in place across devices
])
def test_in_place_gradient_sums_are_right_on_one_device_only(cap, variant, right):
    difference = largest_difference(cap, variant)
    assert (difference < 1e-12) == right, difference


PARTITIONED = r"""
import sys, warnings
import mxnet as mx
import tofu_mx
from tofu_mx import models
k = int(sys.argv[1])
builders = {
    "wresnet": (models.wresnet(14, widen=1, num_classes=10),
                models.input_shapes("wresnet", 8, image_size=32), "float64"),
    "rnn": (models.rnn(2, hidden=16, seq_len=6, vocab=24),
            models.input_shapes("rnn", 8, seq_len=6), "float32"),
    "transformer": (models.transformer(2, 16, 4, seq_len=4, vocab=24),
                    models.input_shapes("transformer", 8, seq_len=4), "float32"),
}
ctx = [mx.cpu(i) for i in range(k)]
for name, (sym, shapes, dtype) in builders.items():
    dtypes = {n: dtype for n in shapes}
    ptd = tofu_mx.partition(sym, ctx, dtypes=dtypes, **shapes)
    chains = ptd.simple_bind().debug_str().count("Op:_grad_add")
    report = tofu_mx.verify(sym, ptd, ctx, rtol=1e-4, atol=1e-5, dtypes=dtypes, **shapes)
    print(name, chains, ptd.node_counts.get("relay", 0), report.ok)
"""


@pytest.mark.parametrize("k", [2, 4])
def test_partitioned_graphs_are_right_at_a_low_cap(k):
    """At a cap of 3 MXNet adds in place wherever a value has 3 readers. A partitioned graph
    keeps those sums only where every piece is made on the value's device by its readers'
    own gradient nodes (an unrolled RNN's weights), and reads every other value through
    relays (``bounded_reads``): both are there, and every gradient matches one device's.
    (At such a cap MXNet's chain is wrong even on one device in some graphs: a fuzz graph
    reading its data in a Convolution and two Concats.)"""
    env = dict(os.environ, MXNET_EXEC_INPLACE_GRAD_SUM_CAP="3", MXNET_MKLDNN_ENABLED="0")
    done = subprocess.run([sys.executable, "-c", PARTITIONED, str(k)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()]
    assert [r[0] for r in rows] == ["wresnet", "rnn", "transformer"]
    assert all(ok == "True" for *_, ok in rows), rows
    assert all(int(relays) > 0 for _, _, relays, _ in rows), rows
    assert sum(int(chains) for _, chains, _, _ in rows) > 0, rows
