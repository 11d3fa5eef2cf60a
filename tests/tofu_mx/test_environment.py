"""``import tofu_mx`` sets MXNet's environment for partitioned graphs (see the package's
docstring); the user's own code must keep working under it. MXNet latches these settings on
first use, so each run is a fresh process."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

USER_SCRIPT = """
import json, sys
if sys.argv[1] == "with":
    import tofu_mx
import mxnet as mx
from mxnet import autograd
from mxnet.gluon import rnn
results = {}
for name, layer, states in [
        ("lstm", rnn.LSTM(8, 2, bidirectional=True, layout="NTC", input_size=4), 2),
        ("gru", rnn.GRU(8, input_size=4), 0), ("rnn", rnn.RNN(8, input_size=4), 1)]:
    layer.initialize(mx.init.Uniform(0.3))
    mx.random.seed(1)
    x = mx.nd.random.uniform(-1, 1, shape=(3, 5, 4))
    x.attach_grad()
    begin = [mx.nd.full((4 if name == "lstm" else 1, 3 if name == "lstm" else 5, 8), 0.1)
             for _ in range(states)]
    with autograd.record():
        y = layer(x, begin) if begin else layer(x)
        y = y[0] if isinstance(y, tuple) else y
        (y * y).sum().backward()
    results[name] = {"dtype": str(y.dtype), "out": y.asnumpy().ravel().tolist(),
                     "grad": x.grad.asnumpy().ravel().tolist()}
print(json.dumps(results))
"""


def _run(mode):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXNET_")}
    done = subprocess.run([sys.executable, "-c", USER_SCRIPT, mode], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plain():
    return _run("without")


@pytest.fixture(scope="module")
def imported():
    return _run("with")


@pytest.mark.parametrize("name", ["lstm", "gru", "rnn"])
def test_users_float32_fused_rnn_layers_run_after_import(name, plain, imported):
    """Seen: after ``import tofu_mx`` no float32 Gluon LSTM/GRU layer ran on CPU."""
    ours = imported[name]
    assert ours["dtype"] == "<class 'numpy.float32'>"
    for key in ("out", "grad"):
        np.testing.assert_allclose(ours[key], plain[name][key], rtol=1e-4, atol=1e-5)


BIND_SCRIPT = """
import mxnet as mx, numpy as np, tofu_mx
y = mx.sym.BatchNorm(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3))
for _ in range(3):
    y.simple_bind(mx.cpu(), data=(2, 4), type_dict={"data": "float64"}).forward()
"""


@pytest.mark.parametrize("verbose, shown", [(None, False), ("1", True)])
def test_mxnets_per_bind_subgraph_log_is_quiet_unless_asked_for(verbose, shown):
    """Seen: 47-103 'Subgraph backend MKLDNN is activated' lines in README's snippets (which
    import mxnet before tofu_mx)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXNET_")}
    if verbose is not None:
        env["MXNET_SUBGRAPH_VERBOSE"] = verbose
    done = subprocess.run([sys.executable, "-c", BIND_SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("Subgraph backend" in done.stderr) is shown


def test_import_leaves_mxnets_gradient_sums_as_they_are():
    """``import tofu_mx`` once raised MXNET_EXEC_INPLACE_GRAD_SUM_CAP for the whole process
    (which cost the user's own graphs memory: in-place gradient sums off); partitioned graphs
    now read no value that often (``bounded_reads``), and the variable is the user's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXNET_")}
    script = ("import os, tofu_mx; "
              "print(os.environ.get('MXNET_EXEC_INPLACE_GRAD_SUM_CAP', 'unset'))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["unset"]
