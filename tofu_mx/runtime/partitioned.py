"""``partition()``: import -> annotate -> coarsen -> search -> route -> emit -> check, and the
:class:`PartitionedSymbol` it returns (binding, parameters, checkpoints, memory)."""
from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import os
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import mxnet as mx
import numpy as np

from nnvm_passes.exporter import symbol_from_json
from nnvm_passes.importer import check_symbol, import_symbol
from nnvm_passes.ir import Graph
from nnvm_passes.placement import placed_group
from nnvm_passes.emit import RewriteResult, emit
from nnvm_passes.program import Program, VarShard, route
from tofu_mx import arguments
from tofu_mx.arguments import show
from tofu_mx.devices import (check_available, check_contexts, group_name,
                             warn_if_mkldnn_across_cpus)
from tofu_mx.errors import (CheckpointError, DataParallelFasterWarning,
                            InvalidArgumentError, NoFeasiblePlanError,
                            TofuError, UnsupportedOperatorError, caller_stacklevel,
                            give_warnings, mxnet_message, warnings_held)
from tofu_mx.files import atomic_write, check_writable
from tofu_mx.runtime.assign import Assignment, assign
from tofu_mx.runtime.unlower import unlower
from tofu_mx.runtime.frontier import FRONTIER_WEIGHTS, Frontier, fit_budget, pareto, trade_off
from tofu_mx.search.plan import (Plan, SearchOptions, budgets_of, check_device_count,
                                 check_plan, collector_paused, lower_graph, plan_graph)
from tofu_mx.sim.memory import held_at_forward_end, peak_memory
from tofu_mx.summary import format_bytes
from tofu_mx.tdl.annotate import import_graph
from tofu_mx.tdl.registry import lookup, registry_key


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes one device holds for a training step of the partitioned graph."""

    device: str
    weights: int
    gradients: int
    aux: int
    inputs: int
    activations: int     # operator outputs that carry a gradient (kept for the backward pass)
    optimizer: int = 0   # optimizer state (momentum, ...) when a trainer holds it

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.aux + self.inputs + self.activations
                + self.optimizer)


@dataclass(frozen=True)
class Candidate:
    """One plan ``partition(machine=...)`` weighed, simulated on the machine."""

    label: str                 # what sets it apart, in words
    step: float                # predicted seconds per training step
    peak: int                  # the busiest device's predicted peak memory, bytes
    fits: bool                 # every device's peak within the machine's memory
    refetch: bool = True       # converted inputs fetched again for the backward pass
    group_size: int = 0        # values crossing to a group of this many devices cross once
    #                            (nnvm_passes.program.relayed_reads); 0: to each reader
    groups: int = 0            # the hybrid's device groups, data parallel (0: not a hybrid)
    interleaved: bool = False  # split blocks (an LSTM's gates) stored interleaved
    conversion_bytes: float = 0.0  # SearchOptions.conversion_bytes it was searched with


@dataclass(frozen=True)
class MachineChoice:
    """Which plan ``partition(machine=...)`` chose, and the ones it weighed (fastest first)."""

    machine: str
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    #: data parallelism on the same devices, simulated alike: not a partition (MXNet's
    #: kvstore runs it), so never chosen, but said where it would be faster; None where
    #: the graph has no batch to split over the devices
    data_parallel: Candidate | None = None
    #: data parallelism across the machine's device groups that ctx spans, Tofu inside each
    #: (:func:`tofu_mx.sim.hybrid_step`): not one partition (``tofu_mx.gluon.partition``
    #: with ``replicas=`` runs it), so never chosen here, but said where it would
    #: be faster; None where ctx is not two or more whole groups or has no batch to split
    hybrid: Candidate | None = None

    @property
    def data_parallel_faster(self) -> bool:
        """Data parallelism fits the machine's memory and is predicted faster than the
        chosen plan."""
        return self._faster(self.data_parallel)

    @property
    def hybrid_faster(self) -> bool:
        """The hybrid fits the machine's memory and is predicted faster than the chosen
        plan."""
        return self._faster(self.hybrid)

    @property
    def fastest_elsewhere(self) -> Candidate | None:
        """The faster of data parallelism and the hybrid where one fits and is predicted
        faster than the chosen plan (what ``partition()`` warns of); else None."""
        faster = [c for c in (self.data_parallel, self.hybrid) if self._faster(c)]
        return min(faster, key=lambda c: c.step, default=None)

    def _faster(self, other: Candidate | None) -> bool:
        return other is not None and other.fits and (other.step < self.chosen.step or
                                                     not self.chosen.fits)

    def lines(self) -> list[str]:
        fits = [c for c in self.candidates if c.fits]
        why = "the fastest that fits its memory" if fits else \
            "none fits its memory: the one needing the least"
        out = [f"chosen for {self.machine} by simulated step time ({why}): "
               f"{self.chosen.label}, {self.chosen.step * 1e3:,.1f} ms per step predicted, "
               f"{format_bytes(self.chosen.peak)} peak on the busiest device"]
        out += [f"  also weighed: {c.label}, {c.step * 1e3:,.1f} ms, "
                f"{format_bytes(c.peak)}{'' if c.fits else ' (does not fit)'}"
                for c in self.candidates if c is not self.chosen]
        for other in (self.data_parallel, self.hybrid):
            if other is not None and other is not self.chosen:
                out.append(f"  for comparison, not a partition: {other.label}, "
                           f"{other.step * 1e3:,.1f} ms, {format_bytes(other.peak)}"
                           f"{'' if other.fits else ' (does not fit)'}")
        if self.fastest_elsewhere is not None:
            out.append(f"  {self.advice()}")
        return out

    def advice(self) -> str:
        """What to run instead, where :attr:`fastest_elsewhere` is not None."""
        if self.fastest_elsewhere is self.data_parallel:
            return DATA_PARALLEL_ADVICE
        return HYBRID_ADVICE.format(groups=self.hybrid.groups)


#: how :attr:`MachineChoice.data_parallel` is described
DATA_PARALLEL = ("data parallelism (every device the whole model on its share of the batch, "
                 "the gradients summed by MXNet's kvstore)")
#: what :class:`MachineChoice` says where data parallelism is predicted faster
DATA_PARALLEL_ADVICE = ("data parallelism is predicted faster on this machine, and fits: "
                        "train the unpartitioned model on these devices with a kvstore "
                        "(gluon.Trainer over their contexts, or mx.mod.Module(context=...))")

#: how :attr:`MachineChoice.hybrid` is described (the number of groups, the devices in each)
HYBRID = ("data parallelism across {groups} groups of {size} devices, Tofu inside each "
          "(tofu_mx.gluon.partition(..., replicas={groups}))")
#: what :class:`MachineChoice` says where the hybrid is predicted faster
HYBRID_ADVICE = ("data parallelism across the {groups} device groups, Tofu inside each, is "
                 "predicted faster on this machine, and fits: partition the Gluon block with "
                 "tofu_mx.gluon.partition(..., ctx, machine=..., replicas={groups}) and train "
                 "it with tofu_mx.gluon.Trainer (each group normalises BatchNorm over its own "
                 "share of the batch, as Gluon's data parallelism does)")


class PartitionedSymbol:
    """A symbol partitioned over ``contexts``: bind it, move parameters in and out of it.

    ``symbol`` is an ordinary MXNet Symbol whose nodes carry ctx groups ``dev<i>``;
    ``group2ctx`` maps them to the devices. Variables are shards named ``<name>@dev<i>``
    (see :attr:`shards`); :meth:`split_params` / :meth:`merge_params` convert between the
    original, whole arrays and the shards, and :meth:`save_params` / :meth:`load_params`
    write and read ordinary ``.params`` files with the original names.
    """

    def __init__(self, reference: mx.sym.Symbol, graph: Graph, plan: Plan,
                 assignment: Assignment, program: Program, result: RewriteResult,
                 contexts: list[mx.Context]):
        self.reference = reference
        self.graph, self.plan, self.assignment = graph, plan, assignment
        self.program = program
        self.contexts = list(contexts)
        self.symbol = symbol_from_json(result.json)
        self.group2ctx = {group_name(i): c for i, c in enumerate(self.contexts)}
        self.shards: tuple[VarShard, ...] = tuple(result.shards)
        self.node_counts = result.counts
        self.executor: mx.executor.Executor | None = None
        self._pending: tuple[dict, dict] | None = None
        self._planned: dict[float, tuple[int, ...]] = {}    # planned_memory's, by state
        #: with ``partition(machine=...)``: which plan it chose and why
        self.machine_choice: MachineChoice | None = None

    # --- shapes and binding -----------------------------------------------------------------
    @property
    def shard_shapes(self) -> dict[str, tuple[int, ...]]:
        return {s.name: s.shape for s in self.shards}

    @functools.cached_property
    def shard_graph(self) -> Graph:
        """The partitioned symbol imported with the shards' shapes, dtypes and kinds (the
        import alone would call every shaped variable data)."""
        graph = import_symbol(self.symbol, dtypes={s.name: s.dtype for s in self.shards},
                              data_names=[], **self.shard_shapes)
        kinds = {s.name: s.kind for s in self.shards}
        return graph.replace(nodes=tuple(n.replace(kind=kinds[n.name]) if n.is_variable else n
                                         for n in graph.nodes))

    def _arg_shards(self) -> list[VarShard]:
        return [s for s in self.shards if s.kind != "aux"]

    def simple_bind(self, grad_req: Any = "write", **kwargs) -> mx.executor.Executor:
        """Bind across the devices (``mx.sym.Symbol.simple_bind`` with the shards' shapes and
        dtypes and ``group2ctx`` filled in). ``grad_req`` (a dict) names original variables;
        each shard gets its variable's request, ``null`` where its variable is not named (a
        variable named like another's shard, ``w@dev1``, is a variable of its own).
        Parameters loaded before binding are copied in."""
        if isinstance(grad_req, Mapping):     # by the variable's own name, never a shard's
            grad_req = {s.name: grad_req.get(s.source, "null") for s in self._arg_shards()}
        shapes = {s.name: s.shape for s in self._arg_shards()}
        shapes.update(kwargs.pop("shapes", {}))
        types = {s.name: s.dtype for s in self._arg_shards()}
        warn_if_mkldnn_across_cpus(self.contexts)
        check_available(self.contexts)
        arguments.check_tensor_sizes(self.shard_graph, "the partitioned graph")
        exe = self.symbol.simple_bind(ctx=self.contexts[0], grad_req=grad_req,
                                      type_dict=types, group2ctx=self.group2ctx,
                                      **shapes, **kwargs)
        self.executor = exe
        if self._pending is not None:
            self._write(exe, *self._pending)
            self._pending = None
        return exe

    # --- outputs ----------------------------------------------------------------------------
    @property
    def output_pieces(self) -> tuple[tuple[int, tuple[slice, ...]], ...] | None:
        """Made with ``join_outputs=False``: for each of the bound executor's outputs, which
        of the original's outputs it is a piece of and where it lies in it (slices); None
        where the outputs are the original's, whole."""
        if not self.program.pieces:
            return None
        return tuple((k, tuple(slice(lo, hi + 1) for lo, hi in box))
                     for k, box in self.program.pieces)

    def join_outputs(self, outputs: Sequence[Any], ctx: mx.Context | None = None
                     ) -> list[Any]:
        """The original's outputs, whole, on ``ctx`` (the first device by default), from
        the executor's ``outputs`` (pieces with ``join_outputs=False``; else copied); NumPy
        arrays (the outputs read with ``asnumpy()``) join as NumPy arrays."""
        ctx = self.contexts[0] if ctx is None else ctx
        infos = self.graph.output_infos
        if len(outputs) != len(self.program.pieces or infos):
            raise InvalidArgumentError(
                f"join_outputs takes the {len(self.program.pieces or infos)} outputs of the "
                f"executor (exe.outputs), got {len(outputs)}")
        nd = all(isinstance(o, mx.nd.NDArray) for o in outputs)
        if self.output_pieces is None:
            return [o.copyto(ctx) if nd else np.array(o) for o in outputs]
        wholes = [mx.nd.empty(t.shape, ctx=ctx, dtype=t.dtype) if nd else
                  np.empty(t.shape, t.dtype) for t in infos]
        for (k, where), piece in zip(self.output_pieces, outputs):
            wholes[k][where] = piece.as_in_context(ctx) if nd else piece
        return wholes

    def head_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """The executor's head gradients (``exe.backward(out_grads=...)``) from gradients of
        the original's outputs, whole (NDArrays or NumPy arrays): each piece's part, on the
        piece's device for NDArrays; ``grads`` as they are where the outputs are whole."""
        infos = self.graph.output_infos
        if len(grads) != len(infos):
            raise InvalidArgumentError(f"head_gradients takes one gradient per output of the "
                                       f"original ({len(infos)}), got {len(grads)}")
        if self.output_pieces is None:
            return list(grads)
        devices = [self.contexts[self.program.steps[r.step].device] for r in self.program.heads]
        return [grads[k][where].as_in_context(d) if isinstance(grads[k], mx.nd.NDArray)
                else np.ascontiguousarray(grads[k][where])
                for (k, where), d in zip(self.output_pieces, devices)]

    def with_output_pieces(self) -> "PartitionedSymbol":
        """The same partition (plan, routing, devices) returning each output as the pieces
        its plan stores it in, on the devices storing them, instead of joining it whole on
        the first device (:attr:`output_pieces`, :meth:`join_outputs`,
        :meth:`head_gradients`). Unbound, with no parameters; ``self`` is not changed."""
        return _routed(self, self.program.group_size, join_outputs=False)

    def placed_on(self, ctx: Sequence[mx.Context]) -> "PartitionedSymbol":
        """The same partition on other devices, as many (``ctx[i]`` runs what
        ``contexts[i]`` ran), unbound, with no parameters: the replicas of a hybrid
        (:func:`tofu_mx.gluon.partition` with ``replicas=``). ``self`` is not changed."""
        contexts = check_contexts(ctx)
        if len(contexts) != len(self.contexts):
            raise InvalidArgumentError(f"placed_on needs {len(self.contexts)} devices, as many "
                                       f"as the partition's, got {len(contexts)}: "
                                       f"{show(contexts)}")
        other = copy.copy(self)
        other.contexts = contexts
        other.group2ctx = {group_name(i): c for i, c in enumerate(contexts)}
        other.executor, other._pending = None, None
        return other

    def check(self, batch: int | None = None, seed: int = 0):
        """Check this partition on a small copy of the model: the same graph at a small
        ``batch`` (default: twice the devices), the same strategies, on CPU devices, against
        one device (:mod:`tofu_mx.runtime.selfcheck`, which says what it costs). Returns the
        :class:`tofu_mx.VerificationReport`; :class:`tofu_mx.VerificationError` if it
        differs."""
        from tofu_mx.runtime.selfcheck import check_partition
        return check_partition(self, batch, seed)

    # --- arrays: whole <-> shards -----------------------------------------------------------
    def split_arrays(self, arrays: Mapping[str, Any], kinds: Sequence[str] | None = None
                     ) -> dict[str, np.ndarray]:
        """Whole arrays (by original name) -> shard arrays (NumPy, by shard name)."""
        out, wholes = {}, {}
        for s in self.shards:
            if (kinds is None or s.kind in kinds) and s.source in arrays:
                if s.source not in wholes:    # one host copy per array, however many shards
                    wholes[s.source] = _numpy(arrays[s.source])
                out[s.name] = np.ascontiguousarray(s.take(wholes[s.source]))
        return out

    def merge_arrays(self, shards: Mapping[str, Any], kinds: Sequence[str] | None = None
                     ) -> dict[str, np.ndarray]:
        """Shard arrays (by shard name) -> whole arrays (NumPy, by original name). Every
        shard of an array given must be there, with its shape; else :class:`CheckpointError`."""
        shards = arguments.mapping(shards, "shards", "{'fc_weight@dev0': array, ...}")
        out: dict[str, np.ndarray] = {}
        wanted = [s for s in self.shards if kinds is None or s.kind in kinds]
        known = {s.name for s in self.shards}      # shards of other kinds are left out
        unknown = [n for n in shards if n not in known]
        if unknown:
            wholes = [n for n in unknown if any(s.source == n for s in self.shards)]
            hint = (f"; {wholes[0]!r} is a whole array: merge takes shards "
                    f"({wholes[0]}@dev0, ...), split_params takes whole arrays") if wholes else ""
            raise CheckpointError(f"{', '.join(map(repr, unknown[:5]))} are not shards of this "
                                  f"partition{hint}. Give arrays named as in "
                                  f"PartitionedSymbol.shards")
        sources = {s.source for s in wanted if s.name in shards}
        missing = [s.name for s in wanted if s.source in sources and s.name not in shards]
        if missing:
            raise CheckpointError(f"shards {missing[:5]} are missing: each array needs all its "
                                  f"shards to be merged (give every shard in "
                                  f"PartitionedSymbol.shards of the arrays you merge)")
        for s in wanted:
            if s.name not in shards:
                continue
            value = arguments.numeric_array(shards[s.name], f"shard {s.name!r}")
            if value.shape != s.shape:
                raise CheckpointError(f"shard {s.name!r} has shape {value.shape}, the partition "
                                      f"stores {s.shape}; give the shard arrays this partition "
                                      f"made")
            if s.source not in out:
                shape = self.graph.node(s.source).outputs[0].shape
                out[s.source] = np.zeros(shape, dtype=s.dtype)
            s.put(out[s.source], value)
        return out

    def split_params(self, arg_params: Mapping[str, Any], aux_params: Mapping[str, Any] | None = None
                     ) -> tuple[dict[str, mx.nd.NDArray], dict[str, mx.nd.NDArray]]:
        """Whole parameters (original names) -> shards, each on its device."""
        arg_params, aux_params = self._checked_params(arg_params, aux_params, "split_params")
        args = self.split_arrays(arg_params, ("param",))
        aux = self.split_arrays(aux_params, ("aux",))
        by_name = {s.name: s for s in self.shards}
        return ({n: mx.nd.array(a, ctx=self.contexts[by_name[n].device], dtype=a.dtype)
                 for n, a in args.items()},
                {n: mx.nd.array(a, ctx=self.contexts[by_name[n].device], dtype=a.dtype)
                 for n, a in aux.items()})

    def merge_params(self, arg_shards: Mapping[str, Any], aux_shards: Mapping[str, Any] | None = None
                     ) -> tuple[dict[str, mx.nd.NDArray], dict[str, mx.nd.NDArray]]:
        """Shards -> whole parameters with the original names (on ``mx.cpu()``). Every shard
        of every parameter and auxiliary state must be given (:attr:`shards`, kinds ``param``
        and ``aux``); else :class:`CheckpointError`."""
        try:
            args = self.merge_arrays(arg_shards, ("param",))
            aux = self.merge_arrays(aux_shards or {}, ("aux",))
        except CheckpointError:
            raise
        except InvalidArgumentError as e:
            raise CheckpointError(f"merge_params: {e}") from e
        names_args, names_aux = self.param_names()
        missing = [n for n in names_args if n not in args] + [n for n in names_aux if n not in aux]
        if missing:
            raise CheckpointError(f"merge_params: no shards of {missing[:5]} were given; give "
                                  f"every shard of the parameters and aux states (the bound "
                                  f"executor's arg_dict and aux_dict, or PartitionedSymbol.shards)")
        return ({n: mx.nd.array(a, dtype=a.dtype) for n, a in args.items()},
                {n: mx.nd.array(a, dtype=a.dtype) for n, a in aux.items()})

    def param_names(self) -> tuple[list[str], list[str]]:
        """The original parameter and auxiliary-state names a checkpoint holds."""
        return ([n.name for n in self.graph.variables("param")],
                [n.name for n in self.graph.variables("aux")])

    def _checked_params(self, arg_params: Any, aux_params: Any, what: str
                        ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The parameters as NumPy copies in the symbol's dtypes, after checking that they are
        exactly the symbol's (names, shapes, numbers); else :class:`CheckpointError` and
        nothing is used."""
        names_args, names_aux = self.param_names()
        problems, checked = [], []
        for kind, given, names in (("arg", arg_params, names_args), ("aux", aux_params, names_aux)):
            try:
                given = arguments.mapping(given, f"{kind}_params", "{'fc_weight': array, ...}")
            except InvalidArgumentError as e:
                raise CheckpointError(f"{what}: {e}") from e
            missing = [n for n in names if n not in given]
            extra = [n for n in given if n not in names]
            if missing:
                problems.append(f"missing {kind} {missing[:5]}{' ...' if len(missing) > 5 else ''}")
            if extra:
                hint = " (shard names: give whole arrays)" if any("@dev" in n for n in extra) \
                    else ""
                problems.append(f"extra {kind} {extra[:5]}{' ...' if len(extra) > 5 else ''}"
                                f"{hint}")
            arrays = {}
            for n in names:
                if n not in given:
                    continue
                info = self.graph.node(n).outputs[0]
                try:
                    arrays[n] = arguments.numeric_array(given[n], f"{kind} {n!r}", info.dtype)
                except InvalidArgumentError as e:
                    problems.append(str(e).split(";")[0])
                    continue
                if arrays[n].shape != info.shape:
                    problems.append(f"{kind} {n} has shape {arrays[n].shape}, the symbol needs "
                                    f"{info.shape}")
            checked.append(arrays)
        if problems:
            raise CheckpointError(f"{what}: the parameters do not match the symbol: "
                                  f"{'; '.join(problems)}. Give exactly the symbol's "
                                  f"parameters and auxiliary states, whole, by original name.")
        return checked[0], checked[1]

    def _write(self, exe, args: Mapping[str, Any], aux: Mapping[str, Any]) -> None:
        for name, value in self.split_arrays(args, ("param",)).items():
            exe.arg_dict[name][:] = value
        for name, value in self.split_arrays(aux, ("aux",)).items():
            exe.aux_dict[name][:] = value

    def set_params(self, arg_params: Mapping[str, Any], aux_params: Mapping[str, Any] | None = None
                   ) -> None:
        """Whole parameters into the bound executor's shards (or kept until it is bound).
        All or nothing: every array is checked and converted before any shard is written."""
        args, aux = self._checked_params(arg_params, aux_params or {}, "set_params")
        if self.executor is None:
            self._pending = (args, aux)
        else:
            self._write(self.executor, args, aux)

    def get_params(self) -> tuple[dict[str, mx.nd.NDArray], dict[str, mx.nd.NDArray]]:
        """The bound executor's parameters, whole, with their original names."""
        if self.executor is None:
            if self._pending is None:
                raise TofuError("no parameters yet: call simple_bind() or load_params() first")
            return ({k: mx.nd.array(v, dtype=v.dtype) for k, v in self._pending[0].items()},
                    {k: mx.nd.array(v, dtype=v.dtype) for k, v in self._pending[1].items()})
        exe = self.executor
        return self.merge_params({s.name: exe.arg_dict[s.name] for s in self.shards
                                  if s.kind == "param"}, exe.aux_dict)

    # --- checkpoints ------------------------------------------------------------------------
    def save_params(self, path: str) -> None:
        """Write the parameters as an ordinary MXNet ``.params`` file (``arg:<name>`` and
        ``aux:<name>`` keys, whole arrays): the unpartitioned symbol loads it as it is. The
        file is written atomically."""
        path = check_writable(path, "the parameter file")
        args, aux = self.get_params()
        blob = {f"arg:{k}": v for k, v in args.items()}
        blob.update({f"aux:{k}": v for k, v in aux.items()})
        atomic_write(path, lambda tmp: mx.nd.save(tmp, blob))

    def load_params(self, path: str) -> None:
        """Read an ordinary ``.params`` file (saved at any device count, or by Module/Gluon
        export) into the shards. Nothing changes if the file does not match the symbol."""
        path = arguments.input_file(path, "the parameter file", CheckpointError)
        try:
            blob = mx.nd.load(path)
        except mx.base.MXNetError as e:
            raise CheckpointError(f"cannot read {path!r} as an MXNet .params file: "
                                  f"{mxnet_message(e)}; give a file written by "
                                  f"save_params, Module.save_params or Gluon's export") from e
        if not isinstance(blob, dict):
            raise CheckpointError(f"{path!r} holds an unnamed list of arrays; give a .params "
                                  f"file that names each array arg:<name> or aux:<name> (as "
                                  f"save_params writes)")
        args, aux, keys = {}, {}, {}
        for key, value in blob.items():
            kind, _, name = key.partition(":")
            if kind not in ("arg", "aux"):
                kind, name = "arg", key  # a plain name: reported as extra unless it is a param
            if name in keys:
                raise CheckpointError(f"{path!r} holds {name!r} twice, as {keys[name]!r} and "
                                      f"{key!r}; which is meant cannot be told: keep one")
            keys[name] = key
            (aux if kind == "aux" else args)[name] = value
        self.set_params(args, aux)

    # --- reports ----------------------------------------------------------------------------
    def memory_per_device(self) -> list[DeviceMemory]:
        """Bytes each device holds at the end of the forward pass: parameter shards, their
        gradients, aux states, input shards, and the activations the backward pass keeps
        (outputs some gradient node reads, as MXNet builds the gradients, on each device
        whose gradient nodes read them): the search's accounting, which budgets are met
        in. Temporary and conversion buffers are not (MXNet holds 1.1-1.6x this on
        bench/memory_mxnet.py's models): :meth:`planned_memory` counts them."""
        rows = held_at_forward_end(self.shard_graph, self.node_devices().__getitem__,
                                   len(self.contexts))
        return [DeviceMemory(str(c), **r) for c, r in zip(self.contexts, rows)]

    def planned_memory(self, optimizer_state: float = 0.0) -> tuple[int, ...]:
        """Bytes each device holds over a training step as MXNet's executor plans them
        (:func:`tofu_mx.sim.memory.peak_memory`: its static memory plan, whose blocks are
        never given back, on top of the variables): what :meth:`memory_per_device` counts,
        and conversion and copy buffers, outputs freed in the forward pass, gradient pieces
        and their sums. Within 4% of MXNet's storage profiler on the models of
        bench/memory_mxnet.py (bench/results/memory.md). ``optimizer_state``: optimizer
        bytes per weight byte a trainer adds (SGD with momentum 1, Adam 2)."""
        optimizer_state = arguments.real(optimizer_state, "optimizer_state", minimum=0,
                                         example="optimizer_state=1 for SGD with momentum")
        # computed once per optimizer_state (seconds on a large partition; partition() and
        # report() both ask): the partitioned graph does not change
        if optimizer_state not in self._planned:
            self._planned[optimizer_state] = peak_memory(
                self.shard_graph, self.node_devices().__getitem__, len(self.contexts),
                optimizer_state)
        return self._planned[optimizer_state]

    def node_devices(self) -> tuple[int, ...]:
        """For each node of :attr:`shard_graph`, the index of the device MXNet runs it on (a
        node placed in no group: device 0, as MXNet's default context)."""
        return self._node_devices

    @functools.cached_property
    def _node_devices(self) -> tuple[int, ...]:
        graph = self.shard_graph
        index = {g: i for i, g in enumerate(self.group2ctx)}
        return tuple(index[placed_group(graph, i, group_name(0))]
                     for i in range(len(graph.nodes)))

    def operators_per_device(self) -> list[int]:
        """MXNet operators each device runs in a forward pass of the partitioned graph: the
        nodes of its ctx group, and the cross-device copies MXNet inserts into it (one per
        value read there from another device)."""
        counts = [0] * len(self.contexts)
        for node, device in zip(self.shard_graph.nodes, self.node_devices()):
            if not node.is_variable:
                counts[device] += 1
        for crossing in self.program.crossings():
            counts[crossing.device] += 1
        return counts

    @property
    def fallbacks(self) -> dict[str, str]:
        """Operators that run whole instead of split, and why: those with no description (on
        one device) and those whose planned shares cannot run (on every device)."""
        return {self.graph.nodes[i].name: why for i, why in self.assignment.fallbacks.items()}

    def report(self, max_rows: int = 20) -> str:
        lines = [self.plan.report(max_rows)]
        counts = ", ".join(f"{n} {role}" for role, n in self.node_counts.items())
        lines.append(f"rewrite: {counts}; {len(self.shards)} variables")
        original = len(self.graph.operators())
        lines.append(f"operators per device (with the copies MXNet inserts): "
                     f"{', '.join(f'{n:,}' for n in self.operators_per_device())}; the graph "
                     f"partitioned has {original:,}")
        if self.output_pieces is not None:
            lines.append(f"outputs returned as the pieces the plan stores "
                         f"(join_outputs=False): {len(self.output_pieces)} piece(s) of "
                         f"{len(self.graph.output_infos)} output(s); join_outputs() joins them")
        lines.append(f"memory per device as MXNet plans the step (planned_memory(), "
                     f"without optimizer state): "
                     f"{', '.join(format_bytes(b) for b in self.planned_memory())}")
        layouts = self.graph.layouts
        if layouts:
            shown = ", ".join(list(layouts)[:3])
            more = f" and {len(layouts) - 3} more" if len(layouts) > 3 else ""
            lines.append(f"weights stored with their blocks interleaved (an LSTM's gates: each "
                         f"device a slice of every gate; split_params/merge_params and the "
                         f"checkpoints use your layout): {len(layouts)}: {shown}{more}")
        if self.plan.unlowered:
            shown = ", ".join(self.plan.unlowered[:3])
            more = f" and {len(self.plan.unlowered) - 3} more" if len(self.plan.unlowered) > 3 \
                else ""
            lines.append(f"run as themselves, not lowered (split as they split): "
                         f"{len(self.plan.unlowered)} operator(s): {shown}{more}")
        for name, why in list(self.fallbacks.items())[:10]:
            lines.append(f"  runs whole (fallback): {name}: {why}")
        if self.machine_choice is not None:
            lines.extend(self.machine_choice.lines())
        lines.append("memory per device:")
        for m in self.memory_per_device():
            lines.append(f"  {m.device:<8} weights {format_bytes(m.weights)}, gradients "
                         f"{format_bytes(m.gradients)}, aux {format_bytes(m.aux)}, inputs "
                         f"{format_bytes(m.inputs)}, activations {format_bytes(m.activations)}:"
                         f" {format_bytes(m.total)}")
        return "\n".join(lines)

    def draw(self, path: str | os.PathLike, view: str | None = None,
             only: str | None = None) -> Any:
        """Write a picture of the plan to ``path`` (.png, .svg, .pdf; .dot for the graph
        view): by default a row per layer, how each device holds its output and weight and
        what it moves, beside memory per device and the bytes of each cut; ``only``: the
        layers whose names contain that text; ``view="graph"``: the operators, drawn by
        Graphviz. Returns :class:`tofu_mx.runtime.draw.Drawing`."""
        from tofu_mx.runtime.draw import draw
        return draw(self, path, view=view, only=only)

    def __repr__(self) -> str:
        return (f"PartitionedSymbol({len(self.contexts)} devices, "
                f"{len(self.plan.ops)} operators, {len(self.shards)} variables)")


def _numpy(value: Any) -> np.ndarray:
    return value.asnumpy() if isinstance(value, mx.nd.NDArray) else np.asarray(value)


def _check_operators(graph: Graph, plan: Plan, k: int, strict: bool) -> None:
    if k == 1:
        return
    stuck = [f"{n.name} ({registry_key(n.op, n.params)})" for n in graph.operators()
             if lookup(n.op, n.params) is None]
    if stuck and strict:
        raise UnsupportedOperatorError(
            f"{len(stuck)} operator(s) have no TDL description, so they cannot be partitioned: "
            f"{', '.join(stuck[:5])}{' ...' if len(stuck) > 5 else ''}. Describe them with "
            f"@tofu_mx.tdl.op(...), register tofu_mx.tdl.opaque(name, reason, batch_axes=...), "
            f"or pass strict=False to run each whole on one device")
    if not any(not layout.replicated for t in plan.tensors for layout in t.layouts):
        shapes = sorted({t.shape for t in plan.tensors if t.kind in ("data", "param")},
                        key=lambda s: -int(np.prod(s)))[:4]
        raise InvalidArgumentError(
            f"nothing can be split over {k} devices: no axis of any tensor is at least "
            f"{max(plan.factors)} long where a cut needs it (largest inputs {shapes}). Use a "
            f"larger batch or wider layers, or fewer devices.")


def partition(symbol: mx.sym.Symbol, ctx: Sequence[mx.Context] | mx.Context, *,
              memory_budget=None, options: SearchOptions | None = None,
              dtypes: Mapping[str, Any] | None = None, strict: bool = False,
              check: bool = False, machine=None, join_outputs: bool = True,
              **shapes) -> PartitionedSymbol:
    """Partition ``symbol`` over the devices ``ctx`` (any number, ``mx.cpu(i)`` or
    ``mx.gpu(i)``), for the input ``shapes`` given by name (``data=(32, 3, 224, 224)``).

    Runs import -> lowering -> TDL analysis -> coarsening -> search (:func:`tofu_mx.plan`)
    -> assignment -> rewrite -> check. ``memory_budget``: bytes per device (or a list).
    Without one, the plan moves the fewest bytes (``options.memory_weight``, 0 by default, as
    Tofu) given ``options.refetch`` (on by default: the converted inputs a gradient reads are
    fetched again in the backward pass, not kept), except that with
    ``options.keep_if_fits`` (on by default) the plan keeping them is taken where it holds
    at most ``options.balance`` (1.15) times the ideal as MXNet plans the step, or no more
    than the re-fetching plan: it moves fewer bytes and runs no share twice
    (:func:`_fewest_bytes`). With one, the plan moving the fewest bytes whose
    ``memory_per_device()`` fits: a re-fetching plan (when ``options.refetch``: with
    ``options.keep_share``, or fetching every converted input again), or a
    keeping plan at a memory weight searched for (:func:`tofu_mx.runtime.frontier.fit_budget`);
    :class:`tofu_mx.NoFeasiblePlanError` if none does.
    An operator with no TDL description runs whole on one device (listed in
    :attr:`PartitionedSymbol.fallbacks`, with one warning); ``strict=True`` refuses the graph
    instead (:class:`tofu_mx.UnsupportedOperatorError`). The caller's symbol is not modified.
    ``check=True``: before returning, the partition is checked on a small copy of the model
    (:meth:`PartitionedSymbol.check`), raising :class:`tofu_mx.VerificationError` if it
    computes something else.
    ``machine``: a :class:`tofu_mx.sim.Machine` or a preset's name (``"8xV100-16GB-PCIe"``)
    with at least as many devices as ``ctx``: the plan is chosen by the simulator's step time
    on it (:func:`choose_by_step_time`) among the fewest-bytes plans fetching converted inputs
    again for the backward pass and keeping them, and the keeping plan searched with each
    conversion priced at the machine's ``conversion_bytes``, each also routed through the machine's
    device groups where ``ctx`` spans several (a value several devices of a group read
    crosses to the group once), the fastest whose peak memory fits the machine's;
    :attr:`PartitionedSymbol.machine_choice` and ``report()`` say which and why, and
    data parallelism's step on the same devices (not a partition: a
    :class:`tofu_mx.DataParallelFasterWarning` where it fits and would be faster).
    Without it, the plan moving the fewest bytes (given ``options``).
    ``join_outputs=False``: the executor returns each output as the pieces the plan stores
    it in, on their devices, not joined whole on the first device (which then holds a whole
    copy of every output: 1.1-1.3x the others' memory with a language model's probabilities);
    :meth:`PartitionedSymbol.join_outputs` and :meth:`~PartitionedSymbol.head_gradients`
    convert (:meth:`PartitionedSymbol.with_output_pieces`).
    """
    check = arguments.flag(check, "check")
    join_outputs = arguments.flag(join_outputs, "join_outputs")
    if machine is not None:
        ptd = choose_by_step_time(symbol, ctx, machine, memory_budget=memory_budget,
                                  options=options, dtypes=dtypes, strict=strict,
                                  join_outputs=join_outputs, **shapes)
    else:
        ptd = _partition(symbol, ctx, memory_budget, options, dtypes, strict, shapes,
                         join_outputs)
    if check:
        ptd.check()
    return ptd


@collector_paused()
def _partition(symbol, ctx, memory_budget, options, dtypes, strict, shapes,
               join_outputs: bool = True) -> PartitionedSymbol:
    symbol = check_symbol(symbol, "symbol")
    contexts = check_contexts(ctx)
    options = SearchOptions.of(options)
    strict = arguments.flag(strict, "strict")
    k = check_device_count(len(contexts))
    if memory_budget is not None:
        budgets_of(memory_budget, k)        # before the import, which may take a while
    whole = import_graph(symbol, dtypes=dtypes, **shapes)
    graph = lower_graph(whole, k, interleave=options.interleave)
    applied = _Applied(symbol, whole, graph, contexts, join_outputs)
    if memory_budget is None:
        return _fewest_bytes(applied, k, options, strict)
    budgets = budgets_of(memory_budget, k)

    def measure(weight: float, refetch: bool = False, keep_share: float = 0.0):
        tried = _variant(options, weight, refetch, keep_share)
        plan, assignment = runnable_plan(graph, k, tried)
        _check_operators(graph, plan, k, strict)
        ptd = applied(plan, assignment)
        return trade_off(ptd, weight, tried.optimizer_state, keep_share), ptd
    others = [measure(options.memory_weight, True, share)
              for share in _refetch_shares(options)]
    return fit_budget(measure, budgets, options.memory_weight, others)


#: MXNet's memory plan of the unpartitioned step, over :func:`tofu_mx.sim.memory.peak_memory`'s
#: (which models no in-place outputs, and one device makes more of them than a partition's
#: devices do): 0.92-0.96 on the models of bench/memory_mxnet.py, where the partitioned
#: graphs' are 0.95-1.07 (bench/results/memory.md). The ideal ``keep_if_fits`` weighs
#: against is scaled by it, so that the keeping plan is judged against MXNet's ideal
ONE_DEVICE_PLANNED = 0.94


def _fewest_bytes(applied: "_Applied", k: int, options: SearchOptions, strict: bool
                  ) -> PartitionedSymbol:
    """The plan moving the fewest bytes at ``options``. Where that plan would fetch
    converted inputs again for the backward pass (``options.refetch``) and
    ``options.keep_if_fits``, the plan keeping them is made first, and taken where every
    device holds at most ``options.balance`` times the ideal as MXNet plans the step
    (:meth:`PartitionedSymbol.planned_memory` against the unpartitioned graph's, over k,
    times :data:`ONE_DEVICE_PLANNED`), or no more than the re-fetching plan: re-fetching
    saves memory, at the price of more bytes moved and the shares run again, so it is only
    worth it where it does."""
    def made(tried: SearchOptions) -> PartitionedSymbol:
        plan, assignment = runnable_plan(applied.graph, k, tried)
        _check_operators(applied.graph, plan, k, strict)
        return applied(plan, assignment)
    if not (options.refetch and options.keep_if_fits and k > 1):
        return made(options)
    said = {}       # each plan's warnings (its fallbacks), given for the plan taken only

    def quietly(tried: SearchOptions) -> PartitionedSymbol:
        with warnings_held() as caught:
            ptd = made(tried)
        said[id(ptd)] = caught
        return ptd

    def taken(ptd: PartitionedSymbol) -> PartitionedSymbol:
        give_warnings(said[id(ptd)])
        return ptd
    kept = quietly(dataclasses.replace(options, refetch=False))
    held = max(kept.planned_memory(options.optimizer_state))
    ideal = max(peak_memory(applied.whole, lambda i: 0, 1, options.optimizer_state)) / k \
        * ONE_DEVICE_PLANNED
    if held <= options.balance * ideal:
        return taken(kept)
    fetched = quietly(options)
    return taken(kept if held <= max(fetched.planned_memory(options.optimizer_state))
                 else fetched)


#: the plans ``partition(machine=...)`` weighs: (label, SearchOptions.refetch, whether
#: conversions are priced at the machine's Machine.conversion_bytes)
STEP_TIME_CANDIDATES = (("converted inputs fetched again for the backward pass", True, False),
                        ("converted inputs kept for the backward pass", False, False),
                        ("converted inputs kept for the backward pass; each conversion priced "
                         "at {} (fewer operators)", False, True))


@collector_paused()
def choose_by_step_time(symbol: mx.sym.Symbol, ctx: Sequence[mx.Context] | mx.Context,
                        machine, *, memory_budget=None, options: SearchOptions | None = None,
                        dtypes: Mapping[str, Any] | None = None, strict: bool = False,
                        compare: bool = True, join_outputs: bool = True,
                        **shapes) -> PartitionedSymbol:
    """``partition(..., machine=machine)``: each plan of :data:`STEP_TIME_CANDIDATES` (the
    fewest-bytes plan at ``options`` but for re-fetching, and the plan that keeps them with
    each conversion priced at the machine's :attr:`~tofu_mx.sim.Machine.conversion_bytes`
    (a transfer's latency and operator launches: fewer, larger conversions, where bytes
    moved are cheaper than operators run; skipped where it is the keeping plan again);
    within ``memory_budget`` if given), one training step of it simulated on ``machine``
    (:func:`tofu_mx.sim.partitioned_step`, ``options.optimizer_state``); the fastest whose
    every device's peak fits the machine's memory, else the one needing the least. Re-fetching
    moves more bytes and re-runs shares but holds less; keeping holds more and runs fewer
    operators. Where ``ctx`` spans more than one of the machine's device groups (PCIe
    switches, NVLink quads), each plan is weighed routed both ways: every reader fetching
    from the holder, and each value several devices of a group read sent to the group once
    (:func:`nnvm_passes.program.relayed_reads`: fewer bytes over the links between groups,
    a copy more within the group). Where the graph has split blocks stored interleaved
    (:attr:`SearchOptions.interleave`: an LSTM's gates), each plan is weighed with them
    stored one after another too (interleaving moves fewer bytes; on CPU devices, where
    bytes are cheap, it can be slower). With ``compare``, data parallelism and the hybrid on
    the same devices are simulated too (:class:`MachineChoice`), and a
    :class:`tofu_mx.DataParallelFasterWarning` is raised where one fits and is faster.
    ``join_outputs``: as :func:`partition`'s (each plan is weighed as it will run)."""
    from tofu_mx import sim
    join_outputs = arguments.flag(join_outputs, "join_outputs")
    contexts = check_contexts(ctx)
    if isinstance(machine, str):
        machine = sim.machine(machine)
    if not isinstance(machine, sim.Machine):
        raise InvalidArgumentError(f"machine must be a tofu_mx.sim.Machine or a preset's name "
                                   f"({', '.join(sorted(sim.PRESETS))}), got "
                                   f"{type(machine).__name__}")
    if len(contexts) > machine.num_devices:
        raise InvalidArgumentError(f"machine {machine.name!r} has {machine.num_devices} "
                                   f"device(s), fewer than the {len(contexts)} in ctx; "
                                   f"choose a machine with at least {len(contexts)}")
    options = SearchOptions.of(options)
    weighed, errors = [], []
    groups = machine.group_size if machine.group_size < len(contexts) else 0
    searched = []       # (layouts, strategies, interleaved) of each plan weighed
    for (label, refetch, priced), interleave in itertools.product(
            STEP_TIME_CANDIDATES, (True, False) if options.interleave else (False,)):
        if options.interleave and not interleave and \
                not any(c.interleaved for c, _ in weighed):
            continue        # nothing was interleaved: the same plans again
        conversion_bytes = machine.conversion_bytes if priced else options.conversion_bytes
        try:
            ptd = _partition(symbol, contexts, memory_budget,
                             dataclasses.replace(options, refetch=refetch,
                                                 keep_if_fits=False, interleave=interleave,
                                                 conversion_bytes=conversion_bytes),
                             dtypes, strict, shapes, join_outputs)
        except NoFeasiblePlanError as e:
            errors.append(e)
            continue
        found = (ptd.plan.tensors, ptd.plan.ops, ptd.plan.unlowered, interleave)
        if priced:
            if found in searched:
                continue    # the plan found without pricing them
            label = label.format(format_bytes(conversion_bytes))
        searched.append(found)
        if options.interleave and not interleave:
            label = f"{label}; {NOT_INTERLEAVED}"
        routed = [(label, 0, ptd)]
        if groups:
            routed.append((f"{label}; {RELAYED.format(groups)}", groups,
                           _routed(ptd, groups)))
        for text, group_size, built in routed:
            step, peaks = sim.partitioned_step(built, machine, options.optimizer_state)
            weighed.append((Candidate(text, step, max(peaks), max(peaks) <= machine.memory,
                                      refetch, group_size,
                                      interleaved=bool(built.graph.layouts),
                                      conversion_bytes=conversion_bytes), built))
    if not weighed:
        raise min(errors, key=lambda e: e.footprint)
    weighed.sort(key=lambda c: (not c[0].fits, c[0].step if c[0].fits else c[0].peak))
    chosen, ptd = weighed[0]
    choice = MachineChoice(machine.name, chosen, tuple(c for c, _ in weighed))
    if compare:
        choice = dataclasses.replace(
            choice,
            data_parallel=_data_parallel(symbol, ptd.graph, len(contexts), machine, options,
                                         dtypes, shapes),
            hybrid=_hybrid(symbol, ptd.graph, len(contexts), machine, options, dtypes, shapes))
    faster = choice.fastest_elsewhere
    if faster is not None:
        warnings.warn(f"partition(machine={machine.name!r}): {choice.advice()} "
                      f"({faster.step * 1e3:,.1f} ms per step predicted, "
                      f"against {chosen.step * 1e3:,.1f} ms for the partitioned plan)",
                      DataParallelFasterWarning, stacklevel=caller_stacklevel())
    ptd.machine_choice = choice
    return ptd


def _data_parallel(symbol, graph: Graph, k: int, machine, options: SearchOptions, dtypes,
                   shapes) -> Candidate | None:
    """Data parallelism over ``k`` of ``machine``'s devices, simulated as a
    :class:`Candidate`; None where ``graph`` has no data input whose batch splits ``k``
    ways."""
    from tofu_mx import sim
    if not _batch_splits(graph, k):
        return None
    result = sim.data_parallel_step(symbol, machine, k, options=options, dtypes=dtypes,
                                    **shapes)
    return Candidate(DATA_PARALLEL, result.step_time, max(result.peak_memory), result.fits)


def _batch_splits(graph: Graph, parts: int) -> bool:
    """``graph`` has a data input, and every one has a batch of ``parts`` or more."""
    data = graph.variables("data")
    return bool(data) and all(v.outputs[0].shape and v.outputs[0].shape[0] >= parts
                              for v in data)


def _hybrid(symbol, graph: Graph, k: int, machine, options: SearchOptions, dtypes,
            shapes) -> Candidate | None:
    """Data parallelism across the machine's device groups among its first ``k`` devices,
    Tofu inside each, simulated as a :class:`Candidate`; None where they are not two or
    more whole groups or the batch does not split over them."""
    from tofu_mx import sim
    size = machine.group_size
    if k % size or k // size < 2 or not _batch_splits(graph, k // size):
        return None
    result = sim.hybrid_step(symbol, machine, k, options=options, dtypes=dtypes, **shapes)
    return Candidate(HYBRID.format(groups=k // size, size=size), result.step_time,
                     max(result.peak_memory), result.fits, groups=k // size)


#: how a candidate of ``partition(machine=...)`` with its split blocks stored one after another
#: is described, where interleaving them was weighed too (SearchOptions.interleave)
NOT_INTERLEAVED = "gates stored one after another, not interleaved"

#: how a candidate of ``partition(machine=...)`` routed through the machine's device groups
#: is described (its group size)
RELAYED = "each value several devices of a group of {} read sent to the group once"


def _routed(ptd: PartitionedSymbol, group_size: int, join_outputs: bool | None = None
            ) -> PartitionedSymbol:
    """``ptd``'s plan on its devices routed again, unbound, with its ``machine_choice``:
    each value that several devices of one group of ``group_size`` read from another group
    sent to that group once (:func:`nnvm_passes.program.relayed_reads`; 0: to each reader),
    its outputs joined or as pieces (``join_outputs``; None: as ``ptd``'s)."""
    join = ptd.output_pieces is None if join_outputs is None else join_outputs
    program = route(ptd.graph, ptd.assignment, group_size=group_size, join_outputs=join)
    with warnings.catch_warnings():       # ptd's rewrite warned of its fallbacks already
        warnings.simplefilter("ignore", RuntimeWarning)
        routed = _rewritten(ptd.reference, ptd.graph, ptd.plan, ptd.assignment, ptd.contexts,
                            program=program)
    routed.machine_choice = ptd.machine_choice
    return routed


#: searches again, at most, when operators' composed shares cannot run
MAX_REPAIRS = 4


def runnable_plan(graph: Graph, k: int, options: SearchOptions) -> tuple[Plan, Assignment]:
    """:func:`plan_graph`'s plan and its assignment, searched again while some operator's
    share, once every
    cut is composed, cannot run as the operator (the search judges each cut on an
    approximate view of the ones before): each time, those operators' strategies at their
    last splitting cut are kept off. Where that does not settle within
    :data:`MAX_REPAIRS` searches (the operator has no other choice there), the last plan
    stands: :func:`~tofu_mx.runtime.assign.assign` runs those operators' last cuts
    replicated."""
    avoid: frozenset = frozenset()
    plan = plan_graph(graph, k, options=options)
    assignment = assign(graph, plan)
    for _ in range(MAX_REPAIRS):
        bad = [graph.nodes[i].name for i, a in assignment.ops.items() if a.unrunnable]
        if not bad:
            break
        ops = {o.name: o for o in plan.ops}
        more = set()
        for name in bad:
            levels = [(level, str(s)) for level, s in enumerate(ops[name].strategies)
                      if s.kind not in ("replicate", "whole")]
            if levels:
                more.add((name, *levels[-1]))
        if more <= avoid:
            break
        avoid |= more
        plan = plan_graph(graph, k, options=options, avoid=avoid)
        assignment = assign(graph, plan)
    return plan, assignment


class _Applied:
    """:func:`apply_plan` of one symbol, graph and devices, once per distinct plan: the
    weights a budget or a frontier tries often give the same plan (measured: 9 tries, 7
    plans), and rewriting and measuring one costs far more than searching it."""

    def __init__(self, symbol: mx.sym.Symbol, whole: Graph, graph: Graph,
                 contexts: Sequence[mx.Context], join_outputs: bool = True):
        self.symbol, self.whole, self.graph, self.contexts = symbol, whole, graph, contexts
        self.join_outputs = join_outputs
        self._done: dict[str, PartitionedSymbol] = {}

    def __call__(self, plan: Plan, assignment: Assignment) -> PartitionedSymbol:
        key = plan.to_json()
        if key not in self._done:
            self._done[key] = _built(self.symbol, self.whole, self.graph, plan, assignment,
                                     self.contexts, self.join_outputs)
        return self._done[key]


def _variant(options: SearchOptions, weight: float, refetch: bool,
             keep_share: float) -> SearchOptions:
    """``options`` for one plan a budget or a frontier weighs: at this memory weight,
    re-fetching or not with this keep share, and not balanced (they search weights
    themselves)."""
    return dataclasses.replace(options, memory_weight=weight, refetch=refetch,
                               keep_share=keep_share, balance=0)


def _refetch_shares(options: SearchOptions) -> list[float]:
    """The keep shares of the re-fetching plans a budget or a frontier weighs: the options'
    one, and 0 (every converted input fetched again: the least memory); none without
    ``options.refetch``."""
    if not options.refetch:
        return []
    return sorted({options.keep_share, 0.0}, reverse=True)


def frontier(symbol: mx.sym.Symbol, ctx: Sequence[mx.Context] | mx.Context, *,
             options: SearchOptions | None = None, dtypes: Mapping[str, Any] | None = None,
             weights: Sequence[float] = FRONTIER_WEIGHTS, **shapes) -> Frontier:
    """Bytes moved against memory per device: the plans keeping converted inputs found at
    each memory weight in ``weights``, and the re-fetching plans (``options.memory_weight``;
    ``options.keep_share`` and 0),
    partitioned for ``ctx`` (nothing is bound) and measured; the Pareto front."""
    symbol = check_symbol(symbol, "symbol")
    contexts = check_contexts(ctx)
    options = SearchOptions.of(options)
    weights = [arguments.real(w, f"weights[{i}]", minimum=0) for i, w in enumerate(weights)]
    k = check_device_count(len(contexts))
    whole = import_graph(symbol, dtypes=dtypes, **shapes)
    graph = lower_graph(whole, k, interleave=options.interleave)
    points = []
    applied = _Applied(symbol, whole, graph, contexts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # fallbacks: reported by partition()
        one = apply_plan(symbol, whole, plan_graph(whole, 1, options=options), contexts[:1])
        ideal = trade_off(one, 0.0, options.optimizer_state).worst / k
        tries = [(w, False, 0.0) for w in weights] + \
            [(options.memory_weight, True, share) for share in _refetch_shares(options)]
        for weight, refetch, share in tries:
            tried = _variant(options, weight, refetch, share)
            ptd = applied(*runnable_plan(graph, k, tried))
            points.append(trade_off(ptd, weight, tried.optimizer_state, share))
    return Frontier(pareto(points), ideal)


def apply_plan(symbol: mx.sym.Symbol, graph: Graph, plan: Plan,
               contexts: Sequence[mx.Context], ordered: bool = False) -> PartitionedSymbol:
    """The rewrite and check steps of :func:`partition`, for a plan made elsewhere.
    ``ordered``: with Tofu's control dependencies (see :func:`nnvm_passes.emit.emit`)."""
    symbol = check_symbol(symbol, "symbol")
    contexts = check_contexts(contexts)
    if not isinstance(graph, Graph):
        raise InvalidArgumentError(f"graph must be the symbol imported with its shapes "
                                   f"(tofu_mx.tdl.annotate.import_graph(symbol, **shapes)), got "
                                   f"{type(graph).__name__}")
    if not isinstance(plan, Plan):
        raise InvalidArgumentError(f"plan must be a tofu_mx.Plan (tofu_mx.plan(), or "
                                   f"Plan.from_json()), got {type(plan).__name__}")
    names = symbol.list_arguments() + symbol.list_auxiliary_states()
    if sorted(names) != sorted(n.name for n in graph.variables()):
        raise InvalidArgumentError("graph is not the import of symbol (their inputs differ); "
                                   "pass import_graph(symbol, **shapes)")
    check_plan(plan, graph, len(contexts))
    return _rewritten(symbol, graph, plan, assign(graph, plan), contexts, ordered)


def _built(symbol: mx.sym.Symbol, whole: Graph, graph: Graph, plan: Plan,
           assignment: Assignment, contexts: Sequence[mx.Context],
           join_outputs: bool = True) -> PartitionedSymbol:
    """:func:`partition`'s last steps for a plan of ``graph`` (``whole`` lowered): route
    (``join_outputs``: as :func:`partition`'s), run the operators the plan splits as they
    split unlowered (:func:`~tofu_mx.runtime.unlower.unlower`), emit, check."""
    graph, plan, assignment, program = unlower(whole, graph, plan, assignment, join_outputs)
    if program is None:
        program = route(graph, assignment, join_outputs=join_outputs)
    return _rewritten(symbol, graph, plan, assignment, contexts, program=program)


def _rewritten(symbol: mx.sym.Symbol, graph: Graph, plan: Plan, assignment: Assignment,
               contexts: Sequence[mx.Context], ordered: bool = False,
               program: Program | None = None) -> PartitionedSymbol:
    """:func:`apply_plan`'s rewrite and checks, given the plan's assignment (and its
    Program, where it was routed already)."""
    program = route(graph, assignment) if program is None else program
    ptd = PartitionedSymbol(symbol, graph, plan, assignment, program, emit(program, ordered),
                            list(contexts))
    _check_rewrite(ptd)
    arguments.check_tensor_sizes(ptd.shard_graph,
                               f"the partition over {len(contexts)} device(s)")
    whole = [f"{ptd.graph.nodes[i].name}: {why}" for i, why in assignment.fallbacks.items()]
    if whole:
        warnings.warn(f"{len(whole)} operator(s) run whole instead of split (see "
                      f"PartitionedSymbol.fallbacks): {'; '.join(whole[:5])}"
                      f"{' ...' if len(whole) > 5 else ''}", RuntimeWarning,
                      stacklevel=caller_stacklevel())
    return ptd


def _check_rewrite(ptd: PartitionedSymbol) -> None:
    """The rewritten graph is one MXNet takes (every operator's inputs, shapes and dtypes
    infer) and infers the original's output shapes and dtypes from the shards'."""
    try:
        graph = ptd.shard_graph
    except TofuError as e:      # MXNet's message names the operator
        raise TofuError(f"internal: MXNet refuses the partitioned graph ({e}); please report "
                        f"it with the symbol and shapes") from e
    got = [(t.shape, t.dtype) for t in graph.output_infos]
    want = [(t.shape, t.dtype) for t in ptd.graph.output_infos]
    if ptd.program.pieces:      # each piece the shape of its box
        want = [(tuple(hi - lo + 1 for lo, hi in box), want[k][1])
                for k, box in ptd.program.pieces]
    if got != want:
        raise TofuError(f"internal: the partitioned graph's outputs have shapes and dtypes "
                        f"{got}, the original's {want}")
    placed = [n.name for i, n in enumerate(graph.nodes)
              if placed_group(graph, i, group_name(0)) not in ptd.group2ctx]
    if placed:
        raise TofuError(f"internal: nodes without a device group: {placed[:5]}")
