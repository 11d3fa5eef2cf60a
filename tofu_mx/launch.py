"""``python -m tofu_mx.launch -n N [-s S] -- CMD ...``: a distributed run on this machine.

It starts ps-lite's scheduler, ``S`` servers and ``N`` workers running ``CMD`` over loopback,
as MXNet's distributed KVStore (``kvstore="dist_sync"``) needs them:

- every process gets the ``DMLC_*`` variables (the scheduler on 127.0.0.1 at a free port,
  the numbers of servers and workers, its own role); the scheduler and the servers run
  ``python -c "import mxnet"``, which serves until the workers are done;
- each line a process prints is streamed with its name in front: ``[worker 1] ...`` (the
  launcher's numbering: a worker's rank, ``kv.rank`` or ``Trainer.rank``, is what ps-lite's
  scheduler assigns at start-up, and may differ);
- it fails fast: when a process exits with an error (or is killed), the others are
  stopped at once and the launcher exits with that code (1 for a signal), naming the
  process; when every worker has finished cleanly, the scheduler and servers get
  ``GRACE`` seconds to finish, then are stopped;
- it owns what it starts: each process runs in a process group of its own, and stopping
  one stops its group (SIGTERM, then SIGKILL after ``STOP`` seconds), so whatever a worker
  started goes too. SIGTERM, SIGINT (Ctrl-C) or SIGHUP to the launcher stop every group
  and it exits with 128 + the signal's number; ``--timeout`` stops a run that takes longer
  (a hung worker), with exit code 124; on Linux, a launcher killed outright (SIGKILL) takes
  the processes it started with it (``ORPHAN_GUARD``; not what they started in turn);
- the servers sum float64 in float64: they start with glibc's malloc handing out zeroed
  memory (``SERVER_TUNABLES``). MXNet 1.9.1's server never initialises its
  ``multi_precision_`` flag (``src/kvstore/kvstore_dist_server.h``), so whatever the heap
  held there decides whether it keeps and sums float64 keys in float32; zeroed memory makes
  it false. A ``GLIBC_TUNABLES`` of your own comes after these, so yours win.

It is for trying and testing on one machine. On a cluster, use MXNet's own launcher
(``tools/launch.py`` of MXNet's sources, with ``--launcher ssh`` and a host file) or
``horovodrun``: they set the same variables on each host.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Sequence, TextIO

from tofu_mx import arguments
from tofu_mx.errors import InvalidArgumentError, TofuError

#: seconds the scheduler and servers get to finish once every worker has
GRACE = 10.0
#: the most workers and servers one launch starts: each is a process with MXNet loaded
MAX_PROCESSES = 256
#: exit code of a run stopped by its --timeout (as timeout(1))
TIMED_OUT = 124
#: seconds a stopped process gets between SIGTERM and SIGKILL
STOP = 3.0
HOST = "127.0.0.1"
#: glibc's malloc settings for the servers: no per-thread cache (it hands out memory without
#: the perturb step) and every block zeroed when handed out (perturb byte 255: filled with
#: 255 ^ 0xff), so the server's uninitialised multi_precision_ flag reads false
SERVER_TUNABLES = "glibc.malloc.tcache_count=0:glibc.malloc.perturb=255"


@dataclass
class _Process:
    name: str           # "scheduler", "server 0", "worker 1"
    popen: subprocess.Popen
    reader: threading.Thread


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on now (the operating system's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Stopped(Exception):
    """The launcher got a signal to stop: ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def launch(command: Sequence[str], workers: int, servers: int = 1, *,
           env: Mapping[str, str] | None = None, out: TextIO | None = None,
           timeout: float | None = None) -> int:
    """Run ``command`` as ``workers`` ps-lite workers, with a scheduler and ``servers``
    servers, on this machine (see the module's docstring); the exit code: 0 when every
    worker finished cleanly, :data:`TIMED_OUT` when ``timeout`` seconds passed first."""
    command = list(command)
    if not command or not all(isinstance(c, str) for c in command):
        raise InvalidArgumentError(f"the command to launch must be a non-empty list of "
                                   f"strings, got {arguments.show(command)}; e.g. "
                                   f"python -m tofu_mx.launch -n 2 -- python train.py")
    workers = arguments.count(workers, "workers (-n)", maximum=MAX_PROCESSES, example="-n 2")
    servers = arguments.count(servers, "servers (-s)", maximum=MAX_PROCESSES, example="-s 1")
    if timeout is not None:
        timeout = arguments.real(timeout, "timeout (--timeout)", minimum=0, strict=True,
                                 example="--timeout 600")
    out = out or sys.stdout
    base = dict(os.environ if env is None else env)
    if shutil.which(command[0], path=base.get("PATH")) is None:
        raise TofuError(f"cannot start the worker 0 ({' '.join(command)}): {command[0]} is "
                        f"not a program found on PATH or an executable file; check the "
                        f"command")
    base.update(DMLC_PS_ROOT_URI=HOST, DMLC_PS_ROOT_PORT=str(free_port()),
                DMLC_NODE_HOST=HOST, DMLC_NUM_SERVER=str(servers),
                DMLC_NUM_WORKER=str(workers))
    serve = [sys.executable, "-c", "import mxnet"]
    own = base.get("GLIBC_TUNABLES")
    tunables = {"GLIBC_TUNABLES": f"{SERVER_TUNABLES}:{own}" if own else SERVER_TUNABLES}
    lock = threading.Lock()
    plan = [("scheduler", "scheduler", serve)] + \
        [(f"server {i}", "server", serve) for i in range(servers)] + \
        [(f"worker {i}", "worker", command) for i in range(workers)]
    processes: list[_Process] = []
    try:
        for name, role, argv in plan:
            env = {**base, "DMLC_ROLE": role, **(tunables if role == "server" else {})}
            processes.append(_start(name, argv, env, out, lock))
        return _watch(processes, out, lock, timeout)
    finally:
        _stop(processes)


#: what each process starts as, on Linux: it asks the kernel to SIGKILL it when the launcher
#: dies (by SIGKILL too, which the launcher cannot catch: a test's time limit, the OOM
#: killer), checks that the launcher has not died already, then becomes the command (the
#: request outlives exec). argv: the launcher's pid, the command.
ORPHAN_GUARD = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n")


def _guarded(argv: list[str]) -> list[str]:
    """``argv`` started through :data:`ORPHAN_GUARD` where the kernel offers it (Linux)."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-c", ORPHAN_GUARD, str(os.getpid()), *argv]


def _start(name: str, argv: list[str], env: dict, out: TextIO, lock) -> _Process:
    try:
        popen = subprocess.Popen(_guarded(argv), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 text=True, bufsize=1, errors="replace",
                                 start_new_session=True)      # its own process group
    except OSError as e:
        raise TofuError(f"cannot start the {name} ({' '.join(argv)}): {e}; check the "
                        f"command") from e

    def stream():
        for line in popen.stdout:
            with lock:
                out.write(f"[{name}] {line if line.endswith(chr(10)) else line + chr(10)}")
                out.flush()
    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    return _Process(name, popen, reader)


def _watch(processes: list[_Process], out: TextIO, lock, timeout: float | None) -> int:
    """Wait until every worker is done, a process fails or ``timeout`` passes; the exit
    code."""
    workers = [p for p in processes if p.name.startswith("worker")]
    finished_at = None
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if deadline is not None and time.monotonic() > deadline:
            left = [p.name for p in processes if p.popen.poll() is None]
            _say(out, lock, f"the run took over --timeout {timeout:g} s; stopping "
                            f"{', '.join(left)}")
            return TIMED_OUT
        for p in processes:
            code = p.popen.poll()
            if code is not None and code != 0:
                p.reader.join(timeout=1.0)
                _say(out, lock, f"{p.name} (pid {p.popen.pid}) {_how(code)}; stopping the "
                                f"other {len(processes) - 1} processes")
                return code if code > 0 else 1
        if all(p.popen.poll() == 0 for p in workers):
            if all(p.popen.poll() == 0 for p in processes):
                for p in processes:
                    p.reader.join(timeout=1.0)
                return 0
            finished_at = finished_at or time.monotonic()
            if time.monotonic() - finished_at > GRACE:
                left = [p.name for p in processes if p.popen.poll() is None]
                _say(out, lock, f"every worker finished; {', '.join(left)} still running "
                                f"after {GRACE:g} s, stopped")
                return 0
        time.sleep(0.05)


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _say(out: TextIO, lock, message: str) -> None:
    with lock:
        out.write(f"tofu_mx.launch: {message}\n")
        out.flush()


def _signal_group(p: _Process, signum: int) -> None:
    """``signum`` to ``p``'s process group (what it started too); gone already: nothing."""
    try:
        os.killpg(p.popen.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(processes: list[_Process]) -> None:
    """SIGTERM to every process group, SIGKILL to those left after ``STOP`` seconds (a
    group's leader that exited may leave members: they are signalled all the same). A
    signal to the launcher meanwhile waits until they are all stopped."""
    held = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        _stop_groups(processes)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _stop_groups(processes: list[_Process]) -> None:
    for p in processes:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + STOP
    for p in processes:
        try:
            p.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in processes:
        _signal_group(p, signal.SIGKILL)
        p.popen.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tofu_mx.launch",
        description="Run CMD as N workers of MXNet's distributed KVStore on this machine, "
                    "with ps-lite's scheduler and S servers.")
    parser.add_argument("-n", "--workers", type=int, required=True, help="worker processes")
    parser.add_argument("-s", "--servers", type=int, default=1, help="server processes")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds the whole run may take; then every process is stopped "
                             f"and the exit code is {TIMED_OUT}")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command each worker runs, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    def stop(signum, frame):
        raise Stopped(signum)
    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT,
                                                    signal.SIGHUP)}
    try:
        return launch(command, args.workers, args.servers, timeout=args.timeout)
    except TofuError as e:
        print(f"python -m tofu_mx.launch: error: {e}", file=sys.stderr)
        return 2
    except Stopped as e:        # launch() stopped every process group on its way out
        print(f"python -m tofu_mx.launch: stopped by {e}; every process it started is "
              f"stopped", file=sys.stderr)
        return 128 + e.signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
