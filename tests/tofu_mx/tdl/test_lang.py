"""The language: tracing, and malformed descriptions rejected at registration."""
import mxnet as mx
import numpy as np
import pytest

from tofu_mx import tdl
from tofu_mx.tdl.lang import Affine, FloorDiv, Mod, TDLError, TensorRef, Var, trace_lambda
from tofu_mx.tdl.registry import registered

EX = [({}, [(2, 3), (2, 3)])]


def test_index_algebra_stays_affine_where_it_can():
    x, dx = Var("x"), Var("dx")
    e = x * 2 + dx - 1
    assert isinstance(e, Affine) and dict(e.terms) == {"x": 2, "dx": 1} and e.const == -1
    assert isinstance(e // 2, FloorDiv) and isinstance(e % 3, Mod)
    assert (x // 1) is x
    with pytest.raises(TDLError, match="positive int constant"):
        x // 0
    with pytest.raises(TDLError, match="multiplied by an int constant"):
        x * 1.5


def test_tensor_access_checks_rank():
    t = TensorRef("data", 0, (2, 3))
    with pytest.raises(TDLError, match=r"'data' has rank 2 \(shape \(2, 3\)\) but is accessed "
                                       r"with 3 indices"):
        t[Var("a"), Var("b"), Var("c")]


def test_nested_lambdas_may_not_reuse_names():
    t = TensorRef("data", 0, (2, 3))
    with pytest.raises(TDLError, match=r"name\(s\) \['i'\] reused"):
        trace_lambda(lambda b, i: tdl.Sum(lambda i: t[b, i]))


def test_malformed_descriptions_are_rejected_at_registration():
    before = dict(registered())
    with pytest.raises(TDLError, match="'FullyConnected' already has a description.*replace=True"):
        tdl.op("FullyConnected", examples=[({"num_hidden": 2}, [(2, 3), (2, 3), (2,)])])
    with pytest.raises(TDLError, match="accessed with 1 indices"):
        @tdl.op("elemwise_add", examples=EX, replace=True)
        def wrong_rank(attrs, lhs, rhs):
            return lambda i, j: lhs[i] + rhs[i, j]
    with pytest.raises(TDLError, match=r"names its inputs \('data', 'w', 'b'\); MXNet's are "
                                       r"\('data', 'weight', 'bias'\)"):
        @tdl.op("FullyConnected", examples=[({"num_hidden": 2}, [(2, 3), (2, 3), (2,)])],
                replace=True)
        def unknown_input(attrs, data, w, b):
            return lambda n, o: tdl.Sum(lambda i: data[n, i] * w[o, i]) + b[o]
    with pytest.raises(TDLError, match=r"reused"):
        @tdl.op("elemwise_add", examples=EX, replace=True)
        def reused(attrs, lhs, rhs):
            return lambda i, j: tdl.Sum(lambda j: lhs[i, j]) + rhs[i, j]
    with pytest.raises(TDLError, match=r"output 0 has rank 2 .* lambda takes 1 variables"):
        @tdl.op("elemwise_add", examples=EX, replace=True)
        def wrong_arity(attrs, lhs, rhs):
            return lambda i: lhs[i, 0]
    with pytest.raises(TDLError, match="cannot infer the extent of reduction variable 'k'"):
        @tdl.op("elemwise_add", examples=EX, replace=True)
        def no_extent(attrs, lhs, rhs):
            return lambda i, j: tdl.Sum(lambda k: lhs[i, (j + k) % 3])
    with pytest.raises(TDLError, match="needs at least one example"):
        tdl.op("elemwise_add", examples=[], replace=True)
    with pytest.raises(TDLError, match=r"failed for attributes \{\} and input shapes "
                                       r"\[\(2, 3\), \(2, 3\)\]: KeyError: 'scale'"):
        @tdl.op("elemwise_add", examples=EX, replace=True)
        def crashes(attrs, lhs, rhs):
            scale = attrs["scale"]
            return lambda i, j: lhs[i, j] * scale
    with pytest.raises(TDLError, match=r"output 0.*cannot use NoneType None as a value"):
        @tdl.op("elemwise_add", examples=EX, replace=True)
        def bad_value(attrs, lhs, rhs):
            return lambda i, j: lhs[i, j] + None
    assert registered() == before, "a rejected description must not be registered"


def test_explicit_reduction_extent():
    t = TensorRef("data", 0, (5,))
    _, expr = trace_lambda(lambda x: tdl.Sum(lambda k: t.padded(0)[x + k - 1], 3))
    assert expr.extents == (3,)


class _Scale(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0] * 2 + in_data[1])

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.assign(in_grad[0], req[0], out_grad[0] * 2)
        self.assign(in_grad[1], req[1], out_grad[0].sum(axis=0))


@mx.operator.register("tofu_test_scale_add")
class _ScaleProp(mx.operator.CustomOpProp):
    def __init__(self):
        super().__init__(need_top_grad=True)

    def list_arguments(self):
        return ["data", "bias"]

    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        return _Scale()


def test_a_user_describes_a_custom_operator_once():
    from tofu_mx.tdl.check import check_description
    from tofu_mx.tdl.registry import unregister

    @tdl.op("Custom:tofu_test_scale_add", examples=[({}, [(4, 3), (3,)]), ({}, [(2, 5), (5,)])])
    def scale_add(attrs, data, bias):
        return lambda b, f: data[b, f] * 2.0 + bias[f]
    try:
        desc = registered()["Custom:tofu_test_scale_add"]
        assert all(r.ok for r in check_description(desc))
        # and it is analysed like any built-in operator
        from nnvm_passes import import_symbol
        from tofu_mx.tdl.annotate import analyse
        y = mx.sym.Custom(mx.sym.var("x"), mx.sym.var("b"), op_type="tofu_test_scale_add")
        (node,) = analyse(import_symbol(y, x=(4, 6), b=(6,)))
        assert node.status == "described"
        assert [s.describe() for s in node.strategies] == [
            "split b: inputs [split(0), replicated] -> outputs [split(0)]",
            "split f: inputs [split(1), split(0)] -> outputs [split(1)]"]
    finally:
        unregister("Custom:tofu_test_scale_add")


def test_interpreter_evaluates_nested_reductions():
    from tofu_mx.tdl.interpret import evaluate
    from tofu_mx.tdl.registry import Output, Traced
    t = TensorRef("x", 0, (2, 4))
    variables, expr = trace_lambda(lambda b, i: tdl.exp(t[b, i] - tdl.Max(lambda m: t[b, m]))
                                   / tdl.Sum(lambda j: tdl.exp(t[b, j] - tdl.Max(lambda k: t[b, k]))))
    traced = Traced("softmax", (t,), (Output(variables, expr, (2, 4)),),
                    {"b": 2, "i": 4, "m": 4, "j": 4, "k": 4})
    x = np.random.default_rng(0).standard_normal((2, 4))
    expected = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    np.testing.assert_allclose(evaluate(traced, [x])[0], expected, rtol=1e-12)
