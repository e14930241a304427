"""The compute device a plan's time model uses: a GPU from planner.time's table, or this CPU measured by a short
matmul probe (`memascend inspect --cpu-probe` runs it and caches the result, so `plan` need not re-probe)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from memascend_cli.planner import time as tm

PROBE_SOURCE = "`memascend inspect --cpu-probe`"
"""How a device's source names the probe (the rate is then the probe's times CPU_ACHIEVED_FRACTION)."""

PROBE_N = 2048
"""Square matmul side: 17 GFLOP per multiply, enough for the BLAS kernels' steady state; ~1 s in all on 2 cores."""

# Run in a child so that the CLI process never imports torch; best of 5 after a warm-up.
_PROBE_SRC = """
import json, time, torch
out = {"threads": torch.get_num_threads()}
for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    a = torch.randn(%(n)d, %(n)d).to(dt); b = torch.randn(%(n)d, %(n)d).to(dt)
    a @ b
    best = min((lambda t0: (a @ b, time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(5))
    out[name + "_gflops"] = round(2 * %(n)d ** 3 / best / 1e9, 1)
print(json.dumps(out))
""" % {"n": PROBE_N}


def cache_path() -> str:
    from memascend_cli.run.recipe import cache_home

    return os.path.join(cache_home("probe"), "cpu-matmul.json")


def run_probe(timeout_s: float = 60.0) -> dict | None:
    """The probe's GFLOP/s ({"fp32_gflops", "bf16_gflops", "threads"}), not cached; None when it fails."""
    try:
        res = subprocess.run([sys.executable, "-c", _PROBE_SRC], capture_output=True, text=True, timeout=timeout_s)
        return json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def probe_cpu(cpu_model: str | None, cpu_cores: int, timeout_s: float = 60.0) -> dict | None:
    """fp32 and bf16 matmul GFLOP/s of this CPU (torch in a child process), cached; None when torch is missing or
    the probe fails (the plan then says the compute time is unknown)."""
    found = run_probe(timeout_s)
    if found is None:
        return None
    found.update(cpu_model=cpu_model, cpu_cores=cpu_cores)
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(found, f)
    except OSError:
        pass  # a read-only home: the probe still reports, plan re-asks for --cpu-gflops
    return found


def cached_cpu(cpu_model: str | None, cpu_cores: int) -> dict | None:
    """The cached probe of this CPU (same model name and core count), or None."""
    try:
        with open(cache_path()) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    same = found.get("cpu_model") == cpu_model and found.get("cpu_cores") == cpu_cores
    return found if same else None


def plan_device(hw, dtype: str, *, cpu_gflops: float | None = None, gpu_tflops: float | None = None,
                cpu_model: str | None = None) -> tm.Device:
    """The device of a plan: the GPU (table or --gpu-tflops), else the CPU (--cpu-gflops, else this machine's
    cached probe when the plan is of this machine, else unknown)."""
    if hw.num_gpus:
        return tm.gpu_device(hw.gpu_name, measured_tflops=gpu_tflops)
    if cpu_gflops:
        return tm.cpu_device(cpu_gflops, "--cpu-gflops")
    if hw.name == "local":
        found = cached_cpu(cpu_model, hw.cpu_cores)
        key = "fp32_gflops" if dtype == "fp32" else "bf16_gflops"
        if found and found.get(key):
            return tm.cpu_device(found[key] * tm.CPU_ACHIEVED_FRACTION,
                                 f"{PROBE_SOURCE} {found[key]:g} GFLOP/s x "
                                 f"{tm.CPU_ACHIEVED_FRACTION}")
    return tm.cpu_device(None, "unknown: run `memascend inspect --cpu-probe` or give --cpu-gflops")
