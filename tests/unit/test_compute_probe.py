"""compute_probe: which device a plan's time model uses, the CPU matmul probe per dtype, and the note for a reduced
precision that runs a slow fallback on this CPU. The recorded probes in tests/assets/cpu were measured on one Xeon
with AMX: as it is (native bf16/fp16) and with ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN limited to AVX2, as on an AVX2-only
CPU: torch's bf16 matmul then takes its scalar fallback)."""

import importlib.util
import json
import os
import time

import pytest

from memascend_cli import compute_probe as cp
from memascend_cli.planner import time as tm
from memascend_cli.planner.spec import HardwareSpec

ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "cpu")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="the probe runs torch in a child process")


def recorded(name: str) -> dict:
    with open(os.path.join(ASSETS, f"probe-{name}.json")) as f:
        return json.load(f)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMASCEND_CACHE", str(tmp_path))
    for k in cp.KERNEL_ENV:
        monkeypatch.delenv(k, raising=False)
    return tmp_path


def _local(**kw):
    return HardwareSpec(name="local", dram_gib=24.0, cpu_cores=2, **kw)


def _write_cache(found: dict) -> None:
    os.makedirs(os.path.dirname(cp.cache_path()), exist_ok=True)
    with open(cp.cache_path(), "w") as f:
        json.dump(found, f)


def test_gpu_plan_uses_the_table_or_the_measurement(cache):
    hw = HardwareSpec(name="p", dram_gib=512, num_gpus=1, gpu_name="NVIDIA H100 80GB HBM3", gpu_mem_gib=80)
    assert cp.plan_device(hw, "bf16").flops_per_s == pytest.approx(989e12 * tm.GPU_ACHIEVED_FRACTION)
    assert cp.plan_device(hw, "bf16", gpu_tflops=500).flops_per_s == 500e12


def test_cpu_plan_uses_the_cache_of_this_cpu_only(cache):
    _write_cache({"fp32_gflops": 100.0, "bf16_gflops": 400.0, "threads": 2, "cpu_model": "X", "cpu_cores": 2,
                  "probe_version": cp.PROBE_VERSION, "kernel_env": {}})
    # The probe's rate times the fraction a whole step achieves of it; --cpu-gflops is taken as given.
    fraction = tm.CPU_ACHIEVED_FRACTION
    assert cp.plan_device(_local(), "fp32", cpu_model="X").flops_per_s == pytest.approx(100e9 * fraction)
    assert cp.plan_device(_local(), "bf16", cpu_model="X").flops_per_s == pytest.approx(400e9 * fraction)
    assert cp.plan_device(_local(), "fp32", cpu_model="Y").flops_per_s is None
    # A profile describes another machine: this CPU's probe says nothing about it.
    assert cp.plan_device(HardwareSpec(name="cpu-24g", dram_gib=24, cpu_cores=2), "fp32",
                          cpu_model="X").flops_per_s is None
    assert cp.plan_device(_local(), "fp32", cpu_gflops=50, cpu_model="Y").flops_per_s == 50e9


def test_a_cache_of_an_older_probe_or_other_kernels_is_not_used(cache, monkeypatch):
    base = {"fp32_gflops": 100.0, "bf16_gflops": 400.0, "threads": 2, "cpu_model": "X", "cpu_cores": 2}
    _write_cache(base)  # version 1: its bf16 rate may be a timeout's absence
    assert cp.cached_cpu("X", 2) is None
    _write_cache({**base, "probe_version": cp.PROBE_VERSION, "kernel_env": {}})
    assert cp.cached_cpu("X", 2) is not None
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # other kernels: another rate
    assert cp.cached_cpu("X", 2) is None


def test_probe_output_cut_short_keeps_what_was_measured():
    header = '{"threads": 2, "torch": "2.13.0", "onednn_bf16": false, "onednn_fp16": false}'
    mem = '{"mem_triad_gbps": 9.87, "mem_triad_bytes": 402653184}'
    fp32 = '{"dtype": "fp32", "gflops": 61.5, "n": 2048, "seconds": 2.9}'
    found = cp.parse_probe_output("\n".join([header, mem, fp32, '{"dtype": "bf16", "gfl']))
    assert found == {"threads": 2, "torch": "2.13.0", "onednn_bf16": False, "onednn_fp16": False,
                     "mem_triad_gbps": 9.87, "mem_triad_bytes": 402653184, "fp32_gflops": 61.5, "fp32_n": 2048,
                     "fp32_s": 2.9}
    assert cp.parse_probe_output("Traceback (most recent call last):\nImportError: torch") is None


def test_cpu_flags_from_cpuinfo():
    xeon = "processor\t: 0\nflags\t\t: fpu sse avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_bf16\n"
    epyc = "processor\t: 0\nflags\t\t: fpu sse avx avx2 fma bmi2 sha_ni\nprocessor\t: 1\nflags\t\t: avx512f\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd asimdhp sve bf16 i8mm\n"
    assert cp.parse_cpu_flags(xeon) == ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                                        "avx512_bf16", "amx_bf16"]
    assert cp.parse_cpu_flags(epyc) == ["avx2", "fma"]  # the first CPU's line
    assert cp.parse_cpu_flags(arm) == ["bf16", "asimdhp", "sve"]
    assert cp.parse_cpu_flags("") == []


def test_slow_bf16_note_on_a_cpu_without_native_kernels():
    slow = recorded("avx2")
    note = cp.slow_precision_note("bf16", slow)
    ratio = slow["fp32_gflops"] / slow["bf16_gflops"]
    assert f"{ratio:.0f}x slower than fp32" in note and "--dtype fp32" in note and "bf16: false" in note
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in note  # the reason: the flags are there, oneDNN may not use them
    assert "fp16: false" in cp.slow_precision_note("fp16", slow)
    assert cp.slow_precision_note("fp32", slow) is None
    # An AVX2-only CPU: no AVX-512, no bf16 instructions, oneDNN's check false.
    epyc = {**slow, "cpu_flags": ["avx2", "fma"], "kernel_env": {}}
    assert "no AVX-512 and no bf16 instructions (avx512_bf16, amx_bf16)" in cp.slow_precision_note("bf16", epyc)
    # bf16 cut by the probe's budget while fp32 finished: still slow, said as such.
    cut = {k: v for k, v in epyc.items() if not k.startswith("bf16_")} | {"incomplete": ["bf16"]}
    assert "did not finish in the probe's budget" in cp.slow_precision_note("bf16", cut)


def test_no_note_where_bf16_is_native_or_unmeasured():
    assert cp.slow_precision_note("bf16", recorded("native")) is None
    assert cp.slow_precision_note("fp16", recorded("native")) is None
    assert cp.slow_precision_note("bf16", None) is None
    # Slower than fp32 but within SLOW_RATIO (AVX-512 without bf16 instructions: oneDNN converts to fp32).
    near = {"fp32_gflops": 100.0, "bf16_gflops": 100.0 / (cp.SLOW_RATIO * 0.9), "cpu_flags": ["avx512f"]}
    assert cp.slow_precision_note("bf16", near) is None


def test_unknown_rate_hint_names_what_works(monkeypatch):
    monkeypatch.setattr(cp, "torch_importable", lambda: False)
    assert "torch is not installed" in cp.unknown_rate_hint() and "--cpu-gflops" in cp.unknown_rate_hint()
    monkeypatch.setattr(cp, "torch_importable", lambda: True)
    assert "probe failed" in cp.unknown_rate_hint()


@pytest.mark.slow
@needs_torch
def test_probe_measures_and_caches(cache):
    t0 = time.monotonic()
    found = cp.probe_cpu("X", 2)
    # Every dtype in its own budget: the whole probe ends well inside its hard timeout, however slow the machine.
    assert time.monotonic() - t0 < cp.PROBE_TIMEOUT_S
    assert found["fp32_gflops"] > 0 and found["fp32_n"] > 0
    assert found["mem_triad_gbps"] > 0 and found["mem_triad_bytes"] == 12 * cp.MEM_PROBE_ELEMS
    for d in ("bf16", "fp16"):
        assert found.get(f"{d}_gflops", 0) > 0 or d in found["incomplete"]
    assert cp.cached_cpu("X", 2) == found
    assert cp.cached_cpu("X", 4) is None


@pytest.mark.slow
@needs_torch
def test_probe_with_onednn_held_to_avx2_reports_fp32_and_a_slow_bf16(cache, monkeypatch):
    """oneDNN held to AVX2 is an AVX2-only CPU to torch's bf16 matmul: the probe must still end in its budget with
    the fp32 rate, and say that bf16 is slow (where oneDNN's bf16 check is off, which it is on every x86 CPU that
    honours ONEDNN_MAX_CPU_ISA)."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    t0 = time.monotonic()
    found = cp.probe_cpu("X", 2)
    assert time.monotonic() - t0 < sum(cp.PROBE_BUDGET_S.values()) + 15  # the budgets, torch's import, the last run
    assert found["fp32_gflops"] > 0
    if found["onednn_bf16"] is False:
        assert "slower than fp32" in cp.slow_precision_note("bf16", found) or "did not finish" in \
            cp.slow_precision_note("bf16", found)


def test_inspect_shows_the_memory_bandwidth_where_the_probe_has_it():
    from memascend_cli.commands.inspect import matmul_lines

    found = {"fp32_gflops": 100.0, "threads": 2}
    assert not any("memory" in line for line in matmul_lines(found, measured_now=False))
    lines = matmul_lines({**found, "mem_triad_gbps": 9.5}, measured_now=True)
    assert "CPU memory bandwidth: 9.5 GB/s (STREAM triad, 2 threads)" in lines
