"""Emit: a :class:`~nnvm_passes.program.Program` becomes an ordinary MXNet graph (JSON) with
one ctx group per device.

Each step becomes the MXNet operators that run it, in the step's device's group ``dev<d>``
(a share marked ``tagged=False`` goes without a group: MXNet places it with its first input):

=========  ==============================================================================
step       MXNet operators
=========  ==============================================================================
VARIABLE   a variable ``<name>@dev<d>``
SHARE      the operator, named ``<name>@dev<d>``, with the share's attributes
SLICE      ``SliceChannel`` (equal pieces)
SPLIT      ``_split_v2`` (pieces at offsets)
CROP       ``slice_axis`` where one axis is cut (it copies that piece only, as a
           convolution's halo rows from its neighbour), else ``slice``
STACK      ``_npi_concatenate`` (:data:`JOIN`), except along the last axis with a
           larger axis before it: ``stack`` then ``Reshape``, as MXNet's CPU concatenation
           along the last axis is about twice as slow (forward and backward, with a loss,
           medians of 50: 2 x (16, 256) float32 pieces 179 against 124 us, 2 x (64, 4096)
           6.7 against 3.3 ms, 2 x (16, 64, 8, 8) along axis 3 1.7 against 1.0 ms), while
           along an inner axis with axes after it the two are equal (2 x (16, 64, 32, 32)
           along axis 1: 13.8 and 13.9 ms; 2 x (16, 16, 512) along axis 1: 1.71 and 1.72
           ms) and one node is one launch fewer. Neither's gradient reads its inputs
CONCAT     ``_npi_concatenate``
COMBINE    ``add_n``, or a chain of ``_maximum`` / ``_minimum``
SEND       ``_copy`` on the holder
PLACE      ``_copy`` on the device
RELAY      ``_copy`` on the device
RERUN      ``_copy`` marked to run again in the backward pass (kernels such as Convolution
           refuse to run with nothing to write), then an unmarked ``_copy`` (so that readers
           run again read what the forward pass kept there, not the share run once more)
PAD        ``_full``
SCALE      ``_mul_scalar``
ZERO       ``zeros_like``, ``sum`` (and ``Cast`` to the head's dtype)
TOTAL      ``add_n`` of the zeros (if more than one), ``reshape`` to the head's rank
ADD        ``broadcast_add``
=========  ==============================================================================

A step marked ``again`` sets ``__force_mirroring__`` (MXNet's gradient pass then builds it
again in the backward pass). No two nodes but SENDs are alike (:data:`DISTINCT`), so MXNet
runs each step, and each value has the readers the Program gives it. MXNet inserts
``_CrossDeviceCopy`` between groups. Names are made unique in the order the steps come
(``name#2``, ...).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from nnvm_passes.backward import MIRROR
from nnvm_passes.ir import format_attr_value
from nnvm_passes.program import Combine, Program, Ref, Step, StepKind, VarShard
from tofu_mx.devices import group_name

#: how emitted nodes are counted in :attr:`RewriteResult.counts`, by step kind
ROLES = {StepKind.SHARE: "operator", StepKind.SLICE: "split", StepKind.SPLIT: "split",
         StepKind.CROP: "split",
         StepKind.STACK: "concat", StepKind.CONCAT: "concat", StepKind.COMBINE: "combine",
         StepKind.SEND: "send", StepKind.PLACE: "send", StepKind.RELAY: "relay",
         StepKind.RERUN: "rerun",
         StepKind.PAD: "pad", StepKind.SCALE: "scale", StepKind.ZERO: "keep",
         StepKind.TOTAL: "keep", StepKind.ADD: "keep"}
#: the operator joining pieces (CONCAT, and STACK but where :func:`_stacked`): NumPy's
#: ``concatenate``, one node whose gradient reads no input (``ElemwiseGradUseNone``), so the
#: pieces are freed after the forward pass. ``Concat``'s gradient, in MXNet's MKLDNN builds
#: (the pip wheels), reads every piece, which then stays until the backward pass; ``stack`` +
#: ``Reshape`` read none but are two nodes. It runs in a legacy (not NumPy-mode) graph on
#: every device as ``Concat`` does.
JOIN = "_npi_concatenate"


def _stacked(shape: tuple, axis: int) -> bool:
    """Pieces of one size joined into ``shape`` along ``axis`` run as ``stack`` + ``Reshape``
    rather than :data:`JOIN`: along the last axis, with an axis of more than one before it
    (the table above says why)."""
    return axis == len(shape) - 1 and any(n > 1 for n in shape[:axis])


_COMBINE_OPS = {Combine.MAX: "_maximum", Combine.MIN: "_minimum"}
#: the attribute telling apart nodes that would be alike (one operator, inputs and
#: attributes: the RELAYs of one value on one device, two equal shares): MXNet's
#: common-expression elimination (MXNET_ELIMINATE_COMMON_EXPR, on by default) would make
#: them one node, read by all their readers, which is what the RELAYs are there to prevent
#: (:func:`nnvm_passes.program.bounded_reads`). The SENDs of one value to several devices
#: are left alike: MXNet makes them one copy (one buffer where each would be one: a
#: variable's copy has its own), and ``bounded_reads`` counts their readers together.
DISTINCT = "__tofu_distinct__"


@dataclass
class RewriteResult:
    json: dict
    shards: list[VarShard]
    counts: dict[str, int] = field(default_factory=dict)   # nodes emitted, by role


class _Emit:
    def __init__(self, program: Program):
        self.program = program
        self.nodes: list[dict] = []
        self.names: set[str] = set()
        self.counts: dict[str, int] = {}
        self.made: list[int] = []          # step -> the node giving its outputs
        self.shares: dict[int, list[int]] = {}   # graph operator -> its shares' nodes
        self.shards: list[VarShard] = []         # the variables, as named
        self.alike: dict[tuple, tuple[int, bool]] = {}   # (operator, inputs, attributes) ->
        #                                           how many emitted, and whether all SENDs

    def _name(self, base: str) -> str:
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base}#{n}"
        self.names.add(name)
        return name

    def entry(self, ref: Ref) -> tuple[int, int]:
        return self.made[ref.step], ref.output

    def add(self, op: str, base: str, attrs: Mapping[str, Any], inputs, step: Step,
            counted: bool = True, again: bool | None = None) -> int:
        attrs = {k: v if isinstance(v, str) else format_attr_value(v)
                 for k, v in attrs.items() if k not in ("__ctx_group__", MIRROR)}
        if step.tagged:
            attrs["__ctx_group__"] = group_name(step.device)
        if step.again if again is None else again:
            attrs[MIRROR] = "True"
        key = (op, tuple(inputs), tuple(sorted(attrs.items())))
        alike, sends = self.alike.get(key, (0, True))
        send = step.kind is StepKind.SEND
        self.alike[key] = (alike + 1, sends and send)
        if alike and not (send and sends):
            attrs[DISTINCT] = str(alike)
        self.nodes.append({"op": op, "name": self._name(base), "attrs": attrs,
                           "inputs": [[n, i, 0] for n, i in inputs]})
        if counted and step.kind in ROLES:
            role = ROLES[step.kind]
            self.counts[role] = self.counts.get(role, 0) + 1
        return len(self.nodes) - 1

    def step(self, step: Step) -> int:
        """Emit ``step``; the node whose outputs are the step's."""
        ins = [self.entry(r) for r in step.inputs]
        kind = step.kind
        derived = f"{self.nodes[ins[0][0]]['name']}{step.name}" if ins else step.name
        if kind is StepKind.VARIABLE:
            nid = self.add("null", step.name, step.attrs, [], step)
            self.shards.append(dataclasses.replace(step.shard, name=self.nodes[nid]["name"]))
            return nid
        if kind is StepKind.SHARE:
            nid = self.add(step.op, step.name, step.attrs, ins, step)
            self.shares.setdefault(step.node, []).append(nid)
            return nid
        if kind is StepKind.CROP:      # slice_axis where one axis is cut, else slice
            shape = self.program.held(step.inputs[0]).shape
            cut = [a for a, (r, n) in enumerate(zip(step.region, shape)) if r != (0, n - 1)]
            if len(cut) == 1:
                (a,) = cut
                return self.add("slice_axis", derived, {
                    "axis": str(a), "begin": str(step.region[a][0]),
                    "end": str(step.region[a][1] + 1)}, ins, step)
            return self.add("slice", derived, {
                "begin": format_attr_value(tuple(lo for lo, _ in step.region)),
                "end": format_attr_value(tuple(hi + 1 for _, hi in step.region))}, ins, step)
        if kind is StepKind.SLICE:
            return self.add("SliceChannel", derived, {"num_outputs": str(step.parts),
                                                      "axis": str(step.axis)}, ins, step)
        if kind is StepKind.SPLIT:
            return self.add("_split_v2", derived, {
                "indices": format_attr_value(step.cuts), "axis": str(step.axis),
                "squeeze_axis": "False", "sections": "0"}, ins, step)
        if kind is StepKind.STACK and _stacked(step.outputs[0].shape, step.axis):
            stacked = self.add("stack", step.name + "@stack", {
                "axis": str(step.axis), "num_args": str(len(ins))}, ins, step)
            merge = format_attr_value((0,) * step.axis + (-3, -2))
            return self.add("Reshape", step.name, {"shape": merge}, [(stacked, 0)], step,
                            counted=False)
        if kind in (StepKind.STACK, StepKind.CONCAT):
            return self.add(JOIN, step.name, {"axis": str(step.axis),
                                              "num_args": str(len(ins))}, ins, step)
        if kind is StepKind.COMBINE:
            if step.combine is Combine.SUM:
                return self.add("add_n", step.name, {"num_args": str(len(ins))}, ins, step)
            acc = ins[0]
            for other in ins[1:]:
                acc = (self.add(_COMBINE_OPS[step.combine], step.name, {}, [acc, other], step),
                       0)
            return acc[0]
        if kind in (StepKind.SEND, StepKind.PLACE, StepKind.RELAY):
            return self.add("_copy", derived, {}, ins, step)
        if kind is StepKind.RERUN:
            j = step.inputs[0].output
            marked = self.add("_copy", f"{step.name}@rerun{j}", {}, ins, step, again=True)
            return self.add("_copy", f"{step.name}@held{j}", {}, [(marked, 0)], step)
        if kind is StepKind.PAD:
            held = step.outputs[0]
            return self.add("_full", step.name, {"shape": format_attr_value(held.shape),
                                                 "value": repr(step.value),
                                                 "dtype": held.dtype}, [], step)
        if kind is StepKind.SCALE:
            return self.add("_mul_scalar", step.name, {"scalar": repr(step.value)}, ins, step)
        if kind is StepKind.ZERO:
            zeros = self.add("zeros_like", f"{step.name}@zeros", {}, ins, step)
            zero = self.add("sum", f"{step.name}@kept", {}, [(zeros, 0)], step)
            dtype = step.outputs[0].dtype
            if self.program.held(step.inputs[0]).dtype != dtype:
                zero = self.add("Cast", f"{step.name}@kept_cast", {"dtype": dtype},
                                [(zero, 0)], step)
            return zero
        if kind is StepKind.TOTAL:
            total = ins[0] if len(ins) == 1 else (self.add(
                "add_n", f"{step.name}@kept", {"num_args": str(len(ins))}, ins, step), 0)
            return self.add("reshape", f"{step.name}@kept_b", {
                "shape": format_attr_value(step.outputs[0].shape)}, [total], step)
        if kind is StepKind.ADD:
            return self.add("broadcast_add", derived, {}, ins, step)
        raise AssertionError(f"no emission for {kind}")

    def run(self, ordered: bool) -> RewriteResult:
        for step in self.program.steps:
            self.made.append(self.step(step))
        if ordered:
            self.order()
        heads = [self.entry(r) for r in self.program.heads]
        js = {"nodes": self.nodes,
              "arg_nodes": [i for i, n in enumerate(self.nodes) if n["op"] == "null"],
              "heads": [[n, i, 0] for n, i in heads],
              "attrs": {"mxnet_version": ["int", 10901]}}
        return RewriteResult(js, self.shards, dict(sorted(self.counts.items())))

    def order(self) -> None:
        """Tofu's memory order: every share of an operator gets control dependencies on all
        shares of the operator before it in the original graph's order, so that MXNet's
        topological order (the order its memory planner assumes) runs the partitioned
        operators as the original ran them, not one device's chain after another's."""
        ops = sorted(self.shares)
        for prev, cur in zip(ops, ops[1:]):
            for nid in self.shares[cur]:
                self.nodes[nid]["control_deps"] = list(self.shares[prev])


def emit(program: Program, ordered: bool = False) -> RewriteResult:
    """The MXNet graph (JSON) running ``program``, and its variables. ``ordered``: add Tofu's
    control dependencies (:meth:`_Emit.order`). Off by default: measured in
    bench/partition.py, they change MXNet's planned allocation by under 1%."""
    return _Emit(program).run(ordered)
