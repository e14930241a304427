"""Fit the planner's measured constants on the calibration runs only (docs/bench/calibration/*.json, or .json.gz).

    python scripts/fit_planner.py          # prints the fitted values and what memory.py holds
    python scripts/fit_planner.py --json

The per-process runtime (python + torch + DeepSpeed, memascend_cli/planner/host.py RUNTIME_CPU_BYTES) is what
the runs of a tiny model measure beyond every other modelled item: their model data is a few MiB, so the residual
is the runtime. The engine runtime (ENGINE_RUNTIME_BYTES) is the memascend run's residual beyond that. Runs of
larger models are calibration for the rest of the model, not for these constants: their residuals carry the
model's other errors. glibc's heap constants (planner/heap.py: ACTIVATION_HEAP_BLOCKS_PER_LAYER,
OPTIMIZER_INIT_HEAP_FRACTION, STEP_HEAP_FRACTION) come from the stock and tuned runs recorded with glibc's heap state
(mallinfo2) at each phase start whose ZeRO settings are today's for their mode: the heap follows the bucket and
sub-group sizes. The one constant of memascend's heap (heap.KEPT_HEAP_LAYER_BLOCKS: the heap its dram row keeps between
layers) comes from the quiet4 placement sweep's dram rows (KEPT_HEAP_FIT_RUNS) only; the dram sittings of 06:55 and
09:25 validate it (tests/unit/test_kept_heap.py). Validation runs (docs/bench/validation) are never read here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from memascend_cli.bench.configs import (
    recorded_hardware,
    recorded_plan_job,
    recorded_spec,
    repredict,
    resolve_settings,
    run_settings,
)
from memascend_cli.bench.document import read_summary, recorded_summaries
from memascend_cli.planner import heap, memory
from memascend_cli.planner.context import Context
from memascend_cli.units import GiB

# Runs whose model data is below this are the runtime's calibration.
TINY_PARAMS = 20_000_000


def _item(pred: dict, key: str) -> int:
    return next((i["bytes"] for i in pred["host_items"] if i["key"] == key), 0)


def residuals(paths: list[str]) -> list[dict]:
    """Per calibration run of a tiny model: measured peak per rank minus the plan without its runtime items."""
    out = []
    for path in paths:
        doc = read_summary(path)
        if doc["job"]["num_params"] >= TINY_PARAMS:
            continue
        ranks = int(doc["job"]["ranks"])
        for r in doc["runs"]:
            if not r["ok"] or not r["peak_system_bytes"]:
                continue
            pred = repredict(doc, r)
            others = pred["host_peak_bytes_per_rank"] - _item(pred, "host/runtime") - _item(pred, "host/engine_runtime")
            out.append({"file": os.path.basename(path), "run": r["name"], "mode": r["mode"],
                        "residual_bytes": r["peak_system_bytes"] // ranks - others})
    return out


def fit(rows: list[dict]) -> dict:
    base = [x["residual_bytes"] for x in rows if x["mode"] != "memascend"]
    eng = [x["residual_bytes"] for x in rows if x["mode"] == "memascend"]
    if not base or not eng:
        raise SystemExit("error: no calibration run of a tiny model with stock/tuned and memascend runs\n"
                         "hint: record one with scripts' campaign (memascend bench --model tiny-llama --dtype fp32)")
    runtime = sum(base) / len(base)
    return {"runtime_cpu_gib": round(runtime / GiB, 2),
            "engine_runtime_gib": round((sum(eng) / len(eng) - runtime) / GiB, 2),
            "runs": rows}


def _current_config(doc: dict, run: dict) -> bool:
    """The run's ZeRO settings are today's for its mode and job: the allocator's behaviour follows the bucket and
    sub-group sizes, so runs of an earlier tuned config are not fitted on."""
    j = doc["job"]
    today = resolve_settings(run["mode"], recorded_spec(j), dtype=j["dtype"], ranks=int(j["ranks"]))
    return run_settings(run["mode"], run["config"]) == today


def _free_kept(run: dict) -> dict[str, int]:
    """glibc's free-but-kept heap bytes (mallinfo2) at each phase start a run recorded them, by phase name."""
    return {p["name"]: p["malloc"]["free_kept_bytes"] for p in run.get("phases") or [] if p.get("malloc")}


def _heap_runs(paths: list[str]):
    """(doc, run, free-kept bytes per phase start) of the stock and tuned runs recorded with mallinfo2, today's
    config."""
    for path in paths:
        doc = read_summary(path)
        for r in doc["runs"]:
            kept = _free_kept(r)
            if r["ok"] and r["mode"] != "memascend" and kept and _current_config(doc, r):
                yield doc, r, kept


def _small_fp32_bytes(doc: dict, run: dict) -> int:
    job, engine = recorded_plan_job(doc, run)
    return heap.small_sub_group_fp32_bytes(Context(job, recorded_hardware(doc), engine))


def _stranded(doc: dict):
    j = doc["job"]
    return memory.activation_heap_block(recorded_spec(j), j["micro_batch"] * j["seq_len"],
                                        memory.DTYPE_BYTES[j["dtype"]])


def _heap_share(paths: list[str], start: str, end: str, *, unstranded_only: bool = False,
                less: str = "") -> float | None:
    """glibc's free-kept heap growth from phase mark `start` to `end` (less the plan's item `less`) per fp32 byte of
    the sub-groups below the mmap threshold, over the runs: a ratio of sums, so a tiny model's few MiB do not weigh
    as much as a large one's GiB."""
    grown = small_total = 0
    for doc, r, kept in _heap_runs(paths):
        small = _small_fp32_bytes(doc, r)
        if small and {start, end} <= kept.keys() and not (unstranded_only and _stranded(doc)):
            grown += kept[end] - kept[start] - (_item(repredict(doc, r), less) if less else 0)
            small_total += small
    return round(grown / small_total, 2) if small_total else None


def optimizer_init_heap_fit(paths: list[str]) -> float | None:
    """OPTIMIZER_INIT_HEAP_FRACTION: the heap growth over deepspeed.initialize (the initialize to step-1 forward
    marks), over all the runs."""
    return _heap_share(paths, "initialize", "step1_forward")


def step_heap_fit(paths: list[str]) -> float | None:
    """STEP_HEAP_FRACTION: the heap growth over step 1 (forward to optimizer marks) beyond the backward blocks the
    plan already keeps (host/allocator_retention), over the runs where no activation block strands."""
    return _heap_share(paths, "step1_forward", "step1_optimizer", unstranded_only=True,
                       less="host/allocator_retention")


def activation_heap_fit(paths: list[str]) -> dict:
    """ACTIVATION_HEAP_BLOCKS_PER_LAYER: glibc's free-kept heap growth (phase starts recorded with mallinfo2) per layer
    over stock's first forward ("forward") and first forward + backward ("retained"), in blocks of
    memory.activation_heap_block, for each width that strands; a width without a calibration run is left out."""
    ks: dict[str, dict[str, list[float]]] = {}
    phases = {"step1_forward", "step1_backward", "step1_optimizer"}
    for doc, r, kept in _heap_runs(paths):
        stranded = _stranded(doc)
        if stranded and phases <= kept.keys():
            width, block = stranded
            per_layer = recorded_spec(doc["job"]).num_hidden_layers * block
            step = heap.STEP_HEAP_FRACTION * _small_fp32_bytes(doc, r)  # the step's own blocks (host/step_heap)
            fit = ks.setdefault(width, {"retained": [], "forward": []})
            fit["retained"].append((kept["step1_optimizer"] - kept["step1_forward"] - step) / per_layer)
            fit["forward"].append((kept["step1_backward"] - kept["step1_forward"]) / per_layer)
    return {w: {part: round(sum(v) / len(v), 1) for part, v in parts.items()} for w, parts in ks.items()}


KEPT_HEAP_FIT_RUNS = os.path.join(REPO, "docs", "bench", "placements",
                                  "bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-quiet4", "*.json")
"""heap.KEPT_HEAP_LAYER_BLOCKS's fit set: the quiet4 sweep's memascend dram rows (its other sittings validate it)."""


def kept_heap_fit(paths: list[str]) -> float | None:
    """KEPT_HEAP_LAYER_BLOCKS: glibc's free-kept heap at the step-1 optimizer mark of the memascend runs that kept the
    heap between layers (their placement's layer_trims False), in units of heap.layer_backward_heap_bytes; the
    median over the runs."""
    import statistics

    ks = []
    for path in paths:
        doc = read_summary(path)
        for r in doc["runs"]:
            kept = _free_kept(r)
            if r["ok"] and (r.get("placement") or {}).get("layer_trims") is False and "step1_optimizer" in kept:
                job, engine = recorded_plan_job(doc, r)
                ks.append(kept["step1_optimizer"] / heap.layer_backward_heap_bytes(
                    Context(job, recorded_hardware(doc), engine)))
    return round(statistics.median(ks), 2) if ks else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    paths = recorded_summaries(os.path.join(REPO, "docs", "bench", "calibration", "*.json"))
    result = fit(residuals(paths))
    result["activation_heap_blocks_per_layer"] = activation_heap_fit(paths)
    result["optimizer_init_heap_fraction"] = optimizer_init_heap_fit(paths)
    result["step_heap_fraction"] = step_heap_fit(paths)
    result["kept_heap_layer_blocks"] = kept_heap_fit(recorded_summaries(KEPT_HEAP_FIT_RUNS))
    result["memory_py"] = {"runtime_cpu_gib": round(memory.RUNTIME_CPU_BYTES / GiB, 2),
                           "engine_runtime_gib": round(memory.ENGINE_RUNTIME_BYTES / GiB, 2),
                           "activation_heap_blocks_per_layer": memory.ACTIVATION_HEAP_BLOCKS_PER_LAYER,
                           "optimizer_init_heap_fraction": heap.OPTIMIZER_INIT_HEAP_FRACTION,
                           "step_heap_fraction": heap.STEP_HEAP_FRACTION}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for x in result["runs"]:
        print(f"{x['file']} {x['run']}: residual {x['residual_bytes'] / GiB:.3f} GiB")
    print(f"fitted: runtime {result['runtime_cpu_gib']:.2f} GiB, engine runtime {result['engine_runtime_gib']:.2f} GiB;"
          f" memory.py: {result['memory_py']['runtime_cpu_gib']:.2f}, {result['memory_py']['engine_runtime_gib']:.2f}")
    print(f"fitted: activation heap blocks per layer {result['activation_heap_blocks_per_layer']};"
          f" memory.py: {memory.ACTIVATION_HEAP_BLOCKS_PER_LAYER}")
    print(f"fitted: optimizer init heap fraction {result['optimizer_init_heap_fraction']};"
          f" heap.py: {heap.OPTIMIZER_INIT_HEAP_FRACTION}")
    print(f"fitted: step heap fraction {result['step_heap_fraction']}; heap.py: {heap.STEP_HEAP_FRACTION}")
    print(f"fitted (quiet4 dram rows): kept heap layer blocks {result['kept_heap_layer_blocks']};"
          f" heap.py: {heap.KEPT_HEAP_LAYER_BLOCKS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
