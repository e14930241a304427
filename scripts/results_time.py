"""The results' step-time page (docs/results/time.md): `memascend bench` runs with and without `--ssd-bandwidth`,
measured s/step against the plan's time model (memascend_cli/planner/time.py), one table per SSD limit. Stdlib only
(scripts/results.py imports it)."""

from __future__ import annotations

import os
import statistics

from results_common import pct, table

TIME_TOLERANCE_PERCENT = 15.0
"""The time model's target: predicted s/step within 15% of the bench's."""


def _limit(doc: dict) -> str:
    bps = doc["job"].get("ssd_bandwidth_bytes_per_s")
    return "none" if not bps else f"{bps / 1e6:g} MB/s"


def _today(doc: dict, run: dict) -> dict | None:
    """Today's time model on the run's recorded job, config and rates (configs.repredict), else the prediction
    recorded with it."""
    from memascend_cli.bench.configs import repredict

    return repredict(doc, run).get("time") or (run.get("predicted") or {}).get("time")


def cores_taken(run: dict) -> float | None:
    """Cores the bench's own samplers and the other jobs kept busy on average while the run ran (None for runs
    recorded without the gauge)."""
    if run.get("others_cpu_seconds") is None or not run.get("wall_s"):
        return None
    return ((run.get("bench_cpu_seconds") or 0.0) + run["others_cpu_seconds"]) / run["wall_s"]


def plan_at_cores_got(plan: dict, run: dict, cores: int) -> float | None:
    """The plan's s/step with its compute time scaled to the cores the run got (cores - cores_taken): what the
    plan would say of a machine with that many free cores; a diagnostic, not the plan's prediction."""
    taken = cores_taken(run)
    compute = (plan.get("resource_seconds") or {}).get("compute")
    if taken is None or not compute or not plan.get("seconds_per_step"):
        return None
    return plan["seconds_per_step"] + compute * (cores / max(0.25, cores - taken) - 1.0)


def step_seconds(run: dict) -> tuple[float, str]:
    """A run's s/step and how it was taken: with `bench --repeat`, the median of its repeats' (the run's other numbers
    are those of the repeat with the median peak, runner.median_run), each listed in the order run."""
    reps = [r["seconds_per_step"] for r in run.get("repeats") or [] if r.get("ok") and r.get("seconds_per_step")]
    if len(reps) < 2:
        return run["seconds_per_step"], ""
    return statistics.median(reps), f"median of {len(reps)}: " + ", ".join(f"{x:.2f}" for x in reps)


def accumulation_lines(runs: list) -> list[str]:
    """The target of gradient accumulation: time per token at N micro-batches a step against 1, per run of a
    document with grad_accum N and the memascend run of its 1 micro-batch twin (same job, limit and host budget)."""
    def key(doc: dict) -> tuple:
        j = doc["job"]
        return (j["model"], j["seq_len"], j["micro_batch"], j["dtype"], j.get("ssd_bandwidth_bytes_per_s"),
                j.get("host_budget_bytes"), j.get("gradient_clipping"))

    ones = {key(d): d for _, d in runs if d["job"].get("grad_accum", 1) == 1}
    out = []
    for path, doc in runs:
        ga = doc["job"].get("grad_accum", 1)
        base = ones.get(key(doc)) if ga > 1 else None
        ref = next((r for r in (base or {}).get("runs", []) if r["name"] == "memascend" and r["ok"]), None)
        if ref is None:
            continue
        cells = [f"{r['name']} x{ref['tokens_per_s'] / r['tokens_per_s']:.2f}" for r in doc["runs"] if r["ok"]]
        budget = doc["job"].get("host_budget_bytes")
        out.append(f"- {ga} micro-batches a step against 1 ({_limit(doc)}, host budget "
                   f"{'default' if not budget else f'{budget / 2**30:.2f} GiB'}): time per token "
                   + ", ".join(cells) + f" (`{os.path.basename(path)}`; target: memascend at most x1.10).")
    return out


def overlap_lines(runs: list) -> list[str]:
    """The targets of the optimizer overlapped with backward, per document with a memascend run that counted it:
    its s/step against tuned stock's and its own without the overlap, the losses against that run, what the steps did
    (memascend_engine.overlap: committed, redone, not speculated) and SSD bytes per parameter."""
    out = []
    for path, doc in runs:
        by = {r["name"]: r for r in doc["runs"] if r["ok"]}
        m, tuned, plain = by.get("memascend"), by.get("tuned"), by.get("memascend-no-overlap_optimizer")
        o = ((m or {}).get("engine_stats") or [{}])[0].get("overlap") if m else None
        if o is None or tuned is None or plain is None:
            continue
        j = doc["job"]
        clip = j.get("gradient_clipping")
        budget = j.get("host_budget_bytes")
        norms = [n for n in m.get("grad_norms") or [] if n is not None]
        bpp = {k: r["ssd_bytes_per_param"]["read"] + r["ssd_bytes_per_param"]["write"] for k, r in
               (("m", m), ("plain", plain))}
        (m_s, m_how), (t_s, t_how), (p_s, p_how) = step_seconds(m), step_seconds(tuned), step_seconds(plain)
        out.append(
            f"- {_limit(doc)}, {j['dtype']}, gradient clipping "
            + ("1.0 (DeepSpeed's default)" if clip is None else "off" if clip == 0 else f"at {clip:g}")
            + (f", host budget {budget / 2**30:.2f} GiB" if budget else "")
            + f": memascend {m_s:.2f} s/step{f' ({m_how})' if m_how else ''}, x{m_s / t_s:.2f} of tuned stock "
            f"({t_s:.2f}{f', {t_how}' if t_how else ''}; target: at most x0.70) and x{m_s / p_s:.2f} of itself "
            f"without the overlap ({p_s:.2f}{f', {p_how}' if p_how else ''}); losses "
            f"{'equal' if m['losses'] == plain['losses'] else 'NOT equal'} to it bit for bit; steps committed / "
            f"redone / not speculated {o['steps_committed']} / "
            f"{o['steps_redone']} / {o['steps_not_speculated']}"
            + (f" (gradient norms {min(norms):.1f}-{max(norms):.1f})" if norms else "")
            + f"; SSD {bpp['m']:.1f} B/param read + write ({bpp['plain']:.1f} without; target for the default: at "
            f"most 32) (`{os.path.basename(path)}`).")
    return out


def roofline_lines(runs: list) -> list[str]:
    """Per document whose plan recorded its roofline (planner.ssd.ssd_traffic: the parameters' fetches, the optimizer
    states once, no gradient): each run's steady-step SSD bytes per parameter against it, and memascend's tokens/s
    against tuned stock's of the same sitting."""
    out = []
    for path, doc in runs:
        by = {r["name"]: r for r in doc["runs"] if r["ok"]}
        tuned = by.get("tuned")
        parts = []
        for name, r in by.items():
            t = (r.get("predicted") or {}).get("ssd_traffic") or {}
            roof = (t.get("roofline_read_bytes_per_param"), t.get("roofline_write_bytes_per_param"))
            bpp = r.get("ssd_bytes_per_param")
            if r.get("mode") != "memascend" or not all(roof) or not bpp:
                continue
            vs = f", x{r['tokens_per_s'] / tuned['tokens_per_s']:.2f} tuned stock's tokens/s" if tuned else ""
            parts.append(f"{name} {bpp['read']:.1f} / {bpp['write']:.1f} against {roof[0]:.1f} / {roof[1]:.1f} "
                         f"({pct(100.0 * (bpp['read'] - roof[0]) / roof[0])} / "
                         f"{pct(100.0 * (bpp['write'] - roof[1]) / roof[1])}){vs}")
        if parts:
            tb = tuned["ssd_bytes_per_param"] if tuned else None
            taken = [c for c in map(cores_taken, by.values()) if c is not None]
            load = (f", cores taken {min(taken):.1f}-{max(taken):.1f} of "
                    f"{(doc.get('hardware') or {}).get('cpu_cores', '?')} cores") if taken else ""
            out.append(f"- {_limit(doc)}, {doc['job']['dtype']}, gradient clipping "
                       f"{doc['job'].get('gradient_clipping', 1.0):g}{load}: " + "; ".join(parts)
                       + (f" (tuned stock {tb['read']:.1f} / {tb['write']:.1f}, {tuned['tokens_per_s']:.1f} tokens/s)"
                          if tb else "") + f" (`{os.path.basename(path)}`).")
    return out


TIME_HEADER = ["SSD limit", "run", "s/step", "plan s/step", "plan error", "tokens/s", "SSD B/param read / write",
               "plan compute / SSD read / SSD write s", "plan binds", "step 1 s", "cores taken", "plan at the cores got",
               "raw"]


def section_ssd_bound(runs: list) -> str:
    """One row per run of the documents under docs/bench/ssd-bound/: measured and planned s/step."""
    from memascend_cli.bench.configs import recorded_probe_gflops
    from memascend_cli.planner import time as tm

    if not runs:
        return ""
    # Unthrottled first, then by limit.
    runs = sorted(runs, key=lambda pd: pd[1]["job"].get("ssd_bandwidth_bytes_per_s") or float("inf"), reverse=True)
    groups: dict[str, list[list[str]]] = {}  # SSD limit -> its rows
    misses, total = 0, 0
    for path, doc in runs:
        rows = groups.setdefault(_limit(doc), [])
        ga = doc["job"].get("grad_accum", 1)
        for r in doc["runs"]:
            name = r["name"] + (f", {ga} micro-batches a step" if ga > 1 else "")
            if not r["ok"]:
                rows.append([_limit(doc), name + " (failed)"] + ["-"] * 10 + [f"`{os.path.basename(path)}`"])
                continue
            t = _today(doc, r) or {}
            plan_s, sps = t.get("seconds_per_step"), r["seconds_per_step"]
            cores = (doc.get("hardware") or {}).get("cpu_cores") or 1
            got_s, taken = plan_at_cores_got(t, r, cores), cores_taken(r)
            err = None if not plan_s else 100.0 * (plan_s - sps) / sps
            total += err is not None
            misses += err is not None and abs(err) > TIME_TOLERANCE_PERCENT
            res = t.get("resource_seconds") or {}
            bpp = r.get("ssd_bytes_per_param")
            rows.append([_limit(doc), name, f"{sps:.2f}", "-" if not plan_s else f"{plan_s:.2f}", pct(err),
                         f"{r['tokens_per_s']:.0f}", "-" if not bpp else f"{bpp['read']:.1f} / {bpp['write']:.1f}",
                         " / ".join("?" if res.get(k) is None else f"{res[k]:.1f}"
                                    for k in ("compute", "SSD read", "SSD write")),
                         t.get("binding", "-"), f"{r['first_step_seconds']:.1f}",
                         "-" if taken is None else f"{taken:.2f} of {cores}",
                         "-" if got_s is None else f"{got_s:.2f} ({pct(100.0 * (got_s - sps) / sps)})",
                         f"`{os.path.basename(path)}`"])
    first = runs[0][1]
    timing = first["job"].get("timing") or {}
    probe = recorded_probe_gflops(timing)
    probe_gflops = "?" if probe is None else round(probe, 1)
    out = ["## The SSD-bound regime: step time, measured and planned", "",
           "`memascend bench --ssd-bandwidth` throttles each engine's reads and writes to the block device under its "
           "region and swap directory (its own io cgroup), so that a CPU step spends several times its compute on "
           "the SSD, as a GPU step does. Plan s/step is `memascend plan`'s time model (memascend_cli/planner/time.py) "
           "on each run's recorded job and config, with the rates the bench recorded: the CPU's from `memascend "
           f"inspect --cpu-probe` ({probe_gflops} GFLOP/s fp32 here) times CPU_ACHIEVED_FRACTION "
           f"({tm.CPU_ACHIEVED_FRACTION}: a plain transformers step over the probe, benchmarks/cpu_step_rate.py), "
           "the SSD's from the region's prepare-ssd probe, or the throttle. s/step is the mean of the steps after the first (the first also "
           "writes the Adam states); SSD bytes per parameter are a steady step's /proc/self/io. On the CPU "
           "accelerator the plan also counts each engine's host passes over the optimizer elements: stock and tuned "
           "stock's stage3 passes (STOCK_CPU_HOST_NS_PER_ELEMENT) and memascend's backward-thread work "
           "(MEMASCEND_CPU_HOST_NS_PER_ELEMENT), each fitted on one run named in its docstring in "
           "memascend_cli/planner/time.py: those two rows are calibration, every other row validation. Cores "
           "taken: the CPU seconds the bench's own memory samplers (>= 1 kHz) and the machine's other jobs used during the run, over "
           "its wall time; the plan takes the probe's rate for all cores, so a run that got fewer computes slower. "
           "Plan at the cores got scales the plan's compute time by cores / (cores - cores taken): a diagnostic of "
           "the model's structure on a shared machine, not the plan's prediction. Each document is one sitting.", "",
           f"{total - misses} of {total} runs within {TIME_TOLERANCE_PERCENT:.0f}% "
           "(as the bench planned them: most of these runs are history, see the validation above).", ""]
    for limit, rows in groups.items():
        out += [f"### {'No SSD limit' if limit == 'none' else f'SSD limited to {limit}'}", "",
                table(TIME_HEADER, rows), ""]
    ga = accumulation_lines(runs)
    if ga:
        out += ["### Gradient accumulation", ""] + ga + [""]
    ov = overlap_lines(runs)
    if ov:
        out += ["### The optimizer overlapped with backward", "",
                "`memascend_engine.overlap`; memascend-no-overlap_optimizer is the same engine without it.", "",
                *ov, ""]
    roof = roofline_lines(runs)
    if roof:
        out += ["### SSD bytes against the plan's roofline", "",
                ("SSD bytes per parameter of a steady step read / written, against the roofline the plan records for "
                 "the run (planner.ssd.ssd_traffic: the parameters fetched as planned, Adam's moments read and written "
                 "once, the fp32 master written once however the parameters hold it and read once unless taken from "
                 "the parameters backward fetched; no gradient, no activation checkpoint). With gradient clipping on, "
                 "the overlap also writes each gradient once for a possible redo (memascend_engine.overlap)."), "",
                *roof, ""]
    out += ["### Commands and dates", ""]
    for path, doc in runs:
        cmd = (doc.get("meta") or {}).get("command", "?")
        out.append(f"- `{os.path.basename(path)}` ({(doc.get('meta') or {}).get('date', '?')}): `{cmd}`")
    return "\n".join(out) + "\n"


VALIDATION_HEADER = ["recorded", "CPU", "run", "placement", "sitting probe GFLOP/s (cache)", "s/step",
                     "plan at the sitting's probe", "plan error", "raw"]


def section_validation(bench: str) -> str:
    """The time model's validation runs by the rule of memascend_cli/bench/validation_scope.py (what each record
    holds, never whether its plan misses): one row each, planned at its sitting's probe; the history counted by the
    part of the rule that keeps it out."""
    from memascend_cli.bench import validation_scope as scope
    from memascend_cli.bench.placements import plan_at_sitting
    from memascend_cli.planner import time as tm

    rows, within, total, history = [], 0, 0, {}
    for name, doc in scope.recorded_documents(bench):
        if doc["job"].get("accelerator", "cpu") != "cpu" or name == scope.CALIBRATION_DOCUMENT:
            continue
        for r in doc["runs"]:
            if not r["ok"] or r.get("disabled"):
                continue
            reason = scope.history_reason(doc, r)
            if reason is not None:
                history[reason] = history.get(reason, 0) + 1
                continue
            fitted = scope.run_id(name, doc, r) in scope.CALIBRATION_RUNS
            plan_s, sps = plan_at_sitting(doc, r), r["seconds_per_step"]
            err = 100.0 * (plan_s - sps) / sps
            total += not fitted
            within += not fitted and abs(err) <= TIME_TOLERANCE_PERCENT
            probe = doc["hardware"]["sitting"]
            rows.append([((doc.get("meta") or {}).get("date") or "?")[:16],
                         tm.host_terms_of((doc["job"].get("timing") or {}).get("cpu_model"))[0], r["name"],
                         (r.get("placement") or {}).get("placement") or "ssd",
                         f"{probe['fp32_gflops']:g} ({probe['cached_fp32_gflops']:g})", f"{sps:.2f}",
                         f"{plan_s:.2f}", pct(err) + (" (fitted)" if fitted else ""), f"`{name}`"])
    if not rows:
        return ""
    rows.sort()
    counts = ", ".join(f"{n} {why}" for why, n in sorted(history.items()))
    rule = (
        "A rule over what each record holds, stated before any run is compared "
        "(memascend_cli/bench/validation_scope.py): a CPU bench record that carries its sitting's own matmul probe "
        "and the SSD rate it ran at is planned with those (what `memascend plan` says of that machine that hour), "
        f"unless its load gauge shows other jobs on {scope.CONTENDED_CORES:g} cores or more, or its sitting's fp32 "
        f"probe ran under {scope.MACHINE_SPEED:g} of the machine's cached probe (a slower machine than the one the "
        "plan describes). Each run is planned with the host terms of its own CPU (planner.time HOST_CPUS: the terms "
        "the two VMs' CPUs disagree on are fitted once per CPU). Runs a time term was fitted on are marked and not "
        "counted. Every other run is history "
        f"({counts}), held to a looser check by `tests/unit/test_time_validation.py`.")
    return "\n".join(["## Which runs validate the time model", "", rule, "",
                      f"{within} of {total} validation runs within {TIME_TOLERANCE_PERCENT:.0f}%.", "",
                      table(VALIDATION_HEADER, rows), ""])
