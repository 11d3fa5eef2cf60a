"""``partition(..., machine=...)``: the plan chosen by the simulator's step time on a machine,
among the fewest-bytes plans fetching converted inputs again and keeping them (issue 41,
item 3, first step)."""
import dataclasses
import warnings

import mxnet as mx
import pytest

import tofu_mx
from tofu_mx import models, sim
from tofu_mx.errors import InvalidArgumentError
from tofu_mx.runtime.partitioned import (DATA_PARALLEL_ADVICE, NOT_INTERLEAVED,
                                        STEP_TIME_CANDIDATES, Candidate, MachineChoice)
from tofu_mx.search import SearchOptions
from tests.tofu_mx.runtime.helpers import float64
from tests.tofu_mx.runtime.test_partition_models import BUILDERS, ZOO, batch_for, zoo_symbol

V100 = "8xV100-16GB-PCIe"


def lstm():
    return models.rnn(2, 64, 4, 200), models.input_shapes("rnn", 8, seq_len=4)


def ctx(k):
    return [mx.cpu(i) for i in range(k)]


#: the LSTM's gates stored one after another only (interleaving them, weighed too by
#: default, doubles the candidates: test_interleaved_gates_are_weighed_against_one_after_another)
ONE_LAYOUT = SearchOptions(interleave=False)


def plans_searched(candidates) -> int:
    """How many plans ``candidates`` were searched as: the fewest-bytes plans re-fetching and
    keeping, and the keeping one with each conversion priced (where it is another plan)."""
    kinds = {(c.refetch, bool(c.conversion_bytes)) for c in candidates}
    assert {(True, False), (False, False)} <= kinds <= \
        {(True, False), (False, False), (False, True)}
    return len(kinds)


#: the first part of each candidate's label
LABELS = {label.split("; ")[0] for label, _, _ in STEP_TIME_CANDIDATES}


def weighed(machine, k=3, options=ONE_LAYOUT):
    sym, shapes = lstm()
    return tofu_mx.partition(sym, ctx(k), machine=machine, options=options, **shapes)


def test_the_fastest_candidate_that_fits_is_chosen_and_it_computes_the_same():
    sym, shapes = lstm()
    ptd = weighed(V100)
    choice = ptd.machine_choice
    assert choice.machine == V100
    assert len(choice.candidates) == plans_searched(choice.candidates)
    assert all(c.fits for c in choice.candidates)
    assert choice.chosen is choice.candidates[0]
    assert choice.chosen.step == min(c.step for c in choice.candidates)
    # the chosen partition is the plan partition() makes with its options, and its
    # simulated step is what the choice says
    plain = tofu_mx.partition(sym, ctx(3), options=SearchOptions(
        refetch=choice.chosen.refetch, interleave=False,
        conversion_bytes=choice.chosen.conversion_bytes), **shapes)
    assert plain.plan.to_json() == ptd.plan.to_json()
    step, peaks = sim.partitioned_step(ptd, sim.machine(V100))
    assert step == choice.chosen.step and max(peaks) == choice.chosen.peak
    assert f"chosen for {V100} by simulated step time" in ptd.report()
    assert choice.chosen.label in ptd.report()
    report = tofu_mx.verify(sym, ptd, ctx(3), rtol=1e-4, atol=1e-5, **shapes)
    assert report.ok, report


def test_memory_decides_before_time():
    """A machine whose memory lies between the two candidates' peaks gets the one that fits,
    however slow; one with too little for both gets the one needing the least."""
    base = sim.machine(V100)
    weighed_ = weighed(base).machine_choice.candidates
    small, large = sorted(weighed_, key=lambda c: c.peak)[:2]
    assert small.peak < large.peak
    between = dataclasses.replace(base, memory=(small.peak + large.peak) // 2)
    choice = weighed(between).machine_choice
    assert choice.chosen.label == small.label and choice.chosen.fits
    assert [c.fits for c in choice.candidates] == [True] + [False] * (len(weighed_) - 1)
    tiny = dataclasses.replace(base, memory=small.peak // 2)
    ptd = weighed(tiny)
    assert ptd.machine_choice.chosen.label == small.label
    assert not any(c.fits for c in ptd.machine_choice.candidates)
    assert "none fits its memory" in ptd.report()


def test_data_parallelism_is_weighed_for_comparison_and_advised_where_faster():
    """The choice also simulates data parallelism on the same devices (not a plan it can
    return): said in the report, and warned of where it fits and is faster."""
    sym, shapes = lstm()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ptd = weighed(V100)
    choice = ptd.machine_choice
    dp = sim.data_parallel_step(sym, sim.machine(V100), 3, **shapes)
    assert choice.data_parallel.step == dp.step_time
    assert choice.data_parallel.peak == max(dp.peak_memory) and choice.data_parallel.fits
    assert choice.data_parallel not in choice.candidates
    assert "for comparison, not a partition: data parallelism" in ptd.report()
    faster = choice.data_parallel.step < choice.chosen.step
    assert choice.data_parallel_faster == faster
    advised = [w for w in caught if issubclass(w.category, tofu_mx.DataParallelFasterWarning)]
    assert all("data parallelism is predicted faster" in str(w.message) for w in advised)
    assert len(advised) == faster and (DATA_PARALLEL_ADVICE in ptd.report()) == faster
    # where the replica does not fit, it is never advised
    tight = dataclasses.replace(sim.machine(V100), memory=choice.chosen.peak + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        choice = weighed(tight).machine_choice
    assert choice.data_parallel.peak > tight.memory and not choice.data_parallel.fits
    assert not choice.data_parallel_faster
    assert not any(issubclass(w.category, tofu_mx.DataParallelFasterWarning) for w in caught)
    # a batch smaller than the devices: nothing to compare with
    small = {**shapes, "data": (2,) + shapes["data"][1:],
             "softmax_label": (2,) + shapes["softmax_label"][1:]}
    assert tofu_mx.partition(sym, ctx(3), machine=V100,
                             **small).machine_choice.data_parallel is None


def test_the_hybrid_is_weighed_for_comparison_across_whole_groups():
    """Over the 8 devices of two PCIe switches, the choice also simulates data parallelism
    across the two switches with Tofu inside each (``sim.hybrid_step``): reported, never
    chosen; over 3 or 4 devices (not two whole groups) there is none."""
    sym, shapes = lstm()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ptd = weighed(V100, k=8)
    choice = ptd.machine_choice
    hybrid = sim.hybrid_step(sym, sim.machine(V100), 8, **shapes)
    assert choice.hybrid.step == hybrid.step_time and choice.hybrid.fits
    assert choice.hybrid.peak == max(hybrid.peak_memory) and choice.hybrid.groups == 2
    assert choice.hybrid not in choice.candidates
    assert ("for comparison, not a partition: data parallelism across 2 groups of 4 devices, "
            "Tofu inside each") in ptd.report()
    advised = [str(w.message) for w in caught
               if issubclass(w.category, tofu_mx.DataParallelFasterWarning)]
    faster = choice.fastest_elsewhere
    assert len(advised) == (faster is not None)
    if faster is choice.hybrid:
        assert "tofu_mx.gluon.partition(..., ctx, machine=..., replicas=2)" in advised[0]
    assert weighed(V100, k=3).machine_choice.hybrid is None
    assert weighed(V100, k=4).machine_choice.hybrid is None


def test_the_advice_names_the_fastest_that_fits():
    chosen = Candidate("plan", 0.003, 100, True)
    dp, hybrid = Candidate("dp", 0.002, 100, True), Candidate("hybrid", 0.001, 100, True,
                                                              groups=2)
    both = MachineChoice("m", chosen, (chosen,), dp, hybrid)
    assert both.fastest_elsewhere is hybrid and both.data_parallel_faster
    assert both.hybrid_faster and "replicas=2" in both.advice()
    assert "replicas=2" in both.lines()[-1]
    too_big = dataclasses.replace(hybrid, fits=False)
    only_dp = MachineChoice("m", chosen, (chosen,), dp, too_big)
    assert only_dp.fastest_elsewhere is dp and only_dp.advice() == DATA_PARALLEL_ADVICE
    slower = MachineChoice("m", chosen, (chosen,), dataclasses.replace(dp, step=0.004),
                           dataclasses.replace(hybrid, step=0.005))
    assert slower.fastest_elsewhere is None and not slower.hybrid_faster
    assert not any("predicted faster" in line for line in slower.lines())
    assert MachineChoice("m", chosen, (chosen,)).fastest_elsewhere is None


def test_bad_machines_are_refused_with_what_to_do():
    with pytest.raises(InvalidArgumentError, match="no machine preset called 'V100'"):
        weighed("V100")
    with pytest.raises(InvalidArgumentError, match="machine must be a tofu_mx.sim.Machine"):
        weighed(8)
    two = dataclasses.replace(sim.machine(V100), num_devices=2, group_size=2,
                              host_shared=2)
    with pytest.raises(InvalidArgumentError, match="2 device.*fewer than the 3 in ctx"):
        weighed(two)


def test_the_simulator_runs_the_chosen_plan():
    """``simulate(..., "tofu-machine")`` simulates the plan ``partition(machine=...)`` chose:
    never slower than the fewest-bytes plan (one of its candidates) where both fit."""
    sym, shapes = lstm()
    machine = dataclasses.replace(sim.machine(V100), num_devices=4)
    chosen = sim.simulate(sym, machine, "tofu-machine", **shapes)
    default = sim.simulate(sym, machine, "tofu", **shapes)
    assert chosen.fits and default.fits
    assert chosen.step_time <= default.step_time
    assert chosen.note.split("; ")[0] in LABELS


def test_plans_are_weighed_routed_through_the_machines_groups():
    """Over 8 devices of two PCIe switches of 4, each plan is weighed as routed and with each
    value several devices of a switch read sent to the switch once: four candidates, the
    fastest chosen, and the relayed ones computing the same as one device."""
    sym, shapes = lstm()
    ptd = weighed(V100, k=8)
    choice = ptd.machine_choice
    plans = plans_searched(choice.candidates)
    assert len(choice.candidates) == 2 * plans
    assert sorted(c.group_size for c in choice.candidates) == [0] * plans + [4] * plans
    assert choice.chosen.step == min(c.step for c in choice.candidates)
    relayed = [c for c in choice.candidates if c.group_size]
    assert all("sent to the group once" in c.label for c in relayed)
    if choice.chosen.group_size:
        assert any(s.kind.value == "relay" for s in ptd.program.steps)
    report = tofu_mx.verify(sym, ptd, ctx(8), rtol=1e-4, atol=1e-5, **shapes)
    assert report.ok, report


def chosen_and_verified(sym, k, dtypes, shapes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ptd = tofu_mx.partition(sym, ctx(k), machine=V100, dtypes=dtypes, **shapes)
    report = tofu_mx.verify(sym, ptd, ctx(k), rtol=1e-4, atol=1e-5, dtypes=dtypes, **shapes)
    assert report.ok, report
    candidates = ptd.machine_choice.candidates     # twice as many where gates interleave
    assert len(candidates) == 2 * sum(      # each plan also relayed through the groups
        plans_searched([c for c in candidates if c.interleaved == layout])
        for layout in {c.interleaved for c in candidates})
    return ptd


def test_interleaved_gates_are_weighed_against_one_after_another():
    """Each plan with the LSTM's gates interleaved and stored one after another: four
    candidates, the fastest chosen, and the partition returned is the one partition() makes
    with its options, computing the same as one device."""
    sym, shapes = lstm()
    ptd = weighed(V100, options=None)
    choice = ptd.machine_choice
    interleaved = [c for c in choice.candidates if c.interleaved]
    apart = [c for c in choice.candidates if not c.interleaved]
    assert len(choice.candidates) == plans_searched(interleaved) + plans_searched(apart)
    assert all((NOT_INTERLEAVED in c.label) != c.interleaved for c in choice.candidates)
    assert choice.chosen.step == min(c.step for c in choice.candidates)
    assert bool(ptd.graph.layouts) == choice.chosen.interleaved
    plain = tofu_mx.partition(sym, ctx(3), options=SearchOptions(
        refetch=choice.chosen.refetch, interleave=choice.chosen.interleaved,
        conversion_bytes=choice.chosen.conversion_bytes), **shapes)
    assert plain.plan.to_json() == ptd.plan.to_json()
    report = tofu_mx.verify(sym, ptd, ctx(3), rtol=1e-4, atol=1e-5, **shapes)
    assert report.ok, report
    # a net with nothing to interleave is weighed once per plan
    wres, wshapes = models.wresnet(14, 1, 10), models.input_shapes("wresnet", 6, image_size=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = tofu_mx.partition(wres, ctx(3), machine=V100, **wshapes).machine_choice
    assert len(other.candidates) == plans_searched(other.candidates)
    assert not any(c.interleaved for c in other.candidates)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_the_builders_at_8(name):
    """On the 8 devices of two PCIe switches, the plan chosen for each builder computes what
    one device does (the WResNet in float64; the language models in float32, as in
    test_partition_models)."""
    sym, shapes = BUILDERS[name](batch_for(8))
    chosen_and_verified(sym, 8, float64(shapes) if name == "wresnet" else {}, shapes)


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=() if name in ("resnet18_v1", "mobilenet1.0") else
                 pytest.mark.slow) for name in ZOO])
def test_the_zoo_at_8(name):
    size, b = ZOO[name], batch_for(8)
    shapes = {"data": (b, 3, size, size), "softmax_label": (b,)}
    chosen_and_verified(zoo_symbol(name), 8, float64(shapes), shapes)
