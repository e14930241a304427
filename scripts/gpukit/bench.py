"""The kit's bench phase (`memascend bench` stock / tuned / memascend per preset, each run with its own time
budget; what does not fit the time or the disk is skipped with the reason), call 4's context sweep, and the
plots."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys
from dataclasses import asdict

from gpukit.kit import DiskSampler, Kit, StepRecord
from gpukit.phase_io import io_by_phase, phase_windows
from gpukit.pure import (BENCH_RUNS, DEFAULT_DISK_GBPS, REPO, RUN_COLORS, BenchDecision, GiB, decide_model,
                         disk_need_bytes, estimate_run_s, plan_max_seq, run_timeout_s, summarize_bench_doc,
                         sweep_stops, versus_stock, with_cuda_context)


def _plan(kit: Kit, model: str, *extra: str) -> dict | None:
    return plan_doc(kit, model, "--seq-len", str(kit.args.seq_len), *(extra or ("--no-search",)))


SYNTHETIC_HARDWARE = ("--hardware", "h100-80g-512g", "--dram", "128GiB", "--nvme-read-gbps", "3",
                      "--nvme-write-gbps", "3.5")
"""A dry run's plans: the lent GPU machine (one H100, 128 GiB DRAM; its SSD about what prepare-ssd's probe measured on
the H200 box, docs/bench/gpu/h200-llama-3.2-1b-2026-11-27.json.gz), not the machine the dry run runs on."""


def ssd_rate_args(storage: dict) -> list[str]:
    """plan's SSD rates from the call's probe: memascend's region probe (engine-like queue depths), else dd's. Pure."""
    probe = storage.get("region_probe") or {}
    read = probe.get("read_gbps") or storage.get("read_gbps")
    write = probe.get("write_gbps") or storage.get("write_gbps")
    return ["--nvme-read-gbps", f"{read:g}", "--nvme-write-gbps", f"{write:g}"] if read and write else []


def plan_doc(kit: Kit, model: str, *args: str) -> dict | None:
    """`memascend plan --model MODEL ARGS --json` of this machine (the venv's python once set up), None when it
    fails (said in the log)."""
    rc, out, err = kit.capture([kit.py if os.path.isfile(kit.py) else sys.executable, "-m", "memascend_cli", "plan",
                                "--model", model, *args, "--json"], timeout=120, env={"PYTHONPATH": REPO})
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        kit.log(f"plan of {model} {' '.join(args)} failed (rc {rc}): {err.strip()[-300:]}")
        return None


def bench_accepts(kit: Kit, flag: str) -> bool:
    """Whether this tree's `memascend bench --help` lists `flag`."""
    py = kit.py if os.path.isfile(kit.py) else sys.executable
    _, out, _ = kit.capture([py, "-m", "memascend_cli", "bench", "--help"], env={"PYTHONPATH": REPO,
                                                                               "COLUMNS": "200"})
    return flag in out


def phase_bench(kit: Kit) -> bool:
    if not bench_accepts(kit, "--accelerator"):
        msg = ("`memascend bench` has no --accelerator option yet: it would force DeepSpeed's CPU accelerator and "
               "measure nothing CUDA-specific; bench skipped (this kit needs a memascend with `bench --accelerator`)")
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
    phase_io: dict = {}
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
        kit.log(f"bench {model}: {d.runs_fit} of {len(runs)} runs of ~{d.estimate_s:.0f} s each (disk {gbps:.2f} "
                f"GB/s, calibration {calibration:.2f}), ~{d.need_disk_bytes / GiB:.1f} GiB of SSD space"
                + (f"; {d.reason}" if d.reason else ""))
        for run in runs[:d.runs_fit]:
            out = os.path.join(kit.ssd, "bench", model, run)
            cmd = _bench_cmd(kit, model, run, kit.args.seq_len, kit.args.steps, out)
            est = estimate_run_s(int(plan["model"]["num_params"]), kit.args.steps, gbps, calibration)
            if not kit.dry_run:
                shutil.rmtree(out, ignore_errors=True)
            rec, io = sampled_run(kit, f"bench-{model}-{run}", cmd, out, kit.args.steps,
                                  cap_s=run_timeout_s(est, 1e9), min_s=min(est, 60.0))
            if kit.dry_run:
                continue
            phase_io.setdefault(model, {})[run] = io
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
    rows = with_cuda_context(rows, (kit.summary.get("cuda_constants") or {}).get("cuda_context_gpu_bytes"))
    kit.summary["bench_rows"] = rows
    kit.summary["bench_vs_stock"] = versus_stock(rows)
    with open(os.path.join(kit.out_dir, "gpu_bench.json"), "w") as f:
        json.dump({"schema_version": 1, "seq_len": kit.args.seq_len, "steps": kit.args.steps,
                   "storage": kit.storage, "facts": kit.facts, "decisions": decisions, "documents": docs,
                   "phase_io": phase_io}, f)
    problem = write_plots(kit.out_dir, docs, rows)
    if problem:
        kit.log(problem)
    skipped = [d["model"] for d in decisions if not d["run"]]
    if skipped:
        kit.summary["next_call"] = ("bash scripts/gpu_check.sh run --phases setup,probe,constants,bench --models "
                                    + ",".join(skipped))
        kit.log("not measured in this call: " + ", ".join(skipped) + "; a next call (setup included): "
                + kit.summary["next_call"])
    return all(r["ok"] for r in rows) and bool(rows)


def sampled_run(kit: Kit, name: str, cmd: list[str], out: str, steps: int, *, cap_s: float,
                min_s: float) -> tuple[StepRecord, dict]:
    """One bench command with the SSD's /proc/diskstats sampled beside it: (its step record, what the SSD did in each
    phase of steps 2..`steps`, phase_io.io_by_phase, with the device and why a phase is missing)."""
    stdout = os.path.join(kit.work, "logs", f"{name}.json")
    if kit.dry_run:
        return kit.run(name, cmd, cap_s=cap_s, min_s=min_s, cwd=REPO, stdout_path=stdout, echo_lines=40), {}
    os.makedirs(kit.ssd, exist_ok=True)
    with DiskSampler(kit.ssd) as sampler:
        rec = kit.run(name, cmd, cap_s=cap_s, min_s=min_s, cwd=REPO, stdout_path=stdout, echo_lines=40)
    events = []
    for rank_file in sorted(glob.glob(os.path.join(out, "runs", "*", "events-rank0.jsonl"))):
        with open(rank_file, errors="replace") as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue  # a line cut off when the run was killed
    io = {"device": f"{sampler.major}:{sampler.minor}", "samples": len(sampler.samples),
          "interval_s": sampler.interval_s, "phases": io_by_phase(sampler.samples, phase_windows(events, steps))}
    if sampler.reason or not io["phases"]:
        io["reason"] = sampler.reason or "no phase marks of steps 2.. in the run's events"
    return rec, io


def _bench_cmd(kit: Kit, model: str, run: str, seq_len: int, steps: int, out: str) -> list[str]:
    return [kit.py, "-m", "memascend_cli", "bench", "--model", model, "--seq-len", str(seq_len), "--steps", str(steps),
            "--runs", run, "--accelerator", kit.args.accelerator, "--settle-cap", str(kit.args.settle_cap_s),
            *([] if kit.args.gradient_clipping is None else ["--gradient-clipping", f"{kit.args.gradient_clipping:g}"]),
            "--out", out, "--json"]


def _run_result(out: str) -> tuple[bool, str, dict]:
    """(ok, why not, the run's record) of a one-run bench document."""
    try:
        with open(os.path.join(out, "bench.json")) as f:
            runs = json.load(f).get("runs", [])
    except (OSError, json.JSONDecodeError):
        return False, "no bench.json", {}
    ok = bool(runs) and all(r.get("ok") for r in runs)
    return ok, "; ".join(str(r.get("error")) for r in runs if not r.get("ok"))[:300], runs[0] if runs else {}


def phase_sweep(kit: Kit) -> bool:
    """Call 4: the paper's capability claim on a 128 GiB box. One preset, growing context, the engines side by side
    at each length (so every engine gets its share when the call's time ends); an engine that failed at one
    length is not tried at a longer one. Recorded next to the plan's largest context per engine."""
    model = kit.args.models.split(",")[0]
    seq_lens = [int(x) for x in kit.args.sweep_seq_lens.split(",") if x]
    runs = [r for r in kit.args.runs.split(",") if r]
    plan = _plan(kit, model, "--search") or {}
    predicted = {r: plan_max_seq(plan, r) for r in runs}
    points: list[dict] = []
    failed: set[str] = set()
    timed_out = False
    gbps = min([g for g in (kit.storage.get("read_gbps"), kit.storage.get("write_gbps")) if g] or [DEFAULT_DISK_GBPS])
    n = int((plan.get("model") or {}).get("num_params") or 5e8)
    for seq in seq_lens:
        for run in runs:
            if run in failed or timed_out:
                continue
            out = os.path.join(kit.ssd, "sweep", f"{run}-{seq}")
            est = estimate_run_s(n, 2, gbps) * max(1.0, seq / 2048) ** 0.5  # longer context: more compute per step
            if not kit.dry_run:
                shutil.rmtree(out, ignore_errors=True)
            rec = kit.run(f"sweep-{run}-{seq}", _bench_cmd(kit, model, run, seq, 2, out), cap_s=run_timeout_s(est, 1e9),
                          min_s=min(est, 60.0), cwd=REPO, echo_lines=20,
                          stdout_path=os.path.join(kit.work, "logs", f"sweep-{run}-{seq}.json"))
            if kit.dry_run:
                continue
            if rec.status in ("timeout", "skipped"):
                timed_out = True  # the call's time, not the engine, ended this point
                continue
            ok, why, r0 = _run_result(out)
            points.append({"engine": run, "seq_len": seq, "ok": ok, "error": None if ok else why,
                           "peak_system_bytes": r0.get("peak_system_bytes"), "peak_gpu_bytes": r0.get("peak_gpu_bytes"),
                           "peak_gpu_reserved_bytes": r0.get("peak_gpu_reserved_bytes"),
                           "seconds_per_step": r0.get("seconds_per_step"), "tokens_per_s": r0.get("tokens_per_s")})
            if not ok:
                failed.add(run)
            for leftover in ("bench.region", "swap"):
                p = os.path.join(out, leftover)
                shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else (os.path.exists(p) and os.unlink(p))
    if kit.dry_run:
        print(f"[sweep] {model}: seq {', '.join(map(str, seq_lens))} x {', '.join(runs)} until each fails or the "
              f"call's time ends; the plan's largest context: {json.dumps(predicted)}")
        return True
    stops = sweep_stops(points)
    for run in runs:
        stops.setdefault(run, {"largest_ok_seq": None, "failed_seq": None, "reason": "not run (time)"})
        stops[run]["plan_max_seq"] = predicted.get(run)
        stops[run]["stopped_by"] = ("failure" if stops[run]["failed_seq"] else "time" if timed_out else
                                    "end of the sweep")
    kit.summary["sweep"] = stops
    with open(os.path.join(kit.out_dir, "gpu_sweep.json"), "w") as f:
        json.dump({"schema_version": 1, "model": model, "seq_lens": seq_lens, "points": points, "stops": stops,
                   "storage": kit.storage, "facts": kit.facts}, f, indent=1)
    kit.log("sweep: " + json.dumps(stops))
    return bool(points)


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
        plotted = False
        for j, run in enumerate(runs):
            xs, ys, ps = [], [], []
            for i, m in enumerate(models):
                r = next((x for x in rows if x["model"] == m and x["run"] == run), None)
                if r and r.get(key) is not None:
                    xs.append(i + (j - (len(runs) - 1) / 2) * width)
                    ys.append(r[key] / scale)
                    ps.append(r.get(pred_key) / scale if pred_key and r.get(pred_key) is not None else None)
            if xs:
                plotted = True
                ax.bar(xs, ys, width, label=run, color=RUN_COLORS.get(run))
            for x, p in zip(xs, ps):
                if p is not None:
                    ax.plot([x - width / 2, x + width / 2], [p, p], color="black", linewidth=1.5)
        if not plotted:
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
                            color=RUN_COLORS.get(r["name"]),
                            label=f"{r['name']} (peak {(r.get('peak_system_bytes') or 0) / GiB:.2f} GiB)")
        ax.set_xlabel("seconds since launch")
        ax.set_ylabel("MemTotal - MemAvailable - idle (GiB)")
        ax.set_title(f"{m}: system memory over time")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"bench_{re.sub(r'[^A-Za-z0-9_.-]', '_', m)}.png"), dpi=100)
        plt.close(fig)
    return None


