"""`bench --capacity`: the largest job of one axis (layers, seq, micro-batch) that trains under a DRAM cap, planned and
measured. Pure: the grid of each axis, the probe sequence, the plan's maximum and the SSD ceiling under the cap, the
summary document, its table and its section of docs/results/capacity.md. capacity_run.py runs the probes.

The probe sequence starts at the plan's maximum under the cap and gallops (1, 2, 4, ... grid steps) up after a fit
and down after an OOM kill (or a stall), then bisects between the largest fit and the smallest one that did not fit.
It stops when a value fits and the next grid value does not (the measured maximum), or when a fit reaches the
ceiling: the grid's end or the SSD space the probes may use, reported as "at least" that value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memascend_cli.planner import search
from memascend_cli.units import GiB

AXES = ("layers", "seq", "micro-batch")
SCHEMA_VERSION = 1
FIT, OOM, STALLED, FAILED = "fit", "oom", "stalled", "failed"
"""A probe's outcome: trained every step under the cap; OOM-killed inside the cap; stalled: killed for thrashing
(run/cgroup.py THRASH_FULL_SHARE) or after the probe time limit (near its cap a cgroup can reclaim and re-read the
pages of the libraries it runs for a long time before the OOM killer fires); failed otherwise. OOM and STALLED both mean "does not fit"."""
DOES_NOT_FIT = (OOM, STALLED)
_SAYS = {OOM: "OOM-killed", STALLED: "stalled (thrashing or timed out)"}
CAPACITY_STEPS = 4
"""Steps a capacity probe trains by default. Stock's and tuned's glibc heap can grow again in step 3 at depth: tuned
at 30-32 layers, seq 2048, fp32 under 8 GiB peaked in step 3's backward in 8 of the 9 runs that trained 4 steps, and
one at 33 layers trained 2 steps and was OOM-killed in step 3 (docs/bench/capacity/cap8gib-layers-fp32-tuned-repeat3-
steps4; docs/bench/heap-depth-tuned-seq2048-steps3-fp32: +0.64 GiB of heap in step 3 at 32 layers), so a 2-step probe
can say "fits" for a job a longer run OOM-kills. memascend's peak repeats from step 2 on."""
DISK_KEEP_FREE_BYTES = 8 * GiB
"""SSD space the probes leave free on the file system they use (other users of the machine)."""
PROBE_START_S = 240.0
"""A probe's time limit before its steps: settle, imports, zero.Init and the region's first writes (a few minutes at
billion scale on the 2-core reference machine)."""
PROBE_STEP_SLACK = 3.0
"""A probe's steps may take this many times the plan's s/step (startup counted as one more step) before it reads
'stalled': a job crawling at its cap re-reads its evicted libraries from disk (major faults) for hours without an
OOM kill, which is 'does not fit' to a user; the plan's step time is within tens of percent (docs/results/time.md)."""
PROBE_TIMEOUT_FALLBACK_S = 3600.0
"""A probe's time limit where the plan has no step time."""
PROBE_TIMEOUT_RULE = (f"{PROBE_START_S:.0f} s plus {PROBE_STEP_SLACK:g} x the plan's s/step for each step and one "
                      "more")
"""probe_timeout_s in words, for --probe-timeout's help and capacity.json's notes."""


@dataclass(frozen=True)
class Grid:
    """The values an axis is searched on: first, first + step, ... last."""

    axis: str
    first: int
    step: int
    last: int
    unit: str

    def index(self, value: int) -> int:
        if value < self.first or value > self.last or (value - self.first) % self.step:
            raise ValueError(f"{value} is not on the {self.axis} grid ({self.first}, {self.first + self.step}, ... "
                             f"{self.last})")
        return (value - self.first) // self.step

    def value(self, index: int) -> int:
        return self.first + index * self.step

    @property
    def size(self) -> int:
        return self.index(self.last) + 1


def grid(axis: str) -> Grid:
    """The planner search's grid of `axis` (planner/search.py), so a planned and a measured maximum compare."""
    if axis == "layers":
        return Grid("layers", 1, 1, search.MAX_LAYERS, "layers")
    if axis == "seq":
        return Grid("seq", search.SEQ_GRANULE, search.SEQ_GRANULE,
                    search.MAX_SEQ_TOKENS // search.SEQ_GRANULE * search.SEQ_GRANULE, "tokens")
    if axis == "micro-batch":
        return Grid("micro-batch", 1, 1, search.MAX_MICRO_BATCH, "sequences")
    raise ValueError(f"unknown axis {axis!r}; axes are {', '.join(AXES)}")


def with_value(axis: str, job, value: int):
    """The planner's job (planner.memory.JobSpec) with `axis` set to `value`."""
    if axis == "layers":
        return replace(job, model=job.model.scaled(value))
    return replace(job, seq_len=value) if axis == "seq" else replace(job, micro_batch=value)


# --- the plan under the cap ---------------------------------------------------------------------------------------


def planned_max(axis: str, job, hw_cap, engine: str) -> tuple[int | None, str]:
    """The planner search's largest value of `axis` under `hw_cap` (the cap as the node's DRAM, nothing reserved for the
    OS: the cgroup holds only the job) and what binds it (search.RESOURCES or GRID_END)."""
    if axis == "layers":
        model, binding = search.max_layers(job, hw_cap, engine)
        return (model.num_hidden_layers if model is not None else None), binding
    if axis == "seq":
        return search.max_seq_len(job, hw_cap, engine)
    return search.max_micro_batch(job, hw_cap, engine)


def ceiling(g: Grid, need_bytes_at, usable_bytes: int) -> tuple[int | None, str]:
    """The largest grid value whose SSD space `need_bytes_at(value)` (monotone in the value) fits in `usable_bytes`
    (None: not even the first), and why the probes stop there: the grid's end, or the SSD space of the next value."""
    def fits(i: int) -> bool:
        return need_bytes_at(g.value(i)) <= usable_bytes

    last = g.size - 1
    if fits(last):
        return g.last, f"grid end ({g.last} {g.unit})"
    lo, hi = -1, last  # fits(lo) (or lo = -1), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    nxt = g.value(hi)
    why = (f"SSD space ({nxt} {g.unit} needs {need_bytes_at(nxt) / GiB:.1f} GiB, {usable_bytes / GiB:.1f} GiB usable "
           f"with {DISK_KEEP_FREE_BYTES / GiB:.0f} GiB left free)")
    return (g.value(lo) if lo >= 0 else None), why


# --- the probe sequence -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conclusion:
    measured_max: int | None
    """The largest value that trained under the cap; None when nothing did."""
    at_least: bool
    """The search stopped at a ceiling (grid end, SSD space) or at a failed probe: the true maximum may be larger."""
    reason: str


def next_probe(g: Grid, start: int | None, top: int | None, top_reason: str,
               results: list[tuple[int, str]]) -> int | Conclusion:
    """The next value to probe given the (value, outcome) results so far, or the search's conclusion.

    start: the plan's maximum (None: the grid's first value); top: the largest value the probes may try (ceiling()),
    top_reason: why. Gallops up from the largest fit and down from the smallest OOM kill, doubling the distance from
    `start`, and bisects once both are known."""
    if top is None:
        return Conclusion(None, False, f"not probed: {top_reason}")
    by_index = {g.index(v): o for v, o in results}
    failed = [v for v, o in results if o == FAILED]
    fits = [i for i, o in by_index.items() if o == FIT]
    ooms = [i for i, o in by_index.items() if o in DOES_NOT_FIT]
    lo, hi = max(fits, default=None), min(ooms, default=None)
    killed = "" if hi is None else f"{_SAYS[by_index[hi]]} at {g.value(hi)}"
    best = None if lo is None else g.value(lo)
    if failed:
        return Conclusion(best, True, f"the probe at {failed[0]} failed (not an OOM kill)")
    if lo is not None and hi is not None:
        if hi < lo:
            return Conclusion(best, True, f"not monotone: {killed}, below a fit at {best}")
        if hi == lo + 1:
            return Conclusion(best, False, killed)
        return g.value((lo + hi) // 2)
    c = g.index(top)
    s = min(c, g.index(start)) if start is not None else 0
    if lo is None and hi is None:
        return g.value(s)
    if hi is None:
        if lo >= c:
            return Conclusion(best, True, top_reason)
        return g.value(min(c, lo + max(1, lo - s + 1)))
    if hi == 0:
        return Conclusion(None, False, f"{killed}, the grid's first value")
    return g.value(max(0, hi - max(1, s - hi + 1)))


def probe_timeout_s(planned_s_per_step: float | None, steps: int) -> float:
    """A probe's time limit from the plan's step time: PROBE_START_S plus PROBE_STEP_SLACK x (steps + 1) steps;
    PROBE_TIMEOUT_FALLBACK_S without a predicted step time. Pure."""
    if not planned_s_per_step:
        return PROBE_TIMEOUT_FALLBACK_S
    return round(PROBE_START_S + PROBE_STEP_SLACK * (steps + 1) * planned_s_per_step, 1)


def outcome(run: dict) -> str:
    """FIT, OOM, STALLED or FAILED of a bench run (runner.RunResult.to_dict())."""
    if run["ok"]:
        return FIT
    if run.get("oom_killed"):
        return OOM
    return STALLED if run.get("timed_out") or run.get("thrashed") else FAILED


def within_one_step(g: Grid, planned: int | None, c: Conclusion) -> bool | None:
    """Whether the plan's maximum is within one grid step of the measured one (None for nothing fits, one below the
    grid's first value). At a ceiling the measured value is a lower bound: the plan is within when it is not below
    it by more than one step. None when a probe failed."""
    if c.at_least and c.reason.startswith(("the probe at", "not monotone")):
        return None
    p = -1 if planned is None else g.index(planned)
    m = -1 if c.measured_max is None else g.index(c.measured_max)
    return p >= m - 1 if c.at_least else abs(p - m) <= 1


# --- the document -------------------------------------------------------------------------------------------------


def probe_repeats(run: dict) -> int:
    """How many runs a probe's bench run stands for (bench --repeat; runner.median_run lists them). Pure."""
    return len(run.get("repeats") or [run])


def repeat_rss(run: dict) -> list[int] | None:
    """ru_maxrss of each run of a probe of several runs (bench --repeat), in run order; None for one run. Pure."""
    runs = run.get("repeats") or []
    return [r.get("ru_maxrss_bytes") for r in runs] if len(runs) > 1 else None


def probe_record(value: int, run: dict, document: str, sitting: str | None = None) -> dict:
    """One probe of the summary: the value, its outcome and peaks (cgroup's own, system-wide), the plan there, how
    many of its repeats fit; `sitting`: when the bench command that ran it started (a resumed search reuses earlier
    sittings' probes)."""
    cg = run.get("cgroup") or {}
    runs = run.get("repeats") or [run]
    return {"value": value, "sitting": sitting, "outcome": outcome(run), "error": run.get("error"),
            "repeats": len(runs), "repeats_fit": sum(bool(r["ok"]) for r in runs),
            "steps_done": len(run["losses"]),
            "cgroup_peak_bytes": cg.get("peak_bytes"), "peak_system_bytes": run.get("peak_system_bytes"),
            "ru_maxrss_bytes": run.get("ru_maxrss_bytes"), "ru_maxrss_each_bytes": repeat_rss(run),
            "planned_peak_bytes": (run.get("predicted") or {}).get("node_host_peak_bytes"),
            "seconds_per_step": run.get("seconds_per_step"), "wall_s": run.get("wall_s"), "document": document}


def job_mismatch(stored: dict, expected: dict) -> str | None:
    """The first field of `expected` (what makes a probe the same job: runner.Point.job_identity and the cap) in which
    a stored probe's job differs, as 'key: stored, not expected'; None when it is the same job. Pure."""
    for key in expected:
        if stored.get(key) != expected.get(key):
            return f"{key}: {stored.get(key)!r}, not {expected.get(key)!r}"
    return None


def killed_where_planned_to_fit(probes: list[dict], planned: int | None) -> list[int]:
    """The probes that did not fit at or below the plan's maximum `planned`: jobs the plan says fit."""
    if planned is None:
        return []
    return [q["value"] for q in probes if q["outcome"] in DOES_NOT_FIT and q["value"] <= planned]


def engine_entry(run_name: str, mode: str, g: Grid, planned: tuple[int | None, str], top: tuple[int | None, str],
                 probes: list[dict], c: Conclusion) -> dict:
    """Per engine: the plan's maximum under the cap and what binds it, the probes' ceiling, every probe, the measured
    maximum, whether it is a lower bound and why the search stopped."""
    p_max, binding = planned
    return {"name": run_name, "mode": mode, "planned_max": p_max,
            "planned_binding": search.RESOURCE_NAMES.get(binding, binding), "ceiling": top[0],
            "ceiling_reason": top[1], "measured_max": c.measured_max, "at_least": c.at_least, "reason": c.reason,
            "within_one_step": within_one_step(g, p_max, c),
            "killed_where_planned_to_fit": killed_where_planned_to_fit(probes, p_max),
            "probes": probes}


def capacity_document(*, g: Grid, cap_bytes: int, job: dict, hardware: dict, disk: dict, engines: list[dict],
                      notes: list[str]) -> dict:
    return {"schema_version": SCHEMA_VERSION, "kind": "capacity", "axis": g.axis,
            "grid": {"first": g.first, "step": g.step, "last": g.last, "unit": g.unit}, "dram_cap_bytes": cap_bytes,
            "job": job, "hardware": hardware, "disk": disk, "engines": engines, "notes": notes}


def fmt_max(value: int | None, at_least: bool = False) -> str:
    return "none fits" if value is None else ("at least " if at_least else "") + str(value)


def _yes_no(x: bool | None, markdown: bool = False) -> str:
    return "-" if x is None else ("yes" if x else ("**no**" if markdown else "no"))


TABLE_COLUMNS = ("engine", "planned max (binds)", "measured max", "why it stopped", "probes", "within one step")


def table_rows(doc: dict) -> list[list[str]]:
    """One row per engine, in TABLE_COLUMNS order."""
    rows = []
    for e in doc["engines"]:
        probes = ", ".join(f"{q['value']} {'fit' if q['outcome'] == FIT else q['outcome'].upper()}"
                           for q in e["probes"])
        rows.append([e["name"], f"{fmt_max(e['planned_max'])} ({e['planned_binding']})",
                     fmt_max(e["measured_max"], e["at_least"]), e["reason"], probes or "-",
                     _yes_no(e["within_one_step"])])
    return rows


RESULTS_COLUMNS = ("DRAM cap GiB", "axis", "engine", "planned max", "measured max", "within one grid step",
                   "today's plan", "probes (value: outcome, cgroup peak / ru_maxrss GiB)")


def replanned_max(doc: dict, engine: dict, probe: dict) -> int | None:
    """Today's planner on a recorded table: the plan's maximum of `engine` (an entry of doc["engines"]) under the
    document's cap, for the job and config its probe `probe` (that probe's bench.json) ran, bound by the SSD ceiling
    the search recorded. Pure."""
    from memascend_cli.bench.configs import recorded_hardware, recorded_plan_job

    job, planned_engine = recorded_plan_job(probe, probe["runs"][0])
    hw = recorded_hardware(probe).under_dram_cap(doc["dram_cap_bytes"])
    planned, _ = planned_max(doc["axis"], job, hw, planned_engine)
    top = engine.get("ceiling")
    return planned if planned is None or top is None else min(planned, top)


def results_section(docs: list[tuple[str, dict]], today: dict[str, dict[str, int | None]] | None = None,
                    steps: dict[str, dict[str, int]] | None = None) -> str:
    """docs/results/capacity.md's "Capacity under a DRAM cap": one table per document (one sitting); "" without any.
    today: {path: {engine: today's planned maximum (replanned_max)}}; steps: {path: {engine: the memory one grid step
    adds at its measured maximum (step_cost_bytes)}}."""
    steps = steps or {}
    if not docs:
        return ""
    out = ["## Capacity under a DRAM cap", "",
           "`memascend bench --capacity AXIS --dram-cap X`: per engine, the plan's largest value of the axis under the "
           "cap (the cap as the node's DRAM) and the largest value that trained every step in a memory cgroup of the "
           "cap, probed from the plan's value up after a fit and down after an OOM kill until a value fits and the "
           "next grid value is OOM-killed. \"At least\" marks a search that stopped at the grid's end, the SSD space "
           "or a failed run. The grids are the planner search's (layers 1, 2, ...; seq multiples of "
           f"{search.SEQ_GRANULE}; micro-batch 1, 2, ...). \"Today's plan\" is the current planner's maximum for "
           "the same job and cap, beside the one the search started from; a probe at or below it that did not fit is "
           "named there (the plan said that job fits). A probe of several runs (`--repeat`) gives the lowest-highest "
           "ru_maxrss of its runs.", ""]
    for path, doc in docs:
        g = grid(doc["axis"])
        j, meta = doc["job"], doc.get("meta") or {}
        cap = f"{doc['dram_cap_bytes'] / GiB:.2f}"
        fixed = ", ".join(f"{k.replace('_', ' ')} {j[k]}" for k in ("layers", "seq_len", "micro_batch")
                          if j.get(k) is not None)  # the searched axis is None
        command = f"`{meta.get('command', '?')}`"
        if "--steps" not in command and j["steps"] != CAPACITY_STEPS:
            command += f" (run when the default was --steps {j['steps']})"
        out += [f"### {meta.get('title') or sitting_title(doc)}", "", command, "",
                f"{j['model']}, {fixed}, {j['steps']} steps, {j['dtype']}, checkpointing {j['checkpointing']}, "
                f"{j['ranks']} rank(s), tuned and memascend loss {j.get('loss', 'hf')} (stock: hf)"
                + (f", {j['repeat']} runs per probe (fits when all fit)" if j.get("repeat", 1) > 1 else "") + "; "
                f"{_when(doc)}, host `{meta.get('host', '?')}`. Raw: `{path}`.", "",
                "| " + " | ".join(RESULTS_COLUMNS) + " |", "|" + "---|" * len(RESULTS_COLUMNS)]
        for e in doc["engines"]:
            probes = "; ".join(f"{q['value']}: {q['outcome']}" + _repeats_cell(q)
                               + ("" if q["cgroup_peak_bytes"] is None else f" {q['cgroup_peak_bytes'] / GiB:.2f}")
                               + _rss_cell(q) for q in e["probes"])
            out.append("| " + " | ".join([cap, doc["axis"], e["name"], fmt_max(e["planned_max"]) +
                                          f" ({e['planned_binding']})", fmt_max(e["measured_max"], e["at_least"]) +
                                          f" ({e['reason']})", _yes_no(e["within_one_step"], True),
                                          _today(g, (today or {}).get(path, {}), e), probes or "-"]) + " |")
        by = {e["name"]: e for e in doc["engines"]}
        mem, tuned = by.get("memascend"), by.get("tuned")
        if mem and tuned and mem["measured_max"] and tuned["measured_max"]:
            out += ["", f"memascend's measured maximum is {'at least ' if mem['at_least'] else ''}"
                        f"{mem['measured_max'] / tuned['measured_max']:.1f}x tuned stock's "
                        f"({fmt_max(mem['measured_max'], mem['at_least'])} vs "
                        f"{fmt_max(tuned['measured_max'], tuned['at_least'])})."]
        mem_step = steps.get(path, {}).get("memascend")
        out += context_ceiling_lines(doc, mem_step // g.step if mem_step else None)
        out.append("")
    out += noise_section(docs, steps)
    out += agreement_section(docs, today or {})
    return "\n".join(out) + "\n"


NOISE_INTRO = (
    "A plan within one grid step of the measured maximum and never above it has to be right to less than the memory "
    "one grid step adds. Where an engine's own peak for one job differs between its runs by more than that (a probe "
    "of several runs that all fit, `--repeat`: their ru_maxrss, which the cap clips, so the spread is a lower bound), "
    "no plan can be both: which grid value fits moves from run to run. One grid step: today's plan one step above "
    "the measured maximum less the plan at it.")


def step_cost_bytes(axis: str, job, hw_cap, engine: str, value: int) -> int:
    """Host memory per node that one grid step above `value` adds in the plan (planner.memory.estimate). Pure."""
    from memascend_cli.planner.memory import estimate

    def peak(v: int) -> int:
        return estimate(with_value(axis, job, v), hw_cap, engine).node_host_peak_bytes

    return peak(value + grid(axis).step) - peak(value)


def largest_spread(probes: list[dict]) -> tuple[int, int] | None:
    """(bytes, value): the largest difference of ru_maxrss between the runs of one probe of several runs that all fit
    (one job's run-to-run variation) and that probe's value; None without such a probe. Pure."""
    spreads = []
    for q in probes:
        each = [b for b in q.get("ru_maxrss_each_bytes") or [] if b is not None]
        if q["outcome"] == FIT and len(each) > 1:
            spreads.append((max(each) - min(each), q["value"]))
    return max(spreads, default=None)


def noise_section(docs: list[tuple[str, dict]], steps: dict[str, dict[str, int]]) -> list[str]:
    """"One grid step against the run-to-run spread": a row per document and engine with a probe of several runs.
    steps: {path: {engine: step_cost_bytes at its measured maximum}}."""
    cols = ("DRAM cap GiB", "axis", "engine", "measured max", "one grid step GiB", "run-to-run spread GiB (at)",
            "spread in grid steps", "document")
    rows = []
    for path, doc in docs:
        for e in doc["engines"]:
            spread, step = largest_spread(e["probes"]), steps.get(path, {}).get(e["name"])
            if spread is None or not step:
                continue
            rows.append([f"{doc['dram_cap_bytes'] / GiB:.2f}", doc["axis"], e["name"],
                         fmt_max(e["measured_max"], e["at_least"]), f"{step / GiB:.3f}",
                         f"{spread[0] / GiB:.3f} ({spread[1]})", f"{spread[0] / step:.1f}",
                         f"`{path.split('/')[-2]}`"])
    if not rows:
        return []
    return (["### One grid step against the run-to-run spread", "", NOISE_INTRO, "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            + ["| " + " | ".join(r) + " |" for r in rows] + [""])


def plans_meeting_both(g: Grid, conclusions: list[Conclusion], probes: list[dict]) -> list[int | None] | None:
    """The planned maxima (None: nothing fits) within one grid step of every sitting's measured maximum and at or
    below no probe of any of them that did not fit; None when no sitting concluded (a failed probe). Pure.

    Empty where the sittings of one job disagree by more than one grid step and allow no safe plan between them."""
    judged = [c for c in conclusions if within_one_step(g, None, c) is not None]
    if not judged:
        return None
    top = max(-1 if c.measured_max is None else g.index(c.measured_max) for c in judged) + 1
    candidates = [None] + [g.value(i) for i in range(min(top, g.size - 1) + 1)]
    return [p for p in candidates
            if all(within_one_step(g, p, c) for c in judged) and not killed_where_planned_to_fit(probes, p)]


AGREEMENT_COLUMNS = ("DRAM cap GiB", "axis", "engine", "steps", "sittings' measured max", "did not fit (any run)",
                     "plans meeting both", "today's plan")


def _span(values: list[int | None], step: int, open_end: bool = False) -> str:
    """Grid values as ranges, 'none fits, 1-3, 7'; open_end: the last range goes on ('7 or more'). Pure."""
    if not values:
        return "**none**"
    parts, nums = (["none fits"] if None in values else []), sorted(v for v in values if v is not None)
    run: list[int] = []
    for v in nums + [None]:
        if run and (v is None or v - run[-1] != step):
            parts.append(f"{run[0]} or more" if open_end and v is None else
                         str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run = []
        if v is not None:
            run.append(v)
    return ", ".join(parts)


def agreement_section(docs: list[tuple[str, dict]], today: dict[str, dict[str, int | None]]) -> list[str]:
    """"Every sitting of one job against one plan": per cap, axis, engine and job (all its sittings, each with its
    own probes), the planned maxima that would be within one grid step of each sitting's measured maximum and never
    above a probe that did not fit, and today's plan against them. today: as results_section's. Pure."""
    groups: dict[tuple, list[tuple[str, dict]]] = {}
    for path, doc in docs:
        j = doc["job"]
        for e in doc["engines"]:
            key = (doc["dram_cap_bytes"], doc["axis"], e["name"], j["model"], j.get("layers"), j.get("seq_len"),
                   j.get("micro_batch"), j["steps"], j["dtype"], j.get("loss", "hf"), j["checkpointing"], j["ranks"])
            groups.setdefault(key, []).append((path, e))
    rows = []
    for key, entries in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        cap, axis, name, steps = key[0], key[1], key[2], key[7]
        g = grid(axis)
        conclusions = [Conclusion(e["measured_max"], e["at_least"], e["reason"]) for _, e in entries]
        probes = [q for _, e in entries for q in e["probes"]]
        meeting = plans_meeting_both(g, conclusions, probes)
        if meeting is None:
            continue
        largest = max(conclusions, key=lambda c: -1 if c.measured_max is None else g.index(c.measured_max))
        # a lower bound at the top (a ceiling, no probe above it): every larger plan meets both too
        open_end = largest.at_least and meeting and meeting[-1] == g.value(g.index(largest.measured_max) + 1)
        failed = sorted({q["value"] for q in probes if q["outcome"] in DOES_NOT_FIT})
        plans = sorted({today[path][name] for path, _ in entries if name in today.get(path, {})}, key=str)
        todays = ", ".join(fmt_max(p) + ("" if p in meeting else " (**does not**)") for p in plans) or "-"
        rows.append([f"{cap / GiB:.2f}", axis, name, str(steps),
                     ", ".join(fmt_max(c.measured_max, c.at_least) for c in conclusions),
                     ", ".join(map(str, failed)) or "-", _span(meeting, g.step, open_end), todays])
    if not rows:
        return []
    return (["### Every sitting of one job against one plan", "",
             "All the sittings of one job (cap, axis, engine, steps) together: the planned maxima that are within one "
             "grid step of every sitting's measured maximum and at or below no probe that did not fit in any of its "
             "runs, in any sitting. \"none\" means no plan can meet both on the recorded runs: the sittings disagree "
             "by more than one grid step.", "",
             "| " + " | ".join(AGREEMENT_COLUMNS) + " |", "|" + "---|" * len(AGREEMENT_COLUMNS)]
            + ["| " + " | ".join(r) + " |" for r in rows] + [""])


def context_ceiling_lines(doc: dict, per_token_bytes: int | None) -> list[str]:
    """For a context table with memascend's and tuned stock's measured maxima: the longest context the cap could hold
    at memascend's planned bytes per token with no fixed host memory at all, against tuned stock's measured maximum
    (on a CPU rank every token's activations and loss live in host DRAM, for both engines). Pure."""
    by = {e["name"]: e for e in doc["engines"]}
    tuned = by.get("tuned")
    if doc["axis"] != "seq" or not per_token_bytes or not tuned or not tuned["measured_max"]:
        return []
    g = grid("seq")
    tokens = doc["dram_cap_bytes"] // per_token_bytes // g.step * g.step
    return ["", f"memascend's plan adds {per_token_bytes / 1024:.0f} KiB of host memory per token at its measured "
                f"maximum: with no fixed host memory at all the cap would hold at most {tokens} tokens, "
                f"{tokens / tuned['measured_max']:.1f}x tuned stock's measured maximum."]


def _rss_cell(q: dict) -> str:
    """' / ru_maxrss' in GiB; for a probe of several runs the lowest-highest of its runs (their spread is the
    engine's run-to-run variation at that job)."""
    each = [b for b in q.get("ru_maxrss_each_bytes") or [] if b is not None]
    low, high = (f"{f(each) / GiB:.2f}" for f in (min, max)) if len(each) > 1 else ("", "")
    if low != high:
        return f" / {low}-{high}"
    return "" if q.get("ru_maxrss_bytes") is None else f" / {q['ru_maxrss_bytes'] / GiB:.2f}"


def _repeats_cell(q: dict) -> str:
    """' (k of n fit)' for a probe of several runs (bench --capacity --repeat), ' (all n)' when it fit, else ''."""
    n = q.get("repeats", 1)
    if n == 1:
        return ""
    return f" (all {n})" if q["outcome"] == FIT else f" ({q['repeats_fit']} of {n} fit)"


def sittings(engines: list[dict]) -> list[str]:
    """When the bench commands that ran the engines' probes started: more than one for a resumed search."""
    return sorted({q["sitting"] for e in engines for q in e["probes"] if q.get("sitting")})


def sitting_title(doc: dict) -> str:
    """A capacity sitting in words, for one recorded without --title: model, axis, cap, engines, runs and day. Pure."""
    j = doc["job"]
    axis = {"layers": "depth", "seq": "context"}.get(doc["axis"], doc["axis"])
    cap_gib = doc["dram_cap_bytes"] / GiB
    return (f"{j['model']}: the largest {axis} under a DRAM cap of {cap_gib:.2f} GiB, {j['dtype']}, "
            + ", ".join(e["name"] for e in doc["engines"])
            + (f", {j['repeat']} runs per probe" if j.get("repeat", 1) > 1 else "")
            + f", {j['steps']} steps, {((doc.get('meta') or {}).get('date') or '?')[:10]}")


def _when(doc: dict) -> str:
    """The sitting's date, or the dates of the sittings a resumed search's probes come from."""
    sittings_ = sittings(doc["engines"])
    if len(sittings_) > 1:
        return "resumed: probes of the sittings started " + ", ".join(sittings_)
    return (doc.get("meta") or {}).get("date", "?")


def _today(g: Grid, planned_by_engine: dict, e: dict) -> str:
    """Today's planned maximum of engine entry `e`, whether it is within one grid step of the measured one, and the
    smallest probe OOM-killed (or stalled) at or below it: a job that plan says fits and that did not."""
    if e["name"] not in planned_by_engine:
        return "-"
    planned = planned_by_engine[e["name"]]
    within = within_one_step(g, planned, Conclusion(e["measured_max"], e["at_least"], e["reason"]))
    killed = killed_where_planned_to_fit(e.get("probes", []), planned)
    unsafe = f"; {min(killed)} did not fit" if killed else ""
    return f"{fmt_max(planned)} ({'within' if within else 'off' if within is False else '-'}{unsafe})"

