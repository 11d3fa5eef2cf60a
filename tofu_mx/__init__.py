"""tofu_mx: automatic partitioning of very large MXNet models across several devices.

The pipeline (see DESIGN.md): import -> annotate (TDL) -> analyse -> coarsen -> search ->
rewrite -> bind. What exists today: the graph import/export (:mod:`nnvm_passes`), the
paper's models (:mod:`tofu_mx.models`), graph summaries and :func:`verify`.
"""
import os as _os

# MXNet 1.9.1's MKLDNN kernels give wrong values (not an error) when a graph spans several
# CPU devices: arrays in MKLDNN's blocked layout cross cpu(i) -> cpu(j) unconverted. Measured
# here: a WResNet split in two groups over cpu(0)/cpu(1) differed in 48 of 82 tensors with it
# on, in none with it off. MXNet reads the flag lazily, so setting it before the first
# operator runs is enough; a value the user set is kept. GPUs are unaffected.
_os.environ.setdefault("MXNET_MKLDNN_ENABLED", "0")
# With MKLDNN off, MXNet logs a "storage fallback" warning per operator; they are harmless.
_os.environ.setdefault("MXNET_STORAGE_FALLBACK_LOG_VERBOSE", "0")

from tofu_mx.errors import (ContextError, InvalidArgumentError, NotASymbolError,
                            ShapeInferenceError, TofuError, UnknownInputError,
                            VerificationError)
from tofu_mx import models
from tofu_mx.summary import GraphSummary, summarize
from tofu_mx.verify import TensorComparison, VerificationReport, verify

__version__ = "0.1.0"

__all__ = ["ContextError", "GraphSummary", "InvalidArgumentError", "NotASymbolError",
           "ShapeInferenceError", "TensorComparison", "TofuError", "UnknownInputError",
           "VerificationError", "VerificationReport", "models", "summarize", "verify"]
