"""simulate() with every strategy, on the model builders and on zoo nets."""
import dataclasses
import math

import pytest

from tofu_mx import models, sim
from tofu_mx.search import SearchOptions

NETS = {
    "wresnet": lambda: (models.wresnet(14, 1, 10), models.input_shapes("wresnet", 8,
                                                                        image_size=32)),
    "rnn": lambda: (models.rnn(2, 128, 4, 500), models.input_shapes("rnn", 8, seq_len=4)),
    "transformer": lambda: (models.transformer(2, 64, 4, 8, 500),
                            models.input_shapes("transformer", 8, seq_len=8)),
    "resnet18_v1": lambda: (models.zoo_symbol("resnet18_v1", classes=10),
                            models.zoo_input_shapes("resnet18_v1", 4, image_size=32)),
}


@pytest.mark.parametrize("net", list(NETS))
def test_every_strategy_runs_and_reports_a_consistent_step(net):
    sym, shapes = NETS[net]()
    machine = dataclasses.replace(sim.machine("8xV100-16GB-PCIe"), num_devices=2,
                                  group_size=2, host_shared=2)
    batch = next(iter(shapes.values()))[0]
    two_pairs = dataclasses.replace(machine, num_devices=4)     # the hybrid needs two groups
    results = {s: sim.simulate(sym, two_pairs if s == "hybrid" else machine, s, **shapes)
               for s in sim.STRATEGIES}
    ideal = results["ideal"]
    for strategy, r in results.items():
        assert r.strategy == strategy
        assert r.machine == (two_pairs if strategy == "hybrid" else machine).name
        assert len(r.peak_memory) == {"ideal": 1, "hybrid": 4}.get(strategy, 2)
        assert r.fits and 0 < r.step_time < math.inf       # small nets fit everywhere
        assert r.throughput == pytest.approx(batch / r.step_time)
        assert max(r.peak_memory) > 0
    # small nets leave every device room: swapping is data parallelism
    assert results["swap"].step_time == pytest.approx(results["data_parallel"].step_time)
    assert results["swap"].note == "swaps nothing"
    # a replica on half the batch holds less than the whole batch on one device
    assert results["data_parallel"].peak_memory[0] < ideal.peak_memory[0]


def test_a_device_too_small_for_the_model_fits_only_the_strategies_that_split_it():
    """wresnet(14, 1): 30.6 MiB of weights, 92 MiB with their gradients and momentum, the
    largest 9 MiB (27 MiB to update), on 8 devices of 40 MiB: one device cannot hold the
    weights, so data parallelism does not fit; swapping does (no operator or update needs
    that much at once); placement and tofu spread the weights."""
    sym = models.wresnet(14, 1, 10)
    shapes = models.input_shapes("wresnet", 8, image_size=32)
    machine = dataclasses.replace(sim.machine("8xV100-16GB-PCIe"), memory=40 << 20)
    options = SearchOptions(optimizer_state=1)
    got = {s: sim.simulate(sym, machine, s, options=options, **shapes)
           for s in ("ideal", "data_parallel", "swap", "placement", "tofu-memory")}
    assert got["ideal"].fits and not got["data_parallel"].fits
    assert got["swap"].fits and got["swap"].note.startswith("swaps ")
    assert got["swap"].step_time > got["data_parallel"].step_time
    for s in ("placement", "tofu-memory"):
        assert got[s].fits, (s, got[s])
        assert max(got[s].peak_memory) <= machine.memory
