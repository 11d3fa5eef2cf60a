"""Data parallelism across workers for :class:`tofu_mx.gluon.Trainer`.

Inside each worker (a process, typically one machine), Tofu splits the model over that
worker's devices. Across workers, the replicas train data-parallel: every worker holds the
same shards on its devices, and before each update every shard's gradient is summed over the
workers, shard by shard (each shard is its own key), by one of two maintained engines:

- MXNet's distributed KVStore (``kvstore="dist_sync"``, ps-lite's servers). Its servers only
  sum: each worker then updates its own shards with its own, sharded optimizer state, as
  ``gluon.Trainer(update_on_kvstore=False)`` does. The workers are started by
  ``python -m tofu_mx.launch`` on one machine, or by MXNet's ``tools/launch.py`` on a
  cluster (they set the ``DMLC_*`` variables).
- Horovod (``kvstore="horovod"``, where ``horovod.mxnet`` imports): an all-reduce among the
  workers ``horovodrun`` starts.

At start-up, the workers check that they partitioned the same way (a fingerprint of the
graph and of every shard: device, box, dtype) and take worker 0's parameter values, as
``gluon.Trainer`` broadcasts them. Auxiliary states (BatchNorm's moving statistics) stay
each worker's own, as in Gluon.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Sequence

import mxnet as mx
import numpy as np

from tofu_mx.arguments import show
from tofu_mx.errors import InvalidArgumentError, TofuError
from tofu_mx.launch import SERVER_TUNABLES
from tofu_mx.runtime.partitioned import PartitionedSymbol
from tofu_mx.search.plan import graph_fingerprint

#: the variables ps-lite reads; tofu_mx.launch and MXNet's tools/launch.py set them
DMLC_VARIABLES = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                  "DMLC_NUM_WORKER")
#: keys of the KVStore the Trainer uses: the plan's fingerprint, a number from each worker
#: (:func:`all_gather`), the servers' float64 probe, then one key per parameter shard from
#: SHARD_KEYS on
FINGERPRINT_KEY, GATHER_KEY, PROBE_KEY, SHARD_KEYS = 0, 1, 2, 3
#: what the float64 probe stores: not a float32 number
PROBE_VALUE = 1 / 3
_LAUNCH_HINT = ("start the workers with python -m tofu_mx.launch -n 2 -- python train.py ... "
                "on one machine, or MXNet's tools/launch.py on a cluster")


class Collective:
    """Sums and broadcasts among the workers of a distributed run (one of two engines)."""

    name: str
    rank: int
    num_workers: int
    kvstore: mx.kv.KVStore | None = None

    def broadcast(self, keys: Sequence[int], arrays: Sequence[mx.nd.NDArray]) -> None:
        """Worker 0's values of ``arrays`` into every worker's, in place."""
        raise NotImplementedError

    def all_reduce(self, keys: Sequence[int], arrays: Sequence[mx.nd.NDArray]) -> None:
        """Each array replaced by its sum over the workers, in place."""
        raise NotImplementedError

    def check_float64(self) -> None:
        """Raise :class:`tofu_mx.TofuError` on every worker unless float64 arrays are kept
        and summed in float64; every worker must call it. Nothing to check by default."""


class _KVStore(Collective):
    """MXNet's distributed KVStore: servers that sum what the workers push (no updater)."""

    def __init__(self, kv: mx.kv.KVStore):
        self.kvstore = kv
        self.name = kv.type
        self.rank = kv.rank
        self.num_workers = kv.num_workers
        self._known: set[int] = set()

    def _init(self, keys, arrays) -> None:
        new = [(k, a) for k, a in zip(keys, arrays) if k not in self._known]
        if new:     # dist_sync keeps worker 0's values, then waits for every worker
            self.kvstore.init([k for k, _ in new], [a for _, a in new])
            self._known.update(k for k, _ in new)

    def broadcast(self, keys, arrays) -> None:
        self._init(keys, arrays)
        self.kvstore.pull(list(keys), out=list(arrays))

    def all_reduce(self, keys, arrays) -> None:
        self._init(keys, arrays)
        # a server without an updater stores the sum of the round's pushes; pull returns it.
        # Later keys first, as gluon.Trainer orders them (priority -key).
        for k, a in zip(keys, arrays):
            self.kvstore.pushpull(k, a, out=a, priority=-k)

    def check_float64(self) -> None:
        # MXNet 1.9.1's server never initialises its multi_precision_ flag
        # (src/kvstore/kvstore_dist_server.h): where the heap left it nonzero, the server
        # keeps every non-float32 key in float32 (it stores worker 0's init so, sums so, and
        # hands back the float32 values cast up). Measured with glibc's malloc perturb byte:
        # zeroed memory gives float64, 0xfe float32. Each server process draws its own, so
        # the probe is split over all of them (see _probe_size).
        probe = mx.nd.array(np.full(_probe_size(), PROBE_VALUE), dtype="float64")
        self.broadcast([PROBE_KEY], [probe])
        got = probe.asnumpy()
        wrong = np.flatnonzero(got != PROBE_VALUE)
        if wrong.size:
            raise TofuError(
                f"the {self.name} servers would keep and sum this model's float64 parameters "
                f"in float32: worker 0 stored 1/3 and got back {float(got[wrong[0]])!r} "
                f"(float32's 1/3 is {float(np.float32(PROBE_VALUE))!r}) at {wrong.size} of "
                f"{got.size} places. MXNet 1.9.1's server leaves its multi_precision_ flag "
                f"uninitialised (src/kvstore/kvstore_dist_server.h), so each server process "
                f"sums float64 in float32 or float64 by chance. Start the servers with "
                f"python -m tofu_mx.launch (it hands them zeroed memory), or give them "
                f"GLIBC_TUNABLES={SERVER_TUNABLES} under another launcher; or train in "
                f"float32, or with kvstore='horovod'")


def _probe_size() -> int:
    """Elements of the float64 probe: 1 with one server; otherwise MXNet's 'big array'
    bound (MXNET_KVSTORE_BIGARRAY_BOUND, 1,000,000 unless set), from which an array is
    split over every server, so every server is probed (a bound above 4M elements is not
    followed: the probe then reaches one server)."""
    try:
        if int(os.environ.get("DMLC_NUM_SERVER", "0")) == 1:
            return 1
        bound = int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", "1000000"))
    except ValueError:
        bound = 1000 * 1000
    return bound if 1 <= bound <= 1 << 22 else 1


class _Horovod(Collective):
    """Horovod's all-reduce among the workers ``horovodrun`` starts."""

    def __init__(self, hvd):
        hvd.init()
        self._hvd = hvd
        self.name = "horovod"
        self.rank = hvd.rank()
        self.num_workers = hvd.size()

    def broadcast(self, keys, arrays) -> None:
        for k, a in zip(keys, arrays):
            self._hvd.broadcast_(a, root_rank=0, name=f"tofu_mx.{k}")

    def all_reduce(self, keys, arrays) -> None:
        for k, a in zip(keys, arrays):
            self._hvd.allreduce_(a, op=self._hvd.Sum, name=f"tofu_mx.{k}", priority=-k)


#: the engines a process has connected to, by name or KVStore: one each (a second
#: ``mx.kv.create("dist_sync")`` in a process hangs: measured, under tofu_mx.launch)
_CONNECTED: dict[Any, Collective] = {}
#: the engines (or KVStores) a Trainer uses: each serves one, whose keys 0, 1, 2, ... they are
_CLAIMED: list[Any] = []


def connect(kvstore: Any) -> Collective | None:
    """The engine ``kvstore`` names (``Trainer``'s argument), or None for a run of one
    worker: None, ``"local"`` and ``"device"`` (the shards are on their devices already).
    A script that needs its rank before it partitions (to pick its rows of the batch) calls
    it first and gives the result to the Trainer. Connecting again to the same name or
    KVStore gives the same engine."""
    if kvstore is None or isinstance(kvstore, Collective):
        return kvstore
    # a KVStore by identity (the engine holds it, so its id stays its own)
    key = id(kvstore) if isinstance(kvstore, mx.kv.KVStore) else kvstore
    if isinstance(key, (str, int)) and key in _CONNECTED:
        return _CONNECTED[key]
    found = _connect(kvstore)
    if found is not None:
        _CONNECTED[key] = found
    return found


def claim(collective: Collective) -> None:
    """Mark ``collective`` as one Trainer's (its keys are the Trainer's); a clear error if
    another Trainer of this process has it already."""
    target = collective.kvstore if collective.kvstore is not None else collective
    if any(c is target for c in _CLAIMED):
        raise InvalidArgumentError(
            f"this {collective.name} {'KVStore' if collective.kvstore is not None else 'run'} "
            f"serves another tofu_mx Trainer of this process already (its keys 0, 1, 2, ... "
            f"are that Trainer's); train one partitioned block per worker process, or "
            f"several with one Trainer each in separate processes")
    _CLAIMED.append(target)


def _connect(kvstore: Any) -> Collective | None:
    if isinstance(kvstore, mx.kv.KVStore):
        kind = kvstore.type
        if "dist" not in kind:
            return None
        _check_sync(kind)
        return _KVStore(kvstore)
    if not isinstance(kvstore, str):
        raise InvalidArgumentError(
            f"kvstore must be None, a name ('dist_sync', 'horovod'), an mx.kv.KVStore or "
            f"what tofu_mx.gluon.distributed.connect returns, got "
            f"{type(kvstore).__name__} {show(kvstore)}")
    if kvstore in ("local", "device"):
        return None
    if kvstore == "horovod":
        try:
            import horovod.mxnet as hvd
        except ImportError as e:
            raise InvalidArgumentError(
                f"kvstore='horovod' needs Horovod with MXNet support, which does not import "
                f"here ({e}); install it (make test-horovod shows how: HOROVOD_WITH_MXNET=1 "
                f"pip install --no-build-isolation horovod) or use kvstore='dist_sync'"
            ) from None
        return _Horovod(hvd)
    if not kvstore.startswith("dist"):
        raise InvalidArgumentError(
            f"unknown kvstore {kvstore!r}; use 'dist_sync' (MXNet's parameter servers), "
            f"'horovod', or None for one worker")
    _check_sync(kvstore)
    missing = [v for v in DMLC_VARIABLES if not os.environ.get(v)]
    if missing:
        raise InvalidArgumentError(
            f"kvstore={kvstore!r} runs among workers a launcher started, but this process has "
            f"no {', '.join(missing)} in its environment; {_LAUNCH_HINT}")
    try:
        kv = mx.kv.create(kvstore)
    except mx.base.MXNetError as e:
        raise InvalidArgumentError(f"cannot create the KVStore {kvstore!r}: "
                                   f"{str(e).strip().splitlines()[-1]}; {_LAUNCH_HINT}") from None
    return _KVStore(kv)


def _check_sync(kind: str) -> None:
    if "async" in kind:
        raise InvalidArgumentError(
            f"kvstore {kind!r} is asynchronous: its servers apply each worker's update on its "
            f"own, which needs the optimizer on the servers, while tofu_mx's Trainer keeps each "
            f"shard's optimizer state on its device; use 'dist_sync'")


def plan_fingerprint(partitioned: PartitionedSymbol) -> str:
    """A digest of how a graph was partitioned: the graph, the device count, and every
    shard's name, source, kind, device, box and dtype (what the workers' keys stand for)."""
    h = hashlib.sha256(graph_fingerprint(partitioned.graph).encode())
    h.update(json.dumps([len(partitioned.contexts)] + [
        [s.name, s.source, s.kind, s.device, [list(b) for b in s.box], s.dtype,
         None if s.layout is None else [s.layout.axis, s.layout.groups]]
        for s in partitioned.shards]).encode())
    return h.hexdigest()


def check_same_plan(collective: Collective, fingerprint: str) -> None:
    """Raise :class:`tofu_mx.TofuError` on every worker unless all partitioned alike: each
    compares its fingerprint with worker 0's, then the workers sum their votes."""
    # 32 bytes as 16 numbers below 2**16: exact in any float dtype a KVStore carries
    ours = np.frombuffer(bytes.fromhex(fingerprint), dtype=">u2").astype(np.float32)
    theirs = mx.nd.array(ours, dtype="float32")
    collective.broadcast([FINGERPRINT_KEY], [theirs])
    votes = all_gather(collective, float(not np.array_equal(theirs.asnumpy(), ours)))
    differ = [r for r, v in enumerate(votes) if v]
    if differ:
        head = theirs.asnumpy().astype(">u2").tobytes().hex()[:12]
        raise TofuError(
            f"the {collective.num_workers} workers of this {collective.name} run did not "
            f"partition alike: worker(s) {differ} differ from worker 0 (plan fingerprint "
            f"{head}..., this worker's {fingerprint[:12]}...). Every worker must partition the "
            f"same block (same parameter names: build it the same way) for the same batch shape, "
            f"dtype, device count and memory_budget/options (the search is deterministic)")


def all_gather(collective: Collective, value: float) -> list[float]:
    """Every worker's ``value``, by rank (float64, exact: its 64 bits travel as four 16-bit
    numbers in float32, which any engine sums exactly with the other workers' zeros);
    every worker must call it."""
    pieces = np.zeros((collective.num_workers, 4), dtype=np.float32)
    pieces[collective.rank] = np.frombuffer(np.float64(value).tobytes(), dtype="<u2")
    out = mx.nd.array(pieces, dtype="float32")
    collective.all_reduce([GATHER_KEY], [out])
    return out.asnumpy().astype("<u2").view("<f8").ravel().tolist()
