"""partition() of LSTMs with their gates interleaved (nnvm_passes.interleave): checked against
one device at every k (hidden sizes k does not divide included), and what it is for: fewer
bytes moved and fewer operators per device than the gates stored one after another."""
import warnings

import mxnet as mx
import pytest

import tofu_mx
from tofu_mx import models
from tests.tofu_mx.runtime.helpers import blocks_one_after_another, partition_and_verify
from tofu_mx.search.plan import SearchOptions

#: the re-fetching plans, so that both layouts are weighed as the same kind of plan
REFETCH = SearchOptions(keep_if_fits=False)


def devices(k):
    return [mx.cpu(i) for i in range(k)]


@pytest.mark.parametrize("hidden", [12, 10])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_an_interleaved_lstm_computes_what_one_device_does(k, hidden):
    """(float32 against a float64 oracle, as the model's Embedding is float32)"""
    sym, shapes = models.rnn(2, hidden, 3, 30), models.input_shapes("rnn", 6, seq_len=3)
    ptd, report = partition_and_verify(sym, k, dtypes={}, oracle="float64", **shapes)
    assert report.ok, report
    assert len(ptd.graph.layouts) == 8


@pytest.mark.parametrize("k", [2, 4])
def test_interleaving_moves_fewer_bytes_and_runs_fewer_operators(k, monkeypatch):
    sym, shapes = models.rnn(2, 256, 5, 1000), models.input_shapes("rnn", 16, seq_len=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ptd = tofu_mx.partition(sym, devices(k), options=REFETCH, **shapes)
        blocks_one_after_another(monkeypatch)
        before = tofu_mx.partition(sym, devices(k), options=REFETCH, **shapes)
    assert ptd.graph.layouts and not before.graph.layouts
    assert ptd.plan.total_bytes < 0.75 * before.plan.total_bytes
    assert max(ptd.operators_per_device()) < 0.9 * max(before.operators_per_device())
