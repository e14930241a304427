"""The swappers' AsyncIOBuilder: Direct NVMe handles, or DeepSpeed's aio op with exact-size locked buffers.

DeepSpeed's three swapper modules each import AsyncIOBuilder as a module global and call it when a swapper is built
(deepspeed/runtime/swap_tensor/partitioned_param_swapper.py, partitioned_optimizer_swapper.py,
pipelined_optimizer_swapper.py); replacing that global is the whole plug-in point.
"""

from __future__ import annotations

from memascend_engine.ds_internals.patches import Patches
from memascend_engine.ds_internals.version import check_version

SWAPPER_MODULES = (
    "deepspeed.runtime.swap_tensor.partitioned_param_swapper",
    "deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper",
    "deepspeed.runtime.swap_tensor.pipelined_optimizer_swapper",
)


def patch_aio_builders(patches: Patches, builder) -> None:
    """Make the three swapper modules build Direct NVMe handles (GDS is left alone: it stages in GPU memory)."""
    import importlib

    check_version()
    for mod_name in SWAPPER_MODULES:
        mod = importlib.import_module(mod_name)
        if not hasattr(mod, "AsyncIOBuilder"):
            raise RuntimeError(f"{mod_name} has no AsyncIOBuilder global; this DeepSpeed version is not supported")
        patches.set(mod, "AsyncIOBuilder", builder)


def pinning_aio_builder(allocator):
    """DeepSpeed's own aio op, but its locked tensors come from the exact-size CUDA-registered
    allocator (used when Direct NVMe is off on a CUDA machine: the aio op then sees
    ``tensor.is_pinned()`` and needs no bounce buffer)."""
    check_version()
    from deepspeed.ops.op_builder import AsyncIOBuilder

    class _Handle:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def new_cpu_locked_tensor(self, num_elem, example_tensor):
            return allocator.empty(int(num_elem), example_tensor.dtype)

        def free_cpu_locked_tensor(self, tensor):
            return True

        def is_pinned(self, tensor):
            return allocator.is_pinned(tensor) or self._inner.is_pinned(tensor)

    class _Op:
        def __init__(self, op):
            self._op = op

        def aio_handle(self, *args, **kwargs):
            return _Handle(self._op.aio_handle(*args, **kwargs))

    class _Builder:
        def __call__(self):
            return self

        def load(self, verbose=True):
            return _Op(AsyncIOBuilder().load(verbose=verbose))

        def is_compatible(self, verbose=False):
            return AsyncIOBuilder().is_compatible(verbose)

    return _Builder()
