"""The results' placement curve (docs/results/time.md): `memascend bench --placements` documents under
docs/bench/placements/, tokens/s and SSD bytes per parameter against the DRAM cap for stock's best config, tuned
(all on the SSD) and memascend's recommended placement, each beside the plan. Stdlib only (scripts/results.py imports
it)."""

from __future__ import annotations

import os

from results_common import REPO, pct, table

from memascend_cli.bench.placements import CURVES, curve
from memascend_cli.units import GiB

HEADER = ["cap GiB", "run", "placement", "s/step", "plan s/step", "plan error", "tokens/s", "SSD B/param",
          "plan SSD B/param", "cgroup peak GiB", "cores taken"]


def _err(measured, planned) -> str:
    return "-" if not measured or planned is None else pct(100.0 * (planned - measured) / measured)


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _row(name: str, p: dict) -> list[str]:
    plan = p.get("planned") or {}
    state = "" if p.get("ok") else " (OOM-killed)" if p.get("oom_killed") else " (failed)"
    tier = f", tier {p['dram_tier_gib']:.2f} GiB" if p.get("dram_tier_gib") else ""
    return [f"{p['cap_gib']:g}", name, (p.get("placement") or "-") + tier + state,
            _f(p.get("seconds_per_step"), ".2f"), _f(plan.get("seconds_per_step"), ".2f"),
            _err(p.get("seconds_per_step"), plan.get("seconds_per_step")), _f(p.get("tokens_per_s"), ",.0f"),
            _f(p.get("ssd_bytes_per_param"), ".1f"), _f(plan.get("ssd_bytes_per_param"), ".1f"),
            _f((p.get("cgroup_peak_bytes") or 0) / GiB or None, ".2f"),
            _f((p.get("load") or {}).get("cores_taken"), ".2f")]


def _ratios(doc: dict) -> list[str]:
    """memascend's tokens/s over stock's best and over tuned at each cap, where both ran."""
    out = []
    curves = {n: curve(doc, n) for n in CURVES}
    for m, best, tuned in zip(curves["memascend"], curves["stock-best"], curves["tuned"]):
        cells = [f"x{m['tokens_per_s'] / o['tokens_per_s']:.2f} of {label}" for label, o in
                 (("stock's best", best), ("tuned", tuned)) if m.get("ok") and o.get("ok") and o.get("tokens_per_s")]
        if cells:
            out.append(f"- {m['cap_gib']:g} GiB: memascend ({m['placement']}) " + ", ".join(cells))
    return out


def section_placements(docs: list[tuple[str, dict]]) -> str:
    """One table per `bench --placements` document, its plot, and memascend's tokens/s against the others."""
    if not docs:
        return ""
    out = ["## Placements: tokens/s against the DRAM budget", "",
           "`memascend bench --placements`: at each DRAM cap (a memory cgroup of that size) stock DeepSpeed's best "
           "config that the plan fits (tuned's knobs; `same_as` tuned where that is all on the SSD), tuned with "
           "every byte on the SSD and memascend's recommended placement, one sitting, each run beside the plan's "
           "s/step and SSD bytes per parameter per step (read + write). Cores taken: cores the bench's samplers and "
           "other jobs kept busy while the run ran (the machine is shared)."]
    for path, doc in docs:
        meta, job = doc.get("meta") or {}, doc["job"]
        bw = job.get("ssd_bandwidth_bytes_per_s")
        rows = [_row(name, p) for name in CURVES for p in curve(doc, name)]
        rows.sort(key=lambda r: float(r[0]))
        loads = [pt.get("loadavg") for pt in doc["points"]]
        probes = [(pt.get("sitting") or {}).get("fp32_gflops") for pt in doc["points"]]
        out += ["", f"### {meta.get('title') or os.path.basename(path)}", "",
                f"`{meta.get('command', '')}` on {meta.get('host', '?')}, {meta.get('date', '?')}: {job['model']} "
                f"({job['num_params'] / 1e6:.0f}M parameters, {job.get('layers')} layers), seq {job['seq_len']}, "
                f"{job['dtype']}, {job['steps']} steps, SSD "
                + ("unthrottled" if not bw else f"throttled to {bw / 1e6:g} MB/s")
                + "; load average (1, 5, 15 min) before and after each point: "
                + "; ".join(", ".join(f"{x:g}" for x in la) for la in loads if la)
                + ("; the matmul probe at each point: " + ", ".join(f"{g:g}" for g in probes) + " GFLOP/s fp32"
                   if all(probes) else "") + f" (`{path}`).", "",
                table(HEADER, rows), ""] + _ratios(doc)
        png = os.path.splitext(path)[0] + ".png"
        if os.path.exists(os.path.join(REPO, png)):
            out += ["", f"![the placements curve](../../{png})", ""]
        out += [f"- note: {n}" for n in doc.get("notes") or []]
    return "\n".join(out) + "\n"
