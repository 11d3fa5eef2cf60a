"""Models nobody on this project wrote partition with no fallback (every operator they use is
described) and compute what they compute on one device: outputs, every gradient, aux states,
in float64, or in float32 judged against a float64 oracle (BERT: MXNet's interleaved attention
kernels have no float64 on CPU; the fused RNN layers as users run them), over 2, 3 and 4 CPU
devices (6 and 8 with ``-m slow``)."""
import pytest

from tests.tofu_mx.runtime.helpers import partition_and_verify
from tests.tofu_mx.runtime.real_models import FLOAT32_ONLY, MODELS
from tofu_mx.tdl.annotate import analyse, import_graph


@pytest.fixture(scope="module")
def built():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = MODELS[name]()
        return cache[name]
    return get


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_operator_is_described(name, built):
    sym, shapes, _, dtype = built(name)
    graph = import_graph(sym, dtypes={n: dtype for n in shapes}, **shapes)
    found = {r.op: r.status for r in analyse(graph)}
    assert all(s in ("described", "opaque") for s in found.values()), found


@pytest.mark.parametrize("k", [2, 3, 4, pytest.param(6, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_partitions_without_fallback_and_verifies(name, k, built):
    sym, shapes, arrays, dtype = built(name)
    ptd, report = partition_and_verify(sym, k, arrays=arrays, dtypes={n: dtype for n in shapes},
                                       oracle=None if name in FLOAT32_ONLY or dtype == "float64"
                                       else "float64",
                                       **shapes)
    assert report.ok, report
    assert not ptd.fallbacks, ptd.fallbacks
