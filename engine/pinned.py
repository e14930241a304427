"""Alignment-free pinned allocation on top of the native core's ``AlignedBuffer``.

PyTorch's CachingHostAllocator rounds every pinned request up to a power of two (up to 2x the
bytes; torch/include/ATen/core/CachingHostAllocator.h, PowerOf2Ceil); DeepSpeed's own mlock allocator
(ops/csrc/aio/py_lib/deepspeed_pin_tensor.h) is exact but not CUDA-registered, so
``is_pinned()`` is False and H2D/D2H copies from it are staged and blocking. Here every buffer is
one anonymous mmap of exactly ``align_up(nbytes, page)`` bytes that is

* mlocked (best effort: when RLIMIT_MEMLOCK refuses, the buffer stays usable, only unlocked, and
  the failure is counted; O_DIRECT does not need locked pages);
* ``cudaHostRegister``ed when CUDA is usable, so ``tensor.is_pinned()`` is True, copies are
  asynchronous, and the same memory serves O_DIRECT I/O with no bounce buffer.

A tensor returned by :meth:`PinnedAllocator.empty` keeps its buffer alive through the buffer
protocol; when the last view dies the buffer is unmapped and its range forgotten, so callers
never have to free explicitly (``free`` only exists for DeepSpeed's ``free_cpu_locked_tensor``).
A CUDA-registered buffer first synchronises the device it was registered on (``AlignedBuffer.close``
in csrc/buffers.cpp): a ``non_blocking`` copy still queued on any stream would otherwise read or
write pages already handed back to the kernel. That wait is why buffers that come and go per step
are pooled by their users (``ds_internals.swapper.OverflowBuffers``, ``activation_checkpointing._HostStash``)
rather than freed.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from dataclasses import dataclass

from memascend_engine import native


@dataclass
class PinnedStats:
    """Counters of one allocator (bytes are mapped bytes: the request rounded up to the page)."""

    live_bytes: int = 0
    peak_bytes: int = 0
    live_buffers: int = 0
    allocations: int = 0
    locked_bytes: int = 0
    cuda_registered_bytes: int = 0
    lock_failures: int = 0
    requested_bytes: int = 0
    """Sum of the live requests before page rounding (live_bytes - this = the page padding)."""


class PinnedAllocator:
    """Exact-size, page-aligned host buffers wrapped as torch tensors."""

    def __init__(self, *, lock: bool = True, cuda_register: bool | None = None, huge_pages: bool = True):
        """``cuda_register=None``: register when torch reports a usable CUDA device."""
        if cuda_register is None:
            cuda_register = _cuda_usable()
        self.lock = lock
        self.cuda_register = cuda_register
        self.huge_pages = huge_pages
        self.stats = PinnedStats()
        self._mutex = threading.Lock()
        self._starts: list[int] = []  # sorted buffer start addresses
        self._ends: dict[int, int] = {}  # start -> end (exclusive)
        self._requested: dict[int, int] = {}
        self.first_lock_error: str | None = None
        self.first_cuda_error: str | None = None

    # -- allocation --------------------------------------------------------------------------
    def empty(self, numel: int, dtype) -> torch.Tensor:  # noqa: F821
        """A 1-D tensor of ``numel`` elements of ``dtype`` in fresh pinned memory (zero-filled)."""
        import torch

        numel = int(numel)
        if numel <= 0:
            return torch.empty(0, dtype=dtype)
        elem_bytes = torch.empty((), dtype=dtype).element_size()
        nbytes = numel * elem_bytes
        buf = native.AlignedBuffer(nbytes, lock=self.lock, cuda_register=self.cuda_register, zero=True,
                                   huge_pages=self.huge_pages)
        tensor = native.as_tensor(buf, dtype, numel)
        self._register(buf, nbytes)
        return tensor

    def pin(self, tensor, make_copy: bool = True, match_shape: bool = True):
        """A pinned copy of ``tensor`` (DeepSpeed accelerator.pin_memory semantics); a tensor that
        already lives in this allocator is returned as is."""
        if tensor.device.type == "cpu" and self.is_pinned(tensor):
            return tensor
        out = self.empty(tensor.numel(), tensor.dtype)
        if tensor.numel() == 0:
            return out.view(tensor.shape) if match_shape else out
        if make_copy:
            out.copy_(tensor.reshape(-1))
        return out.view(tensor.shape) if match_shape else out

    def free(self, tensor) -> None:
        """Forget nothing early: the buffer is unmapped when its last view dies (DeepSpeed's
        ``free_cpu_locked_tensor`` frees explicitly; with views possibly alive that would be unsafe)."""
        return

    # -- queries -----------------------------------------------------------------------------
    def is_pinned(self, tensor) -> bool:
        """True if ``tensor``'s memory lies inside one of this allocator's live buffers."""
        if tensor.device.type != "cpu":
            return False
        return self.owns_address(tensor.data_ptr(), tensor.numel() * tensor.element_size())

    def owns_address(self, address: int, nbytes: int = 0) -> bool:
        """True if [address, address+nbytes) is inside one live buffer."""
        with self._mutex:
            i = bisect.bisect_right(self._starts, address) - 1
            if i < 0:
                return False
            start = self._starts[i]
            return address + nbytes <= self._ends[start]

    def snapshot(self) -> dict:
        """Counters as a dict."""
        with self._mutex:
            return dict(vars(self.stats))

    # -- internals ---------------------------------------------------------------------------
    def _register(self, buf, requested_bytes: int) -> None:
        start = buf.address
        mapped = buf.mapped_bytes
        locked = bool(buf.locked)
        registered = bool(buf.cuda_registered)
        with self._mutex:
            bisect.insort(self._starts, start)
            self._ends[start] = start + mapped
            self._requested[start] = requested_bytes
            s = self.stats
            s.live_bytes += mapped
            s.peak_bytes = max(s.peak_bytes, s.live_bytes)
            s.live_buffers += 1
            s.allocations += 1
            s.requested_bytes += requested_bytes
            if locked:
                s.locked_bytes += mapped
            elif self.lock:
                s.lock_failures += 1
                self.first_lock_error = self.first_lock_error or buf.lock_error
            if registered:
                s.cuda_registered_bytes += mapped
            elif self.cuda_register:
                self.first_cuda_error = self.first_cuda_error or buf.cuda_error
        # The tensor holds the only strong reference (through its memoryview); when it goes, so
        # does the buffer, and this callback drops the range.
        weakref.finalize(buf, self._unregister, start, mapped, locked, registered)

    def _unregister(self, start: int, mapped: int, locked: bool, registered: bool) -> None:
        with self._mutex:
            i = bisect.bisect_left(self._starts, start)
            if i < len(self._starts) and self._starts[i] == start:
                del self._starts[i]
            self._ends.pop(start, None)
            s = self.stats
            s.requested_bytes -= self._requested.pop(start, 0)
            s.live_bytes -= mapped
            s.live_buffers -= 1
            if locked:
                s.locked_bytes -= mapped
            if registered:
                s.cuda_registered_bytes -= mapped


def _cuda_usable() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - any failure means no CUDA registration
        return False
