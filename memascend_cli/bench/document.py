"""The bench's outputs: the JSON summary per point (or sweep), its timeline side file, the table, the plot and
the SSD roofline lines. Pure except the writers."""

from __future__ import annotations

import glob
import gzip
import json
import os

from memascend_cli.bench.sampling import bucket_max
from memascend_cli.units import GiB, MiB

JSON_SCHEMA_VERSION = 2
"""2: the runs' memory timelines live in a side file the summary names (`timeline_file`); 1 had them inline."""
SIDE_FILE_BUCKET_S = 1.0
"""The side file keeps the maximum of each 1 s bucket: the shape of a run (the peak itself is in the summary, taken
from the raw 1 kHz series)."""
TIMELINE_SUFFIX = ".timeline.json.gz"
"""bench.json -> bench.timeline.json.gz, sweep.json -> sweep.timeline.json.gz: beside the summary."""


def sweep_document(docs: list[dict]) -> dict:
    """Peak per run over the points of a sweep, the spread (largest - smallest) and the slope in GiB per billion
    parameters (least squares) of every run name. Pure."""
    names: list[str] = []
    for d in docs:
        for r in d["runs"]:
            if r["name"] not in names:
                names.append(r["name"])
    series = {}
    for name in names:
        pts = []
        for d in docs:
            r = next((x for x in d["runs"] if x["name"] == name), None)
            if r is not None and r["ok"] and r["peak_system_bytes"]:
                pts.append({"layers": d["job"]["layers"], "seq_len": d["job"]["seq_len"],
                            "num_params": d["job"]["num_params"], "peak_system_bytes": r["peak_system_bytes"],
                            "ru_maxrss_bytes": r["ru_maxrss_bytes"], "seconds_per_step": r["seconds_per_step"],
                            "predicted_bytes": (r.get("predicted") or {}).get("node_host_peak_bytes")})
        peaks = [q["peak_system_bytes"] for q in pts]
        slope = None
        xs = [q["num_params"] / 1e9 for q in pts]
        if len(pts) >= 2 and len(set(xs)) >= 2:
            mx, my = sum(xs) / len(xs), sum(peaks) / len(peaks)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, peaks)) / sum((x - mx) ** 2 for x in xs) / GiB
        series[name] = {"points": pts, "spread_bytes": (max(peaks) - min(peaks)) if peaks else None,
                        "smallest_bytes": min(peaks) if peaks else None,
                        "gib_per_billion_params": round(slope, 4) if slope is not None else None}
    return {"schema_version": JSON_SCHEMA_VERSION, "kind": "sweep",
            "points": [{"layers": d["job"]["layers"], "seq_len": d["job"]["seq_len"], "num_params": d["job"]["num_params"]}
                       for d in docs], "series": series, "documents": docs}


def render_sweep(doc: dict) -> None:
    from rich.table import Table

    from memascend_cli.console import out

    t = Table(title="sweep: peak system memory (GiB) per point", title_justify="left")
    t.add_column("run")
    for p in doc["points"]:
        t.add_column(f"L{p['layers']} s{p['seq_len']}", justify="right")
    t.add_column("GiB/B params", justify="right")
    for name, s in doc["series"].items():
        by = {(q["layers"], q["seq_len"]): q["peak_system_bytes"] for q in s["points"]}
        t.add_row(name, *[("-" if (p["layers"], p["seq_len"]) not in by else f"{by[(p['layers'], p['seq_len'])] / GiB:.2f}")
                          for p in doc["points"]],
                  "-" if s["gib_per_billion_params"] is None else f"{s['gib_per_billion_params']:.2f}")
    out.print(t)


def compare(runs: list, reference: str) -> dict:
    """Peak reduction and step-time change of every run (runner.RunResult) against `reference` (stock or tuned).
    Pure."""
    ref = next((r for r in runs if r.name == reference), None)
    out = {}
    if ref is None or not ref.ok or not ref.peak_system_bytes:
        return out
    for r in runs:
        if r is ref or not r.ok or not r.peak_system_bytes:
            continue
        out[r.name] = {
            "peak_reduction_percent": round(100.0 * (1 - r.peak_system_bytes / ref.peak_system_bytes), 2),
            "step_time_change_percent": (round(100.0 * (r.seconds_per_step / ref.seconds_per_step - 1), 2)
                                         if r.seconds_per_step and ref.seconds_per_step else None),
        }
    return out


def build_document(*, job: dict, hardware: dict, runs: list, notes: list[str]) -> dict:
    """The JSON document of one point, every run's timeline still inline (write_document moves them out). Pure."""
    params_per_rank = job["num_params"] / max(1, job["ranks"])
    out_runs = []
    for r in runs:
        d = r.to_dict()
        d["ssd_bytes_per_param"] = ({"read": round(r.ssd_read_bytes_per_step / params_per_rank, 3),
                                     "write": round(r.ssd_write_bytes_per_step / params_per_rank, 3)}
                                    if r.ssd_read_bytes_per_step is not None else None)
        out_runs.append(d)
    return {"schema_version": JSON_SCHEMA_VERSION, "job": job, "hardware": hardware, "runs": out_runs,
            "vs_stock": compare(runs, "stock"), "vs_tuned": compare(runs, "tuned"), "notes": notes}


def timeline_path(summary_path: str) -> str:
    """The timeline side file of a summary: its name with TIMELINE_SUFFIX for `.json`. Pure."""
    stem = summary_path[:-len(".json")] if summary_path.endswith(".json") else summary_path
    return stem + TIMELINE_SUFFIX


def split_timelines(doc: dict) -> tuple[dict, list[dict]]:
    """(the document without any run's timeline, the timelines as side-file entries, max per SIDE_FILE_BUCKET_S) of
    a point's or a sweep's document. Pure."""
    entries: list[dict] = []

    def strip(point: dict) -> dict:
        runs = []
        for r in point["runs"]:
            r = dict(r)
            timeline = r.pop("timeline", None)
            if timeline:
                entries.append({"layers": point["job"].get("layers"), "seq_len": point["job"]["seq_len"],
                                "run": r["name"], "points": [list(p) for p in bucket_max(
                                    [t for t, _ in timeline], [v for _, v in timeline], 0.0, SIDE_FILE_BUCKET_S)]})
            runs.append(r)
        return {**point, "runs": runs}

    if doc.get("kind") == "sweep":
        return {**doc, "documents": [strip(p) for p in doc["documents"]]}, entries
    return strip(doc), entries


def write_document(doc: dict, path: str, *, compact: bool = False) -> dict:
    """Write the summary to `path` and its runs' timelines beside it (timeline_path, gzip, a fixed mtime so the same
    timelines give the same bytes); returns the summary, which names the side file in `timeline_file`. `compact`:
    one line (for documents committed to the repository)."""
    summary, timelines = split_timelines(doc)
    side = timeline_path(path)
    summary["timeline_file"] = os.path.basename(side)
    payload = {"schema_version": JSON_SCHEMA_VERSION, "bucket_s": SIDE_FILE_BUCKET_S,
               "quantity": "MemTotal - MemAvailable - the run's idle level, bytes, max per bucket; t = seconds since "
                           "the launch at the bucket's start", "timelines": timelines}
    write_summary(side, payload)
    with open(path, "w") as f:
        json.dump(summary, f, **({"separators": (",", ":")} if compact else {"indent": 1}))
    return summary


def read_timelines(summary_path: str) -> list[dict]:
    """The timeline entries ({layers, seq_len, run, points}) of the summary at `summary_path`; [] without a side
    file."""
    name = read_summary(summary_path).get("timeline_file")
    if not name:
        return []
    with gzip.open(os.path.join(os.path.dirname(summary_path), name), "rt") as f:
        return json.load(f)["timelines"]


RECORDED_GZIP = ".gz"
"""A large summary committed to the repository may be gzipped whole (docs/bench/NAME.json.gz: a sweep embeds every
point's document); readers of recorded summaries take either (read_summary, recorded_summaries)."""


def read_summary(path: str) -> dict:
    """The JSON summary at `path`, gzipped or not (RECORDED_GZIP)."""
    with (gzip.open(path, "rt") if path.endswith(RECORDED_GZIP) else open(path)) as f:
        return json.load(f)


def write_summary(path: str, doc: dict) -> None:
    """`doc` as one line of compact JSON at `path`, gzipped where its name ends in RECORDED_GZIP (fixed gzip mtime:
    the same document gives the same bytes); read back by read_summary."""
    text = json.dumps(doc, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(gzip.compress(text, mtime=0) if path.endswith(RECORDED_GZIP) else text)


def recorded_stem(path: str) -> str:
    """A recorded summary's path without `.json` or `.json.gz`: the name of what sits beside it (its folder of
    records, its plot). Pure."""
    return path.removesuffix(RECORDED_GZIP).removesuffix(".json")


def recorded_summaries(pattern: str) -> list[str]:
    """Paths of the summaries `pattern` (a glob ending in .json; ** recurses) names, each also gzipped
    (RECORDED_GZIP), sorted; timeline side files and capacity probe bundles are not summaries."""
    paths = glob.glob(pattern, recursive=True) + glob.glob(pattern + RECORDED_GZIP, recursive=True)
    return sorted(p for p in paths if not p.endswith((TIMELINE_SUFFIX, RECORDED_PROBES_FILE)))


def read_document(summary_path: str) -> dict:
    """The summary at `summary_path` with every run's timeline back in place from its side file (1 s buckets), as
    write_document takes it: for joining point documents into a sweep (scripts/join_sweep.py)."""
    doc = read_summary(summary_path)
    by_run = {(t["layers"], t["seq_len"], t["run"]): t["points"] for t in read_timelines(summary_path)}
    doc.pop("timeline_file", None)
    for point in doc.get("documents") or [doc]:
        for r in point["runs"]:
            r["timeline"] = by_run.get((point["job"].get("layers"), point["job"]["seq_len"], r["name"]), [])
    return doc


RECORDED_PROBES_FILE = "probes.json.gz"
"""A capacity sitting committed to the repository (scripts/record_capacity.py): every probe's summary and timelines
in one gzip file beside capacity.json, keyed by the probe's `document` path, instead of two small files per probe."""


def write_recorded_probes(folder: str, probe_paths: list[str], src: str) -> None:
    """Bundle the probe documents `probe_paths` (relative to `src`, the sitting's OUT) and their timeline side files
    into `folder`/RECORDED_PROBES_FILE (fixed gzip mtime: the same probes give the same bytes)."""
    bundle = {"schema_version": 1, "documents": {}, "timelines": {}}
    for rel in probe_paths:
        path = os.path.join(src, rel)
        with open(path) as f:
            bundle["documents"][rel] = json.load(f)
        side = timeline_path(path)
        if os.path.exists(side):
            with gzip.open(side, "rt") as f:
                bundle["timelines"][rel] = json.load(f)
    with open(os.path.join(folder, RECORDED_PROBES_FILE), "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(json.dumps(bundle, separators=(",", ":"), sort_keys=True).encode())


def recorded_probe(folder: str, rel: str) -> dict:
    """The summary of the probe whose `document` is `rel` in the capacity sitting at `folder`: from its bundle in
    the repository, else (a sitting's own OUT) from the probe's bench.json."""
    bundle = os.path.join(folder, RECORDED_PROBES_FILE)
    if os.path.exists(bundle):
        with gzip.open(bundle, "rt") as f:
            return json.load(f)["documents"][rel]
    with open(os.path.join(folder, rel)) as f:
        return json.load(f)


def ssd_minimum(run: dict) -> tuple[float, float] | None:
    """(read, write) bytes per parameter per step of the run's placement roofline, as planned for its config
    (memory.SsdTraffic.minimum_per_param); None for runs recorded without it. Pure."""
    t = (run.get("predicted") or {}).get("ssd_traffic") or {}
    if not t.get("minimum_read_bytes_per_param") and not t.get("minimum_write_bytes_per_param"):
        return None
    return t["minimum_read_bytes_per_param"], t["minimum_write_bytes_per_param"]


def ssd_share(run: dict, read_bytes_per_s: float, write_bytes_per_s: float) -> float | None:
    """The fraction of a recorded run's step its SSD's busier direction needs at these limits: max(read bytes / read
    limit, written bytes / write limit) over the measured s/step; None without a step time or block I/O. Pure."""
    if not run.get("seconds_per_step") or run.get("ssd_read_bytes_per_step") is None:
        return None
    busy = max(run["ssd_read_bytes_per_step"] / read_bytes_per_s, run["ssd_write_bytes_per_step"] / write_bytes_per_s)
    return busy / run["seconds_per_step"]


def ssd_line(run: dict) -> str | None:
    """The run's measured SSD bytes per parameter next to its placement's minimum, with the excess in %; None for a
    failed run or one recorded without either. Pure."""
    bpp, low = run.get("ssd_bytes_per_param"), ssd_minimum(run)
    if not run.get("ok", True) or not bpp or not low:
        return None

    def over(x, m):
        return "-" if not m else f"{100.0 * (x - m) / m:+.1f}%"

    return (f"{run['name']}: SSD {bpp['read']:.1f} / {bpp['write']:.1f} B/param read / write per step, minimum for "
            f"its placement {low[0]:.1f} / {low[1]:.1f} ({over(bpp['read'], low[0])} / {over(bpp['write'], low[1])})")


TABLE_COLUMNS = ("run", "peak GiB", "maxrss GiB", "s/step", "plan s/step", "tokens/s", "SSD B/param r/w", "plan GiB",
                 "plan err")
"""Peak = MemTotal - MemAvailable minus idle; plan s/step = the time model's (planner/time.py) at the SSD bandwidth
the run got; SSD bytes per parameter of a steady step (rank 0). On CUDA the peak GPU memory is added."""


def predicted_step_s(run: dict) -> float | None:
    """The plan's s/step for a run (recorded with the time model's inputs), else None. Pure."""
    return ((run.get("predicted") or {}).get("time") or {}).get("seconds_per_step")


def _plan_s_text(run: dict, plan_s: float | None) -> str:
    """The plan's s/step, or its lower bound where the run's SSD rate is unknown ('≥12.3'), else '-'."""
    if plan_s is not None:
        return f"{plan_s:.2f}"
    low = ((run.get("predicted") or {}).get("time") or {}).get("seconds_per_step_at_least")
    return f"≥{low:.2f}" if low else "-"


def throttle_text(job: dict) -> str | None:
    """'SSD throttled to 400 MB/s (vda)' for a run under --ssd-bandwidth, else None. Pure."""
    bps = job.get("ssd_bandwidth_bytes_per_s")
    if not bps:
        return None
    devices = ", ".join(t["device"] for t in job.get("ssd_throttle") or [])
    return f"SSD throttled to {bps / 1e6:g} MB/s" + (f" ({devices})" if devices else "")


def table_rows(doc: dict) -> list[tuple[str, ...]]:
    """One row per run, in TABLE_COLUMNS order (+ GPU GiB on CUDA). Pure."""

    def g(b):
        return "-" if b is None else f"{b / GiB:.2f}"

    cuda = doc["job"].get("accelerator") == "cuda"
    rows = []
    for r in doc["runs"]:
        pred = r["predicted"]["node_host_peak_bytes"] if r.get("predicted") else None
        err = r.get("prediction_error_percent")
        bpp = r.get("ssd_bytes_per_param")
        plan_s, tps = predicted_step_s(r), r.get("tokens_per_s")
        row = (
            r["name"] + ("" if r["ok"] else " (failed)"),
            g(r["peak_system_bytes"]), g(r["ru_maxrss_bytes"]),
            "-" if r["seconds_per_step"] is None else f"{r['seconds_per_step']:.2f}",
            _plan_s_text(r, plan_s), "-" if tps is None else f"{tps:.0f}",
            "-" if not bpp else f"{bpp['read']:.1f}/{bpp['write']:.1f}", g(pred),
            "-" if err is None else f"{err:+.1f}%",
        )
        rows.append(row + ((g(r.get("peak_gpu_bytes")),) if cuda else ()))
    return rows


def render_table(doc: dict) -> None:
    from rich.table import Table

    from memascend_cli.console import out

    j = doc["job"]
    t = Table(title=f"memascend bench: {j['model']} ({j['num_params']:,} params), seq {j['seq_len']}, "
                    f"micro-batch {j['micro_batch']}"
                    + (f" x {j['grad_accum']} accumulated" if j.get("grad_accum", 1) > 1 else "")
                    + f", {j['steps']} steps, {j['dtype']}, {j['ranks']} rank(s)"
                    + (f", {throttle_text(j)}" if throttle_text(j) else ""),
              title_justify="left")
    for c in TABLE_COLUMNS + (("GPU GiB",) if j.get("accelerator") == "cuda" else ()):
        t.add_column(c, justify="left" if c == "run" else "right")
    for row in table_rows(doc):
        t.add_row(*row)
    out.print(t)
    for ref in ("stock", "tuned"):
        for name, c in doc.get(f"vs_{ref}", {}).items():
            st = c["step_time_change_percent"]
            out.print(f"{name}: peak {c['peak_reduction_percent']:.1f}% below {ref}"
                      + ("" if st is None else f", step time {st:+.1f}% vs {ref}"))
    for line in filter(None, map(ssd_line, doc["runs"])):
        out.print(line)
    for r in doc["runs"]:
        s = r["settle"]
        if s:
            out.print(f"[dim]{r['name']}: idle {r['idle_bytes'] / GiB:.2f} GiB after {s['waited_s']:.0f}s "
                      f"({'flat' if s['flat'] else 'NOT flat'}, spread {s['spread_bytes'] / MiB:.0f} MiB), "
                      f"sampled {r['sampling'].get('rate_hz', 0):.0f} Hz (gap p99.9 {r['sampling'].get('p999_gap_ms')} ms, "
                      f"max {r['sampling'].get('max_gap_ms')} ms), "
                      f"peak at {r['peak_at_s']}s in {r['peak_phase']}, other processes' RSS moved "
                      f"{(r['others_rss_span_bytes'] or 0) / MiB:.0f} MiB[/dim]")
        if not r["ok"]:
            out.print(f"[red]{r['name']} failed:[/red] {r['error']}")
    for n in doc["notes"]:
        out.print(f"[yellow]note:[/yellow] {n}")


NO_MATPLOTLIB = "matplotlib is not installed (`pip install matplotlib`): no plot written"


def pyplot():
    """matplotlib.pyplot for headless PNGs, or None when matplotlib is missing (the plots are optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(plt, fig, ax, path: str) -> None:
    """Every bench plot's finish: grid, legend upper left, PNG at 110 dpi."""
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plot(doc: dict, path: str) -> str | None:
    """PNG of (MemTotal - MemAvailable - idle) over time for every run; None when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, ax = plt.subplots(figsize=(11, 5.5))
    for r in doc["runs"]:
        if not r["timeline"]:
            continue
        ts = [p[0] for p in r["timeline"]]
        vs = [p[1] / GiB for p in r["timeline"]]
        (line,) = ax.plot(ts, vs, linewidth=0.8, label=f"{r['name']} (peak {(r['peak_system_bytes'] or 0) / GiB:.2f} GiB)")
        if r.get("predicted"):
            ax.axhline(r["predicted"]["node_host_peak_bytes"] / GiB, color=line.get_color(), linestyle=":", linewidth=0.8)
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("MemTotal - MemAvailable - idle (GiB)")
    ax.set_title(f"{doc['job']['model']}: system memory over time (dotted: memascend plan prediction)")
    save_figure(plt, fig, ax, path)
    return None
