"""Values sent to a group of devices once (``nnvm_passes.program.relayed_reads``, the routing
``partition(machine=...)`` weighs on machines whose device groups share a link): the
partitioned graph routed so is verified against one device in float64 (outputs, every
gradient, aux states), on generated graphs, the zoo's kinds of layers and the plans that
gather most (data parallelism's weights, re-fetched inputs)."""
import dataclasses
import warnings

import mxnet as mx
import pytest

import tofu_mx
from nnvm_passes.importer import import_symbol
from nnvm_passes.program import StepKind
from tofu_mx import models
from tofu_mx.runtime.partitioned import _routed, apply_plan
from tofu_mx.search import SearchOptions
from tofu_mx.search.baselines import baseline_plan
from tofu_mx.search.plan import lower_graph
from tests.tofu_mx.runtime.helpers import partition_and_verify
from tests.tofu_mx.runtime.test_fuzz import random_graph
from tests.tofu_mx.runtime.test_partition_models import ZOO, zoo_symbol


def relayed_verify(sym, k, group_size, **kwargs):
    """``sym`` partitioned over ``k`` CPU devices, routed with groups of ``group_size``, and
    verified against one device (float64 unless ``dtypes`` says otherwise)."""
    return partition_and_verify(sym, k, group_size=group_size, **kwargs)


def relays(ptd) -> int:
    return sum(step.kind is StepKind.RELAY for step in ptd.program.steps)


def group_crossings(ptd, group_size: int) -> tuple[int, int]:
    """(bytes, copies) MXNet moves between groups of ``group_size`` devices in a forward
    pass of ``ptd``."""
    out = [c for c in ptd.program.crossings()
           if c.source // group_size != c.device // group_size]
    return sum(c.nbytes for c in out), len(out)


#: generated graphs over 3 or 4 devices (with 2, a group of 2 holds every device)
SEEDS = [s for s in range(400) if random_graph(s)[1] > 2]


@pytest.mark.parametrize("seed", SEEDS[:60], ids=lambda s: f"seed_{s}")
def test_generated_graphs(seed):
    sym, k, shapes = random_graph(seed)
    _, report = relayed_verify(sym, k, 2, **shapes)
    assert report.ok, f"fuzz seed {seed}, relayed: {report}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS[60:], ids=lambda s: f"seed_{s}")
def test_generated_graphs_long(seed):
    test_generated_graphs(seed)


MODELS = {
    "wresnet": lambda: (models.wresnet(14, widen=1, num_classes=10),
                        models.input_shapes("wresnet", 8, image_size=32)),
    "rnn": lambda: (models.rnn(2, hidden=16, seq_len=3, vocab=24),
                    models.input_shapes("rnn", 8, seq_len=3)),
    "transformer": lambda: (models.transformer(2, 16, 4, seq_len=4, vocab=24),
                            models.input_shapes("transformer", 8, seq_len=4)),
}
#: the plans: the default (re-fetching), keeping, and data parallelism (every weight
#: gathered whole on every device: what relaying saves most on)
PLANS = {"default": {}, "keeps": {"options": SearchOptions(refetch=False)},
         "data_parallel": {"policy": "data_parallel"}}


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("name", list(MODELS))
def test_models(name, plan):
    sym, shapes = MODELS[name]()
    # the language models' Embedding makes float32 whatever the token dtype: they run in
    # float32, as in test_partition_models.test_builders
    dtypes = None if name == "wresnet" else {}
    ptd, report = relayed_verify(sym, 4, 2, **PLANS[plan], dtypes=dtypes, **shapes)
    assert report.ok, report
    assert relays(ptd) > 0
    assert len(report.comparisons) > 10


def test_a_gathered_weight_crosses_to_each_group_once():
    """Data parallelism over 4 devices, groups of 2: each weight (stored in 4 pieces) is
    gathered whole by every device, so each piece crosses to the other group for both of its
    devices; relayed, once: half the bytes between groups, as many in all, and every piece
    read across groups by one device of each group."""
    sym, shapes = MODELS["wresnet"]()
    ctx = [mx.cpu(i) for i in range(4)]
    graph = lower_graph(import_symbol(sym, **shapes), 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        direct = apply_plan(sym, graph, baseline_plan(graph, 4, "data_parallel"), ctx)
        relayed = _routed(direct, 2)
    assert relays(direct) == 0 and relays(relayed) > 0
    before, after = group_crossings(direct, 2), group_crossings(relayed, 2)
    weights = sum(n.outputs[0].nbytes for n in graph.variables("param"))
    assert before[0] - after[0] >= weights // 2     # each weight's other-group half, once less
    assert after[0] < 0.6 * before[0]
    readers: dict = {}
    for c in relayed.program.crossings():
        if c.source // 2 != c.device // 2:
            readers.setdefault((c.ref, c.device // 2), set()).add(c.device)
    assert readers and all(len(d) == 1 for d in readers.values())


def test_nothing_changes_within_one_group():
    sym, shapes = MODELS["rnn"]()
    ctx = [mx.cpu(i) for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ptd = tofu_mx.partition(sym, ctx, **shapes)
        same = _routed(ptd, 4)
    assert same.program.group_size == 4       # recorded, so that it can be routed again
    assert dataclasses.replace(same.program, group_size=0) == ptd.program


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=() if name in ("squeezenet1.0", "densenet121") else
                 pytest.mark.slow) for name in ZOO])
def test_the_zoo(name):
    size = ZOO[name]
    shapes = {"data": (12, 3, size, size), "softmax_label": (12,)}
    _, report = relayed_verify(zoo_symbol(name), 4, 2, **shapes)
    assert report.ok, report     # (resnet18_v1's plan has no value two devices of a group read)


def cuts_moved(ptd, group_size: int) -> int:
    """Cuts made in another group than their input's."""
    steps = ptd.program.steps
    return sum(s.kind in (StepKind.SLICE, StepKind.SPLIT) and
               steps[s.inputs[0].step].device // group_size != s.device // group_size
               for s in steps)


@pytest.mark.parametrize("name", ["wresnet", "rnn"])
def test_a_cut_read_in_one_other_group_is_made_there(name):
    """Over 8 devices in two groups of 4 (as two PCIe switches), keeping converted inputs:
    the cuts whose pieces are all read in the other group are made there, so fewer copies
    cross between the groups (as many bytes: their inputs whole), and the partition
    computes what one device does."""
    sym, shapes = MODELS[name]()
    shapes = {n: (16,) + s[1:] for n, s in shapes.items()}
    dtypes = None if name == "wresnet" else {}
    ptd, report = relayed_verify(sym, 8, 4, options=SearchOptions(refetch=False),
                                 dtypes=dtypes, **shapes)
    assert report.ok, report
    assert cuts_moved(ptd, 4) > 0
    ctx = [mx.cpu(i) for i in range(8)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        direct = tofu_mx.partition(sym, ctx, options=SearchOptions(refetch=False),
                                   dtypes={n: "float64" for n in shapes} if dtypes is None
                                   else dtypes, **shapes)
    assert group_crossings(ptd, 4)[1] < group_crossings(direct, 4)[1]
