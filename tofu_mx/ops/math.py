"""Elementwise math: unary functions (trigonometric, hyperbolic, rounding, special), the
comparisons and logic operators, hypot and mod, in each form MXNet has: public, broadcast,
same-shape (``_equal``, which Symbol arithmetic produces) and scalar (``_equal_scalar``).

``_plus``, ``_minus``, ``_mul`` and ``_div`` are MXNet aliases of ``elemwise_add`` ... (see
:mod:`tofu_mx.ops.elemwise`), so they need no description of their own.

Comparisons and logic give 1.0 or 0.0, and MXNet gives them no gradient (``MakeZeroGradNodes``),
nor the rounding functions and ``sign`` (whose gradient is zero everywhere): they are declared
``gradient=False``. The kernel check draws inputs uniform in [-1, 1), so two inputs are
never equal nor zero there: equality and logic are checked on one outcome only (``1.0`` for
``logical_and``, ``0.0`` for ``equal``); the logic operators' scalar forms are checked with
a zero scalar too.
"""
import math

from tofu_mx.ops.elemwise import broadcast_op, each, elemwise_op, scalar_op, unary_op
from tofu_mx.tdl import (absolute, arccos, arccosh, arcsin, arcsinh, arctan, arctanh, cbrt,
                         ceil, cos, cosh, equal, erf, erfinv, expm1, floor, gamma, gammaln,
                         greater, greater_equal, less, less_equal, log1p, log2, log10, maximum,
                         minimum, not_equal, op, reciprocal, rint, round_, rsqrt, sign, sin, sinh,
                         softsign, sqrt, tan, trunc, where)

_X = [(2, 3, 4)]

# --- unary functions --------------------------------------------------------------------------

unary_op("arccos", arccos)
unary_op("arcsin", arcsin)
unary_op("arctan", arctan)
unary_op("arctanh", arctanh)
unary_op("arcsinh", arcsinh)
unary_op("arccosh", arccosh, domain=(1.0, 3.0))
unary_op("sin", sin)
unary_op("cos", cos)
unary_op("tan", tan)
unary_op("sinh", sinh)
unary_op("cosh", cosh)
unary_op("degrees", lambda x: x * (180.0 / math.pi))
unary_op("radians", lambda x: x * (math.pi / 180.0))
unary_op("cbrt", cbrt)
unary_op("rcbrt", lambda x: reciprocal(cbrt(x)))
unary_op("reciprocal", reciprocal)
unary_op("rsqrt", rsqrt, domain=(0.1, 3.0))
unary_op("log2", log2, domain=(0.1, 3.0))
unary_op("log10", log10, domain=(0.1, 3.0))
unary_op("log1p", log1p)
unary_op("expm1", expm1)
unary_op("erf", erf)
unary_op("erfinv", erfinv)
unary_op("gamma", gamma)
unary_op("gammaln", gammaln)
unary_op("softsign", softsign)

# Rounding: no gradient in MXNet. round takes halves away from zero (C's round); fix is
# trunc; rint takes halves *down* (rint(2.5) = 2, rint(-0.5) = -1), not to the even neighbour as
# NumPy's does; the language's rint means MXNet's.
unary_op("floor", floor, gradient=False)
unary_op("ceil", ceil, gradient=False)
unary_op("trunc", trunc, gradient=False)
unary_op("fix", trunc, gradient=False)
unary_op("round", round_, gradient=False)
unary_op("rint", rint, gradient=False)
unary_op("sign", sign, gradient=False)    # its gradient is defined, as zero
unary_op("logical_not", lambda x: where(equal(x, 0.0), 1.0, 0.0), gradient=False)


@op("hard_sigmoid", examples=[({}, _X), ({"alpha": 1.5, "beta": 0.25}, _X)])
def hard_sigmoid(attrs, data):
    """clip(alpha * x + beta, 0, 1); the defaults (0.2, 0.5) never clip in [-1, 1)."""
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    return each(data, lambda x: minimum(maximum(alpha * x + beta, 0.0), 1.0))


@op("smooth_l1", examples=[({"scalar": 2.0}, _X), ({"scalar": 1.0}, _X), ({"scalar": 3.0}, _X)])
def smooth_l1(attrs, data):
    """sigma = scalar: 0.5 (sigma x)^2 where |x| < 1 / sigma^2, else |x| - 0.5 / sigma^2."""
    s2 = float(attrs["scalar"]) ** 2
    return each(data, lambda x: where(greater(x, 1.0 / s2), x - 0.5 / s2,
                                      where(less(x, -1.0 / s2), -x - 0.5 / s2,
                                            0.5 * s2 * x * x)))


# --- binary functions, in every form ----------------------------------------------------------

def _indicator(cmp):
    return lambda a, b: where(cmp(a, b), 1.0, 0.0)


def _truth(x):
    """1.0 where x is nonzero (NaN included, as in C), else 0.0."""
    return where(equal(x, 0.0), 0.0, 1.0)


def _mod(a, b):
    """MXNet's mod: the remainder takes the divisor's sign (floored, as Python's %), and a
    zero divisor gives 0."""
    return where(equal(b, 0.0), 0.0, a - b * floor(a / b))


def _hypot(a, b):
    return sqrt(a * a + b * b)


_LOGIC = {"equal": _indicator(equal), "not_equal": _indicator(not_equal),
          "greater": _indicator(greater), "greater_equal": _indicator(greater_equal),
          "lesser": _indicator(less), "lesser_equal": _indicator(less_equal),
          "logical_and": lambda a, b: _truth(a) * _truth(b),
          "logical_or": lambda a, b: maximum(_truth(a), _truth(b)),
          "logical_xor": lambda a, b: absolute(_truth(a) - _truth(b))}
_ARITHMETIC = {"hypot": _hypot, "mod": _mod}

for _name, _f in _LOGIC.items():
    broadcast_op(f"broadcast_{_name}", _f, gradient=False)
    elemwise_op(f"_{_name}", _f, gradient=False)
    scalar_op(f"_{_name}_scalar", _f, gradient=False,
              scalars=(0.0, 0.75) if "logical" in _name else (0.25, -0.5))
for _name, _f in _ARITHMETIC.items():
    broadcast_op(f"broadcast_{_name}", _f)
    elemwise_op(f"_{_name}", _f)

elemwise_op("_power", lambda a, b: a ** b)     # NaN for a negative base, in both
elemwise_op("_grad_add", lambda a, b: a + b)   # the sum the backward pass builds

# Scalars exact in float32 (MXNet casts the scalar to the input's type), so that a mod's
# wrap-around falls at the same place in both.
scalar_op("_hypot_scalar", _hypot, scalars=(0.75, -2.0))
scalar_op("_mod_scalar", _mod, scalars=(0.75, -0.625, 3.0))
scalar_op("_rmod_scalar", lambda x, s: _mod(s, x), scalars=(0.75, -2.5))
# (lift: a value expression has no __rpow__, so a float cannot be the base of **)
scalar_op("_rpower_scalar", lambda x, s: s ** x, scalars=(2.0, 0.5))
