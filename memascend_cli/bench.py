"""`memascend bench` machinery: configs per run, the settle wait, the 1 kHz meminfo sampler, the child
launch with os.wait4, the planner's prediction, and the JSON / table / PNG outputs.

The training job itself runs in a child process (benchmarks/bench_job.py), so this module stays
torch-free: the parent only samples /proc and waits. Pure parts (config building, the flatness test,
the result document) take plain data so tests can drive them without DeepSpeed.

Memory is measured the way shared/docs/platform-notes.md §9 and its addendum recommend:
system-wide MemTotal - MemAvailable sampled at >= 1 kHz in the parent, minus the settled idle level
taken right before the launch, plus the child's ru_maxrss from os.wait4 (the largest single process of
the tree), plus per-process RSS of the tree sampled with psutil.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from array import array
from dataclasses import asdict, dataclass, field

from memascend_cli.run.dsconfig import ELEM_BYTES, adamw, ds_config
from memascend_cli.defaults import ENGINE_ENV
from memascend_cli.errors import BadInput
from memascend_cli.planner import zero
from memascend_cli.units import GiB, MiB

JSON_SCHEMA_VERSION = 1
MODES = ("stock", "tuned", "memascend")
TECHNIQUES = ("streaming", "pinned", "adaptive_pool", "fused_overflow", "direct_nvme", "offload_checkpointing",
              "malloc_trim", "verify_checksums")
"""The engine's techniques (and its checksum verification, to measure what it costs), each switchable off for the
ablation (memascend_engine.EngineOptions fields)."""
ABLATION_PREFIX = "memascend-no-"
"""Run name of memascend with one technique off: memascend-no-<technique>."""

ACCELERATORS = ("auto", "cpu", "cuda")
JOB_MODULE = "memascend_engine.bench_job"
"""The child of every run (`python -m memascend_engine.bench_job`): works from an installed wheel."""

SETTLE_WINDOW_S = 6.0
SETTLE_TOLERANCE_BYTES = 8 * MiB
SETTLE_CAP_S = 150.0
"""The addendum measured 45-85 s to settle after a heavy run; cap the wait and report when not flat."""
SAMPLE_INTERVAL_S = 0.0008
"""Target meminfo period: ~1.25 kHz asked so that scheduling jitter still leaves >= 1 kHz."""
TREE_SAMPLE_INTERVAL_S = 0.05
TIMELINE_BUCKET_S = 0.01
"""The JSON timeline keeps the maximum of each 10 ms bucket (the raw 1 kHz series is large)."""


# ---------------------------------------------------------------------------------------------
# What to run (pure)


@dataclass(frozen=True)
class RunSpec:
    """One measured run: a mode and, for memascend ablations, the techniques switched off."""

    name: str
    mode: str
    disabled: tuple[str, ...] = ()


def parse_runs(text: str, ablation: bool) -> list[RunSpec]:
    """'stock,tuned,memascend' (+ one memascend run per technique disabled with --ablation)."""
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if not names:
        raise BadInput("--runs is empty", "give e.g. --runs stock,tuned,memascend")
    ablated = {f"{ABLATION_PREFIX}{t}": t for t in TECHNIQUES}
    bad = [n for n in names if n not in MODES and n not in ablated]
    if bad:
        raise BadInput(f"unknown run {bad[0]!r}", "runs are " + ", ".join(MODES) + f", or {ABLATION_PREFIX}X with X one "
                       "of " + ", ".join(TECHNIQUES))
    if len(set(names)) != len(names):
        raise BadInput("--runs names a run twice", "list each of " + ", ".join(MODES) + " at most once")
    runs = [RunSpec(n, "memascend", (ablated[n],)) if n in ablated else RunSpec(n, n) for n in names]
    if ablation:
        # The ablation separates config from technique: tuned is "stock + memascend's knobs only", and each
        # memascend-no-X run differs from full memascend in X alone.
        if "tuned" not in names:
            runs.append(RunSpec("tuned", "tuned"))
        runs += [RunSpec(n, "memascend", (t,)) for n, t in ablated.items() if n not in names]
    return runs


def resolve_settings(mode: str, spec, *, dtype: str, ranks: int, aio_block_size: int | None = None,
                     aio_queue_depth: int | None = None) -> zero.ZeroSettings:
    """The ZeRO settings of one run (zero.resolve: tuned and memascend get the same stock knobs). Pure."""
    if mode not in MODES:
        raise BadInput(f"unknown mode {mode!r}", "modes are " + ", ".join(MODES))
    if dtype not in ELEM_BYTES:
        raise BadInput(f"unknown dtype {dtype!r}", "use bf16, fp16 or fp32")
    return zero.resolve(mode, model=spec, world_size=ranks, elem_bytes=ELEM_BYTES[dtype],
                        aio_block_size=aio_block_size, aio_queue_depth=aio_queue_depth)


def build_ds_config(mode: str, spec, *, micro_batch: int, dtype: str, nvme_dir: str, ranks: int, lr: float = 1e-4,
                    aio_block_size: int | None = None, aio_queue_depth: int | None = None) -> dict:
    """The DeepSpeed config of one run. Pure.

    stock: what a user writes from DeepSpeed's docs for ZeRO-Infinity (params + optimizer on NVMe), every knob at
      its default except buffer_size, raised to fit the largest partition.
    tuned: stock DeepSpeed given every stock knob memascend sets (zero.memascend_knobs), the same aio settings and
      (child_env) the same exact-size native pinning.
    memascend: byte-for-byte the tuned config; the engine's install() finds nothing to change in it.
    """
    s = resolve_settings(mode, spec, dtype=dtype, ranks=ranks, aio_block_size=aio_block_size,
                         aio_queue_depth=aio_queue_depth)
    return ds_config(s, nvme_path=nvme_dir, micro_batch=micro_batch, precision=dtype, optimizer=adamw(lr))


def child_env(mode: str, cfg: dict, base: dict, *, accelerator: str = "cpu") -> dict:
    """Environment of a run's child: the accelerator, the settings' environment (DS_PIN_MEMORY_BACKEND: native
    for tuned and memascend, DeepSpeed's default torch allocator for stock) and, for memascend, the engine's allocator
    environment (defaults.ENGINE_ENV)."""
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"
    if accelerator == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    elif accelerator == "cuda":
        env["DS_ACCELERATOR"] = "cuda"
    env.pop("DS_PIN_MEMORY_BACKEND", None)
    settings = zero.from_ds_config(cfg, {"DS_PIN_MEMORY_BACKEND": "native" if mode != "stock" else "torch"})
    env.update(settings.env())
    if mode == "memascend":
        env.update(ENGINE_ENV)
    return env


def run_settings(mode: str, cfg: dict) -> zero.ZeroSettings:
    """The settings a run's child really gets (read back from its config and environment, so plan and run cannot
    drift). Pure."""
    return zero.from_ds_config(cfg, child_env(mode, cfg, {}))


def checkpointing_impl(mode: str, disabled: tuple[str, ...] = ()) -> str:
    """Which activation checkpointing a run uses when it checkpoints: `hf` (transformers' non-reentrant, what a stock
    user writes) for stock; memascend's checkpoint function for tuned and memascend (`memascend`, with the engine's
    exact pinned host buffers on a GPU) so tuned stock and memascend run the same implementation."""
    return "hf" if mode == "stock" else "memascend"


def legacy_engine_knobs(mode: str, cfg: dict) -> tuple[tuple[str, object], ...]:
    """Stock knobs a recorded memascend run had that today's engine sets otherwise. Runs recorded before the engine
    turned reduce_scatter off (their configs lack the key; today's engine writes it) reduced through
    reduce_scatter_coalesced. Pure."""
    if mode == "memascend" and "reduce_scatter" not in (cfg.get("zero_optimization") or {}):
        return (("reduce_scatter", True),)
    return ()


def bench_launcher_processes(ranks: int) -> int:
    """Launcher processes beside the ranks (see child_command): none for one rank, torchrun for more."""
    return 0 if ranks == 1 else 1


def predict(mode: str, cfg: dict, spec, *, seq_len: int, micro_batch: int, dtype: str, ranks: int,
            checkpointing: str, hw, deepspeed_version: str, disabled: tuple[str, ...] = (),
            checkpoint_offload: str = "ssd", host_budget_bytes: int | None = None) -> dict:
    """memascend plan's estimate for one run: node peak plus the host items (for recalibration). `disabled`: the
    memascend techniques switched off (ablation runs)."""
    from memascend_cli.planner.memory import JobSpec, estimate

    offloaded = checkpointing_impl(mode) == "memascend" and (mode != "memascend"
                                                             or "offload_checkpointing" not in disabled)
    ck = "none" if checkpointing != "full" else ("offload" if offloaded else "full")
    job = JobSpec(model=spec, seq_len=seq_len, micro_batch=micro_batch, dtype=dtype, ranks_per_node=ranks,
                  checkpointing=ck, deepspeed_version=deepspeed_version, knobs=run_settings(mode, cfg),
                  checkpoint_copies=0, streaming="streaming" not in disabled,
                  checkpoint_offload=checkpoint_offload if mode == "memascend" else "dram",
                  host_budget_bytes=host_budget_bytes if mode == "memascend" else None,
                  launcher_processes=bench_launcher_processes(ranks),
                  engine_knob_overrides=legacy_engine_knobs(mode, cfg))
    est = estimate(job, hw, "memascend" if mode == "memascend" else "baseline")
    return {
        "engine": est.engine,
        "node_host_peak_bytes": est.node_host_peak_bytes,
        "host_peak_bytes_per_rank": est.host_peak_bytes,
        "host_steady_bytes_per_rank": est.host_steady_bytes,
        "gpu_peak_bytes": est.gpu_peak_bytes if hw.num_gpus else None,
        "nvme_bytes_per_rank": est.nvme_bytes,
        "host_items": [{"key": i.key, "kind": i.kind, "bytes": i.bytes} for i in est.items if i.tier == "host"],
        "config_errors": list(est.config_errors),
        "ssd_traffic": est.traffic.to_dict() if est.traffic else None,
        "host_budget": est.budget.to_dict() if est.budget else None,
    }


# ---------------------------------------------------------------------------------------------
# Settling (pure core + I/O wrapper)


def flat_spread(samples: list[tuple[float, int]], window_s: float) -> int | None:
    """max - min of the samples in the last `window_s`, or None until the samples span the window."""
    if not samples or samples[-1][0] - samples[0][0] < window_s:
        return None
    t_end = samples[-1][0]
    vals = [v for t, v in samples if t >= t_end - window_s]
    return max(vals) - min(vals)


@dataclass
class SettleResult:
    idle_bytes: int
    """Median of MemTotal - MemAvailable over the last window: the level a run's peak is taken from."""
    waited_s: float
    flat: bool
    """False when the cap ran out before the level was flat (the idle level is then less certain)."""
    spread_bytes: int
    dropped_caches: bool


def settle(read_used_bytes, *, window_s: float = SETTLE_WINDOW_S, tolerance_bytes: int = SETTLE_TOLERANCE_BYTES,
           cap_s: float = SETTLE_CAP_S, interval_s: float = 0.25, clock=time.monotonic, sleep=time.sleep,
           on_tick=None, dropped_caches: bool = False) -> SettleResult:
    """Wait until used memory is flat within `tolerance_bytes` over `window_s`, at most `cap_s`."""
    t0 = clock()
    samples: list[tuple[float, int]] = []
    spread = None
    while True:
        now = clock()
        samples.append((now, int(read_used_bytes())))
        # Keep only what the window needs.
        while len(samples) > 2 and samples[1][0] <= now - window_s:
            samples.pop(0)
        spread = flat_spread(samples, window_s)
        if on_tick is not None:
            on_tick(now - t0, spread)
        if spread is not None and spread <= tolerance_bytes:
            break
        if now - t0 >= cap_s:
            break
        sleep(interval_s)
    vals = sorted(v for t, v in samples if t >= samples[-1][0] - window_s)
    flat = spread is not None and spread <= tolerance_bytes
    return SettleResult(idle_bytes=vals[len(vals) // 2], waited_s=clock() - t0, flat=flat,
                        spread_bytes=spread if spread is not None else (vals[-1] - vals[0]), dropped_caches=dropped_caches)


def drop_caches() -> bool:
    """sync, and as root drop the page cache so reclaimable cache does not drift during the run."""
    os.sync()
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# Sampling


class MeminfoReader:
    """MemTotal - MemAvailable in bytes, read with os.pread on one open fd (no open/close per sample)."""

    def __init__(self, path: str = "/proc/meminfo"):
        self.fd = os.open(path, os.O_RDONLY)
        self.total_bytes = self._field(os.pread(self.fd, 8192, 0), b"MemTotal:")

    @staticmethod
    def _field(data: bytes, name: bytes) -> int:
        i = data.index(name) + len(name)
        return int(data[i:data.index(b"kB", i)]) * 1024

    def used_bytes(self) -> int:
        return self.total_bytes - self._field(os.pread(self.fd, 8192, 0), b"MemAvailable:")

    def close(self) -> None:
        os.close(self.fd)


class MemSampler(threading.Thread):
    """Samples MemTotal - MemAvailable at ~1.25 kHz into compact arrays (16 B per sample)."""

    def __init__(self, reader: MeminfoReader, interval_s: float = SAMPLE_INTERVAL_S):
        super().__init__(daemon=True, name="meminfo-sampler")
        self.reader, self.interval_s = reader, interval_s
        self.t_s = array("d")
        self.used_bytes = array("q")
        self._halt = threading.Event()

    def run(self) -> None:
        # As root, raise this thread's priority (per-thread nice on Linux) so the training job's
        # threads on a 2-core box do not starve the sampler; the child does not inherit it.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)
        except (OSError, AttributeError):
            pass
        nxt = time.monotonic()
        read, t_app, u_app, mono = self.reader.used_bytes, self.t_s.append, self.used_bytes.append, time.monotonic
        while not self._halt.is_set():
            t_app(mono())
            u_app(read())
            nxt += self.interval_s
            delay = nxt - mono()
            if delay > 0:
                time.sleep(delay)
            else:
                nxt = mono()  # fell behind: do not burst to catch up

    def stop(self) -> None:
        self._halt.set()
        self.join()


class TreeSampler(threading.Thread):
    """psutil RSS of the child's process tree (the sum, and each process's max), and of everyone else.

    wait4's ru_maxrss covers one process at a time; with a launcher and two ranks the node's real
    footprint is the sum. Other processes' RSS (sampled at 1 Hz) shows how much the other jobs on a
    shared machine moved the system-wide reading.
    """

    def __init__(self, pid: int, interval_s: float = TREE_SAMPLE_INTERVAL_S):
        super().__init__(daemon=True, name="tree-sampler")
        self.pid, self.interval_s = pid, interval_s
        self.max_tree_rss_bytes = 0
        self.per_process_max_rss_bytes: dict[int, tuple[str, int]] = {}
        self.others_rss_bytes: list[tuple[float, int]] = []
        """(monotonic time, summed RSS of every process outside the tree and this one)."""
        self._halt = threading.Event()

    def _tree(self, psutil):
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def run(self) -> None:
        import psutil

        me = os.getpid()
        last_others = 0.0
        while not self._halt.is_set():
            total = 0
            procs = self._tree(psutil)
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    name = " ".join(p.cmdline()[:3])[-80:]
                except psutil.Error:
                    continue
                total += rss
                prev = self.per_process_max_rss_bytes.get(p.pid, ("", 0))
                if rss > prev[1]:
                    self.per_process_max_rss_bytes[p.pid] = (name, rss)
            self.max_tree_rss_bytes = max(self.max_tree_rss_bytes, total)
            now = time.monotonic()
            if now - last_others >= 1.0:
                last_others = now
                self.others_rss_bytes.append((now, others_rss_bytes({p.pid for p in procs} | {me})))
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def others_rss_bytes(exclude: set[int]) -> int:
    """Summed RSS of every process not in `exclude` (shared pages count once per process: a rough gauge)."""
    import psutil

    total = 0
    for p in psutil.process_iter(["memory_info"]):
        if p.pid not in exclude and p.info["memory_info"] is not None:
            total += p.info["memory_info"].rss
    return total


def nearest(series: list[tuple[float, int]], t: float) -> int | None:
    """Value of the (time, value) sample closest to t. Pure."""
    return min(series, key=lambda x: abs(x[0] - t))[1] if series else None


def bucket_max(t_s, values, t0: float, bucket_s: float = TIMELINE_BUCKET_S) -> list[tuple[float, int]]:
    """Downsample (t, v) to the maximum of each `bucket_s` bucket, times relative to t0. Pure."""
    out: list[tuple[float, int]] = []
    cur_b, cur_v = None, 0
    for t, v in zip(t_s, values):
        b = int((t - t0) / bucket_s + 1e-9)  # epsilon: 0.03 / 0.01 is 2.999... in floating point
        if b != cur_b:
            if cur_b is not None:
                out.append((round(cur_b * bucket_s, 4), cur_v))
            cur_b, cur_v = b, v
        elif v > cur_v:
            cur_v = v
    if cur_b is not None:
        out.append((round(cur_b * bucket_s, 4), cur_v))
    return out


def sampling_stats(t_s) -> dict:
    """Achieved rate and the largest gap of the meminfo series (a gap could hide a spike)."""
    n = len(t_s)
    if n < 2:
        return {"samples": n, "rate_hz": 0.0, "max_gap_ms": None}
    span = t_s[-1] - t_s[0]
    gaps = sorted(t_s[i + 1] - t_s[i] for i in range(n - 1))
    return {"samples": n, "rate_hz": round((n - 1) / span, 1) if span > 0 else 0.0,
            "max_gap_ms": round(gaps[-1] * 1e3, 3), "p999_gap_ms": round(gaps[int(0.999 * (len(gaps) - 1))] * 1e3, 3)}


# ---------------------------------------------------------------------------------------------
# One run


@dataclass
class RunResult:
    name: str
    mode: str
    disabled: list[str]
    ok: bool
    error: str | None = None
    idle_bytes: int = 0
    settle: dict = field(default_factory=dict)
    peak_system_bytes: int | None = None
    """max(MemTotal - MemAvailable) over the child's life minus the settled idle level."""
    peak_at_s: float | None = None
    peak_phase: str | None = None
    ru_maxrss_bytes: int | None = None
    max_tree_rss_bytes: int | None = None
    per_process_max_rss: list[dict] = field(default_factory=list)
    others_rss_span_bytes: int | None = None
    others_rss_change_at_peak_bytes: int | None = None
    peak_system_minus_others_bytes: int | None = None
    """peak_system_bytes less the change of other processes' RSS from idle to the peak (shared machines)."""
    seconds_per_step: float | None = None
    first_step_seconds: float | None = None
    tokens_per_s: float | None = None
    losses: list[float] = field(default_factory=list)
    ssd_read_bytes: int | None = None
    ssd_written_bytes: int | None = None
    ssd_read_bytes_per_step: float | None = None
    """Rank 0's /proc/self/io read_bytes of a steady step (steps 2..N)."""
    ssd_write_bytes_per_step: float | None = None
    ssd_read_bytes_steps: int | None = None
    ssd_written_bytes_steps: int | None = None
    engine_stats: list[dict] | None = None
    swap_bytes_on_disk: int | None = None
    peak_gpu_bytes: int | None = None
    """torch.cuda.max_memory_allocated of rank 0 (CUDA runs)."""
    peak_gpu_reserved_bytes: int | None = None
    pinned_bytes: int | None = None
    """Pinned host bytes at the end of rank 0's run: torch's CUDA host allocator peak + VmLck (stock, tuned), the
    engine's own pinned buffers (memascend)."""
    wall_s: float | None = None
    shm: dict = field(default_factory=dict)
    """/dev/shm around the run: used bytes and DeepSpeed's allreduce segments before and after, and the leftovers
    swept before the launch and after the exit (memascend_cli/leftovers.py); a clean run ends where it started."""
    sampling: dict = field(default_factory=dict)
    phases: list[dict] = field(default_factory=list)
    timeline: list[tuple[float, int]] = field(default_factory=list)
    """(seconds since launch, MemTotal - MemAvailable - idle in bytes), max per 10 ms bucket."""
    predicted: dict | None = None
    repeats: list[dict] = field(default_factory=list)
    """With --repeat N > 1: each repeat's peak, max RSS, step time and log in the order run; this run's other
    fields are those of the repeat with the median peak (median_run)."""
    config: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    log_path: str = ""

    @property
    def prediction_error_percent(self) -> float | None:
        if not self.predicted or not self.peak_system_bytes:
            return None
        return 100.0 * (self.predicted["node_host_peak_bytes"] - self.peak_system_bytes) / self.peak_system_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["prediction_error_percent"] = (round(self.prediction_error_percent, 2)
                                         if self.prediction_error_percent is not None else None)
        return d


def read_events(path: str) -> list[dict]:
    """The child's JSON lines (a partial last line while the child writes is skipped)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return out


def summarize_events(events_by_rank: dict[int, list[dict]], *, micro_batch: int, seq_len: int, ranks: int) -> dict:
    """Step timing from rank 0; SSD bytes summed over ranks. Pure."""
    ev0 = events_by_rank.get(0, [])
    steps = [e for e in ev0 if e.get("event") == "step"]
    finals = [next((e for e in evs if e.get("event") == "final"), None) for evs in events_by_rank.values()]
    finals = [f for f in finals if f is not None]
    errors = [e["message"] for evs in events_by_rank.values() for e in evs if e.get("event") == "error"]
    out: dict = {"losses": [s["loss"] for s in steps], "errors": errors}
    if steps:
        # Step 1 also records the parameter trace and creates the Adam states: report it apart.
        timed = steps[1:] if len(steps) > 1 else steps
        sps = sum(s["seconds"] for s in timed) / len(timed)
        out.update(seconds_per_step=sps, first_step_seconds=steps[0]["seconds"],
                   tokens_per_s=micro_batch * seq_len * ranks / sps)
        # SSD bytes of a steady step (rank 0; the first step reads no Adam moments and records the trace).
        with_io = [s for s in timed if "io" in s]
        if with_io:
            out.update(ssd_read_bytes_per_step=sum(s["io"]["read_bytes"] for s in with_io) / len(with_io),
                       ssd_write_bytes_per_step=sum(s["io"]["write_bytes"] for s in with_io) / len(with_io))
    if finals and len(finals) == len(events_by_rank):
        out.update(
            ssd_read_bytes=sum(f["io"]["read_bytes"] for f in finals),
            ssd_written_bytes=sum(f["io"]["write_bytes"] for f in finals),
            ssd_read_bytes_steps=sum(f["io_steps"]["read_bytes"] for f in finals),
            ssd_written_bytes_steps=sum(f["io_steps"]["write_bytes"] for f in finals),
            swap_bytes_on_disk=max(f.get("swap_bytes_on_disk", 0) for f in finals),
        )
        first = next((f for f in finals if f.get("rank") == 0), finals[0])
        for k in ("peak_gpu_bytes", "peak_gpu_reserved_bytes", "pinned_bytes"):
            if first.get(k) is not None:
                out[k] = first[k]
        stats = [f["engine_stats"] for f in finals if f.get("engine_stats") is not None]
        if stats:
            out["engine_stats"] = stats
    out["phases"] = [e for e in ev0 if e.get("event") == "phase"]
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_command(args: list[str], ranks: int) -> list[str]:
    """One rank: `python -m memascend_engine.bench_job`. More: torchrun (python -m torch.distributed.run -m ...)."""
    if ranks == 1:
        return [sys.executable, "-m", JOB_MODULE, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--nnodes", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", JOB_MODULE, *args]


def run_one(run: RunSpec, *, job_args: list[str], cfg: dict, out_dir: str, nvme_dir: str, ranks: int,
            micro_batch: int, seq_len: int, steps: int, region: str | None, progress=None,
            settle_cap_s: float = SETTLE_CAP_S, accelerator: str = "cpu", extra_args: list[str] | None = None
            ) -> RunResult:
    """Settle, launch the child, sample until it exits, collect its events."""
    import shutil

    res = RunResult(name=run.name, mode=run.mode, disabled=list(run.disabled), ok=False, config=cfg)
    run_dir = os.path.join(out_dir, "runs", run.name)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    shutil.rmtree(nvme_dir, ignore_errors=True)  # stale swap files would be read back as data
    os.makedirs(nvme_dir)
    cfg_path = os.path.join(run_dir, "ds_config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    events_prefix = os.path.join(run_dir, "events")
    args = [*job_args, "--mode", run.mode, "--ds-config", cfg_path, "--events", events_prefix,
            "--checkpointing-impl", checkpointing_impl(run.mode, run.disabled)]
    for t in run.disabled:
        args += ["--disable", t]
    args += list(extra_args or [])
    if region is not None:
        args += ["--region", region]
    env = child_env(run.mode, cfg, os.environ, accelerator=accelerator)
    res.env = {k: env[k] for k in ("DS_ACCELERATOR", "DS_PIN_MEMORY_BACKEND", "TORCH_EXTENSIONS_DIR",
                                   "MEMASCEND_VERIFY_CHECKSUMS", *ENGINE_ENV) if k in env}
    task = progress.add_task(f"{run.name}: settling", total=steps) if progress is not None else None

    def tick(waited_s, spread):
        if progress is not None:
            s = "…" if spread is None else f"{spread / MiB:.0f} MiB"
            progress.update(task, description=f"{run.name}: settle {waited_s:.0f}s ±{s}")

    from memascend_cli.run import leftovers

    swept_before = leftovers.sweep()
    res.shm = {"before_bytes": leftovers.shm_used_bytes(), "segments_before": leftovers.deepspeed_segments(),
               "swept_before": swept_before.to_dict()}
    reader = MeminfoReader()
    try:
        dropped = drop_caches()
        st = settle(reader.used_bytes, on_tick=tick, cap_s=settle_cap_s, dropped_caches=dropped)
        res.idle_bytes = st.idle_bytes
        res.settle = asdict(st)
        others_at_idle = others_rss_bytes({os.getpid()})
        cmd = child_command(args, ranks)
        res.log_path = os.path.join(run_dir, "child.log")
        sampler = MemSampler(reader)
        # A 0.2 ms GIL switch interval (default 5 ms) keeps the psutil sweeps of the tree sampler from
        # holding the sampler thread off for tens of milliseconds.
        switch_s = sys.getswitchinterval()
        sys.setswitchinterval(0.0002)
        sampler.start()
        t_launch = time.monotonic()
        with open(res.log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        tree = TreeSampler(proc.pid)
        tree.start()
        status, rusage = 0, None
        rank0_events = f"{events_prefix}-rank0.jsonl"
        try:
            while True:
                pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
                if pid == proc.pid:
                    break
                if progress is not None:
                    evs = read_events(rank0_events)
                    done = sum(1 for e in evs if e.get("event") == "step")
                    phase = next((e["name"] for e in reversed(evs) if e.get("event") == "phase"), "starting")
                    progress.update(task, completed=done, description=f"{run.name}: {phase}")
                time.sleep(0.2)
        except BaseException:
            proc.kill()
            os.wait4(proc.pid, 0)
            raise
        finally:
            proc.returncode = -1  # reaped by wait4 above: keep Popen from waiting on a pid it no longer owns
            t_end = time.monotonic()
            sampler.stop()
            tree.stop()
            sys.setswitchinterval(switch_s)
    finally:
        reader.close()
    res.wall_s = t_end - t_launch
    swept_after = leftovers.sweep()
    res.shm.update(after_bytes=leftovers.shm_used_bytes(), segments_after=leftovers.deepspeed_segments(),
                   swept_after=swept_after.to_dict())
    code = os.waitstatus_to_exitcode(status)
    res.ru_maxrss_bytes = rusage.ru_maxrss * 1024 if rusage is not None else None
    res.max_tree_rss_bytes = tree.max_tree_rss_bytes
    res.per_process_max_rss = sorted(({"pid": p, "cmd": n, "max_rss_bytes": b}
                                      for p, (n, b) in tree.per_process_max_rss_bytes.items()),
                                     key=lambda d: -d["max_rss_bytes"])[:8]
    if tree.others_rss_bytes:
        vals = [v for _, v in tree.others_rss_bytes]
        res.others_rss_span_bytes = max(vals) - min(vals)
    ts, used = sampler.t_s, sampler.used_bytes
    res.sampling = sampling_stats(ts)
    in_run = [(t, u) for t, u in zip(ts, used) if t_launch <= t <= t_end]
    if in_run:
        t_pk, u_pk = max(in_run, key=lambda x: x[1])
        res.peak_system_bytes = u_pk - res.idle_bytes
        res.peak_at_s = round(t_pk - t_launch, 3)
        at_peak = nearest(tree.others_rss_bytes, t_pk)
        if at_peak is not None:
            # Cross-check for a shared machine: take out how much the other processes' RSS moved between
            # the idle reading and the moment of the peak (1 Hz, RSS only: a gauge, not a correction).
            res.others_rss_change_at_peak_bytes = at_peak - others_at_idle
            res.peak_system_minus_others_bytes = res.peak_system_bytes - res.others_rss_change_at_peak_bytes
    res.timeline = [(t, v - res.idle_bytes) for t, v in bucket_max(ts, used, t_launch)]
    events = {r: read_events(f"{events_prefix}-rank{r}.jsonl") for r in range(ranks)}
    summary = summarize_events(events, micro_batch=micro_batch, seq_len=seq_len, ranks=ranks)
    for k in ("losses", "seconds_per_step", "first_step_seconds", "tokens_per_s", "ssd_read_bytes_per_step",
              "ssd_write_bytes_per_step", "ssd_read_bytes", "ssd_written_bytes",
              "ssd_read_bytes_steps", "ssd_written_bytes_steps", "swap_bytes_on_disk", "engine_stats", "peak_gpu_bytes",
              "peak_gpu_reserved_bytes", "pinned_bytes"):
        if k in summary:
            setattr(res, k, summary[k])
    res.phases = [{"name": p["name"], "at_s": round(p["t_mono"] - t_launch, 3),
                   **{k: p[k] for k in ("rss_anon_bytes", "malloc") if k in p}} for p in summary["phases"]]
    if res.peak_at_s is not None:
        res.peak_phase = next((p["name"] for p in reversed(res.phases) if p["at_s"] <= res.peak_at_s), "startup")
    if code == 0 and len(res.losses) == steps:
        res.ok = True
    else:
        res.error = "; ".join(summary["errors"]) or f"exit status {code}; last lines of {res.log_path}:\n" + _tail(res.log_path)
    if progress is not None:
        progress.update(task, completed=len(res.losses),
                        description=f"{run.name}: {'done' if res.ok else '[red]failed[/red]'}")
    shutil.rmtree(nvme_dir, ignore_errors=True)
    return res


def _tail(path: str, nbytes: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - nbytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# Checks before running


def check_nvme_dir(path: str) -> dict:
    """Swap files must go to a real, O_DIRECT-capable file system: on tmpfs 'offloading' keeps data in RAM."""
    from memascend_cli.hardware import path_info
    from memascend_cli.ssd.safety import RAM_FILESYSTEMS

    os.makedirs(path, exist_ok=True)
    info = path_info(path)
    if info.fstype in RAM_FILESYSTEMS:
        raise BadInput(f"--nvme-dir {path} is on {info.fstype}, which keeps file data in RAM",
                       "point --nvme-dir at a directory on an SSD file system (ext4, xfs)")
    if info.o_direct_ok is False:
        raise BadInput(f"--nvme-dir {path} ({info.fstype}) does not support O_DIRECT: {info.o_direct_reason}",
                       "DeepSpeed's swapper needs O_DIRECT; use a directory on ext4 or xfs")
    return info.to_dict()


def engine_available() -> tuple[bool, str]:
    """Whether memascend_engine.install exists, asked in a subprocess so this process stays torch-free."""
    code = ("import sys\ntry:\n import memascend_engine as m\nexcept Exception as e:\n print(repr(e)); sys.exit(3)\n"
            "sys.exit(0 if callable(getattr(m, 'install', None)) and hasattr(m, 'EngineOptions') else 4)")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    if r.returncode == 0:
        return True, ""
    if r.returncode == 4:
        return False, "memascend_engine has no install()/EngineOptions yet (the engine is not implemented in this checkout)"
    return False, f"memascend_engine cannot be imported: {(r.stdout + r.stderr).strip()[-300:]}"


def create_region(path: str, size_bytes: int, ranks: int) -> dict:
    """A fresh region file for the memascend runs (region_setup: prepare-ssd's checks and steps, no probe)."""
    from memascend_cli.ssd.prepare import create_region_file

    return create_region_file(path, size_bytes, ranks=ranks, label="memascend-bench").to_dict()


# ---------------------------------------------------------------------------------------------
# One point of a sweep


@dataclass
class Point:
    """One job of the bench (a point of a depth / context sweep)."""

    model: str
    spec: object
    layers: int | None
    """Decoder layers when the depth was set (the child scales the model), else None."""
    seq_len: int
    micro_batch: int
    steps: int
    dtype: str
    seed: int
    checkpointing: str
    ranks: int
    host_budget_bytes: int | None
    accelerator: str
    hw: object
    deepspeed_version: str

    def job_args(self) -> list[str]:
        args = ["--model", self.model, "--seq-len", str(self.seq_len), "--micro-batch", str(self.micro_batch),
                "--steps", str(self.steps), "--dtype", self.dtype, "--seed", str(self.seed), "--checkpointing",
                self.checkpointing]
        return args + (["--layers", str(self.layers)] if self.layers else [])

    def predict(self, mode: str, cfg: dict, disabled: tuple[str, ...] = ()) -> dict:
        return predict(mode, cfg, self.spec, seq_len=self.seq_len, micro_batch=self.micro_batch, dtype=self.dtype,
                       ranks=self.ranks, checkpointing=self.checkpointing, hw=self.hw,
                       deepspeed_version=self.deepspeed_version, disabled=disabled,
                       host_budget_bytes=self.host_budget_bytes)


def engine_args(predicted: dict) -> list[str]:
    """The memascend child's window arguments: the planner's split of the host budget, so plan and run agree."""
    b = predicted.get("host_budget")
    if not b:
        return []
    return ["--engine-windows", json.dumps(b["windows"]), "--prefetch-layers", str(b["prefetch_layers"])]


def median_run(repeats: list[RunResult]) -> RunResult:
    """The repeat that stands for a run measured `len(repeats)` times: a failed one if any failed (it is reported),
    else the one with the median peak (the lower of the two middle ones for an even count), with every repeat's
    numbers in its `repeats`. Pure."""
    if len(repeats) == 1:
        return repeats[0]
    failed = [r for r in repeats if not r.ok or r.peak_system_bytes is None]
    chosen = failed[0] if failed else sorted(repeats, key=lambda r: r.peak_system_bytes)[(len(repeats) - 1) // 2]
    chosen.repeats = [{"peak_system_bytes": r.peak_system_bytes, "ru_maxrss_bytes": r.ru_maxrss_bytes,
                       "idle_bytes": r.idle_bytes, "peak_phase": r.peak_phase, "seconds_per_step": r.seconds_per_step,
                       "ok": r.ok, "log_path": r.log_path} for r in repeats]
    return chosen


def run_point(p: Point, run_specs: list[RunSpec], *, out_dir: str, nvme_dir: str, nvme_info: dict,
              region: str | None, engine_ok: bool, settle_cap_s: float, repeat: int = 1) -> dict:
    """Every run of one point, each after memory settled, `repeat` times; returns the point's JSON
    document (median_run stands for the repeats of a run)."""
    from memascend_cli.console import err, step_progress

    notes: list[str] = [
        ("peak system memory is machine-wide (MemTotal - MemAvailable): other processes' allocations during a run "
         "count too; others_rss_change_at_peak_bytes / peak_system_minus_others_bytes gauge that, and ru_maxrss / "
         "tree RSS are per process"),
    ]
    if os.geteuid() != 0:
        notes.append("not root: the page cache was not dropped before the runs, so the idle level is less stable")
    spec, ranks = p.spec, p.ranks
    region_info = None
    if engine_ok and region is None and any(r.mode == "memascend" for r in run_specs):
        region = os.path.join(out_dir, "bench.region")
        est = p.predict("memascend", build_ds_config("memascend", spec, micro_batch=p.micro_batch, dtype=p.dtype,
                                                     nvme_dir=nvme_dir, ranks=ranks))
        # The planner's SSD bytes per rank (+ the checkpoint stream), 50% headroom for alignment and metadata.
        act = (est.get("ssd_traffic") or {}).get("write_bytes", {}).get("activation_checkpoints", 0)
        size_bytes = int((est["nvme_bytes_per_rank"] + act) * ranks * 1.5) + (64 << 20)
        err.print(f"creating region {region} ({size_bytes / 2**30:.1f} GiB)")
        region_info = create_region(region, size_bytes, ranks)
    aio_block, aio_depth = None, None
    if region is not None and os.path.exists(region):
        from memascend_cli.ssd import region as region_mod
        from memascend_cli.run.dsconfig import region_aio

        aio_block, aio_depth = region_aio(region_mod.read_header(region))  # what prepare-ssd measured, if probed
    cfgs = [build_ds_config(run.mode, spec, micro_batch=p.micro_batch, dtype=p.dtype, nvme_dir=nvme_dir, ranks=ranks,
                            aio_block_size=aio_block, aio_queue_depth=aio_depth) for run in run_specs]
    predictions = [p.predict(run.mode, cfg, run.disabled) for run, cfg in zip(run_specs, cfgs)]
    measured: list[list[RunResult]] = [[] for _ in run_specs]
    with step_progress(err) as progress:
        # A run's repeats follow each other: smallest planned peak first also across repeats (see execution_order).
        for i in execution_order([pred["node_host_peak_bytes"] for pred in predictions]):
            run, cfg, predicted = run_specs[i], cfgs[i], predictions[i]
            for k in range(repeat):
                res = run_one(run, job_args=p.job_args(), cfg=cfg,
                              out_dir=out_dir if repeat == 1 else os.path.join(out_dir, f"repeat{k + 1}"),
                              nvme_dir=nvme_dir, ranks=ranks, micro_batch=p.micro_batch, seq_len=p.seq_len,
                              steps=p.steps, region=region if run.mode == "memascend" else None, progress=progress,
                              settle_cap_s=settle_cap_s, accelerator=p.accelerator,
                              extra_args=engine_args(predicted) if run.mode == "memascend" else None)
                res.predicted = predicted
                measured[i].append(res)
    results = [median_run(rs) for rs in measured]
    if repeat > 1:
        notes.append(f"each run is the repeat with the median peak of {repeat}, taken one after another in one "
                     "sitting; runs[].repeats lists every repeat")
    job = {"model": p.model, "layers": spec.num_hidden_layers, "num_params": spec.num_params, "seq_len": p.seq_len,
           "micro_batch": p.micro_batch, "steps": p.steps, "dtype": p.dtype, "seed": p.seed,
           "checkpointing": p.checkpointing, "ranks": ranks, "accelerator": p.accelerator,
           "host_budget_bytes": p.host_budget_bytes, "deepspeed_version": p.deepspeed_version, "nvme_dir": nvme_dir,
           "nvme_dir_fstype": nvme_info.get("fstype"), "region": region, "region_header": region_info}
    return build_document(job=job, hardware=p.hw.to_dict(), runs=results, notes=notes)


def execution_order(planned_peak_bytes: list[int]) -> list[int]:
    """Indices of the runs, smallest planned peak first. Memory a run frees can take minutes to show up as available
    again (a VM's free-page reporting: ~32 MiB/s here), which inflates the next run's idle level and so shrinks its
    measured peak; a smaller run after a larger one would be measured short by a larger share. Pure."""
    return sorted(range(len(planned_peak_bytes)), key=lambda i: (planned_peak_bytes[i], i))


def recorded_spec(job: dict):
    """The model a recorded bench job ran: its preset, scaled to the job's layer count. Pure."""
    from memascend_cli.models import load_model

    spec = load_model(job["model"])
    if job.get("layers") and job["layers"] != spec.num_hidden_layers:
        spec = spec.scaled(job["layers"])
    return spec


def repredict(doc: dict, run: dict) -> dict:
    """Today's planner on a recorded run: its exact config, job, techniques and machine (CPU-only unless the run
    used CUDA). Pure: what scripts/results.py and the planner-validation test compare with the measured peak."""
    from memascend_cli.planner.spec import HardwareSpec

    j = doc["job"]
    spec = recorded_spec(j)
    hw_doc = doc.get("hardware") or {}
    cuda = j.get("accelerator") == "cuda"
    hw = HardwareSpec(name=hw_doc.get("name", "recorded"), dram_gib=float(hw_doc.get("dram_gib", 24.0)),
                      num_gpus=int(hw_doc.get("num_gpus", 0)) if cuda else 0,
                      gpu_mem_gib=float(hw_doc.get("gpu_mem_gib", 0.0)) if cuda else 0.0,
                      cpu_cores=int(hw_doc.get("cpu_cores", 1)))
    return predict(run["mode"], run["config"], spec, seq_len=j["seq_len"], micro_batch=j["micro_batch"],
                   dtype=j["dtype"], ranks=j["ranks"], checkpointing=j["checkpointing"], hw=hw,
                   deepspeed_version=j["deepspeed_version"], disabled=tuple(run.get("disabled") or ()),
                   host_budget_bytes=j.get("host_budget_bytes"))


def sweep_document(docs: list[dict]) -> dict:
    """Peak per run over the points of a sweep, the spread (largest - smallest) and the slope in GiB per billion
    parameters (least squares) of every run name. Pure."""
    names: list[str] = []
    for d in docs:
        for r in d["runs"]:
            if r["name"] not in names:
                names.append(r["name"])
    series = {}
    for name in names:
        pts = []
        for d in docs:
            r = next((x for x in d["runs"] if x["name"] == name), None)
            if r is not None and r["ok"] and r["peak_system_bytes"]:
                pts.append({"layers": d["job"]["layers"], "seq_len": d["job"]["seq_len"],
                            "num_params": d["job"]["num_params"], "peak_system_bytes": r["peak_system_bytes"],
                            "ru_maxrss_bytes": r["ru_maxrss_bytes"], "seconds_per_step": r["seconds_per_step"],
                            "predicted_bytes": (r.get("predicted") or {}).get("node_host_peak_bytes")})
        peaks = [q["peak_system_bytes"] for q in pts]
        slope = None
        xs = [q["num_params"] / 1e9 for q in pts]
        if len(pts) >= 2 and len(set(xs)) >= 2:
            mx, my = sum(xs) / len(xs), sum(peaks) / len(peaks)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, peaks)) / sum((x - mx) ** 2 for x in xs) / GiB
        series[name] = {"points": pts, "spread_bytes": (max(peaks) - min(peaks)) if peaks else None,
                        "smallest_bytes": min(peaks) if peaks else None,
                        "gib_per_billion_params": round(slope, 4) if slope is not None else None}
    return {"schema_version": JSON_SCHEMA_VERSION, "kind": "sweep",
            "points": [{"layers": d["job"]["layers"], "seq_len": d["job"]["seq_len"], "num_params": d["job"]["num_params"]}
                       for d in docs], "series": series, "documents": docs}


def render_sweep(doc: dict) -> None:
    from rich.table import Table

    from memascend_cli.console import out

    t = Table(title="sweep: peak system memory (GiB) per point", title_justify="left")
    t.add_column("run")
    for p in doc["points"]:
        t.add_column(f"L{p['layers']} s{p['seq_len']}", justify="right")
    t.add_column("GiB/B params", justify="right")
    for name, s in doc["series"].items():
        by = {(q["layers"], q["seq_len"]): q["peak_system_bytes"] for q in s["points"]}
        t.add_row(name, *[("-" if (p["layers"], p["seq_len"]) not in by else f"{by[(p['layers'], p['seq_len'])] / GiB:.2f}")
                          for p in doc["points"]],
                  "-" if s["gib_per_billion_params"] is None else f"{s['gib_per_billion_params']:.2f}")
    out.print(t)


# ---------------------------------------------------------------------------------------------
# Outputs


def compare(runs: list[RunResult], reference: str) -> dict:
    """Peak reduction and step-time change of every run against `reference` (stock or tuned). Pure."""
    ref = next((r for r in runs if r.name == reference), None)
    out = {}
    if ref is None or not ref.ok or not ref.peak_system_bytes:
        return out
    for r in runs:
        if r is ref or not r.ok or not r.peak_system_bytes:
            continue
        out[r.name] = {
            "peak_reduction_percent": round(100.0 * (1 - r.peak_system_bytes / ref.peak_system_bytes), 2),
            "step_time_change_percent": (round(100.0 * (r.seconds_per_step / ref.seconds_per_step - 1), 2)
                                         if r.seconds_per_step and ref.seconds_per_step else None),
        }
    return out


def build_document(*, job: dict, hardware: dict, runs: list[RunResult], notes: list[str]) -> dict:
    """The JSON document. Pure."""
    params_per_rank = job["num_params"] / max(1, job["ranks"])
    out_runs = []
    for r in runs:
        d = r.to_dict()
        d["ssd_bytes_per_param"] = ({"read": round(r.ssd_read_bytes_per_step / params_per_rank, 3),
                                     "write": round(r.ssd_write_bytes_per_step / params_per_rank, 3)}
                                    if r.ssd_read_bytes_per_step is not None else None)
        out_runs.append(d)
    return {"schema_version": JSON_SCHEMA_VERSION, "job": job, "hardware": hardware, "runs": out_runs,
            "vs_stock": compare(runs, "stock"), "vs_tuned": compare(runs, "tuned"), "notes": notes}


def ssd_minimum(run: dict) -> tuple[float, float] | None:
    """(read, write) bytes per parameter per step of the run's placement roofline, as planned for its config
    (memory.SsdTraffic.minimum_per_param); None for runs recorded without it. Pure."""
    t = (run.get("predicted") or {}).get("ssd_traffic") or {}
    if not t.get("minimum_read_bytes_per_param") and not t.get("minimum_write_bytes_per_param"):
        return None
    return t["minimum_read_bytes_per_param"], t["minimum_write_bytes_per_param"]


def ssd_line(run: dict) -> str | None:
    """The run's measured SSD bytes per parameter next to its placement's minimum, with the excess in %; None for a
    failed run or one recorded without either. Pure."""
    bpp, low = run.get("ssd_bytes_per_param"), ssd_minimum(run)
    if not run.get("ok", True) or not bpp or not low:
        return None

    def over(x, m):
        return "-" if not m else f"{100.0 * (x - m) / m:+.1f}%"

    return (f"{run['name']}: SSD {bpp['read']:.1f} / {bpp['write']:.1f} B/param read / write per step, minimum for "
            f"its placement {low[0]:.1f} / {low[1]:.1f} ({over(bpp['read'], low[0])} / {over(bpp['write'], low[1])})")


TABLE_COLUMNS = ("run", "peak GiB", "maxrss GiB", "s/step", "SSD B/param r/w", "plan GiB", "plan err")
"""Peak = MemTotal - MemAvailable minus idle; SSD bytes per parameter of a steady step (rank 0). On CUDA the peak GPU
memory is added."""


def table_rows(doc: dict) -> list[tuple[str, ...]]:
    """One row per run, in TABLE_COLUMNS order (+ GPU GiB on CUDA). Pure."""

    def g(b):
        return "-" if b is None else f"{b / GiB:.2f}"

    cuda = doc["job"].get("accelerator") == "cuda"
    rows = []
    for r in doc["runs"]:
        pred = r["predicted"]["node_host_peak_bytes"] if r.get("predicted") else None
        err = r.get("prediction_error_percent")
        bpp = r.get("ssd_bytes_per_param")
        row = (
            r["name"] + ("" if r["ok"] else " (failed)"),
            g(r["peak_system_bytes"]), g(r["ru_maxrss_bytes"]),
            "-" if r["seconds_per_step"] is None else f"{r['seconds_per_step']:.2f}",
            "-" if not bpp else f"{bpp['read']:.1f}/{bpp['write']:.1f}", g(pred),
            "-" if err is None else f"{err:+.1f}%",
        )
        rows.append(row + ((g(r.get("peak_gpu_bytes")),) if cuda else ()))
    return rows


def render_table(doc: dict) -> None:
    from rich.table import Table

    from memascend_cli.console import out

    j = doc["job"]
    t = Table(title=f"memascend bench: {j['model']} ({j['num_params']:,} params), seq {j['seq_len']}, "
                    f"micro-batch {j['micro_batch']}, {j['steps']} steps, {j['dtype']}, {j['ranks']} rank(s)",
              title_justify="left")
    for c in TABLE_COLUMNS + (("GPU GiB",) if j.get("accelerator") == "cuda" else ()):
        t.add_column(c, justify="left" if c == "run" else "right")
    for row in table_rows(doc):
        t.add_row(*row)
    out.print(t)
    for ref in ("stock", "tuned"):
        for name, c in doc.get(f"vs_{ref}", {}).items():
            st = c["step_time_change_percent"]
            out.print(f"{name}: peak {c['peak_reduction_percent']:.1f}% below {ref}"
                      + ("" if st is None else f", step time {st:+.1f}% vs {ref}"))
    for line in filter(None, map(ssd_line, doc["runs"])):
        out.print(line)
    for r in doc["runs"]:
        s = r["settle"]
        if s:
            out.print(f"[dim]{r['name']}: idle {r['idle_bytes'] / GiB:.2f} GiB after {s['waited_s']:.0f}s "
                      f"({'flat' if s['flat'] else 'NOT flat'}, spread {s['spread_bytes'] / MiB:.0f} MiB), "
                      f"sampled {r['sampling'].get('rate_hz', 0):.0f} Hz (gap p99.9 {r['sampling'].get('p999_gap_ms')} ms, "
                      f"max {r['sampling'].get('max_gap_ms')} ms), "
                      f"peak at {r['peak_at_s']}s in {r['peak_phase']}, other processes' RSS moved "
                      f"{(r['others_rss_span_bytes'] or 0) / MiB:.0f} MiB[/dim]")
        if not r["ok"]:
            out.print(f"[red]{r['name']} failed:[/red] {r['error']}")
    for n in doc["notes"]:
        out.print(f"[yellow]note:[/yellow] {n}")


def write_plot(doc: dict, path: str) -> str | None:
    """PNG of (MemTotal - MemAvailable - idle) over time for every run; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (`pip install matplotlib`): no plot written"
    fig, ax = plt.subplots(figsize=(11, 5.5))
    for r in doc["runs"]:
        if not r["timeline"]:
            continue
        ts = [p[0] for p in r["timeline"]]
        vs = [p[1] / GiB for p in r["timeline"]]
        (line,) = ax.plot(ts, vs, linewidth=0.8, label=f"{r['name']} (peak {(r['peak_system_bytes'] or 0) / GiB:.2f} GiB)")
        if r.get("predicted"):
            ax.axhline(r["predicted"]["node_host_peak_bytes"] / GiB, color=line.get_color(), linestyle=":", linewidth=0.8)
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("MemTotal - MemAvailable - idle (GiB)")
    ax.set_title(f"{doc['job']['model']}: system memory over time (dotted: memascend plan prediction)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
