"""Checks of the public API's arguments: one function per kind of argument.

Every public entry point passes what the caller gave through these before using it, so that a
bad value gets the same clear :class:`tofu_mx.InvalidArgumentError` (what, the value, what to
do) wherever it enters. NumPy scalars are accepted where Python numbers are (``np.int64(2)``
devices, a ``np.float32`` tolerance); ``bool`` is not a number here, and neither is a string.
Each check returns the value converted to a plain Python type; none modifies its argument.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

import numpy as np

from tofu_mx.errors import InvalidArgumentError


def show(value: Any, width: int = 80) -> str:
    """``repr(value)`` for a message, cut to ``width`` characters."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def count(value: Any, name: str, *, minimum: int = 1, maximum: int | None = None,
          example: str = "") -> int:
    """An integer in ``[minimum, maximum]`` (Python or NumPy int), as ``int``."""
    if not is_int(value):
        raise InvalidArgumentError(
            f"{name} must be an int, got {type(value).__name__} {show(value)}"
            f"{'; e.g. ' + example if example else ''}")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"between {minimum} and {maximum}" if maximum is not None else \
            f"at least {minimum}"
        raise InvalidArgumentError(f"{name} must be {bounds}, got {value}"
                                   f"{'; e.g. ' + example if example else ''}")
    return value


def real(value: Any, name: str, *, minimum: float | None = None, strict: bool = False,
         maximum: float | None = None, example: str = "") -> float:
    """A finite real number (Python or NumPy; not a string, not ``bool``), as ``float``;
    ``> minimum`` with ``strict``, else ``>= minimum``; ``<= maximum``."""
    if not is_real(value):
        raise InvalidArgumentError(
            f"{name} must be a number, got {type(value).__name__} {show(value)}"
            f"{'; e.g. ' + example if example else ''}")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be a finite number, got {value}"
                                   f"{'; e.g. ' + example if example else ''}")
    low = minimum is not None and (value <= minimum if strict else value < minimum)
    if low or (maximum is not None and value > maximum):
        parts = []
        if minimum is not None:
            parts.append(f"{'>' if strict else '>='} {minimum:g}")
        if maximum is not None:
            parts.append(f"<= {maximum:g}")
        raise InvalidArgumentError(f"{name} must be {' and '.join(parts)}, got {value:g}"
                                   f"{'; e.g. ' + example if example else ''}")
    return value


def flag(value: Any, name: str) -> bool:
    """``True`` or ``False`` (NumPy's too), as ``bool``."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name} must be True or False, got "
                                   f"{type(value).__name__} {show(value)}")
    return bool(value)


def byte_amount(value: Any, name: str = "memory_budget") -> int | float:
    """A positive, finite number of bytes."""
    real(value, name, minimum=0, strict=True, example="16 * 2**30 for 16 GiB")
    return int(value) if is_int(value) else float(value)


def mapping(value: Any, name: str, example: str) -> Mapping:
    """A dict-like argument (``None`` is an empty one)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{name} must be a dict, got {type(value).__name__} "
                                   f"{show(value)}; e.g. {example}")
    for key in value:
        if not isinstance(key, str):
            raise InvalidArgumentError(f"{name} must be keyed by names (str), got key "
                                       f"{show(key)} ({type(key).__name__}); e.g. {example}")
    return value


def numeric_array(value: Any, name: str, dtype: Any = None) -> np.ndarray:
    """A NumPy copy of an NDArray, NumPy array or nested list of numbers (in ``dtype`` when
    given). Strings, objects and ragged lists are refused."""
    import mxnet as mx
    if isinstance(value, mx.nd.NDArray):
        array = value.asnumpy()
    else:
        try:
            array = np.array(value)
        except (ValueError, TypeError) as e:
            raise InvalidArgumentError(f"{name} is not an array of numbers ({e}); give an "
                                       f"NDArray or a NumPy array") from e
    if array.dtype.kind not in "biuf":
        raise InvalidArgumentError(f"{name} must hold numbers, got an array of dtype "
                                   f"{array.dtype} ({show(value)}); give an NDArray or a NumPy "
                                   f"array of numbers")
    if dtype is not None and array.dtype != np.dtype(dtype):
        array = array.astype(dtype)
    return array


#: elements a tensor may have in MXNet 1.9.1's pip builds (int32 sizes; INT64_TENSOR_SIZE off)
INT32_ELEMENTS = 2 ** 31 - 1


def check_tensor_sizes(graph: Any, what: str) -> None:
    """Raise :class:`tofu_mx.InvalidArgumentError` before MXNet allocates a tensor of
    ``graph`` (an ``nnvm_passes.ir.Graph``) too large for its int32 sizes: MXNet fails only
    at bind or run time, with a bare ``Exception``. Checked on shapes, so nothing is
    allocated. Builds with ``INT64_TENSOR_SIZE`` have no such limit. ``what`` names the
    graph in the message ("the reference", "the partition over 4 devices")."""
    import mxnet as mx
    if mx.runtime.Features().is_enabled("INT64_TENSOR_SIZE"):
        return
    for node in graph.nodes:
        for j, t in enumerate(node.outputs):
            if t.size > INT32_ELEMENTS:
                which = "input" if node.is_variable else f"output {j} of {node.op}"
                raise InvalidArgumentError(
                    f"{what}'s tensor {node.name!r} ({which}) has shape {t.shape}: "
                    f"{t.size:,} elements, 2**31 or more. This MXNet ({mx.__version__}) is "
                    f"built without int64 tensor sizes (USE_INT64_TENSOR_SIZE, off in the pip "
                    f"packages), so it cannot allocate or index such a tensor; use a smaller "
                    f"batch or input shape, or more devices so that each shard is smaller")


def input_file(path: Any, what: str, error: type = InvalidArgumentError) -> str:
    """A path to a file that exists and can be read, as ``str`` (``os.PathLike`` accepted);
    else ``error`` saying which of those it is not."""
    import os
    if not isinstance(path, (str, os.PathLike)):
        raise error(f"{what} must be a path (str), got {type(path).__name__} {show(path)}")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise error(f"{what} {path!r} does not exist; check the path")
    if os.path.isdir(path):
        raise error(f"{what} {path!r} is a directory; give the file in it")
    if not os.access(path, os.R_OK):
        raise error(f"{what} {path!r} cannot be read (permission denied); check its "
                    f"permissions")
    return path
