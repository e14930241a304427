"""What a bench run's child left behind, read into its RunResult: the ranks' events (steps, SSD bytes, phases, a
wait on a lock), the memory samples around the launch, and the verdict (finished, OOM-killed, thrashing, timed out,
waited on a lock, or the child's own error). Pure but for reading the event files and the log's tail."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from memascend_cli.bench.sampling import bucket_max, nearest, sampling_stats

if TYPE_CHECKING:
    from memascend_cli.bench.runner import RunResult


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
        if all(f.get("determinism") for f in finals):
            out["determinism"] = run_determinism(finals)
    out["phases"] = [e for e in ev0 if e.get("event") == "phase"]
    return out


def run_determinism(finals: list[dict]) -> dict:
    """What decided a run's losses (memascend_engine.determinism, each rank's final record): rank 0's kernels, every
    rank's parameter digest in rank order, the slowest rank's digest seconds. Pure."""
    by_rank = sorted(finals, key=lambda f: f.get("rank", 0))
    dets = [f["determinism"] for f in by_rank]
    return {**{k: v for k, v in dets[0].items() if not k.startswith("param_")},
            "param_crc32": [d["param_crc32"] for d in dets], "param_bytes": dets[0]["param_bytes"],
            "param_digest_s": max(d["param_digest_s"] for d in dets)}


def waiting_on(events: dict[int, list[dict]]) -> dict | None:
    """The lock a rank was last waiting on ({"on", "holders", "waited_s"}, the rank's "wait" event), when nothing
    followed that wait, else None. Pure."""
    for evs in events.values():
        if evs and evs[-1].get("event") == "wait":
            return evs[-1]
    return None


def judge(res: RunResult, *, code: int, steps: int, events: dict, errors: list[str], watch, timeout_s: float | None,
          capped: bool) -> None:
    """res.ok, or res.error: why the run failed (OOM-killed, waited on a lock, thrashing, timed out, the child's own
    errors or exit status). Pure but for the log's tail."""
    from memascend_cli.run.cgroup import THRASH_FULL_SHARE, THRASH_WINDOW_S

    wait = waiting_on(events)
    if code == 0 and len(res.losses) == steps:
        res.ok = True
    elif res.oom_killed:
        res.error = f"does not fit: OOM-killed at step {len(res.losses) + 1} ({_phase(events)}) under the DRAM cap"
    elif wait is not None:  # not a capacity result: the rank slept on a lock, whatever the cap's pressure read
        res.waited_on, res.thrashed, res.timed_out = wait, False, False
        res.error = (f"stalled in {_phase(events)}: waited on {wait['on']}, held by {', '.join(wait['holders'])}"
                     + (f" ({'; '.join(errors)})" if errors else ""))
    elif res.thrashed:
        res.error = (f"does not fit: thrashing at step {len(res.losses) + 1} ({_phase(events)}) under the DRAM cap: "
                     f"{watch.scope} tasks all stalled on memory {watch.max_share:.0%} of {THRASH_WINDOW_S:.0f} s "
                     f"(killed at {THRASH_FULL_SHARE:.0%}, systemd-oomd's limit)")
    elif res.timed_out:
        res.error = (f"did not finish within {timeout_s:.0f} s: killed at step {len(res.losses) + 1} "
                     f"({_phase(events)})" + (" under the DRAM cap" if capped else ""))
    else:
        res.error = "; ".join(errors) or f"exit status {code}; last lines of {res.log_path}:\n" + _tail(res.log_path)


def record_memory(res: RunResult, tree, ts: list, used: list, *, t_launch: float, t_end: float,
                  others_at_idle: int) -> None:
    """The run's memory from the samples: the peak over the settled idle level, when and beside what the other
    processes did, the timeline, the process tree's largest RSS. Pure."""
    res.max_tree_rss_bytes = tree.max_tree_rss_bytes
    res.per_process_max_rss = sorted(({"pid": p, "cmd": n, "max_rss_bytes": b}
                                      for p, (n, b) in tree.per_process_max_rss_bytes.items()),
                                     key=lambda d: -d["max_rss_bytes"])[:8]
    if tree.others_rss_bytes:
        vals = [v for _, v in tree.others_rss_bytes]
        res.others_rss_span_bytes = max(vals) - min(vals)
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


def record_cpu(res: RunResult, rusage, *, busy_s: tuple, self_s: tuple) -> None:
    """The child's CPU seconds and largest RSS (wait4's rusage), this process's sampling, and the rest of the
    machine's busy seconds over the run (busy_s, self_s: at the launch and at the end). Pure."""
    res.ru_maxrss_bytes = rusage.ru_maxrss * 1024 if rusage is not None else None
    res.cpu_seconds = round(rusage.ru_utime + rusage.ru_stime, 2) if rusage is not None else None
    res.bench_cpu_seconds = round(self_s[1] - self_s[0], 2)
    if res.cpu_seconds is not None and busy_s[0] is not None and busy_s[1] is not None:
        res.others_cpu_seconds = round(max(0.0, busy_s[1] - busy_s[0] - res.cpu_seconds - res.bench_cpu_seconds), 2)


def record_events(res: RunResult, summary: dict, *, t_launch: float) -> None:
    """What the ranks reported (summarize_events), with the phases timed from the launch. Pure."""
    for k in ("losses", "grad_norms", "seconds_per_step", "first_step_seconds", "tokens_per_s", "ssd_read_bytes_per_step",
              "ssd_write_bytes_per_step", "ssd_read_bytes", "ssd_written_bytes",
              "ssd_read_bytes_steps", "ssd_written_bytes_steps", "swap_bytes_on_disk", "engine_stats", "peak_gpu_bytes",
              "peak_gpu_reserved_bytes", "pinned_bytes", "determinism"):
        if k in summary:
            setattr(res, k, summary[k])
    res.phases = [{"name": p["name"], "at_s": round(p["t_mono"] - t_launch, 3),
                   **{k: p[k] for k in ("rss_anon_bytes", "rss_file_bytes", "malloc") if k in p}}
                  for p in summary["phases"]]
    if res.peak_at_s is not None:
        res.peak_phase = next((p["name"] for p in reversed(res.phases) if p["at_s"] <= res.peak_at_s), "startup")


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
