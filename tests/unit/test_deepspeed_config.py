"""The generated DeepSpeed config: planner-sized buffers, probed aio settings, and DeepSpeed's own validation."""

from __future__ import annotations

import pytest

from memascend_cli.deepspeed_config import OffloadSizing, build_ds_config, sizing_from_plan
from memascend_cli.models import load_preset
from memascend_cli.planner.memory import JobSpec, ZeroKnobs, estimate
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.recipe import recipe_from_dict
from memascend_cli.region import ProbeResult, new_header

HW = HardwareSpec(name="t", dram_gib=24.0, cpu_cores=2)


def recipe(**kw):
    return recipe_from_dict({"model": "tiny-llama", "dataset": "d.jsonl", "precision": "fp32", **kw})


def sizing(world=1, engine="baseline"):
    job = JobSpec(model=load_preset("tiny-llama"), seq_len=128, micro_batch=4, dtype="fp32", ranks_per_node=world,
                  knobs=ZeroKnobs(max_in_cpu=0))
    return sizing_from_plan(job, estimate(job, HW, engine))


def test_sizing_comes_from_the_planner_partitions():
    s1, s2 = sizing(1), sizing(2)
    # tiny-llama's largest tensors are 1024 x 512 (embedding, lm_head, MLP).
    assert s1.largest_partition_numel == 524288 and s2.largest_partition_numel == 262144
    assert s1.partition_numel == 6_294_016 and s1.world_size == 1 and s1.nvme_bytes_per_rank > 0


def test_offload_blocks_and_buffers():
    cfg = build_ds_config(recipe(micro_batch=4, grad_accum=2), sizing(), None, True, swap_dir="/ssd/run/swap",
                          total_steps=30)
    z = cfg["zero_optimization"]
    assert z["stage"] == 3 and z["stage3_max_reuse_distance"] == 0
    assert z["offload_param"] == {"device": "nvme", "nvme_path": "/ssd/run/swap", "pin_memory": True,
                                  "buffer_count": 5, "buffer_size": 524288, "max_in_cpu": 0}
    assert z["offload_optimizer"]["device"] == "nvme" and z["offload_optimizer"]["buffer_count"] == 4
    assert cfg["aio"]["block_size"] == 1 << 20 and cfg["aio"]["queue_depth"] == 8
    assert "thread_count" not in cfg["aio"]
    assert cfg["train_batch_size"] == 8 and cfg["gradient_accumulation_steps"] == 2
    assert "bf16" not in cfg and "fp16" not in cfg
    assert cfg["optimizer"]["type"] == "AdamW"


def test_aio_from_region_probe():
    h = new_header(capacity_bytes=1 << 30)
    h.probe = ProbeResult(read_gbps=3.0, write_gbps=2.0, best_block_bytes=4 << 20, best_queue_depth=32,
                          best_num_workers=1, backend="io_uring", measured_at="x")
    cfg = build_ds_config(recipe(), sizing(), h, False, swap_dir="/s", total_steps=10)
    assert cfg["aio"]["block_size"] == 4 << 20 and cfg["aio"]["queue_depth"] == 32


@pytest.mark.parametrize("precision,key", [("bf16", "bf16"), ("fp16", "fp16")])
def test_precision_sections(precision, key):
    cfg = build_ds_config(recipe(precision=precision), sizing(), None, True, swap_dir="/s", total_steps=10)
    assert cfg[key]["enabled"] is True


@pytest.mark.parametrize("schedule,kind", [("constant", "WarmupLR"), ("linear", "WarmupDecayLR"), ("cosine", "WarmupCosineLR")])
def test_schedules(schedule, kind):
    cfg = build_ds_config(recipe(schedule={"name": schedule, "warmup_steps": 3}), sizing(), None, True,
                          swap_dir="/s", total_steps=20)
    assert cfg["scheduler"]["type"] == kind


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("world", [1, 2])
def test_deepspeed_accepts_the_config(precision, world, tmp_path):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.swap_tensor.aio_config import get_aio_config
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

    cfg = build_ds_config(recipe(precision=precision), sizing(world), None, True, swap_dir=str(tmp_path),
                          total_steps=10)
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

    cfg = build_ds_config(recipe(), sizing(), None, True, swap_dir="/s", total_steps=10)
    z = DeepSpeedZeroConfig(**cfg["zero_optimization"])
    assert z.max_reuse_distance == 0 and z.sub_group_size == cfg["zero_optimization"]["sub_group_size"]


def test_offload_sizing_is_plain_data():
    s = OffloadSizing(largest_partition_numel=1, partition_numel=2, sub_group_size=3, world_size=1,
                      nvme_bytes_per_rank=4)
    assert s.world_size == 1
