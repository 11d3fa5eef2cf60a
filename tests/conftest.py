import os
import time
import uuid

import mxnet as mx
import pytest

import tofu_mx  # noqa: F401  (sets MXNet's environment defaults before any operator runs)

#: in the environment of the test session and of every process it starts (inherited), so
#: that the session can find, at its end, any process a test left behind
SESSION_MARKER = "TOFU_MX_TEST_SESSION"


@pytest.fixture
def cpus():
    """``cpus(k)``: k distinct CPU devices, which MXNet's executor treats as separate devices."""
    return lambda k: [mx.cpu(i) for i in range(k)]


def pytest_configure(config):
    if not hasattr(config, "workerinput"):      # the controller; xdist's workers inherit it
        os.environ.setdefault(SESSION_MARKER, uuid.uuid4().hex)


def _left_behind(tag: bytes, exclude: set[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if tag in f.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat", "rb") as s:
                        if s.read().split(b") ")[-1][:1] != b"Z":    # not a zombie
                            found.append(int(entry))
        except OSError:
            pass
    return found


def pytest_sessionfinish(session, exitstatus):
    """No test leaves a process behind: at the end, no process but this one (and xdist's
    workers, on their way out) carries this session's marker."""
    if hasattr(session.config, "workerinput") or not os.path.isdir("/proc"):
        return
    tag = f"{SESSION_MARKER}={os.environ[SESSION_MARKER]}".encode()
    me = {os.getpid()}
    deadline = time.monotonic() + 10
    left = _left_behind(tag, me)
    while left and time.monotonic() < deadline:     # xdist's workers exiting
        time.sleep(0.2)
        left = _left_behind(tag, me)
    if left:
        commands = []
        for pid in left[:5]:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    commands.append(f"{pid}: {f.read().replace(chr(0).encode(), b' ')[:120]}")
            except OSError:
                pass
        session.config.get_terminal_writer().line(
            f"processes left behind by the tests: {len(left)}: {commands}", red=True)
        session.exitstatus = 1
