"""Quality check of memascend's bf16 Adam moments (EngineOptions.optimizer_moments): the real
SmolLM2 SFT with fp32 moments and with bf16 moments, same recipe, seed and data, loss curves side by side.

    memascend train presets/train/smollm2-sft.yaml --steps 200 --output-dir /var/tmp/smollm2-fp32m
    memascend train presets/train/smollm2-sft.yaml --steps 200 --set optimizer_moments=bf16 \
        --output-dir /var/tmp/smollm2-bf16m
    python benchmarks/moments_quality.py --fp32 /var/tmp/smollm2-fp32m --bf16 /var/tmp/smollm2-bf16m \
        --out docs/raw/smollm2-moments.json

Noise is the fp32 run's own: the standard deviation of its training loss around its centred moving average
(WINDOW steps). The bf16 curve is within noise when its moving average stays within that much of the fp32 one at
every step after the warmup window, and every validation loss within VALIDATION_TOLERANCE of fp32's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

WINDOW = 10
"""Steps of the centred moving average that separates a curve from its step-to-step noise."""
VALIDATION_TOLERANCE = 0.02
"""Largest relative difference of a validation loss (the evaluation set has a handful of sequences)."""


def _records(run: str) -> list[dict]:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _moving(xs: list[float], w: int) -> list[float | None]:
    h = w // 2
    return [statistics.fmean(xs[i - h:i + h + 1]) if h <= i < len(xs) - h else None for i in range(len(xs))]


def compare(fp32: list[float], bf16: list[float], val32: list[dict], val16: list[dict]) -> dict:
    """The verdict and its numbers. Pure."""
    n = min(len(fp32), len(bf16))
    a, b = _moving(fp32[:n], WINDOW), _moving(bf16[:n], WINDOW)
    noise = statistics.pstdev([x - m for x, m in zip(fp32[:n], a) if m is not None])
    gaps = [abs(x - y) for x, y in zip(a, b) if x is not None and y is not None]
    by_step = {v["step"]: v["loss"] for v in val16}
    val = [{"step": v["step"], "fp32": round(v["loss"], 5), "bf16": round(by_step[v["step"]], 5),
            "relative": round(by_step[v["step"]] / v["loss"] - 1, 5)} for v in val32 if v["step"] in by_step]
    within = bool(gaps) and max(gaps) <= noise and all(abs(v["relative"]) <= VALIDATION_TOLERANCE for v in val)
    return {"steps": n, "noise": round(noise, 5), "max_smoothed_gap": round(max(gaps), 5) if gaps else None,
            "mean_smoothed_gap": round(statistics.fmean(gaps), 5) if gaps else None, "validation": val,
            "final_loss": {"fp32": round(fp32[n - 1], 5), "bf16": round(bf16[n - 1], 5)},
            "within_noise": within}


def collect(fp32_run: str, bf16_run: str) -> dict:
    runs = {}
    for name, path in (("fp32", fp32_run), ("bf16", bf16_run)):
        recs = _records(path)
        steps = [r for r in recs if r["event"] == "step"]
        with open(os.path.join(path, "engine.json")) as f:
            moments = json.load(f).get("optimizer_moments", "fp32")
        if moments != name:
            raise SystemExit(f"error: {path} ran with {moments} moments, expected {name}")
        last = next((r["engine_stats"] for r in reversed(steps) if r.get("engine_stats")), {})
        io = last.get("bounded_io") or {}
        runs[name] = {"run": path, "losses": [round(r["loss"], 5) for r in steps],
                      "validation": [{"step": r["step"], "loss": r["loss"]} for r in recs if r["event"] == "eval"],
                      "seconds_per_step": round(statistics.median(r["s_per_step"] for r in steps[1:]), 3),
                      "optimizer_bytes": {"read": io.get("optimizer_read_bytes"),
                                          "written": io.get("optimizer_write_bytes")}}
    with open(os.path.join(fp32_run, "recipe.json")) as f:
        recipe = json.load(f)
    return {"what": "bf16 vs fp32 Adam moments on the SSD, presets/train/smollm2-sft.yaml (benchmarks/moments_quality.py)",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "recipe": {k: recipe[k] for k in ("model", "seq_len", "micro_batch", "steps", "lr", "precision", "seed")},
            "criterion": {"window_steps": WINDOW, "validation_tolerance": VALIDATION_TOLERANCE},
            "runs": runs,
            "comparison": compare(runs["fp32"]["losses"], runs["bf16"]["losses"], runs["fp32"]["validation"],
                                  runs["bf16"]["validation"])}


def tables(doc: dict) -> str:
    """Markdown for docs/results.md (scripts/results.py)."""
    c = doc["comparison"]
    r32, r16 = doc["runs"]["fp32"], doc["runs"]["bf16"]
    lines = ["| moments | final train loss | optimizer bytes read / written | median s/step |", "|---|---:|---:|---:|"]
    for name, r in (("fp32", r32), ("bf16", r16)):
        ob = r["optimizer_bytes"]
        lines.append(f"| {name} | {r['losses'][-1]:.4f} | {ob['read'] or 0:,} / {ob['written'] or 0:,} | "
                     f"{r['seconds_per_step']:.2f} |")
    lines += ["", f"Training loss over {c['steps']} steps: the {doc['criterion']['window_steps']}-step moving "
              f"averages differ by at most {c['max_smoothed_gap']:.4f} (mean {c['mean_smoothed_gap']:.4f}); the fp32 "
              f"run's own step-to-step noise is {c['noise']:.4f}.", "",
              "| step | validation loss fp32 | bf16 | difference |", "|---:|---:|---:|---:|"]
    lines += [f"| {v['step']} | {v['fp32']:.4f} | {v['bf16']:.4f} | {100 * v['relative']:+.2f}% |"
              for v in c["validation"]]
    lines += ["", "Within noise: **" + ("yes" if c["within_noise"] else "no") + "** (moving averages within the "
              "fp32 noise at every step, every validation loss within "
              f"{100 * doc['criterion']['validation_tolerance']:.0f}%)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp32", required=True, help="run directory with fp32 moments")
    ap.add_argument("--bf16", required=True, help="run directory with bf16 moments")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    doc = collect(args.fp32, args.bf16)
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(tables(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
