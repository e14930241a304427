"""compute_probe: which device a plan's time model uses, and the cached CPU matmul probe."""

import importlib.util
import json
import os

import pytest

from memascend_cli import compute_probe as cp
from memascend_cli.planner import time as tm
from memascend_cli.planner.spec import HardwareSpec


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMASCEND_CACHE", str(tmp_path))
    return tmp_path


def _local(**kw):
    return HardwareSpec(name="local", dram_gib=24.0, cpu_cores=2, **kw)


def test_gpu_plan_uses_the_table_or_the_measurement(cache):
    hw = HardwareSpec(name="p", dram_gib=512, num_gpus=1, gpu_name="NVIDIA H100 80GB HBM3", gpu_mem_gib=80)
    assert cp.plan_device(hw, "bf16").flops_per_s == pytest.approx(989e12 * tm.GPU_ACHIEVED_FRACTION)
    assert cp.plan_device(hw, "bf16", gpu_tflops=500).flops_per_s == 500e12


def test_cpu_plan_uses_the_cache_of_this_cpu_only(cache):
    os.makedirs(os.path.dirname(cp.cache_path()))
    with open(cp.cache_path(), "w") as f:
        json.dump({"fp32_gflops": 100.0, "bf16_gflops": 400.0, "threads": 2, "cpu_model": "X", "cpu_cores": 2}, f)
    # The probe's rate times the fraction a whole step achieves of it; --cpu-gflops is taken as given.
    fraction = tm.CPU_ACHIEVED_FRACTION
    assert cp.plan_device(_local(), "fp32", cpu_model="X").flops_per_s == pytest.approx(100e9 * fraction)
    assert cp.plan_device(_local(), "bf16", cpu_model="X").flops_per_s == pytest.approx(400e9 * fraction)
    assert cp.plan_device(_local(), "fp32", cpu_model="Y").flops_per_s is None
    # A profile describes another machine: this CPU's probe says nothing about it.
    assert cp.plan_device(HardwareSpec(name="cpu-24g", dram_gib=24, cpu_cores=2), "fp32",
                          cpu_model="X").flops_per_s is None
    assert cp.plan_device(_local(), "fp32", cpu_gflops=50, cpu_model="Y").flops_per_s == 50e9


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the probe runs torch in a child process")
def test_probe_measures_and_caches(cache):
    found = cp.probe_cpu("X", 2)
    assert found["fp32_gflops"] > 0 and found["bf16_gflops"] > 0
    assert cp.cached_cpu("X", 2) == found
    assert cp.cached_cpu("X", 4) is None
