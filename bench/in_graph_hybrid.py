"""Tried, not kept: data parallelism across device groups INSIDE one partitioned Symbol.

    python bench/in_graph_hybrid.py [--quick]

Issue 41 asks ``partition(..., machine=...)`` to weigh hybrids (data parallel across groups
of devices, Tofu inside each). The hybrid that runs today is the Gluon block's
(``tofu_mx.gluon.partition(..., replicas=2)``): one executor per group, each holding every
weight it reads, gradients summed between groups through the Trainer. This script measures
the other way, within one Symbol, which is all ``partition()`` can return: the search with
its first cuts (those making the groups) restricted to splitting every operator's batch,
the cuts inside searched as usual. One executor gives each variable one gradient, so a
weight cannot be held by both groups and updated from their summed gradients: it is stored
split between the groups, gathered in the forward pass, and its gradient summed back.

The restriction is ``bench/results/data_parallel_groups.patch`` (a ``SearchOptions``
field, ``data_parallel_groups``), applied to the commit it was made against (:data:`BASE`)
in a temporary git worktree; nothing in the tree is changed. For each model and machine, a fresh process
simulates one training step (SGD with momentum, WResNets at batch 32, 224 px) of data
parallelism, the Gluon hybrid, ``partition(machine=)``'s plan, and the in-Symbol hybrid
(converted inputs kept; conversions priced at the machine's ``conversion_bytes`` or not;
routed as it is and once per device group), and writes bench/out/in_graph_hybrid.md.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchlib import table, write_out  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATCH = os.path.join(ROOT, "bench", "results", "data_parallel_groups.patch")
#: the commit the patch was made against
BASE = "4cf31db"
CASES = [(152, 4, "8xV100-16GB-PCIe"), (101, 4, "8xV100-16GB-PCIe"),
         (152, 4, "8xV100-32GB-NVLink")]     # machines of two or more device groups

#: one model on one machine (argv: depth, width, machine); prints a JSON object of steps
CHILD = r"""
import dataclasses, json, sys, warnings
warnings.simplefilter("ignore")
import mxnet as mx
from tofu_mx import models, sim
from tofu_mx.search import SearchOptions
from tofu_mx.runtime.partitioned import _partition, _routed
depth, width, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
sym, shapes = models.wresnet(depth, width), models.input_shapes("wresnet", 32)
machine = sim.machine(name)
options = SearchOptions(optimizer_state=1)
out = {s: sim.simulate(sym, machine, s, options=options, **shapes)
       for s in ("data_parallel", "hybrid", "tofu-machine")}
out = {s: r.step_time if r.fits else None for s, r in out.items()}
groups = machine.num_devices // machine.group_size
steps = []
for priced in (machine.conversion_bytes, 0.0):
    tried = dataclasses.replace(options, data_parallel_groups=groups, refetch=False,
                                keep_if_fits=False, conversion_bytes=priced)
    ptd = _partition(sym, [mx.cpu(i) for i in range(machine.num_devices)], None, tried,
                     None, False, shapes, True)
    assert ptd.plan.levels[0].data_parallel
    for routed in (ptd, _routed(ptd, machine.group_size)):
        step, peaks = sim.partitioned_step(routed, machine, options.optimizer_state)
        steps.append(step if max(peaks) <= machine.memory else None)
fitting = [s for s in steps if s is not None]
out["in_symbol"] = min(fitting) if fitting else None
print(json.dumps(out))
"""


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    cases = CASES[:1] if quick else CASES
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "tree")
        subprocess.run(["git", "worktree", "add", "--detach", "-q", tree, BASE], cwd=ROOT,
                       check=True)
        try:
            subprocess.run(["git", "apply", PATCH], cwd=tree, check=True)
            rows = []
            for depth, width, name in cases:
                env = dict(os.environ, PYTHONPATH=tree)
                done = subprocess.run([sys.executable, "-c", CHILD, str(depth), str(width),
                                       name], cwd=tree, env=env, capture_output=True,
                                      text=True)
                if done.returncode:
                    raise SystemExit(f"WResNet-{depth}-W{width} on {name} failed:\n"
                                     f"{done.stderr}")
                got = json.loads(done.stdout.strip().splitlines()[-1])

                def cell(key):
                    return "does not fit" if got[key] is None else f"{got[key]:.3f} s"
                rows.append([f"WResNet-{depth}-W{width}", name] +
                            [cell(k) for k in ("data_parallel", "hybrid", "tofu-machine",
                                               "in_symbol")])
                print(" | ".join(rows[-1]), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT,
                           check=False)
    text = "\n".join([
        f"# Data parallelism inside one Symbol (tried, not kept): at {BASE} + "
        f"bench/results/data_parallel_groups.patch", "",
        "Simulated step (`tofu_mx.sim`), SGD with momentum, batch 32, 224 px:", "",
        table(["model", "machine", "data parallel", "hybrid (Gluon, replicas=2)",
               "partition(machine=)", "data parallel across the groups inside one Symbol "
               "(best of 4 variants)"], rows), ""])
    print("wrote", write_out("in_graph_hybrid.md", text))


if __name__ == "__main__":
    main()
