"""python -m tofu_mx.launch: ps-lite's scheduler, servers and workers on loopback."""
import subprocess
import sys
import time

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
