"""What ``--compare`` judges: the loss curve of a run partitioned by tofu_mx next to plain
Gluon's (and, in float32, plain Gluon's in float64, the oracle), printed side by side, and the
verdict. The training that gives the curves is in ``common``; this module only judges them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    from common import Reference   # plain Gluon's run: .label, .ctx, .curve

#: float64 (--compare): the partitioned loss curve must equal plain Gluon's to this relative
#: tolerance at every step. Only summation orders differ (split reductions), and float64
#: rounds at 1e-16, so 1e-7 leaves room for rounding growing ~1e9x through training.
RTOL_FLOAT64 = 1e-7
#: float32 (--compare): both float32 curves are judged against a float64 run of plain Gluon
#: (the oracle, from the same initial values and batches). At each step the partitioned
#: curve's relative error must be at most FLOAT32_ERROR_FACTOR x the largest error plain
#: Gluon's float32 curve has had up to that step + FLOAT32_ERROR_FLOOR: partitioning may change
#: the rounding, not add error beyond float32's. Two summation orders give errors of the same
#: size, not the same errors, hence the factor; training amplifies rounding step after step,
#: so a step is judged by the amplification Gluon has shown so far; the floor (64 float32
#: ulps) covers first steps where Gluon's error happens to be near zero.
FLOAT32_ERROR_FACTOR = 4.0
FLOAT32_ERROR_FLOOR = 64 * float(np.finfo(np.float32).eps)
#: float32 (--compare): where plain Gluon's float32 curve strays further than this (relative)
#: from the float64 oracle, float32 training is too ill-conditioned for a tight comparison,
#: and the script says so
FLOAT32_ILL_CONDITIONED = 1e-3
#: float64 (--compare): where the curves differ beyond RTOL_FLOAT64, plain Gluon is trained
#: PERTURBED_RUNS more times from the same values on the same batches, each input of the
#: first batch moved by this relative amount (a few ulps, up or down at random). How far its
#: curve then moves is how much the model itself amplifies rounding: a chaotic model
#: (BatchNorm over a few values, deep stacks at small sizes) amplifies tofu_mx's other
#: summation orders just as much.
PERTURBATION = 1e-15
#: float64 (--compare): runs of plain Gluon on perturbed first batches (each its own random
#: signs); the largest move at each step is the sensitivity. One run is a poor sample: on
#: MobileNetV2 at 32 px, six runs moved step 5 by 3.9e-6 to 7.2e-3.
PERTURBED_RUNS = 3
#: float64 (--compare), measured sensitivity: at each step tofu_mx's curve may differ from
#: Gluon's by RTOL_FLOAT64 or this many times the largest that Gluon's perturbed curves have
#: moved up to that step, whichever is larger: room for the spread of the runs. A wrong
#: partition is off by far more from its first steps on, where a perturbation of the first
#: batch has barely moved the curve (MobileNetV2 at 32 px: 1e-13 at step 1, 1e-10 at step 2).
SENSITIVITY_FACTOR = 10.0


def compare(args, curve, start, refs: list[Reference],
            perturbed: Callable[[], list[list]] | None = None) -> int:
    """Print the curves of this run's steps side by side; 1 if they differ beyond tolerance.
    float64: where they do, ``perturbed()`` (:func:`common.perturbed_gluon`) measures how
    far the model's own curve moves, and the curves are judged by that."""
    ours = np.array(curve[start:])
    if len(ours) == 0:
        print("--compare: no steps were run")
        return 0
    columns = [(f"tofu_mx {len(args.devices)} devices", ours, "22.16g"),
               (f"{refs[0].label} {refs[0].where}", np.array(refs[0].curve), "22.16g")]
    if len(refs) == 1:
        ok, verdict, notes = _judge_float64(ours, refs[0], start, columns, perturbed)
    else:
        ok, verdict, notes = _judge_float32(ours, refs, start, columns)
    widths = [max(len(title), int(fmt.split(".")[0])) for title, _, fmt in columns]
    print(f"{'step':>5}" + "".join(f"  {title:>{w}}" for (title, _, _), w in
                                    zip(columns, widths)))
    for i in range(len(ours)):
        print(f"{start + i + 1:>5}" + "".join(f"  {values[i]:>{w}{fmt[fmt.index('.'):]}}"
                                              for (_, values, fmt), w in zip(columns, widths)))
    print(f"--compare: {'agree' if ok else 'DIFFER'}: {verdict}")
    for note in notes:
        print(f"--compare: {note}")
    return 0 if ok else 1


def _relative(values: np.ndarray, reference: np.ndarray) -> np.ndarray:
    return np.abs(values - reference) / np.abs(reference)


def _judge_float64(ours, ref: Reference, start: int, columns: list,
                   perturbed: Callable[[], list[list]] | None
                   ) -> tuple[bool, str, list[str]]:
    """Every step within RTOL_FLOAT64; where not, within SENSITIVITY_FACTOR x how far plain
    Gluon's own curve moves after perturbations of the first batch (if they are measured).
    Appends the columns it shows."""
    gluon_curve = np.array(ref.curve)
    rel = _relative(ours, gluon_curve)
    columns.append(("rel. diff", rel, "9.1e"))
    ok = bool((rel <= RTOL_FLOAT64).all())
    verdict = (f"largest relative difference {rel.max():.2e}, tolerance {RTOL_FLOAT64:g} "
               f"(float64)")
    if ok or perturbed is None:
        return ok, verdict, []
    print(f"--compare: the float64 curves differ by up to {rel.max():.1e} (tolerance "
          f"{RTOL_FLOAT64:g}); training plain Gluon {PERTURBED_RUNS} more times, the first "
          f"batch moved by {PERTURBATION:g}, to measure the model's own sensitivity")
    curves = perturbed()
    moved = np.max([_relative(np.array(c), gluon_curve) for c in curves], axis=0)
    allowed = np.maximum(RTOL_FLOAT64, SENSITIVITY_FACTOR * np.maximum.accumulate(moved))
    columns += [("gluon moved", moved, "9.1e"), ("allowed", allowed, "9.1e")]
    ok = bool((rel <= allowed).all())
    return ok, verdict + _sensitivity_verdict(rel, allowed, start), [
        _sensitivity_note(ok, moved, len(curves), start)]


def _sensitivity_verdict(rel: np.ndarray, allowed: np.ndarray, start: int) -> str:
    worst = int(np.argmax(rel / allowed))
    return (f"; judged by the model's measured sensitivity: closest to its limit at step "
            f"{start + worst + 1}, {rel[worst]:.2e} of {allowed[worst]:.2e} allowed "
            f"({SENSITIVITY_FACTOR:g} x Gluon's own largest move so far, at least "
            f"{RTOL_FLOAT64:g})")


def _sensitivity_note(ok: bool, moved: np.ndarray, runs: int, start: int) -> str:
    """What the perturbed runs of plain Gluon say about the model, and what to do."""
    first = f"the first batch (step {start + 1})"
    if not moved.any():
        return (f"moving {first} by {PERTURBATION:g} left plain Gluon's curve exactly as it "
                f"was (a model that reads its inputs as indices, e.g. token ids, does not see "
                f"such a move): the model's sensitivity is not measured, and the difference "
                f"stands; tofu_mx.verify() on the model finds the tensor that differs")
    where = int(np.argmax(np.nan_to_num(moved, nan=np.inf)))
    measured = (f"plain Gluon's own curve moves by up to {moved[where]:.1e} (step "
                f"{start + where + 1}) after moving {first} by {PERTURBATION:g} ({runs} runs)")
    if ok:
        return (f"the model is chaotic at this size: {measured}, so the {RTOL_FLOAT64:g} "
                f"tolerance cannot tell tofu_mx's other summation orders from a bug; "
                f"tofu_mx's curve is within {SENSITIVITY_FACTOR:g} x that sensitivity at "
                f"every step. For a tight comparison try a larger --image-size or "
                f"--batch-size, or fewer --steps-total")
    chaotic = "" if moved.max() <= RTOL_FLOAT64 else ", so the model is chaotic at this size"
    return (f"{measured}{chaotic}, but tofu_mx's curve differs by more than "
            f"{SENSITIVITY_FACTOR:g} x that: the difference is tofu_mx's, not the model's; "
            f"tofu_mx.verify() on the model finds the tensor that differs")


def _judge_float32(ours, refs: list[Reference], start: int, columns: list
                   ) -> tuple[bool, str, list[str]]:
    """Both float32 curves judged against the float64 oracle (see FLOAT32_ERROR_FACTOR).
    Appends the columns it shows."""
    gluon_curve, oracle = np.array(refs[0].curve), np.array(refs[1].curve)
    ours_err, gluon_err = _relative(ours, oracle), _relative(gluon_curve, oracle)
    allowed = FLOAT32_ERROR_FACTOR * np.maximum.accumulate(gluon_err) + FLOAT32_ERROR_FLOOR
    columns += [("rel. diff", _relative(ours, gluon_curve), "9.1e"),
                (f"{refs[1].label} {refs[1].where}", oracle, "22.16g"),
                ("tofu err", ours_err, "9.1e"), ("gluon err", gluon_err, "9.1e"),
                ("allowed", allowed, "9.1e")]
    ok = bool((ours_err <= allowed).all())
    worst = int(np.argmax(ours_err / allowed))
    verdict = (f"relative error from the float64 oracle at most {ours_err.max():.2e} "
               f"(plain Gluon float32: {gluon_err.max():.2e}); closest to its limit at step "
               f"{start + worst + 1}: {ours_err[worst]:.2e} of {allowed[worst]:.2e} allowed "
               f"({FLOAT32_ERROR_FACTOR:g} x Gluon's largest so far + "
               f"{FLOAT32_ERROR_FLOOR:.1e})")
    notes = []
    if gluon_err.max() > FLOAT32_ILL_CONDITIONED:
        notes.append(f"plain Gluon's own float32 curve strays up to {gluon_err.max():.1e} "
                     f"from float64's: training is ill-conditioned here (small batches, "
                     f"BatchNorm on small feature maps), so float32 bounds the comparison "
                     f"loosely; --dtype float64 compares tightly")
    return ok, verdict, notes
