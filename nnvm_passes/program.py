"""The Program: what each device of a partitioned graph runs, and every move between them.

:func:`route` turns the imported graph and an assignment (what each device computes of every
operator and stores of every tensor, :mod:`tofu_mx.runtime.assign`) into a :class:`Program`:
a flat list of typed :class:`Step` values, each on one device, reading earlier steps'
outputs. :func:`nnvm_passes.emit.emit` makes it an MXNet graph; the drawing, the operator
counts and the bytes crossing devices read it, so that nothing else re-derives the routing.

Routing decides nothing the plan has not decided; it builds, lazily from the graph's outputs
backwards (so a share nobody reads is never made):

- each operator's share on device ``d`` as one :attr:`StepKind.SHARE`;
- each variable as one :attr:`StepKind.VARIABLE` per distinct stored box, on the first
  device storing that box; auxiliary states (mutated in place) get one per device that
  updates them;
- a value read on another device is read there directly (MXNet inserts the
  ``_CrossDeviceCopy``), or through a :attr:`StepKind.SEND` on the device holding it where
  the sum of its gradients must be made on that device (see :meth:`_Route.send`);
- an operator whose outputs are regions of its input 0 (a SliceChannel share holding parts
  of pieces) runs no step: each output is that region; one that may also run (holding
  whole pieces) is read so where its pieces lie in different stored boxes of the input,
  rather than joined and cut again (:meth:`_Route.apart`);
- conversions: a region of a tensor on a device is cut out of the stored boxes it overlaps
  (:attr:`~StepKind.SLICE` into equal pieces, :attr:`~StepKind.SPLIT` at any offsets) on
  the device holding them, and joined (:attr:`~StepKind.STACK` for pieces of one size,
  :attr:`~StepKind.CONCAT` otherwise) on the device needing it; padding is a
  :attr:`~StepKind.PAD` block; partial outputs are combined (:attr:`~StepKind.COMBINE`) on
  the device storing the result; a cut of which one piece is read becomes a
  :attr:`~StepKind.CROP` of that piece, and a chain of them one (:func:`cropped_cuts`);
- re-fetching (an operator assigned ``refetch``): its converted inputs are built apart, each
  step marked ``again`` (MXNet's ``__force_mirroring__``): MXNet's gradient pass builds them
  again in the backward pass from the stored shards, so nothing converted is held from the
  forward pass to the backward: the share runs twice (its outputs go through a
  :attr:`~StepKind.RERUN`) and its remote pieces cross twice. Every remote piece goes
  through its own marked SEND on the device holding it, so that the backward pass's
  cross-device copy is not the forward pass's (MXNet makes one per tensor and device,
  which would be held).

The graph's outputs are joined whole on device 0, so the partitioned graph has the
original's outputs and shapes; or (``route(..., join_outputs=False)``) each output is
returned as the pieces the plan stores it in, each on a device storing it
(:attr:`Program.pieces` says which part of which output each is), so that no device holds a
whole output it would not hold otherwise. Every step records what it was built for (an
:class:`Account`): the bytes crossing devices into it are booked there.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from nnvm_passes.backward import passes_gradient_through
from nnvm_passes.ir import FrozenDict, Graph, Interleave
from tofu_mx.errors import TofuError

Box = tuple[tuple[int, int], ...]
Tensor = tuple[int, int]          # (graph node index, output index)


class StepKind(enum.Enum):
    """What a step does (:mod:`nnvm_passes.emit` says which MXNet operators run it)."""

    VARIABLE = "variable"    # a stored box of one of the graph's variables
    SHARE = "share"          # one device's share of one of the graph's operators
    SLICE = "slice"          # cut into ``parts`` equal pieces along ``axis``; output j: piece j
    SPLIT = "split"          # cut at the offsets ``cuts`` along ``axis``; output j: piece j
    STACK = "stack"          # pieces of one size joined along ``axis``
    CONCAT = "concat"        # pieces joined along ``axis``
    COMBINE = "combine"      # partial outputs combined by ``combine``
    SEND = "send"            # a copy on the holder, for readers on device ``to``
    PLACE = "place"          # a copy made on this device (for an operator placed by input 0)
    RERUN = "rerun"          # a share's output, when the backward pass runs the share again
    PAD = "pad"              # a block of ``value`` of shape ``shape`` and dtype ``dtype``
    SCALE = "scale"          # the input times ``value``
    ZERO = "zero"            # an exact zero (as ``dtype``) that reads a variable's box
    TOTAL = "total"          # the sum of zeros, shaped ``(1,) * len(shape)``
    ADD = "add"              # input 0 plus input 1 (broadcast)
    RELAY = "relay"          # a copy on this device read by some of a value's readers
    CROP = "crop"            # the part ``region`` of input 0 (a cut of which one piece is
    #                          read, or a chain of such cuts: :func:`cropped_cuts`)


class Combine(enum.Enum):
    SUM = "sum"
    MAX = "max"
    MIN = "min"


class Purpose(enum.Enum):
    READ = "read"            # an operator's input (``node``, ``input``)
    COMBINE = "combine"      # an operator's outputs into their stored layout (``node``)
    OUTPUT = "output"        # the graph's output ``node`` (an index into its heads)
    KEEP = "keep"            # a variable box nobody reads, kept in the graph (``node``)


@dataclass(frozen=True)
class Account:
    """What a step was built for."""

    purpose: Purpose
    node: int
    input: int = 0


@dataclass(frozen=True, init=False)
class Ref:
    """Output ``output`` of step ``step``."""

    step: int
    output: int = 0

    def __init__(self, step: int, output: int = 0):
        # written out (routing makes hundreds of thousands): see nnvm_passes.ir.Entry
        fields = self.__dict__
        fields["step"] = step
        fields["output"] = output


@dataclass(frozen=True)
class Held:
    """What one output of a step holds: tensor ``tensor``'s values in ``box`` (beyond the
    tensor's bounds: padding), or, with ``tensor`` None, one of the rewrite's own values."""

    tensor: Tensor | None
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class VarShard:
    """One variable of the partitioned graph: a box of an original variable on a device
    (of the variable as the graph lays it out: ``layout``, where it is not the caller's)."""

    name: str
    source: str
    kind: str                 # param | aux | data | label
    device: int
    box: Box
    dtype: str
    layout: Interleave | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(hi - lo + 1 for lo, hi in self.box)

    @property
    def slices(self) -> tuple[slice, ...]:
        """The box as an index into the whole array as the graph lays it out (the caller's
        where ``layout`` is None): use :meth:`take` and :meth:`put` on the caller's."""
        return tuple(slice(lo, hi + 1) for lo, hi in self.box)

    def index(self, shape: Sequence[int]) -> tuple:
        """Where the shard lies in the caller's whole array of ``shape`` (NumPy indexing:
        slices, and an array of positions along an interleaved axis)."""
        index: list = list(self.slices)
        if self.layout is not None:
            a = self.layout.axis
            index[a] = self.layout.order(shape[a])[index[a]]
        return tuple(index)

    def take(self, whole: np.ndarray) -> np.ndarray:
        """This shard of the caller's whole array (NumPy)."""
        return whole[self.index(whole.shape)]

    def put(self, whole: np.ndarray, value: Any) -> None:
        """Write this shard's ``value`` into the caller's whole array (NumPy)."""
        whole[self.index(whole.shape)] = value


@dataclass(frozen=True)
class Step:
    """One step of a :class:`Program` on device ``device``, reading ``inputs``. Only the
    fields of its kind are set (see :class:`StepKind`)."""

    kind: StepKind
    device: int
    inputs: tuple[Ref, ...]
    outputs: tuple[Held, ...]
    account: Account | None
    name: str = ""                  # display name (SLICE, SPLIT, SEND, PLACE, ADD: a suffix
    #                                 of their input's)
    again: bool = False             # built again in the backward pass (force mirroring)
    node: int | None = None         # SHARE, VARIABLE: the graph's node
    op: str = ""                    # SHARE: the MXNet operator
    attrs: FrozenDict = FrozenDict()  # SHARE, VARIABLE: MXNet attributes (raw values)
    reads: tuple[int, ...] = ()     # SHARE: the graph input index of each of ``inputs``
    tagged: bool = True             # SHARE: in its device's group (else placed by input 0)
    axis: int = 0                   # SLICE, SPLIT, STACK, CONCAT
    parts: int = 0                  # SLICE
    cuts: tuple[int, ...] = ()      # SPLIT: the offsets where pieces start
    region: Box = ()                # CROP: per axis of input 0, the first and last index kept
    combine: Combine | None = None  # COMBINE
    value: float = 0.0              # PAD: the value; SCALE: the factor
    to: int | None = None           # SEND: the reading device
    shard: VarShard | None = None   # VARIABLE

    def reading(self, inputs: tuple[Ref, ...]) -> "Step":
        """This step reading ``inputs`` instead (``dataclasses.replace``'s result, made
        without its checks: a pass renumbers every step after the first it drops)."""
        if inputs == self.inputs:
            return self
        step = object.__new__(Step)
        step.__dict__.update(self.__dict__)
        step.__dict__["inputs"] = inputs
        return step

    def read_account(self, position: int) -> Account | None:
        """What reading input ``position`` is for: a share's operator input, else this
        step's own account."""
        if self.kind is StepKind.SHARE:
            return Account(Purpose.READ, self.node, self.reads[position])
        return self.account


@dataclass(frozen=True)
class Crossing:
    """A value MXNet copies from its device to ``device`` (once, however many read it)."""

    ref: Ref
    source: int
    device: int
    nbytes: int
    account: Account | None


@dataclass(frozen=True)
class Program:
    """Every step of the partitioned graph in the order it was built (inputs first), its
    outputs (``heads``: the graph's outputs whole, on device 0, or with ``pieces`` their
    stored pieces), and per operator of the graph the devices running a share of it
    (``placement``; an operator whose outputs are regions of its input, which no step runs,
    included)."""

    steps: tuple[Step, ...]
    heads: tuple[Ref, ...]
    num_devices: int
    placement: Mapping[int, tuple[int, ...]]
    #: for each head, ``(output, box)``: which of the graph's outputs it is a piece of, and
    #: the piece's box; empty where every head is the graph's output of its position, whole
    pieces: tuple[tuple[int, Box], ...] = ()
    #: the devices of one group a value crossing groups is sent to once (0: not routed so)
    group_size: int = 0

    @property
    def shards(self) -> tuple[VarShard, ...]:
        return tuple(s.shard for s in self.steps if s.kind is StepKind.VARIABLE)

    def held(self, ref: Ref) -> Held:
        return self.steps[ref.step].outputs[ref.output]

    def crossings(self) -> list[Crossing]:
        """What MXNet copies between devices in one forward pass: every value read on
        another device than its maker's, once per reading device, booked to the account of
        its first reader there (an operator's input ``j``: ``READ(op, j)``)."""
        seen: set[tuple[Ref, int]] = set()
        out = []
        for step in self.steps:
            for pos, ref in enumerate(step.inputs):
                source = self.steps[ref.step].device
                if source == step.device or (ref, step.device) in seen:
                    continue
                seen.add((ref, step.device))
                out.append(Crossing(ref, source, step.device, self.held(ref).nbytes,
                                    step.read_account(pos)))
        return out

    def outputs_read(self) -> dict[int, set[int]]:
        """Step -> the positions of its outputs some step or the graph's outputs read."""
        out: dict[int, set[int]] = {}
        for ref in (r for step in self.steps for r in step.inputs):
            out.setdefault(ref.step, set()).add(ref.output)
        for ref in self.heads:
            out.setdefault(ref.step, set()).add(ref.output)
        return out

    def steps_per_device(self) -> list[dict[StepKind, int]]:
        """Steps of each kind on each device."""
        out: list[dict[StepKind, int]] = [{} for _ in range(self.num_devices)]
        for step in self.steps:
            if step.kind is not StepKind.VARIABLE:
                counts = out[step.device]
                counts[step.kind] = counts.get(step.kind, 0) + 1
        return out


def _intersect(a: Box, b: Box) -> Box | None:
    out = []
    for (a_lo, a_hi), (b_lo, b_hi) in zip(a, b):
        lo, hi = max(a_lo, b_lo), min(a_hi, b_hi)
        if lo > hi:
            return None
        out.append((lo, hi))
    return tuple(out)


def _shape(box: Box) -> tuple[int, ...]:
    return tuple(hi - lo + 1 for lo, hi in box)


class _Route:
    def __init__(self, graph: Graph, assignment: Any):
        self.graph, self.assignment = graph, assignment
        self.k = assignment.num_devices
        self.steps: list[Step] = []
        self.memo: dict[tuple, Any] = {}
        self.placement: dict[int, list[int]] = {}
        self.readers = graph.consumers()

    def add(self, step: Step) -> int:
        self.steps.append(step)
        return len(self.steps) - 1

    def suffix(self, device: int) -> str:
        return "" if self.k == 1 else f"@dev{device}"

    def held(self, t: Tensor, box: Box | None) -> Held:
        info = self.graph.nodes[t[0]].outputs[t[1]]
        return Held(t, info.shape if box is None else _shape(box), info.dtype)

    def value(self, ref: Ref) -> Held:
        return self.steps[ref.step].outputs[ref.output]

    def name(self, t: Tensor, d: int) -> str:
        return f"{self.graph.nodes[t[0]].name}{self.suffix(d)}"

    # --- variables --------------------------------------------------------------------------
    def cells(self, t: Tensor) -> dict[Box, list[int]]:
        """Distinct stored boxes of tensor ``t`` and the devices storing each."""
        key = ("cells", t)
        if key not in self.memo:
            found: dict[Box, list[int]] = {}
            for d, box in enumerate(self.assignment.stored[t]):
                found.setdefault(box, []).append(d)
            self.memo[key] = found
        return self.memo[key]

    def variable(self, i: int, box: Box, device: int, account: Account) -> Ref:
        key = ("var", i, box, device)
        if key not in self.memo:
            node = self.graph.nodes[i]
            shard = VarShard(node.name + self.suffix(device), node.name, node.kind, device, box,
                             node.outputs[0].dtype, self.graph.layouts.get(node.name))
            self.memo[key] = Ref(self.add(Step(
                StepKind.VARIABLE, device, (), (self.held((i, 0), box),), account, shard.name,
                node=i, attrs=node.attrs, shard=shard)))
        return self.memo[key]

    def send(self, ref: Ref, d: int, account: Account, again: bool = False) -> Ref:
        """``ref`` for readers on device ``d``. MXNet inserts the cross-device copy; routing
        adds a SEND on the device holding ``ref`` (one per reading device) only where the
        sum of ``ref``'s gradients must be made on that device: MXNet places a gradient sum
        on one of its readers' devices, so without it a variable's gradient could be summed
        away from the variable (which cannot bind), and so could the gradient of an operator
        that hands its output gradient to its inputs unchanged (``elemwise_add``, a SUM
        combine: :func:`passes_gradient_through`). Every other operator's gradient node
        sits in its own ctx group and reads the sum wherever it was made. ``again``:
        re-fetched in the backward pass, always through a marked SEND."""
        src = self.steps[ref.step].device
        if src == d:
            return ref
        key = ("send", ref, d, again)
        if key not in self.memo:
            self.memo[key] = Ref(self.add(Step(
                StepKind.SEND, src, (ref,), (self.value(ref),),
                account, f"@to{d}", again=again, to=d))) \
                if again or self.needs_copy(ref) else ref
        return self.memo[key]

    def on_device(self, ref: Ref, d: int, account: Account, again: bool = False) -> Ref:
        """``ref`` made by a step of device ``d`` (a PLACE there if it lives elsewhere)."""
        if self.steps[ref.step].device == d:
            return ref
        key = ("on", ref, d, again)
        if key not in self.memo:
            self.memo[key] = Ref(self.add(Step(
                StepKind.PLACE, d, (ref,), (self.value(ref),),
                account, f"@on{d}", again=again)))
        return self.memo[key]

    def needs_copy(self, ref: Ref) -> bool:
        return self.needs_copy_of(self.graph, self.steps[ref.step])

    @staticmethod
    def needs_copy_of(graph: Graph, step: Step) -> bool:
        """Whether the sum of ``step``'s output gradients must be made on its device (see
        :meth:`send`)."""
        if step.kind is StepKind.VARIABLE:
            return True
        if step.kind is StepKind.SHARE:
            return passes_gradient_through(graph.nodes[step.node], graph)
        return step.kind is StepKind.COMBINE and step.combine is Combine.SUM

    # --- operators --------------------------------------------------------------------------
    def instance(self, i: int, d: int) -> list[Ref]:
        key = ("op", i, d)
        if key in self.memo:
            return self.memo[key]
        node, share = self.graph.nodes[i], self.assignment.ops[i].shares[d]
        refetch, kept = self.assignment.ops[i].refetch, self.assignment.ops[i].kept
        self.placement.setdefault(i, []).append(d)
        if share.views is not None and (not share.runs or self.apart(i, share.views)):
            # no operator: each output is a region of input 0
            entry = node.inputs[0]
            outs = [self.region((entry.node, entry.index), box, d, share.pads[0],
                                Account(Purpose.READ, i, 0))
                    for box in share.views]
            self.memo[key] = outs
            return outs
        inputs, reads = [], []
        for j, (entry, box) in enumerate(zip(node.inputs, share.inputs)):
            if box is None:
                continue
            reads.append(j)
            account = Account(Purpose.READ, i, j)
            src = self.graph.nodes[entry.node]
            if src.is_variable and src.kind == "aux":
                inputs.append(self.variable(entry.node, box, d, account))
            else:
                inputs.append(self.region((entry.node, entry.index), box, d, share.pads[j],
                                          account, refetch and j not in kept))
        tagged = not self.assignment.ops[i].placed_by_input
        if not tagged and inputs:    # MXNet places it with its first input: that must be on d
            inputs[0] = self.on_device(inputs[0], d, Account(Purpose.READ, i, reads[0]),
                                       refetch and reads[0] not in kept)
        # run again in the backward pass only where that re-fetches a converted input
        rerun = any(self.steps[r.step].again and self.steps[r.step].kind is not StepKind.SHARE
                    for r in inputs)
        outputs = tuple(self.held((i, j), box) for j, box in enumerate(share.outputs))
        sid = self.add(Step(StepKind.SHARE, d, tuple(inputs), outputs, None,
                            self.name((i, 0), d), again=rerun, node=i, op=node.op,
                            attrs=share.attrs, reads=tuple(reads), tagged=tagged))
        outs = [Ref(sid, j) for j in range(len(node.outputs))]
        if rerun:
            outs = [Ref(self.add(Step(StepKind.RERUN, d, (o,), (outputs[o.output],), None,
                                      self.name((i, 0), d))))
                    for o in outs]
        if share.scale is not None and share.scale != 1.0:
            outs = [Ref(self.add(Step(StepKind.SCALE, d, (o,), (self.value(o),), None,
                                      f"{self.name((i, 0), d)}@scale",
                                      value=float(share.scale))))
                if box is not None else o for o, box in zip(outs, share.outputs)]
        self.memo[key] = outs
        return outs

    def apart(self, i: int, views: tuple[Box, ...]) -> bool:
        """Whether operator ``i``'s share reads ``views`` (regions of its input 0) rather than
        running: where each view lies in one stored box of the input, not all in the same
        one, the views are cut out of those boxes (nothing joined) where the operator would
        read them joined into one region first; unless a reader of ``i`` fetches its
        converted inputs again (``refetch``): the conversion would move into that reader's
        input, and the reader would run again in the backward pass."""
        if any(self.assignment.ops[r].refetch for r, _ in self.readers[i]
               if r in self.assignment.ops):
            return False
        entry = self.graph.nodes[i].inputs[0]
        cells = self.cells((entry.node, entry.index))
        within = set()
        for view in views:
            inside = [c for c in cells if _intersect(view, c) is not None]
            if len(inside) != 1:
                return False
            within.add(inside[0])
        return len(within) > 1

    def computed(self, t: Tensor, d: int):
        """Distinct boxes computed of ``t``, each with the devices whose shares make it (the
        contributors combined for partial outputs), preferring a group with ``d``."""
        op = self.assignment.ops[t[0]]
        by_box, partial = self._computed(t)
        out = []
        for box, options in by_box.items():
            mine = [g for g in options if d in g and not op.loss]
            out.append((box, mine[0] if mine else options[0]))
        return out, partial

    def _computed(self, t: Tensor) -> tuple[dict, Combine | None]:
        """Each distinct box computed of ``t`` -> the groups of devices computing it (for
        :meth:`computed`, once per tensor)."""
        key = ("computed", t)
        if key not in self.memo:
            op = self.assignment.ops[t[0]]
            groups: dict[tuple, list[int]] = {}
            for e, share in enumerate(op.shares):
                if share is not None:       # None: device e runs none of this operator
                    groups.setdefault((share.outputs[t[1]], share.key), []).append(e)
            by_box: dict[Box, list[list[int]]] = {}
            for (box, _), devices in groups.items():
                by_box.setdefault(box, []).append(devices)
            partial = next(s for s in op.shares if s is not None).partial
            self.memo[key] = by_box, None if partial is None else Combine(partial)
        return self.memo[key]

    def stored(self, t: Tensor, d: int) -> Ref:
        key = ("stored", t, d)
        if key in self.memo:
            return self.memo[key]
        box, account = self.assignment.stored[t][d], Account(Purpose.COMBINE, t[0])
        computed, partial = self.computed(t, d)
        pieces = []
        for c, devices in computed:
            inter = _intersect(box, c)
            if inter is None:
                continue
            if partial is None:
                src = d if d in devices and not self.assignment.ops[t[0]].loss else devices[0]
                pieces.append((inter, self.send(self.extract(
                    self.instance(t[0], src)[t[1]], c, inter, src, t, account), d, account)))
                continue
            parts = [self.send(self.extract(self.instance(t[0], e)[t[1]], c, inter, e, t,
                                            account), d, account)
                     for e in devices]
            pieces.append((inter, self.combine(parts, partial, d, t, inter, account)))
        self.memo[key] = self.assemble(pieces, box, d, t, account)
        return self.memo[key]

    def combine(self, parts: list[Ref], how: Combine, d: int, t: Tensor, box: Box,
                account: Account) -> Ref:
        if len(parts) == 1:
            return parts[0]
        return Ref(self.add(Step(StepKind.COMBINE, d, tuple(parts), (self.held(t, box),),
                                 account, f"{self.name(t, d)}@{how.value}", combine=how)))

    # --- regions ----------------------------------------------------------------------------
    def region(self, t: Tensor, box: Box, d: int, pad: float | None, account: Account,
               again: bool = False) -> Ref:
        """Tensor ``t``'s values in ``box`` on device ``d`` (outside its bounds: ``pad``);
        ``again``: every step converting it is built again in the backward pass."""
        key = ("region", t, box, d, pad, again)
        if key in self.memo:
            return self.memo[key]
        shape = self.graph.nodes[t[0]].outputs[t[1]].shape
        for a, ((lo, hi), n) in enumerate(zip(box, shape)):
            if lo >= 0 and hi < n:
                continue
            if pad is None:
                raise TofuError(f"{self.graph.nodes[t[0]].name} is read at {box} beyond its "
                                f"shape {shape} but has no pad value")
            if hi < 0 or lo >= n:      # nothing but padding
                self.memo[key] = self.constant(box, pad, d, t, account, again)
                return self.memo[key]
            inner = box[:a] + ((max(lo, 0), min(hi, n - 1)),) + box[a + 1:]
            pieces = [(inner, self.region(t, inner, d, pad, account, again))]
            if lo < 0:
                pieces.insert(0, (box[:a] + ((lo, -1),) + box[a + 1:], None))
            if hi >= n:
                pieces.append((box[:a] + ((n, hi),) + box[a + 1:], None))
            pieces = [(b, s if s is not None else self.constant(b, pad, d, t, account, again))
                      for b, s in pieces]
            self.memo[key] = self.concat([s for _, s in pieces], a, d, t, box, account,
                                         again=again)
            return self.memo[key]
        node = self.graph.nodes[t[0]]
        pieces = []
        for cell, holders in self.cells(t).items():
            inter = _intersect(box, cell)
            if inter is None:
                continue
            if node.is_variable:
                src = holders[0]
                piece = self.extract(self.variable(t[0], cell, src, account), cell, inter, src,
                                     t, account, again)
            else:
                src = d if d in holders else holders[0]
                piece = self.extract(self.stored(t, src), cell, inter, src, t, account, again)
            pieces.append((inter, self.send(piece, d, account, again)))
        self.memo[key] = self.assemble(pieces, box, d, t, account, again)
        return self.memo[key]

    def constant(self, box: Box, value: float, d: int, t: Tensor, account: Account,
                 again: bool = False) -> Ref:
        dtype = self.graph.nodes[t[0]].outputs[t[1]].dtype
        if np.isinf(value):
            value = float(np.finfo(dtype).min if value < 0 else np.finfo(dtype).max)
        return Ref(self.add(Step(StepKind.PAD, d, (), (self.held(t, box),), account,
                                 f"{self.name(t, d)}@pad", again=again, value=float(value))))

    def extract(self, ref: Ref, src: Box, target: Box, device: int, t: Tensor,
                account: Account, again: bool = False) -> Ref:
        """``target`` out of ``ref`` (holding ``src``), cut on ``device``."""
        for a, ((s0, s1), (t0, t1)) in enumerate(zip(src, target)):
            if (s0, s1) == (t0, t1):
                continue
            n, o0, o1 = s1 - s0 + 1, t0 - s0, t1 - s0 + 1
            width = o1 - o0
            if n % width == 0 and o0 % width == 0:
                key = ("cut", ref, a, n // width, again)
                if key not in self.memo:
                    pieces = [src[:a] + ((s0 + p * width, s0 + (p + 1) * width - 1),)
                              + src[a + 1:] for p in range(n // width)]
                    self.memo[key] = self.add(Step(
                        StepKind.SLICE, device, (ref,), tuple(self.held(t, b) for b in pieces),
                        account, f"@split{a}", again=again, axis=a, parts=n // width))
                ref = Ref(self.memo[key], o0 // width)
            else:
                cuts = tuple(sorted({0, o0, o1} - {n}))
                key = ("cut", ref, a, cuts, again)
                if key not in self.memo:
                    ends = cuts[1:] + (n,)
                    pieces = [src[:a] + ((s0 + lo, s0 + hi - 1),) + src[a + 1:]
                              for lo, hi in zip(cuts, ends)]
                    self.memo[key] = self.add(Step(
                        StepKind.SPLIT, device, (ref,), tuple(self.held(t, b) for b in pieces),
                        account, f"@split{a}", again=again, axis=a, cuts=cuts))
                ref = Ref(self.memo[key], cuts.index(o0))
            src = src[:a] + ((t0, t1),) + src[a + 1:]
        return ref

    def concat(self, refs: list[Ref], axis: int, d: int, t: Tensor, box: Box,
               account: Account, equal: bool = False, again: bool = False) -> Ref:
        """Join ``refs`` along ``axis`` on device ``d``: pieces of one size STACK (its
        gradient reads no input, so the pieces are freed after the forward pass, where
        ``Concat``'s gradient, in MXNet's MKLDNN builds, keeps every piece until the backward
        pass), others CONCAT."""
        if len(refs) == 1:
            return refs[0]
        key = ("concat", tuple(refs), axis, d, again)
        if key not in self.memo:
            self.memo[key] = Ref(self.add(Step(
                StepKind.STACK if equal else StepKind.CONCAT, d, tuple(refs),
                (self.held(t, box),), account, f"{self.name(t, d)}@concat{axis}", again=again,
                axis=axis)))
        return self.memo[key]

    def assemble(self, pieces: list[tuple[Box, Ref]], box: Box, d: int, t: Tensor,
                 account: Account, again: bool = False) -> Ref:
        """Join pieces tiling ``box`` (a grid) on device ``d``."""
        if len(pieces) == 1 and pieces[0][0] == box:
            return pieces[0][1]
        for a in range(len(box)):
            spans = sorted({p[0][a] for p in pieces})
            if len(spans) < 2:
                continue
            at, parts = box[a][0], []
            for span in spans:
                if span[0] != at:
                    break
                sub = box[:a] + (span,) + box[a + 1:]
                parts.append(self.assemble([p for p in pieces if p[0][a] == span], sub, d, t,
                                           account, again))
                at = span[1] + 1
            if at == box[a][1] + 1 and len(parts) == len(spans):
                equal = len({hi - lo for lo, hi in spans}) == 1
                return self.concat(parts, a, d, t, box, account, equal, again)
        raise TofuError(f"internal: the pieces {[p[0] for p in pieces]} of "
                        f"{self.graph.nodes[t[0]].name} do not tile {box}")

    # --- the whole graph --------------------------------------------------------------------
    def run(self, join: bool = True) -> Program:
        """The program; ``join``: each output whole on device 0, else its stored pieces, each
        on the first device storing it."""
        heads, pieces = [], []
        for k, entry in enumerate(self.graph.heads):
            t, shape = (entry.node, entry.index), self.graph.tensor(entry).shape
            account = Account(Purpose.OUTPUT, k)
            if join:
                heads.append(self.region(t, tuple((0, n - 1) for n in shape), 0, None, account))
                continue
            for box, holders in self.cells(t).items():
                heads.append(self.region(t, box, holders[0], None, account))
                pieces.append((k, box))
        heads = self.keep_unread_cells(heads, live_steps(self.steps, heads),
                                       [k for k, _ in pieces] if pieces else None)
        return without_dead_steps(Program(
            tuple(self.steps), tuple(heads), self.k,
            {i: tuple(ds) for i, ds in sorted(self.placement.items())}, tuple(pieces)))

    def keep_unread_cells(self, heads: list[Ref], live: set[int],
                          output_of: list[int] | None = None) -> list[Ref]:
        """Every stored cell of every variable is a variable of the partitioned graph, also
        one no share reads (a constant read in part, as YOLO's offsets through
        ``slice_like``), or only shares whose outputs nothing reads (``live``: the steps the
        heads reach; a device's share of an LSTM's gates holding only the first step's
        unused forget gate): it is stored, trained (its gradient is zero) and saved as the
        rest. MXNet keeps only what the heads reach, so such a cell reaches the first float
        head as an exact ZERO added to it (MXNet's ``zeros_like`` reads no value), on device
        0, or on its device where the heads are pieces (``output_of``: each head's output)."""
        have = {(s.node, s.shard.box) for j, s in enumerate(self.steps)
                if s.kind is StepKind.VARIABLE and j in live}
        unread = [(i, cell, holders[0]) for i, node in enumerate(self.graph.nodes)
                  if node.is_variable and node.kind != "aux"
                  for cell, holders in self.cells((i, 0)).items() if (i, cell) not in have]
        if not unread:
            return heads
        floats = [j for j, e in enumerate(self.graph.heads)
                  if np.issubdtype(np.dtype(self.graph.tensor(e).dtype), np.floating)]
        if not floats:
            names = sorted({self.graph.nodes[i].name for i, _, _ in unread})
            raise TofuError(f"no operator reads {names} in part of their cells, and the graph "
                            f"has no float output to keep those parts in the partitioned graph; "
                            f"partition with those variables kept whole (choose a plan that "
                            f"replicates them)")
        j = floats[0]
        info = self.graph.tensor(self.graph.heads[j])
        at = j if output_of is None else output_of.index(j)      # the head added to
        target = 0 if output_of is None else self.steps[heads[at].step].device
        zeros = []
        for i, cell, device in unread:
            account = Account(Purpose.KEEP, i)
            var = self.variable(i, cell, device, account)
            zero = Ref(self.add(Step(StepKind.ZERO, device, (var,), (Held(None, (), info.dtype),),
                                     account, self.name((i, 0), device))))
            zeros.append(self.send(zero, target, account))
        account = Account(Purpose.OUTPUT, j)
        scalar = Held(None, (1,) * len(info.shape), info.dtype)
        total = Ref(self.add(Step(StepKind.TOTAL, target, tuple(zeros), (scalar,), account,
                                  "unread")))
        head = self.on_device(heads[at], target, account)
        heads[at] = Ref(self.add(Step(StepKind.ADD, target, (head, total),
                                      (self.value(head),), account, "@with_unread")))
        return heads


def live_steps(steps: Sequence[Step], heads: Sequence[Ref]) -> set[int]:
    """The steps ``heads`` reach through their inputs."""
    live: set[int] = set()
    stack = [r.step for r in heads]
    while stack:
        s = stack.pop()
        if s not in live:
            live.add(s)
            stack.extend(r.step for r in steps[s].inputs)
    return live


def without_dead_steps(program: Program) -> Program:
    """``program`` without the steps its heads do not reach (MXNet would drop them from the
    symbol: a share whose outputs are all unread), and without their devices in
    ``placement`` where no other share of the operator runs there."""
    live = live_steps(program.steps, program.heads)
    if len(live) == len(program.steps):
        return program
    rebuilt = _Rebuilt(program)
    ran, dropped = set(), set()                 # (operator, device) of live and dead shares
    for s, step in enumerate(program.steps):
        if s in live:
            rebuilt.keep(s, step, rebuilt.inputs(step))
        if step.kind is StepKind.SHARE:
            (ran if s in live else dropped).add((step.node, step.device))
    placement = {i: tuple(d for d in ds if (i, d) in ran or (i, d) not in dropped)
                 for i, ds in program.placement.items()}
    return dataclasses.replace(rebuilt.result(), placement=placement)


def route(graph: Graph, assignment: Any, cap: int | None = None,
          group_size: int = 0, join_outputs: bool = True, passes: bool = True) -> Program:
    """The :class:`Program` of ``assignment`` over ``graph`` (see the module docstring),
    its gradient sums of ``cap`` pieces or more made where MXNet's in-place sums are right
    (:func:`bounded_reads`; ``cap``: MXNet's, :func:`inplace_sum_cap`, by default).
    ``group_size``: devices ``0 .. group_size - 1``, then the next ``group_size``, ... share
    a link to the other groups (a PCIe switch's): a value several devices of one group read
    from another group crosses once (:func:`relayed_reads`); 0: every reader fetches it.
    ``join_outputs``: the graph's outputs whole on device 0, else their stored pieces
    (:attr:`Program.pieces`). ``passes=False``: the Program as routed, before those passes
    and :func:`cropped_cuts` (:func:`finished` makes it what ``route`` gives): to compare
    the bytes it copies (:meth:`Program.crossings`), which :func:`bounded_reads` and
    :func:`cropped_cuts` do not change, in less time (WResNet-152-W10 over 8 devices, the
    collector paused: 1.4-1.5 against 2.2 s)."""
    # routing recurses from the outputs to the inputs, a few frames per operator: a deep
    # network (WResNet-152: about a thousand operators in a chain) needs more than Python's
    # default limit of 1,000 frames
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph.nodes) + 1000))
    try:
        program = _Route(graph, assignment).run(join_outputs)
    finally:
        sys.setrecursionlimit(limit)
    return finished(graph, program, cap, group_size) if passes else program


def finished(graph: Graph, program: Program, cap: int | None = None,
             group_size: int = 0) -> Program:
    """``program``, as routed over ``graph`` (``route(..., passes=False)``), after
    :func:`route`'s passes: its reads relayed through ``group_size`` groups, its gradient
    sums bounded by ``cap``, its single-read cuts cropped."""
    if group_size:
        program = dataclasses.replace(relayed_reads(program, group_size, lambda step:
                                                    _Route.needs_copy_of(graph, step)),
                                      group_size=group_size)
    cap = inplace_sum_cap() if cap is None else cap
    if cap < 3:
        raise TofuError(f"MXNET_EXEC_INPLACE_GRAD_SUM_CAP={cap}: MXNet then adds even two "
                        f"gradient pieces in place, which is wrong across devices; a "
                        f"partitioned graph needs 3 or more (unset it for MXNet's default, 8)")
    return cropped_cuts(bounded_reads(program, cap, lambda step: step.kind is StepKind.SHARE
                                      and not passes_gradient_through(graph.nodes[step.node],
                                                                      graph)))


def cropped_cuts(program: Program) -> Program:
    """``program`` with each cut (SLICE, SPLIT) of which one piece is read made a CROP of that
    piece, and each chain of them made one: a CROP reading a CROP on its device (both marked
    ``again`` or neither) that nothing else reads crops that one's input instead, and the
    one before is dropped. MXNet then runs one ``slice_axis`` or ``slice`` where it ran a
    cut per axis (a strided convolution's input, trimmed along its rows and its columns)."""
    steps = program.steps
    read = program.outputs_read()
    uses: dict[Ref, int] = {}                   # how many reads of each output, heads too
    for ref in [r for step in steps for r in step.inputs] + list(program.heads):
        uses[ref] = uses.get(ref, 0) + 1
    crops: dict[int, Step] = {}                 # old step -> its CROP (old inputs)
    absorbed: set[int] = set()                  # CROPs another CROP now does
    for s, step in enumerate(steps):
        if step.kind not in (StepKind.SLICE, StepKind.SPLIT) or len(read.get(s, ())) != 1:
            continue
        (j,) = read[s]
        shape = program.held(step.inputs[0]).shape
        first = sum(o.shape[step.axis] for o in step.outputs[:j])
        region = tuple((0, n - 1) for n in shape)
        region = region[:step.axis] + ((first, first + step.outputs[j].shape[step.axis] - 1),) \
            + region[step.axis + 1:]
        source, name = step.inputs[0], step.name
        before = crops.get(source.step)
        if before is not None and uses[source] == 1 and before.device == step.device \
                and before.again == step.again:
            region = tuple((lo + b, hi + b) for (lo, hi), (b, _) in zip(region, before.region))
            source, name = before.inputs[0], before.name + step.name
            absorbed.add(step.inputs[0].step)
        crops[s] = dataclasses.replace(step, kind=StepKind.CROP, inputs=(source,),
                                       outputs=(step.outputs[j],), name=name, axis=0, parts=0,
                                       cuts=(), region=region)
    if not crops:
        return program
    out = _Rebuilt(program)
    for s, step in enumerate(steps):
        if s in absorbed:
            continue
        if s in crops:
            out.only.add(s)
            step = crops[s]
        out.keep(s, step, out.inputs(step))
    return out.result()


class _Rebuilt:
    """A program's steps copied into a new one, in order, with steps added and some dropped:
    the passes below (:func:`relayed_reads`, :func:`_cuts_moved`, :func:`bounded_reads`)
    each rewrite a few reads and keep every other step as it was, renumbered."""

    def __init__(self, program: Program):
        self.program = program
        self.steps: list[Step] = []
        self.at: dict[int, int] = {}            # old step -> new step
        self.only: set[int] = set()             # old steps kept as their one read output

    def ref(self, ref: Ref) -> Ref:
        """An old step's output, renumbered."""
        return Ref(self.at[ref.step], 0 if ref.step in self.only else ref.output)

    def inputs(self, step: Step, moved: Callable[[int], Ref | None] | None = None
               ) -> tuple[Ref, ...]:
        """``step``'s inputs renumbered, but those ``moved(position)`` gives anew."""
        if moved is None:
            return tuple(self.ref(r) for r in step.inputs)
        out = []
        for pos, ref in enumerate(step.inputs):
            new = moved(pos)
            out.append(self.ref(ref) if new is None else new)
        return tuple(out)

    def keep(self, s: int, step: Step, inputs: tuple[Ref, ...]) -> Ref:
        """Old step ``s``, as ``step`` reading ``inputs`` (renumbered: :meth:`inputs`)."""
        self.at[s] = len(self.steps)
        self.steps.append(step.reading(inputs))
        return Ref(self.at[s])

    def add(self, step: Step) -> Ref:
        """A new step."""
        self.steps.append(step)
        return Ref(len(self.steps) - 1)

    def result(self) -> Program:
        old = self.program
        return dataclasses.replace(old, steps=tuple(self.steps),
                                   heads=tuple(self.ref(r) for r in old.heads))


def relayed_reads(program: Program, group_size: int,
                  needs_send: Callable[[Step], bool] = lambda step: True) -> Program:
    """``program`` with each value that two or more devices of one group (devices ``g *
    group_size`` to ``(g + 1) * group_size - 1``) read from a device of another group sent
    to that group once: to a :attr:`StepKind.RELAY` on one of the reading devices (the one
    at the holder's position in its group where it reads, else the first), which the
    group's readers read; their gradients cross back once too. The bytes crossing between
    groups, where groups share one link to the others (a PCIe switch's uplink), fall by up
    to ``group_size`` times for values every device reads whole (a weight split at the
    first cut and gathered at the next); the copies within the group and the relay's
    ``_copy`` are added. A value's SENDs (one per reading device, see
    :meth:`_Route.send`) to the group's devices become the gateway's SEND alone.

    First, a cut (SLICE, SPLIT) whose every piece is read in one other group is made there,
    on one of its readers (:func:`_cuts_moved`): its input crosses once, where each piece
    crossed on its own (as many bytes, one copy's latency instead of one per piece).
    ``needs_send(step)``: whether the sum of the step's output gradients must be made on its
    device (:meth:`_Route.send`): such a value crosses through a SEND."""
    if group_size <= 0 or program.num_devices <= group_size:
        return program
    program = _cuts_moved(program, group_size, needs_send)
    steps = program.steps
    reads: dict[Ref, list[tuple[int, int]]] = {}
    for s, step in enumerate(steps):
        for pos, ref in enumerate(step.inputs):
            reads.setdefault(ref, []).append((s, pos))
    moved: dict[tuple[int, int], int] = {}      # (step, position) -> relay (index in relays)
    #: each relay: (the value it reads, its device, account, again, name)
    relays: list[tuple[Ref, int, Account | None, bool, str]] = []
    dropped: set[int] = set()                   # SENDs whose readers read a relay now
    retarget: dict[int, int] = {}               # a SEND kept -> the gateway it goes to

    def relay(source: Ref, device: int, group_reads: list[tuple[int, int]], again: bool):
        first = steps[min(group_reads)[0]]
        relays.append((source, device, first.read_account(min(group_reads)[1]), again,
                       f"@relay{len(relays)}"))
        moved.update({read: len(relays) - 1 for read in group_reads})

    sends: dict[tuple[Ref, bool], list[int]] = {}
    for s, step in enumerate(steps):
        if step.kind is StepKind.SEND:
            sends.setdefault((step.inputs[0], step.again), []).append(s)
    for (_, again), group in sends.items():
        src = steps[group[0]].device
        by_group: dict[int, list[int]] = {}
        for s in group:
            if steps[s].to // group_size != src // group_size:
                by_group.setdefault(steps[s].to // group_size, []).append(s)
        for members in by_group.values():
            if len(members) < 2:
                continue
            # the first SEND stays (its readers come after it), now to the gateway
            gate, device = members[0], _gateway(src, [steps[s].to for s in members],
                                                 group_size)
            retarget[gate] = device
            relay(Ref(gate), device, [r for s in members for r in reads.get(Ref(s), ())],
                  again)
            dropped.update(members[1:])
    for ref, readers in reads.items():
        if steps[ref.step].kind is StepKind.SEND:
            continue
        src = steps[ref.step].device
        by_group: dict[tuple[int, bool], list[tuple[int, int]]] = {}
        for read in readers:
            d = steps[read[0]].device
            if d // group_size != src // group_size:
                by_group.setdefault((d // group_size, steps[read[0]].again), []).append(read)
        for (_, again), group_reads in by_group.items():
            devices = sorted({steps[s].device for s, _ in group_reads})
            if len(devices) >= 2:
                relay(ref, _gateway(src, devices, group_size), group_reads, again)
    if not relays:
        return program
    after: dict[int, list[int]] = {}            # step -> the relays reading it
    for r, (source, *_rest) in enumerate(relays):
        after.setdefault(source.step, []).append(r)
    out = _Rebuilt(program)
    made: dict[int, Ref] = {}                   # relay -> its step (new)
    for s, step in enumerate(steps):
        if s in dropped:
            continue
        inputs = out.inputs(step, lambda pos: made[moved[s, pos]] if (s, pos) in moved
                            else None)
        if s in retarget:
            step = dataclasses.replace(step, to=retarget[s], name=f"@to{retarget[s]}")
        kept = out.keep(s, step, inputs)
        for r in after.get(s, ()):
            source, device, account, again, name = relays[r]
            made[r] = out.add(Step(StepKind.RELAY, device, (Ref(kept.step, source.output),),
                                   (step.outputs[source.output],), account, name,
                                   again=again))
    return out.result()


def _gateway(src: int, devices, group_size: int) -> int:
    """Of ``devices`` (all in one group), the one a value from device ``src`` crosses to:
    the one at ``src``'s position in its group where it is among them, else the first (so
    the groups' devices share the crossings out)."""
    mirror = min(devices) // group_size * group_size + src % group_size
    return mirror if mirror in devices else min(devices)


def _cuts_moved(program: Program, group_size: int, needs_send: Callable[[Step], bool]
                ) -> Program:
    """``program`` with each cut whose pieces are all read, and read only, by devices of
    one group other than its own made on one of them (the one at its device's position in
    the group where it reads, else the first); not one marked ``again`` (its input would
    cross unmarked, and be held for the backward pass), nor one an output of the graph is.
    Where the sum of its input's gradients must be made where the input is
    (``needs_send``), the cut reads it through a SEND there, as routing reads it remotely
    (:meth:`_Route.send`)."""
    steps = program.steps
    readers: dict[int, set[int]] = {}           # cut -> the devices reading its pieces
    for step in steps:
        for ref in step.inputs:
            if steps[ref.step].kind in (StepKind.SLICE, StepKind.SPLIT):
                readers.setdefault(ref.step, set()).add(step.device)
    read = program.outputs_read()
    heads = {ref.step for ref in program.heads}
    moved: dict[int, int] = {}                  # cut -> the device it is made on
    for s, devices in readers.items():
        step = steps[s]
        groups = {d // group_size for d in devices}
        if (len(groups) != 1 or step.device // group_size in groups or step.again
                or s in heads or len(read[s]) != len(step.outputs)):
            continue
        moved[s] = _gateway(step.device, devices, group_size)
    if not moved:
        return program
    out = _Rebuilt(program)
    for s, step in enumerate(steps):
        inputs = out.inputs(step)
        if s in moved:
            d, source = moved[s], steps[step.inputs[0].step]
            if needs_send(source):
                sent = out.add(Step(StepKind.SEND, source.device, inputs[:1],
                                    (source.outputs[step.inputs[0].output],), step.account,
                                    f"@to{d}", to=d))
                inputs = (sent,) + inputs[1:]
            step = dataclasses.replace(step, device=d)
        out.keep(s, step, inputs)
    return out.result()


#: MXNet 1.9.1's MXNET_EXEC_INPLACE_GRAD_SUM_CAP when the variable is not set
#: (src/executor/graph_executor.cc, AggregateGradient)
DEFAULT_INPLACE_SUM_CAP = 8


def inplace_sum_cap() -> int:
    """The number of gradient pieces from which MXNet sums them with a chain of in-place
    adds instead of one ``ElementWiseSum``: ``MXNET_EXEC_INPLACE_GRAD_SUM_CAP`` as MXNet
    reads it (its default where unset or not a number, which MXNet refuses; 0 is a cap of 0:
    every sum in place; MXNet reads it once per process, at its first gradient graph)."""
    value = os.environ.get("MXNET_EXEC_INPLACE_GRAD_SUM_CAP", "").strip()
    return int(value) if value.isdigit() else DEFAULT_INPLACE_SUM_CAP


def bounded_reads(program: Program, cap: int,
                  own_piece: Callable[[Step], bool] = lambda step: False) -> Program:
    """``program`` with every value read ``cap`` times or more read through
    :attr:`StepKind.RELAY` copies, but where MXNet's in-place sum of its gradient is right.

    MXNet sums a value's gradient pieces (one per read, and the head gradient of an output)
    with one ``ElementWiseSum`` below ``cap`` pieces, and from ``cap`` on with a chain of
    in-place adds, each ordered after the last by a control dependency, which frees each
    piece as soon as it is added (an unrolled RNN's weights: measured, the chain holds
    370.8 MiB where ``ElementWiseSum`` holds 914.8). Where the pieces come from several
    devices, or pass through a copy or an ``elemwise_add`` from another (their gradient is
    their output's), that chain gives a wrong sum, silently (pinned in
    tests/nnvm_passes/test_gradient_sums.py). So a value read ``cap`` times or more keeps
    its readers only where all of them run on its device and make their pieces there
    (``own_piece(step)``: a share whose operator does not hand its output's gradient to its
    inputs). Any other is read through a tree of relays, each read fewer than ``cap`` times:
    the readers on each device through relays there, one per device reading the value (or
    a relay of it) from its device, so the bytes crossing devices do not change; the pieces
    of one relay are then added by one ``ElementWiseSum``. A relay is ``_copy``, which
    MXNet's memory planner lets share its input's storage (``FInplaceIdentity``; not a
    variable's). MXNet's cap stays the user's (by default 8) for every graph."""
    steps = program.steps
    room = cap - 1                  # reads a value may have
    # MXNet merges the SENDs of one value to several devices (nnvm_passes.emit.DISTINCT):
    # their readers are the first one's
    first: dict[tuple, int] = {}
    merged = {s: first.setdefault((step.inputs[0], step.again, step.device), s)
              for s, step in enumerate(steps) if step.kind is StepKind.SEND}
    uses: dict[Ref, list[tuple[int, int]]] = {}
    for s, step in enumerate(steps):
        for pos, ref in enumerate(step.inputs):
            ref = Ref(merged.get(ref.step, ref.step), ref.output)
            uses.setdefault(ref, []).append((s, pos))
    heads: dict[Ref, int] = {}
    for ref in program.heads:
        ref = Ref(merged.get(ref.step, ref.step), ref.output)
        heads[ref] = heads.get(ref, 0) + 1

    def alone(ref: Ref, readers) -> bool:
        """Read where it is made only, by steps making their gradient pieces there."""
        device = steps[ref.step].device
        return not heads.get(ref) and all(steps[s].device == device and own_piece(steps[s])
                                          for s, _ in readers)
    trees = {ref: _tree(readers, steps, ref, room, heads.get(ref, 0))
             for ref, readers in uses.items()
             if len(readers) + heads.get(ref, 0) > room and not alone(ref, readers)}
    if not trees:
        return program
    moved = {read: (ref, r) for ref, tree in trees.items()
             for r, relay in enumerate(tree) for read in relay.reads}
    out = _Rebuilt(program)
    made: dict[tuple[Ref, int], Ref] = {}       # (old ref, relay) -> the relay's step (new)
    for s, step in enumerate(steps):
        inputs = out.inputs(step, lambda pos: made[moved[s, pos]] if (s, pos) in moved
                            else None)
        kept = out.keep(s, step, inputs)
        for output in range(len(step.outputs)):
            ref = Ref(s, output)
            for r, relay in enumerate(trees.get(ref, ())):
                t, pos = min(relay.below)
                source = Ref(kept.step, output) if relay.parent < 0 else made[ref, relay.parent]
                made[ref, r] = out.add(Step(
                    StepKind.RELAY, relay.device, (source,), (step.outputs[output],),
                    steps[t].read_account(pos), f"@relay{r}",
                    again=all(steps[t].again for t, _ in relay.below)))
    return out.result()


@dataclass
class _Relay:
    device: int
    children: list                  # ("read", (step, position)) or ("relay", index)
    parent: int = -1                # a relay's index, or -1: reads the value
    reads: tuple = ()               # the reads it gives (its children's)
    below: tuple = ()               # every read under it


def _tree(readers: list[tuple[int, int]], steps, ref: Ref, room: int, heads: int
          ) -> list[_Relay]:
    """The relays of one value read by ``readers`` (and by ``heads`` outputs), parents
    first, each reading its parent or the value, none read more than ``room`` times."""
    relays: list[_Relay] = []
    src = steps[ref.step].device
    by_device: dict[int, list] = {}
    for read in readers:
        by_device.setdefault(steps[read[0]].device, []).append(("read", read))
    top = by_device.pop(src, [])
    for d, items in sorted(by_device.items()):
        items = _fan(relays, items, d, room, room)
        top += items if len(items) == 1 else [_relay(relays, items, d)]
    _fan(relays, top, src, room - heads, room)
    # parents first, renumbered
    depth = []
    for relay in relays:
        n, p = 0, relay.parent
        while p >= 0:
            n, p = n + 1, relays[p].parent
        depth.append(n)
    order = sorted(range(len(relays)), key=lambda i: (depth[i], i))
    index = {old: new for new, old in enumerate(order)}
    out = []
    for i in order:
        relay = relays[i]
        out.append(_Relay(relay.device, [], index.get(relay.parent, -1),
                          tuple(x[1] for x in relay.children if x[0] == "read"),
                          tuple(sorted(_below(relays, i)))))
    return out


def _below(relays: list[_Relay], i: int) -> list[tuple[int, int]]:
    out = []
    for kind, x in relays[i].children:
        out.extend([x] if kind == "read" else _below(relays, x))
    return out


def _relay(relays: list[_Relay], children: list, device: int) -> tuple:
    relays.append(_Relay(device, children))
    for kind, x in children:
        if kind == "relay":
            relays[x].parent = len(relays) - 1
    return ("relay", len(relays) - 1)


def _fan(relays: list[_Relay], items: list, device: int, keep: int, limit: int) -> list:
    """``items`` (reads, relays, in the order the forward pass makes them) of one value, at
    most ``keep`` left: the first ``keep - 1`` as they are and the rest under a chain of
    relays on ``device``, each of at most ``limit`` (2 or more) items, the last items deepest.
    The backward pass makes the last readers' gradient pieces first: each relay's sum
    runs as soon as they are made, and frees them, as an in-place sum would."""
    keep = max(keep, 1)
    if len(items) <= keep:
        return items
    tail = items[-limit:]
    rest = items[:-limit]
    while True:
        # ``tail`` under one relay; then it joins the items before it
        grouped = _relay(relays, tail, device)
        if len(rest) + 1 <= keep:
            return rest + [grouped]
        tail = rest[-(limit - 1):] + [grouped]
        rest = rest[:-(limit - 1)]
