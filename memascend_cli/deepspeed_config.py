"""Recipe + plan -> the DeepSpeed JSON config (ZeRO-3, params and optimizer on NVMe). Pure.

No deepspeed import: the tests validate the dict with DeepSpeed's own config classes, and
`train --dry-run` prints it without starting anything. Sizes follow deepspeed-notes §8 and the
platform-notes §6 recipe that is known to run on the CPU accelerator.
"""

from __future__ import annotations

from dataclasses import dataclass

from memascend_cli.recipe import Recipe

DEFAULT_AIO_BLOCK_BYTES = 1 << 20
"""DeepSpeed's aio.block_size default (aio_config.py); used when the region was not probed."""
DEFAULT_AIO_QUEUE_DEPTH = 8
PARAM_BUFFER_COUNT = 5
"""offload_param.buffer_count: DeepSpeed's default; enough for prefetch of one layer's params."""
OPTIMIZER_BUFFER_COUNT = 4
"""offload_optimizer.buffer_count: Adam needs 4 (param, grad, exp_avg, exp_avg_sq) without pipelining."""
MAX_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's reduce_bucket_size default; smaller models get a bucket of their own size, since on
the CPU accelerator the bucket is host memory (5e8 fp32 elements = 2 GB)."""


def zero3_nvme_config(*, micro_batch: int, dtype: str, nvme_dir: str, lr: float, sub_group_size: int,
                      reduce_bucket_size: int, param_buffer_count: int, param_buffer_size: int, max_in_cpu: int,
                      optimizer_buffer_count: int, zero_extra: dict | None = None,
                      optimizer_extra: dict | None = None) -> dict:
    """A plain ZeRO-3 config with params and optimizer on NVMe (swap files under `nvme_dir`), AdamW at
    `lr` and DeepSpeed's default aio settings: what the benchmarks, the buffer measurement and the
    parity script run. Pure. `zero_extra` / `optimizer_extra` add zero_optimization /
    offload_optimizer keys (e.g. stage3_max_reuse_distance, fast_init)."""
    zero = {"stage": 3, "sub_group_size": int(sub_group_size), "reduce_bucket_size": int(reduce_bucket_size),
            **(zero_extra or {}),
            "offload_param": {"device": "nvme", "nvme_path": nvme_dir, "pin_memory": True,
                              "buffer_count": param_buffer_count, "buffer_size": int(param_buffer_size),
                              "max_in_cpu": int(max_in_cpu)},
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme_dir, "pin_memory": True,
                                  "buffer_count": optimizer_buffer_count, **(optimizer_extra or {})}}
    cfg = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": lr}},
        "zero_optimization": zero,
        "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                "overlap_events": True},
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return cfg


@dataclass(kw_only=True, slots=True)
class OffloadSizing:
    """What the planner knows about how ZeRO-3 will split the model on one rank."""

    largest_partition_numel: int
    """Elements of the largest parameter partition (offload_param.buffer_size must hold it)."""
    partition_numel: int
    """Elements of all of one rank's partitions."""
    sub_group_size: int
    """zero_optimization.sub_group_size used for the plan (elements)."""
    world_size: int
    """Ranks over all nodes."""
    nvme_bytes_per_rank: int
    """SSD bytes one rank needs (planner: params + optimizer states + gradients + checkpoint copies)."""


def sizing_from_plan(job, est) -> OffloadSizing:
    """OffloadSizing from a planner JobSpec and its Estimate (memascend_cli.planner.memory)."""
    from memascend_cli.planner.memory import MEMASCEND_SUB_GROUP_SIZE, partition

    sub_group_size = job.knobs.sub_group_size
    if est.engine == "memascend":
        sub_group_size = min(sub_group_size, MEMASCEND_SUB_GROUP_SIZE)
    part = partition(job.model, est.world_size, sub_group_size)
    return OffloadSizing(
        largest_partition_numel=part.largest_partition_numel,
        partition_numel=part.ns,
        sub_group_size=sub_group_size,
        world_size=est.world_size,
        nvme_bytes_per_rank=est.nvme_bytes,
    )


def aio_settings(header) -> dict:
    """The `aio` block: block size and queue depth measured by prepare-ssd, else DeepSpeed's defaults."""
    block, depth = DEFAULT_AIO_BLOCK_BYTES, DEFAULT_AIO_QUEUE_DEPTH
    probe = getattr(header, "probe", None) if header is not None else None
    if probe is not None and probe.best_block_bytes > 0 and probe.best_queue_depth > 0:
        block, depth = int(probe.best_block_bytes), int(probe.best_queue_depth)
    return {
        "block_size": block,
        "queue_depth": depth,
        # intra_op_parallelism, not the documented-but-ignored thread_count (deepspeed-notes §8).
        "intra_op_parallelism": 1,
        "single_submit": False,
        "overlap_events": True,
    }


def scheduler_section(r: Recipe, total_steps: int) -> dict:
    """DeepSpeed's own scheduler for the recipe's schedule (its state goes into our checkpoints)."""
    from memascend_cli.recipe import warmup_steps

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


def build_ds_config(r: Recipe, sizing: OffloadSizing, header, baseline: bool, *, swap_dir: str,
                    total_steps: int) -> dict:
    """The DeepSpeed config dict for the job.

    Args:
        r: the recipe (batch, precision, optimizer, schedule).
        sizing: planner facts; offload_param.buffer_size is at least the largest partition.
        header: the region's RegionHeader (aio settings from its probe), or None.
        baseline: stock DeepSpeed swap files; False: the memascend engine rewrites the offload
            paths onto the region when it installs.
        swap_dir: offload_*.nvme_path (per-rank folders are created below it by DeepSpeed).
        total_steps: optimizer steps, for the decaying schedules.
    """
    del baseline  # same DeepSpeed config for both engines; the engine adapts it in install()
    numel = max(1, sizing.partition_numel)
    # Buckets: DeepSpeed's defaults capped by the model size (host memory on the CPU accelerator).
    bucket = max(sizing.largest_partition_numel, min(MAX_BUCKET_ELEMENTS, numel))
    zero = {
        "stage": 3,
        "sub_group_size": int(sizing.sub_group_size),
        "reduce_bucket_size": int(bucket),
        "stage3_prefetch_bucket_size": int(min(50_000_000, bucket)),
        "stage3_max_live_parameters": int(min(1_000_000_000, max(bucket, numel))),
        # max_in_cpu 0 with the default reuse distance crashes in step 2 (deepspeed-notes addendum).
        "stage3_max_reuse_distance": 0,
        "stage3_param_persistence_threshold": 0,
        "contiguous_gradients": True,
        "overlap_comm": False,
        "offload_param": {
            "device": "nvme",
            "nvme_path": swap_dir,
            "pin_memory": True,
            "buffer_count": PARAM_BUFFER_COUNT,
            # Elements; DeepSpeed asserts every partition fits one buffer (platform-notes §6.3).
            "buffer_size": int(sizing.largest_partition_numel),
            # 0: every partition lives on the SSD; nothing parked in pinned DRAM.
            "max_in_cpu": 0,
        },
        "offload_optimizer": {
            "device": "nvme",
            "nvme_path": swap_dir,
            "pin_memory": True,
            "buffer_count": OPTIMIZER_BUFFER_COUNT,
            "fast_init": False,
            "pipeline_read": False,
            "pipeline_write": False,
        },
    }
    cfg: dict = {
        "train_micro_batch_size_per_gpu": r.micro_batch,
        "gradient_accumulation_steps": r.grad_accum,
        "train_batch_size": r.micro_batch * r.grad_accum * sizing.world_size,
        "steps_per_print": 10**9,  # our own metrics log replaces DeepSpeed's prints
        "wall_clock_breakdown": False,
        "gradient_clipping": float(r.max_grad_norm),
        "zero_optimization": zero,
        "aio": aio_settings(header),
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": r.lr, "betas": [float(b) for b in r.adam_betas], "eps": 1e-8,
                       "weight_decay": r.weight_decay},
        },
        "scheduler": scheduler_section(r, total_steps),
        "zero_allow_untested_optimizer": False,
    }
    if r.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif r.precision == "fp16":
        # Dynamic loss scaling from 2**8: the CPU recipe that is known to run (platform-notes §6.1).
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 1000,
                       "hysteresis": 2, "min_loss_scale": 1}
    return cfg
