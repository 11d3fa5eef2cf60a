"""The simulator (issue 16, in progress): modelled machines and the cost formulas a
simulated training step is made of.

Built so far: :class:`Machine` and :class:`Link` (a machine's devices and links),
the presets (:func:`machine`, :data:`PRESETS`), the formulas of
:mod:`tofu_mx.sim.formulas` (an operator's roofline time, a transfer, a ring all-reduce),
and an operator's forward FLOPs and bytes counted on its TDL description
(:func:`operator_work`). Not built yet: the backward pass's work, the schedule of a
partitioned graph with liveness and overlap, the strategies, the ``cpu`` preset and its
calibration, ``simulate()`` and ``bench/paper.py``.
"""
from tofu_mx.sim.formulas import compute_time, ring_all_reduce_time, transfer_time
from tofu_mx.sim.machine import GB, GiB, PRESETS, Link, Machine, machine
from tofu_mx.sim.work import Work, operator_work

__all__ = ["GB", "GiB", "Link", "Machine", "PRESETS", "Work", "compute_time", "machine",
           "operator_work", "ring_all_reduce_time", "transfer_time"]
