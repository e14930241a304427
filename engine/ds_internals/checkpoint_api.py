"""DeepSpeed's own APIs on state the engine keeps in the region: engine.save_checkpoint / load_checkpoint and the
tensor-fragment accessors (deepspeed.utils.safe_get_full_fp32_param & co.)."""

from __future__ import annotations

from memascend_engine.ds_internals.optimizer_state import ADAM_STATES, EngineRef, OptimizerStateAccess, prime_cpu_adam
from memascend_engine.ds_internals.patches import Patches
from memascend_engine.ds_internals.version import check_version

from memascend_cli.errors import MemascendError


class DeepSpeedApiRefused(MemascendError, RuntimeError):
    """A DeepSpeed call that cannot see the engine's state and would give a silently partial answer."""


_OWN_CHECKPOINTS = ("save and load with engine.save_checkpoint(dir) / engine.load_checkpoint(dir) (optimizer states "
                    "included), or memascend_engine.run_checkpoint.save/load (what `memascend train` does)")


class _Checkpoints:
    """engine.save_checkpoint / load_checkpoint with the optimizer's state in the region, and stock's loads
    with parameters on NVMe."""

    _ma_api = True
    _ma_ckpt = None
    """("save" | "load", this rank's offloaded_tensors folder) while engine.save/load_checkpoint runs."""

    def state_dict(self):
        if self.swap_optimizer and self._ma_ckpt is None:
            raise DeepSpeedApiRefused("the optimizer's fp32 masters and Adam states are on the SSD: "
                                      "optimizer.state_dict() would leave them out", _OWN_CHECKPOINTS)
        return super().state_dict()

    def checkpoint_event_epilogue(self):
        from memascend_engine.ds_internals import checkpoint_files

        if self._ma_ckpt is not None and self._ma_ckpt[0] == "save" and self.swap_optimizer:
            checkpoint_files.export_rank(OptimizerStateAccess(EngineRef(self)), self._ma_ckpt[1],
                                      numel_alignment=self.optimizer_swapper.numel_alignment)
        super().checkpoint_event_epilogue()

    def load_state_dict(self, state_dict_list, load_optimizer_states=True, load_from_fp32_weights=False,
                        checkpoint_folder=None, load_serial=None, param_shapes=None):
        if not self.swap_optimizer:
            return super().load_state_dict(state_dict_list, load_optimizer_states=load_optimizer_states,
                                           load_from_fp32_weights=load_from_fp32_weights,
                                           checkpoint_folder=checkpoint_folder, load_serial=load_serial,
                                           param_shapes=param_shapes)
        from deepspeed import comm as dist
        from deepspeed.checkpoint.constants import LOSS_SCALER, OPTIMIZER_STATE_DICT
        from memascend_engine.ds_internals import checkpoint_files

        if self._ma_ckpt is None or self._ma_ckpt[0] != "load" or checkpoint_folder or not load_optimizer_states:
            raise DeepSpeedApiRefused("the optimizer's fp32 masters and Adam states are on the SSD: "
                                      "optimizer.load_state_dict() alone cannot restore them", _OWN_CHECKPOINTS)
        rank = dist.get_rank(group=self.dp_process_group)
        sd = state_dict_list[rank]
        self.loss_scaler = sd[LOSS_SCALER]
        self.dynamic_loss_scale = sd["dynamic_loss_scale"]
        self.overflow = sd["overflow"]
        for group, saved in zip(self.optimizer.param_groups, sd[OPTIMIZER_STATE_DICT]["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})
        steps = checkpoint_files.import_rank(OptimizerStateAccess(EngineRef(self)), self._ma_ckpt[1])
        known = [s for s in steps if s is not None]
        if known:
            prime_cpu_adam(EngineRef(self), max(known))
        if load_serial is not None:  # as stage3.py load_state_dict: wake the next rank
            load_serial += 1
            if dist.get_local_rank() != dist.get_world_size() - 1:
                dist.send(tensor=load_serial, dst=rank + 1)
        if len(self.persistent_parameters) > 0:
            self.persistent_parameters[0].partition(self.persistent_parameters)

    def _rigid_load_state_dict(self, state_dict, load_optimizer_states=True):
        if self.swap_optimizer or all(f is not None for f in self.fp16_partitioned_groups_flat):
            return super()._rigid_load_state_dict(state_dict, load_optimizer_states)
        from deepspeed.checkpoint.constants import FP32_FLAT_GROUPS, LOSS_SCALER, OPTIMIZER_STATE_DICT

        # stage3.py _rigid_load_state_dict, except that the 16-bit partitions are written from the restored
        # masters as step() writes them (sub-groups on NVMe have no CPU flat buffer).
        self.loss_scaler = state_dict[LOSS_SCALER]
        self.dynamic_loss_scale = state_dict["dynamic_loss_scale"]
        self.overflow = state_dict["overflow"]
        saved_groups = state_dict.get("ds_zero_partition_groups")
        if saved_groups is not None and saved_groups != self._zero3_partition_group_metadata():
            raise RuntimeError("AutoEP ZeRO-3 checkpoints can only be loaded with the same parameter placement "
                               "topology in this release.")
        if load_optimizer_states:
            self._set_fp32_optimizer_param_groups()
            self.optimizer.load_state_dict(state_dict[OPTIMIZER_STATE_DICT])
            self._clear_fp32_optimizer_param_groups()
        for current, saved in zip(self.fp32_partitioned_groups_flat, state_dict[FP32_FLAT_GROUPS]):
            current.data.copy_(saved.data)
        for i in range(len(self.fp32_partitioned_groups_flat)):
            self._reassign_or_swap_out_partitioned_parameters(i)

    def _restore_from_bit16_weights(self):
        if self.swap_optimizer:
            raise DeepSpeedApiRefused("the checkpoint holds no optimizer state, and refreshing fp32 masters on "
                                      "the SSD from the 16-bit weights is not supported", _OWN_CHECKPOINTS)
        if all(f is not None for f in self.fp16_partitioned_groups_flat):
            return super()._restore_from_bit16_weights()
        for i, (fp16, fp32) in enumerate(zip(self.fp16_partitioned_groups_flat,
                                             self.fp32_partitioned_groups_flat)):
            if fp16 is None:
                self._swap_in_sub_group_to_flat_buffer(fp32, i)
            else:
                fp32.data.copy_(fp16.data)


class _TensorFragments:
    """DeepSpeed's four swap steps of a sub-group (what its tensor-fragment accessors call) on the bounded engine's
    chunks and streamed gradients."""

    def _optimizer_states_and_gradient_swap_in(self, sub_group_id, timer_names=None):
        if not getattr(self, "_ma_bounded", False):
            return super()._optimizer_states_and_gradient_swap_in(sub_group_id, timer_names)
        import torch

        g = sub_group_id
        fp32 = self.fp32_partitioned_groups_flat[g]
        n = int(self.fp16_partitioned_groups_flat_numel[g])
        master = torch.empty(n, dtype=torch.float32)
        moments = {}
        for ci, off in self._ma_subgroup_chunks(g):
            st = self._ma_pipeline.read_state(ci)
            m = int(self._ma_chunks[ci].numel)
            master.narrow(0, off, m).copy_(st["fp32"])
            for name in ADAM_STATES:
                if name in st:
                    moments.setdefault(name, torch.zeros(n, dtype=torch.float32)).narrow(0, off, m).copy_(st[name])
        fp32.data = master
        self.optimizer.state.setdefault(fp32, {}).update(moments)
        self._ma_stream.spill()  # a save between micro-batches: the held running sums are read below
        self._ma_stream.flush()
        grad = torch.zeros(n, dtype=torch.float32)
        elem = torch.tensor([], dtype=self.gradient_accumulation_dtype).element_size()
        for key, off, count in self._ma_subgroup_grads(g):
            self._ma_check_readable(key)
            if key in self._ma_stream.written:
                written = self._ma_stream.written[key] // elem
                grad.narrow(0, off, written).copy_(self._ma_stream.read(key, written,
                                                                        self.gradient_accumulation_dtype, "cpu"))
        fp32.grad = grad

    def _optimizer_states_and_gradient_swap_out(self, sub_group_id, timer_names=None):
        if not getattr(self, "_ma_bounded", False):
            return super()._optimizer_states_and_gradient_swap_out(sub_group_id, timer_names)
        self._ma_write_back(sub_group_id, state=True, grads=False)

    def _release_swap_buffers(self, sub_group_id):
        if not getattr(self, "_ma_bounded", False):
            return super()._release_swap_buffers(sub_group_id)
        self._ma_release(sub_group_id)

    def _writeback_swap_state(self, sub_group_id, write_opt_state, write_gradients):
        if not getattr(self, "_ma_bounded", False):
            return super()._writeback_swap_state(sub_group_id, write_opt_state, write_gradients)
        self._ma_write_back(sub_group_id, state=write_opt_state, grads=write_gradients)

    def _ma_subgroup_chunks(self, g: int):
        """(chunk index, element offset inside sub-group g) of g's chunks."""
        off = 0
        for ci, chunk in enumerate(self._ma_chunks):
            if chunk.sub_group == g:
                yield ci, off
                off += int(chunk.numel)

    def _ma_subgroup_grads(self, g: int):
        """(gradient key, offset inside sub-group g, partition numel) of g's parameters (grad_position order)."""
        from memascend_engine import bounded

        off = 0
        for param, part in zip(self.fp16_groups[g], self.fp16_partitioned_groups[g]):
            yield bounded.GradientStream.key(param.ds_id), off, int(part.ds_numel)
            off += int(part.ds_numel)

    def _ma_write_back(self, g: int, *, state: bool, grads: bool) -> None:
        fp32 = self.fp32_partitioned_groups_flat[g]
        if state or (grads and fp32.grad is not None):
            self._ma_spec_invalidate()
        if state:
            st = self.optimizer.state.get(fp32, {})
            for ci, off in self._ma_subgroup_chunks(g):
                m = int(self._ma_chunks[ci].numel)
                tensors = {"fp32": fp32.data.narrow(0, off, m)}
                if all(name in st for name in ADAM_STATES):
                    tensors.update({name: st[name].narrow(0, off, m) for name in ADAM_STATES})
                self._ma_pipeline.write_state(ci, tensors, params=False)
        if grads and fp32.grad is not None:
            for key, off, count in self._ma_subgroup_grads(g):
                self._ma_stream.write(key, fp32.grad.narrow(0, off, count).to(self.gradient_accumulation_dtype))
            self._ma_stream.flush()
        self._ma_release(g)

    def _ma_release(self, g: int) -> None:
        import torch

        fp32 = self.fp32_partitioned_groups_flat[g]
        fp32.data = torch.empty(0, dtype=fp32.dtype)
        fp32.grad = None
        st = self.optimizer.state.get(fp32, {})
        for name in ADAM_STATES:
            st.pop(name, None)


class DeepSpeedApi(_Checkpoints, _TensorFragments):
    """DeepSpeed's checkpoint and tensor-fragment APIs on a memascend ZeRO-3 optimizer (either engine mode): a mixin
    of DeepSpeedZeroOptimizer_Stage3 (stage3.stage3_optimizer_class composes it after the version check).

    Checkpoints (with patch_checkpoint_api, which tells the optimizer where DeepSpeed puts this rank's files):

    * save: DeepSpeed writes optim_states.pt (loss scaler, step counts, learning rates) and copies the optimizer swap
      folder, which holds no state with Direct NVMe (engine.py save_checkpoint); the epilogue then writes every
      sub-group's fp32 master and Adam moments from the region into that copy, in DeepSpeed's file names
      (checkpoint_files), before DeepSpeed writes `latest`. ``state_dict()`` outside save_checkpoint
      is refused while the optimizer is on NVMe (it would leave the region's state out).
    * load: DeepSpeed's in-memory ZeRO-3 branch hands this rank's optim_states.pt to ``load_state_dict``, which restores
      the loss scaler and hyperparameters, writes the files back into the region with their checksums checked and
      replays CPU-Adam's step counter (prime_cpu_adam) so the next steps equal an uninterrupted run.
    * parameters on NVMe (max_in_cpu 0) with the optimizer in memory: stock's ``_rigid_load_state_dict`` and
      ``_restore_from_bit16_weights`` touch the CPU flat buffer those sub-groups do not have (AttributeError on None);
      here such sub-groups go through DeepSpeed's own swap-out / swap-in of their partitions.

    Tensor fragments with the bounded engine: DeepSpeed's accessors swap a sub-group in, read or write a slice and
    swap it out (stage3.py get_full_hp_param & co.); the four swap steps do that with the sub-group's chunks and
    streamed gradients (a set gradient is stored in the gradient dtype, as the stream keeps it).
    """


def patch_checkpoint_api(patches: Patches) -> None:
    """engine.save_checkpoint / load_checkpoint of engines with a memascend optimizer (others are untouched).

    Both tell the optimizer this rank's ``<dir>/<tag>/offloaded_tensors/rank<R>`` folder, named as engine.py does.
    With the optimizer on NVMe, load refuses at once what cannot be exact (load_module_only, load_optimizer_states=False,
    universal checkpoints) and takes DeepSpeed's in-memory ZeRO-3 branch: its NVMe branch copies the folder into the
    swap folder and calls reset_swap_buffers, which restores neither step counts nor the loss scaler (the reason stock
    DeepSpeed's own NVMe resume is not exact: engine.py load_checkpoint 4474-4482; its
    tests/unit/runtime/zero/test_nvme_checkpointing.py fails for every optimizer-on-NVMe case).
    """
    import os

    check_version()
    from deepspeed.checkpoint.ds_to_universal import dp_index_to_str
    from deepspeed.runtime.engine import DeepSpeedEngine

    save, load = DeepSpeedEngine.save_checkpoint, DeepSpeedEngine.load_checkpoint

    def rank_folder(engine, root: str, tag) -> str:
        rank = engine.local_rank if engine.use_node_local_storage() else engine.global_rank
        return os.path.join(root, str(tag), "offloaded_tensors", "rank" + dp_index_to_str(rank))

    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True,  # noqa: B006 - DeepSpeed's
                        exclude_frozen_parameters=False):
        opt = self.optimizer
        if not getattr(opt, "_ma_api", False) or not save_dir:
            return save(self, save_dir, tag, client_state, save_latest, exclude_frozen_parameters)
        opt._ma_ckpt = ("save", rank_folder(self, save_dir, f"global_step{self.global_steps}" if tag is None else tag))
        try:
            return save(self, save_dir, tag, client_state, save_latest, exclude_frozen_parameters)
        finally:
            opt._ma_ckpt = None

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False, custom_load_fn=None):
        args = (load_module_strict, load_optimizer_states, load_lr_scheduler_states, load_module_only, custom_load_fn)
        opt = self.optimizer
        if not (getattr(opt, "_ma_api", False) and opt.swap_optimizer):
            return load(self, load_dir, tag, *args)
        if load_module_only or not load_optimizer_states or self.load_universal_checkpoint():
            raise DeepSpeedApiRefused(
                "with memascend's engine the optimizer's state is on the SSD: engine.load_checkpoint supports only "
                "full loads (no load_module_only, load_optimizer_states=False or universal checkpoints)",
                "load the whole checkpoint, or export the weights (engine.save_16bit_model) and start a new run")
        if tag is None:
            latest = os.path.join(load_dir, "latest")
            if not os.path.isfile(latest):
                return load(self, load_dir, tag, *args)  # DeepSpeed warns and returns (None, None)
            with open(latest) as f:
                tag = f.read().strip()
        opt._ma_ckpt = ("load", rank_folder(self, load_dir, tag))
        self.zero_nvme_offload_optimizer = lambda: False
        try:
            return load(self, load_dir, tag, *args)
        finally:
            del self.zero_nvme_offload_optimizer
            opt._ma_ckpt = None

    patches.set(DeepSpeedEngine, "save_checkpoint", save_checkpoint)
    patches.set(DeepSpeedEngine, "load_checkpoint", load_checkpoint)
