"""The example training scripts, run as a user runs them (subprocesses, small sizes): each
trains as plain Gluon does (--compare, float64), a run killed by SIGKILL resumes from its
checkpoint at another device count on the curve an uninterrupted run follows, and bad flags
give one line and exit code 2."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: small sizes: a few seconds a run on 2 cores
SMALL = {
    "train_wresnet.py": ["--depth", "14", "--widen", "1", "--image-size", "32"],
    "train_rnn.py": ["--layers", "2", "--hidden", "32", "--steps", "6", "--vocab", "48"],
    "train_gluon_zoo.py": ["--model", "resnet18_v1", "--image-size", "32"],
}


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(EXAMPLES / script), *SMALL[script], *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def printed_curve(stdout: str) -> list[float]:
    found = re.search(r"^loss curve \((\d+) steps\): (.*)$", stdout, re.MULTILINE)
    assert found, stdout
    values = [float(v) for v in found.group(2).split()]
    assert len(values) == int(found.group(1))
    return values


def checkpoint(folder: Path) -> dict:
    return json.loads((folder / "checkpoint.json").read_text())


@pytest.mark.parametrize("script, dtype", [(s, "float64") for s in sorted(SMALL)]
                         + [("train_rnn.py", "float32")])
def test_trains_as_plain_gluon_does(script, dtype):
    done = run(script, "--compare", "--dtype", dtype, "--steps-total", "3",
               "--batch-size", "4", "--devices", "cpu:2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "operators run whole (fallbacks): none" in done.stdout
    assert len(printed_curve(done.stdout)) == 3
    rows = re.findall(r"^ +([123])((?: +\S+){3,})$", done.stdout, re.MULTILINE)
    assert [int(r[0]) for r in rows] == [1, 2, 3]               # side by side, every step
    columns = np.array([[float(v) for v in r[1].split()] for r in rows])
    if dtype == "float64":
        assert "--compare: agree: largest relative difference" in done.stdout
        np.testing.assert_allclose(columns[:, 0], columns[:, 1], rtol=1e-7)
    else:       # judged against plain Gluon in float64, the fourth column
        assert "--compare: agree: relative error from the float64 oracle" in done.stdout
        np.testing.assert_allclose(columns[:, 0], columns[:, 3], rtol=1e-5)
    assert re.search(r"^\s+cpu\(1\)\s+\d", done.stdout, re.MULTILINE)   # memory per device
    assert re.search(r"\d+\.\d samples/s", done.stdout)


def test_a_killed_run_resumes_at_another_device_count_on_the_same_curve(tmp_path):
    """WResNet: the checkpoint carries BatchNorm's statistics and SGD's momentum."""
    common = ["--dtype", "float64", "--steps-total", "5", "--checkpoint-every", "2",
              "--batch-size", "4"]
    killed = run("train_wresnet.py", *common, "--devices", "cpu:2",
                 "--checkpoint", str(tmp_path / "ck"), "--kill-after-step", "3")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    saved = checkpoint(tmp_path / "ck")
    assert saved["step"] == 2 and len(saved["losses"]) == 2
    assert sorted(os.listdir(tmp_path / "ck")) == [
        "checkpoint.json", "step-00000002.params", "step-00000002.states"]

    other = run("train_wresnet.py", *common, "--widen", "2",
                "--checkpoint", str(tmp_path / "ck"), "--resume")
    assert other.returncode == 2
    assert re.fullmatch(r"train_wresnet\.py: error: --resume: .* was written by another run: "
                        r"widen=1 \(now 2\)\. .*\n", other.stderr.splitlines(True)[-1])

    resumed = run("train_wresnet.py", *common, "--devices", "cpu:4",
                  "--checkpoint", str(tmp_path / "ck"), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {tmp_path / 'ck'} at step 2" in resumed.stdout
    assert len(printed_curve(resumed.stdout)) == 5               # the whole curve
    whole = run("train_wresnet.py", *common, "--devices", "cpu:2",
                "--checkpoint", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stdout + whole.stderr
    a, b = checkpoint(tmp_path / "ck"), checkpoint(tmp_path / "whole")
    assert a["step"] == b["step"] == 5
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=1e-7, atol=0)
    assert a["losses"][:2] == saved["losses"]
    assert printed_curve(resumed.stdout) == pytest.approx(a["losses"], abs=1e-6)


def test_a_checkpoint_is_never_replaced_without_overwrite(tmp_path):
    """Each save prints one line; a second run into the same folder refuses (exit 2, the
    checkpoint untouched) unless it resumes or says --overwrite."""
    common = ["--dtype", "float64", "--batch-size", "4", "--checkpoint", str(tmp_path / "ck")]
    first = run("train_rnn.py", *common, "--steps-total", "2", "--checkpoint-every", "1")
    assert first.returncode == 0, first.stdout + first.stderr
    saves = re.findall(r"^checkpoint: step (\d) saved in (.*)$", first.stdout, re.MULTILINE)
    assert saves == [("1", str(tmp_path / "ck")), ("2", str(tmp_path / "ck"))], first.stdout
    before = checkpoint(tmp_path / "ck")

    again = run("train_rnn.py", *common, "--steps-total", "2")
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.splitlines()[-1] == (
        f"train_rnn.py: error: --checkpoint {tmp_path / 'ck'} holds a checkpoint at step 2, "
        f"which this run would replace; continue it with --resume (with --steps-total above "
        f"2 to train further), start again with --overwrite, or give another --checkpoint "
        f"folder")
    assert checkpoint(tmp_path / "ck") == before

    more = run("train_rnn.py", *common, "--steps-total", "3", "--resume")
    assert more.returncode == 0 and "checkpoint: step 3 saved in" in more.stdout
    assert checkpoint(tmp_path / "ck")["losses"][:2] == before["losses"]

    fresh = run("train_rnn.py", *common, "--steps-total", "1", "--overwrite")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    saved = checkpoint(tmp_path / "ck")
    assert saved["step"] == 1 and saved["losses"] == before["losses"][:1]


def launched(workers: int, script: str, *args: str) -> subprocess.CompletedProcess:
    """``script`` as ``workers`` workers of python -m tofu_mx.launch."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "tofu_mx.launch", "-n", str(workers), "--",
                           sys.executable, str(EXAMPLES / script), *SMALL[script], *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_two_workers_follow_one_process_curve_and_resume_at_another_count(tmp_path):
    """train_rnn.py --kvstore dist_sync: 2 workers x 2 devices, each on its half of the batch,
    print the whole batch's curve of one process; worker 0 alone writes the checkpoint, which
    one process on 3 devices resumes on the curve an uninterrupted run follows."""
    common = ["--dtype", "float64", "--batch-size", "4", "--checkpoint-every", "1"]
    two = launched(2, "train_rnn.py", *common, "--steps-total", "2", "--devices", "cpu:2",
                   "--kvstore", "dist_sync", "--checkpoint", str(tmp_path / "ck"))
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    assert sorted(re.findall(r"^\[worker \d\] (worker \d of 2 \(dist_sync\): rows \d-\d)",
                             two.stdout, re.MULTILINE)) == [
        "worker 0 of 2 (dist_sync): rows 0-1", "worker 1 of 2 (dist_sync): rows 2-3"]
    curves = re.findall(r"^\[worker \d\] loss curve \(2 steps\): (.*)$", two.stdout, re.MULTILINE)
    assert len(curves) == 2 and curves[0] == curves[1]
    assert sorted(os.listdir(tmp_path / "ck")) == [
        "checkpoint.json", "step-00000002.params", "step-00000002.states"]

    resumed = run("train_rnn.py", *common, "--steps-total", "4", "--devices", "cpu:3",
                  "--checkpoint", str(tmp_path / "ck"), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    whole = run("train_rnn.py", *common, "--steps-total", "4", "--devices", "cpu:2",
                "--checkpoint", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stdout + whole.stderr
    a, b = checkpoint(tmp_path / "ck"), checkpoint(tmp_path / "whole")
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=1e-7, atol=0)
    np.testing.assert_allclose([float(v) for v in curves[0].split()], b["losses"][:2],
                               rtol=1e-6)     # printed with 6 decimals

    uneven = launched(2, "train_rnn.py", "--batch-size", "5", "--steps-total", "1",
                      "--kvstore", "dist_sync")
    assert uneven.returncode == 2
    assert "error: --batch-size 5 (the batch of all workers) does not split evenly over 2 " \
           "workers" in uneven.stdout


def test_replicas_train_as_gluons_data_parallelism_does():
    """--replicas 2 over 4 devices (BatchNorm in every block): --compare trains plain Gluon
    data-parallel on 2 devices, whose BatchNorm sees each device's rows, as each group's."""
    done = run("train_wresnet.py", "--compare", "--dtype", "float64", "--steps-total", "3",
               "--batch-size", "8", "--devices", "cpu:4", "--replicas", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "over 4 devices (cpu(0), cpu(1), cpu(2), cpu(3)) in 2 data-parallel groups" \
        in done.stdout
    assert "gluon float64 cpu(0)+cpu(1)" in done.stdout
    assert "--compare: agree: largest relative difference" in done.stdout


@pytest.mark.parametrize("script, args, message", [
    ("train_rnn.py", ["--devices", "cpu:0"], r"argument --devices: .* names no device"),
    ("train_rnn.py", ["--replicas", "auto"], r"--replicas auto lets --machine choose"),
    ("train_rnn.py", ["--replicas", "two"], r"argument --replicas: expected an integer >= 1 or auto, got 'two'"),
    ("train_rnn.py", ["--kvstore", "dist_sync", "--compare"],
     r"--compare runs plain Gluon in this process"),
    ("train_gluon_zoo.py", ["--model", "resnet19"],
     r"argument --model: unknown model 'resnet19'; did you mean"),
    ("train_rnn.py", ["--overwrite"],
     r"--resume, --checkpoint-every and --overwrite need --checkpoint DIR"),
    ("train_rnn.py", ["--checkpoint", "ck", "--resume", "--overwrite"],
     r"--resume continues the checkpoint, --overwrite replaces it: give one"),
])
def test_a_bad_flag_is_one_line_and_exit_code_2(script, args, message):
    done = run(script, *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert re.match(rf"{re.escape(script)}: error: {message}", done.stderr)


def test_the_demos_paper_size_figure_is_the_plan_users_get():
    """make demo's bytes per step are tofu_mx.plan()'s (it once searched the graph without
    BatchNorm lowered: 173 GiB where plan() and the CLI say 105 GiB for WResNet-152-W10)."""
    import importlib.util
    import tofu_mx
    from tofu_mx import models
    spec = importlib.util.spec_from_file_location("demo", EXAMPLES / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    sym, shapes = models.wresnet(14, 2, 10), models.input_shapes("wresnet", 8, image_size=32)
    plan, _, dp = demo.paper_plan(sym, shapes, 4)
    assert plan.total_bytes == tofu_mx.plan(sym, 4, **shapes).total_bytes < dp
