"""Hostile and unusual inputs to the public Python API, as one table.

Every case names the call, the error it must raise (a :class:`tofu_mx.TofuError` subclass:
never AttributeError, KeyError, TypeError, MXNetError or a bare Exception) and the text its
message must contain: the offending argument, key or value, and a phrase that says what to
do (:data:`DO`). Whether the call raises or succeeds, nothing the caller passed may change:
symbols (their JSON), NumPy and NDArray contents, dicts and lists, Gluon parameters, a
partitioned symbol's bound values, files on disk (bytes and mtime) are compared before and
after. Valid-but-unusual inputs (NumPy ints as counts, a dict as options, one Context as ctx)
must succeed and give what the plain input gives.

Cases that could hang, allocate gigabytes or kill the process run isolated: in a forked child
with a time limit and an address-space cap (:func:`run_isolated`), or in a fresh interpreter
(custom operators).
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import resource
import subprocess
import sys
import textwrap
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.gluon import nn

import tofu_mx
import tofu_mx.gluon as tg
from tofu_mx import (CheckpointError, ContextError, InvalidArgumentError, NoFeasiblePlanError,
                     NotASymbolError, ShapeInferenceError, TofuError, UnknownInputError)
from tofu_mx.runtime.partitioned import PartitionedSymbol, apply_plan
from tofu_mx.search.plan import Plan, SearchOptions
from tofu_mx.tdl.annotate import import_graph

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: a phrase that tells the caller what to do
DO = re.compile(r"\b(give|use|pass|call|set|install|check|make|expected|must|e\.g\.|partition"
                r"|try|add|remove|one of|rename|drop|pad|write|save|bind|describe|register"
                r"|did you mean|leave|omit)\b", re.IGNORECASE)


# --- the table's machinery --------------------------------------------------------------------
class Call:
    """``fn(*args, **kwargs)``; ``watch``: more things the call must leave alone."""

    def __init__(self, fn: Callable, *args, watch: tuple = (), **kwargs):
        self.fn, self.args, self.kwargs, self.watch = fn, args, kwargs, watch


@dataclass
class Case:
    id: str
    call: Callable[["Env"], Call]
    error: Any = None            # the exception class (or tuple); None: the call must succeed
    says: tuple = ()             # fragments the message must hold (AnyOf: one of several)
    check: Callable | None = None  # (result, env) -> None, for cases that succeed
    may_succeed: bool = False    # either returns (then `check`) or raises `error`
    isolate: bool = False        # forked child, time limit, memory cap
    timeout: float = 20.0


@dataclass(frozen=True)
class File:
    """A path on disk whose bytes and mtime must not change."""

    path: str


def snap(obj: Any) -> Any:
    """A comparable value standing for everything ``obj`` holds."""
    if isinstance(obj, mx.sym.Symbol):
        return ("Symbol", obj.tojson())
    if isinstance(obj, mx.nd.NDArray):
        return ("NDArray", obj.shape, str(obj.dtype), str(obj.context), obj.asnumpy().tobytes())
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind == "O":
            return ("ndarray[O]", obj.shape, tuple(snap(x) for x in obj.ravel()))
        return ("ndarray", obj.shape, obj.dtype.str, obj.tobytes(), obj.flags.writeable)
    if isinstance(obj, np.generic):
        return ("numpy", type(obj).__name__, obj.tobytes())
    if isinstance(obj, float):
        return ("float", repr(obj))
    if isinstance(obj, File):
        if os.path.isdir(obj.path):
            return ("dir", obj.path, sorted(os.listdir(obj.path)))
        if not os.path.exists(obj.path):
            return ("absent", obj.path)
        with open(obj.path, "rb") as f:
            return ("file", obj.path, f.read(), os.stat(obj.path).st_mtime_ns)
    if isinstance(obj, dict):
        return ("dict", type(obj).__name__, tuple((snap(k), snap(v)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(snap(x) for x in obj))
    if isinstance(obj, (set, frozenset)):
        return (type(obj).__name__, tuple(sorted(repr(snap(x)) for x in obj)))
    if isinstance(obj, PartitionedSymbol):
        exe = obj.executor
        bound = None if exe is None else (
            tuple((k, snap(v)) for k, v in exe.arg_dict.items()),
            tuple((k, snap(v)) for k, v in exe.aux_dict.items()))
        return ("PartitionedSymbol", obj.symbol.tojson(), obj.plan.to_json(), bound,
                snap(obj._pending), [repr(s) for s in obj.shards])
    if isinstance(obj, tg.PartitionedBlock):    # its parameters and aux states, not inputs
        return ("PartitionedBlock", snap(obj.source),
                tuple((s.name, snap(value)) for s, value, _ in obj.shard_arrays()))
    if isinstance(obj, gluon.Block):
        rows = []
        for key, p in obj._collect_params_with_prefix().items():
            values = None
            if p._data is not None:
                values = tuple(snap(d) for d in p.list_data())
            rows.append((key, p.name, p.shape, str(np.dtype(p.dtype)), p.grad_req, p.lr_mult,
                         p.wd_mult, values, bool(p._deferred_init)))
        return ("Block", type(obj).__name__, obj.name, tuple(rows))
    if isinstance(obj, Plan):
        return ("Plan", obj.to_json())
    return ("repr", type(obj).__name__, repr(obj))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


class AnyOf(tuple):
    """Fragments of which the message must contain at least one."""

    def __new__(cls, *alternatives):
        return super().__new__(cls, alternatives)


def _alternatives(item) -> tuple:
    return item if isinstance(item, AnyOf) else (item,)


TRACEBACK = "Traceback (most recent call last)"


def message_problems(e: BaseException, says: tuple) -> list[str]:
    """What the message lacks: each fragment (any of its alternatives) and a what-to-do."""
    text = str(e)
    problems = []
    if TRACEBACK in text:    # MXNet's first line: says nothing, and its "call" is no advice
        problems.append("message quotes a traceback header instead of the cause")
        text = text.replace(TRACEBACK, "")
    for item in says:
        if not any(str(alt).lower() in text.lower() for alt in _alternatives(item)):
            problems.append(f"message does not name {' or '.join(map(repr, _alternatives(item)))}")
    if not DO.search(text):
        problems.append("message does not say what to do (no phrase matching DO)")
    if problems:
        problems.append(f"message was: {str(e)[:400]!r}")
    return problems


def run_case(case: Case, env: "Env") -> list[str]:
    """The problems with one case (empty: it passes)."""
    call = case.call(env)
    watched = (call.args, call.kwargs, call.watch, env.shared())
    before = snap(watched)
    result, raised = None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = call.fn(*call.args, **call.kwargs)
        except Exception as e:  # noqa: BLE001  (the type is what the case checks)
            raised = e
    problems = []
    if raised is None:
        if case.error is not None and not case.may_succeed:
            problems.append(f"expected {_name(case.error)}, but the call returned "
                            f"{repr(result)[:200]}")
        elif case.check is not None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    case.check(result, env)
            except Exception as e:  # noqa: BLE001
                problems.append(f"the result is wrong: {type(e).__name__}: {e}"[:800])
    elif case.error is None:
        problems.append(f"expected success, got {_qual(raised)}: {_first_line(raised)}")
    elif not isinstance(raised, case.error):
        problems.append(f"expected {_name(case.error)}, got {_qual(raised)}: "
                        f"{_first_line(raised)}")
    else:
        problems += message_problems(raised, case.says)
    after = snap(watched)
    if before != after:
        names = ["args", "kwargs", "watched objects", "the module's shared symbols/nets"]
        changed = [n for n, b, a in zip(names, before[1], after[1]) if b != a]
        problems.append(f"the call changed the caller's input: {', '.join(changed)}")
    return problems


def _qual(e: BaseException) -> str:
    return f"{type(e).__module__}.{type(e).__qualname__}"


def _name(error) -> str:
    return " or ".join(e.__name__ for e in (error if isinstance(error, tuple) else (error,)))


def _child(case: Case, env: "Env", conn) -> None:
    try:
        status = open("/proc/self/status").read()
        vm = int(re.search(r"VmSize:\s+(\d+)", status).group(1)) * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (vm + 3 * 2**30, hard))
        conn.send(run_case(case, env))
    except BaseException as e:  # noqa: BLE001
        conn.send([f"the isolated run failed: {type(e).__name__}: {e}\n{traceback.format_exc()}"])
    finally:
        conn.close()
        os._exit(0)


def run_isolated(case: Case, env: "Env") -> list[str]:
    """``run_case`` in a forked child: a hang is killed after ``case.timeout`` seconds, an
    allocation over 3 GiB fails there, and a crash is reported, not suffered."""
    fork = multiprocessing.get_context("fork")
    receive, send = fork.Pipe(duplex=False)
    child = fork.Process(target=_child, args=(case, env, send), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(case.timeout):
            return [f"no answer within {case.timeout:g} s: the call hangs (or is far too slow)"]
        try:
            return receive.recv()
        except EOFError:
            child.join(5)
            return [f"the process died (exit code {child.exitcode}) instead of raising"]
    finally:
        if child.is_alive():
            child.kill()
        child.join(5)
        receive.close()


# --- the graphs, built once -------------------------------------------------------------------
FC_SHAPES = dict(data=(4, 6), softmax_label=(4,))
CONV_SHAPES = dict(data=(4, 3, 8, 8), softmax_label=(4,))
CPUS = [mx.cpu(0), mx.cpu(1)]


def fc_symbol(hidden: int = 8, name: str = "fc") -> mx.sym.Symbol:
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=hidden, name=name)
    return mx.sym.SoftmaxOutput(fc, name="softmax")


def conv_symbol() -> mx.sym.Symbol:
    x = mx.sym.Convolution(mx.sym.var("data"), num_filter=4, kernel=(3, 3), pad=(1, 1),
                           name="conv")
    x = mx.sym.BatchNorm(x, name="bn")
    x = mx.sym.Activation(x, act_type="relu", name="relu")
    x = mx.sym.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="max", name="pool")
    x = mx.sym.FullyConnected(mx.sym.flatten(x, name="flat"), num_hidden=4, name="out")
    return mx.sym.SoftmaxOutput(x, name="softmax")


def dense_net(seed: int = 0, initialize: bool = True, hidden: int = 8) -> gluon.HybridBlock:
    mx.random.seed(seed)
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Dense(hidden, in_units=6, activation="relu"), nn.Dense(4, in_units=hidden))
    if initialize:
        net.initialize(mx.init.Xavier(), ctx=mx.cpu(0))
    return net


class PlainBlock(gluon.Block):
    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.dense = nn.Dense(4, in_units=6)

    def forward(self, x):
        return self.dense(x)


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def known_params(sym, shapes, seed: int):
    """Whole parameters and aux states of ``sym`` with distinct seeded values."""
    arg_shapes, _, aux_shapes = sym.infer_shape(**shapes)
    rng = np.random.default_rng(seed)
    args = {n: mx.nd.array(rng.standard_normal(s)) for n, s in
            zip(sym.list_arguments(), arg_shapes) if n not in shapes}
    aux = {n: mx.nd.array(rng.uniform(0.5, 1.5, s)) for n, s in
           zip(sym.list_auxiliary_states(), aux_shapes)}
    return args, aux


class Env:
    """What the cases share: symbols, a Gluon net, checkpoint files (all must stay as they
    are), and factories for fresh partitioned objects a case may put state into."""

    def __init__(self, tmp):
        self.tmp = str(tmp)
        self.fc, self.conv = fc_symbol(), conv_symbol()
        self.fc5 = fc_symbol(5)                  # same names as fc, other shapes
        self.other = fc_symbol(8, name="other")  # other names
        self.net = dense_net()
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss()
        self.pnet = quiet(tg.partition, self.net, CPUS, data=(4, 6), label=(4,), loss=self.loss)
        self.fc_plan2 = tofu_mx.plan(self.fc, 2, **FC_SHAPES)
        self.fc_plan4 = tofu_mx.plan(self.fc, 4, **FC_SHAPES)
        self.files = {}
        self._save("fc", self.bound_fc(seed=7))
        self._save("conv", self.bound_conv(seed=8))
        fc5 = quiet(tofu_mx.partition, self.fc5, CPUS, **FC_SHAPES)
        fc5.simple_bind(grad_req="null")
        fc5.set_params(*known_params(self.fc5, FC_SHAPES, 9))
        self._save("fc5", fc5)
        other = quiet(tofu_mx.partition, self.other, CPUS, **FC_SHAPES)
        other.simple_bind(grad_req="null")
        other.set_params(*known_params(self.other, FC_SHAPES, 10))
        self._save("other", other)
        blob = open(self.files["fc"], "rb").read()
        self._write("truncated", blob[:len(blob) // 2])
        self._write("empty", b"")
        self._write("text", b"fc_weight = [[1, 2], [3, 4]]\n")
        self._write("garbage", bytes(range(256)) * 4)
        self.files["list"] = os.path.join(self.tmp, "list.params")
        mx.nd.save(self.files["list"], [mx.nd.ones((8, 6)), mx.nd.ones((8,))])
        self.files["missing"] = os.path.join(self.tmp, "no_such_file.params")
        self.files["dir"] = os.path.join(self.tmp, "a_directory")
        os.makedirs(self.files["dir"])
        self.files["net"] = os.path.join(self.tmp, "net.params")
        self.net.save_parameters(self.files["net"])
        other_net = nn.HybridSequential()
        with other_net.name_scope():
            other_net.add(nn.Dense(3, in_units=5))
        other_net.initialize(ctx=mx.cpu(0))
        self.files["other_net"] = os.path.join(self.tmp, "other_net.params")
        other_net.save_parameters(self.files["other_net"])
        self._write("pickle_list", __import__("pickle").dumps([1, 2, 3]))
        # trainer states of a net with the same structure and other widths
        wider = quiet(tg.partition, dense_net(hidden=5), CPUS, data=(4, 6), label=(4,),
                      loss=self.loss)
        self.files["other_states"] = os.path.join(self.tmp, "other.states")
        tg.Trainer(wider, "sgd", {"learning_rate": 0.1, "momentum": 0.9}).save_states(
            self.files["other_states"])

    def _save(self, key, ptd):
        self.files[key] = os.path.join(self.tmp, f"{key}.params")
        ptd.save_params(self.files[key])

    def _write(self, key, data: bytes):
        self.files[key] = os.path.join(self.tmp, f"{key}.bin")
        with open(self.files[key], "wb") as f:
            f.write(data)

    def shared(self):
        return (self.fc, self.conv, self.fc5, self.other, self.net,
                tuple(File(p) for p in self.files.values()))

    def file(self, key) -> File:
        return File(self.files[key])

    # fresh objects a case may change ------------------------------------------------------
    def ptd_fc(self, k: int = 2, **shapes):
        return quiet(tofu_mx.partition, self.fc, [mx.cpu(i) for i in range(k)],
                     **(shapes or FC_SHAPES))

    def bound_fc(self, seed: int = 1):
        ptd = self.ptd_fc()
        ptd.simple_bind(grad_req="write")
        ptd.set_params(*known_params(self.fc, FC_SHAPES, seed))
        return ptd

    def bound_conv(self, seed: int = 2):
        ptd = quiet(tofu_mx.partition, self.conv, CPUS, **CONV_SHAPES)
        ptd.simple_bind(grad_req="write")
        ptd.set_params(*known_params(self.conv, CONV_SHAPES, seed))
        return ptd

    def fc_args(self, seed: int = 3):
        return known_params(self.fc, FC_SHAPES, seed)[0]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Env(tmp_path_factory.mktemp("hostile"))


CASES: list[Case] = []


def case(id, call, error=None, says=(), **kw):
    assert id not in {c.id for c in CASES}, id
    CASES.append(Case(id, call, error, says if isinstance(says, tuple) and
                      not isinstance(says, AnyOf) else (says,), **kw))


def same_plan(other: Callable[["Env"], Plan]):
    """Check: the result is the plan ``other(env)`` gives, byte for byte."""
    def check(result, env):
        assert isinstance(result, Plan), f"not a Plan: {result!r}"
        want = other(env).to_json()
        assert result.to_json() == want, "the plan differs from the plain input's"
    return check


def plan_fc(*args, **kwargs):
    return tofu_mx.plan(*args, **{**FC_SHAPES, **kwargs})


# === NotASymbolError: plan, partition, verify ================================================
NOT_SYMBOLS = {
    "gluon_block": lambda env: env.net,
    "plain_block": lambda env: PlainBlock(),
    "str": lambda env: "fc",
    "json_text": lambda env: env.fc.tojson(),
    "None": lambda env: None,
    "dict": lambda env: {"data": env.fc},
    "list_of_symbol": lambda env: [env.fc],
}
for key, make in NOT_SYMBOLS.items():
    case(f"plan/symbol={key}", lambda env, make=make: Call(tofu_mx.plan, make(env), 2, **FC_SHAPES),
         NotASymbolError, "symbol")
for key in ("gluon_block", "str", "None", "dict", "plain_block"):
    case(f"partition/symbol={key}",
         lambda env, make=NOT_SYMBOLS[key]: Call(tofu_mx.partition, make(env), CPUS, **FC_SHAPES),
         NotASymbolError, "symbol")
case("verify/reference=str", lambda env: Call(tofu_mx.verify, "fc", env.fc, CPUS, **FC_SHAPES),
     NotASymbolError, "reference")
case("verify/reference=gluon_block",
     lambda env: Call(tofu_mx.verify, env.net, env.fc, CPUS, **FC_SHAPES),
     NotASymbolError, "reference")
case("verify/candidate=None", lambda env: Call(tofu_mx.verify, env.fc, None, CPUS, **FC_SHAPES),
     NotASymbolError, "candidate")
case("verify/candidate=dict",
     lambda env: Call(tofu_mx.verify, env.fc, {"symbol": env.fc}, CPUS, **FC_SHAPES),
     NotASymbolError, "candidate")

# === num_devices =============================================================================
for label, value in [("True", True), ("False", False), ("2.0", 2.0), ("2.5", 2.5), ("str", "2"),
                     ("bytes", b"2"), ("0", 0), ("-1", -1), ("None", None),
                     ("np.float64", np.float64(2.0)), ("np.bool_", np.bool_(True)),
                     ("list", [2]), ("np.int64(0)", np.int64(0))]:
    case(f"plan/num_devices={label}", lambda env, v=value: Call(plan_fc, env.fc, v),
         InvalidArgumentError, "num_devices")
for label, value, plain in [("np.int64", np.int64(2), 2), ("np.int32", np.int32(2), 2),
                            ("np.uint8", np.uint8(2), 2), ("np.int16(1)", np.int16(1), 1)]:
    case(f"plan/num_devices={label}", lambda env, v=value: Call(plan_fc, env.fc, v),
         check=same_plan(lambda env, p=plain: plan_fc(env.fc, p)))
def _one_device(result, env):
    assert result.num_devices == 1 and result.factors == (), (result.num_devices, result.factors)


case("plan/num_devices=1", lambda env: Call(plan_fc, env.fc, 1), check=_one_device)


def _plan_or_invalid(result, env):
    assert isinstance(result, Plan), f"not a Plan: {result!r}"


for label, value in [("2**16", 2**16), ("2**40", 2**40), ("10**12", 10**12),
                     ("prime 2**31-1", 2**31 - 1), ("np.int64(2**40)", np.int64(2**40))]:
    case(f"plan/num_devices={label} (no hang)", lambda env, v=value: Call(plan_fc, env.fc, v),
         InvalidArgumentError, "num_devices", check=_plan_or_invalid, may_succeed=True,
         isolate=True, timeout=10)

# === memory_budget ===========================================================================
BAD_BUDGETS = [("nan", float("nan")), ("inf", float("inf")), ("-inf", -math.inf), ("-1", -1),
               ("0", 0), ("str 16GiB", "16GiB"), ("True", True), ("list wrong length", [2**30]),
               ("list with nan", [2**30, float("nan")]), ("list with -1", [2**30, -1]),
               ("dict", {"dev0": 2**30}), ("np.nan", np.float64("nan")),
               ("complex", 2**30 + 0j), ("None in list", [2**30, None])]
for label, value in BAD_BUDGETS:
    case(f"plan/memory_budget={label}",
         lambda env, v=value: Call(plan_fc, env.fc, 2, memory_budget=v),
         InvalidArgumentError, "memory_budget")
for label, value in [("nan", float("nan")), ("str 16GiB", "16GiB"), ("-1", -1), ("0", 0),
                     ("True", True), ("list wrong length", [2**30] * 3)]:
    case(f"partition/memory_budget={label}",
         lambda env, v=value: Call(tofu_mx.partition, env.fc, CPUS, memory_budget=v, **FC_SHAPES),
         InvalidArgumentError, "memory_budget")
for label, value, plain in [("np.int64", np.int64(2**30), 2**30),
                            ("np.float64", np.float64(1e9), 1e9),
                            ("list of np.int64", [np.int64(2**30)] * 2, [2**30] * 2),
                            ("tuple", (2**30, 2**30), [2**30, 2**30])]:
    case(f"plan/memory_budget={label}",
         lambda env, v=value: Call(plan_fc, env.fc, 2, memory_budget=v),
         check=same_plan(lambda env, p=plain: plan_fc(env.fc, 2, memory_budget=p)))
case("plan/memory_budget=1 byte", lambda env: Call(plan_fc, env.fc, 2, memory_budget=1),
     NoFeasiblePlanError, "budget")
case("partition/memory_budget=1 byte",
     lambda env: Call(tofu_mx.partition, env.fc, CPUS, memory_budget=1, **FC_SHAPES),
     NoFeasiblePlanError, "budget")
# a budget everything fits: the plan moving the fewest bytes, which keeps its gathered inputs
case("partition/memory_budget=np.int64 fits",
     lambda env: Call(tofu_mx.partition, env.fc, CPUS, memory_budget=np.int64(2**30),
                      **FC_SHAPES),
     check=lambda r, env: _same_partition(r, tofu_mx.partition(
         env.fc, CPUS, options={"refetch": False}, **FC_SHAPES)))


def _same_partition(got, want):
    assert isinstance(got, PartitionedSymbol), f"not a PartitionedSymbol: {got!r}"
    assert got.plan.to_json() == want.plan.to_json(), "the plan differs"
    assert got.symbol.tojson() == want.symbol.tojson(), "the partitioned symbol differs"
    assert len(got.contexts) == len(want.contexts)


# === options and SearchOptions ===============================================================
for label, value, says in [("unknown key", {"memory_wieght": 1.0}, "memory_wieght"),
                           ("bad value", {"memory_weight": -1}, "memory_weight"),
                           ("list", ["tie"], "options"), ("str", "fast", "options"),
                           ("empty list", [], "options"), ("empty str", "", "options"),
                           ("0", 0, "options"), ("the class", SearchOptions, "options"),
                           ("non-str key", {1: True}, "options")]:
    case(f"plan/options={label}", lambda env, v=value: Call(plan_fc, env.fc, 2, options=v),
         InvalidArgumentError, says)
for label, value, says in [("unknown key", {"bogus": 1}, "bogus"), ("str", "x", "options"),
                           ("list", [1], "options")]:
    case(f"partition/options={label}",
         lambda env, v=value: Call(tofu_mx.partition, env.fc, CPUS, options=v, **FC_SHAPES),
         InvalidArgumentError, says)
case("plan/options=dict", lambda env: Call(plan_fc, env.fc, 2, options={"memory_weight": 16}),
     check=same_plan(lambda env: plan_fc(env.fc, 2, options=SearchOptions(memory_weight=16))))
case("plan/options=empty dict", lambda env: Call(plan_fc, env.fc, 2, options={}),
     check=same_plan(lambda env: plan_fc(env.fc, 2)))
case("partition/options=dict",
     lambda env: Call(tofu_mx.partition, env.fc, CPUS, options={"tie": False}, **FC_SHAPES),
     check=lambda r, env: _same_partition(r, quiet(tofu_mx.partition, env.fc, CPUS,
                                                   options=SearchOptions(tie=False),
                                                   **FC_SHAPES)))
for field, value in [("memory_weight", -1), ("memory_weight", "16"),
                     ("memory_weight", float("inf")), ("optimizer_state", float("nan")),
                     ("optimizer_state", -0.5), ("max_states", 0), ("max_states", 2.5),
                     ("max_states", True), ("tie", "yes"), ("tie", 1), ("try_factor_orders", None),
                     ("progress", "no"), ("conversion_bytes", -1),
                     ("conversion_bytes", "250e3"), ("conversion_bytes", float("nan")),
                     ("keep_if_fits", "no"), ("keep_if_fits", 0)]:
    case(f"SearchOptions({field}={value!r})",
         lambda env, f=field, v=value: Call(SearchOptions, **{f: v}),
         InvalidArgumentError, field)
case("SearchOptions(numpy values)",
     lambda env: Call(SearchOptions, max_states=np.int64(1000), memory_weight=np.float32(4),
                      tie=np.bool_(False)),
     check=lambda r, env: _equal(r, SearchOptions(max_states=1000, memory_weight=4.0, tie=False)))


def _equal(got, want):
    assert got == want, f"{got!r} != {want!r}"


# === shapes ==================================================================================
BAD_SHAPES = [("(4, 0)", (4, 0)), ("(4, -6)", (4, -6)), ("(4.0, 6)", (4.0, 6)), ("str", "4,6"),
              ("()", ()), ("None", None), ("(True, 6)", (True, 6)), ("(4, None)", (4, None)),
              ("(4, 6.5)", (4, 6.5)), ("dict", {"a": 4}), ("np float array", np.array([4.0, 6.0])),
              ("[[4, 6]]", [[4, 6]])]
for label, value in BAD_SHAPES:
    case(f"plan/data={label}",
         lambda env, v=value: Call(tofu_mx.plan, env.fc, 2, data=v, softmax_label=(4,)),
         InvalidArgumentError, "data")
for label, value in [("(4, 0)", (4, 0)), ("str", "4,6"), ("None", None)]:
    case(f"partition/data={label}",
         lambda env, v=value: Call(tofu_mx.partition, env.fc, CPUS, data=v, softmax_label=(4,)),
         InvalidArgumentError, "data")
case("plan/data=(2**70, 6)",
     lambda env: Call(tofu_mx.plan, env.fc, 2, data=(2**70, 6), softmax_label=(2**70,)),
     InvalidArgumentError, "data", isolate=True)
for label, value in [("list", [4, 6]), ("np.int64 dims", (np.int64(4), np.int64(6))),
                     ("np int array", np.array([4, 6]))]:
    case(f"plan/data={label}",
         lambda env, v=value: Call(tofu_mx.plan, env.fc, 2, data=v, softmax_label=(4,)),
         check=same_plan(lambda env: plan_fc(env.fc, 2)))
case("plan/unknown input dat", lambda env: Call(tofu_mx.plan, env.fc, 2, dat=(4, 6),
                                                softmax_label=(4,)),
     UnknownInputError, ("'dat'", "'data'"))
case("plan/unknown input fc_wieght", lambda env: Call(plan_fc, env.fc, 2, fc_wieght=(8, 6)),
     UnknownInputError, ("fc_wieght", "fc_weight"))
case("partition/unknown input", lambda env: Call(tofu_mx.partition, env.fc, CPUS, dta=(4, 6),
                                                 softmax_label=(4,)),
     UnknownInputError, ("dta", "data"))
case("plan/data (4,7) vs fc_weight (8,6)",
     lambda env: Call(plan_fc, env.fc, 2, data=(4, 7), fc_weight=(8, 6)),
     ShapeInferenceError, AnyOf("data", "fc_weight"))
case("plan/conv data of rank 3", lambda env: Call(tofu_mx.plan, env.conv, 2, data=(4, 3, 8),
                                                  softmax_label=(4,)),
     ShapeInferenceError, "data")
case("plan/conv channels vs weight",
     lambda env: Call(tofu_mx.plan, env.conv, 2, data=(4, 5, 8, 8), conv_weight=(4, 3, 3, 3),
                      softmax_label=(4,)),
     ShapeInferenceError, AnyOf("data", "conv_weight"))
case("plan/bn aux state shape", lambda env: Call(tofu_mx.plan, env.conv, 2, bn_moving_mean=(5,),
                                                 **CONV_SHAPES),
     ShapeInferenceError, "bn_moving_mean")
case("plan/no shapes at all", lambda env: Call(tofu_mx.plan, env.fc, 2),
     ShapeInferenceError, "data")
case("plan/label shape only", lambda env: Call(tofu_mx.plan, env.fc, 2, softmax_label=(4,)),
     ShapeInferenceError, "data")
case("plan/label batch differs", lambda env: Call(tofu_mx.plan, env.fc, 2, data=(4, 6),
                                                  softmax_label=(5,)),
     ShapeInferenceError, AnyOf("softmax_label", "softmax"))

# === dtypes ==================================================================================
for label, value, error, says in [
        ("str", "float64", InvalidArgumentError, "dtypes"),
        ("list of pairs", [("data", "float64")], InvalidArgumentError, "dtypes"),
        ("unknown name", {"dta": "float32"}, UnknownInputError, "dta"),
        ("float128x", {"data": "float128x"}, InvalidArgumentError, "float128x"),
        ("5", {"data": 5}, InvalidArgumentError, "data"),
        ("int8 (MXNet's int8 conflicts with the float label)", {"data": "int8"},
         ShapeInferenceError, "int8"),
        ("complex64", {"data": "complex64"}, InvalidArgumentError, "complex64"),
        ("object", {"data": object}, InvalidArgumentError, "data"),
        ("bytes dtype", {"data": "S5"}, InvalidArgumentError, "data"),
        ("non-str key", {0: "float32"}, InvalidArgumentError, "dtypes")]:
    case(f"plan/dtypes={label}", lambda env, v=value: Call(plan_fc, env.fc, 2, dtypes=v),
         error, says)
case("partition/dtypes=float128x",
     lambda env: Call(tofu_mx.partition, env.fc, CPUS, dtypes={"data": "float128x"}, **FC_SHAPES),
     InvalidArgumentError, "float128x")
case("plan/dtypes numpy type",
     lambda env: Call(plan_fc, env.fc, 2, dtypes={"data": np.float64, "softmax_label": np.float64}),
     check=same_plan(lambda env: plan_fc(env.fc, 2, dtypes={"data": "float64",
                                                          "softmax_label": "float64"})))

# === ctx (partition) and strict ==============================================================
BAD_CTX = [("[]", lambda: []), ("duplicate", lambda: [mx.cpu(0), mx.cpu(0)]),
           ("str", lambda: "cpu"), ("str cpu:2", lambda: "cpu:2"), ("ints", lambda: [0, 1]),
           ("None", lambda: None), ("set", lambda: {mx.cpu(0), mx.cpu(1)}),
           ("dict", lambda: {0: mx.cpu(0)}), ("mixed", lambda: [mx.cpu(0), "cpu(1)"]),
           ("generator", lambda: (mx.cpu(i) for i in range(2))), ("int 2", lambda: 2)]
for label, make in BAD_CTX:
    case(f"partition/ctx={label}",
         lambda env, make=make: Call(tofu_mx.partition, env.fc, make(), **FC_SHAPES),
         ContextError, "ctx")
case("partition/ctx=mx.cpu(0)", lambda env: Call(tofu_mx.partition, env.fc, mx.cpu(0), **FC_SHAPES),
     check=lambda r, env: _same_partition(r, quiet(tofu_mx.partition, env.fc, [mx.cpu(0)],
                                                   **FC_SHAPES)))
case("partition/ctx=tuple", lambda env: Call(tofu_mx.partition, env.fc, tuple(CPUS), **FC_SHAPES),
     check=lambda r, env: _same_partition(r, env.ptd_fc()))
for label, value in [("str", "yes"), ("1", 1), ("None", None)]:
    case(f"partition/strict={label}",
         lambda env, v=value: Call(tofu_mx.partition, env.fc, CPUS, strict=v, **FC_SHAPES),
         InvalidArgumentError, "strict")
case("partition/strict=np.bool_", lambda env: Call(tofu_mx.partition, env.fc, CPUS,
                                                   strict=np.bool_(True), **FC_SHAPES),
     check=lambda r, env: _same_partition(r, env.ptd_fc()))
case("simple_bind/gpu partition on a CPU-only machine",
     lambda env: Call(quiet(tofu_mx.partition, env.fc, [mx.gpu(0), mx.gpu(1)],
                            **FC_SHAPES).simple_bind),
     ContextError, "gpu(0)")

# === 2**31 elements: MXNet 1.9.1 has no int64 tensor sizes ===================================
BIG = dict(data=(2**16, 2**15), softmax_label=(2**16,))
case("plan/2**31-element data (may plan)", lambda env: Call(tofu_mx.plan, env.fc, 2, **BIG),
     InvalidArgumentError, "data", check=_plan_or_invalid, may_succeed=True, isolate=True,
     timeout=30)
case("partition/2**31-element data on one device",
     lambda env: Call(tofu_mx.partition, env.fc, [mx.cpu(0)], **BIG),
     InvalidArgumentError, "data", isolate=True, timeout=30)
case("verify/2**31-element data", lambda env: Call(tofu_mx.verify, env.fc, env.fc, CPUS, **BIG),
     InvalidArgumentError, "data", isolate=True, timeout=30)


# === PartitionedSymbol: set_params / split_params / load_params / merge_params ================
def set_params_call(make_args, make_aux=lambda env, args: None, conv=False):
    """set_params on a bound executor holding known values; the values must stay."""
    def build(env):
        ptd = env.bound_conv() if conv else env.bound_fc()
        sym, shapes = (env.conv, CONV_SHAPES) if conv else (env.fc, FC_SHAPES)
        args, aux = known_params(sym, shapes, 99)
        new_args, new_aux = make_args(env, args), make_aux(env, aux)
        return Call(ptd.set_params, new_args, *([] if new_aux is None else [new_aux]),
                    watch=(ptd,))
    return build


def _without(d, key):
    return {k: v for k, v in d.items() if k != key}


RIGHT_SHAPE_OBJECTS = np.array([object() for _ in range(8)], dtype=object)
BAD_PARAMS = [
    ("missing fc_bias", lambda env, a: _without(a, "fc_bias"), "fc_bias"),
    ("extra fc_wieght", lambda env, a: {**a, "fc_wieght": a["fc_weight"]}, "fc_wieght"),
    ("wrong shape", lambda env, a: {**a, "fc_weight": mx.nd.ones((6, 8))}, "fc_weight"),
    ("transposed numpy", lambda env, a: {**a, "fc_weight": a["fc_weight"].asnumpy().T},
     "fc_weight"),
    ("list not dict", lambda env, a: list(a.values()), AnyOf("arg_params", "dict")),
    ("string values", lambda env, a: {**a, "fc_weight": "abc"}, "fc_weight"),
    ("object value", lambda env, a: {**a, "fc_bias": object()}, "fc_bias"),
    ("None value", lambda env, a: {**a, "fc_bias": None}, "fc_bias"),
    ("ragged list", lambda env, a: {**a, "fc_bias": [[1, 2], [3]]}, "fc_bias"),
    ("object array of the right shape (after a valid weight)",
     lambda env, a: {"fc_weight": a["fc_weight"], "fc_bias": RIGHT_SHAPE_OBJECTS}, "fc_bias"),
    ("string array of the right shape (after a valid weight)",
     lambda env, a: {"fc_weight": a["fc_weight"], "fc_bias": np.array(["x"] * 8)}, "fc_bias"),
    ("complex array", lambda env, a: {**a, "fc_bias": np.ones(8, dtype=complex)}, "fc_bias"),
    ("nested dict value", lambda env, a: {**a, "fc_bias": {"value": 1}}, "fc_bias"),
    ("non-str key", lambda env, a: {**a, 7: a["fc_bias"]}, "7"),
]
for label, make, says in BAD_PARAMS:
    case(f"set_params/{label}", set_params_call(make), CheckpointError, says)
case("set_params/conv missing aux bn_moving_var",
     set_params_call(lambda env, a: a, lambda env, aux: _without(aux, "bn_moving_var"), conv=True),
     CheckpointError, "bn_moving_var")
case("set_params/conv aux as a list",
     set_params_call(lambda env, a: a, lambda env, aux: list(aux.values()), conv=True),
     CheckpointError, AnyOf("aux_params", "dict"))
case("set_params/conv aux wrong shape (valid args)",
     set_params_call(lambda env, a: a, lambda env, aux: {**aux, "bn_gamma": mx.nd.ones((5,))}
                     if "bn_gamma" in aux else {**aux, "bn_moving_mean": mx.nd.ones((5,))},
                     conv=True),
     CheckpointError, AnyOf("bn_gamma", "bn_moving_mean"))
def _set_numpy(env):
    ptd = env.bound_fc()
    given = {k: v.asnumpy() for k, v in env.fc_args(5).items()}

    def set_and_get(values):
        ptd.set_params(values)
        return ptd.get_params()[0], values
    return Call(set_and_get, given)


def _got_what_was_set(result, env):
    got, given = result
    assert sorted(got) == sorted(given), (sorted(got), sorted(given))
    for name, value in given.items():
        np.testing.assert_array_equal(got[name].asnumpy(), value, err_msg=name)


case("set_params/numpy arrays (valid)", _set_numpy, check=_got_what_was_set)


def split_params_call(make_args):
    def build(env):
        ptd = env.bound_fc()
        return Call(ptd.split_params, make_args(env, env.fc_args(4)), watch=(ptd,))
    return build


for label, make, says in BAD_PARAMS[:9]:
    case(f"split_params/{label}", split_params_call(make), CheckpointError, says)


def merge_params_call(edit):
    def build(env):
        ptd = env.bound_fc()
        shards, _ = ptd.split_params(env.fc_args(4))
        return Call(ptd.merge_params, edit(ptd, shards, env), watch=(ptd,))
    return build


def _first_shard(ptd, name="fc_weight"):
    return next(s for s in ptd.shards if s.source == name)


case("merge_params/missing shard",
     merge_params_call(lambda ptd, sh, env: _without(sh, _first_shard(ptd).name)),
     CheckpointError, "fc_weight")
case("merge_params/misshaped shard",
     merge_params_call(lambda ptd, sh, env: {**sh, _first_shard(ptd).name: mx.nd.ones((1, 1))}),
     CheckpointError, "fc_weight")
case("merge_params/misshaped bias shard (broadcastable)",
     merge_params_call(lambda ptd, sh, env: {**sh, _first_shard(ptd, "fc_bias").name:
                                            mx.nd.ones((1,))}),
     CheckpointError, "fc_bias")
case("merge_params/whole-array names", merge_params_call(lambda ptd, sh, env: env.fc_args(4)),
     CheckpointError, "fc_weight")
case("merge_params/empty dict", merge_params_call(lambda ptd, sh, env: {}),
     CheckpointError, "fc_weight")
case("merge_params/unknown shard name",
     merge_params_call(lambda ptd, sh, env: {**sh, "fc_weight@dev7": mx.nd.ones((4, 6))}),
     CheckpointError, "fc_weight@dev7")
case("merge_params/list", merge_params_call(lambda ptd, sh, env: list(sh.values())),
     CheckpointError, AnyOf("arg_shards", "dict"))


def load_params_call(key, conv=False):
    def build(env):
        ptd = env.bound_conv() if conv else env.bound_fc()
        return Call(ptd.load_params, env.files[key], watch=(ptd, env.file(key)))
    return build


for key, says, isolate in [("missing", "no_such_file", False), ("dir", "a_directory", False),
                           ("truncated", "truncated", True), ("empty", "empty", True),
                           ("text", "text", True), ("garbage", "garbage", True),
                           ("list", "list.params", False), ("other", "other", False),
                           ("fc5", "fc_weight", False), ("conv", "conv", False)]:
    case(f"load_params/{key} file", load_params_call(key), CheckpointError, says,
         isolate=isolate)
case("load_params/fc file into conv", load_params_call("fc", conv=True), CheckpointError,
     AnyOf("conv_weight", "fc.params"))
case("load_params/path None", lambda env: (lambda p: Call(p.load_params, None, watch=(p,)))(
    env.bound_fc()), CheckpointError, "None")


def _unbound(method, *args):
    def build(env):
        ptd = env.ptd_fc()
        return Call(getattr(ptd, method), *args, watch=(ptd,))
    return build


case("get_params/before binding", _unbound("get_params"), TofuError,
     AnyOf("simple_bind", "load_params"))
case("save_params/before binding", lambda env: _unbound(
    "save_params", os.path.join(env.tmp, "never_written.params"))(env), TofuError,
     AnyOf("simple_bind", "load_params"))
case("save_params/into a missing directory", lambda env: (lambda p: Call(
    p.save_params, os.path.join(env.tmp, "no", "such", "dir", "x.params"), watch=(p,)))(
    env.bound_fc()), InvalidArgumentError, "x.params")


# === Plan.from_json and apply_plan ===========================================================
def edited_plan(env, edit, k: int = 4):
    d = json.loads((env.fc_plan4 if k == 4 else env.fc_plan2).to_json())
    edit(d)
    return json.dumps(d)


def _set(path, value):
    def edit(d):
        target = d
        for key in path[:-1]:
            target = target[key]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return edit


for label, text, says in [("invalid JSON", lambda env: "{", "json"),
                          ("empty text", lambda env: "", "json"),
                          ("a list", lambda env: "[]", AnyOf("object", "dict", "list")),
                          ("a number", lambda env: "5", AnyOf("object", "dict")),
                          ("None", lambda env: None, AnyOf("str", "text", "json", "None")),
                          ("missing levels",
                           lambda env: edited_plan(env, _set(["levels"], KeyError)), "levels"),
                          ("factors '2,2'", lambda env: edited_plan(env, _set(["factors"], "2,2")),
                           "factors"),
                          ("num_devices '4'",
                           lambda env: edited_plan(env, _set(["num_devices"], "4")),
                           "num_devices"),
                          ("num_devices -4",
                           lambda env: edited_plan(env, _set(["num_devices"], -4)), "num_devices"),
                          ("tensor without shape",
                           lambda env: edited_plan(env, _set(["tensors", 0, "shape"], KeyError)),
                           "shape"),
                          ("level with an unknown key",
                           lambda env: edited_plan(env, _set(["levels", 0, "bogus"], 1)), "bogus"),
                          ("memory entries as lists",
                           lambda env: edited_plan(env, _set(["memory"], [[1, 2]])), "memory"),
                          ("ops is a number",
                           lambda env: edited_plan(env, _set(["ops"], 5)), "ops"),
                          ("factors [2] for 4 devices",
                           lambda env: edited_plan(env, _set(["factors"], [2])),
                           AnyOf("factors", "num_devices"))]:
    case(f"Plan.from_json/{label}", lambda env, t=text: Call(Plan.from_json, t(env)),
         InvalidArgumentError, says)
case("Plan.from_json/round trip", lambda env: Call(Plan.from_json, env.fc_plan4.to_json()),
     check=lambda r, env: _equal(r.to_json(), env.fc_plan4.to_json()))


def apply_call(make_plan, k: int = 2, sym="fc", shapes=FC_SHAPES):
    def build(env):
        symbol = getattr(env, sym)
        graph = import_graph(symbol, **shapes)
        return Call(lambda plan: apply_plan(symbol, graph, plan, [mx.cpu(i) for i in range(k)]),
                    make_plan(env), watch=(graph,))
    return build


def apply_edited(edit, k=4, plan_k=4):
    """from_json of an edited plan, then apply_plan: either may refuse it."""
    def build(env):
        graph = import_graph(env.fc, **FC_SHAPES)
        text = edited_plan(env, edit, plan_k)
        return Call(lambda t: apply_plan(env.fc, graph, Plan.from_json(t),
                                         [mx.cpu(i) for i in range(k)]), text, watch=(graph,))
    return build


case("apply_plan/plan of another graph",
     apply_call(lambda env: tofu_mx.plan(env.conv, 2, **CONV_SHAPES)), InvalidArgumentError,
     "plan")
case("apply_plan/plan of a graph with other names",
     apply_call(lambda env: tofu_mx.plan(env.other, 2, **FC_SHAPES)), InvalidArgumentError, "plan")
case("apply_plan/plan for other shapes",
     apply_call(lambda env: tofu_mx.plan(env.fc, 2, data=(8, 6), softmax_label=(8,))),
     InvalidArgumentError, "plan")
case("apply_plan/plan for other weight shapes (fc5)",
     apply_call(lambda env: tofu_mx.plan(env.fc5, 2, **FC_SHAPES)), InvalidArgumentError, "plan")
case("apply_plan/plan for 4 devices, ctx of 2", apply_call(lambda env: env.fc_plan4, k=2),
     InvalidArgumentError, "plan")
case("apply_plan/edited: 4 devices, factors [2]", apply_edited(_set(["factors"], [2])),
     InvalidArgumentError, AnyOf("factors", "num_devices", "plan"))
case("apply_plan/edited: num_devices 2, factors [2, 2]",
     apply_edited(_set(["num_devices"], 2), k=2), InvalidArgumentError,
     AnyOf("factors", "num_devices", "plan"))
case("apply_plan/edited: layout on a missing axis",
     apply_edited(_set(["tensors", 0, "layouts"], ["split(7)", "split(9)"])),
     InvalidArgumentError, AnyOf("data", "layout", "plan"))
case("apply_plan/edited: layout not a layout",
     apply_edited(_set(["tensors", 0, "layouts"], ["sideways", "split(0)"])),
     InvalidArgumentError, AnyOf("data", "layout", "sideways", "plan"))
case("apply_plan/edited: an operator left out", apply_edited(_set(["ops"], [])),
     InvalidArgumentError, AnyOf("fc", "plan"))
case("apply_plan/edited: strategy name unknown",
     apply_edited(_set(["ops", 0, "strategies"], ["split q9", "split q9"])),
     InvalidArgumentError, AnyOf("fc", "strategy", "plan"))
case("apply_plan/edited: a tensor's shape",
     apply_edited(_set(["tensors", 1, "shape"], [16, 6])), InvalidArgumentError,
     AnyOf("fc_weight", "shape", "plan"))
def _runs_right(result, env):
    """An edited plan that is accepted must still compute what the graph computes."""
    assert isinstance(result, PartitionedSymbol), repr(result)
    report = tofu_mx.verify(env.fc, result, result.contexts, **FC_SHAPES)
    assert report.ok, str(report)


for label, edit in [
        ("data layouts swapped", _set(["tensors", 0, "layouts"], ["split(1)", "split(0)"])),
        ("fc_weight replicated", _set(["tensors", 1, "layouts"], ["replicated", "replicated"])),
        ("fc strategies swapped", _set(["ops", 0, "strategies"], ["reduce i", "split i1"])),
        ("data shard (4, 6)", _set(["tensors", 0, "shard"], [4, 6])),
        ("one memory entry for 4 devices", lambda d: d.update(memory=d["memory"][:1]))]:
    case(f"apply_plan/edited: {label} (refused, or runs right)", apply_edited(edit),
         InvalidArgumentError, "plan", check=_runs_right, may_succeed=True)
case("apply_plan/ctx='cpu'", lambda env: Call(apply_plan, env.fc, import_graph(env.fc, **FC_SHAPES),
                                              env.fc_plan2, "cpu"),
     ContextError, "ctx")


# === verify ==================================================================================
def verify_call(*args, candidate=None, ctx=None, **kwargs):
    def build(env):
        cand = env.fc if candidate is None else candidate(env)
        return Call(tofu_mx.verify, env.fc, cand, CPUS if ctx is None else ctx(), *args,
                    **{**FC_SHAPES, **kwargs})
    return build


for label, kwargs, says in [("rtol='1e-4'", dict(rtol="1e-4"), "rtol"),
                            ("rtol=-1", dict(rtol=-1), "rtol"),
                            ("rtol=nan", dict(rtol=float("nan")), "rtol"),
                            ("rtol=True", dict(rtol=True), "rtol"),
                            ("atol=-1", dict(atol=-1), "atol"),
                            ("atol=inf", dict(atol=float("inf")), "atol"),
                            ("atol=None", dict(atol=None), "atol"),
                            ("seed=1.5", dict(seed=1.5), "seed"),
                            ("seed=True", dict(seed=True), "seed"),
                            ("seed=-1", dict(seed=-1), "seed"),
                            ("seed='0'", dict(seed="0"), "seed"),
                            ("oracle='float16'", dict(oracle="float16"), "oracle"),
                            ("arrays=list", dict(arrays=[np.ones((4, 6))]), "arrays"),
                            ("arrays data str", dict(arrays={"data": "abc"}), "data"),
                            ("arrays data None", dict(arrays={"data": None}), "data"),
                            ("arrays data ragged", dict(arrays={"data": [[1, 2], [3]]}), "data"),
                            ("arrays data wrong shape", dict(arrays={"data": np.ones((6, 4))}),
                             "data"),
                            ("arrays unknown name", dict(arrays={"dta": np.ones((4, 6))}), "dta"),
                            ("arrays object array",
                             dict(arrays={"data": np.full((4, 6), None, dtype=object)}), "data"),
                            ("dtypes=str", dict(dtypes="float64"), "dtypes"),
                            ("group2ctx='cpu'", dict(group2ctx="cpu"), "group2ctx")]:
    case(f"verify/{label}", verify_call(**kwargs), InvalidArgumentError, says)
case("verify/unknown shape name", verify_call(dat=(4, 6)), UnknownInputError, "dat")
case("verify/partition over [cpu0, gpu0]",
     lambda env: Call(tofu_mx.verify, env.fc, quiet(tofu_mx.partition, env.fc,
                                                     [mx.cpu(0), mx.gpu(0)], **FC_SHAPES),
                      [mx.cpu(0), mx.gpu(0)], **FC_SHAPES),
     ContextError, "gpu(0)")
for label, ctx, says in [("[cpu0, gpu0]", lambda: [mx.cpu(0), mx.gpu(0)], "gpu(0)"),
                         ("[]", lambda: [], "ctx"), ("str", lambda: "cpu", "ctx"),
                         ("duplicate", lambda: [mx.cpu(1), mx.cpu(1)], "ctx")]:
    case(f"verify/ctx={label}", verify_call(ctx=ctx), ContextError, says)
def grouped_fc() -> mx.sym.Symbol:
    """fc with its operators placed in ctx groups dev0 and dev1 by hand."""
    with mx.AttrScope(ctx_group="dev0"):
        fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc")
    with mx.AttrScope(ctx_group="dev1"):
        return mx.sym.SoftmaxOutput(fc, name="softmax")


case("verify/group2ctx maps to a str",
     verify_call(candidate=lambda env: grouped_fc(), group2ctx={"dev0": "cpu"}), ContextError,
     "dev0")
case("verify/group2ctx maps to a gpu", verify_call(candidate=lambda env: grouped_fc(),
                                                   group2ctx={"dev1": mx.gpu(0)}),
     ContextError, "gpu(0)")
case("verify/group2ctx with a PartitionedSymbol",
     verify_call(candidate=lambda env: env.ptd_fc(), group2ctx={"dev0": mx.cpu(1)}),
     InvalidArgumentError, "group2ctx")
case("verify/partition of another graph",
     verify_call(candidate=lambda env: env.bound_conv()), InvalidArgumentError,
     AnyOf("partition", "candidate"))
case("verify/partition for other shapes",
     verify_call(candidate=lambda env: env.ptd_fc(data=(8, 6), softmax_label=(8,))),
     InvalidArgumentError, AnyOf("partition", "candidate"))
case("verify/partition for other weights (fc5)",
     verify_call(candidate=lambda env: quiet(tofu_mx.partition, env.fc5, CPUS, **FC_SHAPES)),
     InvalidArgumentError, AnyOf("partition", "candidate"))
case("verify/partition over 4 devices, ctx of 2",
     verify_call(candidate=lambda env: env.ptd_fc(k=4)), ContextError,
     AnyOf("dev2", "cpu(2)"))


def _verified(result, env):
    assert result.ok, str(result)
    assert result.seed == 3 and abs(result.rtol - 1e-3) < 1e-9, (result.seed, result.rtol)


case("verify/numpy rtol and seed (valid)",
     verify_call(candidate=lambda env: env.ptd_fc(), rtol=np.float32(1e-3), seed=np.int64(3)),
     check=_verified)
case("verify/one Context (valid, k=1 candidate)",
     lambda env: Call(tofu_mx.verify, env.fc, quiet(tofu_mx.partition, env.fc, [mx.cpu(0)],
                                                   **FC_SHAPES), mx.cpu(0), **FC_SHAPES),
     check=lambda r, env: _equal(r.ok, True))


# === Gluon ===================================================================================
_DROP = object()     # leave the keyword out


def gluon_call(block=None, ctx=None, **kwargs):
    def build(env):
        net = env.net if block is None else block(env)
        args = dict(data=(4, 6), label=(4,), loss=env.loss)
        args.update(kwargs)
        return Call(tg.partition, net, CPUS if ctx is None else ctx(), watch=(net,),
                    **{k: v for k, v in args.items() if v is not _DROP})
    return build

for label, kw, error, says in [
        ("plain Block", dict(block=lambda env: PlainBlock()), (InvalidArgumentError,
                                                               NotASymbolError), "HybridBlock"),
        ("block=None", dict(block=lambda env: None), (InvalidArgumentError, NotASymbolError),
         "HybridBlock"),
        ("block=Symbol", dict(block=lambda env: env.fc), (InvalidArgumentError, NotASymbolError),
         "HybridBlock"),
        ("data=None", dict(data=None), InvalidArgumentError, "data"),
        ("data=(0, 6)", dict(data=(0, 6)), InvalidArgumentError, "data"),
        ("data=(4, -6)", dict(data=(4, -6)), InvalidArgumentError, "data"),
        ("data='4,6'", dict(data="4,6"), InvalidArgumentError, "data"),
        ("data=()", dict(data=()), InvalidArgumentError, "data"),
        ("data=(4.0, 6)", dict(data=(4.0, 6)), InvalidArgumentError, "data"),
        ("data=[(4, 6), None]", dict(data=[(4, 6), None]), InvalidArgumentError, "data"),
        ("data=(4, 7) for in_units=6", dict(data=(4, 7)), ShapeInferenceError, "data"),
        ("label without loss", dict(loss=_DROP), InvalidArgumentError, "loss"),
        ("loss without label", dict(label=_DROP), InvalidArgumentError, "label"),
        ("loss='softmax'", dict(loss="softmax"), InvalidArgumentError, "loss"),
        ("loss=a function", dict(loss=lambda x, y: x), InvalidArgumentError, "loss"),
        ("label=(0,)", dict(label=(0,)), InvalidArgumentError, "label"),
        ("label='4'", dict(label="4"), InvalidArgumentError, "label"),
        ("dtype='float17'", dict(dtype="float17"), InvalidArgumentError, "float17"),
        ("dtype=5", dict(dtype=5), InvalidArgumentError, "dtype"),
        ("memory_budget=nan", dict(memory_budget=float("nan")), InvalidArgumentError,
         "memory_budget"),
        ("memory_budget='1GiB'", dict(memory_budget="1GiB"), InvalidArgumentError,
         "memory_budget"),
        ("memory_budget=1 byte", dict(memory_budget=1), NoFeasiblePlanError, "budget"),
        ("options='fast'", dict(options="fast"), InvalidArgumentError, "options"),
        ("options unknown key", dict(options={"speed": 1}), InvalidArgumentError, "speed"),
        ("strict='yes'", dict(strict="yes"), InvalidArgumentError, "strict"),
        ("ctx=[]", dict(ctx=lambda: []), ContextError, "ctx"),
        ("ctx='cpu'", dict(ctx=lambda: "cpu"), ContextError, "ctx"),
        ("ctx duplicate", dict(ctx=lambda: [mx.cpu(0), mx.cpu(0)]), ContextError, "ctx"),
        ("ctx ints", dict(ctx=lambda: [0, 1]), ContextError, "ctx"),
        ("init=5 on an uninitialised net",
         dict(block=lambda env: dense_net(initialize=False), init=5), InvalidArgumentError,
         "init"),
        ("replicas=True", dict(replicas=True), InvalidArgumentError, "replicas"),
        ("replicas=2.0", dict(replicas=2.0), InvalidArgumentError, "replicas"),
        ("replicas=-1", dict(replicas=-1), InvalidArgumentError, "replicas"),
        ("replicas='two'", dict(replicas="two"), InvalidArgumentError, "replicas"),
        ("replicas='auto' without machine", dict(replicas="auto"), InvalidArgumentError,
         "machine"),
        ("replicas=2 over 2 devices (groups of one)", dict(replicas=2), InvalidArgumentError,
         "groups of two or more"),
        ("replicas=2, batch 3", dict(replicas=2, data=(3, 6), label=(3,),
                                     ctx=lambda: [mx.cpu(i) for i in range(4)]),
         InvalidArgumentError, "does not divide by 2")]:
    case(f"gluon.partition/{label}", gluon_call(**kw), error, says)


def _same_pnet(result, env):
    assert isinstance(result, tg.PartitionedBlock), repr(result)
    x = mx.nd.array(np.random.default_rng(0).standard_normal((4, 6)))
    y = mx.nd.array([0, 1, 2, 3])
    np.testing.assert_allclose(result(x, y).asnumpy(), env.pnet(x, y).asnumpy(), rtol=1e-5)


case("gluon.partition/replicas=np.int64(2) over 4 devices (valid)",
     gluon_call(replicas=np.int64(2), ctx=lambda: [mx.cpu(i) for i in range(4)]),
     check=_same_pnet)
case("gluon.partition/numpy data and label (valid)",
     gluon_call(data=(np.int64(4), np.int64(6)), label=[np.int32(4)]), check=_same_pnet)
case("gluon.partition/options dict (valid)", gluon_call(options={"memory_weight": 0}),
     check=_same_pnet)


def trainer_call(optimizer, params=None, block=None):
    def build(env):
        pnet = env.pnet if block is None else block(env)
        return Call(tg.Trainer, pnet, optimizer, params, watch=(pnet,))
    return build


for label, build, says in [
        ("optimizer=5", trainer_call(5), "optimizer"),
        ("optimizer='nosuchopt'", trainer_call("nosuchopt"), "nosuchopt"),
        ("optimizer=None", trainer_call(None), "optimizer"),
        ("params='lr'", trainer_call("sgd", "lr"), AnyOf("optimizer_params", "params")),
        ("params={'learning_rate': 'x'}", trainer_call("sgd", {"learning_rate": "x"}),
         "learning_rate"),
        ("params={'learning_rate': nan}", trainer_call("sgd", {"learning_rate": float("nan")}),
         "learning_rate"),
        ("params unknown key", trainer_call("sgd", {"no_such_param": 1}), "no_such_param"),
        ("instance and params", trainer_call(mx.optimizer.SGD(), {"learning_rate": 0.1}),
         "optimizer_params"),
        ("unpartitioned block", trainer_call("sgd", block=lambda env: env.net), "Trainer")]:
    case(f"gluon.Trainer/{label}", build, InvalidArgumentError, says)


def _x(shape=(4, 6)):
    return mx.nd.array(np.random.default_rng(1).standard_normal(shape))


Y = mx.nd.array([0, 1, 2, 3])
for label, args, says in [("x of batch 3", lambda: (_x((3, 6)), Y), "data"),
                          ("x transposed", lambda: (_x((6, 4)), Y), "data"),
                          ("x a str", lambda: ("abc", Y), "data"),
                          ("x None", lambda: (None, Y), "data"),
                          ("y of batch 5", lambda: (_x(), mx.nd.zeros((5,))), "label"),
                          ("no label", lambda: (_x(),), "label"),
                          ("three arrays", lambda: (_x(), Y, Y), "label")]:
    case(f"pnet.step/{label}", lambda env, a=args: Call(env.pnet.step, *a(), watch=(env.pnet,)),
         InvalidArgumentError, says)
case("pnet()/x of batch 3", lambda env: Call(env.pnet, _x((3, 6)), Y, watch=(env.pnet,)),
     InvalidArgumentError, "data")


def _load_into_pnet(key, method="load_parameters"):
    def build(env):
        return Call(getattr(env.pnet, method), env.files[key], watch=(env.pnet, env.file(key)))
    return build


for key, says in [("missing", "no_such_file"), ("other_net", "other_net"), ("dir", "a_directory"),
                  ("fc", "fc.params"), ("list", "list.params")]:
    case(f"pnet.load_parameters/{key}", _load_into_pnet(key), InvalidArgumentError, says)
for key, says in [("truncated", "truncated"), ("garbage", "garbage")]:
    case(f"pnet.load_parameters/{key}", _load_into_pnet(key), InvalidArgumentError, says,
         isolate=True)


def _trainer_load(key):
    def build(env):
        trainer = tg.Trainer(env.pnet, "sgd", {"learning_rate": 0.1, "momentum": 0.9})
        return Call(trainer.load_states, env.files[key], watch=(env.pnet, env.file(key)))
    return build


for key, says in [("missing", "no_such_file"), ("garbage", "garbage"), ("empty", "empty"),
                  ("pickle_list", "pickle_list"), ("dir", "a_directory"), ("fc", "fc.params"),
                  ("other_states", "weight")]:
    case(f"Trainer.load_states/{key}", _trainer_load(key), InvalidArgumentError, says)
for label, value in [("0", 0), ("2.5", 2.5), ("'8'", "8"), ("True", True)]:
    case(f"Trainer.step/batch_size={label}",
         lambda env, v=value: (lambda t: Call(t.step, v, watch=(env.pnet,)))(
             tg.Trainer(env.pnet, "sgd", {"learning_rate": 0.1})),
         InvalidArgumentError, "batch_size")


# === the table ===============================================================================
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile(case: Case, env):
    problems = run_isolated(case, env) if case.isolate else run_case(case, env)
    assert not problems, f"{case.id}:\n  " + "\n  ".join(problems)


def test_corpus_is_large_and_unique():
    ids = [c.id for c in CASES]
    assert len(ids) >= 140
    assert len(set(ids)) == len(ids), [i for i in ids if ids.count(i) > 1]


# === checkpoints keep every parameter ========================================================
def test_shape_given_for_a_parameter_keeps_it_a_parameter(env, tmp_path):
    """``fc_weight=(8, 6)`` as a shape must not make fc_weight data: either partition refuses
    it, or the weight stays a parameter that save_params writes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ptd = tofu_mx.partition(env.fc, CPUS, fc_weight=(8, 6), **FC_SHAPES)
        except InvalidArgumentError as e:
            assert not message_problems(e, ("fc_weight",)), message_problems(e, ("fc_weight",))
            return
    args, _ = ptd.param_names()
    assert "fc_weight" in args, f"fc_weight is no longer a parameter: {ptd.param_names()}"
    ptd.simple_bind(grad_req="write")
    ptd.set_params(*known_params(env.fc, FC_SHAPES, 11))
    path = str(tmp_path / "w.params")
    ptd.save_params(path)
    assert set(mx.nd.load(path)) == {"arg:fc_weight", "arg:fc_bias"}


@pytest.mark.parametrize("which", ["fc", "conv"])
def test_checkpoint_round_trip_keeps_every_parameter(env, tmp_path, which):
    sym, shapes = (env.fc, FC_SHAPES) if which == "fc" else (env.conv, CONV_SHAPES)
    args, aux = known_params(sym, shapes, 12)
    first = env.bound_fc() if which == "fc" else env.bound_conv()
    first.set_params(args, aux)
    path = str(tmp_path / f"{which}.params")
    first.save_params(path)
    want = {f"arg:{n}" for n in sym.list_arguments() if n not in shapes}
    want |= {f"aux:{n}" for n in sym.list_auxiliary_states()}
    assert set(mx.nd.load(path)) == want
    second = quiet(tofu_mx.partition, sym, [mx.cpu(i) for i in range(3)], **shapes)
    second.simple_bind(grad_req="null")
    second.load_params(path)
    got_args, got_aux = second.get_params()
    assert sorted(got_args) == sorted(args) and sorted(got_aux) == sorted(aux)
    for name in args:
        np.testing.assert_array_equal(got_args[name].asnumpy(), args[name].asnumpy())
    for name in aux:
        np.testing.assert_array_equal(got_aux[name].asnumpy(), aux[name].asnumpy())


# === custom operators whose Prop takes no keywords ===========================================
CUSTOM_SCRIPT = """
import sys, warnings
warnings.simplefilter("ignore")
import mxnet as mx, numpy as np, tofu_mx

class Double(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0] * 2)
    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.assign(in_grad[0], req[0], out_grad[0] * 2)

@mx.operator.register("hostile_no_kwargs")
class DoubleProp(mx.operator.CustomOpProp):
    def __init__(self):                     # no **kwargs, as in MXNet's own examples
        super().__init__(need_top_grad=True)
    def list_arguments(self):
        return ["data"]
    def list_outputs(self):
        return ["output"]
    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []
    def create_operator(self, ctx, shapes, dtypes):
        return Double()

fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc")
sym = mx.sym.SoftmaxOutput(mx.sym.Custom(fc, op_type="hostile_no_kwargs", name="double"),
                           name="softmax")
shapes = dict(data=(4, 6), softmax_label=(4,))
ctx = [mx.cpu(0), mx.cpu(1)]
try:
{body}
    print("RESULT ok", flush=True)
except tofu_mx.TofuError as e:
    print("RESULT", type(e).__name__, str(e).splitlines()[0], flush=True)
"""
CUSTOM_BODIES = {
    "plan": "tofu_mx.plan(sym, 2, **shapes)",
    "partition, bind, run, verify": """
ptd = tofu_mx.partition(sym, ctx, **shapes)
exe = ptd.simple_bind(grad_req="write")
exe.forward(is_train=True, **ptd.split_arrays({"data": np.ones((4, 6)),
                                               "softmax_label": np.arange(4)}))
exe.backward()
mx.nd.waitall()
tofu_mx.verify(sym, ptd, ctx, **shapes)""",
}


@pytest.mark.parametrize("what", list(CUSTOM_BODIES))
def test_custom_op_without_kwargs_does_not_kill_the_process(what):
    body = textwrap.indent(textwrap.dedent(CUSTOM_BODIES[what]).strip(), "    ")
    try:
        done = subprocess.run([sys.executable, "-c", CUSTOM_SCRIPT.format(body=body)], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: hangs (no answer in 120 s)")
    tail = (done.stdout + done.stderr)[-2000:]
    assert done.returncode >= 0, f"{what}: killed by signal {-done.returncode}:\n{tail}"
    assert done.returncode == 0, f"{what}: exit code {done.returncode}, not a TofuError:\n{tail}"
    assert "RESULT" in done.stdout, tail


def test_names_mxnet_accepts_are_accepted_unicode_included(tmp_path):
    """Seen: 'MXNetError: unknown string escape \\u' for a variable named données, through
    partition() and through a --symbol file Symbol.save wrote (MXNet's JSON reader knows no
    \\u escape; the names are handed to it as they are)."""
    import mxnet as mx
    x = mx.sym.var("données")
    y = mx.sym.FullyConnected(x, num_hidden=4, name="couche_é")
    sym = mx.sym.MakeLoss(mx.sym.sum(y * y), name="perte")
    ctx = [mx.cpu(0), mx.cpu(1)]
    ptd = tofu_mx.partition(sym, ctx, données=(4, 6), dtypes={"données": "float64"})
    assert tofu_mx.verify(sym, ptd, ctx, données=(4, 6), dtypes={"données": "float64"}).ok
    assert {s.source for s in ptd.shards} >= {"données", "couche_é_weight"}
    path = tmp_path / "réseau-symbol.json"
    sym.save(str(path))
    from tofu_mx.files import load_symbol
    assert load_symbol(str(path)).list_arguments() == sym.list_arguments()


def test_a_cyclic_symbol_is_a_clear_error():
    """Seen: 'MXNetError: _Map_base::at' for a cycle made with mx.sym.load_json."""
    import mxnet as mx
    x = mx.sym.var("x")
    js = json.loads(mx.sym.relu(mx.sym.relu(x, name="a"), name="b").tojson())
    js["nodes"][1]["inputs"] = [[2, 0, 0]]          # a reads b, b reads a
    cyclic = mx.sym.load_json(json.dumps(js))
    with pytest.raises(tofu_mx.InvalidArgumentError, match="has a cycle"):
        tofu_mx.partition(cyclic, [mx.cpu(0), mx.cpu(1)], x=(2, 3))


@pytest.mark.parametrize("field, value", [("optimizer_state", 1e308), ("memory_weight", 1e300),
                                          ("balance", 1e200), ("max_states", 1 << 62),
                                          ("conversion_bytes", 1e300)])
def test_search_options_past_any_meaning_are_refused(field, value):
    """Seen: SearchOptions(optimizer_state=1e308) accepted, then an OverflowError."""
    with pytest.raises(tofu_mx.InvalidArgumentError,
                       match=f"SearchOptions.{field} must be .*(<=|and) "):
        tofu_mx.SearchOptions(**{field: value})


def test_a_device_count_with_a_huge_prime_factor_is_refused_at_once():
    """Seen: plan() at a prime near 2^20 gave no answer in 120 s. Counts whose prime factors
    are all small (2^20 itself) still plan."""
    import time

    import mxnet as mx
    y = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc")
    sym = mx.sym.MakeLoss(mx.sym.sum(y * y))
    start = time.monotonic()
    with pytest.raises(tofu_mx.InvalidArgumentError,
                       match=r"num_devices=1048573 has the prime factor 1048573.*e\.g\. "):
        tofu_mx.plan(sym, 1048573, data=(16, 32))
    assert time.monotonic() - start < 1.0
    assert tofu_mx.plan(sym, 1 << 20, data=(16, 32)).num_devices == 1 << 20


def test_the_cli_takes_a_symbol_file_with_unicode_names(tmp_path):
    """Seen: a --symbol file with names MXNet accepts (données) refused by the CLI."""
    import mxnet as mx
    x = mx.sym.var("données")
    y = mx.sym.FullyConnected(x, num_hidden=4, name="couche_é")
    path = tmp_path / "réseau-symbol.json"
    mx.sym.MakeLoss(mx.sym.sum(y * y), name="perte").save(str(path))
    done = subprocess.run([sys.executable, "-m", "tofu_mx", "plan", "--symbol", str(path),
                           "--shape", "données=4,6", "--devices", "2"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-1500:]
    assert "couche_é_weight" in done.stdout
