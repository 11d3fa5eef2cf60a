import mxnet as mx
import numpy as np

from nnvm_passes import import_symbol
from tofu_mx import models
from tofu_mx.values import index_range, random_inputs


def test_index_inputs_get_integers_in_their_operators_range():
    g = import_symbol(models.rnn(1, 8, 3, vocab=17), **models.input_shapes("rnn", 64, seq_len=3))
    values = random_inputs(g, seed=0)
    tokens, labels = values["data"], values["softmax_label"]
    # The label reaches SoftmaxOutput through a Reshape: its range is still found.
    assert index_range(g, g.index("softmax_label")) == (0, 17)
    assert index_range(g, g.index("data")) == (0, 17)
    for v in (tokens, labels):
        assert v.dtype == np.float32 and (v == np.round(v)).all()
        assert v.min() >= 0 and v.max() <= 16 and len(np.unique(v)) > 10


def test_sequence_lengths_are_between_one_and_the_length():
    out = mx.sym.SequenceMask(mx.sym.var("x"), mx.sym.var("len"), use_sequence_length=True)
    g = import_symbol(out, x=(6, 40, 2), len=(40,))
    v = random_inputs(g, 0)["len"]
    assert v.min() >= 1 and v.max() <= 6


def test_weights_are_fan_in_scaled_and_aux_positive():
    g = import_symbol(models.wresnet(14, 1, 10), **models.input_shapes("wresnet", 2, image_size=32))
    values = random_inputs(g, 3)
    w = values["stage4_unit1_conv3_weight"]             # fan-in 512
    assert np.abs(w).max() <= np.sqrt(3 / 512) + 1e-7
    assert all(values[n].min() >= 0.5 for n in g.aux_names)
    assert values["final_bn_gamma"].min() >= 0.5


def test_seeded_and_deterministic():
    g = import_symbol(models.transformer(1, 8, 2, 3, 10), **models.input_shapes("transformer", 2,
                                                                                 seq_len=3))
    a, b, c = random_inputs(g, 5), random_inputs(g, 5), random_inputs(g, 6)
    assert all((a[k] == b[k]).all() for k in a)
    assert any((a[k] != c[k]).any() for k in a)
