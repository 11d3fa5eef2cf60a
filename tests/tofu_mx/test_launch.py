"""python -m tofu_mx.launch: ps-lite's scheduler, servers and workers on loopback."""
import contextlib
import io
import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from tofu_mx.launch import launch, main

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
    (["-n", "0", "--", "true"], "workers (-n) must be between 1 and 256"),
    (["-n", "2", "-s", "0", "--", "true"], "servers (-s) must be between 1 and 256"),
    (["-n", "2", "--"], "must be a non-empty list"),
    (["-n", "1", "--", "/no/such/program"], "cannot start the worker 0"),
])
def test_bad_arguments_get_one_line_and_code_2(argv, match, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


def _marked(marker: str) -> list[int]:
    """Processes (but this one) whose environment holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


HANG = [sys.executable, "-c", "import os, time; print('up', flush=True); time.sleep(600)"]


@contextlib.contextmanager
def _launched(worker: list[str]):
    """A launcher of 2 ``worker`` processes, its output read until both printed "up", and
    the marker in every environment it started; whatever carries it afterwards is killed."""
    marker = f"TOFU_LAUNCH_TEST={uuid.uuid4().hex}"
    name, value = marker.split("=")
    launcher = subprocess.Popen([sys.executable, "-m", "tofu_mx.launch", "-n", "2", "--",
                                 *worker], env={**os.environ, name: value},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        up = 0
        for line in launcher.stdout:
            up += line.endswith("up\n")
            if up == 2:
                break
        yield launcher, marker
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in _marked(marker):
            os.kill(pid, signal.SIGKILL)


def _all_gone(marker: str, seconds: float) -> bool:
    """No process carries ``marker`` within ``seconds``."""
    deadline = time.monotonic() + seconds
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _marked(marker) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_everything_it_started(signum, tmp_path):
    """Seen: after SIGTERM the launcher exited and its 4 processes ran on; after SIGINT it
    did not exit within 30 s. Each worker here also starts a child of its own."""
    worker = [sys.executable, "-c",
              "import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              "print('up', flush=True); time.sleep(600)"]
    with _launched(worker) as (launcher, marker):
        started, deadline = _marked(marker), time.monotonic() + 10
        while len(started) < 7 and time.monotonic() < deadline:   # a child may still start
            time.sleep(0.1)
            started = _marked(marker)
        assert len(started) >= 7     # launcher, scheduler, server, 2 workers, their children
        launcher.send_signal(signum)
        assert launcher.wait(timeout=15) == 128 + signum
        assert _all_gone(marker, 5)


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_launcher_killed_outright_takes_its_processes_with_it():
    """Seen: a test's time limit SIGKILLed the launcher of a hung dist_sync run, and its two
    workers, the scheduler and the server ran on."""
    with _launched(HANG) as (launcher, marker):
        assert len(_marked(marker)) == 5     # launcher, scheduler, server, 2 workers
        launcher.kill()
        launcher.wait(timeout=15)
        assert _all_gone(marker, 10)


def test_a_hung_run_is_stopped_after_its_timeout():
    start = time.monotonic()
    out = io.StringIO()
    assert launch(HANG, 1, timeout=2.0, out=out) == 124
    assert time.monotonic() - start < 15
    assert "--timeout 2 s" in out.getvalue()


@pytest.mark.parametrize("argv, match", [
    (["-n", "100000000", "--", "true"], "workers (-n) must be between 1 and 256"),
    (["-n", "1", "-s", "999", "--", "true"], "servers (-s) must be between 1 and 256"),
    (["-n", "1", "--timeout", "-3", "--", "true"], "timeout (--timeout) must be"),
])
def test_absurd_counts_are_refused_before_anything_starts(argv, match, capsys):
    """Seen: a MemoryError traceback for a huge -n."""
    assert main(argv) == 2
    assert match in capsys.readouterr().err
