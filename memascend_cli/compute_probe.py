"""The compute device a plan's time model uses: a GPU from planner.time's table, or this CPU measured by a short
matmul probe (run once by `plan`, `train` or `memascend inspect --cpu-probe` and cached per CPU), and what the probe
says about reduced precision on this CPU (bf16/fp16 without native kernels run a slow fallback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from memascend_cli.planner import time as tm

PROBE_SOURCE = "`memascend inspect --cpu-probe`"
"""How a device's source names the probe (the rate is then the probe's times CPU_ACHIEVED_FRACTION)."""

PROBE_VERSION = 2
"""Bumped when what the probe measures changes; a cache of another version is probed again."""

PROBE_N = 2048
"""The largest square matmul side: 17 GFLOP per multiply, the BLAS kernels' steady state (CPU_ACHIEVED_FRACTION was
fitted against the best of 5 at this size). A dtype whose multiplies are too slow for its budget stops smaller."""

PROBE_BUDGET_S = {"fp32": 3.0, "bf16": 2.0, "fp16": 2.0}
"""Seconds of matmuls each dtype may spend: the whole probe (torch's import included) ends well under 15 s on any
CPU, however slow its bf16 fallback (~1 GFLOP/s on an AVX2-only CPU: one 2048^3 bf16 multiply alone takes 17 s)."""

MEM_PROBE_ELEMS = 32 * 2**20
"""fp32 elements of each of the memory probe's three arrays (384 MiB in all: far past any last-level cache)."""

MEM_PROBE_RUNS = 5
"""Timed triads after two warm-ups (the first touches fault pages in): the best is the rate, ~0.1 s in all at 10 GB/s.
A cached probe from before the memory probe keeps its matmul rates (PROBE_VERSION unchanged) and has no memory rate
until `memascend inspect --cpu-probe` measures again."""

PROBE_TIMEOUT_S = 30.0
"""The probe child's hard limit; the dtypes it measured before it are kept."""

SLOW_RATIO = 1.5
"""A reduced-precision dtype slower than fp32 by at least this factor gets a note: bf16/fp16 halve the bytes a matmul
moves, so with native kernels they run at least as fast as fp32 (this CPU with AMX: ~17x faster)."""

KERNEL_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")
"""Environment variables that change which matmul kernels torch picks (or how many threads): part of the cache key."""

PRECISION_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_fp16",
                   "amx_bf16", "amx_fp16", "amx_tile", "bf16", "asimdhp", "sve")
"""/proc/cpuinfo flags that decide torch's CPU matmul kernels per dtype (x86 `flags`, Arm `Features`)."""

# Run in a child so that the CLI process never imports torch. One JSON line per dtype as soon as it is measured, so a
# timeout keeps what was done. First the memory bandwidth: STREAM's triad (a = b + s * c) on torch's threads, the
# bytes that STREAM counts (read b and c, write a: 12 per element), the best of MEM_PROBE_RUNS; a step of ZeRO-Offload
# (the CPU Adam over every parameter) is bound by it, not by the matmuls. Then the matmuls: sizes grow from 256 while
# the next size (8x the work) fits the dtype's budget twice (a warm-up and one timed multiply); the rate is the best
# of up to 5 at the largest size reached.
_PROBE_SRC = r"""
import json, sys, time
import torch
budgets = json.loads(sys.argv[1])
def supported(name):
    try:
        return bool(getattr(torch.ops.mkldnn, "_is_mkldnn_" + name + "_supported")())
    except Exception:
        return None
print(json.dumps({"threads": torch.get_num_threads(), "torch": torch.__version__,
                  "onednn_bf16": supported("bf16"), "onednn_fp16": supported("fp16")}), flush=True)
n = MEM_ELEMS
a, b, c = torch.empty(n), torch.full((n,), 1.0), torch.full((n,), 2.0)
runs = []
for i in range(2 + MEM_RUNS):
    t0 = time.perf_counter(); torch.add(b, c, alpha=3.0, out=a); runs.append(time.perf_counter() - t0)
print(json.dumps({"mem_triad_gbps": round(12 * n / min(runs[2:]) / 1e9, 2), "mem_triad_bytes": 12 * n}), flush=True)
del a, b, c
for name, budget in budgets.items():
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
    start, n, best = time.perf_counter(), 256, None
    while True:
        a = torch.randn(n, n).to(dt); b = torch.randn(n, n).to(dt)
        runs = []
        for _ in range(6):
            t0 = time.perf_counter(); a @ b; runs.append(time.perf_counter() - t0)
            if time.perf_counter() - start + runs[-1] > budget:
                break
        best = (n, min(runs[1:] or runs))
        left = budget - (time.perf_counter() - start)
        if n >= N_MAX or 2 * 8 * best[1] > left:
            break
        n *= 2
    print(json.dumps({"dtype": name, "gflops": round(2 * best[0] ** 3 / best[1] / 1e9, 1), "n": best[0],
                      "seconds": round(time.perf_counter() - start, 2)}), flush=True)
""".replace("N_MAX", str(PROBE_N)).replace("MEM_ELEMS", str(MEM_PROBE_ELEMS)).replace("MEM_RUNS", str(MEM_PROBE_RUNS))


def parse_probe_output(text: str) -> dict | None:
    """The probe's result from its JSON lines (possibly cut short by a timeout): {"threads", "torch",
    "onednn_bf16", "onednn_fp16", "mem_triad_gbps", "mem_triad_bytes", "<dtype>_gflops", "<dtype>_n", "<dtype>_s"};
    None when not even the header came. Pure."""
    out: dict = {}
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        if "dtype" in rec:
            d = rec["dtype"]
            out.update({f"{d}_gflops": rec["gflops"], f"{d}_n": rec["n"], f"{d}_s": rec["seconds"]})
        else:
            out.update(rec)
    return out if "threads" in out else None


def run_probe(timeout_s: float = PROBE_TIMEOUT_S, budgets: dict | None = None) -> dict | None:
    """The probe's GFLOP/s per dtype (parse_probe_output), not cached; None when torch is missing or fails. A dtype
    the timeout cut is absent (`incomplete` lists it)."""
    budgets = dict(PROBE_BUDGET_S if budgets is None else budgets)
    t0 = time.monotonic()
    try:
        res = subprocess.run([sys.executable, "-c", _PROBE_SRC, json.dumps(budgets)], capture_output=True,
                             timeout=timeout_s)
        stdout, ok = res.stdout, res.returncode == 0
    except subprocess.TimeoutExpired as exc:
        stdout, ok = exc.stdout or b"", False
    except OSError:
        return None
    found = parse_probe_output(stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout)
    if found is None:
        return None
    missing = [d for d in budgets if f"{d}_gflops" not in found]
    if missing or not ok:
        found["incomplete"] = missing
    found["probe_s"] = round(time.monotonic() - t0, 1)
    return found


def parse_cpu_flags(cpuinfo: str) -> list[str]:
    """PRECISION_FLAGS this CPU has, from /proc/cpuinfo's first `flags` (x86) or `Features` (Arm) line. Pure."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            have = set(value.split())
            return [f for f in PRECISION_FLAGS if f in have]
    return []


def local_cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return parse_cpu_flags(f.read())
    except OSError:
        return []


def kernel_env(env=None) -> dict:
    env = os.environ if env is None else env
    return {k: env[k] for k in KERNEL_ENV if env.get(k)}


def cache_path() -> str:
    from memascend_cli.defaults import cache_home

    return os.path.join(cache_home("probe"), "cpu-matmul.json")


def probe_cpu(cpu_model: str | None, cpu_cores: int, timeout_s: float = PROBE_TIMEOUT_S) -> dict | None:
    """The matmul GFLOP/s per dtype of this CPU (torch in a child process) with its precision flags, cached when fp32
    was measured; None when torch is missing or the probe fails (the plan then says the compute time is unknown)."""
    found = run_probe(timeout_s)
    if found is None:
        return None
    found.update(cpu_model=cpu_model, cpu_cores=cpu_cores, cpu_flags=local_cpu_flags(), kernel_env=kernel_env(),
                 probe_version=PROBE_VERSION, measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    if not found.get("fp32_gflops"):
        return found
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(found, f)
        os.replace(tmp, path)  # concurrent probes (test workers, two plans) never leave half a file
    except OSError:
        pass  # a read-only home: the probe still reports, the next plan probes again
    return found


def cached_cpu(cpu_model: str | None, cpu_cores: int) -> dict | None:
    """The cached probe of this CPU (same model name, core count, kernel environment and probe version), or None."""
    try:
        with open(cache_path()) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    same = (found.get("cpu_model") == cpu_model and found.get("cpu_cores") == cpu_cores
            and found.get("probe_version") == PROBE_VERSION and found.get("kernel_env", {}) == kernel_env())
    return found if same else None


def local_cpu_rates(cpu_model: str | None, cpu_cores: int) -> dict | None:
    """This CPU's cached probe, else a probe now (cached), announced on stderr since it takes seconds. None when
    torch is missing or the probe fails."""
    found = cached_cpu(cpu_model, cpu_cores)
    if found is not None:
        return found
    from memascend_cli.console import err

    err.print(f"measuring this CPU's matmul rates once (up to ~{sum(PROBE_BUDGET_S.values()) + 5:.0f} s; cached for "
              "later plans and runs)", highlight=False)
    return probe_cpu(cpu_model, cpu_cores)


def torch_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def unknown_rate_hint() -> str:
    """How to get this CPU's rate, for the plan's "unknown" compute device: what failed decides what works."""
    if not torch_importable():
        return (f"unknown: torch is not installed for {sys.executable} (`bash scripts/bootstrap.sh test` or "
                "`pip install torch` lets plan measure it), or give --cpu-gflops")
    return "unknown: the matmul probe failed (see `memascend inspect --cpu-probe`), or give --cpu-gflops"


def plan_device(hw, dtype: str, *, cpu_gflops: float | None = None, gpu_tflops: float | None = None,
                cpu_model: str | None = None, rates: dict | None = None) -> tm.Device:
    """The device of a plan: the GPU (table or --gpu-tflops), else the CPU (--cpu-gflops, else `rates`, this
    machine's probe, when the plan is of this machine, else unknown), its host work priced for this machine's CPU
    model (`cpu_model`, else the probe's, else /proc/cpuinfo's) when the plan is of this machine (planner.time
    host_terms_of); a profile's CPU is not known: the default host terms, which the plan says were not fitted on
    it."""
    if hw.num_gpus:
        from memascend_cli.planner import measured

        return tm.gpu_device(hw.gpu_name, measured_tflops=gpu_tflops, rates=measured.time_rates(hw.gpu_name))
    if hw.name != "local":
        return tm.cpu_device(cpu_gflops, "--cpu-gflops") if cpu_gflops else \
            tm.cpu_device(None, "unknown: this CPU's probe says nothing of a profile; give --cpu-gflops")
    if cpu_model is None:
        from memascend_cli.hardware import local_cpu_model

        cpu_model = (rates or {}).get("cpu_model") or local_cpu_model()
    if cpu_gflops:
        return tm.cpu_device(cpu_gflops, "--cpu-gflops", cpu_model)
    if rates is None:
        rates = cached_cpu(cpu_model, hw.cpu_cores)
    rate = (rates or {}).get(f"{dtype}_gflops")
    if rate:
        return tm.cpu_device(rate * tm.CPU_ACHIEVED_FRACTION,
                             f"{PROBE_SOURCE} {rate:g} GFLOP/s x {tm.CPU_ACHIEVED_FRACTION}", cpu_model)
    if rates and rates.get("fp32_gflops"):
        return tm.cpu_device(None, f"unknown: the probe's {dtype} matmuls did not finish in its time budget (a slow "
                                   "fallback); train in fp32 (--dtype fp32) or give --cpu-gflops", cpu_model)
    return tm.cpu_device(None, unknown_rate_hint(), cpu_model)


def precision_reason(dtype: str, flags: list[str], onednn: bool | None, env: dict | None = None) -> str:
    """Why torch has no fast `dtype` matmul on this CPU, from its flags and oneDNN's own check. Pure."""
    env = env or {}
    capped = [f"{k}={env[k]}" for k in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA") if env.get(k)]
    native = {"bf16": ("avx512_bf16", "amx_bf16", "bf16"), "fp16": ("avx512_fp16", "amx_fp16", "asimdhp")}[dtype]
    has = [f for f in native if f in flags]
    if has and capped:
        return f"the CPU has {', '.join(has)} but {', '.join(capped)} keeps oneDNN from using it"
    if has:
        return f"the CPU has {', '.join(has)}, yet torch's oneDNN {dtype} kernels are " + (
            "off here" if onednn is False else "slow here")
    avx512 = all(f in flags for f in ("avx512bw", "avx512vl", "avx512dq"))
    what = "AVX-512 but " if avx512 else "no AVX-512 and "
    return (f"this CPU has {what}no {dtype} instructions ({', '.join(native[:2])}): torch's {dtype} matmul "
            f"{'has no oneDNN kernel here and runs a scalar fallback' if onednn is False else 'runs a slow path'}")


def slow_precision_note(dtype: str, rates: dict | None) -> str | None:
    """One line when `dtype` (bf16/fp16) matmuls are at least SLOW_RATIO times slower than fp32 on this CPU by the
    probe's rates (or did not finish in their budget while fp32 did), with the measured ratio and the flag to
    change; None when they are not, for fp32, and without a probe. Pure."""
    if dtype not in ("bf16", "fp16") or not rates or not rates.get("fp32_gflops"):
        return None
    fp32, low = rates["fp32_gflops"], rates.get(f"{dtype}_gflops")
    reason = precision_reason(dtype, rates.get("cpu_flags") or [], rates.get(f"onednn_{dtype}"),
                              rates.get("kernel_env"))
    fix = (f"train in fp32 (`--dtype fp32`; in a recipe `precision: fp32`, in a LLaMA-Factory one "
           f"`{dtype}: false`)")
    if low is None:
        if dtype not in (rates.get("incomplete") or []):
            return None
        return f"{dtype} matmuls did not finish in the probe's budget while fp32 ran {fp32:g} GFLOP/s: {reason}; {fix}"
    if fp32 / low < SLOW_RATIO:
        return None
    return (f"{dtype} matmuls run {fp32 / low:.0f}x slower than fp32 on this CPU ({low:g} vs {fp32:g} GFLOP/s, "
            f"by its matmul probe): {reason}; {fix}")
