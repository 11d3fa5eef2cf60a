"""Tying RNN steps: the pass that re-examines only the families that grew ties exactly as the
rule's plain statement (every family examined in every pass), on seeded random inputs."""
import numpy as np

from tofu_mx.search import ties


def tie_every_family_every_pass(signature, readers, producers_of):
    """The rule as stated in :mod:`tofu_mx.search.ties`, examining every family each pass."""
    parent = list(range(len(signature)))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def union(a, b):
        a, b = find(a), find(b)
        if a != b and signature[a] == signature[b]:
            parent[max(a, b)] = min(a, b)
            return True
        return False

    succ = [set() for _ in signature]
    pred = [set() for _ in signature]
    for c, producers in enumerate(producers_of):
        for u in producers:
            succ[u].add(c)
            pred[c].add(u)
    for ks in readers:
        first_of = {}
        for k in ks:
            union(first_of.setdefault(signature[k], k), k)
    changed = True
    while changed:
        changed = False
        families = {}
        for k in range(len(signature)):
            families.setdefault(find(k), []).append(k)
        for members in families.values():
            if len(members) < 2:
                continue
            for links in (succ, pred):
                by_sig = {}
                for k in members:
                    for n in links[k]:
                        by_sig.setdefault(signature[n], []).append(n)
                for ns in by_sig.values():
                    if len(ns) == len(members) and len(set(map(find, ns))) == len(ns):
                        for n in ns[1:]:
                            changed |= union(ns[0], n)
    found = {}
    for k in range(len(signature)):
        found.setdefault(find(k), []).append(k)
    return tuple(tuple(f) for f in found.values())


def random_copies(rng):
    """Unrolled-RNN-like copies: a few step structures repeated, wired step to step, some
    steps reading shared parameters, plus random extra wiring."""
    steps, width = int(rng.integers(1, 7)), int(rng.integers(1, 6))
    n = steps * width + int(rng.integers(0, 4))
    signature = [k % width if k < steps * width else width + k for k in range(n)]
    signature = [s if rng.random() < 0.9 else int(rng.integers(0, width + 2)) for s in signature]
    producers = [[] for _ in range(n)]
    for k in range(n):
        if k >= width and rng.random() < 0.8:
            producers[k].append(k - width)          # the same op at the previous step
        if k % width and rng.random() < 0.8:
            producers[k].append(k - 1)              # the previous op in the step
        if rng.random() < 0.2 and k:
            producers[k].append(int(rng.integers(0, k)))
    params = [[] for _ in range(n)]
    for p in range(int(rng.integers(0, 4))):
        position = int(rng.integers(0, width))
        for k in range(position, min(n, steps * width), width):
            if rng.random() < 0.9:
                params[k].append(1000 + p)
    return signature, ties.readers(params), producers


def test_examining_grown_families_ties_as_examining_all():
    for seed in range(1500):
        rng = np.random.default_rng(seed)
        signature, readers, producers = random_copies(rng)
        assert ties.tie(signature, readers, producers) == \
            tie_every_family_every_pass(signature, readers, producers), \
            f"reproduce: random_copies(np.random.default_rng({seed}))"


def test_steps_reading_one_weight_are_tied_and_so_are_their_successors():
    # two steps of (matmul -> tanh); both matmuls read weight 7
    signature = [0, 1, 0, 1]
    producers = [[], [0], [1], [2]]
    assert ties.tie(signature, ties.readers([[7], [], [7], []]), producers) == ((0, 2), (1, 3))
