"""The memory page of the results (docs/results/memory.md): every bench document and sweep in detail, the planner's
accuracy on the calibration and validation runs, the billion-scale runs under a DRAM cap and the allocator settings.
Stdlib only (scripts/results.py imports it)."""

from __future__ import annotations

import os

from memascend_cli.bench.configs import repredict
from memascend_cli.bench.sitting import sitting_text
from memascend_cli.units import GiB
from results_common import gib, pct, table

PLANNER_TOLERANCE_PERCENT = 10.0
PLANNER_SECTION = "Planner accuracy: calibration vs validation runs"


def doc_heading(path: str, doc: dict) -> str:
    """A document's heading in words: its recorded title (else its file name's words) and its sitting's day."""
    meta = doc.get("meta") or {}
    title = meta.get("title") or os.path.basename(path).split(".")[0].replace("-", " ")
    day = (meta.get("date") or "")[:10]
    return title if not day or day in title else f"{title}, {day}"


def machine_line(doc: dict) -> str:
    hw = doc.get("hardware") or {}
    meta = doc.get("meta") or {}
    gpu = f"{hw.get('num_gpus')} x {hw.get('gpu_name')}" if hw.get("num_gpus") else "no GPU"
    job = doc.get("job") or {}
    sitting = sitting_text(hw.get("sitting"))
    return (f"Machine: {hw.get('cpu_cores', '?')} cores, {hw.get('dram_gib', 0):.1f} GiB DRAM, {gpu}"
            f"{', accelerator ' + job['accelerator'] if job.get('accelerator') else ''}; "
            f"DeepSpeed {job.get('deepspeed_version', '?')}; measured {meta.get('date', '?')}"
            f"{'; this sitting: ' + sitting if sitting else ''}.")


def point_name(d: dict) -> str:
    """A sweep point's bench document as its depth and context: L8 s2048."""
    return f"L{d['job']['layers']} s{d['job']['seq_len']}"


def peak_cell(r: dict) -> str:
    """The run's peak; for a repeated run, the median and the range of its repeats."""
    peaks = [x["peak_system_bytes"] for x in r.get("repeats") or [] if x.get("peak_system_bytes") is not None]
    if len(peaks) < 2:
        return gib(r["peak_system_bytes"])
    return f"{gib(r['peak_system_bytes'])} (median of {len(peaks)}: {gib(min(peaks))}-{gib(max(peaks))})"


def run_rows(doc: dict) -> list[list[str]]:
    rows = []
    for r in doc["runs"]:
        bpp = r.get("ssd_bytes_per_param")
        pred = (r.get("predicted") or {}).get("node_host_peak_bytes")
        rows.append([r["name"] + ("" if r["ok"] else " (failed)"), peak_cell(r), gib(r["ru_maxrss_bytes"]),
                     "-" if r["seconds_per_step"] is None else f"{r['seconds_per_step']:.2f}",
                     "-" if not bpp else f"{bpp['read']:.1f} / {bpp['write']:.1f}", gib(pred),
                     pct(r.get("prediction_error_percent"))])
    return rows


RUN_HEADER = ["run", "peak system GiB", "ru_maxrss GiB", "s/step", "SSD B/param read / write", "plan GiB", "plan error"]


def comparisons(doc: dict) -> list[str]:
    lines = []
    for ref in ("stock", "tuned"):
        for name, c in (doc.get(f"vs_{ref}") or {}).items():
            if name.startswith("memascend") or (ref == "stock" and name == "tuned") or name.startswith("tuned-"):
                st = c["step_time_change_percent"]
                lines.append(f"- {name}: **{c['peak_reduction_percent']:.1f}% less** peak system memory than {ref}"
                             + ("" if st is None else f", step time {st:+.1f}%"))
    # Ablation runs against full memascend: what switching one technique off changes.
    full = next((r for r in doc["runs"] if r["name"] == "memascend" and r["ok"]), None)
    # memascend against tuned given an environment of its own (runs.NAMED_RUNS): system peak and the rank's own.
    for r in doc["runs"]:
        if full is not None and r["ok"] and r["name"].startswith("tuned-"):
            lines.append(f"- memascend against {r['name']}: "
                         f"{100.0 * (1 - full['peak_system_bytes'] / r['peak_system_bytes']):.1f}% less peak system "
                         f"memory, {100.0 * (1 - full['ru_maxrss_bytes'] / r['ru_maxrss_bytes']):.1f}% less ru_maxrss")
    for r in doc["runs"]:
        if full is not None and r["ok"] and r["name"].startswith("memascend-no-"):
            dpeak = 100.0 * (r["peak_system_bytes"] - full["peak_system_bytes"]) / full["peak_system_bytes"]
            dstep = (100.0 * (r["seconds_per_step"] - full["seconds_per_step"]) / full["seconds_per_step"]
                     if r.get("seconds_per_step") and full.get("seconds_per_step") else None)
            lines.append(f"- {r['name']}: peak {dpeak:+.1f}% vs memascend"
                         + ("" if dstep is None else f", step time {dstep:+.1f}%"))
    return lines


def section_bench(title: str, path: str, doc: dict) -> str:
    from memascend_cli.bench.document import ssd_line

    j = doc["job"]
    out = [f"## {title}", "", f"`{(doc.get('meta') or {}).get('command', '?')}`", "",
           f"{j['model']} ({j['num_params']:,} params, {j.get('layers', '?')} layers), seq {j['seq_len']}, micro-batch "
           f"{j['micro_batch']}" + (f" x {j['grad_accum']} accumulated" if j.get("grad_accum", 1) > 1 else "")
           + f", {j['steps']} steps, {j['dtype']}, {j['ranks']} rank(s), checkpointing "
           f"{j['checkpointing']}. {machine_line(doc)} Raw: `{path}`.", "",
           table(RUN_HEADER, run_rows(doc)), ""]
    out += comparisons(doc)
    out += [f"- {line}" for line in filter(None, map(ssd_line, doc["runs"]))]
    out += phase_heap_lines(doc)
    return "\n".join(out) + "\n"


def _arenas(p: dict) -> list | None:
    return (p.get("malloc") or {}).get("arenas")


def _has_arenas(runs: list) -> bool:
    return any(_arenas(p) for r in runs for p in r.get("phases") or [])


def phase_heap_lines(doc: dict) -> list[str]:
    """Rank 0's anonymous RSS and glibc's free-but-kept heap at each phase boundary (runs recorded with them), and
    what the arenas of threads other than the main one hold (runs recorded with malloc_info's arenas)."""
    runs = [r for r in doc["runs"] if r["ok"] and any(p.get("malloc") for p in r.get("phases") or [])]
    if not runs:
        return []
    per_arena = _has_arenas(runs)
    names = [p["name"] for p in runs[0]["phases"]]
    rows = []
    for name in names:
        cells = []
        for r in runs:
            p = next((q for q in r["phases"] if q["name"] == name), None)
            cell = f"{p['rss_anon_bytes'] / GiB:.2f} / {p['malloc']['free_kept_bytes'] / GiB:.2f}" \
                if p and p.get("malloc") else "-"
            if per_arena and p and _arenas(p):
                cell += f" / {sum(system for system, _ in _arenas(p)[1:]) / GiB:.2f}"
            cells.append(cell)
        rows.append([name] + cells)
    what = "anonymous RSS / heap glibc keeps free (mallinfo2 fordblks)" + \
        (" / heap of the arenas of threads other than the main one (malloc_info)" if per_arena else "")
    return [f"At the start of each phase, rank 0's {what}, GiB:", "", table(["phase"] + [r["name"] for r in runs], rows),
            ""]


def sweep_peak_table(doc: dict) -> str:
    """A sweep's peak system memory (GiB): a row per run, a column per point, then the spread and GiB per billion
    parameters."""
    rows = []
    for name, s in doc["series"].items():
        by = {(q["layers"], q["seq_len"]): q for q in s["points"]}
        cells = [by.get((p["layers"], p["seq_len"])) for p in doc["points"]]
        rows.append([name] + [gib(q["peak_system_bytes"]) if q else "-" for q in cells]
                    + [gib(s["spread_bytes"]), "-" if s["gib_per_billion_params"] is None
                       else f"{s['gib_per_billion_params']:.2f}"])
    return table(_sweep_header(doc), rows)


def _sweep_header(doc: dict) -> list[str]:
    return ["run"] + [f"L{p['layers']} s{p['seq_len']} ({p['num_params'] / 1e6:.0f}M)" for p in doc["points"]] + \
        ["spread GiB", "GiB / B params"]


def section_sweep(title: str, path: str, doc: dict) -> str:
    header = _sweep_header(doc)
    first = doc["documents"][0]
    out = [f"## {title}", "", f"`{(doc.get('meta') or {}).get('command', '?')}`", "",
           f"Peak system memory (GiB) per point. {machine_line(first)} Raw: `{path}` (one bench document per point "
           "inside).", "", sweep_peak_table(doc), "",
           "Per point: seconds per step, and the plan's error on the peak (planned - measured) / measured.", "",
           table(["run"] + header[1:-2], _sweep_rows(doc, _detail_cell)), "",
           "The same points re-planned with today's planner (memascend_cli.bench.configs.repredict on each run's "
           "recorded "
           "config and job): planned GiB and error.", "",
           table(["run"] + header[1:-2], _sweep_rows(doc, _today_cell)), ""]
    out += _sweep_growth_lines(doc)
    for d in doc["documents"]:
        if _has_arenas(d["runs"]):
            out += [f"{point_name(d)}:", ""] + phase_heap_lines(d)
    for d in doc["documents"]:
        cmp = [x for x in comparisons(d) if x.startswith("- memascend:")]
        if cmp:
            out.append(f"- L{d['job']['layers']} s{d['job']['seq_len']}: " + cmp[0][len("- memascend: "):])
    return "\n".join(out) + "\n"


def _sweep_rows(doc: dict, cell) -> list[list[str]]:
    """One row per run name, one cell per point: cell(point document, run), or '-' where the run has no peak."""
    runs = _runs_by_point(doc)
    rows = []
    for name in doc["series"]:
        cells = []
        for p in doc["points"]:
            d, r = runs.get((p["layers"], p["seq_len"], name), (None, None))
            cells.append("-" if r is None or not r["peak_system_bytes"] else cell(d, r))
        rows.append([name] + cells)
    return rows


def _detail_cell(_doc: dict, r: dict) -> str:
    """Seconds per step and the plan's error recorded with the run."""
    step = "-" if r["seconds_per_step"] is None else f"{r['seconds_per_step']:.1f} s"
    err = r.get("prediction_error_percent")
    return step + ("" if err is None else f", {pct(err)}")


def _today_cell(d: dict, r: dict) -> str:
    """Today's plan of the run and its error on the measured peak."""
    planned, err = replan(d, r)
    return f"{gib(planned)}, {pct(err)}"


def _runs_by_point(doc: dict) -> dict:
    """(layers, seq_len, run name) -> (the point's bench document, the run) for every run that finished."""
    return {(d["job"]["layers"], d["job"]["seq_len"], r["name"]): (d, r)
            for d in doc["documents"] for r in d["runs"] if r["ok"]}


def finished_runs(runs: list) -> list[tuple[str, dict, dict]]:
    """(path, document, run) for every run that finished, over (path, document) pairs."""
    return [(path, doc, r) for path, doc in runs for r in doc["runs"] if r["ok"]]


def replan(doc: dict, run: dict) -> tuple[int, float]:
    """Today's plan of a recorded run (memascend_cli.bench.configs.repredict) and its error on the measured peak,
    in %."""
    planned = repredict(doc, run)["node_host_peak_bytes"]
    return planned, 100.0 * (planned - run["peak_system_bytes"]) / run["peak_system_bytes"]


def _sweep_growth_lines(doc: dict) -> list[str]:
    """Largest minus smallest point, measured and planned: what the sweep's bar is about."""
    lines = []
    for name, s in doc["series"].items():
        pts = [q for q in s["points"] if q.get("predicted_bytes")]
        if len(pts) < 2:
            continue
        lo, hi = pts[0], pts[-1]
        lines.append(f"- {name}: L{lo['layers']} s{lo['seq_len']} -> L{hi['layers']} s{hi['seq_len']}: measured "
                     f"{(hi['peak_system_bytes'] - lo['peak_system_bytes']) / GiB:+.2f} GiB, planned "
                     f"{(hi['predicted_bytes'] - lo['predicted_bytes']) / GiB:+.2f} GiB")
    return lines + ([""] if lines else [])


def section_planner(cal: list, val: list) -> str:
    out = [f"## {PLANNER_SECTION}", "",
           "The planner's measured constants (runtime level per process, engine runtime) were fitted on the "
           "calibration runs only; the validation runs are other models, dtypes and rank counts it was not fitted on. "
           f"The target is an error within {PLANNER_TOLERANCE_PERCENT:.0f}% on every validation run; "
           "`tests/unit/test_planner_validation.py` checks it and lists the runs that miss it (strict expected "
           "failures, so a fix or a regression shows).", ""]
    for title, runs in (("calibration", cal), ("validation", val)):
        rows = []
        for path, doc, r in finished_runs(runs):
            j = doc["job"]
            planned, err = replan(doc, r)
            rows.append([f"{j['model']} L{j.get('layers', '?')}", j["dtype"], str(j["ranks"]), str(j["seq_len"]),
                         r["name"], peak_cell(r), gib(planned), pct(err), f"`{os.path.basename(path)}`"])
        within = sum(1 for r in rows if abs(float(r[7].rstrip("%"))) <= PLANNER_TOLERANCE_PERCENT)
        out += [f"### {title.capitalize()} runs", "",
                table(["model", "dtype", "ranks", "seq", "run", "measured GiB", "planned GiB", "error", "raw"], rows)
                if rows else "(none recorded)", ""]
        if rows:
            out += [f"{within} of {len(rows)} {title} runs within {PLANNER_TOLERANCE_PERCENT:.0f}%.", ""]
    return "\n".join(out) + "\n"


def _cap_outcome(r: dict) -> str:
    """How a capped run ended: its steps, or the bench's own `does not fit: OOM-killed at step k (phase)`."""
    if r["ok"]:
        return f"ran {len(r['losses'])} steps"
    if r.get("oom_killed"):
        return "**" + r["error"].replace(" under the DRAM cap", "") + "**"
    return "failed: " + (r.get("error") or "?").splitlines()[0]


def _err_on(planned, measured) -> str:
    return "-" if not planned or not measured else pct(100.0 * (planned - measured) / measured)


def _cap_plan_error(r: dict, planned, cap_bytes) -> str:
    """The plan's error on both peaks; for an OOM-killed run (its peak cut at the cap), whether the plan put it above
    the cap."""
    if r.get("oom_killed"):
        if not planned or not cap_bytes:
            return "-"
        return "plan above the cap: as measured" if planned > cap_bytes else "**plan below the cap: wrong**"
    return f"{_err_on(planned, r['peak_system_bytes'])} / {_err_on(planned, (r.get('cgroup') or {}).get('peak_bytes'))}"


def capped_rows(doc: dict, plan=None) -> list[list[str]]:
    """One row per engine of a `bench --dram-cap` document, in CAP_HEADER order; `plan(run)` is today's plan of a
    run (default: today's planner on its recorded job and config). Pure."""
    plan = plan or (lambda r: repredict(doc, r)["node_host_peak_bytes"])
    rows = []
    for r in doc["runs"]:
        cg = r.get("cgroup") or {}
        recorded = (r.get("predicted") or {}).get("node_host_peak_bytes")
        pred = plan(r)
        read, write = r.get("ssd_read_bytes_per_step"), r.get("ssd_write_bytes_per_step")
        bpp = r.get("ssd_bytes_per_param")
        first = r.get("first_step_seconds")
        rows.append([r["name"], _cap_outcome(r), gib(cg.get("peak_bytes")), gib(r["peak_system_bytes"]),
                     gib(r.get("peak_system_minus_others_bytes")), gib(r["ru_maxrss_bytes"]),
                     r.get("peak_phase") or "-", f"{gib(pred)} ({gib(recorded)})",
                     _cap_plan_error(r, pred, doc["job"].get("dram_cap_bytes")),
                     "-" if r["seconds_per_step"] is None else f"{r['seconds_per_step']:.1f}"
                     + ("" if first is None else f" (step 1: {first:.1f})"),
                     "-" if read is None else f"{gib(read)} / {gib(write)} ({bpp['read']:.1f} / {bpp['write']:.1f})"])
    return rows


CAP_HEADER = ["engine", "result", "cgroup peak GiB", "system peak GiB", "system peak less others' RSS change GiB",
              "ru_maxrss GiB", "peak in phase", "today's plan GiB (when run)",
              "today's plan error on system / cgroup peak", "s/step after step 1",
              "SSD GiB per step read / write (B/param)"]


def section_capped(runs: list) -> str:
    """`memascend bench --dram-cap` documents: each engine in its own memory cgroup, as a user's DRAM would hold it."""
    from memascend_cli.bench.document import ssd_line

    if not runs:
        return ""
    out = ["## Billion-scale under a DRAM cap", "",
           "`memascend bench --dram-cap`: every engine's process tree runs in its own memory cgroup of the cap (v1 "
           "`memory.limit_in_bytes` with `memory.memsw.limit_in_bytes` on this machine, v2 `memory.max` with no swap "
           "elsewhere), one engine after another in one sitting. The cgroup peak is the cgroup's own high-water mark "
           "(`memory.max_usage_in_bytes` / `memory.peak`): the processes' memory plus the page cache charged to them "
           "(the libraries and the token cache they read after the page cache was dropped, stock's swap-file I/O; the "
           "region's O_DIRECT I/O bypasses it); other processes on the machine do not move it. The system peak is "
           "MemTotal - MemAvailable less the settled idle level, which other processes do move (the next column takes "
           "their RSS change out, a 1 Hz gauge). The plan is today's planner on the run's recorded job and config (in "
           "brackets, the plan the bench recorded when it ran); its error is (planned - measured) / measured; an "
           "OOM-killed run's peak is cut at the cap, so its row says whether the plan put it above the cap. An OOM "
           "kill is read from the cgroup's own counter (`memory.oom_control` oom_kill / `memory.events`). Step 1 also records the "
           "parameter trace and creates the Adam states; later steps read and write them.", ""]
    for path, doc in runs:
        j, meta = doc["job"], doc.get("meta") or {}
        cap = j["dram_cap_bytes"]
        versions = sorted({(r.get("cgroup") or {}).get("version") for r in doc["runs"]} - {None})
        out += [f"### {doc_heading(path, doc)}", "",
                f"`{meta.get('command', '?')}`", "",
                f"{j['model']} ({j['num_params']:,} params, {j['layers']} layers, random weights), seq {j['seq_len']}, "
                f"micro-batch {j['micro_batch']}, {j['steps']} steps, {j['dtype']}, {j['ranks']} rank(s), "
                f"checkpointing {j['checkpointing']}; DRAM cap {cap / GiB:.2f} GiB per engine (cgroup v"
                f"{'/'.join(map(str, versions)) or '?'}); region and swap files on {j.get('nvme_dir_fstype') or '?'}. "
                f"{machine_line(doc)} Host `{meta.get('host', '?')}`. Raw: `{path}` (memory timelines in its side "
                "file).", "", table(CAP_HEADER, capped_rows(doc)), ""]
        out += [f"- {line}" for line in filter(None, map(ssd_line, doc["runs"]))]
        out.append("")
    return "\n".join(out) + "\n"



def section_allocator(runs: list) -> str:
    """memascend alone under different allocator settings (each document's env records them)."""
    if not runs:
        return ""
    rows = []
    for path, doc, r in finished_runs(runs):
        j = doc["job"]
        rows.append([(doc.get("meta") or {}).get("title", "?").split(",")[0], f"L{j.get('layers')} s{j['seq_len']}",
                     gib(r["peak_system_bytes"]), gib(r["max_tree_rss_bytes"]), f"{r['seconds_per_step']:.1f}",
                     f"`{os.path.basename(path)}`"])
    return "\n".join(["## Allocator policy experiments (memascend only)", "",
                      "glibc's mmap threshold (the engine fixes it; `fixed 32 MiB` is close to glibc's dynamic default) "
                      "and PyTorch's huge-page tensors (`THP_MEM_ALLOC_ENABLE=1`, defaults.ENGINE_ENV) on "
                      "bench-llama-136m, fp32, one sitting per row. Tree RSS is the processes' own peak; the system "
                      "peak also counts memory freed but not yet returned by this VM's balloon free-page reporting "
                      "(up to ~0.4 GiB after large frees).", "",
                      table(["setting", "point", "peak GiB", "tree RSS GiB", "s/step", "raw"], rows), ""]) + "\n"

