"""`install()` and the `Installed` handle: config rewriting, resources, and the plugin wiring."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import asdict, replace
from typing import Any

from memascend_engine import trainer_config
from memascend_engine.options import EngineOptions

from memascend_cli.run import leftovers
from memascend_cli.planner import zero

log = logging.getLogger("memascend_engine")
_active: Installed | None = None


def _dtype_bytes(ds_config: dict) -> int:
    for key in ("bf16", "bfloat16", "fp16"):
        if (ds_config.get(key) or {}).get("enabled") is True:  # "auto": the HF Trainer fills it later
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


def inventory_spec(model) -> Any:
    """The ModelSpec of a transformers model from its config, when that config describes exactly the parameters the
    module has (names and sizes; ds_numel under zero.Init), else None (a wrapped, adapted or unsupported model)."""
    from memascend_cli.errors import BadInput
    from memascend_cli.models import spec_from_hf_config

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict") or not hasattr(model, "named_parameters"):
        return None
    try:
        spec = spec_from_hf_config(config.to_dict(), name=type(model).__name__, origin="the model's config")
    except BadInput:
        return None
    have = {n: int(getattr(p, "ds_numel", None) or p.numel()) for n, p in model.named_parameters()}
    return spec if have == {t.name: t.numel for t in spec.tensors()} else None


def _loose_spec(model) -> Any:
    """The ModelSpec of a model's Hugging Face config even where its parameters differ (adapters, a wrapper): close
    enough to price where its states go; None without a config the planner reads."""
    from memascend_cli.errors import BadInput
    from memascend_cli.models import spec_from_hf_config

    config = getattr(model, "config", None)
    try:
        return spec_from_hf_config(config.to_dict(), name=type(model).__name__, origin="the model's config") \
            if hasattr(config, "to_dict") else None
    except BadInput:
        return None


def _resolve_spec(model_spec):
    if model_spec is None:
        return None
    if isinstance(model_spec, str):
        from memascend_cli.models import load_model

        return load_model(model_spec)
    return model_spec


class Installed:
    """A live installation; :meth:`uninstall` restores DeepSpeed."""

    def __init__(self, *, options: EngineOptions, ds_config: dict, spec, rank: int, region: str | None,
                 placement: str = "auto"):
        self.options = options
        self.placement = placement
        """install(placement=...): auto, dram or region (planner.offload_choice.PLACEMENT_CHOICES)."""
        self.choice = None
        """The OffloadChoice for a config whose own offload is CPU (or none) under ZeRO-3 with a region: kept or moved
        (planner/offload_choice.py); None for any other config."""
        self._pending = False
        """auto without a model_spec: the choice waits for the model deepspeed.initialize receives."""
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
        self.param_pool_plan: zero.PoolPlan | None = None
        self.inventory_spec = None
        """Without a model_spec: the inventory of the model deepspeed.initialize received (inventory_spec), which
        sizes the parameter pool exactly as with one."""
        self.settings: zero.ZeroSettings | None = None
        """The effective stock ZeRO settings after install (None when nothing is offloaded to NVMe)."""
        self._installed = False
        self.param_nvme = self.opt_nvme = False
        self._deferred = False
        """install() met `"auto"` ZeRO values it could not fill; the rewrite waits for deepspeed.initialize."""

    # -- config --------------------------------------------------------------------------------
    def _rewrite_config(self) -> None:
        """Rewrite the config install() was given and, when a TrainingArguments(deepspeed=...) already exists in
        this process, the Trainer's own copy of it (the one it hands to DeepSpeed; trainer_config.hf_live_config)."""
        hidden = self.spec.hidden_size if self.spec is not None else None
        self.config_changes.update(self._rewrite(self.ds_config, hidden))
        live = trainer_config.hf_live_config()
        if live is not None and live is not self.ds_config:
            changes = self._rewrite(live, hidden)
            log.warning("memascend_engine: install() after TrainingArguments: the Trainer's copy of the DeepSpeed "
                        "config rewritten as well (%s)", ", ".join(changes) or "no change")
            self.config_changes.update(changes)
            self.ds_config = live

    def _rewrite(self, cfg: dict, hidden_size: int | None) -> dict:
        """Apply the stock knobs memascend sets (zero.memascend_knobs, the same function the planner, `train` and
        `bench` use) to `cfg`, so a config generated by memascend comes back unchanged; returns what changed.

        `"auto"` ZeRO values are filled as the HF Trainer fills them (trainer_config.resolve_zero_auto) when the
        hidden size is known, else the rewrite waits for `deepspeed.initialize` (see _initialize_hook). Under ZeRO-3
        with a region, CPU (or no) offload stays as written where the DRAM holds it and moves to NVMe where it does
        not, or as `placement` asks (_choose); otherwise a config that offloads nothing to NVMe is reported loudly,
        since nothing would reach the SSD."""
        changes: dict[str, Any] = {}
        devices = trainer_config.offload_devices(cfg)
        if "nvme" not in devices.values():
            stage = trainer_config.zero_stage(cfg)
            if not (stage == 3 and self.region and self.options.direct_nvme):
                if self.placement == "region":
                    raise ValueError(f"placement='region' needs ZeRO-3 and a region with direct_nvme (ZeRO stage "
                                     f"{stage}, region {self.region})")
                warnings.warn(f"memascend_engine.install(): this DeepSpeed config offloads nothing to NVMe (ZeRO stage "
                              f"{stage}, offload {devices or 'none'}): no model state goes to the SSD and the engine "
                              "saves nothing; use ZeRO-3 with a region to move the offload there", stacklevel=5)
                return changes
            if not self._choose(cfg, devices).move:
                return changes
            changes.update(trainer_config.move_offload_to_nvme(cfg))
        elif self.placement == "dram":
            warnings.warn(f"memascend_engine.install(): placement 'dram' has no effect: the config already offloads "
                          f"to NVMe ({devices})", stacklevel=5)
        zo = cfg["zero_optimization"]
        op, oo = zo.get("offload_param") or {}, zo.get("offload_optimizer") or {}
        self.param_nvme = op.get("device") == "nvme"
        self.opt_nvme = oo.get("device") == "nvme"
        pending = trainer_config.check_zero_auto(cfg)
        if pending and hidden_size is not None:
            changes.update(trainer_config.resolve_zero_auto(cfg, hidden_size))
            pending = []
        # 'auto' keys stay for the Trainer to fill (trainer_config_finalize); every other knob is written now, so a
        # zero.Init before deepspeed.initialize (from_pretrained under ZeRO-3) already sees them. The reduce bucket
        # cap follows when deepspeed.initialize receives the filled config (_initialize_hook).
        kept = {key: zo.pop(key) for key in (p.removeprefix("zero_optimization.") for p in pending)}
        self.settings, knobs = self._write_knobs(cfg)
        zo.update(kept)
        changes.update({k: v for k, v in knobs.items() if k not in trainer_config.setting_names(kept)})
        if kept and not self._deferred:
            log.warning("memascend_engine: %s left 'auto' for the trainer to fill; memascend's cap on them is applied "
                        "when deepspeed.initialize receives the filled config", ", ".join(kept))
        self._deferred = bool(kept)
        if self.options.direct_nvme:
            path = op.get("nvme_path") or oo.get("nvme_path") or self.key_dir
            if not path:
                # Swap paths are only keys with Direct NVMe, but DeepSpeed still rmtree's/makedirs its folders.
                # Named with the pid: memascend_cli.run.leftovers sweeps the folder if this process dies without uninstall.
                path = tempfile.mkdtemp(prefix=f"{leftovers.KEY_DIR_PREFIX}{os.getpid()}-")
                self._own_key_dir = True
            for section, on in ((op, self.param_nvme), (oo, self.opt_nvme)):
                if on and not section.get("nvme_path"):
                    section["nvme_path"] = path
                    changes["nvme_path"] = {"from": None, "to": path}
            os.makedirs(path, exist_ok=True)
            self.key_dir = self.key_dir or str(path)
        else:
            self.key_dir = self.key_dir or op.get("nvme_path") or oo.get("nvme_path")
        return changes

    def _choose(self, cfg: dict, devices: dict, model=None):
        """The OffloadChoice for `cfg` (made once, then kept for every config this installation rewrites): as asked,
        else priced with the model_spec, or with `model` (deepspeed.initialize's); without either it waits for
        deepspeed.initialize (_pending) and the config stays as written until then. Prints one line."""
        if self.choice is not None and not (self._pending and model is not None):
            return self.choice
        from memascend_engine import procfs

        from memascend_cli.hardware import inventory_to_spec, probe
        from memascend_cli.planner import offload_choice as oc

        self._pending = self.placement == "auto" and self.spec is None and model is None
        if self._pending:
            self.choice = oc.OffloadChoice(move=False, placement="auto", pending=True, reason="decided at "
                                           "deepspeed.initialize, when the model is known: install() got no "
                                           "model_spec")
            log.warning("memascend_engine: %s", self.choice.line())
            return self.choice
        spec, partitioned, assumed = self.spec, False, []
        if spec is None and model is not None:
            spec = inventory_spec(model) or _loose_spec(model)
            partitioned = any(hasattr(p, "ds_id") for p in model.parameters())
            if spec is None:
                assumed.append(f"it fits: {type(model).__name__} has no Hugging Face config to plan it by (pass "
                               "model_spec=)")
        job = None
        if spec is not None and self.placement == "auto":
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            job, assumed = oc.job_for_config(cfg, spec, ranks_per_node=local, zero_init=partitioned or
                                             self.spec is not None, env=os.environ)
        self.choice = oc.decide(job, inventory_to_spec(probe()), procfs.dram_view(), placement=self.placement,
                                offload_none=set(devices.values()) <= {"none"}, assumptions=assumed)
        if self.choice.move and partitioned:
            # zero.Init already put the parameters where the config said: they cannot move now.
            self.choice = replace(self.choice, move=False, reason=f"{self.choice.reason}; but deepspeed.zero.Init "
                                  "already partitioned the model with the config's offload, so it stays (pass "
                                  "model_spec= to install(), or launch --model, to decide before zero.Init)")
        log.warning("memascend_engine: %s", self.choice.line())
        return self.choice

    def _decide_at_initialize(self, cfg: dict | None, model) -> bool:
        """The pending choice, now that deepspeed.initialize received the model; True when the offload moves to the
        region (the wiring made for the CPU offload is undone: _install wires the engine again)."""
        if cfg is None:
            log.warning("memascend_engine: deepspeed.initialize got its config as a path: the offload stays as "
                        "written (pass the config as a dict, or model_spec= to install())")
            self._pending = False
            return False
        devices = trainer_config.offload_devices(cfg)
        if "nvme" in devices.values():  # a config of the program's own with NVMe offload: nothing to choose
            self._pending = False
            return False
        if not self._choose(cfg, devices, model).move:
            return False
        self.patches.restore()
        self.config_changes.update(trainer_config.move_offload_to_nvme(cfg))
        return True

    def _initialize_hook(self, initialize):
        """`deepspeed.initialize` that first rewrites the config it receives: the HF Trainer (through accelerate)
        passes its own copy, with the `"auto"` values filled only now (trainer_config_finalize)."""

        @functools.wraps(initialize)
        def wrapper(*args, **kwargs):
            cfg = trainer_config.initialize_config(kwargs)
            model = kwargs.get("model", args[1] if len(args) > 1 else None)
            rewire = self._pending and self._decide_at_initialize(cfg, model)
            if cfg is not None and "nvme" in trainer_config.offload_devices(cfg).values():
                hidden = (self.spec.hidden_size if self.spec is not None
                          else trainer_config.model_hidden_size(kwargs.get("model")))
                changes = self._rewrite(cfg, hidden)
                if changes:
                    log.warning("memascend_engine: the config deepspeed.initialize received rewritten (%s)",
                                ", ".join(changes))
                self.config_changes.update(changes)
                self.ds_config = cfg
            elif cfg is None and self._deferred:
                warnings.warn("memascend_engine: deepspeed.initialize got its config as a path, so the 'auto' ZeRO "
                              "values install() deferred were never rewritten; pass the config as a dict",
                              stacklevel=2)
            if rewire:
                self._wire()
            if self.spec is None and self.inventory_spec is None:
                # deepspeed.initialize(args=None, model=None, ...): the model is its second positional parameter.
                self.inventory_spec = inventory_spec(model)
                if self.inventory_spec is not None and self.ctx is not None:
                    for sw in self.ctx.param_swappers:  # a pool built before: sized to the largest partition only
                        if sw.pool_plan is not None:
                            sw.resize_pool(self._param_plan(sw.swap_element_size, sw.min_aio_bytes, sw._iop))
                            self.param_pool_plan = sw.pool_plan  # what is allocated, resized or not
            return initialize(*args, **kwargs)

        return wrapper

    def _write_knobs(self, cfg: dict) -> tuple[zero.ZeroSettings, dict]:
        """memascend's stock knobs (zero.memascend_knobs) written into `cfg`; returns them and what changed."""
        current = zero.from_ds_config(cfg, os.environ)
        largest = None
        if self.spec is not None:
            largest = zero.largest_swappable_partition(zero.model_partitions(self.spec, _world_size()), current,
                                                       _dtype_bytes(cfg)) or None
        settings = zero.memascend_knobs(current, largest_partition_numel=largest,
                                        overlap=self.options.overlap_optimizer and self.options.streaming)
        return settings, zero.write_into_ds_config(cfg, settings)

    def adopt(self, ds_config: dict) -> dict:
        """Give another DeepSpeed config the rewrite install() gave its own (a script that passes zero.Init and
        deepspeed.initialize separate dicts, or builds a second engine): the same knobs and, with Direct NVMe, the
        key folder where it names none. Returns what changed."""
        if "nvme" not in trainer_config.offload_devices(ds_config).values():
            return {}
        return self._rewrite(ds_config, self.spec.hidden_size if self.spec is not None else None)

    def _param_plan(self, elem_bytes: int, min_aio_bytes: int, iop: int,
                    largest_partition_numel: int | None = None) -> zero.PoolPlan | None:
        """The parameter pool's size classes (the adaptive swapper asks when DeepSpeed creates it).

        Without a model spec, the inventory of the model deepspeed.initialize received where its config describes
        it (inventory_spec; zero.Init's writes come first and borrow buffers until the first fetch asks again), else
        None defers the pool until the swapper knows the real partitions and asks again with the largest one; the
        pool is then DeepSpeed's buffer_count slots of that size, never larger than stock's buffer_count x
        buffer_size (which must hold the largest partition anyway)."""
        spec = self.spec or self.inventory_spec
        if spec is None:
            if largest_partition_numel is None:
                return None
            op = self.ds_config["zero_optimization"]["offload_param"]
            plan = zero.uniform_pool_plan(buffer_count=int(op.get("buffer_count", 5)),
                                          buffer_numel=min(int(largest_partition_numel),
                                                           int(float(op.get("buffer_size", 1e8)))),
                                          elem_bytes=elem_bytes, intra_op_parallelism=iop)
        else:
            plan = zero.param_pool_plan(zero.model_partitions(spec, _world_size()), elem_bytes=elem_bytes,
                                        per_layer_counts=zero.per_layer_role_counts(spec),
                                        prefetch_layers=self.options.prefetch_layers, min_aio_bytes=min_aio_bytes,
                                        intra_op_parallelism=iop)
        self.param_pool_plan = plan
        return plan

    # -- wiring --------------------------------------------------------------------------------
    def _install(self) -> None:
        from memascend_engine import cpuinfo_cache
        from memascend_engine.ds_internals import jit_ops
        from memascend_engine.ds_internals.version import check_version

        check_version()
        cpuinfo_cache.enable()
        jit_ops.enable()  # DeepSpeed's built ops load without torch's build lock: a killed rank leaves none behind
        self._rewrite_config()
        self._wire()
        self._installed = True
        log.info("memascend engine installed (rank %d, region %s): %s; config changes %s", self.rank, self.region,
                 self.options, self.config_changes)

    def _wire(self) -> None:
        """Plug the engine into DeepSpeed for the offload the config now has (again after a choice made at
        deepspeed.initialize moved it: nothing DeepSpeed built used the first wiring yet)."""
        from memascend_engine.ds_internals import aio, context, patches, pinning, stage3
        from memascend_engine.ds_internals.checkpoint_api import patch_checkpoint_api
        from memascend_engine.pinned import PinnedAllocator

        o = self.options
        # Unpinned still means page-aligned exact-size buffers: O_DIRECT needs aligned memory.
        self.allocator = PinnedAllocator(lock=o.pinned, cuda_register=None if o.pinned else False)
        self.patches = patches.Patches()
        use_direct = o.direct_nvme and (self.param_nvme or self.opt_nvme)
        if o.optimizer_moments != "fp32" and not (use_direct and o.streaming and self.opt_nvme):
            raise ValueError(f"optimizer_moments={o.optimizer_moments!r} needs the bounded engine: streaming and "
                             "direct_nvme on, the optimizer offloaded to NVMe")
        self.ctx = context.PluginContext(
            fused_overflow=o.fused_overflow, malloc_trim=o.malloc_trim, bounded_norm=o.bounded_norm,
            adam_in_place=o.adam_in_place and use_direct and self.opt_nvme,
            pool_plan_factory=self._param_plan if (o.adaptive_pool and self.param_nvme) else None,
            pinned_allocator=self.allocator if o.pinned else None)
        if o.malloc_trim:
            self.ctx.fix_mmap_threshold()
        try:
            if use_direct:
                if not self.region:
                    raise ValueError("direct_nvme needs a region made by `memascend prepare-ssd` (region=...), "
                                     "or EngineOptions(direct_nvme=False)")
                from memascend_engine.direct_nvme import RegionStore, verify_from_env
                from memascend_engine.direct_nvme_aio import DirectNvmeBuilder

                self.store = self._open_store(RegionStore, verify_from_env())
                self.ctx.declare_zero = self.store.declare_zero
                aio.patch_aio_builders(self.patches, DirectNvmeBuilder(self.store, self.allocator))
                if o.streaming and self.opt_nvme:
                    from memascend_cli.planner.job import MOMENT_BYTES

                    self.ctx.store = self.store
                    self.ctx.windows = self.windows()
                    self.ctx.moment_bytes = MOMENT_BYTES[o.optimizer_moments]
                    self.ctx.params_hold_master = o.params_hold_master
                    if o.overlap_optimizer:
                        from memascend_engine.overlap import OverlapCounters

                        self.ctx.overlap = OverlapCounters()
                        self.ctx.master_from_params = o.master_from_params
            elif o.pinned and self.allocator.cuda_register:
                aio.patch_aio_builders(self.patches, aio.pinning_aio_builder(self.allocator))
            if o.pinned:
                pinning.patch_accelerator(self.patches, self.allocator)
            stage3.patch_stage3(self.patches, self.ctx, adaptive_pool=self.ctx.pool_plan_factory is not None)
            stage3.cache_cpu_device_count(self.patches)
            stage3.single_rank_reduce_scatter(self.patches)
            patch_checkpoint_api(self.patches)
            import deepspeed

            self.patches.set(deepspeed, "initialize", self._initialize_hook(deepspeed.initialize))
        except BaseException:
            self.patches.restore()
            if self.store is not None:
                self.store.close()
            raise

    def _open_store(self, region_store, verify_env: bool):
        """The rank's region store; with a DRAM tier (EngineOptions.dram_tier_gib) and the bounded engine, one that
        keeps what the tier holds in DRAM (memascend_engine.dram_tier)."""
        o = self.options
        verify = o.verify_checksums and verify_env
        if o.dram_tier_gib <= 0:
            return region_store(self.region, self.rank, verify=verify)
        if not (o.streaming and self.opt_nvme):
            log.warning("memascend_engine: warning: EngineOptions.dram_tier_gib needs the bounded engine (streaming on, "
                        "the optimizer offloaded to NVMe): everything stays on the region")
            return region_store(self.region, self.rank, verify=verify)
        from memascend_engine.dram_tier import TieredStore

        return TieredStore(self.region, self.rank, verify=verify, tier_bytes=int(o.dram_tier_gib * 2**30),
                           lock=o.pinned)

    def windows(self) -> zero.EngineWindows:
        """The bounded engine's host windows (zero.EngineWindows) from the options and the ZeRO settings."""
        w = self.options.windows
        if w is None:
            s = self.settings or zero.from_ds_config(self.ds_config)
            w = zero.EngineWindows(optimizer_chunk_numel=zero.chunk_numel_for(s.sub_group_size),
                                   optimizer_depth=max(1, int(self.options.pipeline_depth)),
                                   checkpoint_offload=self.options.checkpoint_offload)
        return w if self.options.accumulate_in_dram else replace(w, accumulation_bytes=0)

    # -- public API ----------------------------------------------------------------------------
    def stats(self) -> dict:
        """Traffic through the region, pinned/pool bytes and technique counters of this rank."""
        from memascend_engine.ds_internals import stage3

        d: dict[str, Any] = {"rank": self.rank, "region": self.region,
                             "options": {k: (v.to_dict() if hasattr(v, "to_dict") else v)
                                         for k, v in vars(self.options).items()}}
        if self.store is not None:
            s = self.store.snapshot()
            d.update(bytes_read=s["bytes_read"], bytes_written=s["bytes_written"], requests=s["requests"])
            d["region_io"] = s
        else:
            d.update(bytes_read=0, bytes_written=0, requests=0)
        alloc = self.allocator.snapshot() if self.allocator is not None else {}
        d["pinned_bytes"] = alloc.get("live_bytes", 0)
        d["pinned"] = alloc
        param_pool = stage3.param_pool_bytes(self.ctx) if self.ctx else 0
        opt_pool = stage3.optimizer_pool_bytes(self.ctx) if self.ctx else 0
        p2 = stage3.partitioned_swap_buffer_bytes(self.ctx) if self.ctx else 0
        d["param_pool_bytes"] = param_pool
        d["optimizer_pool_bytes"] = opt_pool
        d["partitioned_swap_buffer_bytes"] = p2
        d["pool_bytes"] = param_pool + opt_pool + p2
        d["param_pool_plan"] = self.param_pool_plan.describe() if self.param_pool_plan else None
        d["swap_files_created"] = self.swap_files()
        d["counters"] = dict(self.ctx.counters) if self.ctx else {}
        d["config_changes"] = dict(self.config_changes)
        d["placement"] = self.choice.to_dict() if self.choice is not None else None
        if self.checkpointer is not None:
            stash = self.checkpointer.stash
            d["checkpointing"] = {"layer_calls": self.checkpointer.calls, "on_ssd": bool(getattr(stash, "on_ssd", False)),
                                  "host_bytes_peak": stash.host_bytes if getattr(stash, "on_ssd", False)
                                  else stash.peak_bytes}
        if self.ctx is not None and self.ctx.io is not None:
            d["bounded_io"] = asdict(self.ctx.io)
            bounded = stage3.bounded_stats(self.ctx)
            if bounded is not None:
                d["bounded"] = bounded
        if self.ctx is not None and self.ctx.overlap is not None:
            d["overlap"] = asdict(self.ctx.overlap)
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
        from memascend_engine import activation_checkpointing
        from memascend_engine.ds_internals.allocator import LAYER_TRIM_MMAP_THRESHOLD_BYTES

        stash = None
        if self.options.checkpoint_offload == "ssd" and self.store is not None:
            from memascend_engine.bounded import CheckpointStash, IOCounters

            self.ctx.io = self.ctx.io or IOCounters()
            stash = CheckpointStash(self.store, self.allocator, self.windows().checkpoint_slots, self.ctx.io)
        after_layer = None
        if self.options.malloc_trim and not self.options.layer_trims:
            self.ctx.keep_heap()  # a DRAM that holds the job: the next layer reuses this one's blocks as they are
        elif self.options.malloc_trim and self.ctx.fix_mmap_threshold(LAYER_TRIM_MMAP_THRESHOLD_BYTES):
            # zero.Init is over (the model exists): from here on each layer's temporaries are reused within the
            # layer and trimmed after it, instead of mmapped one by one (allocator.LAYER_TRIM_MMAP_THRESHOLD_BYTES).
            after_layer = functools.partial(self.ctx.trim_heap, "layer_trims")
        self.checkpointer = activation_checkpointing.enable(model, self.allocator, stash, after_layer)

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


def active() -> Installed | None:
    """The installation live in this process, None when there is none."""
    return _active


def install(ds_config: dict, *, region: str | None, model_spec=None, options: EngineOptions | None = None,
            rank: int | None = None, placement: str = "auto") -> Installed:
    """Plug the engine into DeepSpeed; rewrites ``ds_config`` in place (see ``Installed.config_changes``).

    ``region``: a region made by `memascend prepare-ssd` (device, partition or file); needed when
    ``direct_nvme`` is on and something is offloaded to NVMe. ``model_spec``: a memascend ModelSpec
    or preset name / model directory, for the adaptive pool's size classes (without it they come from the
    transformers model deepspeed.initialize receives, where its config describes its parameters; else the
    parameter pool is DeepSpeed's ``buffer_count`` slots of the largest partition, still exact-size). ``rank``:
    the region sub-region to use (default: LOCAL_RANK). ``placement``: what happens to a ZeRO-3 config's own CPU
    offload (or none) with a region: ``"auto"`` keeps it where the DRAM this process may use (MemAvailable, or its
    cgroup's limit when lower) holds stock DeepSpeed's placement, else moves it to the region; ``"dram"`` keeps it,
    ``"region"`` moves it. Without ``model_spec``, auto decides at ``deepspeed.initialize`` from the model it
    receives. One line says which and why (``Installed.choice``).
    """
    from memascend_cli.planner.offload_choice import PLACEMENT_CHOICES

    if placement not in PLACEMENT_CHOICES:
        raise ValueError(f"placement={placement!r}: use one of {', '.join(PLACEMENT_CHOICES)}")
    global _active
    if _active is not None:
        raise RuntimeError("memascend_engine is already installed in this process; call uninstall() first")
    inst = Installed(options=options or EngineOptions(), ds_config=ds_config, spec=_resolve_spec(model_spec),
                     rank=_local_rank() if rank is None else int(rank), region=region, placement=placement)
    inst._install()
    _active = inst
    return inst
