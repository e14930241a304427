"""The results' placement curve (docs/results/time.md): `memascend bench --placements` documents under
docs/bench/placements/, tokens/s and SSD bytes per parameter against the DRAM cap for stock's best config, tuned
(all on the SSD) and memascend's recommended placement, each beside the plan and the plan at its sitting's probe
(from the points' own documents in the folder beside it of its name), and the sitting's other runs recorded there.
Torch-free (scripts/results.py imports it)."""

from __future__ import annotations

import os

from results_common import REPO, pct, table
from results_time import cores_taken

from memascend_cli.bench.document import read_summary, recorded_stem, recorded_summaries
from memascend_cli.bench.placements import CURVES, curve, plan_at_sitting
from memascend_cli.units import GiB

HEADER = ["cap GiB", "run", "placement", "s/step", "plan s/step", "plan error", "plan at the sitting's probe",
          "tokens/s", "SSD B/param", "plan SSD B/param", "cgroup peak GiB", "cores taken"]


def _err(measured, planned) -> str:
    return "-" if not measured or planned is None else pct(100.0 * (planned - measured) / measured)


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def records_beside(path: str) -> list[tuple[str, dict]]:
    """(repository path, bench document) of the records in the folder beside the placements document at `path`
    (repository-relative) of its name: each point's own document (OUT/cap-*/bench.json, gzipped: phases, probes,
    engine counters) and other runs of that sitting."""
    return [(os.path.relpath(p, REPO), read_summary(p))
            for p in recorded_summaries(os.path.join(REPO, recorded_stem(path), "*.json"))]


def point_records(records: list[tuple[str, dict]], command: str) -> dict[float, dict]:
    """{cap GiB: the point's own document} among `records`: those the sweep's `command` wrote."""
    return {d["job"]["dram_cap_bytes"] / GiB: d for _, d in records
            if "runs" in d and d["job"].get("dram_cap_bytes") and (d.get("meta") or {}).get("command") == command}


OTHER_HEADER = ["run", "placement", "s/step", "plan s/step", "plan at the sitting's probe", "tokens/s", "SSD B/param",
                "cgroup peak GiB", "ru_maxrss GiB", "cores taken"]


def _others(records: list[tuple[str, dict]], command: str) -> list[str]:
    """The sitting's other runs beside the curve (a repeat, a placement with one technique off): one table each."""
    out = []
    for path, d in records:
        meta = d.get("meta") or {}
        if "runs" not in d or meta.get("command") == command:
            continue
        rows = []
        for r in d["runs"]:
            ok = r["ok"]
            plan = ((r.get("placement") or {}).get("planned_seconds_per_step")
                    or ((r.get("predicted") or {}).get("time") or {}).get("seconds_per_step"))
            at = plan_at_sitting(d, r) if ok else None
            bpp = r.get("ssd_bytes_per_param") or {}
            rows.append([r["name"], (r.get("placement") or {}).get("placement") or "ssd",
                         _f(r["seconds_per_step"] if ok else None, ".2f"), _f(plan, ".2f"),
                         "-" if at is None else f"{at:.2f} ({_err(r['seconds_per_step'], at)})",
                         _f(r["tokens_per_s"] if ok else None, ",.0f"),
                         "-" if not bpp else f"{bpp.get('read', 0) + bpp.get('write', 0):.1f}",
                         _f(((r.get("cgroup") or {}).get("peak_bytes") or 0) / GiB or None, ".2f"),
                         _f((r.get("ru_maxrss_bytes") or 0) / GiB or None, ".2f"),
                         _f(cores_taken(r), ".2f")])
        probe = ((d.get("hardware") or {}).get("sitting") or {}).get("fp32_gflops")
        out += ["", f"{meta.get('title') or os.path.basename(path)}: `{meta.get('command', '')}`, "
                    f"{meta.get('date', '?')}" + (f", the matmul probe {probe:g} GFLOP/s fp32" if probe else "")
                + f" (`{path}`).", "", table(OTHER_HEADER, rows)]
    return out


def _at_sitting(name: str, p: dict, records: dict[float, dict]) -> str:
    """The plan at the point's sitting probe (placements.plan_at_sitting) and its error, from the point's record."""
    point = records.get(p["cap_gib"])
    runs = {r["name"]: r for r in (point or {}).get("runs", [])}
    run = runs.get(name) or runs.get("tuned" if name == "stock-best" else name)  # stock's best: tuned's (same_as)
    planned = plan_at_sitting(point, run) if run is not None and p.get("ok") else None
    return "-" if planned is None else f"{planned:.2f} ({_err(p['seconds_per_step'], planned)})"


def _row(name: str, p: dict, records: dict[float, dict]) -> list[str]:
    """One run of the curve; a run that did not train (OOM-killed, failed) has no step time of its own: the steps it
    made before it stopped are not its steady state."""
    plan = p.get("planned") or {}
    state = "" if p.get("ok") else " (OOM-killed)" if p.get("oom_killed") else " (failed)"
    tier = f", tier {p['dram_tier_gib']:.2f} GiB" if p.get("dram_tier_gib") else ""
    m = p if p.get("ok") else {}
    return [f"{p['cap_gib']:g}", name, (p.get("placement") or "-") + tier + state,
            _f(m.get("seconds_per_step"), ".2f"), _f(plan.get("seconds_per_step"), ".2f"),
            _err(m.get("seconds_per_step"), plan.get("seconds_per_step")), _at_sitting(name, p, records),
            _f(m.get("tokens_per_s"), ",.0f"),
            _f(m.get("ssd_bytes_per_param"), ".1f"), _f(plan.get("ssd_bytes_per_param"), ".1f"),
            _f((p.get("cgroup_peak_bytes") or 0) / GiB or None, ".2f"),
            _f((p.get("load") or {}).get("cores_taken"), ".2f")]


def _ratios(doc: dict) -> list[str]:
    """memascend's tokens/s over stock's best (with DRAM) and over tuned at each cap, where both ran, and which of the
    two was stock's fastest config; where stock's best config did not train, over the fastest stock config that did
    (tuned's all-SSD run), and what stopped it."""
    out = []
    curves = {n: curve(doc, n) for n in CURVES}
    for m, best, tuned in zip(curves["memascend"], curves["stock-best"], curves["tuned"]):
        if not m.get("ok"):
            continue
        cells = [f"x{m['tokens_per_s'] / o['tokens_per_s']:.2f} of {label}" for label, o in
                 (("stock's best", best), ("tuned", tuned)) if o.get("ok") and o.get("tokens_per_s")]
        if not best.get("ok") and best is not tuned and tuned.get("ok"):
            stop = "OOM-killed" if best.get("oom_killed") else best.get("error") or "failed"
            cells[-1] += f" (stock's fastest config that trained: its best the plan fits, {best['placement']}, " \
                         f"stopped: {stop})"
        elif best is not tuned and best.get("ok") and tuned.get("ok"):
            # Both of stock's configs trained: the faster as measured is stock's fastest that fits.
            label, fast = min((("stock's best", best), ("tuned", tuned)), key=lambda o: o[1]["seconds_per_step"])
            cells.append(f"stock's fastest config that fits: {label} ({fast['placement']})")
        if cells:
            out.append(f"- {m['cap_gib']:g} GiB: memascend ({m['placement']}) " + ", ".join(cells))
    return out


def section_placements(docs: list[tuple[str, dict]]) -> str:
    """One table per `bench --placements` document, its plot, and memascend's tokens/s against the others."""
    if not docs:
        return ""
    out = ["## Placements: tokens/s against the DRAM budget", "",
           "`memascend bench --placements`: at each DRAM cap (a memory cgroup of that size) stock DeepSpeed's best "
           "config with DRAM that the plan fits (tuned's knobs; run even where the plan ranks it behind tuned; "
           "`same_as` tuned where none fits), tuned with every byte on the SSD and memascend's recommended placement, "
           "one sitting, each run beside the plan's s/step and SSD bytes per parameter per step (read + write). Cores "
           "taken: cores the bench's samplers and other jobs kept busy while the run ran (the machine is shared). "
           "Plan s/step: what the bench planned, with the cached CPU probe (`memascend inspect --cpu-probe`). Plan at "
           "the sitting's probe: today's time model on the run's own record (configs.repredict) with the CPU rate of "
           "the matmul probe the bench ran seconds before the point's runs in place of the cached one, where the "
           "point's document is recorded beside the curve's: a diagnostic of the plan's input, not its prediction."]
    for path, doc in docs:
        meta, job = doc.get("meta") or {}, doc["job"]
        bw = job.get("ssd_bandwidth_bytes_per_s")
        beside = records_beside(path)
        records = point_records(beside, meta.get("command", ""))
        rows = [_row(name, p, records) for name in CURVES for p in curve(doc, name)]
        rows.sort(key=lambda r: float(r[0]))
        loads = [pt.get("loadavg") for pt in doc["points"]]
        probes = [(pt.get("sitting") or {}).get("fp32_gflops") for pt in doc["points"]]
        cached = {(pt.get("sitting") or {}).get("cached_fp32_gflops") for pt in doc["points"]} - {None}
        out += ["", f"### {meta.get('title') or os.path.basename(path)}", "",
                f"`{meta.get('command', '')}` on {meta.get('host', '?')}, {meta.get('date', '?')}: {job['model']} "
                f"({job['num_params'] / 1e6:.0f}M parameters, {job.get('layers')} layers), seq {job['seq_len']}, "
                f"{job['dtype']}, {job['steps']} steps, SSD "
                + ("unthrottled" if not bw else f"throttled to {bw / 1e6:g} MB/s")
                + "; load average (1, 5, 15 min) before and after each point: "
                + "; ".join(", ".join(f"{x:g}" for x in la) for la in loads if la)
                + ("; the matmul probe at each point: " + ", ".join(f"{g:g}" for g in probes) + " GFLOP/s fp32"
                   if all(probes) else "")
                + (" (the cached probe the plan used: " + ", ".join(f"{g:g}" for g in sorted(cached)) + ")"
                   if cached else "") + f" (`{path}`).", "",
                table(HEADER, rows), ""] + _ratios(doc)
        png = recorded_stem(path) + ".png"
        if os.path.exists(os.path.join(REPO, png)):
            out += ["", f"![the placements curve](../../{png})", ""]
        out += [f"- note: {n}" for n in doc.get("notes") or []]
        out += _others(beside, meta.get("command", ""))
    return "\n".join(out) + "\n"
