"""`memascend plan` on bench runs it was not fitted on: within 10% of the measured peak system memory.

docs/bench/validation/*.json.gz are `memascend bench` documents of models, dtypes and rank counts other than the
calibration runs (docs/bench/calibration/*.json.gz) the planner's constants come from (each read gzipped or not:
document.read_summary). Each run is re-planned with today's planner from its recorded config, job and techniques
(memascend_cli.bench.configs.repredict).
"""

import os

import pytest

from memascend_cli.bench import configs as bench
from memascend_cli.bench.document import RECORDED_GZIP, read_summary, recorded_summaries

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLERANCE = 0.10


# Validation runs the planner misses by more than TOLERANCE today. Re-recorded 2026-11-24 on an AVX-512 VM (the
# earlier records were from an AVX2 VM): at 2 ranks both tuned (3.68 -> 4.32 GiB) and memascend (2.54 -> 2.81) peak
# higher than the earlier records and the plan, which has no per-rank term for it, was 18% short (memascend still
# is); Qwen2.5's stock run
# measured 12.25 GiB where the plan says 13.59 (+11%). Causes not isolated yet. The tiny-llama runs (0.5-0.6 GiB
# peaks, spread +-0.04 GiB from run to run) are recorded as the median of 3 repeats (`memascend bench --repeat 3`),
# like the tiny calibration run the runtime constant is fitted on.
# The loss pair at seq 8192 (2026-11-25): tuned with the chunked loss peaks 4.11 GiB, the plan 3.25 (-21%; -28%
# before 2026-11-29): glibc kept 0.76-1.0 GiB free in stock's heap (mallinfo2 at the phase starts) where the plan has
# 0.38 + 0.17 + 0.06 for zero.Init, deepspeed.initialize and the first step (every activation block of 32 MiB is
# mmapped); with transformers' loss memascend peaks 2.24 GiB on the system counter, the plan 2.64 (+18%, with the
# model's top since 2026-11-27), while its own ru_maxrss is 2.77 GiB
# (-5%): that run's system peak (idle 0.87 GiB subtracted) is 0.53 GiB below its own process's peak RSS.
# Strict: a run listed here that comes within TOLERANCE fails until it is taken off the list.
# Tuned at 2 ranks and with transformers' loss at seq 8192 came within 10% (-9.2% each) on 2026-11-29, when the
# heap that deepspeed.initialize and the first step keep of the small sub-groups' fp32 blocks
# (host/optimizer_init_heap, host/step_heap) and the later backward above the kept heap were fitted on the allocator
# calibration runs; tiny-llama fp16 memascend (+9.2%) when the per-process runtime was refitted with them (0.37 +
# 0.11 -> 0.35 + 0.12 GiB for memascend).
KNOWN_MISSES: set[str] = {"bench-llama-136m-2ranks-fp32.json:memascend",
                          "qwen2.5-0.5b-8l-fp32.json:stock", "loss-chunked-l8-seq8192-fp32.json:tuned",
                          "loss-hf-l8-seq8192-fp32.json:memascend"}


def _runs(kind: str):
    out = []
    for path in recorded_summaries(os.path.join(REPO, "docs", "bench", kind, "*.json")):
        doc = read_summary(path)
        for r in doc["runs"]:
            if r["ok"]:
                run_id = f"{os.path.basename(path).removesuffix(RECORDED_GZIP)}:{r['name']}"
                marks = [pytest.mark.xfail(strict=True, reason="planner error above 10% (KNOWN_MISSES)")] \
                    if kind == "validation" and run_id in KNOWN_MISSES else []
                out.append(pytest.param(doc, r, id=run_id, marks=marks))
    return out


VALIDATION = _runs("validation")
CALIBRATION = _runs("calibration")


def test_known_misses_are_recorded_runs():
    ids = {p.id for p in VALIDATION}
    assert KNOWN_MISSES <= ids


def test_validation_covers_the_required_shapes():
    """At least three model shapes, bf16 and fp16, one and two ranks (the planner checked on data it was not fitted on)."""
    docs = {id(p.values[0]): p.values[0]["job"] for p in VALIDATION}
    models = {(j["model"], j.get("layers")) for j in docs.values()}
    assert len(models) >= 3
    assert {"bf16", "fp16"} <= {j["dtype"] for j in docs.values()}
    assert {1, 2} <= {j["ranks"] for j in docs.values()}


def test_calibration_and_validation_are_separate_runs():
    cal = {(p.values[0]["meta"]["date"], p.values[0]["job"]["model"]) for p in CALIBRATION}
    val = {(p.values[0]["meta"]["date"], p.values[0]["job"]["model"]) for p in VALIDATION}
    assert cal and val and not cal & val


@pytest.mark.parametrize("doc,run", VALIDATION)
def test_plan_within_10_percent_of_measured_peak(doc, run):
    planned = bench.repredict(doc, run)["node_host_peak_bytes"]
    measured = run["peak_system_bytes"]
    assert abs(planned - measured) <= TOLERANCE * measured, (planned / 2**30, measured / 2**30)


def test_measured_constants_are_the_calibration_fit():
    """RUNTIME_CPU_BYTES, ENGINE_RUNTIME_BYTES, ACTIVATION_HEAP_BLOCKS_PER_LAYER and the heap fractions are what
    scripts/fit_planner.py fits on the calibration runs (to 0.01 GiB, 0.1 block, 0.01), so a constant cannot drift
    onto the validation runs it is judged by."""
    import importlib.util

    from memascend_cli.planner import heap, memory

    spec = importlib.util.spec_from_file_location("fit_planner", os.path.join(REPO, "scripts", "fit_planner.py"))
    fit_planner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_planner)
    paths = recorded_summaries(os.path.join(REPO, "docs", "bench", "calibration", "*.json"))
    fitted = fit_planner.fit(fit_planner.residuals(paths))
    assert round(memory.RUNTIME_CPU_BYTES / 2**30, 2) == fitted["runtime_cpu_gib"]
    assert round(memory.ENGINE_RUNTIME_BYTES / 2**30, 2) == fitted["engine_runtime_gib"]
    assert fit_planner.activation_heap_fit(paths) == memory.ACTIVATION_HEAP_BLOCKS_PER_LAYER
    assert fit_planner.optimizer_init_heap_fit(paths) == heap.OPTIMIZER_INIT_HEAP_FRACTION
    assert fit_planner.step_heap_fit(paths) == heap.STEP_HEAP_FRACTION


def _billion_runs():
    paths = recorded_summaries(os.path.join(REPO, "docs", "bench", "capped", "*.json")) + \
        recorded_summaries(os.path.join(REPO, "docs", "bench", "ssd-bound", "llama-3.2-1b-*.json"))
    out = []
    for path in sorted(paths):
        doc = read_summary(path)
        name = os.path.basename(path).removesuffix(RECORDED_GZIP)
        out += [pytest.param(doc, r, id=f"{name}:{r['name']}",
                             marks=[pytest.mark.xfail(strict=True, reason=BILLION_MISSES[r["name"]])]
                             if r["name"] in BILLION_MISSES else []) for r in doc["runs"] if r["ok"]]
    return out


BILLION_MISSES = {
    "memascend-no-params_hold_master": "an ablation the plan does not model: without the master in the parameters' "
                                       "extents its initialization peaked at 5.58 GiB (ru_maxrss 4.06) where the "
                                       "default engine's plan says 4.03 (llama-3.2-1b fp32, 2026-11-27)"}
"""Billion-scale runs of an engine variant the planner does not model, by run name."""

BILLION = _billion_runs()


def test_billion_parameter_runs_are_covered():
    assert {p.values[0]["job"]["model"] for p in BILLION} >= {"llama-3.2-1b", "qwen2.5-1.5b"}


@pytest.mark.parametrize("doc,run", BILLION)
def test_plan_within_10_percent_at_billion_scale(doc, run):
    """Today's plan on the recorded 1.2-1.5B-parameter runs (within 10% on each)."""
    planned = bench.repredict(doc, run)["node_host_peak_bytes"]
    measured = run["peak_system_bytes"]
    assert abs(planned - measured) <= TOLERANCE * measured, (planned / 2**30, measured / 2**30)
