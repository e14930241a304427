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
                                         plan_job, predict, ssd_space_bytes)
from memascend_cli.bench.document import build_document
from memascend_cli.bench.runs import RunSpec
from memascend_cli.bench.sampling import (SETTLE_CAP_S, MeminfoReader, MemSampler, TreeSampler, bucket_max,
                                          drop_caches, nearest, others_rss_bytes, read_busy_cpu_seconds,
                                          sampling_stats, settle)
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


def summarize_events(events_by_rank: dict[int, list[dict]], *, micro_batch: int, seq_len: int, ranks: int,
                     grad_accum: int = 1) -> dict:
    """Step timing from rank 0 (a step: grad_accum micro-batches and the optimizer); SSD bytes summed over ranks.
    Pure."""
    ev0 = events_by_rank.get(0, [])
    steps = [e for e in ev0 if e.get("event") == "step"]
    finals = [next((e for e in evs if e.get("event") == "final"), None) for evs in events_by_rank.values()]
    finals = [f for f in finals if f is not None]
    errors = [e["message"] for evs in events_by_rank.values() for e in evs if e.get("event") == "error"]
    out: dict = {"losses": [s["loss"] for s in steps], "grad_norms": [s.get("grad_norm") for s in steps],
                 "errors": errors}
    if steps:
        # Step 1 also records the parameter trace and creates the Adam states: report it apart.
        timed = steps[1:] if len(steps) > 1 else steps
        sps = sum(s["seconds"] for s in timed) / len(timed)
        out.update(seconds_per_step=sps, first_step_seconds=steps[0]["seconds"],
                   tokens_per_s=micro_batch * seq_len * grad_accum * ranks / sps)
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


def child_command(args: list[str], ranks: int) -> list[str]:
    """One rank: `python -m memascend_engine.bench_job`. More: torchrun (python -m torch.distributed.run -m ...)."""
    if ranks == 1:
        return [sys.executable, "-m", JOB_MODULE, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--nnodes", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", JOB_MODULE, *args]


def run_one(run: RunSpec, *, job_args: list[str], cfg: dict, out_dir: str, nvme_dir: str, ranks: int,
            micro_batch: int, seq_len: int, steps: int, region: str | None, progress=None,
            settle_cap_s: float = SETTLE_CAP_S, accelerator: str = "cpu", extra_args: list[str] | None = None,
            loss: str, dram_cap_bytes: int | None = None, timeout_s: float | None = None,
            io_limits: tuple = (), predicted: dict | None = None) -> RunResult:
    """Settle, launch the child (in a memory cgroup of dram_cap_bytes and an io cgroup throttled to io_limits
    (run/iolimit.py) if given), sample until it exits or runs past
    timeout_s (then it is killed, its ranks die with it), collect its events. The child dies with this process
    (run/lifeline.py). A stock or tuned run whose swap files (`predicted`, the run's plan) do not fit on the disk is
    refused before it starts."""
    import shutil
    from contextlib import ExitStack

    from memascend_cli.run import lifeline
    from memascend_cli.run.cgroup import THRASH_FULL_SHARE, THRASH_WINDOW_S, RunCgroup

    res = RunResult(name=run.name, mode=run.mode, disabled=list(run.disabled), ok=False, config=cfg,
                    predicted=predicted, optimizer_moments=run.moments)
    run_dir = os.path.join(out_dir, "runs", run.name)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    shutil.rmtree(nvme_dir, ignore_errors=True)  # stale swap files would be read back as data
    os.makedirs(nvme_dir)
    res.error = swap_space_short(run.mode, predicted, ranks, nvme_dir) if predicted else None
    if res.error:  # stock's swap files would fill the disk mid-run (ENOSPC); the other engines still run
        return res
    cfg_path = os.path.join(run_dir, "ds_config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    events_prefix = os.path.join(run_dir, "events")
    args = [*job_args, "--mode", run.mode, "--ds-config", cfg_path, "--events", events_prefix,
            "--checkpointing-impl", checkpointing_impl(run.mode, run.disabled), "--loss-impl", loss_impl(run.mode, loss)]
    for t in run.disabled:
        args += ["--disable", t]
    if run.moments != "fp32":
        args += ["--optimizer-moments", run.moments]
    args += list(extra_args or [])
    if region is not None:
        args += ["--region", region]
    run_env = dict(run.env)
    env = {**child_env(run.mode, cfg, os.environ, accelerator=accelerator), **run_env, lifeline.ENV: lifeline.token()}
    res.env = {k: env[k] for k in ("DS_ACCELERATOR", "DS_PIN_MEMORY_BACKEND", "TORCH_EXTENSIONS_DIR",
                                   "MEMASCEND_VERIFY_CHECKSUMS", *ENGINE_ENV, *run_env) if k in env}
    task = progress.add_task(f"{run.name}: settling", total=steps) if progress is not None else None

    def tick(waited_s, spread):
        if progress is not None:
            s = "…" if spread is None else f"{spread / MiB:.0f} MiB"
            progress.update(task, description=f"{run.name}: settle {waited_s:.0f}s ±{s}")

    from memascend_cli.run import leftovers

    swept_before = leftovers.sweep()
    if swept_before.note():
        from memascend_cli.console import err

        (progress.console if progress is not None else err).print(f"note: {swept_before.note()}", highlight=False,
                                                                   soft_wrap=True)
    res.shm = {"before_bytes": leftovers.shm_used_bytes(), "segments_before": leftovers.deepspeed_segments(),
               "swept_before": swept_before.to_dict()}
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
        rank0_events = f"{events_prefix}-rank0.jsonl"
        watch = cap.pressure_watch() if dram_cap_bytes else None
        try:
            while True:
                pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
                if pid == proc.pid:
                    break
                if watch is not None:
                    watch.sample(time.monotonic())
                    res.thrashed = watch.thrashing() is not None
                timed_out = timeout_s is not None and time.monotonic() - t_launch > timeout_s
                if timed_out or res.thrashed:
                    proc.kill()
                    _, status, rusage = os.wait4(proc.pid, 0)
                    res.timed_out = timed_out
                    break
                if progress is not None:
                    evs = read_events(rank0_events)
                    done = sum(1 for e in evs if e.get("event") == "step")
                    phase = next((e["name"] for e in reversed(evs) if e.get("event") == "phase"), "starting")
                    wait = waiting_on({0: evs})
                    progress.update(task, completed=done, description=f"{run.name}: {phase}" + (
                        f", waiting on {wait['on']} ({', '.join(wait['holders'])})" if wait else ""))
                time.sleep(0.2)
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
        if io_limits:
            res.io_throttle = cap.io_result()
        if dram_cap_bytes:
            if watch is not None:
                res.memory_stall = {"scope": watch.scope, "max_full_share": round(watch.max_share, 3),
                                    "window_s": THRASH_WINDOW_S}
            cg = cap.result(sigkilled=not (res.timed_out or res.thrashed) and os.WIFSIGNALED(status)
                            and os.WTERMSIG(status) == signal.SIGKILL)
            res.cgroup, res.oom_killed = {"limit_bytes": dram_cap_bytes, **cg.to_dict()}, cg.oom_killed
    finally:
        reader.close()
        stack.close()  # kills what is left in the cgroup and removes it
    res.wall_s = t_end - t_launch
    swept_after = leftovers.sweep()
    after = leftovers.deepspeed_segments()
    held = leftovers.held_paths(os.path.join(leftovers.SHM_DIR, leftovers.SHM_PREFIX))
    # What the run left: segments new since the launch that no live process holds (another job's live ones are not).
    left = [n for n in after if n not in res.shm["segments_before"] and os.path.join(leftovers.SHM_DIR, n) not in held]
    res.shm.update(after_bytes=leftovers.shm_used_bytes(), segments_after=after, left_by_run=left,
                   swept_after=swept_after.to_dict())
    code = os.waitstatus_to_exitcode(status)
    res.ru_maxrss_bytes = rusage.ru_maxrss * 1024 if rusage is not None else None
    res.cpu_seconds = round(rusage.ru_utime + rusage.ru_stime, 2) if rusage is not None else None
    res.bench_cpu_seconds = round(self_at_end - self_at_launch, 2)
    if res.cpu_seconds is not None and busy_at_launch is not None and busy_at_end is not None:
        res.others_cpu_seconds = round(max(0.0, busy_at_end - busy_at_launch - res.cpu_seconds
                                           - res.bench_cpu_seconds), 2)
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
    summary = summarize_events(events, micro_batch=micro_batch, seq_len=seq_len, ranks=ranks,
                               grad_accum=int(cfg.get("gradient_accumulation_steps", 1)))
    for k in ("losses", "grad_norms", "seconds_per_step", "first_step_seconds", "tokens_per_s", "ssd_read_bytes_per_step",
              "ssd_write_bytes_per_step", "ssd_read_bytes", "ssd_written_bytes",
              "ssd_read_bytes_steps", "ssd_written_bytes_steps", "swap_bytes_on_disk", "engine_stats", "peak_gpu_bytes",
              "peak_gpu_reserved_bytes", "pinned_bytes"):
        if k in summary:
            setattr(res, k, summary[k])
    res.phases = [{"name": p["name"], "at_s": round(p["t_mono"] - t_launch, 3),
                   **{k: p[k] for k in ("rss_anon_bytes", "rss_file_bytes", "malloc") if k in p}}
                  for p in summary["phases"]]
    if res.peak_at_s is not None:
        res.peak_phase = next((p["name"] for p in reversed(res.phases) if p["at_s"] <= res.peak_at_s), "startup")
    wait = waiting_on(events)
    if code == 0 and len(res.losses) == steps:
        res.ok = True
    elif res.oom_killed:
        res.error = f"does not fit: OOM-killed at step {len(res.losses) + 1} ({_phase(events)}) under the DRAM cap"
    elif wait is not None:  # not a capacity result: the rank slept on a lock, whatever the cap's pressure read
        res.waited_on, res.thrashed, res.timed_out = wait, False, False
        res.error = (f"stalled in {_phase(events)}: waited on {wait['on']}, held by {', '.join(wait['holders'])}"
                     + (f" ({'; '.join(summary['errors'])})" if summary["errors"] else ""))
    elif res.thrashed:
        res.error = (f"does not fit: thrashing at step {len(res.losses) + 1} ({_phase(events)}) under the DRAM cap: "
                     f"{watch.scope} tasks all stalled on memory {watch.max_share:.0%} of {THRASH_WINDOW_S:.0f} s "
                     f"(killed at {THRASH_FULL_SHARE:.0%}, systemd-oomd's limit)")
    elif res.timed_out:
        res.error = (f"did not finish within {timeout_s:.0f} s: killed at step {len(res.losses) + 1} "
                     f"({_phase(events)})" + (" under the DRAM cap" if dram_cap_bytes else ""))
    else:
        res.error = "; ".join(summary["errors"]) or f"exit status {code}; last lines of {res.log_path}:\n" + _tail(res.log_path)
    if progress is not None:
        progress.update(task, completed=len(res.losses),
                        description=f"{run.name}: {'done' if res.ok else '[red]failed[/red]'}")
    shutil.rmtree(nvme_dir, ignore_errors=True)
    return res


def _self_cpu_seconds() -> float:
    """User + system CPU seconds of this process, all its threads."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def waiting_on(events: dict[int, list[dict]]) -> dict | None:
    """The lock a rank was last waiting on ({"on", "holders", "waited_s"}, the rank's "wait" event), when nothing
    followed that wait, else None. Pure."""
    for evs in events.values():
        if evs and evs[-1].get("event") == "wait":
            return evs[-1]
    return None


def _phase(events: dict[int, list[dict]]) -> str:
    """Rank 0's last phase event (startup before the first)."""
    return next((e["name"] for e in reversed(events.get(0, [])) if e.get("event") == "phase"), "startup")


def _tail(path: str, nbytes: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - nbytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


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
              dram_cap_bytes: int | None = None, timeout_s: float | None = None, io_limits: tuple = ()) -> dict:
    """Every run of one point, each after memory settled, `repeat` times; returns the point's JSON
    document (median_run stands for the repeats of a run)."""
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
    cfgs = [build_ds_config(run.mode, spec, micro_batch=p.micro_batch, dtype=p.dtype, nvme_dir=nvme_dir, ranks=ranks,
                            aio_block_size=aio_block, aio_queue_depth=aio_depth, grad_accum=p.grad_accum,
                            gradient_clipping=p.gradient_clipping)
            for run in run_specs]
    predictions = [p.predict(run.mode, cfg, run.disabled, run.moments) for run, cfg in zip(run_specs, cfgs)]
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
                              settle_cap_s=settle_cap_s, accelerator=p.accelerator,
                              extra_args=engine_args(predicted) if run.mode == "memascend" else None,
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
    return build_document(job=job, hardware=hardware, runs=results, notes=notes)


def _sitting(nvme_dir: str, cpu_cores: int, err) -> dict:
    """This sitting's matmul and disk rates (bench.sitting), printed with the cached probe's for comparison."""
    from memascend_cli.bench.sitting import sitting_probe, sitting_text
    from memascend_cli.compute_probe import cached_cpu
    from memascend_cli.hardware import local_cpu_model

    os.makedirs(nvme_dir, exist_ok=True)  # a capacity search removes it between probes
    probe = sitting_probe(nvme_dir)
    cached = (cached_cpu(local_cpu_model(), cpu_cores) or {}).get("fp32_gflops")
    if cached:
        probe["cached_fp32_gflops"] = cached
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
