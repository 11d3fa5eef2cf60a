"""The layer view of a plan (tofu_mx.runtime.layers): a row per layer of the user's graph."""
import io
import json
import os

import mxnet as mx
import pytest
from PIL import Image

import tofu_mx
from tofu_mx.models.zoo import zoo_symbol
from tofu_mx.runtime import layers
from tofu_mx.runtime.draw import cross_device_bytes, draw, traffic
from tofu_mx.search.plan import SearchOptions

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def resnet():
    """resnet18_v1 over 4 devices, the re-fetching plan: 15 BatchNorms lowered, cut 2 x 2."""
    return tofu_mx.partition(zoo_symbol("resnet18_v1", classes=10),
                             [mx.cpu(i) for i in range(4)], data=(8, 3, 32, 32),
                             softmax_label=(8,), options=SearchOptions(keep_if_fits=False))


def texts(figure):
    return [t.get_text() for ax in figure.axes for t in ax.texts]


def test_a_row_per_operator_of_the_users_graph_with_batchnorm_folded(resnet):
    view = layers.layers(resnet)
    user = [n for n in json.loads(resnet.reference.tojson())["nodes"] if n["op"] != "null"]
    assert [(r.name, r.op) for r in view.layers] == [(n["name"], n["op"]) for n in user]
    assert len(view.layers) == 69 < len(resnet.graph.operators())
    norms = [r for r in view.layers if r.op == "BatchNorm"]
    assert len(norms) == 20
    for r in norms:     # lowered into its sums, or run as itself where split on channels
        assert r.operators == 1 if r.name in resnet.plan.unlowered else r.operators > 20
    assert sum(r.operators for r in view.layers) == len(resnet.graph.operators())
    assert all(r.operators == 1 for r in view.layers if r.op != "BatchNorm")
    assert view.prefix == "resnetv10_"
    assert view.short("resnetv10_stage2_conv1_fwd") == "stage2_conv1"
    assert view.short("softmax") == "softmax"


def test_the_bytes_of_the_rows_are_what_mxnet_copies(resnet):
    view = layers.layers(resnet)
    assert view.forward_bytes == cross_device_bytes(resnet) > 0
    moves = traffic(resnet)
    conv0 = next(r for r in view.layers if r.name.endswith("conv0_fwd"))
    i = next(j for j, n in enumerate(resnet.graph.nodes) if n.name == conv0.name)
    assert conv0.moved == sum(b for key, b in moves.accounts.items()
                              if key[0] in ("read", "combine") and key[1] == i)


def test_held_says_how_the_devices_hold_each_part(resnet):
    view = layers.layers(resnet)
    for row in view.layers:
        stored = resnet.assignment.stored
        i = next(j for j, n in enumerate(resnet.graph.nodes) if n.name == row.output.name)
        # every device holds exactly one part, and the parts' holders are the k devices
        assert sorted(d for _, devices in row.output.parts for d in devices) == [0, 1, 2, 3]
        assert any((i, j) in stored for j in range(len(resnet.graph.nodes[i].outputs)))
    batch = layers.Held("x", (8, 6), (((((0, 3), (0, 5))), (0, 1)), ((((4, 7), (0, 5))), (2, 3))))
    assert batch.cut_axes == (0,) and batch.words(4) == "axis 0 in 2, 2 copies"
    grid = layers.Held("x", (8, 6), tuple(
        (((a * 4, a * 4 + 3), (b * 3, b * 3 + 2)), (2 * a + b,)) for a in (0, 1) for b in (0, 1)))
    assert grid.words(4) == "axis 0 in 2 x axis 1 in 2"
    whole = layers.Held("x", (8,), ((((0, 7),), (0, 1, 2, 3)),))
    assert whole.words(4) == "whole, every device" and whole.words(8) == "whole, devices 0,1,2,3"
    assert layers.Held("x", (8,), ((((0, 7),), (0,)),)).words(2) == "whole, device 0"


def test_the_picture_fits_a_screen_and_names_every_layer(resnet, tmp_path):
    drawing = draw(resnet, tmp_path / "plan.png")
    assert drawing.path == str(tmp_path / "plan.png") and not drawing.missing_dot
    assert os.listdir(tmp_path) == ["plan.png"]
    data = (tmp_path / "plan.png").read_bytes()
    assert data[:8] == PNG_MAGIC
    assert max(Image.open(io.BytesIO(data)).size) < layers.MAX_SIDE
    view = drawing.picture
    shown = texts(layers.render(view))
    for row in view.layers:
        assert view.short(row.name) in shown
    assert any(t.startswith("How to read it. A row is one layer") for t in shown)
    assert any("partial sums: each device computes a partial result" in t for t in shown)
    lowered = [r for r in view.layers if r.op == "BatchNorm" and r.operators > 1]
    assert all(f"BatchNorm ({r.operators} ops)" in shown for r in lowered)


def test_only_draws_the_layers_whose_names_contain_it(resnet, tmp_path):
    view = layers.layers(resnet)
    shown = texts(layers.render(view, only="stage2_"))
    names = [view.short(r.name) for r in view.layers]
    assert [n for n in names if n in shown] == [n for n in names if "stage2_" in n]
    with pytest.raises(tofu_mx.InvalidArgumentError, match="only='nothing' is in no layer"):
        layers.render(view, only="nothing")
    with pytest.raises(tofu_mx.InvalidArgumentError, match="only= picks rows of the layer"):
        draw(resnet, tmp_path / "plan.dot", only="stage2_")
    with pytest.raises(tofu_mx.InvalidArgumentError, match="cannot draw the layer view to"):
        draw(resnet, tmp_path / "plan.dot", view="layers")
    with pytest.raises(tofu_mx.InvalidArgumentError, match="view must be one of"):
        draw(resnet, tmp_path / "plan.png", view="table")
    assert os.listdir(tmp_path) == []


def test_a_long_network_stays_bounded_and_says_what_it_leaves_out(tmp_path):
    ptd = tofu_mx.partition(tofu_mx.models.rnn(2, 32, seq_len=12, vocab=50),
                            [mx.cpu(0), mx.cpu(1)],
                            **tofu_mx.models.input_shapes("rnn", 4, seq_len=12))
    view = layers.layers(ptd)
    assert len(view.layers) > 2 * 90
    figure = layers.render(view)
    width, height = figure.get_size_inches() * figure.dpi
    assert max(width, height) < layers.MAX_SIDE
    note = [t for t in texts(figure) if "more layers are left out" in t]
    assert note and note[0].startswith(f"{len(view.layers) - 180} more layers")
    assert "only='l0_'" in note[0] or "only='l1_'" in note[0]


def test_the_method_on_a_partition_draws_the_layer_view(resnet, tmp_path):
    drawing = resnet.draw(tmp_path / "plan.svg", only="stage1_")
    assert isinstance(drawing.picture, layers.LayerView)
    assert (tmp_path / "plan.svg").read_text(encoding="utf-8").lstrip().startswith("<?xml")
