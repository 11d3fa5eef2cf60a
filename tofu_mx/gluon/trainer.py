"""A Gluon-style trainer for a :class:`~tofu_mx.gluon.PartitionedBlock`: each device updates
only its own parameter shards, and each shard's optimizer state lives with it.

Any ``mx.optimizer`` works (by name or instance, with its ``lr_scheduler``): every shard is
one index of the optimizer, whose ``param_dict`` maps it to its Gluon ``Parameter`` so
``lr_mult`` and ``wd_mult`` apply as in ``gluon.Trainer``. The update is local
(``update_on_kvstore=False``): no whole gradient anywhere.

Several workers (``kvstore="dist_sync"`` or ``"horovod"``, see
:mod:`tofu_mx.gluon.distributed`) train data-parallel: each shard's gradient is summed over
the workers as its own key, then each worker updates its shards locally. As in Gluon,
``step(batch_size)`` divides the summed gradient by ``batch_size``: pass the batch of all
workers together for the update one process would make on that whole batch.

A block made with ``replicas=`` (data parallel across groups of devices, Tofu inside each)
keeps a copy of every shard in each group: each shard's gradient is summed over the groups
(queued behind the backward pass, as above; with several workers, then over the workers),
then every group applies the same update to its copy, with its own optimizer state. A sum
is reduced on one group's copy and copied back to the others, the groups taking turns over
the shards: each device exchanges with its peers, never through one device. (MXNet's
``device`` kvstore would reduce every key on the devices of its first key: all shards
through two GPUs, whose merge buffers would hold them.)

``save_states`` writes the file ``gluon.Trainer.save_states`` writes for the unpartitioned
block (states whole, keyed by the parameter's index in ``sorted(block.collect_params())``, as
``gluon.Trainer`` numbers them), so it
loads into a plain ``gluon.Trainer`` or into a Trainer at any other device count.
"""
from __future__ import annotations

import copy
import inspect
import pickle
from typing import Any, Mapping

import mxnet as mx
import numpy as np

from tofu_mx import arguments
from tofu_mx.errors import CheckpointError, InvalidArgumentError
from tofu_mx.files import atomic_write_bytes, check_writable
from tofu_mx.gluon import distributed
from tofu_mx.gluon.block import PartitionedBlock


class Trainer:
    """``gluon.Trainer`` for a partitioned block: ``Trainer(pnet, "sgd", {"learning_rate":
    0.1, "momentum": 0.9})``, then ``trainer.step(batch_size)`` after each backward pass.

    ``kvstore``: None (or ``"local"``, ``"device"``) for one process; ``"dist_sync"`` (or a
    ``dist_sync`` ``mx.kv.KVStore``, or what :func:`tofu_mx.gluon.distributed.connect`
    returns) or ``"horovod"`` for data parallelism across workers
    that each partitioned the block alike (checked here, on every worker). Every worker then
    starts from worker 0's parameter values. The KVStore's keys 0, 1, 2, ... are the
    Trainer's. With float64 parameters, ``dist_sync``'s servers are checked to keep float64
    (MXNet 1.9.1's may not: :meth:`~tofu_mx.gluon.distributed.Collective.check_float64`)."""

    def __init__(self, block: PartitionedBlock, optimizer: Any = "sgd",
                 optimizer_params: Mapping[str, Any] | None = None, kvstore: Any = None):
        if not isinstance(block, PartitionedBlock):
            raise InvalidArgumentError(
                f"tofu_mx.gluon.Trainer takes the block tofu_mx.gluon.partition returns, got "
                f"{type(block).__name__}; for an unpartitioned block use gluon.Trainer")
        self.block = block
        param_shards = block.shard_arrays(("param",))
        #: each group's (VarShard, weight, gradient) of the shards updated, alike in order;
        #: the optimizer's index of group g's i-th is g * len(self._shards) + i
        self._copies = [[(s, w, g) for s, w, g in block.shard_arrays(("param",), r)
                         if g is not None] for r in range(len(block.replicas))]
        self._shards = self._copies[0]
        # gluon.Trainer(block.collect_params()) numbers the parameters in sorted key order
        params = block.source.collect_params()
        self._param_index = {params[key].name: i for i, key in enumerate(sorted(params.keys()))}
        param_dict = {i: block._params_by_name[s.source] for i, (s, _, _) in
                      enumerate(self._updated())}
        if isinstance(optimizer, mx.optimizer.Optimizer):
            if optimizer_params is not None and (not isinstance(optimizer_params, Mapping)
                                                 or optimizer_params):
                raise InvalidArgumentError(
                    f"optimizer_params must be None when optimizer is an Optimizer instance, "
                    f"got {optimizer_params!r}; set them on the instance "
                    f"(mx.optimizer.{type(optimizer).__name__}(learning_rate=...))")
            optimizer.param_dict = param_dict
            self._optimizer = optimizer
        else:
            self._optimizer = _create_optimizer(optimizer, optimizer_params, param_dict)
        self._scale = self._optimizer.rescale_grad
        self._updater = mx.optimizer.get_updater(self._optimizer)
        # every shard's state now, on the shard's device: memory_per_device counts it
        for i, (_, w, _) in enumerate(self._updated()):
            self._updater.states[i] = self._optimizer.create_state_multi_precision(i, w)
            self._updater.states_synced[i] = True
        self._by_device: dict[Any, list[int]] = {}
        for i, (_, w, _) in enumerate(self._updated()):
            self._by_device.setdefault(w.context, []).append(i)
        # where each shard's gradient is summed over the groups: group i % G's copy of
        # shard i (the first group's gradients without replicas)
        groups = len(self._copies)
        self._summed = [self._copies[i % groups][i][2] for i in range(len(self._shards))]
        # with replicas: per (device, dtype), a buffer as large as the largest gradient
        # shard the device sums, which its peers' copies are received in
        sizes: dict[tuple[Any, str], int] = {}
        for total in self._summed if groups > 1 else ():
            key = (total.context, np.dtype(total.dtype).name)
            sizes[key] = max(sizes.get(key, 0), total.size)
        self._received = {key: mx.nd.empty((n,), ctx=key[0], dtype=key[1])
                          for key, n in sizes.items()}
        # last: the other workers wait for this one from here on
        self._collective = distributed.connect(kvstore)
        if self._collective is not None:
            distributed.claim(self._collective)
            distributed.check_same_plan(self._collective,
                                        distributed.plan_fingerprint(block.partitioned))
            if any(w.dtype == np.float64 for _, w, _ in param_shards):
                self._collective.check_float64()
            keys = {s.name: distributed.SHARD_KEYS + i
                    for i, (s, _, _) in enumerate(param_shards)}
            self._collective.broadcast([keys[s.name] for s, _, _ in param_shards],
                                       [w for _, w, _ in param_shards])
            for g in range(1, len(block.replicas)):     # worker 0's values in every group
                for (_, first, _), (_, mine, _) in zip(param_shards,
                                                       block.shard_arrays(("param",), g)):
                    first.copyto(mine)
            self._keys = [keys[s.name] for s, _, _ in self._shards]

    @property
    def optimizer(self) -> mx.optimizer.Optimizer:
        return self._optimizer

    @property
    def rank(self) -> int:
        """This worker's number, 0 to ``num_workers - 1`` (0 in a run of one process)."""
        return self._collective.rank if self._collective is not None else 0

    @property
    def num_workers(self) -> int:
        """How many workers train together (1 without a distributed ``kvstore``)."""
        return self._collective.num_workers if self._collective is not None else 1

    def all_gather(self, value: float) -> list[float]:
        """Every worker's ``value`` (a number, e.g. its mean loss), by rank: ``[value]`` in a
        run of one process. Every worker must call it."""
        if not arguments.is_real(value):    # NaN and infinities pass: a diverging loss
            raise InvalidArgumentError(f"all_gather takes a number, got {type(value).__name__} "
                                       f"{arguments.show(value)}; e.g. "
                                       f"trainer.all_gather(float(loss.mean().asscalar()))")
        value = float(value)
        if self._collective is None:
            return [value]
        return distributed.all_gather(self._collective, value)

    @property
    def kvstore(self) -> mx.kv.KVStore | None:
        """The distributed KVStore the gradients are summed through (None otherwise)."""
        return self._collective.kvstore if self._collective is not None else None

    @property
    def learning_rate(self) -> float:
        opt = self._optimizer
        return opt.lr_scheduler(opt.num_update) if opt.lr_scheduler is not None else opt.lr

    def set_learning_rate(self, lr: float) -> None:
        lr = arguments.real(lr, "lr", minimum=0, strict=True, example="0.01")
        if self._optimizer.lr_scheduler is not None:
            raise InvalidArgumentError(
                f"the optimizer has an lr_scheduler ({type(self._optimizer.lr_scheduler).__name__}"
                f"), which sets the learning rate each step; set its base_lr instead, or create "
                f"the optimizer without one")
        self._optimizer.set_learning_rate(lr)

    def step(self, batch_size: int, ignore_stale_grad: bool = False) -> None:
        """One update of every shard with its gradient scaled by ``1 / batch_size``, as
        ``gluon.Trainer.step``; with several workers, the gradient summed over them first
        (every worker must call it, with the same ``batch_size``).

        It does not wait for the backward pass: the sums across workers and the updates are
        queued in MXNet's engine behind the gradients they read, so each gradient is sent
        as soon as the backward pass has made it, while the rest of the pass runs. Only a
        backward pass that autograd started (``loss.backward()``) and that has not reached
        the executor yet is waited for (it runs on one of MXNet's engine threads: the
        executor is not entered before it is done)."""
        batch_size = arguments.count(batch_size, "batch_size", example="trainer.step(x.shape[0])")
        ignore_stale_grad = arguments.flag(ignore_stale_grad, "ignore_stale_grad")
        if self.block._recorded or not self.block._fresh or self.block._pending is not None:
            self.block._settle()
        if not self.block._fresh:
            if ignore_stale_grad:       # as gluon.Trainer: a stale gradient is not applied
                return
            raise InvalidArgumentError(
                "the gradients have not been computed since the last step: call "
                "pnet.step(x, y), or loss.backward() after pnet(x, y) under autograd.record(), "
                "before trainer.step (or pass ignore_stale_grad=True)")
        self._sum_over_groups()
        if self._collective is not None:
            self._collective.all_reduce(self._keys, self._summed)
        self._share_over_groups()
        self._optimizer.rescale_grad = self._scale / batch_size
        updated = self._updated()
        for ctx, indices in self._by_device.items():
            self._updater(list(indices), [updated[i][2] for i in indices],
                          [updated[i][1] for i in indices])
        self.block._fresh = False

    def _sum_over_groups(self) -> None:
        """Each shard's gradient summed over the groups (with ``replicas=``), in place in
        its copy of :attr:`_summed` (each peer's copied into that device's receiving buffer
        first). Engine operations, each queued behind the gradients it reads; last shards
        first, as the backward pass makes them (one receiving buffer per device orders its
        reductions)."""
        groups = len(self._copies)
        for i in reversed(range(len(self._shards) if groups > 1 else 0)):
            total = self._summed[i]
            buffer = self._received[(total.context, np.dtype(total.dtype).name)]
            received = buffer[:total.size].reshape(total.shape)
            for g, shards in enumerate(self._copies):
                if g != i % groups:
                    shards[i][2].copyto(received)
                    total += received

    def _share_over_groups(self) -> None:
        """Each shard's summed gradient copied to the other groups' copies of the shard."""
        groups = len(self._copies)
        for i in reversed(range(len(self._shards) if groups > 1 else 0)):
            for g, shards in enumerate(self._copies):
                if g != i % groups:
                    self._summed[i].copyto(shards[i][2])

    def _updated(self) -> list[tuple[Any, mx.nd.NDArray, mx.nd.NDArray]]:
        """Every group's shards updated, by the optimizer's index."""
        return [shard for shards in self._copies for shard in shards]

    # --- memory ----------------------------------------------------------------------------
    def state_bytes_per_device(self) -> list[int]:
        """Bytes of optimizer state each device holds, and with ``replicas=`` the buffer
        it receives its peers' gradient shards in."""
        contexts = self.block.contexts
        index = {c: i for i, c in enumerate(contexts)}
        out = [0] * len(contexts)
        for state in self._updater.states.values():
            for a in _leaves(state):
                out[index[a.context]] += int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
        for a in self._received.values():
            out[index[a.context]] += a.size * np.dtype(a.dtype).itemsize
        return out

    def memory_per_device(self):
        """The block's :meth:`~PartitionedBlock.memory_per_device` with this trainer's
        optimizer state counted."""
        return self.block.memory_per_device(self.state_bytes_per_device())

    # --- states ----------------------------------------------------------------------------
    def save_states(self, path: str) -> None:
        """Write the optimizer and its states, whole, as ``gluon.Trainer.save_states`` does for
        the unpartitioned block (atomically)."""
        path = check_writable(path, "the trainer states file")
        self.block._settle()
        groups: dict[int, list[int]] = {}
        for i, (s, _, _) in enumerate(self._shards):
            groups.setdefault(self._param_index[s.source], []).append(i)
        states = {g: self._merge(members) for g, members in groups.items()}
        opt = copy.copy(self._optimizer)
        counts = {}
        for table in self._optimizer._all_index_update_counts.values():
            for i, n in table.items():
                if i < len(self._shards):       # the groups' copies are counted alike
                    counts[self._param_index[self._shards[i][0].source]] = n
        opt._all_index_update_counts = {0: counts}
        opt._index_update_count = counts
        opt.param_dict = {}
        opt.rescale_grad = self._scale
        atomic_write_bytes(path, pickle.dumps((states, opt)))

    def load_states(self, path: str) -> None:
        """Read a file written by :meth:`save_states` or ``gluon.Trainer.save_states`` (of the
        unpartitioned block, at any device count) into the shards' states. Nothing changes if
        it does not fit (:class:`tofu_mx.CheckpointError`)."""
        states, opt = self._read_states(path)
        new_states = {i: self._split(states[self._param_index[s.source]], s, w)
                      for i, (s, w, _) in enumerate(self._updated())}
        if opt is not None:
            opt = self._adopt(opt)
            self._optimizer = opt
            self._updater.optimizer = opt
        self._updater.states = new_states
        self._updater.states_synced = dict.fromkeys(new_states, True)

    def _read_states(self, path: Any) -> tuple[dict, mx.optimizer.Optimizer | None]:
        """The whole states (by parameter index) and optimizer a states file holds, checked
        against this trainer's parameters: one state per updated parameter, each array of
        its parameter's shape."""
        hint = ("give a file written by tofu_mx.gluon.Trainer.save_states or "
                "gluon.Trainer.save_states for this block")
        path = arguments.input_file(path, "the trainer states file", error=CheckpointError)
        try:
            with open(path, "rb") as f:
                loaded = pickle.loads(f.read())
        except Exception as e:  # noqa: BLE001  (pickle fails in many ways on a foreign file)
            raise CheckpointError(f"cannot read trainer states from {path!r}: "
                                  f"{type(e).__name__}: {e}; {hint}") from None
        states, opt = loaded if isinstance(loaded, tuple) and len(loaded) == 2 else (loaded,
                                                                                     None)
        if not isinstance(states, dict) or not all(
                isinstance(k, int) and not isinstance(k, bool) for k in states):
            raise CheckpointError(f"{path!r} holds a {type(loaded).__name__}, not trainer states "
                                  f"(a dict of optimizer states by parameter index); {hint}")
        if opt is not None and not isinstance(opt, mx.optimizer.Optimizer):
            raise CheckpointError(f"{path!r} holds a {type(opt).__name__} where the optimizer "
                                  f"belongs; {hint}")
        by_index = {i: name for name, i in self._param_index.items()}
        unknown = sorted(k for k in states if k not in by_index)
        if unknown:
            raise CheckpointError(f"{path!r} has states for parameter indices {unknown[:5]}, "
                                  f"but {self.block.source.name} has {len(by_index)} parameters; "
                                  f"{hint}")
        for i, (s, _, _) in enumerate(self._shards):
            g = self._param_index[s.source]
            if g not in states:
                raise CheckpointError(
                    f"{path!r} has no optimizer state for {s.source!r} (index {g}); it was "
                    f"saved for another block or optimizer; {hint}")
            ours = _layout(self._updater.states[i])
            if opt is None and _layout(states[g]) != ours:
                raise CheckpointError(
                    f"{path!r} holds no optimizer, and its state for {s.source!r} (index {g}) "
                    f"is laid out as {_layout(states[g])}, not as this trainer's "
                    f"{type(self._optimizer).__name__} keeps it ({ours}); create the Trainer "
                    f"with the optimizer the states were saved with")
            whole = tuple(self.block.partitioned.graph.node(s.source).outputs[0].shape)
            for leaf in _leaves(states[g]):
                if tuple(leaf.shape) != whole:
                    raise CheckpointError(
                        f"{path!r} holds an optimizer state of shape {tuple(leaf.shape)} for "
                        f"parameter {s.source!r} (index {g}), whose shape is {whole}: the states "
                        f"must have the shapes of the parameters they belong to (was the file "
                        f"saved for another net?); {hint}")
        return states, opt

    def _adopt(self, opt: mx.optimizer.Optimizer) -> mx.optimizer.Optimizer:
        """A copy of the file's optimizer, its update counts numbered by shard."""
        counts = dict(getattr(opt, "_index_update_count", None) or {})
        for table in (getattr(opt, "_all_index_update_counts", None) or {}).values():
            counts.update(table)
        opt = copy.copy(opt)
        # the Updater keeps one count table per device id (Optimizer._set_current_context);
        # shard indices are unique, so every device shares one table
        table = {i: counts[self._param_index[s.source]]
                 for i, (s, _, _) in enumerate(self._updated())
                 if self._param_index[s.source] in counts}
        opt._all_index_update_counts = {c.device_id: table for c in self._by_device}
        opt._all_index_update_counts.setdefault(0, table)
        opt._index_update_count = table
        opt.param_dict = self._optimizer.param_dict
        # rescale_grad in the file is the last step's 1/batch_size: step() sets it anew
        return opt

    def _merge(self, members: list[int]):
        """The shards' states of one parameter -> its whole state (NumPy-backed, on cpu)."""
        first = self._shards[members[0]]
        whole_shape = self.block.partitioned.graph.node(first[0].source).outputs[0].shape

        def merge(parts):
            head = parts[0][1]
            if head is None:
                return None
            if isinstance(head, (tuple, list)):
                merged = [merge([(s, h[j]) for s, h in parts]) for j in range(len(head))]
                return type(head)(merged)
            if isinstance(head, mx.nd.NDArray):
                if tuple(head.shape) != first[0].shape:
                    return head.copyto(mx.cpu())
                out = np.zeros(whole_shape, dtype=head.dtype)
                for s, h in parts:
                    s.put(out, h.asnumpy())
                return mx.nd.array(out, ctx=mx.cpu(), dtype=out.dtype)
            return head
        return merge([(self._shards[i][0], self._updater.states[i]) for i in members])

    def _split(self, state, shard, weight):
        """A parameter's whole state (shapes checked by _read_states) -> the shard's."""
        if isinstance(state, (tuple, list)):
            return type(state)(self._split(x, shard, weight) for x in state)
        if isinstance(state, mx.nd.NDArray):
            if not state.ndim:
                return state.as_in_context(weight.context)
            if shard.layout is None:
                return state[shard.slices].as_in_context(weight.context)
            return mx.nd.array(shard.take(state.asnumpy()), ctx=weight.context,
                               dtype=state.dtype)
        return state


_SET_BY_TRAINER = ("param_dict", "param_idx2name")
_NUMERIC_PARAMS = ("learning_rate", "wd", "momentum", "clip_gradient", "rescale_grad", "beta1",
                   "beta2", "epsilon", "gamma1", "gamma2", "rho", "lamda1", "lower_bound",
                   "upper_bound", "eta", "eps", "centered_epsilon")


def _create_optimizer(name: Any, params: Any, param_dict: dict) -> mx.optimizer.Optimizer:
    """``mx.optimizer.create(name, **params)``, its name and parameters checked first."""
    registry = mx.optimizer.Optimizer.opt_registry
    known = ", ".join(n for n in sorted(registry) if n != "test")
    if not isinstance(name, str):
        raise InvalidArgumentError(f"optimizer must be a name ('sgd', 'adam', ...) or an "
                                   f"mx.optimizer.Optimizer, got {type(name).__name__} "
                                   f"{name!r}; use one of {known}")
    if name.lower() not in registry:
        raise InvalidArgumentError(f"unknown optimizer {name!r}; use one of {known} (the names "
                                   f"in mx.optimizer.Optimizer.opt_registry)")
    params = dict(arguments.mapping(params, "optimizer_params",
                                    "{'learning_rate': 0.1, 'momentum': 0.9}"))
    cls = registry[name.lower()]
    accepted = _keywords(cls)
    if accepted is not None:
        accepted = {k: v for k, v in accepted.items() if k not in _SET_BY_TRAINER}
    for key, value in params.items():
        if key in _SET_BY_TRAINER:
            raise InvalidArgumentError(f"optimizer_params must not set {key}: the Trainer "
                                       f"maps the shards to the block's Parameters itself; "
                                       f"remove it")
        if accepted is not None and key not in accepted:
            raise InvalidArgumentError(
                f"optimizer {name!r} takes no parameter {key!r}; use one of "
                f"{', '.join(sorted(accepted))}")
        numeric = key in _NUMERIC_PARAMS or (accepted is not None and
                                             _is_number(accepted.get(key)))
        if value is None or not numeric:    # None: the optimizer's default
            continue
        arguments.real(value, f"optimizer_params[{key!r}]",
                       minimum=0 if key == "learning_rate" else None,
                       strict=key == "learning_rate", example=f"{{{key!r}: 0.1}}")
    try:
        return mx.optimizer.create(name, param_dict=param_dict, **params)
    except Exception as e:  # noqa: BLE001  (an optimizer's own checks: asserts, ValueErrors)
        raise InvalidArgumentError(f"cannot create optimizer {name!r} with {params}: "
                                   f"{type(e).__name__}: {e}; check optimizer_params against "
                                   f"mx.optimizer.{cls.__name__}'s parameters") from None


def _keywords(cls: type) -> dict[str, Any] | None:
    """The keyword parameters ``cls(...)`` accepts -> their defaults, following ``**kwargs``
    up to ``Optimizer.__init__``; None where the chain ends in an open ``**kwargs``."""
    out: dict[str, Any] = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                out.setdefault(p.name, p.default)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return out
        if klass is mx.optimizer.Optimizer:
            return None
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _layout(state) -> Any:
    """A state's nesting, arrays as "array": what an optimizer's create_state fixes."""
    if isinstance(state, (tuple, list)):
        return tuple(_layout(x) for x in state)
    return "array" if isinstance(state, mx.nd.NDArray) else type(state).__name__


def _leaves(state):
    if isinstance(state, mx.nd.NDArray):
        yield state
    elif isinstance(state, (tuple, list)):
        for x in state:
            yield from _leaves(x)

