"""``plan()``: import -> annotate (TDL) -> coarsen -> search, for any number of devices.

**Recursion.** ``k`` devices are cut in steps: ``k = p1 * p2 * ...`` (its prime factors).
The first step cuts the graph into ``p1`` parts with the DP; each part's work (the regions
its operators read and compute) is then cut into ``p2`` parts, and so on. The total is
Tofu's ``c1 + p1 c2 + p1 p2 c3 + ...``: a later cut happens inside each group of devices
made by the earlier ones. Every order of the prime factors is tried and the cheapest kept
(for ``k = 2^m`` there is one). An axis a cut does not divide is split into parts that
differ by at most one (floor boundaries, :func:`~tofu_mx.tdl.analysis.part_interval`), so
any k gives each device about 1/k of a tensor; an axis shorter than the cut is not split.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
import dataclasses
import functools
import gc
from dataclasses import asdict, dataclass, field
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any, Mapping, Sequence

import numpy as np

from nnvm_passes.backward import kept_tensors
from nnvm_passes.ir import FrozenDict, Graph, TensorInfo
from nnvm_passes.interleave import interleave as interleave_blocks
from nnvm_passes.lower import lower
from tofu_mx import arguments
from tofu_mx.errors import InvalidArgumentError, NoFeasiblePlanError
from tofu_mx.search.cut import Cut, CutProblem, Group, View, next_view
from tofu_mx.search.bounded import Bounded, solve_within
from tofu_mx.search.dp import Solution, prime_factors
from tofu_mx.search.layouts import OpaqueOp, OpStrategy, StoredLayout
from tofu_mx.search.problem import Problem, by_first_appearance, distinct_rows
from tofu_mx.search.structure import GraphStructure, itemsize_of
from tofu_mx.summary import format_bytes
from tofu_mx.tdl.annotate import described, import_graph, registry_entry
from tofu_mx.tdl.axes import block_split, passed_axes
from tofu_mx.tdl.lang import TDLError
from tofu_mx.tdl.registry import Attrs, Description, facts, generation


#: bounds of SearchOptions' numbers, past which they mean nothing more (and their products
#: with byte counts would overflow): a state of 2**32 float64 entries already needs 32 GiB;
#: no optimizer keeps a thousand copies of a parameter; a memory weight of a million prices
#: memory above any byte moved; a device may hold a thousand times the ideal; no conversion
#: costs more than a terabyte moved
MAX_STATES = 1 << 32
MAX_OPTIMIZER_STATE = 1000.0
MAX_MEMORY_WEIGHT = 1e6
MAX_BALANCE = 1000.0
MAX_CONVERSION_BYTES = 1e12


@dataclass(frozen=True)
class SearchOptions:
    """Every tunable of the search, in one place (the CLI's flags come from these fields)."""

    tie: bool = True                  # give the time steps of an unrolled RNN one choice
    max_states: int = 4_000_000       # largest DP state (product of frontier choice counts)
    try_factor_orders: bool = True    # try every order of k's prime factors, keep the best
    optimizer_state: float = 0.0      # optimizer bytes per parameter byte (SGD+momentum 1, Adam 2)
    progress: bool | None = None      # tqdm bar: None = on for big graphs when stderr is a tty
    memory_weight: float = 0.0        # cost of a byte of converted input kept for the backward
    #                                   pass, in bytes moved (0: fewest bytes moved, as Tofu)
    refetch: bool = True              # fetch converted inputs again for the backward pass
    #                                   (re-running their operator) instead of keeping them:
    #                                   less memory, more bytes moved and compute
    keep_if_fits: bool = True         # partition(): with refetch, keep the converted inputs
    #                                   after all where the plan keeping them holds at most
    #                                   balance x the ideal as MXNet plans the step, or no
    #                                   more than the re-fetching plan (fewer bytes, no re-run)
    keep_share: float = 0.03          # share of device memory small kept copies may add
    #                                   (with refetch: the converted inputs saving the most
    #                                   bytes per byte kept are kept, not fetched again)
    balance: float = 1.15             # most memory per device, x ideal, before bytes are traded
    #                                   (with no memory weight: a plan holding more is searched
    #                                   again at memory weights until one fits; 0: off)
    interleave: bool = True           # store the blocks a split cuts interleaved (an LSTM's
    #                                   gates: each device a slice of every gate; see
    #                                   nnvm_passes.interleave)
    conversion_bytes: float = 0.0     # bytes each conversion is priced at besides those it
    #                                   moves, once per pass that runs it (its fixed cost: a
    #                                   transfer's latency, operator launches; 0: fewest bytes
    #                                   moved, as Tofu; machine= also weighs its machine's)

    def __post_init__(self):
        set_ = object.__setattr__     # frozen: each field is stored in its checked form
        set_(self, "tie", arguments.flag(self.tie, "SearchOptions.tie"))
        set_(self, "refetch", arguments.flag(self.refetch, "SearchOptions.refetch"))
        set_(self, "interleave", arguments.flag(self.interleave, "SearchOptions.interleave"))
        set_(self, "keep_if_fits", arguments.flag(self.keep_if_fits,
                                                  "SearchOptions.keep_if_fits"))
        set_(self, "try_factor_orders",
             arguments.flag(self.try_factor_orders, "SearchOptions.try_factor_orders"))
        set_(self, "max_states", arguments.count(self.max_states, "SearchOptions.max_states",
                                                 minimum=1, maximum=MAX_STATES,
                                                 example="max_states=4_000_000"))
        set_(self, "optimizer_state", arguments.real(
            self.optimizer_state, "SearchOptions.optimizer_state", minimum=0,
            maximum=MAX_OPTIMIZER_STATE,
            example="optimizer_state=1 for SGD with momentum, 2 for Adam"))
        set_(self, "balance", arguments.real(
            self.balance, "SearchOptions.balance", minimum=0, maximum=MAX_BALANCE,
            example="balance=1.15, or 0 for the fewest-bytes plan whatever it holds"))
        if 0 < self.balance < 1:
            raise InvalidArgumentError(f"SearchOptions.balance must be 0 (off) or at least 1 (a "
                                       f"multiple of the ideal memory), got {self.balance}; "
                                       f"e.g. balance=1.15")
        set_(self, "keep_share", arguments.real(
            self.keep_share, "SearchOptions.keep_share", minimum=0, maximum=1,
            example="keep_share=0.03 (small copies kept) or 0 (every one fetched again)"))
        set_(self, "memory_weight", arguments.real(
            self.memory_weight, "SearchOptions.memory_weight", minimum=0,
            maximum=MAX_MEMORY_WEIGHT,
            example="memory_weight=0 (fewest bytes moved) or 16 (less memory)"))
        set_(self, "conversion_bytes", arguments.real(
            self.conversion_bytes, "SearchOptions.conversion_bytes", minimum=0,
            maximum=MAX_CONVERSION_BYTES,
            example="conversion_bytes=0 (fewest bytes moved) or 250e3 (a conversion's fixed "
                    "cost on 8 V100s over PCIe: tofu_mx.sim.machine(...).conversion_bytes)"))
        if self.progress is not None:
            set_(self, "progress", arguments.flag(self.progress, "SearchOptions.progress"))

    @staticmethod
    def of(value: "SearchOptions | Mapping[str, Any] | None") -> "SearchOptions":
        """``options=`` as given to plan()/partition(): None (the defaults), a SearchOptions,
        or a dict of its fields."""
        if value is None:
            return SearchOptions()
        if isinstance(value, SearchOptions):
            return value
        names = [f.name for f in dataclasses.fields(SearchOptions)]
        if isinstance(value, Mapping):
            unknown = [k for k in value if k not in names]
            if unknown:
                raise InvalidArgumentError(f"options has {', '.join(map(repr, unknown))}, which "
                                           f"SearchOptions does not; use one of its fields: "
                                           f"{', '.join(names)}")
            return SearchOptions(**value)
        raise InvalidArgumentError(f"options must be a tofu_mx.SearchOptions or a dict of its "
                                   f"fields ({', '.join(names)}), got {type(value).__name__}; "
                                   f"e.g. options=SearchOptions(memory_weight=16)")


@dataclass(frozen=True)
class Level:
    parts: int
    groups: int                 # device groups this cut happens in (earlier parts multiplied)
    bytes_per_group: float
    problem_nodes: int          # nodes of the coarsened search problem
    max_frontier: int
    max_states: int
    #: nodes fixed before the exact DP because its state would not fit in max_states
    #: (:mod:`tofu_mx.search.bounded`); 0: the cut is the exact optimum
    fixed: int = 0
    #: with ``fixed``, at most this far above the optimum ((cost - LP bound) / cost; None: the
    #: bound was not computed)
    gap: float | None = None

    @property
    def bytes(self) -> float:
        return self.groups * self.bytes_per_group


@dataclass(frozen=True, init=False)
class TensorPlan:
    name: str
    kind: str                   # data | label | param | aux | activation
    shape: tuple[int, ...]
    dtype: str
    layouts: tuple[StoredLayout, ...]   # stored layout at each level
    shard: tuple[int, ...]              # the largest piece one device stores (pieces of
    #                                     an axis a cut does not divide differ by one)

    def __init__(self, name: str, kind: str, shape: tuple[int, ...], dtype: str,
                 layouts: tuple[StoredLayout, ...], shard: tuple[int, ...]):
        # written out (a plan has one per tensor): see nnvm_passes.ir.Entry
        fields = self.__dict__
        fields["name"] = name
        fields["kind"] = kind
        fields["shape"] = shape
        fields["dtype"] = dtype
        fields["layouts"] = layouts
        fields["shard"] = shard

    @property
    def shard_bytes(self) -> int:
        return int(np.prod(self.shard, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True, init=False)
class OpPlan:
    name: str
    op: str
    strategies: tuple[OpStrategy, ...]  # chosen at each level

    def __init__(self, name: str, op: str, strategies: tuple[OpStrategy, ...]):
        # written out (a plan has one per operator): see nnvm_passes.ir.Entry
        fields = self.__dict__
        fields["name"] = name
        fields["op"] = op
        fields["strategies"] = strategies


@dataclass(frozen=True)
class Memory:
    """Bytes one device holds."""

    weights: int
    gradients: int
    optimizer: int
    aux: int
    inputs: int
    activations: int            # stored operator outputs a gradient node reads (converted
    #                             copies not counted: PartitionedSymbol.memory_per_device does)

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.aux + self.inputs +
                self.activations)


@dataclass(frozen=True)
class Plan:
    num_devices: int
    factors: tuple[int, ...]
    levels: tuple[Level, ...]
    tensors: tuple[TensorPlan, ...]
    ops: tuple[OpPlan, ...]
    memory: tuple[Memory, ...]            # one per device
    opaque: tuple[OpaqueOp, ...]          # operators without a description, or opaque ones
    coarsening: Mapping[str, int] = field(default_factory=dict)
    fingerprint: str = ""                 # graph_fingerprint() of the graph it was made for
    refetch: bool = False                 # converted inputs a gradient reads are fetched again
    #                                       in the backward pass, not kept (SearchOptions)
    kept: tuple[tuple[str, int], ...] = ()   # with refetch, the (operator, input) whose
    #                                       converted copy is kept nevertheless (keep_share)
    no_loss_head: bool = False            # no output is a loss head, and some output carries
    #                                       a gradient: backward() needs out_grads
    #                                       (:func:`has_no_loss_head`)
    unlowered: tuple[str, ...] = ()       # operators run as themselves, not lowered: the
    #                                       plan is for lower_graph(graph, k, keep=unlowered)
    #                                       (tofu_mx.runtime.unlower)

    @property
    def exact_bytes(self) -> float:
        """The bytes moved per training step as the search priced them (a float sum of the
        levels' bytes): what plans are compared and sorted by."""
        return float(sum(level.bytes for level in self.levels))

    @property
    def total_bytes(self) -> int:
        """The bytes moved per training step, whole (:attr:`exact_bytes` rounded): for
        display; compare plans by :attr:`exact_bytes`."""
        return round(self.exact_bytes)

    def tensor(self, name: str) -> TensorPlan:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    # --- plain data -------------------------------------------------------------------------
    def to_json(self) -> str:
        """The plan as JSON: layouts and strategies as their text (``split(1)``,
        ``reduce ci``), opaque operators as ``[name, op, reason]``."""
        d = asdict(self)
        d["tensors"] = [dict(x, layouts=[str(l) for l in t.layouts])
                        for x, t in zip(d["tensors"], self.tensors)]
        d["ops"] = [dict(x, strategies=[str(s) for s in o.strategies])
                    for x, o in zip(d["ops"], self.ops)]
        d["opaque"] = [[o.name, o.op, o.reason] for o in self.opaque]
        for level in d["levels"]:      # an exact cut's record stays as it always was
            if not level["fixed"]:
                del level["fixed"], level["gap"]
        if not self.no_loss_head:      # so does a plan's with a loss head
            del d["no_loss_head"]
        if not self.unlowered:         # and one with every lowering kept
            del d["unlowered"]
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str | bytes) -> "Plan":
        """The plan :meth:`to_json` wrote. Raises :class:`tofu_mx.InvalidArgumentError` if
        ``text`` is not such a plan (checked against the graph later, by ``check_plan``)."""
        try:
            d = json.loads(text)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"cannot read the plan: not JSON ({e}); give the text "
                                       f"Plan.to_json() wrote (tofu-mx plan --json)") from e
        if not isinstance(d, dict):
            raise InvalidArgumentError(f"the plan's JSON must be an object, got "
                                       f"{type(d).__name__}; give the text Plan.to_json() wrote "
                                       f"(tofu-mx plan --json)")
        readers = {
            "num_devices": lambda x: x, "factors": tuple,
            "levels": lambda xs: tuple(Level(**x) for x in xs),
            "tensors": lambda xs: tuple(TensorPlan(
                x["name"], x["kind"], tuple(x["shape"]), x["dtype"],
                tuple(map(StoredLayout.parse, x["layouts"])), tuple(x["shard"])) for x in xs),
            "ops": lambda xs: tuple(OpPlan(x["name"], x["op"],
                                           tuple(map(OpStrategy.parse, x["strategies"])))
                                    for x in xs),
            "memory": lambda xs: tuple(Memory(**x) for x in xs),
            "opaque": lambda xs: tuple(_opaque_entry(x) for x in xs),
            "coarsening": dict}
        fields = {}
        for key, read in readers.items():
            if key not in d:
                raise InvalidArgumentError(f"the plan's JSON lacks the field {key!r}; give the "
                                           f"text Plan.to_json() wrote (tofu-mx plan --json)")
            try:
                fields[key] = read(d[key])
            except InvalidArgumentError as e:
                raise InvalidArgumentError(f"the plan's field {key!r}: {e}") from e
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise InvalidArgumentError(
                    f"the plan's field {key!r} has the wrong structure ({type(e).__name__}: "
                    f"{e}); give the text Plan.to_json() wrote (tofu-mx plan --json)") from e
        # plans written before re-fetching existed were priced and rewritten without it
        kept = d.get("kept", [])
        if not isinstance(kept, list) or \
                not all(isinstance(x, list) and len(x) == 2 for x in kept):
            raise InvalidArgumentError(f"the plan's field 'kept' must be a list of [operator "
                                       f"name, input index] pairs, got {kept!r}")
        plan = Plan(**fields, fingerprint=d.get("fingerprint", ""),
                    refetch=d.get("refetch", False), kept=tuple(map(tuple, kept)),
                    no_loss_head=d.get("no_loss_head", False),
                    unlowered=_names(d.get("unlowered", []), "unlowered"))
        _check_types(plan)
        return plan

    def report(self, max_rows: int = 40) -> str:
        lines = [f"plan for {self.num_devices} devices, cuts {' x '.join(map(str, self.factors)) or '-'}"
                 f": {format_bytes(self.total_bytes)} moved per training step"]
        if self.no_loss_head:
            lines.append(NO_LOSS_HEAD)
        for k, lv in enumerate(self.levels):
            lines.append(f"  level {k + 1}: {lv.parts}-way cut in {lv.groups} group(s), "
                         f"{format_bytes(lv.bytes_per_group)} each, {format_bytes(lv.bytes)} in all "
                         f"(search: {lv.problem_nodes} nodes, frontier <= {lv.max_frontier}, "
                         f"<= {lv.max_states} states)")
            if lv.fixed:
                gap = ("gap unknown" if lv.gap is None else "its cost equals the LP "
                       "relaxation's bound: optimal all the same" if lv.gap == 0 else
                       f"at most {lv.gap:.1%} above the optimum, by the LP relaxation's bound")
                lines.append(f"    not the exact optimum: the exact search would not fit in "
                             f"max_states, so {lv.fixed} node(s) were fixed first ({gap})")
        if self.coarsening:
            c = self.coarsening
            lines.append(f"  coarsening: {c['operators']} operators -> {c['groups']} groups "
                         f"(followers merged) -> {c['tied']} choices (RNN steps tied)")
        m = self.memory[0] if self.memory else None
        if m:
            lines.append(f"  per device, stored shards: weights {format_bytes(m.weights)}, "
                         f"gradients {format_bytes(m.gradients)}, "
                         f"optimizer {format_bytes(m.optimizer)}, "
                         f"activations {format_bytes(m.activations)}, aux {format_bytes(m.aux)}, "
                         f"inputs {format_bytes(m.inputs)}: {format_bytes(m.total)}")
            lines.append(f"    (converted inputs a gradient reads: fetched again in the backward "
                         f"pass, but {len(self.kept)} kept)" if self.refetch else
                         "    (not the converted copies a gradient reads: "
                         "PartitionedSymbol.memory_per_device() counts those)")
        lines.append(f"  opaque operators: "
                     f"{', '.join(map(str, self.opaque)) if self.opaque else 'none'}")
        lines.append("  tensors (largest first):")
        for t in sorted(self.tensors, key=lambda t: (-t.shard_bytes, t.name))[:max_rows]:
            lines.append(f"    {t.name:<40} {t.kind:<10} {str(t.shape):<22} "
                         f"{' > '.join(map(str, t.layouts)):<30} shard {t.shard}")
        if len(self.tensors) > max_rows:
            lines.append(f"    ... {len(self.tensors) - max_rows} more")
        return "\n".join(lines)


#: what :meth:`Plan.report` says of a graph with no loss head
NO_LOSS_HEAD = ("  no loss head: no output is made by a loss operator (SoftmaxOutput, "
                "MakeLoss, ...: one declared loss=True), so the backward pass priced here "
                "starts from the outputs' gradients: give them to "
                "exe.backward(out_grads=[...]) (a Gluon PartitionedBlock does); for inference "
                "only, bind with grad_req='null'")


def has_no_loss_head(graph: Graph, needs_grad: Mapping[tuple[int, int], bool]) -> bool:
    """Whether MXNet's backward pass of ``graph`` needs the outputs' gradients given
    (``out_grads``): no output is made by a loss head (an operator whose facts say
    ``loss=True``), and some output carries a gradient (``needs_grad``:
    :func:`~tofu_mx.search.structure.needs_grad_of`). An output of an operator with no
    description may be a loss nobody declared (a custom one): nothing is claimed then."""
    for e in graph.heads:
        node = graph.nodes[e.node]
        if not node.is_variable and (registry_entry(node.op, node.attrs) is None or
                                     facts(node.op, Attrs(node.attrs)).loss):
            return False
    return any(needs_grad[(e.node, e.index)] for e in graph.heads)


def _names(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise InvalidArgumentError(f"the plan's field {field!r} must be a list of operator "
                                   f"names, got {value!r}")
    return tuple(value)


def _check_types(plan: Plan) -> None:
    """Every field of a plan read from JSON has its type (ints, strings, tuples of them)."""
    def ints(values, what):
        if not all(arguments.is_int(v) for v in values):
            raise InvalidArgumentError(f"the plan's {what} must be ints, got {list(values)!r}")

    def strings(values, what):
        if not all(isinstance(v, str) for v in values):
            raise InvalidArgumentError(f"the plan's {what} must be strings, got {list(values)!r}")
    ints([plan.num_devices], "num_devices")
    ints(plan.factors, "factors")
    for lv in plan.levels:
        ints([lv.parts, lv.groups, lv.problem_nodes, lv.max_frontier, lv.max_states,
              lv.fixed], "level counts")
    for t in plan.tensors:
        strings([t.name, t.kind, t.dtype], f"tensor {t.name!r} fields")
        ints(t.shape + t.shard, f"tensor {t.name!r} shape and shard")
    for o in plan.ops:
        strings([o.name, o.op], f"operator {o.name!r} fields")
    for o in plan.opaque:
        strings([o.name, o.op, o.reason], "opaque operator's fields")
    strings([plan.fingerprint], "fingerprint")
    strings([name for name, _ in plan.kept], "kept inputs' operator names")
    ints([j for _, j in plan.kept], "kept inputs' indices")
    for flag in ("refetch", "no_loss_head"):
        if not isinstance(getattr(plan, flag), bool):
            raise InvalidArgumentError(f"the plan's {flag} must be true or false, got "
                                       f"{getattr(plan, flag)!r}")
    if plan.num_devices < 1 or any(f < 2 for f in plan.factors) or \
            math.prod(plan.factors) != plan.num_devices:
        raise InvalidArgumentError(f"the plan's cuts {list(plan.factors)} do not multiply to its "
                                   f"num_devices {plan.num_devices} (each cut has 2 or more "
                                   f"parts); give the text Plan.to_json() wrote, unedited there")


def graph_fingerprint(graph: Graph) -> str:
    """A digest of what a plan depends on: every node's name, operator, attributes, inputs,
    and every tensor's shape and dtype.

    The SHA-256 of each node's ``json.dumps([name, op, sorted(attrs.items()), inputs,
    [[shape, dtype], ...], kind])``, then of the heads' (saved plans store it). The JSON of
    an attribute mapping or a tensor is made once per object (nodes share them), the rest
    written as ``json.dumps`` writes it."""
    attrs_json: dict[int, tuple] = {}       # id -> (the object, kept alive; its JSON)
    info_json: dict[int, tuple] = {}
    words: dict[Any, str] = {}              # an operator or kind -> its JSON (a few repeat)
    parts = []
    for n in graph.nodes:
        attrs = attrs_json.get(id(n.attrs))
        if attrs is None:
            attrs = attrs_json[id(n.attrs)] = (n.attrs, json.dumps(sorted(n.attrs.items())))
        outs = []
        for t in n.outputs:
            info = info_json.get(id(t))
            if info is None:
                info = info_json[id(t)] = (t, json.dumps([list(t.shape), t.dtype]))
            outs.append(info[1])
        ins = ", ".join([f"[{e.node}, {e.index}, {e.version}]" if type(e.node) is int and
                         type(e.index) is int and type(e.version) is int else
                         json.dumps(e.to_json()) for e in n.inputs])
        op, kind = words.get(n.op), words.get(n.kind)
        if op is None:
            op = words[n.op] = _json_str(n.op)
        if kind is None:
            kind = words[n.kind] = _json_str(n.kind)
        parts.append(f"[{_json_str(n.name)}, {op}, {attrs[1]}, [{ins}], "
                     f"[{', '.join(outs)}], {kind}]")
    parts.append(json.dumps([e.to_json() for e in graph.heads]))
    return hashlib.sha256("".join(parts).encode()).hexdigest()[:16]


def _json_str(value: Any) -> str:
    """``json.dumps(value)``, quick for a string."""
    return _ENCODE_STR(value) if type(value) is str else json.dumps(value)


_ENCODE_STR = json.encoder.encode_basestring_ascii     # what json.dumps writes a string with


def check_plan(plan: Plan, graph: Graph, num_devices: int | None = None) -> None:
    """Raise :class:`tofu_mx.InvalidArgumentError` unless ``plan`` fits ``graph``: made for it
    (its fingerprint), for ``num_devices`` devices, with cuts multiplying to that count, a
    layout per cut for each of the graph's tensors (shapes and dtypes as the graph's, shards
    as the layouts make them) and a strategy per cut for each operator. A plan edited by hand
    passes if it is consistent; one made elsewhere, for other shapes or devices, does not."""
    def bad(what: str):
        lowered = (f"; it runs {len(plan.unlowered)} operator(s) unlowered, so lower the graph "
                   f"with lower_graph(graph, k, keep=plan.unlowered)" if plan.unlowered else "")
        return InvalidArgumentError(f"the plan does not fit this graph: {what}{lowered}. Make "
                                    f"the plan for this graph and these shapes (tofu_mx.plan("
                                    f"symbol, k, **shapes)), or partition() directly")
    if num_devices is not None and plan.num_devices != num_devices:
        raise bad(f"it is for {plan.num_devices} devices, {num_devices} are given")
    if any(f < 2 for f in plan.factors) or math.prod(plan.factors) != plan.num_devices:
        raise bad(f"its cuts {list(plan.factors)} do not multiply to its {plan.num_devices} "
                  f"devices (each cut has 2 or more parts)")
    if [lv.parts for lv in plan.levels] != list(plan.factors):
        raise bad(f"its levels cut into {[lv.parts for lv in plan.levels]} parts, its cuts are "
                  f"{list(plan.factors)}")
    want = {}
    for node in graph.nodes:
        outs = [(node.name, node.outputs[0])] if node.is_variable else \
            [(f"{node.name}:{j}", t) for j, t in enumerate(node.outputs)]
        want.update(outs)
    got = {t.name: t for t in plan.tensors}
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or extra:
        raise bad(f"tensors missing from the plan {missing[:5]}, tensors the graph lacks "
                  f"{extra[:5]}")
    for name, info in want.items():
        t = got[name]
        if tuple(t.shape) != info.shape or t.dtype != info.dtype:
            raise bad(f"tensor {name!r} is {t.shape} {t.dtype} in the plan, {info.shape} "
                      f"{info.dtype} in the graph")
        if len(t.layouts) != len(plan.factors) or \
                not all(isinstance(l, StoredLayout) for l in t.layouts):
            raise bad(f"tensor {name!r} has layouts {list(map(str, t.layouts))}: one "
                      f"StoredLayout per cut ({len(plan.factors)})")
        shard, smallest = list(info.shape), list(info.shape)
        for layout, p in zip(t.layouts, plan.factors):
            if layout.replicated:
                continue
            if not 0 <= layout.axis < len(shard) or smallest[layout.axis] < p:
                raise bad(f"tensor {name!r} {info.shape} has layout '{layout}', which is not "
                          f"'replicated' or 'split(axis)' with every piece of the axis at "
                          f"least {p} long")
            shard[layout.axis] = -(-shard[layout.axis] // p)
            smallest[layout.axis] //= p
        if tuple(t.shard) != tuple(shard):
            raise bad(f"tensor {name!r} has shard {t.shard}, its layouts give {tuple(shard)}")
    ops = [(n.name, n.op) for n in graph.operators()]
    if [(o.name, o.op) for o in plan.ops] != ops:
        raise bad("its operators are not the graph's")
    for o in plan.ops:
        if len(o.strategies) != len(plan.factors) or \
                not all(isinstance(s, OpStrategy) for s in o.strategies):
            raise bad(f"operator {o.name!r} has strategies {list(map(str, o.strategies))}: one "
                      f"OpStrategy per cut ({len(plan.factors)})")
    arity = {n.name: len(n.inputs) for n in graph.operators()}
    unknown = sorted(x for x in plan.kept if not 0 <= x[1] < arity.get(x[0], 0))
    if unknown:
        raise bad(f"it keeps inputs the graph's operators lack: {unknown[:5]}")
    if plan.fingerprint and plan.fingerprint != graph_fingerprint(graph):
        raise bad("it was made for another graph (operator attributes or edges differ) (fingerprint "
                  f"{plan.fingerprint}, this graph's is {graph_fingerprint(graph)})")


#: the most orders of k's prime factors the search tries (k = 2*3*5*7 has 24; 2**16 has one)
MAX_FACTOR_ORDERS = 24
#: the largest device count plan() takes: the search's work grows with log(k), but
#: factoring k and the per-device tables grow with k
MAX_DEVICES = 2 ** 20
#: the largest prime factor of a device count plan() searches for (see check_device_count)
MAX_PRIME_FACTOR = 4096


def factor_orders(k: int, try_all: bool) -> list[tuple[int, ...]]:
    """The orders of ``k``'s prime factors to search: largest first alone, or (``try_all``)
    every distinct order, in lexicographic order, at most :data:`MAX_FACTOR_ORDERS` of them."""
    factors = sorted(prime_factors(k), reverse=True)
    if not try_all:
        return [tuple(factors)]
    return list(itertools.islice(_distinct_orders(sorted(factors)), MAX_FACTOR_ORDERS))


def _distinct_orders(items: list[int]):
    """Each distinct permutation of the sorted ``items`` once, in lexicographic order (not
    every permutation: 2**16 has 16! of those and one distinct order)."""
    if not items:
        yield ()
        return
    for i, first in enumerate(items):
        if i and items[i - 1] == first:
            continue
        for rest in _distinct_orders(items[:i] + items[i + 1:]):
            yield (first,) + rest


@dataclass(frozen=True)
class _LevelResult:
    cut: Cut
    problem: CutProblem
    solution: Solution
    members: Mapping      # op index -> (strategy, stored layouts)
    var_layout: Mapping   # variable index -> layout
    bounded: Bounded | None = None    # how the solution was found, where the DP did not fit


def _solve_level(graph: Graph, view: View, parts: int, options: SearchOptions,
                 choose=None, structure: GraphStructure | None = None,
                 kept_tensors: frozenset = frozenset(),
                 avoid: frozenset = frozenset()) -> _LevelResult:
    """One cut's search. ``choose(cut, cut_problem) -> Solution`` replaces the DP (the
    baselines, tests that force a strategy); ``avoid``: ``(operator name, strategy name)``
    pairs not chosen at this cut."""
    cut = Cut(graph, view, parts, tie=options.tie, memory_weight=options.memory_weight,
              conversion_bytes=options.conversion_bytes,
              refetch=options.refetch, structure=structure, kept_tensors=kept_tensors)
    problem = cut.problem()
    if avoid:
        problem = dataclasses.replace(problem, problem=restricted(
            cut, problem, lambda c, p, slot, choice: avoid.isdisjoint(
                _member_choices(c, p, slot, choice))))
    progress = _progress_bar(len(problem.problem.names), options, f"{parts}-way cut")
    bounded = None
    try:
        if choose is None:
            solution, bounded = solve_within(problem.problem, options.max_states,
                                             progress.update if progress else None)
        else:
            solution = choose(cut, problem)
    finally:
        if progress is not None:
            progress.close()
    return _LevelResult(cut, problem, solution, problem.members(solution.assignment),
                        problem.var_layouts(solution.assignment), bounded)


#: the unary cost that keeps a choice out of the DP's answer (where its node has another)
EXCLUDED = 1e30


def restricted(cut: Cut, problem: CutProblem, allowed) -> Problem:
    """``problem``'s problem with the choices ``allowed(cut, problem, slot, choice)`` refuses
    priced out (:data:`EXCLUDED`), except at a node where it refuses them all."""
    unary = []
    for slot, cost in enumerate(problem.problem.unary):
        keep = np.array([allowed(cut, problem, slot, c) for c in range(len(cost))])
        unary.append(cost if not keep.any() else np.where(keep, cost, EXCLUDED))
    return Problem(problem.problem.names, problem.problem.choices, tuple(unary),
                   problem.problem.edges)


def choice_name(cut: Cut, problem: CutProblem, slot: int, choice: int) -> tuple[str, str] | None:
    """(operator name, strategy name) of a group's choice, by its first member; None for a
    variable's."""
    obj = problem.slots[slot]
    if not isinstance(obj, Group):
        return None
    leader = obj.copies[0][0]
    return cut.graph.nodes[leader].name, cut.strats[leader][obj.choices[choice][0]].name


def _member_choices(cut: Cut, problem: CutProblem, slot: int, choice: int
                    ) -> set[tuple[str, str]]:
    """(operator name, strategy name) of every member of a group under one of its choices
    (followers take strategies of their own); empty for a variable's."""
    obj = problem.slots[slot]
    if not isinstance(obj, Group):
        return set()
    names = cut.graph.nodes
    return {(names[i].name, strategy.name)
            for copy, row in zip(obj.copies, problem.resolved[slot].rows[choice])
            for i, (strategy, _) in zip(copy, row)}


def _progress_bar(total: int, options: SearchOptions, what: str):
    show = options.progress
    if show is None:
        show = total > 5000 and sys.stderr.isatty()
    if not show:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=f"tofu_mx search: {what}", unit="node", leave=False)


def search_levels(graph: Graph, order: Sequence[int], options: SearchOptions,
                  choose=None, structure: GraphStructure | None = None,
                  kept_tensors: frozenset = frozenset(),
                  avoid: frozenset = frozenset()) -> list[_LevelResult]:
    """The cuts of one factor order, each searched at the view the previous ones leave;
    ``structure``: the graph's :class:`~tofu_mx.search.structure.GraphStructure`, shared by
    every level (made here if not given); ``kept_tensors``: tensors whose converted copies
    are kept for the backward pass even by operators that re-fetch; ``avoid``: as for
    :func:`plan_graph`."""
    structure = GraphStructure.of(graph) if structure is None else structure
    view, results = View.of(graph), []
    for level, parts in enumerate(order):
        if level:
            last = results[-1]
            view = next_view(last.cut, last.members, last.var_layout)
        results.append(_solve_level(graph, view, parts, options, choose, structure,
                                    kept_tensors, frozenset((name, strategy) for name, at,
                                                            strategy in avoid if at == level)))
    return results


def _tensor_and_op_plans(graph: Graph, results: list[_LevelResult], structure: GraphStructure
                         ) -> tuple[tuple[TensorPlan, ...], tuple[OpPlan, ...]]:
    """The plan's tensors (a variable's, or an operator's outputs, in node order) and its
    operators. What each level chose is shared by the nodes that chose alike (all alive in
    ``results``): numbered by its identity, each distinct choice across the levels is typed
    once."""
    nodes, ops, variables = graph.nodes, list(structure.ops), list(structure.variables)
    parts = [r.cut.parts for r in results]
    ports = structure.ports(graph)
    n_tensors = int(ports.tensor_start[-1])
    # per node, which of the distinct choices across the levels it made (operators and
    # variables numbered apart)
    op_rows = [list(map(r.members.__getitem__, ops)) for r in results]
    var_found = [list(map(r.var_layout.__getitem__, variables)) for r in results]
    op_choice, op_first = _distinct_by_identity(op_rows, len(ops))
    var_choice, var_first = _distinct_by_identity(var_found, len(variables))
    choice = np.zeros(len(nodes), dtype=np.int64)
    choice[ops] = op_choice
    choice[variables] = var_choice + len(op_first)
    # per tensor: its node's choice, its output, its TensorInfo (numbered by identity)
    node_of = np.repeat(np.arange(len(nodes), dtype=np.int64), np.diff(ports.tensor_start))
    output = np.arange(n_tensors, dtype=np.int64) - ports.tensor_start[node_of]
    infos = list(chain.from_iterable(n.outputs for n in nodes))
    _, info_first, info_of = np.unique(np.fromiter(map(id, infos), np.int64, n_tensors),
                                       return_index=True, return_inverse=True)
    keys = np.stack([choice[node_of], output, info_of.reshape(-1)], axis=1)
    distinct, which = distinct_rows(keys)
    typed = []
    for c, k, info in distinct.tolist():
        shape = infos[int(info_first[info])].shape
        if c < len(op_first):
            at = op_first[c]
            typed.append(_typed_layouts(shape, [rows[at][1][k] for rows in op_rows], parts))
        else:
            typed.append(_typed_layouts(shape, [found[var_first[c - len(op_first)]]
                                                for found in var_found], parts))
    picked = list(map(typed.__getitem__, which.tolist()))
    names = structure.names(graph)
    is_var = np.zeros(len(nodes), dtype=bool)
    is_var[variables] = True
    tensor_names = [names[i] if v else f"{names[i]}:{k}" for i, k, v in
                    zip(node_of.tolist(), output.tolist(), is_var[node_of].tolist())]
    kinds = [nodes[i].kind if v else "activation" for i, v in
             zip(node_of.tolist(), is_var[node_of].tolist())]
    tensors = tuple(map(TensorPlan, tensor_names, kinds, map(attrgetter("shape"), infos),
                        map(attrgetter("dtype"), infos), map(itemgetter(0), picked),
                        map(itemgetter(1), picked)))
    # a search Strategy's type by its id (hashing one is slow)
    strategy_types: dict[int, OpStrategy] = {}
    by_choice = []
    for at in op_first:
        for s, _ in (rows[at] for rows in op_rows):
            if id(s) not in strategy_types:
                strategy_types[id(s)] = OpStrategy.of(s)
        by_choice.append(tuple(strategy_types[id(rows[at][0])] for rows in op_rows))
    op_plans = tuple(map(OpPlan, map(names.__getitem__, ops),
                         map(attrgetter("op"), map(nodes.__getitem__, ops)),
                         map(by_choice.__getitem__, op_choice.tolist())))
    return tensors, op_plans


def _distinct_by_identity(columns: list[list], n: int) -> tuple[np.ndarray, list[int]]:
    """Which distinct row each of ``n`` rows is (``columns``: one list per column, of
    objects alive meanwhile, compared by identity), numbered in order of first appearance,
    and each distinct row's first."""
    if not columns or not n:
        return np.zeros(n, dtype=np.int64), [0] if n else []
    ids = [np.unique(np.fromiter(map(id, column), np.int64, n), return_inverse=True)[1]
           .reshape(-1) for column in columns]
    which, first = by_first_appearance(distinct_rows(np.stack(ids, axis=1))[1])
    return which, first.tolist()


def _typed_layouts(shape: tuple[int, ...], found: list, parts: list[int]
                   ) -> tuple[tuple[StoredLayout, ...], tuple[int, ...]]:
    """A tensor's stored layout at each level (the search's ``found``) as the plan's, and
    the largest shard a device stores."""
    shard = list(shape)
    for layout, p in zip(found, parts):
        if layout[0] == "split":     # the largest piece
            shard[layout[1]] = -(-shard[layout[1]] // p)
    return tuple(map(StoredLayout.of, found)), tuple(shard)


def _memory(graph: Graph, tensors: Sequence[TensorPlan], kept: Mapping, options: SearchOptions,
            k: int, structure: GraphStructure) -> tuple[Memory, ...]:
    """``kept``: :func:`~nnvm_passes.backward.kept_tensors` of the graph; ``tensors``:
    :func:`_tensor_and_op_plans` of the graph (a variable's tensor, or an operator's
    outputs, in node order)."""
    sizes: dict[tuple, int] = {}      # (id of a shard, dtype) -> its bytes (shards shared)

    def shard_bytes(t: TensorPlan) -> int:
        key = (id(t.shard), t.dtype)
        found = sizes.get(key)
        if found is None:
            found = sizes[key] = math.prod(t.shard) * itemsize_of(t.dtype)
        return found
    weights = gradients = aux = inputs = activations = 0
    start = structure.ports(graph).tensor_start.tolist()     # node -> its first tensor
    nodes = graph.nodes
    for v in structure.variables:
        b = shard_bytes(tensors[start[v]])
        kind = nodes[v].kind
        if kind == "param":
            weights += b
            gradients += b
        elif kind == "aux":
            aux += b
        else:
            inputs += b
    for i, j in kept:
        activations += shard_bytes(tensors[start[i] + j])
    m = Memory(weights, gradients, int(weights * options.optimizer_state), aux, inputs, activations)
    return tuple(m for _ in range(k))


def budgets_of(budget, k: int) -> list[float]:
    """``memory_budget`` (bytes, or one per device) as one budget per device."""
    if isinstance(budget, str):
        raise InvalidArgumentError(
            f"memory_budget must be a number of bytes, got the string {budget!r}; convert it "
            f"with tofu_mx.summary.parse_bytes({budget!r})")
    if isinstance(budget, (list, tuple, np.ndarray)):
        budgets = list(budget)
        if len(budgets) != k:
            raise InvalidArgumentError(f"memory_budget lists {len(budgets)} budgets for {k} "
                                       f"devices; give one number of bytes, or one per device")
        return [arguments.byte_amount(b, f"memory_budget[{d}]") for d, b in enumerate(budgets)]
    return [arguments.byte_amount(budget)] * k


def _check_budget(plan: Plan, budget, k: int) -> None:
    budgets = budgets_of(budget, k)
    over = [(d, m.total, b) for d, (m, b) in enumerate(zip(plan.memory, budgets)) if m.total > b]
    if not over:
        return
    m = plan.memory[0]
    fixed = sum(t.shard_bytes for t in plan.tensors if all(l.replicated for l in t.layouts))
    scalable = (m.total - fixed) * k
    need = None if min(budgets) <= fixed else math.ceil(scalable / (min(budgets) - fixed))
    d, total, b = over[0]
    raise NoFeasiblePlanError(
        f"no plan fits: device {d} needs {format_bytes(total)} (weights {format_bytes(m.weights)},"
        f" gradients {format_bytes(m.gradients)}, optimizer {format_bytes(m.optimizer)}, "
        f"activations {format_bytes(m.activations)}) but its budget is {format_bytes(b)}; "
        + (f"about {need} devices would fit: use more devices, a smaller batch or a larger "
           f"budget" if need else "no number of devices would fit: the tensors kept whole "
           "alone exceed the budget; use a smaller model or batch, or a larger budget"),
        total, need)


def check_device_count(num_devices) -> int:
    """A device count plan() can search for (NumPy ints too), as ``int``: at most
    :data:`MAX_DEVICES`, with no prime factor above :data:`MAX_PRIME_FACTOR` (a cut into p
    parts costs time in proportion to p: WResNet-14 took 6.5 s at k = 4093, a one-layer MLP
    48 s at the prime 1048573)."""
    k = arguments.count(num_devices, "num_devices", minimum=1, maximum=MAX_DEVICES,
                        example="num_devices=8")
    largest = max(prime_factors(k), default=1)
    if largest > MAX_PRIME_FACTOR:
        raise InvalidArgumentError(
            f"num_devices={k} has the prime factor {largest}: the search cuts the devices by "
            f"their prime factors, and a cut into more than {MAX_PRIME_FACTOR} parts would take "
            f"minutes; use a device count whose prime factors are at most {MAX_PRIME_FACTOR} "
            f"(e.g. {_nearest_allowed(k)})")
    return k


def _nearest_allowed(k: int) -> int:
    """The largest device count at most ``k`` whose prime factors are all allowed."""
    while max(prime_factors(k), default=1) > MAX_PRIME_FACTOR:
        k -= 1
    return k


def plan(symbol, num_devices: int, *, memory_budget=None, options: SearchOptions | None = None,
         dtypes: Mapping[str, Any] | None = None, **shapes) -> Plan:
    """Partition plan of ``symbol`` over ``num_devices`` devices (nothing is bound or run).

    Runs import -> lowering (:func:`lower_graph`) -> TDL analysis -> coarsening -> search.
    ``memory_budget``: bytes per device, or a list with one budget per device;
    :class:`tofu_mx.NoFeasiblePlanError` if no plan fits.
    """
    num_devices = check_device_count(num_devices)
    options = SearchOptions.of(options)
    if memory_budget is not None:
        budgets_of(memory_budget, num_devices)    # before the import, which may take a while
    with collector_paused():       # import and lowering too make objects by the million
        graph = lower_graph(import_graph(symbol, dtypes=dtypes, **shapes), num_devices,
                            interleave=options.interleave)
        found = plan_graph(graph, num_devices, memory_budget=memory_budget, options=options)
        del graph
    return found


def lower_graph(graph: Graph, num_devices: int, keep: frozenset | Sequence[str] = (),
                interleave: bool = True) -> Graph:
    """``graph`` with the operators that split better as their parts lowered into them
    (:attr:`tofu_mx.tdl.OpFacts.lowering`: BatchNorm), and the blocks of splits that can be
    read interleaved stored so (:func:`nnvm_passes.interleave.interleave`: an LSTM's gates),
    when there is more than one device; the graph plan() searches and partition() rewrites.
    ``keep``: names of operators left as they are (:attr:`Plan.unlowered`); ``interleave``:
    False leaves the splits as they are (:attr:`SearchOptions.interleave`; a graph lowered
    with it has ``layouts``)."""
    if num_devices == 1:
        return graph
    keep = frozenset(keep)
    lowered = lower(graph, lambda node: None if node.name in keep else
                    _lowering_of(node.op, node.attrs, generation()))
    if not interleave:
        return lowered
    return interleave_blocks(lowered, _passed_axes(lowered), _block_split(lowered))


def _traced(graph: Graph, node):
    """``node``'s traced description in ``graph`` (None: not described, or failing)."""
    try:
        found = described(node.op, node.attrs, [graph.tensor(e).shape for e in node.inputs],
                          [o.shape for o in node.outputs])
    except TDLError:        # a description failing here only keeps the graph as it is
        return None
    return None if found is None else found[1]


def _passed_axes(graph: Graph):
    def passes(node, k: int, axis: int):
        traced = _traced(graph, node)
        return None if traced is None else passed_axes(traced, k, axis)
    return passes


def _block_split(graph: Graph):
    def splits(node):
        if len(node.outputs) < 2:       # (most nodes: not traced for this)
            return None
        traced = _traced(graph, node)
        return None if traced is None else block_split(traced)
    return splits


@functools.lru_cache(maxsize=1 << 12)
def _lowering_of(op: str, attrs: FrozenDict, _generation: int):
    """``facts(op).lowering`` for a node's raw attributes (cached per registry generation:
    nodes share their attributes, and parsing them per node dominated at 100k operators)."""
    return facts(op, Attrs(attrs)).lowering


def plan_graph(graph: Graph, num_devices: int, *, memory_budget=None,
               options: SearchOptions = SearchOptions(), choose=None,
               factors: Sequence[int] | None = None, avoid: frozenset = frozenset()) -> Plan:
    """The cheapest plan over every order of the device count's prime factors (``factors``:
    that order alone); with a ``memory_budget``, the cheapest of those that fit (else
    NoFeasiblePlanError, reporting the smallest footprint found). ``avoid``: ``(operator
    name, level, strategy name)`` triples the search does not choose (where the operator
    has another choice): shares found not to run once every cut is composed."""
    with collector_paused():
        return _plan_graph(graph, num_devices, memory_budget, options, choose, factors,
                           avoid)


def _plan_graph(graph: Graph, num_devices: int, memory_budget, options: SearchOptions,
                choose, factors=None, avoid: frozenset = frozenset()) -> Plan:
    shared = _Shared.of(graph)
    ideal = ideal_memory(graph, shared.kept, options, num_devices) if choose is None else 0.0
    weights = _small_weights(graph, num_devices, options, shared, ideal) if choose is None \
        else (frozenset(), 0.0)
    candidates = _candidates(graph, num_devices, options, choose, shared, weights, factors,
                             avoid)
    if memory_budget is None:
        if choose is None and not options.memory_weight and options.balance:
            return _balanced(graph, num_devices, candidates[0], options, shared, weights,
                             ideal, avoid)
        return candidates[0]
    failures = []
    for candidate in candidates:
        try:
            _check_budget(candidate, memory_budget, num_devices)
            return candidate
        except NoFeasiblePlanError as e:
            failures.append(e)
    raise min(failures, key=lambda e: e.footprint)


def _candidates(graph: Graph, num_devices: int, options: SearchOptions, choose,
                shared: "_Shared", small_weights: tuple[frozenset, float],
                factors: Sequence[int] | None = None, avoid: frozenset = frozenset()
                ) -> list[Plan]:
    """The plan of every order of the device count's prime factors (or of ``factors``
    alone), fewest bytes first (with ``options.conversion_bytes``: the least bytes and
    conversions as the search priced them); ``small_weights``: :func:`_small_weights`."""
    orders = [tuple(factors)] if factors is not None else \
        factor_orders(num_devices, options.try_factor_orders) if num_devices > 1 else [()]
    weights, used = small_weights
    found = []
    for order in orders:
        results = search_levels(graph, order, options, choose, shared.structure, weights,
                                avoid)
        plan = _assemble(graph, num_devices, order, results, options, shared, weights, used)
        priced = sum(level.groups * r.problem.problem.cost(r.solution.assignment)
                     for level, r in zip(plan.levels, results)) \
            if options.conversion_bytes else plan.exact_bytes
        found.append((priced, plan.factors, plan))
    return [plan for _, _, plan in sorted(found, key=lambda x: x[:2])]


def _small_weights(graph: Graph, num_devices: int, options: SearchOptions,
                   shared: "_Shared", ideal: float) -> tuple[frozenset, float]:
    """The parameters whose converted copies the search keeps for the backward pass even
    where their readers re-fetch (so it prices, and may choose, data parallelism's way with
    them: gathered once), and the bytes that may hold: the smallest first, each counted
    once per device (a whole copy), while they add at most ``keep_share`` of the ideal
    memory. Only with ``refetch``. The pieces joined into a copy are not counted, though
    the joining Concat's gradient reads them in MXNet's oneDNN build: measured, they add
    about as much again (counting them too kept fewer weights and moved more bytes than
    keeping none before the search: SqueezeNet at k = 5, 1.20x data parallelism).
    ``ideal``: :func:`ideal_memory`."""
    if not options.refetch or not options.keep_share or num_devices == 1:
        return frozenset(), 0.0
    structure = shared.structure
    ports = structure.ports(graph)
    param = np.zeros(len(graph.nodes), dtype=bool)
    param[[v for v, facts in zip(structure.variables, structure.variable_facts)
           if facts[1] == 2]] = True
    read = np.flatnonzero(structure.refetches(graph)[ports.member] & param[ports.source] &
                          structure.read_by_gradient(graph))
    # each parameter tensor such an input reads, once, with its bytes
    _, first = np.unique(ports.tensor[read], return_index=True)
    source = ports.source[read[first]]
    index = ports.tensor[read[first]] - ports.tensor_start[source]     # the output read
    nodes = graph.nodes
    sizes = np.array([math.prod(t.shape) * itemsize_of(t.dtype) for t in
                      (nodes[x].outputs[k] for x, k in zip(source.tolist(), index.tolist()))],
                     dtype=np.int64)
    budget = options.keep_share * ideal
    kept, used = [], 0.0
    for k in np.lexsort((index, source, sizes)).tolist():     # smallest first, then by tensor
        size = int(sizes[k])
        if used + size > budget:
            break
        kept.append((int(source[k]), int(index[k])))
        used += size
    return frozenset(kept), used


#: the memory weights :func:`_balanced` tries, in order
BALANCE_WEIGHTS = (1.0, 4.0, 16.0, 64.0, 256.0)


def _balanced(graph: Graph, num_devices: int, plan: Plan, options: SearchOptions,
              shared: "_Shared", small_weights: tuple[frozenset, float], ideal: float,
              avoid: frozenset = frozenset()) -> Plan:
    """``plan`` if its devices hold at most ``options.balance`` times the ideal (its memory
    estimate against 1/k of everything it counts), else the first plan within that found
    at the weights :data:`BALANCE_WEIGHTS` (which price the bytes a device stores above an
    even share: a split's remainder, a whole copy), or ``plan`` if none is; ``ideal``:
    :func:`ideal_memory`."""
    if plan.memory[0].total <= options.balance * ideal:
        return plan
    for weight in BALANCE_WEIGHTS:
        found = _candidates(graph, num_devices, dataclasses.replace(options, memory_weight=weight),
                            None, shared, small_weights, None, avoid)[0]
        if found.memory[0].total <= options.balance * ideal:
            return found
    return plan


def ideal_memory(graph: Graph, kept: Mapping, options: SearchOptions, k: int) -> float:
    """1/k of the bytes :attr:`Plan.memory` counts on a device, what an even split of
    everything would hold (``kept``: :func:`~nnvm_passes.backward.kept_tensors`, or
    :func:`~nnvm_passes.backward.kept_for_backward`)."""
    sizes: dict[int, int] = {}      # id of a TensorInfo (alive in the graph) -> its bytes

    def nbytes(t: TensorInfo) -> int:
        found = sizes.get(id(t))
        if found is None:
            found = sizes[id(t)] = t.nbytes
        return found
    total = 0
    nodes = graph.nodes
    for node in nodes:
        if node.is_variable:
            b = nbytes(node.outputs[0])
            total += b * (2 + options.optimizer_state) if node.kind == "param" else b
    for (i, j), readers in kept.items():
        if readers:
            total += nbytes(nodes[i].outputs[j])
    return total / k


class collector_paused:
    """Python's cyclic garbage collector paused, and restored as it was: a context manager,
    or a decorator (``@collector_paused()``) whose wrapper is this package's code, so that
    :func:`tofu_mx.errors.caller_stacklevel` still finds the user's line. The search, and
    the rewrite after it (:func:`tofu_mx.partition`), allocate millions of small tuples,
    dicts and arrays that live until they return; their count keeps triggering the
    collector, whose passes over the whole heap (the graph included) find nothing to free:
    they make no reference cycles, and reference counting frees the rest. (Measured: the
    collector took more than half of ``partition()`` of WResNet-152-W10 over 8 devices,
    42 s against 19 s paused.)"""

    def __enter__(self):
        self.enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.enabled:
            gc.enable()

    def __call__(self, function):
        @functools.wraps(function)
        def paused(*args, **kwargs):
            with collector_paused():
                return function(*args, **kwargs)
        return paused


@dataclass(frozen=True)
class _Shared:
    """What the candidate plans of one graph share, whatever the factor order: computed
    once per :func:`plan_graph`."""

    structure: GraphStructure
    kept: Mapping             # kept_tensors
    opaque: tuple[OpaqueOp, ...]
    fingerprint: str
    no_loss_head: bool        # has_no_loss_head

    @staticmethod
    def of(graph: Graph) -> "_Shared":
        structure = GraphStructure.of(graph)
        return _Shared(structure, kept_tensors(graph, structure.needs_grad,
                                               structure.backward),
                       _opaque_ops(graph), graph_fingerprint(graph),
                       has_no_loss_head(graph, structure.needs_grad))


def _assemble(graph: Graph, num_devices: int, order: Sequence[int],
              results: list[_LevelResult], options: SearchOptions, shared: _Shared,
              weights: frozenset = frozenset(), used: float = 0.0) -> Plan:
    """The plan of ``results``; ``weights``: the parameters kept before the search
    (:func:`_small_weights`), holding at most ``used`` bytes of the keep budget."""
    tensors, op_plans = _tensor_and_op_plans(graph, results, shared.structure)
    levels = tuple(Level(p, math.prod(order[:k]), _bytes_moved(r), len(r.problem.slots),
                         r.solution.max_frontier, r.solution.max_states,
                         *((len(r.bounded.fixed), r.bounded.gap) if r.bounded else ()))
                   for k, (p, r) in enumerate(zip(order, results)))
    coarsening = {}
    if results:
        cut = results[0].cut
        coarsening = {"operators": len(cut.ops), "groups": sum(len(g.copies) for g in cut.groups),
                      "tied": len(cut.groups)}
    memory = _memory(graph, tensors, shared.kept, options, num_devices, shared.structure)
    kept, saved = _keep_small(graph, results, options.keep_share * memory[0].total - used
                              if options.refetch else 0)
    kept = tuple(sorted(set(kept) | _readers_of(graph, shared.structure, weights)))
    levels = tuple(dataclasses.replace(lv, bytes_per_group=lv.bytes_per_group - s)
                   for lv, s in zip(levels, saved))
    return Plan(num_devices, tuple(order), levels, tensors, op_plans, memory,
                shared.opaque, coarsening, shared.fingerprint, options.refetch, kept,
                shared.no_loss_head)


def _readers_of(graph: Graph, structure: GraphStructure, tensors: frozenset
                ) -> set[tuple[str, int]]:
    """The inputs (operator name, input index) of re-fetching operators that read one of
    ``tensors`` ((node, output) pairs)."""
    if not tensors:
        return set()
    ports = structure.ports(graph)
    wanted = np.zeros(int(ports.tensor_start[-1]), dtype=bool)
    wanted[[int(ports.tensor_start[i]) + j for i, j in tensors]] = True
    at = np.flatnonzero(wanted[ports.tensor] & structure.refetches(graph)[ports.member])
    nodes = graph.nodes
    return {(nodes[i].name, j) for i, j in zip(ports.member[at].tolist(),
                                                ports.input[at].tolist())}


def _bytes_moved(result: _LevelResult) -> float:
    """The bytes a level's solution moves: the search's own exact sum where it minimised
    the bytes alone, else the bytes problem's sum."""
    if result.solution.exact and result.problem.problem is result.problem.bytes_problem:
        return result.solution.cost
    return result.problem.bytes_problem.cost(result.solution.assignment)


def _keep_small(graph: Graph, results: list[_LevelResult],
                budget: float) -> tuple[tuple[tuple[str, int], ...], list[float]]:
    """Which converted inputs (operator name, input index) of re-running operators are kept
    after all, and the bytes per group that saves at each level: those whose second fetch
    saves the most bytes per byte kept, while the copies kept (each the largest region a
    device reads, with the pieces it joins, counted where the last cut converts it or an
    earlier one moved it) add at most ``budget`` bytes. The readers of one fetched copy
    decide together (one fetch serves them)."""
    if budget <= 0 or not results:
        return (), [0.0] * len(results)
    ports = results[0].cut.structure.ports(graph)
    n = len(ports.member)
    # the readers of one fetched copy (at any cut) form a class, its root the reader the
    # first union put first (the classes' order breaks ties)
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while x in parent:
            x = parent[x]
        return x
    seen = np.zeros(n, dtype=bool)          # readers of some re-fetched edge
    moved = np.zeros(n, dtype=bool)         # readers fetched for over some cut
    firsts, fetched = [], []
    for r in results:
        edges = r.problem.refetched
        starts, readers = edges.reader_start, edges.reader_port
        seen[readers] = True
        for e in np.flatnonzero(np.diff(starts) > 1).tolist():
            group = readers[starts[e]:starts[e + 1]].tolist()
            first = root(group[0])
            for reader in group[1:]:
                top = root(reader)
                if top != first:
                    parent[top] = first
        b = r.cut.second_fetches(edges, r.solution.assignment)
        moved[readers[np.repeat(b != 0, np.diff(starts))]] = True
        firsts.append(readers[starts[:-1]])
        fetched.append(b)
    top = np.arange(n)
    if parent:
        top[np.fromiter(parent.keys(), np.int64, len(parent))] = \
            np.fromiter(parent.values(), np.int64, len(parent))
        while True:     # pointer jumping to the roots
            up = top[top]
            if np.array_equal(up, top):
                break
            top = up
    by_class = np.zeros((len(results), n))      # bytes a class's second fetches move, per cut
    has_saved = np.zeros(n, dtype=bool)
    for level, (first, b) in enumerate(zip(firsts, fetched)):
        np.add.at(by_class[level], top[first], b)
        has_saved[top[first[b != 0]]] = True
    last, size = results[-1], np.zeros(n)
    edges = last.problem.refetched
    if len(edges):
        largest, converted = last.cut.kept_copies(edges, last.solution.assignment)
        moved_readers = np.logical_or.reduceat(moved[edges.reader_port],
                                               edges.reader_start[:-1])
        # held even where no gradient reads it: a re-running share reads all its inputs
        counted = converted | moved_readers
        np.add.at(size, top[edges.reader_port[edges.reader_start[:-1]][counted]],
                  largest[counted])
    classes = np.flatnonzero(has_saved)
    saved = by_class[:, classes].sum(axis=0)
    ratio = size[classes] / saved
    members = np.flatnonzero(seen)
    members = members[np.argsort(top[members], kind="stable")]
    bounds = np.searchsorted(top[members], [classes, classes + 1])
    kept, used, total = [], 0.0, [0.0] * len(results)
    rows, sizes, spans = by_class.T.tolist(), size.tolist(), bounds.T.tolist()
    for k in np.lexsort((classes, ratio)).tolist():
        c = int(classes[k])
        if used + sizes[c] <= budget:
            used += sizes[c]
            kept.append(members[spans[k][0]:spans[k][1]])
            total = [t + s for t, s in zip(total, rows[c])]
    kept_ports = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    names = [graph.nodes[m].name for m in ports.member[kept_ports].tolist()]
    return tuple(sorted(zip(names, ports.input[kept_ports].tolist()))), total


def _opaque_ops(graph: Graph) -> tuple[OpaqueOp, ...]:
    found = []
    # what the registry holds, by operator and attribute object (shared by nodes, alive)
    entries: dict[tuple[str, int], Any] = {}
    for node in graph.operators():
        key = (node.op, id(node.attrs))
        if key not in entries:
            entries[key] = registry_entry(node.op, node.attrs)
        entry = entries[key]
        if entry is None:
            found.append(OpaqueOp(node.name, node.op, "no description"))
        elif not isinstance(entry, Description):
            found.append(OpaqueOp(node.name, node.op, entry.reason))
    return tuple(found)


def _opaque_entry(x) -> OpaqueOp:
    """An opaque operator as JSON holds it: ``[name, op, reason]`` (or, as plans written
    before, the text ``"name (op): reason"``)."""
    if isinstance(x, str):
        head, sep, reason = x.partition("): ")
        name, sep2, op = head.partition(" (")
        if not (sep and sep2):
            raise ValueError(f"{x!r} is not 'name (op): reason'")
        return OpaqueOp(name, op, reason)
    name, op, reason = x
    return OpaqueOp(name, op, reason)
