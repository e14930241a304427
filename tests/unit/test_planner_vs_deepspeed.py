"""Baseline items P1..P5 equal the buffers a real stock DeepSpeed run allocated (to the byte).

tests/assets/deepspeed_measured.json was recorded by benchmarks/measure_ds_buffers.py from real
DeepSpeed ZeRO-3 runs (params + optimizer on NVMe, CPU accelerator); the slow integration test
tests/integration/test_deepspeed_buffers.py re-measures live against the installed DeepSpeed. The plan's peak is
checked on the system measure (MemTotal - MemAvailable) in test_planner_validation.py; these runs recorded only
ru_maxrss, which also counts ~0.1 GiB of shared-library pages.
"""

import json
import os
from dataclasses import replace

import pytest

from memascend_cli.models import load_model
from memascend_cli.planner import zero
from memascend_cli.planner.memory import JobSpec, estimate
from memascend_cli.planner.spec import HardwareSpec

ASSET = os.path.join(os.path.dirname(__file__), "..", "assets", "deepspeed_measured.json")
ITEMS = {"P1_param_swap_pool": "host/param_swap_pool", "P2_partitioned_swap_buffer": "host/partitioned_swap_buffer",
         "P3_fp16_cpu_params": "host/fp16_cpu_params", "P4_optimizer_swap_pool": "host/optimizer_swap_pool",
         "P5_grad_flat_buffer": "host/grad_flat_buffer"}
CPU_ONLY = HardwareSpec(name="cpu", dram_gib=24)


def planned(case: dict):
    k = case["knobs"]
    job = JobSpec(model=load_model(case["model"]), dtype=case["dtype"], deepspeed_version=case["deepspeed_version"],
                  seq_len=case["job"]["seq_len"], micro_batch=case["job"]["micro_batch"],
                  knobs=replace(zero.DEEPSPEED_DEFAULTS, param_buffer_count=k["param_buffer_count"],
                                param_buffer_size=k["param_buffer_size"], max_in_cpu=k["max_in_cpu"],
                                optimizer_buffer_count=k["optimizer_buffer_count"],
                                sub_group_size=k["sub_group_size"], reduce_bucket_size=k["reduce_bucket_size"]),
                  param_buffer_size_auto=False)
    return estimate(job, CPU_ONLY, "stock")


def assert_matches(case: dict):
    est = planned(case)
    for measured_key, item_key in ITEMS.items():
        item = est.item(item_key)
        assert (item.bytes if item else 0) == case["measured_bytes"][measured_key], measured_key
    # Everything the swap pools mlock shows in VmLck (plus a few kB the process locks anyway).
    assert abs(est.locked_bytes - case["vmlck_kib"]["after_initialize"] * 1024) < 64 * 1024


with open(ASSET) as f:
    CASES = json.load(f)["cases"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_run(name):
    assert_matches(CASES[name])
