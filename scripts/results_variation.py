"""The capacity page's "Run-to-run variation of one job" (docs/results/capacity.md): the same bench job run several
times in one sitting without a cap (docs/bench/variation/*.json, `memascend bench --repeat N`), each run's peak against
the memory one grid step of each capacity axis adds in today's plan. Imported by scripts/results.py."""

from __future__ import annotations

from memascend_cli.bench import capacity
from memascend_cli.bench.configs import recorded_hardware, recorded_plan_job, repredict
from memascend_cli.units import GiB
from results_common import table


def _range(values: list[int]) -> str:
    return f"{min(values) / GiB:.2f}-{max(values) / GiB:.2f}"


def variation_rows(path: str, doc: dict) -> list[list[str]]:
    """A row per engine run of several repeats: its runs' peaks, their spread, today's plan and the grid steps."""
    rows = []
    j = doc["job"]
    for r in doc["runs"]:
        reps = [x for x in r.get("repeats") or [] if x["ok"]]
        if len(reps) < 2:
            continue
        job, engine = recorded_plan_job(doc, r)
        hw = recorded_hardware(doc)
        steps = {axis: capacity.step_cost_bytes(axis, job, hw, engine, value)
                 for axis, value in (("layers", j["layers"]), ("seq", j["seq_len"]), ("micro-batch", j["micro_batch"]))}
        rss = [x["ru_maxrss_bytes"] for x in reps]
        spread = max(rss) - min(rss)
        rows.append([f"`{path.split('/')[-1]}`", r["name"], str(len(reps)),
                     _range([x["peak_system_bytes"] for x in reps]), _range(rss), f"{spread / GiB:.2f}", f"{repredict(doc, r)['node_host_peak_bytes'] / GiB:.2f}"]
                    + [f"{steps[a] / GiB:.3f} ({spread / steps[a]:.1f})" for a in ("layers", "seq", "micro-batch")])
    return rows


def section_variation(docs: list[tuple[str, dict]]) -> str:
    rows = [row for path, doc in docs for row in variation_rows(path, doc)]
    if not rows:
        return ""
    commands = [f"- `{path.split('/')[-1]}`: `{(doc.get('meta') or {}).get('command', '?')}`; "
                f"{doc['job']['model']}, {doc['job']['layers']} layers, seq {doc['job']['seq_len']}, "
                f"micro-batch {doc['job']['micro_batch']}, {doc['job']['steps']} steps, {doc['job']['dtype']}; "
                f"{(doc.get('meta') or {}).get('date', '?')}, host `{(doc.get('meta') or {}).get('host', '?')}`"
                for path, doc in docs]
    return "\n".join([
        "## Run-to-run variation of one job", "",
        "The same job run several times, one run after another in one sitting, without a DRAM cap. A capacity plan "
        "that is within one grid step of the measured maximum and never above it has to be right to less than one "
        "grid step's memory (today's plan one step above the job less the plan at it; in brackets, the spread in "
        "grid steps); an engine whose own peak moves by more than that between runs of one job has no such plan.",
        "", table(["document", "engine", "runs", "peak system GiB", "ru_maxrss GiB", "spread GiB", "plan GiB",
                   "+1 layer GiB", "+256 tokens GiB", "+1 sequence GiB"], rows), "", *commands, ""]) + "\n"
