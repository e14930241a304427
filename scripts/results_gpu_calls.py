"""The GPU page's sections of the kit's newer calls (docs/results/gpu.md, scripts/results_gpu.py): the capacity
search under a DRAM cap (gpu_capacity.json), the placement sweep (gpu_placements.json), the time model's rates
measured on the box (cuda_constants.json `time_rates`) and what the SSD did in each phase of the bench runs
(gpu_bench.json `phase_io`). Each renders one recorded document (`bash scripts/gpu_check.sh record`); none types a
number. Stdlib only."""

from __future__ import annotations

from results_common import gib, table

CAPACITY_HEADER = ["engine", "context (tokens)", "outcome", "steps", "cgroup peak GiB", "plan GiB", "s/step"]
PLACEMENT_HEADER = ["preset", "placement", "run", "s/step", "plan s/step", "tokens/s", "plan tokens/s", "host GiB",
                    "plan host GiB", "GPU GiB", "plan GPU GiB", "SSD B/param r / w", "plan SSD B/param r / w"]
PHASE_IO_HEADER = ["run", "phase", "seconds", "read GB/s", "reads in flight", "write GB/s", "writes in flight",
                   "mean read KiB", "device busy"]


def _yes_no(x) -> str:
    return "-" if x is None else ("yes" if x else "no")


def _s(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def section_capacity(cap: dict) -> list[str]:
    """The capacity call: the memory cgroup it made (or why not), tuned's search, memascend's probe, the checks on them."""
    cg = cap.get("cgroup") or {}
    head = f"Capacity of {cap.get('model', '?')} under a {cap.get('dram_cap', '?')} DRAM cap (`bench --capacity seq`)"
    if not cg.get("ok"):
        return [f"{head}: not measured, no memory cgroup could be made on the GPU machine "
                f"({cg.get('error', '?')}).", ""]
    tuned, m = cap["tuned"], cap["memascend"]
    rows = [["tuned", str(q["value"]), q["outcome"], str(q["steps_done"]), gib(q.get("cgroup_peak_bytes")),
             gib(q.get("planned_peak_bytes")), _s(q.get("seconds_per_step"))] for q in tuned["probes"]]
    q = m.get("probe")
    if q:
        rows.append(["memascend", str(q["value"]), q["outcome"], str(q.get("steps_done", "-")),
                     gib(q.get("cgroup_peak_bytes")), gib(q.get("planned_peak_bytes")), _s(q.get("seconds_per_step"))])
    v = cap["verdict"]
    lines = [f"{head}, memory cgroup v{cg.get('version', '?')}, {cap['steps']} steps a probe, weights "
             f"{cap.get('weights', 'random')}"
             f"{' (synthetic: a dry run, the plan standing in for the GPU)' if cap.get('synthetic') else ''}: "
             f"tuned's planned maximum {tuned['planned_max'] if tuned['planned_max'] is not None else 'none fits'}, "
             f"measured {tuned['measured_max'] if tuned['measured_max'] is not None else 'none fits'}"
             + ("" if tuned["measured_max_proven"] else " (a lower bound: no value above it was shown not to fit)") +
             f", its search stopped by {tuned['stopped_by']}; memascend probed at {m.get('value') or '-'} "
             f"({m.get('basis', '?')}).", "", table(CAPACITY_HEADER, rows), "",
             f"- memascend's longest context >= 2x tuned's: {_yes_no(v['memascend_at_least_2x'])}"
             + (f" (x{v['memascend_over_tuned']:.2f} shown)" if v.get("memascend_over_tuned") else "") + ".",
             f"- tuned's planned maximum within one grid step ({cap['grid_step_tokens']} tokens) of its measured one: "
             f"{_yes_no(v['tuned_within_one_step'])}; OOM-killed or stalled at its planned maximum: "
             f"{_yes_no(v['tuned_killed_at_planned'])}.", ""]
    return lines


def _plan_cells(plan: dict | None, num_params: int | None) -> list[str]:
    if not plan:
        return ["-"] * 5
    t = plan.get("time") or {}
    bpp = "-" if not num_params else (f"{plan.get('ssd_read_bytes_per_step', 0) / num_params:.1f} / "
                                      f"{plan.get('ssd_write_bytes_per_step', 0) / num_params:.1f}")
    return [_s(t.get("seconds_per_step")), _s(t.get("tokens_per_s"), ".0f"), gib(plan.get("host_peak_bytes")),
            gib(plan.get("gpu_peak_bytes")), bpp]


def section_placements(pl: dict) -> list[str]:
    """The placement sweep's table: each point measured next to the call's plan of that placement."""
    if pl.get("skipped"):
        return [f"Placement sweep: not run ({pl['skipped']}).", ""]
    rows = []
    for r in pl.get("rows") or []:
        plan = _plan_cells(r.get("plan"), _num_params(pl, r["model"]))
        got = "-" if r.get("ssd_read_bytes_per_param") is None else (
            f"{r['ssd_read_bytes_per_param']:.1f} / {r['ssd_write_bytes_per_param']:.1f}")
        ok = r["ok"]
        rows.append([r["model"], r["placement"], r["run"] + ("" if ok else ": failed"),
                     _s(r.get("seconds_per_step")), plan[0], _s(r.get("tokens_per_s"), ".0f"), plan[1],
                     gib(r.get("peak_system_bytes")), plan[2], gib(r.get("peak_gpu_bytes")), plan[3], got, plan[4]])
    cut = [f"{p['model']} {p['placement']} {p['run']} ({p['status']})" for p in pl.get("points") or []
           if p["status"] in ("timeout", "skipped")]
    failed = [f"{r['model']} {r['placement']} {r['run']}: `{r.get('error') or '?'}`" for r in pl.get("rows") or []
              if not r["ok"]]
    return [f"Placement sweep (`bench --placement`), weights {pl.get('weights', 'random')}, seq {pl.get('seq_len')}, "
            f"{pl.get('steps')} steps; plan = the call's `memascend plan` of each preset there"
            + (" (synthetic: a dry run, the plan standing in for the GPU)" if pl.get("synthetic") else "") + ".", "",
            table(PLACEMENT_HEADER, rows), ""] + [f"- Failed: {f}." for f in failed] + (
        [f"- Not measured (the call's time): {', '.join(cut)}."] if cut else []) + ([""] if failed or cut else [])


def _num_params(pl: dict, model: str) -> int | None:
    return (pl.get("num_params") or {}).get(model)


def section_time_rates(constants: dict | None) -> list[str]:
    """The time model's rates measured on the box, beside the values the plan takes without them."""
    from memascend_cli.planner import time as tm

    r = (constants or {}).get("time_rates")
    if not r:
        return []
    if r.get("error"):
        return [f"The time model's rates: not measured ({r['error']}).", ""]
    per_core = r["cpu_adam_elems_per_s"] / r["torch_threads"]
    table_gbps = tm.gpu_device(constants.get("device")).pcie_bytes_per_s / 1e9
    return [f"The time model's rates on this box (`scripts/gpukit/cuda_constants.py` time_rates; the plan takes them "
            "for a plan of this GPU, memascend_cli/planner/measured.py): host -> device "
            f"{r['h2d_pinned_gbps']:.1f} GB/s pinned ({r['h2d_pageable_gbps']:.1f} pageable), device -> host "
            f"{r['d2h_pinned_gbps']:.1f} GB/s pinned ({r['d2h_pageable_gbps']:.1f} pageable), against the PCIe "
            f"table's {table_gbps:.0f} GB/s a direction; CPU Adam "
            f"{r['cpu_adam_elems_per_s'] / 1e9:.2f}e9 elements/s on {r['torch_threads']} threads of "
            f"{r.get('cpu_model', '?')} ({per_core / 1e9:.2f}e9 a thread against the constant's "
            f"{tm.CPU_ADAM_ELEMS_PER_S_PER_CORE / 1e9:.2f}e9); the global norm {r['norm_elems_per_s'] / 1e9:.1f}e9 "
            f"elements/s on the GPU, its barrier ({r['norm_barrier']}) {r['norm_barrier_s'] * 1e3:.2f} ms.", ""]


def section_phase_io(bench: dict) -> list[str]:
    """What the SSD did in each phase of each bench run, beside the probe's best queue depth."""
    rows = []
    for model, by_run in (bench.get("phase_io") or {}).items():
        for run, io in by_run.items():
            for phase, p in (io.get("phases") or {}).items():
                rows.append([f"{model} {run}", phase, f"{p['seconds']:.1f}", f"{p['read_gbps']:.2f}",
                             f"{p['reads_in_flight']:.1f}", f"{p['write_gbps']:.2f}", f"{p['writes_in_flight']:.1f}",
                             "-" if p.get("mean_read_bytes") is None else f"{p['mean_read_bytes'] / 1024:.0f}",
                             f"{100.0 * p['busy_share']:.0f}%"])
    if not rows:
        return []
    probe = (bench.get("storage") or {}).get("region_probe") or {}
    return [f"The SSD per phase of steps 2..N (/proc/diskstats sampled beside each run; in flight = the requests' "
            f"summed time in the kernel over the phase's, Little's law; device busy relative to all the time). The "
            f"probe's best: {probe.get('read_gbps', '?')} GB/s read at queue depth {probe.get('best_queue_depth', '?')}"
            f" of {(probe.get('best_block_bytes') or 0) // 1024} KiB.", "", table(PHASE_IO_HEADER, rows), ""]
