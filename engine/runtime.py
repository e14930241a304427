"""`install()` and the `Installed` handle: config rewriting, resources, and the plugin wiring."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

from memascend_engine import EngineOptions, pools

log = logging.getLogger("memascend_engine")

# One source of truth with the planner.
from memascend_cli.planner.memory import MEMASCEND_REDUCE_BUCKET_SIZE, MEMASCEND_SUB_GROUP_SIZE  # noqa: E402
_active: Installed | None = None


def _dtype_bytes(ds_config: dict) -> int:
    for key in ("bf16", "bfloat16", "fp16"):
        if (ds_config.get(key) or {}).get("enabled"):
            return 2
    return 4


def _world_size() -> int:
    try:
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            return tdist.get_world_size()
    except Exception as exc:  # noqa: BLE001 - fall back to the launcher's environment
        log.debug("torch.distributed world size unavailable (%s); using WORLD_SIZE", exc)
    return int(os.environ.get("WORLD_SIZE", "1"))


def _local_rank() -> int:
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    try:
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            return tdist.get_rank()
    except Exception as exc:  # noqa: BLE001 - no process group: rank 0
        log.debug("torch.distributed rank unavailable (%s); using rank 0", exc)
    return 0


def _resolve_spec(model_spec):
    if model_spec is None:
        return None
    if isinstance(model_spec, str):
        from memascend_cli.models import load_model

        return load_model(model_spec)
    return model_spec


class Installed:
    """A live installation; :meth:`uninstall` restores DeepSpeed."""

    def __init__(self, *, options: EngineOptions, ds_config: dict, spec, rank: int, region: str | None):
        self.options = options
        self.ds_config = ds_config
        self.spec = spec
        self.rank = rank
        self.region = region
        self.store = None
        self.allocator = None
        self.patches = None
        self.ctx = None
        self.key_dir: str | None = None
        self._own_key_dir = False
        self.checkpointer = None
        self.fused_kernels_applied: list[str] = []
        self.config_changes: dict[str, Any] = {}
        self.param_pool_plan: pools.PoolPlan | None = None
        self._installed = False

    # -- config --------------------------------------------------------------------------------
    def _set(self, section: dict, key: str, value, label: str) -> None:
        if section.get(key) != value:
            self.config_changes[label] = {"from": section.get(key), "to": value}
        section[key] = value

    def _rewrite_config(self) -> None:
        o, cfg = self.options, self.ds_config
        zo = cfg.setdefault("zero_optimization", {})
        op = zo.get("offload_param") or {}
        oo = zo.get("offload_optimizer") or {}
        self.param_nvme = op.get("device") == "nvme"
        self.opt_nvme = oo.get("device") == "nvme"
        if self.param_nvme:
            # Params really live on the SSD (the default 1e9 keeps a <1B model in DRAM), and a
            # fetched partition gives its buffer back right after use (the default reuse distance
            # keeps every NVMe partition's buffer once the trace is recorded: "Not enough buffers").
            self._set(op, "max_in_cpu", 0, "offload_param.max_in_cpu")
            self._set(zo, "stage3_max_reuse_distance", 0, "stage3_max_reuse_distance")
        if o.direct_nvme and (self.param_nvme or self.opt_nvme):
            path = op.get("nvme_path") or oo.get("nvme_path")
            if not path or not os.path.isdir(path):
                # Swap paths are only keys; DeepSpeed still rmtree's/makedirs its folders there.
                path = tempfile.mkdtemp(prefix="memascend-keys-")
                self._own_key_dir = True
            self.key_dir = str(path)
            for section, on in ((op, self.param_nvme), (oo, self.opt_nvme)):
                if on:
                    self._set(section, "nvme_path", self.key_dir, "nvme_path")
        elif self.param_nvme or self.opt_nvme:
            self.key_dir = op.get("nvme_path") or oo.get("nvme_path")
        if o.pinned:
            for name, section in (("offload_param", op), ("offload_optimizer", oo)):
                if section.get("device") in ("cpu", "nvme"):
                    self._set(section, "pin_memory", True, f"{name}.pin_memory")
        if o.adaptive_pool and self.param_nvme and self.spec is not None:
            plan = self._param_plan(_dtype_bytes(cfg), self._min_aio_bytes(), self._iop())
            self.param_pool_plan = plan
            # DeepSpeed validates and logs these; the real pool is the size classes.
            self._set(op, "buffer_count", max(1, plan.slot_count), "offload_param.buffer_count")
            self._set(op, "buffer_size", max(1, plan.largest_slot_numel), "offload_param.buffer_size")
        if o.adaptive_pool and self.opt_nvme:
            need = pools.optimizer_buffer_count(pipeline_read=bool(oo.get("pipeline_read")),
                                                pipeline_write=bool(oo.get("pipeline_write")))
            self._set(oo, "buffer_count", need, "offload_optimizer.buffer_count")
            sgs = int(float(zo.get("sub_group_size", 1e9)))
            self._set(zo, "sub_group_size", min(sgs, MEMASCEND_SUB_GROUP_SIZE), "sub_group_size")
            # Each reduce bucket's gradients are copied to fp32 host tensors before they are swapped
            # out (stage3 partition_grads): a bounded bucket bounds that host transient.
            rbs = int(float(zo.get("reduce_bucket_size", 5e8)))
            self._set(zo, "reduce_bucket_size", min(rbs, MEMASCEND_REDUCE_BUCKET_SIZE), "reduce_bucket_size")
            # fast_init hands the whole parameter pool to the optimizer init and needs every slot
            # to hold a sub-group; the streaming path needs no pool slots.
            self._set(oo, "fast_init", False, "offload_optimizer.fast_init")
        if op:
            zo["offload_param"] = op
        if oo:
            zo["offload_optimizer"] = oo

    def _aio(self) -> dict:
        return self.ds_config.get("aio") or {}

    def _min_aio_bytes(self) -> int:
        return max(pools.MIN_AIO_BYTES, int(self._aio().get("block_size", 1 << 20)))

    def _iop(self) -> int:
        return int(self._aio().get("intra_op_parallelism", 1))

    def _param_plan(self, elem_bytes: int, min_aio_bytes: int, iop: int) -> pools.PoolPlan:
        if self.spec is None:
            op = self.ds_config["zero_optimization"]["offload_param"]
            return pools.uniform_pool_plan(buffer_count=int(op.get("buffer_count", 5)),
                                           buffer_numel=int(float(op.get("buffer_size", 1e8))),
                                           elem_bytes=elem_bytes, intra_op_parallelism=iop)
        return pools.param_pool_plan(pools.partition_inventory(self.spec, _world_size()), elem_bytes=elem_bytes,
                                     per_layer_counts=pools.per_layer_role_counts(self.spec),
                                     prefetch_layers=self.options.prefetch_layers, min_aio_bytes=min_aio_bytes,
                                     intra_op_parallelism=iop)

    # -- wiring --------------------------------------------------------------------------------
    def _install(self) -> None:
        from memascend_engine import deepspeed_plugin as plug
        from memascend_engine.pinned import PinnedAllocator

        plug.check_version()
        o = self.options
        self._rewrite_config()
        # Unpinned still means page-aligned exact-size buffers: O_DIRECT needs aligned memory.
        self.allocator = PinnedAllocator(lock=o.pinned, cuda_register=None if o.pinned else False)
        self.patches = plug.Patches()
        use_direct = o.direct_nvme and (self.param_nvme or self.opt_nvme)
        self.ctx = plug.PluginContext(
            fused_overflow=o.fused_overflow, malloc_trim=o.malloc_trim,
            adam_in_place=o.adam_in_place and use_direct and self.opt_nvme,
            pool_plan_factory=self._param_plan if (o.adaptive_pool and self.param_nvme) else None,
            pinned_allocator=self.allocator if o.pinned else None)
        try:
            if use_direct:
                if not self.region:
                    raise ValueError("direct_nvme needs a region made by `memascend prepare-ssd` (region=...), "
                                     "or EngineOptions(direct_nvme=False)")
                from memascend_engine.direct_nvme import DirectNvmeBuilder, RegionStore, verify_from_env

                self.store = RegionStore(self.region, self.rank, verify=o.verify_checksums and verify_from_env())
                self.ctx.declare_zero = self.store.declare_zero
                plug.patch_aio_builders(self.patches, DirectNvmeBuilder(self.store, self.allocator))
            elif o.pinned and self.allocator.cuda_register:
                plug.patch_aio_builders(self.patches, plug.pinning_aio_builder(self.allocator))
            if o.pinned:
                plug.patch_accelerator(self.patches, self.allocator)
            plug.patch_stage3(self.patches, self.ctx, adaptive_pool=self.ctx.pool_plan_factory is not None)
        except BaseException:
            self.patches.restore()
            if self.store is not None:
                self.store.close()
            raise
        self._installed = True
        log.info("memascend engine installed (rank %d, region %s): %s; config changes %s", self.rank, self.region,
                 self.options, self.config_changes)

    # -- public API ----------------------------------------------------------------------------
    def stats(self) -> dict:
        """Traffic through the region, pinned/pool bytes and technique counters of this rank."""
        from memascend_engine import deepspeed_plugin as plug

        d: dict[str, Any] = {"rank": self.rank, "region": self.region, "options": vars(self.options).copy()}
        if self.store is not None:
            s = self.store.snapshot()
            d.update(bytes_read=s["bytes_read"], bytes_written=s["bytes_written"], requests=s["requests"])
            d["region_io"] = s
        else:
            d.update(bytes_read=0, bytes_written=0, requests=0)
        alloc = self.allocator.snapshot() if self.allocator is not None else {}
        d["pinned_bytes"] = alloc.get("live_bytes", 0)
        d["pinned"] = alloc
        param_pool = sum(getattr(sw, "pool_bytes", 0) for sw in (self.ctx.param_swappers if self.ctx else []))
        opt_pool = plug.optimizer_pool_bytes(self.ctx) if self.ctx else 0
        p2 = plug.partitioned_swap_buffer_bytes(self.ctx) if self.ctx else 0
        d["param_pool_bytes"] = param_pool
        d["optimizer_pool_bytes"] = opt_pool
        d["partitioned_swap_buffer_bytes"] = p2
        d["pool_bytes"] = param_pool + opt_pool + p2
        d["param_pool_plan"] = self.param_pool_plan.describe() if self.param_pool_plan else None
        d["swap_files_created"] = self.swap_files()
        d["counters"] = dict(self.ctx.counters) if self.ctx else {}
        d["config_changes"] = dict(self.config_changes)
        if self.checkpointer is not None:
            d["checkpointing"] = {"layer_calls": self.checkpointer.calls,
                                  "host_bytes_peak": self.checkpointer.stash.peak_bytes}
        d["fused_kernels"] = list(self.fused_kernels_applied)
        return d

    def swap_files(self) -> int:
        """Files under the swap folders (DeepSpeed's ``<nvme_path>/zero_stage_3``); 0 with Direct NVMe."""
        if not self.key_dir:
            return 0
        root = os.path.join(self.key_dir, "zero_stage_3")
        return sum(len(files) for _, _, files in os.walk(root))

    def enable_offloaded_checkpointing(self, model) -> None:
        """Wrap every decoder layer of a transformers model (no-op when the option is off)."""
        if not self.options.offload_checkpointing:
            return
        from memascend_engine import checkpointing

        self.checkpointer = checkpointing.enable(model, self.allocator)

    def apply_fused_kernels(self, model_type: str) -> list[str]:
        """Liger-Kernel for ``model_type`` when it is installed and CUDA is usable (call before the
        model is built); returns what was applied. FlashAttention: see :meth:`attn_implementation`."""
        applied: list[str] = []
        if not self.options.fused_kernels or not _cuda():
            return applied
        try:
            import liger_kernel.transformers as liger
        except ImportError:
            return applied
        fn = getattr(liger, f"apply_liger_kernel_to_{model_type}", None)
        if fn is not None:
            fn()
            applied.append(f"liger:{model_type}")
        self.fused_kernels_applied += applied
        return applied

    def attn_implementation(self) -> str | None:
        """'flash_attention_2' when flash-attn is installed on a CUDA machine and the option is on,
        else None (keep transformers' default)."""
        if not self.options.fused_kernels or not _cuda():
            return None
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            return None
        return "flash_attention_2"

    def uninstall(self) -> None:
        """Restore DeepSpeed and release the region (call after the DeepSpeed engine is done)."""
        global _active
        if not self._installed:
            return
        self.patches.restore()
        if self.store is not None:
            self.store.close()
        if self._own_key_dir and self.key_dir:
            shutil.rmtree(self.key_dir, ignore_errors=True)
        self._installed = False
        if _active is self:
            _active = None


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def install(ds_config: dict, *, region: str | None, model_spec=None, options: EngineOptions | None = None,
            rank: int | None = None) -> Installed:
    """Plug the engine into DeepSpeed; rewrites ``ds_config`` in place (see ``Installed.config_changes``).

    ``region``: a region made by `memascend prepare-ssd` (device, partition or file); needed when
    ``direct_nvme`` is on and something is offloaded to NVMe. ``model_spec``: a memascend ModelSpec
    or preset name / model directory, for the adaptive pool's size classes (without it the parameter
    pool is DeepSpeed's ``buffer_count x buffer_size``, still exact-size). ``rank``: the region
    sub-region to use (default: LOCAL_RANK).
    """
    global _active
    if _active is not None:
        raise RuntimeError("memascend_engine is already installed in this process; call uninstall() first")
    inst = Installed(options=options or EngineOptions(), ds_config=ds_config, spec=_resolve_spec(model_spec),
                     rank=_local_rank() if rank is None else int(rank), region=region)
    inst._install()
    _active = inst
    return inst
