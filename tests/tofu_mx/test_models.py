import json
import time

import mxnet as mx
import pytest
from mxnet.gluon.model_zoo import vision

import tofu_mx
from nnvm_passes import import_symbol
from tofu_mx import models
from tofu_mx.models.wresnet import BASE_FILTERS, UNITS_BY_DEPTH


def params_of(sym, shapes):
    return sum(n.outputs[0].size for n in import_symbol(sym, **shapes).variables("param"))


def wresnet_params(depth, widen, classes):
    """Closed form, written from the architecture, not from the builder's code."""
    f = [c * widen for c in BASE_FILTERS]
    total = 2 * 3 + f[0] * 3 * 7 * 7 + 2 * f[0]          # bn_data, conv0, stem bn
    in_ch = f[0]
    for stage, units in enumerate(UNITS_BY_DEPTH[depth]):
        out, inner = f[stage + 1], f[stage + 1] // 4
        for unit in range(units):
            total += 2 * in_ch + in_ch * inner + 2 * inner + inner * inner * 9
            total += 2 * inner + inner * out
            total += in_ch * out if unit == 0 else 0        # projection shortcut
            in_ch = out
    return total + 2 * in_ch + in_ch * classes + classes   # final bn, fc


@pytest.mark.parametrize("depth, widen", [(14, 1), (50, 1), (50, 3), (101, 2)])
def test_wresnet_parameter_count(depth, widen):
    sym = models.wresnet(depth, widen, num_classes=10)
    shapes = models.input_shapes("wresnet", 1, image_size=32)
    assert params_of(sym, shapes) == wresnet_params(depth, widen, 10)


def test_wresnet50_widen1_has_the_parameters_of_gluons_resnet50_v2():
    """Same architecture (pre-activation bottlenecks, BatchNorm on the input): same size."""
    with mx.name.NameManager():
        gluon = vision.get_model("resnet50_v2", classes=100)(mx.sym.var("data"))
    shapes = models.input_shapes("wresnet", 1)
    assert params_of(models.wresnet(50, 1, 100), shapes) == params_of(gluon, {"data": shapes["data"]})


@pytest.mark.parametrize("layers, hidden, seq_len, vocab", [(1, 8, 2, 11), (3, 16, 5, 40)])
def test_rnn_parameter_count(layers, hidden, seq_len, vocab):
    sym = models.rnn(layers, hidden, seq_len, vocab)
    expected = vocab * hidden + layers * (8 * hidden * hidden + 8 * hidden) + hidden * vocab + vocab
    assert params_of(sym, models.input_shapes("rnn", 2, seq_len=seq_len)) == expected


def test_rnn_shares_each_layers_weights_across_time_steps():
    g = import_symbol(models.rnn(2, 8, 6, 10), **models.input_shapes("rnn", 2, seq_len=6))
    consumers = g.consumers()
    w = g.index("l1_h2h_weight")
    assert len(consumers[w]) == 5  # every step but the first (zero initial state)
    assert len(consumers[g.index("l1_i2h_weight")]) == 6


@pytest.mark.parametrize("layers, units, heads, seq_len, vocab, hidden",
                         [(1, 8, 2, 3, 13, None), (2, 16, 4, 5, 20, 24)])
def test_transformer_parameter_count(layers, units, heads, seq_len, vocab, hidden):
    sym = models.transformer(layers, units, heads, seq_len, vocab, hidden=hidden)
    h = hidden or 4 * units
    per_layer = 4 * (units * units + units) + 2 * 2 * units + units * h + h + h * units + units
    expected = vocab * units + seq_len * units + layers * per_layer + units * vocab + vocab
    assert params_of(sym, models.input_shapes("transformer", 2, seq_len=seq_len)) == expected


def test_builders_are_deterministic():
    for build in (lambda: models.wresnet(26, 2), lambda: models.rnn(2, 8, 3, 10),
                  lambda: models.transformer(2, 8, 2, 3, 10, dropout=0.1)):
        assert json.loads(build().tojson()) == json.loads(build().tojson())


def test_paper_sizes_build_and_import_without_allocating():
    """WResNet-152-W10 and LSTM-10-8K hold ~30 GiB and ~10 GiB of weights: more than this
    machine's memory, so these only pass if nothing is allocated."""
    start = time.perf_counter()
    big = tofu_mx.summarize(import_symbol(models.wresnet(152, 10),
                                          **models.input_shapes("wresnet", 8)))
    lstm = tofu_mx.summarize(import_symbol(models.rnn(10, 8192, 20, 10000),
                                           **models.input_shapes("rnn", 8, seq_len=20)))
    assert big.param_bytes > 20 * 2**30
    assert lstm.param_elements == (10000 * 8192 * 2 + 10000
                                   + 10 * (8 * 8192 * 8192 + 8 * 8192))
    assert time.perf_counter() - start < 120


@pytest.mark.parametrize("call, message", [
    (lambda: models.wresnet(depth=34), r"depth must be one of \[14, 26, 50, 101, 152\], got 34"),
    (lambda: models.wresnet(widen=0), "widen must be a positive int, got 0"),
    (lambda: models.wresnet(num_classes=2.5), "num_classes must be a positive int"),
    (lambda: models.rnn(cell="gru"), r"cell must be one of \('lstm',\), got 'gru'"),
    (lambda: models.rnn(hidden=-4), "rnn hidden must be a positive int, got -4"),
    (lambda: models.rnn(dropout=1.0), r"dropout must be in \[0, 1\)"),
    (lambda: models.transformer(units=10, heads=4), r"units \(10\) must be a multiple of heads"),
    (lambda: models.transformer(seq_len=0), "seq_len must be a positive int, got 0"),
    (lambda: models.input_shapes("rnn", 2), "needs seq_len"),
    (lambda: models.input_shapes("vgg", 2), "unknown model 'vgg'"),
])
def test_bad_builder_arguments(call, message):
    with pytest.raises(tofu_mx.InvalidArgumentError, match=message):
        call()
