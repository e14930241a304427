"""The placement sweep's phase: per preset, `memascend bench --placement P` for each placement the plan prices
(gpu-resident where it fits, DRAM-resident, DRAM + SSD split, all-SSD; pure.PLACEMENT_SWEEP), one bench command per
point so every point that ends is recorded when the call's time runs out, random weights with clipping off. Beside
the runs: the plan of each preset on this machine (its placement rows, with the SSD rates the probe measured and the
CUDA constants of the call) and the SSD's phases (phase_io). Writes gpu_placements.json.

`bench --placement` is another engineer's work in progress (memascend_cli/options.py): while `bench --help` does not
list it, the phase records that and runs nothing (a dry run prints the commands it would run, with a warning).
A dry run writes gpu_placements.json from the plan's rows, marked synthetic."""

from __future__ import annotations

import json
import os
import shutil

from gpukit.bench import SYNTHETIC_HARDWARE, bench_accepts, plan_doc, sampled_run, ssd_rate_args
from gpukit.kit import Kit, StepRecord
from gpukit.pure import (DEFAULT_DISK_GBPS, PLACEMENT_STEPS, PLACEMENT_SWEEP, WEIGHTS, estimate_run_s,
                         placement_io_share, placement_row, run_timeout_s, summarize_bench_doc)

PLACEMENTS_FILE = "gpu_placements.json"
PLAN_ENGINE = {"tuned": "stock"}
"""The plan's placement rows name stock DeepSpeed's config `stock` (planner/placement.py); the bench runs it as
tuned."""


def plan_row(plan: dict | None, placement: str, run: str) -> dict | None:
    """The plan's row of `placement` for the engine that `run` is. Pure."""
    engine = PLAN_ENGINE.get(run, run)
    rows = ((plan or {}).get("placements") or {}).get("rows") or []
    return next((r for r in rows if r["placement"] == placement and r["engine"] == engine), None) or (
        next((r for r in rows if r["placement"] == placement and r["engine"] == run), None))


def rehearsal_doc(model: str, run: str, row: dict, num_params: int) -> dict:
    """A bench document as the dry run stands it in: the plan's row as the measurement. Pure."""
    t = row.get("time") or {}
    return {"synthetic": True, "job": {"model": model}, "runs": [{
        "name": run, "ok": bool(row.get("fits")), "peak_system_bytes": row.get("host_peak_bytes"),
        "peak_gpu_bytes": row.get("gpu_peak_bytes"), "seconds_per_step": t.get("seconds_per_step"),
        "tokens_per_s": t.get("tokens_per_s"),
        "ssd_bytes_per_param": {"read": round(row.get("ssd_read_bytes_per_step", 0) / num_params, 3),
                                "write": round(row.get("ssd_write_bytes_per_step", 0) / num_params, 3)},
        "predicted": {"node_host_peak_bytes": row.get("host_peak_bytes"), "gpu_peak_bytes": row.get("gpu_peak_bytes")},
        "error": None if row.get("fits") else "does not fit (synthetic: the plan's verdict)"}]}


def _cmd(kit: Kit, model: str, placement: str, run: str, out: str) -> list[str]:
    return [kit.py, "-m", "memascend_cli", "bench", "--model", model, "--placement", placement, "--runs", run,
            "--seq-len", str(kit.args.seq_len), "--steps", str(PLACEMENT_STEPS), "--accelerator",
            kit.args.accelerator, "--gradient-clipping", "0", "--settle-cap", str(kit.args.settle_cap_s), "--out", out,
            "--json"]


def phase_placements(kit: Kit) -> bool:
    if not bench_accepts(kit, "--placement"):
        msg = ("`memascend bench` has no --placement option yet (memascend_cli/options.py, in progress): the placement "
               "sweep needs it")
        if not kit.dry_run:
            kit.log(msg + "; sweep skipped")
            kit.steps.append(StepRecord("placements", "skipped", note=msg))
            _write(kit, {"schema_version": 1, "skipped": msg})
            return False
        print("[placements] WARNING: " + msg + "; the commands below are what it will run")
    gbps = min([g for g in (kit.storage.get("read_gbps"), kit.storage.get("write_gbps")) if g] or [DEFAULT_DISK_GBPS])
    plan_args = list(SYNTHETIC_HARDWARE) if kit.dry_run else ssd_rate_args(kit.storage)
    plans, docs, rows, io, points, sizes = {}, {}, [], {}, [], {}
    for model in kit.args.models.split(","):
        plans[model] = plan_doc(kit, model, "--seq-len", str(kit.args.seq_len), "--no-search", *plan_args)
        n = sizes[model] = int(((plans[model] or {}).get("model") or {}).get("num_params") or 1.5e9)
        for placement, run in PLACEMENT_SWEEP:
            key = f"{placement}/{run}"
            out = os.path.join(kit.ssd, "placements", model, placement, run)
            est = estimate_run_s(int(n * placement_io_share(placement)), PLACEMENT_STEPS, gbps)
            name = f"placement-{model}-{placement}-{run}"
            rec, io_point = sampled_run(kit, name, _cmd(kit, model, placement, run, out), out, PLACEMENT_STEPS,
                                        cap_s=run_timeout_s(est, 1e9), min_s=min(est, 45.0))
            points.append({"model": model, "placement": placement, "run": run, "status": rec.status,
                           "seconds": rec.seconds})
            row = plan_row(plans[model], placement, run)
            if kit.dry_run:
                doc = rehearsal_doc(model, run, row, n) if row else None
            else:
                doc = _read_doc(out, rec.status, model, os.path.join(kit.work, "logs", f"{name}.log"))
            if doc is None:
                continue
            docs.setdefault(model, {})[key] = doc
            io.setdefault(model, {})[key] = io_point
            for r in summarize_bench_doc(doc):
                rows.append({**placement_row(placement, r, doc["runs"][0].get("ssd_bytes_per_param")), "plan": row})
            if not kit.dry_run:
                for leftover in ("bench.region", "swap"):  # tens of GB at 1B: gone before the next point
                    p = os.path.join(out, leftover)
                    shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else (os.path.exists(p) and os.unlink(p))
    _write(kit, {"schema_version": 1, "seq_len": kit.args.seq_len, "steps": PLACEMENT_STEPS, "gradient_clipping": 0,
                 "weights": WEIGHTS, "num_params": sizes, "points": points, "rows": rows,
                 "plans": {m: (p or {}).get("placements") for m, p in plans.items()},
                 "documents": docs, "phase_io": io, **({"synthetic": True} if kit.dry_run else {})})
    return bool(rows) and all(r["ok"] for r in rows)


def _read_doc(out: str, status: str, model: str, log: str) -> dict | None:
    """The point's bench.json; a point bench refused or that died before writing it: its error line (bench says why
    a placement does not fit in one `error:` line), None for one the call's time skipped."""
    try:
        with open(os.path.join(out, "bench.json")) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        if status == "skipped":
            return None
    try:
        with open(log, errors="replace") as f:
            said = next((ln.strip() for ln in f if ln.startswith("error:")), "")
    except OSError:
        said = ""
    return {"runs": [{"name": os.path.basename(out), "ok": False, "error": said or f"{status}: no bench.json"}],
            "job": {"model": model}}


def _write(kit: Kit, doc: dict) -> None:
    with open(os.path.join(kit.out_dir, PLACEMENTS_FILE), "w") as f:
        json.dump({**doc, "storage": kit.storage, "facts": kit.facts}, f)
