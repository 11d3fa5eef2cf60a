"""Draw a partitioned plan: which device runs what, and what moves between them.

:func:`draw` writes one of two views. The **layer view** (the default;
:mod:`tofu_mx.runtime.layers`, drawn with matplotlib) is a table with a row per layer of the
user's graph, readable for real networks. The **graph view**, described here, draws the
operators and the tensors between them with Graphviz; it reads best up to a few dozen
operators.

The graph view is of the *original* graph annotated with the plan, not of the partitioned
Symbol (which has a copy of every operator per device plus the conversion nodes):

- **An operator node** is one operator of the original graph. Its label gives its name, its
  MXNet operator and the strategy chosen at each level of the recursion, outermost cut first
  (``split co | reduce ci``; the letters are the description's loop variables). Under the
  label a strip has one cell per device, filled with the device's colour (see the legend)
  where the partitioned Symbol runs a share of the operator: all cells for an operator split
  or replicated over every device, one for an operator that runs on one device (a share
  nobody reads is never emitted: a replicated operator whose result only device 0 reads runs
  there alone).
- **A fallback** (:attr:`PartitionedSymbol.fallbacks`: an operator that runs whole instead of
  split, on device 0 or on every device) has a thick red border and says why. **An opaque
  operator** (registered with :func:`tofu_mx.tdl.opaque`, as the analysis reports it: split
  only along the batch axes it declares, if any) has a double border and gives its reason.
- **A variable node** (data, label, parameter) is an ellipse with its kind, shape and stored
  layout; its strip shows the devices holding a shard. Auxiliary states (BatchNorm's moving
  statistics) are not drawn: each device keeps and updates its own share, nothing moves. The
  **outputs** node is where the graph's outputs are joined, whole, on device 0.
- **An edge** is a tensor read by an operator (all its shares together). Its label is the
  conversion ``stored -> read``, each layout written ``split(a,b)×n`` (the axes along which
  the devices' boxes differ, ``n`` distinct boxes, ``+halo`` when boxes overlap in part),
  ``whole``, or ``part`` (the same part of the tensor on every device), and the bytes that
  cross devices to give every share the region it reads. An edge that moves nothing is grey
  and has no byte count.
- **Combining** (partial sums of a ``reduce`` strategy added up, or parts computed on one
  device stored on another) happens inside an operator: its bytes are a line of its label.

The bytes are those of the **forward pass**, as MXNet copies them: a value crosses to a
device once however many operators there read it (the first reader's edge shows the bytes,
the others none), and :func:`cross_device_bytes`, counted on the partitioned Symbol itself,
equals the sum of everything drawn (the tests check it). They are read off the partition's
:class:`~nnvm_passes.program.Program` (:meth:`~nnvm_passes.program.Program.crossings`),
which MXNet's graph is emitted from. The backward pass sends
the gradients of those values back, so a tensor that carries a gradient moves about as much
again; the plan's figure in the title counts both passes, by the search's cost model.

**Large graphs** (more than ``max_operators`` operators) are drawn *coarsened*: one node per
group of the search's coarsening at the first cut (an operator and the elementwise operators
that follow its layout: the groups ``Plan.coarsening`` counts, before RNN steps are tied),
its operators counted by kind. Its strip is the union of its operators' devices; its label
names its first operator and that one's strategies, counts its fallback and opaque
operators, and adds up what its operators fetch from variables (variables are not drawn),
move among themselves and combine. An edge is every tensor one group reads from another,
bytes summed.

:func:`to_dot` gives the ``graphviz.Digraph``; :func:`draw` writes it as ``.png``, ``.svg``,
``.pdf`` (these need Graphviz's ``dot`` program) or ``.dot``.
"""
from __future__ import annotations

import colorsys
import functools
import html
import os
import shutil
import subprocess
import textwrap
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import graphviz

from nnvm_passes.ir import Graph
from nnvm_passes.placement import placed_group
from tofu_mx.errors import InvalidArgumentError, TofuError
from tofu_mx.files import atomic_write_bytes, check_writable
from nnvm_passes.program import Program, Purpose
from tofu_mx.search.cost import intersect
from tofu_mx.search.cut import Cut, View
from tofu_mx.summary import format_bytes
from tofu_mx.tdl.annotate import OPAQUE, analyse_node

if TYPE_CHECKING:
    from tofu_mx.runtime.layers import LayerView
    from tofu_mx.runtime.partitioned import PartitionedSymbol

Box = tuple[tuple[int, int], ...]
Tensor = tuple[int, int]          # (graph node index, output index)

#: formats :func:`draw` writes, by file suffix; all but .dot need Graphviz's ``dot`` program
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf", ".dot": "dot"}
#: how to get ``dot`` where it is missing
INSTALL_HINT = "apt-get install graphviz, brew install graphviz or conda install graphviz"
#: operators above which :func:`to_dot` draws the search's groups instead of operators
MAX_OPERATORS = 60

_PALETTE = ("#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5",
            "#ffffb3", "#bc80bd", "#ccebc5", "#ffed6f", "#d9d9d9")
_OUTPUTS = "outputs"


# --- what is drawn: plain data ----------------------------------------------------------------
@dataclass(frozen=True)
class DrawnNode:
    """One node of the picture: an operator, a group of operators, a variable, the outputs."""

    key: str                          # the Graphviz node id
    kind: str                         # operator | group | variable | outputs
    name: str
    ops: tuple[tuple[str, int], ...]  # (MXNet operator, count); one entry for an operator
    devices: tuple[int, ...]          # devices running a share of it / holding a shard
    strategies: tuple[str, ...] = ()  # per level, outermost cut first
    fallbacks: tuple[str, ...] = ()   # why each fallback operator in it runs whole
    opaque: tuple[str, ...] = ()      # the reason of each opaque operator in it
    combine_bytes: int = 0            # partial sums combined / parts moved into the layout
    variable_bytes: int = 0           # coarsened: bytes its operators fetch from variables
    inner_bytes: int = 0              # coarsened: bytes moved between its own operators
    detail: str = ""                  # a variable's kind, shape and layout


@dataclass(frozen=True)
class DrawnEdge:
    tail: str
    head: str
    conversions: tuple[tuple[str, str], ...]   # (stored, read) layouts, each distinct once
    bytes: int                        # crossing devices, forward pass
    tensors: int                      # tensor reads it stands for


@dataclass(frozen=True)
class Picture:
    nodes: tuple[DrawnNode, ...]
    edges: tuple[DrawnEdge, ...]
    devices: tuple[str, ...]          # the devices, by index
    coarsened: bool
    operators: int                    # operators of the original graph
    plan_bytes: float                 # the plan's bytes moved per training step
    cuts: tuple[int, ...]

    @property
    def forward_bytes(self) -> int:
        """Everything drawn: what MXNet copies between devices in one forward pass."""
        return sum(e.bytes for e in self.edges) + sum(
            n.combine_bytes + n.variable_bytes + n.inner_bytes for n in self.nodes)


# --- traffic: what the Program runs and what crosses devices -------------------------------
def clip(box: Box, shape: Sequence[int]) -> Box:
    """The part of ``box`` inside the tensor (beyond it is padding, made where it is read)."""
    return intersect(box, tuple((0, n - 1) for n in shape))


def _layout(boxes: Sequence[Box], shape: Sequence[int]) -> str:
    """``split(a,b)×n``: the axes along which the devices' boxes differ and how many distinct
    boxes there are (``+halo`` when two overlap in part); else ``whole``, or ``part`` when
    every device has the same part (a strided read that skips the last rows, say)."""
    axes = [a for a in range(len(shape)) if len({b[a] for b in boxes}) > 1]
    if not axes:
        full = all(span == (0, n - 1) for b in boxes for span, n in zip(b, shape))
        return "whole" if full else "part"
    spans = [{b[a] for b in boxes} for a in axes]
    halo = any(x != y and x[0] <= y[1] and y[0] <= x[1] for s in spans for x in s for y in s)
    return (f"split({','.join(map(str, axes))}){'+halo' if halo else ''}"
            f"\u00d7{len(set(boxes))}")


@dataclass(frozen=True)
class Traffic:
    """What the drawing reads of the plan: each tensor's distinct stored boxes, the devices
    running a share of each operator (:attr:`Program.placement`), the boxes each operator
    input is read in, and the bytes crossing devices (:meth:`Program.crossings`) by what
    they were moved for: ``("read", op, input)``, ``("combine", op)`` or ``("output", k)``."""

    cells: dict[Tensor, dict[Box, list[int]]]
    instances: dict[int, tuple[int, ...]]
    read_boxes: dict[tuple[int, int], list[Box]]
    accounts: dict[tuple, int]


def traffic(ptd: PartitionedSymbol) -> Traffic:
    graph, assignment, program = ptd.graph, ptd.assignment, ptd.program
    cells: dict[Tensor, dict[Box, list[int]]] = {}
    for t, boxes in assignment.stored.items():
        for d, box in enumerate(boxes):
            cells.setdefault(t, {}).setdefault(box, []).append(d)
    read_boxes: dict[tuple[int, int], list[Box]] = {}
    for i, devices in program.placement.items():
        for d in devices:
            share = assignment.ops[i].shares[d]
            if share.views is not None:      # no operator: output j is a region of input 0
                read_boxes.setdefault((i, 0), []).extend(share.views)
                continue
            for j, (e, box) in enumerate(zip(graph.nodes[i].inputs, share.inputs)):
                src = graph.nodes[e.node]
                if box is not None and not (src.is_variable and src.kind == "aux"):
                    read_boxes.setdefault((i, j), []).append(box)
    return Traffic(cells, dict(program.placement), read_boxes, moved_bytes(program))


def moved_bytes(program: Program) -> dict[tuple, int]:
    """The bytes crossing devices (:meth:`Program.crossings`) by what they were moved for:
    ``("read", op, input)``, ``("combine", op)`` or ``("output", k)``."""
    accounts: dict[tuple, int] = {}
    for crossing in program.crossings():
        a = crossing.account
        key = (a.purpose.value, a.node, a.input) if a.purpose is Purpose.READ else \
            (a.purpose.value, a.node)
        accounts[key] = accounts.get(key, 0) + crossing.nbytes
    return accounts


def cross_device_bytes(ptd: PartitionedSymbol) -> int:
    """Bytes MXNet copies between devices in one forward pass of the partitioned Symbol: every
    value read in another ctx group than its maker's, once per reading group (MXNet inserts
    one ``_CrossDeviceCopy`` per value and destination)."""
    graph = ptd.shard_graph
    group = functools.partial(placed_group, graph)
    copies = {(e, group(i)) for i, n in enumerate(graph.nodes) if not n.is_variable
              for e in n.inputs if group(e.node) != group(i)}
    return sum(graph.tensor(e).nbytes for e, _ in copies)


# --- the picture -------------------------------------------------------------------------------
def picture(ptd: PartitionedSymbol, coarsen: bool | None = None,
            max_operators: int = MAX_OPERATORS) -> Picture:
    """What :func:`to_dot` draws, as plain data (see the module docstring). ``coarsen``: draw
    the search's groups instead of operators (None: when the graph has more than
    ``max_operators`` operators)."""
    graph = ptd.graph
    ops = [i for i, n in enumerate(graph.nodes) if not n.is_variable]
    coarsen = len(ops) > max_operators if coarsen is None else coarsen
    parts = ptd.plan.factors[0] if ptd.plan.factors else 2
    moves = traffic(ptd)
    opaque = {i: a.reason for i in ops for a in [analyse_node(graph, i, parts)]
              if a.status == OPAQUE}
    if coarsen:     # the copies of the first cut's groups, as the search coarsens the graph
        members = [copy for group in Cut(graph, View.of(graph), parts, tie=False).groups
                   for copy in group.copies]
    else:
        members = [[i] for i in ops]
    owner = {m: f"group{k}" if coarsen else f"op{m}" for k, group in enumerate(members)
             for m in group}
    owner.update({i: f"var{i}" for i, n in enumerate(graph.nodes) if n.is_variable})
    edges, variable_bytes, inner_bytes = _edges(graph, moves, owner, coarsen)
    strategies = {o.name: tuple(map(str, o.strategies)) for o in ptd.plan.ops}
    nodes = [_group_node(graph, owner[group[0]], group, coarsen, moves, strategies,
                         ptd.fallbacks, opaque, variable_bytes, inner_bytes)
             for group in members]
    if not coarsen:
        nodes += _variable_nodes(ptd, graph, moves)
    nodes.append(DrawnNode(_OUTPUTS, "outputs", "outputs", (), (0,),
                           detail="joined whole on device 0"))
    return Picture(tuple(nodes), edges, tuple(str(c) for c in ptd.contexts), coarsen,
                   len(ops), ptd.plan.total_bytes, tuple(ptd.plan.factors))


def _edges(graph: Graph, traffic: Traffic, owner: dict[int, str], coarsen: bool):
    """The edges between drawn nodes (``owner``: graph node -> drawn node), and per drawn
    node the bytes read from variables that are not drawn and moved inside it."""
    reads: dict[tuple[str, str], list] = {}
    variable_bytes: dict[str, int] = {}
    inner_bytes: dict[str, int] = {}
    for (i, j), boxes in traffic.read_boxes.items():
        entry = graph.nodes[i].inputs[j]
        source = graph.nodes[entry.node]
        shape = source.outputs[entry.index].shape
        conversion = (_layout(list(traffic.cells[(entry.node, entry.index)]), shape),
                      _layout([clip(b, shape) for b in boxes], shape))
        moved = traffic.accounts.get(("read", i, j), 0)
        tail, head = owner[entry.node], owner[i]
        if coarsen and source.is_variable:
            variable_bytes[head] = variable_bytes.get(head, 0) + moved
        elif tail == head:
            inner_bytes[head] = inner_bytes.get(head, 0) + moved
        else:
            reads.setdefault((tail, head), []).append((conversion, moved))
    for k, entry in enumerate(graph.heads):
        if coarsen and graph.nodes[entry.node].is_variable:
            continue                     # a variable handed out as it is: not drawn
        conversion = (_layout(list(traffic.cells[(entry.node, entry.index)]),
                              graph.tensor(entry).shape), "whole")
        reads.setdefault((owner[entry.node], _OUTPUTS), []).append(
            (conversion, traffic.accounts.get(("output", k), 0)))
    edges = tuple(DrawnEdge(tail, head, tuple(dict.fromkeys(c for c, _ in found)),
                            sum(b for _, b in found), len(found))
                  for (tail, head), found in reads.items())
    return edges, variable_bytes, inner_bytes


def _group_node(graph: Graph, key: str, group: list[int], coarsen: bool, traffic: Traffic,
                strategies, fallbacks, opaque, variable_bytes, inner_bytes) -> DrawnNode:
    leader = graph.nodes[group[0]]
    counts = Counter(graph.nodes[m].op for m in group)
    return DrawnNode(
        key, "group" if coarsen else "operator", leader.name,
        tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        tuple(sorted({d for m in group for d in traffic.instances.get(m, ())})),
        tuple(strategies.get(leader.name, ())),
        tuple(f"{graph.nodes[m].name}: {fallbacks[graph.nodes[m].name]}" for m in group
              if graph.nodes[m].name in fallbacks),
        tuple(f"{graph.nodes[m].name} ({graph.nodes[m].op}): {opaque[m]}" for m in group
              if m in opaque),
        sum(traffic.accounts.get(("combine", m), 0) for m in group),
        variable_bytes.get(key, 0), inner_bytes.get(key, 0))


def _variable_nodes(ptd: PartitionedSymbol, graph: Graph, traffic: Traffic) -> list[DrawnNode]:
    holders: dict[str, set[int]] = {}
    for s in ptd.shards:
        holders.setdefault(s.source, set()).add(s.device)
    read = {graph.nodes[i].inputs[j].node for i, j in traffic.read_boxes} | \
        {e.node for e in graph.heads}
    out = []
    for i, node in enumerate(graph.nodes):
        if node.is_variable and i in read:
            shape = node.outputs[0].shape
            layout = _layout(list(traffic.cells[(i, 0)]), shape)
            out.append(DrawnNode(f"var{i}", "variable", node.name, (),
                                 tuple(sorted(holders.get(node.name, ()))),
                                 detail=f"{node.kind} {shape} {layout}"))
    return out


# --- rendering ---------------------------------------------------------------------------------
_FALLBACK_COLOUR, _OPAQUE_COLOUR = "#d62728", "#1f4e9c"


def device_colours(k: int) -> list[str]:
    """One fill colour per device: a fixed palette, then evenly spaced hues."""
    if k <= len(_PALETTE):
        return list(_PALETTE[:k])
    return ["#%02x%02x%02x" % tuple(int(255 * c) for c in
                                    colorsys.hsv_to_rgb(d / k, 0.35, 0.97)) for d in range(k)]


def _html(text: str) -> str:
    return html.escape(text, quote=True)


def _table(rows: list[str], devices: Sequence[int], colours: Sequence[str]) -> str:
    """An HTML-like label: text rows over a strip with one cell per device, filled with the
    device's colour where the device runs a share (or holds a shard), blank elsewhere."""
    size = f'WIDTH="{max(4, min(16, 96 // max(len(colours), 1)))}" HEIGHT="7"'
    cells = "".join(f'<TD BGCOLOR="{colour}" {size}></TD>' if d in devices else f"<TD {size}></TD>"
                    for d, colour in enumerate(colours))
    text = "".join(f"<TR><TD>{row}</TD></TR>" for row in rows)
    return (f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">{text}'
            f'<TR><TD><TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="0"><TR>'
            f"{cells}</TR></TABLE></TD></TR></TABLE>>")


def _wrapped(text: str, colour: str, width: int = 48) -> list[str]:
    return [f'<FONT COLOR="{colour}">{_html(line)}</FONT>' for line in textwrap.wrap(text, width)]


def _node_attrs(node: DrawnNode, colours: Sequence[str]) -> tuple[str, dict[str, str]]:
    if node.kind == "outputs":
        return _table(["outputs", _html(node.detail)], node.devices, colours), \
            {"shape": "box", "style": "rounded"}
    if node.kind == "variable":
        return _table([_html(node.name), f'<FONT POINT-SIZE="8">{_html(node.detail)}</FONT>'],
                      node.devices, colours), {"shape": "ellipse", "fontsize": "9"}
    ops = ", ".join(op if n == 1 else f"{op} x{n}" for op, n in node.ops)
    rows = [f"<B>{_html(node.name)}</B>"]
    if node.kind == "group":
        count = sum(n for _, n in node.ops)
        rows += [_html(line) for line in
                 textwrap.wrap(f"{count} operator{'s' if count > 1 else ''}: {ops}", 48)]
    else:
        rows.append(_html(ops))
    rows.append(_html(" | ".join(node.strategies)))
    for what, nbytes in (("reads variables", node.variable_bytes), ("inside", node.inner_bytes),
                         ("combines", node.combine_bytes)):
        if nbytes:
            rows.append(f"{what}: {format_bytes(nbytes)}")
    if not node.devices:
        rows.append("(no share is run)")
    attrs = {"shape": "box"}
    if node.fallbacks:
        rows += _wrapped(f"FALLBACK: {node.fallbacks[0]}" if len(node.fallbacks) == 1 else
                         f"FALLBACK: {len(node.fallbacks)} operators run whole",
                         _FALLBACK_COLOUR)
        attrs.update(color=_FALLBACK_COLOUR, penwidth="3")
    if node.opaque:
        rows += _wrapped(f"OPAQUE: {node.opaque[0]}" if len(node.opaque) == 1 else
                         f"OPAQUE: {len(node.opaque)} operators", _OPAQUE_COLOUR)
        attrs["peripheries"] = "2"
    return _table(rows, node.devices, colours), attrs


def _edge_attrs(edge: DrawnEdge, heaviest: int) -> tuple[str | None, dict[str, str]]:
    shown = [f"{stored} \u2192 {read}" for stored, read in edge.conversions[:2]]
    shown += ["..."] if len(edge.conversions) > 2 else []
    converts = any(stored != read for stored, read in edge.conversions)
    if not edge.bytes:
        return ("\\n".join(shown) if converts else None), {"color": "grey60"}
    width = 1 + 3 * edge.bytes / heaviest
    return "\\n".join(shown + [format_bytes(edge.bytes)]), {"penwidth": f"{width:.2f}"}


def _legend(devices: Sequence[str], colours: Sequence[str]) -> str:
    def row(mark: str, text: str) -> str:
        return f'<TR><TD {mark} WIDTH="16"></TD><TD ALIGN="LEFT">{text}</TD></TR>'
    rows = [row(f'BGCOLOR="{c}"', f"dev{d}: {_html(name)}")
            for d, (name, c) in enumerate(zip(devices, colours))]
    rows += [row(f'BORDER="2" COLOR="{_FALLBACK_COLOUR}"', "fallback: runs whole, not split"),
             row('BORDER="1"', "double border: opaque (split on batch axes only)"),
             '<TR><TD COLSPAN="2" ALIGN="LEFT" BALIGN="LEFT">colour strip: the devices that '
             'run a share<BR/>edge: stored \u2192 read layout, bytes<BR/>crossing devices in '
             'the forward pass</TD></TR>']
    return (f'<<TABLE BORDER="1" CELLBORDER="0" CELLSPACING="3" COLOR="grey60">'
            f'<TR><TD COLSPAN="2"><B>legend</B></TD></TR>{"".join(rows)}</TABLE>>')


def render(pic: Picture, title: str | None = None) -> graphviz.Digraph:
    """The Graphviz graph of a :class:`Picture`."""
    colours = device_colours(len(pic.devices))
    cuts = " x ".join(map(str, pic.cuts)) or "none"
    lines = [title] if title is not None else [
        f"{len(pic.devices)} devices (cuts {cuts}): the plan moves "
        f"{format_bytes(pic.plan_bytes)} per training step (forward and backward, cost model)",
        f"drawn: {format_bytes(pic.forward_bytes)} crossing devices in the forward pass"]
    if title is None and pic.coarsened:
        lines.append(f"{pic.operators} operators drawn as "
                     f"{sum(1 for n in pic.nodes if n.kind == 'group')} groups of the search")
    graph = graphviz.Digraph(
        "plan", graph_attr={"label": "\\n".join(s.replace("\\", "\\\\") for s in lines),
                            "labelloc": "t", "fontname": "Helvetica", "fontsize": "11",
                            "rankdir": "TB", "nodesep": "0.3", "ranksep": "0.35"},
        node_attr={"fontname": "Helvetica", "fontsize": "10", "margin": "0.06,0.03"},
        edge_attr={"fontname": "Helvetica", "fontsize": "9", "arrowsize": "0.7"})
    with graph.subgraph(name="legend_rank") as top:     # the legend alone, above the graph
        top.attr(rank="source")
        top.node("legend", _legend(pic.devices, colours), shape="plaintext", fontsize="9")
    for node in pic.nodes:
        label, attrs = _node_attrs(node, colours)
        graph.node(node.key, label, **attrs)
    heaviest = max([e.bytes for e in pic.edges] + [1])
    for edge in pic.edges:
        label, attrs = _edge_attrs(edge, heaviest)
        graph.edge(edge.tail, edge.head, label, **attrs)
    return graph


def to_dot(ptd: PartitionedSymbol, coarsen: bool | None = None,
           max_operators: int = MAX_OPERATORS, title: str | None = None) -> graphviz.Digraph:
    """The partitioned plan of ``ptd`` (a :class:`PartitionedSymbol`) as a Graphviz graph;
    see the module docstring for what nodes and edges mean. ``coarsen``: one node per group
    of the search instead of per operator (None: when there are more than
    ``max_operators`` operators)."""
    return render(picture(ptd, coarsen, max_operators), title)


#: what :func:`draw` draws: a table of the user's layers (:mod:`tofu_mx.runtime.layers`,
#: matplotlib) or the graph of operators (Graphviz)
VIEWS = ("layers", "graph")


@dataclass(frozen=True)
class Drawing:
    """What :func:`draw` wrote."""

    path: str             # the file written
    missing_dot: bool     # a .dot file was written instead of the format asked for
    picture: "Picture | LayerView"   # what was drawn, as plain data


def draw(ptd: PartitionedSymbol, path: str | os.PathLike, view: str | None = None,
         coarsen: bool | None = None, max_operators: int = MAX_OPERATORS,
         title: str | None = None, only: str | None = None) -> Drawing:
    """Write the drawing of ``ptd``'s plan to ``path``, atomically, in the format its suffix
    names (:data:`FORMATS`). Nothing is bound or run.

    ``view="layers"`` (the default, except for ``.dot``): one row per layer of the user's
    graph, how each device holds its output and weight, what it moves, beside memory per
    device and the bytes of each cut (:mod:`tofu_mx.runtime.layers`; ``only``: the layers
    whose names contain that text). ``view="graph"``: the operators and what moves between
    them, drawn by Graphviz (``coarsen``, ``max_operators``: see :func:`picture`); where its
    ``dot`` program is missing, the ``.dot`` file is written next to ``path`` instead
    (``Drawing.missing_dot``; render it later with ``dot -Tpng plan.dot -o plan.png``;
    :data:`INSTALL_HINT` says how to get dot)."""
    path = os.fspath(path)
    view = view_of(view, path, only)
    suffix = check_output(path, view=view)
    if view == "layers":
        from tofu_mx.runtime import layers
        table = layers.layers(ptd)
        figure = layers.render(table, only, title)
        atomic_write_bytes(path, layers.save(figure, FORMATS[suffix]))
        return Drawing(path, False, table)
    pic = picture(ptd, coarsen, max_operators)
    graph = render(pic, title)
    if suffix == ".dot" or shutil.which("dot") is None:
        written = os.path.splitext(path)[0] + ".dot"
        atomic_write_bytes(written, graph.source.encode("utf-8"))
        return Drawing(written, suffix != ".dot", pic)
    try:
        data = graph.pipe(format=FORMATS[suffix])
    except (subprocess.CalledProcessError, OSError, RuntimeError) as e:
        raise TofuError(f"Graphviz's dot could not render {path!r}: {e}; draw to a .dot file "
                        f"and render it with dot -T{FORMATS[suffix]}") from e
    atomic_write_bytes(path, data)
    return Drawing(path, False, pic)


def view_of(view: str | None, path: str | os.PathLike, only: str | None = None) -> str:
    """The view :func:`draw` draws to ``path``: ``view``, else ``graph`` for a ``.dot`` file
    and ``layers`` otherwise; :class:`tofu_mx.InvalidArgumentError` for an unknown view,
    ``only`` with the graph view, or ``only`` not a non-empty string."""
    if view is not None and view not in VIEWS:
        raise InvalidArgumentError(f"view must be one of {', '.join(map(repr, VIEWS))}, got "
                                   f"{view!r}")
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    view = view or ("graph" if suffix == ".dot" else "layers")
    if only is not None and (not isinstance(only, str) or not only):
        raise InvalidArgumentError(f"only must be a non-empty text (part of a layer's name), "
                                   f"got {only!r}")
    if only is not None and view != "layers":
        raise InvalidArgumentError("only= picks rows of the layer view; draw to a .png, .svg "
                                   "or .pdf with view='layers' (or leave only out)")
    return view


def check_output(path: str, what: str = "the drawing", view: str = "graph") -> str:
    """The suffix of ``path`` if :func:`draw` can write ``view`` there (a known format, an
    existing folder); else :class:`tofu_mx.InvalidArgumentError` saying what to change."""
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise InvalidArgumentError(f"cannot draw to {path!r}: its suffix {suffix!r} names no "
                                   f"format; use one of {', '.join(FORMATS)}")
    if view == "layers" and suffix == ".dot":
        raise InvalidArgumentError(f"cannot draw the layer view to {path!r}: a .dot file holds "
                                   f"the graph view; use .png, .svg or .pdf, or view='graph'")
    check_writable(path, what)
    if view == "graph" and suffix != ".dot":   # written instead where Graphviz's dot is missing
        check_writable(os.path.splitext(path)[0] + ".dot", f"{what}'s .dot file")
    return suffix
