"""A partitioned plan by layer: one row per layer of the model, how each device holds it.

Where :mod:`tofu_mx.runtime.draw`'s Graphviz picture draws the searched graph's operators
and edges (readable up to a few dozen operators), this view is a table a person reads for a
real network, in the manner of JAX's ``visualize_array_sharding``:

- **A row is a layer**: an operator of the graph the user gave (``conv0``, ``batchnorm0``,
  ``stage1__plus0``), named as the Gluon export names it (the prefix common to every layer
  and ``_fwd`` left out). An operator the partition computes as several smaller ones
  (BatchNorm, lowered into the sums its statistics are made of) is folded back into its
  row, which counts them.
- **Output held** and **weight held** draw the layer's output and its largest parameter as a
  rectangle cut where the devices' parts are cut (the first axis cut runs across, the others
  down), each part filled with the colour of the device holding it (several colours: each of
  those devices holds a copy), with the same in words (``axis 0 in 2 x axis 1 in 2``).
- **partial sums**: some share computes a partial result over its slice of a summed axis,
  and the partial results are added across devices.
- **moved**: the bytes MXNet copies between devices in the forward pass for the layer (the
  parts its devices read that others hold, and its partial sums), read off the
  :class:`~nnvm_passes.program.Program`; the backward pass moves about as much again. The
  rows and the outputs' gathering add up to :func:`~tofu_mx.runtime.draw.cross_device_bytes`.
- Beside the table: memory per device (:meth:`PartitionedSymbol.memory_per_device`) and the
  bytes each cut of the recursion moves per training step (the plan's cost model).

:func:`layers` gives the rows as plain data; :func:`render` the matplotlib figure, at most
:data:`MAX_SIDE` pixels on its long side: a graph with more layers than fit shows the first
ones and says how many are left out (``only=`` draws the layers whose names contain a text,
a stage at a time).
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from nnvm_passes.ir import Graph
from nnvm_passes.lower import lowered_from
from tofu_mx.summary import format_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tofu_mx.runtime.partitioned import PartitionedSymbol

Box = tuple[tuple[int, int], ...]

#: the most pixels on the picture's long side
MAX_SIDE = 4000
_ROW, _BLOCK_ROWS, _BLOCKS = 18, 90, 2       # row height (px), rows per column block, blocks


@dataclass(frozen=True)
class Held:
    """How the devices hold one tensor: each distinct part (a box of index spans, inclusive)
    and the devices holding it."""

    name: str
    shape: tuple[int, ...]
    parts: tuple[tuple[Box, tuple[int, ...]], ...]

    @property
    def cut_axes(self) -> tuple[int, ...]:
        return tuple(a for a in range(len(self.shape))
                     if len({box[a] for box, _ in self.parts}) > 1)

    def words(self, num_devices: int) -> str:
        """``axis 0 in 2 x axis 1 in 2``, ``whole, every device``, ``whole, device 0``; with
        ``, 2 copies`` where each part is held by several devices."""
        axes = self.cut_axes
        copies = min(len(devices) for _, devices in self.parts)
        if not axes:
            holders = sorted({d for _, devices in self.parts for d in devices})
            where = ("every device" if len(holders) == num_devices else
                     f"device{'s' if len(holders) > 1 else ''} "
                     f"{','.join(map(str, holders))}")
            return f"whole, {where}"
        text = " x ".join(f"axis {a} in {len({box[a] for box, _ in self.parts})}"
                          for a in axes)
        return text + (f", {copies} copies" if copies > 1 else "")


@dataclass(frozen=True)
class Layer:
    """One row: an operator of the user's graph and what the partition does with it."""

    name: str                     # the operator's name in the user's graph
    op: str                       # its MXNet operator
    operators: int                # operators of the partitioned search graph it stands for
    output: Held | None           # its output (the largest, where it has several)
    weight: Held | None           # its largest parameter
    partial_sums: bool            # some share's results are summed across devices
    moved: int                    # bytes crossing devices in the forward pass for it
    devices: tuple[int, ...]      # devices running a share of it
    fallback: str = ""            # why it runs whole, where it does


@dataclass(frozen=True)
class LayerView:
    layers: tuple[Layer, ...]
    prefix: str                   # left out of every name
    num_devices: int
    devices: tuple[str, ...]
    outputs_moved: int            # bytes moved to join the outputs on device 0
    plan_bytes: float             # the plan's bytes per training step (both passes)
    cuts: tuple[tuple[int, float], ...]   # per cut: parts, bytes per training step
    memory: tuple                 # DeviceMemory rows

    @property
    def forward_bytes(self) -> int:
        return sum(layer.moved for layer in self.layers) + self.outputs_moved

    def short(self, name: str) -> str:
        name = name[len(self.prefix):] if name.startswith(self.prefix) else name
        return name[:-4] if name.endswith("_fwd") else name


def layers(ptd: PartitionedSymbol) -> LayerView:
    """The rows of ``ptd``'s plan, one per operator of the graph the user partitioned."""
    from tofu_mx.runtime.draw import moved_bytes
    graph = ptd.graph
    members = _members(graph, _user_operators(ptd.reference))
    strategies = {o.name: o.strategies for o in ptd.plan.ops}
    fallbacks = ptd.fallbacks
    k = len(ptd.contexts)
    moved: dict[int, int] = {}          # operator -> bytes read into it or combined for it
    outputs = 0                         # bytes gathering the outputs on device 0
    for key, nbytes in moved_bytes(ptd.program).items():
        if key[0] == "output":
            outputs += nbytes
        else:
            moved[key[1]] = moved.get(key[1], 0) + nbytes
    consumers = graph.consumers()
    rows = []
    for name, (op, group) in members.items():
        rows.append(Layer(
            name, op, len(group), _held(graph, ptd, _output_of(graph, consumers, group)),
            _held(graph, ptd, _weight_of(graph, group)),
            any(s.kind == "reduce" for m in group
                for s in strategies.get(graph.nodes[m].name, ())),
            sum(moved.get(m, 0) for m in group),
            tuple(sorted({d for m in group for d in ptd.program.placement.get(m, ())})),
            "; ".join(f"{graph.nodes[m].name}: {fallbacks[graph.nodes[m].name]}"
                      for m in group if graph.nodes[m].name in fallbacks)))
    cuts = tuple((level.parts, level.bytes) for level in ptd.plan.levels)
    return LayerView(tuple(rows), _common_prefix([r.name for r in rows]), k,
                     tuple(str(c) for c in ptd.contexts), outputs, ptd.plan.total_bytes,
                     cuts, tuple(ptd.memory_per_device()))


def _user_operators(reference) -> dict[str, str]:
    """Name -> MXNet operator of every operator of the user's Symbol."""
    nodes = json.loads(reference.tojson())["nodes"]
    return {n["name"]: n["op"] for n in nodes if n["op"] != "null"}


def _members(graph: Graph, user: dict[str, str]) -> dict[str, tuple[str, list[int]]]:
    """Per operator of the user's graph, in the searched graph's order: its operator and the
    searched graph's nodes computing it (itself, or what lowering emitted: ``name/part``)."""
    found: dict[str, tuple[str, list[int]]] = {}
    for i, node in enumerate(graph.nodes):
        if node.is_variable:
            continue
        name = lowered_from(node.name, user) or node.name
        found.setdefault(name, (user.get(name, node.op), []))[1].append(i)
    return found


def _output_of(graph: Graph, consumers: dict[int, list[tuple[int, int]]],
               group: Sequence[int]) -> tuple[int, int] | None:
    """The group's output: the largest tensor it makes that others (or the heads) read
    (``consumers``: :meth:`Graph.consumers`)."""
    inside = set(group)
    read = {(m, graph.nodes[c].inputs[p].index) for m in group for c, p in consumers[m]
            if c not in inside}
    read |= {(e.node, e.index) for e in graph.heads if e.node in inside}
    if not read:
        return (max(group), 0)
    return max(sorted(read), key=lambda t: graph.nodes[t[0]].outputs[t[1]].size)


def _weight_of(graph: Graph, group: Sequence[int]) -> tuple[int, int] | None:
    params = {e.node for m in group for e in graph.nodes[m].inputs
              if graph.nodes[e.node].is_variable and graph.nodes[e.node].kind == "param"}
    if not params:
        return None
    return (max(sorted(params), key=lambda v: graph.nodes[v].outputs[0].size), 0)


def _held(graph: Graph, ptd: PartitionedSymbol, tensor: tuple[int, int] | None) -> Held | None:
    if tensor is None or tensor not in ptd.assignment.stored:
        return None
    node = graph.nodes[tensor[0]]
    shape = tuple(node.outputs[tensor[1]].shape)
    from tofu_mx.runtime.draw import clip
    parts: dict[Box, list[int]] = {}
    for d, box in enumerate(ptd.assignment.stored[tensor]):
        parts.setdefault(clip(box, shape), []).append(d)
    return Held(node.name, shape, tuple((b, tuple(d)) for b, d in parts.items()))


def _common_prefix(names: Sequence[str]) -> str:
    """The network's prefix (Gluon's ``resnetv10_``): the text up to the first ``_`` that most
    names start with, where they do not end there (names without it are shown whole)."""
    heads = [n[:n.find("_") + 1] for n in names if 0 < n.find("_") < len(n) - 1]
    if not heads:
        return ""
    prefix = max(sorted(set(heads)), key=heads.count)
    return prefix if 2 * heads.count(prefix) > len(names) else ""


# --- the figure --------------------------------------------------------------------------------
_COLUMNS = (("#", 34), ("layer", 190), ("operator", 130), ("output", 120),
            ("output held", 290), ("weight", 110), ("weight held", 230), ("moved", 170))
_MEMORY_KINDS = (("weights", "#4c72b0"), ("gradients", "#dd8452"), ("optimizer", "#937860"),
                 ("aux", "#8172b3"), ("inputs", "#55a868"), ("activations", "#c44e52"))
_GRID_W, _SIDE_W = 70, 520


def render(view: LayerView, only: str | None = None, title: str | None = None) -> Figure:
    """The figure of ``view``: the table (the layers whose names contain ``only``, or all),
    memory per device and bytes per cut beside it, the legend under it."""
    from matplotlib.figure import Figure
    from tofu_mx.runtime.draw import device_colours
    rows = [r for r in view.layers if only is None or only in r.name]
    if not rows:
        from tofu_mx.errors import InvalidArgumentError
        names = ", ".join(view.short(r.name) for r in view.layers[:4])
        raise InvalidArgumentError(f"only={only!r} is in no layer's name; the layers are "
                                   f"named e.g. {names}")
    shown = rows[:_BLOCK_ROWS * _BLOCKS]
    blocks = max(1, -(-len(shown) // _BLOCK_ROWS))
    per_block = -(-len(shown) // blocks) if shown else 0
    table_w = sum(w for _, w in _COLUMNS)
    width = blocks * table_w + _SIDE_W + 40
    legend = _legend(view, len(rows) - len(shown), only)
    height = max(110 + per_block * _ROW, 760) + 16 * len(legend) + 30
    fig = Figure(figsize=(width / 100, height / 100), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    colours = device_colours(view.num_devices)
    ax.text(20, 24, title or _title(view, len(rows), only), fontsize=12, va="center",
            weight="bold")
    heaviest = max([r.moved for r in view.layers] + [1])
    for b in range(blocks):
        x0 = 20 + b * table_w
        _header(ax, x0, 70)
        for n, row in enumerate(shown[b * per_block:(b + 1) * per_block]):
            _row(ax, view, row, b * per_block + n + 1, x0, 90 + n * _ROW, colours, heaviest)
    side = 20 + blocks * table_w + 20
    _devices_key(ax, view, colours, side, 60)
    _memory(fig, view, side, width, height)
    _cuts(fig, view, side, width, height)
    top = max(110 + per_block * _ROW, 760)
    for n, line in enumerate(legend):
        ax.text(20, top + 16 * n, line, fontsize=9, va="center")
    return fig


def _title(view: LayerView, rows: int, only: str | None) -> str:
    cuts = " x ".join(str(p) for p, _ in view.cuts) or "none"
    which = f"{rows} layers" + (f" whose names contain {only!r}" if only else "")
    return (f"{which} on {view.num_devices} devices (cuts {cuts}): the plan moves "
            f"{format_bytes(view.plan_bytes)} per training step; "
            f"{format_bytes(view.forward_bytes)} cross devices in the forward pass")


def _header(ax, x0: float, y: float) -> None:
    x = x0
    for name, w in _COLUMNS:
        ax.text(x + 2, y, name, fontsize=9, weight="bold", va="center")
        x += w
    ax.plot([x0, x], [y + 9, y + 9], color="#444444", linewidth=0.8)


def _row(ax, view: LayerView, row: Layer, number: int, x0: float, y: float,
         colours: Sequence[str], heaviest: int) -> None:
    if number % 2 == 0:
        ax.add_patch(_rect(x0, y - _ROW / 2, sum(w for _, w in _COLUMNS), _ROW, "#f3f3f3"))
    op = row.op + (f" ({row.operators} ops)" if row.operators > 1 else "")
    texts = [str(number), view.short(row.name), op,
             "x".join(map(str, row.output.shape)) if row.output else ""]
    x = x0
    for text, (_, w) in zip(texts, _COLUMNS):
        ax.text(x + 2, y, _fit(text, w), fontsize=8, va="center",
                color="#d62728" if row.fallback and w == _COLUMNS[1][1] else "black")
        x += w
    x = _held_cell(ax, row.output, view, colours, x, y, row.partial_sums, _COLUMNS[4][1])
    weight = "x".join(map(str, row.weight.shape)) if row.weight else ""
    ax.text(x + 2, y, _fit(weight, _COLUMNS[5][1]), fontsize=8, va="center")
    x = _held_cell(ax, row.weight, view, colours, x + _COLUMNS[5][1], y, False,
                   _COLUMNS[6][1])
    if row.moved:
        ax.add_patch(_rect(x + 2, y - 5, 90 * row.moved / heaviest, 10, "#9aa7b8"))
        ax.text(x + 96, y, format_bytes(row.moved), fontsize=8, va="center")


def _held_cell(ax, held: Held | None, view: LayerView, colours, x: float, y: float,
               partial: bool, width: float) -> float:
    if held is not None:
        _grid(ax, held, colours, x + 2, y - 6, _GRID_W - 8, 12)
        words = held.words(view.num_devices) + ("; partial sums" if partial else "")
        ax.text(x + _GRID_W, y, _fit(words, width - _GRID_W), fontsize=8, va="center")
    return x + width


def _grid(ax, held: Held, colours, x: float, y: float, w: float, h: float) -> None:
    """The tensor as a w x h rectangle: the first cut axis across, the others down."""
    axes = held.cut_axes
    across = axes[0] if axes else None
    downs = sorted({tuple(box[a] for a in axes[1:]) for box, _ in held.parts})
    for box, devices in held.parts:
        if across is None:
            x0, x1 = 0.0, 1.0
        else:
            n = held.shape[across]
            x0, x1 = box[across][0] / n, (box[across][1] + 1) / n
        row = downs.index(tuple(box[a] for a in axes[1:]))
        y0, y1 = row / len(downs), (row + 1) / len(downs)
        stripe = (x1 - x0) / len(devices)
        for s, d in enumerate(devices):
            ax.add_patch(_rect(x + w * (x0 + s * stripe), y + h * y0, w * stripe,
                               h * (y1 - y0), colours[d]))
        ax.add_patch(_rect(x + w * x0, y + h * y0, w * (x1 - x0), h * (y1 - y0), "none",
                           edge="#333333"))


def _rect(x, y, w, h, fill, edge=None):
    from matplotlib.patches import Rectangle
    return Rectangle((x, y), w, h, facecolor=fill, edgecolor=edge or "none", linewidth=0.5)


def _fit(text: str, width: float) -> str:
    most = max(4, int(width / 5.6))
    return text if len(text) <= most else text[:most - 1] + "\u2026"


def _devices_key(ax, view: LayerView, colours, x: float, y: float) -> None:
    ax.text(x, y, "devices", fontsize=10, weight="bold", va="center")
    for d, name in enumerate(view.devices):
        col, line = divmod(d, 8)
        ax.add_patch(_rect(x + col * 130, y + 14 + 16 * line, 14, 11, colours[d], "#333333"))
        ax.text(x + col * 130 + 20, y + 20 + 16 * line, f"{d}: {name}", fontsize=8,
                va="center")


def _memory(fig, view: LayerView, x: float, width: float, height: float) -> None:
    """Memory per device, stacked by kind."""
    top = 60 + 16 * min(8, view.num_devices) + 50
    ax = fig.add_axes(((x + 60) / width, 1 - (top + 250) / height,
                       (_SIDE_W - 90) / width, 250 / height))
    rows = view.memory
    left = [0.0] * len(rows)
    unit = max([m.total for m in rows] + [1])
    scale, label = (2 ** 30, "GiB") if unit >= 2 ** 30 else (2 ** 20, "MiB")
    for kind, colour in _MEMORY_KINDS:
        values = [getattr(m, kind) / scale for m in rows]
        if any(values):
            ax.barh(range(len(rows)), values, left=left, color=colour, label=kind)
            left = [a + b for a, b in zip(left, values)]
    ax.set_yticks(range(len(rows)), [str(d) for d in range(len(rows))], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(label, fontsize=8)
    ax.set_ylabel("device", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title("memory per device at the end of the forward pass", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3,
              frameon=False)


def _cuts(fig, view: LayerView, x: float, width: float, height: float) -> None:
    """Bytes each cut of the recursion moves per training step."""
    top = 60 + 16 * min(8, view.num_devices) + 50 + 250 + 120
    ax = fig.add_axes(((x + 60) / width, 1 - (top + 40 + 28 * len(view.cuts)) / height,
                       (_SIDE_W - 90) / width, (40 + 28 * len(view.cuts)) / height))
    values = [b for _, b in view.cuts]
    unit = max(values + [1])
    scale, label = (2 ** 30, "GiB") if unit >= 2 ** 30 else (2 ** 20, "MiB")
    names = [f"cut {n + 1}: in {p}" for n, (p, _) in enumerate(view.cuts)]
    ax.barh(range(len(values)), [v / scale for v in values], color="#9aa7b8")
    ax.set_yticks(range(len(values)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"{label} per training step (forward and backward)", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title("bytes moved by each cut of the recursion", fontsize=9)


def _legend(view: LayerView, left_out: int, only: str | None) -> list[str]:
    lines = [
        "How to read it. A row is one layer of your model (an operator of its MXNet graph); "
        "one computed as several smaller operators (BatchNorm) counts them after its name.",
        "output held / weight held: the tensor as a rectangle, cut where the devices' parts "
        "are cut (the first axis cut runs across, the others down); each part has the colour "
        "of the device holding it, several colours where several devices hold a copy.",
        "'axis 0 in 4' = cut into 4 pieces along axis 0. In an image network axis 0 of an "
        "activation is the batch and axis 1 its channels; axis 0 of a convolution's weight is "
        "its output channels, axis 1 its input channels.",
        "partial sums: each device computes a partial result over its piece of a summed axis, "
        "and the partial results are added across devices.",
        "moved: bytes copied between devices in the forward pass for the layer (what its "
        "devices read that others hold, and its partial sums); the backward pass moves about "
        "as much again." + (f" Layer names are shown without {view.prefix!r} and '_fwd'."
                            if view.prefix else ""),
        f"Joining the outputs on device 0 moves {format_bytes(view.outputs_moved)}."]
    if left_out:
        lines.append(f"{left_out} more layers are left out to keep the picture readable: draw "
                     f"a part at a time with only= (tofu-mx draw --only TEXT), e.g. "
                     f"only={_part(view)!r}" + (f" (this picture: only={only!r})" if only
                                                else "") + ".")
    return lines


def _part(view: LayerView) -> str:
    """A text naming a part of the network: the most common first word of the short names."""
    words = [view.short(r.name) for r in view.layers]
    words = [w[:w.find("_") + 1] for w in words if 0 < w.find("_") < len(w) - 1]
    return max(sorted(set(words)), key=words.count) if words else view.short(
        view.layers[0].name)


def save(fig: Figure, fmt: str) -> bytes:
    """The figure as ``fmt`` (png, svg or pdf) bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=100)
    return buffer.getvalue()
