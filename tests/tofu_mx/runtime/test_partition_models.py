"""partition() on real models, proven by running: every gluon model-zoo vision net, the
WResNet, the LSTM and the Transformer builders, at k = 2 to 8 CPU devices; outputs,
every gradient and every aux state equal the single-device graph's (float64, rtol 1e-4).

The default suite runs each zoo net at one k (every k is run by some net); the whole matrix
of zoo nets and k, about 20 minutes on 2 cores, is marked slow (``make test-slow``).

The zoo nets run at small images so the suite stays fast: their final fixed-size average
pool (7x7, 13x13 or 8x8 at full size) is made global, which is what it computes at full size.
"""
import json

import mxnet as mx
import pytest
from mxnet.gluon.model_zoo import vision

from tests.tofu_mx.runtime.helpers import blocks_one_after_another, partition_and_verify
from tofu_mx import models
from tofu_mx.search import SearchOptions

#: every converted input fetched again for the backward pass, even where keeping fits
REFETCH_ALL = SearchOptions(keep_share=0, keep_if_fits=False)
ZOO = {"alexnet": 64, "vgg11_bn": 32, "vgg16": 32, "resnet18_v1": 32, "resnet50_v1": 32,
       "resnet50_v2": 32, "densenet121": 32, "squeezenet1.0": 64, "inceptionv3": 75,
       "mobilenet1.0": 32, "mobilenetv2_1.0": 32}
DEVICES = [2, 3, 4, 5, 6, 7, 8]   # 3, 5, 6 and 7 split many axes unevenly


def zoo_symbol(name):
    with mx.name.NameManager():
        net = vision.get_model(name, pretrained=False, classes=10)
        net.cast("float64")
        sym = mx.sym.SoftmaxOutput(net(mx.sym.var("data", dtype="float64")), name="softmax")
    graph = json.loads(sym.tojson())
    for node in graph["nodes"]:
        if node["op"] == "Pooling" and node["attrs"].get("kernel") in ("(7, 7)", "(13, 13)",
                                                                       "(8, 8)"):
            node["attrs"]["global_pool"] = "True"
    return mx.sym.load_json(json.dumps(graph))


def batch_for(k):
    return 24 if k == 8 else 12


#: the k each zoo net runs at in the default suite
DEFAULT_K = {"alexnet": 8, "vgg11_bn": 6, "vgg16": 5, "resnet18_v1": 7, "resnet50_v1": 3,
             "resnet50_v2": 2, "densenet121": 3, "squeezenet1.0": 7, "inceptionv3": 4,
             "mobilenet1.0": 5, "mobilenetv2_1.0": 6}
assert set(DEFAULT_K.values()) == set(DEVICES) and set(DEFAULT_K) == set(ZOO)


@pytest.mark.parametrize("name,k", [
    pytest.param(name, k, marks=() if DEFAULT_K[name] == k else pytest.mark.slow)
    for name in ZOO for k in DEVICES])
def test_model_zoo(name, k):
    """At odd k the default plan: at these small sizes, the plan keeping the converted
    inputs fits (``keep_if_fits``); at even k every one is fetched again instead (the
    re-fetching plan with ``keep_share=0``), so the re-fetching rewrite is proven on every
    net too."""
    size, b = ZOO[name], batch_for(k)
    options = REFETCH_ALL if k % 2 == 0 else None
    ptd, report = partition_and_verify(zoo_symbol(name), k, data=(b, 3, size, size),
                                       softmax_label=(b,), options=options)
    assert report.ok and len(report.comparisons) > 10
    assert len(ptd.group2ctx) == k
    assert not ptd.fallbacks    # every operator runs as planned


BUILDERS = {
    "wresnet": lambda b: (models.wresnet(14, widen=1, num_classes=10),
                          models.input_shapes("wresnet", b, image_size=32)),
    "rnn": lambda b: (models.rnn(2, hidden=16, seq_len=3, vocab=24),
                      models.input_shapes("rnn", b, seq_len=3)),
    "transformer": lambda b: (models.transformer(2, 16, 4, seq_len=4, vocab=24),
                              models.input_shapes("transformer", b, seq_len=4)),
}


@pytest.mark.parametrize("k", [1] + DEVICES)
@pytest.mark.parametrize("name", list(BUILDERS))
def test_builders(name, k):
    sym, shapes = BUILDERS[name](batch_for(k))
    # The language models' Embedding makes float32 whatever the token dtype: they run in
    # float32, where their sums are short enough to agree within the tolerance.
    dtypes = {"data": "float64", "softmax_label": "float64"} if name == "wresnet" else {}
    options = REFETCH_ALL if k % 2 == 0 else None   # as test_model_zoo
    ptd, report = partition_and_verify(sym, k, dtypes=dtypes, options=options, **shapes)
    assert report.ok and not ptd.fallbacks
    if k == 1:   # one device: the original graph, names and all
        assert sorted(ptd.symbol.list_arguments()) == sorted(sym.list_arguments())


@pytest.mark.parametrize("refetch", [False, True])
def test_lstm_gates_made_apart_are_read_where_they_are_made(refetch, monkeypatch):
    """At k = 8 the LSTM's gates, stored one after another (not interleaved: the pass is
    turned off here), are made split on their columns and used split on the batch:
    each device's SliceChannel share holds whole gates, each made on another device. Kept
    for the backward pass, each gate is read from where it is made (no share joining the
    four to cut them again); re-fetched, the share runs (its readers would run again
    otherwise). Both verify."""
    from nnvm_passes.program import StepKind
    blocks_one_after_another(monkeypatch)
    sym = models.rnn(2, hidden=64, seq_len=3, vocab=50)
    ptd, report = partition_and_verify(sym, 8, dtypes={},     # float32, as test_builders
                                       options=SearchOptions(refetch=refetch,
                                                             keep_if_fits=False),
                                       **models.input_shapes("rnn", 64, seq_len=3))
    assert report.ok and not ptd.fallbacks
    gates = [i for i, n in enumerate(ptd.graph.nodes)
             if n.op == "SliceChannel" and n.name.endswith("_slice")]
    assert len(gates) == 6 and all(ptd.assignment.ops[i].shares[0].runs for i in gates)
    ran = {s.node for s in ptd.program.steps if s.kind is StepKind.SHARE and s.node in gates}
    assert ran == (set(gates) if refetch else set())
