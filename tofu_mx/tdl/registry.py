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

import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import mxnet as mx

from nnvm_passes.importer import import_symbol
from nnvm_passes.ir import Graph, format_attr_value, is_hidden_attr, parse_attr_value
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
    """Attributes (as MXNet spells them) and input shapes for one kernel check."""

    attrs: Mapping[str, str]
    shapes: tuple[tuple[int, ...], ...]


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

    @property
    def family(self) -> str:
        return self.fn.__module__.rsplit(".", 1)[-1]


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
    (``padded[input] = axes``: the rewrite materialises the pad values there), and a factor
    to multiply the outputs by (a mean's partial sum). ``views``: the share runs no operator,
    its output ``j`` is input 0's region ``views[j]`` (a box), cut and joined by the rewrite
    (a SliceChannel share holding parts of several pieces)."""

    attrs: Mapping[str, Any] = field(default_factory=dict)
    padded: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    scale: float | None = None
    views: tuple | None = None


@dataclass(frozen=True)
class Opaque:
    """An operator without a description. ``batch_axes[i]`` is input i's batch axis (or None:
    the input is needed whole); ``output_batch_axes`` likewise for outputs. No batch axes at
    all means the operator can only run whole on one device, or replicated."""

    op: str
    reason: str
    batch_axes: tuple[int | None, ...] = ()
    output_batch_axes: tuple[int | None, ...] = ()


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


def mxnet_input_names(op: str, attrs: Mapping[str, str]) -> tuple[str, ...] | None:
    """MXNet's names for the inputs of ``op`` (None where MXNet cannot tell without inputs)."""
    creator = getattr(mx.sym, op, None) or getattr(mx.sym._internal, op, None)
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
        return mx.sym.load_json(json.dumps(js))
    except mx.base.MXNetError as e:
        raise TDLError(f"MXNet has no operator {op!r} that takes {n_inputs} inputs with "
                       f"attributes {dict(attrs)}: {str(e).splitlines()[0]}") from e


def example_graph(op: str, example: Example) -> Graph:
    """The one-operator graph of an example, imported with shapes."""
    sym = single_op_symbol(op, example.attrs, len(example.shapes))
    return import_symbol(sym, **{f"in{i}": s for i, s in enumerate(example.shapes)})


def op(name: str, *, examples: Sequence[tuple[Mapping[str, Any], Sequence[Sequence[int]]]],
       train: bool = True, rtol: float = 1e-4, atol: float = 1e-5, note: str = "",
       replace: bool = False, shard: Callable | None = None) -> Callable[[Callable], Callable]:
    """Register the decorated function as the description of operator ``name``.

    ``examples``: ``(attrs, input shapes)`` pairs; each is traced now (a malformed
    description raises :class:`TDLError` here) and checked against MXNet's kernel by
    :func:`tofu_mx.tdl.check.check_description`. ``train``: run that check in training mode.
    For an MXNet custom operator use ``"Custom:<op_type>"``. Registering a name twice is an
    error unless ``replace=True``. ``shard(attrs, ctx: ShardContext) -> Shard | None``: how
    one device's share runs (attributes that fix output sizes, padding, offsets); without it
    the share runs with the operator's own attributes; None means the share cannot run as
    this operator (the rewrite then computes the operator whole).
    """
    if name in _REGISTRY and not replace:
        raise TDLError(f"{name!r} already has a description ({_REGISTRY[name]!r:.80}); pass "
                       f"replace=True to replace it")
    if not examples:
        raise TDLError(f"description of {name!r} needs at least one example (attrs, shapes)")

    def register(fn: Callable) -> Callable:
        names, variadic = _signature(fn, name)
        exs = tuple(Example(_format_attrs(a), tuple(tuple(s) for s in shapes))
                    for a, shapes in examples)
        desc = Description(name, fn, names, variadic, exs, train, rtol, atol, note, shard)
        mx_op, _, op_type = name.partition(":")
        if not variadic and not op_type:
            theirs = mxnet_input_names(mx_op, exs[0].attrs)
            if theirs is not None and tuple(theirs[:len(names)]) != names[:len(theirs)]:
                raise TDLError(f"description of {name!r} names its inputs {names}; MXNet's "
                               f"are {theirs}")
        for ex in exs:
            attrs = dict(ex.attrs, op_type=op_type) if op_type else ex.attrs
            graph = example_graph(mx_op, Example(attrs, ex.shapes))
            node = graph.nodes[-1]
            trace(desc, Attrs(attrs), [graph.tensor(e).shape for e in node.inputs],
                  [t.shape for t in node.outputs])
        _REGISTRY[name] = desc
        return fn
    return register


def unregister(name: str) -> Description | Opaque | None:
    """Remove ``name`` from the registry (returns what was there): for tests and for replacing
    a description at run time."""
    return _REGISTRY.pop(name, None)


def opaque(name: str, reason: str, batch_axes: Sequence[int | None] = (),
           output_batch_axes: Sequence[int | None] = ()) -> None:
    """Register ``name`` as deliberately opaque, saying why."""
    _REGISTRY[name] = Opaque(name, reason, tuple(batch_axes), tuple(output_batch_axes))


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


__all__ = ["Attrs", "Description", "Example", "Opaque", "Output", "Shard", "ShardContext",
           "Traced", "example_graph",
           "lookup", "op", "opaque", "registered", "registry_key", "trace", "unregister"]
