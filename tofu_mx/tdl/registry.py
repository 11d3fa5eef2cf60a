"""Registering operator descriptions, and tracing one for a concrete node.

``@op("FullyConnected", examples=[...])`` registers a description: a function of the
operator's attributes and its inputs (:class:`~tofu_mx.tdl.lang.TensorRef`, with shapes) that
returns a lambda over output coordinates, or a tuple of lambdas for an operator with several
outputs (outputs share a loop variable by sharing its name). Each example is a set of
attributes and input shapes; at registration every example is traced, so a malformed
description is rejected at once, and the examples are what the kernel check runs.

An operator that cannot be described is registered with :func:`opaque`, with the reason and,
when it has one, its batch axis.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, c_str, check_call, py_str

from nnvm_passes.exporter import symbol_from_json
from nnvm_passes.importer import import_symbol
from nnvm_passes.ir import FrozenDict, Graph, format_attr_value, is_hidden_attr, parse_attr_value
from tofu_mx.tdl.lang import (Access, Bin, Cmp, DataIndex, Depends, Expr, Reduce, TDLError,
                              TensorRef, Unary, Var, Where, index_nodes, lambda_params,
                              trace_lambda)


class Attrs(Mapping[str, Any]):
    """An operator's attributes, parsed (``"(3, 3)"`` -> ``(3, 3)``); ``get`` takes defaults."""

    def __init__(self, raw: Mapping[str, str], output_shapes: Sequence[Sequence[int]] = ()):
        self._values = {k: parse_attr_value(v) for k, v in raw.items() if not is_hidden_attr(k)}
        #: The operator's output shapes, as MXNet infers them from these attributes and the
        #: input shapes (Reshape's special codes resolved, say).
        self.output_shapes = tuple(tuple(s) for s in output_shapes)

    def with_output_shapes(self, output_shapes: Sequence[Sequence[int]]) -> "Attrs":
        """The same attributes, knowing the operator's output shapes."""
        copy = Attrs({})
        copy._values = self._values
        copy.output_shapes = tuple(tuple(s) for s in output_shapes)
        return copy

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Attrs({self._values!r})"


@dataclass(frozen=True)
class Example:
    """Attributes (as MXNet spells them), input shapes and (where not float32) input dtypes
    for one kernel check."""

    attrs: Mapping[str, str]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: FrozenDict = field(default_factory=FrozenDict)   # input position -> dtype name


@dataclass(frozen=True)
class Description:
    op: str
    fn: Callable = field(repr=False)
    input_names: tuple[str, ...]
    variadic: bool
    examples: tuple[Example, ...]
    train: bool        # the kernel check runs the operator in training mode
    rtol: float
    atol: float
    note: str = ""
    shard: Callable | None = field(default=None, repr=False)
    facts: "OpFacts" = field(default_factory=lambda: OpFacts())
    domain: tuple[float, float] | None = None   # the check's float inputs, if not [-1, 1)


@dataclass(frozen=True)
class ShardContext:
    """One device's share of an operator, as a description's ``shard`` hook sees it: boxes are
    inclusive ``(lo, hi)`` per axis in the whole tensor's coordinates."""

    inputs: tuple           # box each input is read in, within bounds (None: not read)
    windows: tuple          # the same boxes before clipping (reaching into the padding)
    outputs: tuple          # box of each output this share computes
    input_shapes: tuple     # the whole tensors' shapes
    output_shapes: tuple
    partial: str | None     # sum | max | min when this share computes partial outputs

    @staticmethod
    def size(box) -> tuple[int, ...]:
        return tuple(hi - lo + 1 for lo, hi in box)


@dataclass(frozen=True)
class Shard:
    """How to run one share: attribute overrides, inputs to read in their unclipped window
    (``padded[input] = axes``: the rewrite materialises the pad values there) or over whole
    axes (``whole``), and a factor
    to multiply the outputs by (a mean's partial sum). ``views``: the share runs no operator,
    its output ``j`` is input 0's region ``views[j]`` (a box), cut and joined by the rewrite
    (a SliceChannel share holding parts of several pieces). ``also_runs`` (with ``views``):
    the operator with ``attrs`` computes the share too, from the box of input 0 covering the
    views (a SliceChannel share holding whole pieces); the rewrite reads the views where they
    lie in different stored boxes of the input (:meth:`nnvm_passes.program._Route.apart`)."""

    attrs: Mapping[str, Any] = field(default_factory=dict)
    padded: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    scale: float | None = None
    views: tuple | None = None
    also_runs: bool = False
    #: ``whole[input] = axes``: the share reads those axes of the input over their whole
    #: extent, beyond what it uses (a kernel whose weights follow the input's size: a resize
    #: skipping the edge rows when it shrinks)
    whole: Mapping[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Opaque:
    """An operator without a description. ``batch_axes[i]`` is input i's batch axis (or None:
    the input is needed whole); ``output_batch_axes`` likewise for outputs. No batch axes at
    all means the operator can only run whole on one device, or replicated."""

    op: str
    reason: str
    batch_axes: tuple[int | None, ...] = ()
    output_batch_axes: tuple[int | None, ...] = ()
    facts: "OpFacts" = field(default_factory=lambda: OpFacts())


#: ``(attrs, input shapes) -> (low, high)``: the integers an index input is read in.
IndexRange = Callable[[Attrs, tuple], tuple[int, int]]


@dataclass(frozen=True)
class OpFacts:
    """What the passes must know of an operator beyond what it computes, declared with its
    description (``@op(..., labels=(1,), loss=True)``) so that no pass names operators.

    ``index_inputs``: input position -> the integer range that input is read in (Embedding's
    tokens, a loss's class labels, sequence lengths); test values are drawn from it.
    ``labels``: input positions that are labels (data, never trained). ``loss``: a loss head,
    whose gradient ignores the gradient of its output (computed once per output box).
    ``gradient``: False when no gradient flows through the operator (BlockGrad, argmax).
    ``random``: its output is random in training (Dropout); verification runs it as the
    identity, its inference behaviour.
    ``group_attr``: False when MXNet hands every attribute, ``__ctx_group__`` included, to
    the operator's constructor (Python custom operators, whose ``CustomOpProp`` may take no
    keywords): the rewrite then places the node through its first input instead. Declared
    for an MXNet operator kind as a whole with :func:`kind_facts`.
    ``recompute``: False when running the operator again does not give the same values
    (LeakyReLU's ``rrelu`` draws its slopes; Python custom operators may do anything): the
    backward pass then never re-runs it to re-fetch its inputs (``SearchOptions.refetch``).
    Random operators are never re-run either.
    ``lowering``: ``(emit, attrs, input shapes, *inputs) -> outputs | None``, an equivalent
    subgraph of other operators that partitions better (BatchNorm's statistics as sums
    that split on the batch); applied before the search by :func:`nnvm_passes.lower.lower`
    when there is more than one device. None from it keeps the operator."""

    index_inputs: Mapping[int, IndexRange] = field(default_factory=dict)
    labels: tuple[int, ...] = ()
    loss: bool = False
    gradient: bool = True
    random: bool = False
    group_attr: bool = True
    lowering: Callable | None = None
    recompute: bool = True


@dataclass(frozen=True)
class Output:
    vars: tuple[Var, ...]
    expr: Expr
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Traced:
    """A description traced for one node: its inputs, outputs and every variable's extent."""

    op: str
    inputs: tuple[TensorRef | None, ...]
    outputs: tuple[Output, ...]
    extents: Mapping[str, int]


_REGISTRY: dict[str, Description | Opaque] = {}
_GENERATION = [0]     # bumped on every change, so that caches keyed on it never go stale


def generation() -> int:
    """A number that changes whenever a description is registered, replaced or removed."""
    return _GENERATION[0]


def _store(name: str, entry: "Description | Opaque") -> None:
    _REGISTRY[name] = entry
    _GENERATION[0] += 1


def registry_key(op: str, attrs: Mapping[str, Any] | None = None) -> str:
    """``"Custom:<op_type>"`` for MXNet custom operators, else the operator's name."""
    if op == "Custom" and attrs and "op_type" in attrs:
        return f"Custom:{attrs['op_type']}"
    return op


def lookup(op: str, attrs: Mapping[str, Any] | None = None) -> Description | Opaque | None:
    return _REGISTRY.get(registry_key(op, attrs))


def registered() -> dict[str, Description | Opaque]:
    """Every registered operator, by name (a copy)."""
    return dict(_REGISTRY)


_NO_FACTS = OpFacts()
_KIND_FACTS: dict[str, dict[str, Any]] = {}


def kind_facts(op: str, **values: Any) -> None:
    """Declare facts that hold for every node of the MXNet operator ``op``, whatever its
    attributes and whether or not it is described (``kind_facts("Custom", group_attr=False)``)."""
    unknown = set(values) - {f.name for f in dataclasses.fields(OpFacts)}
    if unknown:
        raise TDLError(f"kind_facts({op!r}): no such facts {sorted(unknown)}")
    _KIND_FACTS[op] = dict(values)
    _GENERATION[0] += 1


def facts(op: str, attrs: Mapping[str, Any] | None = None) -> OpFacts:
    """The declared facts of ``op`` (the defaults for an operator nobody registered)."""
    entry = lookup(op, attrs)
    found = _NO_FACTS if entry is None else entry.facts
    return dataclasses.replace(found, **_KIND_FACTS[op]) if op in _KIND_FACTS else found


def label_inputs(op: str, attrs: Mapping[str, Any] | None = None) -> tuple[int, ...]:
    """Input positions of ``op`` that are labels (for the importer's classification)."""
    return facts(op, attrs).labels


def _format_attrs(attrs: Mapping[str, Any]) -> dict[str, str]:
    return {k: v if isinstance(v, str) else format_attr_value(v) for k, v in attrs.items()}


def _signature(fn: Callable, op: str) -> tuple[tuple[str, ...], bool]:
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY,
                                            params[0].POSITIONAL_OR_KEYWORD):
        raise TDLError(f"description of {op!r} must take the attributes first: "
                       f"def {fn.__name__}(attrs, data, ...)")
    names, variadic = [], False
    for p in params[1:]:
        if p.kind is p.VAR_POSITIONAL:
            variadic = True
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        else:
            raise TDLError(f"description of {op!r}: inputs are positional parameters, got "
                           f"{p.name!r} ({p.kind.description})")
    return tuple(names), variadic


@functools.lru_cache(maxsize=1)
def mxnet_operators() -> dict[str, str]:
    """Every operator name MXNet registers, mapped to its canonical name (an alias such as
    ``flip`` to ``reverse``; graphs always carry the canonical name). Do not modify."""
    names = mx.operator.get_all_registered_operators()
    return {n: _canonical(n) for n in names}


def _canonical(name: str) -> str:
    handle = ctypes.c_void_p()
    check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
    real, desc, num_args = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_uint()
    arg_names, arg_types, arg_descs = (ctypes.POINTER(ctypes.c_char_p)() for _ in range(3))
    key_var_args, return_type = ctypes.c_char_p(), ctypes.c_char_p()
    check_call(_LIB.MXSymbolGetAtomicSymbolInfo(
        handle, ctypes.byref(real), ctypes.byref(desc), ctypes.byref(num_args),
        ctypes.byref(arg_names), ctypes.byref(arg_types), ctypes.byref(arg_descs),
        ctypes.byref(key_var_args), ctypes.byref(return_type)))
    return py_str(real.value)


def mxnet_input_names(op: str, attrs: Mapping[str, str]) -> tuple[str, ...] | None:
    """MXNet's names for the inputs of ``op`` (None where MXNet cannot tell without inputs)."""
    creator = getattr(mx.sym, op, None) or getattr(mx.sym._internal, op, None)
    for prefix, module in (("_contrib_", mx.sym.contrib), ("_linalg_", mx.sym.linalg)):
        if creator is None and op.startswith(prefix):
            creator = getattr(module, op[len(prefix):], None)
    if creator is None:
        return None
    try:
        sym = creator(name="tdlprobe", **attrs)
    except (mx.base.MXNetError, TypeError, ValueError):
        return None
    names = sym.list_arguments() + sym.list_auxiliary_states()
    return tuple(n[len("tdlprobe_"):] if n.startswith("tdlprobe_") else n for n in names)


def single_op_symbol(op: str, attrs: Mapping[str, str], n_inputs: int,
                     n_outputs: int = 1) -> mx.sym.Symbol:
    """A symbol of one ``op`` node reading variables ``in0``, ``in1``, ..., giving its first
    ``n_outputs`` outputs."""
    nodes = [{"op": "null", "name": f"in{i}", "inputs": []} for i in range(n_inputs)]
    nodes.append({"op": op, "name": "op", "attrs": dict(attrs),
                  "inputs": [[i, 0, 0] for i in range(n_inputs)]})
    js = {"nodes": nodes, "arg_nodes": list(range(n_inputs)),
          "heads": [[n_inputs, j, 0] for j in range(n_outputs)],
          "attrs": {"mxnet_version": ["int", 10901]}}
    try:
        return symbol_from_json(js)
    except mx.base.MXNetError as e:
        raise TDLError(f"MXNet has no operator {op!r} that takes {n_inputs} inputs with "
                       f"attributes {dict(attrs)}: {str(e).splitlines()[0]}") from e


def example_graph(op: str, example: Example) -> Graph:
    """The one-operator graph of an example, imported with shapes."""
    sym = single_op_symbol(op, example.attrs, len(example.shapes))
    shapes = {f"in{i}": s for i, s in enumerate(example.shapes)}
    return import_symbol(sym, dtypes={f"in{i}": d for i, d in example.dtypes.items()},
                         data_names=list(shapes), **shapes)


def _facts(index_inputs, labels, loss, gradient, random, name: str,
           lowering: Callable | None = None, recompute: bool = True) -> OpFacts:
    index_inputs = dict(index_inputs or {})
    bad = [p for p, f in index_inputs.items() if not isinstance(p, int) or not callable(f)]
    if bad:
        raise TDLError(f"{name!r}: index_inputs maps input positions to functions (attrs, "
                       f"input shapes) -> (low, high); got {bad!r} as keys")
    labels = tuple(labels)
    if not all(isinstance(p, int) and p >= 0 for p in labels):
        raise TDLError(f"{name!r}: labels are input positions (ints), got {labels!r}")
    if lowering is not None and not callable(lowering):
        raise TDLError(f"{name!r}: lowering is a function (emit, attrs, input shapes, *inputs) "
                       f"-> outputs, got {lowering!r}")
    return OpFacts(index_inputs, labels, bool(loss), bool(gradient), bool(random),
                   lowering=lowering, recompute=bool(recompute))


def _example(example, name: str) -> Example:
    """``(attrs, shapes)`` or ``(attrs, shapes, {input position: dtype})``."""
    if not isinstance(example, (tuple, list)) or len(example) not in (2, 3):
        raise TDLError(f"{name!r}: an example is (attrs, input shapes) or (attrs, input shapes, "
                       f"{{input position: dtype}}), got {example!r}")
    attrs, shapes, dtypes = (*example, {})[:3]
    return Example(_format_attrs(attrs), tuple(tuple(s) for s in shapes),
                   FrozenDict({int(i): np.dtype(d).name for i, d in dtypes.items()}))


def _domain(domain, name: str) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in domain)
    except (TypeError, ValueError):
        low = high = None
    if low is None or not low < high:
        raise TDLError(f"{name!r}: domain is (low, high) with low < high, got {domain!r}")
    return low, high


def op(name: str, *, examples: Sequence[tuple[Mapping[str, Any], Sequence[Sequence[int]]]],
       train: bool = True, rtol: float = 1e-4, atol: float = 1e-5, note: str = "",
       replace: bool = False, shard: Callable | None = None,
       index_inputs: Mapping[int, IndexRange] | None = None, labels: Sequence[int] = (),
       loss: bool = False, gradient: bool = True, random: bool = False,
       domain: tuple[float, float] | None = None,
       lowering: Callable | None = None,
       recompute: bool = True, check: bool | None = None) -> Callable[[Callable], Callable]:
    """Register the decorated function as the description of operator ``name``.

    ``examples``: ``(attrs, input shapes)`` pairs, or ``(attrs, input shapes, {input
    position: dtype})`` for inputs that must not be float32; each is traced now (a malformed
    description raises :class:`TDLError` here) and checked against MXNet's kernel by
    :func:`tofu_mx.tdl.check.check_description`. ``train``: run that check in training mode.
    For an MXNet custom operator use ``"Custom:<op_type>"``. Registering a name twice is an
    error unless ``replace=True``. ``shard(attrs, ctx: ShardContext) -> Shard | None``: how
    one device's share runs (attributes that fix output sizes, padding, offsets); without it
    the share runs with the operator's own attributes; None means the share cannot run as
    this operator (the rewrite then computes the operator whole). ``index_inputs``,
    ``labels``, ``loss``, ``gradient``, ``random``, ``lowering``, ``recompute``: the operator's facts
    (:class:`OpFacts`).
    ``domain``: ``(low, high)`` to draw the check's float inputs from, for an operator defined
    on part of the line only (``arccosh`` on [1, inf)); [-1, 1) by default.
    ``check``: compare every example with MXNet's kernel now, refusing a description that
    contradicts it (:class:`TDLError` with the first differing example); by default for
    every description but the built-in ones (which the test suite checks).
    """
    if name in _REGISTRY and not replace:
        raise TDLError(f"{name!r} already has a description ({_REGISTRY[name]!r:.80}); pass "
                       f"replace=True to replace it")
    if not examples:
        raise TDLError(f"description of {name!r} needs at least one example (attrs, shapes)")
    op_facts = _facts(index_inputs, labels, loss, gradient, random, name, lowering, recompute)

    def register(fn: Callable) -> Callable:
        names, variadic = _signature(fn, name)
        real = mxnet_operators().get(name.partition(":")[0])
        if real is not None and real != name.partition(":")[0]:
            raise TDLError(f"{name!r} is MXNet's alias of {real!r}: graphs always name the "
                           f"operator {real!r}, so describe {real!r} (the alias is covered)")
        exs = tuple(_example(ex, name) for ex in examples)
        desc = Description(name, fn, names, variadic, exs, train, rtol, atol, note, shard,
                           op_facts, None if domain is None else _domain(domain, name))
        mx_op, _, op_type = name.partition(":")
        if not variadic and not op_type:
            theirs = mxnet_input_names(mx_op, exs[0].attrs)
            if theirs is not None and tuple(theirs[:len(names)]) != names[:len(theirs)]:
                raise TDLError(f"description of {name!r} names its inputs {names}; MXNet's "
                               f"are {theirs}")
        for ex in exs:
            attrs = dict(ex.attrs, op_type=op_type) if op_type else ex.attrs
            graph = example_graph(mx_op, dataclasses.replace(ex, attrs=attrs))
            node = graph.nodes[-1]
            trace(desc, Attrs(attrs), [graph.tensor(e).shape for e in node.inputs],
                  [t.shape for t in node.outputs])
        if check if check is not None else not fn.__module__.startswith("tofu_mx.ops"):
            _check_against_kernel(desc)
        _store(name, desc)
        return fn
    return register


def _check_against_kernel(desc: Description) -> None:
    from tofu_mx.tdl.check import check_example
    for ex in desc.examples:
        result = check_example(desc, ex)
        if not result.ok:
            raise TDLError(f"description of {desc.op!r} contradicts MXNet's kernel on its "
                           f"example {dict(ex.attrs)} with inputs {list(ex.shapes)}: "
                           f"{result.message or 'it differs'} (max abs err "
                           f"{result.max_abs_err:.3g}); fix the description, or pass "
                           f"check=False to register it unchecked")


def unregister(name: str) -> Description | Opaque | None:
    """Remove ``name`` from the registry (returns what was there): for tests and for replacing
    a description at run time."""
    _GENERATION[0] += 1
    return _REGISTRY.pop(name, None)


def opaque(name: str, reason: str, batch_axes: Sequence[int | None] = (),
           output_batch_axes: Sequence[int | None] = (), *,
           index_inputs: Mapping[int, IndexRange] | None = None, labels: Sequence[int] = (),
           loss: bool = False, gradient: bool = True, random: bool = False,
           recompute: bool = True) -> None:
    """Register ``name`` as deliberately opaque, saying why (facts as for :func:`op`)."""
    _store(name, Opaque(name, reason, tuple(batch_axes), tuple(output_batch_axes),
                        _facts(index_inputs, labels, loss, gradient, random, name,
                               recompute=recompute)))


# --- tracing ----------------------------------------------------------------------------------

def walk(expr: Expr):
    """Every sub-expression of ``expr`` (values, not indices), depth first."""
    stack = [expr]
    while stack:
        e = stack.pop()
        yield e
        if isinstance(e, Bin):
            stack += [e.a, e.b]
        elif isinstance(e, Unary):
            stack.append(e.a)
        elif isinstance(e, Where):
            stack += [e.a, e.b]
            if isinstance(e.cond, Cmp):
                stack += [e.cond.a, e.cond.b]
        elif isinstance(e, Reduce):
            stack.append(e.body)
        elif isinstance(e, Depends):
            stack += [e.value, *e.on]
        elif isinstance(e, Access):
            stack += [i.value for i in index_nodes(e.indices) if isinstance(i, DataIndex)]


def _infer_extents(outputs: list[Output]) -> dict[str, int]:
    extents: dict[str, int] = {}

    def put(name: str, extent: int, where: str) -> None:
        if extents.setdefault(name, extent) != extent:
            raise TDLError(f"index variable {name!r} has extent {extents[name]} in one place and "
                           f"{extent} in {where}; give different variables different names")

    for k, out in enumerate(outputs):
        for var, extent in zip(out.vars, out.shape):
            put(var.name, extent, f"output {k}")
    for out in outputs:
        accesses = [e for e in walk(out.expr) if isinstance(e, Access)]
        for red in (e for e in walk(out.expr) if isinstance(e, Reduce)):
            for var, given in zip(red.vars, red.extents):
                if given is not None:
                    put(var.name, int(given), "a reduction")
                    continue
                found = [a.tensor.shape[ax] for a in accesses
                         for ax, i in enumerate(a.indices)
                         if hasattr(i, "single_var") and i.single_var() == var.name]
                if not found:
                    raise TDLError(
                        f"cannot infer the extent of reduction variable {var.name!r}: no access "
                        f"uses it alone as an index; pass it, e.g. Sum(lambda {var.name}: ..., N)")
                put(var.name, found[0], "a reduction")
    return extents


def trace(desc: Description, attrs: Attrs, input_shapes: Sequence[Sequence[int]],
          output_shapes: Sequence[Sequence[int]]) -> Traced:
    """Trace ``desc`` for one node with these attributes and shapes."""
    # Optional trailing inputs (a bias under no_bias=True) are left to their defaults.
    n_named = len(desc.input_names)
    if len(input_shapes) > n_named and not desc.variadic:
        raise TDLError(f"description of {desc.op!r} takes inputs {desc.input_names}, the node "
                       f"has {len(input_shapes)}")
    names = list(desc.input_names) + [f"arg{i}" for i in range(n_named, len(input_shapes))]
    refs = [TensorRef(names[i], i, s) for i, s in enumerate(input_shapes)]
    attrs = attrs.with_output_shapes(output_shapes)
    try:
        result = desc.fn(attrs, *refs)
    except Exception as e:
        raise TDLError(f"description of {desc.op!r} failed for attributes {dict(attrs)} and "
                       f"input shapes {[tuple(s) for s in input_shapes]}: "
                       f"{type(e).__name__}: {e}") from e
    lambdas = result if isinstance(result, tuple) else (result,)
    if len(lambdas) > len(output_shapes):
        raise TDLError(f"description of {desc.op!r} gives {len(lambdas)} outputs, the operator "
                       f"has {len(output_shapes)}")
    outputs = []
    for k, fn in enumerate(lambdas):
        if len(lambda_params(fn)) != len(output_shapes[k]):
            raise TDLError(f"description of {desc.op!r}: output {k} has rank "
                           f"{len(output_shapes[k])} (shape {tuple(output_shapes[k])}) but its "
                           f"lambda takes {len(lambda_params(fn))} variables")
        try:
            variables, expr = trace_lambda(fn)
        except Exception as e:
            raise TDLError(f"description of {desc.op!r}, output {k}, attributes {dict(attrs)}, "
                           f"input shapes {[tuple(s) for s in input_shapes]}: "
                           f"{type(e).__name__}: {e}") from e
        outputs.append(Output(variables, expr, tuple(output_shapes[k])))
    try:
        extents = _infer_extents(outputs)
    except TDLError as e:
        raise TDLError(f"description of {desc.op!r}: {e}") from e
    return Traced(desc.op, tuple(refs), tuple(outputs), extents)


__all__ = ["Attrs", "Description", "Example", "IndexRange", "OpFacts", "Opaque", "Output",
           "Shard", "ShardContext", "Traced", "example_graph", "facts", "generation",
           "kind_facts", "label_inputs", "lookup", "mxnet_operators", "op", "opaque",
           "registered", "registry_key", "trace", "unregister"]
