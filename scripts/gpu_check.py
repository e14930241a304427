#!/usr/bin/env python3
"""The GPU kit (issue 11): everything a lent GPU machine needs to test and measure memascend, in two steps.

The lent machine (shared/docs/platform-notes.md §13a) has Python 3.12 with torch (CUDA 13), transformers,
pybind11, pytest, nvcc, ninja and matplotlib, reaches no package registry, takes at most 64 MiB of files
with the working tree, and runs one command for at most 10 minutes. So:

Step 1, here (a machine that reaches PyPI and Debian's archive), from the repo root:

    bash scripts/gpu_check.sh carry

  builds .gpu_carry/ (git-ignored): the DeepSpeed wheel built from its sdist (pure Python: its ops are
  JIT-built there with nvcc), Python 3.12 wheels of DeepSpeed's requirements the image may lack (pydantic,
  hjson, ...) and of the native core's build requirements (setuptools>=77, wheel, pybind11), and libaio's
  .deb files for DeepSpeed's async_io op (unpacked into a private prefix there; the native core needs no
  liburing: it drives io_uring through raw syscalls). It writes .gpu_carry/manifest.json and checks that the
  working tree plus the folder stay under 64 MiB.

Step 2, there, with `.gpu_carry` in the device call's carry list:

    bash scripts/gpu_check.sh run              # one ~9-minute command; JSON, plots and a log to $OUT
    bash scripts/gpu_check.sh run --dry-run    # anywhere: checks the inputs, prints every command

  Phases (``--phases``, default all): setup (private venv layered on the image's Python, installs from
  the carry folder with --no-index, builds the native core and DeepSpeed's async_io / cpu_adam ops),
  probe (O_DIRECT and io_uring on the work disk, with a loop-device ext4 fallback; the native engine's
  back end; dd bandwidth), tests (`pytest -m gpu`), bench (`memascend bench` stock / tuned / memascend
  per preset, random weights, each run with its own time budget; presets that do not fit the time or the
  disk are skipped with the reason and the command for a next call), validate (the 1B-class bench test
  on the bench's own output). Work files live in .gpu_work/ (git-ignored), which a warm machine keeps
  between calls: a second call right after the first skips the installs and the op builds.

Outputs in $OUT (at most 8 files come back): gpu_check.log, gpu_check.json (summary), pytest_gpu.xml,
gpu_bench.json (every bench document), gpu_bench.png (summary plot), bench_<model>.png (memory over time).

Stdlib only: it runs on the image's python3 before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARRY_DIR = os.path.join(REPO, ".gpu_carry")
"""Git-ignored; named in the device call's carry list."""
WORK_DIR = os.path.join(REPO, ".gpu_work")
"""Git-ignored; a warm device machine keeps it between calls (ignored build outputs stay there)."""
MiB = 1 << 20
GiB = 1 << 30

DEEPSPEED_VERSION = "0.19.8"
PYTHON_TARGET = "3.12"
# The device tool's advice for cp312 wheels (device/README.md): pip matches manylinux_2_N exactly.
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
"""The device tool carries at most 64 MiB: tracked + untracked-not-ignored files + the carried folders."""

DEFAULT_MODELS = ("qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-1.5b")
"""Ascending size: when time runs out, the larger ones are skipped first."""
BENCH_RUNS = ("stock", "tuned", "memascend")
RUN_COLORS = {"stock": "tab:blue", "tuned": "tab:orange", "memascend": "tab:green"}
VALIDATE_MODEL = "llama-3.2-1b"
"""The 1B-class preset whose bench output tests/gpu/test_gpu_cli.py checks."""
VALIDATE_TEST = "tests/gpu/test_gpu_cli.py::test_memascend_bench_1b_class_preset"
DEFAULT_BUDGET_S = 540.0
"""The device tool stops a command at 600 s; the kit ends its own work by then, outputs written."""
RESERVE_S = 25.0
"""Kept back from every step's timeout for writing the outputs."""
PHASES = ("setup", "probe", "tests", "bench", "validate")

# Time model of one bench run (for skipping what does not fit): start-up (settle, imports, NCCL,
# zero.Init, initialize) plus the SSD traffic at the measured O_DIRECT speed. Per parameter, ZeRO-3 with
# params and optimizer on NVMe moves about 20 B at init (16-bit params + fp32 master and Adam states
# written) and 40 B per step (params read in forward and backward, fp32 master + exp_avg + exp_avg_sq +
# gradient read and written, 16-bit params written back); deepspeed-notes §7 has the per-item bytes.
RUN_OVERHEAD_S = 45.0
INIT_IO_BYTES_PER_PARAM = 20
STEP_IO_BYTES_PER_PARAM = 40
DEFAULT_DISK_GBPS = 1.0


# ---------------------------------------------------------------------------------------------------
# Pure parts (tests/unit/test_gpu_check.py)


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


def decide_model(model: str, *, num_params: int, need_disk_bytes: int, free_disk_bytes: int | None, steps: int,
                 runs: int, disk_gbps: float | None, remaining_s: float, calibration: float = 1.0) -> BenchDecision:
    """Whether all `runs` of a model fit the time left and the disk. Pure."""
    est = estimate_run_s(num_params, steps, disk_gbps, calibration)
    d = BenchDecision(model, True, "", round(est, 1), need_disk_bytes)
    if free_disk_bytes is not None and need_disk_bytes > free_disk_bytes:
        d.run = False
        d.reason = (f"needs ~{need_disk_bytes / GiB:.1f} GiB on the SSD directory, {free_disk_bytes / GiB:.1f} GiB "
                    "free")
    elif runs * est > remaining_s:
        d.run = False
        d.reason = f"{runs} runs need ~{runs * est:.0f} s, {remaining_s:.0f} s left"
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


def check_manifest(manifest: dict, carry_dir: str, *, verify_hashes: bool = True) -> list[str]:
    """Problems with a carry folder (empty list: complete). Reads the files it names."""
    problems = []
    files = manifest.get("files", [])
    names = set()
    for f in files:
        path = os.path.join(carry_dir, f["path"])
        if not os.path.isfile(path):
            problems.append(f"{f['path']} is listed in the manifest but missing")
            continue
        if os.path.getsize(path) != f["bytes"]:
            problems.append(f"{f['path']} has {os.path.getsize(path)} bytes, the manifest says {f['bytes']}")
        elif verify_hashes and sha256_file(path) != f["sha256"]:
            problems.append(f"{f['path']} does not match its sha256")
        if f["path"].startswith("wheels/"):
            w = parse_wheel_name(os.path.basename(f["path"]))
            if w is None:
                problems.append(f"{f['path']} is not a wheel file name")
                continue
            names.add(w["name"])
            if not wheel_fits_target(w):
                problems.append(f"{f['path']} does not install on CPython {PYTHON_TARGET} x86-64 Linux")
            if w["name"] == "deepspeed" and w["version"] != DEEPSPEED_VERSION:
                problems.append(f"{f['path']}: DeepSpeed {w['version']}, the kit pins {DEEPSPEED_VERSION}")
    for d in REQUIRED_DISTS:
        if d not in names:
            problems.append(f"no wheel of {d} in the carry folder")
    debs = [os.path.basename(f["path"]) for f in files if f["path"].startswith("debs/")]
    for pkg in DEBS:
        if not any(b.startswith((pkg + "_", pkg + "t64_")) for b in debs):
            problems.append(f"no .deb of {pkg} in the carry folder")
    return problems


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
            "peak_gpu_bytes": r.get("peak_gpu_bytes"), "pinned_bytes": r.get("pinned_bytes"),
            "seconds_per_step": r.get("seconds_per_step"), "tokens_per_s": r.get("tokens_per_s"),
            "ssd_read_bytes": r.get("ssd_read_bytes"), "ssd_written_bytes": r.get("ssd_written_bytes"),
            "predicted_host_peak_bytes": pred.get("node_host_peak_bytes"),
            "predicted_gpu_peak_bytes": pred.get("gpu_peak_bytes"),
            "prediction_error_percent": r.get("prediction_error_percent"),
            "wall_s": r.get("wall_s"),
        })
    return rows


def versus_stock(rows: list[dict]) -> dict:
    """{model: {run: {peak_vs_stock_percent, step_time_vs_stock_percent}}} for the issue's bar. Pure."""
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


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------
# Size of what travels with a device call


def travelling_bytes(repo: str, extra_dirs: list[str]) -> dict:
    """Bytes the device tool would send: tracked and untracked-not-ignored files, plus `extra_dirs`."""
    def git_files(*args):
        r = subprocess.run(["git", "-C", repo, "ls-files", "-z", *args], capture_output=True, check=True)
        return [p for p in r.stdout.decode().split("\0") if p]

    tree = 0
    for rel in set(git_files()) | set(git_files("--others", "--exclude-standard")):
        p = os.path.join(repo, rel)
        if os.path.isfile(p) and not os.path.islink(p):
            tree += os.path.getsize(p)
    extra = {d: dir_bytes(d) for d in extra_dirs}
    return {"tree_bytes": tree, "carried_bytes": extra, "total_bytes": tree + sum(extra.values()),
            "limit_bytes": CARRY_LIMIT_BYTES}


def dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for n in files:
            p = os.path.join(root, n)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


# ---------------------------------------------------------------------------------------------------
# Step 1: the carry folder


def build_carry(dest: str, python: str) -> int:
    """pip wheel / pip download / apt-get download into `dest`, then the manifest and the size check."""
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    wheels, debs = os.path.join(tmp, "wheels"), os.path.join(tmp, "debs")
    os.makedirs(wheels)
    os.makedirs(debs)
    pip = [python, "-m", "pip", "--disable-pip-version-check"]

    def sh(cmd, cwd=None):
        print("$ " + shlex.join(cmd), flush=True)
        subprocess.run(cmd, cwd=cwd, check=True)

    # DeepSpeed ships only an sdist; its setup.py finds no torch in the isolated build env, so nothing is
    # compiled (platform-notes §2.2): a pure-Python wheel whose ops JIT-build on first use.
    sh(pip + ["wheel", "--no-deps", "--no-cache-dir", "-w", wheels, f"deepspeed=={DEEPSPEED_VERSION}"])
    platform_args = [a for p in WHEEL_PLATFORMS for a in ("--platform", p)]
    sh(pip + ["download", "--only-binary=:all:", "--python-version", PYTHON_TARGET, "--implementation", "cp",
              *platform_args, "--no-cache-dir", "-d", wheels, *RUNTIME_REQUIREMENTS, *BUILD_REQUIREMENTS])
    try:
        sh(["apt-get", "download", *DEBS], cwd=debs)
    except subprocess.CalledProcessError:
        sh(["apt-get", "update", "-qq"])
        sh(["apt-get", "download", *DEBS], cwd=debs)

    files = []
    for sub in ("wheels", "debs"):
        for n in sorted(os.listdir(os.path.join(tmp, sub))):
            p = os.path.join(tmp, sub, n)
            files.append({"path": f"{sub}/{n}", "bytes": os.path.getsize(p), "sha256": sha256_file(p)})
    manifest = {"schema_version": 1, "deepspeed_version": DEEPSPEED_VERSION, "python_target": PYTHON_TARGET,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": files}
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    problems = check_manifest(manifest, tmp)
    if problems:
        print("carry folder incomplete:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    for f in files:
        print(f"  {f['bytes'] / MiB:7.2f} MiB  {f['path']}")
    size = travelling_bytes(REPO, [dest])
    print(f"carry folder {dir_bytes(dest) / MiB:.2f} MiB; working tree {size['tree_bytes'] / MiB:.2f} MiB; "
          f"total {size['total_bytes'] / MiB:.2f} MiB of {CARRY_LIMIT_BYTES / MiB:.0f} MiB")
    if size["total_bytes"] > CARRY_LIMIT_BYTES:
        print("error: the working tree plus the carry folder exceed what the device tool carries", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------------------------
# Step 2: running on the GPU machine


@dataclass
class StepRecord:
    name: str
    status: str  # ok | failed | timeout | skipped | dry-run
    seconds: float = 0.0
    rc: int | None = None
    note: str = ""
    cmd: str = ""


@dataclass
class Kit:
    """State of one `run`: paths, the clock, the log, the records."""

    args: argparse.Namespace
    out_dir: str
    work: str
    carry: str
    deadline: float
    dry_run: bool
    log_path: str
    steps: list[StepRecord] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    storage: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    background: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)

    # -- paths ---------------------------------------------------------------------------------------
    @property
    def venv(self) -> str:
        return os.path.join(self.work, "venv")

    @property
    def py(self) -> str:
        return os.path.join(self.venv, "bin", "python")

    @property
    def ssd(self) -> str:
        return self.storage.get("dir") or os.path.join(self.work, "ssd")

    def remaining(self) -> float:
        return self.deadline - time.monotonic() - RESERVE_S

    # -- logging -------------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} {max(0, self.remaining()):5.0f}s left] {text}"
        print(line, flush=True)
        with open(self.log_path, "a") as f:
            f.write(line + "\n")

    def append_log_file(self, path: str, max_lines: int = 400) -> None:
        try:
            with open(path, errors="replace") as f:
                lines = f.readlines()
        except OSError:
            return
        cut = lines[-max_lines:]
        with open(self.log_path, "a") as f:
            if len(lines) > len(cut):
                f.write(f"    ... {len(lines) - len(cut)} earlier lines in {path}\n")
            f.writelines("    " + ln for ln in cut)
        for ln in cut[-15:]:
            print("    " + ln, end="", flush=True)

    # -- running -------------------------------------------------------------------------------------
    def run(self, name: str, cmd: list[str], *, cap_s: float, min_s: float = 5.0, env: dict | None = None,
            cwd: str | None = None, stdout_path: str | None = None, echo_lines: int = 400) -> StepRecord:
        """Run `cmd` with a timeout of min(cap_s, time left); its output goes to WORK/logs/NAME.log and
        the main log. In dry-run mode, print it instead."""
        full_env = {**os.environ, **self.env, **(env or {})}
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        text = (shown + " " if shown else "") + shlex.join(cmd)
        timeout = min(cap_s, self.remaining())
        rec = StepRecord(name, "dry-run", cmd=text)
        if self.dry_run:
            print(f"[{name}] (timeout {cap_s:.0f} s){' cwd=' + cwd if cwd else ''}\n    $ {text}", flush=True)
            self.steps.append(rec)
            return rec
        if timeout < min_s:
            rec.status, rec.note = "skipped", f"no time left ({max(0, timeout):.0f} s < {min_s:.0f} s)"
            self.log(f"{name}: skipped, {rec.note}")
            self.steps.append(rec)
            return rec
        log_file = os.path.join(self.work, "logs", f"{name}.log")
        self.log(f"{name}: $ {text}  (timeout {timeout:.0f} s)")
        t0 = time.monotonic()
        with open(log_file, "w") as lf, open(stdout_path, "w") if stdout_path else open(os.devnull, "w") as so:
            try:
                proc = subprocess.Popen(cmd, stdout=so if stdout_path else lf, stderr=lf, env=full_env, cwd=cwd,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                rec.status, rec.note = "failed", f"cannot start: {exc}"
                self.log(f"{name}: {rec.note}")
                self.steps.append(rec)
                return rec
            try:
                rec.rc = proc.wait(timeout=timeout)
                rec.status = "ok" if rec.rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the step's own process group (launchers start ranks)
                proc.wait()
                rec.status, rec.note = "timeout", f"stopped after {timeout:.0f} s"
        rec.seconds = round(time.monotonic() - t0, 1)
        self.log(f"{name}: {rec.status} in {rec.seconds} s" + (f" (rc {rec.rc})" if rec.rc else "")
                 + (f", {rec.note}" if rec.note else ""))
        self.append_log_file(log_file, echo_lines)
        self.steps.append(rec)
        return rec

    def start(self, name: str, cmd: list[str], *, env: dict | None = None) -> None:
        """Start `cmd` in the background (joined by :meth:`join`)."""
        text = shlex.join(cmd)
        if self.dry_run:
            print(f"[{name}] (background)\n    $ {text}", flush=True)
            self.steps.append(StepRecord(name, "dry-run", cmd=text))
            return
        log_file = os.path.join(self.work, "logs", f"{name}.log")
        self.log(f"{name}: started in the background: $ {text}")
        lf = open(log_file, "w")  # noqa: SIM115 - closed in join()
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env={**os.environ, **self.env, **(env or {})},
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.background[name] = (proc, lf, log_file, time.monotonic(), text)

    def join(self, name: str) -> StepRecord | None:
        if self.dry_run or name not in self.background:
            return None
        proc, lf, log_file, t0, text = self.background.pop(name)
        rec = StepRecord(name, "ok", cmd=text)
        try:
            rec.rc = proc.wait(timeout=max(1.0, self.remaining()))
            rec.status = "ok" if rec.rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rec.status, rec.note = "timeout", "out of time"
        lf.close()
        rec.seconds = round(time.monotonic() - t0, 1)
        self.log(f"{name}: {rec.status} after {rec.seconds} s" + (f" (rc {rec.rc})" if rec.rc else ""))
        self.append_log_file(log_file, 60)
        self.steps.append(rec)
        return rec

    def capture(self, cmd: list[str], timeout: float = 60, env: dict | None = None) -> tuple[int, str, str]:
        """A quick query (not a step): rc, stdout, stderr; never raises for a missing program."""
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                               env={**os.environ, **self.env, **(env or {})})
            return r.returncode, r.stdout, r.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 127, "", str(exc)


# -- phase: setup ---------------------------------------------------------------------------------------


def base_site_dirs(python: str) -> list[str]:
    code = ("import json, sys; print(json.dumps([p for p in sys.path if p.rstrip('/').endswith(('site-packages', "
            "'dist-packages'))]))")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def extract_deb(deb: str, dest: str) -> list[str]:
    """`dpkg -x` in Python (an ar archive holding data.tar.*), so no dpkg is needed on the GPU image."""
    import io

    members = []
    with open(deb, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise ValueError(f"{deb} is not an ar archive")
        while True:
            header = f.read(60)
            if len(header) < 60:
                break
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            if name.startswith("data.tar"):
                with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
                    tar.extractall(dest, filter="tar") if hasattr(tarfile, "tar_filter") else tar.extractall(dest)
                    members = tar.getnames()
    return members


def aio_env(prefix: str) -> dict:
    """Compiler, linker and loader paths for libaio unpacked under `prefix` (DeepSpeed's is_compatible reads
    CFLAGS/LDFLAGS; its JIT build reads CPATH/LIBRARY_PATH through gcc)."""
    inc = os.path.join(prefix, "usr", "include")
    lib = os.path.join(prefix, "usr", "lib", "x86_64-linux-gnu")

    def prepend(var, value, sep=":"):
        old = os.environ.get(var, "")
        return value + (sep + old if old else "")

    return {"CPATH": prepend("CPATH", inc), "LIBRARY_PATH": prepend("LIBRARY_PATH", lib),
            "LD_LIBRARY_PATH": prepend("LD_LIBRARY_PATH", lib), "CFLAGS": prepend("CFLAGS", f"-I{inc}", " "),
            "LDFLAGS": prepend("LDFLAGS", f"-L{lib}", " ")}


def phase_setup(kit: Kit) -> bool:
    manifest_path = os.path.join(kit.carry, "manifest.json")
    stamp_path = os.path.join(kit.work, "setup.stamp")
    manifest_sha = sha256_file(manifest_path) if os.path.isfile(manifest_path) else "missing"
    base_py = kit.args.python
    # Installs are skipped when a warm machine kept the venv of this very carry folder.
    stamp = ""
    if os.path.isfile(stamp_path):
        with open(stamp_path) as f:
            stamp = f.read().strip()
    fresh = not (stamp == manifest_sha and os.path.isfile(kit.py))
    if fresh or kit.dry_run:
        if not kit.dry_run:
            shutil.rmtree(kit.venv, ignore_errors=True)
        r = kit.run("venv", [base_py, "-m", "venv", "--without-pip", kit.venv], cap_s=60)
        if r.status not in ("ok", "dry-run"):
            return False
        # The venv sees the image's packages (torch, transformers, pip, pytest...) through a .pth file, and
        # takes precedence over them: pip installs only what is missing or too old, into the venv.
        if kit.dry_run:
            print(f"[venv-pth] write {kit.venv}/lib/python{PYTHON_TARGET}/site-packages/zz_image.pth listing "
                  f"the site-packages of {base_py}")
        else:
            site = subprocess.run([kit.py, "-c", "import site; print(site.getsitepackages()[0])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            with open(os.path.join(site, "zz_image.pth"), "w") as f:
                # addsitedir (not a bare path) also runs the .pth files of the image's site-packages.
                f.write("".join(f"import site; site.addsitedir({d!r})\n" for d in base_site_dirs(base_py)))
        wheels = os.path.join(kit.carry, "wheels")
        r = kit.run("pip-install", [kit.py, "-m", "pip", "install", "--no-index", "--find-links", wheels,
                                    "--no-cache-dir", "--disable-pip-version-check", "--no-warn-script-location",
                                    f"deepspeed=={DEEPSPEED_VERSION}", *BUILD_REQUIREMENTS], cap_s=180)
        if r.status not in ("ok", "dry-run"):
            return False
        aio = os.path.join(kit.work, "aio")
        deb_dir = os.path.join(kit.carry, "debs")
        debs = sorted(os.path.join(deb_dir, n) for n in os.listdir(deb_dir)) if os.path.isdir(deb_dir) else []
        if kit.dry_run:
            print(f"[aio-debs] unpack {', '.join(os.path.basename(d) for d in debs) or '(none)'} into {aio}")
        else:
            for d in debs:
                extract_deb(d, aio)
            kit.log(f"libaio unpacked into {aio}: "
                    + ", ".join(sorted(os.listdir(os.path.join(aio, "usr", "lib", "x86_64-linux-gnu")))))
        if not kit.dry_run:
            with open(stamp_path, "w") as f:
                f.write(manifest_sha)
    else:
        kit.log(f"setup: {kit.venv} already holds this carry folder's packages (warm machine): installs skipped")
    # Ops first (the long pole, in the background), the native core meanwhile.
    probe = "from deepspeed.ops.op_builder import {b}; {b}().load(verbose=False); print('{b} loaded')"
    for name, builder in (("op-async-io", "AsyncIOBuilder"), ("op-cpu-adam", "CPUAdamBuilder")):
        kit.start(name, [kit.py, "-c", probe.format(b=builder)])
    r = kit.run("native-build", [kit.py, "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation",
                                 "--no-cache-dir", "--disable-pip-version-check", "--no-warn-script-location", "-e",
                                 REPO], cap_s=240, cwd=REPO)
    code = ("import json, torch; from memascend_engine import native; import deepspeed\n"
            "from deepspeed.accelerator import get_accelerator as g\n"
            "print(json.dumps({'native': native.available(), 'cuda_runtime': native.cuda_runtime_status() "
            "if native.available()[0] else None, 'torch': torch.__version__, 'torch_cuda': torch.version.cuda, "
            "'cuda_available': torch.cuda.is_available(), 'deepspeed': deepspeed.__version__, "
            "'accelerator': g().device_name(), 'backend': g().communication_backend_name()}))")
    facts_path = os.path.join(kit.work, "logs", "import-check.json")
    r2 = kit.run("import-check", [kit.py, "-c", code], cap_s=90, cwd="/", stdout_path=facts_path)
    if not kit.dry_run and r2.status == "ok":
        with open(facts_path) as f:
            kit.facts["installed"] = json.load(f)
        kit.log("installed: " + json.dumps(kit.facts["installed"]))
    return r.status in ("ok", "dry-run") and r2.status in ("ok", "dry-run")


# -- phase: probe ---------------------------------------------------------------------------------------


def _inspect_path(kit: Kit, path: str) -> dict | None:
    rc, out, err = kit.capture([kit.py, "-m", "memascend_cli", "inspect", "--nvme-path", path, "--json"], timeout=120)
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        kit.log(f"inspect --nvme-path {path} failed (rc {rc}): {err.strip()[-400:]}")
        return None


def _loop_fallback(kit: Kit, size_bytes: int) -> dict | None:
    """An ext4 file system on a loop device over a sparse file in WORK (root): O_DIRECT works there even
    when the work directory's own file system (overlayfs, gVisor's) refuses it."""
    img = os.path.join(kit.work, "ssd.img")
    mnt = os.path.join(kit.work, "ssd-loop")
    os.makedirs(mnt, exist_ok=True)
    steps = [["truncate", "-s", str(size_bytes), img]]
    for cmd in steps:
        if kit.capture(cmd)[0] != 0:
            return None
    rc, dev, err = kit.capture(["losetup", "-f", "--show", img])
    if rc != 0:
        kit.log(f"loop fallback: losetup failed: {err.strip()}")
        return None
    dev = dev.strip()
    kit.storage["loop_device"] = dev
    for cmd in (["mkfs.ext4", "-q", "-F", "-E", "nodiscard", dev], ["mount", dev, mnt]):
        rc, _, err = kit.capture(cmd, timeout=300)
        if rc != 0:
            kit.log(f"loop fallback: {' '.join(cmd)} failed: {err.strip()}")
            kit.capture(["losetup", "-d", dev])
            kit.storage.pop("loop_device", None)
            return None
    kit.storage["loop_mount"] = mnt
    return _inspect_path(kit, mnt)


def _dd_speed(kit: Kit, path: str, nbytes: int = 1 * GiB) -> dict:
    f = os.path.join(path, "dd-probe.bin")
    count = str(nbytes // (4 * MiB))
    rc_w, _, err_w = kit.capture(["dd", "if=/dev/zero", f"of={f}", "bs=4M", f"count={count}", "oflag=direct",
                                  "conv=fsync"], timeout=120)
    rc_r, _, err_r = kit.capture(["dd", f"if={f}", "of=/dev/null", "bs=4M", "iflag=direct"], timeout=120)
    try:
        os.unlink(f)
    except OSError:
        pass
    return {"write_gbps": parse_dd_gbps(err_w) if rc_w == 0 else None,
            "read_gbps": parse_dd_gbps(err_r) if rc_r == 0 else None}


def phase_probe(kit: Kit) -> bool:
    target = os.path.join(kit.work, "ssd")
    if kit.dry_run:
        print(f"[probe] $ {kit.py} -m memascend_cli inspect --nvme-path {target} --json   (O_DIRECT, io_uring, "
              "libaio; if O_DIRECT fails: truncate + losetup -f + mkfs.ext4 + mount under .gpu_work/ssd-loop)")
        print(f"[probe] native IOEngine(backend='auto') on {target}: io_uring, else the thread pool (reported)")
        print(f"[probe] $ dd if=/dev/zero of={target}/dd-probe.bin bs=4M count=256 oflag=direct conv=fsync; dd ... "
              "iflag=direct (GB/s for the time budget)")
        kit.storage = {"dir": target, "kind": "dry-run"}
        return True
    os.makedirs(target, exist_ok=True)
    info = _inspect_path(kit, target)
    path_info = (info or {}).get("path") or {}
    kit.storage = {"dir": target, "kind": "work directory", "fstype": path_info.get("fstype"),
                   "o_direct_ok": path_info.get("o_direct_ok"), "o_direct_reason": path_info.get("o_direct_reason"),
                   "free_bytes": path_info.get("free_bytes"), "io_backends": (info or {}).get("io_backends")}
    if not path_info.get("o_direct_ok"):
        free = path_info.get("free_bytes") or shutil.disk_usage(kit.work).free
        size = max(8 * GiB, min(free - 4 * GiB, 56 * GiB))
        kit.log(f"O_DIRECT refused on {target} ({path_info.get('fstype')}: {path_info.get('o_direct_reason')}); "
                f"trying an ext4 loop device of {size / GiB:.0f} GiB")
        loop = _loop_fallback(kit, int(size))
        lp = (loop or {}).get("path") or {}
        if lp.get("o_direct_ok"):
            kit.storage.update({"dir": kit.storage["loop_mount"], "kind": f"ext4 on {kit.storage['loop_device']} "
                                f"(loop over {target}'s file system)", "fstype": lp.get("fstype"),
                                "o_direct_ok": True, "o_direct_reason": lp.get("o_direct_reason"),
                                "free_bytes": lp.get("free_bytes")})
        else:
            kit.storage["kind"] = "none: no O_DIRECT-capable directory (bench and SSD tests will fail or skip)"
    code = ("import json, os, sys; from memascend_engine import native\n"
            "p = os.path.join(sys.argv[1], 'engine-probe.bin'); open(p, 'wb').truncate(8 << 20)\n"
            "e = native.IOEngine(p, backend='auto'); print(json.dumps({'backend': e.backend, "
            "'reason': e.backend_reason})); os.unlink(p)")
    rc, out, err = kit.capture([kit.py, "-c", code, kit.ssd])
    kit.storage["native_io_backend"] = json.loads(out) if rc == 0 else {"error": err.strip()[-300:]}
    kit.storage.update(_dd_speed(kit, kit.ssd))
    kit.log("storage: " + json.dumps(kit.storage))
    return bool(kit.storage.get("o_direct_ok"))


# -- phase: tests ---------------------------------------------------------------------------------------


OP_BUILDS = ("op-async-io", "op-cpu-adam")


def phase_tests(kit: Kit) -> bool:
    for name in OP_BUILDS:
        kit.join(name)
    kit.run("ds-report", [kit.py, "-c", "from deepspeed.env_report import cli_main; cli_main()"], cap_s=60,
            echo_lines=80)
    junit = os.path.join(kit.out_dir, "pytest_gpu.xml")
    base = os.path.join(kit.ssd, "pytest")
    r = kit.run("pytest-gpu", [kit.py, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-rA", "-q",
                               f"--basetemp={base}", f"--junitxml={junit}", "--deselect", VALIDATE_TEST, "tests"],
                cap_s=kit.args.tests_cap_s, cwd=REPO)
    if not kit.dry_run:
        kit.summary["pytest_gpu"] = parse_junit(junit)
        shutil.rmtree(base, ignore_errors=True)
    return r.status in ("ok", "dry-run")


# -- phase: bench ---------------------------------------------------------------------------------------


def _plan(kit: Kit, model: str) -> dict | None:
    rc, out, err = kit.capture([kit.py if os.path.isfile(kit.py) else sys.executable, "-m", "memascend_cli", "plan",
                                "--model", model, "--seq-len", str(kit.args.seq_len), "--no-search", "--json"],
                               timeout=120, env={"PYTHONPATH": REPO})
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        kit.log(f"plan of {model} failed (rc {rc}): {err.strip()[-300:]}")
        return None


def bench_accepts_accelerator(kit: Kit) -> bool:
    py = kit.py if os.path.isfile(kit.py) else sys.executable
    _, out, _ = kit.capture([py, "-m", "memascend_cli", "bench", "--help"], env={"PYTHONPATH": REPO,
                                                                               "COLUMNS": "200"})
    return "--accelerator" in out


def phase_bench(kit: Kit) -> bool:
    for name in OP_BUILDS:
        kit.join(name)
    if not bench_accepts_accelerator(kit):
        msg = ("`memascend bench` has no --accelerator option yet: it would force DeepSpeed's CPU accelerator and "
               "measure nothing CUDA-specific; bench skipped (see the issue-11 notes for the change it needs)")
        if kit.dry_run:
            print("[bench] WARNING: " + msg)
        else:
            kit.log(msg)
            kit.steps.append(StepRecord("bench", "skipped", note=msg))
            return False
    free = shutil.disk_usage(kit.ssd if os.path.isdir(kit.ssd) else kit.work).free
    gbps = min([g for g in (kit.storage.get("read_gbps"), kit.storage.get("write_gbps")) if g] or [DEFAULT_DISK_GBPS])
    runs = [r for r in kit.args.runs.split(",") if r]
    calibration = 1.0
    docs: dict = {}
    decisions = []
    stop_reason = None
    for model in kit.args.models.split(","):
        plan = _plan(kit, model)
        if plan is None:
            decisions.append(asdict(BenchDecision(model, False, "memascend plan failed for this preset")))
            continue
        d = decide_model(model, num_params=int(plan["model"]["num_params"]), need_disk_bytes=disk_need_bytes(plan),
                         free_disk_bytes=None if kit.dry_run else free, steps=kit.args.steps, runs=len(runs),
                         disk_gbps=gbps, remaining_s=1e9 if kit.dry_run else kit.remaining(),
                         calibration=calibration)
        if stop_reason and not kit.dry_run:
            d.run, d.reason = False, stop_reason
        decisions.append(asdict(d))
        if not d.run:
            kit.log(f"bench {model}: skipped, {d.reason}")
            if "s left" in d.reason:
                stop_reason = "an earlier, smaller preset did not fit the time left"
            continue
        kit.log(f"bench {model}: {len(runs)} runs of ~{d.estimate_s:.0f} s each (disk {gbps:.2f} GB/s, "
                f"calibration {calibration:.2f}), ~{d.need_disk_bytes / GiB:.1f} GiB of SSD space")
        for run in runs:
            out = os.path.join(kit.ssd, "bench", model, run)
            cmd = [kit.py, "-m", "memascend_cli", "bench", "--model", model, "--seq-len", str(kit.args.seq_len),
                   "--steps", str(kit.args.steps), "--runs", run, "--accelerator", kit.args.accelerator,
                   "--settle-cap", str(kit.args.settle_cap_s), "--out", out, "--json"]
            est = estimate_run_s(int(plan["model"]["num_params"]), kit.args.steps, gbps, calibration)
            if not kit.dry_run:
                shutil.rmtree(out, ignore_errors=True)
            rec = kit.run(f"bench-{model}-{run}", cmd, cap_s=run_timeout_s(est, 1e9), min_s=min(est, 60.0),
                          cwd=REPO, stdout_path=os.path.join(kit.work, "logs", f"bench-{model}-{run}.json"),
                          echo_lines=40)
            if kit.dry_run:
                continue
            if rec.status in ("ok", "failed") and rec.seconds:
                calibration = max(0.5, min(4.0, rec.seconds / estimate_run_s(int(plan["model"]["num_params"]),
                                                                            kit.args.steps, gbps)))
            doc_path = os.path.join(out, "bench.json")
            try:
                with open(doc_path) as f:
                    docs.setdefault(model, {})[run] = json.load(f)
            except (OSError, json.JSONDecodeError):
                docs.setdefault(model, {})[run] = {"runs": [{"name": run, "ok": False,
                                                             "error": f"{rec.status}: no bench.json"}],
                                                   "job": {"model": model}}
            # The region and swap files of a 1B model are tens of GB: gone before the next run.
            for leftover in ("bench.region", "swap"):
                p = os.path.join(out, leftover)
                shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else (os.path.exists(p) and os.unlink(p))
            if rec.status == "timeout":
                stop_reason = f"bench-{model}-{run} ran out of time"
                break
    kit.summary["bench_decisions"] = decisions
    if kit.dry_run:
        return True
    rows = [row for model in docs for run in docs[model] for row in summarize_bench_doc(docs[model][run])]
    kit.summary["bench_rows"] = rows
    kit.summary["bench_vs_stock"] = versus_stock(rows)
    with open(os.path.join(kit.out_dir, "gpu_bench.json"), "w") as f:
        json.dump({"schema_version": 1, "seq_len": kit.args.seq_len, "steps": kit.args.steps,
                   "storage": kit.storage, "facts": kit.facts, "decisions": decisions, "documents": docs}, f)
    problem = write_plots(kit.out_dir, docs, rows)
    if problem:
        kit.log(problem)
    skipped = [d["model"] for d in decisions if not d["run"]]
    if skipped:
        kit.summary["next_call"] = ("bash scripts/gpu_check.sh run --phases setup,probe,bench,validate --models "
                                    + ",".join(skipped))
        kit.log("not measured in this call: " + ", ".join(skipped) + "; next call (on the warm machine the "
                "setup is skipped): " + kit.summary["next_call"])
    return all(r["ok"] for r in rows) and bool(rows)


def write_plots(out_dir: str, docs: dict, rows: list[dict]) -> str | None:
    """gpu_bench.png (peaks and step times per preset and run, with the plan's predictions) and
    bench_<model>.png (system memory over time, every run)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not importable: no plots"
    models = list(docs)
    if not models:
        return None
    metrics = [("peak_system_bytes", "predicted_host_peak_bytes", "peak system memory (GiB)", GiB),
               ("peak_gpu_bytes", "predicted_gpu_peak_bytes", "peak GPU memory (GiB)", GiB),
               ("seconds_per_step", None, "s/step", 1)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(15, 4.8))
    runs = [r for r in BENCH_RUNS if any(x["run"] == r for x in rows)]
    width = 0.8 / max(1, len(runs))
    for ax, (key, pred_key, title, scale) in zip(axes, metrics):
        drawn = False
        for j, run in enumerate(runs):
            xs, ys, ps = [], [], []
            for i, m in enumerate(models):
                r = next((x for x in rows if x["model"] == m and x["run"] == run), None)
                if r and r.get(key) is not None:
                    xs.append(i + (j - (len(runs) - 1) / 2) * width)
                    ys.append(r[key] / scale)
                    ps.append(r.get(pred_key) / scale if pred_key and r.get(pred_key) is not None else None)
            if xs:
                drawn = True
                ax.bar(xs, ys, width, label=run, color=RUN_COLORS.get(run))
            for x, p in zip(xs, ps):
                if p is not None:
                    ax.plot([x - width / 2, x + width / 2], [p, p], color="black", linewidth=1.5)
        if not drawn:
            ax.text(0.5, 0.5, "not in the bench documents", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, fontsize=8)
        ax.set_title(title + ("  (black: plan)" if pred_key else ""), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "gpu_bench.png"), dpi=100)
    plt.close(fig)
    for m in models[:3]:  # 8 files come back: log, 2 JSON, junit, summary plot, 3 timelines
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for run, doc in docs[m].items():
            for r in doc.get("runs", []):
                if r.get("timeline"):
                    ax.plot([p[0] for p in r["timeline"]], [p[1] / GiB for p in r["timeline"]], linewidth=0.8,
                            color=RUN_COLORS.get(r["name"]), label=f"{r['name']} (peak {(r.get('peak_system_bytes') or 0) / GiB:.2f} GiB)")
        ax.set_xlabel("seconds since launch")
        ax.set_ylabel("MemTotal - MemAvailable - idle (GiB)")
        ax.set_title(f"{m}: system memory over time")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"bench_{re.sub(r'[^A-Za-z0-9_.-]', '_', m)}.png"), dpi=100)
        plt.close(fig)
    return None


# -- phase: validate ------------------------------------------------------------------------------------


def phase_validate(kit: Kit) -> bool:
    bench_dir = os.path.join(kit.ssd, "bench", VALIDATE_MODEL)
    if not kit.dry_run and not os.path.isdir(bench_dir):
        kit.log(f"validate: skipped, no bench output of {VALIDATE_MODEL} in this call")
        kit.steps.append(StepRecord("validate", "skipped", note=f"no bench of {VALIDATE_MODEL}"))
        return False
    r = kit.run("validate-bench", [kit.py, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q", VALIDATE_TEST],
                cap_s=120, cwd=REPO, env={"MEMASCEND_GPU_BENCH_DIR": bench_dir})
    return r.status in ("ok", "dry-run")


# -- the run --------------------------------------------------------------------------------------------


def collect_facts(kit: Kit) -> None:
    facts = {"python": kit.args.python, "host": os.uname().nodename, "kernel": os.uname().release,
             "cpu_count": os.cpu_count()}
    rc, out, _ = kit.capture(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    facts["gpus"] = [ln.strip() for ln in out.splitlines() if ln.strip()] if rc == 0 else []
    rc, out, _ = kit.capture(["nvcc", "--version"])
    facts["nvcc"] = out.strip().splitlines()[-1] if rc == 0 and out.strip() else None
    code = ("import json, sys, torch; print(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__, "
            "'cuda': torch.version.cuda, 'cuda_available': torch.cuda.is_available(), 'capability': "
            "'.'.join(map(str, torch.cuda.get_device_capability())) if torch.cuda.is_available() else None}))")
    rc, out, err = kit.capture([kit.args.python, "-c", code], timeout=120)
    try:
        facts["torch"] = json.loads(out)
    except json.JSONDecodeError:
        facts["torch"] = {"error": err.strip()[-300:]}
    try:
        with open("/proc/meminfo") as f:
            facts["mem_total_kib"] = int(f.readline().split()[1])
    except OSError:
        pass
    facts["work_free_bytes"] = shutil.disk_usage(kit.work).free
    kit.facts = facts
    if not kit.dry_run:
        kit.log("facts: " + json.dumps(facts))


def check_inputs(kit: Kit) -> list[str]:
    """What must hold before step 2 can run (the dry mode's checks)."""
    problems = []
    manifest_path = os.path.join(kit.carry, "manifest.json")
    if not os.path.isfile(manifest_path):
        problems.append(f"{manifest_path} is missing: build the carry folder first (bash scripts/gpu_check.sh carry)")
    else:
        with open(manifest_path) as f:
            problems += check_manifest(json.load(f), kit.carry)
    for m in kit.args.models.split(","):
        if not os.path.isfile(os.path.join(REPO, "presets", "models", f"{m}.yaml")):
            problems.append(f"preset {m} not found in presets/models/")
    for t in ("tests/gpu/test_gpu_pinned.py", "tests/gpu/test_gpu_deepspeed.py", "tests/gpu/test_gpu_cli.py"):
        if not os.path.isfile(os.path.join(REPO, t)):
            problems.append(f"{t} is missing")
    bad_runs = [r for r in kit.args.runs.split(",") if r not in BENCH_RUNS]
    if bad_runs:
        problems.append(f"unknown bench run(s) {bad_runs}; runs are {', '.join(BENCH_RUNS)}")
    bad_phases = [p for p in kit.args.phases.split(",") if p not in PHASES]
    if bad_phases:
        problems.append(f"unknown phase(s) {bad_phases}; phases are {', '.join(PHASES)}")
    if os.path.isdir(kit.carry):
        size = travelling_bytes(REPO, [kit.carry])
        kit.summary["travelling"] = size
        if size["total_bytes"] > CARRY_LIMIT_BYTES:
            problems.append(f"working tree + carry folder = {size['total_bytes'] / MiB:.1f} MiB > 64 MiB")
    return problems


def main_run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    work = os.path.abspath(args.work)
    out_dir = args.out or os.environ.get("OUT") or os.path.join(work, "out")
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    kit = Kit(args=args, out_dir=out_dir, work=work, carry=os.path.abspath(args.carry), deadline=t0 + args.budget_s, dry_run=args.dry_run,
              log_path=os.path.join(out_dir, "gpu_check.log"))
    if not args.dry_run:
        open(kit.log_path, "w").close()
    kit.env = {
        "PATH": os.pathsep.join([os.path.join(kit.venv, "bin"), os.path.dirname(args.python), os.environ.get("PATH", "")]),
        "DS_ACCELERATOR": args.accelerator, "TORCH_EXTENSIONS_DIR": os.path.join(work, "torch_ext"),
        "MAX_JOBS": str(max(1, (os.cpu_count() or 2) // 2)), "MEMASCEND_BUILD_JOBS": str(os.cpu_count() or 2),
        "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        **aio_env(os.path.join(work, "aio")),
    }
    problems = check_inputs(kit)
    collect_facts(kit)
    cap = (kit.facts.get("torch") or {}).get("capability")
    if cap:
        kit.env["TORCH_CUDA_ARCH_LIST"] = cap  # build the ops for this GPU only
    phases = [p for p in args.phases.split(",") if p]
    if args.dry_run:
        print(f"gpu_check run --dry-run: repo {REPO}, carry {kit.carry}, work {work}, out {out_dir}")
        print("environment of every step:\n" + "\n".join(f"    {k}={v}" for k, v in kit.env.items()))
        size = kit.summary.get("travelling")
        if size:
            print(f"travels with the call: tree {size['tree_bytes'] / MiB:.2f} MiB + carry "
                  f"{sum(size['carried_bytes'].values()) / MiB:.2f} MiB = {size['total_bytes'] / MiB:.2f} MiB "
                  f"(limit {CARRY_LIMIT_BYTES / MiB:.0f} MiB)")
        print("this machine: " + json.dumps(kit.facts))
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        print("hint: bash scripts/gpu_check.sh carry builds .gpu_carry/ on a machine that reaches PyPI", file=sys.stderr)
        return 2
    results = {}
    for phase in PHASES:
        if phase not in phases:
            continue
        if phase in ("bench", "validate", "tests") and "setup" in phases and results.get("setup") is False:
            kit.log(f"{phase}: skipped, the setup failed")
            continue
        if not args.dry_run:
            kit.log(f"=== phase {phase} ===")
        fn = {"setup": phase_setup, "probe": phase_probe, "tests": phase_tests, "bench": phase_bench,
              "validate": phase_validate}[phase]
        if phase in ("tests", "bench", "validate") and not kit.storage:
            kit.storage = {"dir": os.path.join(work, "ssd")}
        results[phase] = fn(kit)
        if args.dry_run and phase == "bench":
            for d in kit.summary.get("bench_decisions", []):
                print(f"[bench] {d['model']}: ~{d['estimate_s']:.0f} s per run at {DEFAULT_DISK_GBPS} GB/s "
                      f"(re-estimated there from the dd probe), ~{d['need_disk_bytes'] / GiB:.1f} GiB SSD space"
                      + ("" if d["run"] else f": SKIPPED, {d['reason']}"))
    for name in list(kit.background):
        kit.join(name)
    if args.dry_run:
        print("inputs OK; the commands above are what `bash scripts/gpu_check.sh run` executes there")
        return 0
    cleanup(kit)
    summary = {"schema_version": 1, "ok": all(results.values()), "phases": results, "seconds": round(time.monotonic()
                                                                                                       - t0, 1),
               "budget_s": args.budget_s, "facts": kit.facts, "storage": kit.storage,
               "steps": [asdict(s) for s in kit.steps], **kit.summary}
    with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
        json.dump(summary, f, indent=1)
    kit.log(f"done in {summary['seconds']} s: " + ", ".join(f"{k} {'ok' if v else 'NOT ok'}" for k, v in results.items())
            + f"; outputs in {out_dir}")
    return 0 if summary["ok"] else 1


def cleanup(kit: Kit) -> None:
    """Unmount and detach the loop fallback (machine-global resources), keep the rest for a warm re-run."""
    if kit.storage.get("loop_mount"):
        kit.capture(["umount", kit.storage["loop_mount"]])
    if kit.storage.get("loop_device"):
        kit.capture(["losetup", "-d", kit.storage["loop_device"]])
        img = os.path.join(kit.work, "ssd.img")
        if os.path.exists(img):
            os.unlink(img)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring for details.")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("carry", help="step 1, here: build .gpu_carry/ (needs PyPI and apt)")
    c.add_argument("--python", default=sys.executable, help="interpreter whose pip builds and downloads the wheels")
    c.add_argument("--carry", default=CARRY_DIR, help="folder to build (default .gpu_carry in the repo root)")
    r = sub.add_parser("run", help="step 2, on the GPU machine (or --dry-run anywhere)")
    r.add_argument("--dry-run", action="store_true", help="check the inputs and print every command; run nothing")
    r.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {', '.join(PHASES)}")
    r.add_argument("--models", default=",".join(DEFAULT_MODELS), help="bench presets, smallest first")
    r.add_argument("--runs", default=",".join(BENCH_RUNS), help="bench runs per preset")
    r.add_argument("--seq-len", type=int, default=2048)
    r.add_argument("--steps", type=int, default=3, help="bench steps per run (s/step averages steps 2..N)")
    r.add_argument("--settle-cap-s", type=float, default=20.0, help="bench: longest wait for memory to settle")
    r.add_argument("--accelerator", default="cuda", choices=["cuda", "cpu"],
                   help="DS_ACCELERATOR of every step and the bench's --accelerator (cpu: rehearse on a CPU box)")
    r.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall time of the whole run")
    r.add_argument("--tests-cap-s", type=float, default=300.0, help="longest time for `pytest -m gpu`")
    r.add_argument("--python", default=sys.executable, help="the image's interpreter (the one with torch)")
    r.add_argument("--out", default=None, help="output folder (default $OUT, else WORK/out)")
    r.add_argument("--carry", default=CARRY_DIR, help="the carry folder (default .gpu_carry in the repo root)")
    r.add_argument("--work", default=WORK_DIR, help="work folder (default .gpu_work in the repo root)")
    args = ap.parse_args(argv)
    if args.command == "carry":
        return build_carry(os.path.abspath(args.carry), args.python)
    return main_run(args)


if __name__ == "__main__":
    sys.exit(main())
