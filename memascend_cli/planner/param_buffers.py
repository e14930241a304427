"""Stock ZeRO-3's parameter swap buffers in use at once, and the 'Not enough buffers' failure it predicts. Pure.

With offload_param on NVMe, every fetched NVMe partition occupies one of offload_param.buffer_count swap buffers until
the parameter is released (runtime/swap_tensor/partitioned_param_swapper.py swap_in / get_buffer: asserts "Not enough
buffers"). Once step 1 has recorded the module trace, a parameter is released after its module only if its next use
lies more than stage3_max_reuse_distance parameter elements ahead (runtime/zero/partitioned_param_coordinator.py
__params_to_release); until then it keeps its buffer. So with DeepSpeed's default reuse distance (1e9) a model whose
NVMe-resident parameters are reused within that distance holds more partitions than there are buffers, and step 2
fails (deepspeedai/DeepSpeed issue 3062; seen on an H200 with llama-3.2-1b and the docs' config; the bound is checked
against real runs on both sides of it in tests/integration/test_param_buffer_failure.py).
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate


def nvme_resident(partition_numels: tuple[int, ...], sub_groups: tuple[tuple[int, ...], ...], max_in_cpu: int,
                  swappable: tuple[bool, ...]) -> tuple[bool, ...]:
    """Which partitions live on NVMe: one param group's sub-groups take the max_in_cpu flat buffer in order while they
    fit whole, the rest stay on NVMe (stage3.py _create_param_groups_fp16_flat_cpu_memory line 888 and
    _create_fp16_partitions_with_defragmentation: 'Flat buffer may not be available for parameters that reside in
    NVME'), each partition the swapper takes (swappable: at least min_aio_bytes)."""
    flat = min(int(max_in_cpu), sum(partition_numels))
    out = [False] * len(partition_numels)
    offset = 0
    for group in sub_groups:
        total = sum(partition_numels[i] for i in group)
        if offset + total > flat:
            for i in group:
                out[i] = bool(swappable[i])
        offset += total
    return tuple(out)


def trace(n_head: int, n_per_layer: int, n_layers: int, n_tail: int, *, recompute: bool,
          last_module: int) -> tuple[int, ...]:
    """Parameter indices in the order a training step uses them: forward in module order, then backward in reverse.
    With activation checkpointing a decoder layer's backward starts at its last module (DeepSpeed's pre-backward hook
    on the layer's output), whose saved tensors then make torch.utils.checkpoint rerun the layer's forward, and goes
    on in reverse from there (the module trace DeepSpeed 0.19.8 records for a Llama layer under HF's non-reentrant
    checkpointing). `last_module`: the position in a layer of that module's weight (the layer's norms may be listed
    after it: they are persistent and take no buffer)."""
    n = n_head + n_per_layer * n_layers + n_tail
    out = list(range(n))
    out += range(n - 1, n - 1 - n_tail, -1)
    for layer in range(n_layers - 1, -1, -1):
        first = n_head + layer * n_per_layer
        ids = list(range(first, first + n_per_layer))
        if recompute:
            last = ids[last_module]
            out += [last, *ids, *(i for i in reversed(ids) if i != last)]
        else:
            out += reversed(ids)
    out += range(n_head - 1, -1, -1)
    return tuple(out)


@lru_cache(maxsize=256)
def peak_held(full_numels: tuple[int, ...], nvme: tuple[bool, ...], order: tuple[int, ...], persistent_below: int,
              max_reuse_distance: int) -> int:
    """Most NVMe partitions holding a swap buffer at once in a step after the first (`order`: see trace()): the one
    being fetched plus those kept for a reuse within max_reuse_distance elements. Parameters below
    stage3_param_persistence_threshold stay on the device and give their buffers back
    (partitioned_param_coordinator.py fetch_sub_module: 'Release swap buffers for persisted params')."""
    cum = [0, *accumulate(full_numels[p] for p in order)]
    last_use: dict[int, int] = {}
    starts: list[int] = []
    ends: list[int] = []
    for t, p in enumerate(order):
        if not nvme[p] or full_numels[p] < persistent_below:
            continue
        prev = last_use.get(p)
        # Kept since its previous use when the elements traversed in between stay below the reuse distance;
        # otherwise released there and fetched again now.
        if prev is None or cum[t] - cum[prev + 1] >= max_reuse_distance:
            if prev is not None:
                ends.append(prev)
            starts.append(t)
        last_use[p] = t
    ends.extend(last_use.values())
    events = sorted([(t, 0) for t in starts] + [(t, 1) for t in ends])  # a fetch at t counts before a release at t
    held = peak = 0
    for _, kind in events:
        held += 1 if kind == 0 else -1
        peak = max(peak, held)
    return peak


def failure(full_numels: tuple[int, ...], nvme: tuple[bool, ...], order: tuple[int, ...], *, buffer_count: int,
            persistent_below: int, max_reuse_distance: int) -> str | None:
    """The error a stock run meets at step 2 and how to avoid it, or None."""
    if not any(nvme):
        return None
    peak = peak_held(full_numels, nvme, order, int(persistent_below), int(max_reuse_distance))
    if peak <= buffer_count:
        return None
    return (f"step 2 would fail with DeepSpeed's 'Not enough buffers 0 for swapping 1': {sum(nvme)} parameter "
            f"partitions live on NVMe (beyond offload_param.max_in_cpu) and stage3_max_reuse_distance "
            f"{max_reuse_distance:,} keeps up to {peak} of them fetched at once, more than offload_param.buffer_count "
            f"{buffer_count} (DeepSpeed issue 3062; stage3_max_reuse_distance 0 avoids it)")
