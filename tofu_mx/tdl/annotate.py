"""Annotate and analyse: each operator node gets its description and its strategies.

This is the pipeline's ``annotate -> analyse`` step and its one entry point: the search, the
assignment and the coverage report all ask :func:`annotate` (cached; the cache is keyed on
the registry's generation, so registering or replacing a description is seen at once) or
:func:`described` (the traced description of one node); :func:`registry_entry` gives the
registry's entry for a node's raw attributes, cached the same way.

What an operator without strategies does is decided here too: a described or opaque operator
that no cut divides (or whose description cannot trace a work view) runs *replicated*: every
part computes it whole from whole inputs. An operator with no description runs *whole on one
device* (:func:`whole_strategy`), its inputs gathered there and its outputs handed to their
readers: it may be random or keep state, so it runs once. One that reads no tensor at all
runs replicated.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import tofu_mx.ops  # noqa: F401  (registers the built-in descriptions)
from nnvm_passes.importer import import_symbol
from nnvm_passes.ir import FrozenDict, Graph
from tofu_mx.tdl.analysis import Layout, Strategy, opaque_strategies, strategies
from tofu_mx.tdl.lang import Access, TDLError
from tofu_mx.tdl.registry import (Attrs, Description, Opaque, Traced, facts, generation,
                                  label_inputs, lookup, registry_key, trace)
from tofu_mx.tdl.shares import runs_as_operator

#: What the analysis knows of an operator.
DESCRIBED, OPAQUE, UNKNOWN, FAILED = "described", "opaque", "unknown", "failed"

Shape = tuple[int, ...]


def import_graph(symbol: Any, *, dtypes: Mapping[str, Any] | None = None,
                 data_names: list[str] | None = None, **shapes: Any) -> Graph:
    """:func:`nnvm_passes.importer.import_symbol`, knowing from the descriptions which
    operator inputs are labels."""
    return import_symbol(symbol, dtypes=dtypes, data_names=data_names,
                         label_inputs=label_inputs, **shapes)


@dataclass(frozen=True)
class NodeAnalysis:
    """One operator at given shapes: what is known of it and how it can run in ``parts``."""

    op: str
    status: str                      # described | opaque | unknown | failed
    reason: str                      # why an operator is opaque, unknown or failed
    strategies: tuple[Strategy, ...]  # never empty: replicated or whole as the last resort

    @property
    def runs_whole(self) -> bool:
        """Whether it runs whole on one device (no description to split it by)."""
        return any(s.kind == "whole" for s in self.strategies)


def replicate_strategy(in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                       parts: int) -> Strategy:
    """Every part computes the whole operator from whole inputs."""
    def every(shape):
        return tuple(tuple((0, n - 1) for n in shape) for _ in range(parts))
    ins, outs = tuple(every(s) for s in in_shapes), tuple(every(s) for s in out_shapes)
    return Strategy("all", "replicate", parts, ins, outs,
                    tuple(Layout("replicated") for _ in ins),
                    tuple(Layout("replicated") for _ in outs))


def whole_strategy(in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                   parts: int) -> Strategy:
    """Part 0 computes the whole operator; the other parts compute nothing."""
    def first(shape):
        return (tuple((0, n - 1) for n in shape),) + (None,) * (parts - 1)
    ins, outs = tuple(first(s) for s in in_shapes), tuple(first(s) for s in out_shapes)
    return Strategy("one", "whole", parts, ins, outs, tuple(Layout("first") for _ in ins),
                    tuple(Layout("first") for _ in outs))


def annotate(op: str, attrs: FrozenDict, in_shapes: tuple, out_shapes: tuple,
             parts: int = 2, short: frozenset[str] | None = None) -> NodeAnalysis:
    """The analysis of one ``op`` node with these attributes (MXNet's strings) and shapes.
    ``short``: loop variables an earlier cut split unevenly (the shapes are the largest
    part's; another part may be one shorter): split only if that part is ``parts`` long."""
    return _annotate(op, attrs if type(attrs) is FrozenDict else FrozenDict(attrs),
                     tuple(map(tuple, in_shapes)), tuple(map(tuple, out_shapes)), parts,
                     short or frozenset(), generation())


@functools.lru_cache(maxsize=1 << 14)
def _annotate(op: str, attrs: FrozenDict, ins: tuple, outs: tuple, parts: int,
              short: frozenset[str], _generation: int) -> NodeAnalysis:
    """Like Tofu, the search does not trade redundant computation for fewer bytes, nor offer
    a strategy some share of which cannot run as the operator (:mod:`tofu_mx.tdl.shares`):
    LayerNorm split on its normalised axis, BatchNorm on the batch (each part reads the whole
    batch); run whole on every device, those would move and keep far more than counted."""
    entry = lookup(op, Attrs(attrs))
    if entry is None:
        status, reason, found = UNKNOWN, f"no description of {registry_key(op, attrs)}", []
    elif not isinstance(entry, Description):
        status, reason = OPAQUE, entry.reason
        found = opaque_strategies(entry, ins, outs, parts)
    else:
        try:
            traced = trace(entry, Attrs(attrs), ins, outs)
            status, reason = DESCRIBED, ""
            found = [s for s in strategies(traced, parts)
                     if runs_as_operator(entry, op, attrs, traced, s)]
        except TDLError as e:
            status, reason, found = FAILED, f"its description fails here: {e}", []
    found = [s for s in found if s.var not in short or s.extent - 1 >= parts]
    if not found:
        # an untagged node (a Python custom operator) without inputs lands on the default
        # device: it can run once there, not once per device
        runs_whole = status == UNKNOWN and (len(ins) > 0 or not facts(op, attrs).group_attr)
        found = [(whole_strategy if runs_whole else replicate_strategy)(ins, outs, parts)]
    return NodeAnalysis(op, status, reason, tuple(found))


def registry_entry(op: str, attrs: FrozenDict) -> Description | Opaque | None:
    """What the registry holds for a node with these raw attributes (``lookup`` of its
    parsed attributes; cached per registry generation)."""
    return _registry_entry(op, attrs if type(attrs) is FrozenDict else FrozenDict(attrs),
                           generation())


@functools.lru_cache(maxsize=1 << 12)
def _registry_entry(op: str, attrs: FrozenDict, _generation: int) -> Description | Opaque | None:
    return lookup(op, Attrs(attrs))


def described(op: str, attrs: FrozenDict, in_shapes: Sequence[Shape],
              out_shapes: Sequence[Shape]) -> tuple[Description, Traced] | None:
    """The description of one node traced at these shapes, or None (not described)."""
    return _described(op, FrozenDict(attrs), tuple(map(tuple, in_shapes)),
                      tuple(map(tuple, out_shapes)), generation())


@functools.lru_cache(maxsize=1 << 12)
def _described(op: str, attrs: FrozenDict, ins: tuple, outs: tuple,
               _generation: int) -> tuple[Description, Traced] | None:
    entry = lookup(op, Attrs(attrs))
    if not isinstance(entry, Description):
        return None
    return entry, trace(entry, Attrs(attrs), ins, outs)


def moves_values(op: str, attrs: FrozenDict, in_shapes: Sequence[Shape],
                 out_shapes: Sequence[Shape]) -> bool:
    """Whether every output of this node is a plain read of its first input (a reshape, a
    transpose, a copy): an index read from the output is an index of the input."""
    try:
        found = described(op, attrs, in_shapes, out_shapes)
    except TDLError:
        return False
    return found is not None and all(
        isinstance(o.expr, Access) and o.expr.tensor.position == 0 and o.expr.pad is None
        for o in found[1].outputs)


def analyse_node(graph: Graph, index: int, parts: int = 2) -> NodeAnalysis:
    node = graph.nodes[index]
    return annotate(node.op, node.attrs, tuple(graph.tensor(e).shape for e in node.inputs),
                    tuple(t.shape for t in node.outputs), parts)


def analyse(graph: Graph, parts: int = 2) -> tuple[NodeAnalysis, ...]:
    """The analysis of every operator node of ``graph`` for a cut into ``parts``."""
    return tuple(analyse_node(graph, i, parts) for i, n in enumerate(graph.nodes)
                 if not n.is_variable)
