"""The ZeRO-3 optimizer subclass (deepspeed/runtime/zero/stage3.py DeepSpeedZeroOptimizer_Stage3) with the engine's
optimizer-side techniques, the patch that installs it, and the pool sizes the engine reports."""

from __future__ import annotations

from memascend_engine.ds_internals.bounded_stage3 import BoundedStage3
from memascend_engine.ds_internals.checkpoint_api import DeepSpeedApi
from memascend_engine.ds_internals.context import PluginContext
from memascend_engine.ds_internals.patches import Patches
from memascend_engine.ds_internals.swapper import adaptive_param_swapper_class
from memascend_engine.ds_internals.version import check_version


class _OptimizerTechniques:
    """The engine's optimizer-side techniques on DeepSpeed's own stage-3 path (either engine mode): the gradient flat
    buffer allocated pinned in place, the fused overflow scan, malloc_trim after backward and CPU-Adam's states
    created in place. The class it is composed into carries the PluginContext as ``_ma_ctx``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ma_ctx.optimizers.append(self)

    def initialize_optimizer_states(self):
        super().initialize_optimizer_states()
        # The next CPU torch.zeros of the full partition size in _setup_for_real_optimizer is
        # the gradient flat buffer (P5); see _setup_for_real_optimizer below.
        self._memascend_grad_buffer_armed = True

    def _setup_for_real_optimizer(self):
        import torch
        from deepspeed.runtime.zero import stage3

        ctx = self._ma_ctx
        alloc = ctx.pinned_allocator
        if alloc is None or not self.offload_optimizer_pin_memory or torch.device(self.device).type != "cpu":
            return super()._setup_for_real_optimizer()
        # Stock: torch.zeros(Ns) (every page touched) then pin_memory() copies it into a second
        # Ns buffer -> a 2 x Ns transient at init. Allocate the pinned buffer directly instead
        # (mmap pages are zero already); accelerator.pin_memory then returns it as is.
        expected = sum(p.partition_numel() for group in self.fp16_groups for p in group)
        real_torch = stage3.torch
        optimizer = self

        class _TorchProxy:
            def __getattr__(self, name):
                return getattr(real_torch, name)

            def zeros(self, *size, dtype=None, device=None, **kwargs):
                numel = size[0] if len(size) == 1 and isinstance(size[0], int) else None
                if (getattr(optimizer, "_memascend_grad_buffer_armed", False) and numel == expected
                        and not kwargs and real_torch.device(device or "cpu").type == "cpu"):
                    optimizer._memascend_grad_buffer_armed = False
                    ctx.counters["grad_buffer_in_place"] += 1
                    return alloc.empty(numel, dtype or real_torch.get_default_dtype())
                return real_torch.zeros(*size, dtype=dtype, device=device, **kwargs)

        self._memascend_grad_buffer_armed = False
        stage3.torch = _TorchProxy()
        try:
            super()._setup_for_real_optimizer()
        finally:
            stage3.torch = real_torch
            self._memascend_grad_buffer_armed = False

    def has_overflow(self, partition_gradients=True):
        import torch
        from deepspeed import comm as dist
        from deepspeed.accelerator import get_accelerator
        from memascend_engine import native

        if getattr(self, "_ma_bounded", False):
            return self._ma_has_overflow()
        ctx = self._ma_ctx
        buf = getattr(self, "grad_partitions_flat_buffer", None)
        if not (ctx.fused_overflow and partition_gradients and buf is not None and buf.device.type == "cpu"
                and buf.is_contiguous() and buf.dtype in (torch.float16, torch.bfloat16, torch.float32)):
            return super().has_overflow(partition_gradients)
        # One multi-threaded pass over the raw bits, no per-element temporaries (stock:
        # torch.isinf + torch.isnan materialise ~3 B/element on fp16, stage3.py has_overflow 3009-3017).
        local = native.has_nonfinite_tensor(buf)
        ctx.counters["overflow_scans"] += 1
        ctx.counters["overflow_scan_bytes"] += buf.numel() * buf.element_size()
        self.inf_or_nan_tracker.zero_()
        overflow_gpu = torch.tensor([int(local)], dtype=torch.uint8, device=get_accelerator().current_device_name())
        dist.all_reduce(overflow_gpu, op=dist.ReduceOp.MAX, group=self.dp_process_group)
        self._model_parallel_all_reduce(tensor=overflow_gpu, op=dist.ReduceOp.MAX)
        return bool(overflow_gpu[0].item())

    def backward_epilogue(self):
        super().backward_epilogue()
        if getattr(self, "_ma_bounded", False):
            self._ma_stream.flush()
        if self._ma_ctx.malloc_trim:
            self._ma_ctx.trim_heap()

    def _optimizer_states_and_gradient_swap_in(self, sub_group_id, timer_names=None):
        if self._ma_ctx.adam_in_place and not getattr(self, "_ma_bounded", False):
            self._memascend_seed_adam_states(sub_group_id)
        return super()._optimizer_states_and_gradient_swap_in(sub_group_id, timer_names)

    def _memascend_seed_adam_states(self, sub_group_id) -> None:
        """Create CPU-Adam's exp_avg / exp_avg_sq directly in the pinned swap buffers.

        Stock CPU Adam allocates them with zeros_like on the first step (8 B x sub-group,
        unpinned) and the swapper then copies them out through its pinned pool. Seeding the
        state with stride-0 placeholders of the right numel makes the swapper give them pool
        buffers on swap-in; their two swap keys are declared zero in the Direct NVMe store, so
        they read as exactly the value zeros_like would have produced, and ``step`` starts at 0
        as in stock.
        """
        import torch
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        opt = self.optimizer
        if not isinstance(opt, DeepSpeedCPUAdam) or self.optimizer_swapper is None:
            return
        fp32 = self.fp32_partitioned_groups_flat[sub_group_id]
        if len(opt.state.get(fp32, {})) != 0:
            return
        numel = int(self.fp16_partitioned_groups_flat_numel[sub_group_id])
        state_dtype = torch.float if getattr(opt, "fp32_optimizer_states", True) else fp32.dtype
        placeholders = [torch.zeros(1, dtype=state_dtype).expand(numel) for _ in range(2)]
        if not all(self.optimizer_swapper.is_swappable_tensor(tensor=p) for p in placeholders):
            return
        opt.state[fp32] = {"step": 0, "exp_avg": placeholders[0], "exp_avg_sq": placeholders[1]}
        self._ma_ctx.counters["adam_states_in_place"] += 1
        self._memascend_declare_zero_states(fp32, numel, placeholders)

    def _memascend_declare_zero_states(self, fp32, numel: int, placeholders) -> None:
        """Tell the store that exactly these two swap keys start as zeros: any other read of a
        key never written is an error there (optimizer_utils.py OptimizerStateSwapInfo paths)."""
        declare_zero = self._ma_ctx.declare_zero
        if declare_zero is None:
            return
        sw = self.optimizer_swapper
        info = sw._get_param_swap_info(fp32)  # registers the placeholders' swap paths, as swap-in would
        nbytes = sw._io_aligned_numel(numel) * sw.swap_element_size
        for t in info.tensors if info is not None else []:
            if any(t.compute_tensor is p for p in placeholders):
                declare_zero(t.swap_path, nbytes)


def stage3_optimizer_class(ctx: PluginContext):
    """A subclass of DeepSpeedZeroOptimizer_Stage3 with the engine's optimizer-side techniques (this module's
    _OptimizerTechniques), DeepSpeed's checkpoint API on region state (checkpoint_api.DeepSpeedApi) and the bounded
    engine (bounded_stage3.BoundedStage3), sharing `ctx`."""
    check_version()
    from deepspeed.runtime.zero import stage3

    class MemAscendStage3(_OptimizerTechniques, DeepSpeedApi, BoundedStage3, stage3.DeepSpeedZeroOptimizer_Stage3):
        _ma_ctx = ctx

    return MemAscendStage3


def patch_stage3(patches: Patches, ctx: PluginContext, *, adaptive_pool: bool) -> None:
    """Install the optimizer subclass (the engine imports the class lazily from the stage3 module)
    and, with ``adaptive_pool``, the adaptive parameter swapper."""
    check_version()
    from deepspeed.runtime.zero import partition_parameters, stage3

    for owner, name in ((stage3, "DeepSpeedZeroOptimizer_Stage3"),
                        (partition_parameters, "AsyncPartitionedParameterSwapper")):
        if not hasattr(owner, name):
            raise RuntimeError(f"{owner.__name__}.{name} is missing; this DeepSpeed version is not supported")
    patches.set(stage3, "DeepSpeedZeroOptimizer_Stage3", stage3_optimizer_class(ctx))
    if adaptive_pool:
        patches.set(partition_parameters, "AsyncPartitionedParameterSwapper", adaptive_param_swapper_class(ctx))
    keep_explicit_init_dtype(patches)


def keep_explicit_init_dtype(patches: Patches) -> None:
    """zero.Init keeps the dtype it is given. DeepSpeed's Init._set_dtype (partition_parameters.py:409-410) reads
    `dtype or torch.float16 if fp16 supported else torch.bfloat16 if ...`, which binds as a conditional around
    `dtype or torch.float16`: on a CPU without oneDNN fp16 (an AMD EPYC VM: avx512_bf16, no avx512_fp16) a given
    dtype is dropped for bf16. Stage 3 passes its optimizer's dtype when it converts a model built outside zero.Init
    (parameter_offload.py:270 _convert_to_zero_parameters), so an fp32 model got bf16 partitions and its first
    forward failed ("expected m1 and m2 to have the same dtype")."""
    check_version()
    from deepspeed.runtime.zero import partition_parameters

    stock = partition_parameters.Init._set_dtype

    def _set_dtype(self, ds_config, dtype):
        stock(self, ds_config, dtype)
        if dtype is not None:
            self.dtype = dtype

    patches.set(partition_parameters.Init, "_set_dtype", _set_dtype)


def cache_cpu_device_count(patches: Patches) -> None:
    """The CPU accelerator's device_count() once per process: stage 3 asks it at every gradient bucket it reduces
    (stage3.py __avg_scatter_grads), and without DeepSpeed's launcher (LOCAL_SIZE unset: torchrun, a plain python)
    each call forks `numactl --hardware` (utils/numa.py get_numa_cores; ~1.5 ms from a 1 GB process, 0.1-0.2 s of
    bench-llama-136m's backward a step). The node's NUMA layout does not change during a run."""
    check_version()
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.device_name() != "cpu":
        return
    count = acc.device_count()
    patches.set(acc, "device_count", lambda: count)


def single_rank_reduce_scatter(patches: Patches) -> None:
    """Stage 3's gradient reduce-scatter, where its group is this rank alone, hands back the gradients themselves:
    DeepSpeed's reduce_scatter_coalesced (runtime/comm/coalesced_collectives.py) concatenates the bucket's gradients
    into a new buffer, divides it by the world size (1) and reduce-scatters it onto itself, three passes over every
    gradient (0.15-0.3 s of bench-llama-136m's backward a step in a sampled profile, contended) that leave each value
    as it was (x / 1 is x). A group of several ranks takes DeepSpeed's path."""
    check_version()
    from deepspeed import comm as dist
    from deepspeed.runtime.zero import stage3

    stock = stage3.reduce_scatter_coalesced

    def reduce_scatter_coalesced(tensors, group=None):
        if dist.get_world_size(group) != 1:
            return stock(tensors, group)
        return [t.view(-1) for t in tensors]

    patches.set(stage3, "reduce_scatter_coalesced", reduce_scatter_coalesced)


def optimizer_pool_bytes(ctx: PluginContext) -> int:
    """Host bytes of the live optimizer swap pools."""
    total = 0
    for opt in ctx.optimizers:
        sw = getattr(opt, "optimizer_swapper", None)
        mgr = getattr(sw, "swap_buffer_manager", None)
        for b in getattr(mgr, "all_buffers", []) or []:
            total += b.numel() * b.element_size()
    return total


def partitioned_swap_buffer_bytes(ctx: PluginContext) -> int:
    """Host bytes of the P2 buffers (fp16 params written back after each sub-group step)."""
    total = 0
    for sw in ctx.param_swappers:
        b = getattr(sw, "partitioned_swap_buffer", None)
        if b is not None:
            total += b.numel() * b.element_size()
    return total


def param_pool_bytes(ctx: PluginContext) -> int:
    """Host bytes of the adaptive parameter pools."""
    return sum(getattr(sw, "pool_bytes", 0) for sw in ctx.param_swappers)


def bounded_stats(ctx: PluginContext) -> dict | None:
    """The bounded engine's host windows of the first optimizer that runs it, None when none does."""
    opt = next((o for o in ctx.optimizers if getattr(o, "_ma_bounded", False)), None)
    if opt is None:
        return None
    return {"gradient_window_bytes": opt._ma_stream.host_bytes,
            "accumulation_window_bytes": opt._ma_stream.window_bytes,
            "optimizer_window_bytes": opt._ma_pipeline.host_bytes,
            "chunks": len(opt._ma_chunks), "windows": ctx.windows.to_dict(),
            "master_split": opt._ma_pipeline.split}
