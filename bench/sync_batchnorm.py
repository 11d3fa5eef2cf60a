"""Can a batch-split BatchNorm run as one MXNet operator per device? A probe.

    python bench/sync_batchnorm.py

Issue 41 asks for batch-split BatchNorm "with far fewer operators (e.g. one fused
statistics pass per device)". Today the rewrite lowers it into about 25 operators per
device, which sum the statistics across devices with ordinary copies. MXNet 1.9.1's one
operator that sums them itself is ``_contrib_SyncBatchNorm`` (``ndev`` instances sharing a
``key`` meet at a barrier inside the operator). This script runs two instances in ONE
executor, over cpu(0) and cpu(1), each on half of a batch, as a partitioned graph would
(each half an input of its own device, or both cut on cpu(0)), in fresh processes under
several MXNet settings, each with a time limit; where it
finishes, it compares the input gradient and the summed gamma gradient with plain
BatchNorm on the whole batch. Then it times a WResNet-14 training step on one CPU device
with MXNet's bulk execution on and off (the setting under which the probe finishes), to
price that setting for every user. Writes bench/out/sync_batchnorm.md.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchlib import table, write_out  # noqa: E402

LIMIT = 60          # seconds a probe may take before it counts as hung (it takes about 1)

PROBE = r"""
import json, sys, numpy as np, mxnet as mx
shape = (6, 4, 3, 3)
rng = np.random.RandomState(0)
x = rng.randn(*shape) * 3 + 1
weight = rng.randn(*shape)

cut = sys.argv[1] == "cut"      # both halves cut from one input on cpu(0)
with mx.AttrScope(ctx_group="d0"):
    whole = mx.sym.var("x")
    halves = [mx.sym.slice_axis(whole, axis=0, begin=0, end=3),
              mx.sym.slice_axis(whole, axis=0, begin=3, end=6)] if cut else None

def half(name, dev):
    with mx.AttrScope(ctx_group=dev):
        data = halves[int(name)] if cut else mx.sym.var("x" + name)
        y = mx.sym.contrib.SyncBatchNorm(
            data, mx.sym.var("g" + name), mx.sym.var("b" + name),
            mx.sym.var("mm" + name), mx.sym.var("mv" + name), ndev=2, key="probe",
            fix_gamma=False, name="s" + name)
        return mx.sym.sum(y * mx.sym.var("w" + name))
with mx.AttrScope(ctx_group="d0"):
    loss = mx.sym.make_loss(half("0", "d0") + half("1", "d1"))
inputs = dict(x=shape) if cut else dict(x0=(3,) + shape[1:], x1=(3,) + shape[1:])
ex = loss.simple_bind(mx.cpu(0), group2ctx={"d0": mx.cpu(0), "d1": mx.cpu(1)},
                      w0=(3,) + shape[1:], w1=(3,) + shape[1:], **inputs)
if cut:
    ex.arg_dict["x"][:] = x
for p, rows in (("0", slice(0, 3)), ("1", slice(3, 6))):
    if not cut:
        ex.arg_dict["x" + p][:] = x[rows]
    ex.arg_dict["w" + p][:] = weight[rows]
    ex.arg_dict["g" + p][:] = 1.5
    ex.arg_dict["b" + p][:] = 0.2
    ex.aux_dict["mm" + p][:] = 0
    ex.aux_dict["mv" + p][:] = 1
ex.forward(is_train=True)
ex.backward()
mx.nd.waitall()
X = mx.sym.var("x")
ref = mx.sym.make_loss(mx.sym.sum(mx.sym.BatchNorm(X, fix_gamma=False, name="bn") *
                                  mx.sym.var("w")))
rex = ref.simple_bind(mx.cpu(0), x=shape, w=shape)
rex.arg_dict["x"][:] = x
rex.arg_dict["w"][:] = weight
rex.arg_dict["bn_gamma"][:] = 1.5
rex.arg_dict["bn_beta"][:] = 0.2
rex.forward(is_train=True)
rex.backward()
dx = ex.grad_dict["x"].asnumpy() if cut else \
    np.concatenate([ex.grad_dict["x0"].asnumpy(), ex.grad_dict["x1"].asnumpy()])
dx_ref = rex.grad_dict["x"].asnumpy()
dg = ex.grad_dict["g0"].asnumpy() + ex.grad_dict["g1"].asnumpy()
dg_ref = rex.grad_dict["bn_gamma"].asnumpy()
print(json.dumps({"dx": float(np.abs(dx - dx_ref).max() / np.abs(dx_ref).max()),
                  "dgamma": float(np.abs(dg - dg_ref).max() / np.abs(dg_ref).max())}))
"""

STEP = r"""
import json, time, numpy as np, mxnet as mx
import tofu_mx
from tofu_mx import models
sym = models.wresnet(14, 2, 10)
shapes = models.input_shapes("wresnet", 16, image_size=32)
ex = sym.simple_bind(mx.cpu(0), **shapes)
for a in ex.arg_arrays:
    a[:] = np.random.RandomState(0).uniform(-0.1, 0.1, a.shape)
times = []
for i in range(30):
    start = time.perf_counter()
    ex.forward(is_train=True)
    ex.backward()
    mx.nd.waitall()
    times.append(time.perf_counter() - start)
print(json.dumps(sorted(times[5:])[len(times[5:]) // 2]))
"""

#: where each instance's input is made: on its own device (a variable there), or both cut
#: on cpu(0) from one input, the half for cpu(1) copied there (as the rewrite's conversions
#: make a batch-split operator's inputs)
LAYOUTS = [("a variable on its device", "own"), ("cut on cpu(0), copied", "cut")]

SETTINGS = [
    ("MXNet's defaults", {}),
    ("MXNET_CPU_WORKER_NTHREADS=2", {"MXNET_CPU_WORKER_NTHREADS": "2"}),
    ("MXNET_EXEC_BULK_EXEC_TRAIN=0", {"MXNET_EXEC_BULK_EXEC_TRAIN": "0"}),
    ("both", {"MXNET_CPU_WORKER_NTHREADS": "2", "MXNET_EXEC_BULK_EXEC_TRAIN": "0"}),
]


def child(code: str, extra: dict, *args: str) -> tuple[str, object]:
    """("ok", its JSON) or ("hung", None), in a fresh process with ``extra`` set."""
    env = {k: v for k, v in os.environ.items() if k not in
           ("MXNET_CPU_WORKER_NTHREADS", "MXNET_EXEC_BULK_EXEC_TRAIN")}
    env.update(extra)
    try:
        done = subprocess.run([sys.executable, "-c", code, *args], env=env,
                              capture_output=True, text=True, timeout=LIMIT)
    except subprocess.TimeoutExpired:
        return "hung", None
    if done.returncode:
        return f"failed ({done.stderr.strip().splitlines()[-1][:120]})", None
    return "ok", json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    rows = []
    for (label, extra), (layout, mode) in itertools.product(SETTINGS, LAYOUTS):
        status, got = child(PROBE, extra, mode)
        rows.append([label, layout, "finished" if status == "ok" else
                     f"{status}: killed after {LIMIT} s" if status == "hung" else status,
                     f"{got['dx']:.1e}" if got else "-", f"{got['dgamma']:.1e}" if got else "-"])
        print(" | ".join(rows[-1]), flush=True)
    steps = []
    for label, extra in (SETTINGS[0], SETTINGS[3]):
        rounds = [child(STEP, extra)[1] for _ in range(3)]
        steps.append([label, " / ".join(f"{t * 1e3:.1f}" for t in rounds)])
        print(" | ".join(steps[-1]), flush=True)
    text = "\n".join([
        "# `_contrib_SyncBatchNorm` in one executor over cpu(0) and cpu(1)", "",
        f"Two instances (ndev=2, one key), each on 3 of 6 samples, float32; a probe counts as "
        f"hung after {LIMIT} s. Errors: largest difference over largest value, against plain "
        f"BatchNorm on the whole batch.", "",
        table(["setting", "each half's input", "probe", "input gradient error",
               "gamma gradient error"], rows), "",
        "WResNet-14-W2, batch 16, 32 px, one training step on cpu(0) (medians of 25 steps, "
        "three fresh processes each), ms:", "",
        table(["setting", "step, ms"], steps), ""])
    print("wrote", write_out("sync_batchnorm.md", text))


if __name__ == "__main__":
    main()
