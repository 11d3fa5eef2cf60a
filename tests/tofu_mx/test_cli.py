import re
import shutil
import subprocess
import sys

import mxnet as mx
import pytest

import tofu_mx
from tofu_mx.cli import main
from tofu_mx.devices import parse_devices
from tofu_mx.summary import parse_bytes

WRESNET_TINY = ["wresnet", "--depth", "14", "--classes", "10", "--batch-size", "4",
                "--image-size", "32"]
RESNET18_TINY = ["resnet18_v1", "--classes", "10", "--shape", "data=2,3,32,32"]


def test_summary_of_a_builtin_model(capsys):
    assert main(["summary", "wresnet", "--depth", "14", "--batch-size", "2",
                 "--image-size", "32", "--classes", "10"]) == 0
    out = capsys.readouterr().out
    assert "Convolution x" in out and "parameters" in out


def test_summary_of_a_symbol_file(tmp_path, capsys):
    path = tmp_path / "net-symbol.json"
    mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=5, name="fc").save(str(path))
    assert main(["summary", "--symbol", str(path), "--shape", "data=2,3"]) == 0
    assert "20 " in capsys.readouterr().out  # 5*3 + 5 parameters


def test_errors_are_one_line_and_exit_code_2(tmp_path, capsys):
    path = tmp_path / "net-symbol.json"
    mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=5, name="fc").save(str(path))
    assert main(["summary", "--symbol", str(path), "--shape", "dat=2,3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tofu-mx: error: shape given for 'dat' (did you mean 'data'?)")
    assert err.count("\n") == 1
    assert main(["summary", "wresnet", "--depth", "33"]) == 2
    assert "depth must be one of" in capsys.readouterr().err


def test_module_entry_point():
    result = subprocess.run([sys.executable, "-m", "tofu_mx", "summary", "rnn", "--layers", "1",
                             "--hidden", "8", "--seq-len", "2", "--vocab", "10"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "FullyConnected x" in result.stdout


def test_plan_command_prints_the_report_and_writes_json(tmp_path, capsys):
    from tofu_mx.search import Plan
    out = tmp_path / "plan.json"
    assert main(["plan", "transformer", "--layers", "1", "--hidden", "16", "--heads", "4",
                 "--seq-len", "4", "--vocab", "20", "--batch-size", "4", "--devices", "4",
                 "--json", str(out), "--no-try-factor-orders", "--optimizer-state", "2"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("plan for 4 devices, cuts 2 x 2:") and "level 2:" in text
    plan = Plan.from_json(out.read_text())
    assert plan.num_devices == 4 and plan.memory[0].optimizer == 2 * plan.memory[0].weights


def test_plan_flags_come_from_search_options():
    import dataclasses

    from tofu_mx.cli import build_parser
    from tofu_mx.search import SearchOptions
    help_text = build_parser()._subparsers._group_actions[0].choices["plan"].format_help()
    for f in dataclasses.fields(SearchOptions):
        assert "--" + f.name.replace("_", "-") in help_text


def test_plan_errors_exit_2(capsys):
    assert main(["plan", "rnn", "--layers", "1", "--hidden", "8", "--seq-len", "2",
                 "--vocab", "10", "--devices", "0"]) == 2
    assert "'0' names no device" in capsys.readouterr().err


# --- devices and amounts of memory as written on a command line ------------------------------
@pytest.mark.parametrize("text, devices", [
    ("4", [mx.cpu(i) for i in range(4)]), ("cpu:4", [mx.cpu(i) for i in range(4)]),
    ("gpu:8", [mx.gpu(i) for i in range(8)]), ("GPU:2", [mx.gpu(0), mx.gpu(1)]),
    (" cpu : 1 ", [mx.cpu(0)]), ("gpu:0,2,5", [mx.gpu(0), mx.gpu(2), mx.gpu(5)])])
def test_parse_devices(text, devices):
    assert parse_devices(text) == devices


@pytest.mark.parametrize("text, message", [
    ("0", "names no device"), ("cpu:0", "names no device"), ("gpu:0,0", "more than once"),
    ("tpu:4", "cannot read 'tpu:4' as devices"), ("", "cannot read '' as devices"),
    ("cpu:", "cannot read"), ("-1", "cannot read"), ("cpu:1.5", "cannot read"),
    ("four", "expected a count \\(4, meaning cpu:4\\), TYPE:COUNT")])
def test_parse_devices_refuses(text, message):
    with pytest.raises(tofu_mx.InvalidArgumentError, match=message):
        parse_devices(text)


@pytest.mark.parametrize("text, n", [
    ("16GiB", 16 * 2 ** 30), ("512MiB", 512 * 2 ** 20), ("512 mib", 512 * 2 ** 20),
    ("1.5GB", 1_500_000_000), ("1e9", 10 ** 9), ("2.5e3", 2500), ("1024", 1024),
    ("3B", 3), ("1KiB", 1024), ("1kb", 1000), ("2TiB", 2 * 2 ** 40), (".5KB", 500)])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["", "GiB", "12XB", "-1", "1e", "inf", "1 2", "16GiBs",
                                  "1,000", "16G"])
def test_parse_bytes_refuses(text):
    with pytest.raises(tofu_mx.InvalidArgumentError,
                       match=f"cannot read {re.escape(repr(text))} as an amount of memory; "
                             f"expected a number of bytes with an optional unit"):
        parse_bytes(text)


# --- models: built-in, model zoo, symbol file ----------------------------------------------------
def test_zoo_models_are_the_names_get_model_accepts():
    from mxnet.gluon.model_zoo import vision
    with pytest.raises(ValueError) as e:
        vision.get_model("no-such-model")
    assert sorted(str(e.value).split("\n\t")[1:]) == sorted(tofu_mx.models.ZOO_MODELS)


def test_zoo_symbol_has_a_softmax_head_and_the_same_names_every_time():
    from tofu_mx.models import zoo_input_shapes, zoo_symbol
    first, again = zoo_symbol("resnet18_v1", classes=10), zoo_symbol("ResNet18_v1", classes=10)
    assert first.list_outputs() == ["softmax_output"]
    assert first.list_arguments()[-1] == "softmax_label"
    assert first.list_arguments() == again.list_arguments()
    assert first.list_arguments()[1] == "resnetv10_conv0_weight"
    assert zoo_input_shapes("inceptionv3", 2) == {"data": (2, 3, 299, 299),
                                                  "softmax_label": (2,)}
    assert zoo_input_shapes("mobilenetv2_1.0", 4, 64)["data"] == (4, 3, 64, 64)
    with pytest.raises(tofu_mx.InvalidArgumentError,
                       match="unknown model 'mobilenetv2'; did you mean mobilenetv2_1.0"):
        zoo_symbol("mobilenetv2")
    with pytest.raises(tofu_mx.InvalidArgumentError, match="downloads nothing"):
        zoo_symbol("alexnet", pretrained=True)


def test_a_model_zoo_name_in_summary_and_plan(capsys):
    assert main(["summary", "mobilenetv2_0.25", "--batch-size", "2", "--classes", "10"]) == 0
    out = capsys.readouterr().out
    assert "Convolution x" in out and "SoftmaxOutput x1" in out
    assert main(["plan", *RESNET18_TINY, "--devices", "cpu:4", "--memory-budget", "1GiB"]) == 0
    assert capsys.readouterr().out.startswith("plan for 4 devices")


def test_the_label_shape_can_be_given(tmp_path, capsys):
    path = tmp_path / "net-symbol.json"
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=5, name="fc")
    mx.sym.SoftmaxOutput(fc, name="softmax").save(str(path))
    assert main(["summary", "--symbol", str(path), "--shape", "data=4,3",
                 "--shape", "softmax_label=4"]) == 0
    assert "inputs" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["summary", "resnet18"], "unknown model 'resnet18'; did you mean resnet18_v2, resnet18_v1"),
    (["plan", "wresnt"], "unknown model 'wresnt'; did you mean wresnet"),
    (["plan", *WRESNET_TINY, "--devices", "tpu:2"], "cannot read 'tpu:2' as devices"),
    (["draw", *WRESNET_TINY, "--devices", "cpu:0", "-o", "x.dot"], "'cpu:0' names no device"),
    (["verify", *WRESNET_TINY, "--devices", "gpu:0,0"], "'gpu:0,0' lists gpu 0 more than once"),
    (["plan", *WRESNET_TINY, "--memory-budget", "12XB"], "cannot read '12XB' as an amount"),
    (["plan", *WRESNET_TINY, "--devices", "2", "--memory-budget", "1KiB"],
     "no plan fits: device 0 needs"),
    (["draw", *WRESNET_TINY, "-o", "plan.jpg"], "cannot draw to 'plan.jpg': its suffix"),
    (["summary", "--symbol", "missing-symbol.json", "--shape", "data=2,3"],
     "cannot load symbol file 'missing-symbol.json': .*No such file")])
def test_errors_are_one_line_on_stderr_with_exit_code_2(argv, message, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert re.match(f"tofu-mx: error: {message}", captured.err), captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""


# --- verify --------------------------------------------------------------------------------------
def mlp_file(tmp_path):
    h = mx.sym.var("data")
    for i in range(1, 3):
        h = mx.sym.Activation(mx.sym.FullyConnected(h, num_hidden=8, name=f"fc{i}"),
                              act_type="relu", name=f"relu{i}")
    out = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(h, num_hidden=4, name="fc3"), name="softmax")
    path = tmp_path / "mlp-symbol.json"
    out.save(str(path))
    return ["--symbol", str(path), "--shape", "data=8,6"]


def test_verify_passes_on_a_right_partition(tmp_path, capsys):
    assert main(["verify", *mlp_file(tmp_path), "--devices", "cpu:2"]) == 0
    out = capsys.readouterr().out
    assert "partitioned over 2 devices (cpu(0), cpu(1))" in out
    assert re.search(r"compared 8 tensors .* in float64, rtol=0.0001 atol=1e-05 seed=0: "
                     r"all agree", out), out
    assert "\nworst: " in out and out.rstrip().endswith("computes what the model computes")


def test_verify_fails_with_exit_1_when_the_partition_computes_something_else(
        tmp_path, capsys, monkeypatch):
    """The rewrite is made to emit a wrong partitioned graph: one device's share of relu2
    computes a sigmoid. The graph still binds and runs; verify must find the difference."""
    from tofu_mx.runtime import partitioned
    rewrite = partitioned.rewrite

    def wrong(graph, assignment, ordered=False):
        result = rewrite(graph, assignment, ordered)
        (share,) = [n for n in result.json["nodes"] if n["name"] == "relu2@dev1"]
        share["attrs"]["act_type"] = "sigmoid"
        return result
    monkeypatch.setattr(partitioned, "rewrite", wrong)
    assert main(["verify", *mlp_file(tmp_path), "--devices", "cpu:2",
                 "--no-try-factor-orders"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"compared 8 tensors .*: \d+ differ", out), out
    assert "DIFFERS: " in out and "  output softmax_output: max abs err" in out


def test_verify_a_model_zoo_net_in_float64(capsys):
    assert main(["verify", *RESNET18_TINY, "--devices", "cpu:2"]) == 0
    out = capsys.readouterr().out
    assert "compared 104 tensors" in out and "in float64" in out and "all agree" in out
    assert "note:" not in out                    # every float tensor was float64


def test_verify_flags_come_from_search_options():
    import dataclasses

    from tofu_mx.cli import build_parser
    from tofu_mx.search import SearchOptions
    for command in ("plan", "verify", "draw"):
        help_text = build_parser()._subparsers._group_actions[0].choices[command].format_help()
        for f in dataclasses.fields(SearchOptions):
            assert "--" + f.name.replace("_", "-") in help_text, (command, f.name)


# --- draw ----------------------------------------------------------------------------------------
def test_draw_writes_a_dot_file(tmp_path, capsys):
    out = tmp_path / "plan.dot"
    assert main(["draw", *WRESNET_TINY, "--devices", "gpu:2", "-o", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}: 55 operators on 2 devices")
    source = out.read_text(encoding="utf-8")
    assert source.startswith("digraph plan {") and "dev1: gpu(1)" in source


def test_draw_coarsens_above_the_threshold(tmp_path, capsys):
    out = tmp_path / "plan.dot"
    assert main(["draw", *WRESNET_TINY, "--devices", "2", "-o", str(out),
                 "--coarsen-above", "20"]) == 0
    assert re.match(r"wrote .*: 55 operators drawn as \d+ groups on 2 devices",
                    capsys.readouterr().out)


def test_draw_without_dot_writes_the_dot_file_and_says_how_to_install_it(
        tmp_path, capsys, monkeypatch):
    from tofu_mx.runtime import draw
    monkeypatch.setattr(draw.shutil, "which", lambda name: None)
    out = tmp_path / "plan.png"
    assert main(["draw", *WRESNET_TINY, "--devices", "2", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1
    assert printed.startswith(f"Graphviz's dot program is not installed, so wrote "
                              f"{tmp_path / 'plan.dot'} instead of {out}")
    for hint in ("apt-get install graphviz", "brew install graphviz", "conda install graphviz",
                 f"dot -Tpng {tmp_path / 'plan.dot'} -o {out}"):
        assert hint in printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.dot"]


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot program is not installed")
def test_draw_renders_a_png(tmp_path, capsys):
    out = tmp_path / "plan.png"
    assert main(["draw", *WRESNET_TINY, "--devices", "cpu:2", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.png"]
