"""The simulator (issue 16, in progress): one training step on a modelled machine.

Built so far: :class:`Machine` and :class:`Link` (a machine's devices and links), the
presets (:func:`machine`, :data:`PRESETS`: four 8-GPU machines and this computer's ``cpu``
devices, fitted by ``bench/calibrate.py``), the formulas of :mod:`tofu_mx.sim.formulas` (an
operator's roofline time, a transfer, a ring all-reduce), an operator's forward FLOPs and
bytes counted on its TDL description (:func:`operator_work`), a step's tasks on devices and
links and their schedule (:mod:`tofu_mx.sim.schedule`), and :func:`simulate` with the
``"ideal"``, ``"data_parallel"``, ``"tofu"`` and ``"tofu-memory"`` strategies.

Not built yet: ``"swap"`` and ``"placement"``, mirroring's re-runs, liveness-based peak
memory, per-operator cost fits (the calibration misses convolutions on this CPU by 3x:
bench/results/calibration.md), and ``bench/paper.py``.
"""
from tofu_mx.sim.formulas import compute_time, ring_all_reduce_time, transfer_time
from tofu_mx.sim.machine import GB, GiB, PRESETS, Link, Machine, machine
from tofu_mx.sim.schedule import Task, finish_times, step_tasks
from tofu_mx.sim.simulate import STRATEGIES, SimResult, simulate
from tofu_mx.sim.work import Work, operator_work

__all__ = ["GB", "GiB", "Link", "Machine", "PRESETS", "STRATEGIES", "SimResult", "Task", "Work",
           "compute_time", "finish_times", "machine", "operator_work", "ring_all_reduce_time",
           "simulate", "step_tasks", "transfer_time"]
