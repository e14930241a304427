"""The placements of `memascend bench`: each run's placement priced as `plan` prices it (planner/placement.py on the
node the run's cgroup makes), and `--placements`, the curve users decide by: at each DRAM budget (a real memory
cgroup of that size) stock's best config (the fastest stock row that fits), tuned with every byte on the SSD and
memascend's recommended placement, each measured beside the plan's s/step and SSD bytes per parameter; one compact
JSON (placements.json), a table and a PNG. Stdlib at import: scripts/results.py reads the documents through it."""

from __future__ import annotations

import dataclasses
import os

from memascend_cli.bench.runs import RunSpec
from memascend_cli.errors import BadInput
from memascend_cli.units import GiB

SCHEMA = "memascend-bench-placements/1"
SWEEP_RUNS = (RunSpec("stock-best", "tuned"), RunSpec("tuned", "tuned"), RunSpec("memascend", "memascend"))
"""The curve's runs: stock DeepSpeed's best config with DRAM at the budget (tuned's knobs, as the plan prices stock's
rows), tuned with every byte on the SSD, memascend's recommended placement."""
CURVES = ("stock-best", "tuned", "memascend")


def parse_caps(text: str) -> list[int]:
    """--placements: a comma list of DRAM caps (e.g. 3GiB,6GiB,12GiB), at least two, ascending and distinct. Pure."""
    from memascend_cli.units import parse_size

    caps = [parse_size(t.strip(), "--placements") for t in str(text).split(",") if t.strip()]
    if len(caps) < 2 or caps != sorted(set(caps)):
        raise BadInput(f"--placements {text!r} needs two or more DRAM caps, ascending and distinct",
                       "e.g. --placements 3GiB,6GiB,12GiB")
    return caps


def price(p):
    """Every placement of the bench point `p` (runner.Point) on its node, from its tuned and memascend runs' plans
    (configs.plan_job: their knobs, checkpointing and loss), timed with the bench's rates (planner.placement)."""
    from memascend_cli.bench.configs import build_ds_config
    from memascend_cli.planner import time as tm
    from memascend_cli.planner.memory import estimate
    from memascend_cli.planner.placement import price_placements

    jobs = {m: p.plan_job(m, build_ds_config(m, p.spec, micro_batch=p.micro_batch, dtype=p.dtype, nvme_dir="/",
                                             ranks=p.ranks, grad_accum=p.grad_accum,
                                             gradient_clipping=p.gradient_clipping))
            for m in ("tuned", "memascend")}
    ests = {m: estimate(job, p.hw, engine) for m, (job, engine) in jobs.items()}
    t = p.timing or {}
    return price_placements(jobs["memascend"][0], p.hw, ests, t.get("device") or tm.cpu_device(None, "unknown"),
                            read_gbps=t.get("read_gbps"), write_gbps=t.get("write_gbps"),
                            duplex_io=bool(t.get("duplex_io")))


def run_choices(p, run_specs: list[RunSpec], asked: str) -> dict:
    """{run name: its Choice} of `bench --placement`: every run at `asked` (refused where it does not fit)."""
    from memascend_cli.planner.placement_choice import choose

    plan = price(p)
    return {r.name: choose(plan, r.mode, asked) for r in run_specs}


def sweep_choices(plan) -> dict:
    """{run name: Choice} at one budget: stock-best, the fastest stock row that fits and keeps bytes in DRAM (left out
    where none does), tuned all on the SSD (run whether or not the plan fits it: a kill is a point of the curve),
    memascend's own. Stock's DRAM row is run even where the plan ranks it behind tuned: the two can be closer than
    the plan's error (the 2.75 GiB point of the quiet sweep: split 7.75 against tuned 7.28 s/step planned, 7.08
    against 7.38 measured), and the fastest stock config that fits is a measurement. Pure."""
    from memascend_cli.planner import placement as pl
    from memascend_cli.planner.placement_choice import Choice, choose, engine_rows

    ssd = plan.row("ssd", "stock")
    chosen = {"tuned": Choice("tuned", ssd, True, "every byte on the SSD (tuned)"),
              "memascend": choose(plan, "memascend")}
    best = pl.recommend([r for r in engine_rows(plan, "tuned") if r.placement != "ssd"])
    if best is not None:
        fastest = choose(plan, "tuned")
        why = fastest.why if fastest.row is best else \
            f"stock's fastest placement with DRAM that fits: {pl.who(best)}, {pl.step_words(best)} (its all-SSD " \
            "config is tuned's run)"
        chosen["stock-best"] = Choice("tuned", best, False, why)
    return chosen


def _cores_taken(run: dict) -> float | None:
    if run.get("others_cpu_seconds") is None or not run.get("wall_s"):
        return None
    return round(((run.get("bench_cpu_seconds") or 0.0) + run["others_cpu_seconds"]) / run["wall_s"], 3)


def run_entry(run: dict, choice, num_params: int) -> dict:
    """One measured run of the curve beside its plan, compact. Pure."""
    row, t = choice.row, choice.row.time
    read, write = run.get("ssd_read_bytes_per_step"), run.get("ssd_write_bytes_per_step")
    placed = run.get("placement") or {}
    return {
        "mode": run["mode"], "placement": row.placement, "config": row.config, "why": choice.why,
        "dram_tier_gib": placed.get("dram_tier_gib_passed"), "ok": run["ok"], "error": run["error"],
        "oom_killed": run["oom_killed"], "seconds_per_step": run["seconds_per_step"],
        "tokens_per_s": run["tokens_per_s"],
        "ssd_bytes_per_param": None if read is None else round((read + (write or 0)) / num_params, 3),
        "peak_system_bytes": run["peak_system_bytes"], "cgroup_peak_bytes": (run.get("cgroup") or {}).get("peak_bytes"),
        "losses": run["losses"],
        "load": {"cores_taken": _cores_taken(run), "others_cpu_seconds": run.get("others_cpu_seconds"),
                 "bench_cpu_seconds": run.get("bench_cpu_seconds"), "wall_s": run.get("wall_s")},
        "planned": {"seconds_per_step": t.step_s if t else None, "tokens_per_s": t.tokens_per_s if t else None,
                    "seconds_per_step_at_least": t.at_least_s if t else None,  # an SSD rate unknown: a bound
                    "binding": row.binds, "ssd_bytes_per_param": round(row.ssd_bytes / num_params, 3),
                    "host_peak_bytes": row.est.node_host_peak_bytes if row.est else None, "fits": row.fits},
    }


def point_entry(cap_bytes: int, plan, chosen: dict, doc: dict, loadavg: tuple) -> dict:
    """One budget point: the cap, the plan's recommendation and tier budget, each curve's run. Pure."""
    by_name = {r["name"]: r for r in doc["runs"]}
    runs = {name: run_entry(by_name[name], chosen[name], doc["job"]["num_params"]) for name in chosen}
    if "stock-best" not in runs:
        runs["stock-best"] = {"same_as": "tuned"}  # no stock config with DRAM fits: only the all-SSD one
    rec = plan.recommended
    return {"dram_cap_bytes": cap_bytes, "dram_budget_bytes": plan.dram_budget_bytes,
            "recommended": None if rec is None else f"{rec.placement}/{rec.engine}", "why": plan.why,
            "loadavg": [round(x, 2) for x in loadavg], "sitting": (doc.get("hardware") or {}).get("sitting"),
            "runs": runs}


def curve(doc: dict, name: str) -> list[dict]:
    """The points of one curve ({cap_gib, run entry}), stock-best resolved where it is tuned's run. Pure."""
    out = []
    for pt in doc["points"]:
        run = pt["runs"].get(name) or {}
        run = pt["runs"][run["same_as"]] if "same_as" in run else run
        out.append({"cap_gib": pt["dram_cap_bytes"] / GiB, **run})
    return out


def plan_at_sitting(point_doc: dict, run: dict) -> float | None:
    """A recorded run's plan s/step (configs.repredict) with the CPU rate of the matmul probe its sitting ran seconds
    before the runs (hardware.sitting, the job's dtype) in place of the cached probe the bench planned with; None where
    the document has no such probe or was not planned with the cached one. A diagnostic of the plan's input (the
    cache is whatever the machine gave when it was taken), not the plan's prediction. Pure."""
    from memascend_cli.bench.configs import recorded_probe_gflops, repredict

    job = point_doc["job"]
    t = job.get("timing") or {}
    rate = ((point_doc.get("hardware") or {}).get("sitting") or {}).get(f"{job.get('dtype', 'fp32')}_gflops")
    if not rate or recorded_probe_gflops(t) is None:
        return None
    timing = {**t, "gflops": rate * t.get("cpu_fraction", 1.0)}  # repredict divides the fraction back out
    return repredict({**point_doc, "job": {**job, "timing": timing}}, run)["time"]["seconds_per_step"]


def run_placements(template, caps: list[int], *, out_dir: str, meta: dict, show_tables: bool, region: str | None,
                   **point_kw) -> tuple[dict, bool]:
    """The sweep: one runner.run_point per cap (its runs in a memory cgroup of that size; the first point's region
    reused by the next), its bench.json in OUT/cap-<GiB>; then OUT/placements.json (compact), placements.png and the
    table. (the document, whether every run trained or was OOM-killed)."""
    from memascend_cli.bench import document, runner
    from memascend_cli.console import err
    from memascend_cli.run.train_placement import dram_tier_supported

    tier, points, all_ok = dram_tier_supported(), [], True
    for cap in caps:
        p = dataclasses.replace(template, hw=template.hw.under_dram_cap(cap))
        plan = price(p)
        chosen = sweep_choices(plan)
        folder = os.path.join(out_dir, f"cap-{cap / GiB:g}GiB")
        os.makedirs(folder, exist_ok=True)
        load_before = os.getloadavg()
        doc = runner.run_point(p, [r for r in SWEEP_RUNS if r.name in chosen], out_dir=folder, region=region,
                               dram_cap_bytes=cap, placements=chosen, dram_tier=tier, **point_kw)
        doc["meta"] = meta
        document.write_document(doc, os.path.join(folder, "bench.json"))
        region = region or doc["job"]["region"]
        points.append(point_entry(cap, plan, chosen, doc, load_before + os.getloadavg()))
        all_ok = all_ok and all(r["ok"] or r["oom_killed"] for r in doc["runs"])
    summary = sweep_document(template.hw, points, meta, doc, tier)
    write_json(summary, os.path.join(out_dir, "placements.json"))
    problem = write_plot(summary, os.path.join(out_dir, "placements.png"))
    if problem:
        summary["notes"].append(problem)
    if show_tables:
        render_table(summary)
        err.print(f"wrote {out_dir}")
    return summary, all_ok


def sweep_document(hw, points: list[dict], meta: dict, last: dict, tier: bool) -> dict:
    """The sweep's compact document: the job (the last point's), the machine `hw` (uncapped), every point. Pure."""
    job = {k: v for k, v in last["job"].items() if k not in ("region_header", "dram_cap_bytes", "nvme_dir", "region")}
    machine = {"dram_gib": hw.dram_gib, "cpu_cores": hw.cpu_cores,
               "cpu_model": (job.get("timing") or {}).get("cpu_model")}
    notes = ["each point's runs ran one after another, each in its own memory cgroup of the point's cap "
             "(dram_cap_bytes) and io cgroup (--ssd-bandwidth); ssd_bytes_per_param is rank 0's block I/O of a "
             "steady step over the parameters; load: cores the bench's samplers and other jobs kept busy while the "
             "run ran (contention), loadavg before and after each point, sitting: the point's matmul and disk probe",
             "stock-best runs stock DeepSpeed with tuned's knobs in the fastest stock placement with DRAM the plan "
             "fits at the cap (offload_optimizer cpu, or nvme + max_in_cpu), even where the plan ranks it behind "
             "tuned's all-SSD run; where none fits it is tuned's run (same_as); stock's fastest config is the faster "
             "of the two as measured"]
    if not tier:
        notes.append("the engine had no DRAM tier (EngineOptions.dram_tier_gib): memascend kept every byte on the "
                     "region whatever its placement")
    return {"schema": SCHEMA, "meta": meta, "job": job, "machine": machine, "points": points, "notes": notes}


def write_json(doc: dict, path: str) -> None:
    import json

    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))


def _cell(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def render_table(doc: dict) -> None:
    """One row per cap and curve: placement, measured s/step, tokens/s and SSD bytes per parameter per step, each
    beside the plan's, and the cgroup's peak. Fits 80 columns."""
    from rich.table import Table

    from memascend_cli.console import out

    t = Table(title="placements: measured and planned against the DRAM cap", title_justify="left", box=None,
              pad_edge=False, show_edge=False)
    for c in ("GiB", "run", "placement", "s/step", "plan", "tok/s", "plan", "B/param", "plan", "peak"):
        t.add_column(c, justify="left" if c in ("run", "placement") else "right", no_wrap=True)
    for name in CURVES:
        for pt in curve(doc, name):
            plan = pt.get("planned") or {}
            state = "" if pt.get("ok") else " OOM" if pt.get("oom_killed") else " failed"
            cells = [_cell(d.get(k), f) for k, f in (("seconds_per_step", ".2f"), ("tokens_per_s", ",.0f"),
                                                     ("ssd_bytes_per_param", ".1f")) for d in (pt, plan)]
            t.add_row(f"{pt['cap_gib']:g}", name, (pt.get("placement") or "") + state, *cells,
                      _cell((pt.get("cgroup_peak_bytes") or 0) / GiB or None, ".2f"))
    out.print(t)


def write_plot(doc: dict, path: str) -> str | None:
    """PNG: tokens/s (left) and SSD bytes per parameter per step (right) against the DRAM cap, measured (solid) and
    planned (dotted) for each curve; the reason when no plot could be written."""
    from memascend_cli.bench.document import NO_MATPLOTLIB, pyplot

    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, (tok, ssd) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name in CURVES:
        pts = curve(doc, name)
        x = [p["cap_gib"] for p in pts]
        for ax, key in ((tok, "tokens_per_s"), (ssd, "ssd_bytes_per_param")):
            (line,) = ax.plot(x, [p.get(key) if p.get("ok") else None for p in pts], marker="o", label=name)
            ax.plot(x, [(p.get("planned") or {}).get(key) for p in pts], linestyle=":", color=line.get_color())
        killed = [p["cap_gib"] for p in pts if not p.get("ok")]
        if killed:  # a run that did not train (OOM-killed under the cap): an x on the axis
            tok.plot(killed, [0] * len(killed), marker="x", linestyle="none", color=line.get_color(), markersize=9,
                     label=f"{name}: OOM-killed / failed")
    job = doc["job"]
    tok.set_title(f"{job['model']} ({job['num_params'] / 1e6:.0f}M, seq {job['seq_len']}): tokens/s (dotted: plan)")
    ssd.set_title("SSD bytes per parameter per step (dotted: plan)")
    for ax, label in ((tok, "tokens/s"), (ssd, "bytes / parameter / step")):
        ax.set_xlabel("DRAM cap (GiB)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    save_small_png(fig, path)
    plt.close(fig)
    return None


def save_small_png(fig, path: str) -> None:
    """`fig` as a PNG of 64 palette colours: a plot of a few lines and its text lose nothing to the eye, and the file
    takes a quarter of the bytes (100 -> 28 KB for the quiet sweep's plot; recorded plots are committed under
    docs/, which stays under 3 MiB). PIL comes with matplotlib."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, dpi=110, format="png")
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
