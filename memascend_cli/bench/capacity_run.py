"""`bench --capacity`: run the probes of capacity.py, one ordinary capped bench run each (runner.run_point), and write
the summary (capacity.json), its table and its plot. Every probe keeps its own bench.json under
OUT/<run>/<axis>-<value>/."""

from __future__ import annotations

import dataclasses
import json
import os

from memascend_cli.bench import capacity, document, runner
from memascend_cli.bench.configs import build_ds_config, ssd_space_bytes
from memascend_cli.planner import search
from memascend_cli.run.cgroup import THRASH_FULL_SHARE, THRASH_WINDOW_S
from memascend_cli.units import GiB

SUMMARY_FILE = "capacity.json"
PLOT_FILE = "capacity.png"


def probe_point(base: runner.Point, axis: str, value: int) -> runner.Point:
    """The probe of `axis` at `value`: `base` is the job of every probe but the searched axis (its spec the model's
    own, its layers the --layers depth or None); the spec is scaled when the depth differs from the model's."""
    layers = value if axis == "layers" else base.layers
    depth = layers or base.spec.num_hidden_layers
    spec = base.spec if depth == base.spec.num_hidden_layers else base.spec.scaled(depth)
    return dataclasses.replace(base, spec=spec, layers=layers, seq_len=value if axis == "seq" else base.seq_len,
                               micro_batch=value if axis == "micro-batch" else base.micro_batch)


def search_hardware(hw):
    """The machine as a search's plan sees it: `hw` is already under the cap (bench applies it once, with
    HardwareSpec.under_dram_cap); SSD space is the probes' ceiling (capacity.ceiling), not checked here."""
    return dataclasses.replace(hw, nvme_free_gib=None, nvme_path=None)


def _config(run, point: runner.Point, nvme_dir: str) -> dict:
    return build_ds_config(run.mode, point.spec, micro_batch=point.micro_batch, dtype=point.dtype, nvme_dir=nvme_dir,
                           ranks=point.ranks, gradient_clipping=point.gradient_clipping)


def plan_engine(run, axis: str, base: runner.Point, *, cap_bytes: int, nvme_dir: str,
                usable_disk_bytes: int) -> tuple[tuple[int | None, str], tuple[int | None, str]]:
    """(the plan's maximum under the cap and what binds it, the probes' ceiling and why) of one engine. Pure."""
    g = capacity.grid(axis)
    first = probe_point(base, axis, g.first)
    job, engine = first.plan_job(run.mode, _config(run, first, nvme_dir), tuple(run.disabled))
    planned = capacity.planned_max(axis, job, search_hardware(base.hw), engine)

    def need_at(value: int) -> int:
        # A memascend run's region is sized as run_point sizes it: from full memascend's plan.
        p = probe_point(base, axis, value)
        return ssd_space_bytes(run.mode, p.predict(run.mode, _config(run, p, nvme_dir)), p.ranks)

    top = capacity.ceiling(g, need_at, usable_disk_bytes)
    if planned[0] is not None and top[0] is not None and planned[0] > top[0]:
        planned = top[0], "nvme_space"  # the plan on this disk: the SSD space binds first
    return planned, top


def stored_probes(run, axis: str, base: runner.Point, *, cap_bytes: int, out_dir: str, repeat: int = 1) -> list[dict]:
    """--resume: the probe records of `run` already in OUT (OUT/<run>/<axis>-<value>/bench.json, smallest value
    first). A folder without bench.json (a probe cut off before it ended) is not a probe: it runs again. A stored
    probe of another job is bad input: its outcome says nothing of this search."""
    from memascend_cli.errors import BadInput

    root = os.path.join(out_dir, run.name)
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        value_text = name.removeprefix(f"{axis}-")
        path = os.path.join(root, name, "bench.json")
        if value_text == name or not value_text.isdigit() or not os.path.exists(path):
            continue
        with open(path) as f:
            doc = json.load(f)
        value = int(value_text)
        expected = {**probe_point(base, axis, value).job_identity(), "dram_cap_bytes": cap_bytes}
        why = capacity.job_mismatch(doc["job"], expected)
        if why is None and [r["name"] for r in doc["runs"]] != [run.name]:
            why = f"runs: {[r['name'] for r in doc['runs']]}, not [{run.name!r}]"
        stored_repeat = capacity.probe_repeats(doc["runs"][0])
        if why is None and stored_repeat != repeat:
            why = f"repeat: {stored_repeat}, not {repeat}"
        if why:
            raise BadInput(f"--resume: {path} is another job ({why})",
                           "resume with that sitting's options (its capacity.json or bench.json meta), or give a "
                           "new --out")
        found.append(capacity.probe_record(value, doc["runs"][0], os.path.relpath(path, out_dir),
                                           (doc.get("meta") or {}).get("date")))
    return sorted(found, key=lambda q: q["value"])


def search_engine(run, axis: str, base: runner.Point, *, cap_bytes: int, out_dir: str, nvme_dir: str, nvme_info: dict,
                  usable_disk_bytes: int, engine_ok: bool, settle_cap_s: float, probe_timeout_s: float | None,
                  meta: dict, stored: list[dict], repeat: int = 1) -> dict:
    """One engine's search: the plan's maximum under the cap, the SSD ceiling, then probes until a conclusion;
    `stored`: probes of an earlier sitting (stored_probes), counted as if run now; `repeat`: runs per probe, a value
    fits only when every one of them fits (runner.median_run reports a failed repeat)."""
    from memascend_cli.console import err

    g = capacity.grid(axis)
    planned, top = plan_engine(run, axis, base, cap_bytes=cap_bytes, nvme_dir=nvme_dir,
                               usable_disk_bytes=usable_disk_bytes)
    err.print(f"{run.name}: planned max {capacity.fmt_max(planned[0])} {g.unit} under {cap_bytes / GiB:.2f} GiB "
              f"(binds: {search.RESOURCE_NAMES.get(planned[1], planned[1])}); probes stop at "
              f"{capacity.fmt_max(top[0])}: {top[1]}")
    probes: list[dict] = list(stored)
    results: list[tuple[int, str]] = [(q["value"], q["outcome"]) for q in stored]
    if stored:
        err.print(f"{run.name}: resumed {len(stored)} probes of earlier sittings: "
                  + ", ".join(f"{q['value']} {q['outcome']}" for q in stored))
    while True:
        nxt = capacity.next_probe(g, planned[0], top[0], top[1], results)
        if isinstance(nxt, capacity.Conclusion):
            break
        point = probe_point(base, axis, nxt)
        probe_dir = os.path.join(out_dir, run.name, f"{axis}-{nxt}")
        os.makedirs(probe_dir, exist_ok=True)
        timeout_s = probe_timeout_s
        if timeout_s is None:
            planned_time = point.predict(run.mode, _config(run, point, nvme_dir)).get("time") or {}
            # Without the SSD's rate (a probe's fresh region) the step's lower bound: compute binds on a CPU.
            timeout_s = capacity.probe_timeout_s(planned_time.get("seconds_per_step")
                                                 or planned_time.get("seconds_per_step_at_least"), point.steps)
        doc = runner.run_point(point, [run], out_dir=probe_dir, nvme_dir=nvme_dir, nvme_info=nvme_info, region=None,
                               engine_ok=engine_ok, settle_cap_s=settle_cap_s, dram_cap_bytes=cap_bytes,
                               timeout_s=timeout_s, repeat=repeat)
        doc["meta"] = meta
        summary = document.write_document(doc, os.path.join(probe_dir, "bench.json"))
        region = os.path.join(probe_dir, "bench.region")
        if os.path.exists(region):
            os.unlink(region)  # the next probe makes its own: keep the SSD space for it
        r = summary["runs"][0]
        q = capacity.probe_record(nxt, r, os.path.relpath(os.path.join(probe_dir, "bench.json"), out_dir),
                                  meta.get("date"))
        q["timeout_s"] = timeout_s
        probes.append(q)
        results.append((nxt, q["outcome"]))
        peak = "-" if q["cgroup_peak_bytes"] is None else f"{q['cgroup_peak_bytes'] / GiB:.2f} GiB"
        what = (f"trained {q['steps_done']} steps" if q["outcome"] == capacity.FIT
                else (r.get("error") or "?").splitlines()[0])
        err.print(f"{run.name}: {axis} {nxt}: {what} (cgroup peak {peak})")
    return capacity.engine_entry(run.name, run.mode, g, planned, top, probes, nxt)


def run_capacity(axis: str, base: runner.Point, run_specs: list, *, cap_bytes: int, out_dir: str, nvme_dir: str,
                 nvme_info: dict, engine_ok: bool, settle_cap_s: float, probe_timeout_s: float | None,
                 meta: dict, resume: bool = False, repeat: int = 1) -> tuple[dict, bool]:
    """Every engine's search, one after another; (the summary as written to OUT/capacity.json, no probe failed
    other than by an OOM kill). `resume`: reuse the probes an earlier sitting left in OUT (stored_probes), all
    checked before any probe runs; `repeat`: runs per probe (search_engine)."""
    from memascend_cli.ssd.path import free_space_at

    stored = {run.name: stored_probes(run, axis, base, cap_bytes=cap_bytes, out_dir=out_dir, repeat=repeat)
              if resume else []
              for run in run_specs}

    where, free_bytes = free_space_at(out_dir)
    if nvme_dir:
        where, free_bytes = min((where, free_bytes), free_space_at(nvme_dir), key=lambda x: x[1])
    usable = max(0, free_bytes - capacity.DISK_KEEP_FREE_BYTES)
    engines = [search_engine(run, axis, base, cap_bytes=cap_bytes, out_dir=out_dir, nvme_dir=nvme_dir,
                             nvme_info=nvme_info, usable_disk_bytes=usable, engine_ok=engine_ok,
                             settle_cap_s=settle_cap_s, probe_timeout_s=probe_timeout_s, meta=meta,
                             stored=stored[run.name], repeat=repeat)
               for run in run_specs]
    job = {k: getattr(base, k) for k in ("model", "layers", "seq_len", "micro_batch", "steps", "dtype", "seed",
                                         "checkpointing", "ranks", "accelerator", "host_budget_bytes",
                                         "deepspeed_version", "loss")}
    job["layers"] = base.layers or base.spec.num_hidden_layers
    job["repeat"] = repeat
    job[{"layers": "layers", "seq": "seq_len", "micro-batch": "micro_batch"}[axis]] = None  # the searched axis
    runs = "one `memascend bench` run" if repeat == 1 else f"{repeat} `memascend bench` runs, one after another,"
    notes = [f"each probe is {runs} of the engine in its own memory cgroup of the cap; its bench.json (path relative "
             "to this file) has the whole run"
             + ("" if repeat == 1 else "; it fits only when every run fits (a job OOM-killed in some runs does not)"),
             "cgroup peak: the cgroup's own high-water mark (processes plus the page cache charged to them); an "
             "OOM-killed probe's peak is cut at the cap",
             "a probe still running after " + (f"{probe_timeout_s:.0f} s" if probe_timeout_s is not None else
                                                f"{capacity.PROBE_TIMEOUT_RULE} (its timeout_s)") +
             " is killed and reads 'stalled' (does not fit: at its cap a job can crawl re-reading its evicted "
             "libraries instead of being OOM-killed); so is one whose tasks all stalled on memory "
             f"{THRASH_FULL_SHARE:.0%} of {THRASH_WINDOW_S:.0f} s (memory pressure, systemd-oomd's limit)"]
    sittings = capacity.sittings(engines)
    if len(sittings) > 1:
        notes.append("resumed (--resume): the probes come from the sittings started at " + ", ".join(sittings)
                     + " (each probe's `sitting`)")
    doc = capacity.capacity_document(g=capacity.grid(axis), cap_bytes=cap_bytes, job=job,
                                     hardware=search_hardware(base.hw).to_dict(),
                                     disk={"path": where, "free_bytes": free_bytes,
                                           "kept_free_bytes": capacity.DISK_KEEP_FREE_BYTES},
                                     engines=engines, notes=notes)
    doc["meta"] = meta
    problem = write_plot(doc, os.path.join(out_dir, PLOT_FILE))
    if problem:
        doc["notes"].append(problem)
    with open(os.path.join(out_dir, SUMMARY_FILE), "w") as f:
        json.dump(doc, f, indent=1)
    ok = all(q["outcome"] != capacity.FAILED for e in engines for q in e["probes"])
    return doc, ok


def render_table(doc: dict) -> None:
    from rich.table import Table

    from memascend_cli.console import out

    j = doc["job"]
    t = Table(title=f"memascend bench --capacity {doc['axis']}: {j['model']} under a {doc['dram_cap_bytes'] / GiB:.2f}"
                    f" GiB DRAM cap ({j['steps']} steps, {j['dtype']})", title_justify="left")
    for c in capacity.TABLE_COLUMNS:
        t.add_column(c)
    for row in capacity.table_rows(doc):
        t.add_row(*row)
    out.print(t)
    for n in doc["notes"]:
        out.print(f"[yellow]note:[/yellow] {n}")


def write_plot(doc: dict, path: str) -> str | None:
    """PNG of each engine's probes: the cgroup peak per value (o trained, x did not fit), the plan's peak there
    (dotted), the cap; None when matplotlib is missing."""
    plt = document.pyplot()
    if plt is None:
        return document.NO_MATPLOTLIB
    fig, ax = plt.subplots(figsize=(9, 5))
    cap = doc["dram_cap_bytes"] / GiB
    ax.axhline(cap, color="black", linewidth=0.8, label=f"DRAM cap {cap:.2f} GiB")
    for e in doc["engines"]:
        qs = sorted(e["probes"], key=lambda q: q["value"])
        planned = [(q["value"], q["planned_peak_bytes"] / GiB) for q in qs if q["planned_peak_bytes"]]
        (line,) = ax.plot([v for v, _ in planned], [b for _, b in planned], linestyle=":", linewidth=1,
                          label=f"{e['name']}: plan (max {capacity.fmt_max(e['planned_max'])}), measured max "
                                f"{capacity.fmt_max(e['measured_max'], e['at_least'])}")
        for kinds, marker in (((capacity.FIT,), "o"), (capacity.DOES_NOT_FIT, "x")):
            pts = [(q["value"], (q["cgroup_peak_bytes"] or 0) / GiB) for q in qs if q["outcome"] in kinds]
            ax.plot([v for v, _ in pts], [b for _, b in pts], marker, color=line.get_color())
    unit = doc["grid"]["unit"]
    ax.set_xlabel(doc["axis"] + ("" if unit == doc["axis"] else f" ({unit})"))
    ax.set_ylabel("GiB (cgroup peak: o trained, x did not fit; dotted: plan)")
    ax.set_title(f"{doc['job']['model']}: capacity in {doc['axis']} under the DRAM cap")
    document.save_figure(plt, fig, ax, path)
    return None
