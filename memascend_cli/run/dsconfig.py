"""The DeepSpeed JSON config of a job: ZeRO-3 with params and optimizer states on NVMe, or where its placement puts
them (planner/placement_choice.py). Pure.

The ZeRO and aio sections come from memascend_cli/planner/zero.py (the one home of every ZeRO number);
this module adds batch sizes, precision, optimizer and schedule. No deepspeed import: the tests validate
the dict with DeepSpeed's own config classes, and `train --dry-run` prints it without starting anything.
"""

from __future__ import annotations

from memascend_cli.planner import zero
from memascend_cli.planner.job import DTYPE_BYTES
from memascend_cli.run.recipe import Recipe


def ds_config(settings: zero.ZeroSettings, *, nvme_path: str, micro_batch: int, precision: str,
              optimizer: dict, grad_accum: int = 1, world_size: int | None = None, scheduler: dict | None = None,
              gradient_clipping: float | None = None, devices: tuple[str, str] = ("nvme", "nvme")) -> dict:
    """The whole DeepSpeed config of a ZeRO-3 job, NVMe offload unless `devices` says otherwise. Pure.

    Args:
        settings: the resolved ZeRO settings (zero.resolve).
        nvme_path: offload_*.nvme_path (DeepSpeed creates per-rank folders below it; with the memascend engine
            the paths are only keys of region extents).
        micro_batch / grad_accum / world_size: train_micro_batch_size_per_gpu, gradient_accumulation_steps, and
            (when given) train_batch_size = their product.
        precision: bf16, fp16 or fp32.
        optimizer / scheduler: DeepSpeed's `optimizer` and `scheduler` sections.
        gradient_clipping: global gradient-norm clip (None: DeepSpeed's default, no clipping).
        devices: (offload_param, offload_optimizer) device, zero.OFFLOAD_DEVICES: the run's placement
            (planner/placement_choice.py).
    """
    if precision not in DTYPE_BYTES:
        raise ValueError(f"unknown precision {precision!r}")
    cfg: dict = {"train_micro_batch_size_per_gpu": int(micro_batch), "gradient_accumulation_steps": int(grad_accum)}
    if world_size is not None:
        cfg["train_batch_size"] = int(micro_batch) * int(grad_accum) * int(world_size)
    cfg["steps_per_print"] = 10**9  # our own logs replace DeepSpeed's prints
    cfg["wall_clock_breakdown"] = False
    if gradient_clipping is not None:
        cfg["gradient_clipping"] = float(gradient_clipping)
    cfg["zero_optimization"] = zero.zero_section(settings, nvme_path, param_device=devices[0],
                                                 optimizer_device=devices[1])
    cfg["aio"] = zero.aio_section(settings)
    cfg["optimizer"] = optimizer
    if scheduler is not None:
        cfg["scheduler"] = scheduler
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif precision == "fp16":
        # Dynamic loss scaling from 2**8: the CPU recipe known to run (small first scales do not overflow).
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 1000,
                       "hysteresis": 2, "min_loss_scale": 1}
    return cfg


def adamw(lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0) -> dict:
    """DeepSpeed's `optimizer` section for AdamW (CPU Adam with optimizer offload)."""
    return {"type": "AdamW", "params": {"lr": float(lr), "betas": [float(b) for b in betas], "eps": float(eps),
                                        "weight_decay": float(weight_decay)}}


def region_aio(header) -> tuple[int | None, int | None]:
    """(block size, queue depth) the region's prepare-ssd probe measured, or (None, None) when not probed."""
    probe = getattr(header, "probe", None) if header is not None else None
    if probe is not None and probe.best_block_bytes > 0 and probe.best_queue_depth > 0:
        return int(probe.best_block_bytes), int(probe.best_queue_depth)
    return None, None


def scheduler_section(r: Recipe, total_steps: int) -> dict:
    """DeepSpeed's own scheduler for the recipe's schedule (its state goes into our checkpoints)."""
    from memascend_cli.run.recipe import warmup_steps

    s = r.schedule
    warmup = warmup_steps(r, total_steps)
    if s.name == "constant":
        # WarmupLR holds warmup_max_lr after the warm-up; its warm-up is at least 2 steps, so
        # no warm-up means starting at the peak.
        return {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0 if warmup else r.lr, "warmup_max_lr": r.lr,
                                               "warmup_num_steps": max(1, warmup), "warmup_type": "linear"}}
    if s.name == "linear":
        return {"type": "WarmupDecayLR", "params": {"total_num_steps": max(total_steps, warmup + 1),
                                                    "warmup_min_lr": 0.0 if warmup else r.lr, "warmup_max_lr": r.lr,
                                                    "warmup_num_steps": max(1, warmup), "warmup_type": "linear"}}
    return {"type": "WarmupCosineLR", "params": {"total_num_steps": max(total_steps, warmup + 1),
                                                 # DeepSpeed warms up for at least 2 steps; starting
                                                 # the warm-up at ratio 1 means "no warm-up".
                                                 "warmup_min_ratio": 0.0 if warmup else 1.0,
                                                 "warmup_num_steps": max(1, warmup),
                                                 "cos_min_ratio": s.min_lr_ratio, "warmup_type": "linear"}}


def build_ds_config(r: Recipe, settings: zero.ZeroSettings, *, swap_dir: str, world_size: int,
                    total_steps: int, devices: tuple[str, str] = ("nvme", "nvme")) -> dict:
    """The DeepSpeed config of a `memascend train` recipe (the same for memascend and stock DeepSpeed).

    Args:
        r: the recipe (batch, precision, optimizer, schedule).
        settings: zero.resolve("memascend", ...) of the job.
        swap_dir: offload_*.nvme_path.
        world_size: ranks over all nodes.
        total_steps: optimizer steps, for the decaying schedules.
        devices: the placement's offload devices (ds_config).
    """
    cfg = ds_config(settings, nvme_path=swap_dir, micro_batch=r.micro_batch, grad_accum=r.grad_accum,
                    world_size=world_size, precision=r.precision, devices=devices,
                    optimizer=adamw(r.lr, r.adam_betas, 1e-8, r.weight_decay),
                    scheduler=scheduler_section(r, total_steps), gradient_clipping=r.max_grad_norm)
    cfg["zero_allow_untested_optimizer"] = False
    return cfg
