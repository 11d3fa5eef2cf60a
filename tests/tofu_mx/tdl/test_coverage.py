import subprocess
import sys

import mxnet as mx

from tofu_mx.tdl.__main__ import main
from tofu_mx.tdl.coverage import builtin_graphs, coverage, format_coverage

TRANSFORMER_OPS = {"Reshape", "transpose", "expand_dims", "batch_dot", "softmax", "LayerNorm",
                   "Embedding", "SequenceMask", "slice", "Cast", "broadcast_add", "broadcast_mul",
                   "LeakyReLU", "Concat", "stack", "SoftmaxOutput", "MakeLoss", "BlockGrad"}


def test_every_operator_of_the_zoo_and_the_models_is_described_and_checked():
    rows = coverage(builtin_graphs())
    assert rows and all(r.status == "described" and r.ok for r in rows), format_coverage(rows)
    ops = {r.op for r in rows}
    assert {"Convolution", "BatchNorm", "Pooling", "Concat", "clip", "FullyConnected",
            "SliceChannel", "stack", "batch_dot", "LayerNorm", "Embedding"} <= ops


def test_transformer_encoder_operators_are_registered():
    from tofu_mx.tdl import registered
    assert TRANSFORMER_OPS <= set(registered())


def test_coverage_of_a_symbol_file_lists_unknown_ops(tmp_path, capsys):
    x = mx.sym.var("x")
    y = mx.sym.SwapAxis(mx.sym.relu(x), dim1=0, dim2=1)
    path = tmp_path / "s.json"
    y.save(str(path))
    assert main(["--coverage", "--symbol", str(path), "--shape", "x=2,3"]) == 1
    out = capsys.readouterr().out
    assert "SwapAxis" in out and "unknown" in out and "relu" in out
    assert "2 operators: 1 described and checked, 0 opaque, 1 without description" in out


def test_module_command_for_the_zoo():
    result = subprocess.run([sys.executable, "-m", "tofu_mx.tdl", "--coverage"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "0 opaque, 0 without description" in result.stdout
