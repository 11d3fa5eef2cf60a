import mxnet as mx
import pytest

import tofu_mx  # noqa: F401  (sets MXNet's environment defaults before any operator runs)


@pytest.fixture
def cpus():
    """``cpus(k)``: k distinct CPU devices, which MXNet's executor treats as separate devices."""
    return lambda k: [mx.cpu(i) for i in range(k)]
