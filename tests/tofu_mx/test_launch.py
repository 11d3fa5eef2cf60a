"""python -m tofu_mx.launch: ps-lite's scheduler, servers and workers on loopback."""
import subprocess
import sys
import time

import numpy as np
import pytest

from tofu_mx.launch import main

PUSH_PULL = """
import mxnet as mx
kv = mx.kv.create("dist_sync")
kv.init(3, mx.nd.zeros((2,)))
kv.push(3, mx.nd.ones((2,)) * (kv.rank + 1))
out = mx.nd.zeros((2,))
kv.pull(3, out=out)
print("rank", kv.rank, "of", kv.num_workers, "pulled", out.asnumpy().tolist())
"""

FLOAT64_SUM = """
import mxnet as mx, numpy as np
kv = mx.kv.create("dist_sync")
kv.init(3, mx.nd.zeros((2,), dtype="float64"))
a = mx.nd.array(np.full(2, 1 / 3 + kv.rank / 1000), dtype="float64")
kv.pushpull(3, a, out=a)
print("rank", kv.rank, "summed", repr(a.asnumpy()[0]))
"""

ONE_DIES = """
import os, signal, time
import mxnet as mx
kv = mx.kv.create("dist_sync")
kv.init(3, mx.nd.zeros((2,)))
if kv.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
for _ in range(1000):          # the other waits for a push that never comes
    kv.push(3, mx.nd.ones((2,)))
    out = mx.nd.zeros((2,))
    kv.pull(3, out=out)
    out.wait_to_read()
"""


def run(tmp_path, script, *flags, timeout=120):
    path = tmp_path / "worker.py"
    path.write_text(script)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tofu_mx.launch", *flags, "--",
                           sys.executable, str(path)], capture_output=True, text=True,
                          timeout=timeout)
    return done, time.monotonic() - start


def test_two_workers_sum_their_pushes_through_a_server(tmp_path):
    """dist_sync sums the two workers' pushes (1 and 2) on the server: both pull 3."""
    done, _ = run(tmp_path, PUSH_PULL, "-n", "2", "-s", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "pulled" in line]
    assert sorted(line.split("]")[0] for line in lines) == ["[worker 0", "[worker 1"]
    assert all(line.endswith("pulled [3.0, 3.0]") and "of 2" in line for line in lines)


@pytest.mark.parametrize("own, exact", [(None, True), ("glibc.malloc.perturb=1", False)])
def test_servers_sum_float64_in_float64_unless_your_own_malloc_settings_say_otherwise(
        tmp_path, monkeypatch, own, exact):
    """MXNet 1.9.1's server reads an uninitialised flag to choose float32 for float64 keys;
    the launcher hands the servers zeroed memory (float64), and a GLIBC_TUNABLES of the
    user's own comes after its settings (here memory filled with 0xfe: float32)."""
    if own:
        monkeypatch.setenv("GLIBC_TUNABLES", own)
    else:
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    done, _ = run(tmp_path, FLOAT64_SUM, "-n", "2", "-s", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    sums = [float(line.rsplit(" ", 1)[1]) for line in done.stdout.splitlines() if "summed" in line]
    a, b = 1 / 3, 1 / 3 + 1 / 1000
    want = a + b if exact else float(np.float32(a) + np.float32(b))
    assert want != float(np.float32(a) + np.float32(b)) if exact else want != a + b
    assert sums == [want, want], (sums, want)


def test_a_killed_worker_stops_the_run_at_once_and_is_named(tmp_path):
    done, seconds = run(tmp_path, ONE_DIES, "-n", "2", "-s", "2")
    assert done.returncode == 1
    assert "was killed by SIGKILL; stopping the other 4 processes" in done.stdout
    assert "tofu_mx.launch: worker " in done.stdout
    assert seconds < 60          # its own start (MXNet's import) included


@pytest.mark.parametrize("argv, match", [
    (["-n", "0", "--", "true"], "workers must be at least 1"),
    (["-n", "2", "-s", "0", "--", "true"], "servers must be at least 1"),
    (["-n", "2", "--"], "must be a non-empty list"),
    (["-n", "1", "--", "/no/such/program"], "cannot start the worker 0"),
])
def test_bad_arguments_get_one_line_and_code_2(argv, match, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1
