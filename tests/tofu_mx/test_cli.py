import json
import os
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
    assert "argument --depth: invalid choice: 33 (choose from 14, 26, 50, 101, 152)" in \
        capsys.readouterr().err


def test_help_carries_every_options_whole_comment_and_the_tolerances(capsys):
    """A SearchOptions comment that goes on over several lines is the flag's whole help;
    --rtol and --atol say what they mean."""
    for command in ("plan", "verify"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert ("fetch converted inputs again for the backward pass (re-running their "
                "operator) instead of keeping them: less memory, more bytes moved and "
                "compute") in out
        assert ("a plan holding more is searched again at memory weights until one fits; "
                "0: off)") in out
    assert "|got - want| <= atol + rtol * |want| (default 1e-4)" in out


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
    ("four", "expected a count \\(4, meaning cpu:4\\), TYPE:COUNT"),
    ("cpu:4097", "'cpu:4097' asks for more than 4096 devices"),
    ("9" * 5000, "'9+\\.\\.\\. asks for more than 4096"),
    ("gpu:0,4096", "'gpu:0,4096' names a gpu id above 4095"),
    ("gpu:" + ",".join(["0"] * 100_000), "'gpu:[0,]+\\.\\.\\. lists gpu 0 more than once")])
def test_parse_devices_refuses(text, message):
    with pytest.raises(tofu_mx.InvalidArgumentError, match=message):
        parse_devices(text)


@pytest.mark.parametrize("text, n", [
    ("16GiB", 16 * 2 ** 30), ("512MiB", 512 * 2 ** 20), ("512 mib", 512 * 2 ** 20),
    ("1.5GB", 1_500_000_000), ("1e9", 10 ** 9), ("2.5e3", 2500), ("1024", 1024),
    ("3B", 3), ("1KiB", 1024), ("1kb", 1000), ("2TiB", 2 * 2 ** 40), (".5KB", 500)])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["", "GiB", "12XB", "1e", "1 2", "16GiBs", "1,000", "16G"])
def test_parse_bytes_refuses(text):
    with pytest.raises(tofu_mx.InvalidArgumentError,
                       match=f"cannot read {re.escape(repr(text))} as an amount of memory; "
                             f"expected a number of bytes with an optional unit"):
        parse_bytes(text)


@pytest.mark.parametrize("text, message", [
    ("-1", "cannot read '-1' as an amount of memory \\(negative\\); expected a number"),
    ("-1.5 GiB", "cannot read '-1.5 GiB' as an amount of memory \\(negative\\)"),
    ("inf", "cannot read 'inf' as an amount of memory \\(not a finite number\\)"),
    ("NaN", "cannot read 'NaN' as an amount of memory \\(not a finite number\\)"),
    ("-inf GiB", "cannot read '-inf GiB' as an amount of memory \\(not a finite number\\)"),
    ("1e999999999", "'1e999999999' is too large an amount of memory: 9.22e\\+18 bytes"),
    ("8388608TiB", "'8388608TiB' is too large"),
    ("9" * 1000, "'9+\\.\\.\\. is too large")])
def test_parse_bytes_says_why_it_refuses(text, message):
    with pytest.raises(tofu_mx.InvalidArgumentError, match=message):
        parse_bytes(text)


def test_parse_bytes_takes_zero_and_the_largest_amount():
    assert parse_bytes("0") == 0 and parse_bytes("1e-999999") == 0
    assert parse_bytes("8388607TiB") == 8388607 * 2 ** 40


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
     "symbol file 'missing-symbol.json' does not exist; give a symbol JSON file")])
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
    emit = partitioned.emit

    def wrong(program, ordered=False):
        result = emit(program, ordered)
        (share,) = [n for n in result.json["nodes"] if n["name"] == "relu2@dev1"]
        share["attrs"]["act_type"] = "sigmoid"
        return result
    monkeypatch.setattr(partitioned, "emit", wrong)
    assert main(["verify", *mlp_file(tmp_path), "--devices", "cpu:2",
                 "--no-try-factor-orders"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"compared 8 tensors .*: \d+ differ", out), out
    assert "DIFFERS: " in out and "  output softmax_output: max abs err" in out


def test_verify_oracle_flag_judges_float32_against_float64(tmp_path, capsys, monkeypatch):
    """--oracle float64 reaches verify(): a right partition passes, judged against the
    float64 run; a wrong one (one device's relu2 share a sigmoid) still fails."""
    argv = ["verify", *mlp_file(tmp_path), "--devices", "cpu:2", "--dtype", "float32",
            "--oracle", "float64"]
    assert main(argv) == 0
    assert "of its allowance against the float64 oracle" in capsys.readouterr().out
    from tofu_mx.runtime import partitioned
    emit = partitioned.emit

    def wrong(program, ordered=False):
        result = emit(program, ordered)
        (share,) = [n for n in result.json["nodes"] if n["name"] == "relu2@dev1"]
        share["attrs"]["act_type"] = "sigmoid"
        return result
    monkeypatch.setattr(partitioned, "emit", wrong)
    assert main(argv + ["--no-try-factor-orders"]) == 1
    assert "DIFFERS: " in capsys.readouterr().out


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


def test_plan_frontier_prints_bytes_against_memory(capsys):
    assert main(["plan", *WRESNET_TINY, "--devices", "2", "--frontier"]) == 0
    out = capsys.readouterr().out
    assert "plan for 2 devices" in out and "Pareto front" in out and "/ ideal" in out


# --- draw ----------------------------------------------------------------------------------------
def test_draw_writes_a_dot_file(tmp_path, capsys):
    out = tmp_path / "plan.dot"
    assert main(["draw", *WRESNET_TINY, "--devices", "gpu:2", "-o", str(out),
                 "--coarsen-above", "100000"]) == 0
    # 55 operators, with each BatchNorm lowered into the sums it is made of
    assert re.match(rf"wrote {re.escape(str(out))}: \d+ operators on 2 devices",
                    capsys.readouterr().out)
    source = out.read_text(encoding="utf-8")
    assert source.startswith("digraph plan {") and "dev1: gpu(1)" in source


def test_draw_coarsens_above_the_threshold(tmp_path, capsys):
    out = tmp_path / "plan.dot"
    assert main(["draw", *WRESNET_TINY, "--devices", "2", "-o", str(out),
                 "--coarsen-above", "20"]) == 0
    assert re.match(r"wrote .*: \d+ operators drawn as \d+ groups on 2 devices",
                    capsys.readouterr().out)


def test_draw_without_dot_writes_the_dot_file_and_says_how_to_install_it(
        tmp_path, capsys, monkeypatch):
    from tofu_mx.runtime import draw
    monkeypatch.setattr(draw.shutil, "which", lambda name: None)
    out = tmp_path / "plan.png"
    assert main(["draw", *WRESNET_TINY, "--devices", "2", "--view", "graph", "-o",
                 str(out)]) == 0
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
    assert main(["draw", *WRESNET_TINY, "--devices", "cpu:2", "--view", "graph", "-o",
                 str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.png"]


def test_draw_writes_the_layer_view_by_default(tmp_path, capsys):
    out = tmp_path / "plan.png"
    assert main(["draw", *WRESNET_TINY, "--devices", "cpu:2", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert re.fullmatch(rf"wrote {re.escape(str(out))}: \d+ layers on 2 devices, 0 run "
                        rf"whole; [\d.]+ [KMG]?i?B cross devices in the forward pass\n", printed)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.png"]


@pytest.mark.parametrize("flags, message", [
    (["--only", "conv", "-o", "plan.dot"], "only= picks rows of the layer view"),
    (["--view", "layers", "-o", "plan.dot"], "cannot draw the layer view to"),
    (["--only", "no_such_layer", "-o", "plan.png"], "only='no_such_layer' is in no layer's"),
])
def test_draw_refuses_what_its_view_cannot_draw(tmp_path, monkeypatch, capsys, flags, message):
    monkeypatch.chdir(tmp_path)
    assert main(["draw", *WRESNET_TINY, "--devices", "2", *flags]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# --- hostile input (issue 14): one line on stderr, exit code 2, nothing written -----------------
def _fc_graph() -> dict:
    """The JSON graph of FullyConnected(data, 5) + SoftmaxOutput: nodes data, fc_weight,
    fc_bias, fc (3), softmax_label, softmax (5)."""
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=5, name="fc")
    return json.loads(mx.sym.SoftmaxOutput(fc, name="softmax").tojson())


def _edited(edit):
    def write(folder):
        graph = _fc_graph()
        edit(graph)
        (folder / "bad-symbol.json").write_text(json.dumps(graph))
    return write


def _written(name, content):
    def write(folder):
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content)
    return write


def _input(node, k, entry):
    return lambda g: g["nodes"][node]["inputs"].__setitem__(k, entry)


BAD = ["summary", "--symbol", "{tmp}/bad-symbol.json", "--shape", "data=4,3"]
SYMBOL_ERROR = "symbol file '{tmp}/bad-symbol.json'"
TINY = ["--symbol", "{tmp}/net-symbol.json", "--shape", "data=4,3"]
RNN_TINY = ["rnn", "--layers", "1", "--hidden", "8", "--seq-len", "2", "--vocab", "10"]

# (argv with {tmp} for the test's folder, what to write there first, the message expected)
HOSTILE = {
    # integer flags: the flag, the value, the smallest value and an example
    "batch-size 0": (["summary", "wresnet", "--batch-size", "0"], None,
                     "--batch-size must be between 1 and 2147483647, got 0; e.g. --batch-size 32"),
    "batch-size word": (["summary", "wresnet", "--batch-size", "two"], None,
                        "argument --batch-size: invalid int value: 'two' \\(see tofu-mx summary "
                        "--help\\)"),
    "depth -1": (["summary", "wresnet", "--depth", "-1"], None,
                 "argument --depth: invalid choice: -1 \\(choose from 14, 26, 50, 101, 152\\)"),
    "classes 0": (["summary", "mobilenetv2_0.25", "--classes", "0"], None,
                  "--classes must be between 1 and 2147483647, got 0; e.g. --classes 1000"),
    "image-size 0": (["summary", "wresnet", "--image-size", "0"], None,
                     "--image-size must be between 1 and 2147483647, got 0; e.g. --image-size "
                     "224"),
    "widen 0": (["summary", "wresnet", "--widen", "0"], None,
                "--widen must be between 1 and 2147483647, got 0"),
    "hidden 2**31": (["summary", *RNN_TINY, "--hidden", "2147483648"], None,
                     "--hidden must be between 1 and 2147483647, got 2147483648"),
    "seq-len 0": (["summary", *RNN_TINY, "--seq-len", "0"], None,
                  "--seq-len must be between 1 and 2147483647, got 0; e.g. --seq-len 20"),
    "layers 0": (["summary", *RNN_TINY, "--layers", "0"], None,
                 "--layers must be between 1 and 2147483647, got 0"),
    "vocab -3": (["summary", *RNN_TINY, "--vocab", "-3"], None,
                 "--vocab must be between 1 and 2147483647, got -3"),
    "heads 0": (["summary", "transformer", "--heads", "0"], None,
                "--heads must be between 1 and 2147483647, got 0; e.g. --heads 16"),
    "max-states 0": (["plan", *TINY, "--max-states", "0"], None,
                     "--max-states 0: SearchOptions.max_states must be between 1 and 4294967296, got 0"),
    "coarsen-above -1": (["draw", *TINY, "-o", "{tmp}/plan.dot", "--coarsen-above", "-1"], None,
                         "--coarsen-above must be at least 0, got -1"),
    "seed -1": (["verify", *TINY, "--seed", "-1"], None,
                "--seed must be between 0 and 4294967295, got -1"),
    "unknown flag": (["plan", *TINY, "--max-sates", "3"], None,
                     "unrecognized arguments: --max-sates \\(see tofu-mx --help\\)"),
    # model flags the model does not read
    "heads for rnn": (["summary", *RNN_TINY, "--heads", "4"], None,
                      "--heads 4 would change nothing: rnn does not read it \\(it is for "
                      "transformer\\); drop it"),
    "depth for a zoo net": (["plan", "resnet18_v1", "--depth", "14"], None,
                            "--depth 14 would change nothing: resnet18_v1 does not read it "
                            "\\(it is for wresnet\\)"),
    "batch-size with --symbol": (["plan", *TINY, "--batch-size", "8"], None,
                                 "--batch-size 8 would change nothing: --symbol '{tmp}/net-symbol"
                                 ".json' is read as it is \\(give the input shapes with "
                                 "--shape\\); --batch-size is for wresnet, rnn, transformer, "
                                 "model-zoo nets"),
    "classes with --symbol": (["summary", *TINY, "--classes", "10"], None,
                              "--classes 10 would change nothing: --symbol .* is read as it is "
                              "\\(the symbol file fixes the model\\)"),
    "image-size with --shape": (["summary", "wresnet", "--depth", "14", "--image-size", "64",
                                 "--shape", "data=2,3,32,32"], None,
                                "--image-size 64 would change nothing: --shape gives the input "
                                "shapes; put it there \\(--shape data=...\\) and drop "
                                "--image-size"),
    # float flags
    "memory-weight -1": (["plan", *TINY, "--memory-weight", "-1"], None,
                         "--memory-weight -1.0: SearchOptions.memory_weight must be >= 0"),
    "optimizer-state nan": (["plan", *TINY, "--optimizer-state", "nan"], None,
                            "--optimizer-state nan: SearchOptions.optimizer_state must be a "
                            "finite number, got nan; e.g. optimizer_state=1"),
    "rtol nan": (["verify", *TINY, "--rtol", "nan"], None,
                 "--rtol must be a finite number, got nan; e.g. --rtol 1e-4"),
    "rtol -1": (["verify", *TINY, "--rtol", "-1"], None, "--rtol must be >= 0, got -1"),
    "atol inf": (["verify", *TINY, "--atol", "inf"], None, "--atol must be a finite number"),
    # memory budgets
    "budget 0": (["plan", *TINY, "--memory-budget", "0"], None,
                 "--memory-budget '0' is 0 bytes; a device needs a positive amount of memory, "
                 "e.g. --memory-budget 16GiB"),
    "budget 0GiB": (["draw", *TINY, "-o", "{tmp}/p.dot", "--memory-budget", "0GiB"], None,
                    "--memory-budget '0GiB' is 0 bytes"),
    "budget nan": (["plan", *TINY, "--memory-budget", "nan"], None,
                   "cannot read 'nan' as an amount of memory \\(not a finite number\\); "
                   "expected a number of bytes"),
    "budget inf": (["verify", *TINY, "--memory-budget", "inf"], None,
                   "cannot read 'inf' as an amount of memory \\(not a finite number\\)"),
    "budget -5": (["plan", *TINY, "--memory-budget", "-5"], None,
                  "cannot read '-5' as an amount of memory \\(negative\\)"),
    "budget 1e999999999": (["plan", *TINY, "--memory-budget", "1e999999999"], None,
                           "'1e999999999' is too large an amount of memory"),
    # shapes
    "shape data=": (["summary", *TINY, "--shape", "data="], None,
                    "argument --shape: expected NAME=D1,D2,... with positive integers, e.g. "
                    "data=32,3,224,224; got 'data=' \\(see tofu-mx summary --help\\)"),
    "shape data=a,b": (["summary", *TINY[:2], "--shape", "data=a,b"], None,
                       "argument --shape: expected NAME=D1,D2,.*; got 'data=a,b'"),
    "shape =3": (["summary", *TINY[:2], "--shape", "=3"], None,
                 "argument --shape: expected NAME=D1,D2,.*; got '=3'"),
    "shape data": (["summary", *TINY[:2], "--shape", "data"], None,
                   "argument --shape: expected NAME=D1,D2,.*; got 'data'"),
    "shape data=4,,3": (["summary", *TINY[:2], "--shape", "data=4,,3"], None,
                        "argument --shape: expected NAME=D1,D2,.*; got 'data=4,,3'"),
    "shape data=0,3": (["summary", *TINY[:2], "--shape", "data=0,3"], None,
                       "argument --shape: 'data=0,3' has a dimension of 0; every dimension "
                       "must be at least 1"),
    "shape data=-1": (["summary", *TINY[:2], "--shape", "data=-1"], None,
                      "argument --shape: expected NAME=D1,D2,.*; got 'data=-1'"),
    "shape twice": (["summary", *TINY, "--shape", "data=8,3"], None,
                    "--shape gives 'data' twice \\(data=4,3 and data=8,3\\); give each input "
                    "once"),
    "shape not an input": (["summary", *TINY[:2], "--shape", "dta=4,3"], None,
                           "shape given for 'dta' \\(did you mean 'data'\\?\\)"),
    "shape too large": (["summary", *TINY[:2], "--shape", "data=4,99999999999"], None,
                        "shape of input 'data' \\(4, 99999999999\\) has a dimension over "
                        "2\\*\\*31 - 1"),
    # devices
    "devices gpu:": (["plan", *TINY, "--devices", "gpu:"], None,
                     "cannot read 'gpu:' as devices; expected a count"),
    "devices tpu:2": (["plan", *TINY, "--devices", "tpu:2"], None,
                      "cannot read 'tpu:2' as devices"),
    "devices 0": (["plan", *TINY, "--devices", "0"], None,
                  "'0' names no device: give at least one, e.g. cpu:1"),
    "devices cpu:0,0": (["verify", *TINY, "--devices", "cpu:0,0"], None,
                        "'cpu:0,0' lists cpu 0 more than once; give each device once"),
    "devices cpu:10**12": (["plan", *TINY, "--devices", "cpu:1000000000000"], None,
                           "'cpu:1000000000000' asks for more than 4096 devices"),
    # models
    "unknown model": (["summary", "nosuch"], None,
                      "unknown model 'nosuch'; e.g. wresnet, rnn, transformer, resnet50_v1"),
    "misspelt model": (["plan", "resnet5O_v1"], None,
                       "unknown model 'resnet5O_v1'; did you mean resnet50_v1"),
    "model and symbol": (["summary", "wresnet", *TINY], None,
                         "give a MODEL or --symbol, not both"),
    "symbol without shape": (["summary", *TINY[:2]], None,
                             "--symbol needs --shape NAME=D1,D2,... for its data inputs .*; its "
                             "inputs are data, fc_weight, fc_bias, softmax_label"),
    # symbol files that cannot be read
    "symbol missing": (["summary", "--symbol", "{tmp}/nosuch.json", "--shape", "data=4,3"],
                       None, "symbol file '{tmp}/nosuch.json' does not exist; give a symbol JSON "
                             "file as Symbol.save writes it"),
    "symbol in a missing folder": (["summary", "--symbol", "{tmp}/no/net.json"], None,
                                   "symbol file '{tmp}/no/net.json' does not exist \\(nor does "
                                   "its folder '{tmp}/no'\\)"),
    "symbol is a folder": (["summary", "--symbol", "{tmp}", "--shape", "data=4,3"], None,
                           "symbol file '{tmp}' is a folder; give a symbol JSON file"),
    "symbol is a pipe": (["summary", "--symbol", "{tmp}/fifo"], lambda d: os.mkfifo(d / "fifo"),
                         "symbol file '{tmp}/fifo' is not a regular file; give a symbol JSON"),
    "symbol is binary": (BAD, _written("bad-symbol.json", b"\x89PNG\r\n\x1a\n\xff\xfe"),
                         SYMBOL_ERROR + " is not text: byte 0 \\(0x89\\) is not UTF-8"),
    "symbol is truncated": (BAD, lambda d: (d / "bad-symbol.json").write_text(
                                json.dumps(_fc_graph())[:150]),
                            SYMBOL_ERROR + " is not JSON: .* at line 1 column \\d+ \\(a "
                                           "truncated file\\?\\)"),
    "symbol is empty": (BAD, _written("bad-symbol.json", ""),
                        SYMBOL_ERROR + " is not JSON: Expecting value at line 1 column 1"),
    "symbol nested too deeply": (BAD, _written("bad-symbol.json", "[" * 200_000),
                                 SYMBOL_ERROR + " is nested too deeply to be a symbol"),
    # symbol files whose graph is wrong (MXNet would crash, loop or answer with a parser position)
    "symbol is a list": (BAD, _written("bad-symbol.json", "[1, 2]"),
                         SYMBOL_ERROR + " holds a JSON list, not a symbol"),
    "symbol without heads": (BAD, _edited(lambda g: g.pop("heads")),
                             SYMBOL_ERROR + " is not a symbol: it needs a list 'heads' and has "
                                            "none"),
    "symbol without nodes": (BAD, _edited(lambda g: g.__setitem__("nodes", [])),
                             SYMBOL_ERROR + " has no nodes"),
    "symbol without outputs": (BAD, _edited(lambda g: g.__setitem__("heads", [])),
                               SYMBOL_ERROR + " has no outputs \\(heads is empty\\)"),
    "node without op": (BAD, _edited(lambda g: g["nodes"][3].pop("op")),
                        SYMBOL_ERROR + ": node 3 needs 'op' \\(str\\), got none"),
    "inputs not a list": (BAD, _edited(lambda g: g["nodes"][3].__setitem__("inputs", 0)),
                          SYMBOL_ERROR + ": node 3 needs 'inputs' \\(list\\), got int 0"),
    "attrs not strings": (BAD, _edited(lambda g: g["nodes"][3]["attrs"].__setitem__("num_hidden",
                                                                                    5)),
                          SYMBOL_ERROR + ": node 3 'fc': 'attrs' must map names to strings"),
    "input out of range": (BAD, _edited(_input(3, 0, [99, 0, 0])),
                           SYMBOL_ERROR + ": input 0 of node 3 'fc' \\(FullyConnected\\) names "
                                          "node 99, and the graph has nodes 0..5"),
    "input negative": (BAD, _edited(_input(3, 1, [-1, 0, 0])),
                       SYMBOL_ERROR + ": input 1 of node 3 'fc' .* names node -1"),
    "input malformed": (BAD, _edited(_input(3, 0, [0])),
                        SYMBOL_ERROR + ": input 0 of node 3 'fc' \\(FullyConnected\\) is \\[0\\], "
                                       "not \\[node id, output index, version\\]"),
    "input of floats": (BAD, _edited(_input(3, 0, [0.5, 0, 0])),
                        SYMBOL_ERROR + ": input 0 of node 3 .* is \\[0.5, 0, 0\\], not"),
    "input output 2**32": (BAD, _edited(_input(3, 0, [3, 2 ** 32, 0])),
                           SYMBOL_ERROR + ": input 0 of node 3 .* output index and version must "
                                          "be between 0 and 2\\*\\*32 - 1"),
    "cycle": (BAD, _edited(_input(3, 0, [5, 0, 0])),
              SYMBOL_ERROR + ": the graph has a cycle: node 3 'fc' \\(FullyConnected\\) reads "
                             "node 5 'softmax' \\(SoftmaxOutput\\) reads node 3 'fc' "
                             "\\(FullyConnected\\); an input must name a node computed before "
                             "it"),
    "self loop": (BAD, _edited(_input(5, 0, [5, 0, 0])),
                  SYMBOL_ERROR + ": the graph has a cycle: node 5 'softmax' "
                                 "\\(SoftmaxOutput\\) reads node 5"),
    "cycle through control_deps": (BAD, _edited(lambda g: g["nodes"][3].__setitem__(
                                       "control_deps", [5])),
                                   SYMBOL_ERROR + ": the graph has a cycle: node 3 'fc' .* reads "
                                                  "node 5 'softmax' .* reads node 3"),
    "control_deps out of range": (BAD, _edited(lambda g: g["nodes"][3].__setitem__(
                                      "control_deps", [7])),
                                  SYMBOL_ERROR + ": control_deps of node 3 'fc' .* names node 7"),
    "variable with inputs": (BAD, _edited(lambda g: g["nodes"][1].__setitem__("inputs",
                                                                               [[0, 0, 0]])),
                             SYMBOL_ERROR + ": node 1 'fc_weight' \\(variable\\) has inputs; a "
                                            "variable \\(op 'null'\\) has none"),
    "two variables named alike": (BAD, _edited(lambda g: g["nodes"][1].__setitem__("name",
                                                                                   "data")),
                                   SYMBOL_ERROR + ": node 1 'data' \\(variable\\) has the name of "
                                                  "node 0; .* give each node its own name"),
    "two operators named alike": (BAD, _edited(lambda g: g["nodes"][5].__setitem__("name", "fc")),
                                  SYMBOL_ERROR + ": node 5 'fc' \\(SoftmaxOutput\\) has the name "
                                                 "of node 3"),
    "arg_nodes names an operator": (BAD, _edited(lambda g: g["arg_nodes"].__setitem__(0, 3)),
                                    SYMBOL_ERROR + ": arg_nodes\\[0\\] names node 3 'fc' "
                                                   "\\(FullyConnected\\); arg_nodes must list "
                                                   "variable nodes"),
    "arg_nodes out of range": (BAD, _edited(lambda g: g["arg_nodes"].append(6)),
                               SYMBOL_ERROR + ": arg_nodes\\[4\\] names node 6, and the graph has "
                                              "nodes 0..5"),
    "heads out of range": (BAD, _edited(lambda g: g.__setitem__("heads", [[6, 0, 0]])),
                           SYMBOL_ERROR + ": heads\\[0\\] names node 6"),
    "unknown operator": (BAD, _edited(lambda g: g["nodes"][3].__setitem__("op", "NoSuchOp")),
                         "MXNet cannot load " + SYMBOL_ERROR + ": Failed loading Op fc of type "
                         "NoSuchOp: Check failed: op != nullptr: Operator NoSuchOp is not "
                         "registered; give a symbol JSON file"),
    "bad attribute": (BAD, _edited(lambda g: g["nodes"][3]["attrs"].__setitem__("num_hidden",
                                                                                "five")),
                      "MXNet cannot load " + SYMBOL_ERROR + ": Invalid Parameter format for "
                      "num_hidden expect int but value='five'"),
    "too few inputs": (BAD, _edited(lambda g: g["nodes"][5].__setitem__("inputs", [[3, 0, 0]])),
                       "MXNet cannot infer the graph's shapes from data=\\(4, 3\\)"),
    # paths to write
    "json in a missing folder": (["plan", *TINY, "--json", "{tmp}/no/plan.json"], None,
                                 "cannot write --json '{tmp}/no/plan.json': the folder "
                                 "'{tmp}/no' does not exist; create it first or give another "
                                 "path"),
    "json is a folder": (["plan", *TINY, "--json", "{tmp}"], None,
                         "cannot write --json '{tmp}': it is a folder; give the path of a file"),
    "json in a file": (["plan", *TINY, "--json", "{tmp}/net-symbol.json/plan.json"], None,
                       "cannot write --json .*: the folder '{tmp}/net-symbol.json' is not a "
                       "folder"),
    "json is empty": (["plan", *TINY, "--json", ""], None,
                      "--json is empty; give the path of a file to write"),
    "json is a pipe": (["plan", *TINY, "--json", "{tmp}/fifo"], lambda d: os.mkfifo(d / "fifo"),
                       "cannot write --json '{tmp}/fifo': it exists and is not a regular file"),
    "output in a missing folder": (["draw", *TINY, "-o", "{tmp}/no/plan.dot"], None,
                                   "cannot write --output '{tmp}/no/plan.dot': the folder "
                                   "'{tmp}/no' does not exist"),
    "output is a folder": (["draw", *TINY, "-o", "{tmp}/sub.dot"],
                           lambda d: (d / "sub.dot").mkdir(),
                           "cannot write --output '{tmp}/sub.dot': it is a folder"),
}


def _tree(folder):
    """Every path under ``folder`` with its bytes (None for folders and pipes)."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("argv, prepare, message", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_input_is_one_line_with_exit_code_2(argv, prepare, message, tmp_path, capsys):
    mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=5, name="fc"),
                         name="softmax").save(str(tmp_path / "net-symbol.json"))
    if prepare:
        prepare(tmp_path)
    before = _tree(tmp_path)
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    expected = "tofu-mx: error: " + message.replace("{tmp}", re.escape(str(tmp_path)))
    assert re.match(expected, captured.err), captured.err
    assert _tree(tmp_path) == before           # nothing written, nothing changed


def _outputs_past_the_end(folder):
    """Symbol files whose entries read an output their node does not have: MXNet 1.9.1 dies of
    a segmentation fault loading them."""
    edits = {"head": lambda g: g.__setitem__("heads", [[5, 1, 0]]),
             "input": _input(5, 0, [3, 1, 0]),
             "variable": _input(3, 0, [0, 1, 0])}
    for name, edit in edits.items():
        graph = _fc_graph()
        edit(graph)
        (folder / f"{name}-symbol.json").write_text(json.dumps(graph))
    return [str(folder / f"{name}-symbol.json") for name in edits]


def test_an_output_past_the_end_is_refused_before_mxnet_crashes_on_it(tmp_path):
    """In a process of its own: if the check let one through, MXNet would kill the process."""
    script = ("import sys; from tofu_mx.cli import main; "
              "print([main(['summary', '--symbol', p, '--shape', 'data=4,3']) "
              "for p in sys.argv[1:]])")
    result = subprocess.run([sys.executable, "-c", script, *_outputs_past_the_end(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == "[2, 2, 2]\n", result
    lines = result.stderr.splitlines()
    assert len(lines) == 3 and all(line.startswith("tofu-mx: error: symbol file ")
                                   for line in lines), lines
    assert lines[0].endswith(": heads[0] reads output 1 of node 5 'softmax' (SoftmaxOutput), "
                             "which has 1 output (0..0)")
    assert lines[1].endswith(": input 0 of node 5 'softmax' (SoftmaxOutput) reads output 1 of "
                             "node 3 'fc' (FullyConnected), which has 1 output (0..0)")
    assert lines[2].endswith(": input 0 of node 3 'fc' (FullyConnected) reads output 1 of node "
                             "0 'data' (variable), a variable, which has only output 0")


def test_a_symbol_file_may_read_any_output_an_operator_has(tmp_path, capsys):
    """Hidden outputs too (BatchNorm's batch mean: output 1 of 3, not listed by MXNet)."""
    graphs = {"split": (mx.sym.split(mx.sym.var("data"), num_outputs=2, axis=1, name="s"), 1),
              "bn": (mx.sym.BatchNorm(mx.sym.var("data"), name="bn"), 5)}
    for name, (symbol, node) in graphs.items():
        graph = json.loads(symbol.tojson())
        graph["heads"] = [[node, 1, 0]]
        (tmp_path / f"{name}.json").write_text(json.dumps(graph))
    assert main(["summary", "--symbol", str(tmp_path / "split.json"), "--shape",
                 "data=4,6"]) == 0
    assert "SliceChannel x1" in capsys.readouterr().out
    assert main(["summary", "--symbol", str(tmp_path / "bn.json"), "--shape",
                 "data=4,3,2,2"]) == 0
    assert "BatchNorm x1" in capsys.readouterr().out


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith("tofu-mx: error: "), captured.err
    return captured.err[len("tofu-mx: error: "):].rstrip("\n")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_symbol_file(tmp_path, capsys):
    path = tmp_path / "net-symbol.json"
    mx.sym.var("data").save(str(path))
    path.chmod(0)
    assert main(["summary", "--symbol", str(path), "--shape", "data=4,3"]) == 2
    assert _one_error_line(capsys) == (f"cannot read symbol file {str(path)!r}: Permission "
                                       f"denied; give a symbol JSON file as Symbol.save writes "
                                       f"it (e.g. net-symbol.json) that you may read")


def test_an_unreadable_symbol_file_as_root_would_see_it(tmp_path, capsys, monkeypatch):
    """The same error where the tests run as root: open() made to refuse."""
    import errno

    from tofu_mx import files

    def refuse(path, mode="r"):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    path = tmp_path / "net-symbol.json"
    mx.sym.var("data").save(str(path))
    monkeypatch.setattr(files, "open", refuse, raising=False)
    assert main(["summary", "--symbol", str(path), "--shape", "data=4,3"]) == 2
    assert _one_error_line(capsys).startswith(
        f"cannot read symbol file {str(path)!r}: Permission denied; give a symbol JSON file")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any folder")
def test_json_in_a_folder_without_write_permission(tmp_path, capsys):
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o555)
    target = folder / "plan.json"
    assert main(["plan", *[a.replace("{tmp}", str(tmp_path)) for a in TINY],
                 "--json", str(target)]) == 2
    assert "no permission to create files in the folder" in _one_error_line(capsys)


def _tiny(tmp_path):
    mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=5, name="fc"),
                         name="softmax").save(str(tmp_path / "net-symbol.json"))
    return [a.replace("{tmp}", str(tmp_path)) for a in TINY]


@pytest.mark.parametrize("flags, message", [
    (["--max-states", "0"], "--max-states 0: "),
    (["--memory-budget", "100"], "no plan fits: device 0 needs")])
def test_an_existing_json_target_is_left_as_it_was_on_error(flags, message, tmp_path, capsys):
    target = tmp_path / "plan.json"
    target.write_text("the plan of yesterday")
    assert main(["plan", *_tiny(tmp_path), "--devices", "2", "--json", str(target),
                 *flags]) == 2
    assert _one_error_line(capsys).startswith(message)
    assert target.read_text() == "the plan of yesterday"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net-symbol.json", "plan.json"]


def test_a_write_that_fails_after_the_search_is_one_line(tmp_path, capsys, monkeypatch):
    import errno

    from tofu_mx import cli

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    monkeypatch.setattr(cli, "atomic_write_bytes", full)
    target = tmp_path / "plan.json"
    assert main(["plan", *_tiny(tmp_path), "--json", str(target)]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("plan for 8 devices")       # the report came first
    assert captured.err == (f"tofu-mx: error: cannot write --json {str(target)!r}: No space "
                            f"left on device; free some space or give another path\n")


@pytest.mark.parametrize("case", [
    "batch-size 0", "max-states 0", "coarsen-above -1", "seed -1", "optimizer-state nan",
    "rtol nan", "budget 0", "budget -5", "shape twice", "devices gpu:", "devices cpu:0,0",
    "json in a missing folder", "json is a folder", "json is a pipe",
    "output in a missing folder", "output is a folder"])
def test_flags_and_paths_are_checked_before_the_model_is_loaded(case, tmp_path, capsys,
                                                                 monkeypatch):
    from tofu_mx import cli

    def too_late(args):
        raise AssertionError(f"{case}: the model was loaded before the flags were checked")
    monkeypatch.setattr(cli, "_model", too_late)
    argv, prepare, message = HOSTILE[case]
    _tiny(tmp_path)
    if prepare:
        prepare(tmp_path)
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    assert re.match(message.replace("{tmp}", re.escape(str(tmp_path))), _one_error_line(capsys))


def test_an_mxnet_error_is_one_line_and_a_bug_is_a_traceback(tmp_path, capsys, monkeypatch):
    """An MXNetError escaping a command comes from the graph or the shapes given: one line,
    MXNet's own, without its traceback frames. TOFU_MX_TRACEBACK=1 re-raises it. Any other
    exception is a bug of tofu_mx and must show its traceback."""
    from tofu_mx import cli

    def mxnet_fails(graph):
        raise mx.base.MXNetError('Traceback (most recent call last):\n  File "../src/x.cc", '
                                 'line 42\nMXNetError: Check failed: a == b (1 vs. 2) : odd')
    monkeypatch.setattr(cli, "summarize", mxnet_fails)
    argv = ["summary", *_tiny(tmp_path)]
    assert main(argv) == 2
    assert _one_error_line(capsys) == ("MXNet failed: Check failed: a == b (1 vs. 2) : odd; "
                                       "check the model and the shapes given "
                                       "(TOFU_MX_TRACEBACK=1 shows where it failed)")
    monkeypatch.setenv("TOFU_MX_TRACEBACK", "1")
    with pytest.raises(mx.base.MXNetError, match="odd"):
        main(argv)
    monkeypatch.delenv("TOFU_MX_TRACEBACK")
    monkeypatch.setattr(cli, "summarize", lambda graph: {}["a bug"])
    with pytest.raises(KeyError, match="a bug"):
        main(argv)


@pytest.mark.parametrize("text, message", [
    ('Traceback (most recent call last):\n  File "../src/a.cc", line 230\nMXNetError: Check '
     'failed: e.node_id < jgraph.nodes.size(): ', "Check failed: e.node_id < jgraph.nodes.size()"),
    ("MXNetError: Error in operator fc: [18:05:16] ../src/operator/nn/fully_connected.cc:47: "
     "Check failed: in_shape->size() == 3U (1 vs. 3) : Input:[data, weight, bias]",
     "Error in operator fc: Check failed: in_shape->size() == 3U (1 vs. 3) : Input:[data, "
     "weight, bias]"),
    ("[19:01:02] ../src/c_api.cc:10: out of memory\nStack trace:\n  [bt] (0) libmxnet.so",
     "out of memory"),
    ("", "MXNetError")])
def test_mxnet_message(text, message):
    from tofu_mx.errors import mxnet_message
    assert mxnet_message(mx.base.MXNetError(text)) == message


@pytest.mark.parametrize("command", ["-m tofu_mx.tdl --coverage --mxnet",
                                     "-m tofu_mx summary rnn --layers 2 --hidden 64"])
def test_output_piped_into_head_ends_quietly(command):
    """Seen: ``python -m tofu_mx.tdl --coverage ... | head`` ended in a BrokenPipeError
    traceback and exit code 1."""
    done = subprocess.run(f"{sys.executable} {command} | head -n 1; "
                          f"echo \"rc=${{PIPESTATUS[0]}}\"", shell=True, executable="/bin/bash",
                          capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.stdout.strip().endswith("rc=0")


def test_verify_chooses_the_plan_by_step_time_on_a_machine(tmp_path, capsys):
    """--machine reaches partition(machine=...): the choice is printed, and the partition
    it chose verifies; a machine that is not a preset is refused, listing the presets."""
    argv = ["verify", *mlp_file(tmp_path), "--devices", "cpu:2"]
    assert main(argv + ["--machine", "8xV100-16GB-PCIe"]) == 0
    out = capsys.readouterr().out
    assert "chosen for 8xV100-16GB-PCIe by simulated step time" in out
    assert "also weighed: converted inputs" in out and "all agree" in out
    assert main(argv + ["--machine", "V100"]) == 2
    assert "invalid choice: 'V100'" in capsys.readouterr().err
