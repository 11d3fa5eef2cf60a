"""What the example training scripts share: their flags, the training loop over a block
partitioned with ``tofu_mx.gluon``, checkpoints, and the comparison with plain Gluon.

A script describes its model and data as a :class:`Task` and calls :func:`run`.
"""
from __future__ import annotations

import os

# MXNet logs a line per executor bound; only the log is silenced.
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

import tofu_mx  # noqa: E402  (sets MXNet's environment before any operator runs)

import argparse  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Callable, Sequence  # noqa: E402

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402
from tqdm import tqdm  # noqa: E402

import tofu_mx.gluon as tg  # noqa: E402
from tofu_mx import sim  # noqa: E402
from tofu_mx.gluon import distributed  # noqa: E402
from tofu_mx.devices import check_available, parse_devices  # noqa: E402
from tofu_mx.files import atomic_write  # noqa: E402
from tofu_mx.summary import format_bytes, parse_bytes  # noqa: E402
from comparison import (FLOAT32_ERROR_FACTOR, FLOAT32_ERROR_FLOOR,  # noqa: E402
                        PERTURBATION, PERTURBED_RUNS, RTOL_FLOAT64, SENSITIVITY_FACTOR,
                        compare)

#: where blocks are built and initialised before partitioning (the partition copies them)
HOST = mx.cpu(0)
CHECKPOINT_FORMAT = "tofu_mx-examples-checkpoint/1"

EPILOG = "\n\n".join(textwrap.fill(paragraph, 88) for paragraph in (
    f"--compare trains a copy of the same initialised block with plain Gluon on the first "
    f"device of --devices (with --replicas G, data-parallel on the first G devices, "
    f"BatchNorm over each device's rows as in the hybrid's groups) "
    f"(gluon.Trainer, same batches and optimizer; Dropout switched off "
    f"in every run, as its random masks differ) and prints both loss curves side by side; "
    f"the exit code is 1 if they differ beyond float tolerance. float64: every step within "
    f"rtol {RTOL_FLOAT64:g}; where not, plain Gluon is trained {PERTURBED_RUNS} more times "
    f"with the first batch moved by {PERTURBATION:g} (relative) to measure the model's own "
    f"sensitivity: if its curve moves as much, the model is chaotic at this size (it says "
    f"so), and tofu_mx's curve may differ from Gluon's by up to {SENSITIVITY_FACTOR:g} x "
    f"that. float32: a third run, plain Gluon in float64, is the oracle; at "
    f"each step the partitioned curve's relative error from it may be at most "
    f"{FLOAT32_ERROR_FACTOR:g} x the largest error plain Gluon's float32 curve has had so far "
    f"+ {FLOAT32_ERROR_FLOOR:.1e}. Two float32 runs are not compared with each other: "
    f"small-batch BatchNorm makes training ill-conditioned, and runs that only sum in "
    f"different orders drift apart.",
    "--checkpoint DIR writes a checkpoint every --checkpoint-every steps and at the end: the "
    "parameters (Gluon's .params format), the trainer states (gluon.Trainer's format), then "
    "checkpoint.json (step, loss curve, flags), which commits them. --resume continues from "
    "it at any device count, with the same model, data and optimizer flags. Dropout masks "
    "are not part of a checkpoint: a network with Dropout resumes, but not on exactly the "
    "curve it would have followed. With --kvstore, worker 0 writes it, and every worker of "
    "the resumed run reads it, at any number of workers.",
    "--kvstore dist_sync trains data-parallel across workers, each partitioning the model "
    "over its own --devices, through MXNet's parameter servers; start it with "
    "python -m tofu_mx.launch -n 2 -- python examples/train_rnn.py --kvstore dist_sync on "
    "one machine, or MXNet's tools/launch.py on several. --kvstore horovod uses Horovod "
    "(horovodrun -np 2 python ...). Each worker trains its rows of every --batch-size batch "
    "and the loss curve is the whole batch's, so it matches a run of one process. "
    "BatchNorm's batch statistics are then each worker's own rows', as in Gluon.",
    "--replicas G trains data-parallel across G groups of the --devices (consecutive, as "
    "many in each), the model partitioned inside each group (tofu_mx.gluon.partition's "
    "replicas=); --replicas auto with --machine NAME takes it where the simulator predicts "
    "it faster on that machine. --machine NAME chooses the partition by simulated step time "
    "on a tofu_mx.sim preset."))


class ExampleError(Exception):
    """A problem with the flags or a checkpoint: printed as one line, exit code 2."""


@dataclass
class Task:
    """One script's model and data."""

    name: str                                  # the script, as checkpoints record it
    title: str                                 # the model, for people
    make_net: Callable[[], gluon.HybridBlock]  # a new, uninitialised block, the same names
    init: mx.init.Initializer
    loss: gluon.HybridBlock                    # per-sample losses from (output, label)
    data: Any                                  # .batch(step) -> (x, y) NumPy; .fingerprint()
    config: dict = field(default_factory=dict)  # model and data flags a resume must keep


# --- flags ---------------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (``prog: error: ...``) and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


positive_int = int_at_least(1)


def devices(text: str) -> list[mx.Context]:
    try:
        return parse_devices(text)
    except tofu_mx.TofuError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def replicas(text: str) -> int | str:
    """--replicas: a positive integer, or auto."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or auto, got {text!r}") \
            from None


def memory(text: str) -> int:
    try:
        return parse_bytes(text)
    except tofu_mx.TofuError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def optimizer_name(text: str) -> str:
    name = text.lower()
    if name not in mx.optimizer.Optimizer.opt_registry:
        raise argparse.ArgumentTypeError(
            f"unknown optimizer {text!r}; MXNet has "
            f"{', '.join(sorted(mx.optimizer.Optimizer.opt_registry))}")
    return name


def parser(description: str, *, batch_size: int, lr: float, steps_total: int = 5) -> Parser:
    """The flags every script takes; the script adds its model's."""
    p = Parser(description=description, epilog=EPILOG,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--devices", type=devices, default="cpu:2",
        help="cpu:K, gpu:K, K (cpu) or gpu:0,2,5 (default cpu:2)")
    add("--dtype", choices=("float32", "float64"), default="float32")
    add("--batch-size", type=positive_int, default=batch_size)
    add("--steps-total", type=positive_int, default=steps_total,
        help="training steps of the whole run, resumed ones included")
    add("--optimizer", type=optimizer_name, default="sgd")
    add("--lr", type=float, default=lr)
    add("--momentum", type=float, default=0.9, help="for sgd and nag")
    add("--wd", type=float, default=1e-4)
    add("--seed", type=int, default=0, help="initial values and batches")
    add("--init", choices=("host", "shards"), default="host",
        help="host: initialise the whole network on cpu(0), then partition it (the same "
             "initial values at any device count; --compare needs it). shards: each device "
             "initialises its own shards, no whole parameter anywhere (networks larger than "
             "host memory)")
    add("--replicas", type=replicas, default=1, metavar="G",
        help="data parallel across G groups of --devices, partitioned inside each; auto "
             "(with --machine): where predicted faster (see below)")
    add("--machine", choices=sorted(sim.PRESETS), default=None,
        help="choose the partition by simulated step time on this machine")
    add("--memory-budget", type=memory, default=None,
        help="bytes per device for the partitioner's search, e.g. 16GiB")
    add("--checkpoint", metavar="DIR", help="checkpoint folder")
    add("--checkpoint-every", type=positive_int, metavar="N")
    add("--resume", action="store_true", help="continue from the checkpoint in --checkpoint")
    add("--overwrite", action="store_true",
        help="start again even if --checkpoint DIR holds a checkpoint (it is replaced at the "
             "first save); without it such a run refuses")
    add("--compare", action="store_true", help="also train with plain Gluon (see below)")
    add("--kvstore", choices=("dist_sync", "horovod"), default=None,
        help="train data-parallel across workers (see below); --batch-size is then the "
             "batch of all workers together, each training its own rows of it")
    add("--kill-after-step", type=positive_int, help=argparse.SUPPRESS)  # tests: SIGKILL
    return p


def run(p: Parser, build_task: Callable[[argparse.Namespace], Task],
        argv: Sequence[str] | None = None) -> int:
    """Parse the flags, build the task, train; errors in flags or checkpoints are one line
    and exit code 2, a --compare mismatch exit code 1."""
    args = p.parse_args(argv)
    if (args.resume or args.checkpoint_every or args.overwrite) and not args.checkpoint:
        p.error("--resume, --checkpoint-every and --overwrite need --checkpoint DIR")
    if args.resume and args.overwrite:
        p.error("--resume continues the checkpoint, --overwrite replaces it: give one")
    if args.compare and args.init != "host":
        p.error("--compare needs --init host (plain Gluon starts from the same whole values)")
    if args.replicas == "auto" and args.machine is None:
        p.error("--replicas auto lets --machine choose: give --machine NAME too")
    if args.compare and args.kvstore:
        p.error("--compare runs plain Gluon in this process on the whole batch; leave it out "
                "with --kvstore (train once without --kvstore to compare the curves)")
    try:
        return train(args, build_task(args))
    except (ExampleError, tofu_mx.TofuError) as e:
        lines = str(e).splitlines() or [type(e).__name__]
        print(f"{p.prog}: error: {lines[0]}", file=sys.stderr)
        return 2


# --- blocks --------------------------------------------------------------------------------
def new_block(task: Task, dtype: str, ctx: mx.Context = HOST, materialise: bool = True
              ) -> gluon.HybridBlock:
    """A new block of the task in ``dtype``, initialised on ``ctx`` (its deferred shapes
    resolved by one forward pass on zeros, in predict mode: BatchNorm statistics stay as
    initialised); with ``materialise=False``, not initialised at all."""
    with mx.name.NameManager():      # the same Parameter names in every copy
        net = task.make_net()
    net.cast(dtype)
    if not materialise:
        return net
    net.initialize(task.init, ctx=ctx)
    x, _ = task.data.batch(0)
    shape = (1,) + x.shape[1:]
    try:
        net(mx.nd.zeros(shape, dtype=dtype, ctx=ctx))
    except (mx.base.MXNetError, ValueError) as e:
        raise ExampleError(f"{task.title} cannot take input of shape {shape}: "
                           f"{_mxnet_reason(e)}. Give a larger input (--image-size)") from e
    return net


def _mxnet_reason(error: Exception) -> str:
    """The line of an MXNet error that says what failed."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    failed = [line for line in lines if "Check failed" in line or "Error in operator" in line]
    return (failed or lines or [type(error).__name__])[-1]


def switch_off_dropout(net: gluon.Block) -> int:
    """Set the rate of every ``nn.Dropout`` in ``net`` to 0 (its forward is then the
    identity); returns how many had a rate above 0."""
    found = 0

    def visit(block):
        nonlocal found
        if isinstance(block, gluon.nn.Dropout) and block._rate > 0:
            block._rate, found = 0.0, found + 1   # Gluon 1.9.1 reads _rate in hybrid_forward
        for child in block._children.values():
            visit(child)
    visit(net)
    return found


def has_dropout(net: gluon.Block) -> bool:
    return isinstance(net, gluon.nn.Dropout) and net._rate > 0 or any(
        has_dropout(child) for child in net._children.values())


def copy_block(task: Task, source: gluon.HybridBlock, dtype: str, ctx: list[mx.Context]
               ) -> gluon.HybridBlock:
    """A new block on the devices ``ctx`` holding ``source``'s values (cast to ``dtype``)."""
    net = new_block(task, dtype, ctx[0])
    net.collect_params().reset_ctx(ctx)
    if not has_dropout(source):
        switch_off_dropout(net)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "source.params")
        source.save_parameters(path)
        net.load_parameters(path, ctx=ctx, cast_dtype=True, dtype_source="current")
    return net


def optimizer_params(args) -> dict:
    params = {"learning_rate": args.lr, "wd": args.wd}
    if args.optimizer in ("sgd", "nag"):
        params["momentum"] = args.momentum
    return params


@dataclass
class Reference:
    """Plain Gluon on one device, or data-parallel on several, each its rows of the batch
    (--compare)."""

    label: str
    dtype: str
    ctx: list[mx.Context]
    net: gluon.HybridBlock
    trainer: gluon.Trainer
    curve: list = field(default_factory=list)

    @property
    def where(self) -> str:
        """The devices, for display: ``cpu(0)``, or ``cpu(0)+cpu(1)`` data-parallel."""
        return "+".join(map(str, self.ctx))

    def step(self, loss_block, x: np.ndarray, y: np.ndarray) -> float:
        rows = x.shape[0] // len(self.ctx)
        losses = []
        with autograd.record():
            for i, ctx in enumerate(self.ctx):
                part = slice(i * rows, (i + 1) * rows)
                data = mx.nd.array(x[part], dtype=self.dtype, ctx=ctx)
                label = mx.nd.array(y[part], dtype=self.dtype, ctx=ctx)
                losses.append(loss_block(self.net(data), label))
        for loss in losses:
            loss.backward()
        self.trainer.step(x.shape[0])
        self.curve.append(mean(mx.nd.concat(*[loss.as_in_context(self.ctx[0])
                                              for loss in losses], dim=0)))
        return self.curve[-1]


def references(args, task: Task, net: gluon.HybridBlock, groups: int) -> list[Reference]:
    """Plain Gluon on the first device of --devices, or on the first ``groups`` of them
    data-parallel (the hybrid's BatchNorm statistics: each group's rows')."""
    dtypes = [args.dtype] + (["float64"] if args.dtype == "float32" else [])
    ctx, out = args.devices[:groups], []
    for dtype in dtypes:
        copy = copy_block(task, net, dtype, ctx)
        trainer = gluon.Trainer(copy.collect_params(), args.optimizer, optimizer_params(args))
        label = "gluon" if dtype == args.dtype else "oracle"
        out.append(Reference(f"{label} {dtype}", dtype, ctx, copy, trainer))
    return out


def mean(losses: mx.nd.NDArray) -> float:
    return float(losses.asnumpy().astype(np.float64).mean())


# --- checkpoints ---------------------------------------------------------------------------
def run_config(args, task: Task) -> dict:
    """What a resumed run must share with the checkpoint (devices and length may differ)."""
    return dict(script=task.name, **task.config, batch_size=args.batch_size, dtype=args.dtype,
                seed=args.seed, optimizer=args.optimizer, data=task.data.fingerprint())


def save_checkpoint(folder: str, step: int, curve: list, config: dict,
                    pnet: tg.PartitionedBlock, trainer: tg.Trainer) -> None:
    """Parameters and trainer states under names carrying the step, then checkpoint.json
    naming them: the JSON is the commit point, so a kill at any moment leaves the previous
    checkpoint whole. Files of other steps are removed afterwards."""
    os.makedirs(folder, exist_ok=True)
    stem = f"step-{step:08d}"
    files = [stem + ".params", stem + ".states"]
    pnet.export_parameters(os.path.join(folder, files[0]))    # atomic itself
    trainer.save_states(os.path.join(folder, files[1]))       # atomic itself
    for name in files:                    # on disk before the JSON names them
        _fsync(os.path.join(folder, name))
    blob = dict(format=CHECKPOINT_FORMAT, step=step, losses=curve, config=config,
                params=files[0], states=files[1])

    def dump(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(blob, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    atomic_write(os.path.join(folder, "checkpoint.json"), dump)
    _fsync(folder)
    for name in os.listdir(folder):
        if (name.startswith("step-") and name not in files) or name.startswith(".tmp-"):
            os.remove(os.path.join(folder, name))


def refuse_overwrite(folder: str, steps_total: int) -> None:
    """ExampleError if ``folder`` holds a checkpoint: a new run would replace it."""
    path = os.path.join(folder, "checkpoint.json")
    if not os.path.exists(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            step = json.load(f).get("step")
    except (OSError, ValueError, AttributeError):
        step = None
    at = f" at step {step}" if isinstance(step, int) else ""
    more = f" (with --steps-total above {step} to train further)" \
        if isinstance(step, int) and step >= steps_total else ""
    raise ExampleError(f"--checkpoint {folder} holds a checkpoint{at}, which this run would "
                       f"replace; continue it with --resume{more}, start again with "
                       f"--overwrite, or give another --checkpoint folder")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(folder: str, config: dict) -> dict:
    path = os.path.join(folder, "checkpoint.json")
    try:
        with open(path, encoding="utf-8") as f:
            blob = json.load(f)
    except FileNotFoundError:
        raise ExampleError(f"--resume: no checkpoint in {folder!r} ({path} does not exist); "
                           f"train with --checkpoint {folder} first") from None
    except (OSError, ValueError) as e:
        raise ExampleError(f"--resume: cannot read {path}: {e}") from e
    if not isinstance(blob, dict) or blob.get("format") != CHECKPOINT_FORMAT:
        raise ExampleError(f"--resume: {path} is not a checkpoint of these scripts "
                           f"(format {CHECKPOINT_FORMAT!r})")
    saved = blob["config"]
    differ = [f"{k}={saved.get(k)!r} (now {v!r})" for k, v in config.items() if saved.get(k) != v]
    if differ:
        raise ExampleError(f"--resume: {folder!r} was written by another run: "
                           f"{', '.join(differ)}. Resume with the model, data and optimizer "
                           f"flags it was written with (devices and --steps-total may differ)")
    return blob


def states_as(path: str, dtype: str, folder: str) -> str:
    """A copy of a trainer-states file with its arrays cast to ``dtype`` (for the float64
    oracle resuming from a float32 checkpoint)."""
    with open(path, "rb") as f:
        states, opt = pickle.loads(f.read())

    def cast(x):
        if isinstance(x, mx.nd.NDArray):
            return x.astype(dtype)
        if isinstance(x, (tuple, list)):
            return type(x)(cast(v) for v in x)
        return x
    out = os.path.join(folder, f"states.{dtype}")
    with open(out, "wb") as f:
        f.write(pickle.dumps(({k: cast(v) for k, v in states.items()}, opt)))
    return out


def resume(args, blob: dict, pnet, trainer, refs: list[Reference]) -> tuple[int, list]:
    """Load the checkpoint ``blob`` (read by :func:`load_checkpoint`) into the partitioned
    block, its trainer and the references; returns its step and loss curve."""
    params = os.path.join(args.checkpoint, blob["params"])
    states = os.path.join(args.checkpoint, blob["states"])
    pnet.load_parameters(params)
    trainer.load_states(states)
    for ref in refs:      # Gluon reads the same files: they are Gluon's formats
        ref.net.load_parameters(params, ctx=ref.ctx, cast_dtype=True,
                                dtype_source="current")
        with tempfile.TemporaryDirectory() as folder:
            ref.trainer.load_states(states if ref.dtype == args.dtype
                                    else states_as(states, ref.dtype, folder))
    return int(blob["step"]), [float(v) for v in blob["losses"]]


# --- training ------------------------------------------------------------------------------
@dataclass
class Workers:
    """This process's place in a --kvstore run: its rows of each batch."""

    collective: Any          # what tofu_mx.gluon.distributed.connect returned, or None
    rank: int
    count: int
    rows: slice


def workers(args) -> Workers:
    collective = distributed.connect(args.kvstore)
    if collective is None:
        return Workers(None, 0, 1, slice(None))
    rank, count = collective.rank, collective.num_workers
    if args.batch_size % count:
        raise ExampleError(f"--batch-size {args.batch_size} (the batch of all workers) does "
                           f"not split evenly over {count} workers; give a multiple of {count}")
    each = args.batch_size // count
    return Workers(collective, rank, count, slice(rank * each, (rank + 1) * each))


def train(args, task: Task) -> int:
    check_available(args.devices)
    config = run_config(args, task)
    if args.checkpoint and not args.resume and not args.overwrite:
        refuse_overwrite(args.checkpoint, args.steps_total)
    blob = load_checkpoint(args.checkpoint, config) if args.resume else None
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    net = new_block(task, args.dtype, materialise=args.init == "host")
    if args.compare and switch_off_dropout(net):
        print("--compare: Dropout switched off in every run (its random masks differ between "
              "runs)")
    team = workers(args)
    pnet = partition(args, task, net, team)
    trainer = tg.Trainer(pnet, args.optimizer, optimizer_params(args), kvstore=team.collective)
    refs = references(args, task, net, len(pnet.replicas)) if args.compare else []
    start, curve = 0, []
    if blob is not None:
        start, curve = resume(args, blob, pnet, trainer, refs)
        print(f"resumed from {args.checkpoint} at step {start}")
    with tempfile.TemporaryDirectory() as folder:
        again = (perturbed_gluon(args, task, refs[0], start, folder)
                 if refs and args.dtype == "float64" else None)
        seconds = loop(args, task, pnet, trainer, refs, start, curve, config, team)
        report(args, curve, start, seconds, trainer, team)
        return compare(args, curve, start, refs, again) if refs else 0


def partition(args, task: Task, net: gluon.HybridBlock, team: Workers) -> tg.PartitionedBlock:
    """``net`` partitioned over --devices for this worker's batch shape, with its loss."""
    x, y = task.data.batch(0)
    x, y = x[team.rows], y[team.rows]
    started = time.perf_counter()
    pnet = tg.partition(net, args.devices, loss=task.loss, data=x.shape, label=y.shape,
                        dtype=args.dtype, init=task.init, memory_budget=args.memory_budget,
                        machine=args.machine, replicas=args.replicas)
    if team.collective is not None:
        print(f"worker {team.rank} of {team.count} ({args.kvstore}): rows "
              f"{team.rows.start}-{team.rows.stop - 1} of each batch of {args.batch_size}")
    groups = len(pnet.replicas)
    print(f"{task.title}, batch {x.shape[0]}, {args.dtype}: partitioned over "
          f"{len(args.devices)} devices ({', '.join(map(str, args.devices))})"
          f"{f' in {groups} data-parallel groups' if groups > 1 else ''} in "
          f"{time.perf_counter() - started:.1f} s")
    fallbacks = pnet.partitioned.fallbacks
    print("operators run whole (fallbacks): " + (
        "none" if not fallbacks else f"{len(fallbacks)}: " +
        "; ".join(f"{k} ({why})" for k, why in list(fallbacks.items())[:5])))
    return pnet


def loop(args, task, pnet, trainer, refs, start, curve, config, team: Workers) -> float:
    """Train steps start+1 .. --steps-total; returns the seconds the partitioned steps took.
    The loss curve is the mean over the whole batch (all workers' rows: the same curve at any
    worker count). Worker 0 alone shows progress and writes checkpoints."""
    seconds = 0.0
    bar = tqdm(total=args.steps_total, initial=start, unit="step", dynamic_ncols=True,
               disable=team.rank != 0)
    for step in range(start + 1, args.steps_total + 1):
        x, y = task.data.batch(step - 1)
        tick = time.perf_counter()
        losses = pnet.step(mx.nd.array(x[team.rows], dtype=args.dtype),
                           mx.nd.array(y[team.rows], dtype=args.dtype))
        trainer.step(args.batch_size)
        curve.append(float(np.mean(trainer.all_gather(mean(losses)))))
        seconds += time.perf_counter() - tick
        for ref in refs:
            ref.step(task.loss, x, y)
        done = step - start
        bar.set_postfix_str(f"loss {curve[-1]:.4f}, "
                            f"{done * args.batch_size / seconds:.1f} samples/s")
        bar.update(1)
        if args.checkpoint and team.rank == 0 and (step == args.steps_total or
                                (args.checkpoint_every and step % args.checkpoint_every == 0)):
            save_checkpoint(args.checkpoint, step, curve, config, pnet, trainer)
            bar.write(f"checkpoint: step {step} saved in {args.checkpoint}")
        if step == args.kill_after_step:
            bar.close()
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    bar.close()
    return seconds


def report(args, curve, start, seconds, trainer, team: Workers) -> None:
    print(f"loss curve ({len(curve)} steps): " + " ".join(f"{v:.6f}" for v in curve))
    done = args.steps_total - start
    if done > 0:
        print(f"trained steps {start + 1}-{args.steps_total} of {args.steps_total}: "
              f"{done * args.batch_size / seconds:.1f} samples/s"
              f"{f' over {team.count} workers' if team.count > 1 else ''} ({seconds:.2f} s in "
              f"partitioned steps)")
    else:
        print(f"nothing to train: the checkpoint is at step {start} of {args.steps_total}")
    columns = ("weights", "gradients", "aux", "inputs", "activations", "optimizer", "total")
    print("memory per device (Trainer.memory_per_device):")
    print(f"  {'device':<8}" + "".join(f"{c:>13}" for c in columns))
    for row in trainer.memory_per_device():
        print(f"  {row.device:<8}" + "".join(f"{format_bytes(getattr(row, c)):>13}"
                                             for c in columns))


def perturbed_gluon(args, task: Task, ref: Reference, start: int, folder: str
                    ) -> Callable[[], list[list]]:
    """Plain Gluon's starting state (``ref``'s, before this run's steps) saved in ``folder``
    now, and a callable that trains it again PERTURBED_RUNS times over this run's steps on
    the same batches, each input of the first batch moved by PERTURBATION (random signs, new
    ones each run), and returns their curves."""
    params, states = os.path.join(folder, "start.params"), os.path.join(folder, "start.states")
    ref.net.save_parameters(params)
    ref.trainer.save_states(states)

    def train_again(run: int) -> list:
        net = new_block(task, ref.dtype, ref.ctx[0])
        if not has_dropout(ref.net):
            switch_off_dropout(net)
        net.load_parameters(params, ctx=ref.ctx)
        trainer = gluon.Trainer(net.collect_params(), args.optimizer, optimizer_params(args))
        trainer.load_states(states)
        again = Reference(f"{ref.label} perturbed", ref.dtype, ref.ctx, net, trainer)
        for step in range(start, args.steps_total):
            x, y = task.data.batch(step)
            again.step(task.loss, perturb(x, [args.seed, run]) if step == start else x, y)
        return again.curve
    return lambda: [train_again(run) for run in range(PERTURBED_RUNS)]


def perturb(x: np.ndarray, seed: list[int]) -> np.ndarray:
    """``x`` with each element moved by a relative PERTURBATION, up or down at random."""
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=x.shape)
    return (x * (1 + PERTURBATION * signs)).astype(x.dtype)
