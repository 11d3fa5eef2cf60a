"""A device's share whose outputs nothing reads (a split's unused piece, an LSTM's first-step
forget gate) is not in the partitioned graph, and the weight cells only it read are kept
as unread cells: trained with a zero gradient, as on one device. Before the fix, MXNet
dropped the share and its weight cells from the symbol, and partition() failed with an
internal error where the plan kept converted inputs (k = 4)."""
import mxnet as mx
import pytest

import tofu_mx
from nnvm_passes.program import StepKind, live_steps
from tofu_mx import models
from tests.tofu_mx.runtime.helpers import blocks_one_after_another, partition_and_verify


def half_used():
    """A layer of which only the first half of the features is read."""
    x = mx.sym.var("data")
    h = mx.sym.FullyConnected(x, num_hidden=32, name="fc")
    half = mx.sym.split(h, num_outputs=2, axis=1, name="halves")[0]
    head = mx.sym.FullyConnected(mx.sym.Activation(half, act_type="tanh"), num_hidden=5,
                                 name="head")
    return mx.sym.SoftmaxOutput(head, name="softmax"), dict(data=(16, 64), softmax_label=(16,))


def one_step_lstm():
    """One LSTM step from a zero state: its forget gate is computed and never read."""
    return models.rnn(1, 16, 1, 50), models.input_shapes("rnn", 8, seq_len=1)


def partitioned(build, k, refetch):
    """The float64 net in float64; the LSTM (its Embedding is float32) in float32, judged
    against a float64 run of the one-device graph."""
    sym, shapes = build()
    lstm = build is one_step_lstm
    return partition_and_verify(sym, k, options=tofu_mx.SearchOptions(refetch=refetch),
                                dtypes={} if lstm else None,
                                oracle="float64" if lstm else None, **shapes)


def check(ptd, report):
    assert report.ok, report
    program = ptd.program
    assert live_steps(program.steps, program.heads) == set(range(len(program.steps)))
    stored = {s.shard.name for s in program.steps if s.kind is StepKind.VARIABLE}
    assert stored == set(ptd.symbol.list_arguments()) | set(ptd.symbol.list_auxiliary_states())


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("refetch", [True, False])
@pytest.mark.parametrize("build", [half_used, one_step_lstm])
def test_unread_shares_are_dropped_and_their_weights_kept(build, refetch, k):
    check(*partitioned(build, k, refetch))


@pytest.mark.parametrize("build", [half_used, one_step_lstm])
def test_the_weight_cells_only_a_dropped_share_read_are_kept(build, monkeypatch):
    """At k = 4, keeping converted inputs, a device's share of the first layer computes
    only unread values (the unused half, the forget gate, with the blocks one after another:
    not interleaved): its weight cells are kept as unread cells (their gradient, an exact
    zero, compared with one device's by verify)."""
    blocks_one_after_another(monkeypatch)
    ptd, report = partitioned(build, 4, False)
    check(ptd, report)
    steps = ptd.program.steps
    kept = {steps[r.step].shard.source for s in steps if s.kind is StepKind.ZERO
            for r in s.inputs}
    assert kept == ({"fc_weight", "fc_bias"} if build is half_used else
                    {"l0_i2h_weight", "l0_i2h_bias"})
