"""The elementwise math family (tofu_mx/ops/math.py): the strategies its descriptions offer,
and a network of them partitioned and proven equal to one device."""
import json

import mxnet as mx
import pytest

import tofu_mx.ops  # noqa: F401
from tests.tofu_mx.ops.helpers import offered
from tests.tofu_mx.runtime.helpers import partition_and_verify
from tofu_mx.tdl import registered

a, b = mx.sym.var("a"), mx.sym.var("b")


@pytest.mark.parametrize("sym", [mx.sym.rint(a), mx.sym.arctan(a), mx.sym.logical_not(a),
                                 mx.sym.smooth_l1(a, scalar=2.0), mx.sym.hard_sigmoid(a),
                                 a % 3, 2 ** a, a >= 0.5],
                         ids=["rint", "arctan", "logical_not", "smooth_l1", "hard_sigmoid",
                              "mod_scalar", "rpower_scalar", "greater_equal_scalar"])
def test_unary_and_scalar_forms_split_every_axis(sym):
    assert offered(sym, a=(4, 6, 2)) == {"split i0", "split i1", "split i2"}


def test_broadcast_ops_split_every_output_axis():
    assert offered(mx.sym.broadcast_greater(a, b), a=(4, 6), b=(1, 6)) == {"split i0", "split i1"}
    assert offered(mx.sym.broadcast_hypot(a, b), parts=3, a=(6, 1), b=(1, 6)) == \
        {"split i0", "split i1"}
    assert offered(mx.sym.broadcast_mod(a, b), a=(2, 4, 6), b=(4, 1)) == \
        {"split i0", "split i1", "split i2"}


def test_same_shape_forms_from_symbol_arithmetic():
    assert offered(a % b, a=(4, 6), b=(4, 6)) == {"split i0", "split i1"}
    assert offered(a != b, parts=3, a=(6, 3), b=(6, 3)) == {"split i0", "split i1"}


def test_gradient_facts():
    """No gradient through comparisons, logic and rounding, as MXNet defines them; mod,
    hypot and the smooth functions keep theirs."""
    for name in ("broadcast_greater", "_equal", "_logical_xor_scalar", "logical_not", "rint",
                 "round", "fix", "sign"):
        assert registered()[name].facts.gradient is False, name
    for name in ("broadcast_mod", "_hypot", "_rmod_scalar", "smooth_l1", "hard_sigmoid",
                 "erfinv", "_grad_add"):
        assert registered()[name].facts.gradient is True, name


def math_net():
    data, thr = mx.sym.var("data"), mx.sym.var("thr")    # (n, 6), (1, 12)
    h = mx.sym.FullyConnected(data, num_hidden=12, name="fc")
    gate = mx.sym.broadcast_greater(h, thr)                        # 0/1, no gradient
    smooth = mx.sym.sin(h) * 2 + 1 + mx.sym.smooth_l1(h, scalar=2.0) + h ** 2
    periodic = (h % 3) * mx.sym.hard_sigmoid(h, alpha=1.5, beta=0.25) + 2 ** h
    special = mx.sym.broadcast_hypot(h, thr) + mx.sym.arctan(h) - mx.sym.rint(h * 4) / 4
    masked = (h > 0) * mx.sym.cosh(h) + (smooth < periodic) * mx.sym.erf(h)
    return gate * smooth + periodic + special + masked + mx.sym.broadcast_mod(h, thr + 2)


@pytest.mark.parametrize("k", [2, 3])
def test_math_net_partitions_exactly(k):
    sym = math_net()
    ops = {n["op"] for n in json.loads(sym.tojson())["nodes"]}
    assert {"_mod_scalar", "_rpower_scalar", "_greater_scalar", "_lesser", "rint",
            "broadcast_greater", "broadcast_mod"} <= ops
    ptd, report = partition_and_verify(sym, k, data=(12, 6), thr=(1, 12))
    assert report.ok, report
    assert not ptd.fallbacks
    checked = {c.name for c in report.comparisons}
    assert {"grad fc_weight", "grad fc_bias", "grad data"} <= checked, checked
