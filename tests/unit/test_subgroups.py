"""The sub-group rule (stage3.py _create_fp16_sub_groups) and its layered form, which the plan's depth search uses."""

import random

import pytest

from memascend_cli.planner import subgroups


def test_sub_groups_close_after_reaching_the_size():
    assert subgroups.sub_groups([3, 3, 3, 3], 5) == ((0, 1), (2, 3))
    assert subgroups.sub_groups([10, 1, 1], 5) == ((0,), (1, 2))
    assert subgroups.sub_groups([1, 1], 100) == ((0, 1),)
    assert subgroups.sub_groups([4, 1], 5) == ((0, 1),)
    assert subgroups.sub_groups([], 5) == ()
    assert subgroups.sub_group_numels([3, 3, 3, 3, 1], 5) == (6, 6, 1)


@pytest.mark.parametrize("seed", range(4))
def test_layered_groups_are_the_flat_walk_of_the_whole_model(seed):
    rng = random.Random(seed)
    for _ in range(2000):
        head = tuple(rng.choice([0, 1, 5, 50, 1000]) for _ in range(rng.randint(0, 3)))
        layer = tuple(rng.choice([0, 1, 3, 7, 64, 500, 4096]) for _ in range(rng.randint(1, 6)))
        tail = tuple(rng.choice([1, 5, 50, 1000]) for _ in range(rng.randint(0, 3)))
        layers = rng.randint(0, 300)
        size = rng.choice([1, 2, 10, 100, 1000, 5000, 10**5, 10**9])
        ranges, numels = subgroups.sub_groups_and_numels(head + layer * layers + tail, size)
        ends, layered_numels = subgroups.layered_sub_group_ends(head, layer, layers, tail, size)
        assert (subgroups.group_ranges(ends), layered_numels) == (ranges, numels), (head, layer, layers, tail, size)


def test_a_model_of_100000_layers_groups_as_the_flat_walk_does():
    head, layer, tail = (10,), (4, 4, 4, 1, 1, 2, 2, 2, 2), (10, 10)
    ranges, numels = subgroups.sub_groups_and_numels(head + layer * 100_000 + tail, 8)
    ends, layered_numels = subgroups.layered_sub_group_ends(head, layer, 100_000, tail, 8)
    assert layered_numels == numels and subgroups.group_ranges(ends) == ranges
    assert sum(numels) == 10 + 22 * 100_000 + 20
