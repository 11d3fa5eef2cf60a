"""The tensor description language: traced expressions over index variables.

A description is a lambda from output coordinates to a value. Calling it on :class:`Var`
objects builds an expression tree; nothing is computed. Index expressions (what goes inside
``tensor[...]``) are integer-valued: affine forms of variables, plus three non-affine forms
real operators need:

- ``e // k`` and ``e % k`` with a positive constant ``k`` (pooling windows, reshape's
  unflattening of a linear index);
- a *data-dependent* index ``index(x[b, t])`` (Embedding, take): the analysis cannot bound it
  and treats the indexed axis as needed whole.

Values combine with ``+ - * /``, unary functions (:data:`UNARY`), :func:`maximum`,
:func:`minimum`, :func:`where` over comparisons, and reductions :func:`Sum`, :func:`Max`,
:func:`Min` over new index variables, whose extents are given or inferred from an access
that uses the variable alone as an index.
"""
from __future__ import annotations

import contextvars
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tofu_mx.errors import TofuError


class TDLError(TofuError):
    """A malformed description: wrong access rank, unknown input, reused name, ..."""


# --- index expressions ------------------------------------------------------------------------

class Index:
    """An integer-valued index expression."""

    def __add__(self, other: Any) -> Any:
        if isinstance(other, Expr):
            return IndexValue(self) + other
        return _iadd(self, as_index(other))

    __radd__ = __add__

    def __sub__(self, other: Any) -> Any:
        if isinstance(other, Expr):
            return IndexValue(self) - other
        return _iadd(self, _iscale(as_index(other), -1))

    def __rsub__(self, other: Any) -> Any:
        if isinstance(other, Expr):
            return other - IndexValue(self)
        return _iadd(as_index(other), _iscale(self, -1))

    def __neg__(self) -> "Index":
        return _iscale(self, -1)

    def __mul__(self, other: Any) -> Any:
        if isinstance(other, Expr):
            return IndexValue(self) * other
        if isinstance(other, int) and not isinstance(other, bool):
            return _iscale(self, other)
        raise TDLError(f"an index can only be multiplied by an int constant, got {other!r}")

    __rmul__ = __mul__

    def __floordiv__(self, k: Any) -> "Index":
        _check_positive(k, "//")
        return self if k == 1 else FloorDiv(self, k)

    def __mod__(self, k: Any) -> "Index":
        _check_positive(k, "%")
        return Affine((), 0) if k == 1 else Mod(self, k)

    def __truediv__(self, other: Any) -> "Expr":
        return IndexValue(self) / other


def _check_positive(k: Any, op: str) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        raise TDLError(f"index {op} needs a positive int constant, got {k!r}")


@dataclass(frozen=True, eq=False)
class Affine(Index):
    """``sum(coeff * var) + const``; ``terms`` is a tuple of ``(var name, coeff)``."""

    terms: tuple[tuple[str, int], ...]
    const: int = 0

    def single_var(self) -> str | None:
        """The variable's name when this is exactly one variable (coefficient 1, no offset)."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and self.const == 0:
            return self.terms[0][0]
        return None


class Var(Affine):
    """An index variable of a description (an output coordinate or a reduction variable)."""

    def __init__(self, name: str):
        super().__init__(((name, 1),), 0)

    @property
    def name(self) -> str:
        return self.terms[0][0]

    def __repr__(self) -> str:
        return f"Var({self.name!r})"


@dataclass(frozen=True, eq=False)
class IAdd(Index):
    """A sum of index expressions that are not all affine."""

    parts: tuple[Index, ...]


@dataclass(frozen=True, eq=False)
class IScale(Index):
    inner: Index
    factor: int


@dataclass(frozen=True, eq=False)
class FloorDiv(Index):
    inner: Index
    divisor: int


@dataclass(frozen=True, eq=False)
class Mod(Index):
    inner: Index
    modulus: int


@dataclass(frozen=True, eq=False)
class DataIndex(Index):
    """An index read from a tensor: data-dependent, unbounded for the analysis."""

    value: "Expr"


def as_index(x: Any) -> Index:
    if isinstance(x, Index):
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        return Affine((), x)
    raise TDLError(f"an index must be an index variable, an int or an index expression, "
                   f"got {type(x).__name__} {x!r}")


def _iadd(a: Index, b: Index) -> Index:
    if isinstance(a, Affine) and isinstance(b, Affine):
        coeffs: dict[str, int] = {}
        for name, c in a.terms + b.terms:
            coeffs[name] = coeffs.get(name, 0) + c
        return Affine(tuple((n, c) for n, c in coeffs.items() if c), a.const + b.const)
    return IAdd(tuple(p for x in (a, b) for p in (x.parts if isinstance(x, IAdd) else (x,))))


def _iscale(a: Index, k: int) -> Index:
    if isinstance(a, Affine):
        return Affine(tuple((n, c * k) for n, c in a.terms if c * k), a.const * k)
    return IScale(a, k)


def index_nodes(indices: Sequence[Index]):
    """Every node of these index expressions (a data-dependent index is yielded, its value
    expression is not entered)."""
    stack = list(indices)
    while stack:
        i = stack.pop()
        yield i
        if isinstance(i, IAdd):
            stack += list(i.parts)
        elif isinstance(i, (IScale, FloorDiv, Mod)):
            stack.append(i.inner)


def index(value: "Expr") -> Index:
    """Use a tensor's value as an index (rounded down): ``weight[index(data[b, t]), d]``."""
    if not isinstance(value, Expr):
        raise TDLError(f"index() takes a value expression, got {value!r}")
    return DataIndex(value)


# --- value expressions ------------------------------------------------------------------------

class Expr:
    """A real-valued expression."""

    def __add__(self, o): return Bin("+", self, lift(o))
    def __radd__(self, o): return Bin("+", lift(o), self)
    def __sub__(self, o): return Bin("-", self, lift(o))
    def __rsub__(self, o): return Bin("-", lift(o), self)
    def __mul__(self, o): return Bin("*", self, lift(o))
    def __rmul__(self, o): return Bin("*", lift(o), self)
    def __truediv__(self, o): return Bin("/", self, lift(o))
    def __rtruediv__(self, o): return Bin("/", lift(o), self)
    def __pow__(self, o): return Bin("pow", self, lift(o))
    def __rpow__(self, o): return Bin("pow", lift(o), self)
    def __neg__(self): return Unary("neg", self)


def lift(x: Any) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, Index):
        return IndexValue(x)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return Const(float(x))
    raise TDLError(f"cannot use {type(x).__name__} {x!r} as a value in a description")


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: float


@dataclass(frozen=True, eq=False)
class IndexValue(Expr):
    """An index expression used as a number (``t < length[b]``)."""

    index: Index


@dataclass(frozen=True, eq=False)
class Access(Expr):
    """``tensor[indices]``; out of range reads ``pad`` (or are an error when it is None)."""

    tensor: "TensorRef"
    indices: tuple[Index, ...]
    pad: float | None = None


@dataclass(frozen=True, eq=False)
class Bin(Expr):
    op: str  # + - * / pow max min
    a: Expr
    b: Expr


#: Unary functions a description may call, by name.
UNARY = ("neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "abs", "erf", "softrelu",
         "softsign", "square", "floor", "sign", "log1p", "expm1", "sin", "cos", "tan", "arcsin",
         "arccos", "arctan", "sinh", "cosh", "arcsinh", "arccosh", "arctanh", "ceil", "round",
         "rint", "trunc", "log2", "log10", "cbrt", "reciprocal", "gamma", "gammaln", "erfinv")


@dataclass(frozen=True, eq=False)
class Unary(Expr):
    fn: str
    a: Expr


@dataclass(frozen=True, eq=False)
class Cmp:
    """A comparison of two values: ``op`` in ``< <= > >= == !=``."""

    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=False)
class InRange:
    """``lo <= index < hi`` for an index expression and int bounds (piecewise operators)."""

    index: Index
    lo: int
    hi: int


@dataclass(frozen=True, eq=False)
class Where(Expr):
    cond: Cmp | InRange
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=False)
class Reduce(Expr):
    kind: str                       # sum | max | min
    vars: tuple[Var, ...]
    extents: tuple[int | None, ...]  # None: inferred from the body's accesses
    body: Expr


@dataclass(frozen=True, eq=False)
class Depends(Expr):
    """Value ``value``; the accesses in ``on`` are read too (by the backward pass only)."""

    value: Expr
    on: tuple[Access, ...]


def _unary(fn: str) -> Callable[[Any], Expr]:
    def f(x: Any) -> Expr:
        return Unary(fn, lift(x))
    f.__name__ = fn
    return f


exp, log, sqrt, rsqrt, tanh, sigmoid = (_unary(n) for n in ("exp", "log", "sqrt", "rsqrt",
                                                            "tanh", "sigmoid"))
absolute, erf, softrelu, softsign, square = (_unary(n) for n in ("abs", "erf", "softrelu",
                                                                 "softsign", "square"))
floor, sign, log1p, expm1 = (_unary(n) for n in ("floor", "sign", "log1p", "expm1"))
sin, cos, tan, arcsin, arccos, arctan = (_unary(n) for n in ("sin", "cos", "tan", "arcsin",
                                                             "arccos", "arctan"))
sinh, cosh, arcsinh, arccosh, arctanh = (_unary(n) for n in ("sinh", "cosh", "arcsinh",
                                                             "arccosh", "arctanh"))
ceil, round_, rint, trunc = (_unary(n) for n in ("ceil", "round", "rint", "trunc"))
log2, log10, cbrt, reciprocal = (_unary(n) for n in ("log2", "log10", "cbrt", "reciprocal"))
gamma, gammaln, erfinv = (_unary(n) for n in ("gamma", "gammaln", "erfinv"))


def maximum(a: Any, b: Any) -> Expr:
    return Bin("max", lift(a), lift(b))


def minimum(a: Any, b: Any) -> Expr:
    return Bin("min", lift(a), lift(b))


def _compare(op: str) -> Callable[[Any, Any], Cmp]:
    def compare(a: Any, b: Any) -> Cmp:
        return Cmp(op, lift(a), lift(b))
    return compare


less, greater, less_equal, greater_equal, equal, not_equal = (
    _compare(op) for op in ("<", ">", "<=", ">=", "==", "!="))


def in_range(i: Any, lo: int, hi: int) -> InRange:
    return InRange(as_index(i), int(lo), int(hi))


def where(cond: Cmp | InRange, a: Any, b: Any) -> Expr:
    if not isinstance(cond, (Cmp, InRange)):
        raise TDLError(f"where() needs a comparison (less, greater, in_range), got {cond!r}")
    return Where(cond, lift(a), lift(b))


def depends(value: Any, *accesses: Access) -> Expr:
    """``value``, declaring that the operator also reads ``accesses`` (e.g. a loss's label,
    used only by its gradient), so the analysis gives them a region."""
    for a in accesses:
        if not isinstance(a, Access):
            raise TDLError(f"depends() takes tensor accesses, got {a!r}")
    return Depends(lift(value), tuple(accesses))


# --- tensors and tracing ----------------------------------------------------------------------

class TensorRef:
    """An input of a description: has a shape, and is indexed as ``x[i, j]``."""

    def __init__(self, name: str, position: int, shape: Sequence[int], pad: float | None = None):
        self.name, self.position, self.shape, self._pad = name, position, tuple(shape), pad

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def padded(self, value: float) -> "TensorRef":
        """The same tensor, reading ``value`` outside its bounds (convolution/pooling pads)."""
        return TensorRef(self.name, self.position, self.shape, float(value))

    def __getitem__(self, idx: Any) -> Access:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != self.ndim:
            raise TDLError(f"input {self.name!r} has rank {self.ndim} (shape {self.shape}) but "
                           f"is accessed with {len(idx)} indices")
        return Access(self, tuple(as_index(i) for i in idx), self._pad)

    def __repr__(self) -> str:
        return f"TensorRef({self.name!r}, shape={self.shape})"


_SCOPE: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("tdl_scope",
                                                                         default=())


def lambda_params(fn: Callable) -> list[str]:
    if not callable(fn):
        raise TDLError(f"a description must return a lambda (or a tuple of lambdas), got {fn!r}")
    params = inspect.signature(fn).parameters.values()
    bad = [p.name for p in params if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if bad:
        raise TDLError(f"index lambdas take plain positional variables, got {bad}")
    return [p.name for p in params]


def trace_lambda(fn: Callable) -> tuple[tuple[Var, ...], Expr]:
    """Call ``fn`` on fresh variables named after its parameters; reject reused names."""
    names = lambda_params(fn)
    scope = _SCOPE.get()
    reused = [n for n in names if n in scope]
    if reused:
        raise TDLError(f"index variable name(s) {reused} reused in a nested lambda; in scope "
                       f"already: {list(scope)}. Give every variable its own name.")
    variables = tuple(Var(n) for n in names)
    token = _SCOPE.set(scope + tuple(names))
    try:
        body = fn(*variables)
    finally:
        _SCOPE.reset(token)
    return variables, lift(body)


def lam(names: int | Sequence[str], fn: Callable, prefix: str = "i") -> Callable:
    """A lambda taking the variables ``names`` (or ``n`` variables ``{prefix}0..``) and calling
    ``fn(*variables)``: for descriptions whose rank depends on the input (elementwise ops)."""
    if isinstance(names, int):
        names = [f"{prefix}{k}" for k in range(names)]

    def f(*variables):
        return fn(*variables)
    f.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names])
    return f


def _reduce(kind: str) -> Callable[..., Reduce]:
    def reduce(fn: Callable, *extents: int) -> Reduce:
        variables, body = trace_lambda(fn)
        if extents and len(extents) != len(variables):
            raise TDLError(f"{kind.title()} over {len(variables)} variables got {len(extents)} "
                           f"extents; give none (inferred) or one per variable")
        return Reduce(kind, variables, tuple(extents) or (None,) * len(variables), body)
    reduce.__name__ = kind.title()
    return reduce


Sum, Max, Min = _reduce("sum"), _reduce("max"), _reduce("min")


def relu(x: Any) -> Expr:
    return maximum(x, 0.0)
