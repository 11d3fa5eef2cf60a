"""Strategies derived by the interval analysis: pinned per operator, and proven sufficient."""
import dataclasses
import itertools

import numpy as np
import pytest

import tofu_mx.ops  # noqa: F401
from nnvm_passes import import_symbol
from tofu_mx.tdl.analysis import (Layout, _uses, classify, index_interval, opaque_strategies,
                                  part_interval, strategies)
from tofu_mx.tdl.annotate import analyse
from tofu_mx.tdl.interpret import evaluate
from tofu_mx.tdl.lang import Affine, Bin, FloorDiv, IAdd, IScale, Mod, Unary
from tofu_mx.tdl.registry import Attrs, Description, Example, example_graph, lookup, registered, trace
from tofu_mx.values import index_range, random_inputs


def traced_for(op, attrs, shapes, dtypes=None):
    example = Example({k: str(v) for k, v in attrs.items()}, tuple(shapes))
    graph = example_graph(op, example if dtypes is None else
                          dataclasses.replace(example, dtypes=dtypes))
    node = graph.nodes[-1]
    return graph, trace(lookup(op), Attrs(node.attrs), [graph.tensor(e).shape for e in node.inputs],
                        [t.shape for t in node.outputs])


def described(op, attrs, shapes, parts=2):
    return [s.describe() for s in strategies(traced_for(op, attrs, shapes)[1], parts)]


def test_fully_connected():
    assert described("FullyConnected", {"num_hidden": 8}, [(4, 6), (8, 6), (8,)]) == [
        "split i0: inputs [split(0), replicated, replicated] -> outputs [split(0)]",   # batch
        "split i1: inputs [replicated, split(0), split(0)] -> outputs [split(1)]",     # output
        "reduce i: inputs [split(1), split(1), first] -> outputs [partial(sum)]",      # input
    ]


def test_convolution_batch_channel_spatial_halo_and_input_channel():
    assert described("Convolution", {"kernel": (3, 3), "num_filter": 8, "pad": (1, 1)},
                     [(4, 6, 8, 8), (8, 6, 3, 3), (8,)]) == [
        "split b: inputs [split(0), replicated, replicated] -> outputs [split(0)]",
        "split co: inputs [replicated, split(0), split(0)] -> outputs [split(1)]",
        "split x0: inputs [split(2)+halo(1, 1), replicated, replicated] -> outputs [split(2)]",
        "split x1: inputs [split(3)+halo(1, 1), replicated, replicated] -> outputs [split(3)]",
        "reduce ci: inputs [split(1), split(1), first] -> outputs [partial(sum)]",
    ]


def test_strided_convolution_halo_is_one_sided():
    assert described("Convolution", {"kernel": (3, 3), "num_filter": 2, "stride": (2, 2),
                                     "pad": (1, 1), "no_bias": True},
                     [(2, 2, 8, 8), (2, 2, 3, 3)])[2] == \
        "split x0: inputs [split(2)+halo(1, 0), replicated] -> outputs [split(2)]"


def test_depthwise_convolution_splits_channels_of_data_and_weight():
    assert described("Convolution", {"kernel": (3, 3), "num_filter": 8, "num_group": 8,
                                     "pad": (1, 1), "no_bias": True},
                     [(2, 8, 4, 4), (8, 1, 3, 3)])[1] == \
        "split co: inputs [split(1), split(0)] -> outputs [split(1)]"


def test_batchnorm_batch_split_needs_the_whole_batch():
    found = described("BatchNorm", {"fix_gamma": False}, [(4, 6, 2, 2)] + [(6,)] * 4)
    # outputs: the normalised data, and the mean and inverse std used (output_mean_var)
    assert found[0] == ("split i0: inputs [replicated, replicated, replicated, replicated, "
                        "replicated] -> outputs [split(0), replicated, replicated]")
    assert found[1] == ("split i1: inputs [split(1), split(0), split(0), split(0), split(0)] "
                        "-> outputs [split(1), split(0), split(0)]")
    assert not any(s.startswith("reduce") for s in found)


def test_layernorm_offers_no_partial_reduction():
    found = described("LayerNorm", {}, [(4, 6, 8), (8,), (8,)])
    assert found == [
        "split i0: inputs [split(0), replicated, replicated] -> outputs [split(0)]",
        "split i1: inputs [split(1), replicated, replicated] -> outputs [split(1)]",
        "split i2: inputs [replicated, split(0), split(0)] -> outputs [split(2)]",
    ]


def test_softmax_reshape_batch_dot_embedding_pooling():
    assert described("softmax", {"axis": -1}, [(4, 6)]) == [
        "split i0: inputs [split(0)] -> outputs [split(0)]",
        "split i1: inputs [replicated] -> outputs [split(1)]"]
    assert described("Reshape", {"shape": (-3, 0)}, [(4, 6, 8)]) == [
        "split i0: inputs [split(0)] -> outputs [split(0)]",
        "split i1: inputs [split(2)] -> outputs [split(1)]"]
    assert described("batch_dot", {"transpose_b": True}, [(4, 6, 8), (4, 6, 8)]) == [
        "split n: inputs [split(0), split(0)] -> outputs [split(0)]",
        "split i: inputs [split(1), replicated] -> outputs [split(1)]",
        "split j: inputs [replicated, split(1)] -> outputs [split(2)]",
        "reduce k: inputs [split(2), split(2)] -> outputs [partial(sum)]"]
    assert described("Embedding", {"input_dim": 10, "output_dim": 4}, [(4, 6), (10, 4)]) == [
        "split i0: inputs [split(0), replicated] -> outputs [split(0)]",
        "split i1: inputs [split(1), replicated] -> outputs [split(1)]",
        "split i2: inputs [replicated, split(1)] -> outputs [split(2)]"]
    assert described("Pooling", {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1),
                                 "pool_type": "max"}, [(2, 4, 8, 8)])[2:] == [
        "split x0: inputs [split(2)+halo(1, 0)] -> outputs [split(2)]",
        "split x1: inputs [split(3)+halo(1, 0)] -> outputs [split(3)]"]
    assert described("sum", {"axis": 1}, [(4, 6, 8)])[-1] == \
        "reduce r0: inputs [split(1)] -> outputs [partial(sum)]"
    assert described("max", {"axis": 1}, [(4, 6, 8)])[-1] == \
        "reduce r0: inputs [split(1)] -> outputs [partial(max)]"


def test_multi_output_split_shares_variables():
    assert described("SliceChannel", {"num_outputs": 2, "axis": 0}, [(4, 8)]) == [
        "split i0: inputs [split(0)+halo(1, 1)] -> outputs [split(0), split(0)]",
        "split i1: inputs [split(1)] -> outputs [split(1), split(1)]"]


def test_three_parts_and_indivisible_axes():
    """8 filters in 3 parts: 2, 3 and 3 (floor boundaries); 2 filters are not split in 3."""
    found = described("Convolution", {"kernel": (3, 3), "num_filter": 8, "pad": (1, 1)},
                      [(6, 6, 12, 12), (8, 6, 3, 3), (8,)], parts=3)
    assert [s.split(":")[0] for s in found] == ["split b", "split co", "split x0", "split x1",
                                                "reduce ci"]
    assert found[1] == "split co: inputs [replicated, split(0), split(0)] -> outputs [split(1)]"
    assert found[2] == "split x0: inputs [split(2)+halo(1, 1), replicated, replicated] -> " \
        "outputs [split(2)]"
    _, traced = traced_for("Convolution", {"kernel": (3, 3), "num_filter": 8, "pad": (1, 1)},
                           [(6, 6, 12, 12), (8, 6, 3, 3), (8,)])
    co = next(s for s in strategies(traced, 3) if s.var == "co")
    assert co.uneven and [r[1] for r in co.outputs[0]] == [(0, 1), (2, 4), (5, 7)]
    narrow = described("Convolution", {"kernel": (3, 3), "num_filter": 2, "pad": (1, 1)},
                       [(6, 6, 12, 12), (2, 6, 3, 3), (2,)], parts=3)
    assert "split co" not in [s.split(":")[0] for s in narrow]


def test_opaque_rnn_splits_its_batch_axis():
    entry = registered()["RNN"]
    (s,) = opaque_strategies(entry, [(5, 4, 3), (100,), (1, 4, 8), (1, 4, 8)],
                             [(5, 4, 8), (1, 4, 8), (1, 4, 8)])
    assert s.describe() == ("split batch: inputs [split(1), replicated, split(1), split(1)] -> "
                            "outputs [split(1), split(1), split(1)]")
    (s,) = opaque_strategies(entry, [(5, 3, 3), (100,), (1, 3, 8), (1, 3, 8)],
                             [(5, 3, 8), (1, 3, 8), (1, 3, 8)])
    assert s.uneven and [r[1] for r in s.outputs[0]] == [(0, 0), (1, 2)]
    assert opaque_strategies(entry, [(5, 1, 3), (100,), (1, 1, 8), (1, 1, 8)],
                             [(5, 1, 8), (1, 1, 8), (1, 1, 8)]) == []


@pytest.mark.parametrize("regions, shape, text", [
    ([((0, 3),), ((4, 7),)], (8,), "split(0)"),
    ([((0, 4),), ((3, 7),)], (8,), "split(0)+halo(1, 1)"),
    ([((0, 7),), ((0, 7),)], (8,), "replicated"),
    ([((0, 7),), None], (8,), "first"),
    ([None, None], (8,), "none"),
    ([((0, 1), (0, 3)), ((2, 3), (4, 7))], (4, 8), "irregular"),
    ([((0, 7),), ((0, 5),)], (8,), "irregular"),
])
def test_classify(regions, shape, text):
    assert str(classify(regions, shape)) == text


# --- the interval analysis is sound ----------------------------------------------------------

def random_index(rng, names, depth=0):
    """A random index expression: affine forms, sums, scalings, floordiv and mod."""
    kind = rng.integers(0, 5) if depth < 3 else 0
    if kind == 0 or kind == 1:
        terms = tuple((n, int(rng.integers(-3, 4))) for n in names if rng.random() < 0.7)
        return Affine(tuple(t for t in terms if t[1]), int(rng.integers(-5, 6)))
    if kind == 2:
        return IAdd((random_index(rng, names, depth + 1), random_index(rng, names, depth + 1)))
    inner = random_index(rng, names, depth + 1)
    k = int(rng.integers(1, 6))
    return {3: FloorDiv, 4: Mod}[kind](inner, k) if rng.random() < 0.8 else IScale(inner, -k)


def concrete(i, point):
    if isinstance(i, Affine):
        return i.const + sum(c * point[n] for n, c in i.terms)
    if isinstance(i, IAdd):
        return sum(concrete(p, point) for p in i.parts)
    if isinstance(i, IScale):
        return concrete(i.inner, point) * i.factor
    if isinstance(i, FloorDiv):
        return concrete(i.inner, point) // i.divisor
    return concrete(i.inner, point) % i.modulus


def test_interval_bounds_contain_every_concrete_value():
    rng = np.random.default_rng(20261122)
    names = ["a", "b", "c"]
    for trial in range(400):
        expr = random_index(rng, names)
        env = {}
        for n in names:
            lo = int(rng.integers(-4, 5))
            env[n] = (lo, lo + int(rng.integers(0, 5)))
        lo, hi = index_interval(expr, env)
        for values in itertools.product(*(range(a, b + 1) for a, b in env.values())):
            v = concrete(expr, dict(zip(names, values)))
            assert lo <= v <= hi, (
                f"reproduce: seed 20261122 trial {trial}: {expr!r} with {env} gives {v} at "
                f"{dict(zip(names, values))}, outside the bounds [{lo}, {hi}]")


CASES = [(name, k) for name, d in sorted(registered().items()) if isinstance(d, Description)
         for k in range(len(d.examples))]


def _masked(value, regions, fill):
    out = np.full_like(value, fill, dtype=np.float64)
    if regions is not None:
        box = tuple(slice(lo, hi + 1) for lo, hi in regions)
        out[box] = value[box]
    return out


def without_free_terms(e, var):
    """What a part other than the first computes of ``e`` under a partition-n-reduce over
    ``var``: additive terms free of ``var`` (a bias) are computed by part 0 only."""
    if isinstance(e, Bin) and e.op in "+-":
        left, right = _uses(e.a, var), _uses(e.b, var)
        if left and right:
            return Bin(e.op, without_free_terms(e.a, var), without_free_terms(e.b, var))
        if left:
            return without_free_terms(e.a, var)
        inner = without_free_terms(e.b, var)
        return inner if e.op == "+" else Unary("neg", inner)
    if isinstance(e, Bin):
        if _uses(e.a, var):
            return Bin(e.op, without_free_terms(e.a, var), e.b)
        return Bin(e.op, e.a, without_free_terms(e.b, var))
    if isinstance(e, Unary) and e.fn == "neg":
        return Unary("neg", without_free_terms(e.a, var))
    return e


@pytest.mark.parametrize("name, k", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_every_part_computes_its_output_from_its_regions_alone(name, k):
    """For every strategy: give a part only the input regions the analysis says it needs (NaN
    elsewhere) and it still computes exactly its output; under partition-n-reduce, its
    partial (the reduction over its own range, the free terms on part 0 only), and the parts'
    partials combine into the whole output."""
    desc = registered()[name]
    example = desc.examples[k]
    graph, traced = traced_for(name, example.attrs, example.shapes, example.dtypes)
    node = graph.nodes[-1]
    values = random_inputs(graph, seed=k)
    inputs = [values[graph.nodes[e.node].name].astype(np.float64) for e in node.inputs]
    # an index input is filled with a valid index outside its regions (the low end of its range)
    ranges = [index_range(graph, e.node) for e in node.inputs]
    full = evaluate(traced, inputs)
    combine_of = {"sum": np.add, "max": np.maximum, "min": np.minimum}
    for parts in (2, 3):
        for s in strategies(traced, parts):
            combine = s.output_layouts[0].combine  # None for output splits
            combined = [None] * len(full)
            for p in range(parts):
                masked = [_masked(x, s.inputs[i][p], np.nan if ranges[i] is None else ranges[i][0])
                          for i, x in enumerate(inputs)]
                if combine is None:
                    for j, (g, f) in enumerate(zip(evaluate(traced, masked), full)):
                        box = tuple(slice(lo, hi + 1) for lo, hi in s.outputs[j][p])
                        np.testing.assert_allclose(
                            g[box], f[box], rtol=1e-9, atol=1e-12,
                            err_msg=f"{name} example {k}, {s.name}, part {p}/{parts}, output {j}")
                    continue
                part = traced if p == 0 or combine != "sum" else dataclasses.replace(
                    traced, outputs=tuple(dataclasses.replace(o, expr=without_free_terms(
                        o.expr, s.var)) for o in traced.outputs))
                partials = evaluate(part, masked, within={s.var: part_interval(traced.extents[s.var], parts, p)})
                for j, g in enumerate(partials):
                    combined[j] = g if combined[j] is None else combine_of[combine](combined[j], g)
            for j, f in enumerate(full if combine is not None else []):
                np.testing.assert_allclose(combined[j], f, rtol=1e-9, atol=1e-12,
                                           err_msg=f"{name} example {k}, {s.name}, {parts} parts")


def test_whole_graph_analysis():
    from tofu_mx import models
    graph = import_symbol(models.transformer(1, 8, 2, 4, 10),
                          **models.input_shapes("transformer", 2, seq_len=4))
    result = analyse(graph, parts=2)
    assert len(result) == len(graph.operators())
    assert all(r.status == "described" and r.strategies for r in result)
    assert {r.op for r in result} >= {"batch_dot", "LayerNorm", "Reshape", "transpose"}


def test_unknown_operator_is_reported_not_crashed():
    """An operator nobody described runs whole on one part; one that reads no tensor runs
    replicated (each part makes it)."""
    import mxnet as mx
    from tofu_mx.tdl.registry import unregister, _store
    saved = unregister("SwapAxis")
    try:
        graph = import_symbol(mx.sym.SwapAxis(mx.sym.var("x"), dim1=0, dim2=1), x=(2, 3))
        (r,) = analyse(graph)
    finally:
        if saved is not None:
            _store("SwapAxis", saved)
    assert r.status == "unknown" and "SwapAxis" in r.reason and r.runs_whole
    assert [s.name for s in r.strategies] == ["whole"]
    assert r.strategies[0].input_layouts[0].kind == "first"


def test_layout_str():
    assert str(Layout("partial", combine="max")) == "partial(max)"


def test_an_access_reading_only_padding_has_a_window_and_no_box():
    from tofu_mx.tdl.analysis import work_regions
    from tofu_mx.tdl.registry import Attrs, lookup, trace
    attrs = {"kernel": (3, 3), "num_filter": 2, "pad": (4, 4), "no_bias": True}
    traced = trace(lookup("Convolution"), Attrs(attrs), [(1, 2, 3, 3), (2, 2, 3, 3)],
                   [(1, 2, 9, 9)])
    work = work_regions(traced, {"x0": (0, 1)})      # rows 0-1 read rows -4..-1: padding
    assert work.inputs[0] is None
    assert work.windows[0] == ((0, 0), (0, 1), (-4, -1), (-4, 6))
    assert work.inputs[1] == ((0, 1), (0, 1), (0, 2), (0, 2))
