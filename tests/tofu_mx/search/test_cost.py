"""Each cost function against its closed form."""
import pytest

from tofu_mx.search.cost import (all_gather_bytes, all_reduce_bytes, consumer_bytes,
                                 fetch_elements, part_interval, producer_bytes,
                                 reduce_scatter_bytes, stored_regions, volume)

SHAPE = (8, 6)       # 48 float32 elements
S = 48 * 4


def split_needs(axis, parts, shape=SHAPE, halo=(0, 0)):
    regions = stored_regions(("split", axis), shape, parts)
    out = []
    for r in regions:
        r = list(r)
        lo, hi = r[axis]
        r[axis] = (max(lo - halo[0], 0), min(hi + halo[1], shape[axis] - 1))
        out.append(tuple(r))
    return out


def whole(parts, shape=SHAPE):
    return [tuple((0, n - 1) for n in shape)] * parts


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_split_to_same_split_is_free(parts):
    shape = (12, 6)
    assert consumer_bytes(("split", 0), shape, split_needs(0, parts, shape), 4, True) == 0


@pytest.mark.parametrize("parts", [2, 3])
def test_split_to_other_axis(parts):
    shape = (6, 6)
    size = 36 * 4
    forward = consumer_bytes(("split", 0), shape, split_needs(1, parts, shape), 4, False)
    assert forward == size * (parts - 1) // parts
    assert consumer_bytes(("split", 0), shape, split_needs(1, parts, shape), 4, True) == 2 * forward


@pytest.mark.parametrize("parts", [2, 4])
def test_split_to_replicated_is_an_all_gather(parts):
    assert consumer_bytes(("split", 0), SHAPE, whole(parts), 4, False) == all_gather_bytes(S, parts)
    assert all_gather_bytes(S, parts) == S * (parts - 1)


def test_halo_exchange():
    # rows of 6 floats; each of 2 parts fetches one row from its neighbour
    assert consumer_bytes(("split", 0), SHAPE, split_needs(0, 2, halo=(1, 1)), 4, False) == 2 * 6 * 4
    # 4 parts: the two inner parts fetch a row on each side, the outer ones one row
    assert consumer_bytes(("split", 0), SHAPE, split_needs(0, 4, halo=(1, 1)), 4, False) == \
        2 * 1 * (6 * 4) * (4 - 1)


@pytest.mark.parametrize("parts", [2, 3])
def test_partial_sums(parts):
    produced = whole(parts, (6, 6))
    size = 36 * 4
    assert producer_bytes(("split", 1), (6, 6), produced, True, 4, False) == \
        reduce_scatter_bytes(size, parts) == size * (parts - 1)
    assert producer_bytes(("replicated",), (6, 6), produced, True, 4, False) == \
        all_reduce_bytes(size, parts) == 2 * size * (parts - 1)
    assert producer_bytes(("split", 1), (6, 6), produced, True, 4, True) == 2 * size * (parts - 1)


def test_producer_split_as_stored_is_free_and_replicated_compute_pays_in_backward():
    produced = split_needs(0, 2)
    assert producer_bytes(("split", 0), SHAPE, produced, False, 4, True) == 0
    # each part computed the whole: nothing to send forward, the output gradient is gathered
    assert producer_bytes(("split", 0), SHAPE, whole(2), False, 4, False) == 0
    assert producer_bytes(("split", 0), SHAPE, whole(2), False, 4, True) == all_gather_bytes(S, 2)


def test_weight_fetched_whole_costs_gather_plus_gradient_reduction():
    """Sharded data parallelism: all-gather forward, reduce-scatter backward = all-reduce."""
    assert consumer_bytes(("split", 1), SHAPE, whole(4), 4, True) == all_reduce_bytes(S, 4)


def test_first_part_only():
    needs = [whole(1)[0], None]
    assert consumer_bytes(("split", 0), SHAPE, needs, 4, False) == S // 2


def test_uneven_parts_and_volumes():
    assert [part_interval(7, 3, p) for p in range(3)] == [(0, 1), (2, 3), (4, 6)]
    assert volume(((0, 1), (0, 2))) == 6 and volume(None) == 0 and volume(((3, 2),)) == 0
    assert fetch_elements([((0, 3),)], [((2, 5),)]) == 2


@pytest.mark.parametrize("parts", [2, 3])
def test_replicated_tensor_with_gradient_keeps_its_replicas_equal(parts):
    # every part reads it whole: the gradients are all-reduced
    assert consumer_bytes(("replicated",), SHAPE, whole(parts), 4, True) == all_reduce_bytes(S, parts)
    # parts read disjoint slices: each receives the others' gradient slices (an all-gather)
    assert consumer_bytes(("replicated",), (6, 6), split_needs(0, parts, (6, 6)), 4, True) == \
        all_gather_bytes(36 * 4, parts)
    # no gradient: nothing moves at all
    assert consumer_bytes(("replicated",), SHAPE, whole(parts), 4, False) == 0
