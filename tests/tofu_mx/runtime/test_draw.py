"""Drawing a partitioned plan: what the nodes and edges carry (read back from the DOT text),
fallback and opaque marks, coarsening, the bytes drawn against what MXNet copies, and files
written with and without Graphviz's ``dot`` program."""
import os
import re
import shutil

import mxnet as mx
import pytest

import tofu_mx
from tests.tofu_mx.runtime.custom_ops import cube
from tests.tofu_mx.runtime.helpers import partition_quietly
from tofu_mx import models, tdl
from tofu_mx.runtime import draw as drawing
from tofu_mx.runtime.draw import cross_device_bytes, device_colours, draw, picture, to_dot
from tofu_mx.tdl.registry import unregister

X = mx.sym.var("data")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BYTES = re.compile(r"\d+(?:\.\d+)? (?:B|KiB|MiB|GiB)")


def mlp(layers=2, hidden=16):
    h = X
    for i in range(layers - 1):
        h = mx.sym.Activation(mx.sym.FullyConnected(h, num_hidden=hidden, name=f"fc{i + 1}"),
                              act_type="relu", name=f"relu{i + 1}")
    out = mx.sym.FullyConnected(h, num_hidden=8, name=f"fc{layers}")
    return mx.sym.SoftmaxOutput(out, name="softmax")


def with_fallback():
    h = mx.sym.FullyConnected(X, num_hidden=8, name="fc1")
    y = mx.sym.FullyConnected(cube(mx.sym.tanh(h), name="cube"), num_hidden=4, name="fc2")
    return mx.sym.MakeLoss(mx.sym.sum(y * y))


partition = partition_quietly


def nodes_of(source):
    """node id -> its attribute text, for every node statement of a DOT source."""
    return dict(re.findall(r"^\t+(\w+) \[(.*)\]$", source, re.M))


def edge_labels(source):
    return re.findall(r'^\t\w+ -> \w+ \[label="([^"]*)"', source, re.M)


def test_nodes_carry_device_colours_and_edges_carry_bytes():
    # the plan keeping gathered inputs (fetching them again changes which it moves fewest)
    ptd = partition(mlp(), 4, options={"refetch": False}, data=(8, 12))
    source = to_dot(ptd).source
    nodes = nodes_of(source)
    colours = device_colours(4)
    assert len(set(colours)) == 4
    for key in ("op3", "op4", "op7", "op9"):                # fc1, relu1, fc2, softmax
        assert re.findall(r'BGCOLOR="([^"]+)"', nodes[key]) == colours, nodes[key]
    legend = nodes["legend"]
    for d, colour in enumerate(colours):
        assert f'BGCOLOR="{colour}"' in legend and f"dev{d}: cpu({d})" in legend
    labels = edge_labels(source)
    assert labels and all(BYTES.search(label) for label in labels)
    # data is stored split on the batch and fc1 (split on its outputs) reads all of it:
    # each device fetches the 3/4 it does not hold, 8*12*4 bytes * 3/4 * 4 devices
    assert "split(0)×4 → whole\\n1.12 KiB" in labels


def test_the_bytes_drawn_are_what_mxnet_copies():
    cases = [(mlp(), 2, {"data": (8, 12)}), (mlp(), 3, {"data": (8, 12)}),
             (mlp(3), 4, {"data": (8, 12)}), (with_fallback(), 3, {"data": (12, 6)}),
             (models.rnn(1, 8, 2, 10), 4, models.input_shapes("rnn", 4, seq_len=2))]
    for sym, k, shapes in cases:
        ptd = partition(sym, k, **shapes)
        pic = picture(ptd)
        assert pic.forward_bytes == cross_device_bytes(ptd) > 0, (k, shapes)


def test_operators_per_device_are_the_groups_nodes_and_the_copies_mxnet_inserts():
    """Counted from the emitted graph (each operator node in its group; one copy per value
    and reading group, as MXNet inserts them), and reported."""
    from nnvm_passes.placement import placed_group
    for sym, k, shapes in [(mlp(3), 4, {"data": (8, 12)}),
                           (models.rnn(1, 8, 2, 10), 2, models.input_shapes("rnn", 4, seq_len=2))]:
        ptd = partition(sym, k, **shapes)
        graph = ptd.shard_graph
        group = [placed_group(graph, i, "dev0") for i in range(len(graph.nodes))]
        copies = {(e, group[i]) for i, n in enumerate(graph.nodes) if not n.is_variable
                  for e in n.inputs if group[e.node] != group[i]}
        want = [sum(1 for i, n in enumerate(graph.nodes) if not n.is_variable and group[i] == g)
                + sum(1 for _, to in copies if to == g) for g in ptd.group2ctx]
        assert ptd.operators_per_device() == want and len(copies) > 0
        assert f"operators per device (with the copies MXNet inserts): " \
               f"{', '.join(f'{n:,}' for n in want)}" in ptd.report()


def test_a_fallback_operator_is_marked_and_runs_on_device_0():
    ptd = partition(with_fallback(), 3, data=(12, 6))
    assert list(ptd.fallbacks) == ["cube"]
    pic = picture(ptd)
    (node,) = [n for n in pic.nodes if n.name == "cube"]
    assert node.devices == (0,) and "runs whole on device 0" in node.fallbacks[0]
    attrs = nodes_of(render_source(pic))[node.key]
    assert "penwidth=3" in attrs and "FALLBACK" in attrs
    assert len(re.findall(r"BGCOLOR=", attrs)) == 1
    others = [n for n in pic.nodes if n.kind == "operator" and n.name != "cube"]
    assert all(not n.fallbacks for n in others)


@pytest.fixture
def opaque_cube():
    tdl.opaque("Custom:tofu_test_cube", "a test cube, split on its batch axis",
               batch_axes=(0,), output_batch_axes=(0,))
    yield
    unregister("Custom:tofu_test_cube")


def test_an_opaque_operator_is_marked(opaque_cube):
    ptd = partition(with_fallback(), 3, data=(12, 6))
    assert not ptd.fallbacks
    pic = picture(ptd)
    (node,) = [n for n in pic.nodes if n.name == "cube"]
    assert node.opaque == ("cube (Custom): a test cube, split on its batch axis",)
    assert node.devices == (0, 1, 2)
    attrs = nodes_of(render_source(pic))[node.key]
    assert "peripheries=2" in attrs and "OPAQUE" in attrs and "penwidth" not in attrs


def render_source(pic):
    return drawing.render(pic).source


def test_a_large_graph_is_drawn_as_the_searchs_groups():
    sym = mlp(layers=36)                     # 35 x (FullyConnected, relu), fc36, softmax
    ptd = partition(sym, 2, data=(4, 8))
    pic = picture(ptd)
    assert pic.coarsened and pic.operators == 72 > drawing.MAX_OPERATORS
    groups = [n for n in pic.nodes if n.kind == "group"]
    assert len(groups) == ptd.plan.coarsening["groups"] < 72
    assert sum(count for n in groups for _, count in n.ops) == 72
    assert not [n for n in pic.nodes if n.kind == "variable"]
    assert pic.forward_bytes == cross_device_bytes(ptd)
    source = to_dot(ptd).source
    assert "72 operators drawn as" in source
    assert "2 operators: Activation, FullyConnected" in source
    assert not picture(ptd, coarsen=False).coarsened
    assert picture(partition(mlp(), 2, data=(8, 12)), max_operators=2).coarsened


def test_without_dot_a_dot_file_is_written_next_to_the_output(tmp_path, monkeypatch):
    ptd = partition(mlp(), 2, data=(8, 12))
    monkeypatch.setattr(drawing.shutil, "which", lambda name: None)
    result = draw(ptd, tmp_path / "plan.png", view="graph")
    assert result.missing_dot and result.path == str(tmp_path / "plan.dot")
    assert os.listdir(tmp_path) == ["plan.dot"]             # no temporary file left behind
    assert (tmp_path / "plan.dot").read_text(encoding="utf-8").startswith("digraph plan {")


def test_a_dot_file_needs_no_dot_program(tmp_path, monkeypatch):
    monkeypatch.setattr(drawing.shutil, "which", lambda name: None)
    result = draw(partition(mlp(), 2, data=(8, 12)), str(tmp_path / "plan.dot"))
    assert not result.missing_dot and os.listdir(tmp_path) == ["plan.dot"]


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot program is not installed")
def test_with_dot_a_png_is_rendered(tmp_path):
    result = draw(partition(mlp(), 2, data=(8, 12)), tmp_path / "plan.png", view="graph")
    assert not result.missing_dot and os.listdir(tmp_path) == ["plan.png"]
    assert (tmp_path / "plan.png").read_bytes()[:8] == PNG_MAGIC


def test_bad_outputs_are_refused_before_anything_is_drawn(tmp_path):
    ptd = partition(mlp(), 2, data=(8, 12))
    with pytest.raises(tofu_mx.InvalidArgumentError, match=r"suffix '\.jpg' names no format"):
        draw(ptd, tmp_path / "plan.jpg")
    with pytest.raises(tofu_mx.InvalidArgumentError, match="does not exist; create it first"):
        draw(ptd, tmp_path / "missing" / "plan.dot")
    assert os.listdir(tmp_path) == []


def test_many_devices_get_distinct_colours():
    for k in (1, 4, 12, 13, 64):
        assert len(set(device_colours(k))) == k
