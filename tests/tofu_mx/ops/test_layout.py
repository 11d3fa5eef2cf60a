"""Layout operators (tofu_mx/ops/layout.py): the strategies the search offers, every share a
hook lets run computing exactly its part of MXNet's output, and partitioned networks
verified end to end in float64 with forced splits on the axes the hooks handle."""
import itertools

import mxnet as mx
import numpy as np
import pytest

from nnvm_passes.ir import FrozenDict
from tests.tofu_mx.ops.helpers import offered
from tests.tofu_mx.runtime.helpers import partition_and_verify
from tofu_mx.tdl.analysis import work_regions
from tofu_mx.tdl.registry import (Attrs, Example, _format_attrs, example_graph, lookup,
                                  single_op_symbol, trace)
from tofu_mx.tdl.interpret import evaluate
from tofu_mx.tdl.shares import resolve

X, L = mx.sym.var("data"), mx.sym.var("like")


# --- strategies offered -------------------------------------------------------------------------

@pytest.mark.parametrize("sym,parts,shapes,want", [
    # out (8, 9): 2 parts of 4 rows are one repetition each; 9 columns are not cut in 2
    (mx.sym.tile(X, reps=(2, 3)), 2, dict(data=(4, 3)), {"split i0"}),
    # 3 parts of 9 columns: one repetition each
    (mx.sym.tile(X, reps=(2, 3)), 3, dict(data=(4, 3)), {"split i1"}),
    # out (2, 12): a half is 1.5 repetitions of 4: no tile computes it
    (mx.sym.tile(X, reps=(3,)), 2, dict(data=(2, 4)), {"split i0"}),
    # a leading axis tile adds is split freely, and so are axes it does not repeat (3
    # columns in parts of 1 and 2)
    (mx.sym.tile(X, reps=(4, 1, 1)), 2, dict(data=(2, 3)), {"split i0", "split i1", "split i2"}),
    # out (2, 6): a half holds 0, 0, 1: element 1 repeated once
    (mx.sym.repeat(X, repeats=2, axis=1), 2, dict(data=(2, 3)), {"split i0"}),
    (mx.sym.repeat(X, repeats=3, axis=1), 2, dict(data=(2, 4)), {"split i0", "split i1"}),
    (mx.sym.repeat(X, repeats=2), 4, dict(data=(2, 3)), {"replicate all"}),
    (mx.sym.Pad(X, mode="constant", pad_width=(0, 0, 0, 0, 1, 1, 2, 2)), 2,
     dict(data=(2, 4, 6, 4)), {"split i0", "split i1", "split i2", "split i3"}),
    # reflect: the low half of the columns reads column 2, past its middle (0, 1)
    (mx.sym.Pad(X, mode="reflect", pad_width=(0, 0, 0, 0, 1, 1, 2, 2)), 2,
     dict(data=(2, 4, 6, 4)), {"split i0", "split i1", "split i2"}),
    # constant: the low half of the rows is all pad and reads nothing; edge reads row 0
    (mx.sym.Pad(X, mode="constant", pad_width=(0, 0, 0, 0, 4, 0, 2, 2)), 2,
     dict(data=(2, 4, 4, 4)), {"split i0", "split i1", "split i3"}),
    (mx.sym.Pad(X, mode="edge", pad_width=(0, 0, 0, 0, 4, 0, 2, 2)), 2,
     dict(data=(2, 4, 4, 4)), {"split i0", "split i1", "split i2", "split i3"}),
    (mx.sym.broadcast_axis(X, axis=1, size=4), 2, dict(data=(2, 1)), {"split i0", "split i1"}),
    (mx.sym.reverse(X, axis=1), 2, dict(data=(2, 4)), {"split i0", "split i1"}),
    (mx.sym.SwapAxis(X, dim1=0, dim2=2), 2, dict(data=(2, 4, 6)),
     {"split i0", "split i1", "split i2"}),
    # a slice of the channels reads channels spread over the other side
    (mx.sym.depth_to_space(X, block_size=2), 2, dict(data=(2, 8, 2, 2)),
     {"split n", "split h", "split w"}),
    (mx.sym.space_to_depth(X, block_size=2), 2, dict(data=(2, 2, 4, 4)),
     {"split n", "split h", "split w"}),
    # a half of the 12 columns is half of each of 2 rows: not a box of lhs
    (mx.sym.reshape_like(X, L), 2, dict(data=(4, 6), like=(2, 12)), {"split i0"}),
    (mx.sym.Crop(X, L, num_args=2, offset=(1, 0)), 2, dict(data=(2, 4, 5, 6), like=(2, 1, 2, 4)),
     {"split n", "split c", "split y", "split x"}),
])
def test_strategies_offered(sym, parts, shapes, want):
    assert offered(sym, parts, **shapes) == want


# --- every runnable share computes its part -----------------------------------------------------

def _outputs(op, attrs, arrays, n_out):
    sym = single_op_symbol(op, attrs, len(arrays), n_out)
    args = {f"in{i}": mx.nd.array(a, dtype="float32") for i, a in enumerate(arrays)}
    return [o.asnumpy() for o in sym.eval(ctx=mx.cpu(), **args)]


def _cut(array, box):
    return array[tuple(slice(lo, hi + 1) for lo, hi in box)]


def _share_ranges(extents):
    """Every contiguous range of each variable; and for two variables together, their
    halves and thirds (a share of a two-level cut)."""
    for var, n in extents.items():
        for lo, hi in itertools.combinations_with_replacement(range(n), 2):
            if (lo, hi) != (0, n - 1):
                yield {var: (lo, hi)}

    def parts(n):
        return [(p * (n // q), (p + 1) * (n // q) - 1) for q in (2, 3) if n % q == 0
                for p in range(q)]
    for (v1, n1), (v2, n2) in itertools.combinations(extents.items(), 2):
        for r1, r2 in itertools.product(parts(n1), parts(n2)):
            yield {v1: r1, v2: r2}


SHARE_CASES = [
    ("tile", {"reps": (2, 3)}, [(3, 2)]),
    ("tile", {"reps": (2, 1, 2)}, [(2, 3)]),
    ("repeat", {"repeats": 3, "axis": 1}, [(2, 3)]),
    ("repeat", {"repeats": 2}, [(2, 3)]),
    ("Pad", {"mode": "constant", "pad_width": (0, 0, 0, 0, 2, 1, 1, 3), "constant_value": 2.0},
     [(1, 2, 4, 3)]),
    ("Pad", {"mode": "edge", "pad_width": (0, 0, 0, 0, 2, 1, 1, 3)}, [(1, 2, 4, 3)]),
    ("Pad", {"mode": "reflect", "pad_width": (0, 0, 0, 0, 2, 1, 1, 3)}, [(1, 2, 4, 5)]),
    ("Pad", {"mode": "reflect", "pad_width": (0, 0, 0, 0, 1, 1, 1, 2, 2, 1)}, [(1, 1, 3, 3, 4)]),
    ("broadcast_axis", {"axis": (0, 2), "size": (3, 4)}, [(1, 2, 1)]),
    ("reverse", {"axis": (0, 2)}, [(4, 2, 3)]),
    ("depth_to_space", {"block_size": 2}, [(1, 8, 2, 3)]),
    ("space_to_depth", {"block_size": 2}, [(1, 2, 4, 6)]),
    ("slice_like", {"axes": (1,)}, [(2, 6, 3), (1, 4)]),
    ("reshape_like", {"lhs_begin": 1, "lhs_end": None, "rhs_begin": 0, "rhs_end": 1},
     [(2, 4, 3), (12, 5)]),
    ("broadcast_like", {"lhs_axes": (1,), "rhs_axes": (0,)}, [(2, 1), (5, 3)]),
    ("Crop", {"num_args": 1, "h_w": (3, 2), "center_crop": True}, [(1, 2, 6, 5)]),
    ("Crop", {"num_args": 2, "offset": (2, 1)}, [(2, 1, 6, 5), (1, 1, 3, 4)]),
    ("_split_v2", {"indices": (0, 1, 4), "axis": 1}, [(2, 6)]),
    ("_split_v2", {"indices": (), "sections": 3, "axis": 0, "squeeze_axis": True}, [(3, 4)]),
    ("_rnn_param_concat", {"dim": 0, "num_args": 2}, [(5,), (3,)]),
    ("SliceChannel", {"num_outputs": 3, "axis": 1}, [(2, 6)]),
    ("SliceChannel", {"num_outputs": 3, "axis": 0, "squeeze_axis": True}, [(3, 4)]),
]


@pytest.mark.parametrize("op,attrs,shapes", SHARE_CASES,
                         ids=[f"{c[0]}-{k}" for k, c in enumerate(SHARE_CASES)])
def test_every_runnable_share_computes_its_part(op, attrs, shapes):
    """Every contiguous range of every output variable (not only equal parts) is a share;
    each one the hook lets run is run by MXNet on the regions it reads, with the hook's
    attributes (or cut as views), and must give exactly its box of the whole output."""
    desc = lookup(op)
    graph = example_graph(op, Example(_format_attrs(attrs), tuple(map(tuple, shapes))))
    node = graph.nodes[-1]
    in_shapes = [graph.tensor(e).shape for e in node.inputs]
    out_shapes = [t.shape for t in node.outputs]
    traced = trace(desc, Attrs(node.attrs), in_shapes, out_shapes)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in in_shapes]
    whole = _outputs(op, node.attrs, arrays, len(out_shapes))
    for k, (ours, theirs) in enumerate(zip(evaluate(traced, arrays), whole)):
        assert np.array_equal(ours, theirs), f"output {k}"   # every output, not only the first
    ran = refused = 0
    for ranges in _share_ranges(traced.extents):
        work = work_regions(traced, ranges)
        run = resolve(desc, op, FrozenDict(node.attrs), traced, work)
        if isinstance(run, str):
            refused += 1
            continue
        ran += 1
        assert not run.shard.padded
        forms = []
        if run.shard.views is not None:
            forms.append([_cut(arrays[0], v).reshape([hi - lo + 1 for lo, hi in box])
                          for v, box in zip(run.shard.views, work.outputs)])
        if run.shard.views is None or run.shard.also_runs:   # both forms where both offered
            regions = [_cut(a, b) for a, b in zip(arrays, run.inputs) if b is not None]
            forms.append(_outputs(op, run.attrs, regions, len(work.outputs)))
        for got in forms:
            for k, box in enumerate(work.outputs):
                assert np.array_equal(got[k], _cut(whole[k], box)), (ranges, k)
    assert ran > 0


@pytest.mark.parametrize("op,attrs,shape,whole,parts,offered", [
    ("SliceChannel", {"num_outputs": 3, "axis": 1}, (2, 6), {"i0": (0, 0)}, {"i1": (0, 0)},
     True),
    ("SliceChannel", {"num_outputs": 3, "axis": 0, "squeeze_axis": True}, (3, 4),
     {"i1": (0, 0)}, None, False),
    ("_split_v2", {"indices": (0, 1, 4), "axis": 1}, (2, 6), {"i0": (0, 0)}, {"p1": (0, 0)},
     True),
    ("_split_v2", {"indices": (), "sections": 3, "axis": 0, "squeeze_axis": True}, (3, 4),
     {"i1": (0, 0)}, None, False),
])
def test_whole_pieces_offer_views_too(op, attrs, shape, whole, parts, offered):
    """A share holding whole pieces (split on another axis) may be read as views of its input
    as well as run (``also_runs``), but for squeezed outputs, whose shape is no region's; a
    share holding parts of pieces only as views."""
    desc = lookup(op)
    graph = example_graph(op, Example(_format_attrs(attrs), (shape,)))
    node = graph.nodes[-1]
    traced = trace(desc, Attrs(node.attrs), [shape], [t.shape for t in node.outputs])
    assert set(whole) <= set(traced.extents) and set(parts or ()) <= set(traced.extents)
    run = resolve(desc, op, FrozenDict(node.attrs), traced, work_regions(traced, whole))
    assert (run.shard.views is not None, run.shard.also_runs) == (offered, offered)
    if parts is not None:
        run = resolve(desc, op, FrozenDict(node.attrs), traced, work_regions(traced, parts))
        assert run.shard.views is not None and not run.shard.also_runs


def test_split_v2_every_output_matches_mxnet():
    """The kernel check compares an operator's first output only; compare them all."""
    desc = lookup("_split_v2")
    for ex in desc.examples:
        graph = example_graph("_split_v2", ex)
        node = graph.nodes[-1]
        out_shapes = [t.shape for t in node.outputs]
        x = np.random.default_rng(1).standard_normal(ex.shapes[0]).astype(np.float32)
        traced = trace(desc, Attrs(node.attrs), [x.shape], out_shapes)
        mine = evaluate(traced, [x])
        theirs = _outputs("_split_v2", node.attrs, [x], len(out_shapes))
        assert len(mine) == len(theirs) > 1
        assert all(np.array_equal(a, b) for a, b in zip(mine, theirs))


# --- end to end ---------------------------------------------------------------------------------

def _verify(y, k, choose, dtypes=None, **shapes):
    """The loss weighs each position of ``y`` by a variable (a sum of squares would not see
    a share computing its values in the wrong order)."""
    (shape,) = y.infer_shape(**shapes)[1]
    loss = mx.sym.MakeLoss(mx.sym.sum(y * mx.sym.var("weigh")))
    ptd, report = partition_and_verify(loss, k, dtypes=dtypes, choose=choose, weigh=shape,
                                       **shapes)
    assert report.ok and not ptd.fallbacks
    return ptd


def _strategies(ptd, name):
    (found,) = [tuple(map(str, o.strategies)) for o in ptd.plan.ops if o.name == name]
    return found


def _fc(hidden):
    return mx.sym.FullyConnected(X, num_hidden=hidden, name="fc")


def _conv(filters=2):
    return mx.sym.Convolution(X, num_filter=filters, kernel=(3, 3), pad=(1, 1), name="conv")


@pytest.mark.parametrize("k,reps", [(2, 4), (3, 3), (4, 4)])
def test_tile_split_on_a_repeated_axis(k, reps):
    """Columns (4, 3 * reps) cut in k: each share is a whole number of repetitions."""
    ptd = _verify(mx.sym.tile(_fc(3), reps=(1, reps), name="tile"), k, {"tile": "split i1"},
                  data=(4, 6))
    assert set(_strategies(ptd, "tile")) == {"split i1"}


@pytest.mark.parametrize("k", [2, 4])
def test_broadcast_axis_split_on_the_broadcast_axis(k):
    y = mx.sym.broadcast_axis(mx.sym.expand_dims(_fc(3), axis=1), axis=1, size=4, name="bax")
    ptd = _verify(y, k, {"bax": "split i1"}, data=(4, 6))
    assert set(_strategies(ptd, "bax")) == {"split i1"}


@pytest.mark.parametrize("k", [2, 3])
def test_reverse_and_swap_axis_split(k):
    ptd = _verify(mx.sym.reverse(_fc(6), axis=1, name="rev"), k, {"rev": "split i1"},
                  data=(4, 6))
    assert _strategies(ptd, "rev") == ("split i1",)
    ptd = _verify(mx.sym.SwapAxis(_fc(6), dim1=0, dim2=1, name="swap"), k,
                  {"swap": "split i0"}, data=(4, 6))
    assert _strategies(ptd, "swap") == ("split i0",)


@pytest.mark.parametrize("mode,k", [("constant", 2), ("constant", 4), ("edge", 2), ("edge", 4),
                                    ("reflect", 2)])
def test_pad_split_on_a_padded_axis(mode, k):
    y = mx.sym.Pad(_conv(), mode=mode, pad_width=(0, 0, 0, 0, 1, 1, 2, 2), constant_value=0.5,
                   name="pad")
    ptd = _verify(y, k, {"pad": "split i2"}, data=(2, 2, 6, 6))
    assert set(_strategies(ptd, "pad")) == {"split i2"}


def test_edge_pad_share_lying_in_the_pad():
    """Rows (2 + 4 + 2) in 4: the first and last shares are all pad (edge rows)."""
    y = mx.sym.Pad(_conv(), mode="edge", pad_width=(0, 0, 0, 0, 2, 2, 0, 0), name="pad")
    ptd = _verify(y, 4, {"pad": "split i2"}, data=(2, 2, 4, 4))
    assert _strategies(ptd, "pad") == ("split i2", "split i2")


@pytest.mark.parametrize("k", [2, 4])
def test_a_network_of_layout_operators(k):
    """repeat, depth_to_space, space_to_depth, slice_like, reshape_like, broadcast_like and
    _split_v2 after a convolution, each forced to a split its share runs."""
    y = mx.sym.depth_to_space(_conv(8), block_size=2, name="d2s")           # (2, 2, 8, 8)
    y = mx.sym.space_to_depth(y * 2.0, block_size=2, name="s2d")            # (2, 8, 4, 4)
    y = mx.sym.repeat(y, repeats=2, axis=2, name="rep")                     # (2, 8, 8, 4)
    y = mx.sym.slice_like(y, L, axes=(2,), name="sl")                       # (2, 8, 4, 4)
    y = mx.sym.reshape_like(y, mx.sym.var("flat"), lhs_begin=2, lhs_end=None, rhs_begin=0,
                            rhs_end=1, name="rl")                           # (2, 8, 16)
    parts = mx.sym._internal._split_v2(y, indices=(0, 4), axis=1, name="sp")
    s = mx.sym.sum(parts[0], axis=1, keepdims=True)                         # (2, 1, 16)
    y = mx.sym.broadcast_like(s, parts[1], lhs_axes=(1,), rhs_axes=(1,), name="bl") + parts[1]
    choose = {"d2s": "split h", "rep": "split i2", "sl": "split i2", "rl": "split i2",
              "bl": "split i1"}
    ptd = _verify(y, k, choose, data=(2, 2, 4, 4), like=(1, 1, 4), flat=(16,))
    for name in ("rep", "rl", "bl"):
        assert _strategies(ptd, name)[0] == choose[name]


@pytest.mark.parametrize("k", [2, 4])
def test_crop_split_on_rows(k):
    """Crop's kernel takes float32 only."""
    y = mx.sym.Crop(_conv(), L, num_args=2, offset=(1, 2), name="crop")
    ptd = _verify(y, k, {"crop": "split y"}, dtypes={}, data=(2, 2, 6, 6), like=(2, 1, 4, 2))
    assert _strategies(ptd, "crop")[0] == "split y"
    y = mx.sym.Crop(_conv(), h_w=(4, 2), center_crop=True, num_args=1, name="crop")
    ptd = _verify(y, k, {"crop": "split y"}, dtypes={}, data=(2, 2, 6, 6))
    # at k = 4 the second cut may group Crop with the convolution, whose choice is free
    assert _strategies(ptd, "crop")[0] == "split y"


def test_rnn_param_concat_split_on_its_axis():
    w1, w2 = mx.sym.var("w1"), mx.sym.var("w2")
    y = mx.sym._internal._rnn_param_concat(w1 * 2.0, w2 * 3.0, dim=0, num_args=2, name="rpc")
    ptd = _verify(y, 2, {"rpc": "split i0"}, w1=(6,), w2=(2,))
    assert _strategies(ptd, "rpc") == ("split i0",)
