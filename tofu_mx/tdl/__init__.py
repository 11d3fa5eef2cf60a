"""TDL: describe an operator's semantics once; its partition strategies are derived.

Write a description as a function of the attributes and inputs that returns a lambda over
output coordinates, and register it with examples (attributes and input shapes) that check it
against MXNet's kernel::

    from tofu_mx import tdl

    @tdl.op("FullyConnected", examples=[({"num_hidden": 4}, [(2, 3), (4, 3), (4,)])])
    def fully_connected(attrs, data, weight, bias=None):
        ...
        return lambda b, o: tdl.Sum(lambda i: data[b, i] * weight[o, i]) + bias[o]

See :mod:`tofu_mx.tdl.lang` for the language, :mod:`tofu_mx.tdl.analysis` for how strategies
are derived, and :mod:`tofu_mx.ops` for the built-in descriptions.
"""
from tofu_mx.tdl.lang import (Max, Min, Sum, TDLError, absolute, arccos, arccosh, arcsin,
                              arcsinh, arctan, arctanh, cbrt, ceil, cos, cosh, depends, equal,
                              erf, erfinv, exp, expm1, floor, gamma, gammaln, greater,
                              greater_equal, in_range, index, lam, less, less_equal, log,
                              log1p, log2, log10, maximum, minimum, not_equal, reciprocal, relu,
                              rint, round_, rsqrt, sigmoid, sign, sin, sinh, softrelu, softsign,
                              sqrt, square, tan, tanh, trunc, where)
from tofu_mx.tdl.registry import (Attrs, Description, OpFacts, Opaque, Shard, ShardContext,
                                  lookup, op, opaque, registered)

__all__ = ["Attrs", "Description", "Max", "Min", "OpFacts", "Opaque", "Shard", "ShardContext",
           "Sum", "TDLError", "absolute", "arccos", "arccosh", "arcsin", "arcsinh", "arctan",
           "arctanh", "cbrt", "ceil", "cos", "cosh", "depends", "equal", "erf", "erfinv", "exp",
           "expm1", "floor", "gamma", "gammaln", "greater", "greater_equal", "in_range", "index",
           "lam", "less", "less_equal", "log", "log1p", "log2", "log10", "lookup", "maximum",
           "minimum", "not_equal", "op", "opaque", "reciprocal", "registered", "relu", "rint",
           "round_", "rsqrt", "sigmoid", "sign", "sin", "sinh", "softrelu", "softsign", "sqrt",
           "square", "tan", "tanh", "trunc", "where"]
