"""GluonCV's model zoo (models nobody on this project wrote) partitions with no fallback and
computes what it computes on one device: outputs, every gradient, aux states. By default each
model runs at one device count (2, 3 and 4 in turn over the list); ``-m slow`` runs every
model at every count."""
import pytest

from tests.tofu_mx.runtime.gluoncv_models import MODELS, SLOW
from tests.tofu_mx.runtime.helpers import partition_and_verify

COUNTS = (2, 3, 4)
ROTATED = [(name, COUNTS[i % len(COUNTS)]) for i, name in enumerate(sorted(MODELS))
           if name not in SLOW]
EVERY = [pytest.param(name, k, marks=pytest.mark.slow) for name in sorted(MODELS)
         for k in COUNTS if (name, k) not in ROTATED]


@pytest.mark.parametrize("name, k", ROTATED + EVERY)
def test_gluoncv_model_partitions_without_fallback_and_verifies(name, k):
    sym, shapes, dtype = MODELS[name]()
    ptd, report = partition_and_verify(sym, k, dtypes={n: dtype for n in shapes},
                                       oracle="float64" if dtype != "float64" else None,
                                       **shapes)
    assert report.ok, report
    assert not ptd.fallbacks, ptd.fallbacks
