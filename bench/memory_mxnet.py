"""Memory as MXNet allocates it: each device's peak in one training step, against the ideal.

    python bench/memory_mxnet.py [--quick]

For each model and device count, in a fresh process each (MXNet's pools and its profiler's
counters start empty):

- **MXNet**: MXNet's storage profiler (``mx.profiler.set_config(profile_memory=True)``)
  counts, per device, the bytes its storage manager hands out and takes back; it is on from
  before ``simple_bind`` to the end of one forward + backward pass, so the peak of each
  device's counter is what that device held at once: arguments, gradients, aux states, the
  executor's planned buffers (activations, conversions, copies) and temporary workspace.
- **ideal**: the same peak of the unpartitioned graph on one device, divided by k (MXNet's
  gradient-sum cap at its default, 8, in both: ``import tofu_mx`` leaves it alone).
- **accounted**: :meth:`PartitionedSymbol.memory_per_device` (weights, gradients, aux,
  inputs, kept activations; not conversions, copies or workspace), the busiest device;
- **planned**: :meth:`PartitionedSymbol.planned_memory` (MXNet's memory plan of the step,
  :func:`tofu_mx.sim.memory.peak_memory`), the busiest device;
- **as pieces**: MXNet's peak again with ``partition(..., join_outputs=False)`` (each output
  returned as its devices' pieces, not joined whole on device 0).

MXNet numbers its profiler's CPU devices by ``omp_get_num_procs()``: on a machine with P
cores, ``cpu(P)`` and ``cpu(P+1)`` are counted under its ``cpu pinned/`` and
``cpu shared/`` names, and a larger ``cpu(i)`` stops MXNet; so k is at most P + 2 here
(k = 2 and 4 on 2 cores). Prints a markdown table; writes bench/out/memory_mxnet.md.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchlib import table, write_out  # noqa: E402

#: the models: (label, builder call, input shapes call), evaluated in the child process
CASES = [
    ("WResNet-26-W2, batch 16, 64px", "models.wresnet(26, 2, 100)",
     "models.input_shapes('wresnet', 16, image_size=64)"),
    ("LSTM-2x1024, batch 32, 10 steps", "models.rnn(2, 1024, 10, 8000)",
     "models.input_shapes('rnn', 32, seq_len=10)"),
    ("Transformer 4x512, batch 16, 32 tokens", "models.transformer(4, 512, 8, 32, 8000)",
     "models.input_shapes('transformer', 16, seq_len=32)"),
]

#: what one child process runs: bind (partitioned over k devices, or whole on cpu(0) for
#: k = 0), one forward + backward pass under the storage profiler; prints a JSON line
CHILD = r"""
import json, os, sys
import mxnet as mx, numpy as np
import tofu_mx
from tofu_mx import models
k, trace, join = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "joined"
sym, shapes = {model}, {shapes}
mx.profiler.set_config(profile_memory=True, profile_symbolic=False,
                       profile_imperative=False, aggregate_stats=False, filename=trace)
accounted = predicted = None
if k:
    ptd = tofu_mx.partition(sym, [mx.cpu(i) for i in range(k)], join_outputs=join, **shapes)
    accounted = [m.total for m in ptd.memory_per_device()]
    predicted = list(ptd.planned_memory())
    names = {{n.name for n in ptd.graph.variables("param")}}
    mx.profiler.set_state("run")
    exe = ptd.simple_bind(grad_req={{n: "write" if n in names else "null"
                                    for n in sym.list_arguments()}})
else:
    from nnvm_passes.importer import import_symbol
    names = {{n.name for n in import_symbol(sym, **shapes).variables("param")}}
    mx.profiler.set_state("run")
    exe = sym.simple_bind(mx.cpu(0), grad_req={{n: "write" if n in names else "null"
                                               for n in sym.list_arguments()}}, **shapes)
rng = np.random.default_rng(0)
for name, array in exe.arg_dict.items():
    array[:] = rng.integers(0, 2, array.shape) if "label" in name else \
        rng.uniform(-0.1, 0.1, array.shape)
exe.forward(is_train=True)
exe.backward()
mx.nd.waitall()
mx.profiler.set_state("stop")
mx.profiler.dump()
print(json.dumps({{"accounted": accounted, "predicted": predicted}}))
"""


def peaks(trace: str) -> dict[str, int]:
    """Each device's peak of MXNet's storage counter, in bytes, by the profiler's name."""
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    out: dict[str, int] = {}
    for e in events:
        if e.get("ph") == "C" and e["name"].startswith("Memory: "):
            value = int(next(iter(e["args"].values())))
            name = e["name"][len("Memory: "):]
            out[name] = max(out.get(name, 0), value)
    return out


def device_names(k: int) -> list[str]:
    """The profiler's names of cpu(0..k-1) (see the module docstring)."""
    procs = os.cpu_count() or 1
    extra = ["cpu pinned/", "cpu shared/"]
    return [f"cpu/{i}" if i < procs else extra[i - procs] for i in range(k)]


def measure(model: str, shapes: str, k: int, join: bool = True
            ) -> tuple[list[int], list[int] | None, list[int] | None]:
    """(MXNet's peak per device, the accounted bytes per device, the simulator's peak per
    device) of one child run (``join``: the outputs joined whole on device 0)."""
    with tempfile.TemporaryDirectory() as folder:
        trace = os.path.join(folder, "trace.json")
        code = CHILD.format(model=model, shapes=shapes)
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        env.pop("MXNET_EXEC_INPLACE_GRAD_SUM_CAP", None)     # MXNet's default in both
        done = subprocess.run([sys.executable, "-c", code, str(k), trace,
                               "joined" if join else "pieces"], env=env,
                              capture_output=True, text=True, check=True)
        said = json.loads(done.stdout.strip().splitlines()[-1])
        found = peaks(trace)
    names = device_names(max(k, 1))
    return [found.get(n, 0) for n in names], said["accounted"], said["predicted"]


def main():
    quick = "--quick" in sys.argv
    procs = os.cpu_count() or 1
    counts = [k for k in (2, 4) if k <= procs + 2]
    rows = []
    for label, model, shapes in CASES[:1] if quick else CASES:
        (one,), _, _ = measure(model, shapes, 0)
        for k in counts:
            got, accounted, predicted = measure(model, shapes, k)
            pieces, _, planned = measure(model, shapes, k, join=False)
            ideal = one / k
            busiest = max(range(k), key=lambda d: got[d])
            row = [label, k, f"{one / 2**20:.1f}", " / ".join(f"{g / 2**20:.1f}" for g in got),
                   f"{got[busiest] / ideal:.2f}", f"{max(accounted) / ideal:.2f}",
                   f"{got[busiest] / accounted[busiest]:.2f}",
                   f"{got[busiest] / predicted[busiest]:.2f}",
                   " / ".join(f"{g / 2**20:.1f}" for g in pieces),
                   f"{max(pieces) / ideal:.2f}",
                   f"{max(pieces) / planned[max(range(k), key=lambda d: pieces[d])]:.2f}"]
            rows.append(row)
            print(" | ".join(map(str, row)), flush=True)
    head = ["model", "k", "one device, MiB", "MXNet's peak per device, MiB",
            "busiest / ideal (MXNet)", "busiest / ideal (accounted)",
            "MXNet / accounted (busiest)", "MXNet / planned_memory() (busiest)",
            "as pieces: MXNet's peak per device, MiB", "as pieces: busiest / ideal (MXNet)",
            "as pieces: MXNet / planned_memory() (busiest)"]
    text = table(head, rows)
    write_out("memory_mxnet.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
