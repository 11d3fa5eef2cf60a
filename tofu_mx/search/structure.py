"""What every cut of one graph shares, whatever its level or factor order: the graph's
structure, which tensors carry a gradient, the ties of the coarsenings already seen
(:class:`GraphStructure`). Made once per graph and handed to every
:class:`~tofu_mx.search.cut.Cut`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Mapping

import numpy as np

from nnvm_passes.backward import backward_reads, gradient_reads
from nnvm_passes.ir import FrozenDict, Graph
from tofu_mx.tdl.registry import Attrs, facts, generation, lookup

#: coarsenings whose ties a GraphStructure remembers (the levels of a few factor orders)
_TIE_MEMO_SIZE = 4


@dataclass(frozen=True)
class GraphStructure:
    """What every cut of one graph shares, whatever its level or factor order (:meth:`of`).

    ``tie_memo`` keeps the ties of the last few coarsenings, keyed by what determines them
    (the followers and each copy's signature): a level whose coarsening did not change
    reuses them. ``backward``: :func:`~nnvm_passes.backward.gradient_reads` of the graph
    (what each operator's gradient reads)."""

    ops: tuple[int, ...]
    variables: tuple[int, ...]
    variable_facts: tuple[tuple[int, int], ...]   # per variable: (itemsize, 2 for a
    #                                               parameter, which holds its gradient, else 1)
    needs_grad: Mapping[tuple[int, int], bool]
    may_follow: Mapping[int, int]  # operator -> the operator producing its first input, for
    #                                operators with one output whose first input is output 0
    #                                of an operator: they follow it if they keep its layout
    outputs_id: Mapping[int, int]  # operator -> id of its outputs' (itemsize, needs gradient)
    shared_params: tuple[tuple[int, ...], ...]   # the operators reading each parameter that
    #                                              two or more read (where ties start)
    tensor_facts: np.ndarray      # tensor (in node, then output order: Ports.tensor_start)
    #                               -> the id of its (itemsize, needs gradient)
    facts_of_tensors: tuple[tuple[int, bool], ...]   # that id -> (itemsize, needs gradient)
    backward: Mapping[int, tuple[frozenset[int], frozenset[int]]]   # operator with a gradient
    #                                   node -> the input and output positions it reads
    refetching: frozenset[int]    # operators that re-fetch their converted inputs for the
    #                               backward pass (:func:`refetches_inputs`), if asked to
    tie_memo: dict = field(default_factory=dict, compare=False, repr=False)
    port_memo: dict = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def of(graph: Graph, needs_grad: Mapping | None = None) -> "GraphStructure":
        nodes = graph.nodes
        grad = needs_grad_of(graph) if needs_grad is None else needs_grad
        tensor_facts: list[int] = []        # in tensor order (node, then output)
        facts: dict[tuple[int, bool], int] = {}
        outputs_id: dict[int, int] = {}
        ids: dict[tuple, int] = {}
        may_follow: dict[int, int] = {}
        variables: list[int] = []
        variable_facts: list[tuple[int, int]] = []
        shared: dict[tuple, tuple[int, int]] = {}     # the variable facts, one tuple each
        for i, node in enumerate(nodes):
            outputs = node.outputs
            if len(outputs) == 1:      # most nodes: the loop below, unrolled
                out = (itemsize_of(outputs[0].dtype), grad[(i, 0)])
                outs = (out,)
                tensor_facts.append(facts.setdefault(out, len(facts)))
            else:
                outs = tuple([(itemsize_of(t.dtype), grad[(i, k)]) for k, t in enumerate(outputs)])
                for out in outs:
                    tensor_facts.append(facts.setdefault(out, len(facts)))
            if node.is_variable:
                variables.append(i)
                key = (out[0], node.kind == "param")
                found = shared.get(key)
                if found is None:
                    found = shared[key] = (key[0], 2 if key[1] else 1)
                variable_facts.append(found)
                continue
            outputs_id[i] = ids.setdefault(outs, len(ids))
            ins = node.inputs
            if ins and ins[0].index == 0 and len(outputs) == 1 and \
                    not nodes[ins[0].node].is_variable:
                may_follow[i] = ins[0].node
        backward = gradient_reads(graph, grad)
        return GraphStructure(tuple(outputs_id), tuple(variables), tuple(variable_facts), grad,
                              may_follow, outputs_id, _shared_params(nodes, outputs_id),
                              np.array(tensor_facts, dtype=np.int64), tuple(facts), backward,
                              _refetching(graph, backward))

    def keeps_input(self, graph: Graph, member: int, j: int) -> bool:
        """Whether operator ``member``'s gradient reads its input ``j`` (so a converted copy
        of it lives until the backward pass)."""
        reads = self.backward.get(member)
        return reads is not None and j in reads[0]

    def ports(self, graph: Graph) -> "Ports":
        """The graph's operator inputs and tensors as arrays (:class:`Ports`), made once."""
        if None not in self.port_memo:
            self.port_memo[None] = Ports.of(self, graph)
        return self.port_memo[None]

    def op_arrays(self) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """:attr:`ops`, and :attr:`may_follow` as arrays ``(operators, producers)``, in
        operator order. Made once."""
        if "ops" not in self.port_memo:
            self.port_memo["ops"] = (
                np.array(self.ops, dtype=np.int64),
                (np.fromiter(self.may_follow.keys(), np.int64, len(self.may_follow)),
                 np.fromiter(self.may_follow.values(), np.int64, len(self.may_follow))))
        return self.port_memo["ops"]

    def names(self, graph: Graph) -> list[str]:
        """Each node's name, in node order. Made once."""
        if "names" not in self.port_memo:
            self.port_memo["names"] = [n.name for n in graph.nodes]
        return self.port_memo["names"]

    def refetches(self, graph: Graph) -> np.ndarray:
        """Per node: whether it is one of :attr:`refetching`. Made once."""
        if "refetching" not in self.port_memo:
            found = np.zeros(len(graph.nodes), dtype=bool)
            found[np.fromiter(self.refetching, np.int64, len(self.refetching))] = True
            self.port_memo["refetching"] = found
        return self.port_memo["refetching"]

    def read_by_gradient(self, graph: Graph) -> np.ndarray:
        """Per port (:meth:`ports`): whether its reader's gradient reads it (so a converted
        copy of it lives until the backward pass: :meth:`keeps_input`). Made once."""
        if "gradient" not in self.port_memo:
            ports = self.ports(graph)
            read = np.zeros(len(ports.member), dtype=bool)
            # by the input positions read (one object per distinct set: gradient_reads)
            reads = list(self.backward.values())
            ops = np.fromiter(self.backward.keys(), np.int64, len(reads))
            _, first, which = np.unique(np.fromiter((id(r[0]) for r in reads), np.int64,
                                                    len(reads)),
                                        return_index=True, return_inverse=True)
            which = which.reshape(-1)
            for k, f in enumerate(first.tolist()):
                starts = ports.start[ops[which == k]]
                for j in reads[f][0]:
                    read[starts + j] = True
            self.port_memo["gradient"] = read
        return self.port_memo["gradient"]

    def port_flags(self, graph: Graph, refetch: bool, kept_tensors: frozenset,
                   weighted: bool) -> tuple[np.ndarray, np.ndarray]:
        """Per port (:meth:`ports`): whether its reader re-fetches it for the backward pass
        (``refetch``, the tensor not in ``kept_tensors``), and whether a converted copy of
        it lives until the backward pass (``weighted``: priced with a memory weight; where
        it is not fetched again). Made once per options."""
        key = (refetch, kept_tensors, weighted)
        if key not in self.port_memo:
            ports = self.ports(graph)
            again = np.zeros(len(ports.member), dtype=bool)
            if refetch and self.refetching:
                again = self.refetches(graph)[ports.member]
                if kept_tensors:
                    kept_tensor = np.zeros(int(ports.tensor_start[-1]), dtype=bool)
                    kept_tensor[[int(ports.tensor_start[i]) + k for i, k in kept_tensors]] = True
                    again &= ~kept_tensor[ports.tensor]
            kept = np.zeros(len(ports.member), dtype=bool)
            if weighted:        # the inputs gradients read
                kept = self.read_by_gradient(graph) & ~again
            self.port_memo[key] = again, kept
        return self.port_memo[key]

    def remember_ties(self, key: tuple, families: tuple) -> None:
        if len(self.tie_memo) >= _TIE_MEMO_SIZE:
            self.tie_memo.pop(next(iter(self.tie_memo)))
        self.tie_memo[key] = families


@dataclass(frozen=True)
class Ports:
    """Every operator input (a *port*: operator ``i``'s input ``j`` is port
    ``start[i] + j``) and every tensor (output ``k`` of node ``i`` is tensor
    ``tensor_start[i] + k``), as arrays a cut indexes in bulk."""

    start: np.ndarray          # node -> its first port
    tensor_start: np.ndarray   # node -> its first tensor
    member: np.ndarray         # port -> the operator reading
    input: np.ndarray          # port -> its input position
    source: np.ndarray         # port -> the node producing what it reads
    tensor: np.ndarray         # port -> the tensor it reads
    facts: np.ndarray          # port -> id of the tensor's (itemsize, needs gradient)

    @staticmethod
    def of(structure: "GraphStructure", graph: Graph) -> "Ports":
        nodes = graph.nodes
        reads = np.fromiter(map(len, (n.inputs for n in nodes)), np.int64, len(nodes))
        start = np.zeros(len(nodes) + 1, dtype=np.int64)
        np.cumsum(reads, out=start[1:])
        tensor_start = np.zeros(len(nodes) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, (n.outputs for n in nodes)), np.int64, len(nodes)),
                  out=tensor_start[1:])
        # each operator's inputs, end to end, in node and input order
        entries = list(chain.from_iterable(n.inputs for n in nodes))
        source = np.fromiter(map(attrgetter("node"), entries), np.int64, len(entries))
        index = np.fromiter(map(attrgetter("index"), entries), np.int64, len(entries))
        member = np.repeat(np.arange(len(nodes), dtype=np.int64), reads)
        tensor = tensor_start[source] + index
        return Ports(start, tensor_start, member, np.arange(len(member)) - start[member],
                     source, tensor, structure.tensor_facts[tensor])


def _shared_params(nodes, ops: Mapping[int, int]) -> tuple[tuple[int, ...], ...]:
    """The operators reading each parameter that two or more operators read (``ops``: the
    operators, in order)."""
    readers: dict[int, set[int]] = {}
    for i in ops:
        for e in nodes[i].inputs:
            if nodes[e.node].kind == "param":
                readers.setdefault(e.node, set()).add(i)
    return tuple(tuple(sorted(r)) for r in readers.values() if len(r) > 1)


@functools.lru_cache(maxsize=64)
def itemsize_of(dtype: str) -> int:
    """Bytes of one element of ``dtype`` (a dtype's name)."""
    return np.dtype(dtype).itemsize


def needs_grad_of(graph: Graph) -> dict[tuple[int, int], bool]:
    """Whether each tensor carries a gradient: parameters do, and whatever is computed from
    them, except through an operator that declares no gradient (BlockGrad, argmax)."""
    grad: dict[tuple[int, int], bool] = {}
    current = generation()
    passes: dict[tuple, bool] = {}      # (operator, attributes) -> whether it has a gradient
    for i, node in enumerate(graph.nodes):
        if node.is_variable:
            grad[(i, 0)] = node.kind == "param"
            continue
        key = (node.op, node.attrs)
        has = passes.get(key)
        if has is None:
            has = passes[key] = _passes_gradient(node.op, node.attrs, current)
        flows = False
        if has:
            for e in node.inputs:
                if grad[(e.node, e.index)]:
                    flows = True
                    break
        if len(node.outputs) == 1:
            grad[(i, 0)] = flows
        else:
            for k in range(len(node.outputs)):
                grad[(i, k)] = flows
    return grad


def _refetching(graph: Graph, backward: Mapping[int, tuple[frozenset[int], frozenset[int]]]
                ) -> frozenset[int]:
    """The operators :func:`refetches_inputs` holds true of, found in one pass:
    ``backward`` (:func:`~nnvm_passes.backward.gradient_reads`) has the operators with a
    gradient, and what each reads."""
    current = generation()
    runs: dict[tuple, bool] = {}        # (operator, attributes) -> whether it may run again
    nodes = graph.nodes
    found = []
    for i, (ins, _) in backward.items():
        if not ins:
            continue
        node = nodes[i]
        key = (node.op, node.attrs)
        again = runs.get(key)
        if again is None:
            again = runs[key] = _may_run_again(node.op, node.attrs, current)
        if again and _rereads(nodes, node, ins):
            found.append(i)
    return frozenset(found)


def _rereads(nodes, node, ins: frozenset[int]) -> bool:
    """The rest of :func:`refetches_inputs`' rule, for an operator with a gradient that may
    run again: its gradient reads some input (positions ``ins``), and it reads no auxiliary
    state (which a second run would update twice)."""
    return bool(ins) and not any(nodes[e.node].kind == "aux" for e in node.inputs)


def refetches_inputs(graph: Graph, i: int, needs_grad: Mapping[tuple[int, int], bool],
                     reads: tuple[frozenset[int], frozenset[int]] | None = None) -> bool:
    """Whether operator ``i`` re-fetches its converted inputs for the backward pass instead of
    keeping them (``SearchOptions.refetch``): the rewrite marks the conversions and the
    operator for MXNet's mirroring, so the backward pass builds them, and runs the operator,
    again. It does when its gradient reads some input, and running it again gives the same
    values: a described operator, not random, declaring ``recompute`` (OpFacts), with no
    auxiliary state (which a second run would update twice). ``reads``: its
    :func:`~nnvm_passes.backward.backward_reads`, if known."""
    node = graph.nodes[i]
    if node.is_variable or not _may_run_again(node.op, node.attrs, generation()) or \
            not any(needs_grad[(i, k)] for k in range(len(node.outputs))):
        return False
    return _rereads(graph.nodes, node, (backward_reads(node, graph) if reads is None else reads)[0])


@functools.lru_cache(maxsize=1 << 12)
def _may_run_again(op: str, attrs: FrozenDict, _generation: int) -> bool:
    """A described operator whose facts let it run again (cached per registry generation)."""
    if lookup(op, Attrs(attrs)) is None:
        return False
    found = facts(op, Attrs(attrs))
    return found.recompute and not found.random and found.gradient


@functools.lru_cache(maxsize=1 << 12)
def _passes_gradient(op: str, attrs: FrozenDict, _generation: int) -> bool:
    """``facts(op).gradient`` for a node's raw attributes (cached per registry generation)."""
    return facts(op, Attrs(attrs)).gradient


__all__ = ["GraphStructure", "itemsize_of", "needs_grad_of", "refetches_inputs"]
