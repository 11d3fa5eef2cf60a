"""Python custom operators nobody described, registered both ways MXNet's users write them:
a ``CustomOpProp`` whose ``__init__`` takes no keywords (as in MXNet's own examples) and one
that takes its attributes as keywords."""
import mxnet as mx
import numpy as np


class _Cube(mx.operator.CustomOp):
    """y = x ** 3 * scale"""

    def __init__(self, scale=1.0):
        super().__init__()
        self.scale = scale

    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0] ** 3 * self.scale)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.assign(in_grad[0], req[0], 3 * self.scale * in_data[0] ** 2 * out_grad[0])


class _Elementwise(mx.operator.CustomOpProp):
    def list_arguments(self):
        return ["data"]

    def list_outputs(self):
        return ["output"]

    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []

    def infer_type(self, in_type):
        return in_type, [in_type[0]], []


@mx.operator.register("tofu_test_cube")
class CubeProp(_Elementwise):
    """No keyword arguments: MXNet passing it any attribute kills the process."""

    def __init__(self):
        super().__init__(need_top_grad=True)

    def create_operator(self, ctx, shapes, dtypes):
        return _Cube()


@mx.operator.register("tofu_test_scaled_cube")
class ScaledCubeProp(_Elementwise):
    """Attributes as keywords (strings, as MXNet passes them)."""

    def __init__(self, scale="1.0"):
        super().__init__(need_top_grad=True)
        self.scale = float(scale)

    def create_operator(self, ctx, shapes, dtypes):
        return _Cube(self.scale)


class _Sign(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], mx.nd.sign(in_data[0]))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        grad = in_grad[0]
        self.assign(grad, req[0], mx.nd.zeros(grad.shape, ctx=grad.context, dtype=grad.dtype))


@mx.operator.register("tofu_test_sign")
class SignProp(_Elementwise):
    """No gradient reaches its input (it is zero)."""

    def __init__(self):
        super().__init__(need_top_grad=False)

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        return []

    def create_operator(self, ctx, shapes, dtypes):
        return _Sign()


def cube(x, **kw):
    return mx.sym.Custom(x, op_type="tofu_test_cube", **kw)


def scaled_cube(x, scale, **kw):
    return mx.sym.Custom(x, op_type="tofu_test_scaled_cube", scale=scale, **kw)


def sign(x, **kw):
    return mx.sym.Custom(x, op_type="tofu_test_sign", **kw)


class _Ramp(mx.operator.CustomOp):
    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def forward(self, is_train, req, in_data, out_data, aux):
        ramp = mx.nd.arange(int(mx.nd.prod(mx.nd.array(self.shape)).asscalar()))
        self.assign(out_data[0], req[0], ramp.reshape(self.shape).astype(out_data[0].dtype))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        pass


@mx.operator.register("tofu_test_ramp")
class RampProp(mx.operator.CustomOpProp):
    """Reads no tensor: 0, 1, 2, ... in the shape given as an attribute."""

    def __init__(self, shape, dtype="float32"):
        super().__init__(need_top_grad=False)
        self.shape = tuple(int(d) for d in shape.strip("()").split(",") if d.strip())
        self.dtype = dtype

    def list_arguments(self):
        return []

    def list_outputs(self):
        return ["output"]

    def infer_shape(self, in_shape):
        return [], [self.shape], []

    def infer_type(self, in_type):
        return [], [np.dtype(self.dtype).type], []

    def create_operator(self, ctx, shapes, dtypes):
        return _Ramp(self.shape)


def ramp(shape, dtype="float64", **kw):
    return mx.sym.Custom(op_type="tofu_test_ramp", shape=str(tuple(shape)), dtype=dtype, **kw)
