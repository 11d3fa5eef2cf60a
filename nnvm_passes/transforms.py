"""Small graph-to-graph passes over the IR."""
from __future__ import annotations

import json
from typing import Callable

import mxnet as mx
import numpy as np

from nnvm_passes.exporter import symbol_from_json
from nnvm_passes.importer import symbol_json
from nnvm_passes.ir import FrozenDict, Graph, is_hidden_attr
from tofu_mx.errors import TofuError


def disable_dropout(graph: Graph, is_random: Callable[[str], bool]) -> Graph:
    """Replace every operator whose output is random in training (``is_random(op)``: Dropout)
    by the identity (``_copy``), which is what it computes at inference.

    Hidden attributes such as ``__ctx_group__`` are kept, so placement is unchanged. The
    Dropout mask output disappears; a graph that reads the mask is rejected.
    """
    nodes = list(graph.nodes)
    random = {i for i, node in enumerate(nodes) if not node.is_variable and is_random(node.op)}
    changed = False
    for i in sorted(random):
        node = nodes[i]
        nodes[i] = node.replace(
            op="_copy", outputs=node.outputs[:1],
            attrs=FrozenDict({k: v for k, v in node.attrs.items() if is_hidden_attr(k)}))
        changed = True
    if not changed:
        return graph
    for node in nodes:
        for entry in node.inputs:
            if entry.index > 0 and entry.node in random:
                raise TofuError(f"{node.name!r} reads the mask of {graph.nodes[entry.node].name!r};"
                                f" such a graph cannot be made deterministic")
    return graph.replace(nodes=tuple(nodes))


_FLOATS = ("float16", "bfloat16", "float32", "float64")


def cast_floats(symbol: mx.sym.Symbol, dtype: str) -> tuple[mx.sym.Symbol, dict[str, str]]:
    """``symbol`` computing in the float ``dtype``, and the dtype of each of its inputs.

    Gluon (and ``mx.sym.var(dtype=...)``) writes a ``__dtype__`` on variables, and some
    operators carry a ``dtype`` attribute; every float one is set to ``dtype`` so that MXNet
    infers ``dtype`` throughout. Inputs declared with another kind (integers) keep theirs.
    """
    from mxnet.ndarray.ndarray import _DTYPE_MX_TO_NP, _DTYPE_NP_TO_MX
    code = str(_DTYPE_NP_TO_MX[np.dtype(dtype).type])
    js = json.loads(symbol_json(symbol))
    kept: dict[str, str] = {}
    for node in js["nodes"]:
        attrs = node.get("attrs", {})
        if node["op"] != "null":
            if attrs.get("dtype") in _FLOATS:
                attrs["dtype"] = dtype
            continue
        declared = attrs.get("__dtype__")
        if declared is None or int(declared) not in _DTYPE_MX_TO_NP:
            continue
        if np.dtype(_DTYPE_MX_TO_NP[int(declared)]).kind == "f":
            attrs["__dtype__"] = code
        else:
            kept[node["name"]] = np.dtype(_DTYPE_MX_TO_NP[int(declared)]).name
    cast = symbol_from_json(js)
    names = cast.list_arguments() + cast.list_auxiliary_states()
    return cast, {name: kept.get(name, dtype) for name in names}
