"""Sections of the reliability page (docs/results/reliability.md) for what a run leaves and says: the soak of runs
OOM-killed in setup under a DRAM cap, each followed by a normal run (scripts/soak_stale_lock.py), and the gaps between
`train`'s output lines in a log (benchmarks/train_output_gaps.py). Imported by scripts/results.py. Stdlib only."""

from __future__ import annotations

from results_common import load, table


def section_stale_lock(pattern: str) -> str:
    """Every soak document: the capped runs (cap, the phase each died in, its reason), the uncapped runs after them,
    the locks left; then the stale lock placed by hand and the lock held by a live process."""
    docs = load(pattern)
    if not docs:
        return ""
    out = ["## Runs killed in setup, and the run after each", "",
           "`scripts/soak_stale_lock.py`: tiny-llama benches under DRAM caps that OOM-kill the rank at different "
           "points of its setup, each followed at once by the same bench uncapped; then a stale op build lock placed by hand "
           "before a run, and a lock held by a live process while a run starts.", ""]
    for path, doc in docs:
        outcome, m = doc["capped_bars"], doc["machine"]
        out += [f"### Soak of {doc['date']} (commit {doc['commit']})", "",
                f"Raw: `{path}`; `{doc['command']}` on {m['host']} ({m['cpus']} CPUs, "
                f"{m['mem_gib']} GiB), extensions folder: {doc['extensions']}. Uncapped runs completed: "
                f"{outcome['uncapped_completed']} of {outcome['runs']}; capped runs whose reason names OOM at the "
                f"phase they died in: {outcome['reasons_name_oom_at_phase']} of {outcome['runs']}; locks left: "
                f"{len(outcome['locks_left'])}.", ""]
        rows = [[f"{c['capped']['cap_mib']} MiB", c["capped"]["died_in"] or "-", c["capped"]["reason"] or "-",
                 ", ".join(c["capped"]["locks_after"]) or "none",
                 "completed" if c["uncapped"]["ok"] else "failed", f"{c['uncapped']['wall_s']:.0f}"]
                for c in doc["capped"]]
        out += [table(["cap", "died in", "reason", "locks after", "uncapped run", "its seconds"], rows), ""]
        for key, what in (("stale", "Stale locks placed by hand"), ("live", "A lock held by a live process")):
            run = doc.get(key)
            if run:
                out += [f"- {what}: the run {'completed' if run['ok'] else 'failed'} in {run['wall_s']:.0f} s; "
                        + "; ".join(n.removeprefix("note: ") for n in run["notes"]) + "."]
        out += [""]
    return "\n".join(out) + "\n"


def section_train_output(pattern: str) -> str:
    """The seconds between `train`'s output lines in a pipe: the first line after "launching", the longest gap and
    what was between, whether the first step's line came."""
    docs = load(pattern)
    if not docs:
        return ""
    rows = [[f"`{d['command']}`", d["date"], f"{d['first_line_after_launching_s']:.1f}", f"{d['max_gap_s']:.1f}",
             "yes" if d["first_step_line"] else "no", f"`{p}`"] for p, d in docs]
    first = docs[0][1]
    return "\n".join([
        "## train's output in a log", "",
        f"`benchmarks/train_output_gaps.py` times each line `memascend train` writes to a pipe ({first['what']}); "
        f"on {first['host']}, {first['cpu_model']}. The recipes are LLaMA-Factory's full-SFT example with "
        "`logging_steps: 10` (attached to each document).", "",
        table(["command", "date", "first line after launching (s)", "longest gap (s)", "first step shown", "raw"],
              rows), ""]) + "\n"
