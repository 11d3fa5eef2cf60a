import mxnet as mx
import pytest

import tofu_mx
from nnvm_passes import import_symbol
from tofu_mx.summary import format_bytes


def test_summary_counts_by_hand():
    data = mx.sym.var("data")
    x = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), pad=(1, 1), name="c")  # 4*2*9+4
    x = mx.sym.BatchNorm(x, name="bn")                 # gamma, beta 4+4; aux 4+4
    x = mx.sym.FullyConnected(x, num_hidden=3, name="fc")  # 3*(4*5*5)+3
    out = mx.sym.SoftmaxOutput(x, name="softmax")
    s = tofu_mx.summarize(import_symbol(out, data=(2, 2, 5, 5)))
    assert s.op_counts == (("BatchNorm", 1), ("Convolution", 1), ("FullyConnected", 1),
                           ("SoftmaxOutput", 1))
    assert s.num_operators == 4
    assert s.param_count == 6
    assert s.param_elements == 76 + 8 + 303
    assert s.param_bytes == 4 * (76 + 8 + 303)
    assert s.aux_bytes == 4 * 8
    assert s.input_bytes == 4 * (2 * 2 * 5 * 5 + 2)       # data and softmax_label
    conv = bn = 2 * 4 * 5 * 5
    assert s.activation_bytes == 4 * (conv + bn + 4 + 4 + 2 * 3 + 2 * 3)  # bn mean/var hidden
    text = str(s)
    assert "Convolution x1" in text and "387 " in text


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.50 KiB"),
                                     (3 * 2**30, "3.00 GiB"), (5 * 2**50, "5120.00 TiB")])
def test_format_bytes(n, text):
    assert format_bytes(n) == text
