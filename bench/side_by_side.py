"""plan() and partition() of the paper's WResNet-152-W10 at k = 8, old code against new.

    python bench/side_by_side.py OLD_REV [--rounds N] [--partition-rounds N]

OLD_REV (a commit) is checked out into a temporary git worktree; the new code is this
checkout's. Each round runs one fresh process per version, alternating, so that drifts in
the machine's speed hit both alike: a process builds the model (batch 48, 224 px), calls
``tofu_mx.plan(sym, 8)`` once to warm up, then times five more calls; a partition round
times one ``tofu_mx.partition(sym, [mx.cpu(0), ..., mx.cpu(7)])`` (nothing bound or run).
Prints the median of each version's calls and new / old, and writes
bench/out/side_by_side.md. Issue 41's target: plan() within 1.2x of its time before the
issue's work (adb592e).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchlib import table, write_out  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: what one process runs (argv[1]: "plan" or "partition"); prints a JSON list of seconds
CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import mxnet as mx
import tofu_mx
from tofu_mx import models
sym, shapes = models.wresnet(152, 10), models.input_shapes("wresnet", 48)
times = []
if sys.argv[1] == "plan":
    tofu_mx.plan(sym, 8, **shapes)
    for _ in range(5):
        start = time.perf_counter()
        tofu_mx.plan(sym, 8, **shapes)
        times.append(time.perf_counter() - start)
else:
    start = time.perf_counter()
    tofu_mx.partition(sym, [mx.cpu(i) for i in range(8)], **shapes)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def timed(code_root: str, what: str) -> list[float]:
    """Seconds of ``what``'s calls in a fresh process running the code at ``code_root``."""
    env = dict(os.environ, PYTHONPATH=code_root)
    out = subprocess.run([sys.executable, "-c", CHILD, what], cwd=code_root, env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def option(name: str, default: int) -> int:
    if name in sys.argv:
        return int(sys.argv[sys.argv.index(name) + 1])
    return default


def main():
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python bench/side_by_side.py OLD_REV [--rounds N] "
                 "[--partition-rounds N]")
    old_rev = sys.argv[1]
    known = subprocess.run(["git", "rev-parse", "--verify", "--quiet", old_rev + "^{commit}"],
                           cwd=ROOT, capture_output=True, text=True)
    if known.returncode != 0:
        sys.exit(f"{old_rev!r} is not a commit of this repository; give one that "
                 f"`git log` lists, e.g. adb592e (the code before issue 41's work)")
    rounds, partition_rounds = option("--rounds", 3), option("--partition-rounds", 2)
    new_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        old_root = os.path.join(tmp, "old")
        subprocess.run(["git", "worktree", "add", "--detach", "-q", old_root, old_rev],
                       cwd=ROOT, check=True)
        try:
            found = {("plan", "old"): [], ("plan", "new"): [],
                     ("partition", "old"): [], ("partition", "new"): []}
            for what, n in (("plan", rounds), ("partition", partition_rounds)):
                for r in range(n):
                    for version, root in (("old", old_root), ("new", ROOT)):
                        found[what, version] += timed(root, what)
                        print(f"{what} round {r + 1}/{n}, {version}: "
                              f"{found[what, version][-1]:.2f} s", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", old_root], cwd=ROOT,
                           check=False)
    rows = []
    for what in ("plan", "partition"):
        old = statistics.median(found[what, "old"])
        new = statistics.median(found[what, "new"])
        rows.append((f"`{what}()`", len(found[what, "old"]), f"{old:.2f}", f"{new:.2f}",
                     f"{new / old:.2f}"))
    text = "\n".join([
        f"# plan() and partition(), WResNet-152-W10 (batch 48) at k = 8: {old_rev} against "
        f"{new_rev} (working tree)", "",
        table(["call", "calls each", f"old ({old_rev}) median s", f"new ({new_rev}) median s",
               "new / old"], rows), ""])
    print(text)
    print(f"written to {write_out('side_by_side.md', text)}")


if __name__ == "__main__":
    main()
