"""One run of the bench: settle, launch the child (memascend_engine.bench_job) with os.wait4, sample until it
exits, collect its events; and the points of a sweep, each a set of runs, repeated on request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace

from memascend_cli.bench.configs import (build_ds_config, checkpointing_impl, child_env, engine_args, loss_impl,
                                         plan_job, predict, row_prediction, ssd_space_bytes)
from memascend_cli.bench.document import build_document
from memascend_cli.bench.outcome import (judge, read_events, record_cpu, record_events, record_memory,
                                          summarize_events, waiting_on)
from memascend_cli.bench.runs import RunSpec
from memascend_cli.bench.sampling import (SETTLE_CAP_S, MeminfoReader, MemSampler, TreeSampler, drop_caches,
                                          others_rss_bytes, read_busy_cpu_seconds, settle)
from memascend_cli.defaults import ENGINE_ENV
from memascend_cli.errors import BadInput
from memascend_cli.run.launch import free_port
from memascend_cli.units import GiB, MiB, fmt_bytes

JOB_MODULE = "memascend_engine.bench_job"
"""The child of every run (`python -m memascend_engine.bench_job`): works from an installed wheel."""


@dataclass
class RunResult:
    name: str
    mode: str
    disabled: list[str]
    ok: bool
    optimizer_moments: str = "fp32"
    error: str | None = None
    idle_bytes: int = 0
    settle: dict = field(default_factory=dict)
    peak_system_bytes: int | None = None
    """max(MemTotal - MemAvailable) over the child's life minus the settled idle level."""
    peak_at_s: float | None = None
    peak_phase: str | None = None
    ru_maxrss_bytes: int | None = None
    cpu_seconds: float | None = None
    """User + system CPU time of the child and everything it waited for (wait4's rusage)."""
    bench_cpu_seconds: float | None = None
    """CPU seconds this bench process (its >= 1 kHz memory sampler and the tree sampler) used while the child ran:
    on a machine with few cores they are taken from the run's compute."""
    others_cpu_seconds: float | None = None
    """CPU seconds the rest of the machine was busy while the child ran (/proc/stat less cpu_seconds and
    bench_cpu_seconds): other jobs competing for the cores slow the run's compute."""
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
    grad_norms: list[float | None] = field(default_factory=list)
    """DeepSpeed's global gradient norm of each step (before clipping): what the clip and the overlap saw."""
    ssd_read_bytes: int | None = None
    ssd_written_bytes: int | None = None
    ssd_read_bytes_per_step: float | None = None
    """Rank 0's /proc/self/io read_bytes of a steady step (steps 2..N)."""
    ssd_write_bytes_per_step: float | None = None
    ssd_read_bytes_steps: int | None = None
    ssd_written_bytes_steps: int | None = None
    engine_stats: list[dict] | None = None
    determinism: dict | None = None
    """What decided the losses (bench.outcome.run_determinism): kernels, threads, their environment, the parameters'
    digest after initialize."""
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
    swept before the launch and after the exit (memascend_cli/run/leftovers.py); a clean run ends where it started."""
    sampling: dict = field(default_factory=dict)
    phases: list[dict] = field(default_factory=list)
    timeline: list[tuple[float, int]] = field(default_factory=list)
    """(seconds since launch, MemTotal - MemAvailable - idle in bytes), max per 10 ms bucket (sampling.TIMELINE_BUCKET_S):
    for the plot; the side file keeps it per 1 s (document.write_document), the summary never."""
    predicted: dict | None = None
    repeats: list[dict] = field(default_factory=list)
    """With --repeat N > 1: each repeat's peak, max RSS, step time and log in the order run; this run's other
    fields are those of the repeat with the median peak (median_run)."""
    config: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    cgroup: dict | None = None
    """With --dram-cap: the run's memory cgroup (limit, its own peak incl. page cache charged to it, OOM kills)."""
    io_throttle: dict | None = None
    """With --ssd-bandwidth: the io cgroup's limits per device and the bytes it counted (RunCgroup.io_result)."""
    oom_killed: bool = False
    timed_out: bool = False
    """Killed by the parent after its time limit (bench --probe-timeout) without finishing."""
    thrashed: bool = False
    """Killed by the parent for thrashing at its DRAM cap (run/cgroup.py THRASH_FULL_SHARE over THRASH_WINDOW_S)."""
    waited_on: dict | None = None
    """The op build lock a rank was still waiting on when the run ended ({"on", "holders", "waited_s"}): the run
    stalled on another process, it says nothing about the cap."""
    memory_stall: dict | None = None
    """With --dram-cap: whose memory pressure was watched and the largest full-stall share over the window."""
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


def child_command(args: list[str], ranks: int) -> list[str]:
    """One rank: `python -m memascend_engine.bench_job`. More: torchrun (python -m torch.distributed.run -m ...)."""
    if ranks == 1:
        return [sys.executable, "-m", JOB_MODULE, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--nnodes", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", JOB_MODULE, *args]


def run_one(run: RunSpec, *, job_args: list[str], cfg: dict, out_dir: str, nvme_dir: str, ranks: int,
            micro_batch: int, seq_len: int, steps: int, region: str | None, progress=None,
            settle_cap_s: float = SETTLE_CAP_S, accelerator: str = "cpu", extra_args: list[str] | None = None,
            loss: str, cpu_cores: int, dram_cap_bytes: int | None = None, timeout_s: float | None = None,
            io_limits: tuple = (), predicted: dict | None = None) -> RunResult:
    """Settle, launch the child (in a memory cgroup of dram_cap_bytes and an io cgroup throttled to io_limits
    (run/iolimit.py) if given), sample until it exits or runs past
    timeout_s (then it is killed, its ranks die with it), collect its events. The child dies with this process
    (run/lifeline.py). A stock or tuned run whose swap files (`predicted`, the run's plan) do not fit on the disk is
    refused before it starts."""
    import shutil
    from contextlib import ExitStack

    from memascend_cli.run import lifeline
    from memascend_cli.run.cgroup import RunCgroup

    res = RunResult(name=run.name, mode=run.mode, disabled=list(run.disabled), ok=False, config=cfg,
                    predicted=predicted, optimizer_moments=run.moments)
    run_dir = os.path.join(out_dir, "runs", run.name)
    for folder in (run_dir, nvme_dir):  # stale swap files would be read back as data
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
    res.error = swap_space_short(run.mode, predicted, ranks, nvme_dir) if predicted else None
    if res.error:  # stock's swap files would fill the disk mid-run (ENOSPC); the other engines still run
        return res
    cfg_path = os.path.join(run_dir, "ds_config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    events_prefix = os.path.join(run_dir, "events")
    args = child_args(run, job_args, cfg_path=cfg_path, events_prefix=events_prefix, loss=loss, extra_args=extra_args,
                      region=region)
    run_env = dict(run.env)
    env = {**child_env(run.mode, cfg, os.environ, cpu_cores=cpu_cores, ranks=ranks, accelerator=accelerator),
           **run_env, lifeline.ENV: lifeline.token()}
    res.env = {k: env[k] for k in ("DS_ACCELERATOR", "DS_PIN_MEMORY_BACKEND", "TORCH_EXTENSIONS_DIR",
                                   "MEMASCEND_VERIFY_CHECKSUMS", *ENGINE_ENV, *run_env) if k in env}
    task = progress.add_task(f"{run.name}: settling", total=steps) if progress is not None else None

    def tick(waited_s, spread):
        if progress is not None:
            s = "…" if spread is None else f"{spread / MiB:.0f} MiB"
            progress.update(task, description=f"{run.name}: settle {waited_s:.0f}s ±{s}")

    res.shm = _shm_before(progress)
    reader = MeminfoReader()
    stack = ExitStack()
    cap = (stack.enter_context(RunCgroup(label=f"bench-{run.name}", cap_bytes=dram_cap_bytes, io_limits=io_limits))
           if dram_cap_bytes or io_limits else None)
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
        busy_at_launch, self_at_launch = read_busy_cpu_seconds(), _self_cpu_seconds()
        t_launch = time.monotonic()
        with open(res.log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                                    preexec_fn=lifeline.die_with_parent(then=cap.join if cap else None))
        tree = TreeSampler(proc.pid)
        tree.start()
        status, rusage = 0, None
        watch = cap.pressure_watch() if dram_cap_bytes else None
        try:
            status, rusage = _wait(proc, res, watch=watch, timeout_s=timeout_s, t_launch=t_launch,
                                   show=(lambda evs: _show_progress(progress, task, run.name, evs)) if progress else None,
                                   rank0_events=f"{events_prefix}-rank0.jsonl")
        except BaseException:
            proc.kill()
            os.wait4(proc.pid, 0)
            raise
        finally:
            proc.returncode = -1  # reaped by wait4 above: keep Popen from waiting on a pid it no longer owns
            t_end = time.monotonic()
            busy_at_end, self_at_end = read_busy_cpu_seconds(), _self_cpu_seconds()
            sampler.stop()
            tree.stop()
            sys.setswitchinterval(switch_s)
        if cap is not None:
            _record_cgroup(res, cap, watch, status, dram_cap_bytes=dram_cap_bytes, throttled=bool(io_limits))
    finally:
        reader.close()
        stack.close()  # kills what is left in the cgroup and removes it
    res.wall_s = t_end - t_launch
    _shm_after(res.shm)
    code = os.waitstatus_to_exitcode(status)
    record_cpu(res, rusage, busy_s=(busy_at_launch, busy_at_end), self_s=(self_at_launch, self_at_end))
    record_memory(res, tree, sampler.t_s, sampler.used_bytes, t_launch=t_launch, t_end=t_end,
                  others_at_idle=others_at_idle)
    events = {r: read_events(f"{events_prefix}-rank{r}.jsonl") for r in range(ranks)}
    summary = summarize_events(events, micro_batch=micro_batch, seq_len=seq_len, ranks=ranks,
                               grad_accum=int(cfg.get("gradient_accumulation_steps", 1)))
    record_events(res, summary, t_launch=t_launch)
    judge(res, code=code, steps=steps, events=events, errors=summary["errors"], watch=watch, timeout_s=timeout_s,
          capped=bool(dram_cap_bytes))
    if progress is not None:
        progress.update(task, completed=len(res.losses),
                        description=f"{run.name}: {'done' if res.ok else '[red]failed[/red]'}")
    shutil.rmtree(nvme_dir, ignore_errors=True)
    return res


def _record_cgroup(res: RunResult, cap, watch, status: int, *, dram_cap_bytes: int | None, throttled: bool) -> None:
    """What the run's cgroup saw: the io throttle's result; under a cap, the memory stall, the peak and whether the
    kernel OOM-killed it (a SIGKILL the parent did not send counts as one where the kernel counts no kills)."""
    from memascend_cli.run.cgroup import THRASH_WINDOW_S

    if throttled:
        res.io_throttle = cap.io_result()
    if dram_cap_bytes:
        if watch is not None:
            res.memory_stall = {"scope": watch.scope, "max_full_share": round(watch.max_share, 3),
                                "window_s": THRASH_WINDOW_S}
        cg = cap.result(sigkilled=not (res.timed_out or res.thrashed) and os.WIFSIGNALED(status)
                        and os.WTERMSIG(status) == signal.SIGKILL)
        res.cgroup, res.oom_killed = {"limit_bytes": dram_cap_bytes, **cg.to_dict()}, cg.oom_killed


def child_args(run: RunSpec, job_args: list[str], *, cfg_path: str, events_prefix: str, loss: str,
               extra_args: list[str] | None, region: str | None) -> list[str]:
    """The child's command line (memascend_engine.bench_job): the job, the run's engine and what it switches off.
    Pure."""
    args = [*job_args, "--mode", run.mode, "--ds-config", cfg_path, "--events", events_prefix,
            "--checkpointing-impl", checkpointing_impl(run.mode, run.disabled), "--loss-impl", loss_impl(run.mode, loss)]
    for t in run.disabled:
        args += ["--disable", t]
    if run.moments != "fp32":
        args += ["--optimizer-moments", run.moments]
    args += list(extra_args or [])
    if region is not None:
        args += ["--region", region]
    return args


def _wait(proc, res: RunResult, *, watch, timeout_s: float | None, t_launch: float, show, rank0_events: str):
    """Reap the child with wait4 (its rusage); kill it when the cap's pressure reads thrashing or it runs past
    timeout_s (res.thrashed, res.timed_out); `show` gets rank 0's events on every poll. (status, rusage)."""
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            return status, rusage
        if watch is not None:
            watch.sample(time.monotonic())
            res.thrashed = watch.thrashing() is not None
        timed_out = timeout_s is not None and time.monotonic() - t_launch > timeout_s
        if timed_out or res.thrashed:
            proc.kill()
            _, status, rusage = os.wait4(proc.pid, 0)
            res.timed_out = timed_out
            return status, rusage
        if show is not None:
            show(read_events(rank0_events))
        time.sleep(0.2)


def _show_progress(progress, task, name: str, evs: list[dict]) -> None:
    done = sum(1 for e in evs if e.get("event") == "step")
    phase = next((e["name"] for e in reversed(evs) if e.get("event") == "phase"), "starting")
    wait = waiting_on({0: evs})
    progress.update(task, completed=done, description=f"{name}: {phase}" + (
        f", waiting on {wait['on']} ({', '.join(wait['holders'])})" if wait else ""))


def _shm_before(progress) -> dict:
    """/dev/shm before the run: leftovers of dead runs swept (said), DeepSpeed's segments listed."""
    from memascend_cli.run import leftovers

    swept_before = leftovers.sweep()
    if swept_before.note():
        from memascend_cli.console import err

        (progress.console if progress is not None else err).print(f"note: {swept_before.note()}", highlight=False,
                                                                   soft_wrap=True)
    return {"before_bytes": leftovers.shm_used_bytes(), "segments_before": leftovers.deepspeed_segments(),
            "swept_before": swept_before.to_dict()}


def _shm_after(shm: dict) -> None:
    """/dev/shm after the run, into `shm`: what the run left behind."""
    from memascend_cli.run import leftovers

    swept_after = leftovers.sweep()
    after = leftovers.deepspeed_segments()
    held = leftovers.held_paths(os.path.join(leftovers.SHM_DIR, leftovers.SHM_PREFIX))
    # What the run left: segments new since the launch that no live process holds (another job's live ones are not).
    left = [n for n in after if n not in shm["segments_before"] and os.path.join(leftovers.SHM_DIR, n) not in held]
    shm.update(after_bytes=leftovers.shm_used_bytes(), segments_after=after, left_by_run=left,
               swept_after=swept_after.to_dict())


def _self_cpu_seconds() -> float:
    """User + system CPU seconds of this process, all its threads."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def check_nvme_dir(path: str) -> dict:
    """Swap files must go to a real, O_DIRECT-capable file system: on tmpfs 'offloading' keeps data in RAM."""
    from memascend_cli.ssd.path import path_info
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


def create_region(path: str, size_bytes: int, ranks: int, *, probe: bool = False):
    """A fresh region file for the memascend runs (prepare-ssd's checks and steps), with prepare-ssd's default
    bandwidth probe when `probe` (a few seconds: the time model's SSD rate when the bench knows none)."""
    from memascend_cli.ssd.prepare import create_region_file
    from memascend_cli.ssd.probe import DEFAULT_PROBE_MIB

    return create_region_file(path, size_bytes, ranks=ranks, label="memascend-bench",
                              probe_mib=DEFAULT_PROBE_MIB if probe else None)


def with_region_rates(timing: dict | None, header) -> dict | None:
    """`timing` with the SSD rates of a region (ssd.region.RegionHeader) the bench created and probed, where it had
    none (no --region, no --ssd-bandwidth): the same drive's rates prepare-ssd would have recorded. Pure."""
    probe = getattr(header, "probe", None)
    if timing is None or timing.get("read_gbps") or probe is None:
        return timing
    return {**timing, "read_gbps": probe.read_gbps, "write_gbps": probe.write_gbps,
            "source": "the probe of the region the bench created", "probe_samples": probe.sample_rows() or None}


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
    timing: dict | None = None
    """The time model's inputs ({device, read_gbps, write_gbps}: configs.predict); None: no predicted s/step."""
    loss: str = "chunked"
    """runs.LOSSES: the loss tuned and memascend compute (stock computes transformers' own)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (the runs' DeepSpeed config carries it to the child and the plan)."""
    gradient_clipping: float | None = None
    """The runs' DeepSpeed gradient_clipping (None: DeepSpeed's default)."""

    def job_args(self) -> list[str]:
        args = ["--model", self.model, "--seq-len", str(self.seq_len), "--micro-batch", str(self.micro_batch),
                "--steps", str(self.steps), "--dtype", self.dtype, "--seed", str(self.seed), "--checkpointing",
                self.checkpointing]
        return args + (["--layers", str(self.layers)] if self.layers else [])

    def job_identity(self) -> dict:
        """What makes two runs the same job, as the point's document records it under `job` (run_point)."""
        spec = self.spec
        return {"model": self.model, "layers": spec.num_hidden_layers, "num_params": spec.num_params,
                "seq_len": self.seq_len, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                "gradient_clipping": self.gradient_clipping, "steps": self.steps, "dtype": self.dtype,
                "seed": self.seed, "checkpointing": self.checkpointing, "loss": self.loss, "ranks": self.ranks,
                "accelerator": self.accelerator, "host_budget_bytes": self.host_budget_bytes,
                "deepspeed_version": self.deepspeed_version}

    def plan_job(self, mode: str, cfg: dict, disabled: tuple[str, ...] = (), moments: str = "fp32"):
        """(the planner's JobSpec of this point's run, the estimate's engine): configs.plan_job."""
        return plan_job(mode, cfg, self.spec, seq_len=self.seq_len, micro_batch=self.micro_batch, dtype=self.dtype,
                        ranks=self.ranks, checkpointing=self.checkpointing, deepspeed_version=self.deepspeed_version,
                        disabled=disabled, host_budget_bytes=self.host_budget_bytes, loss=self.loss, moments=moments)

    def predict(self, mode: str, cfg: dict, disabled: tuple[str, ...] = (), moments: str = "fp32") -> dict:
        return predict(mode, cfg, self.spec, seq_len=self.seq_len, micro_batch=self.micro_batch, dtype=self.dtype,
                       ranks=self.ranks, checkpointing=self.checkpointing, hw=self.hw,
                       deepspeed_version=self.deepspeed_version, disabled=disabled,
                       host_budget_bytes=self.host_budget_bytes, timing=self.timing, loss=self.loss, moments=moments)


def median_run(repeats: list[RunResult]) -> RunResult:
    """The repeat that stands for a run measured `len(repeats)` times: a failed one if any failed (it is reported),
    else the one with the median peak (the lower of the two middle ones for an even count), with every repeat's
    numbers in its `repeats`. Pure."""
    if len(repeats) == 1:
        return repeats[0]
    failed = [r for r in repeats if not r.ok or r.peak_system_bytes is None]
    chosen = failed[0] if failed else sorted(repeats, key=lambda r: r.peak_system_bytes)[(len(repeats) - 1) // 2]
    if failed and chosen.error:
        # Near a DRAM cap one job can fit in one repeat and be OOM-killed in the next (stock's glibc heap).
        chosen.error += f" (failed in {len(failed)} of {len(repeats)} repeats)"
    chosen.repeats = [{"peak_system_bytes": r.peak_system_bytes, "ru_maxrss_bytes": r.ru_maxrss_bytes,
                       "idle_bytes": r.idle_bytes, "peak_phase": r.peak_phase, "seconds_per_step": r.seconds_per_step,
                       "ok": r.ok, "log_path": r.log_path} for r in repeats]
    return chosen


def run_point(p: Point, run_specs: list[RunSpec], *, out_dir: str, nvme_dir: str, nvme_info: dict,
              region: str | None, engine_ok: bool, settle_cap_s: float, repeat: int = 1,
              dram_cap_bytes: int | None = None, timeout_s: float | None = None, io_limits: tuple = (),
              placements: dict | None = None, dram_tier: bool = False) -> dict:
    """Every run of one point, each after memory settled, `repeat` times; returns the point's JSON
    document (median_run stands for the repeats of a run). `placements`: {run name: its placement
    (planner.placement_choice.Choice)}, every byte on the SSD for a run not named; `dram_tier`: the engine has
    memascend's DRAM tier (its budget goes to the memascend runs)."""
    from memascend_cli.console import err, step_progress

    notes: list[str] = [
        ("peak system memory is machine-wide (MemTotal - MemAvailable): other processes' allocations during a run "
         "count too; others_rss_change_at_peak_bytes / peak_system_minus_others_bytes gauge that, and ru_maxrss / "
         "tree RSS are per process"),
    ]
    if dram_cap_bytes:
        notes.append(f"every run in its own memory cgroup of {dram_cap_bytes / GiB:.2f} GiB (swap off where the kernel "
                     "accounts it): its peak counts the processes' memory plus the page cache charged to them "
                     "(stock's swap-file writes; the region's O_DIRECT I/O bypasses the page cache)")
    if io_limits:
        notes.append("every run in its own io cgroup, its SSD bandwidth throttled to "
                     + ", ".join(f"{lim.read_bytes_per_s / 1e6:g} MB/s read and {lim.write_bytes_per_s / 1e6:g} MB/s "
                                 f"write on {lim.device} ({lim.maj_min})" for lim in io_limits)
                     + ": O_DIRECT I/O (the region, DeepSpeed's aio swap files) and page-cache-missing reads are "
                       "throttled; buffered writes are not on cgroup v1 (written back by the kernel's flusher)")
    if os.geteuid() != 0:
        notes.append("not root: the page cache was not dropped before the runs, so the idle level is less stable")
    spec, ranks = p.spec, p.ranks
    region_info = None
    if engine_ok and region is None and any(r.mode == "memascend" for r in run_specs):
        region = os.path.join(out_dir, "bench.region")
        est = p.predict("memascend", build_ds_config("memascend", spec, micro_batch=p.micro_batch, dtype=p.dtype,
                                                     nvme_dir=nvme_dir, ranks=ranks, grad_accum=p.grad_accum,
                                                     gradient_clipping=p.gradient_clipping))
        size_bytes = ssd_space_bytes("memascend", est, ranks)
        err.print(f"creating region {region} ({size_bytes / GiB:.1f} GiB)")
        header = create_region(region, size_bytes, ranks, probe=not (p.timing or {}).get("read_gbps"))
        region_info = header.to_dict()
        p = replace(p, timing=with_region_rates(p.timing, header))
    aio_block, aio_depth = None, None
    if region is not None and os.path.exists(region) and region_info is None:
        # A region given with --region: its probe's best request size and depth for every engine, as in `train`. The
        # bench's own region's probe only gives the time model its rates: the runs keep DeepSpeed's aio settings.
        from memascend_cli.ssd import region as region_mod
        from memascend_cli.run.dsconfig import region_aio

        aio_block, aio_depth = region_aio(region_mod.read_header(region))  # what prepare-ssd measured, if probed
    placed = placements or {}
    cfgs = [build_ds_config(run.mode, spec, micro_batch=p.micro_batch, dtype=p.dtype, nvme_dir=nvme_dir, ranks=ranks,
                            aio_block_size=aio_block, aio_queue_depth=aio_depth, grad_accum=p.grad_accum,
                            gradient_clipping=p.gradient_clipping, choice=placed.get(run.name))
            for run in run_specs]
    tiers = [_tier_gib(run, placed.get(run.name), dram_tier) for run in run_specs]
    predictions = [_prediction(p, run, cfg, placed.get(run.name), tier)
                   for run, cfg, tier in zip(run_specs, cfgs, tiers)]
    sitting = _sitting(nvme_dir, p.hw.cpu_cores, err) if engine_ok else None
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
                              settle_cap_s=settle_cap_s, accelerator=p.accelerator, cpu_cores=p.hw.cpu_cores,
                              extra_args=(engine_args(predicted) + _placement_args(placed.get(run.name), tiers[i]))
                              if run.mode == "memascend" else None,
                              dram_cap_bytes=dram_cap_bytes, timeout_s=timeout_s, io_limits=io_limits, loss=p.loss,
                              predicted=predicted)
                measured[i].append(res)
    results = [median_run(rs) for rs in measured]
    if repeat > 1:
        notes.append(f"each run is the repeat with the median peak of {repeat}, taken one after another in one "
                     "sitting; runs[].repeats lists every repeat")
    job = {**p.job_identity(), "nvme_dir": nvme_dir, "nvme_dir_fstype": nvme_info.get("fstype"), "region": region,
           "region_header": region_info, "dram_cap_bytes": dram_cap_bytes,
           "ssd_bandwidth_bytes_per_s": io_limits[0].read_bytes_per_s if io_limits else None,
           "ssd_throttle": [lim.to_dict() for lim in io_limits] or None, "timing": _timing_doc(p.timing)}
    from memascend_cli.compute_probe import local_cpu_flags

    # The flags that decide torch's kernels per dtype: a bf16 run on a CPU without them takes a slow fallback.
    hardware = {**p.hw.to_dict(), "cpu_flags": local_cpu_flags(), **({"sitting": sitting} if sitting else {})}
    doc = build_document(job=job, hardware=hardware, runs=results, notes=notes)
    for run, entry, tier in zip(run_specs, doc["runs"], tiers):
        if run.name in placed:
            entry["placement"] = {**placed[run.name].to_dict(), "dram_tier_gib_passed": tier}
    return doc


def _tier_gib(run: RunSpec, choice, dram_tier: bool) -> float | None:
    """The DRAM tier's budget (GiB per rank) a memascend run hands its engine, None where it has none: not asked by its
    placement, or not in the engine (the run then keeps every byte on the region)."""
    if run.mode != "memascend" or choice is None or not choice.dram_tier_bytes or not dram_tier:
        return None
    return choice.dram_tier_bytes / GiB


def _placement_args(choice, tier_gib: float | None) -> list[str]:
    """The memascend child's arguments of its placement: the DRAM tier's budget and, where the row keeps them there,
    the activation checkpoints in DRAM (planner.placement Priced.checkpoint_offload), the optimizer overlap and the
    per-layer heap trims off (Priced.overlap_optimizer, Priced.layer_trims); none where the run keeps every byte on the
    region (no tier in the engine: the run is planned all-SSD)."""
    if tier_gib is None:
        return []
    row = choice.row if choice is not None else None
    where = row.checkpoint_offload if row is not None else None
    off = [t for t in ("overlap_optimizer", "layer_trims") if row is not None and getattr(row, t) is False]
    return (["--dram-tier-gib", repr(tier_gib)] + (["--checkpoint-offload", where] if where else [])
            + [a for t in off for a in ("--disable", t)])


def _prediction(p: Point, run: RunSpec, cfg: dict, choice, tier_gib: float | None) -> dict:
    """The plan of a run: its placement row's where the run keeps bytes off the SSD (stock's cpu offload or
    max_in_cpu, memascend's DRAM tier handed to the engine, no offload), else predict's from its config."""
    off_ssd = choice is not None and choice.placement != "ssd" and (
        run.mode != "memascend" or tier_gib is not None or choice.placement == "gpu")
    return row_prediction(choice.row, p.hw) if off_ssd else p.predict(run.mode, cfg, run.disabled, run.moments)


def _sitting(nvme_dir: str, cpu_cores: int, err) -> dict:
    """This sitting's matmul, memory and disk rates (bench.sitting), printed with the cached probe's for comparison."""
    from memascend_cli.bench.sitting import sitting_probe, sitting_text
    from memascend_cli.compute_probe import cached_cpu
    from memascend_cli.hardware import local_cpu_model

    os.makedirs(nvme_dir, exist_ok=True)  # a capacity search removes it between probes
    probe = sitting_probe(nvme_dir)
    cached = cached_cpu(local_cpu_model(), cpu_cores) or {}
    for key in ("fp32_gflops", "mem_triad_gbps"):  # a cache from before the memory probe has no mem_triad_gbps
        if cached.get(key):
            probe[f"cached_{key}"] = cached[key]
    text = sitting_text(probe)
    if text:
        err.print(f"this sitting: {text}", highlight=False)
    return probe


def _timing_doc(timing: dict | None) -> dict | None:
    """The time model's inputs as the document records them."""
    if timing is None:
        return None
    from memascend_cli.compute_probe import PROBE_SOURCE
    from memascend_cli.planner.time import CPU_ACHIEVED_FRACTION

    dev = timing["device"]
    return {"device": dev.name, "gflops": None if dev.flops_per_s is None else round(dev.flops_per_s / 1e9, 1),
            **({"cpu_fraction": CPU_ACHIEVED_FRACTION} if dev.source.startswith(PROBE_SOURCE) else {}),
            "device_source": dev.source, "read_gbps": timing["read_gbps"], "write_gbps": timing["write_gbps"],
            "bandwidth_source": timing.get("source"), "cpu_model": timing.get("cpu_model"),
            **({"probe_samples": timing["probe_samples"]} if timing.get("probe_samples") else {})}


def swap_space_short(mode: str, predicted: dict, ranks: int, nvme_dir: str) -> str | None:
    """Why a stock or tuned run cannot start: its swap files (the plan's SSD bytes) need more than the file system
    of `nvme_dir` has free; None when they fit, and for memascend, whose region is allocated before any run."""
    from memascend_cli.ssd.path import free_space_at

    if mode == "memascend":
        return None
    need = ssd_space_bytes(mode, predicted, ranks)
    where, free = free_space_at(nvme_dir)
    if need <= free:
        return None
    return f"does not fit: its swap files need {fmt_bytes(need)} on the SSD, {fmt_bytes(free)} free at {where}"


def execution_order(planned_peak_bytes: list[int]) -> list[int]:
    """Indices of the runs, smallest planned peak first. Memory a run frees can take minutes to show up as available
    again (a VM's free-page reporting: ~32 MiB/s here), which inflates the next run's idle level and so shrinks its
    measured peak; a smaller run after a larger one would be measured short by a larger share. Pure."""
    return sorted(range(len(planned_peak_bytes)), key=lambda i: (planned_peak_bytes[i], i))
