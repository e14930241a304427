"""The allocator policy: glibc's mmap threshold fixed and the heap trimmed where the planner assumes no retention.

Used through :class:`memascend_engine.ds_internals.context.PluginContext` (trim_heap, fix_mmap_threshold).
"""

from __future__ import annotations

import ctypes
from typing import Any

M_MMAP_THRESHOLD = -3
"""mallopt(3) parameter number (glibc malloc.h)."""
M_TRIM_THRESHOLD = -1
"""mallopt(3) parameter number (glibc malloc.h)."""
PR_SET_THP_DISABLE = 41
"""prctl(2) option (linux/prctl.h): no transparent huge pages for this process, madvised regions included."""
MMAP_THRESHOLD_BYTES = 1 << 20
"""Allocations from 1 MiB up are mmapped (tensors of a layer or larger); below it, the heap (python objects)."""
LAYER_TRIM_MMAP_THRESHOLD_BYTES = 32 << 20
"""With a malloc_trim after every checkpointed layer, tensors below 32 MiB (glibc's largest dynamic threshold,
malloc/malloc.c DEFAULT_MMAP_THRESHOLD_MAX) come from the heap again: a layer's recompute and backward reuse the
blocks its own temporaries freed instead of faulting in fresh zeroed pages for each (measured on bench-llama-136m,
16 layers, seq 2048, CPU: 28.7 -> 26.1 s/step, tuned stock 25.9), and the trim bounds what the heap keeps to one
layer's working set."""
KEPT_HEAP_TRIM_THRESHOLD_BYTES = 2 * LAYER_TRIM_MMAP_THRESHOLD_BYTES
"""The trim threshold of a heap kept between layers (EngineOptions.layer_trims off): the one glibc's own dynamic policy
pairs with its largest mmap threshold (malloc/malloc.c free: trim_threshold = 2 * mmap_threshold). A fixed mmap
threshold leaves the trim threshold at its 128 KiB default, and glibc then gives the heap's top back at nearly every
free, to fault it in again at the next allocation."""


class GlibcHeap:
    """malloc_trim(3) and mallopt(3) of the process's glibc, or nothing where there is none (musl)."""

    def __init__(self):
        self._libc: Any = None

    def _glibc(self):
        if self._libc is None:
            try:
                self._libc = ctypes.CDLL("libc.so.6")
                self._libc.malloc_trim.argtypes = [ctypes.c_size_t]
                self._libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            except (OSError, AttributeError):
                self._libc = False
        return self._libc

    def trim(self) -> bool:
        """Return freed heap pages to the OS; False without glibc."""
        libc = self._glibc()
        if not libc:
            return False
        libc.malloc_trim(0)
        return True

    def fix_mmap_threshold(self, nbytes: int) -> bool:
        """M_MMAP_THRESHOLD = nbytes (turns glibc's dynamic threshold off); False when it could not be set."""
        libc = self._glibc()
        return bool(libc) and bool(libc.mallopt(M_MMAP_THRESHOLD, int(nbytes)))

    def fix_trim_threshold(self, nbytes: int) -> bool:
        """M_TRIM_THRESHOLD = nbytes: free heap top glibc keeps before it gives any back; False when not set."""
        libc = self._glibc()
        return bool(libc) and bool(libc.mallopt(M_TRIM_THRESHOLD, int(nbytes)))


def disable_huge_pages() -> bool:
    """No transparent huge pages for this process from now on (prctl PR_SET_THP_DISABLE, Linux 3.15+), whatever
    PyTorch madvises (THP_MEM_ALLOC_ENABLE, defaults.ENGINE_ENV); False where the call failed or there is no libc."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
