"""DeepSpeed's pin sites routed through memascend's exact-size allocator (memascend_engine.pinned).

DeepSpeed pins through the accelerator object (deepspeed/accelerator/cpu_accelerator.py and cuda_accelerator.py
pin_memory / pin_empty / ...), which torch's CachingHostAllocator backs on CUDA: every request is rounded up to a
power of two (torch/include/ATen/core/CachingHostAllocator.h, PowerOf2Ceil). The exact-size allocator gives
page-aligned buffers of exactly the requested size instead.
"""

from __future__ import annotations

from memascend_engine.ds_internals.patches import Patches
from memascend_engine.ds_internals.version import check_version


def patch_accelerator(patches: Patches, allocator) -> None:
    """Route every ``get_accelerator()`` pin site (grad flat buffer P5, CPU flat params P3, small
    partitions P6, non-swappable sub-group grads) through the exact-size allocator."""
    check_version()
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    orig_is_pinned = acc.is_pinned

    def pin_memory(tensor, make_copy=True, match_shape=True):
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        return allocator.pin(tensor, make_copy=make_copy, match_shape=match_shape)

    def pin_empty(*size, dtype, device="cpu"):
        import torch

        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else tuple(size)
        n = 1
        for d in shape:
            n *= int(d)
        return allocator.empty(n, dtype).view(shape)

    def pin_empty_like(tensor, device="cpu", dtype=None):
        return allocator.empty(tensor.numel(), dtype or tensor.dtype).view(tensor.shape)

    def is_pinned(tensor):
        return allocator.is_pinned(tensor) or orig_is_pinned(tensor)

    def unpin_memory(tensor):
        # The buffer is unmapped when its last view dies; nothing to do eagerly.
        return None

    for name, fn in (("pin_memory", pin_memory), ("pin_empty", pin_empty), ("pin_empty_like", pin_empty_like),
                     ("is_pinned", is_pinned), ("unpin_memory", unpin_memory)):
        patches.set(acc, name, fn)


def plain_allocator():
    """Aligned, unlocked buffers when the pinned technique is off (O_DIRECT still needs alignment)."""
    from memascend_engine.pinned import PinnedAllocator

    return PinnedAllocator(lock=False, cuda_register=False)
