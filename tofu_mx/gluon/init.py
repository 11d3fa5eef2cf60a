"""Initialise a parameter's shards directly, never the whole parameter.

MXNet's initializers look at ``arr.shape`` for the fan-in and fan-out (``Xavier``,
``MSRAPrelu``), or for where a value goes (``Bilinear``, ``LSTMBias``), and then write with
``random.*(out=arr)`` or ``arr[...] = value``. :class:`ShardWindow` is an NDArray that is one
shard's memory but reports the *whole* parameter's shape: an initializer called on it computes
its scale from the whole parameter and its writes land in the shard:

- a random draw (``mx.random.uniform(lo, hi, window.shape, out=window)``) fills the shard with
  the whole parameter's distribution (the values differ from a whole draw's, as any two draws
  do). MXNet's initializers pass the shape along with ``out``; while shards are initialised,
  ``mxnet.initializer``'s ``random`` module is replaced (under a lock) by one that draws the
  shard's own shape into the shard when ``out`` is a window;
- an assignment ``window[key] = value`` keeps the part of ``value`` inside the shard's box, so
  position-dependent initializers (``Bilinear``, ``LSTMBias``, ``Constant`` with an array,
  ``Load``) give exactly the whole initialisation's values there.

Reading a window (``asnumpy``, arithmetic) would see the shard, not the whole parameter: an
initializer that reads its array is refused with a message rather than given wrong values.
"""
from __future__ import annotations

import contextlib
import numbers
import threading
import types
from typing import Any, Sequence

import mxnet as mx
import numpy as np

from tofu_mx.errors import InvalidArgumentError, TofuError

Box = tuple[tuple[int, int], ...]


class ShardWindow(mx.nd.NDArray):
    """The shard ``box`` of a parameter of shape ``whole``, seen as the whole parameter."""

    __slots__ = ("_whole", "_box", "_shard", "_name")

    @classmethod
    def of(cls, shard: mx.nd.NDArray, whole: Sequence[int], box: Box, name: str
           ) -> "ShardWindow":
        view = shard.reshape(shard.shape)     # a new handle on the shard's memory
        window = cls(view.handle)
        view.handle = None                    # the window owns it now (MXNDArrayFree(NULL) is a no-op)
        window._whole, window._box, window._shard, window._name = tuple(whole), box, shard, name
        return window

    @property
    def shape(self):
        return self._whole

    def __repr__(self) -> str:
        return f"<ShardWindow {self._box} of {self._name} {self._whole}>"

    def __setitem__(self, key: Any, value: Any) -> None:
        region = _region(key, self._whole, self._name)
        inside = tuple((max(lo, blo), min(hi, bhi))
                       for (lo, hi), (blo, bhi) in zip(region, self._box))
        if any(lo > hi for lo, hi in inside):
            return
        target = tuple(slice(lo - blo, hi - blo + 1) for (lo, hi), (blo, _) in
                       zip(inside, self._box))
        if isinstance(value, numbers.Number):
            self._shard[target] = value
            return
        value = value.asnumpy() if isinstance(value, mx.nd.NDArray) else np.asarray(value)
        full = np.broadcast_to(value, tuple(hi - lo + 1 for lo, hi in region))
        part = full[tuple(slice(lo - rlo, hi - rlo + 1) for (lo, hi), (rlo, _) in
                          zip(inside, region))]
        self._shard[target] = np.ascontiguousarray(part, dtype=self._shard.dtype)

    def _refuse(self, *_args, **_kwargs):
        raise InvalidArgumentError(
            f"the initializer of {self._name!r} reads the array it initialises; shards are "
            f"initialised one at a time, so it would read one shard as if it were the whole "
            f"parameter. Initialise the block with it (block.initialize(...)) before "
            f"partitioning, or use an initializer that only writes (Xavier, Uniform, "
            f"Normal, Constant, ...).")

    asnumpy = asscalar = __getitem__ = copyto = copy = _refuse


def _region(key: Any, whole: Sequence[int], name: str) -> tuple[tuple[int, int], ...]:
    """The box (inclusive bounds) that ``array[key]`` selects of an array of shape ``whole``:
    integers and step-1 slices, as MXNet's initializers write."""
    keys = key if isinstance(key, tuple) else (key,)
    if len(keys) > len(whole):
        raise InvalidArgumentError(f"index {key!r} has more axes than {name!r} {tuple(whole)}")
    out = []
    for axis, n in enumerate(whole):
        k = keys[axis] if axis < len(keys) else slice(None)
        if isinstance(k, numbers.Integral):
            i = int(k) + n if k < 0 else int(k)
            out.append((i, i))
        elif isinstance(k, slice) and k.step in (None, 1):
            lo, hi, _ = k.indices(n)
            out.append((lo, hi - 1))
        else:
            raise InvalidArgumentError(
                f"cannot initialise {name!r} shard by shard: its initializer writes "
                f"array[{key!r}]; only integers and step-1 slices are supported. Initialise "
                f"the block before partitioning instead.")
    return tuple(out)


def initialize_shard(init: Any, default_init: Any, name: str, shard: mx.nd.NDArray,
                     whole: Sequence[int], box: Box) -> None:
    """Run Gluon's initialisation of parameter ``name`` (``Parameter.initialize`` with
    ``init`` and the block's ``default_init``) on the shard ``box`` of its ``whole`` shape."""
    window = ShardWindow.of(shard, whole, box, name)
    try:
        with mx.autograd.pause(), _draws_into_shards():
            initializer = mx.init.create(default_init or mx.init.Uniform())
            initializer(mx.init.InitDesc(name, {"__init__": init}), window)
    except TofuError:
        raise
    except Exception as e:  # noqa: BLE001  (MXNet's initializers answer with asserts)
        text = str(e).splitlines()[0] if str(e) else ""
        raise InvalidArgumentError(
            f"cannot initialise parameter {name!r} {tuple(whole)} with init={init!r} "
            f"(default {default_init!r}): {type(e).__name__}: {text}. Give the parameter an "
            f"mx.init.Initializer (or initialise the block before partitioning).") from e


_LOCK = threading.Lock()


def _into_shard(draw):
    def drawn(*args, out=None, **kwargs):
        if isinstance(out, ShardWindow):
            if len(args) > 2:
                args = args[:2] + (out._shard.shape,) + args[3:]
            if "shape" in kwargs:
                kwargs["shape"] = out._shard.shape
            draw(*args, out=out._shard, **kwargs)
            return out
        return draw(*args, out=out, **kwargs)
    return drawn


@contextlib.contextmanager
def _draws_into_shards():
    import mxnet.initializer as initializer
    with _LOCK:
        real = initializer.random
        shim = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real)
                                        if not n.startswith("__")})
        for n in ("uniform", "normal", "randn", "poisson", "exponential", "gamma"):
            if hasattr(real, n):
                setattr(shim, n, _into_shard(getattr(real, n)))
        initializer.random = shim
        try:
            yield
        finally:
            initializer.random = real
