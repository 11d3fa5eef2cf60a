"""Calibrate the simulator on this machine's CPU, then check its predictions.

    python bench/calibrate.py          # about 3 minutes on 2 cores

1. **Fit** the ``cpu`` machine from single-operator forward+backward steps on ``cpu(0)``,
   with the simulator's own formulas (a step of one operator costs two launches and
   ``1 + BACKWARD_RATIO`` times its forward work): the launch from a tiny ReLU, the FLOP/s
   from a large fully connected layer, a convolution's share of it from a large
   convolution (MXNet's CPU convolution without oneDNN, which tofu_mx turns off for
   multi-device graphs, is far slower per FLOP; it also runs one matrix product per sample,
   reading its weight each time: ``Machine.per_sample``), the memory bandwidth from a large
   ReLU,
   and the link between ``cpu(i)`` devices from copies of a large and a tiny array.
2. **Predict and measure** one training step (forward and backward) of small models,
   unpartitioned on ``cpu(0)`` and partitioned over ``cpu(0)``, ``cpu(1)`` (the devices
   share the two cores: ``Machine.shared_compute``), and report the error per model.
   Each step is also predicted with every distinct operator timed alone instead of its
   roofline: what error is left is the schedule's and the transfers'.
3. **By operator kind**, for the first model: each distinct operator measured alone against
   its prediction, to say where the error comes from.

Writes bench/out/calibration.md.
"""
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tofu_mx  # noqa: E402,F401  (sets MXNet's environment before MXNet is imported)
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from nnvm_passes import import_symbol  # noqa: E402
from nnvm_passes.placement import placed_group  # noqa: E402
from tofu_mx import models, sim  # noqa: E402
from tofu_mx.sim.schedule import BACKWARD_RATIO  # noqa: E402
from tofu_mx.tdl.annotate import import_graph  # noqa: E402
from benchlib import table, write_out  # noqa: E402

REPEATS = 10


def median_step(exe, repeats: int = REPEATS) -> float:
    """Median forward+backward seconds of a bound executor (one warm-up step)."""
    times = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        exe.forward(is_train=True)
        exe.backward()
        mx.nd.waitall()
        if r:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def bind(sym, ctx=mx.cpu(0), **shapes):
    params = {n.name for n in import_symbol(sym, **shapes).variables("param")}
    req = {n: "write" if n in params or n == "x" else "null" for n in sym.list_arguments()}
    exe = sym.simple_bind(ctx, grad_req=req, **shapes)
    rng = np.random.default_rng(0)
    for name, a in exe.arg_dict.items():
        a[:] = rng.integers(0, 10, a.shape) if "label" in name or name.startswith("data") \
            else rng.standard_normal(a.shape).astype(a.dtype) * 0.05
    return exe


def one_op_step(sym, **shapes) -> float:
    return median_step(bind(sym, **shapes))


def copy_seconds(nbytes: int, repeats: int = REPEATS) -> float:
    x = mx.nd.ones((nbytes // 4,), ctx=mx.cpu(0))
    times = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        x.copyto(mx.cpu(1)).wait_to_read()
        if r:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def fit() -> tuple[sim.Machine, list[tuple]]:
    x = mx.sym.var("x")
    scale = 1 + BACKWARD_RATIO
    tiny = one_op_step(mx.sym.make_loss(mx.sym.relu(x, name="op")), x=(4, 4))
    launch = tiny / 2
    n, width = 256, 1024
    fc = mx.sym.make_loss(mx.sym.sum(mx.sym.FullyConnected(x, num_hidden=width, name="op")))
    fc_t = one_op_step(fc, x=(n, width))
    fc_flops = n * width * (2 * width + 1)
    flops = scale * fc_flops / max(fc_t - 4 * launch, 1e-9)
    big = (4096, 4096)
    relu_t = one_op_step(mx.sym.make_loss(mx.sym.relu(x, name="op")), x=big)
    relu_bytes = 2 * 4 * big[0] * big[1]
    bandwidth = scale * relu_bytes / max(relu_t - 2 * launch, 1e-9)
    conv_shape, filters = (8, 64, 32, 32), 64
    conv = mx.sym.make_loss(mx.sym.sum(mx.sym.Convolution(
        x, num_filter=filters, kernel=(3, 3), pad=(1, 1), no_bias=True, name="op")))
    conv_t = one_op_step(conv, x=conv_shape)
    conv_flops = conv_shape[0] * filters * 32 * 32 * 2 * conv_shape[1] * 9
    conv_rate = scale * conv_flops / max(conv_t - 4 * launch, 1e-9)
    small_copy, large = copy_seconds(64), 64 << 20
    large_copy = copy_seconds(large)
    link = sim.Link(large / max(large_copy - small_copy, 1e-9), small_copy)
    machine = sim.Machine("cpu", 2, 16 << 30, flops, bandwidth, launch, 2, peer=link,
                          bridge=link, host=link, shared_compute=True,
                          efficiency=(("Convolution", min(conv_rate / flops, 1.0)),),
                          per_sample=(("Convolution", 1),),
                          source=f"bench/calibrate.py, {time.strftime('%Y-%m-%d')}")
    rows = [("tiny ReLU (4 x 4), step", f"{tiny * 1e6:.0f} us", f"launch {launch * 1e6:.1f} us"),
            (f"FullyConnected {n} x {width} -> {width}, step", f"{fc_t * 1e3:.2f} ms",
             f"{flops / 1e9:.1f} GFLOP/s"),
            ("Convolution 8 x 64 x 32 x 32, 64 filters 3 x 3, step",
             f"{conv_t * 1e3:.2f} ms", f"{conv_rate / 1e9:.1f} GFLOP/s "
                                       f"({conv_rate / flops:.2f} of the above)"),
            ("ReLU 4096 x 4096, step", f"{relu_t * 1e3:.2f} ms",
             f"{bandwidth / 1e9:.1f} GB/s"),
            ("copy cpu(0) -> cpu(1), 64 B / 64 MiB", f"{small_copy * 1e6:.0f} us / "
             f"{large_copy * 1e3:.2f} ms", f"link {link.bandwidth / 1e9:.1f} GB/s, "
             f"{link.latency * 1e6:.0f} us")]
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
    rows = []
    for label, make in CASES:
        sym, shapes = make()
        measured_one = median_step(bind(sym, **shapes))
        ptd = tofu_mx.partition(sym, [mx.cpu(0), mx.cpu(1)], **shapes)
        params = {n.name for n in ptd.graph.variables("param")}
        many = ptd.simple_bind(grad_req={n: "write" if n in params else "null"
                                         for n in sym.list_arguments()})
        measured_two = median_step(many)
        single = dataclasses.replace(machine, num_devices=1, group_size=1)
        one = sim.simulate(sym, single, "ideal", **shapes).step_time
        two = sim.simulate(sym, machine, "tofu", **shapes).step_time
        index = {g: d for d, g in enumerate(ptd.group2ctx)}
        graph = ptd.shard_graph
        one_m = with_measured_operators(single, import_graph(sym, **shapes), lambda i: 0)
        two_m = with_measured_operators(machine, graph,
                                        lambda i: index.get(placed_group(graph, i), 0))

        def err(p, m):
            return f"{(p / m - 1) * 100:+.0f}%"
        rows.append((label, f"{measured_one * 1e3:.1f}", f"{one * 1e3:.1f}",
                     err(one, measured_one), err(one_m, measured_one),
                     f"{measured_two * 1e3:.1f}", f"{two * 1e3:.1f}", err(two, measured_two),
                     err(two_m, measured_two)))
        print(" | ".join(rows[-1]), flush=True)
    return rows


class Alone:
    """Each distinct operator of a graph (kind, attributes, input shapes) timed alone on
    ``cpu(0)``, forward and backward, less the loss its output is summed into; split into
    forward and backward as the simulator splits work (1 : ``BACKWARD_RATIO``). None where
    MXNet cannot bind it alone."""

    def __init__(self, graph):
        self.graph, self.times, self.losses = graph, {}, {}

    def step(self, i: int) -> float | None:
        from tofu_mx.tdl.registry import single_op_symbol

        node, graph = self.graph.nodes[i], self.graph
        ins = tuple(graph.tensor(e).shape for e in node.inputs)
        key = (node.op, tuple((k, v) for k, v in node.attrs.items() if not k.startswith("__")),
               ins, node.outputs[0].shape)
        if key not in self.times:
            try:
                op = single_op_symbol(node.op, dict(key[1]), len(ins), len(node.outputs))
                total = median_step(mx.sym.make_loss(mx.sym.sum(op[0])).simple_bind(
                    mx.cpu(0), grad_req="write", **dict(zip(op.list_arguments(), ins))), 5)
                self.times[key] = max(total - self.loss(node.outputs[0].shape), 0.0)
            except Exception:   # noqa: BLE001  (an operator MXNet cannot bind alone)
                self.times[key] = None
        return self.times[key]

    def loss(self, shape) -> float:
        """The step of the loss an operator's output is summed into (once per shape)."""
        if shape not in self.losses:
            self.losses[shape] = median_step(mx.sym.make_loss(mx.sym.sum(
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
    label, make = CASES[0]
    per_op = by_operator(machine, *make())
    print(table(["operator", "predicted", "measured alone"], per_op), flush=True)
    out = ["# Simulator calibration on this machine's CPU", "",
           f"`python bench/calibrate.py`, {time.strftime('%Y-%m-%d')}; median of {REPEATS} "
           f"steps after one warm-up.", "", "## Fitted `cpu` machine", "",
           table(["measured", "time", "fitted"], fitted), "",
           "## One training step: measured against predicted (ms)", "",
           table(["model", "cpu(0) measured", "predicted", "error",
                  "error, operators measured", "2 cpu devices measured", "predicted", "error",
                  "error, operators measured"], checked), "",
           "\"Operators measured\": the simulator's step with each distinct operator timed "
           "alone on cpu(0) instead of its roofline, so what is left is the schedule's and the "
           "transfers' error.", "",
           f"## {label}, one device, by operator kind (ms per step)", "",
           table(["operator", "predicted", "measured alone"], per_op), ""]
    print("wrote", write_out("calibration.md", "\n".join(out)))


if __name__ == "__main__":
    main()
