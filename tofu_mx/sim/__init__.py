"""The simulator: one training step on a modelled machine, by strategy (issue 16).

- :class:`Machine` and :class:`Link`: a machine's devices and links; the presets
  (:func:`machine`, :data:`PRESETS`): four 8-GPU machines and this computer's ``cpu``
  devices, fitted by ``bench/calibrate.py``;
- :mod:`tofu_mx.sim.formulas`: an operator's roofline time, a transfer, swapping to host
  memory, a ring all-reduce, gradients all-reduced in buckets as they are ready;
- :func:`operator_work`: an operator's forward FLOPs and bytes, counted on its TDL
  description, and the FLOPs each input's gradient repeats;
- :mod:`tofu_mx.sim.schedule`: a step's tasks on devices and links, run as MXNet's engine
  runs them;
- :mod:`tofu_mx.sim.memory`: what each device holds, at the end of the forward pass and at
  its peak (as MXNet's executor plans its memory);
- :func:`place_operators`: the operator-placement alternative;
- :func:`simulate` with the strategies :data:`STRATEGIES` (:func:`data_parallel_step` and
  :func:`hybrid_step`: data parallelism, and data parallelism across device groups with Tofu
  inside each, on the machine's first devices);
- :func:`project_to_machines`: a simulated step on ``N`` machines, data-parallel across
  them over each machine's ``network`` link, each gradient all-reduced once the backward
  pass completes it (in buckets, overlapping the rest of the backward pass).

Not modelled: per-operator cost fits beyond one efficiency per operator (the calibration:
bench/results/calibration.md), a step's fixed cost (MXNet's executor: tens of microseconds),
that ``cpu(i)`` devices run memory-bound operators side by side on their own threads (the
``cpu`` preset shares one processor), the operators' temporary workspace.
"""
from tofu_mx.sim.cluster import ClusterResult, project_to_machines
from tofu_mx.sim.formulas import (FUSION_BYTES, bucketed_all_reduce, compute_time,
                                  network_all_reduce_time, ring_all_reduce_time, swap_time,
                                  transfer_time)
from tofu_mx.sim.machine import GB, GiB, PRESETS, Link, Machine, machine
from tofu_mx.sim.memory import gradients_per_device, held_at_forward_end, peak_memory
from tofu_mx.sim.placement import place_operators
from tofu_mx.sim.schedule import Task, finish_times, gradients_ready, step_tasks
from tofu_mx.sim.simulate import (STRATEGIES, SimResult, data_parallel_step, hybrid_step,
                                  partitioned_step, simulate)
from tofu_mx.sim.work import Work, operator_work

__all__ = ["FUSION_BYTES", "ClusterResult", "GB", "GiB", "Link", "Machine", "PRESETS",
           "STRATEGIES", "SimResult", "Task", "Work", "bucketed_all_reduce", "compute_time",
           "data_parallel_step", "finish_times", "gradients_per_device", "gradients_ready",
           "held_at_forward_end", "hybrid_step", "machine", "network_all_reduce_time",
           "operator_work", "partitioned_step", "peak_memory", "place_operators",
           "project_to_machines", "ring_all_reduce_time", "simulate", "step_tasks",
           "swap_time", "transfer_time"]
