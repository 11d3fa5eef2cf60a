"""Seeded fuzzing: random graphs of described operators, partitioned over 2-4 CPU devices and
verified against one device (outputs, every gradient, aux states). A failure names its seed:
``pytest tests/tofu_mx/runtime/test_fuzz.py -k 'seed_<n>'`` reproduces it. The default run
tries 200 seeds, and 60 of them under the plans keeping converted inputs; ``-m slow`` tries
2,000 more, and the next 140 keeping."""
import random

import mxnet as mx
import pytest

from tofu_mx.search import SearchOptions
from tests.tofu_mx.runtime.helpers import partition_and_verify


def random_graph(seed: int):
    rnd = random.Random(seed)
    k = rnd.choice([2, 3, 4])
    batch = k * rnd.choice([1, 2, 3])
    c, hw = rnd.choice([2, 3, 4, 8]), rnd.choice([4, 6, 8])
    x = mx.sym.var("data", dtype="float64")
    pool = [(x, (batch, c, hw, hw))]
    cur, shape = pool[0]
    for n in range(rnd.randint(2, 7)):
        name = f"n{n}"
        if len(shape) == 4:
            choice = rnd.choice(["conv", "conv", "pool", "bn", "act", "add", "concat", "scalar",
                                 "flatten"])
            if choice == "conv":
                kernel = rnd.choice([1, 3])
                stride = rnd.choice([1, 1, 2]) if shape[2] >= 4 else 1
                pad = kernel // 2 if rnd.random() < 0.8 or shape[2] < kernel else 0
                filters = rnd.choice([2, 4, 6, 8])
                group = rnd.choice([1, shape[1]]) if filters == shape[1] else 1
                cur = mx.sym.Convolution(cur, num_filter=filters, kernel=(kernel, kernel),
                                         stride=(stride, stride), pad=(pad, pad),
                                         num_group=group, name=name,
                                         no_bias=rnd.random() < 0.3)
                size = (shape[2] + 2 * pad - kernel) // stride + 1
                shape = (shape[0], filters, size, size)
            elif choice == "pool" and shape[2] >= 4:
                kind = rnd.choice(["max", "avg"])
                if rnd.random() < 0.5:
                    cur = mx.sym.Pooling(cur, kernel=(2, 2), stride=(2, 2), pool_type=kind,
                                         name=name)
                    shape = shape[:2] + (shape[2] // 2, shape[3] // 2)
                else:
                    cur = mx.sym.Pooling(cur, kernel=(3, 3), stride=(1, 1), pad=(1, 1),
                                         pool_type=kind, name=name)
            elif choice == "bn":
                cur = mx.sym.BatchNorm(cur, fix_gamma=rnd.random() < 0.5, name=name)
            elif choice == "act":
                cur = mx.sym.Activation(cur, act_type=rnd.choice(["relu", "tanh", "sigmoid"]),
                                        name=name)
            elif choice in ("add", "concat"):
                same = [t for t, s in pool if s == shape and t is not cur]
                if choice == "add" and same:
                    cur = mx.sym.elemwise_add(cur, rnd.choice(same), name=name)
                elif choice == "concat":
                    other = [t for t, s in pool if s[0] == shape[0] and s[2:] == shape[2:]]
                    partner = rnd.choice(other)
                    width = [s for t, s in pool if t is partner][0][1]
                    cur = mx.sym.Concat(cur, partner, dim=1, name=name)
                    shape = (shape[0], shape[1] + width) + shape[2:]
            elif choice == "scalar":
                cur = cur * rnd.choice([0.5, 2.0])
            elif choice == "flatten":
                cur = mx.sym.Flatten(cur, name=name)
                shape = (shape[0], shape[1] * shape[2] * shape[3])
        else:
            choice = rnd.choice(["fc", "fc", "act", "softmax", "mul"])
            if choice == "fc":
                hidden = rnd.choice([4, 6, 8, 12])
                cur = mx.sym.FullyConnected(cur, num_hidden=hidden, name=name)
                shape = (shape[0], hidden)
            elif choice == "act":
                cur = mx.sym.Activation(cur, act_type="tanh", name=name)
            elif choice == "softmax":
                cur = mx.sym.softmax(cur, axis=-1, name=name)
            else:
                cur = cur * cur
        pool.append((cur, shape))
    if len(shape) == 4:
        cur = mx.sym.Flatten(cur)
    if rnd.random() < 0.5:
        out = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(cur, num_hidden=4, name="head"),
                                   name="softmax")
        shapes = {"data": pool[0][1], "softmax_label": (batch,)}
    else:
        out = mx.sym.MakeLoss(mx.sym.sum(cur * cur))
        shapes = {"data": pool[0][1]}
    return out, k, shapes


def check(seed: int, options=None) -> None:
    sym, k, shapes = random_graph(seed)
    try:
        _, report = partition_and_verify(sym, k, options=options, **shapes)
    except Exception as e:
        raise AssertionError(f"fuzz seed {seed} (k={k}, shapes {shapes}) failed: "
                             f"{type(e).__name__}: {e}") from e
    assert report.ok, f"fuzz seed {seed} failed"


@pytest.mark.parametrize("seed", [
    pytest.param(s, marks=() if s < 60 else pytest.mark.slow) for s in range(200)],
    ids=lambda s: f"seed_{s}")
def test_fuzz_keeping_converted_inputs(seed):
    """The same graphs under the plans that keep converted inputs for the backward pass
    (``SearchOptions(refetch=False)``, which ``partition(machine=)`` mostly chooses)."""
    check(seed, SearchOptions(refetch=False))


@pytest.mark.parametrize("seed", range(200), ids=lambda s: f"seed_{s}")
def test_fuzz(seed):
    check(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(200, 2200), ids=lambda s: f"seed_{s}")
def test_fuzz_long(seed):
    check(seed)
