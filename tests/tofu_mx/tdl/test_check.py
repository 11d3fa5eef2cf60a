"""Every description agrees with MXNet's own kernel on every one of its examples."""
import numpy as np
import pytest

import tofu_mx.ops  # noqa: F401
from tofu_mx.tdl import Sum, lam, registered
from tofu_mx.tdl.check import (check_description, check_example, check_loss_gradients,
                               check_shares)
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


LOSS_CASES = [(name, k) for name, k in CASES if registered()[name].facts.loss]


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("name, k", LOSS_CASES, ids=[f"{n}-{k}" for n, k in LOSS_CASES])
def test_loss_head_shares_give_the_whole_gradient(name, k, parts):
    """A loss head's gradient divides by counts of what its kernel sees (the batch, the values
    per sample, the positions): every share the search may run computes the whole operator's
    gradient over its box."""
    desc = registered()[name]
    results = check_loss_gradients(desc, desc.examples[k], parts)
    assert all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


@pytest.mark.parametrize("name", ["LinearRegressionOutput", "SoftmaxOutput"])
def test_the_gradient_check_fails_without_the_rescaling_hook(name):
    import dataclasses
    desc = dataclasses.replace(registered()[name], shard=None)
    bad = [r for ex in desc.examples for r in check_loss_gradients(desc, ex, 3) if not r.ok]
    assert bad and "MISMATCH" in str(bad[0])


def test_every_loss_head_has_examples_that_split_off_the_batch():
    """The check above proves something only where some share splits a non-batch axis."""
    for name in {n for n, _ in LOSS_CASES}:
        desc = registered()[name]
        splits = {r.strategy for ex in desc.examples for r in check_loss_gradients(desc, ex, 2)}
        assert splits - {"split i0"}, name


@pytest.mark.parametrize("name, k", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_every_share_computes_the_whole_operator_there(name, k):
    """Each share the search may run (every strategy in 2 and 3 parts), run through MXNet's
    kernel as the rewrite runs it, gives the whole operator's outputs over its boxes."""
    desc = registered()[name]
    results = [r for parts in (2, 3) for r in check_shares(desc, desc.examples[k], parts)]
    assert all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


def test_the_share_check_fails_on_a_hook_that_forgets_the_input_size():
    """BilinearResize2D shrinking 9 rows to 3 without aligned corners never reads rows 0, 3
    and 6: a share given only the rows it reads resizes another image (seen by the Gluon
    fuzzer). Its hook reads every row; without that the check fails."""
    import dataclasses

    from tofu_mx.tdl import Shard

    def forgetful(attrs, ctx):
        out = ctx.outputs[0]
        return Shard() if all(out[a] == (0, ctx.output_shapes[0][a] - 1) for a in (2, 3)) \
            else None
    desc = dataclasses.replace(registered()["_contrib_BilinearResize2D"], shard=forgetful)
    bad = [r for ex in desc.examples for r in check_shares(desc, ex, 2) if not r.ok]
    assert bad and "MISMATCH" in str(bad[0])


class _Centre(__import__("mxnet").operator.CustomOp):
    """y = x - mean(x, axis=1)"""

    def forward(self, is_train, req, in_data, out_data, aux):
        x = in_data[0]
        self.assign(out_data[0], req[0], x - x.mean(axis=1, keepdims=True))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        g = out_grad[0]
        self.assign(in_grad[0], req[0], g - g.mean(axis=1, keepdims=True))


def _register_centre():
    import mxnet as mx

    @mx.operator.register("tofu_test_centre")
    class CentreProp(mx.operator.CustomOpProp):
        def __init__(self):
            super().__init__(need_top_grad=True)

        def list_arguments(self):
            return ["data"]

        def infer_shape(self, in_shape):
            return in_shape, [in_shape[0]], []

        def create_operator(self, ctx, shapes, dtypes):
            return _Centre()


def test_a_description_contradicting_its_kernel_is_refused_at_registration():
    """Seen: a custom operator described as y = x for a kernel computing x - mean(x, axis=1)
    was registered without complaint (README says examples are checked at registration),
    and at batch 1 a plan split its row axis. The right description registers."""
    from tofu_mx.tdl import Sum, lam, op
    from tofu_mx.tdl.lang import TDLError
    from tofu_mx.tdl.registry import unregister
    _register_centre()
    with pytest.raises(TDLError, match="contradicts MXNet's kernel on its example .*"
                                       r"\[\(2, 3\)\]: output 0 differs"):
        op("Custom:tofu_test_centre", examples=[({}, [(2, 3)])])(
            lambda attrs, data: lam(2, lambda b, i: data[b, i]))
    assert lookup("Custom:tofu_test_centre") is None
    try:
        op("Custom:tofu_test_centre", examples=[({}, [(2, 3)])])(
            lambda attrs, data: lam(2, lambda b, i: data[b, i] - Sum(
                lambda j: data[b, j]) / data.shape[1]))
        assert lookup("Custom:tofu_test_centre") is not None
    finally:
        unregister("Custom:tofu_test_centre")
