"""Faults and load: a checkpoint survives a process killed while saving it, and plan() /
partition() give the same results in two threads at once as one after the other."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import mxnet as mx
import numpy as np

import tofu_mx
from tofu_mx import models

_SAVER = textwrap.dedent("""
    import sys, mxnet as mx, numpy as np, tofu_mx
    path, rows = sys.argv[1], int(sys.argv[2])
    data = mx.sym.var("data")
    out = mx.sym.MakeLoss(mx.sym.sum(mx.sym.FullyConnected(data, num_hidden=rows, name="fc")))
    ptd = tofu_mx.partition(out, [mx.cpu(0), mx.cpu(1)], data=(2, 1024))
    ptd.simple_bind()
    version = 0
    while True:
        ptd.set_params({"fc_weight": np.full((rows, 1024), version, np.float32),
                        "fc_bias": np.full((rows,), version, np.float32)})
        ptd.save_params(path)
        print(version, flush=True)
        version += 1
""")


def test_checkpoint_survives_a_kill_while_saving(tmp_path):
    """A process saving a 64 MiB checkpoint over and over is killed (SIGKILL) in the middle of
    a save: the file on disk still loads, and holds one whole version (every value equal),
    never a mix or a truncated file. Each kill lands at another point of the write."""
    path = str(tmp_path / "model.params")
    rows = 16 * 1024           # fc_weight: 16384 x 1024 float32 = 64 MiB
    for delay in (0.05, 0.2, 0.35):
        proc = subprocess.Popen([sys.executable, "-c", _SAVER, path, str(rows)],
                                stdout=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()        # one whole save has finished
            assert first.strip() == "0", first
            time.sleep(delay)                     # then kill it during a later one
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == -signal.SIGKILL
        blob = mx.nd.load(path)
        assert sorted(blob) == ["arg:fc_bias", "arg:fc_weight"]
        weight = blob["arg:fc_weight"].asnumpy()
        assert weight.shape == (rows, 1024)
        version = weight.flat[0]
        assert (weight == version).all() and (blob["arg:fc_bias"].asnumpy() == version).all()


def _small_models():
    wres = models.wresnet(14, 1, 10)
    rnn = models.rnn(2, 64, 4, 100)
    return [(wres, models.input_shapes("wresnet", 8, image_size=32)),
            (rnn, models.input_shapes("rnn", 8, seq_len=4))]


def _run(sym, shapes):
    plan = tofu_mx.plan(sym, 4, **shapes)
    ptd = tofu_mx.partition(sym, [mx.cpu(i) for i in range(2)], **shapes)
    return plan.to_json(), ptd.symbol.tojson()


def test_plan_and_partition_in_two_threads_match_sequential():
    """MXNet keeps its name and attribute scopes per thread, and the package keeps no
    global state a search writes: two threads planning and partitioning two models at once
    get exactly what one after the other gets."""
    work = _small_models()
    sequential = [_run(sym, shapes) for sym, shapes in work]
    results: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def run(i):
        try:
            for _ in range(2):
                results[i] = _run(*work[i])
        except BaseException as e:   # noqa: BLE001  (reported in the main thread)
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert [results[i] for i in range(len(work))] == sequential
