"""Device lists and the ctx-group names that place graph nodes on them."""
from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections import Counter
from typing import Any, Iterator, Mapping, Sequence

import mxnet as mx

from tofu_mx.arguments import show
from tofu_mx.errors import ContextError, InvalidArgumentError, caller_stacklevel

_GROUP = re.compile(r"dev(\d+)$")
_DEVICES = re.compile(r"(?:(?P<type>[a-z]+):)?(?P<ids>\d+(?:,\d+)*)")
#: most devices (and highest device id + 1) parse_devices accepts: more than any machine has
MAX_DEVICES = 4096
_DEVICE_FORMS = ("a count (4, meaning cpu:4), TYPE:COUNT (cpu:4, gpu:8: devices 0..COUNT-1) "
                 "or TYPE:ID,ID,... (gpu:0,2,5), with TYPE cpu or gpu")


def group_name(index: int) -> str:
    """The ctx group of device ``index``: ``dev<index>``."""
    return f"dev{index}"


def parse_devices(text: str) -> list[mx.Context]:
    """Devices written on a command line: ``"4"`` (same as ``"cpu:4"``), ``"cpu:4"``
    (``mx.cpu(0)`` .. ``mx.cpu(3)``), ``"gpu:8"``, or a list of ids ``"gpu:0,2,5"`` (two or
    more, comma-separated). Case and spaces do not matter. Nothing is allocated: a GPU list
    can be parsed (and planned for) on a machine without GPUs. At most :data:`MAX_DEVICES`
    devices, ids below it.

    Raises :class:`tofu_mx.InvalidArgumentError` naming the text and the accepted forms.
    """
    shown = show(text, 40)
    found = _DEVICES.fullmatch(re.sub(r"\s+", "", str(text)).lower())
    kind = found and (found.group("type") or "cpu")
    if not found or kind not in ("cpu", "gpu"):
        raise InvalidArgumentError(f"cannot read {shown} as devices; expected {_DEVICE_FORMS}")
    # a count or id of more digits than MAX_DEVICES is too large (and int() of 5000 digits fails)
    ids = [int(i) if len(i.lstrip("0")) <= len(str(MAX_DEVICES)) else MAX_DEVICES ** 2
           for i in found.group("ids").split(",")]
    if len(ids) == 1 and ids[0] > MAX_DEVICES:
        raise InvalidArgumentError(f"{shown} asks for more than {MAX_DEVICES} devices, the "
                                   f"most tofu_mx takes; give fewer")
    if len(ids) > 1 and max(ids) >= MAX_DEVICES:
        raise InvalidArgumentError(f"{shown} names a {kind} id above {MAX_DEVICES - 1}, the "
                                   f"largest tofu_mx takes; give smaller ids")
    if len(ids) == 1:
        if ids[0] < 1:
            raise InvalidArgumentError(f"{shown} names no device: give at least one, e.g. "
                                       f"{kind}:1 (accepted: {_DEVICE_FORMS})")
        ids = list(range(ids[0]))
    repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
    if repeated:
        raise InvalidArgumentError(f"{shown} lists {kind} {repeated[0]} more than once; give "
                                   f"each device once")
    return [mx.Context(kind, i) for i in ids]


def check_available(contexts: Sequence[mx.Context]) -> None:
    """Raise :class:`ContextError` if a GPU in ``contexts`` is one MXNet cannot see (MXNet's
    own error comes only at binding, pages long). Planning needs no devices; binding does."""
    missing = [c for c in contexts if c.device_type == "gpu"
               and c.device_id >= mx.context.num_gpus()]
    if missing:
        raise ContextError(
            f"cannot bind on {', '.join(map(str, missing))}: MXNet sees "
            f"{mx.context.num_gpus()} GPU(s) (a CPU build of MXNet sees none). Install "
            f"mxnet-cu112 (pip install .[gpu]) on a machine with the GPUs, or use "
            f"mx.cpu(i) devices")


def check_contexts(ctx: Any) -> list[mx.Context]:
    """A non-empty list of distinct ``mx.Context``; a single Context is a list of one."""
    if isinstance(ctx, mx.Context):
        ctx = [ctx]
    if isinstance(ctx, (str, bytes)) or not isinstance(ctx, Sequence):
        raise ContextError(
            f"ctx must be a list of mx.Context, got {type(ctx).__name__} {ctx!r}; "
            f"e.g. ctx=[mx.cpu(0), mx.cpu(1)]")
    if not ctx:
        raise ContextError("ctx is empty; give at least one device, e.g. ctx=[mx.cpu(0)]")
    bad = [c for c in ctx if not isinstance(c, mx.Context)]
    if bad:
        raise ContextError(
            f"ctx must hold mx.Context objects, got {bad[0]!r} ({type(bad[0]).__name__}); "
            f"e.g. ctx=[mx.gpu(0), mx.gpu(1)]")
    seen: dict[mx.Context, int] = {}
    for i, c in enumerate(ctx):
        if c in seen:
            raise ContextError(
                f"ctx lists {c} twice (positions {seen[c]} and {i}); give each device once")
        seen[c] = i
    return list(ctx)


def resolve_group2ctx(groups: Sequence[str], ctx: Sequence[mx.Context],
                      group2ctx: Mapping[str, Any] | None = None) -> dict[str, mx.Context]:
    """Map every ctx group in ``groups`` to a Context.

    An explicit ``group2ctx`` entry wins (a Context, or an int indexing ``ctx``); otherwise a
    group named ``dev<i>`` maps to ``ctx[i]``.
    """
    out: dict[str, mx.Context] = {}
    for group in groups:
        if group2ctx is not None and group in group2ctx:
            target = group2ctx[group]
            if isinstance(target, int) and 0 <= target < len(ctx):
                target = ctx[target]
            if not isinstance(target, mx.Context):
                raise ContextError(f"group2ctx[{group!r}] must be an mx.Context or an index "
                                   f"into ctx (0..{len(ctx) - 1}), got {target!r}")
            out[group] = target
            continue
        match = _GROUP.match(group)
        if not match or int(match.group(1)) >= len(ctx):
            raise ContextError(
                f"ctx group {group!r} has no device: ctx has {len(ctx)} devices "
                f"(groups dev0..dev{len(ctx) - 1}); pass group2ctx={{{group!r}: mx.cpu(1)}} "
                f"or give more devices")
        out[group] = ctx[int(match.group(1))]
    return out


def warn_if_mkldnn_across_cpus(contexts: Sequence[mx.Context]) -> None:
    """Warn when a graph will span several CPU devices with MKLDNN kernels switched on."""
    cpus = {c for c in contexts if c.device_type == "cpu"}
    if len(cpus) > 1 and os.environ.get("MXNET_MKLDNN_ENABLED", "1") != "0" \
            and mx.runtime.Features().is_enabled("MKLDNN"):
        warnings.warn(
            f"MXNET_MKLDNN_ENABLED={os.environ.get('MXNET_MKLDNN_ENABLED', '1')}: MXNet 1.9.1's "
            f"MKLDNN kernels compute wrong values when a graph spans several CPU devices "
            f"({', '.join(map(str, sorted(cpus, key=str)))}). Set MXNET_MKLDNN_ENABLED=0 "
            f"before the first MXNet operator runs (importing tofu_mx first does this).",
            RuntimeWarning, stacklevel=caller_stacklevel())


@contextlib.contextmanager
def no_subgraph_backend() -> Iterator[None]:
    """Bind with MXNet's subgraph backend off: MKLDNN's fusion can drop ctx groups."""
    old = os.environ.get("MXNET_SUBGRAPH_BACKEND")
    os.environ["MXNET_SUBGRAPH_BACKEND"] = "NONE"
    try:
        yield
    finally:
        if old is None:
            del os.environ["MXNET_SUBGRAPH_BACKEND"]
        else:
            os.environ["MXNET_SUBGRAPH_BACKEND"] = old
