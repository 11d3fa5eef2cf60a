"""A Gluon ``HybridBlock`` partitioned over several devices.

:func:`partition` traces the block as Gluon does when it exports (``block(mx.sym.var(...))``:
each ``Parameter`` becomes the variable named ``Parameter.name``), appends the loss block,
partitions the graph with :func:`tofu_mx.partition`, binds it once across the devices, and
fills the parameter shards. The result, a :class:`PartitionedBlock`, is itself a Gluon
``Block``: ``pnet(x, y)`` runs the partitioned executor, also inside ``autograd.record()``.

Why a new block rather than ``net.hybridize()``: Gluon's ``CachedOp`` (what a hybridized
block runs) ignores ctx groups, so it cannot place operators on devices. The user's block is
never changed; it stays on its own devices with its own values.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from nnvm_passes.ir import VARIABLE_KINDS
from tofu_mx import arguments
from tofu_mx.arguments import show
from tofu_mx.devices import check_contexts, no_subgraph_backend
from tofu_mx.errors import (CheckpointError, DataParallelFasterWarning, InvalidArgumentError,
                            TofuError, give_warnings, mxnet_message, warnings_held)
from tofu_mx.files import atomic_write, check_writable
from tofu_mx.gluon.init import initialize_shard
from tofu_mx.runtime.partitioned import (DeviceMemory, MachineChoice, PartitionedSymbol,
                                         choose_by_step_time)
from tofu_mx.runtime.partitioned import partition as partition_symbol

Shape = tuple[int, ...]


def trace(block: gluon.HybridBlock, data_names: Sequence[str], dtype: str,
          loss: gluon.HybridBlock | None = None, label_name: str = "label") -> mx.sym.Symbol:
    """The block's graph as a Symbol (the loss appended when given): inputs ``data_names``,
    parameters named ``Parameter.name``. Nothing of the block changes."""
    _check_block(block)
    if isinstance(data_names, str) or not isinstance(data_names, Sequence) or not data_names \
            or not all(isinstance(n, str) for n in (*data_names, label_name)):
        raise InvalidArgumentError(f"data_names must be a non-empty list of input names and "
                                   f"label_name a name, got {show(data_names)} and "
                                   f"{show(label_name)}; e.g. trace(net, ['data'], 'float32')")
    dtype = _dtype(dtype)
    inputs = [mx.sym.var(n, dtype=dtype) for n in data_names]
    out = _call(block, inputs, "block")
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if not all(isinstance(o, mx.sym.Symbol) for o in outs):
        raise InvalidArgumentError(
            f"tracing {block.name} with Symbol inputs returned "
            f"{[type(o).__name__ for o in outs]}, not Symbols: its hybrid_forward must build "
            f"its result with F (mx.sym while tracing), not NDArray code")
    if loss is None:
        return outs[0] if len(outs) == 1 else mx.sym.Group(outs)
    _check_loss(loss)
    if len(outs) != 1:
        raise InvalidArgumentError(
            f"{block.name} has {len(outs)} outputs; a loss block takes one. Partition "
            f"without loss= and apply the loss to pnet(x)'s outputs instead")
    return _call(loss, [outs[0], mx.sym.var(label_name, dtype=dtype)], "loss")


def _check_block(block) -> None:
    if isinstance(block, gluon.HybridBlock):
        return
    if isinstance(block, gluon.Block):
        raise InvalidArgumentError(
            f"tofu_mx.gluon.partition needs a gluon.HybridBlock, got {type(block).__name__}: "
            f"a plain Block runs Python and NDArray code, so it has no graph to partition. "
            f"Write it as a HybridBlock (hybrid_forward(self, F, x, ...)).")
    hint = ("for an mx.sym.Symbol use tofu_mx.partition(symbol, ctx, data=...)"
            if isinstance(block, mx.sym.Symbol) else
            "give the network, e.g. a gluon.nn.HybridSequential")
    raise InvalidArgumentError(f"tofu_mx.gluon.partition needs a gluon.HybridBlock, got "
                               f"{type(block).__name__} {show(block)}; {hint}")


def _check_loss(loss) -> None:
    if not isinstance(loss, gluon.HybridBlock):
        raise InvalidArgumentError(
            f"loss must be a gluon.HybridBlock, got {type(loss).__name__} {show(loss)}; "
            f"use a Gluon loss such as gluon.loss.SoftmaxCrossEntropyLoss(), or write the "
            f"loss as a HybridBlock")


def _call(block, inputs, what):
    try:
        with autograd.pause():
            return block(*inputs)
    except TofuError:
        raise
    except Exception as e:  # noqa: BLE001  (re-raised with what to do)
        raise InvalidArgumentError(
            f"cannot trace the {what} {block.name} ({type(block).__name__}) as a graph: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. Its "
            f"hybrid_forward must use only F operators with shapes known from the inputs "
            f"(no .shape, .asnumpy() or Python branches on values).") from e


def partition(block: gluon.HybridBlock, ctx: Sequence[mx.Context] | mx.Context, *,
              data: Shape | Sequence[Shape], label: Shape | None = None,
              loss: gluon.HybridBlock | None = None, dtype: Any = None, init: Any = None,
              memory_budget: Any = None, options: Any = None, strict: bool = False,
              machine: Any = None, replicas: int | str = 1) -> "PartitionedBlock":
    """Partition a Gluon ``HybridBlock`` over the devices ``ctx`` for one batch shape.

    - ``data``: the input's shape, or a list of shapes for a block with several inputs
      (named ``data0``, ``data1``, ...). ``label`` and ``loss``: with a loss block, the
      partitioned graph computes the per-sample losses ``loss(block(x), y)``.
    - ``dtype``: of the inputs; the parameters' dtype by default (``block.cast('float64')``
      partitions in float64).
    - Parameter values: an initialised parameter's values are copied into its shards. A
      parameter that is not initialised (never, or deferred by ``block.initialize()``
      without shapes) is initialised shard by shard, each shard from the parameter's own
      initializer (or ``init``, or Gluon's default ``Uniform``) with the whole parameter's
      fan-in and fan-out: no device ever holds the whole parameter.
    - ``memory_budget``, ``options``, ``strict``, ``machine``: as :func:`tofu_mx.partition`
      (``machine``: the plan chosen by simulated step time on it). The budget
      counts the optimizer state ``options.optimizer_state`` says the trainer will keep
      (bytes per parameter byte: ``SearchOptions(optimizer_state=2)`` for Adam).
    - ``replicas``: data parallelism across ``replicas`` groups of devices, Tofu inside each
      (the hybrid ``partition(machine=...)`` weighs). ``ctx`` is cut into that many groups
      of consecutive devices; the block is partitioned over the first group for its share
      of the batch (``data``'s first axis divided by ``replicas``), and each group runs that
      partition on its own devices and its own rows of the batch, with its own copy of the
      parameter shards. :class:`tofu_mx.gluon.Trainer` sums each shard's gradient over the
      groups (each device with its peers) before every group applies the same update, so
      the copies stay equal. As in Gluon's data parallelism, anything computed across
      samples sees each group's rows only: BatchNorm normalises each group's rows by their
      own statistics (not the whole batch's), each group updates its own moving statistics
      (the first group's are saved), and a loss comparing samples compares a group's. Every output must have the
      batch as its first axis (per-sample losses): the groups' outputs are joined along it.
      ``replicas="auto"`` (with ``machine``): the hybrid over the machine's device groups
      where the simulator predicts it fits and is faster than every partition of all the
      devices and than data parallelism, else one partition of them all;
      :attr:`PartitionedBlock.machine_choice` says what was weighed.

    Returns a :class:`PartitionedBlock`. ``block`` is not modified.
    """
    contexts = check_contexts(ctx)
    _check_block(block)
    shapes = _data_shapes(data)
    if (label is None) != (loss is None):
        raise InvalidArgumentError("give both loss= and label= (the label's shape), or neither")
    if label is not None:
        _check_loss(loss)
        label = _shape(label, "label", "(32,)")
    init = _initializer(init)
    params = _parameters(block)
    dtype = _dtype(dtype) if dtype is not None else _param_dtype(params)
    names = ["data"] if len(shapes) == 1 else [f"data{i}" for i in range(len(shapes))]
    symbol = trace(block, names, dtype, loss)
    shape_of = dict(zip(names, shapes))
    if label is not None:
        shape_of["label"] = tuple(label)
    dtypes = {n: dtype for n in shape_of}
    choice = None
    if replicas == "auto":
        if machine is None:
            raise InvalidArgumentError(
                "replicas='auto' lets machine= choose between one partition and the hybrid: "
                "give machine= too (a tofu_mx.sim preset's name or Machine), or a number of "
                "replicas")
        whole, choice = _whole_or_hybrid(symbol, contexts, memory_budget, options, dtypes,
                                         strict, machine, shape_of)
        if whole is not None:
            return PartitionedBlock(block, whole, names, "label" if label is not None else None,
                                    params, init, contexts, choice)
        replicas = choice.hybrid.groups
    replicas = arguments.count(replicas, "replicas", example="replicas=2 or replicas='auto'")
    share = _replica_shapes(symbol, contexts, replicas, shape_of)
    group = contexts[:len(contexts) // replicas]
    if choice is not None:      # the hybrid, as simulated: each group machine='s plan for it
        ptd = choose_by_step_time(symbol, group, machine, memory_budget=memory_budget,
                                  options=options, dtypes=dtypes, strict=strict,
                                  compare=False, join_outputs=False, **share)
    else:
        ptd = partition_symbol(symbol, group, memory_budget=memory_budget, options=options,
                               dtypes=dtypes, strict=strict, machine=machine,
                               join_outputs=False, **share)
    return PartitionedBlock(block, ptd, names, "label" if label is not None else None,
                            params, init, contexts, choice)


def _whole_or_hybrid(symbol, contexts, memory_budget, options, dtypes, strict, machine,
                     shape_of):
    """``replicas='auto'``: the partition of all of ``contexts`` ``machine=`` chooses and
    its :class:`~tofu_mx.runtime.partitioned.MachineChoice`, or (None, the choice with the
    hybrid chosen) where the hybrid is the fastest that fits. Its warning that the hybrid is
    faster is dropped when the hybrid is taken; every other warning is passed on."""
    with warnings_held() as caught:
        whole = partition_symbol(symbol, contexts, memory_budget=memory_budget,
                                 options=options, dtypes=dtypes, strict=strict,
                                 machine=machine, join_outputs=False, **shape_of)
    choice = whole.machine_choice
    hybrid = choice.hybrid is not None and choice.fastest_elsewhere is choice.hybrid
    give_warnings([w for w in caught
                   if not (hybrid and issubclass(w.category, DataParallelFasterWarning))])
    if hybrid:
        return None, dataclasses.replace(choice, chosen=choice.hybrid)
    return whole, choice


def _replica_shapes(symbol: mx.sym.Symbol, contexts: Sequence[mx.Context], replicas: int,
                    shape_of: dict[str, Shape]) -> dict[str, Shape]:
    """Each input's shape for one of ``replicas`` groups of ``contexts`` (its batch, the
    first axis, divided among them), checked: the devices and every batch divide evenly,
    and every output has the batch as its first axis (so the groups' outputs join)."""
    if replicas == 1:
        return shape_of
    k = len(contexts)
    if k % replicas or k == replicas:
        raise InvalidArgumentError(
            f"replicas={replicas} must divide the {k} devices of ctx into groups of two or "
            f"more (each group partitions the block); e.g. replicas=2 with 4 or 8 devices, or "
            f"replicas=1 to partition over all of them")
    batch = next(iter(shape_of.values()))[0]
    other = {n: s for n, s in shape_of.items() if s[0] != batch}
    if other:
        raise InvalidArgumentError(
            f"replicas={replicas} splits every input along its first axis, the batch "
            f"({batch} in {next(iter(shape_of))}), but "
            f"{', '.join(f'{n} {s}' for n, s in other.items())} has another first axis; give "
            f"batch-first inputs (begin states as (batch, ...)), or use replicas=1")
    if batch % replicas:        # every input's first axis is the batch (above)
        raise InvalidArgumentError(
            f"replicas={replicas} divides the batch (the first axis of every input) among "
            f"the groups, but {batch} does not divide by {replicas}; use a batch that does")
    share = {n: (s[0] // replicas,) + s[1:] for n, s in shape_of.items()}
    try:
        _, whole, _ = symbol.infer_shape(**shape_of)
        _, parts, _ = symbol.infer_shape(**share)
    except mx.base.MXNetError:      # partitioning says what is wrong with the shapes
        return share
    if whole is None or parts is None:
        return share
    wrong = [f"{name} {w}" for name, w, p in zip(symbol.list_outputs(), whole, parts)
             if not w or not p or w[0] != p[0] * replicas or w[1:] != p[1:]
             or w[0] != batch]
    if wrong:
        raise InvalidArgumentError(
            f"replicas={replicas} joins the groups' outputs along the batch, but the "
            f"output(s) {', '.join(wrong)} do not have the batch ({batch}) as their first "
            f"axis; return per-sample outputs (Gluon losses do), or use replicas=1")
    return share


def _data_shapes(data) -> list[Shape]:
    """``data=`` as a list of shapes: one shape (a tuple of ints) or a list of them."""
    example = "(32, 3, 224, 224), or [(32, 10), (32, 5)] for a block with two inputs"
    if not isinstance(data, (tuple, list)) or not data:
        raise InvalidArgumentError(f"data must be a shape or a list of shapes, got "
                                   f"{type(data).__name__} {show(data)}; e.g. {example}")
    if any(isinstance(d, (tuple, list)) for d in data):
        return [_shape(s, f"data[{i}]", example) for i, s in enumerate(data)]
    return [_shape(data, "data", example)]


def _shape(value, name: str, example: str) -> Shape:
    """A non-empty tuple or list of positive ints (NumPy's too), as a tuple of ints."""
    if not isinstance(value, (tuple, list)) or not value:
        raise InvalidArgumentError(f"{name} must be a shape (a non-empty tuple of ints), got "
                                   f"{type(value).__name__} {show(value)}; e.g. {example}")
    return tuple(arguments.count(d, f"{name}[{i}] (of {name}={show(value)})", example=example)
                 for i, d in enumerate(value))


def _dtype(dtype) -> str:
    """The name of a dtype MXNet arrays can have."""
    supported = ", ".join(sorted({np.dtype(t).name for t in mx.ndarray.ndarray._DTYPE_NP_TO_MX
                                  if t is not None and np.dtype(t).names is None}))
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"dtype {dtype!r} is not a data type ({e}); use one of "
                                   f"{supported}, e.g. dtype='float32'") from None
    if name not in supported.split(", "):
        raise InvalidArgumentError(f"dtype {dtype!r} is not one MXNet arrays can have; use one "
                                   f"of {supported}")
    return name


def _initializer(init) -> mx.init.Initializer | None:
    """``init=``: None, an ``mx.init.Initializer``, or the name of a registered one."""
    if init is None or isinstance(init, mx.init.Initializer):
        return init
    names = ", ".join(sorted(mx.registry.get_registry(mx.init.Initializer)))
    if not isinstance(init, str):
        raise InvalidArgumentError(f"init must be an mx.init.Initializer or its name, got "
                                   f"{type(init).__name__} {show(init)}; e.g. "
                                   f"init=mx.init.Xavier() or one of {names}")
    try:
        return mx.init.create(init)
    except Exception as e:  # noqa: BLE001  (MXNet answers an unknown name with an assert)
        raise InvalidArgumentError(f"init={init!r} is no initializer MXNet knows ({e}); use "
                                   f"one of {names}, or an mx.init.Initializer") from None


def _parameters(block) -> dict[str, gluon.Parameter]:
    """Parameter.name -> Parameter; a Parameter shared between blocks appears once."""
    out: dict[str, gluon.Parameter] = {}
    for p in block.collect_params().values():
        if p.name in out and out[p.name] is not p:
            raise InvalidArgumentError(
                f"two different Parameters of {block.name} are named {p.name!r}; Gluon "
                f"names the graph's variables by Parameter.name, so they would be one. Give "
                f"the blocks distinct prefixes.")
        out[p.name] = p
    return out


def _param_dtype(params) -> str:
    kinds = {np.dtype(p.dtype).name for p in params.values()}
    if len(kinds) > 1:
        raise InvalidArgumentError(f"the block's parameters have several dtypes {sorted(kinds)}; "
                                   f"give dtype= for the inputs")
    return kinds.pop() if kinds else "float32"


class PartitionedBlock(gluon.Block):
    """A block partitioned over several devices (made by :func:`partition`).

    - ``pnet.step(x, y)``: forward and backward (head gradients of 1, as ``loss.backward()``)
      on the partitioned executor; returns the per-sample losses (on device 0).
    - ``pnet(x, y)`` (or ``pnet(x)`` without a loss): inside ``autograd.record()`` the
      executor runs as an ``autograd.Function``, so ``loss.backward()`` reaches it.
      Outside, it runs forward in Gluon's mode (``autograd.is_training()``).
    - :class:`tofu_mx.gluon.Trainer` updates the shards where they are.
    - ``export_parameters(path)`` / ``load_parameters(path)``: whole parameters under the
      block's structural names, the file ``block.save_parameters`` writes and
      ``block.load_parameters`` reads, at any device count.

    Each call must have the batch shape it was partitioned for. Made with ``replicas=``,
    :attr:`partitioned` is the first group's partition (its share of the batch), and
    :attr:`contexts` every device; each group runs its own copy.
    """

    def __init__(self, block, ptd: PartitionedSymbol, data_names, label_name, params, init,
                 contexts: Sequence[mx.Context] | None = None,
                 choice: MachineChoice | None = None):
        super().__init__(prefix=block.prefix + "tofu_")
        # partition() made ptd with its outputs as their pieces, on the devices storing
        # them: this block joins them itself (no device holds a whole output for the
        # executor's sake)
        self.partitioned = ptd
        #: with ``machine=``: what was weighed over all the devices and chosen
        #: (``replicas='auto'``), else the partition's own choice
        self.machine_choice = choice if choice is not None else ptd.machine_choice
        #: every device, the groups' one after another (``partitioned.contexts`` first)
        self.contexts = list(contexts) if contexts is not None else list(ptd.contexts)
        size = len(ptd.contexts)
        #: each group's partition: the same plan on its own devices
        self.replicas = [ptd] + [ptd.placed_on(self.contexts[g * size:(g + 1) * size])
                                 for g in range(1, len(self.contexts) // size)]
        # the user's block, kept but not a child: hybridize(), cast(), collect_params() and
        # initialize() of this block never reach (or change) it
        object.__setattr__(self, "source", block)
        self.data_names = list(data_names)
        self.label_name = label_name
        self._params_by_name = params
        by_source: dict[str, list] = {}
        for s in ptd.shards:
            by_source.setdefault(s.source, []).append(s)
        self._shards_of = by_source
        with no_subgraph_backend():     # MKLDNN's fusion passes can drop ctx groups
            self._exes = [r.simple_bind(grad_req={n: _grad_req(p) for n, p in params.items()})
                          for r in self.replicas]
        # each group's shard name -> array
        self._arrays = [{**e.arg_dict, **e.aux_dict} for e in self._exes]
        self._fresh = False
        self._recorded = False       # a recorded call whose backward pass has not run
        #: each group's head gradients of a backward pass loss.backward() asked for, not run
        #: yet (see _settle)
        self._pending: list | None = None
        self._anchor = mx.nd.zeros((1,), ctx=ptd.contexts[0])
        self._anchor.attach_grad()
        self._fill(init)

    # --- parameters ------------------------------------------------------------------------
    @property
    def executor(self) -> mx.executor.Executor:
        """The (first group's) executor."""
        self._settle()
        return self._exes[0]

    def shard_arrays(self, kinds: Sequence[str] = ("param", "aux"), replica: int = 0
                     ) -> list[tuple[Any, mx.nd.NDArray, mx.nd.NDArray | None]]:
        """``(VarShard, value, gradient or None)`` of every shard of the given kinds, in
        group ``replica``'s copy (made with ``replicas=``; the first by default)."""
        replica = arguments.count(replica, "replica", minimum=0,
                                  maximum=len(self.replicas) - 1, example="replica=0")
        if isinstance(kinds, str) or not isinstance(kinds, Sequence) or \
                not all(isinstance(k, str) and k in VARIABLE_KINDS for k in kinds):
            raise InvalidArgumentError(f"kinds must be a list of variable kinds, some of "
                                       f"{', '.join(VARIABLE_KINDS)}; got {show(kinds)}, e.g. "
                                       f"kinds=('param',)")
        self._settle()
        arrays, grads = self._arrays[replica], self._exes[replica].grad_dict
        return [(s, arrays[s.name], grads.get(s.name)) for s in self.partitioned.shards
                if s.kind in kinds]

    def _fill(self, init) -> None:
        names_args, names_aux = self.partitioned.param_names()
        copied = {}
        for name in names_args + names_aux:
            p = self._params_by_name.get(name)
            if p is None:
                raise TofuError(f"internal: the traced graph has a variable {name!r} that is "
                                f"no Parameter of the block")
            if p._data is not None:
                copied[name] = p.data(p.list_ctx()[0]).asnumpy()
                continue
            if p._deferred_init:
                p_init, _, default_init, _ = p._deferred_init
            else:
                default_init = init or mx.init.Uniform()
                p_init = p.init if p.init is not None else default_init
            whole = self.partitioned.graph.node(name).outputs[0].shape
            if any(s.layout is not None for s in self._shards_of[name]):
                # laid out otherwise than the block's (interleaved): initialised whole on the
                # host, as the block lays it out (an initializer may write parts of it, as
                # LSTMBias does the forget gate's), then cut into its shards
                array = mx.nd.zeros(whole, ctx=mx.cpu(), dtype=self._shards_of[name][0].dtype)
                initialize_shard(p_init, default_init, name, array, whole,
                                 tuple((0, n - 1) for n in whole))
                copied[name] = array.asnumpy()
                continue
            for s in self._shards_of[name]:
                first = self._arrays[0][s.name]
                initialize_shard(p_init, default_init, name, first, whole, s.box)
                for arrays in self._arrays[1:]:     # every group starts from the same values
                    first.copyto(arrays[s.name])
        self._write(copied)

    def _write(self, values) -> None:
        """Whole parameters and aux states (NumPy, by Parameter.name) into their shards, in
        every group."""
        for name, part in self.partitioned.split_arrays(values, ("param", "aux")).items():
            for arrays in self._arrays:
                arrays[name][:] = part

    def structural_names(self) -> dict[str, str]:
        """The block's structural parameter names (``features.0.weight``, what
        ``save_parameters`` writes) -> ``Parameter.name``."""
        return {k: p.name for k, p in self.source._collect_params_with_prefix().items()}

    @property
    def fallbacks(self) -> dict[str, str]:
        """Operators that run whole instead of split, and why
        (:attr:`PartitionedSymbol.fallbacks`)."""
        return self.partitioned.fallbacks

    def collect_params(self, select: str | None = None):
        """Refused: the parameters are shards on several devices, not Gluon Parameters."""
        raise InvalidArgumentError(
            f"a PartitionedBlock's parameters are shards on {len(self.contexts)} "
            f"devices, not Gluon Parameters: train with tofu_mx.gluon.Trainer(pnet, optimizer, "
            f"...), save with pnet.save_parameters(path) (whole arrays, what "
            f"{self.source.name}.load_parameters reads), read shards with pnet.shard_arrays()")

    def initialize(self, *args, **kwargs) -> None:
        """Refused: the shards are initialised by :func:`partition` (its ``init``)."""
        raise InvalidArgumentError(
            "a PartitionedBlock's shards are initialised when it is made: pass init= to "
            "tofu_mx.gluon.partition (or load values with pnet.load_parameters(path))")

    def save_parameters(self, filename: str, deduplicate: bool = False) -> None:
        """:meth:`export_parameters`: the file ``block.save_parameters`` writes."""
        self.export_parameters(filename)

    def export_parameters(self, path: str) -> None:
        """Write every parameter and auxiliary state, whole, under the block's structural
        names: ``block.load_parameters(path)`` reads it (as ``block.save_parameters`` wrote
        it), at any device count. The file is written atomically. With ``replicas=``, the
        first group's (the groups' parameters are equal; their moving statistics not)."""
        path = check_writable(path, "the parameter file")
        self._settle()
        wholes = self.partitioned.merge_arrays(self._arrays[0], ("param", "aux"))
        blob = {}
        for key, name in self.structural_names().items():
            if name in wholes:
                blob[key] = mx.nd.array(wholes[name], dtype=wholes[name].dtype)
            else:   # a parameter the graph does not read: the block's own value, if any
                p = self._params_by_name[name]
                if p._data is not None:
                    blob[key] = p.data(p.list_ctx()[0]).copyto(mx.cpu())
        atomic_write(path, lambda tmp: mx.nd.save(tmp, blob))

    def load_parameters(self, path: str) -> None:
        """Read a file written by :meth:`export_parameters` or ``block.save_parameters``
        (structural names, whole arrays) into the shards. Nothing changes if it does not fit
        (:class:`tofu_mx.CheckpointError`)."""
        hint = (f"give a file saved from {self.source.name} (block.save_parameters or "
                f"PartitionedBlock.export_parameters)")
        path = arguments.input_file(path, "the parameter file", error=CheckpointError)
        try:
            blob = mx.nd.load(path)
        except mx.base.MXNetError as e:
            raise CheckpointError(f"cannot read {path!r} as a Gluon .params file: "
                                  f"{mxnet_message(e)}; {hint}") from None
        if not isinstance(blob, dict):
            raise CheckpointError(f"{path!r} holds an unnamed list of {len(blob)} arrays, not "
                                  f"a Gluon parameter file (arrays by name); {hint}")
        names = self.structural_names()
        # a parameter shared by several blocks has several structural names; Gluon's
        # save_parameters (deduplicate=True) writes it under one of them
        keys_of: dict[str, list[str]] = {}
        for key, name in names.items():
            if name in self._shards_of:
                keys_of.setdefault(name, []).append(key)
        found = {name: [k for k in keys if k in blob] for name, keys in keys_of.items()}
        missing = sorted(keys[0] for name, keys in keys_of.items() if not found[name])
        extra = sorted(set(blob) - set(names))
        wrong = [f"{k} {blob[k].shape} (needs {self.partitioned.graph.node(n).outputs[0].shape})"
                 for n, ks in found.items() for k in ks
                 if blob[k].shape != self.partitioned.graph.node(n).outputs[0].shape]
        if missing or extra or wrong:
            raise CheckpointError(
                f"{path!r} does not fit {self.source.name}: missing {missing[:5]}, unknown "
                f"{extra[:5]}, wrong shape {wrong[:5]}. {hint[0].upper()}{hint[1:]}.")
        self._write({name: blob[ks[0]].asnumpy() for name, ks in found.items()})

    # --- running ---------------------------------------------------------------------------
    def _check_inputs(self, arrays: Sequence[Any]) -> list[mx.nd.NDArray | np.ndarray]:
        """The inputs (data..., label), each an NDArray or a NumPy array of the shape the
        block was partitioned for; nothing is written."""
        names = self.data_names + ([self.label_name] if self.label_name else [])
        if len(arrays) != len(names):
            call = f"pnet.step({', '.join(names)})" if self.label_name else \
                f"pnet({', '.join(names)})"
            raise InvalidArgumentError(
                f"{self.name} takes {len(names)} array{'s' * (len(names) > 1)} "
                f"({', '.join(names)}), got "
                f"{len(arrays)}; call {call}"
                + ("" if self.label_name else " (it was partitioned without a loss: apply "
                   "the loss to its outputs)"))
        graph = self.partitioned.graph
        checked = []
        for name, array in zip(names, arrays):
            if not isinstance(array, mx.nd.NDArray):    # NumPy, a list; not str, None
                array = arguments.numeric_array(array, name)
            want = graph.node(name).outputs[0].shape
            want = (want[0] * len(self.replicas),) + want[1:]     # every group's rows
            if tuple(array.shape) != want:
                raise InvalidArgumentError(
                    f"{name} has shape {tuple(array.shape)}, the block was partitioned for "
                    f"{want}: the partition is for one batch shape. Partition again for this "
                    f"shape, or drop (or pad) the last incomplete batch.")
            checked.append(array)
        return checked

    def _set_inputs(self, arrays: Sequence[Any]) -> None:
        """Check every input, then write them all into their shards (each group's its rows
        of the batch)."""
        checked = self._check_inputs(arrays)
        names = self.data_names + ([self.label_name] if self.label_name else [])
        self._settle()
        for name, array in zip(names, checked):
            rows = array.shape[0] // len(self.replicas)
            for g, arrays in enumerate(self._arrays):
                mine = array[g * rows:(g + 1) * rows] if len(self.replicas) > 1 else array
                for s in self._shards_of[name]:
                    part = mine[s.slices]
                    if isinstance(part, mx.nd.NDArray):
                        part.copyto(arrays[s.name])
                    else:
                        arrays[s.name][:] = np.asarray(part)

    def _outputs(self) -> list[mx.nd.NDArray]:
        """The outputs, joined from their pieces, each group's along the batch, on the
        first device."""
        ctx = self.contexts[0]
        joined = [r.join_outputs(e.outputs, ctx) for r, e in zip(self.replicas, self._exes)]
        if len(joined) == 1:
            return joined[0]
        return [mx.nd.concat(*parts, dim=0) for parts in zip(*joined)]

    def step(self, *arrays) -> mx.nd.NDArray:
        """Forward and backward once (training mode) with head gradients of 1; returns the
        outputs (the per-sample losses with a loss block)."""
        self._set_inputs(arrays)
        self._recorded = False
        for exe in self._exes:      # queued in MXNet's engine: the groups run side by side
            exe.forward(is_train=True)
            exe.backward(out_grads=[mx.nd.ones(o.shape, ctx=o.context, dtype=o.dtype)
                                    for o in exe.outputs])
        self._fresh = True
        outs = self._outputs()
        return outs[0] if len(outs) == 1 else outs

    def _settle(self) -> None:
        """Wait for MXNet's engine, then run the backward pass ``loss.backward()`` left
        pending. Autograd calls :meth:`_Run.backward` on MXNet's custom-function thread, at
        some moment after ``loss.backward()`` returns; the executors are not entered from
        there while this thread may use MXNet too (seen: "Cannot find attribute shape in
        the graph", and hangs, with every engine thread idle and a value never written).
        That thread only keeps the head gradients; the executors' backward runs here, on the
        caller's thread, at the block's next use (a call, ``step``, ``zero_grad``, the
        Trainer's ``step``, reading gradients or parameters)."""
        mx.nd.waitall()
        pending, self._pending = self._pending, None
        if pending is not None:
            for r, exe, heads in zip(self.replicas, self._exes, pending):
                exe.backward(out_grads=r.head_gradients(heads))

    def zero_grad(self) -> None:
        """Set every shard's gradient to zero (``Parameter.zero_grad``): with
        ``grad_req='add'`` gradients are summed over backward passes until then."""
        self._settle()
        for exe in self._exes:
            for grad in exe.grad_dict.values():
                if grad is not None:
                    grad[:] = 0

    def forward(self, *arrays):
        if autograd.is_recording():
            self._settle()
            if self._recorded:
                raise InvalidArgumentError(
                    f"{self!r} was called again inside autograd.record() before the first "
                    f"call's backward pass: it runs one executor, whose state the second call "
                    f"would replace. Call loss.backward() after each call (with grad_req="
                    f"'add' on the parameters to sum the micro-batches' gradients), or call "
                    f"it once on the joined batch (a call whose result needs no backward pass "
                    f"belongs outside autograd.record())")
            # autograd records an operation only when some input is in its graph; the
            # inputs need no gradient, so a one-element anchor that has one stands in
            checked = self._check_inputs(arrays)
            return _Run(self)(self._anchor, *[
                a if isinstance(a, mx.nd.NDArray) else
                mx.nd.array(a, ctx=self._anchor.context, dtype=a.dtype) for a in checked])
        self._set_inputs(arrays)
        self._recorded = False      # the executor's state is this call's now
        for exe in self._exes:
            exe.forward(is_train=autograd.is_training())
        outs = self._outputs()
        return outs[0] if len(outs) == 1 else outs

    # --- reports ---------------------------------------------------------------------------
    def memory_per_device(self, optimizer_bytes: Sequence[int] | None = None
                          ) -> list[DeviceMemory]:
        """:meth:`PartitionedSymbol.memory_per_device`, with the optimizer state each device
        holds (``optimizer_bytes``; a :class:`~tofu_mx.gluon.Trainer` fills it in)."""
        rows = [dataclasses.replace(m, device=str(c)) for r in self.replicas
                for m, c in zip(r.memory_per_device(), r.contexts)]
        if optimizer_bytes is None:
            return rows
        if isinstance(optimizer_bytes, str) or not isinstance(optimizer_bytes, Sequence) or \
                len(optimizer_bytes) != len(rows):
            raise InvalidArgumentError(f"optimizer_bytes must list the bytes of optimizer state "
                                       f"on each of the {len(rows)} devices, got "
                                       f"{show(optimizer_bytes)}; e.g. "
                                       f"trainer.state_bytes_per_device()")
        optimizer_bytes = [arguments.count(b, f"optimizer_bytes[{d}]", minimum=0)
                           for d, b in enumerate(optimizer_bytes)]
        return [dataclasses.replace(m, optimizer=int(b)) for m, b in zip(rows, optimizer_bytes)]

    def bytes_per_device(self) -> list[dict[str, int]]:
        """Bytes of the arrays bound on each device, by role (parameters, gradients,
        aux states, inputs), read off the executor's arrays themselves."""
        rows = [dict(weights=0, gradients=0, aux=0, inputs=0) for _ in self.contexts]
        index = {c: i for i, c in enumerate(self.contexts)}
        for exe, arrays in zip(self._exes, self._arrays):
            for s in self.partitioned.shards:
                array = arrays[s.name]
                size = int(np.prod(array.shape)) * np.dtype(array.dtype).itemsize
                key = {"param": "weights", "aux": "aux"}.get(s.kind, "inputs")
                rows[index[array.context]][key] += size
                grad = exe.grad_dict.get(s.name)
                if grad is not None:
                    rows[index[grad.context]]["gradients"] += size
        return rows

    def report(self, max_rows: int = 20) -> str:
        """The partition's :meth:`~PartitionedSymbol.report`; with ``replicas=``, the groups
        first, and with ``replicas='auto'`` what ``machine=`` weighed over all the
        devices."""
        lines = []
        if len(self.replicas) > 1:
            batch = self.partitioned.graph.node(self.data_names[0]).outputs[0].shape[0]
            lines.append(f"data parallel across {len(self.replicas)} groups of "
                         f"{len(self.partitioned.contexts)} devices "
                         f"({'; '.join(', '.join(map(str, r.contexts)) for r in self.replicas)})"
                         f", each running the partition below on {batch} samples of the batch")
        lines.append(self.partitioned.report(max_rows))
        if self.machine_choice is not None and \
                self.machine_choice is not self.partitioned.machine_choice:
            lines.append(f"over all {len(self.contexts)} devices:")
            lines.extend(self.machine_choice.lines())
        return "\n".join(lines)

    def __repr__(self) -> str:
        groups = f" in {len(self.replicas)} data-parallel groups" if len(self.replicas) > 1 \
            else ""
        return (f"PartitionedBlock({self.source.name} over {len(self.contexts)} "
                f"devices{groups}, {len(self._shards_of)} variables)")


def _grad_req(p: gluon.Parameter) -> str:
    """The parameter's own request: ``write``, ``add`` (gradients summed over backward
    passes until :meth:`PartitionedBlock.zero_grad`) or ``null`` (frozen)."""
    return p.grad_req


class _Run(autograd.Function):
    """The partitioned executor as one autograd operation: forward runs it, backward runs
    its backward pass with the head gradients autograd hands over."""

    def __init__(self, block: PartitionedBlock):
        super().__init__()
        self.block = block

    def forward(self, anchor, *arrays):
        self.block._set_inputs(arrays)
        self.shapes = [(a.shape, a.context, a.dtype) for a in (anchor, *arrays)]
        for exe in self.block._exes:
            exe.forward(is_train=autograd.is_training())
        self.block._recorded = True
        outs = self.block._outputs()
        return outs[0] if len(outs) == 1 else tuple(outs)

    def backward(self, *head_grads):
        # on MXNet's custom-function thread: the head gradients are copied (autograd owns
        # theirs) and the backward pass left to the block's next use (PartitionedBlock._settle)
        block = self.block
        pending = []
        for g, r in enumerate(block.replicas):
            rows = [t.shape[0] for t in r.graph.output_infos]       # each group its rows
            pending.append([(h[g * n:(g + 1) * n] if len(block.replicas) > 1 else h).copy()
                            for h, n in zip(head_grads, rows)])
        block._pending = pending
        block._fresh = True
        block._recorded = False
        # the anchor and the inputs (data, labels) get no gradient
        return tuple(mx.nd.zeros(shape, ctx=ctx, dtype=dtype) for shape, ctx, dtype in self.shapes)


__all__ = ["PartitionedBlock", "partition", "trace"]
