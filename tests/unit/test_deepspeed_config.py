"""The generated DeepSpeed config: resolver-sized buffers, probed aio settings, and DeepSpeed's own validation."""

from __future__ import annotations

import pytest

from memascend_cli.run.dsconfig import build_ds_config, region_aio
from memascend_cli.models import load_preset
from memascend_cli.planner import zero
from memascend_cli.run.recipe import recipe_from_dict
from memascend_cli.ssd.region import ProbeResult, new_header

TINY = load_preset("tiny-llama")


def recipe(**kw):
    return recipe_from_dict({"model": "tiny-llama", "dataset": "d.jsonl", "precision": "fp32", **kw})


def settings(world=1, precision="fp32", header=None):
    block, depth = region_aio(header)
    return zero.resolve("memascend", model=TINY, world_size=world, elem_bytes=4 if precision == "fp32" else 2,
                        aio_block_size=block, aio_queue_depth=depth)


def build(r=None, world=1, header=None, swap_dir="/s", total_steps=10):
    r = r or recipe()
    return build_ds_config(r, settings(world, r.precision, header), swap_dir=swap_dir, world_size=world,
                           total_steps=total_steps)


def test_offload_blocks_and_buffers():
    cfg = build(recipe(micro_batch=4, grad_accum=2), swap_dir="/ssd/run/swap", total_steps=30)
    z = cfg["zero_optimization"]
    assert z["stage"] == 3 and z["stage3_max_reuse_distance"] == 0
    # tiny-llama's largest tensors are 1024 x 512 (embedding, lm_head, MLP): the smallest buffer DeepSpeed accepts.
    assert z["offload_param"] == {"device": "nvme", "nvme_path": "/ssd/run/swap", "pin_memory": True,
                                  "buffer_count": 5, "buffer_size": 524288, "max_in_cpu": 0}
    assert z["offload_optimizer"]["device"] == "nvme" and z["offload_optimizer"]["buffer_count"] == 4
    assert z["sub_group_size"] == zero.MEMASCEND_SUB_GROUP_SIZE
    assert z["reduce_bucket_size"] == zero.OVERLAP_REDUCE_BUCKET_SIZE
    assert cfg["aio"]["block_size"] == 1 << 20 and cfg["aio"]["queue_depth"] == 8
    assert "thread_count" not in cfg["aio"]
    assert cfg["train_batch_size"] == 8 and cfg["gradient_accumulation_steps"] == 2
    assert "bf16" not in cfg and "fp16" not in cfg
    assert cfg["optimizer"]["type"] == "AdamW"


def test_partitions_follow_the_world_size():
    assert build(world=2)["zero_optimization"]["offload_param"]["buffer_size"] == 262144


def test_aio_from_region_probe():
    h = new_header(capacity_bytes=1 << 30)
    h.probe = ProbeResult(read_gbps=3.0, write_gbps=2.0, best_block_bytes=4 << 20, best_queue_depth=32,
                          best_num_workers=1, backend="io_uring", measured_at="x")
    cfg = build(header=h)
    assert cfg["aio"]["block_size"] == 4 << 20 and cfg["aio"]["queue_depth"] == 32


@pytest.mark.parametrize("precision,key", [("bf16", "bf16"), ("fp16", "fp16")])
def test_precision_sections(precision, key):
    assert build(recipe(precision=precision))[key]["enabled"] is True


@pytest.mark.parametrize("schedule,kind", [("constant", "WarmupLR"), ("linear", "WarmupDecayLR"), ("cosine", "WarmupCosineLR")])
def test_schedules(schedule, kind):
    cfg = build(recipe(schedule={"name": schedule, "warmup_steps": 3}), total_steps=20)
    assert cfg["scheduler"]["type"] == kind


def test_the_zero_sections_read_back_to_the_same_settings():
    s = settings()
    assert zero.from_ds_config(build(), s.env()) == s


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("world", [1, 2])
def test_deepspeed_accepts_the_config(precision, world, tmp_path):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.swap_tensor.aio_config import get_aio_config
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

    cfg = build(recipe(precision=precision), world=world, swap_dir=str(tmp_path))
    # Without torch.distributed DeepSpeedConfig assumes one rank; it checks train_batch_size =
    # micro x accumulation x world, so give it the one-rank share of the batch we planned.
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * world
    ds = DeepSpeedConfig({**cfg, "train_batch_size": cfg["train_batch_size"] // world})
    z = ds.zero_config
    assert z.stage == 3
    assert z.offload_param.device == OffloadDeviceEnum.nvme and z.offload_param.max_in_cpu == 0
    assert z.offload_param.buffer_size == cfg["zero_optimization"]["offload_param"]["buffer_size"]
    assert z.offload_optimizer.device == OffloadDeviceEnum.nvme
    assert get_aio_config(cfg)["queue_depth"] == 8
    assert ds.bfloat16_config.enabled == (precision == "bf16") and ds.float16_config.enabled == (precision == "fp16")


def test_pydantic_zero_models_reject_nothing_we_emit():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    cfg = build()
    z = DeepSpeedZeroConfig(**cfg["zero_optimization"])
    assert z.max_reuse_distance == 0 and z.sub_group_size == cfg["zero_optimization"]["sub_group_size"]


def test_deepspeed_defaults_match_the_installed_deepspeed():
    """zero.DEEPSPEED_DEFAULTS is what DeepSpeed's own config classes give for an empty NVMe config."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.swap_tensor.aio_config import get_aio_config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    z = DeepSpeedZeroConfig(stage=3, offload_param={"device": "nvme", "nvme_path": "/x"},
                            offload_optimizer={"device": "nvme", "nvme_path": "/x"})
    d = zero.DEEPSPEED_DEFAULTS
    assert (z.sub_group_size, z.reduce_bucket_size, z.prefetch_bucket_size) == (
        d.sub_group_size, d.reduce_bucket_size, d.prefetch_bucket_size)
    assert (z.max_live_parameters, z.max_reuse_distance, z.param_persistence_threshold) == (
        d.max_live_parameters, d.max_reuse_distance, d.param_persistence_threshold)
    assert (z.contiguous_gradients, z.overlap_comm) == (d.contiguous_gradients, d.overlap_comm)
    p, o = z.offload_param, z.offload_optimizer
    assert (p.buffer_count, p.buffer_size, p.max_in_cpu, p.pin_memory) == (
        d.param_buffer_count, d.param_buffer_size, d.max_in_cpu, d.pin_memory)
    assert (o.buffer_count, o.pipeline_read, o.pipeline_write, o.fast_init, o.pin_memory) == (
        d.optimizer_buffer_count, d.pipeline_read, d.pipeline_write, d.fast_init, d.pin_memory)
    a = get_aio_config({})
    assert (a["block_size"], a["queue_depth"], a["intra_op_parallelism"], a["single_submit"], a["overlap_events"]) == (
        d.aio_block_size, d.aio_queue_depth, d.intra_op_parallelism, d.single_submit, d.overlap_events)
