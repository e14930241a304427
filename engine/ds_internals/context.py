"""What the patched DeepSpeed classes share with the installed engine (memascend_engine.runtime.Installed)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memascend_engine.ds_internals.allocator import (
    KEPT_HEAP_TRIM_THRESHOLD_BYTES,
    LAYER_TRIM_MMAP_THRESHOLD_BYTES,
    MMAP_THRESHOLD_BYTES,
    GlibcHeap,
    disable_huge_pages,
)


@dataclass
class PluginContext:
    """What the patched DeepSpeed classes need from the installed engine."""

    fused_overflow: bool
    malloc_trim: bool
    adam_in_place: bool
    pool_plan_factory: Callable[..., Any] | None
    """(elem_bytes, min_aio_bytes, intra_op_parallelism, largest_partition_numel=None) -> zero.PoolPlan, or None
    while the inventory is unknown (no model spec: asked again with the largest real partition); the factory itself
    is None for DeepSpeed's stock pool."""
    bounded_norm: bool = True
    """Gradient norms in fp64 pieces of NORM_CHUNK_NUMEL (EngineOptions.bounded_norm), in the bounded engine."""
    pinned_allocator: Any = None
    """Set when the pinned technique is on: the gradient flat buffer is then allocated pinned in place."""
    declare_zero: Callable[[str, int], None] | None = None
    """The Direct NVMe store's declare_zero(swap path, nbytes): the Adam states seeded in place read as zeros."""
    counters: dict = field(default_factory=lambda: {
        "overflow_scans": 0, "overflow_scan_bytes": 0, "malloc_trims": 0, "layer_trims": 0, "mmap_threshold_bytes": 0,
        "trim_threshold_bytes": 0, "huge_pages_off": 0,
        "adam_states_in_place": 0,
        "pool_overflow_allocations": 0, "pool_overflow_reuses": 0, "pool_overflow_bytes": 0,
        "prefetch_skipped": 0, "prefetch_duplicates": 0, "master_partitions_evicted": 0,
        "grad_buffer_in_place": 0, "norms_on_worker": 0, "chunks_fused_step": 0,
        "fused_step_mismatches": 0})
    param_swappers: list = field(default_factory=list)
    optimizers: list = field(default_factory=list)
    store: Any = None
    """The rank's RegionStore (Direct NVMe), or None."""
    windows: Any = None
    """zero.EngineWindows when the bounded engine (gradient streaming + optimizer pipeline) is on, else None."""
    io: Any = None
    """memascend_engine.bounded.IOCounters of the bounded engine."""
    moment_bytes: int = 4
    """Bytes per element of Adam's exp_avg / exp_avg_sq on the SSD for the bounded engine
    (EngineOptions.optimizer_moments, memascend_cli.planner.job.MOMENT_BYTES)."""
    overlap: Any = None
    """memascend_engine.overlap.OverlapCounters when the optimizer overlaps backward (EngineOptions.overlap_optimizer),
    else None."""
    master_from_params: bool = False
    """EngineOptions.master_from_params (with the overlap)."""
    params_hold_master: bool = False
    """EngineOptions.params_hold_master (with streaming)."""
    partition_released: Any = None
    """Called with each parameter whose swapped-in partition the param swapper is about to drop (its buffer goes back
    to the pool): the optimizer overlapped with backward copies an fp32 master from it (overlap.Speculator) and returns
    whether a chunk of it has still to start (the swapper then keeps it until the gradient's offer)."""
    heap: GlibcHeap = field(default_factory=GlibcHeap)

    def trim_heap(self, counter: str = "malloc_trims") -> None:
        """Return freed heap pages to the OS (glibc keeps fwd/bwd temporaries in its arenas); `counter` names the
        call site: after backward (malloc_trims) or after each checkpointed layer (layer_trims)."""
        if self.heap.trim():
            self.counters[counter] += 1

    def fix_mmap_threshold(self, nbytes: int = MMAP_THRESHOLD_BYTES) -> bool:
        """Serve every allocation of `nbytes` or more by its own mmap for the rest of the process.

        glibc raises its mmap threshold to the size of each mmapped block freed (up to 32 MiB, mallopt(3)
        "M_MMAP_THRESHOLD"); after the first freed tensor of a few MiB, parameter, gradient and activation tensors
        of that size come from the heap, whose freed middle glibc keeps: measured on bench-llama-136m at 32 layers
        (fp32, CPU), the rank's peak grew from 1.69 to 3.68 GiB, by ~4 B per parameter during zero.Init and
        backward. Setting the threshold turns the dynamic raise off; freed tensors go back to the OS at once."""
        ok = self.heap.fix_mmap_threshold(nbytes)
        self.counters["mmap_threshold_bytes"] = int(nbytes) if ok else 0
        return ok

    def keep_heap(self) -> bool:
        """The layers reuse the heap's freed blocks, nothing trimmed between them (EngineOptions.layer_trims off, a
        DRAM that holds the job): glibc's largest mmap threshold with the trim threshold its own policy pairs with
        it, and no transparent huge pages, which would be faulted in and zeroed 2 MiB at a time wherever the heap
        gives pages back (the trim after backward). False where the thresholds could not be set."""
        ok = self.fix_mmap_threshold(LAYER_TRIM_MMAP_THRESHOLD_BYTES) and \
            self.heap.fix_trim_threshold(KEPT_HEAP_TRIM_THRESHOLD_BYTES)
        self.counters["trim_threshold_bytes"] = KEPT_HEAP_TRIM_THRESHOLD_BYTES if ok else 0
        self.counters["huge_pages_off"] = int(ok and disable_huge_pages())
        return ok
