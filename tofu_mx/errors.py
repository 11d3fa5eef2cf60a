"""The package's exceptions: one base class, a few subclasses.

Every message says what went wrong, the values involved, and what to do about it.
Subclasses also derive from the matching built-in (``ValueError``, ``TypeError``) so that
generic handlers keep working.
"""
import contextlib
import os
import re
import sys
import warnings


class TofuError(Exception):
    """Base class of every error raised by tofu_mx and nnvm_passes."""


class InvalidArgumentError(TofuError, ValueError):
    """An argument has a value that cannot be used (a bad shape, an empty list, ...)."""


class NotASymbolError(TofuError, TypeError):
    """An argument that must be an ``mx.sym.Symbol`` is something else."""


class UnknownInputError(InvalidArgumentError):
    """A shape or dtype was given for a name that is not an input of the symbol."""


class ContextError(InvalidArgumentError):
    """The device list is empty, has duplicates, or holds something that is not a Context."""


class ShapeInferenceError(TofuError):
    """MXNet cannot infer every shape (or dtype) of the graph from the given inputs."""


class BindError(TofuError):
    """MXNet refused to bind a graph (usually: a variable placed apart from its consumer)."""


class VerificationError(TofuError):
    """A multi-device graph does not compute what its single-device reference computes.

    ``report`` holds the full :class:`tofu_mx.verification.VerificationReport`.
    """

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report


class NoFeasiblePlanError(TofuError):
    """No plan fits the memory budget. ``footprint`` is the smallest per-device footprint
    found (bytes) and ``devices_needed`` how many devices would fit it (None: none would)."""

    def __init__(self, message: str, footprint: int = 0, devices_needed: int | None = None):
        super().__init__(message)
        self.footprint, self.devices_needed = footprint, devices_needed


class UnsupportedOperatorError(TofuError):
    """An operator can be neither partitioned (no description, no batch axis) nor skipped."""


class CheckpointError(InvalidArgumentError):
    """A parameter file or dict does not match the symbol (missing, extra, misshaped)."""


class DataParallelFasterWarning(RuntimeWarning):
    """``partition(machine=...)``: data parallelism, or data parallelism across the machine's
    device groups with Tofu inside each, fits the machine and is predicted faster than every
    partitioned plan (:attr:`tofu_mx.runtime.partitioned.MachineChoice`); the message says
    what to run instead."""


def mxnet_message(error: BaseException) -> str:
    """The line of an MXNet error that says what failed, without MXNet's traceback frames,
    timestamps and source positions."""
    for line in str(error).splitlines():
        line = line.strip()
        if not line or line.startswith(("Traceback (most recent", 'File "', "[bt]",
                                        "Stack trace")):
            continue
        line = re.sub(r"^(mxnet\.base\.)?MXNetError: ", "", line)
        return re.sub(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ", "", line).rstrip(": ")
    return type(error).__name__


#: the folders of the packages whose frames a warning skips to reach the caller's line
_OWN_CODE = tuple(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + name
                  + os.sep for name in ("tofu_mx", "nnvm_passes"))


def caller_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel`` for the function calling this one, pointing at the
    first frame outside tofu_mx and nnvm_passes: the user's line, however deep in the
    package the warning is raised (``tofu_mx.gluon.partition`` -> ``partition`` -> ...)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_OWN_CODE):
        frame, level = frame.f_back, level + 1
    return level


@contextlib.contextmanager
def warnings_held():
    """Every warning raised inside, recorded into the list this yields and not shown (what
    the filters would make of it is decided when :func:`give_warnings` raises it again)."""
    with warnings.catch_warnings(record=True) as held:
        warnings.simplefilter("always")
        yield held


def give_warnings(held) -> None:
    """Raise again warnings :func:`warnings_held` recorded, at the lines they were raised
    for, through the filters in force now."""
    for w in held:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
