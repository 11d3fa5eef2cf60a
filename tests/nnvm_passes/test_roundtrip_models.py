"""Import -> export is exact on every gluon model-zoo vision net and on the three builders:
the JSON graphs are equal, and binding both gives bit-identical outputs."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon.model_zoo import vision

from nnvm_passes import export_symbol, import_symbol
from tofu_mx import models
from tofu_mx.values import random_inputs

ZOO = {
    "alexnet": 224, "vgg11_bn": 224, "vgg16": 224, "resnet18_v1": 224, "resnet50_v1": 224,
    "resnet50_v2": 224, "densenet121": 224, "squeezenet1.0": 224, "inceptionv3": 299,
    "mobilenet1.0": 224, "mobilenetv2_1.0": 224,
}


def zoo_symbol(name):
    with mx.name.NameManager():
        return vision.get_model(name, pretrained=False)(mx.sym.var("data"))


BUILDERS = {
    "wresnet": (lambda: models.wresnet(50, widen=2, num_classes=10),
                models.input_shapes("wresnet", 2, image_size=32)),
    "rnn": (lambda: models.rnn(num_layers=2, hidden=16, seq_len=4, vocab=30),
            models.input_shapes("rnn", 3, seq_len=4)),
    "transformer": (lambda: models.transformer(2, units=16, heads=4, seq_len=5, vocab=30,
                                               dropout=0.1),
                    models.input_shapes("transformer", 2, seq_len=5)),
}


def assert_round_trip(sym, shapes):
    before = sym.tojson()
    graph = import_symbol(sym, **shapes)
    exported = export_symbol(graph)
    assert json.loads(exported.tojson()) == json.loads(sym.tojson())
    assert exported.tojson() == sym.tojson()  # byte for byte, too
    assert sym.tojson() == before, "import must not modify the caller's symbol"
    values = random_inputs(graph, seed=1)
    outputs = []
    for s in (sym, exported):
        exe = s.simple_bind(mx.cpu(), grad_req="null",
                            **{n.name: n.outputs[0].shape for n in graph.variables()
                               if n.kind != "aux"})
        for name, arr in list(exe.arg_dict.items()) + list(exe.aux_dict.items()):
            arr[:] = values[name]
        outputs.append([o.asnumpy() for o in exe.forward(is_train=False)])
    for a, b in zip(*outputs):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", list(ZOO))
def test_model_zoo_round_trip(name):
    size = ZOO[name]
    assert_round_trip(zoo_symbol(name), {"data": (1, 3, size, size)})


@pytest.mark.parametrize("name", list(BUILDERS))
def test_builder_round_trip(name):
    build, shapes = BUILDERS[name]
    assert_round_trip(build(), shapes)
