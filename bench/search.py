"""Search benchmark: time and bytes of plans, optimality gap against the ILP, bytes against
the baselines, DP state width on the model zoo, end-to-end plan() time.

    python bench/search.py                  # everything (about 5 minutes on 2 cores)
    python bench/search.py --quick          # a smaller sweep
    python bench/search.py --end-to-end     # the end-to-end section alone
    python bench/search.py --million        # ... and the 1M-operator synthetic graph

Prints markdown tables and writes them to bench/out/search.md (the run quoted in README is
kept in bench/results/search.md). The paper models and the ILP gaps use the graph plan()
searches (BatchNorm lowered, :func:`lower_graph`). Timings are wall-clock seconds of
plan_graph() (import and lowering excluded), measured here, one run each; every model is planned in this one process, whose
peak resident size is printed at the end. The end-to-end section times plan() itself
(import, lowering, search), warm. Batches are 48, so that every device count tried
(2, 3, 4, 6, 8) divides them.
"""
import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import tofu_mx  # noqa: E402,F401  (sets MXNet's environment before MXNet is imported)
import mxnet as mx  # noqa: E402
from tqdm import tqdm  # noqa: E402

from nnvm_passes import import_symbol  # noqa: E402
from benchlib import table, write_out  # noqa: E402
from synthetic import synthetic  # noqa: E402
from tofu_mx import models  # noqa: E402
from tofu_mx.search.baselines import POLICIES, baseline_plan  # noqa: E402
from tofu_mx.search.cut import Cut, View  # noqa: E402
from tofu_mx.search.dp import solve_dp  # noqa: E402
from tofu_mx.search.exact import solve_ilp  # noqa: E402
from tofu_mx.search.plan import SearchOptions, lower_graph, plan_graph  # noqa: E402
from tofu_mx.summary import format_bytes  # noqa: E402
from tofu_mx.tdl.coverage import ZOO  # noqa: E402

DEVICES = (2, 4, 8, 3, 6)
KEEP = SearchOptions(refetch=False, balance=0)


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


def peak_resident() -> str:
    """The process's peak resident size (Linux), for the record that the sweep stays bounded."""
    found = peak_resident_bytes()
    return "unknown" if found is None else format_bytes(found)


def peak_resident_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            return 1024 * next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def paper_model_rows(name, sym, shapes):
    graph = lower_graph(import_symbol(sym, **shapes), 2)   # as plan() searches it, k > 1
    rows, base_rows = [], []
    for k in DEVICES:
        start = time.perf_counter()
        p = plan_graph(graph, k)
        seconds = time.perf_counter() - start
        rows.append((name, k, "x".join(map(str, p.factors)), f"{seconds:.2f}",
                     format_bytes(p.total_bytes), max(lv.max_states for lv in p.levels)))
        if k in (2, 8, 6):
            # like with like: the baselines keep their converted inputs, so the search is
            # compared keeping them too; the default plan fetches big ones again
            keep = plan_graph(graph, k, options=KEEP).total_bytes
            bases = {pol: baseline_plan(graph, k, pol).total_bytes for pol in POLICIES}
            best_base = min(bases.values())
            base_rows.append((name, k, format_bytes(keep),
                              *(format_bytes(bases[pol]) for pol in POLICIES),
                              f"{bases['data_parallel'] / max(keep, 1):.2f}x",
                              "yes" if keep <= best_base + 1e-6 else "NO",
                              format_bytes(p.total_bytes),
                              f"{p.total_bytes / bases['data_parallel']:.2f}x"))
    return rows, base_rows


def gap_rows_of(name, sym, shapes):
    graph = lower_graph(import_symbol(sym, **shapes), 2)
    rows = []
    for parts in (2, 3):
        problem = Cut(graph, View.of(graph), parts).problem().problem
        dp = solve_dp(problem)
        ilp, seconds, status = solve_ilp(problem, time_limit=60)
        gap = "-" if ilp is None else f"{100 * (dp.cost - ilp.cost) / max(ilp.cost, 1):.3f}%"
        rows.append((name, parts, len(problem.names), format_bytes(dp.cost), status,
                     f"{seconds:.1f}", gap))
    return rows


def end_to_end_models():
    """The paper's headline models, batch 48, as section 5 plans them (k = 8)."""
    yield "WResNet-152-W10", models.wresnet(152, 10), models.input_shapes("wresnet", 48)
    yield ("LSTM-10x8K", models.rnn(10, 8192, 20, 10000),
           models.input_shapes("rnn", 48, seq_len=20))
    yield ("Transformer-24x2048", models.transformer(24, 2048, 32, 128, 30000),
           models.input_shapes("transformer", 48, seq_len=128))


@contextlib.contextmanager
def search_seconds():
    """A list that receives the seconds each plan() call spends in plan_graph (the search,
    after import and lowering)."""
    module = sys.modules["tofu_mx.search.plan"]
    inner, spent = module.plan_graph, []

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)
    module.plan_graph = timed
    try:
        yield spent
    finally:
        module.plan_graph = inner


def timed_plan(sym, shapes, k: int = 8) -> tuple[float, float]:
    """``(seconds of one plan() call, seconds of it in the search)``."""
    with search_seconds() as spent:
        start = time.perf_counter()
        tofu_mx.plan(sym, k, **shapes)
        return time.perf_counter() - start, spent[0]


def end_to_end_rows(runs: int = 3):
    """plan() of each paper model at k = 8, warm (one call first): the fastest and the
    median of ``runs`` calls, and the median call's search."""
    rows = []
    for name, sym, shapes in end_to_end_models():
        tofu_mx.plan(sym, 8, **shapes)
        found = sorted(timed_plan(sym, shapes) for _ in range(runs))
        total, search = found[len(found) // 2]
        rows.append((name, f"{found[0][0]:.2f}", f"{total:.2f}", f"{search:.2f}",
                     f"{total - search:.2f}"))
    return rows


def synthetic_alone(n: int) -> dict:
    """plan() of the n-operator synthetic graph at k = 8 in this process, warmed by a small
    one first: seconds (building the symbol apart), of them in the search, peak resident."""
    small, small_shapes = synthetic(1000)
    tofu_mx.plan(small, 8, **small_shapes)
    start = time.perf_counter()
    sym, shapes = synthetic(n)
    built = time.perf_counter() - start
    total, search = timed_plan(sym, shapes)
    return {"operators": n, "build": built, "plan": total, "search": search,
            "peak": peak_resident_bytes()}


def synthetic_in_subprocess(n: int) -> dict:
    """:func:`synthetic_alone` in a fresh process (its own peak resident size)."""
    done = subprocess.run([sys.executable, __file__, "--synthetic-alone", str(n)], check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def profile_summary(n: int, rows: int = 15) -> str:
    """cProfile of one plan() of the n-operator synthetic graph at k = 8: the functions with
    the most time of their own."""
    sym, shapes = synthetic(n)
    profiler = cProfile.Profile()
    profiler.enable()
    tofu_mx.plan(sym, 8, **shapes)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(rows)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    lines = [line.replace(root, "").replace(sys.prefix + os.sep, "")
             for line in text.getvalue().splitlines() if line.strip()]
    start = next(k for k, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
    return "\n".join([lines[0].strip()] + lines[start:])


def end_to_end_section(million: bool) -> str:
    rows = end_to_end_rows()
    text = ["### End to end: plan() at k = 8, warm\n\n" + table(
        ["model", "fastest s", "median s", "search s", "import + lowering s"], rows)]
    syn = [synthetic_in_subprocess(n) for n in ((100000, 1000000) if million else (100000,))]
    text.append(table(["operators", "plan() s", "search s", "import + lowering s",
                       "building the symbol s", "peak resident (own process)"],
                      [(f"{r['operators']:,}", f"{r['plan']:.1f}", f"{r['search']:.1f}",
                        f"{r['plan'] - r['search']:.1f}", f"{r['build']:.1f}",
                        format_bytes(r["peak"]) if r["peak"] else "unknown") for r in syn]))
    text.append("cProfile of plan() on 100,000 operators (k = 8), the 15 functions with the "
                "most time of their own:\n\n```\n" + profile_summary(100000) + "\n```")
    return "\n\n".join(text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--end-to-end", action="store_true",
                        help="run the end-to-end section (5) alone")
    parser.add_argument("--million", action="store_true",
                        help="time the 1M-operator synthetic graph too (several minutes)")
    parser.add_argument("--synthetic-alone", type=int, metavar="N", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.synthetic_alone:
        print(json.dumps(synthetic_alone(args.synthetic_alone)))
        return
    if args.end_to_end:
        write([end_to_end_section(args.million)])
        return
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
    out.append("### Against the baselines (same cost model)\n\nThe search keeping its "
               "converted inputs for the backward pass, as the baselines do "
               "(`SearchOptions(refetch=False, balance=0)`), then the default plan (which "
               "fetches all but small ones again, holding 1/k of them).\n\n" + table(
                   ["model", "k", "search (keep)", *POLICIES, "data parallel / search",
                    "search <= all", "default plan", "default / data parallel"], base_rows))
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
        graph = lower_graph(import_symbol(sym, data=(48, 3, size, size)), 2)
        level = plan_graph(graph, 2).levels[0]
        zoo_rows.append((name, len(graph.operators()), level.problem_nodes, level.max_frontier,
                         level.max_states))
    out.append("### DP state on the model zoo (2-way cut of the lowered graph plan() "
               "searches, batch 48)\n\n" + table(
        ["net", "operators", "search nodes", "largest frontier", "largest state"], zoo_rows))
    print(out[-1], flush=True)

    out.append(f"Peak resident size of this run, every model in one process: {peak_resident()}")
    print(out[-1], flush=True)

    # 5. end to end
    out.append(end_to_end_section(args.million))
    write(out)


def write(out: list[str]) -> None:
    print(out[-1], flush=True)
    write_out("search.md", "\n\n".join(out) + "\n")


if __name__ == "__main__":
    main()
