"""The headline of docs/results.md: one table per claim (memory against stock and tuned, flatness in depth and
context, planner accuracy, SSD bytes per parameter against the roofline, speed), from today's sweeps. Stdlib only
(scripts/results.py imports it)."""

from __future__ import annotations

import os

from results_common import BENCH, REPO, gib, load_one, pct, table
from results_memory import (PLANNER_SECTION, PLANNER_TOLERANCE_PERCENT, finished_runs, replan, machine_line,
                            point_name, sweep_peak_table)
from results_markdown import slug

# Today's headline documents: the depth and context sweeps of today's engine (tuned and memascend, median of 3) and
# the stock runs of the depth sweep's points.
DEPTH = os.path.join(BENCH, "depth-sweep-seq2048-rep3-fp32.json.gz")
CONTEXT = os.path.join(BENCH, "context-sweep-lt-rep3-fp32.json.gz")
STOCK_DEPTH = os.path.join(BENCH, "depth-sweep-seq2048-fp32.json.gz")


def _source(path: str, doc: dict) -> str:
    """Where a headline's numbers come from: the document, its command and its machine and date."""
    first = doc["documents"][0] if doc.get("kind") == "sweep" else doc
    return (f"`{os.path.relpath(path, REPO)}`: `{(doc.get('meta') or {}).get('command', '?')}`. "
            f"{machine_line(first)}")


def _run(d: dict, name: str) -> dict | None:
    return next((r for r in d["runs"] if r["name"] == name and r["ok"]), None)


def _less(x: dict | None, ref: dict | None) -> str:
    if not x or not ref:
        return "-"
    return f"{100.0 * (1 - x['peak_system_bytes'] / ref['peak_system_bytes']):.1f}%"


def headline_memory(depth: dict, stock: dict) -> list[str]:
    stock_by = {point_name(d): _run(d, "stock") for d in stock["documents"]}
    rows = []
    for d in depth["documents"]:
        s, t, m = stock_by.get(point_name(d)), _run(d, "tuned"), _run(d, "memascend")
        rows.append([f"{point_name(d)} ({d['job']['num_params'] / 1e6:.0f}M)", gib(s and s["peak_system_bytes"]),
                     gib(t and t["peak_system_bytes"]), gib(m and m["peak_system_bytes"]), _less(m, s), _less(m, t)])
    return ["### Memory: memascend against stock and tuned DeepSpeed", "",
            "Peak system memory (GiB), bench-llama-136m, fp32, seq 2048. Tuned and memascend in one sitting (median of "
            "3 repeats); stock DeepSpeed as its docs configure it in an earlier sitting.", "",
            table(["point", "stock", "tuned", "memascend", "memascend less than stock", "memascend less than tuned"],
                  rows), "", f"- {_source(DEPTH, depth)}", f"- {_source(STOCK_DEPTH, stock)}", ""]


def headline_flatness(title: str, path: str, doc: dict) -> list[str]:
    return [f"### {title}", "", "Peak system memory (GiB) per point, median of 3 repeats.", "", sweep_peak_table(doc),
            "", f"- {_source(path, doc)}", ""]


def headline_planner(depth: dict, context: dict, cal: list, val: list) -> list[str]:
    sets = [("depth sweep (today's runs)", [(DEPTH, d, r) for d in depth["documents"] for r in d["runs"] if r["ok"]]),
            ("context sweep (today's runs)", [(CONTEXT, d, r) for d in context["documents"] for r in d["runs"]
                                              if r["ok"]]),
            ("calibration runs (fitted on)", finished_runs(cal)),
            ("validation runs (not fitted on)", finished_runs(val))]
    rows = []
    for title, runs in sets:
        for engine in ("stock", "tuned", "memascend"):
            errs = [replan(d, r)[1] for _, d, r in runs if r["mode"] == engine]
            if errs:
                within = sum(1 for e in errs if abs(e) <= PLANNER_TOLERANCE_PERCENT)
                rows.append([title, engine, str(len(errs)), f"{within} of {len(errs)}",
                             f"{pct(min(errs))} .. {pct(max(errs))}"])
    return ["### Planner accuracy", "",
            "Today's `memascend plan` of each recorded run (its exact config, job and techniques) against the measured "
            f"peak: (planned - measured) / measured. Target: within {PLANNER_TOLERANCE_PERCENT:.0f}% on the validation "
            "runs. Every run is listed on the memory page, "
            f"[{PLANNER_SECTION}](results/memory.md#{slug(PLANNER_SECTION)}).",
            "",
            table(["set", "engine", "runs", f"within {PLANNER_TOLERANCE_PERCENT:.0f}%", "error range"], rows), ""]


def headline_ssd(depth: dict, context: dict) -> list[str]:
    from memascend_cli.bench.document import ssd_minimum

    rows = []
    for label, doc in (("depth", depth), ("context", context)):
        for d in doc["documents"]:
            for r in d["runs"]:
                bpp, low = r.get("ssd_bytes_per_param"), ssd_minimum(r)
                if r["ok"] and bpp and low:
                    rows.append([f"{label} {point_name(d)}", r["name"], f"{bpp['read']:.1f} / {bpp['write']:.1f}",
                                 f"{low[0]:.1f} / {low[1]:.1f}",
                                 f"{pct(100.0 * (bpp['read'] - low[0]) / low[0]) if low[0] else '-'} / "
                                 f"{pct(100.0 * (bpp['write'] - low[1]) / low[1]) if low[1] else '-'}"])
    return ["### SSD bytes per parameter against the roofline", "",
            "A steady step's block I/O (rank 0's /proc/self/io) over the rank's parameters, next to the minimum for "
            "the run's placement (the plan's roofline for its config, memory.SsdTraffic.minimum_per_param).", "",
            table(["point", "run", "measured read / write", "minimum read / write", "excess read / write"], rows),
            "", f"- {_source(DEPTH, depth)}", f"- {_source(CONTEXT, context)}", ""]


def headline_speed(depth: dict, context: dict) -> list[str]:
    rows = []
    for label, doc in (("depth", depth), ("context", context)):
        for d in doc["documents"]:
            t, m = _run(d, "tuned"), _run(d, "memascend")
            if t and m and t["seconds_per_step"] and m["seconds_per_step"]:
                rows.append([f"{label} {point_name(d)}", f"{t['seconds_per_step']:.1f}", f"{m['seconds_per_step']:.1f}",
                             pct(100.0 * (m["seconds_per_step"] / t["seconds_per_step"] - 1))])
    return ["### Speed: seconds per step, memascend against tuned", "",
            "Mean of the steps after the first, of the repeat with the median peak; the runs of the two tables above "
            "(2 cores shared with other jobs: a few % is noise).", "",
            table(["point", "tuned s/step", "memascend s/step", "change"], rows), "",
            f"- {_source(DEPTH, depth)}", f"- {_source(CONTEXT, context)}", ""]


def section_headline(cal: list, val: list) -> str:
    depth, context, stock = load_one(DEPTH), load_one(CONTEXT), load_one(STOCK_DEPTH)
    out = ["## Today's headline", ""]
    out += headline_memory(depth, stock)
    out += headline_flatness("Flatness in depth: 8, 16, 32 layers at seq 2048", DEPTH, depth)
    out += headline_flatness("Flatness in context: seq 512, 2048, 8192 at 8 layers", CONTEXT, context)
    out += headline_planner(depth, context, cal, val)
    out += headline_ssd(depth, context)
    out += headline_speed(depth, context)
    return "\n".join(out) + "\n"

