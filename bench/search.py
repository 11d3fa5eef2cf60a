"""Search benchmark: time and bytes of plans, optimality gap against the ILP, bytes against
the baselines, DP state width on the model zoo.

    python bench/search.py            # everything (about 5 minutes on 2 cores)
    python bench/search.py --quick    # a smaller sweep

Prints markdown tables and writes them to bench/out/search.md (the run quoted in README is
kept in bench/results/search.md). Timings are wall-clock seconds
of plan_graph() (import excluded), measured here, one run each; every model is planned in
this one process, whose peak resident size is printed at the end. Batches are 48, so that
every device count tried (2, 3, 4, 6, 8) divides them.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import tofu_mx  # noqa: E402,F401  (sets MXNet's environment before MXNet is imported)
import mxnet as mx  # noqa: E402
from tqdm import tqdm  # noqa: E402

from nnvm_passes import import_symbol  # noqa: E402
from synthetic import synthetic  # noqa: E402
from tofu_mx import models  # noqa: E402
from tofu_mx.search.baselines import POLICIES, baseline_plan  # noqa: E402
from tofu_mx.search.cut import Cut, View  # noqa: E402
from tofu_mx.search.dp import solve_dp  # noqa: E402
from tofu_mx.search.exact import solve_ilp  # noqa: E402
from tofu_mx.search.plan import plan_graph  # noqa: E402
from tofu_mx.summary import format_bytes  # noqa: E402
from tofu_mx.tdl.coverage import ZOO  # noqa: E402

DEVICES = (2, 4, 8, 3, 6)


def paper_models(quick):
    widens = (4, 10) if quick else (4, 6, 8, 10)
    for depth in (50, 101, 152):
        for w in widens:
            yield f"WResNet-{depth}-W{w}", models.wresnet(depth, w), models.input_shapes("wresnet", 48)
    lstms = ((4, 4096), (10, 8192)) if quick else ((4, 4096), (6, 6144), (8, 8192), (10, 8192),
                                                   (10, 10240))
    for layers, hidden in lstms:
        yield (f"LSTM-{layers}x{hidden // 1024}K", models.rnn(layers, hidden, 20, 10000),
               models.input_shapes("rnn", 48, seq_len=20))
    yield ("Transformer-12x1024", models.transformer(12, 1024, 16, 128, 30000),
           models.input_shapes("transformer", 48, seq_len=128))
    if not quick:
        yield ("Transformer-24x2048", models.transformer(24, 2048, 32, 128, 30000),
               models.input_shapes("transformer", 48, seq_len=128))


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def peak_resident() -> str:
    """The process's peak resident size (Linux), for the record that the sweep stays bounded."""
    try:
        with open("/proc/self/status") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return "unknown"
    return format_bytes(kib * 1024)


def paper_model_rows(name, sym, shapes):
    graph = import_symbol(sym, **shapes)
    rows, base_rows = [], []
    for k in DEVICES:
        start = time.perf_counter()
        p = plan_graph(graph, k)
        seconds = time.perf_counter() - start
        rows.append((name, k, "x".join(map(str, p.factors)), f"{seconds:.2f}",
                     format_bytes(p.total_bytes), max(lv.max_states for lv in p.levels)))
        if k in (2, 8, 6):
            bases = {pol: baseline_plan(graph, k, pol).total_bytes for pol in POLICIES}
            best_base = min(bases.values())
            base_rows.append((name, k, format_bytes(p.total_bytes),
                              *(format_bytes(bases[pol]) for pol in POLICIES),
                              f"{bases['data_parallel'] / max(p.total_bytes, 1):.2f}x",
                              "yes" if p.total_bytes <= best_base + 1e-6 else "NO"))
    return rows, base_rows


def gap_rows_of(name, sym, shapes):
    graph = import_symbol(sym, **shapes)
    rows = []
    for parts in (2, 3):
        problem = Cut(graph, View.of(graph), parts).problem().problem
        dp = solve_dp(problem)
        ilp, seconds, status = solve_ilp(problem, time_limit=60)
        gap = "-" if ilp is None else f"{100 * (dp.cost - ilp.cost) / max(ilp.cost, 1):.3f}%"
        rows.append((name, parts, len(problem.names), format_bytes(dp.cost), status,
                     f"{seconds:.1f}", gap))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    out = []

    # 1. paper models: time, bytes, and the baselines, at every k
    configs = list(paper_models(args.quick))
    rows, base_rows = [], []
    for config in tqdm(configs, desc="paper models"):
        found, bases = paper_model_rows(*config)
        rows += found
        base_rows += bases
    out.append("### Search time and bytes per training step\n\n" + table(
        ["model", "k", "cuts", "search s", "bytes moved", "largest DP state"], rows))
    out.append("### Against the baselines (same cost model)\n\n" + table(
        ["model", "k", "search", *POLICIES, "data parallel / search", "search <= all"],
        base_rows))
    print("\n\n".join(out[-2:]), flush=True)

    # 2. optimality gap: the DP against CBC on the first cut's problem
    gap_rows = []
    for config in tqdm(configs, desc="gap vs ILP"):
        gap_rows += gap_rows_of(*config)
    out.append("### Optimality gap of the DP (first cut, CBC with a 60 s limit)\n\n" + table(
        ["model", "parts", "search nodes", "DP bytes", "ILP status", "ILP s", "gap"], gap_rows))
    print(out[-1], flush=True)

    # 3. synthetic graphs
    syn_rows = []
    sizes = (1000, 10000) if args.quick else (1000, 10000, 100000)
    for n in tqdm(sizes, desc="synthetic"):
        sym, shapes = synthetic(n)
        graph = import_symbol(sym, **shapes)
        for k in (DEVICES if n < 100000 else (8,)):
            start = time.perf_counter()
            p = plan_graph(graph, k)
            syn_rows.append((n, k, f"{time.perf_counter() - start:.1f}",
                             format_bytes(p.total_bytes), max(lv.max_states for lv in p.levels)))
    out.append("### Synthetic graphs\n\n" + table(
        ["operators", "k", "search s", "bytes moved", "largest DP state"], syn_rows))
    print(out[-1], flush=True)

    # 4. DP state width on the model zoo
    from mxnet.gluon.model_zoo import vision
    zoo_rows = []
    for name, size in ZOO.items():
        with mx.name.NameManager():
            sym = vision.get_model(name)(mx.sym.var("data"))
        graph = import_symbol(sym, data=(48, 3, size, size))
        problem = Cut(graph, View.of(graph), 2).problem().problem
        sol = solve_dp(problem)
        zoo_rows.append((name, len(graph.operators()), len(problem.names), sol.max_frontier,
                         sol.max_states))
    out.append("### DP state on the model zoo (2-way cut, batch 48)\n\n" + table(
        ["net", "operators", "search nodes", "largest frontier", "largest state"], zoo_rows))
    print(out[-1], flush=True)

    out.append(f"Peak resident size of this run, every model in one process: {peak_resident()}")
    print(out[-1], flush=True)
    os.makedirs(os.path.join(os.path.dirname(__file__), "out"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "out", "search.md"), "w") as f:
        f.write("\n\n".join(out) + "\n")


if __name__ == "__main__":
    main()
