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
