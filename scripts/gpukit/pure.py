"""The GPU kit's pure parts: its constants, the time model, wheel names, bench summaries, the parsers of
what the machine reports (dd, junit, ldconfig) and the verdicts from the first probe. No I/O here
(tests/unit/test_gpu_check.py)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARRY_DIR = os.path.join(REPO, ".gpu_carry")
"""Git-ignored; copied to the GPU machine beside the working tree."""
WORK_DIR = os.path.join(REPO, ".gpu_work")
"""Git-ignored; made on the GPU machine by every call (a machine that starts fresh for each call keeps nothing)."""
MiB = 1 << 20
GiB = 1 << 30

DEEPSPEED_VERSION = "0.19.8"
PYTHON_TARGET = "3.12"
# cp312 wheels for an image with glibc 2.28 or later: pip matches manylinux_2_N tags exactly, so list each one.
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                   "manylinux2014_x86_64", "manylinux1_x86_64")
RUNTIME_REQUIREMENTS = ("hjson", "pydantic>=2", "einops", "msgpack", "ninja", "packaging>=20", "psutil", "py-cpuinfo",
                        "tqdm", "nvidia-ml-py")
"""DeepSpeed 0.19.8's requirements (its setup.py) except torch and numpy, which the image has; pip's resolver
there installs only what the image lacks or has too old (pydantic brings pydantic-core and its helpers)."""
BUILD_REQUIREMENTS = ("setuptools>=77", "wheel", "pybind11>=2.11")
"""pyproject.toml [build-system]: the native core is built with --no-build-isolation from these."""
DEBS = ("libaio1", "libaio-dev")
"""DeepSpeed's async_io op links -laio and includes libaio.h (op_builder/async_io.py); the image has neither."""
REQUIRED_DISTS = ("deepspeed", "pydantic", "pydantic_core", "hjson", "setuptools", "wheel", "pybind11")
CARRY_LIMIT_BYTES = 64 * MiB
"""The default most that goes to the GPU machine: tracked + untracked-not-ignored files + the carried folders
(`carry --limit-mib`, `run --carry-limit-mib`)."""

DEFAULT_MODELS = ("qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-1.5b")
"""Ascending size: when time runs out, the larger ones are skipped first."""
BENCH_RUNS = ("stock", "tuned", "memascend")
RUN_COLORS = {"stock": "tab:blue", "tuned": "tab:orange", "memascend": "tab:green"}
VALIDATE_MODEL = "llama-3.2-1b"
"""The 1B-class preset whose bench output tests/gpu/test_gpu_cli.py checks."""
VALIDATE_TEST = "tests/gpu/test_gpu_cli.py::test_memascend_bench_1b_class_preset"
DEFAULT_BUDGET_S = 530.0
"""A call's default wall time (`--budget-s`): the kit ends its own work within 9 minutes, outputs written, so a GPU
machine that stops a command after 10 minutes still gets them."""
RESERVE_S = 25.0
"""Kept back from every step's timeout for writing the outputs."""
PHASES = ("setup", "probe", "constants", "tests", "bench", "validate", "sweep", "capacity", "placements")
"""In this order; a call (gpukit/calls.py) names the ones it runs."""

# Time model of one bench run (for skipping what does not fit): start-up (settle, imports, NCCL,
# zero.Init, initialize) plus the SSD traffic at the measured O_DIRECT speed. Per parameter, ZeRO-3 with
# params and optimizer on NVMe moves about 20 B at init (16-bit params + fp32 master and Adam states
# written) and 40 B per step (params read in forward and backward, fp32 master + exp_avg + exp_avg_sq +
# gradient read and written, 16-bit params written back).
RUN_OVERHEAD_S = 45.0
INIT_IO_BYTES_PER_PARAM = 20
STEP_IO_BYTES_PER_PARAM = 40
DEFAULT_DISK_GBPS = 1.0


def estimate_run_s(num_params: int, steps: int, disk_gbps: float | None, calibration: float = 1.0) -> float:
    """Seconds one bench run of a `num_params` model for `steps` steps should take. Pure."""
    gbps = disk_gbps if disk_gbps and disk_gbps > 0 else DEFAULT_DISK_GBPS
    io_bytes = num_params * (INIT_IO_BYTES_PER_PARAM + steps * STEP_IO_BYTES_PER_PARAM)
    return calibration * (RUN_OVERHEAD_S + io_bytes / (gbps * 1e9))


def run_timeout_s(estimate_s: float, remaining_s: float) -> float:
    """A run may take twice its estimate (at least a minute more), never past what is left. Pure."""
    return max(0.0, min(max(2 * estimate_s, estimate_s + 60), remaining_s))


@dataclass
class BenchDecision:
    model: str
    run: bool
    reason: str
    estimate_s: float = 0.0
    need_disk_bytes: int = 0
    runs_fit: int = 0
    """How many of the runs fit the time left (the first ones of the list run; the call lists the most wanted
    first)."""


def decide_model(model: str, *, num_params: int, need_disk_bytes: int, free_disk_bytes: int | None, steps: int,
                 runs: int, disk_gbps: float | None, remaining_s: float, calibration: float = 1.0) -> BenchDecision:
    """Whether a model's `runs` fit the disk and how many fit the time left (none: skipped). Pure."""
    est = estimate_run_s(num_params, steps, disk_gbps, calibration)
    fit = min(runs, int(remaining_s // est)) if est > 0 else runs
    d = BenchDecision(model, True, "", round(est, 1), need_disk_bytes, fit)
    if free_disk_bytes is not None and need_disk_bytes > free_disk_bytes:
        d.run, d.runs_fit = False, 0
        d.reason = (f"needs ~{need_disk_bytes / GiB:.1f} GiB on the SSD directory, {free_disk_bytes / GiB:.1f} GiB "
                    "free")
    elif fit == 0:
        d.run = False
        d.reason = f"{runs} runs need ~{runs * est:.0f} s, {remaining_s:.0f} s left"
    elif fit < runs:
        d.reason = f"only {fit} of {runs} runs fit: {runs} need ~{runs * est:.0f} s, {remaining_s:.0f} s left"
    return d


def disk_need_bytes(plan_doc: dict) -> int:
    """SSD bytes one model's bench needs at once: the larger of stock's swap files and memascend's region
    (the bench sizes the region at 1.5 x the plan's SSD bytes + 64 MiB, and plans no checkpoint copies),
    plus 2 GiB of slack. Pure."""
    def without_checkpoints(engine: str) -> int:
        items = plan_doc["engines"][engine]["items"]
        return sum(int(i["bytes"]) for i in items if i["tier"] == "nvme" and i["key"] != "nvme/checkpoints")

    stock = without_checkpoints("stock")
    region = int(without_checkpoints("memascend") * 1.5) + 64 * MiB
    return max(stock, region) + 2 * GiB


_WHEEL_RE = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-"
                       r"(?P<plat>[^-]+)\.whl$")


def parse_wheel_name(filename: str) -> dict | None:
    """{name (normalised), version, py, abi, plat} of a wheel file name, or None. Pure."""
    m = _WHEEL_RE.match(filename)
    if not m:
        return None
    d = m.groupdict()
    d["name"] = re.sub(r"[-_.]+", "_", d["name"]).lower()
    return d


def wheel_fits_target(w: dict, py: str = PYTHON_TARGET) -> bool:
    """True if the wheel installs on CPython `py` on x86-64 Linux. Pure."""
    nodot = py.replace(".", "")
    tag = "cp" + nodot

    def py_ok_tag(t: str) -> bool:
        if t in ("py3", f"py{nodot}", tag):
            return True
        # cp36-abi3: the stable ABI of CPython 3.6 and every later 3.x.
        return "abi3" in w["abi"].split(".") and t.startswith("cp3") and int(t[3:] or 0) <= int(nodot[1:])

    py_ok = any(py_ok_tag(t) for t in w["py"].split("."))
    abi_ok = any(a in ("none", "abi3", tag) for a in w["abi"].split("."))
    plat_ok = any(p == "any" or (p.endswith("x86_64") and "linux" in p) for p in w["plat"].split("."))
    return py_ok and abi_ok and plat_ok


def summarize_bench_doc(doc: dict) -> list[dict]:
    """One flat row per run of a `memascend bench` JSON document (keys the bench may not write yet are
    None: peak GPU and pinned bytes arrive with its CUDA support). Pure."""
    rows = []
    for r in doc.get("runs", []):
        pred = r.get("predicted") or {}
        rows.append({
            "model": doc.get("job", {}).get("model"), "run": r.get("name"), "ok": r.get("ok"),
            "error": (r.get("error") or None) and str(r.get("error"))[:300],
            "accelerator": (r.get("env") or {}).get("DS_ACCELERATOR") or doc.get("job", {}).get("accelerator"),
            "peak_system_bytes": r.get("peak_system_bytes"), "ru_maxrss_bytes": r.get("ru_maxrss_bytes"),
            "peak_gpu_bytes": r.get("peak_gpu_bytes"), "peak_gpu_reserved_bytes": r.get("peak_gpu_reserved_bytes"),
            "pinned_bytes": r.get("pinned_bytes"),
            "seconds_per_step": r.get("seconds_per_step"), "tokens_per_s": r.get("tokens_per_s"),
            "ssd_read_bytes": r.get("ssd_read_bytes"), "ssd_written_bytes": r.get("ssd_written_bytes"),
            "predicted_host_peak_bytes": pred.get("node_host_peak_bytes"),
            "predicted_gpu_peak_bytes": pred.get("gpu_peak_bytes"),
            "prediction_error_percent": r.get("prediction_error_percent"),
            "wall_s": r.get("wall_s"),
        })
    return rows


def versus_stock(rows: list[dict]) -> dict:
    """{model: {run: {peak_vs_stock_percent, step_time_vs_stock_percent}}}: each engine against stock. Pure."""
    out: dict = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        by = {r["run"]: r for r in rows if r["model"] == model and r["ok"]}
        stock = by.get("stock")
        if not stock or not stock["peak_system_bytes"]:
            continue
        for name, r in by.items():
            if name == "stock" or not r["peak_system_bytes"]:
                continue
            st = (100.0 * (r["seconds_per_step"] / stock["seconds_per_step"] - 1)
                  if r["seconds_per_step"] and stock["seconds_per_step"] else None)
            out.setdefault(model, {})[name] = {
                "peak_vs_stock_percent": round(100.0 * (r["peak_system_bytes"] / stock["peak_system_bytes"] - 1), 2),
                "step_time_vs_stock_percent": None if st is None else round(st, 2)}
    return out


def parse_dd_gbps(stderr: str) -> float | None:
    """GB/s from GNU dd's last line ('... copied, 1.2 s, 3.4 GB/s'). Pure."""
    m = re.search(r"([\d.,]+)\s*([kMGT]?B)/s\s*$", stderr.strip())
    if not m:
        return None
    value = float(m.group(1).replace(",", "."))
    scale = {"B": 1e-9, "kB": 1e-6, "MB": 1e-3, "GB": 1.0, "TB": 1e3}[m.group(2)]
    return value * scale


def parse_junit(path: str) -> dict | None:
    """{tests, failures, errors, skipped, failed: [names], skipped_reasons: {name: reason}} of a junit file."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed": [], "skipped_reasons": {}}
    for s in suites:
        for k in ("tests", "failures", "errors", "skipped"):
            out[k] += int(s.get(k, 0))
        for case in s.iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                out["failed"].append(name)
            sk = case.find("skipped")
            if sk is not None:
                out["skipped_reasons"][name] = (sk.get("message") or "")[:200]
    return out



def with_cuda_context(rows: list[dict], context_bytes: int | None) -> list[dict]:
    """Rows with the GPU peak the plan predicts: torch's reserved peak (what its caching allocator took from the
    driver) plus the CUDA context measured by the constants phase, which torch's counters never see; the plan's GPU
    figure holds the context as its own item (gpu/cuda_context). Pure."""
    out = []
    for r in rows:
        reserved = r.get("peak_gpu_reserved_bytes")
        out.append({**r, "cuda_context_bytes": context_bytes,
                    "peak_gpu_with_context_bytes": reserved + context_bytes
                    if reserved is not None and context_bytes is not None else None})
    return out


# -- the first seconds: what this machine can do -------------------------------------------------------------

GVISOR_KERNEL = "4.4.0"
"""gVisor reports this kernel release (cloud machines that run in its sandbox)."""


def what_can_run(host: dict) -> tuple[list[str], list[str]]:
    """(lines saying what cannot be measured here and why, the phases that still make sense) from the first probe:
    {gvisor, io_uring, o_direct, loop_devices}. DeepSpeed's async_io (stock, tuned) and memascend's region both
    open their files with O_DIRECT, so without it and without a loop device to make an ext4 with it, no SSD
    offload runs; the native core falls back to its thread pool without io_uring. Pure."""
    lost, phases = [], list(PHASES)
    if host.get("gvisor"):
        lost.append("gVisor sandbox (kernel 4.4.0): system calls may be emulated; step times and I/O speed are not "
                    "those of a real kernel")
    if not host.get("io_uring"):
        lost.append("no io_uring: memascend's native core runs on its thread pool (the bench says so per run)")
    ssd_ok = host.get("o_direct") or host.get("loop_devices")
    if not host.get("o_direct"):
        lost.append("no O_DIRECT on the work directory" + ("; an ext4 loop device will carry the SSD files"
                                                           if host.get("loop_devices") else ""))
    if not ssd_ok:
        lost.append("no O_DIRECT and no loop device: no SSD offload can run (bench, sweep and the SSD GPU tests "
                    "fail); still measured: the CUDA runtime constants and the pinned-memory GPU tests")
        phases = ["setup", "probe", "constants", "tests"]
    return lost, phases


def parse_ldconfig(text: str, name: str) -> str | None:
    """Path of the x86-64 library `name` in `ldconfig -p` output. Pure."""
    for line in text.splitlines():
        m = re.match(r"\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)", line)
        if m and m.group(1) == name and "x86-64" in m.group(2):
            return m.group(3)
    return None


def cuda_home_of(nvcc: str | None) -> str | None:
    """CUDA_HOME of an nvcc binary (DIR/bin/nvcc: DIR), which torch.utils.cpp_extension also derives from
    `which nvcc` when CUDA_HOME is unset. Pure."""
    if not nvcc:
        return None
    bin_dir = os.path.dirname(nvcc)
    return os.path.dirname(bin_dir) if os.path.basename(bin_dir) == "bin" else None


# -- the context sweep -------------------------------------------------------------------------------------------

SWEEP_SEQ_LENS = (8192, 16384, 32768, 65536, 131072)
"""Call 4's contexts, each engine until it fails or the call's time ends."""


def sweep_stops(points: list[dict]) -> dict:
    """{engine: {largest_ok_seq, failed_seq, reason}} from sweep points {engine, seq_len, ok, error}: where each
    engine stopped. Pure."""
    out: dict = {}
    for p in sorted(points, key=lambda p: p["seq_len"]):
        e = out.setdefault(p["engine"], {"largest_ok_seq": None, "failed_seq": None, "reason": None})
        if p["ok"] and e["failed_seq"] is None:
            e["largest_ok_seq"] = p["seq_len"]
        elif not p["ok"] and e["failed_seq"] is None:
            e["failed_seq"], e["reason"] = p["seq_len"], (p.get("error") or "")[:300]
    return out


def plan_max_seq(plan_doc: dict, engine: str) -> int | None:
    """The plan's largest context for `engine` (its search). Pure."""
    search = (plan_doc.get("engines", {}).get(engine) or {}).get("search") or {}
    return int(search["max_seq_len"]) if search.get("max_seq_len") else None


def compiler_errors(log_text: str, limit: int = 40) -> list[str]:
    """The lines of an op build's log that say why it failed (gcc/nvcc/ld errors, DeepSpeed's own), at most
    `limit`. Pure."""
    pat = re.compile(r"error:|error \d|fatal|undefined reference|cannot find -l|No such file|RuntimeError|"
                     r"Error building extension|not found", re.IGNORECASE)
    return [ln.rstrip() for ln in log_text.splitlines() if pat.search(ln)][:limit]


def runtime_constants(samples: dict, *, gpu_total_bytes: int) -> dict:
    """The planner's CUDA constants from the measurement's samples {phase: {rss_anon_bytes, system_used_bytes,
    gpu_free_bytes, torch_reserved_bytes}} at the phases start (bare python), imports (torch, deepspeed,
    transformers), context (first CUDA tensor), cublas (a bf16 matmul) and nccl (init_distributed + an
    all_reduce: NCCL builds its communicator at the first collective) and step (a training step's first uses, its
    tensors freed; the runtime the plan takes is measured there, before it when absent). Host: what the system sees
    used beyond the bare interpreter (MemTotal - MemAvailable, the plan's view) plus the interpreter's own anonymous
    memory;
    GPU: device memory in use that torch's caching allocator does not own (context, kernels, cuBLAS workspace,
    NCCL buffers), which the plan holds as gpu/cuda_context. Pure."""
    s0, last = samples["start"], samples["nccl"]
    after_step = samples.get("step", last)

    def gpu_other(ph: dict) -> int:
        return gpu_total_bytes - ph["gpu_free_bytes"] - ph["torch_reserved_bytes"]

    return {
        "host_runtime_bytes": after_step["system_used_bytes"] - s0["system_used_bytes"] + s0["rss_anon_bytes"],
        "host_runtime_before_step_bytes": last["system_used_bytes"] - s0["system_used_bytes"] + s0["rss_anon_bytes"],
        "host_runtime_rss_anon_bytes": after_step["rss_anon_bytes"],
        "host_cuda_bytes": last["system_used_bytes"] - samples["imports"]["system_used_bytes"],
        "host_imports_bytes": samples["imports"]["system_used_bytes"] - s0["system_used_bytes"],
        "cuda_context_gpu_bytes": gpu_other(last),
        "cuda_context_gpu_bytes_after_step": gpu_other(after_step) if "gpu_free_bytes" in after_step else None,
        "cuda_context_gpu_bytes_before_nccl": gpu_other(samples["cublas"]),
        "cuda_context_gpu_bytes_bare": gpu_other(samples["context"]),
    }


# -- the capacity search under a DRAM cap ------------------------------------------------------------------------

CAPACITY_MODEL = "smollm2-360m"
"""The capacity call's preset: on a GPU box under an 8 GiB DRAM cap the plan puts tuned's longest context at tens of
thousands of tokens (its host memory grows ~60 KB a token, the activation checkpoints it keeps in host memory; at
seq 2048 it plans ~5 GiB) and memascend's far beyond, so tuned's search and a memascend probe at twice tuned's
maximum are minutes, not hours, of training. qwen2.5-0.5b's tuned does not fit 8 GiB at all (~8.7 GiB planned at
seq 2048); bench-llama-136m's tuned maximum is ~300K tokens, too long a probe for one call."""
CAPACITY_DRAM_CAP = "8GiB"
CAPACITY_STEPS = 3
"""Steps of every capacity probe: tuned's glibc heap grew again in step 3 on a CPU (bench/capacity.py
CAPACITY_STEPS), so step 3 is in; a 4th costs a probe's worth of time over a search."""
SEQ_GRID_TOKENS = 256
"""The seq axis' grid step (memascend_cli/planner/search.py SEQ_GRANULE): 'within one grid step' is this many tokens."""
MEMASCEND_PROBE_FACTOR = 2
"""The capacity check: memascend's longest context >= 2x tuned's. One memascend probe at that context shows it (a search from
memascend's planned maximum, hundreds of thousands of tokens, would not end within a call)."""
FIT, OOM, STALLED, FAILED = "fit", "oom", "stalled", "failed"
"""A capacity probe's outcome, as memascend_cli/bench/capacity.py outcome() says it."""


def capacity_outcome(run: dict) -> str:
    """FIT, OOM, STALLED or FAILED of one bench run record (bench/capacity.py outcome, stdlib here). Pure."""
    if run.get("ok"):
        return FIT
    if run.get("oom_killed"):
        return OOM
    return STALLED if run.get("timed_out") or run.get("thrashed") else FAILED


def capacity_probe(value: int, run: dict) -> dict:
    """One probe of a capacity search: the value, its outcome, the cgroup's own peak and the plan's there. Pure."""
    return {"value": value, "outcome": capacity_outcome(run), "error": (run.get("error") or None) and
            str(run["error"])[:300], "steps_done": len(run.get("losses") or []),
            "cgroup_peak_bytes": (run.get("cgroup") or {}).get("peak_bytes"),
            "peak_system_bytes": run.get("peak_system_bytes"), "peak_gpu_bytes": run.get("peak_gpu_bytes"),
            "planned_peak_bytes": (run.get("predicted") or {}).get("node_host_peak_bytes"),
            "seconds_per_step": run.get("seconds_per_step"), "wall_s": run.get("wall_s")}


_PLANNED_MAX_RE = re.compile(r"^(?P<run>[\w-]+): planned max (?P<value>\d+|none fits) ", re.MULTILINE)


def parse_planned_max(log_text: str, run: str) -> tuple[bool, int | None]:
    """(found, the plan's maximum) from `bench --capacity`'s first line for `run` ("tuned: planned max 51200 tokens
    under 8.00 GiB ..."; capacity_run.search_engine): what a search cut off before its capacity.json still says.
    Pure."""
    for m in _PLANNED_MAX_RE.finditer(log_text):
        if m.group("run") == run:
            return True, None if m.group("value") == "none fits" else int(m.group("value"))
    return False, None


def measured_max(probes: list[dict]) -> tuple[int | None, bool]:
    """(the largest value that fit below every value that did not, whether the search proved it: the next grid value
    did not fit) from a search's probes, however far it got. Pure."""
    fits = sorted(q["value"] for q in probes if q["outcome"] == FIT)
    misses = sorted(q["value"] for q in probes if q["outcome"] in (OOM, STALLED))
    below = [v for v in fits if not misses or v < misses[0]]
    best = below[-1] if below else None
    proven = best is not None and bool(misses) and misses[0] - best <= SEQ_GRID_TOKENS
    return best, proven


def memascend_probe_value(tuned_max: int | None, proven: bool, tuned_planned: int | None) -> tuple[int | None, str]:
    """memascend's one probe: MEMASCEND_PROBE_FACTOR x tuned's measured maximum when its search proved it; else x the
    larger of its planned maximum and its largest fit, plus two grid steps (the plan within one step of the
    measurement is the other bar). Pure."""
    if tuned_max and proven:
        return MEMASCEND_PROBE_FACTOR * tuned_max, f"{MEMASCEND_PROBE_FACTOR} x tuned's measured maximum"
    base = max(tuned_planned or 0, tuned_max or 0)
    if base:
        return (MEMASCEND_PROBE_FACTOR * (base + 2 * SEQ_GRID_TOKENS),
                f"{MEMASCEND_PROBE_FACTOR} x (tuned's planned maximum or largest fit + 2 grid steps): its search did "
                "not end")
    return None, "tuned has no maximum to double (the plan says nothing fits and no probe fit)"


def capacity_summary(*, model: str, cap: str, cgroup: dict, tuned_planned: int | None, tuned_probes: list[dict],
                     tuned_stopped_by: str, memascend_value: int | None, memascend_basis: str,
                     memascend_probe: dict | None) -> dict:
    """gpu_capacity.json's findings: tuned's search (its plan's maximum, every probe, the measured maximum and whether
    the next grid value was shown not to fit), memascend's probe and the checks on them (capacity_verdict). Pure."""
    best, proven = measured_max(tuned_probes)
    tuned = {"planned_max": tuned_planned, "measured_max": best, "measured_max_proven": proven,
             "stopped_by": tuned_stopped_by, "probes": sorted(tuned_probes, key=lambda q: q["value"])}
    memascend = {"value": memascend_value, "basis": memascend_basis, "probe": memascend_probe}
    return {"schema_version": 1, "model": model, "axis": "seq", "dram_cap": cap, "steps": CAPACITY_STEPS,
            "grid_step_tokens": SEQ_GRID_TOKENS, "cgroup": cgroup, "tuned": tuned, "memascend": memascend,
            "verdict": capacity_verdict(tuned, memascend)}


def rehearsal_run(*, fits: bool, peak_bytes: int, planned_bytes: int, steps: int,
                  seconds_per_step: float | None) -> dict:
    """A bench run record as a dry run's synthetic output stands it in (`call N --dry-run`: the plan's numbers where a
    GPU run's measurements go), so `record` and the results page are exercised on the shapes the calls write. Pure."""
    return {"ok": fits, "oom_killed": not fits, "error": None if fits else "OOM-killed (synthetic: the plan's peak "
            "is over the cap)", "losses": [0.0] * (steps if fits else steps - 1), "cgroup": {"peak_bytes": peak_bytes},
            "peak_system_bytes": peak_bytes, "predicted": {"node_host_peak_bytes": planned_bytes},
            "seconds_per_step": seconds_per_step, "wall_s": None}


def capacity_verdict(tuned: dict, memascend: dict) -> dict:
    """The checks on the capacity call's summary: memascend fits at >= 2x tuned's measured maximum; tuned's planned
    maximum within one grid step of its measured one; tuned not OOM-killed at its planned maximum. None where the
    call did not get that far. Pure."""
    m_max, proven = tuned.get("measured_max"), tuned.get("measured_max_proven")
    planned = tuned.get("planned_max")
    probe = memascend.get("probe") or {}
    ratio_ok = None
    if probe and m_max:
        fit = probe["outcome"] == FIT
        ratio_ok = True if fit and probe["value"] >= MEMASCEND_PROBE_FACTOR * m_max else (False if not fit else None)
    at_planned = next((q for q in tuned.get("probes") or [] if q["value"] == planned), None)
    return {"memascend_at_least_2x": ratio_ok,
            "memascend_over_tuned": round(probe["value"] / m_max, 2) if probe.get("outcome") == FIT and m_max
            else None,
            "tuned_within_one_step": None if not (proven and planned is not None)
            else abs(planned - m_max) <= SEQ_GRID_TOKENS,
            "tuned_killed_at_planned": None if at_planned is None else at_planned["outcome"] in (OOM, STALLED)}


# -- the placement sweep -----------------------------------------------------------------------------------------

WEIGHTS = ("random, gradient clipping off (a converted SmolLM2-135M is ~270 MB in bf16, over the 64 MiB that travels "
           "with a call; random weights' gradient norms are far over any clipping a trained model's pass)")
"""What the capacity and placement calls train, recorded in their JSON."""

PLACEMENT_MODELS = ("llama-3.2-1b", "qwen2.5-1.5b")
PLACEMENT_SWEEP = (("gpu", "tuned"), ("dram", "tuned"), ("dram", "memascend"), ("split", "tuned"),
                   ("split", "memascend"), ("ssd", "memascend"), ("ssd", "tuned"))
"""(placement, bench run) in the order the call measures them: the rows `memascend plan` prices (planner/placement.py)
that no GPU has measured first, the all-SSD rows (measured on an H100 and an H200, docs/bench/gpu/) last. Stock
DeepSpeed's rows run as tuned (stock given memascend's knobs; stock as its docs configure it fails at step 2 beyond
1e9 parameters); memascend's dram and split rows are its DRAM tier (engine/dram_tier.py); at gpu memascend runs
stock's ZeRO-3 config unchanged, so one run stands for both."""
PLACEMENT_STEPS = 2
"""s/step is step 2's (bench averages steps 2..N)."""


def placement_io_share(placement: str) -> float:
    """The share of the all-SSD run's SSD traffic a placement keeps, for its time estimate (split: about half). Pure."""
    return {"gpu": 0.0, "dram": 0.0, "split": 0.5}.get(placement, 1.0)


def placement_row(placement: str, row: dict, bytes_per_param: dict | None) -> dict:
    """One row of the sweep's table: a bench row (summarize_bench_doc) at `placement`, with its SSD bytes per
    parameter. Pure."""
    keep = ("model", "run", "ok", "error", "seconds_per_step", "tokens_per_s", "peak_system_bytes", "peak_gpu_bytes",
            "peak_gpu_reserved_bytes", "predicted_host_peak_bytes", "predicted_gpu_peak_bytes", "wall_s")
    return {"placement": placement, **{k: row.get(k) for k in keep},
            "ssd_read_bytes_per_param": (bytes_per_param or {}).get("read"),
            "ssd_write_bytes_per_param": (bytes_per_param or {}).get("write")}


def linear_bytes(points: tuple[tuple[int, int], tuple[int, int]], seq: int) -> int:
    """Bytes at context `seq` on the line through two (seq, bytes) points of a plan. Pure."""
    (s1, b1), (s2, b2) = points
    return int(b1 + (b2 - b1) * (seq - s1) / (s2 - s1))


def grid_max_under(points: tuple[tuple[int, int], tuple[int, int]], cap_bytes: int) -> int | None:
    """The largest context on the seq grid whose bytes on that line stay within `cap_bytes` (None: not even the first
    point; a line that does not grow has no maximum: None too). Pure."""
    (s1, b1), (s2, b2) = points
    if b1 > cap_bytes or b2 <= b1:
        return None
    seq = s1 + (cap_bytes - b1) * (s2 - s1) / (b2 - b1)
    return int(seq // SEQ_GRID_TOKENS) * SEQ_GRID_TOKENS
