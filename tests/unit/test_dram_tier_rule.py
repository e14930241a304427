"""The DRAM tier's rule (memascend_cli/planner/dram_tier.py): what it holds at a budget, what each unit costs, and
when a tier has no room."""

from __future__ import annotations

from itertools import pairwise

from memascend_cli.planner import dram_tier as rule


def test_parameters_come_first_then_whole_sub_groups():
    params, groups = [10, 10, 10], [40, 40, 40]
    t = rule.split(25, params, groups)
    assert (t.params, t.groups, t.params_bytes, t.groups_bytes) == ((0, 1), (), 20, 0)
    t = rule.split(30 + 79, params, groups)
    assert (t.params, t.groups, t.groups_bytes) == ((0, 1, 2), (0,), 40)  # 79 left: one whole sub-group, not two
    assert t.total_bytes == 70


def test_a_unit_that_does_not_fit_leaves_room_for_a_later_smaller_one():
    t = rule.split(30 + 50, [10, 10, 10], [60, 40, 40])
    assert t.groups == (1,) and t.groups_bytes == 40


def test_gradients_come_before_sub_groups_and_what_a_larger_unit_leaves_goes_to_smaller_ones():
    params, groups, grads = [10], [40, 40], [5, 5]
    t = rule.split(10 + 10 + 40, params, groups, grads)
    assert (t.grads, t.groups) == ((0, 1), (0,))
    t = rule.split(10 + 5 + 40, params, groups, grads)  # 45 left after the partitions: both gradients, then no group
    assert (t.grads, t.groups, t.total_bytes) == ((0, 1), (), 20)
    t = rule.split(10 + 8, params, [3, 4], grads)  # what the gradients leave goes to a small sub-group
    assert (t.grads, t.groups) == ((0,), (0,))
    assert rule.split(None, params, groups, grads).total_bytes == 10 + 80 + 10
    assert rule.split(9, params, [4], grads).groups == (0,)  # no partition fits 9 B: a gradient and a sub-group do


def test_a_record_of_the_engine_before_takes_the_sub_groups_first():
    params, groups, grads = [10], [40, 40], [5, 5]
    old = rule.split(10 + 40 + 10, params, groups, grads, gradients_first=False)
    assert (old.groups, old.grads) == ((0,), (0, 1))  # the second sub-group does not fit: the gradients take the rest
    assert rule.split(10 + 40 + 10, params, groups, grads).groups == (0,)
    assert rule.split(10 + 45, params, groups, grads, gradients_first=False).grads == (0,)
    assert rule.split(10 + 45, params, groups, grads).grads == (0, 1)


def test_held_bytes_never_pass_the_budget_and_grow_with_it():
    params, groups, grads = [3, 7, 11, 5], [23, 19, 29], [2, 4, 6, 8]
    for first in (True, False):
        totals = [rule.split(b, params, groups, grads, gradients_first=first).total_bytes for b in range(130)]
        assert all(t <= b for b, t in enumerate(totals))
        assert all(a <= b for a, b in pairwise(totals)) and totals[-1] == sum(params + groups + grads)


def test_unit_bytes_count_what_the_engine_keeps():
    kw = {"param_numels": [100], "group_numels": [1000], "grad_numels": [100], "grad_elem_bytes": 2}
    p, g, d = rule.unit_bytes(param_elem_bytes=2, moment_bytes=4, master_in_params=False, overlap=False, **kw)
    assert (p, g, d) == ([200], [12_000], [200])  # bf16 partitions; fp32 master + two fp32 moments
    # The overlap keeps a second generation of the states; bf16 moments halve them.
    assert rule.unit_bytes(param_elem_bytes=2, moment_bytes=2, master_in_params=False, overlap=True, **kw)[1] == [16_000]
    # fp32 with the parameters holding the master: no master key, and the overlap's shadow partition beside each.
    p, g, _ = rule.unit_bytes(param_elem_bytes=4, moment_bytes=4, master_in_params=True, overlap=True, **kw)
    assert (p, g) == ([800], [16_000])


def test_a_tier_without_room_for_itself_and_the_headroom_gets_nothing():
    assert rule.granted_bytes(100, 200, 100) == 100
    assert rule.granted_bytes(100, 199, 100) == 0
    assert rule.granted_bytes(0, 0, 0) == 0
