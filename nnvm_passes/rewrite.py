"""Rewrite: an assigned plan becomes an ordinary MXNet graph with one ctx group per device.

Input: the imported :class:`~nnvm_passes.ir.Graph` and an assignment (what each device
computes of every operator and stores of every tensor, :mod:`tofu_mx.runtime.assign`). The
rewrite never decides anything; it emits, lazily from the graph's outputs backwards:

- each operator's share on device ``d`` as one node ``<name>@dev<d>`` in group ``dev<d>``,
  with the share's attributes;
- each variable as one variable per distinct stored box, ``<name>@dev<d>`` on the first
  device storing that box; auxiliary states (mutated in place) get one variable per device
  that updates them;
- a tensor read on another device is read there directly (MXNet inserts the
  ``_CrossDeviceCopy``), or through one ``_copy`` per reading device placed with the tensor
  where its gradient must be summed on its own device (see :meth:`_Rewrite.send`);
- conversions: a region of a tensor on a device is cut out of the stored boxes it overlaps
  with ``SliceChannel`` (equal pieces) or ``_split_v2`` (any cut points) on the device
  holding them, and joined with ``Concat`` on the device needing it; padding is a ``_full``
  block; partial outputs are combined with ``add_n`` (or ``_maximum``/``_minimum``) on the
  device storing the result. MXNet inserts ``_CrossDeviceCopy`` between groups;
- re-fetching (an operator assigned ``refetch``): its converted inputs are built apart, each
  node marked ``__force_mirroring__``, and so is the operator's share when it reads one.
  MXNet's gradient pass then reads a copy of each marked node that it builds again in the
  backward pass from the unmarked tensors beneath (the stored shards), so nothing converted
  is held from the forward pass to the backward: the share runs twice and its remote pieces
  cross twice (its outputs go through a marked and an unmarked ``_copy``: see
  :meth:`_Rewrite.instance`). Every remote piece goes through its own marked ``_copy`` on
  the device holding it, so that the backward pass's cross-device copy is not the forward
  pass's (MXNet makes one per tensor and device, which would be held).

The graph's outputs are joined whole on device 0, so the partitioned symbol has the
original's outputs and shapes.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from nnvm_passes.backward import MIRROR, passes_gradient_through
from nnvm_passes.ir import Graph, format_attr_value
from tofu_mx.devices import group_name
from tofu_mx.errors import TofuError

#: the rewrite's own operators whose inputs' gradients are their output's gradient
_PASSES_THROUGH = {"add_n"}

Box = tuple[tuple[int, int], ...]
Sym = tuple[int, int]        # (node id, output index) in the JSON being built


@dataclass(frozen=True)
class VarShard:
    """One variable of the partitioned graph: a box of an original variable on a device."""

    name: str
    source: str
    kind: str                 # param | aux | data | label
    device: int
    box: Box
    dtype: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(hi - lo + 1 for lo, hi in self.box)

    @property
    def slices(self) -> tuple[slice, ...]:
        """The box as an index into the whole array: ``whole[shard.slices]``."""
        return tuple(slice(lo, hi + 1) for lo, hi in self.box)


@dataclass
class RewriteResult:
    json: dict
    shards: list[VarShard]
    counts: dict[str, int] = field(default_factory=dict)   # nodes emitted, by role


def _intersect(a: Box, b: Box) -> Box | None:
    out = []
    for (a_lo, a_hi), (b_lo, b_hi) in zip(a, b):
        lo, hi = max(a_lo, b_lo), min(a_hi, b_hi)
        if lo > hi:
            return None
        out.append((lo, hi))
    return tuple(out)


class _Rewrite:
    def __init__(self, graph: Graph, assignment: Any, ordered: bool = False):
        self.g, self.a, self.ordered = graph, assignment, ordered
        self.k = assignment.num_devices
        self.nodes: list[dict] = []
        self.device: list[int] = []      # the device of each node emitted
        self.names: set[str] = set()
        self.shards: list[VarShard] = []
        self.counts: dict[str, int] = {}
        self.memo: dict[tuple, Any] = {}
        self.origin: dict[int, int] = {}     # emitted operator share -> the graph's node
        self.again: set[int] = set()         # emitted nodes the backward pass builds again

    # --- emitting ---------------------------------------------------------------------------
    def _name(self, base: str) -> str:
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base}#{n}"
        self.names.add(name)
        return name

    def add(self, op: str, base: str, attrs: Mapping[str, str], inputs, device: int,
            role: str | None, tagged: bool = True, again: bool = False) -> int:
        """Emit a node in ``device``'s group; ``role`` names it in :attr:`counts` (None: not
        counted, as variables, which :attr:`shards` lists). ``tagged=False``: without the
        ``__ctx_group__`` attribute (MXNet then places the node with its first input).
        ``again``: the backward pass builds it again (``__force_mirroring__``)."""
        attrs = {k: v if isinstance(v, str) else format_attr_value(v)
                 for k, v in attrs.items() if k not in ("__ctx_group__", MIRROR)}
        if tagged:
            attrs["__ctx_group__"] = group_name(device)
        if again:
            attrs[MIRROR] = "True"
            self.again.add(len(self.nodes))
        self.nodes.append({"op": op, "name": self._name(base), "attrs": attrs,
                           "inputs": [[n, i, 0] for n, i in inputs]})
        self.device.append(device)
        if role is not None:
            self.counts[role] = self.counts.get(role, 0) + 1
        return len(self.nodes) - 1

    def suffix(self, device: int) -> str:
        return "" if self.k == 1 else f"@dev{device}"

    # --- variables --------------------------------------------------------------------------
    def cells(self, t: tuple[int, int]) -> dict[Box, list[int]]:
        """Distinct stored boxes of tensor ``t`` and the devices storing each."""
        key = ("cells", t)
        if key not in self.memo:
            found: dict[Box, list[int]] = {}
            for d, box in enumerate(self.a.stored[t]):
                found.setdefault(box, []).append(d)
            self.memo[key] = found
        return self.memo[key]

    def variable(self, i: int, box: Box, device: int) -> Sym:
        key = ("var", i, box, device)
        if key not in self.memo:
            node = self.g.nodes[i]
            nid = self.add("null", node.name + self.suffix(device), node.attrs, [], device, None)
            self.shards.append(VarShard(self.nodes[nid]["name"], node.name, node.kind, device,
                                        box, node.outputs[0].dtype))
            self.memo[key] = (nid, 0)
        return self.memo[key]

    def send(self, sym: Sym, d: int, again: bool = False) -> Sym:
        """``sym`` for readers on device ``d``. MXNet inserts the cross-device copy; the
        rewrite adds a ``_copy`` on the device holding ``sym`` (one per reading device) only
        where the sum of ``sym``'s gradients must be made on that device: MXNet places a
        gradient sum on one of its readers' devices, so without the copy a variable's gradient
        could be summed away from the variable (which cannot bind), and so could the gradient
        of an operator that hands its output gradient to its inputs unchanged
        (``elemwise_add``, ``add_n``: :func:`passes_gradient_through`). Every other operator's
        gradient node sits in its own ctx group and reads the sum wherever it was made.
        ``again``: re-fetched in the backward pass, always through a marked ``_copy``."""
        src = self.device[sym[0]]
        if src == d:
            return sym
        key = ("send", sym, d, again)
        if key not in self.memo:
            self.memo[key] = (self.add("_copy", f"{self.nodes[sym[0]]['name']}@to{d}", {}, [sym],
                                       src, "send", again=again), 0) \
                if again or self.needs_copy(sym) else sym
        return self.memo[key]

    def on_device(self, sym: Sym, d: int, again: bool = False) -> Sym:
        """``sym`` made by a node of device ``d`` (a ``_copy`` there if it lives elsewhere)."""
        if self.device[sym[0]] == d:
            return sym
        key = ("on", sym, d, again)
        if key not in self.memo:
            self.memo[key] = (self.add("_copy", f"{self.nodes[sym[0]]['name']}@on{d}", {}, [sym],
                                       d, "send", again=again), 0)
        return self.memo[key]

    def needs_copy(self, sym: Sym) -> bool:
        op = self.nodes[sym[0]]["op"]
        if op == "null":
            return True
        if sym[0] in self.origin:
            return passes_gradient_through(self.g.nodes[self.origin[sym[0]]], self.g)
        return op in _PASSES_THROUGH     # the rewrite's own nodes

    # --- operators --------------------------------------------------------------------------
    def instance(self, i: int, d: int) -> list[Sym]:
        key = ("op", i, d)
        if key in self.memo:
            return self.memo[key]
        node, share = self.g.nodes[i], self.a.ops[i].shares[d]
        refetch, kept = self.a.ops[i].refetch, self.a.ops[i].kept
        if share.views is not None:       # no operator: each output is a region of input 0
            entry = node.inputs[0]
            outs = [self.region((entry.node, entry.index), box, d, share.pads[0])
                    for box in share.views]
            self.memo[key] = outs
            return outs
        inputs, first = [], None
        for j, (entry, box) in enumerate(zip(node.inputs, share.inputs)):
            if box is None:
                continue
            first = j if first is None else first
            src = self.g.nodes[entry.node]
            if src.is_variable and src.kind == "aux":
                inputs.append(self.variable(entry.node, box, d))
            else:
                inputs.append(self.region((entry.node, entry.index), box, d, share.pads[j],
                                          refetch and j not in kept))
        tagged = not self.a.ops[i].placed_by_input
        if not tagged and inputs:    # MXNet places it with its first input: that must be on d
            inputs[0] = self.on_device(inputs[0], d, refetch and first not in kept)
        # run again in the backward pass only where that re-fetches a converted input
        rerun = any(n in self.again and n not in self.origin for n, _ in inputs)
        nid = self.add(node.op, node.name + self.suffix(d), share.attrs, inputs, d, "operator",
                       tagged, again=rerun)
        self.origin[nid] = i
        outs = [(nid, j) for j in range(len(node.outputs))]
        if rerun:
            outs = [self.held(o, f"{node.name}{self.suffix(d)}", j, d) for j, o in enumerate(outs)]
        if share.scale is not None and share.scale != 1.0:
            outs = [(self.add("_mul_scalar", f"{node.name}{self.suffix(d)}@scale",
                              {"scalar": repr(float(share.scale))}, [o], d, "scale"), 0)
                    if box is not None else o for o, box in zip(outs, share.outputs)]
        self.memo[key] = outs
        return outs

    def held(self, out: Sym, base: str, j: int, d: int) -> Sym:
        """Output ``j`` of a share run again in the backward pass, as its readers read it:
        through a marked ``_copy``, so that the backward pass's run has its output read
        (kernels such as Convolution refuse to run with nothing to write), then an unmarked
        one, so that readers run again themselves read what the forward pass kept there, not
        the share run once more. Both may run in place (MXNet's planner)."""
        marked = self.add("_copy", f"{base}@rerun{j}", {}, [out], d, "rerun", again=True)
        return self.add("_copy", f"{base}@held{j}", {}, [(marked, 0)], d, "rerun"), 0

    def computed(self, t: tuple[int, int], d: int):
        """Distinct boxes computed of ``t``, each with the devices whose shares make it (the
        contributors summed for partial outputs), preferring a group with ``d``."""
        op = self.a.ops[t[0]]
        by_box, partial = self._computed(t)
        out = []
        for box, options in by_box.items():
            mine = [g for g in options if d in g and not op.loss]
            out.append((box, mine[0] if mine else options[0]))
        return out, partial

    def _computed(self, t: tuple[int, int]) -> tuple[dict, str | None]:
        """Each distinct box computed of ``t`` -> the groups of devices computing it (for
        :meth:`computed`, once per tensor)."""
        key = ("computed", t)
        if key not in self.memo:
            op = self.a.ops[t[0]]
            groups: dict[tuple, list[int]] = {}
            for e, share in enumerate(op.shares):
                if share is not None:       # None: device e runs none of this operator
                    groups.setdefault((share.outputs[t[1]], share.key), []).append(e)
            by_box: dict[Box, list[list[int]]] = {}
            for (box, _), devices in groups.items():
                by_box.setdefault(box, []).append(devices)
            self.memo[key] = by_box, next(s for s in op.shares if s is not None).partial
        return self.memo[key]

    def stored(self, t: tuple[int, int], d: int) -> Sym:
        key = ("stored", t, d)
        if key in self.memo:
            return self.memo[key]
        box = self.a.stored[t][d]
        computed, partial = self.computed(t, d)
        pieces = []
        for c, devices in computed:
            inter = _intersect(box, c)
            if inter is None:
                continue
            if partial is None:
                src = d if d in devices and not self.a.ops[t[0]].loss else devices[0]
                pieces.append((inter, self.send(self.extract(self.instance(t[0], src)[t[1]], c,
                                                             inter, src), d)))
                continue
            parts = [self.send(self.extract(self.instance(t[0], e)[t[1]], c, inter, e), d)
                     for e in devices]
            pieces.append((inter, self.combine(parts, partial, d, t)))
        self.memo[key] = self.assemble(pieces, box, d, t)
        return self.memo[key]

    def combine(self, parts: list[Sym], how: str, d: int, t) -> Sym:
        if len(parts) == 1:
            return parts[0]
        base = f"{self.g.nodes[t[0]].name}{self.suffix(d)}@{how}"
        if how == "sum":
            return (self.add("add_n", base, {"num_args": str(len(parts))}, parts, d,
                             "combine"), 0)
        acc = parts[0]
        for p in parts[1:]:
            acc = (self.add("_maximum" if how == "max" else "_minimum", base, {}, [acc, p], d,
                            "combine"), 0)
        return acc

    # --- regions ----------------------------------------------------------------------------
    def region(self, t: tuple[int, int], box: Box, d: int, pad: float | None,
               again: bool = False) -> Sym:
        """Tensor ``t``'s values in ``box`` on device ``d`` (outside its bounds: ``pad``);
        ``again``: every node converting it is built again in the backward pass."""
        key = ("region", t, box, d, pad, again)
        if key in self.memo:
            return self.memo[key]
        shape = self.g.nodes[t[0]].outputs[t[1]].shape
        for a, ((lo, hi), n) in enumerate(zip(box, shape)):
            if lo >= 0 and hi < n:
                continue
            if pad is None:
                raise TofuError(f"{self.g.nodes[t[0]].name} is read at {box} beyond its shape "
                                f"{shape} but has no pad value")
            if hi < 0 or lo >= n:      # nothing but padding
                self.memo[key] = self.constant(box, pad, d, t, again)
                return self.memo[key]
            inner = box[:a] + ((max(lo, 0), min(hi, n - 1)),) + box[a + 1:]
            pieces = [(inner, self.region(t, inner, d, pad, again))]
            if lo < 0:
                pieces.insert(0, (box[:a] + ((lo, -1),) + box[a + 1:], None))
            if hi >= n:
                pieces.append((box[:a] + ((n, hi),) + box[a + 1:], None))
            pieces = [(b, s if s is not None else self.constant(b, pad, d, t, again))
                      for b, s in pieces]
            self.memo[key] = self.concat([s for _, s in pieces], a, d, t, again=again)
            return self.memo[key]
        node = self.g.nodes[t[0]]
        pieces = []
        for cell, holders in self.cells(t).items():
            inter = _intersect(box, cell)
            if inter is None:
                continue
            if node.is_variable:
                src = holders[0]
                piece = self.extract(self.variable(t[0], cell, src), cell, inter, src, again)
            else:
                src = d if d in holders else holders[0]
                piece = self.extract(self.stored(t, src), cell, inter, src, again)
            pieces.append((inter, self.send(piece, d, again)))
        self.memo[key] = self.assemble(pieces, box, d, t, again)
        return self.memo[key]

    def constant(self, box: Box, value: float, d: int, t, again: bool = False) -> Sym:
        dtype = self.g.nodes[t[0]].outputs[t[1]].dtype
        if np.isinf(value):
            value = float(np.finfo(dtype).min if value < 0 else np.finfo(dtype).max)
        shape = tuple(hi - lo + 1 for lo, hi in box)
        return (self.add("_full", f"{self.g.nodes[t[0]].name}{self.suffix(d)}@pad",
                         {"shape": format_attr_value(shape), "value": repr(float(value)),
                          "dtype": dtype}, [], d, "pad", again=again), 0)

    def extract(self, sym: Sym, src: Box, target: Box, device: int, again: bool = False) -> Sym:
        """``target`` out of ``sym`` (holding ``src``), cut on ``device``."""
        for a, ((s0, s1), (t0, t1)) in enumerate(zip(src, target)):
            if (s0, s1) == (t0, t1):
                continue
            n, o0, o1 = s1 - s0 + 1, t0 - s0, t1 - s0 + 1
            width = o1 - o0
            if n % width == 0 and o0 % width == 0:
                key = ("cut", sym, a, n // width, again)
                if key not in self.memo:
                    self.memo[key] = self.add(
                        "SliceChannel", f"{self.nodes[sym[0]]['name']}@split{a}",
                        {"num_outputs": str(n // width), "axis": str(a)}, [sym], device, "split",
                        again=again)
                sym = (self.memo[key], o0 // width)
            else:
                cuts = tuple(sorted({0, o0, o1} - {n}))
                key = ("cut", sym, a, cuts, again)
                if key not in self.memo:
                    self.memo[key] = self.add(
                        "_split_v2", f"{self.nodes[sym[0]]['name']}@split{a}",
                        {"indices": format_attr_value(cuts), "axis": str(a),
                         "squeeze_axis": "False", "sections": "0"}, [sym], device, "split",
                        again=again)
                sym = (self.memo[key], cuts.index(o0))
            src = src[:a] + ((t0, t1),) + src[a + 1:]
        return sym

    def concat(self, syms: list[Sym], axis: int, d: int, t, equal: bool = False,
               again: bool = False) -> Sym:
        """Join ``syms`` along ``axis`` on device ``d``. Pieces of one size are stacked and
        reshaped (``stack`` then ``Reshape``): neither's gradient reads its inputs, so the
        pieces are freed after the forward pass, where ``Concat``'s gradient (in MXNet's
        MKLDNN builds) keeps every piece until the backward pass."""
        if len(syms) == 1:
            return syms[0]
        key = ("concat", tuple(syms), axis, d, again)
        if key not in self.memo:
            base = f"{self.g.nodes[t[0]].name}{self.suffix(d)}@concat{axis}"
            if equal:
                stacked = self.add("stack", base + "@stack", {"axis": str(axis),
                                                              "num_args": str(len(syms))},
                                   syms, d, "concat", again=again)
                merge = format_attr_value((0,) * axis + (-3, -2))
                self.memo[key] = (self.add("Reshape", base, {"shape": merge},
                                           [(stacked, 0)], d, None, again=again), 0)
            else:
                self.memo[key] = (self.add("Concat", base, {"dim": str(axis),
                                                            "num_args": str(len(syms))},
                                           syms, d, "concat", again=again), 0)
        return self.memo[key]

    def assemble(self, pieces: list[tuple[Box, Sym]], box: Box, d: int, t,
                 again: bool = False) -> Sym:
        """Join pieces tiling ``box`` (a grid) with Concat on device ``d``."""
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
                                           again))
                at = span[1] + 1
            if at == box[a][1] + 1 and len(parts) == len(spans):
                equal = len({hi - lo for lo, hi in spans}) == 1
                return self.concat(parts, a, d, t, equal, again)
        raise TofuError(f"internal: the pieces {[p[0] for p in pieces]} of "
                        f"{self.g.nodes[t[0]].name} do not tile {box}")

    # --- the whole graph --------------------------------------------------------------------
    def run(self) -> RewriteResult:
        heads = []
        for entry in self.g.heads:
            shape = self.g.tensor(entry).shape
            heads.append(self.region((entry.node, entry.index), tuple((0, n - 1) for n in shape),
                                     0, None))
        heads = self._keep_unread_cells(heads)
        if self.ordered:
            self.order()
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
        shares: dict[int, list[int]] = {}
        for nid, i in self.origin.items():
            shares.setdefault(i, []).append(nid)
        ops = sorted(shares)
        for prev, cur in zip(ops, ops[1:]):
            for nid in shares[cur]:
                self.nodes[nid]["control_deps"] = list(shares[prev])

    def _keep_unread_cells(self, heads: list[Sym]) -> list[Sym]:
        """Every stored cell of every variable is a variable of the partitioned graph, also
        one no share reads (a constant read in part, as YOLO's offsets through
        ``slice_like``): it is stored, trained (its gradient is zero) and saved as the rest.
        MXNet keeps only what the heads reach, so such a cell reaches the first float head as
        an exact zero, ``sum(zeros_like(cell))``, added to it (``zeros_like`` reads no value)."""
        unread = []
        for i, node in enumerate(self.g.nodes):
            if not node.is_variable or node.kind == "aux":
                continue
            have = {s.box for s in self.shards if s.source == node.name}
            unread += [(i, cell, holders[0]) for cell, holders in self.cells((i, 0)).items()
                       if cell not in have]
        if not unread:
            return heads
        floats = [j for j, e in enumerate(self.g.heads)
                  if np.issubdtype(np.dtype(self.g.tensor(e).dtype), np.floating)]
        if not floats:
            names = sorted({self.g.nodes[i].name for i, _, _ in unread})
            raise TofuError(f"no operator reads {names} in part of their cells, and the graph "
                            f"has no float output to keep those parts in the partitioned graph; "
                            f"partition with those variables kept whole (choose a plan that "
                            f"replicates them)")
        j = floats[0]
        info = self.g.tensor(self.g.heads[j])
        zeros = []
        for i, cell, device in unread:
            name = self.g.nodes[i].name
            var = self.variable(i, cell, device)
            zeros_like = self.add("zeros_like", f"{name}{self.suffix(device)}@zeros", {}, [var],
                                  device, "keep")
            zero = self.add("sum", f"{name}{self.suffix(device)}@kept", {}, [(zeros_like, 0)],
                            device, "keep")
            if self.g.nodes[i].outputs[0].dtype != info.dtype:
                zero = self.add("Cast", f"{name}{self.suffix(device)}@kept_cast",
                                {"dtype": info.dtype}, [(zero, 0)], device, "keep")
            zeros.append(self.send((zero, 0), 0))
        total = zeros[0] if len(zeros) == 1 else (self.add(
            "add_n", "unread@kept", {"num_args": str(len(zeros))}, zeros, 0, "keep"), 0)
        total = (self.add("reshape", "unread@kept_b", {"shape": format_attr_value(
            (1,) * len(info.shape))}, [total], 0, "keep"), 0)
        head = self.on_device(heads[j], 0)
        heads[j] = (self.add("broadcast_add", f"{self.nodes[head[0]]['name']}@with_unread", {},
                             [head, total], 0, "keep"), 0)
        return heads


def rewrite(graph: Graph, assignment: Any, ordered: bool = False) -> RewriteResult:
    """The partitioned graph (MXNet JSON) and its variables; see the module docstring.
    ``ordered``: add Tofu's control dependencies (:meth:`_Rewrite.order`). Off by default:
    measured in bench/partition.py, they change MXNet's planned allocation by under 1%."""
    # emission recurses from the outputs to the inputs, a few frames per operator: a deep
    # network (WResNet-152: about a thousand operators in a chain) needs more than Python's
    # default limit of 1,000 frames
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph.nodes) + 1000))
    try:
        return _Rewrite(graph, assignment, ordered).run()
    finally:
        sys.setrecursionlimit(limit)
