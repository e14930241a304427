"""The optimizer overlap and bf16 moments on a real fine-tune: `memascend train` runs of the real SmolLM2-135M-Instruct
on real text (benchmarks/real_sft.yaml), collected into one raw JSON document, and its tables for docs/results/.

    python scripts/make_pydoc_sft_data.py --out /var/tmp/i62/pydoc-sft.jsonl
    memascend train benchmarks/real_sft.yaml --placement dram --output-dir /var/tmp/i62/fp32
    memascend train benchmarks/real_sft.yaml --placement dram --set optimizer_moments=bf16 --output-dir /var/tmp/i62/bf16
    memascend train benchmarks/real_sft.yaml --placement ssd --output-dir /var/tmp/i62/ssd-overlap-on
    memascend train benchmarks/real_sft.yaml --placement ssd --set overlap_optimizer=false \
        --output-dir /var/tmp/i62/ssd-overlap-off
    python benchmarks/real_sft_report.py --quality fp32 bf16 --speed ssd-overlap-on ssd-overlap-off \
        --loadavg /var/tmp/i62/loadavg.log --out docs/bench/real-sft/smollm2-pydoc.json.gz /var/tmp/i62/{fp32,bf16,...}

A run of another recipe (e.g. presets/train/smollm2-sft.yaml, whose templated answers the model learns in a few dozen
steps, so that its gradient norms fall below the clipping limit) is named `DIR:RECIPE AND FLAGS`, and a second
--speed pair compares it with and without the overlap.

Per step: the training loss, the gradient norm before clipping, what the overlap did (memascend_engine.overlap's
counters, cumulative in each step's engine_stats: one code per step, OUTCOME_CODES), s/step and tokens/s; the
validation losses. The quality pair is compared by benchmarks/moments_quality.compare; the speed pair (the same job
with and without the overlap, run at the same time so that both see the same contention) by its median tokens/s.
A run stopped early (SIGTERM: a checkpoint, exit 75) counts the steps it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

from memascend_cli.bench.document import write_summary

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moments_quality import compare  # noqa: E402

OUTCOME_CODES = {"steps_committed": "c", "steps_redone": "r", "steps_rolled_back": "b", "steps_not_speculated": "s"}
"""One letter per step: committed, redone, rolled back, not speculated (the previous step clipped); '-' without the
overlap."""
WINDOW_STEPS = 100
"""Steps per row of the loss-curve summary."""


def outcomes(steps: list[dict]) -> str:
    """The overlap's outcome of each step record, from the growth of its cumulative counters (they start again from 0
    in the process that resumes a run). Pure."""
    out, prev = [], dict.fromkeys(OUTCOME_CODES, 0)
    for rec in steps:
        counters = (rec.get("engine_stats") or {}).get("overlap")
        if counters is None:
            out.append("-")
            continue
        if any(counters[k] < prev[k] for k in OUTCOME_CODES):
            prev = dict.fromkeys(OUTCOME_CODES, 0)
        grown = [code for key, code in OUTCOME_CODES.items() if counters[key] > prev[key]]
        out.append(grown[0] if len(grown) == 1 else "?")
        prev = {k: counters[k] for k in OUTCOME_CODES}
    return "".join(out)


def summarize(records: list[dict], engine: dict, loads: list[tuple[float, float]]) -> dict:
    """One run's compact document from its metrics records, engine.json and the load samples (time, 1-min load). Pure."""
    steps = [r for r in records if r["event"] == "step"]
    t0, t1 = steps[0]["time"] - steps[0]["s_per_step"], steps[-1]["time"]
    during = [load for t, load in loads if t0 <= t <= t1]
    return {"placement": "dram" if engine.get("dram_tier_gib") else "ssd",
            "overlap_optimizer": bool(engine.get("overlap_optimizer")),
            "optimizer_moments": engine.get("optimizer_moments", "fp32"),
            "steps": len(steps),
            "loss": [round(r["loss"], 5) for r in steps],
            "grad_norm": [None if r.get("grad_norm") is None else round(r["grad_norm"], 4) for r in steps],
            "s_per_step": [round(r["s_per_step"], 3) for r in steps],
            "tokens_per_s": [round(r["tokens_per_s"], 2) for r in steps],
            "outcome": outcomes(steps), "resumed_at": [r["step"] for r in records if r["event"] == "resumed"],
            "validation": [{"step": r["step"], "loss": round(r["loss"], 5)} for r in records if r["event"] == "eval"],
            "loadavg_1min": None if not during else {"min": min(during), "median": statistics.median(during),
                                                     "max": max(during), "samples": len(during)}}


def overlap_counts(run: dict, clip: float) -> dict:
    """What the overlap did over a run, the steps that clipped, and the median s/step of each outcome. Pure."""
    codes = run["outcome"]
    by = {}
    for code in sorted(set(codes)):
        s = [t for t, c in zip(run["s_per_step"][1:], codes[1:]) if c == code]  # the first step also sets up
        by[code] = {"steps": codes.count(code), "median_s_per_step": round(statistics.median(s), 3) if s else None}
    norms = [g for g in run["grad_norm"] if g is not None]
    return {"steps": run["steps"], "clipped": sum(g > clip for g in norms), "median_grad_norm": statistics.median(norms),
            "by_outcome": by}


def speed(on: dict, off: dict) -> dict:
    """Median tokens/s with and without the overlap over the steps both ran, the first left out. Pure."""
    n = min(on["steps"], off["steps"])
    a, b = statistics.median(on["tokens_per_s"][1:n]), statistics.median(off["tokens_per_s"][1:n])
    return {"steps": n - 1, "with_overlap": round(a, 2), "without_overlap": round(b, 2), "ratio": round(a / b, 3)}


def curve(run: dict, window: int = WINDOW_STEPS) -> list[dict]:
    """The mean training loss of each `window` steps. Pure."""
    xs = run["loss"]
    return [{"first": i + 1, "last": min(i + window, len(xs)), "mean_loss": round(statistics.fmean(xs[i:i + window]), 5)}
            for i in range(0, len(xs), window)]


def _records(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _loads(path: str | None) -> list[tuple[float, float]]:
    """Samples `date +%s; cat /proc/loadavg` lines: (epoch seconds, 1-minute load)."""
    if not path:
        return []
    with open(path) as f:
        return [(float(p[0]), float(p[1])) for p in (line.split() for line in f) if len(p) >= 2]


def _machine() -> dict:
    with open("/proc/meminfo") as f:
        mem_kib = int(next(line.split()[1] for line in f if line.startswith("MemTotal:")))
    return {"host": platform.node(), "cpus": os.cpu_count(), "mem_gib": round(mem_kib / 2**20, 1),
            "python": platform.python_version()}


def command(run_dir: str, run: dict, recipe: str) -> str:
    """The `memascend train` command line that reproduces the run (what differs from the recipe: placement, overlap,
    moments)."""
    sets = ([] if run["overlap_optimizer"] else ["--set overlap_optimizer=false"]) + (
        [] if run["optimizer_moments"] == "fp32" else [f"--set optimizer_moments={run['optimizer_moments']}"])
    return " ".join(["memascend train", recipe, "--placement", run["placement"], *sets, "--output-dir", run_dir])


def _job(run_dir: str) -> tuple[dict, dict]:
    """The run's recipe.json and data.json."""
    with open(os.path.join(run_dir, "recipe.json")) as f, open(os.path.join(run_dir, "data.json")) as g:
        return json.load(f), json.load(g)


def collect(run_args: list[str], quality: list[str], speed_pairs: list[list[str]], loadavg: str | None,
            recipe: str) -> dict:
    """`run_args`: run directories, each optionally followed by `:RECIPE` (the recipe and flags its command starts
    with, when not `recipe`)."""
    loads = _loads(loadavg)
    runs, dirs = {}, {}
    for arg in run_args:
        d, _, own = arg.partition(":")
        with open(os.path.join(d, "engine.json")) as f:
            engine = json.load(f)
        name = os.path.basename(d.rstrip("/"))
        runs[name] = run = summarize(_records(d), engine, loads)
        dirs[name] = d
        run["command"] = command(d, run, own or recipe)
        rr, _ = _job(d)
        run["job"] = {"data": os.path.basename(rr["dataset"]["path"]), "seq_len": rr["seq_len"],
                      "micro_batch": rr["micro_batch"], "max_grad_norm": rr["max_grad_norm"]}
    r, data = _job(dirs[quality[0]])
    q32, q16 = runs[quality[0]], runs[quality[1]]
    n = min(q32["steps"], q16["steps"])
    return {"what": "SmolLM2-135M-Instruct fine-tuned on real text by `memascend train`: the optimizer overlap's "
                    "outcomes, tokens/s with and without it, bf16 against fp32 moments (benchmarks/real_sft_report.py)",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": _machine(),
            "recipe": {k: r[k] for k in ("seq_len", "micro_batch", "grad_accum", "steps", "lr", "max_grad_norm",
                                         "schedule", "precision", "seed", "eval_every")},
            "data": {"path": r["dataset"]["path"], "train_sequences": data.get("train_sequences"),
                     "validation_sequences": data.get("validation_sequences"),
                     "made_by": "python scripts/make_pydoc_sft_data.py --out " + r["dataset"]["path"]},
            "runs": runs,
            "overlap": {name: overlap_counts(run, run["job"]["max_grad_norm"]) for name, run in runs.items()
                        if run["overlap_optimizer"]},
            "speed": [{"with": a, "without": b, **speed(runs[a], runs[b])} for a, b in speed_pairs],
            "quality": {"fp32": quality[0], "bf16": quality[1],
                        **compare(q32["loss"], q16["loss"], q32["validation"], q16["validation"]),
                        "curve": [{**a, "mean_loss_bf16": b["mean_loss"]}
                                  for a, b in zip(curve({"loss": q32["loss"][:n]}), curve({"loss": q16["loss"][:n]}))]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories of `memascend train`, each optionally followed by "
                    "`:RECIPE AND FLAGS` when its command does not start with --recipe")
    ap.add_argument("--quality", nargs=2, required=True, metavar=("FP32", "BF16"), help="run names: the moments pair")
    ap.add_argument("--speed", nargs=2, required=True, action="append", metavar=("ON", "OFF"),
                    help="run names: with / without overlap (repeatable)")
    ap.add_argument("--loadavg", help="load samples: lines of `epoch-seconds` then /proc/loadavg's fields")
    ap.add_argument("--recipe", default="benchmarks/real_sft.yaml")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    doc = collect(args.runs, args.quality, args.speed, args.loadavg, args.recipe)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_summary(args.out, doc)  # gzipped where --out ends in .gz, as the repository keeps it
    print(json.dumps({k: doc[k] for k in ("overlap", "speed")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
