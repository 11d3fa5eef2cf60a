"""Evaluate a traced description with NumPy over every output coordinate (the reference
oracle the kernel check compares MXNet's operators with).

Every index variable gets one axis of a broadcast grid: the output's variables first, then
each reduction's, so an expression evaluates to an array that broadcasts against the grid and
a reduction sums (or maxes) over its own axes. Values are computed in float64.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from tofu_mx.tdl.lang import (Access, Affine, Bin, Const, DataIndex, Depends, Expr,
                              FloorDiv, IAdd, Index, IndexValue, InRange, IScale, Mod, Reduce,
                              TDLError, Unary, Where)
from tofu_mx.tdl.registry import Traced, walk

def _gammaln(v: float) -> float:
    """log |gamma(v)|, inf at the poles (0, -1, -2, ...), NaN for NaN."""
    if math.isnan(v):
        return math.nan
    return math.inf if v <= 0 and v == math.floor(v) else math.lgamma(v)


def _erfinv(y: float) -> float:
    """The inverse of erf by Newton's method from a close first guess (NumPy has none)."""
    if not -1.0 < y < 1.0:
        return math.copysign(math.inf, y) if abs(y) == 1.0 else math.nan
    a = 0.147
    ln = math.log(1.0 - y * y)
    t = 2.0 / (math.pi * a) + ln / 2.0
    x = math.copysign(math.sqrt(math.sqrt(t * t - ln / a) - t), y)
    for _ in range(4):
        x -= (math.erf(x) - y) / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
    return x
_BIN = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "pow": np.power,
        "max": np.maximum, "min": np.minimum}
_CMP = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
        "==": np.equal, "!=": np.not_equal}
_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}
_NEUTRAL = {"sum": 0.0, "max": -np.inf, "min": np.inf}


_UNARY = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "abs": np.abs,
    "erf": np.vectorize(math.erf, otypes=[np.float64]),
    "softrelu": lambda x: np.log1p(np.exp(x)), "softsign": lambda x: x / (1.0 + np.abs(x)),
    "square": np.square, "floor": np.floor, "sign": np.sign, "log1p": np.log1p,
    "expm1": np.expm1, "sin": np.sin, "cos": np.cos, "tan": np.tan, "arcsin": np.arcsin,
    "arccos": np.arccos, "arctan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "arcsinh": np.arcsinh, "arccosh": np.arccosh, "arctanh": np.arctanh, "ceil": np.ceil,
    # MXNet's round takes halves away from zero; its rint takes them down (rint(2.5) = 2,
    # rint(-0.5) = -1), unlike NumPy's half-to-even
    "round": lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5), "rint": lambda x: np.ceil(x - 0.5),
    "trunc": np.trunc, "log2": np.log2, "log10": np.log10, "cbrt": np.cbrt,
    "reciprocal": lambda x: 1.0 / x,
    "gamma": np.vectorize(math.gamma, otypes=[np.float64]),
    "gammaln": np.vectorize(_gammaln, otypes=[np.float64]),
    "erfinv": np.vectorize(lambda v: _erfinv(v), otypes=[np.float64]),
}


class _Grid:
    def __init__(self, axes: dict[str, int], extents: dict[str, int], inputs,
                 within: Mapping[str, tuple[int, int]]):
        self.axes, self.extents, self.inputs, self.within = axes, extents, inputs, within
        self.ndim = len(axes)
        # Where the value being computed is used: a where() branch is computed everywhere but
        # only its selected positions must read inside their tensors.
        self.active: np.ndarray | bool = True

    def var(self, name: str) -> np.ndarray:
        shape = [1] * self.ndim
        shape[self.axes[name]] = self.extents[name]
        return np.arange(self.extents[name], dtype=np.int64).reshape(shape)

    def index(self, i: Index) -> np.ndarray:
        if isinstance(i, Affine):
            out = np.full([1] * self.ndim, i.const, dtype=np.int64)
            for name, coeff in i.terms:
                out = out + coeff * self.var(name)
            return out
        if isinstance(i, IAdd):
            return sum((self.index(p) for p in i.parts), np.zeros([1] * self.ndim, np.int64))
        if isinstance(i, IScale):
            return self.index(i.inner) * i.factor
        if isinstance(i, FloorDiv):
            return np.floor_divide(self.index(i.inner), i.divisor)
        if isinstance(i, Mod):
            return np.mod(self.index(i.inner), i.modulus)
        if isinstance(i, DataIndex):
            return np.floor(self.value(i.value)).astype(np.int64)
        raise TDLError(f"unknown index form {i!r}")

    def access(self, e: Access) -> np.ndarray:
        data = self.inputs[e.tensor.position]
        idx = np.broadcast_arrays(*(self.index(i) for i in e.indices))
        inside = np.ones(idx[0].shape, dtype=bool)
        for axis, ix in enumerate(idx):
            inside &= (ix >= 0) & (ix < data.shape[axis])
        outside = ~inside & self.active
        if e.pad is None and outside.any():
            outside = np.broadcast_to(outside, inside.shape)
            bad = tuple(int(np.broadcast_to(ix, inside.shape)[outside].flat[0]) for ix in idx)
            raise TDLError(f"the description reads {e.tensor.name}{list(bad)} outside its shape "
                           f"{data.shape}; use {e.tensor.name}.padded(value) if that is a pad")
        clipped = tuple(np.clip(ix, 0, n - 1) for ix, n in zip(idx, data.shape))
        values = data[clipped]
        return values if e.pad is None else np.where(inside, values, e.pad)

    def cond(self, c) -> np.ndarray:
        if isinstance(c, InRange):
            ix = self.index(c.index)
            return (ix >= c.lo) & (ix < c.hi)
        return _CMP[c.op](self.value(c.a), self.value(c.b))

    def value(self, e: Expr) -> np.ndarray:
        if isinstance(e, Const):
            return np.float64(e.value)
        if isinstance(e, IndexValue):
            return self.index(e.index).astype(np.float64)
        if isinstance(e, Access):
            return self.access(e)
        if isinstance(e, Bin):
            with np.errstate(all="ignore"):
                return _BIN[e.op](self.value(e.a), self.value(e.b))
        if isinstance(e, Unary):
            with np.errstate(all="ignore"):
                return _UNARY[e.fn](self.value(e.a))
        if isinstance(e, Where):
            cond, outer = self.cond(e.cond), self.active
            try:
                self.active = outer & cond
                a = self.value(e.a)
                self.active = outer & ~cond
                b = self.value(e.b)
            finally:
                self.active = outer
            return np.where(cond, a, b)
        if isinstance(e, Depends):
            return self.value(e.value)
        if isinstance(e, Reduce):
            body = np.asarray(self.value(e.body))
            axes = tuple(self.axes[v.name] for v in e.vars)
            shape = list(np.broadcast_shapes(body.shape, (1,) * self.ndim))
            for v, ax in zip(e.vars, axes):
                shape[ax] = self.extents[v.name]
            body = np.broadcast_to(body, shape)
            for v in e.vars:
                if v.name in self.within:     # a part's partial: the rest is the neutral value
                    lo, hi = self.within[v.name]
                    index = self.var(v.name)
                    body = np.where((index >= lo) & (index <= hi), body, _NEUTRAL[e.kind])
            return _REDUCE[e.kind](body, axis=axes, keepdims=True)
        raise TDLError(f"unknown expression {e!r}")


def evaluate(traced: Traced, inputs: Sequence[np.ndarray],
             within: Mapping[str, tuple[int, int]] | None = None) -> list[np.ndarray]:
    """Every described output of ``traced`` for these input arrays (float64). ``within``:
    reduction variables reduced over these inclusive sub-ranges only (one part's partial
    output under partition-n-reduce)."""
    arrays = [np.asarray(x, dtype=np.float64) for x in inputs]
    results = []
    for out in traced.outputs:
        axes = {v.name: k for k, v in enumerate(out.vars)}
        for e in walk(out.expr):
            if isinstance(e, Reduce):
                for v in e.vars:
                    axes.setdefault(v.name, len(axes))
        grid = _Grid(axes, dict(traced.extents), arrays, dict(within or {}))
        value = np.asarray(grid.value(out.expr), dtype=np.float64)
        full = np.broadcast_to(value, np.broadcast_shapes(value.shape, (1,) * grid.ndim))
        full = np.broadcast_to(full, tuple(out.shape) + full.shape[len(out.shape):])
        results.append(full.reshape(full.shape[:len(out.shape)]).copy())
    return results
