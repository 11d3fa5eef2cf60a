"""Where a simulated training step goes: its critical path, and its busiest device's work.

    python bench/step_anatomy.py WResNet-101-W4 LSTM-6x4K     # any labels of bench/paper.py
    python bench/step_anatomy.py LSTM-6x4K --levels DSS       # data parallel at the first cut

For each model (bench/paper.py's, same batch and options), the plan
``partition(..., machine=...)`` chooses on ``--machine`` (default the paper's
8xV100-16GB-PCIe), simulated (:func:`tofu_mx.sim.schedule.step_tasks`,
:func:`~tofu_mx.sim.schedule.finish_times`), then:

- the step, the busiest device's and the busiest link's seconds (a step longer than both is
  one whose compute and transfers wait for each other);
- the critical path: from the task finishing last, back through whatever made each task
  start when it did (an input it waited for, else the task before it on its device or
  link), its seconds by resource (compute, transfer) and pass, and its transfers by what
  they carry: weights (and their gradients) or activations, large or latency-bound
  (under 30 us);
- the busiest device's seconds by operator and pass.

``--levels``: instead of ``machine=``'s choice, the fewest-bytes plan (converted inputs kept,
as ``machine=`` chooses on this sweep) with some cuts forced to data parallelism
(``bench``-only: ``D`` a cut splitting every operator's batch, ``S`` a searched cut, one letter
per cut of the device count's factors in order, e.g. ``DSS`` for 8 devices: data parallel
across the two PCIe switches, Tofu inside each), routed both ways as ``machine=`` does and
the faster taken. Writes bench/out/step_anatomy.md.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tofu_mx  # noqa: E402,F401  (sets MXNet's environment before MXNet is imported)
import mxnet as mx  # noqa: E402

from tofu_mx import sim  # noqa: E402
from tofu_mx.runtime.partitioned import choose_by_step_time  # noqa: E402
from tofu_mx.sim.schedule import finish_times, step_tasks  # noqa: E402
from benchlib import table, write_out  # noqa: E402
from paper import OPTIONS, sweep  # noqa: E402

#: a transfer shorter than this is counted as latency-bound
SMALL = 30e-6


def chosen(model, machine, levels: str | None):
    """The partitioned symbol studied: ``machine=``'s choice, or the ``levels`` hybrid."""
    sym, shapes = model.build()
    ctx = [mx.cpu(i) for i in range(machine.num_devices)]
    if not levels:
        ptd = choose_by_step_time(sym, ctx, machine, options=OPTIONS, compare=False,
                                  **shapes)
        return ptd, ptd.machine_choice.chosen.label
    return hybrid(sym, shapes, ctx, machine, levels)


def hybrid(sym, shapes, ctx, machine, levels: str):
    """The fewest-bytes keeping plan with the cuts marked ``D`` in ``levels`` data-parallel."""
    from tofu_mx.runtime.assign import assign
    from tofu_mx.runtime.partitioned import _built, _routed
    from tofu_mx.search.baselines import POLICIES
    from tofu_mx.search.bounded import solve_within
    from tofu_mx.search.dp import prime_factors
    from tofu_mx.search.plan import lower_graph, plan_graph
    from tofu_mx.tdl.annotate import import_graph

    factors = prime_factors(len(ctx))
    if len(levels) != len(factors) or set(levels) - {"D", "S"}:
        raise SystemExit(f"--levels needs one letter D or S per cut of {len(ctx)} devices "
                         f"({'x'.join(map(str, factors))}), got {levels!r}")
    options = dataclasses.replace(OPTIONS, refetch=False)
    calls = iter(levels)

    def choose(cut, problem):      # called once per cut, in order
        if next(calls) == "D":
            return POLICIES["data_parallel"](cut, problem)
        return solve_within(problem.problem, options.max_states)[0]

    whole = import_graph(sym, **shapes)
    graph = lower_graph(whole, len(ctx))
    plan = plan_graph(graph, len(ctx), options=options, choose=choose, factors=factors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ptd = _built(sym, whole, graph, plan, assign(graph, plan), ctx)
        routed = [(ptd, "as routed")]
        if machine.group_size < len(ctx):
            routed.append((_routed(ptd, machine.group_size), "sent to each group once"))
    step = [(sim.partitioned_step(p, machine, OPTIONS.optimizer_state)[0], p, how)
            for p, how in routed]
    _, ptd, how = min(step, key=lambda s: s[0])
    return ptd, f"{levels} (D: data parallel, S: searched), converted inputs kept; {how}"


def anatomy(ptd, machine) -> dict:
    graph, devices = ptd.shard_graph, ptd.node_devices()
    tasks = step_tasks(graph, devices.__getitem__, machine)
    forward = len(step_tasks(graph, devices.__getitem__, machine, backward=False))
    done = finish_times(tasks)
    start = [d - t.seconds for d, t in zip(done, tasks)]
    params = {n.name for n in ptd.graph.variables("param")}
    ops = {n.name: n.op for n in graph.nodes if not n.is_variable}

    def node_name(k: int) -> str:
        """The shard graph node a task runs, or whose value it carries (a forward transfer)
        or carries a gradient to (a backward one)."""
        name = tasks[k].name
        if name.endswith(" again"):          # built again for the backward pass
            name = name[:-len(" again")]
        elif k >= forward:                   # a backward task: "d" + the node's name
            name = name[1:]
        return name.split("->")[0].split("<-")[0]

    def base(k: int) -> str:
        """The original tensor or operator a task's node was made for."""
        return node_name(k).split("@")[0]

    previous: dict[int, int] = {}     # task -> the task before it on its resource
    by_resource: dict[tuple, list[int]] = collections.defaultdict(list)
    for k, task in enumerate(tasks):
        by_resource[task.resource].append(k)
    for ids in by_resource.values():
        ids.sort(key=lambda k: (start[k], done[k]))
        previous.update(zip(ids[1:], ids))
    path: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    k = max(range(len(tasks)), key=done.__getitem__)
    while True:
        task = tasks[k]
        phase = "forward" if k < forward else "backward"
        if task.resource[0] == "device":
            key = ("compute", phase, "")
        else:
            what = "weights" if base(k) in params else "activations"
            key = ("transfer", phase, f"{what}, {'small' if task.seconds < SMALL else 'large'}")
        path[key] += task.seconds
        count[key] += 1
        waited = [a for a in task.after if abs(done[a] - start[k]) < 1e-12]
        if waited:
            k = waited[0]
        elif k in previous and abs(done[previous[k]] - start[k]) < 1e-12:
            k = previous[k]
        else:
            break
    busy: collections.Counter = collections.Counter()
    runs: collections.Counter = collections.Counter()
    load: collections.Counter = collections.Counter()
    for task in tasks:
        load[task.resource] += task.seconds
    device = max((r for r in load if r[0] == "device"), key=load.__getitem__)
    for k, task in enumerate(tasks):
        if task.resource == device:
            key = (ops.get(node_name(k), "?"), "forward" if k < forward else "backward")
            busy[key] += task.seconds
            runs[key] += 1
    return dict(step=max(done), device=device, device_s=load[device],
                link_s=max((s for r, s in load.items() if r[0] == "link"), default=0.0),
                path=path, count=count, busy=busy, runs=runs)


def report(label: str, how: str, a: dict) -> list[str]:
    ms = lambda s: f"{s * 1e3:,.1f}"   # noqa: E731
    out = [f"## {label}", "", f"Plan: {how}. Step {ms(a['step'])} ms; the busiest device "
           f"(device {a['device'][1]}) computes {ms(a['device_s'])} ms, the busiest link "
           f"carries {ms(a['link_s'])} ms.", "", "Critical path:", "",
           table(["resource", "pass", "carries", "ms", "tasks"],
                 [(*key, ms(s), a["count"][key]) for key, s in a["path"].most_common()]),
           "", f"Device {a['device'][1]}'s work (the 15 largest):", "",
           table(["operator", "pass", "ms", "runs", "us each"],
                 [(*key, ms(s), a["runs"][key], f"{s / a['runs'][key] * 1e6:.1f}")
                  for key, s in a["busy"].most_common(15)]), ""]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="labels of bench/paper.py's sweep")
    parser.add_argument("--machine", default="8xV100-16GB-PCIe")
    parser.add_argument("--levels", help="force cuts to data parallelism, e.g. DSS")
    args = parser.parse_args()
    known = {m.label: m for m in sweep(False)}
    missing = [m for m in args.models if m not in known]
    if missing:
        raise SystemExit(f"unknown model(s) {missing}; choose from {', '.join(known)}")
    machine = sim.machine(args.machine)
    lines = [f"# Anatomy of a simulated step on {machine.name}", ""]
    for label in args.models:
        ptd, how = chosen(known[label], machine, args.levels)
        found = report(label, how, anatomy(ptd, machine))
        print("\n".join(found), flush=True)
        lines += found
    print("wrote", write_out("step_anatomy.md", "\n".join(lines)))


if __name__ == "__main__":
    main()
