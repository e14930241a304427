"""The bounded engine inside ZeRO-3: gradient streaming and the chunked optimizer pipeline (memascend_engine.bounded,
memascend_engine.optimizer_pipeline) wired into DeepSpeed's stage-3 optimizer.

:class:`BoundedStage3` is a mixin of DeepSpeedZeroOptimizer_Stage3 (stage3.stage3_optimizer_class composes it with
DeepSpeed's class after the version check); the class it is composed into carries the PluginContext as ``_ma_ctx``.
It is made of one small mixin per concern: construction (:class:`_Construction`), gradient streaming in backward
(:class:`_GradientStreaming`), the optimizer overlapped with backward (:class:`_Overlap`), the Adam arithmetic per
chunk (:class:`_ChunkAdam`) and the step (:class:`_Step`). DeepSpeed is imported inside the methods, so importing
this module stays cheap.
"""

from __future__ import annotations

import collections

from memascend_engine.ds_internals.pinning import plain_allocator


class _SwapperFacade:
    """What DeepSpeed's remaining stage-3 code asks of an optimizer swapper when the pipeline owns the state."""

    swap_folder: str = ""
    """DeepSpeed's optimizer swap folder (empty: engine.save_checkpoint copies it, then checkpoint_api.DeepSpeedApi
    writes the state into the copy)."""

    def is_swappable_tensor(self, tensor=None, numel=None):
        return True  # every sub-group lives on the SSD (chunks of the pipeline)

    def init_timers(self):
        pass

    def log_timers(self):
        pass

    def pre_backward(self):
        pass

    def post_backward(self):
        pass

    def purge_state(self):
        raise RuntimeError("memascend's bounded engine keeps optimizer states in its region; DeepSpeed's "
                           "load_checkpoint cannot restore them: use memascend_engine.run_checkpoint (memascend train)")


class _Construction:
    """Eligibility, the pipeline in place of DeepSpeed's optimizer swapper and flat buffers, and where each parameter
    partition lives (the pipeline's targets)."""

    def _ma_eligible(self) -> bool:
        import torch
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        ctx = self._ma_ctx
        return (ctx.windows is not None and ctx.store is not None and isinstance(self.optimizer, DeepSpeedCPUAdam)
                and not getattr(self, "zenflow", False) and not getattr(self, "use_muon", False)
                and getattr(self, "partial_offload", 1.0) == 1.0
                and self.master_weights_and_grads_dtype == torch.float32
                and not getattr(self, "torch_autocast_gradscaler", None))

    def _configure_tensor_swapping(self, offload_optimizer_config, aio_config):
        self._ma_bounded = self._ma_eligible()
        if not self._ma_bounded:
            return super()._configure_tensor_swapping(offload_optimizer_config, aio_config)
        self.optimizer_swapper = _SwapperFacade()
        self.optimizer_swapper.swap_folder = _optimizer_swap_folder(offload_optimizer_config.nvme_path)
        self.optimizer_swapper.numel_alignment = _io_numel_alignment(aio_config, 4)

    def _setup_for_real_optimizer(self):
        if not getattr(self, "_ma_bounded", False):
            return super()._setup_for_real_optimizer()
        from deepspeed import comm as dist
        from memascend_engine import dram_tier

        self._ma_placeholders()
        self._ma_build_pipeline()
        # The DRAM tier (EngineOptions.dram_tier_gib) takes its keys before the pipeline writes its first state.
        dram_tier.assign(self._ma_ctx.store, self._ma_pipeline, self._ma_targets(during_backward=True),
                         overlap=self._ma_spec is not None,
                         grads_reach_ssd=(self._ma_spec is None or self._ma_keeps_grads()
                                          or self.gradient_accumulation_steps > 1))
        dist.barrier()
        self._ma_pipeline.initialize()
        if self._ma_spec is not None and self._ma_pipeline.params_hold_master:
            self._ma_pipeline.prepare_speculation(self._ma_targets(during_backward=True))
        dist.barrier()

    def _ma_placeholders(self) -> None:
        """Empty fp32 placeholders per sub-group, no gradient flat buffer (P5): the pipeline holds the state."""
        import torch
        from deepspeed.accelerator import get_accelerator

        for i, _ in enumerate(self.fp16_partitioned_groups_flat):
            ids = self.fp16_partitioned_groups_flat_id[i]
            placeholder = torch.empty(0, dtype=self.master_weights_and_grads_dtype)
            placeholder.ds_id = f"{ids[0]}_{ids[-1]}"
            placeholder.requires_grad = True
            self.fp32_partitioned_groups_flat.append(placeholder)
        for param_group in self.optimizer.param_groups:
            param_group["params"] = []
        if self.contiguous_gradients:
            for dtype, bucket in self.ipg_buckets.items():
                bucket.buffer = torch.empty(self.reduce_bucket_size, dtype=dtype,
                                            device=get_accelerator().current_device_name())
        self.grad_partitions_flat_buffer = None
        self._DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition = {}

    def _ma_build_pipeline(self) -> None:
        """The gradient stream, the optimizer pipeline over memascend's chunks and, with the overlap, its
        Speculator."""
        import torch
        from memascend_engine import bounded, optimizer_pipeline, overlap

        from memascend_cli.planner import zero

        ctx = self._ma_ctx
        ctx.io = ctx.io or bounded.IOCounters()
        self._ma_stream = bounded.GradientStream(ctx.store, ctx.pinned_allocator or plain_allocator(),
                                                 ctx.windows, ctx.io)
        self._ma_norms = _NormWorker(self._ma_norm, self._ma_stream.host_bytes, ctx.counters)
        parts = [[int(p.ds_numel) for p in group] for group in self.fp16_partitioned_groups]
        self._ma_chunks = zero.optimizer_chunks(parts, ctx.windows.optimizer_chunk_numel)
        grad_keys = [[bounded.GradientStream.key(p.ds_id) for p in group] for group in self.fp16_groups]
        self._ma_pipeline = optimizer_pipeline.OptimizerPipeline(
            ctx.store, ctx.pinned_allocator or plain_allocator(), ctx.windows, self._ma_chunks,
            self._ma_targets(), grad_keys, param_dtype=self.dtype, grad_dtype=self.gradient_accumulation_dtype,
            counters=ctx.io, grad_written=self._ma_stream.written,
            key_prefix=f"{optimizer_pipeline.OPT_PREFIX}{len(ctx.optimizers)}/", moment_bytes=ctx.moment_bytes,
            params_hold_master=ctx.params_hold_master)
        self._ma_overflow_local = False
        self._ma_param_pos = {p.ds_id: (g, j) for g, group in enumerate(self.fp16_groups)
                              for j, p in enumerate(group)}
        self._ma_spec = None
        if ctx.overlap is not None:
            from_params = ctx.master_from_params and (self.dtype == torch.float32 or self._ma_pipeline.split)
            self._ma_spec = overlap.Speculator(self._ma_pipeline, self._ma_targets(during_backward=True),
                                               ctx.overlap, master_from_params=from_params)
            if from_params:
                ctx.partition_released = self._ma_partition_released
        self._ma_spec_inv_scale = None
        self._ma_last_clipped = False

    def _ma_targets(self, *, during_backward: bool = False):
        """targets[g][j](): where parameter j of sub-group g lives now (DeepSpeed can fetch or release it)."""
        return [[self._ma_target_fn(param, self.fp16_partitioned_groups[g][j], during_backward)
                 for j, param in enumerate(group)] for g, group in enumerate(self.fp16_groups)]

    def _ma_target_fn(self, param, partitioned, during_backward: bool):
        from deepspeed.runtime.swap_tensor.partitioned_param_swapper import PartitionedParamStatus
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum
        from memascend_engine.optimizer_pipeline import ParamTarget

        ctx = self._ma_ctx

        def in_memory() -> bool:
            if during_backward:
                # DeepSpeed may still hold a swapped partition in a pool buffer; it drops it unwritten
                # (partition_parameters.py _partition_param: remove_partition_and_release_buffers), so the
                # overlap's update goes to the extent of any partition whose home is the SSD.
                return getattr(partitioned, "final_location", None) != OffloadDeviceEnum.nvme
            # As _partitioned_params_swap_out (stage3.py 1271): an available partition is updated in memory,
            # any other one on the SSD.
            return partitioned.status == PartitionedParamStatus.AVAILABLE

        def resolve() -> ParamTarget:
            if param.nvme_swapper is None or in_memory():
                resident = getattr(partitioned, "final_location", None) != OffloadDeviceEnum.nvme
                return ParamTarget(numel=int(partitioned.ds_numel), tensor=partitioned.data, resident=resident)
            path = param.nvme_swapper.get_path(param, must_exist=True)
            return ParamTarget(numel=int(partitioned.ds_numel), key=ctx.store.key(path))
        return resolve


class _Overlap:
    """The optimizer overlapped with backward (memascend_engine.overlap): when a speculation starts, what it is
    offered, and what may no longer be read once it has used a gradient."""

    def _ma_partition_released(self, param) -> bool:
        """The param swapper drops `param`'s partition: while a step speculates, its chunks take their fp32
        master from it (Speculator.released). Inside the boundary micro-batch's backward (base_optimizer.py
        ZeROOptimizer._backward_active_depth) the speculation starts here, before the first gradient is reduced:
        the last layers' partitions are dropped before their bucket is."""
        pos = self._ma_param_pos.get(param.ds_id)
        if pos is None or self.fp16_groups[pos[0]][pos[1]] is not param:
            return False
        spec = self._ma_spec
        if not spec.active and self._backward_active_depth > 0:
            spec = self._ma_speculation(self.is_gradient_accumulation_boundary())
        return spec is not None and spec.active and spec.released(*pos, param.ds_tensor.data)

    def _ma_offered(self, param) -> None:
        """Every chunk of `param` has its gradient piece (and its master piece, if its partition was kept for
        that): the swapper drops a partition it kept for the speculation."""
        swapper = getattr(param, "nvme_swapper", None)
        if swapper is not None and hasattr(swapper, "release_kept_master"):
            swapper.release_kept_master(param)

    def _ma_speculation(self, boundary: bool):
        """The Speculator when this micro-batch's gradients are final and the step speculates, else None."""
        spec = self._ma_spec
        if spec is None or not boundary or spec.skipped:
            return None
        if not spec.active:
            if self._ma_last_clipped:  # clipping is likely again: a speculation would be redone
                spec.skipped = True
                self._ma_ctx.overlap.steps_not_speculated += 1
                return None
            self._ma_spec_inv_scale, _ = self._ma_inv_scale(None)
            spec.begin(self._ma_adam(self._ma_spec_inv_scale, speculative=True))
        return spec

    def _ma_keeps_grads(self) -> bool:
        """A speculated chunk's gradients are needed again only by a redo: clipping, or fp16's loss scale
        changing at the step."""
        import torch

        return self.clip_grad > 0. or self.dtype == torch.float16

    def _ma_spec_invalidate(self) -> None:
        """Optimizer states or gradients are being set between backward and step() (a checkpoint load, DeepSpeed's
        tensor-fragment setters): step() redoes the step from them instead of committing the speculation."""
        spec = self._ma_spec
        if spec is None or not spec.active:
            return
        if spec.consumed:
            raise RuntimeError("memascend: optimizer state or gradients set between backward and step() while "
                               "the optimizer, overlapped with backward and without gradient clipping, has "
                               "already used and dropped the gradients; set them after step(), or install with "
                               "EngineOptions(overlap_optimizer=False)")
        spec.settle()
        spec.invalidated = True
        self._ma_stream.spill()  # the kept gradients to the SSD first, where a setter may replace them
        self._ma_stream.flush()

    def _ma_check_readable(self, key: str) -> None:
        spec = self._ma_spec
        if spec is not None and key in spec.consumed:
            raise RuntimeError("memascend: this gradient was stepped during backward and dropped (the optimizer "
                               "overlapped with backward, gradient clipping off); read gradients between backward "
                               "and step() with gradient clipping on or EngineOptions(overlap_optimizer=False)")


class _ChunkAdam:
    """DeepSpeed's unscale-and-clip factor and DeepSpeedCPUAdam's update, one chunk at a time."""

    def _ma_inv_scale(self, scaled_norm):
        """(1 / (loss scale x clip factor), whether clipping triggered), as stage3.py unscale_and_clip_grads
        (2979) computes it; `scaled_norm` None: the factor when clipping does not trigger (what a speculation
        assumes)."""
        import torch

        combined, clipped = self.loss_scale, False
        if self.clip_grad > 0.:
            if scaled_norm is None:
                scaled_norm = torch.zeros((), dtype=torch.float32)  # complete_grad_norm_..._cpu_offload's dtype
            clip = ((scaled_norm / self.loss_scale) + 1e-6) / self.clip_grad
            clipped = bool(clip > 1.0)
            clip = torch.clamp(clip, min=1.0)
            combined = clip * self.loss_scale
        inv = 1. / combined
        return (inv.cpu() if torch.is_tensor(inv) else inv), clipped  # the chunk's gradient is in host memory

    def _ma_adam(self, inv_scale, *, speculative: bool):
        """compute(ci, chunk, slot): the DeepSpeedCPUAdam op on one chunk (ops/adam/cpu_adam.py step). A
        speculative call takes the step the commit will count; the op keeps beta^t per step
        (ops/csrc/includes/cpu_adam.h IncrementStep: the same step again leaves it as it is), so a later call of
        the same step, a redo, sees the same bias correction."""
        from memascend_engine.ds_internals.cpu_adam import OpConstants

        inner = self.optimizer
        op = getattr(self, "_ma_adam_op", None)
        if op is None:  # follows the op's step state from its first call on (DeepSpeedCPUAdam.__init__ created it)
            op = self._ma_adam_op = OpConstants(inner.ds_opt_adam, inner.opt_id, inner.defaults["betas"],
                                                inner.adam_w_mode)

        def compute(ci, chunk, slot):
            g = chunk.sub_group
            state = inner.state.setdefault(self.fp32_partitioned_groups_flat[g], {})
            group = inner.param_groups[self.sub_group_to_group_id[g]]
            beta1, beta2 = group["betas"]
            if speculative:
                step = state.get("step", 0) + 1
            else:
                # A sub-group's later chunks see the bias correction its first chunk set, as stock's one call
                # per sub-group did.
                if chunk.index == 0:
                    _count_step(state)
                step = state["step"]
            self._ma_pipeline.rounding_step = step  # 16-bit moments: this step's rounding noise
            args = (inner.opt_id, step, group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                    group["bias_correction"])

            def update(start, count):
                # The op is elementwise: its call on the chunk's last elements steps them as one call over the chunk.
                grad = slot.grad.narrow(0, start, count)
                if scaled:
                    grad.mul_(inv_scale)
                op.call(args, slot.master.narrow(0, start, count), grad, slot.exp_avg.narrow(0, start, count),
                        slot.exp_avg_sq.narrow(0, start, count))
            # The fused pass does not scale the gradient: a scaled step (loss scale, clipping) stays on the op.
            adam = None if scaled else op.constants(args)
            # After backward (not speculative) both cores are free for the pass; a speculation shares them with it.
            self._ma_pipeline.step_in_one_pass(ci, slot, update, adam, threads=1 if speculative else 2)
            counters = self._ma_ctx.counters  # chunks_fused_step also marks the engine's records (the time model)
            counters["chunks_fused_step"] += adam is not None
            counters["fused_step_mismatches"] = op.mismatches

        # x * 1.0 is x bit for bit: no pass over the gradient where nothing scales it (bf16, or no clipping and loss
        # scale 1, or clipping that did not trigger: its factor is the tensor 1.0), and the fused pass steps the chunk.
        scaled = float(inv_scale) != 1.0
        compute.one_pass = True  # the pipeline leaves the widening and join of its reads to step_in_one_pass (one pass)
        return compute

    def _ma_commit_steps(self, done) -> None:
        """Count the step of each sub-group whose first chunk the commit takes (compute did not)."""
        for ci in done:
            chunk = self._ma_chunks[ci]
            if chunk.index == 0:
                _count_step(self.optimizer.state.setdefault(self.fp32_partitioned_groups_flat[chunk.sub_group], {}))


class _GradientStreaming:
    """Backward: each reduced partition to the SSD, with its norm and fp16 overflow scan taken as it streams."""

    def partition_grads(self, params_to_release, grad_partitions):
        if not getattr(self, "_ma_bounded", False):
            return super().partition_grads(params_to_release, grad_partitions)
        from deepspeed.accelerator import get_accelerator

        boundary = self.is_gradient_accumulation_boundary()
        spec = self._ma_speculation(boundary)
        keep_grads = self._ma_keeps_grads()
        for param, grad_partition in zip(params_to_release, grad_partitions):
            contains_real_data = param.partition_numel() * self._get_param_partition_rank(param) < param.ds_numel
            if not contains_real_data:
                param.grad = None
                if spec is not None:
                    spec.offer(*self._ma_param_pos[param.ds_id], None)
                    self._ma_offered(param)
                continue
            self._offload_boundary_param_ids.add(param.ds_id)
            self._ma_stream_partition(param, grad_partition, boundary, spec, keep_grads)
            if not get_accelerator().is_synchronized_device() and param.grad is not None:
                param.grad.record_stream(get_accelerator().current_stream())
            param.grad = None
        return []

    def _ma_stream_partition(self, param, grad_partition, boundary: bool, spec, keep_grads: bool) -> None:
        """One parameter's reduced partition: accumulated onto the micro-batches before it, its norm and overflow
        scan at the boundary, then offered to the speculation, held in DRAM or written to the SSD."""
        import torch
        from memascend_engine import bounded

        key = bounded.GradientStream.key(param.ds_id)
        dtype = self.gradient_accumulation_dtype
        if self.micro_step_id == 0:
            grad = grad_partition.to(dtype)  # stock: grad_buffer.copy_(grad_partition)
        else:
            grad = self._ma_stream.read(key, grad_partition.numel(), dtype, grad_partition.device)
            grad.add_(grad_partition.to(dtype).view(grad.shape))
        written = False
        if boundary:
            if grad.device.type == "cpu":
                # Its norm on the worker thread while backward goes on. Nothing writes to a tensor of our own (a
                # conversion, the sum read back) again; a view of DeepSpeed's reduce bucket, which the next bucket
                # overwrites, is copied first (the same values: the same fp64 norm): into its key where the DRAM tier
                # holds it and no speculation takes it (GradientStream.write; the key is not written again before
                # step() drains the norms), else a clone.
                owned, kept = grad, None
                if grad is grad_partition:
                    if spec is None:
                        kept, written = self._ma_stream.write(key, grad), True
                    owned = grad.clone() if kept is None else kept
                self._ma_norms.submit(self.get_param_id(param), owned, self.norm_for_param_grads)
            else:
                self.norm_for_param_grads[self.get_param_id(param)] = self._ma_norm(grad)
            if self.dtype == torch.float16:
                self._ma_overflow_local |= self._ma_nonfinite(grad)
        if spec is not None:
            fell_back = spec.offer(*self._ma_param_pos[param.ds_id], grad)
            self._ma_offered(param)
            if fell_back:
                self._ma_stream.write(key, grad)  # a chunk of it is stepped after backward
            elif keep_grads:
                self._ma_stream.hold(key, grad)  # for a redo: the DRAM window, else the SSD
            else:
                self._ma_stream.written.pop(key, None)  # its chunks are stepped: no gradient on the SSD
                spec.consumed.add(key)
        elif boundary and not written:
            self._ma_stream.write(key, grad)
        elif not boundary:
            self._ma_stream.hold(key, grad)  # the DRAM accumulation window, else the SSD

    def _ma_norm(self, grad):
        # DeepSpeed's own norm, fp64 a NORM_CHUNK_NUMEL piece at a time instead of 250M elements (a 2 GB
        # temporary for a billion-scale embedding's gradient). Tensors up to that size sum exactly as in stock.
        from memascend_cli.defaults import NORM_CHUNK_NUMEL

        if not self._ma_ctx.bounded_norm:
            return self._constant_buffered_norm2(grad)
        return self._constant_buffered_norm2(grad, NORM_CHUNK_NUMEL)

    def _ma_nonfinite(self, grad) -> bool:
        import torch
        from memascend_engine import native

        ctx = self._ma_ctx
        if grad.device.type == "cpu" and ctx.fused_overflow and grad.dtype in (torch.float16, torch.bfloat16,
                                                                                torch.float32):
            ctx.counters["overflow_scans"] += 1
            ctx.counters["overflow_scan_bytes"] += grad.numel() * grad.element_size()
            return bool(native.has_nonfinite_tensor(grad.contiguous()))
        return bool((~torch.isfinite(grad)).any().item())  # one partition: a bounded temporary

    def _ma_has_overflow(self) -> bool:
        import torch
        from deepspeed import comm as dist
        from deepspeed.accelerator import get_accelerator

        flag = torch.tensor([int(self._ma_overflow_local)], dtype=torch.uint8,
                            device=get_accelerator().current_device_name())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.dp_process_group)
        self._model_parallel_all_reduce(tensor=flag, op=dist.ReduceOp.MAX)
        return bool(flag[0].item())

    def finalize_gradient_accumulation_boundary(self):
        if not getattr(self, "_ma_bounded", False):
            return super().finalize_gradient_accumulation_boundary()
        import torch
        from deepspeed.accelerator import get_accelerator
        from memascend_engine import bounded

        # Unmanaged gradient accumulation (managed_gradient_accumulation=False): step() is the boundary. The
        # accumulated partitions are on the SSD already; take the boundary work partition_grads skipped (norm,
        # fp16 overflow scan) for the parameters reduced in this window (stage3.py
        # _finalize_offload_gradient_accumulation).
        self.set_gradient_accumulation_boundary(True)
        self._ma_stream.spill()
        self._ma_stream.flush()
        dtype = self.gradient_accumulation_dtype
        elem = torch.tensor([], dtype=dtype).element_size()
        for group in self.fp16_groups:
            for param in group:
                key = bounded.GradientStream.key(param.ds_id)
                if param.ds_id not in self._offload_boundary_param_ids or key not in self._ma_stream.written:
                    continue
                grad = self._ma_stream.read(key, self._ma_stream.written[key] // elem, dtype,
                                            get_accelerator().current_device_name())
                self.norm_for_param_grads[self.get_param_id(param)] = self._ma_norm(grad)
                if self.dtype == torch.float16:
                    self._ma_overflow_local |= self._ma_nonfinite(grad)


class _Step:
    """step(): DeepSpeed's overflow, norm and loss-scale logic, then the pipeline over the chunks a speculation has
    not committed (or all of them)."""

    def step(self, closure=None):
        if not getattr(self, "_ma_bounded", False):
            return super().step(closure)
        for swapper in self._ma_ctx.param_swappers:  # a kept partition goes stale once the step writes the parameters
            swapper.drop_kept()
        spec = self._ma_spec if self._ma_spec is not None and self._ma_spec.active else None
        done, rest = spec.finish() if spec is not None else ([], [])
        if self._ma_spec is not None:
            self._ma_spec.skipped = False
        if spec is None:
            self._ma_stream.spill()  # nothing is held at a managed boundary; an unmanaged one spilled already
        self._ma_stream.flush()
        self._ma_norms.drain(self.norm_for_param_grads)
        self._pre_step()
        self._partition_all_parameters()
        skipped, scaled_global_grad_norm = self._ma_norm_or_skip(spec, done)
        if skipped:
            return
        self._global_grad_norm = scaled_global_grad_norm / self.loss_scale
        inv_scale, self._ma_last_clipped = self._ma_inv_scale(scaled_global_grad_norm)
        compute = self._ma_adam(inv_scale, speculative=False)
        if spec is not None and not spec.invalidated and _same_scale(inv_scale, self._ma_spec_inv_scale):
            self._ma_commit_steps(done)
            spec.commit(done)
            self._ma_stream.drop_held()  # the gradients kept for a redo
            self._ma_pipeline.run(compute, chunks=rest)
            self._ma_pipeline.end_step()
        else:
            if spec is not None:  # clipping or a new loss scale: step every chunk from the old states
                self._ma_redo(spec)
            self._ma_pipeline.run(compute)
        self._post_step(set())

    def _ma_norm_or_skip(self, spec, done):
        """DeepSpeed's own overflow, norm and loss-scale logic (stage3.py 2881-2896): (whether the step is skipped,
        the scaled global gradient norm); a skipped step's speculated parameters go back to the old masters."""
        from deepspeed.runtime.zero import stage3

        try:
            self._overflow_check_and_loss_scale_update(update_scale=False)
            scaled_global_grad_norm = None
            if not self.overflow:
                scaled_global_grad_norm = stage3.combine_grad_norm_groups(self._get_norm_groups())
                if stage3.is_invalid_grad_norm(scaled_global_grad_norm):
                    self.overflow = True
            if self._loss_scale_update_and_overflow_cleanup():
                if spec is not None:  # the step is skipped: the parameters back from the old masters
                    back = spec.drop(done)
                    self._ma_stream.drop_held()
                    self._ma_pipeline.run(lambda ci, chunk, slot: None, with_grads=False, writes="params",
                                          chunks=back)
                    self._ma_ctx.overlap.steps_rolled_back += 1
                return True, None
        finally:
            self._ma_overflow_local = False
        return False, scaled_global_grad_norm

    def _ma_redo(self, spec) -> None:
        """Drop a speculation that cannot commit; the kept gradients go to the SSD for the step from the old
        states."""
        spec.drop()
        self._ma_ctx.overlap.steps_redone += 1
        if not self._ma_keeps_grads():
            raise RuntimeError("memascend overlap: a redo without the gradients kept "
                               f"(loss scale {self.loss_scale}, clip {self.clip_grad})")
        self._ma_stream.spill()
        self._ma_stream.flush()


class _NormWorker:
    """DeepSpeed's per-parameter gradient norms (_GradientStreaming._ma_norm) on one worker thread, so that the thread
    driving backward and the SSD does not compute them in turn with everything else (a sampled profile of
    bench-llama-136m's bf16 step at 400 MB/s: 0.9 s of its backward). torch's CPU kernels release the GIL; the worker
    runs the same ops on the same values (OpenMP teams of the same size), so each norm has the same bits. Gradients
    waiting for their norm stay alive: at most `window_bytes` of them (the gradient ring's size) beyond the one
    submitted; step() drains the rest before DeepSpeed sums them."""

    def __init__(self, norm, window_bytes: int, counters: dict):
        self._norm = norm
        self.window_bytes = int(window_bytes)
        self._counters = counters
        self._pool = None
        self._pending: collections.deque = collections.deque()  # (param id, gradient, future), oldest first
        self._bytes = 0

    def submit(self, param_id, grad, into: dict) -> None:
        """Compute `grad`'s norm into `into[param_id]` (DeepSpeed's norm_for_param_grads) by the next drain()."""
        from concurrent.futures import ThreadPoolExecutor

        import torch

        nbytes = grad.numel() * grad.element_size()
        while self._pending and self._bytes + nbytes > self.window_bytes:
            self._take(into)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="memascend-norm")
        self._pending.append((param_id, grad, self._pool.submit(self._on_worker, grad, torch.get_num_threads())))
        self._bytes += nbytes
        self._counters["norms_on_worker"] += 1

    def _on_worker(self, grad, threads: int):
        import torch

        # A reduction's order follows the OpenMP team size, a per-thread setting: the caller's, so the bits match.
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return self._norm(grad)

    def drain(self, into: dict) -> None:
        """Every norm into `into`: the caller takes the newest ones the worker has not started itself, while the
        worker goes on from the oldest (the caller would only wait otherwise)."""
        while self._pending:
            param_id, grad, future = self._pending[-1]
            if not future.cancel():
                self._take(into)  # the worker has reached it: wait from the oldest
                continue
            self._pending.pop()
            self._bytes -= grad.numel() * grad.element_size()
            into[param_id] = self._norm(grad)

    def _take(self, into: dict) -> None:
        param_id, grad, future = self._pending.popleft()
        self._bytes -= grad.numel() * grad.element_size()
        into[param_id] = future.result()


class BoundedStage3(_Construction, _GradientStreaming, _Overlap, _ChunkAdam, _Step):
    """Gradient streaming and the chunked optimizer pipeline inside ZeRO-3.

    Active when ctx.windows is set, a region store is open, the optimizer is DeepSpeedCPUAdam on NVMe with fp32
    master weights, and no ZenFlow / Muon / partial offload / torch-autocast path is in use; otherwise every method
    falls through to DeepSpeed's. What it replaces, each mirroring DeepSpeed 0.19.8's arithmetic so per-step losses
    equal the stock path (runtime/zero/stage3.py line numbers):

    * _configure_tensor_swapping (839): no OptimizerSwapper and no swap pool; the pipeline's slots are the pool;
    * _setup_for_real_optimizer (761): fp32 placeholders per sub-group, no gradient flat buffer (P5), no
      initialize_optimizer_states gradient buffer; fp32 masters created chunk by chunk on the SSD;
    * partition_grads (2006): each reduced partition to the SSD in the gradient dtype, its norm (1446; fp64 in
      pieces of NORM_CHUNK_NUMEL, not _constant_buffered_norm2's 250M; on a worker thread, _NormWorker) and fp16
      overflow scan taken as it streams; micro-batches accumulate by reading the partition back;
    * step (2873): DeepSpeed's overflow / norm / loss-scale logic, then the pipeline over chunks with the same
      unscale-and-clip (2979) and the same DeepSpeedCPUAdam op calls (ops/adam/cpu_adam.py step) per chunk.
    """


def _count_step(state: dict) -> None:
    """One more Adam step of a sub-group, as DeepSpeedCPUAdam.step counts it (ops/adam/cpu_adam.py)."""
    if len(state) == 0:
        state["step"] = 0
    state["step"] += 1


def _same_scale(a, b) -> bool:
    """The two unscale factors are the same number of the same type (a committed speculation is then bit-exact)."""
    import torch

    if torch.is_tensor(a) != torch.is_tensor(b):
        return False
    if torch.is_tensor(a):
        return a.dtype == b.dtype and bool(torch.equal(a, b))
    return a == b


def _optimizer_swap_folder(nvme_path) -> str:
    """DeepSpeed's optimizer swap folder of this rank (stage3.py _configure_tensor_swapping, optimizer_utils.py
    OptimizerSwapper.__init__), created as DeepSpeed does."""
    import os

    from deepspeed import comm as dist

    folder = os.path.join(str(nvme_path), "zero_stage_3", "optimizer", f"rank{dist.get_rank()}")
    os.makedirs(folder, exist_ok=True)
    return folder


def _io_numel_alignment(aio_config, elem_bytes: int) -> int:
    """DeepSpeed's swap-file length granularity in elements (AIO_ALIGNED_BYTES x intra_op_parallelism)."""
    from deepspeed.runtime.swap_tensor.constants import AIO_INTRA_OP_PARALLELISM
    from deepspeed.runtime.swap_tensor.utils import AIO_ALIGNED_BYTES

    return AIO_ALIGNED_BYTES * int(aio_config[AIO_INTRA_OP_PARALLELISM]) // elem_bytes
