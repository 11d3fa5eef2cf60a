"""Per-device memory over a training step: the end of the forward pass, and the peak."""
import json
import os
import subprocess
import sys

import mxnet as mx
import pytest

from nnvm_passes import import_symbol

from tofu_mx.errors import InvalidArgumentError
from tofu_mx.sim.memory import held_at_forward_end, peak_memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def test_the_end_of_the_forward_pass_holds_variables_and_kept_outputs(two_devices):
    """dev0: data 96 B, weights 84 B and their gradients 84 B (momentum: 84 B more); dev1:
    relu's output (48 B), which relu's gradient reads; fc's gradient reads only data."""
    graph, device_of = two_devices
    rows = held_at_forward_end(graph, device_of, 2, optimizer_state=1)
    assert rows[0] == dict(weights=84, gradients=84, optimizer=84, aux=0, inputs=96,
                           activations=0)
    assert rows[1] == dict(weights=0, gradients=0, optimizer=0, aux=0, inputs=0,
                           activations=48)


def test_the_peak_is_the_sum_of_mxnets_planned_blocks(two_devices):
    """MXNet plans every buffer of the step into blocks it never gives back; a buffer takes
    a free block within 16x of its size (the smallest as large, else the largest smaller,
    which grows).

    dev0 holds 264 B of variables. fc's output (48) takes block A; it is read only on dev1
    and not kept: A is free at once. Backward: the gradient of fc's output copied from dev1
    (48) takes A; FC's gradient also makes data's gradient (96, never read: data needs
    none), a new block. 264 + 48 + 96 = 408.

    dev1: the copy of fc's output (48, block A), relu's output (48, B), A free after relu;
    sum's output (4) takes A (48 is within 16x), loss's output (4, a head) a new C. Backward
    (MakeLoss reads no output gradient: no head gradient array): sum's output gradient (4)
    takes A; relu's output gradient (48) a new D; A free; fc's output gradient (48) takes
    A. Blocks 48 + 48 + 4 + 48 = 148.

    On one device: no copies; FC's data gradient (96) takes D, the largest free block
    below 96, grown to 96: 48 + 48 + 4 + 96 = 196 on 264 B of variables."""
    graph, device_of = two_devices
    assert peak_memory(graph, device_of, 2) == (408, 148)
    assert peak_memory(graph, device_of, 2, optimizer_state=2) == (408 + 2 * 84, 148)
    assert peak_memory(graph, lambda i: 0, 1) == (460,)


def _shared_weight(readers: int):
    """``w`` (3, 6) read by ``readers`` FullyConnected layers, each on its own data
    (4, 6); their outputs concatenated, summed, MakeLoss; float32, on one device."""
    w = mx.sym.var("w")
    outs = [mx.sym.FullyConnected(mx.sym.var(f"x{i}"), w, num_hidden=3, no_bias=True,
                                  name=f"fc{i}") for i in range(readers)]
    loss = mx.sym.MakeLoss(mx.sym.sum(mx.sym.concat(*outs, dim=0), name="total"),
                           name="loss")
    shapes = {f"x{i}": (4, 6) for i in range(readers)}
    return loss, shapes


def test_a_weight_read_three_times_holds_three_gradient_pieces(monkeypatch):
    """Variables: x0..x2 (3 x 96), w (72) and its gradient (72): 432.

    Forward: the FC outputs (48 each: blocks A, B, C; Concat's gradient reads them, so they
    stay), concat's output (144, D), sum's output (4, a new E: nothing is free), D free;
    loss's output (4): D is out of range (144 > 16 x 4), so a new F; E free. Backward:
    sum's output gradient (4) takes E, concat's (144) takes D, E free; the three FC output
    gradients (48 each) take E (grown to 48) and new G, H; D, A, B, C free. Each FC's
    gradient makes x_i's gradient (96, never read) and a piece of w's gradient (72): below
    MXNet's cap of 8 pieces, one ElementWiseSum adds them into w's gradient array once all
    three are in, so all three are held. fc2: x2's takes D, w's piece C (grown to 72), H
    free; fc1: x1's D, w's piece H (grown to 72), G free; fc0: w's piece G (grown to 72).
    Blocks 48 + 48 + 72 + 144 + 48 + 4 + 72 + 72 = 508; 432 + 508 = 940, what MXNet holds.

    At a cap of 3 the pieces are added one by one into the first (a chain of in-place
    adds): fc1's piece is freed once added, and fc0's takes its block (72) where it grew G
    from 48: 940 - 24."""
    loss, shapes = _shared_weight(3)
    graph = import_symbol(loss, **shapes)
    assert peak_memory(graph, lambda i: 0, 1) == (940,)
    monkeypatch.setenv("MXNET_EXEC_INPLACE_GRAD_SUM_CAP", "3")
    assert peak_memory(graph, lambda i: 0, 1) == (940 - 24,)


def _two_weights():
    """Two towers ``top_i = FC(FC(x_i, w0), w1)`` (x_i (4, 6), w0 (5, 6), w1 (3, 5), no
    bias), their outputs concatenated, summed, MakeLoss; float32, on one device."""
    w0, w1 = mx.sym.var("w0"), mx.sym.var("w1")
    outs = []
    for i in range(2):
        h = mx.sym.FullyConnected(mx.sym.var(f"x{i}"), w0, num_hidden=5, no_bias=True,
                                  name=f"fc{i}")
        outs.append(mx.sym.FullyConnected(h, w1, num_hidden=3, no_bias=True, name=f"top{i}"))
    loss = mx.sym.MakeLoss(mx.sym.sum(mx.sym.concat(*outs, dim=0), name="total"),
                           name="loss")
    return loss, {f"x{i}": (4, 6) for i in range(2)}


def test_weight_gradients_are_summed_at_the_end_of_the_backward_pass():
    """MXNet runs its graph depth first from the outputs, the weights' gradients last: a
    weight's ElementWiseSum runs when its output is reached, after every gradient node, so
    each weight's pieces are held to the end of the pass.

    Variables: x0, x1 (96 each), w0 (120) and its gradient, w1 (60) and its: 552.
    Forward: h0 (80, A), top0 (48, B), h1 (80, C), top1 (48, D) (all read by FC's
    gradient), concat (96, E), sum (4, F), E free; loss (4): E is out of range, new G; F
    free. Backward: sum's output gradient (4) takes F, concat's (96) E, F free; the two
    towers' output gradients (48) take F (grown to 48) and a new H; E free, B and D free.
    The order is depth first from w0's gradient (pieces from fc1, then fc0): top1's
    gradient makes h1's (80: E) and w1's piece (60: D grown; H free); fc1's makes x1's
    (96, never read: C grown to 96, freed) and w0's piece (120: H grown); then top0's makes
    h0's (80: C) and w1's piece (60: E); fc0's makes x0's (96: A grown) and w0's piece
    (120: F grown). Blocks 96 + 48 + 96 + 60 + 96 + 120 + 4 + 120 = 640: 1192. Summing
    w1's pieces once both are in (reverse topological order) would free D and E before
    fc0's gradient, whose pieces would then fit in them: 1144."""
    loss, shapes = _two_weights()
    assert peak_memory(import_symbol(loss, **shapes), lambda i: 0, 1) == (1192,)


PROFILED = r"""
import json, sys
import mxnet as mx
import tofu_mx
from tests.tofu_mx.sim.test_memory import _shared_weight, _two_weights
loss, shapes = _shared_weight(3) if sys.argv[2] == "shared" else _two_weights()
mx.profiler.set_config(profile_memory=True, profile_symbolic=False, profile_imperative=False,
                       aggregate_stats=False, filename=sys.argv[1])
mx.profiler.set_state("run")
exe = loss.simple_bind(mx.cpu(0), grad_req={n: "write" if n.startswith("w") else "null"
                                            for n in loss.list_arguments()}, **shapes)
exe.forward(is_train=True)
exe.backward()
mx.nd.waitall()
mx.profiler.set_state("stop")
mx.profiler.dump()
"""


def _profiled(tmp_path, graph: str) -> int:
    """MXNet's storage profiler's peak on cpu(0), bind to the end of one forward + backward
    pass of ``graph``, in a fresh process (nothing else allocated on cpu(0); MXNet's
    gradient-sum cap at its default, 8)."""
    trace = str(tmp_path / "trace.json")
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("MXNET_EXEC_INPLACE_GRAD_SUM_CAP", None)
    subprocess.run([sys.executable, "-c", PROFILED, trace, graph], env=env, check=True,
                   capture_output=True, timeout=120)
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    return max(int(next(iter(e["args"].values()))) for e in events
               if e.get("ph") == "C" and e["name"] == "Memory: cpu/0")


def test_mxnet_holds_what_the_plan_says_for_a_shared_weight(tmp_path):
    """The graph of the test above: 940 B, as planned."""
    loss, shapes = _shared_weight(3)
    assert _profiled(tmp_path, "shared") == 940 == peak_memory(
        import_symbol(loss, **shapes), lambda i: 0, 1)[0]


def test_mxnet_holds_every_weights_pieces_to_the_end(tmp_path):
    """The two towers above: MXNet holds 1196 B, the plan 1192 (summing each weight once
    its pieces are in: 1144)."""
    loss, shapes = _two_weights()
    assert _profiled(tmp_path, "towers") == 1196


def test_a_negative_optimizer_state_is_refused(two_devices):
    graph, device_of = two_devices
    with pytest.raises(InvalidArgumentError, match="optimizer_state"):
        peak_memory(graph, device_of, 2, optimizer_state=-1)
