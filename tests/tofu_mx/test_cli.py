import subprocess
import sys

import mxnet as mx

from tofu_mx.cli import main


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
    assert "num_devices must be a positive int, got 0" in capsys.readouterr().err
