"""Benchmark of partition(): memory per device, the rewrite's own overhead, cross-device bytes.

    python bench/partition.py [--quick] [--no-big]

``--quick``: no k=8 plan-level rows, few repeats; ``--no-big``: no k=8 rows (they take about
10 GB of RAM).

(a) memory: ``memory_per_device()`` (weights, gradients, aux, inputs, and the activations some
    gradient node reads, from MXNet's own gradient graphs), for the plans keeping converted
    inputs for the backward pass (moving the fewest bytes, memory weight 0; and
    memory-weighted, 16), the one fetching every one again, and the default one (the
    keeping plan where it holds at most 1.15x the ideal as MXNet plans the step, else the
    re-fetching one, small copies kept, an uneven plan balanced), against the ideal:
    the single-device graph's same figure divided by k. For sizes that fit, the weights,
    gradients, aux and inputs are also summed from a bound executor's arrays per context.
(b) overhead: forward+backward time of the partitioned graph with every group on cpu(0),
    against the unpartitioned graph on cpu(0), measured side by side in one run (each round
    runs every executor once; medians of 31 rounds). Also the time with groups on
    cpu(0..k-1): each CPU device has its own engine thread on the same 2 cores, so this is
    NOT a model of GPU communication. And the plan ``partition(machine=...)`` chooses by
    the simulator's step time on this machine (the fitted ``"cpu"`` preset, k devices
    sharing its cores), all on cpu(0). Two sizes of each model: k shares of an operator pay
    its fixed cost per call k times (plus the conversions' calls), which weighs on small
    operators; the operator-node counts show how many calls each graph makes, and the
    busiest device's count (``PartitionedSymbol.operators_per_device()``: its group's nodes
    and the cross-device copies MXNet inserts into it) against the unpartitioned graph's,
    for the default plan and for ``machine=``'s.
(c) cross-device copies: tensors crossing ctx groups in the rewritten forward graph (count,
    bytes; the backward pass mirrors them) against the plan's predicted bytes.
(d) memory order: the same plan rewritten without and with Tofu's control dependencies
    (``apply_plan(..., ordered=True)``): the activation and temporary memory MXNet's planner
    allocates (``Executor.debug_str``, all contexts), and the step time.
Prints markdown tables; writes bench/out/partition.md.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

import tofu_mx  # noqa: E402
from benchlib import table, write_out  # noqa: E402
from nnvm_passes.importer import import_symbol  # noqa: E402
from tofu_mx import models, sim  # noqa: E402
from tofu_mx.runtime.partitioned import apply_plan  # noqa: E402
from tofu_mx.search.plan import SearchOptions, plan_graph  # noqa: E402
from tofu_mx.summary import format_bytes  # noqa: E402

warnings.simplefilter("ignore", RuntimeWarning)


def single_device_bytes(sym, shapes) -> int:
    """Weights, gradients, aux, inputs and kept activations of the graph on one device,
    counted as ``memory_per_device`` counts them."""
    return tofu_mx.partition(sym, [mx.cpu(0)], **shapes).memory_per_device()[0].total


def bound_bytes(exe) -> dict[str, int]:
    per = {}
    for arrays in (exe.arg_dict, exe.grad_dict, exe.aux_dict):
        for a in arrays.values():
            if a is not None:
                per[str(a.context)] = per.get(str(a.context), 0) + a.size * np.dtype(a.dtype).itemsize
    return per


def crossing(ptd) -> tuple[int, int]:
    g = ptd.shard_graph
    count = nbytes = 0
    seen = set()
    for n in g.nodes:
        for e in n.inputs:
            src = g.nodes[e.node]
            if src.ctx_group != n.ctx_group and (e.node, e.index, n.ctx_group) not in seen:
                seen.add((e.node, e.index, n.ctx_group))
                count += 1
                nbytes += g.tensor(e).nbytes
    return count, nbytes


def step_times(exes, repeats: int) -> list[float]:
    """Median forward+backward seconds of each executor, run in turn in every round (one
    warm-up round), so that drifts in the machine's speed hit all of them alike."""
    times = [[] for _ in exes]
    for r in range(repeats + 1):
        for i, exe in enumerate(exes):
            t = time.perf_counter()
            exe.forward(is_train=True)
            exe.backward()
            mx.nd.waitall()
            if r:
                times[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times]


def fill(exe, seed=0):
    rng = np.random.default_rng(seed)
    for name, a in exe.arg_dict.items():
        if "label" in name:
            a[:] = rng.integers(0, 10, a.shape)
        elif name.startswith("data"):
            a[:] = rng.integers(0, 10, a.shape)
        else:
            a[:] = rng.standard_normal(a.shape).astype(a.dtype) * 0.05


#: the plans compared: keeping converted inputs for the backward pass (fewest bytes, and
#: memory-weighted), fetching them again, and the default (keeping them where that fits
#: 1.15x the ideal as MXNet plans the step, else fetching them again, small copies kept)
PLANS = (("keep", SearchOptions(refetch=False, balance=0)),
         ("keep, weight 16", SearchOptions(refetch=False, memory_weight=16.0)),
         ("re-fetch all", SearchOptions(keep_share=0, balance=0, keep_if_fits=False)),
         ("default", SearchOptions()))


def memory_rows(cases, bound: bool, plans=PLANS):
    rows = []
    for label, sym, shapes, k in cases:
        ideal = single_device_bytes(sym, shapes) / k
        for name, options in plans:
            t = time.perf_counter()
            ptd = tofu_mx.partition(sym, [mx.cpu(i) for i in range(k)], options=options,
                                    **shapes)
            t_part = time.perf_counter() - t
            mem = ptd.memory_per_device()
            worst = max(m.total for m in mem)
            row = [label, k, name, f"{t_part:.1f}s", format_bytes(ideal),
                   format_bytes(worst), f"{worst / ideal:.3f}"]
            if bound:
                exe = ptd.simple_bind(grad_req={n.name: "write"
                                                for n in ptd.graph.variables("param")})
                per = bound_bytes(exe)
                planned = {m.device: m.weights + m.gradients + m.aux + m.inputs for m in mem}
                same = all(per.get(d, 0) == planned[d] for d in planned)
                row.append("agree" if same else f"differ {per} vs {planned}")
                del exe
            else:
                row.append("(plan only)")
            count, nbytes = crossing(ptd)
            row += [count, format_bytes(2 * nbytes), format_bytes(ptd.plan.total_bytes)]
            rows.append(row)
            print(" | ".join(map(str, row)), flush=True)
    return rows


def operator_nodes(sym) -> int:
    return sum(n["op"] != "null" for n in json.loads(sym.tojson())["nodes"])


def overhead_rows(cases, repeats: int):
    rows = []
    for label, sym, shapes in cases:
        params = [n.name for n in import_symbol(sym, **shapes).variables("param")]
        req = {n: "write" if n in params else "null" for n in sym.list_arguments()}
        ref = sym.simple_bind(mx.cpu(0), grad_req=req, **shapes)
        fill(ref)
        exes, nodes, busiest, chosen, by_time_busiest = [ref], [operator_nodes(sym)], [], [], []
        for k in (2, 4):
            ptd = tofu_mx.partition(sym, [mx.cpu(i) for i in range(k)], **shapes)
            nodes.append(operator_nodes(ptd.symbol))
            busiest.append(max(ptd.operators_per_device()))
            many = ptd.simple_bind(grad_req=req)
            fill(many)
            # the plan chosen by the simulator's step time on this machine (its fitted
            # preset, k devices sharing the cores), all on cpu(0) too
            here = dataclasses.replace(sim.machine("cpu"), num_devices=k)
            by_time = tofu_mx.partition(sym, [mx.cpu(i) for i in range(k)], machine=here,
                                        **shapes)
            picked = by_time.machine_choice.chosen
            chosen.append(("keeps" if not picked.refetch else "fetches again") +
                          (", conversions priced" if picked.conversion_bytes else ""))
            by_time_busiest.append(max(by_time.operators_per_device()))
            exes += [on_cpu0(ptd, req), many, on_cpu0(by_time, req)]
        base, *others = step_times(exes, repeats)
        row = [label, " / ".join(map(str, nodes)),
               " / ".join(f"{n} ({n / nodes[0]:.1f}x)" for n in busiest),
               " / ".join(f"{n} ({n / nodes[0]:.1f}x)" for n in by_time_busiest),
               f"{base * 1e3:.1f}"] + \
            [f"{t / base:.2f}" for t in others[:2]] + \
            [f"{others[2] / base:.2f} ({chosen[0]})"] + \
            [f"{t / base:.2f}" for t in others[3:5]] + \
            [f"{others[5] / base:.2f} ({chosen[1]})"]
        rows.append(row)
        print(" | ".join(map(str, row)), flush=True)
    return rows


def on_cpu0(ptd, req):
    """``ptd`` bound with every group on cpu(0), filled."""
    shard_req = {s.name: req[s.source] for s in ptd.shards if s.kind != "aux"}
    exe = ptd.symbol.simple_bind(mx.cpu(0), grad_req=shard_req,
                                 group2ctx={g: mx.cpu(0) for g in ptd.group2ctx},
                                 **ptd.shard_shapes)
    fill(exe)
    return exe


def planned_mb(exe) -> int:
    """MXNet's memory plan for the executor's activations and temporaries, all contexts."""
    return int(re.search(r"Total (\d+) MB allocated", exe.debug_str()).group(1))


def order_rows(cases, repeats: int):
    """The same plan rewritten without and with Tofu's control dependencies."""
    rows = []
    for label, sym, shapes, k in cases:
        graph = import_symbol(sym, **shapes)
        plan = plan_graph(graph, k)
        ctx = [mx.cpu(i) for i in range(k)]
        req = {n.name: "write" for n in graph.variables("param")}
        exes, mbs = [], []
        for ordered in (False, True):
            exe = apply_plan(sym, graph, plan, ctx, ordered=ordered).simple_bind(grad_req=req)
            fill(exe)
            exes.append(exe)
            mbs.append(planned_mb(exe))
        plain, ordered = step_times(exes, repeats)
        row = [label, k, mbs[0], mbs[1], f"{ordered / plain:.2f}"]
        rows.append(row)
        print(" | ".join(map(str, row)), flush=True)
        del exes
    return rows


def main():
    quick = "--quick" in sys.argv
    bound_cases = [
        ("WResNet-26-W2, batch 16, 64px", models.wresnet(26, 2, 100),
         models.input_shapes("wresnet", 16, image_size=64), 4),
        ("LSTM-2x1024, batch 32, 10 steps", models.rnn(2, 1024, 10, 8000),
         models.input_shapes("rnn", 32, seq_len=10), 4),
        ("Transformer 4x512, batch 16, 32 tokens", models.transformer(4, 512, 8, 32, 8000),
         models.input_shapes("transformer", 16, seq_len=32), 4),
    ]
    big_cases = [] if quick or "--no-big" in sys.argv else [
        ("WResNet-152-W10, batch 48, 224px", models.wresnet(152, 10), models.input_shapes(
            "wresnet", 48), 8),
        ("LSTM-10x8K, batch 48, 20 steps", models.rnn(10, 8192, 20, 10000),
         models.input_shapes("rnn", 48, seq_len=20), 8),
    ]
    head = ["model", "k", "plan", "partition", "ideal/device", "max device", "ratio",
            "bound arrays",
            "crossings", "crossing bytes (fwd+bwd)", "plan bytes"]
    print("## (a, c) memory per device and cross-device bytes")
    mem = memory_rows(bound_cases, True) + memory_rows(big_cases, False)
    print("\n## (b) overhead: partitioned fwd+bwd / unpartitioned, on cpu(0)")
    over_cases = [
        ("WResNet-14-W1, batch 8, 32px", models.wresnet(14, 1, 10),
         models.input_shapes("wresnet", 8, image_size=32)),
        ("WResNet-14-W2, batch 16, 32px", models.wresnet(14, 2, 10),
         models.input_shapes("wresnet", 16, image_size=32)),
        ("LSTM-2x256, batch 16, 5 steps", models.rnn(2, 256, 5, 1000),
         models.input_shapes("rnn", 16, seq_len=5)),
        ("LSTM-2x1024, batch 32, 5 steps", models.rnn(2, 1024, 5, 1000),
         models.input_shapes("rnn", 32, seq_len=5)),
    ]
    over = overhead_rows(over_cases, 5 if quick else 31)
    print("\n## (d) memory order: Tofu's control dependencies")
    order = order_rows(bound_cases, 3 if quick else 7)
    text = ["# bench/partition.py results", "", "## (a, c) memory and cross-device bytes", "",
            table(head, mem), "", "## (b) overhead (ratios to the unpartitioned graph on cpu(0))",
            "", table(["model", "operator nodes (1 / k=2 / k=4)",
                       "busiest device's operators, with MXNet's copies (k=2 / k=4)",
                       "the same, machine=cpu's plan (k=2 / k=4)",
                       "unpartitioned ms",
                       "k=2 all on cpu(0)", "k=2 on cpu(0..1)",
                       "k=2 machine=cpu, all on cpu(0)", "k=4 all on cpu(0)",
                       "k=4 on cpu(0..3)", "k=4 machine=cpu, all on cpu(0)"], over), "",
            "machine=cpu: the plan `partition(..., machine=...)` chooses on this machine's "
            "fitted preset (`tofu_mx.sim.machine(\"cpu\")` with k devices sharing its "
            "cores), and which (conversions priced: the plan searched with each conversion "
            "priced at the machine's `conversion_bytes`).", "",
            "cpu(0..k-1) timings share 2 cores and one process: not a model of GPUs.", "",
            "## (d) memory order: the same plan without and with Tofu's control dependencies",
            "", table(["model", "k", "MXNet planned MB", "planned MB, ordered",
                       "step time ordered / plain (cpu(0..k-1))"], order)]
    write_out("partition.md", "\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
