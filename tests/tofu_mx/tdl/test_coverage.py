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
    from tests.tofu_mx.runtime.custom_ops import cube
    x = mx.sym.var("x")
    y = cube(mx.sym.relu(x))
    path = tmp_path / "s.json"
    y.save(str(path))
    assert main(["--coverage", "--symbol", str(path), "--shape", "x=2,3"]) == 1
    out = capsys.readouterr().out
    assert "Custom:tofu_test_cube" in out and "unknown" in out and "relu" in out
    assert "2 operators: 1 described and checked, 0 opaque, 1 without description" in out


def test_every_mxnet_operator_is_accounted_for():
    """Every name MXNet registers has a row; at least 150 public ones are described and
    pass their kernel check; every public one left out says why."""
    from tofu_mx.tdl.coverage import FALLBACK, OUT_OF_SCOPE, mxnet_coverage
    from tofu_mx.tdl.registry import mxnet_operators
    rows = mxnet_coverage()
    assert [r.name for r in rows] == sorted(mxnet_operators())
    public = [r for r in rows if r.public]
    described = [r for r in public if r.status == "described"]
    assert len(public) == 269 and len(described) >= 150
    assert all(r.ok for r in rows), [r.name for r in rows if not r.ok]
    left_out = [r for r in public if r.status in (FALLBACK, OUT_OF_SCOPE)]
    assert all(r.reason and r.reason != "no description: runs whole on one device"
               for r in left_out), [r.name for r in left_out if "no description" in r.reason]
    by_name = {r.name: r for r in rows}
    assert by_name["flip"].status == "described" and by_name["flip"].canonical == "reverse"
    assert by_name["sgd_update"].status == OUT_OF_SCOPE
    assert by_name["CTCLoss"].status == FALLBACK and "recursion" in by_name["CTCLoss"].reason
    # the operators of the models nobody here wrote
    for op in ("_contrib_arange_like", "_contrib_interleaved_matmul_selfatt_qk", "_zeros",
               "_contrib_interleaved_matmul_selfatt_valatt", "broadcast_axis", "zeros_like",
               "_rnn_param_concat", "_contrib_div_sqrt_dim", "gather_nd", "where"):
        assert by_name[op].status == "described", op


def test_module_command_for_every_mxnet_operator():
    result = subprocess.run([sys.executable, "-m", "tofu_mx.tdl", "--coverage", "--mxnet",
                             "--public"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 + 269 + 2 and lines[-2].startswith("public operators (269): ")
    assert "sgd_update" in result.stdout and "_plus_scalar" not in result.stdout


def test_module_command_for_the_zoo():
    result = subprocess.run([sys.executable, "-m", "tofu_mx.tdl", "--coverage"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "0 opaque, 0 without description" in result.stdout
