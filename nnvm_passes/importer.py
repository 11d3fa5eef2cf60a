"""Import an ``mx.sym.Symbol`` and its input shapes into the IR of :mod:`nnvm_passes.ir`.

Shapes and dtypes come from MXNet's own ``infer_shape``/``infer_type``, so that each entry of
the IR carries its shape and dtype: run on the symbol's ``get_internals()``, whose outputs are
every output entry of every node but hidden ones (BatchNorm's batch mean), which are inferred
node by node, once per operator, attributes and inputs (or, where that cannot be done, on a
copy of the graph with every entry an output).
"""
from __future__ import annotations

import ctypes
import difflib
import functools
import json
import math
from array import array
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, SymbolHandle, c_array_buf, c_str_array, check_call, mx_uint
from mxnet.ndarray.ndarray import _DTYPE_MX_TO_NP, _DTYPE_NP_TO_MX, _int64_enabled

from nnvm_passes.exporter import symbol_from_json
from nnvm_passes.ir import (NO_EXTRA, Entry, FrozenDict, Graph, Node, TensorInfo, is_hidden_attr,
                            parse_attr_value)
from tofu_mx.errors import (InvalidArgumentError, NotASymbolError, ShapeInferenceError,
                            UnknownInputError, mxnet_message)

#: ``(op, parsed attributes) -> input positions that are labels``: how the importer learns
#: which variables are labels (the operator descriptions declare it; see tofu_mx.tdl).
LabelInputs = Callable[[str, Mapping[str, Any]], Sequence[int]]


_JSON_NODE_KEYS = frozenset(("op", "name", "attrs", "inputs"))


def check_symbol(symbol: Any, what: str = "symbol") -> mx.sym.Symbol:
    """Reject anything that is not an ``mx.sym.Symbol``, saying how to get one."""
    if not isinstance(symbol, mx.sym.Symbol):
        hint = ""
        if isinstance(symbol, mx.gluon.HybridBlock):
            hint = " For a Gluon block, pass net(mx.sym.var('data')) instead of the block."
        raise NotASymbolError(
            f"{what} must be an mx.sym.Symbol, got {type(symbol).__name__}.{hint}")
    return symbol


def _saved(symbol: mx.sym.Symbol, remove_amp_cast: bool) -> str:
    try:
        return symbol.tojson(remove_amp_cast=remove_amp_cast)
    except mx.base.MXNetError as e:   # nnvm's save meets a node twice on a path: a cycle
        raise InvalidArgumentError(
            f"MXNet cannot save the symbol as JSON ({mxnet_message(e)}): its graph has a "
            f"cycle (a node among its own inputs, as mx.sym.load_json of an edited graph may "
            f"give); give a symbol built with mx.sym or Gluon, or loaded from a saved file")\
            from e


def symbol_json(symbol: mx.sym.Symbol, keep_amp_casts: bool = False) -> str:
    """``symbol.tojson()``, without its leak: MXNet 1.9.1's ``tojson()`` saves a copy of the
    graph with its ``amp_cast`` nodes removed and never frees that copy (apache/mxnet#19574),
    about 2.3 times the JSON's size per call. Here a Symbol owns the copy and frees it; a
    graph with no ``amp_cast`` or ``amp_multicast`` node, which that pass leaves as it is,
    is saved directly (copying it took a third of importing 100,000 operators).
    ``keep_amp_casts``: the graph as it computes, AMP's casts kept (without them a mixed
    precision graph's float16 weights meet float32 data)."""
    text = _saved(symbol, remove_amp_cast=False)
    if keep_amp_casts or "amp_cast" not in text and "amp_multicast" not in text:
        return text     # nothing to remove (the pass only unplugs those operators' nodes)
    handle = SymbolHandle()
    check_call(_LIB.MXSymbolRemoveAmpCast(symbol.handle, ctypes.byref(handle)))
    return mx.sym.Symbol(handle).tojson(remove_amp_cast=False)


def _check_shape(name: str, shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        dims = None
    if not dims or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0
                           for d in dims):
        raise InvalidArgumentError(
            f"shape of input {name!r} must be a non-empty tuple of positive ints, got {shape!r}; "
            f"e.g. {name}=(32, 3, 224, 224)")
    dims = tuple(int(d) for d in dims)
    if max(dims) > 2 ** 31 - 1 and not mx.runtime.Features().is_enabled("INT64_TENSOR_SIZE"):
        raise InvalidArgumentError(
            f"shape of input {name!r} {dims} has a dimension over 2**31 - 1, which this MXNet "
            f"build cannot take (no INT64_TENSOR_SIZE); give a smaller shape")
    if math.prod(dims) >= 2 ** 63:
        raise InvalidArgumentError(
            f"shape of input {name!r} {dims} has {math.prod(dims):.3g} elements, more than MXNet "
            f"can count (2**63); give a smaller shape")
    return dims


#: the dtypes MXNet 1.9.1's operators take
MXNET_DTYPES = ("float16", "float32", "float64", "uint8", "int8", "int32", "int64", "bool")


def _check_dtypes(dtypes: Any) -> dict[str, str]:
    if dtypes is None:
        return {}
    if not isinstance(dtypes, Mapping):
        raise InvalidArgumentError(f"dtypes must be a dict of input name -> dtype, got "
                                   f"{type(dtypes).__name__} {dtypes!r}; e.g. "
                                   f"dtypes={{'data': 'float64'}}")
    out = {}
    for name, dtype in dtypes.items():
        if not isinstance(name, str):
            raise InvalidArgumentError(f"dtypes must be keyed by input names (str), got key "
                                       f"{name!r}; e.g. dtypes={{'data': 'float64'}}")
        try:
            out[name] = np.dtype(dtype).name
        except TypeError:
            out[name] = None
        if out[name] not in MXNET_DTYPES:
            raise InvalidArgumentError(f"dtypes[{name!r}] is {dtype!r}, which MXNet does not "
                                       f"compute in; use one of {', '.join(MXNET_DTYPES)}")
    return out


def _check_given_shapes(symbol: mx.sym.Symbol, shapes: Mapping[str, tuple[int, ...]],
                        arg_names: list[str], aux_names: list[str]) -> None:
    """MXNet takes a given auxiliary-state shape that contradicts the graph without a word
    (it infers the aux state from the operator): refuse it."""
    given_aux = {k: v for k, v in shapes.items() if k in aux_names}
    if not given_aux:
        return
    others = {k: v for k, v in shapes.items() if k not in aux_names}
    try:
        _, _, aux_shapes = symbol.infer_shape_partial(**others)
    except mx.base.MXNetError:
        return      # reported by the full inference
    for name, shape in given_aux.items():
        inferred = aux_shapes[aux_names.index(name)]
        if not _unknown(inferred) and tuple(inferred) != shape:
            raise ShapeInferenceError(
                f"the shape given for {name!r}, {shape}, contradicts the graph, which needs "
                f"{tuple(inferred)} from {_fmt(others)}; give {name}={tuple(inferred)} or leave "
                f"it out")


def _check_names(given: Mapping[str, Any], inputs: list[str], what: str) -> None:
    unknown = [n for n in given if n not in inputs]
    if not unknown:
        return
    hints = []
    for n in unknown:
        close = difflib.get_close_matches(n, inputs, n=1)
        hints.append(f"{n!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise UnknownInputError(
        f"{what} given for {', '.join(hints)}, which the symbol does not have as input. "
        f"Its inputs are: {', '.join(inputs)}.")


def _unknown(shape: Any) -> bool:
    return not shape or 0 in shape


def all_entries_symbol(js: dict) -> mx.sym.Symbol:
    """The graph of ``js`` with every output entry of every node made a head."""
    row_ptr = js["node_row_ptr"]
    heads = [[nid, k, 0] for nid in range(len(js["nodes"]))
             for k in range(row_ptr[nid + 1] - row_ptr[nid])]
    return symbol_from_json(dict(js, heads=heads))


def _lists_every_entry(js: dict, names: list[str]) -> bool:
    """Whether ``names`` (``get_internals().list_outputs()``) are every entry of ``js``."""
    row_ptr = js["node_row_ptr"]
    return len(names) == row_ptr[-1] and all(
        names[row_ptr[i]] == node["name"] if node["op"] == "null" else
        names[row_ptr[i]].startswith(node["name"] + "_")
        for i, node in enumerate(js["nodes"]))


def _entries_symbol(js: dict, internals: tuple[mx.sym.Symbol, list[str]]
                    ) -> tuple[mx.sym.Symbol, "_Hidden | None"]:
    """The symbol to infer every entry of ``js`` (a symbol's JSON) through, and the hidden
    outputs to add (:class:`_Hidden`), or None. The symbol is the symbol's
    ``get_internals()`` (``internals``: :func:`internals_of`) where it lists every entry in
    ``js``'s order, or every entry but hidden outputs (BatchNorm's saved statistics, a
    pooling workspace). Else (``js`` lacks removed ``amp_cast`` nodes, say) it is
    :func:`all_entries_symbol`: saving and loading that copy took a third of importing
    100,000 operators."""
    everything, names = internals
    if _lists_every_entry(js, names):
        return everything, None
    hidden = _Hidden.of(js, names) if len(names) < js["node_row_ptr"][-1] else None
    return (everything, hidden) if hidden is not None else (all_entries_symbol(js), None)


@dataclass(frozen=True)
class _Hidden:
    """Where ``get_internals()`` leaves out hidden outputs (BatchNorm's saved statistics, a
    pooling workspace, Dropout's mask): the entry row each output it lists has (in the JSON's
    ``node_row_ptr`` numbering), and the nodes with hidden outputs, whose outputs are then
    inferred alone, once per operator, attributes and inputs (:func:`_node_outputs`).
    Inferring the listed entries and these spares saving and loading a copy of the JSON
    with every entry a head."""

    rows: np.ndarray              # listed output -> its entry row
    visible: np.ndarray           # node -> outputs listed
    nodes: tuple[int, ...]        # the nodes with hidden outputs

    @staticmethod
    def of(js: dict, names: list[str]) -> "_Hidden | None":
        """The listing of ``names`` (``get_internals().list_outputs()``) in ``js``; None
        where it cannot be told apart (then the copy is used)."""
        row_ptr, nodes = js["node_row_ptr"], js["nodes"]
        visible, at = [], 0
        for i, node in enumerate(nodes):
            total = row_ptr[i + 1] - row_ptr[i]
            count = total if total == 1 or node["op"] == "null" else \
                _visible_outputs(node["op"], tuple(node.get("attrs", {}).items()),
                                 len(node["inputs"]))
            if count is None or not 0 < count <= total or at + count > len(names) or (
                    names[at] != node["name"] if node["op"] == "null" else
                    not names[at].startswith(node["name"] + "_")):
                return None
            visible.append(count)
            at += count
        shown = np.array(visible, dtype=np.int64)
        if at != len(names) or any(e[1] >= visible[e[0]] for node in nodes
                                   for e in node["inputs"]):
            return None         # a listing out of step, or a hidden output read
        first = np.asarray(row_ptr[:-1], dtype=np.int64)
        starts = np.cumsum(shown) - shown
        rows = np.repeat(first, shown) + np.arange(at) - np.repeat(starts, shown)
        return _Hidden(rows, shown, tuple(np.flatnonzero(
            shown < np.diff(np.asarray(row_ptr, dtype=np.int64))).tolist()))

    def spliced(self, js: dict, shapes: "_Shapes", codes: np.ndarray
                ) -> "tuple[_Shapes, np.ndarray] | None":
        """Every entry's shape and dtype code: the listed ones' (``shapes``, ``codes``), and
        the hidden ones' inferred alone; None where that fails."""
        row_ptr, nodes = js["node_row_ptr"], js["nodes"]
        n = row_ptr[-1]
        listed = np.full(n, -1, dtype=np.int64)       # entry row -> its listed output
        listed[self.rows] = np.arange(len(self.rows))
        hidden: dict[int, tuple] = {}       # entry row -> (shape, dtype code)
        for i in self.nodes:
            node = nodes[i]
            ins = []
            for src, index, _ in node["inputs"]:
                e = int(listed[row_ptr[src] + index])
                ins.append((tuple(shapes.dims[shapes.start[e]:shapes.start[e + 1]].tolist()),
                            int(codes[e])))
            found = _node_outputs(node["op"], tuple(node.get("attrs", {}).items()),
                                  tuple(ins), row_ptr[i + 1] - row_ptr[i])
            if found is None:
                return None
            for k in range(int(self.visible[i]), len(found)):
                hidden[row_ptr[i] + k] = found[k]
        ndim = np.zeros(n, dtype=np.int64)
        ndim[self.rows] = shapes.ndim
        all_codes = np.zeros(n, dtype=np.int64)
        all_codes[self.rows] = codes
        for row, (shape, code) in hidden.items():
            ndim[row], all_codes[row] = len(shape), code
        full = _Shapes.of(ndim, np.zeros(0, dtype=np.int64))
        dims = np.zeros(int(full.start[-1]), dtype=np.int64)
        lengths = np.diff(shapes.start)
        entry = np.repeat(np.arange(len(self.rows)), lengths)
        dims[full.start[self.rows][entry] + np.arange(len(shapes.dims)) -
             shapes.start[entry]] = shapes.dims
        for row, (shape, _) in hidden.items():
            dims[full.start[row]:full.start[row + 1]] = shape
        return _Shapes(ndim, dims, full.start), all_codes


#: MXNet's version as its JSON states it (1.9.1 -> 10901)
_VERSION = sum(int(part) * 100 ** (2 - k)
               for k, part in enumerate(mx.__version__.split(".")[:3]))


def _one_node_symbol(op: str, attrs: tuple, n_inputs: int, heads: list) -> mx.sym.Symbol:
    """A graph of ``op`` (``attrs``: its JSON attributes) reading variables ``in0`` ...,
    with ``heads`` (output indices of the node) its outputs."""
    nodes = [{"op": "null", "name": f"in{k}", "inputs": []} for k in range(n_inputs)]
    nodes.append({"op": op, "name": "node", "attrs": dict(attrs),
                  "inputs": [[k, 0, 0] for k in range(n_inputs)]})
    return symbol_from_json({
        "nodes": nodes, "arg_nodes": list(range(n_inputs)),
        "heads": [[n_inputs, k, 0] for k in heads],
        "attrs": {"mxnet_version": ["int", _VERSION]}})


@functools.lru_cache(maxsize=1 << 10)
def _visible_outputs(op: str, attrs: tuple, n_inputs: int) -> int | None:
    """How many outputs of ``op`` with ``attrs`` MXNet lists (None: it cannot say)."""
    try:
        return len(_one_node_symbol(op, attrs, n_inputs, [0]).get_internals()
                   .list_outputs()) - n_inputs
    except mx.base.MXNetError:
        return None


@functools.lru_cache(maxsize=1 << 12)
def _node_outputs(op: str, attrs: tuple, inputs: tuple, n_outputs: int
                  ) -> tuple[tuple[tuple[int, ...], int], ...] | None:
    """Each output's shape and dtype code, as MXNet infers them for ``op`` with ``attrs``
    reading ``inputs`` (shape, dtype code); None where it cannot (or leaves one unknown)."""
    try:
        symbol = _one_node_symbol(op, attrs, len(inputs), list(range(n_outputs)))
        names = [f"in{k}" for k in range(len(inputs))]
        _, shapes, _ = symbol.infer_shape_partial(**dict(zip(names, (s for s, _ in inputs))))
        _, types, _ = symbol.infer_type_partial(
            **{name: _DTYPE_MX_TO_NP[c] for name, (_, c) in zip(names, inputs) if c >= 0})
    except (mx.base.MXNetError, KeyError):
        return None
    if any(s is None or _unknown(s) for s in shapes) or any(t is None for t in types):
        return None
    return tuple((tuple(int(d) for d in s), int(_DTYPE_NP_TO_MX[np.dtype(t).type]))
                 for s, t in zip(shapes, types))


def internals_of(symbol: mx.sym.Symbol) -> tuple[mx.sym.Symbol, list[str]]:
    """``symbol.get_internals()`` and the names of its outputs."""
    internals = symbol.get_internals()
    return internals, internals.list_outputs()


@dataclass(frozen=True)
class _Shapes:
    """Shapes MXNet inferred, as arrays: entry ``k`` has ``ndim[k]`` dims (0 or less:
    unknown), ``dims[start[k]:start[k + 1]]``."""

    ndim: np.ndarray
    dims: np.ndarray
    start: np.ndarray

    @staticmethod
    def of(ndim: np.ndarray, dims: np.ndarray) -> "_Shapes":
        start = np.zeros(len(ndim) + 1, dtype=np.int64)
        np.cumsum(np.maximum(ndim, 0), out=start[1:])
        return _Shapes(ndim, dims, start)

    def unknown(self) -> np.ndarray:
        """Per entry, whether its shape is unknown (:func:`_unknown`: no dims, or a 0)."""
        zeros = np.zeros(len(self.dims) + 1, dtype=np.int64)
        np.cumsum(self.dims == 0, out=zeros[1:])
        return (self.ndim <= 0) | (zeros[self.start[1:]] > zeros[self.start[:-1]])


def _infer_shape_arrays(symbol: mx.sym.Symbol, shapes: Mapping[str, tuple[int, ...]]
                        ) -> tuple[_Shapes, _Shapes, _Shapes]:
    """``symbol.infer_shape_partial(**shapes)`` as arrays (:class:`_Shapes`) of its
    arguments, outputs and aux states. MXNet returns every entry's dims end to end in one
    buffer; reading it whole spares the tuple per entry its Python wrapper makes (a third
    of the inference at 100,000 operators). Where the buffer is not one piece, the wrapper's
    tuples are read instead."""
    wide = _int64_enabled()
    dim_t, ptr_t = (ctypes.c_int64, "q") if wide else (ctypes.c_int, "i")
    keys = list(shapes)
    indptr = np.cumsum([0] + [len(shapes[k]) for k in keys]).tolist()
    sizes = [mx_uint() for _ in range(3)]
    ndims = [ctypes.POINTER(ctypes.c_int)() for _ in range(3)]
    data = [ctypes.POINTER(ctypes.POINTER(dim_t))() for _ in range(3)]
    complete = ctypes.c_int()
    infer = _LIB.MXSymbolInferShapePartialEx64 if wide else _LIB.MXSymbolInferShapePartialEx
    check_call(infer(symbol.handle, mx_uint(len(keys)), c_str_array(keys),
                     c_array_buf(ctypes.c_int64 if wide else mx_uint,
                                 array("q" if wide else "I", indptr)),
                     c_array_buf(dim_t, array(ptr_t, [d for k in keys for d in shapes[k]])),
                     *(x for triple in zip(sizes, ndims, data) for x in map(ctypes.byref, triple)),
                     ctypes.byref(complete)))
    found = []
    for size, ndim_p, data_p in zip(sizes, ndims, data):
        n = size.value
        ndim = np.ctypeslib.as_array(ndim_p, (n,)).astype(np.int64) if n else \
            np.zeros(0, dtype=np.int64)
        shape = _Shapes.of(ndim, np.zeros(0, dtype=np.int64))
        total = int(shape.start[-1])
        if total:
            at = np.ctypeslib.as_array(ctypes.cast(data_p, ctypes.POINTER(ctypes.c_uint64)),
                                       (n,)).astype(np.int64)
            if not _one_buffer(at, shape.start, ctypes.sizeof(dim_t)):
                return _wrapped_shape_arrays(symbol, shapes)
            dims = np.ctypeslib.as_array(ctypes.cast(int(at[0]), ctypes.POINTER(dim_t)),
                                         (total,)).astype(np.int64)
            shape = _Shapes(ndim, dims, shape.start)
        found.append(shape)
    return tuple(found)


def _one_buffer(at: np.ndarray, start: np.ndarray, itemsize: int) -> bool:
    """Whether the entries' dims (at addresses ``at``) lie end to end in one buffer."""
    return bool(np.array_equal(at - at[0], start[:-1] * itemsize))


def _wrapped_shape_arrays(symbol: mx.sym.Symbol, shapes: Mapping[str, tuple[int, ...]]
                          ) -> tuple[_Shapes, _Shapes, _Shapes]:
    """:func:`_infer_shape_arrays` through MXNet's own wrapper."""
    found = []
    for entries in symbol.infer_shape_partial(**shapes):
        entries = [() if s is None else s for s in entries]
        found.append(_Shapes.of(np.array([len(s) for s in entries], dtype=np.int64),
                                np.array([d for s in entries for d in s], dtype=np.int64)))
    return tuple(found)


def _infer_shapes(everything: mx.sym.Symbol, shapes: dict, arg_names: list[str],
                  aux_names: list[str]) -> _Shapes:
    try:
        arg_shapes, out_shapes, aux_shapes = _infer_shape_arrays(everything, shapes)
    except mx.base.MXNetError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        raise ShapeInferenceError(
            f"MXNet cannot infer the graph's shapes from {_fmt(shapes)}: {first}. "
            f"Check the input shapes against what the first layers expect.") from e
    missing = [arg_names[k] for k in np.flatnonzero(arg_shapes.unknown()).tolist()]
    missing += [aux_names[k] for k in np.flatnonzero(aux_shapes.unknown()).tolist()]
    if missing:
        raise ShapeInferenceError(
            f"the shapes of {', '.join(missing)} cannot be inferred from {_fmt(shapes)}. "
            f"Pass them as keywords (e.g. {missing[0]}=(...)), or give the shapes of the "
            f"inputs they depend on.")
    unknown = np.flatnonzero(out_shapes.unknown()).tolist()
    if unknown:
        names = everything.list_outputs()
        missing = [names[k] for k in unknown]
        raise ShapeInferenceError(
            f"the shapes of the outputs {', '.join(missing[:8])} cannot be inferred from "
            f"{_fmt(shapes)}; give the shapes of every data input.")
    return out_shapes


def _infer_dtypes(everything: mx.sym.Symbol, dtypes: dict) -> np.ndarray:
    """MXNet's dtype of every output of ``everything``, as its type codes (read as one
    array, not through the Python wrapper's list)."""
    keys = [k for k, v in dtypes.items() if np.dtype(v).type in _DTYPE_NP_TO_MX]
    sizes = [mx_uint() for _ in range(3)]
    data = [ctypes.POINTER(ctypes.c_int)() for _ in range(3)]
    complete = ctypes.c_int()
    try:
        check_call(_LIB.MXSymbolInferTypePartial(
            everything.handle, mx_uint(len(keys)), c_str_array(keys),
            c_array_buf(ctypes.c_int, array("i", [_DTYPE_NP_TO_MX[np.dtype(dtypes[k]).type]
                                                 for k in keys])),
            *(x for pair in zip(sizes, data) for x in map(ctypes.byref, pair)),
            ctypes.byref(complete)))
    except mx.base.MXNetError as e:
        first = str(e).strip().splitlines()[0]
        raise ShapeInferenceError(
            f"MXNet cannot infer the graph's dtypes from {_fmt(dtypes)}: {first}") from e
    n = sizes[1].value
    codes = np.ctypeslib.as_array(data[1], (n,)).astype(np.int64) if n else \
        np.zeros(0, dtype=np.int64)
    unknown = np.flatnonzero(codes == -1).tolist()
    if unknown:
        names = everything.list_outputs()
        missing = [names[k] for k in unknown]
        raise ShapeInferenceError(
            f"the dtypes of {', '.join(missing[:8])} cannot be inferred from {_fmt(dtypes)}; "
            f"pass dtypes={{name: 'float32', ...}} for them.")
    return codes


def _tensor_infos(shapes: _Shapes, codes: np.ndarray) -> tuple[list[TensorInfo], list[int]]:
    """The distinct (shape, dtype) of the entries, and which of them each entry has."""
    n = len(shapes.ndim)
    if not n:
        return [], []
    width = int(shapes.ndim.max(initial=0))
    rows = np.zeros((n, width + 2), dtype=np.int64)
    rows[:, 0], rows[:, 1] = codes, shapes.ndim
    lengths = np.diff(shapes.start)
    entry = np.repeat(np.arange(n), lengths)
    rows[entry, 2 + np.arange(len(shapes.dims)) - shapes.start[entry]] = shapes.dims
    keys = np.ascontiguousarray(rows).view(np.dtype((np.void, rows.shape[1] * 8))).ravel()
    _, first, which = np.unique(keys, return_index=True, return_inverse=True)
    names: dict[int, str] = {}
    infos = []
    for code, ndim, *dims in rows[first].tolist():
        if code not in names:
            names[code] = np.dtype(_DTYPE_MX_TO_NP[code]).name
        infos.append(TensorInfo(tuple(dims[:ndim]), names[code]))
    return infos, which.reshape(-1).tolist()


def _fmt(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "no inputs"


def _labels(js: dict, label_inputs: LabelInputs | None) -> set[int]:
    """The variable nodes that operators read as labels (``label_inputs``)."""
    labels: set[int] = set()
    positions: dict[tuple, Sequence[int]] = {}      # (op, attributes) -> its label inputs
    for node in js["nodes"]:
        if node["op"] == "null" or label_inputs is None:
            continue
        key = (node["op"], tuple(node.get("attrs", {}).items()))
        if key not in positions:
            params = {k: parse_attr_value(v) for k, v in node.get("attrs", {}).items()
                      if not is_hidden_attr(k)}
            positions[key] = tuple(label_inputs(node["op"], params))
        for pos in positions[key]:
            if pos < len(node["inputs"]):
                labels.add(node["inputs"][pos][0])
    return labels


def _classify(js: dict, aux: set[str], data_names: set[str], labels: set[int]) -> dict[int, str]:
    """Kind of every variable node: aux state, label (``labels``, or named ``*label``), data
    or parameter, in that order of precedence."""
    kinds = {}
    for i, node in enumerate(js["nodes"]):
        if node["op"] != "null":
            continue
        name = node["name"]
        if name in aux:
            kinds[i] = "aux"
        elif i in labels or name.endswith("label"):
            kinds[i] = "label"
        elif name in data_names:
            kinds[i] = "data"
        else:
            kinds[i] = "param"
    return kinds


def _data_inputs(symbol: mx.sym.Symbol, shapes: Mapping[str, tuple[int, ...]],
                 arg_names: list[str], decided: set[str] = frozenset(),
                 known: Mapping[str, Future] | None = None) -> list[str]:
    """The inputs whose shapes are given and that MXNet cannot infer from the other given
    shapes: the data. A shape given for a weight (``fc_weight=(8, 6)``), which MXNet infers
    from the data's, leaves it a parameter. If every given shape follows from the others
    (``a * b`` with both given), all of them are data.

    ``decided``: inputs whose kind does not depend on being data (labels, aux states), tested
    last and only when no other is data (each test is one shape inference of the graph);
    ``known``: tests begun already (:func:`_needed`), by input name."""
    if len(shapes) < 2:
        return list(shapes)

    def needed(name: str) -> bool:
        if known and name in known:
            return known[name].result()
        return _needed(symbol, shapes, arg_names, name)

    data = [name for name in shapes if name not in decided and needed(name)]
    if data:
        return data     # whether a decided input is data changes no kind
    return [name for name in shapes if name in decided and needed(name)] or list(shapes)


def _needed(symbol: mx.sym.Symbol, shapes: Mapping[str, tuple[int, ...]],
            arg_names: list[str], name: str) -> bool:
    """Whether MXNet cannot infer input ``name``'s shape from the other given ``shapes``."""
    others = {k: v for k, v in shapes.items() if k != name}
    try:
        inferred = _infer_shape_arrays(symbol, others)[0]
    except mx.base.MXNetError:
        return True     # the others alone contradict: the given shape is needed
    return name not in arg_names or bool(inferred.unknown()[arg_names.index(name)])


def _roles(symbol: mx.sym.Symbol, js: dict, shapes: Mapping[str, tuple[int, ...]],
           arg_names: list[str], aux_names: list[str], data_names: list[str] | None,
           label_inputs: LabelInputs | None, known: Mapping[str, Future] | None = None
           ) -> tuple[set[int], list[str]]:
    """The label nodes (:func:`_labels`) and the data inputs: ``data_names``, or by default
    :func:`_data_inputs` (``known``: its tests begun already)."""
    labels = _labels(js, label_inputs)
    if data_names is None:
        decided = set(aux_names) | {js["nodes"][i]["name"] for i in labels} | \
            {n for n in shapes if n.endswith("label")}
        data_names = _data_inputs(symbol, shapes, arg_names, decided, known)
    return labels, data_names


def _unique_operator_names(js: dict) -> bool:
    """Give each operator whose name an earlier node has (a Gluon block called twice, as one
    ``self.relu`` used at two places) its own: ``name#2``, ``name#3``, ... in the order of
    the graph, so that plans, reports and the partitioned graph name one node each. MXNet
    binds variables by name, so two variables of one name are refused (MXNet cannot bind them
    either). Whether anything was renamed."""
    taken = {node["name"] for node in js["nodes"]}
    seen: dict[str, int] = {}
    renamed = False
    for i, node in enumerate(js["nodes"]):
        name = node["name"]
        if name not in seen:
            seen[name] = i
            continue
        if node["op"] == "null" and js["nodes"][seen[name]]["op"] == "null":
            raise InvalidArgumentError(
                f"the symbol has two variables named {name!r} (nodes {seen[name]} and {i}); "
                f"MXNet binds variables by name and cannot bind this symbol either: give each "
                f"variable its own name")
        if node["op"] == "null":       # the variable keeps its name: the operator is renamed
            node, name = js["nodes"][seen[name]], name
            seen[name] = i
        n = 2
        while f"{name}#{n}" in taken:
            n += 1
        node["name"] = f"{name}#{n}"
        taken.add(node["name"])
        renamed = True
    return renamed


def import_symbol(symbol: mx.sym.Symbol, *, dtypes: Mapping[str, Any] | None = None,
                  data_names: list[str] | None = None, label_inputs: LabelInputs | None = None,
                  **shapes: Any) -> Graph:
    """Import ``symbol`` with the given input shapes into a :class:`~nnvm_passes.ir.Graph`.

    ``shapes`` use ``simple_bind``'s keyword form (``data=(32, 3, 224, 224)``); ``dtypes``
    maps input names to dtypes (float32 where not given). Variables are classified as
    ``aux`` (auxiliary states), ``label`` (read where ``label_inputs(op, attrs)`` says an
    operator reads a label, or named ``*label``), ``data`` (named in ``data_names``; by
    default, every input whose shape is given and cannot be inferred from the other given
    shapes: see :func:`_data_inputs`) and ``param`` (everything else). The caller's symbol is not modified.
    """
    check_symbol(symbol)
    # MXNet's C calls (saving the JSON, listing, inferring) release the GIL: the independent
    # ones run side by side on two threads (at 100,000 operators they are most of the
    # import). The data-input tests need no JSON: those of the inputs no name or aux state
    # decides begin while it is saved (a label the JSON shows may leave one unused).
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="tofu_mx-import") as pool:
        text = pool.submit(symbol_json, symbol, True)
        arg_names = symbol.list_arguments()
        aux_names = symbol.list_auxiliary_states()
        inputs = arg_names + aux_names
        try:        # raised after the JSON's own check, whose error comes first
            dtypes = _check_dtypes(dtypes)
            _check_names(shapes, inputs, "shape")
            _check_names(dtypes, inputs, "dtype")
            shapes = {k: _check_shape(k, v) for k, v in shapes.items()}
            _check_given_shapes(symbol, shapes, arg_names, aux_names)
            if data_names is not None:
                _check_names(dict.fromkeys(data_names), inputs, "data name")
            invalid = None
        except Exception as e:      # noqa: BLE001 (raised below, in its turn)
            invalid = e
        known = {} if invalid is not None or data_names is not None or len(shapes) < 2 else {
            name: pool.submit(_needed, symbol, shapes, arg_names, name)
            for name in shapes if name not in aux_names and not name.endswith("label")}
        js = json.loads(text.result())
        if _unique_operator_names(js):
            symbol = symbol_from_json(js)
        internals = internals_of(symbol)
        if invalid is not None:
            raise invalid
        type_dict = {k: "float32" for k in shapes}
        type_dict.update(dtypes)

        everything, hidden = _entries_symbol(js, internals)
        types = pool.submit(_infer_dtypes, everything, type_dict)
        roles = pool.submit(_roles, symbol, js, shapes, arg_names, aux_names, data_names,
                            label_inputs, known)
        out_shapes = _infer_shapes(everything, shapes, arg_names, aux_names)
        out_types = types.result()
        if hidden is not None:
            spliced = hidden.spliced(js, out_shapes, out_types)
            if spliced is None:     # a hidden output MXNet cannot infer alone: the copy
                everything = all_entries_symbol(js)
                types = pool.submit(_infer_dtypes, everything, type_dict)
                out_shapes = _infer_shapes(everything, shapes, arg_names, aux_names)
                spliced = out_shapes, types.result()
            out_shapes, out_types = spliced
        labels, data_names = roles.result()
    kinds = _classify(js, set(aux_names), set(data_names), labels)
    infos, info_at = _tensor_infos(out_shapes, out_types)
    return Graph(nodes=_nodes(js, infos, info_at, kinds),
                 heads=tuple(Entry(*e) for e in js["heads"]),
                 attrs=FrozenDict({k: json.dumps(v) for k, v in js.get("attrs", {}).items()}))


def _nodes(js: dict, infos: list[TensorInfo], info_at: list[int], kinds: dict[int, str]
           ) -> tuple[Node, ...]:
    """The IR's nodes; ``infos[info_at[k]]``: the shape and dtype of output entry ``k``.
    Equal values are made once and shared (they are immutable): a tensor's shape and dtype,
    a node's attributes (so that their hash is computed once)."""
    attrs: dict[tuple, FrozenDict] = {}
    no_attrs = FrozenDict()
    nodes = []
    append = nodes.append
    row_ptr = js["node_row_ptr"]
    get_attrs, get_kind = attrs.get, kinds.get

    for i, jn in enumerate(js["nodes"]):
        row, end = row_ptr[i], row_ptr[i + 1]
        if end == row + 1:          # most nodes: one output
            outputs = (infos[info_at[row]],)
        else:
            outputs = tuple([infos[k] for k in info_at[row:end]])
        raw = jn.get("attrs")
        if raw:
            key = tuple(raw.items())
            found = get_attrs(key)
            if found is None:
                found = attrs[key] = FrozenDict(raw)
        else:
            found = no_attrs
        # MXNet writes "op", "name" and "inputs" for every node: anything beyond those and
        # "attrs" is extra (counted, as testing the keys as a set took a fifth of the loop)
        extra = NO_EXTRA if len(jn) == (4 if raw is not None else 3) else \
            FrozenDict({k: json.dumps(v) for k, v in jn.items() if k not in _JSON_NODE_KEYS})
        ins = jn["inputs"]
        append(Node(jn["name"], jn["op"], found,
                    tuple([Entry(*e) for e in ins]) if ins else (), outputs, get_kind(i), extra))
    return tuple(nodes)
