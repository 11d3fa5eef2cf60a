"""The shape of the Tofu paper's evaluation, in simulation (issue 16).

    python bench/paper.py                  # about 10 minutes on 2 cores
    python bench/paper.py --quick          # the smallest model of each family
    python bench/paper.py --machines-only  # only "Beyond one machine" (about a minute)
    python bench/paper.py --models LSTM-6x4K LSTM-4x4K   # some rows of the throughput table

For each model of the paper's two families on 8 devices of ``--machine`` (the paper's
8xV100-16GB-PCIe by default): WResNet-50/101/152 with widening 4, 6, 8, 10 (224px images)
and LSTMs of 4, 6, 8, 10 layers with 4K, 6K, 8K, 10K hidden units (20 steps, a 10,000-word
vocabulary), and one wider model of each beyond them (WResNet-152-W12, LSTM-10x12K), it
simulates one training step (SGD with momentum: one optimizer state per
weight) with every strategy of :func:`tofu_mx.sim.simulate`, and reports

- throughput relative to ``"ideal"`` (one device with unlimited memory);
- the peak memory per device, and whether the strategy fits;
- the largest model each strategy trains, against what one device holds;
- beyond one machine: the throughput of 1 to 16 such machines, data-parallel across them
  and Tofu's plan inside each, for WResNet-152-W10 and LSTM-10x8K
  (:func:`tofu_mx.sim.project_to_machines`).

``"tofu-memory"`` is simulated only where the default plan does not fit (where it does, the
table shows the default plan). Writes bench/out/paper.md, bench/out/paper-throughput.png
and bench/out/paper-memory.png (``--machines-only``: bench/out/paper-machines.md, simulating
only those two models' tofu plans; ``--models``: bench/out/paper-models.md, those models'
rows); the committed run is in bench/results/.
"""
import argparse
import concurrent.futures
import dataclasses
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tofu_mx  # noqa: E402,F401  (sets MXNet's environment before MXNet is imported)
from tofu_mx import models, sim  # noqa: E402
from tofu_mx.search import SearchOptions  # noqa: E402
from tofu_mx.sim import FUSION_BYTES  # noqa: E402
from tofu_mx.summary import format_bytes  # noqa: E402
from benchlib import OUT, table, write_out  # noqa: E402

#: strategies in the order the tables show them
SHOWN = ("ideal", "data_parallel", "swap", "placement", "tofu")
ALTERNATIVES = ("data_parallel", "swap", "placement")
#: the plan partition(machine=...) chooses by simulated step time (a column of its own)
BY_TIME = "tofu-machine"
#: data parallelism across the machine's device groups, Tofu's machine= plan inside each
HYBRID = "hybrid"
OPTIONS = SearchOptions(optimizer_state=1)      # SGD with momentum
WRESNET_BATCH, LSTM_BATCH, LSTM_STEPS, VOCAB = 32, 64, 20, 10000
#: "Beyond one machine": the models projected, and the numbers of machines
PROJECTED, MACHINE_COUNTS = ("WResNet-152-W10", "LSTM-10x8K"), (1, 2, 4, 8, 16)


@dataclasses.dataclass(frozen=True)
class Model:
    family: str
    label: str
    depth: int        # WResNet depth or LSTM layers
    width: int        # widening or hidden units

    def build(self):
        if self.family == "WResNet":
            return models.wresnet(self.depth, self.width), models.input_shapes(
                "wresnet", WRESNET_BATCH)
        return models.rnn(self.depth, self.width, LSTM_STEPS, VOCAB), models.input_shapes(
            "rnn", LSTM_BATCH, seq_len=LSTM_STEPS)


def sweep(quick: bool) -> list[Model]:
    """The paper's models, then one wider model per family beyond them (to find where each
    strategy stops fitting)."""
    wres = [(d, w) for d in (50, 101, 152) for w in (4, 6, 8, 10)] + [(152, 12)]
    lstm = [(n, h) for n in (4, 6, 8, 10) for h in (4096, 6144, 8192, 10240)] + [(10, 12288)]
    if quick:
        wres, lstm = wres[:1], lstm[:1]
    return [Model("WResNet", f"WResNet-{d}-W{w}", d, w) for d, w in wres] + \
        [Model("LSTM", f"LSTM-{n}x{h // 1024}K", n, h) for n, h in lstm]


def run(model: Model, machine_name: str, strategies=SHOWN) -> tuple[Model, int, dict, float]:
    """One model, each of ``strategies`` (tofu among them): (model, weight bytes, results by
    strategy, seconds)."""
    start = time.perf_counter()
    machine = sim.machine(machine_name)
    sym, shapes = model.build()
    results = {s: sim.simulate(sym, machine, s, options=OPTIONS, **shapes) for s in strategies}
    if "tofu" in results and not results["tofu"].fits:
        results["tofu"] = sim.simulate(sym, machine, "tofu-memory", options=OPTIONS, **shapes)
    from tofu_mx.tdl.annotate import import_graph
    weights = sum(n.outputs[0].nbytes for n in import_graph(sym, **shapes).variables("param"))
    return model, weights, results, time.perf_counter() - start


def throughput_table(rows) -> list[str]:
    head = ["model", "weights"] + [f"{s}" for s in SHOWN[1:]] + \
        ["tofu / best alternative", "tofu, machine=", "its plan", "machine= / best alternative",
         "hybrid", "best of machine= and hybrid / best alternative"]
    cells = []
    for model, weights, results, _ in rows:
        ideal = results["ideal"].throughput

        def relative(strategy):
            r = results.get(strategy)
            return "-" if r is None else f"{r.throughput / ideal:.2f}" if r.fits else \
                "does not fit"
        timed = results.get(BY_TIME)
        cells.append([model.label, format_bytes(weights)] +
                     [relative(s) for s in SHOWN[1:]] + [_versus(results)] +
                     ([relative(BY_TIME), _kept(timed.note), _versus(results, BY_TIME)]
                      if timed else ["-", "-", "-"]) +
                     ([relative(HYBRID), _versus(results, _best_tofu(results))]
                      if HYBRID in results and timed else ["-", "-"]))
    return table(head, cells).split("\n")


def _best_tofu(results) -> str:
    """Of ``machine=``'s plan and the hybrid, the faster that fits (``machine=``'s if
    neither does)."""
    fitting = [s for s in (BY_TIME, HYBRID) if results[s].fits]
    return max(fitting, key=lambda s: results[s].throughput, default=BY_TIME)


def counts(rows) -> list[str]:
    """How many configurations where Tofu fits each Tofu strategy is at least 1.0x and
    1.25x the best alternative that fits (or where only Tofu fits)."""
    out = []
    for label, pick in (("tofu, machine=", lambda r: BY_TIME),
                        ("the best of machine= and hybrid", _best_tofu)):
        ratios = [_ratio(results, pick(results)) for _, _, results, _ in rows
                  if BY_TIME in results and HYBRID in results]
        ratios = [x for x in ratios if x is not None]
        out.append(f"- {label}: at least 1.0x the best alternative on "
                   f"{sum(x >= 1.0 for x in ratios)} of {len(ratios)} configurations where "
                   f"it fits, 1.25x or more on {sum(x >= 1.25 for x in ratios)}.")
    return out


def _kept(note: str) -> str:
    """The chosen candidate in a word or two."""
    how = "keeps" if "kept" in note else "fetches again" if "again" in note else note
    how = f"{how}, conversions priced" if "conversion priced" in note else how
    how = f"{how}, gates one after another" if "not interleaved" in note else how
    return f"{how}, once per group" if "sent to the group once" in note else how


def _ratio(results, strategy: str) -> float | None:
    """``strategy``'s throughput over the best fitting alternative's: None where it does not
    fit, infinite where only it does."""
    fitting = [results[s].throughput for s in ALTERNATIVES if results[s].fits]
    if not results[strategy].fits:
        return None
    return results[strategy].throughput / max(fitting) if fitting else math.inf


def _versus(results, strategy: str = "tofu") -> str:
    ratio = _ratio(results, strategy)
    return "tofu does not fit" if ratio is None else "only tofu fits" if ratio == math.inf \
        else f"{ratio:.2f}x"


def memory_table(rows, machine) -> list[str]:
    """The busiest device's peak per strategy ("-": not run, as the hybrid where the batch
    does not split over the groups)."""
    shown = SHOWN + tuple(s for s in (BY_TIME, HYBRID) if rows and s in rows[0][2])
    head = ["model"] + [s if s != BY_TIME else "tofu, machine=" for s in shown]

    def cell(result, strategy):
        if not any(result.peak_memory):
            return "-"
        return format_bytes(max(result.peak_memory)) + \
            ("" if result.fits or strategy == "ideal" else " (over)")
    cells = [[model.label] + [cell(results[s], s) for s in shown]
             for model, _, results, _ in rows]
    return table(head, cells).split("\n")


def largest(rows, machine) -> list[str]:
    """The largest model (by weight bytes) each strategy fits, per family, against what one
    device trains: the largest model of the sweep whose whole step fits one device at the
    same batch, and the most weights one device could hold at all."""
    bound = machine.memory / (2 + OPTIONS.optimizer_state)
    out = [f"\"One device\": the largest model of the sweep whose step fits one "
           f"{machine.name.split('x', 1)[1]} device at the same batch (the ideal's peak "
           f"within its memory). \"Bound\": the most weights one device could hold at all, "
           f"{format_bytes(int(bound))} (with their gradients and momentum, and no "
           f"activations).", "",
           "| family | strategy | largest model trained | weights | x one device | x bound |",
           "|---|---|---|---|---|---|"]
    for family in dict.fromkeys(m.family for m, *_ in rows):
        mine = [(w, m.label, results) for m, w, results, _ in rows if m.family == family]
        alone = [(w, label) for w, label, results in mine
                 if results["ideal"].peak_memory[0] <= machine.memory]
        one = max(alone) if alone else None
        out.append(f"| {family} | one device | {one[1] if one else 'none'} | "
                   f"{format_bytes(one[0]) if one else ''} | | |")
        for s in SHOWN[1:]:
            fit = [(w, label) for w, label, results in mine if results[s].fits]
            if not fit:
                out.append(f"| {family} | {s} | none | | | |")
                continue
            w, label = max(fit)
            times = f"{w / one[0]:.1f}" if one else ""
            out.append(f"| {family} | {s} | {label} | {format_bytes(w)} | {times} | "
                       f"{w / bound:.1f} |")
    return out


def why(rows, strategy: str = "tofu") -> list[str]:
    """Where ``strategy``'s plan is under 1.25x the best alternative that fits: its step
    against its busiest device's compute and busiest link, and the same of that
    alternative."""
    out = ["| model | strategy | step | busiest device computes | even share of the ideal's "
           "compute | busiest link carries |", "|---|---|---|---|---|---|"]
    for model, _, results, _ in rows:
        fitting = [s for s in ALTERNATIVES if results[s].fits]
        if strategy not in results:
            continue
        tofu = results[strategy]
        if not tofu.fits or not fitting:
            continue
        best = max(fitting, key=lambda s: results[s].throughput)
        if tofu.throughput >= 1.25 * results[best].throughput:
            continue
        even = results["ideal"].busiest_device / len(tofu.peak_memory)
        for s in (strategy, best):
            r = results[s]
            out.append(f"| {model.label} | {s} | {r.step_time:.3f} s | "
                       f"{r.busiest_device:.3f} s | {even:.3f} s | {r.busiest_link:.3f} s |")
    return out


def machines_table(rows, machine) -> list[str]:
    """The tofu plan of each model of :data:`PROJECTED` on 1 to 16 machines, and a reading."""
    out = ["| model | machines | GPUs | batch | gradients a machine all-reduces | step | "
           "all-reduce | of it after the backward pass | samples/s | x one machine | "
           "efficiency |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    reading = []
    for model, _, results, _ in rows:
        if model.label not in PROJECTED:
            continue
        tofu = results["tofu"]
        if not tofu.fits:
            out.append(f"| {model.label} | - | - | - | - | does not fit one machine | - | - | "
                       f"- | - | - |")
            reading.append(f"{model.label} fits no machine ({tofu.note}): nothing to project")
            continue
        got = [sim.project_to_machines(tofu, machine, n) for n in MACHINE_COUNTS]
        for g in got:
            out.append(
                f"| {model.label} | {g.num_machines} | {g.num_machines * machine.num_devices} | "
                f"{g.num_machines * round(tofu.throughput * tofu.step_time)} | "
                f"{format_bytes(g.gradient_bytes)} | {g.step_time:.3f} s | "
                f"{g.all_reduce_time:.3f} s | {g.exposed:.3f} s | {g.throughput:.1f} | "
                f"{g.throughput / tofu.throughput:.2f} | {g.efficiency:.2f} |")
        best = max(got, key=lambda g: g.throughput)
        slower = [g.num_machines for g in got if g.throughput < tofu.throughput]
        reading.append(
            f"{model.label}'s one-machine step takes {tofu.step_time:.3f} s and all-reducing "
            f"its {format_bytes(got[-1].gradient_bytes)} of gradients "
            f"{got[1].all_reduce_time:.3f} s on 2 machines ({got[1].exposed:.3f} s of it after "
            f"the backward pass), {got[-1].all_reduce_time:.3f} s on {got[-1].num_machines} "
            f"({got[-1].exposed:.3f} s after): {best.num_machines} machines train "
            f"{best.throughput / tofu.throughput:.2f}x as fast as one ({best.efficiency:.2f} "
            f"efficiency)" + (f", and {' and '.join(map(str, slower))} machines are "
                              f"slower than one" if slower else ""))
    if not reading:
        return [f"None of {', '.join(PROJECTED)} in this run."]
    network = machine.network
    return out + ["", f"Reading. Each machine runs Tofu's one-machine step on its own batch "
                      f"(the global batch grows with the machines), then each GPU all-reduces "
                      f"the gradients of the weights it holds with the same GPU of the other "
                      f"machines as the backward pass completes them (in buckets of "
                      f"{FUSION_BYTES // 2**20} MiB, as Horovod fuses them), all "
                      f"{machine.num_devices} sharing the machine's network "
                      f"link ({network.bandwidth / 1e9:g} GB/s, {network.latency * 1e6:g} us a "
                      f"ring step). Each link carries 2(N-1)/N of the whole model's gradient "
                      f"bytes, whatever the plan inside the machine, so the all-reduce nears "
                      f"twice the model's bytes over the link's bandwidth as machines are "
                      f"added; what the backward pass does not hide delays the step. "
                      + "; ".join(reading) + ". Data parallelism across machines pays back "
                      "where a machine's backward pass is long against its all-reduce: a "
                      "model of tens of GiB of weights needs a faster network or a larger "
                      "batch per machine."]


def plot(rows, machine, path_throughput: str, path_memory: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(dict.fromkeys(m.family for m, *_ in rows))
    colors = dict(zip(SHOWN, ("#888888", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")))
    for path, what in ((path_throughput, "throughput"), (path_memory, "memory")):
        fig, axes = plt.subplots(len(families), 1, figsize=(12, 4.2 * len(families)),
                                 squeeze=False)
        for ax, family in zip(axes[:, 0], families):
            mine = [r for r in rows if r[0].family == family]
            shown = SHOWN[1:] if what == "throughput" else SHOWN
            width = 0.8 / len(shown)
            for j, s in enumerate(shown):
                xs = [i + (j - (len(shown) - 1) / 2) * width for i in range(len(mine))]
                if what == "throughput":
                    ys = [r[2][s].throughput / r[2]["ideal"].throughput if r[2][s].fits else 0
                          for r in mine]
                else:
                    ys = [max(r[2][s].peak_memory) / 2 ** 30 for r in mine]
                ax.bar(xs, ys, width, label=s, color=colors[s])
            if what == "throughput":
                ax.axhline(1.0, color="black", linewidth=0.8)
                ax.set_ylabel("throughput / ideal (0: does not fit)")
            else:
                ax.axhline(machine.memory / 2 ** 30, color="black", linewidth=0.8,
                           linestyle="--", label="device memory")
                ax.set_yscale("log")
                ax.set_ylabel("peak memory per device (GiB)")
            ax.set_xticks(range(len(mine)))
            ax.set_xticklabels([r[0].label for r in mine], rotation=30, ha="right")
            ax.set_title(f"{family} on {machine.name} (simulated)")
            ax.legend(fontsize=8, ncol=3)
        fig.tight_layout()
        fig.savefig(path + ".tmp.png", dpi=90)
        plt.close(fig)
        os.replace(path + ".tmp.png", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one model per family")
    parser.add_argument("--machine", default="8xV100-16GB-PCIe", choices=sorted(sim.PRESETS))
    parser.add_argument("--jobs", type=int, default=2, help="models simulated at once")
    parser.add_argument("--machines-only", action="store_true",
                        help="only the section \"Beyond one machine\": the tofu plans of "
                             f"{' and '.join(PROJECTED)}, to bench/out/paper-machines.md")
    parser.add_argument("--models", nargs="+", metavar="LABEL",
                        help="only these models of the sweep: their rows of the throughput "
                             "table, to bench/out/paper-models.md")
    args = parser.parse_args()
    from tqdm import tqdm

    machine = sim.machine(args.machine)
    models_ = sweep(args.quick)
    strategies = SHOWN + (BY_TIME, HYBRID)
    if args.models:
        known = {m.label: m for m in sweep(False)}
        missing = [label for label in args.models if label not in known]
        if missing:
            parser.error(f"no model(s) {missing} in the sweep; choose from {', '.join(known)}")
        models_ = [known[label] for label in args.models]
    if args.machines_only:
        models_ = [m for m in sweep(False) if m.label in PROJECTED]
        strategies = ("tofu",)
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run, m, args.machine, strategies) for m in models_]
        for _ in tqdm(concurrent.futures.as_completed(futures), total=len(futures),
                      desc="models", unit="model"):
            pass
    rows = [f.result() for f in futures]
    elapsed = time.perf_counter() - start
    if args.machines_only:
        run_alone = (f"`python bench/paper.py --machines-only`, {time.strftime('%Y-%m-%d')}, "
                     f"{elapsed:.0f} s on this machine (the two models' tofu plans only; the "
                     f"machine: {machine.source}).")
        _write("paper-machines.md",
               "\n".join(machines_section(rows, machine, run_alone)) + "\n")
        return
    if args.models:
        _write("paper-models.md", "\n".join([
            f"`python bench/paper.py --models {' '.join(args.models)}`, "
            f"{time.strftime('%Y-%m-%d')}, {elapsed:.0f} s on this machine; machine: "
            f"{machine.name}.", "", *throughput_table(rows)]) + "\n")
        return
    text = report(rows, machine, elapsed)
    os.makedirs(OUT, exist_ok=True)
    plot(rows, machine, os.path.join(OUT, "paper-throughput.png"),
         os.path.join(OUT, "paper-memory.png"))
    _write("paper.md", text)


def _write(name: str, text: str) -> None:
    print(text)
    print("wrote", write_out(name, text))


def machines_section(rows, machine, run: str = "") -> list[str]:
    """The section "Beyond one machine"; ``run``: the command and time of a run of it alone."""
    head = ["## Beyond one machine (simulated)", ""]
    if machine.network is None:
        return head + [f"{machine.name} has no network link to other machines: not projected."]
    return head + [
        f"{run + ' ' if run else ''}N machines {machine.name}, data-parallel across them over "
        f"each machine's network (see the machine's source above), Tofu's plan inside each "
        f"(tofu_mx.sim.project_to_machines: each gradient all-reduced once the backward pass "
        f"completes it, in buckets). "
        f"\"x one machine\": samples/s against one machine's; \"efficiency\": against N "
        f"times one machine's.", "", *machines_table(rows, machine)]


def report(rows, machine, elapsed: float) -> str:
    lines = [
        "# The paper's evaluation, simulated", "",
        f"`python bench/paper.py`, {time.strftime('%Y-%m-%d')}, {elapsed:.0f} s on this "
        f"machine. Machine: {machine.name} ({machine.source}). One training step, SGD with "
        f"momentum; WResNets at batch {WRESNET_BATCH} (224px), LSTMs at batch {LSTM_BATCH}, "
        f"{LSTM_STEPS} steps, a {VOCAB:,}-word vocabulary. Every figure is the simulator's "
        f"(tofu_mx.sim), not a measurement: see bench/results/calibration.md for how far "
        f"its predictions are from measured steps on this CPU.", "",
        "## Throughput relative to ideal (one device with unlimited memory)", "",
        *throughput_table(rows), "",
        "\"tofu\" is the default plan, or the memory-constrained plan (`tofu-memory`) where "
        "the default does not fit. \"tofu, machine=\": the plan `partition(..., "
        "machine=...)` chooses by this simulator's step time among the fewest-bytes plans "
        "fetching converted inputs again for the backward pass and keeping "
        "them (the default takes the keeping plan where it holds at most 1.15x the ideal "
        "as MXNet plans the step), and the keeping plan with each conversion priced, each "
        "routed as it is and through the machine's two PCIe switches (\"once "
        "per group\": a value several devices of a switch read crosses the host bridge "
        "once, to one of them, which passes it on), the fastest that fits (\"its plan\": "
        "which). \"hybrid\": data parallelism across the machine's two switches, each "
        "switch's four GPUs running the plan `machine=` chooses for four devices on half "
        "the batch, each GPU's gradient shard all-reduced with its peer in the other switch "
        "over the host bridge as the backward pass completes it; `partition(machine=...)` "
        "reports it and warns where it is faster, but returns a partition of all the "
        "devices: the hybrid runs as `tofu_mx.gluon.partition(..., replicas=2)` (each "
        "shard's gradient summed between the devices holding it in each switch; tested on "
        "CPU devices, not on GPUs). Data parallelism's (and swapping's) "
        "all-reduce overlaps its backward pass the same way.", "",
        *counts(rows), "",
        "## Peak memory per device", "",
        *memory_table(rows, machine), "",
        "## The largest model each strategy trains", "",
        *largest(rows, machine), "",
        "## Where tofu is under 1.25x the best alternative", "",
        *why(rows), "",
        "## Where tofu, machine=, is under 1.25x the best alternative", "",
        *why(rows, BY_TIME), "",
        *machines_section(rows, machine), "",
        "## Notes", "",
        *[f"- {m.label}, {s}: {r.note}" for m, _, results, _ in rows
          for s, r in results.items() if r.note and s != "ideal"],
        "", "Seconds per model: " + ", ".join(f"{m.label} {t:.0f}" for m, _, _, t in rows),
        ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
