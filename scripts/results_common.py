"""What every section of the results pages (docs/results.md, docs/results/*.md) uses: the folders, loading the raw
JSON, number formats, tables, the benchmark scripts' own renderings. Stdlib only (scripts/results*.py import it)."""

from __future__ import annotations

import importlib.util
import os
import sys

from memascend_cli.bench.document import read_summary, recorded_summaries
from memascend_cli.planner.time import PHASE_FORWARD_BACKWARD, PHASE_OPTIMIZER
from memascend_cli.units import GiB

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
BENCH = os.path.join(DOCS, "bench")
HISTORY = os.path.join(BENCH, "history.json")


def load(pattern: str) -> list[tuple[str, dict]]:
    """The recorded summaries `pattern` names (NAME.json, or gzipped NAME.json.gz), as (repository path, document)."""
    return [(os.path.relpath(path, REPO), read_summary(path)) for path in recorded_summaries(pattern)
            if path != HISTORY]


def load_one(path: str) -> dict | None:
    """The JSON document at `path`, or None when it was not recorded."""
    return read_summary(path) if os.path.exists(path) else None


def gib(b) -> str:
    return "-" if b is None else f"{b / GiB:.2f}"


def pct(x) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def table(header: list[str], rows: list[list[str]]) -> str:
    align = ["---"] + ["---:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def phase_seconds(run: dict, steps: int) -> dict[str, float] | None:
    """A bench run's measured forward + backward and optimizer seconds, each the mean over steps 2..`steps` (the
    bench marks each phase's start: engine/bench_job.py), keyed like planner.time's phases; None without the marks
    (gradient accumulation marks each micro-batch instead)."""
    at = {p["name"]: p["at_s"] for p in run.get("phases") or []}
    fb, opt = [], []
    for n in range(2, steps + 1):
        end = at.get(f"step{n + 1}_forward", at.get("finish"))
        if None in (at.get(f"step{n}_forward"), at.get(f"step{n}_optimizer"), end):
            return None
        fb.append(at[f"step{n}_optimizer"] - at[f"step{n}_forward"])
        opt.append(end - at[f"step{n}_optimizer"])
    return {PHASE_FORWARD_BACKWARD: sum(fb) / len(fb), PHASE_OPTIMIZER: sum(opt) / len(opt)} if fb else None


def benchmark_script(name: str):
    """A benchmark script of benchmarks/ as a module (their table functions render their own raw JSON)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "benchmarks", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod
