"""The adaptive parameter pool: DeepSpeed's parameter swapper with size-class slots instead of
``buffer_count x buffer_size`` (deepspeed/runtime/swap_tensor/partitioned_param_swapper.py
AsyncPartitionedParameterSwapper, whose methods the mixins below override one for one; adaptive_param_swapper_class
composes them with DeepSpeed's class after the version check, and the class carries the PluginContext as
``_ma_ctx``). DeepSpeed is imported inside the methods, so importing this module stays cheap."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from memascend_engine.ds_internals.context import PluginContext
from memascend_engine.ds_internals.version import check_version

log = logging.getLogger("memascend_engine")


class OverflowBuffers:
    """Pinned buffers for fetches that find every pool slot taken, kept and reused.

    Allocating one per fetch would mmap + mlock + cudaHostRegister (milliseconds per MiB) and, on
    release, synchronise the device before cudaHostUnregister, on every step. Instead a released
    buffer goes back to a free list and the next overflow takes the smallest free buffer that holds
    it (best fit), so the list grows only to the largest number of overflows live at once.
    Counters: ``pool_overflow_allocations`` (new buffers), ``pool_overflow_reuses``,
    ``pool_overflow_bytes`` (bytes held by the list, free or taken).
    """

    def __init__(self, allocate: Callable[[int], Any], counters: dict):
        self._allocate = allocate  # numel -> 1-D pinned tensor of exactly numel elements
        self._counters = counters
        self._free: list[tuple[int, int]] = []  # (numel, serial), sorted
        self._by_serial: dict[int, Any] = {}
        self._serial_of: dict[int, int] = {}  # id(tensor) -> serial, for the tensors handed out
        self._next = 0

    def take(self, numel: int):
        """A tensor of at least ``numel`` elements (narrow it); a free one when one is large enough."""
        import bisect

        i = bisect.bisect_left(self._free, (int(numel), -1))
        if i < len(self._free):
            _, serial = self._free.pop(i)
            buf = self._by_serial[serial]
            self._counters["pool_overflow_reuses"] += 1
        else:
            buf = self._allocate(int(numel))
            serial, self._next = self._next, self._next + 1
            self._by_serial[serial] = buf
            self._counters["pool_overflow_allocations"] += 1
            self._counters["pool_overflow_bytes"] += buf.numel() * buf.element_size()
        self._serial_of[id(buf)] = serial
        return buf

    def give_back(self, buf) -> None:
        """Return a tensor obtained from :meth:`take` (exactly that object)."""
        import bisect

        serial = self._serial_of.pop(id(buf))
        bisect.insort(self._free, (buf.numel(), serial))

    def drop_free(self) -> None:
        """Forget the free buffers (their memory is released with the last reference)."""
        for numel, serial in self._free:
            buf = self._by_serial.pop(serial)
            self._counters["pool_overflow_bytes"] -= buf.numel() * buf.element_size()
        self._free = []

    @property
    def free_count(self) -> int:
        return len(self._free)


class _AdaptivePool:
    """The pool itself: DeepSpeed's aio set-up without its monolithic buffer, then size classes from the plan."""

    def _configure_aio(self, ds_config):
        import os
        import shutil

        import torch
        from deepspeed import comm as dist
        from deepspeed.runtime.swap_tensor import partitioned_param_swapper as pps

        self.swap_config = ds_config.zero_config.offload_param
        torch_dtype_string = str(self.dtype).split(".")[1]
        self.swap_folder = os.path.join(self.swap_config.nvme_path, "zero_stage_3", f"{torch_dtype_string}params",
                                        f"rank{dist.get_rank()}")
        shutil.rmtree(self.swap_folder, ignore_errors=True)
        os.makedirs(self.swap_folder, exist_ok=True)
        self.swap_element_size = torch.tensor([], dtype=self.dtype).element_size()
        self.aio_config = ds_config.aio_config
        self.use_gds = self.aio_config[pps.AIO_USE_GDS]
        if self.use_gds:
            raise ValueError("memascend adaptive pools stage in host memory; disable aio.use_gds or adaptive_pool")
        self.aio_handle = pps.AsyncIOBuilder().load(verbose=False).aio_handle
        self.min_aio_bytes = max(pps.MIN_AIO_BYTES, self.aio_config[pps.AIO_BLOCK_SIZE])
        iop = self.aio_config[pps.AIO_INTRA_OP_PARALLELISM]
        self.aligned_bytes = pps.AIO_ALIGNED_BYTES * iop
        self.numel_alignment = self.aligned_bytes // self.swap_element_size
        kwargs = {"block_size": self.aio_config[pps.AIO_BLOCK_SIZE], "queue_depth": self.aio_config[pps.AIO_QUEUE_DEPTH],
                  "single_submit": self.aio_config[pps.AIO_SINGLE_SUBMIT],
                  "overlap_events": self.aio_config[pps.AIO_OVERLAP_EVENTS], "intra_op_parallelism": iop}
        self.aio_read_handle = self.aio_handle(**kwargs)
        self.aio_write_handle = self.aio_handle(**kwargs)
        self._ma_init_pool(iop)

    def _ma_init_pool(self, iop: int) -> None:
        """The size-class pool, its overflow list and the bookkeeping that replaces DeepSpeed's buffer ids."""
        import torch

        ctx = self._ma_ctx
        self.buffers = None  # no monolithic pool
        self.pool_tensors = []
        self._free_slots: list[list[int]] = []
        self._overflow = OverflowBuffers(
            lambda n: self.aio_read_handle.new_cpu_locked_tensor(n, torch.empty(0, dtype=self.dtype)), ctx.counters)
        self._iop = iop
        self.pool_plan = None
        self._build_pool(ctx.pool_plan_factory(self.swap_element_size, self.min_aio_bytes, iop))
        self._slot_of: dict[int, tuple] = {}  # ds_id -> (class index, slot index) or ("overflow", tensor)
        self._reserved: list[tuple[int, int]] = []
        self.available_buffer_ids = []  # unused; kept for code that prints it
        self.reserved_buffer_ids = []
        self.swap_out_params = []
        self._kept_master: dict[int, Any] = {}
        ctx.param_swappers.append(self)

    def _build_pool(self, plan) -> None:
        """Allocate the size classes of `plan`; None (no model inventory) defers the pool to the first fetch,
        when every partition of the model has been written (_ensure_pool). Until then, the writes of zero.Init
        take buffers from the overflow list."""
        import torch
        from deepspeed import comm as dist

        if plan is None:
            self.elements_per_buffer = self.param_buffer_count = self.aligned_elements_per_buffer = 0
            return
        self.pool_plan = plan
        # DeepSpeed reads these two for logs and its own buffer_size check.
        self.elements_per_buffer = plan.largest_slot_numel
        self.param_buffer_count = plan.slot_count
        self.aligned_elements_per_buffer = self.elements_per_buffer
        for c in plan.classes:
            pool = self.aio_read_handle.new_cpu_locked_tensor(c.slot_numel * c.slot_count,
                                                              torch.empty(0, dtype=self.dtype))
            self.pool_tensors.append(pool)
            self._free_slots.append(list(range(c.slot_count)))
        if dist.get_rank() == 0:
            log.info("memascend adaptive parameter pool: %s (%.1f MiB)", plan.describe(), plan.total_bytes / 2**20)

    def _ensure_pool(self) -> None:
        """Without a model inventory: size the pool from the real partitions (the largest swapped one) at the
        first fetch, and drop the buffers zero.Init's writes borrowed."""
        if self.pool_plan is not None:
            return
        swapped = [n for n in self.param_id_to_numel.values() if n * self.swap_element_size >= self.min_aio_bytes]
        if not swapped:
            return
        self._overflow.drop_free()
        self._build_pool(self._ma_ctx.pool_plan_factory(self.swap_element_size, self.min_aio_bytes, self._iop,
                                                        largest_partition_numel=max(swapped)))

    def resize_pool(self, plan) -> bool:
        """Replace a pool sized without the model's inventory (_ensure_pool, at a fetch before
        deepspeed.initialize: a weight initialisation under zero.Init) by `plan`, while no partition holds one of
        its slots. Returns whether it did; the old pool is freed with its last view."""
        if self.pool_plan is None or plan is None or plan == self.pool_plan or self._reserved \
                or any(slot[0] != "overflow" for slot in self._slot_of.values()):
            return False
        self.pool_tensors, self._free_slots, self.pool_plan = [], [], None
        self._build_pool(plan)
        return True

    @property
    def pool_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.pool_tensors)


class _Slots:
    """Slots handed to partitions: the smallest class that holds one, else a larger one, else (synchronous fetches
    only) an overflow buffer; DeepSpeed's buffer interface on top of them."""

    def available_swap_in_buffers(self):
        self._ensure_pool()
        return sum(len(f) for f in self._free_slots)

    def _take_slot(self, numel: int, allow_overflow: bool):
        first = self.pool_plan.class_for(numel) if self.pool_plan is not None else None
        if first is not None:
            for ci in range(first, len(self.pool_plan.classes)):
                if self._free_slots[ci]:
                    si = self._free_slots[ci].pop()
                    c = self.pool_plan.classes[ci]
                    view = self.pool_tensors[ci].narrow(0, si * c.slot_numel, c.slot_numel)
                    return (ci, si), view
        if not allow_overflow:
            return None, None
        if self._evict_kept_master():
            return self._take_slot(numel, allow_overflow)
        buf = self._overflow.take(self._io_aligned_numel(numel))
        return ("overflow", buf), buf

    def _assign(self, param, numel: int, allow_overflow: bool):
        param_id = param.ds_id
        assert param_id not in self._slot_of, f"param {param_id} already holds a swap buffer"
        slot, view = self._take_slot(numel, allow_overflow)
        if slot is None:
            return None, None
        self._slot_of[param_id] = slot
        self.param_id_to_numel[param_id] = numel
        swap_buffer = view.narrow(0, 0, self._io_aligned_numel(numel))
        self.param_id_to_swap_buffer[param_id] = swap_buffer
        return swap_buffer.narrow(0, 0, numel), swap_buffer

    def _release_slot(self, param_id) -> bool:
        slot = self._slot_of.pop(param_id, None)
        if slot is None:
            return False
        if slot[0] == "overflow":
            self._overflow.give_back(slot[1])
        else:
            self._free_slots[slot[0]].append(slot[1])
        return True

    def get_buffer(self, param, numel):
        compute, _ = self._assign(param, numel, allow_overflow=True)
        return compute

    def _allocate_and_return_buffers_for_swap_in(self, params):
        compute_buffers, swap_buffers = [], []
        for param in params:
            compute, swap = self._assign(param, self.param_id_to_numel[param.ds_id], allow_overflow=True)
            compute_buffers.append(compute)
            swap_buffers.append(swap)
        return compute_buffers, swap_buffers

    def reserve_available_buffers(self):
        self._ensure_pool()
        buffers = []
        for ci, free in enumerate(self._free_slots):
            c = self.pool_plan.classes[ci]
            for si in free:
                buffers.append(self.pool_tensors[ci].narrow(0, si * c.slot_numel, c.slot_numel))
                self._reserved.append((ci, si))
            free.clear()
        return buffers

    def release_reserved_buffers(self):
        for ci, si in self._reserved:
            self._free_slots[ci].append(si)
        self._reserved = []


class _KeptMasters:
    """Releasing partitions, and keeping some for the overlapped optimizer's fp32 master copy."""

    def _keeps_for_master(self, param) -> bool:
        """Tell the overlapped optimizer the partition is going (ctx.partition_released: it copies the fp32 master
        of the chunks it has started); keep it while a chunk of it has still to start (its gradient comes after
        the release), so the master comes from here instead of the SSD (4 B per parameter less read)."""
        from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus

        ctx = self._ma_ctx
        if ctx.partition_released is None or param.ds_tensor.status != PartitionedParamStatus.AVAILABLE:
            return False
        if not ctx.partition_released(param):
            return False
        self._kept_master[param.ds_id] = param
        return True

    def release_kept_master(self, param) -> None:
        """The overlapped optimizer has the master of every chunk of `param`: drop its kept partition."""
        if self._kept_master.pop(param.ds_id, None) is not None:
            self._release([param])

    def drop_kept(self) -> None:
        """Drop every partition still kept for a master (step(): the speculation is over)."""
        from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus

        kept, self._kept_master = list(self._kept_master.values()), {}
        self._release([p for p in kept if p.ds_tensor.status == PartitionedParamStatus.AVAILABLE])

    def _evict_kept_master(self) -> bool:
        """A fetch finds no free slot: drop the oldest partition kept for a master (its chunks read the master
        from the SSD) rather than allocate beyond the pool."""
        if not self._kept_master:
            return False
        param = self._kept_master.pop(next(iter(self._kept_master)))
        self._ma_ctx.counters["master_partitions_evicted"] += 1
        self._ma_ctx.partition_released(param)  # the chunks started since take their piece now
        self._release([param])
        return True

    def remove_partition_and_release_buffers(self, params):
        self._release([p for p in params if not self._keeps_for_master(p)])

    def _release(self, params):
        from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus

        for param in params:
            param_id = param.ds_id
            if self._release_slot(param_id):
                self.param_id_to_swap_buffer.pop(param_id, None)
                if param_id in self.available_params:
                    self.available_params.remove(param_id)
                    self.available_numel -= self.param_id_to_numel[param_id]
            param.ds_tensor.data = self.invalid_buffer.data
            param.ds_tensor.status = PartitionedParamStatus.NOT_AVAILABLE


class _Reads:
    """Fetches: a prefetch that finds no slot is skipped (the later synchronous fetch reads it)."""

    def swap_in(self, params, async_op=True, swap_in_buffers=None):
        from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus
        from deepspeed.runtime.swap_tensor.utils import swap_in_tensors

        self._ensure_pool()
        assert all(p.ds_tensor.status == PartitionedParamStatus.NOT_AVAILABLE for p in params), \
            "Some params are already available or in flight"
        if swap_in_buffers is None:
            params, compute_buffers, swap_in_buffers = self._ma_take_for_swap_in(params, async_op)
            inflight_numel = sum(t.numel() for t in compute_buffers)
        else:
            inflight_numel = sum(t.numel() for t in swap_in_buffers)
        if params:
            swap_in_tensors(self.aio_read_handle, swap_in_buffers, self._get_swap_paths(params))
            self._update_inflight_swap_in(params, swap_in_buffers, inflight_numel)
        if not async_op:
            self.synchronize_reads()

    def _ma_take_for_swap_in(self, params, async_op: bool):
        """(params that got a buffer, their compute buffers, their swap buffers)."""
        ctx = self._ma_ctx
        taken, compute_buffers, swap_in_buffers = [], [], []
        for param in params:
            if async_op and (param.ds_id in self._slot_of or any(p is param for p in taken)):
                # The prefetch walks the trace, where a parameter can appear twice within the
                # window (e.g. at the end of forward and the start of backward); the larger
                # size-class pool makes that window longer than stock's 5 slots ever were.
                ctx.counters["prefetch_duplicates"] += 1
                continue
            compute, swap = self._assign(param, self.param_id_to_numel[param.ds_id], allow_overflow=not async_op)
            if compute is None:
                ctx.counters["prefetch_skipped"] += 1
                continue  # prefetch only: the synchronous fetch will read it
            taken.append(param)
            compute_buffers.append(compute)
            swap_in_buffers.append(swap)
        return taken, compute_buffers, swap_in_buffers

    def swap_into_buffer(self, param, dest_buffer):
        from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus
        from deepspeed.runtime.swap_tensor.utils import swap_in_tensors

        assert param.ds_tensor.status == PartitionedParamStatus.NOT_AVAILABLE, \
            f"param {param.ds_id} is already available or inflight"
        direct = self.aio_read_handle.is_pinned(dest_buffer) and self._is_io_aligned(dest_buffer.numel())
        if direct:
            swap_in_buffers, inflight_numel = [dest_buffer], dest_buffer.numel()
        else:
            compute, swap = self._assign(param, self.param_id_to_numel[param.ds_id], allow_overflow=True)
            swap_in_buffers, inflight_numel = [swap], compute.numel()
        swap_in_tensors(self.aio_read_handle, swap_in_buffers, self._get_swap_paths([param]))
        self._update_inflight_swap_in([param], swap_in_buffers, inflight_numel)
        self.synchronize_reads()
        if not direct:
            dest_buffer.data.copy_(param.ds_tensor.data)
            self.remove_partition_and_release_buffers([param])


class _PartitionedWrites:
    """The P2 buffer that writes the updated 16-bit partitions, sized for partitions (not full tensors) and, with
    the bounded engine, allocated only if DeepSpeed's own step writes them."""

    def reserve_partitioned_swap_space(self, partition_num_elems):
        from deepspeed import comm as dist

        # DeepSpeed passes the FULL numels of the largest sub-group's params but writes their
        # partitions: size the buffer for the partitions (ceil(numel / world)).
        world = max(1, dist.get_world_size())
        self._p2_numel = sum(self._io_aligned_numel(-(-int(n) // world)) for n in partition_num_elems)
        self.partitioned_swap_buffer = None
        self.partitioned_swap_pool = None
        if self._ma_ctx.windows is None:
            self._allocate_partitioned_swap_buffer()
        # With the bounded engine the optimizer pipeline writes parameters chunk by chunk; the buffer is only
        # allocated if DeepSpeed's own step ends up writing them (the pipeline was not eligible).

    def _allocate_partitioned_swap_buffer(self):
        import torch
        from deepspeed.runtime.swap_tensor.utils import SwapBufferPool

        self.partitioned_swap_buffer = self.aio_write_handle.new_cpu_locked_tensor(
            self._p2_numel, torch.zeros(1, dtype=self.dtype))
        self.partitioned_swap_pool = SwapBufferPool([self.partitioned_swap_buffer], aio_handle=self.aio_write_handle)

    def swap_out_partitioned_params(self, dst_fp16_params, src_fp32_params):
        from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus

        if self.partitioned_swap_pool is None and getattr(self, "_p2_numel", None):
            self._allocate_partitioned_swap_buffer()
        assert self.partitioned_swap_pool is not None, "partitioned swap buffer not initialised"
        paths = self._get_swap_paths(dst_fp16_params, must_exist=True)
        self.synchronize_writes()
        self.partitioned_swap_pool.reset()
        for i, fp32_tensor in enumerate(src_fp32_params):
            aligned = self._io_aligned_numel(fp32_tensor.numel())
            swap_tensor, _ = self.partitioned_swap_pool.insert_tensor(fp32_tensor, paths[i], aligned)
            if swap_tensor is None:
                # Full (a sub-group larger than sized for): write what is staged, then go on.
                self.partitioned_swap_pool.swap_out(self.aio_write_handle)
                self.partitioned_swap_pool.reset()
                swap_tensor, _ = self.partitioned_swap_pool.insert_tensor(fp32_tensor, paths[i], aligned)
                assert swap_tensor is not None, f"partition of {fp32_tensor.numel()} elements exceeds the swap buffer"
            dst_fp16_params[i].ds_tensor.status = PartitionedParamStatus.AVAILABLE
        self.partitioned_swap_pool.swap_out(self.aio_write_handle)
        for param in dst_fp16_params:
            param.ds_tensor.status = PartitionedParamStatus.NOT_AVAILABLE


def adaptive_param_swapper_class(ctx: PluginContext):
    """A subclass of DeepSpeed's AsyncPartitionedParameterSwapper whose pool is size classes, sharing `ctx`.

    Routing: a partition takes a free slot of the smallest class that holds it, else of any larger
    class. A synchronous fetch that finds no slot gets an exact-size overflow buffer from
    :class:`OverflowBuffers` instead of DeepSpeed's "Not enough buffers" assertion; an
    asynchronous prefetch that finds no slot is simply skipped (the later synchronous fetch reads it).
    """
    check_version()
    from deepspeed.runtime.swap_tensor import partitioned_param_swapper as pps

    class AdaptiveParamSwapper(_AdaptivePool, _Slots, _KeptMasters, _Reads, _PartitionedWrites,
                               pps.AsyncPartitionedParameterSwapper):
        _ma_ctx = ctx

    return AdaptiveParamSwapper
