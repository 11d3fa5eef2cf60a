"""Indexing, creation and sequence descriptions: the strategies they offer, and partitioned
nets using them computing what one device computes (float64), shard hooks included."""
import mxnet as mx
import pytest

import tofu_mx.ops  # noqa: F401
from tests.tofu_mx.ops.helpers import offered
from tests.tofu_mx.runtime.helpers import partition_and_verify

X, I = mx.sym.var("x"), mx.sym.var("i")


def test_take_splits_the_index_axis_and_the_table_columns():
    assert offered(mx.sym.take(X, I), x=(6, 4), i=(4,)) == {"split i0", "split i1"}
    # axis 1: rows of the table, the index axes, never the indexed axis itself
    assert offered(mx.sym.take(X, I, axis=1), x=(4, 6), i=(2, 2)) == \
        {"split i0", "split i1", "split i2"}


def test_creation_ops_split_every_axis():
    assert offered(mx.sym.zeros(shape=(4, 6))) == {"split i0", "split i1"}
    assert offered(mx.sym.zeros(shape=(4, 6), dtype="int32")) == {"split i0", "split i1"}
    assert offered(mx.sym.full(shape=(4, 6), val=2.0)) == {"split i0", "split i1"}
    assert offered(mx.sym.zeros_like(X), x=(4, 6)) == {"split i0", "split i1"}


def test_arange_shares_hold_whole_groups_of_repeats():
    assert offered(mx.sym.arange(0, 6, repeat=2), parts=3) == {"split i"}
    assert offered(mx.sym.arange(0, 3, repeat=2)) == {"replicate all"}   # shares of 3
    # arange_like numbers the flat order: a share must be one contiguous run of it, starting
    # on a whole group of repeats
    assert offered(mx.sym.contrib.arange_like(X), x=(4, 6)) == {"split i0"}
    assert offered(mx.sym.contrib.arange_like(X), x=(1, 6)) == {"split i1"}
    assert offered(mx.sym.contrib.arange_like(X, repeat=3), x=(4, 6)) == {"split i0"}
    assert offered(mx.sym.contrib.arange_like(X, repeat=4), x=(2, 6)) == {"replicate all"}
    assert offered(mx.sym.contrib.arange_like(X, axis=1), x=(3, 4)) == {"split i"}


def test_shares_that_no_attribute_can_express_are_not_offered():
    # one_hot: a slice of the one-hot axis past 0 would need shifted indices
    assert offered(mx.sym.one_hot(I, depth=6), i=(4,)) == {"split i0"}
    # reversing by lengths reads the whole time axis: only batch and features split
    rev = mx.sym.SequenceReverse(X, I, use_sequence_length=True)
    assert offered(rev, x=(4, 6, 2), i=(6,)) == {"split b", "split r0"}
    assert offered(mx.sym.SequenceReverse(X), x=(4, 6, 2)) == {"split i0", "split i1", "split i2"}
    assert offered(mx.sym.shape_array(X), x=(4, 6)) == {"replicate all"}


def test_diag_shares_read_square_boxes():
    assert offered(mx.sym.diag(X, k=1), x=(4, 6)) == {"split i0"}
    # the diagonal of 5 x 6 above the main one: 5 elements, in parts of 2 and 3
    assert offered(mx.sym.diag(X, k=1, axis1=1, axis2=2), x=(4, 5, 6)) == {"split i0",
                                                                          "split i1"}


def _head(x):
    return mx.sym.FullyConnected(x, num_hidden=6, name="fc")


@pytest.mark.parametrize("k", [2, 3])
def test_indexing_ops_after_a_layer(k):
    """Gradients reach the layer's weights through every one of them."""
    y = _head(X)
    z = y + mx.sym.zeros(shape=(6, 6), dtype="float64", name="z")
    z = z * mx.sym.ones_like(y) + mx.sym.where(mx.sym.var("cond"), y * y, y)
    z = z * mx.sym.one_hot(mx.sym.var("hot"), depth=6, dtype="float64")
    picked = mx.sym.pick(y, mx.sym.var("col"), axis=1)
    loss = mx.sym.MakeLoss(mx.sym.sum(z * z) + mx.sym.sum(picked * picked))
    ptd, report = partition_and_verify(loss, k, x=(6, 5), cond=(6,), hot=(6,), col=(6,))
    assert report.ok and not ptd.fallbacks


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("strategy", ["split i0", "split i1"])
def test_forced_split_of_zeros(k, strategy):
    z = mx.sym.zeros(shape=(6, 6), dtype="float64", name="z")
    loss = mx.sym.MakeLoss(mx.sym.sum(mx.sym.square(_head(X) + z)))
    ptd, report = partition_and_verify(loss, k, choose={"z": strategy}, x=(6, 5))
    assert report.ok and not ptd.fallbacks
    assert str({o.name: o for o in ptd.plan.ops}["z"].strategies[0]) == strategy


def _steps(x):
    """(6, 3, 4) steps x batch x features, from (6, 3, 5)."""
    return mx.sym.FullyConnected(x, num_hidden=4, flatten=False, name="fc")


def _arange_like(y):
    return y * mx.sym.contrib.arange_like(y, start=1.0, step=0.5, repeat=2, name="arl")


def _last(x):
    return mx.sym.SequenceLast(_steps(x), mx.sym.var("len"), use_sequence_length=True,
                               name="last")


@pytest.mark.parametrize("name,strategy,build,shapes", [
    ("ar", "split i", lambda: _head(X) * mx.sym.reshape(
        mx.sym.arange(1, 13, repeat=3, dtype="float64", name="ar"), shape=(6, 6)), {}),
    ("arl", "split i0", lambda: _arange_like(_head(X)), {}),
    ("dg", "split i0", lambda: mx.sym.diag(mx.sym.FullyConnected(X, num_hidden=7), k=1,
                                           name="dg") * 2.0, {}),
    ("rev", "split i0", lambda: mx.sym.SequenceReverse(_steps(X), name="rev"),
     {"x": (6, 3, 5)}),
    ("last", "split b", lambda: _last(X), {"x": (6, 4, 5), "len": (4,)}),
    ("last", "split b", lambda: mx.sym.SequenceLast(_steps(X), name="last"), {"x": (6, 4, 5)}),
    ("take", "split i1", lambda: mx.sym.take(_head(X), mx.sym.var("ix"), name="take"),
     {"ix": (4,)}),
])
def test_forced_splits_through_shard_hooks(name, strategy, build, shapes):
    """Each share runs with its own offset (arange's start and stop, arange_like's start,
    diag's k) or on mirrored steps (SequenceReverse without lengths)."""
    out = build()
    loss = mx.sym.MakeLoss(mx.sym.sum(out * out))
    ptd, report = partition_and_verify(loss, 2, choose={name: strategy},
                                       **{"x": (6, 5), **shapes})
    assert report.ok and not ptd.fallbacks
    assert str({o.name: o for o in ptd.plan.ops}[name].strategies[0]) == strategy
