"""Calibrate the simulator on this machine's CPU, then check its predictions.

    python bench/calibrate.py          # about 4 minutes on 2 cores

1. **Fit** the ``cpu`` machine with the simulator's own formulas (an operator's step is a
   forward and a backward task, each a launch, and ``1 + BACKWARD_RATIO`` times its forward
   work), from what MXNet's executor does when it runs a model:

   - the launch, from the slope of a chain of tiny ReLUs (the executor runs a device's
     operators in bulk: a fraction of a microsecond each, where one operator's step alone
     costs tens of microseconds of fixed overhead);
   - the memory bandwidth, from the slope of a chain of 4 MiB ReLUs;
   - the link between ``cpu(i)`` devices, from the same chains alternating between
     ``cpu(0)`` and ``cpu(1)`` (each ReLU's input copied over, its gradient back): as the
     executor copies, into buffers it planned, not as ``NDArray.copyto`` allocates;
   - the FLOP/s from a large fully connected layer, a convolution's share of it from a
     large convolution (MXNet's CPU convolution without oneDNN, which tofu_mx turns off for
     multi-device graphs, is slower per FLOP; it also runs one matrix product per sample,
     reading its weight each time: ``Machine.per_sample``), and LayerNorm's share of the
     memory bandwidth (``Machine.bandwidth_efficiency``: MXNet's CPU LayerNorm, its
     backward pass above all, is far off it); each solved from the simulator's step of
     that operator, its memory traffic added to its arithmetic
     (``Machine.memory_overlap=False``: MXNet's CPU kernels do not overlap the two; the
     roofline's maximum put small-batch matrix products 30% fast), less the executor's
     fixed cost of a step (a tiny operator's step less its launches).
2. **Predict and measure** one training step (forward and backward) of small models: on
   ``cpu(0)``; partitioned over ``cpu(0)``, ``cpu(1)`` (the devices share the two cores:
   ``Machine.shared_compute``) by the default plan; and by the plan
   ``partition(machine=...)`` chooses on the fitted machine; and report the error of each.
   Each step is also predicted with every distinct operator timed alone instead of its
   roofline: what error is left is the schedule's and the transfers'.
3. **By operator kind**, for each model: each distinct operator measured alone against
   its prediction, to say where the error comes from.

Writes bench/out/calibration.md.
"""
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tofu_mx  # noqa: E402,F401  (sets MXNet's environment before MXNet is imported)
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from nnvm_passes import import_symbol  # noqa: E402
from tofu_mx import models, sim  # noqa: E402
from tofu_mx.sim.schedule import BACKWARD_RATIO, inputs_needing_gradients  # noqa: E402
from tofu_mx.tdl.annotate import import_graph  # noqa: E402
from benchlib import table, write_out  # noqa: E402

REPEATS = 10


def best_step(exe, repeats: int = REPEATS) -> float:
    """Fastest forward+backward seconds of a bound executor over ``repeats`` steps (after one
    warm-up): the least disturbed by the other work this shared machine runs."""
    times = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        exe.forward(is_train=True)
        exe.backward()
        mx.nd.waitall()
        if r:
            times.append(time.perf_counter() - start)
    return min(times)


def bind(sym, ctx=mx.cpu(0), **shapes):
    params = {n.name for n in import_symbol(sym, **shapes).variables("param")}
    req = {n: "write" if n in params else "null" for n in sym.list_arguments()}
    exe = sym.simple_bind(ctx, grad_req=req, **shapes)
    rng = np.random.default_rng(0)
    for name, a in exe.arg_dict.items():
        a[:] = rng.integers(0, 10, a.shape) if "label" in name or name.startswith("data") \
            else rng.standard_normal(a.shape).astype(a.dtype) * 0.05
    return exe


def one_op_step(sym, **shapes) -> float:
    return best_step(bind(sym, **shapes))


def relu_chain(length: int, shape, alternate: bool = False) -> float:
    """The step of ``length`` ReLUs in a row over an array of ``shape``, all on ``cpu(0)``
    or, with ``alternate``, on ``cpu(0)`` and ``cpu(1)`` in turn (each value and its gradient
    copied between them): MXNet's executor runs such a chain as it runs a model's, in bulk."""
    with mx.AttrScope(ctx_group="g0"):
        y = mx.sym.var("x")
    for i in range(length):
        with mx.AttrScope(ctx_group=f"g{i % 2 if alternate else 0}"):
            y = mx.sym.relu(y)
    with mx.AttrScope(ctx_group=f"g{(length - 1) % 2 if alternate else 0}"):
        loss = mx.sym.make_loss(mx.sym.sum(y))
    return best_step(loss.simple_bind(mx.cpu(0), group2ctx={"g0": mx.cpu(0), "g1": mx.cpu(1)},
                                      x=shape))


def per_relu(shape, alternate: bool = False, short: int = 2, long: int = 42) -> float:
    """Seconds each ReLU of a chain adds to the step (forward and backward): the slope
    between a short and a long chain, so the step's fixed cost drops out."""
    return (relu_chain(long, shape, alternate) - relu_chain(short, shape, alternate)) / \
        (long - short)


def solve(sym, shapes, measured: float, machine_at, guess: float) -> float:
    """The value ``x`` for which the simulator's step of ``sym`` on ``machine_at(x)`` (one
    device) is ``measured``, where ``x`` divides part of the step (a FLOP/s, or an operator's
    share of the FLOP/s or of the memory bandwidth): the step is ``A + C / x``, read at
    ``guess`` and ``2 guess``."""
    def step(x):
        one = dataclasses.replace(machine_at(x), num_devices=1, group_size=1)
        return sim.simulate(sym, one, "ideal", **shapes).step_time
    at, twice = step(guess), step(2 * guess)
    divided = 2 * (at - twice) * guess             # C
    rest = at - divided / guess                    # A: what x does not divide
    return divided / max(measured - rest, 1e-9)


def fit() -> tuple[sim.Machine, list[tuple]]:
    """The ``cpu`` machine, from chains of operators run as MXNet's executor runs a model
    (see the module's docstring), and single large operators for the FLOP/s."""
    # the operators' input gets a gradient, as in a model's every layer but the first: a
    # weight added to it (one more small, memory-bound operator the simulator costs too)
    x = mx.sym.elemwise_add(mx.sym.var("x"), mx.sym.var("shift"))
    scale = 1 + BACKWARD_RATIO
    tiny, big = (4, 4), (1024, 1024)
    tiny_op, big_op = per_relu(tiny, long=202), per_relu(big, long=12)
    launch = tiny_op / 2                          # a forward and a backward task per ReLU
    relu_bytes = 2 * 4 * big[0] * big[1]
    bandwidth = scale * relu_bytes / max(big_op - 2 * launch, 1e-9)
    # every ReLU of the alternating chain also copies its input over, and its gradient back
    latency = max(per_relu(tiny, alternate=True, long=202) - tiny_op, 0.0) / 2
    big_copy = max(per_relu(big, alternate=True, long=12) - big_op, 1e-9) / 2
    link = sim.Link(4 * big[0] * big[1] / max(big_copy - latency, 1e-9), latency)
    machine = sim.Machine("cpu", 2, 16 << 30, 100e9, bandwidth, launch, 2, peer=link,
                          bridge=link, host=link, shared_compute=True,
                          per_sample=(("Convolution", 1),), memory_overlap=False,
                          source=f"bench/calibrate.py, {time.strftime('%Y-%m-%d')}")
    # a single operator's step also pays the executor's fixed cost: a tiny one's less its
    # two launches, taken off the steps below
    fixed = max(one_op_step(mx.sym.make_loss(mx.sym.relu(mx.sym.var("x"))), x=tiny)
                - 2 * launch, 0.0)
    n, width = 256, 1024
    fc = mx.sym.make_loss(mx.sym.sum(mx.sym.FullyConnected(x, num_hidden=width, name="op")))
    fc_t = one_op_step(fc, x=(n, width)) - fixed
    flops = solve(fc, {"x": (n, width)}, fc_t, lambda r: dataclasses.replace(machine, flops=r),
                  50e9)
    machine = dataclasses.replace(machine, flops=flops)
    # the operators whose kernels fall short of the roofline on models (bench/results/
    # calibration.md, by operator kind) and whose step alone is theirs: a convolution of its
    # FLOP/s (per sample, see the module's docstring), LayerNorm of the memory bandwidth
    fitted = {"efficiency": {}, "bandwidth_efficiency": {}}
    measured_alone = []
    for field, op, sym, shape in (
            ("efficiency", "Convolution", mx.sym.Convolution(
                x, num_filter=64, kernel=(3, 3), pad=(1, 1), no_bias=True, name="op"),
             (8, 64, 32, 32)),
            ("bandwidth_efficiency", "LayerNorm", mx.sym.LayerNorm(x, name="op"),
             (512, 256))):
        loss = mx.sym.make_loss(mx.sym.sum(sym))
        took = one_op_step(loss, x=shape) - fixed

        def at(e, field=field, op=op):
            return dataclasses.replace(machine, **{
                f: tuple(shares.items()) + (((op, e),) if f == field else ())
                for f, shares in fitted.items()})
        fitted[field][op] = min(solve(loss, {"x": shape}, took, at, 0.25), 1.0)
        measured_alone.append((field, op, shape, took))
    machine = dataclasses.replace(machine, **{f: tuple(shares.items())
                                              for f, shares in fitted.items()})
    rows = [("a ReLU in a chain of 4 x 4 ReLUs, forward + backward",
             f"{tiny_op * 1e6:.2f} us", f"launch {launch * 1e6:.2f} us"),
            (f"FullyConnected {n} x {width} -> {width}, step", f"{fc_t * 1e3:.2f} ms",
             f"{flops / 1e9:.1f} GFLOP/s"),
            ("a ReLU in a chain of 1024 x 1024 ReLUs", f"{big_op * 1e3:.2f} ms",
             f"{bandwidth / 1e9:.1f} GB/s"),
            ("a copy cpu(0) <-> cpu(1) in a chain alternating devices, 64 B / 4 MiB",
             f"{latency * 1e6:.2f} us / {big_copy * 1e6:.0f} us",
             f"link {link.bandwidth / 1e9:.1f} GB/s, {link.latency * 1e6:.2f} us"),
            ("a tiny ReLU's step alone, less its launches", f"{fixed * 1e6:.0f} us",
             "the executor's fixed cost per step (not modelled; taken off the steps below)")]
    rows += [(f"{op} on {' x '.join(map(str, shape))}, step", f"{took * 1e3:.2f} ms",
              f"{fitted[field][op]:.2f} of the device's "
              f"{'FLOP/s' if field == 'efficiency' else 'memory bandwidth'}")
             for field, op, shape, took in measured_alone]
    return machine, rows


CASES = [
    ("WResNet-14-W2, batch 8, 32 px", lambda: (models.wresnet(14, 2, 10),
                                              models.input_shapes("wresnet", 8, image_size=32))),
    ("MLP 3 x 1024, batch 256", lambda: (mlp(), dict(data=(256, 1024), softmax_label=(256,)))),
    ("LSTM 2 x 256, 10 steps, batch 32", lambda: (models.rnn(2, 256, 10, 1000),
                                                  models.input_shapes("rnn", 32, seq_len=10))),
    ("Transformer 2 x 256, 32 tokens, batch 16", lambda: (
        models.transformer(2, 256, 4, 32, 1000), models.input_shapes("transformer", 16,
                                                                     seq_len=32))),
]


def mlp():
    x = mx.sym.var("data")
    for i in range(3):
        x = mx.sym.relu(mx.sym.FullyConnected(x, num_hidden=1024, name=f"fc{i}"))
    return mx.sym.SoftmaxOutput(mx.sym.FullyConnected(x, num_hidden=10, name="out"),
                                name="softmax")


def check(machine: sim.Machine) -> list[tuple]:
    """Each model's step measured and predicted three ways: on ``cpu(0)``; partitioned over
    ``cpu(0)`` and ``cpu(1)`` by the default (fewest-bytes) plan; and by the plan
    ``partition(machine=...)`` chooses on the fitted machine."""
    rows = []
    single = dataclasses.replace(machine, num_devices=1, group_size=1)
    ctx = [mx.cpu(0), mx.cpu(1)]

    def err(p, m):
        return f"{(p / m - 1) * 100:+.0f}%"
    for label, make in CASES:
        sym, shapes = make()
        graph = import_graph(sym, **shapes)
        runs = [("cpu(0)", best_step(bind(sym, **shapes)),
                 sim.simulate(sym, single, "ideal", **shapes).step_time,
                 with_measured_operators(single, graph, lambda i: 0))]
        for plan, ptd in (("2 devices, default plan", tofu_mx.partition(sym, ctx, **shapes)),
                          ("2 devices, `machine=` plan",
                           tofu_mx.partition(sym, ctx, machine=machine, **shapes))):
            params = {n.name for n in ptd.graph.variables("param")}
            measured = best_step(ptd.simple_bind(grad_req={
                n: "write" if n in params else "null" for n in sym.list_arguments()}))
            runs.append((plan, measured, sim.partitioned_step(ptd, machine)[0],
                         with_measured_operators(machine, ptd.shard_graph,
                                                 ptd.node_devices().__getitem__)))
        for where, measured, predicted, timed in runs:
            rows.append((label, where, f"{measured * 1e3:.1f}", f"{predicted * 1e3:.1f}",
                         err(predicted, measured), err(timed, measured)))
            print(" | ".join(rows[-1]), flush=True)
    return rows


class Alone:
    """Each distinct operator of a graph (kind, attributes, input shapes, inputs that need a
    gradient) timed alone on ``cpu(0)``, forward and backward, less the loss its output is
    summed into; split into forward and backward as the simulator splits an operator's
    bytes (1 : ``BACKWARD_RATIO``). None where MXNet cannot bind it alone."""

    def __init__(self, graph):
        from tofu_mx.search.structure import needs_grad_of

        self.graph, self.times, self.losses = graph, {}, {}
        self.grads = needs_grad_of(graph)

    def step(self, i: int) -> float | None:
        from tofu_mx.tdl.registry import single_op_symbol

        node, graph = self.graph.nodes[i], self.graph
        ins = tuple(graph.tensor(e).shape for e in node.inputs)
        needed = tuple("write" if n else "null"
                       for n in inputs_needing_gradients(graph, self.grads, i))
        key = (node.op, tuple((k, v) for k, v in node.attrs.items() if not k.startswith("__")),
               ins, node.outputs[0].shape, needed)
        if key not in self.times:
            try:
                op = single_op_symbol(node.op, dict(key[1]), len(ins), len(node.outputs))
                args = op.list_arguments()
                total = best_step(mx.sym.make_loss(mx.sym.sum(op[0])).simple_bind(
                    mx.cpu(0), grad_req=dict(zip(args, needed)), **dict(zip(args, ins))), 5)
                self.times[key] = max(total - self.loss(node.outputs[0].shape), 0.0)
            except Exception:   # noqa: BLE001  (an operator MXNet cannot bind alone)
                self.times[key] = None
        return self.times[key]

    def loss(self, shape) -> float:
        """The step of the loss an operator's output is summed into (once per shape)."""
        if shape not in self.losses:
            self.losses[shape] = best_step(mx.sym.make_loss(mx.sym.sum(
                mx.sym.var("x"))).simple_bind(mx.cpu(0), grad_req="write", x=shape), 5)
        return self.losses[shape]

    def seconds(self, fallback):
        """``op_seconds`` for :func:`step_tasks`: measured, else ``fallback(i)``."""
        def timed(i):
            t = self.step(i)
            return fallback(i) if t is None else \
                (t / (1 + BACKWARD_RATIO), t * BACKWARD_RATIO / (1 + BACKWARD_RATIO))
        return timed


def by_operator(machine: sim.Machine, sym, shapes) -> list[tuple]:
    """Predicted against measured step time of every operator kind of a graph on one device:
    each distinct operator measured alone, counted as often as the graph holds it."""
    from tofu_mx.sim.schedule import step_tasks
    from tofu_mx.tdl.annotate import import_graph

    graph = import_graph(sym, **shapes)
    one = dataclasses.replace(machine, num_devices=1, group_size=1)
    seconds = {t.name: t.seconds for t in step_tasks(graph, lambda i: 0, one)}
    alone = Alone(graph)
    predicted, measured = {}, {}
    for i, node in enumerate(graph.nodes):
        if node.is_variable:
            continue
        predicted[node.op] = predicted.get(node.op, 0.0) + seconds.get(node.name, 0.0) + \
            seconds.get("d" + node.name, 0.0)
        measured[node.op] = measured.get(node.op, 0.0) + (alone.step(i) or 0.0)
    return [(op, f"{predicted[op] * 1e3:.1f}", f"{measured[op] * 1e3:.1f}")
            for op in sorted(predicted, key=lambda o: -measured[o])]


def with_measured_operators(machine: sim.Machine, graph, device_of) -> float:
    """The simulator's step with every operator's time measured alone (the roofline's error
    taken out): what is left is the schedule's and the transfers' error."""
    from tofu_mx.sim.schedule import roofline_seconds, step_tasks

    timed = Alone(graph).seconds(lambda i: roofline_seconds(graph, i, machine))
    return max(sim.finish_times(step_tasks(graph, device_of, machine, op_seconds=timed)))


def main():
    machine, fitted = fit()
    print(table(["measured", "time", "fitted"], fitted), flush=True)
    checked = check(machine)
    out = ["# Simulator calibration on this machine's CPU", "",
           f"`python bench/calibrate.py`, {time.strftime('%Y-%m-%d')}; the fastest of "
           f"{REPEATS} steps after one warm-up (the least disturbed on a shared machine).", "",
           "## Fitted `cpu` machine", "",
           table(["measured", "time", "fitted"], fitted), "",
           "## One training step: measured against predicted (ms)", "",
           table(["model", "run on", "measured", "predicted", "error",
                  "error, operators measured"], checked), "",
           "\"Operators measured\": the simulator's step with each distinct operator timed "
           "alone on cpu(0) instead of its roofline, so what is left is the schedule's and the "
           "transfers' error.", ""]
    for label, make in CASES:
        per_op = by_operator(machine, *make())
        print(table(["operator", "predicted", "measured alone"], per_op), flush=True)
        out += [f"## {label}, one device, by operator kind (ms per step)", "",
                table(["operator", "predicted", "measured alone"], per_op), ""]
    print("wrote", write_out("calibration.md", "\n".join(out)))


if __name__ == "__main__":
    main()
