"""A small immutable IR of an MXNet (NNVM) graph, with shapes and dtypes attached.

``Graph.nodes`` is in MXNet's own node order, which is topological. An operator node's
inputs are :class:`Entry` references ``(producer index, output index, version)`` exactly as
in MXNet's JSON graph, so that exporting the IR gives MXNet's graph back unchanged.
Values are updated functionally: ``replace`` returns a new object, or ``self`` when nothing
changed.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

#: Kinds of variable nodes. ``None`` is the kind of operator nodes.
VARIABLE_KINDS = ("data", "label", "param", "aux")


class FrozenDict(Mapping[str, Any]):
    """A hashable, read-only mapping that keeps insertion order."""

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping[str, Any] | None = None, **kwargs: Any):
        merged = dict(items or {}, **kwargs)
        self._items = merged
        self._hash = None

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    # the dict's own (Mapping's mixins go through __getitem__, and get() through a KeyError
    # for each absent key: slow where every node's attributes are asked)
    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str, default: Any = None) -> Any:
        return self._items.get(key, default)

    def keys(self):
        return self._items.keys()

    def items(self):
        return self._items.items()

    def values(self):
        return self._items.values()

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._items.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if type(other) is FrozenDict:   # the common case, kept cheap: it is hashed and compared
            return self is other or self._items == other._items   # in search signatures
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenDict({self._items!r})"

    def updated(self, **changes: Any) -> "FrozenDict":
        """A copy with ``changes`` applied; ``self`` when they change nothing."""
        if all(k in self._items and self._items[k] == v for k, v in changes.items()):
            return self
        return FrozenDict(self._items, **changes)


def is_hidden_attr(key: str) -> bool:
    """MXNet's hidden attributes (``__ctx_group__``, ``__shape__``, ...) are not op parameters."""
    return key.startswith("__") and key.endswith("__")


def parse_attr_value(text: str) -> Any:
    """Parse an MXNet attribute string: ``"(3, 3)"`` -> (3, 3), ``"True"`` -> True, ``"64"`` -> 64.

    A string that is not a Python literal (``"relu"``, ``"NCHW"``) is returned unchanged.
    """
    value = _literal(text) if isinstance(text, str) else _literal.__wrapped__(text)
    if isinstance(value, _SCALARS) or isinstance(value, tuple) and \
            all(isinstance(v, _SCALARS) for v in value):
        return value
    return copy.deepcopy(value)     # a mutable value: the caller's own


_SCALARS = (bool, int, float, complex, str, bytes, type(None))


@functools.lru_cache(maxsize=1 << 14)
def _literal(text: str) -> Any:
    """:func:`parse_attr_value`, cached: a graph spells the same few values on every node."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def format_attr_value(value: Any) -> str:
    """The inverse of :func:`parse_attr_value`, in the spelling MXNet itself writes."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(format_attr_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


# The classes below are made by the hundred thousand (a node, an entry per input): their
# __init__ is written out, filling the instance's __dict__, since the one a frozen dataclass
# generates calls object.__setattr__ once per field and took five times as long. Frozen
# all the same: setting an attribute afterwards raises FrozenInstanceError.


@dataclass(frozen=True, init=False)
class Entry:
    """One output of one node: ``(node index, output index, version)`` as in MXNet's JSON."""

    node: int
    index: int = 0
    version: int = 0

    def __init__(self, node: int, index: int = 0, version: int = 0):
        fields = self.__dict__
        fields["node"] = node
        fields["index"] = index
        fields["version"] = version

    def to_json(self) -> list[int]:
        return [self.node, self.index, self.version]


@dataclass(frozen=True, init=False)
class TensorInfo:
    """Shape and dtype of one output entry."""

    shape: tuple[int, ...]
    dtype: str

    def __init__(self, shape: tuple[int, ...], dtype: str):
        fields = self.__dict__
        fields["shape"] = shape
        fields["dtype"] = dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * _itemsize(self.dtype)


@functools.lru_cache(maxsize=None)
def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


#: the ``extra`` of a node with nothing beyond what the IR models (shared: it is immutable)
NO_EXTRA = FrozenDict()


@dataclass(frozen=True, init=False)
class Node:
    """One node of the graph: an operator (``op != "null"``) or a variable.

    ``attrs`` holds MXNet's attribute strings verbatim, hidden ones (``__ctx_group__``)
    included; ``params`` is the parsed view of the operator's own parameters.
    ``kind`` is one of :data:`VARIABLE_KINDS` for a variable and ``None`` for an operator.
    ``extra`` keeps any other key of MXNet's JSON node (e.g. ``subgraphs``) for the round trip.
    """

    name: str
    op: str
    attrs: FrozenDict
    inputs: tuple[Entry, ...]
    outputs: tuple[TensorInfo, ...]
    kind: str | None = None
    extra: FrozenDict = dataclasses.field(default_factory=FrozenDict)
    #: whether the node is a variable (``op == "null"``): kept as a field, since the passes
    #: ask it of every node many times over
    is_variable: bool = dataclasses.field(init=False, repr=False, compare=False)

    def __init__(self, name: str, op: str, attrs: FrozenDict, inputs: tuple[Entry, ...],
                 outputs: tuple[TensorInfo, ...], kind: str | None = None,
                 extra: FrozenDict = NO_EXTRA):
        fields = self.__dict__
        fields["name"] = name
        fields["op"] = op
        fields["attrs"] = attrs
        fields["inputs"] = inputs
        fields["outputs"] = outputs
        fields["kind"] = kind
        fields["extra"] = extra
        fields["is_variable"] = op == "null"

    @property
    def params(self) -> dict[str, Any]:
        """The operator's parameters, parsed (hidden ``__x__`` attributes left out)."""
        return {k: parse_attr_value(v) for k, v in self.attrs.items() if not is_hidden_attr(k)}

    @property
    def ctx_group(self) -> str | None:
        return self.attrs.get("__ctx_group__")

    def replace(self, **changes: Any) -> "Node":
        """A copy with ``changes``; ``self`` when they change nothing."""
        if not changes.keys() <= _NODE_FIELDS:
            raise TypeError(f"Node has no fields {sorted(changes.keys() - _NODE_FIELDS)} to "
                            f"replace (it has {sorted(_NODE_FIELDS)})")
        if all(getattr(self, k) == v for k, v in changes.items()):
            return self
        get = changes.get     # not dataclasses.replace: it is slow, and the passes call this
        return Node(get("name", self.name), get("op", self.op), get("attrs", self.attrs),
                    get("inputs", self.inputs), get("outputs", self.outputs),
                    get("kind", self.kind), get("extra", self.extra))


_NODE_FIELDS = frozenset(f.name for f in dataclasses.fields(Node) if f.init)


@dataclass(frozen=True)
class Interleave:
    """How a variable of a graph is laid out against the caller's array of that name: the
    ``groups`` equal consecutive blocks of ``axis`` interleaved. Element ``h * groups + j``
    of the graph's axis is element ``j * (length // groups) + h`` of the caller's (an LSTM's
    four gates, stored so that a contiguous slice holds a slice of every gate:
    :mod:`nnvm_passes.interleave`)."""

    axis: int
    groups: int

    def order(self, length: int) -> np.ndarray:
        """For each position of the graph's axis, the caller's position it holds."""
        size = length // self.groups
        return np.arange(length).reshape(self.groups, size).T.reshape(-1)


@dataclass(frozen=True)
class Graph:
    """A whole graph: nodes in topological order, its output entries, MXNet's graph attrs,
    and the variables laid out otherwise than the caller's arrays (``layouts``: name ->
    :class:`Interleave`; none but after :mod:`nnvm_passes.interleave`)."""

    nodes: tuple[Node, ...]
    heads: tuple[Entry, ...]
    attrs: FrozenDict = dataclasses.field(default_factory=FrozenDict)
    layouts: FrozenDict = dataclasses.field(default_factory=FrozenDict)

    def replace(self, **changes: Any) -> "Graph":
        if all(getattr(self, k) == v for k, v in changes.items()):
            return self
        return dataclasses.replace(self, **changes)

    # --- look-ups -------------------------------------------------------------------------
    def index(self, name: str) -> int:
        """Index of the node called ``name``."""
        for i, node in enumerate(self.nodes):
            if node.name == name:
                return i
        raise KeyError(f"no node named {name!r} in the graph")

    def node(self, name: str) -> Node:
        return self.nodes[self.index(name)]

    def tensor(self, entry: Entry) -> TensorInfo:
        """Shape and dtype of an output entry."""
        return self.nodes[entry.node].outputs[entry.index]

    def variables(self, kind: str | None = None) -> list[Node]:
        """Variable nodes in graph order, optionally only those of one kind."""
        return [n for n in self.nodes if n.is_variable and (kind is None or n.kind == kind)]

    def operators(self) -> list[Node]:
        return [n for n in self.nodes if not n.is_variable]

    def consumers(self) -> dict[int, list[tuple[int, int]]]:
        """For each node index, the ``(consumer index, input position)`` pairs reading it."""
        out: dict[int, list[tuple[int, int]]] = {i: [] for i in range(len(self.nodes))}
        for i, node in enumerate(self.nodes):
            for pos, entry in enumerate(node.inputs):
                out[entry.node].append((i, pos))
        return out

    @property
    def arg_names(self) -> list[str]:
        """Arguments in MXNet's ``list_arguments`` order (graph order, aux states left out)."""
        return [n.name for n in self.variables() if n.kind != "aux"]

    @property
    def aux_names(self) -> list[str]:
        return [n.name for n in self.variables("aux")]

    @property
    def output_infos(self) -> list[TensorInfo]:
        return [self.tensor(e) for e in self.heads]
