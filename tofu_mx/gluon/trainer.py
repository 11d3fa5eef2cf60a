"""A Gluon-style trainer for a :class:`~tofu_mx.gluon.PartitionedBlock`: each device updates
only its own parameter shards, and each shard's optimizer state lives with it.

Any ``mx.optimizer`` works (by name or instance, with its ``lr_scheduler``): every shard is
one index of the optimizer, whose ``param_dict`` maps it to its Gluon ``Parameter`` so
``lr_mult`` and ``wd_mult`` apply as in ``gluon.Trainer``. The update is local
(``update_on_kvstore=False``): no KVStore, no whole gradient anywhere.

``save_states`` writes the file ``gluon.Trainer.save_states`` writes for the unpartitioned
block (states whole, keyed by the parameter's index in ``sorted(block.collect_params())``, as
``gluon.Trainer`` numbers them), so it
loads into a plain ``gluon.Trainer`` or into a Trainer at any other device count.
"""
from __future__ import annotations

import copy
import pickle
from typing import Any, Mapping

import mxnet as mx
import numpy as np

from tofu_mx.errors import InvalidArgumentError
from tofu_mx.files import atomic_write_bytes
from tofu_mx.gluon.block import PartitionedBlock


class Trainer:
    """``gluon.Trainer`` for a partitioned block: ``Trainer(pnet, "sgd", {"learning_rate":
    0.1, "momentum": 0.9})``, then ``trainer.step(batch_size)`` after each backward pass."""

    def __init__(self, block: PartitionedBlock, optimizer: Any = "sgd",
                 optimizer_params: Mapping[str, Any] | None = None):
        if not isinstance(block, PartitionedBlock):
            raise InvalidArgumentError(
                f"tofu_mx.gluon.Trainer takes the block tofu_mx.gluon.partition returns, got "
                f"{type(block).__name__}; for an unpartitioned block use gluon.Trainer")
        self.block = block
        self._shards = [(s, w, g) for s, w, g in block.shard_arrays(("param",))
                        if g is not None]
        # gluon.Trainer(block.collect_params()) numbers the parameters in sorted key order
        params = block.source.collect_params()
        self._param_index = {params[key].name: i for i, key in enumerate(sorted(params.keys()))}
        param_dict = {i: block._params_by_name[s.source] for i, (s, _, _) in
                      enumerate(self._shards)}
        if isinstance(optimizer, mx.optimizer.Optimizer):
            if optimizer_params:
                raise InvalidArgumentError("optimizer_params must be None when optimizer is an "
                                           "Optimizer instance (set them on the instance)")
            optimizer.param_dict = param_dict
            self._optimizer = optimizer
        elif isinstance(optimizer, str):
            try:
                self._optimizer = mx.optimizer.create(optimizer, param_dict=param_dict,
                                                      **dict(optimizer_params or {}))
            except (ValueError, TypeError) as e:
                raise InvalidArgumentError(f"cannot create optimizer {optimizer!r} with "
                                           f"{dict(optimizer_params or {})}: {e}") from e
        else:
            raise InvalidArgumentError(f"optimizer must be a name ('sgd', 'adam', ...) or an "
                                       f"mx.optimizer.Optimizer, got {type(optimizer).__name__}")
        self._scale = self._optimizer.rescale_grad
        self._updater = mx.optimizer.get_updater(self._optimizer)
        # every shard's state now, on the shard's device: memory_per_device counts it
        for i, (_, w, _) in enumerate(self._shards):
            self._updater.states[i] = self._optimizer.create_state_multi_precision(i, w)
            self._updater.states_synced[i] = True
        self._by_device: dict[Any, list[int]] = {}
        for i, (_, w, _) in enumerate(self._shards):
            self._by_device.setdefault(w.context, []).append(i)

    @property
    def optimizer(self) -> mx.optimizer.Optimizer:
        return self._optimizer

    @property
    def learning_rate(self) -> float:
        opt = self._optimizer
        return opt.lr_scheduler(opt.num_update) if opt.lr_scheduler is not None else opt.lr

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)

    def step(self, batch_size: int, ignore_stale_grad: bool = False) -> None:
        """One update of every shard with its gradient scaled by ``1 / batch_size``, as
        ``gluon.Trainer.step``. Waits for the backward pass to finish first (needed when it
        ran through autograd: MXNet's threaded engine can otherwise hang)."""
        if not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise InvalidArgumentError(f"batch_size must be a positive integer, got "
                                       f"{batch_size!r}")
        mx.nd.waitall()
        if not self.block._fresh and not ignore_stale_grad:
            raise InvalidArgumentError(
                "the gradients have not been computed since the last step: call "
                "pnet.step(x, y), or loss.backward() after pnet(x, y) under autograd.record(), "
                "before trainer.step (or pass ignore_stale_grad=True)")
        self._optimizer.rescale_grad = self._scale / batch_size
        for ctx, indices in self._by_device.items():
            self._updater(list(indices), [self._shards[i][2] for i in indices],
                          [self._shards[i][1] for i in indices])
        self.block._fresh = False

    # --- memory ----------------------------------------------------------------------------
    def state_bytes_per_device(self) -> list[int]:
        """Bytes of optimizer state each device holds."""
        contexts = self.block.partitioned.contexts
        index = {c: i for i, c in enumerate(contexts)}
        out = [0] * len(contexts)
        for state in self._updater.states.values():
            for a in _leaves(state):
                out[index[a.context]] += int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
        return out

    def memory_per_device(self):
        """The block's :meth:`~PartitionedBlock.memory_per_device` with this trainer's
        optimizer state counted."""
        return self.block.memory_per_device(self.state_bytes_per_device())

    # --- states ----------------------------------------------------------------------------
    def save_states(self, path: str) -> None:
        """Write the optimizer and its states, whole, as ``gluon.Trainer.save_states`` does for
        the unpartitioned block (atomically)."""
        mx.nd.waitall()
        groups: dict[int, list[int]] = {}
        for i, (s, _, _) in enumerate(self._shards):
            groups.setdefault(self._param_index[s.source], []).append(i)
        states = {g: self._merge(members) for g, members in groups.items()}
        opt = copy.copy(self._optimizer)
        counts = {}
        for table in self._optimizer._all_index_update_counts.values():
            for i, n in table.items():
                counts[self._param_index[self._shards[i][0].source]] = n
        opt._all_index_update_counts = {0: counts}
        opt._index_update_count = counts
        opt.param_dict = {}
        opt.rescale_grad = self._scale
        atomic_write_bytes(path, pickle.dumps((states, opt)))

    def load_states(self, path: str) -> None:
        """Read a file written by :meth:`save_states` or ``gluon.Trainer.save_states`` (of the
        unpartitioned block, at any device count) into the shards' states."""
        try:
            with open(path, "rb") as f:
                loaded = pickle.loads(f.read())
        except (OSError, pickle.UnpicklingError, EOFError) as e:
            raise InvalidArgumentError(f"cannot read trainer states from {path!r}: {e}") from e
        if isinstance(loaded, tuple) and len(loaded) == 2:
            states, opt = loaded
        else:
            states, opt = loaded, None
        if not isinstance(states, dict):
            raise InvalidArgumentError(f"{path!r} holds no trainer states")
        new_states = {}
        for i, (s, w, _) in enumerate(self._shards):
            g = self._param_index[s.source]
            if g not in states:
                raise InvalidArgumentError(
                    f"{path!r} has no optimizer state for {s.source!r} (index {g}); it was saved "
                    f"for another block or optimizer")
            new_states[i] = self._split(states[g], s, w)
        if opt is not None:
            counts = dict(opt._index_update_count)
            for table in opt._all_index_update_counts.values():
                counts.update(table)
            opt = copy.copy(opt)
            # the Updater keeps one count table per device id (Optimizer._set_current_context);
            # shard indices are unique, so every device shares one table
            table = {i: counts[self._param_index[s.source]]
                     for i, (s, _, _) in enumerate(self._shards)
                     if self._param_index[s.source] in counts}
            opt._all_index_update_counts = {c.device_id: table for c in self._by_device}
            opt._all_index_update_counts.setdefault(0, table)
            opt._index_update_count = table
            opt.param_dict = self._optimizer.param_dict
            # rescale_grad in the file is the last step's 1/batch_size: step() sets it anew
            self._optimizer = opt
            self._updater.optimizer = opt
        self._updater.states = new_states
        self._updater.states_synced = dict.fromkeys(new_states, True)

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
                    out[s.slices] = h.asnumpy()
                return mx.nd.array(out, ctx=mx.cpu(), dtype=out.dtype)
            return head
        return merge([(self._shards[i][0], self._updater.states[i]) for i in members])

    def _split(self, state, shard, weight):
        whole = self.block.partitioned.graph.node(shard.source).outputs[0].shape
        if state is None:
            return None
        if isinstance(state, (tuple, list)):
            return type(state)(self._split(x, shard, weight) for x in state)
        if isinstance(state, mx.nd.NDArray):
            if tuple(state.shape) == tuple(whole):
                part = state[shard.slices] if len(whole) else state
                return part.as_in_context(weight.context).astype(state.dtype, copy=False)
            return state.as_in_context(weight.context)
        return state


def _leaves(state):
    if isinstance(state, mx.nd.NDArray):
        yield state
    elif isinstance(state, (tuple, list)):
        for x in state:
            yield from _leaves(x)

