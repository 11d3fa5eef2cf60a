"""tofu_mx: partition every tensor and operator of an MXNet 1.9.1 graph over k devices (Tofu).

The pipeline: import -> annotate (TDL) -> analyse -> coarsen -> search -> route -> emit -> bind.
What the package offers:

- :func:`partition` (``tofu_mx.partition(symbol, ctx, **shapes)``): the whole pipeline; returns
  a :class:`PartitionedSymbol`: an ordinary Symbol with one ctx group per device, with
  binding, whole <-> shard parameters, ``.params`` checkpoints readable at any device count,
  ``memory_per_device()``, ``report()`` and ``fallbacks``.
- :func:`verify`: run a multi-device graph and its single-device reference on the same seeded
  inputs and compare every output, gradient and auxiliary state.
- :func:`plan` and :class:`SearchOptions`: the search alone (:mod:`tofu_mx.search`); a
  :class:`Plan` gives every tensor's layout at every cut, and nothing is bound.
  :func:`frontier`: bytes moved against memory per device over the plans found.
- :mod:`tofu_mx.tdl` (the description language, ``@tdl.op``, coverage) and :mod:`tofu_mx.ops`
  (the built-in descriptions, each checked against MXNet's kernel).
- :mod:`tofu_mx.gluon`: partition a Gluon ``HybridBlock`` and train
  it with its ``Trainer``.
- :mod:`tofu_mx.sim`: the simulator: machine presets, cost formulas, and a plan's simulated
  step time and memory per device.
- :mod:`tofu_mx.cli` (``python -m tofu_mx``, or ``tofu-mx``), :mod:`tofu_mx.models` (the
  paper's models as Symbol builders), :func:`summarize`, and the graph import/export and
  rewrite in :mod:`nnvm_passes`.

Errors derive from :class:`TofuError`. Importing this package sets MXNet's environment for
partitioned graphs (below) and loads only the errors; everything else is loaded on first use.
"""
import importlib as _importlib
import os as _os

# MXNet 1.9.1's MKLDNN kernels give wrong values (not an error) when a graph spans several
# CPU devices: arrays in MKLDNN's blocked layout cross cpu(i) -> cpu(j) unconverted. Measured
# here: a WResNet split in two groups over cpu(0)/cpu(1) differed in 48 of 82 tensors with it
# on, in none with it off. MXNet reads the flag lazily, so setting it before the first
# operator runs is enough; a value the user set is kept. GPUs are unaffected.
_os.environ.setdefault("MXNET_MKLDNN_ENABLED", "0")
# MXNet latches that flag on its first read (a static in the library), so it cannot be scoped to
# partitioned executors: it holds for the user's own code too. With it off, MXNet 1.9.1 still
# builds a float32 fused RNN's state for MKLDNN (it asks MXNET_USE_MKLDNN_RNN, not the flag) and
# then runs the plain kernel on it: every float32 Gluon LSTM/GRU layer fails on CPU ("Check
# failed: in_data.size() == num_inputs"). Turning MKLDNN's RNN off with it keeps them running.
if _os.environ["MXNET_MKLDNN_ENABLED"] == "0":
    _os.environ.setdefault("MXNET_USE_MKLDNN_RNN", "0")
# With MKLDNN off, MXNet logs a "storage fallback" warning per operator; they are harmless.
_os.environ.setdefault("MXNET_STORAGE_FALLBACK_LOG_VERBOSE", "0")
# MXNet logs "Subgraph backend MKLDNN is activated" at every bind (47-103 lines in a short
# script); a value the user set is kept.
_os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

from tofu_mx.errors import (BindError, CheckpointError, ContextError,  # noqa: E402
                            DataParallelFasterWarning, InvalidArgumentError,
                            NoFeasiblePlanError, NotASymbolError, ShapeInferenceError,
                            TofuError, UnknownInputError, UnsupportedOperatorError,
                            VerificationError)

__version__ = "0.1.0"

_LAZY = {
    "verify": "tofu_mx.verification",
    "VerificationReport": "tofu_mx.verification",
    "TensorComparison": "tofu_mx.verification",
    "summarize": "tofu_mx.summary",
    "GraphSummary": "tofu_mx.summary",
    "plan": "tofu_mx.search.plan",
    "Plan": "tofu_mx.search.plan",
    "SearchOptions": "tofu_mx.search.plan",
    "partition": "tofu_mx.runtime.partitioned",
    "PartitionedSymbol": "tofu_mx.runtime.partitioned",
    "frontier": "tofu_mx.runtime.partitioned",
}
_SUBMODULES = ("models", "devices", "values", "summary", "verification", "cli", "tdl", "ops",
               "search", "runtime", "gluon", "sim")


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return _importlib.import_module(f"tofu_mx.{name}")
    raise AttributeError(f"module 'tofu_mx' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


__all__ = ["BindError", "CheckpointError", "ContextError", "DataParallelFasterWarning",
           "GraphSummary", "InvalidArgumentError", "NoFeasiblePlanError", "NotASymbolError",
           "PartitionedSymbol", "Plan", "SearchOptions", "ShapeInferenceError",
           "TensorComparison", "TofuError", "UnknownInputError", "UnsupportedOperatorError",
           "VerificationError", "VerificationReport", "frontier", "gluon", "models", "partition",
           "plan", "summarize", "verify"]
