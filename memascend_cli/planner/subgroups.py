"""Optimizer sub-groups: how ZeRO-3 cuts one param group's partitions into the sub-groups its optimizer steps and
swaps (deepspeed/runtime/zero/stage3.py _create_fp16_sub_groups). Pure: stdlib only."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate


def _close_groups(numels: Iterable[int], sub_group_size: int, acc: int, ends: list[int], group_numels: list[int],
                  first: int) -> int:
    """Walk partitions numbered from `first` with `acc` elements already in the open sub-group: a group closes once it
    reaches sub_group_size (stage3.py _create_fp16_sub_groups), its end index and elements appended. Returns the open
    group's elements."""
    for i, p in enumerate(numels, first + 1):
        acc += p
        if acc >= sub_group_size:
            ends.append(i)
            group_numels.append(acc)
            acc = 0
    return acc


def _close_last(ends: list[int], group_numels: list[int], n: int, acc: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if n and (not ends or ends[-1] != n):  # the last group closes at the end, whatever its size
        ends.append(n)
        group_numels.append(acc)
    return tuple(ends), tuple(group_numels)


def group_ranges(ends: Sequence[int]) -> tuple[range, ...]:
    """Parameter indices per sub-group from the groups' end indices."""
    return tuple(map(range, [0, *ends[:-1]], ends))


def sub_groups_and_numels(partition_numels: Sequence[int], sub_group_size: int
                          ) -> tuple[tuple[range, ...], tuple[int, ...]]:
    """Parameter indices (as ranges) and partition elements per optimizer sub-group, one param group in module
    order: a group closes once it reaches sub_group_size, so it can exceed it by one partition
    (stage3.py _create_fp16_sub_groups)."""
    ends: list[int] = []
    numels: list[int] = []
    acc = _close_groups(partition_numels, sub_group_size, 0, ends, numels, 0)
    group_ends, group_numels = _close_last(ends, numels, len(partition_numels), acc)
    return group_ranges(group_ends), group_numels


def layered_sub_group_ends(head: Sequence[int], layer: Sequence[int], num_layers: int, tail: Sequence[int],
                           sub_group_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(end index, partition elements) per sub-group of head + layer x num_layers + tail (sub_groups_and_numels's
    rule) without walking every layer: the open group's size at a layer's start decides the groups from there on,
    so once a size repeats, the layers in between repeat."""
    ends: list[int] = []
    numels: list[int] = []
    acc = _close_groups(head, sub_group_size, 0, ends, numels, 0)
    seen: dict[int, tuple[int, int]] = {}  # open group's size at a layer's start -> (layer, groups closed before)
    start, per = len(head), len(layer)
    i = 0
    while i < num_layers:
        if acc in seen:
            first, groups_before = seen[acc]
            period = i - first
            repeats = (num_layers - i) // period
            if repeats and len(ends) > groups_before:
                # the distances between group ends repeat; the first one spans the period's boundary
                steps = [ends[groups_before] + period * per - ends[-1],
                         *(b - a for a, b in zip(ends[groups_before:], ends[groups_before + 1:]))]
                ends += list(accumulate(steps * repeats, initial=ends[-1]))[1:]
                numels += numels[groups_before:] * repeats
            i += repeats * period
            seen.clear()
            if i >= num_layers:
                break
        seen[acc] = (i, len(ends))
        acc = _close_groups(layer, sub_group_size, acc, ends, numels, start + i * per)
        i += 1
    n = start + per * num_layers + len(tail)
    acc = _close_groups(tail, sub_group_size, acc, ends, numels, start + per * num_layers)
    return _close_last(ends, numels, n, acc)


def sub_groups(partition_numels: Sequence[int], sub_group_size: int) -> tuple[tuple[int, ...], ...]:
    """Parameter indices per optimizer sub-group (see sub_groups_and_numels)."""
    return tuple(tuple(g) for g in sub_groups_and_numels(partition_numels, sub_group_size)[0])


def sub_group_numels(partition_numels: Sequence[int], sub_group_size: int) -> tuple[int, ...]:
    """Partition elements per optimizer sub-group (see sub_groups_and_numels)."""
    return sub_groups_and_numels(partition_numels, sub_group_size)[1]
