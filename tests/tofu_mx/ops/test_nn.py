"""Neural-network layers (tofu_mx.ops.nn): the strategies each offers, pinned, and partitioned
runs proven equal to one device, in float64 (float32 for MXNet's float32-only kernels:
InstanceNorm, LRN, SoftmaxActivation, BatchNorm_v1, IdentityAttachKLSparseReg)."""
import mxnet as mx
import pytest

from tests.tofu_mx.ops.helpers import offered
from tests.tofu_mx.runtime.helpers import partition_and_verify

X, Y = mx.sym.var("data"), mx.sym.var("y")
F32 = {"data": "float32", "y": "float32"}


def verify(sym, k, choose=None, dtypes=None, **shapes):
    """Partition MakeLoss(sum(sym^2)) over k devices; the forced strategies were applied."""
    loss = mx.sym.MakeLoss(mx.sym.sum(sym * sym))
    if dtypes is not None:
        dtypes = {n: t for n, t in dtypes.items() if n in shapes}
    ptd, report = partition_and_verify(loss, k, choose=choose, dtypes=dtypes, **shapes)
    assert report.ok, report
    assert not ptd.fallbacks
    if choose:
        chosen = {o.name: str(o.strategies[0]) for o in ptd.plan.ops}
        assert all(chosen[n] == s for n, s in choose.items()), chosen
    return ptd


# --- strategies offered -----------------------------------------------------------------------

@pytest.mark.parametrize("sym,shapes,want", [
    # batch, filters, input channels (partial sums) and, with explicit zero rows, rows/columns
    (mx.sym.Deconvolution(X, kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=4,
                          no_bias=False), dict(data=(2, 4, 4, 4)),
     {"split b", "split co", "reduce ci", "split x0", "split x1"}),
    # groups: half the filters is a whole group; half of every group's channels is no slice
    (mx.sym.Deconvolution(X, kernel=(3, 3), pad=(1, 1), num_filter=4, num_group=2),
     dict(data=(2, 4, 4, 4)), {"split b", "split co", "split x0", "split x1"}),
    (mx.sym.Deconvolution(X, kernel=(3,), stride=(2,), target_shape=(8,), num_filter=4),
     dict(data=(2, 4, 4)), {"split b", "split co", "reduce ci", "split x0"}),
    (mx.sym.UpSampling(X, Y, scale=2, sample_type="nearest", num_args=2),
     dict(data=(2, 2, 4, 4), y=(2, 2, 2, 2)), {"split b", "split c", "split y", "split x"}),
    # bilinear: a depthwise deconvolution whose fixed pad no spatial share can use
    (mx.sym.UpSampling(X, scale=2, sample_type="bilinear", num_args=2, num_filter=4),
     dict(data=(2, 4, 4, 4)), {"split b", "split co"}),
    # 7 rows to 4 (overlapping windows) do not split; 8 columns to 4 do
    (mx.sym.contrib.AdaptiveAvgPooling2D(X, output_size=(4, 4)), dict(data=(2, 4, 7, 8)),
     {"split b", "split c", "split x"}),
    (mx.sym.contrib.BilinearResize2D(X, height=8, width=6), dict(data=(2, 4, 4, 4)),
     {"split b", "split c"}),
    (mx.sym.Correlation(X, Y, kernel_size=3, max_displacement=2, pad_size=2),
     dict(data=(2, 4, 6, 6), y=(2, 4, 6, 6)), {"split b", "reduce ch"}),
    (mx.sym.Convolution_v1(X, kernel=(3, 3), pad=(1, 1), num_filter=4), dict(data=(2, 4, 6, 6)),
     {"split b", "split co", "reduce ci", "split x0", "split x1"}),
    (mx.sym.Pooling_v1(X, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max"),
     dict(data=(2, 4, 8, 8)), {"split b", "split c", "split x0", "split x1"}),
])
def test_layers_offer_their_splits(sym, shapes, want):
    assert offered(sym, **shapes) == want


@pytest.mark.parametrize("sym,shape,want", [
    # statistics per (sample, channel): never a spatial split
    (mx.sym.InstanceNorm(X), (2, 4, 4, 4), {"split i0", "split i1"}),
    # whole groups of channels only (gamma/beta are per group)
    (mx.sym.GroupNorm(X, num_groups=2), (2, 4, 4, 4), {"split b", "split c"}),
    (mx.sym.GroupNorm(X, num_groups=1), (2, 4, 4, 4), {"split b"}),
    # the (batch, group) mean/std outputs are indexed by a group, not a channel
    (mx.sym.GroupNorm(X, num_groups=4, output_mean_var=True), (2, 4, 4, 4), {"split b"}),
    (mx.sym.L2Normalization(X, mode="instance"), (2, 4, 4, 4), {"split i0"}),
    (mx.sym.L2Normalization(X, mode="channel"), (2, 4, 4, 4),
     {"split i0", "split i2", "split i3"}),
    (mx.sym.L2Normalization(X, mode="spatial"), (2, 4, 4, 4), {"split i0", "split i1"}),
    # the channel window: a share would normalise its halo channels too
    (mx.sym.LRN(X, nsize=3), (2, 4, 4, 4), {"split b", "split y", "split x"}),
    (mx.sym.SoftmaxActivation(X, mode="channel"), (2, 4, 4), {"split i0", "split i2"}),
    # "instance" is over the last axis in MXNet's kernel
    (mx.sym.SoftmaxActivation(X), (2, 4, 4), {"split i0", "split i1"}),
    (mx.sym.BatchNorm_v1(X), (2, 4, 3, 3), {"split i1"}),
    # the gradient's moving average reads the whole batch: features only
    (mx.sym.IdentityAttachKLSparseReg(X), (4, 6), {"split f"}),
])
def test_normalisations_are_not_split_on_their_normalised_axes(sym, shape, want):
    assert offered(sym, data=shape) == want


# --- partitioned runs -------------------------------------------------------------------------

def conv_net():
    y = mx.sym.Convolution(X, kernel=(3, 3), pad=(1, 1), num_filter=8, name="conv")
    y = mx.sym.GroupNorm(y, num_groups=4, name="gn")
    y = mx.sym.Activation(y, act_type="relu")
    y = mx.sym.Deconvolution(y, kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=4,
                             no_bias=False, name="deconv")
    y = mx.sym.UpSampling(y, scale=2, sample_type="nearest", num_args=1, name="up")
    y = mx.sym.L2Normalization(y, mode="channel", name="l2")
    y = mx.sym.contrib.AdaptiveAvgPooling2D(y, output_size=(6, 6), name="ap")
    return mx.sym.contrib.BilinearResize2D(y, height=8, width=8, name="rs")


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("choose", [None, {"gn": "split c", "deconv": "split co", "up": "split y",
                                           "l2": "split i3", "ap": "split y", "rs": "split c"}])
def test_conv_net(k, choose):
    verify(conv_net(), k, choose=choose, data=(4, 3, 8, 8))


DECONV = dict(kernel=(4, 4), stride=(2, 2), pad=(1, 1), no_bias=False)


@pytest.mark.parametrize("k,attrs,strategy", [
    (2, DECONV, "split b"), (2, DECONV, "split co"), (2, DECONV, "reduce ci"),
    (2, DECONV, "split x0"), (2, DECONV, "split x1"),
    (3, DECONV, "split b"), (3, DECONV, "split co"), (3, DECONV, "reduce ci"),
    (3, DECONV, "split x0"),
    (4, DECONV, "split co"),
    (3, dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), adj=(1, 1), num_group=3), "split co"),
    (3, dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), adj=(1, 1), num_group=3), "split x0"),
    (2, dict(kernel=(3, 3), stride=(2, 2), target_shape=(12, 12)), "split x0"),
])
def test_deconvolution_shares(k, attrs, strategy):
    """Filters (num_filter and num_group follow), batch, input channels (partial sums), and
    rows with the zero rows of the unclipped window materialised (pad and adj recomputed)."""
    y = mx.sym.Deconvolution(X, num_filter=6, name="d", **attrs)
    verify(y, k, choose={"d": strategy}, data=(6, 6, 6, 6))


@pytest.mark.parametrize("attrs,strategy", [
    (DECONV, "split x0"), (DECONV, "split x1"),
    (dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), adj=(1, 1), num_group=4), "split co"),
    (dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), adj=(1, 1), num_group=4), "split x0"),
])
def test_deconvolution_shares_in_four(attrs, strategy):
    """Two levels of cuts: each share's pad and adj recomputed for its quarter."""
    y = mx.sym.Deconvolution(X, num_filter=8, name="d", **attrs)
    verify(y, 4, choose={"d": strategy}, data=(4, 8, 4, 4))


def test_deconvolution_1d_shares():
    y = mx.sym.Deconvolution(X, kernel=(3,), stride=(2,), pad=(1,), adj=(1,), num_filter=4,
                             name="d")
    for strategy in ("split co", "split x0", "reduce ci"):
        verify(y, 2, choose={"d": strategy}, data=(2, 4, 4))


@pytest.mark.parametrize("sym,strategy,shapes", [
    # a channel share of a concatenation reads (and upsamples) one input only
    (mx.sym.UpSampling(X, Y, scale=2, sample_type="nearest", num_args=2, name="u"), "split c",
     dict(data=(2, 2, 4, 4), y=(2, 2, 2, 2))),
    (mx.sym.UpSampling(X, Y, scale=2, sample_type="nearest", num_args=2, multi_input_mode="sum",
                       name="u"), "split y", dict(data=(2, 2, 4, 4), y=(2, 2, 2, 2))),
    (mx.sym.UpSampling(X, scale=2, sample_type="bilinear", num_args=2, num_filter=4, name="u"),
     "split co", dict(data=(2, 4, 4, 4))),
    # overlapping adaptive windows (6 rows to 4) that still split
    (mx.sym.contrib.AdaptiveAvgPooling2D(X, output_size=(4, 2), name="u"), "split y",
     dict(data=(2, 4, 6, 5))),
    (mx.sym.contrib.BilinearResize2D(X, height=7, width=6, align_corners=False, name="u"),
     "split c", dict(data=(2, 4, 3, 5))),
    (mx.sym.Correlation(X, Y, kernel_size=3, max_displacement=2, pad_size=2, name="u"),
     "reduce ch", dict(data=(2, 4, 5, 5), y=(2, 4, 5, 5))),
    # zeros, not -inf, pad Pooling_v1's max: a border share materialises them
    (mx.sym.Pooling_v1(X - 0.5, kernel=(3, 3), stride=(3, 3), pad=(2, 2), pool_type="max",
                       name="u"), "split x0", dict(data=(2, 2, 8, 8))),
    (mx.sym.Convolution_v1(X, kernel=(3, 3), pad=(1, 1), num_filter=4, name="u"), "split co",
     dict(data=(2, 4, 6, 6))),
])
def test_layer_shares(sym, strategy, shapes):
    verify(sym, 2, choose={"u": strategy}, **shapes)


@pytest.mark.parametrize("sym,strategy,shape", [
    (mx.sym.InstanceNorm(X, name="n"), "split i1", (2, 4, 3, 3)),
    (mx.sym.LRN(X, nsize=3, name="n"), "split y", (2, 4, 4, 4)),
    (mx.sym.SoftmaxActivation(X, mode="channel", name="n"), "split i2", (2, 4, 4, 4)),
    (mx.sym.BatchNorm_v1(X, fix_gamma=False, name="n"), "split i1", (2, 4, 3, 3)),
    (mx.sym.IdentityAttachKLSparseReg(mx.sym.sigmoid(X), name="n"), "split f", (4, 6)),
])
def test_float32_only_layers(sym, strategy, shape):
    """MXNet runs these in float32 only; their aux states (moving averages) are checked too."""
    verify(sym, 2, choose={"n": strategy}, dtypes=F32, data=shape)


def test_a_depthwise_convolution_splits_its_channels_at_every_cut():
    """Below the first cut the search sees half the channels with the original num_group:
    the description takes its per-group sizes from the attributes and the weight, so the
    second cut splits the channels too (it replicated the convolution, reading the other
    half of the input, while it took them from the part's channel counts)."""
    from tofu_mx.search.plan import plan_graph
    from tofu_mx.tdl.annotate import import_graph
    x = mx.sym.Convolution(mx.sym.var("data"), kernel=(3, 3), pad=(1, 1), num_filter=48,
                           num_group=48, name="dw")
    sym = mx.sym.MakeLoss(mx.sym.sum(x))
    shapes = dict(data=(1, 48, 4, 4))
    graph = import_graph(sym, dtypes={"data": "float64"}, **shapes)
    plan = plan_graph(graph, 4)
    (dw,) = [o for o in plan.ops if o.name == "dw"]
    assert [str(s) for s in dw.strategies] == ["split co", "split co"]
    _, report = partition_and_verify(sym, 4, **shapes)
    assert report.ok
