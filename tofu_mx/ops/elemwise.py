"""Elementwise, scalar and broadcast operators."""
import math

from tofu_mx.tdl import (absolute, erf, exp, lam, log, maximum, minimum, op, sigmoid,
                         softrelu, softsign, sqrt, tanh, where, greater)

_X = [(2, 3, 4)]
_XX = [(2, 3, 4), (2, 3, 4)]


def each(data, f):
    """out[i...] = f(data[i...]) over every axis of data."""
    return lam(data.ndim, lambda *i: f(data[i]))


_ACTIVATIONS = {"relu": lambda x: maximum(x, 0.0), "sigmoid": sigmoid, "tanh": tanh,
                "softrelu": softrelu, "softsign": softsign}


@op("Activation", examples=[({"act_type": a}, _X) for a in _ACTIVATIONS])
def activation(attrs, data):
    return each(data, _ACTIVATIONS[attrs["act_type"]])


def unary_op(name, f, examples=(({}, _X),), **kw):
    """Register ``name`` as out = f(data), elementwise (``kw``: as for :func:`op`)."""
    op(name, examples=list(examples), **kw)(lambda attrs, data: each(data, f))


unary_op("relu", lambda x: maximum(x, 0.0))
unary_op("sigmoid", sigmoid)
unary_op("tanh", tanh)
unary_op("exp", exp)
unary_op("log", log, domain=(0.1, 3.0))
unary_op("sqrt", sqrt, domain=(0.0, 3.0))
unary_op("negative", lambda x: -x)
unary_op("abs", absolute)
unary_op("square", lambda x: x * x)
unary_op("_copy", lambda x: x)
unary_op("BlockGrad", lambda x: x, gradient=False)
unary_op("Cast", lambda x: x, examples=[({"dtype": "float32"}, _X), ({"dtype": "float64"}, _X)])
# AMP's casts (mxnet.contrib.amp): amp_cast to its dtype (float inputs only), amp_multicast
# every input to the widest float type among them (the narrowest with cast_narrow)
unary_op("amp_cast", lambda x: x, examples=[({"dtype": "float16"}, _X),
                                            ({"dtype": "float32"}, _X, {0: "float16"})])


@op("amp_multicast", examples=[({"num_outputs": 2}, [(2, 3), (2, 3)], {0: "float16"}),
                               ({"num_outputs": 3, "cast_narrow": True}, [(4,), (2, 2), (3,)],
                                {1: "float16"})])
def amp_multicast(attrs, *data):
    """out_j = data_j, each in the common float type (each output its own variables)."""
    return tuple(lam(d.ndim, lambda *i, d=d: d[i], prefix=f"o{j}_") for j, d in enumerate(data))
# Training-mode Dropout multiplies by a random mask: still one element in, one out, so it
# splits like any elementwise op. The check runs it in inference mode (the identity).
unary_op("Dropout", lambda x: x, examples=[({"p": 0.5}, _X)], train=False, random=True,
         note="random in training; checked in inference mode, where it is the identity")


@op("clip", examples=[({"a_min": 0, "a_max": 0.5}, _X), ({"a_min": -0.2, "a_max": 6}, _X)])
def clip(attrs, data):
    lo, hi = float(attrs["a_min"]), float(attrs["a_max"])
    return each(data, lambda x: minimum(maximum(x, lo), hi))


_SELU_LAMBDA, _SELU_ALPHA = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717


@op("LeakyReLU", examples=[({"act_type": "leaky", "slope": 0.1}, _X), ({"act_type": "elu"}, _X),
                           ({"act_type": "selu"}, _X), ({"act_type": "gelu"}, _X),
                           ({"act_type": "prelu"}, [(2, 3, 4), (3,)]),
                           ({"act_type": "rrelu", "lower_bound": 0.1, "upper_bound": 0.3}, _X)],
    train=False, recompute=False,
    note="rrelu draws a random slope in training; checked in inference mode")
def leaky_relu(attrs, data, gamma=None):
    kind, slope = attrs.get("act_type", "leaky"), float(attrs.get("slope", 0.25))
    if kind == "prelu":
        # gamma holds one slope per channel (axis 1), or a single slope.
        g = (lambda i: gamma[i[1]]) if gamma.shape[0] > 1 else (lambda i: gamma[0])
        return lam(data.ndim, lambda *i: where(greater(data[i], 0.0), data[i], g(i) * data[i]))
    if kind == "rrelu":
        slope = (float(attrs.get("lower_bound", 0.125)) + float(attrs.get("upper_bound", 0.334))) / 2
    negative = {
        "leaky": lambda x: slope * x,
        "rrelu": lambda x: slope * x,
        "elu": lambda x: slope * (exp(x) - 1.0),
        "selu": lambda x: _SELU_LAMBDA * _SELU_ALPHA * (exp(x) - 1.0),
    }
    if kind == "gelu":
        return each(data, lambda x: 0.5 * x * (1.0 + erf(x / math.sqrt(2.0))))
    scale = _SELU_LAMBDA if kind == "selu" else 1.0
    return each(data, lambda x: where(greater(x, 0.0), scale * x, negative[kind](x)))


_BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "div": lambda a, b: a / b, "maximum": maximum, "minimum": minimum}


def elemwise_op(name, f, **kw):
    """Register ``name`` as out = f(lhs, rhs) of two inputs of one shape."""
    op(name, examples=[({}, _XX)], **kw)(
        lambda attrs, lhs, rhs: lam(lhs.ndim, lambda *i: f(lhs[i], rhs[i])))


for _name in ("add", "sub", "mul", "div"):
    elemwise_op(f"elemwise_{_name}", _BINARY[_name])
elemwise_op("_maximum", maximum)
elemwise_op("_minimum", minimum)


@op("add_n", examples=[({"num_args": 3}, [(2, 3)] * 3), ({"num_args": 1}, [(4,)])])
def add_n(attrs, *args):
    def total(*i):
        value = args[0][i]
        for a in args[1:]:
            value = value + a[i]
        return value
    return lam(args[0].ndim, total)


_SCALAR = {"_plus_scalar": lambda x, s: x + s, "_minus_scalar": lambda x, s: x - s,
           "_rminus_scalar": lambda x, s: s - x, "_mul_scalar": lambda x, s: x * s,
           "_div_scalar": lambda x, s: x / s, "_rdiv_scalar": lambda x, s: s / x,
           "_maximum_scalar": maximum, "_minimum_scalar": minimum,
           "_power_scalar": lambda x, s: x ** s}


def scalar_op(name, f, scalars=(0.7,), **kw):
    """Register ``name`` as out = f(data, scalar), one example per scalar."""
    op(name, examples=[({"scalar": s}, _X) for s in scalars], **kw)(
        lambda attrs, data: each(data, lambda x: f(x, float(attrs["scalar"]))))


for _name, _f in _SCALAR.items():
    scalar_op(_name, _f, scalars=(2.0,) if _name == "_power_scalar" else (0.7,))


def broadcast_index(tensor, out_index):
    """The element of ``tensor`` that broadcasting puts at output coordinate ``out_index``:
    shapes align on the right, and an axis of size 1 is read at 0."""
    skip = len(out_index) - tensor.ndim
    return tuple(0 if n == 1 else i for n, i in zip(tensor.shape, out_index[skip:]))


def broadcast_op(name, f, **kw):
    """Register ``name`` as out = f(lhs, rhs) with NumPy-style broadcasting."""
    examples = [({}, [(2, 3, 4), (2, 1, 4)]), ({}, [(1, 3, 1), (2, 3, 4)]), ({}, [(2, 3), (2, 3)])]

    @op(name, examples=examples, **kw)
    def describe(attrs, lhs, rhs):
        rank = max(lhs.ndim, rhs.ndim)
        return lam(rank, lambda *i: f(lhs[broadcast_index(lhs, i)], rhs[broadcast_index(rhs, i)]))


for _name, _f in _BINARY.items():
    broadcast_op(f"broadcast_{_name}", _f)
broadcast_op("broadcast_power", lambda a, b: a ** b)


@op("broadcast_to", examples=[({"shape": (2, 3, 4)}, [(2, 1, 4)]), ({"shape": (3, 2)}, [(1, 2)])])
def broadcast_to(attrs, data):
    rank = len(attrs["shape"])
    return lam(rank, lambda *i: data[broadcast_index(data, i)])
