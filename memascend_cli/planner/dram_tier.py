"""What memascend's DRAM tier holds at a budget: the one rule the planner (placement.py) prices and the engine
(memascend_engine.dram_tier) applies. Pure: stdlib only.

The tier keeps in DRAM what saves the most SSD bytes per DRAM byte, in three classes taken in order:
  1. the training-dtype parameter partitions: each byte held saves its reads in forward and backward and its
     write-back after the step (about 3 SSD bytes per byte held);
  2. the gradients, where they reach the SSD: written each micro-batch and read back by the next one or the optimizer
     (2 x micro-batches SSD bytes per byte held; one fewer with the overlap, which steps the last micro-batch's as
     they are reduced: with one micro-batch they are written only to be kept for a redo, clipping on, and never read
     back: 1 per byte, every byte a write);
  3. whole optimizer sub-groups (the bounded engine's chunks): master + Adam moments, read and written once a step
     (2 SSD bytes per byte held; with the overlap both generations of the states are held: 1 per byte, half of them
     reads).
The gradients come before the sub-groups because a gradient byte never saves less than a sub-group byte and saves
more writes: with the overlap and clipping on, the step writes its moments and its gradients and reads only its
moments, so the writes bind (bench-llama-136m, 4 layers, fp32, 400 MB/s, the split at 2.3 GiB with the sub-groups
first: 6.77 B/param read, 10.77 written, 4 of them the gradients kept for a redo; docs/bench/placements/
bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-quiet5-split-0749). Engines recorded before this order held the
sub-groups first (split's `gradients_first`).
Within a class every unit saves the same per byte: the classes are walked in that order and each unit that still fits
is taken (what a larger unit leaves over goes to smaller ones, of its class or the next).

What a unit costs is what the engine keeps for it (unit_bytes): the overlap's second generation of the states and, in
fp32 with the parameters holding the master, the shadow of each parameter partition are kept too; the region keys of
a held unit never touch the SSD.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TierSplit:
    """The units a tier holds: indices into the sizes given to split()."""

    params: tuple[int, ...]
    groups: tuple[int, ...]
    grads: tuple[int, ...]
    params_bytes: int
    groups_bytes: int
    grads_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.groups_bytes + self.grads_bytes


def _fill(left: int, sizes: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """Each unit of `sizes` that still fits in `left` bytes, in order: (indices, bytes)."""
    held, used = [], 0
    for i, n in enumerate(sizes):
        if used + n <= left:
            held.append(i)
            used += n
    return tuple(held), used


ORDER = "params,gradients,groups"
"""The classes in the order split() takes them (TierStats.order records it: a record without it held the sub-groups
before the gradients)."""


def split(budget_bytes: int | None, param_bytes: Sequence[int], group_bytes: Sequence[int],
          grad_bytes: Sequence[int] = (), *, gradients_first: bool = True) -> TierSplit:
    """The tier at `budget_bytes` (None: everything) over units of these sizes: parameter partitions first, then
    the gradients, then whole sub-groups, each unit that still fits. `gradients_first` False: the sub-groups before the
    gradients, the rule of engines recorded before ORDER."""
    left = sum(param_bytes) + sum(group_bytes) + sum(grad_bytes) if budget_bytes is None else max(0, budget_bytes)
    params, p = _fill(left, param_bytes)
    if gradients_first:
        grads, g = _fill(left - p, grad_bytes)
        groups, s = _fill(left - p - g, group_bytes)
    else:
        groups, s = _fill(left - p, group_bytes)
        grads, g = _fill(left - p - s, grad_bytes)
    return TierSplit(params, groups, grads, p, s, g)


def unit_bytes(*, param_numels: Sequence[int], param_elem_bytes: int, group_numels: Sequence[int],
               moment_bytes: int, master_in_params: bool, overlap: bool,
               grad_numels: Sequence[int] = (), grad_elem_bytes: int = 0
               ) -> tuple[list[int], list[int], list[int]]:
    """(parameter, sub-group, gradient) unit sizes in bytes as the engine keeps them. `master_in_params`:
    EngineOptions.params_hold_master (fp32: no master key; bf16: a 2 B residual instead of the 4 B master; with the
    overlap each partition has a shadow key beside it); `overlap`: EngineOptions.overlap_optimizer (a second generation
    of every sub-group's states)."""
    shadow = 2 if overlap and master_in_params else 1
    state = (4 - param_elem_bytes if master_in_params else 4) + 2 * moment_bytes
    generations = 2 if overlap else 1
    return ([n * param_elem_bytes * shadow for n in param_numels],
            [n * state * generations for n in group_numels],
            [n * grad_elem_bytes for n in grad_numels])


def granted_bytes(asked_bytes: int, free_bytes: int, headroom_bytes: int) -> int:
    """What a tier asked `asked_bytes` may take when the process has `free_bytes` left (MemAvailable, or its cgroup's
    limit less its usage): all of it while `headroom_bytes` stay free, else nothing (the tier falls back to the
    region rather than run the process into the OOM killer)."""
    return asked_bytes if asked_bytes + headroom_bytes <= free_bytes else 0
