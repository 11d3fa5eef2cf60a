"""--compare in float64 where the curves differ: plain Gluon is trained again on a first batch
moved by 1e-15, and the curves are judged by how far that moves Gluon's own. A chaotic model
(its own curve moves as much) is said to be so and passes; a wrong run of a model that is not
chaotic, or one wrong from its first steps on a chaotic model, still DIFFERs. In process, on
synthetic curves and on a two-layer network: a few seconds."""
import re
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import common  # noqa: E402
import comparison  # noqa: E402

GLUON = [3.11, 2.76, 2.66, 3.08, 2.67]


def compare(ours, perturbed, start=0):
    """``comparison.compare`` on a float64 run of cpu:2 with plain Gluon's curve ``GLUON``, the
    run (resumed at step ``start``) having trained the steps after ``start``."""
    args = common.parser("test", batch_size=8, lr=0.01).parse_args(["--dtype", "float64"])
    ref = common.Reference("gluon float64", "float64", [mx.cpu(0)], None, None, GLUON[start:])
    return comparison.compare(args, [0.0] * start + list(ours), start, [ref], perturbed)


def moved_by(*relative):
    """Gluon's curve moved by these relative amounts, step by step."""
    return [g * (1 + r) for g, r in zip(GLUON, relative)]


def test_a_chaotic_model_is_said_to_be_so_and_judged_by_its_own_sensitivity(capsys):
    ours = moved_by(1e-13, 3e-11, 3e-8, 1e-7, 4e-5)         # MobileNetV2 at 32 px
    runs = [moved_by(1e-13, 1e-10, 9e-9, 8e-7, 7e-3), moved_by(5e-14, 2e-12, 1e-9, 1e-7, 4e-6)]
    assert compare(ours, lambda: runs) == 0
    out = capsys.readouterr().out
    assert "--compare: agree: largest relative difference 4.00e-05, tolerance 1e-07" in out
    assert ("--compare: the model is chaotic at this size: plain Gluon's own curve moves by "
            "up to 7.0e-03 (step 5) after moving the first batch (step 1) by 1e-15 (2 runs)"
            in out)
    assert "try a larger --image-size or --batch-size, or fewer --steps-total" in out


@pytest.mark.parametrize("ours, why", [
    (moved_by(1e-13, 1e-3, 1e-3, 1e-3, 1e-3), "wrong from step 2, where Gluon has moved 1e-10"),
    (moved_by(1e-13, 3e-11, 3e-8, 1e-7, 0.5), "at step 5 more than 10 x Gluon's own move"),
])
def test_a_wrong_curve_differs_even_on_a_chaotic_model(capsys, ours, why):
    runs = [moved_by(1e-13, 1e-10, 9e-9, 8e-7, 7e-3)]
    assert compare(ours, lambda: runs) == 1, why
    out = capsys.readouterr().out
    assert "--compare: DIFFER: largest relative difference" in out
    assert ("so the model is chaotic at this size, but tofu_mx's curve differs by more than "
            "10 x that: the difference is tofu_mx's, not the model's; tofu_mx.verify()" in out)


def test_a_model_that_is_not_chaotic_keeps_the_tolerance(capsys):
    runs = [moved_by(1e-15, 2e-15, 3e-15, 3e-15, 4e-15)]
    assert compare(moved_by(0, 0, 0, 0, 2e-7), lambda: runs) == 1
    out = capsys.readouterr().out
    assert "closest to its limit at step 5, 2.00e-07 of 1.00e-07 allowed" in out
    assert "by up to 4.0e-15 (step 5) after moving the first batch (step 1) by 1e-15" in out
    assert "chaotic" not in out


def test_a_perturbation_the_model_does_not_see_measures_nothing(capsys):
    assert compare(moved_by(0, 1e-3, 0, 0, 0), lambda: [list(GLUON)] * 3) == 1
    assert ("left plain Gluon's curve exactly as it was (a model that reads its inputs as "
            "indices, e.g. token ids, does not see such a move): the model's sensitivity is not "
            "measured" in capsys.readouterr().out)


def test_curves_that_agree_or_a_resumed_run_are_judged_as_before(capsys):
    def never():
        raise AssertionError("the curves agree: nothing to measure")
    assert compare(moved_by(1e-13, 3e-11, 3e-8, 5e-8, 9e-8), never) == 0
    assert compare(moved_by(0, 0, 0, 0, 1e-3)[2:], lambda: [moved_by(0, 0, 1e-5, 0, 1e-3)[2:]],
                   start=2) == 0
    assert "the first batch (step 3)" in capsys.readouterr().out


class Batches:
    """Random 4-feature rows, three classes; the same batch for a step every time."""

    def batch(self, step):
        rng = np.random.default_rng(step)
        return rng.normal(size=(8, 4)), rng.integers(0, 3, 8).astype(np.float64)

    def fingerprint(self):
        return "random"


def mlp():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(6, activation="tanh"), gluon.nn.Dense(3))
    return net


class WrongTrainer(common.tg.Trainer):
    """Updates with the gradient scaled by 8/9: a partition that lost part of a sum."""

    def step(self, batch_size, ignore_stale_grad=False):
        super().step(batch_size + 1, ignore_stale_grad)


def test_a_wrong_partition_of_a_model_that_is_not_chaotic_still_differs(capsys, monkeypatch):
    monkeypatch.setattr(common.tg, "Trainer", WrongTrainer)
    task = common.Task("test", "two-layer network", mlp, mx.init.Xavier(),
                       gluon.loss.SoftmaxCrossEntropyLoss(), Batches())
    args = common.parser("test", batch_size=8, lr=0.5).parse_args(
        ["--dtype", "float64", "--compare", "--devices", "cpu:2", "--steps-total", "3"])
    assert common.train(args, task) == 1
    out = capsys.readouterr().out
    rows = re.findall(r"^ +([123])((?: +\S+){5})$", out, re.MULTILINE)
    moved = np.array([float(r[1].split()[3]) for r in rows])
    assert len(moved) == 3 and 0 < moved.max() < 1e-13, out      # Gluon barely moves
    assert "--compare: DIFFER" in out and "the difference is tofu_mx's" in out
    assert "chaotic" not in out
