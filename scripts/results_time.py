"""docs/results.md's step-time section: `memascend bench` runs with and without `--ssd-bandwidth`, measured s/step
against the plan's time model (memascend_cli/planner/time.py). Stdlib only (scripts/results.py imports it)."""

from __future__ import annotations

import os

from results_common import pct, table

TIME_TOLERANCE_PERCENT = 15.0
"""The time model's bar (issue 26): predicted s/step within 15% of the bench's."""


def _limit(doc: dict) -> str:
    bps = doc["job"].get("ssd_bandwidth_bytes_per_s")
    return "none" if not bps else f"{bps / 1e6:g} MB/s"


def _today(doc: dict, run: dict) -> dict | None:
    """Today's time model on the run's recorded job, config and rates (configs.repredict), else the prediction
    recorded with it."""
    from memascend_cli.bench.configs import repredict

    return repredict(doc, run).get("time") or (run.get("predicted") or {}).get("time")


def _others(run: dict) -> str:
    """Cores the rest of the machine kept busy on average while the run ran ('-' for runs recorded without it)."""
    if run.get("others_cpu_seconds") is None or not run.get("wall_s"):
        return "-"
    return f"{run['others_cpu_seconds'] / run['wall_s']:.2f}"


def section_ssd_bound(runs: list) -> str:
    """One row per run of the documents under docs/bench/ssd-bound/: measured and planned s/step."""
    if not runs:
        return ""
    # Unthrottled first, then by limit.
    runs = sorted(runs, key=lambda pd: pd[1]["job"].get("ssd_bandwidth_bytes_per_s") or float("inf"), reverse=True)
    rows, misses, total = [], 0, 0
    for path, doc in runs:
        for r in doc["runs"]:
            if not r["ok"]:
                rows.append([_limit(doc), r["name"] + " (failed)"] + ["-"] * 9 + [f"`{os.path.basename(path)}`"])
                continue
            t = _today(doc, r) or {}
            plan_s, sps = t.get("seconds_per_step"), r["seconds_per_step"]
            err = None if not plan_s else 100.0 * (plan_s - sps) / sps
            total += err is not None
            misses += err is not None and abs(err) > TIME_TOLERANCE_PERCENT
            res = t.get("resource_seconds") or {}
            bpp = r.get("ssd_bytes_per_param")
            rows.append([_limit(doc), r["name"], f"{sps:.2f}", "-" if not plan_s else f"{plan_s:.2f}", pct(err),
                         f"{r['tokens_per_s']:.0f}", "-" if not bpp else f"{bpp['read']:.1f} / {bpp['write']:.1f}",
                         f"{res.get('compute', 0):.1f} / {res.get('SSD read', 0):.1f} / {res.get('SSD write', 0):.1f}",
                         t.get("binding", "-"), f"{r['first_step_seconds']:.1f}", _others(r),
                         f"`{os.path.basename(path)}`"])
    first = runs[0][1]
    timing = first["job"].get("timing") or {}
    out = ["## The SSD-bound regime: step time, measured and planned", "",
           "`memascend bench --ssd-bandwidth` throttles each engine's reads and writes to the block device under its "
           "region and swap directory (its own io cgroup), so that a CPU step spends several times its compute on "
           "the SSD, as a GPU step does. Plan s/step is `memascend plan`'s time model (memascend_cli/planner/time.py) "
           "on each run's recorded job and config, with the rates the bench recorded: the CPU's from `memascend "
           f"inspect --cpu-probe` ({timing.get('gflops', '?')} GFLOP/s fp32 here), the SSD's from the region's "
           "prepare-ssd probe, or the throttle. s/step is the mean of the steps after the first (the first also "
           "writes the Adam states); SSD bytes per parameter are a steady step's /proc/self/io. Other jobs' cores: "
           "the CPU seconds the rest of the machine was busy during the run over its wall time (2 cores in all; "
           "the bench's own samplers count there too), what slowed the compute the plan takes at the probe's rate. "
           "Each document is one sitting.", "",
           table(["SSD limit", "run", "s/step", "plan s/step", "plan error", "tokens/s", "SSD B/param read / write",
                  "plan compute / SSD read / SSD write s", "plan binds", "step 1 s", "other jobs' cores", "raw"],
                 rows), "",
           f"{total - misses} of {total} runs within {TIME_TOLERANCE_PERCENT:.0f}% "
           "(`tests/unit/test_time_validation.py` checks every CPU bench document).", ""]
    for path, doc in runs:
        cmd = (doc.get("meta") or {}).get("command", "?")
        out.append(f"- `{os.path.basename(path)}` ({(doc.get('meta') or {}).get('date', '?')}): `{cmd}`")
    return "\n".join(out) + "\n"
