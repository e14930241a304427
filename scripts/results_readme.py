"""The README's one headline table: peak host memory and tokens/s of stock, tuned and memascend DeepSpeed on four
recorded jobs (a depth point on the CPU, two billion-scale jobs under a 12 GiB DRAM cap, one GPU job), generated
between the README's `headline` markers by scripts/results.py (and checked by its --check). Stdlib only."""

from __future__ import annotations

import os

from results_common import BENCH, gib, load_one, table

START, END = "<!-- headline:start -->", "<!-- headline:end -->"
ENGINES = ("stock", "tuned", "memascend")

DEPTH = os.path.join(BENCH, "depth-sweep-seq2048-rep3-fp32.json.gz")
STOCK_DEPTH = os.path.join(BENCH, "depth-sweep-seq2048-fp32.json.gz")
CAPPED = [os.path.join(BENCH, "capped", f"{job}-seq1024-cap12gib-{part}.json.gz")
          for job in ("qwen2.5-1.5b-bf16", "llama-3.2-3b-bf16") for part in ("stock-tuned", "memascend")]
GPU = os.path.join(BENCH, "gpu", "h200-qwen2.5-0.5b-2026-11-26.json.gz")


def cell(run: dict | None) -> str:
    """"3.63 GiB, 18.8 tok/s", "OOM-killed (cap 12 GiB)" or "-". Pure."""
    if run is None:
        return "-"
    if run.get("oom_killed"):
        return "OOM-killed"
    if not run.get("ok"):
        return "failed"
    tok = run.get("tokens_per_s")
    return f"{gib(run['peak_system_bytes'])} GiB" + ("" if tok is None else f", {tok:,.0f} tok/s")


def _runs(*docs: dict) -> dict[str, dict]:
    return {r["name"]: r for d in docs if d for r in d["runs"]}


def engine_cell(runs: dict[str, dict], engine: str) -> str:
    """The engine's cell; where only a variant of it ran (e.g. memascend-no-overlap_optimizer), that run, named. Pure."""
    if engine in runs:
        return cell(runs[engine])
    variant = next((n for n in sorted(runs) if n.startswith(engine + "-")), None)
    return "-" if variant is None else f"{cell(runs[variant])} ({variant.removeprefix(engine + '-')})"


def _deepest(sweep: dict) -> dict:
    return max(sweep["documents"], key=lambda d: d["job"]["num_params"])


def rows() -> list[list[str]]:
    """One row per job: what it is, where it ran, and each engine's cell. Pure over the committed JSON."""
    depth, stock = _deepest(load_one(DEPTH)), _deepest(load_one(STOCK_DEPTH))
    j = depth["job"]
    out = [[f"{j['num_params'] / 1e6:.0f}M Llama, {j['layers']} layers, fp32, seq {j['seq_len']}", "CPU, 2 cores",
            *(engine_cell(_runs(stock if e == "stock" else depth), e) for e in ENGINES)]]
    for i in range(0, len(CAPPED), 2):
        docs = [load_one(p) for p in CAPPED[i:i + 2]]
        j, runs = docs[1]["job"], _runs(*docs)
        out.append([f"{j['model']}, {j['dtype']}, seq {j['seq_len']}",
                    f"CPU, DRAM cap {gib(j['dram_cap_bytes']).rstrip('0').rstrip('.')} GiB",
                    *(engine_cell(runs, e) for e in ENGINES)])
    gpu = load_one(GPU)
    for model, by_engine in gpu["bench"]["documents"].items():
        j = by_engine["memascend"]["job"]
        out.append([f"{model}, {j['dtype']}, seq {j['seq_len']}", gpu["facts"]["gpus"][0].split(",")[0],
                    *(engine_cell(_runs(by_engine.get(e)), e) for e in ENGINES)])
    return out


def block() -> str:
    """The README's headline, between its markers."""
    return "\n".join([START, "Peak host memory and tokens/s, measured ([all results](docs/results.md)). Stock is "
                      "DeepSpeed as its docs configure it", "(on the CPU row, in an earlier sitting of the same job), "
                      "tuned is stock given every knob memascend sets:", "",
                      table(["job", "machine", "stock", "tuned", "memascend"], rows()), END])


def with_headline(readme: str) -> str:
    """`readme` with its headline block replaced by today's."""
    head, sep, rest = readme.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"README.md has no {START} ... {END} block for the headline table")
    return head + block() + tail
