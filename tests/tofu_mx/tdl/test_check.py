"""Every description agrees with MXNet's own kernel on every one of its examples."""
import numpy as np
import pytest

import tofu_mx.ops  # noqa: F401
from tofu_mx.tdl import Sum, lam, registered
from tofu_mx.tdl.check import check_description, check_example
from tofu_mx.tdl.registry import Description, lookup

CASES = [(name, k) for name, d in sorted(registered().items()) if isinstance(d, Description)
         for k in range(len(d.examples))]


def test_the_builtin_set_is_large():
    assert len({name for name, _ in CASES}) >= 65 and len(CASES) >= 170


@pytest.mark.parametrize("name, k", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_description_matches_mxnet_kernel(name, k):
    desc = registered()[name]
    result = check_example(desc, desc.examples[k])
    assert result.ok, str(result)


def test_a_wrong_description_fails_its_check():
    """The check can fail: FullyConnected with the weight read transposed... of a square
    weight, so it still traces, and with the bias forgotten."""
    real = lookup("FullyConnected")

    def wrong(attrs, data, weight, bias=None):
        return lam(2, lambda b, o: Sum(lambda i: data[b, i] * weight[i, o]))
    fake = Description("FullyConnected", wrong, real.input_names, False,
                       (real.examples[0].__class__({"num_hidden": "3"}, ((2, 3), (3, 3), (3,))),),
                       True, 1e-4, 1e-5)
    results = check_description(fake)
    assert not results[0].ok and "output 0 differs" in str(results[0])


def test_an_operator_defined_on_part_of_the_line_is_checked_there():
    """arccosh is NaN on all of [-1, 1): its declared domain makes the check compare numbers."""
    desc = lookup("arccosh")
    assert desc.domain == (1.0, 3.0)
    result = check_example(desc, desc.examples[0])
    assert result.ok and np.isfinite(result.max_abs_err)


def test_every_described_output_is_compared():
    """A SliceChannel whose second output repeats the first piece fails its check."""
    import dataclasses
    real = lookup("SliceChannel")

    def wrong(attrs, data):
        pieces = real.fn(attrs, data)
        return (pieces[0],) * len(pieces)
    results = check_description(dataclasses.replace(real, fn=wrong))
    assert any(not r.ok and "output 1 differs" in str(r) for r in results)
