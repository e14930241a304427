"""`memascend plan` on bench runs it was not fitted on: within 10% of the measured peak system memory.

docs/bench/validation/*.json are `memascend bench` documents of models, dtypes and rank counts other than the
calibration runs (docs/bench/calibration/*.json) the planner's constants come from. Each run is re-planned with
today's planner from its recorded config, job and techniques (memascend_cli.bench.repredict).
"""

import glob
import json
import os

import pytest

from memascend_cli import bench

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLERANCE = 0.10


# Validation runs the planner misses by more than TOLERANCE today (issue 9 stays open until this is empty):
# - memascend on fp32 models of 100M+ parameters is under-predicted, more so the deeper the model (-21% on
#   bench-llama-136m x 2 ranks, -41% on SmolLM2-360M's 32 layers): the engine's level after zero.Init and its backward
#   peak grow with the layer count (docs/results.md, depth sweep) by more than the itemised windows and working set;
# - stock on SmolLM2-360M is over-predicted (+15%);
# - tuned and memascend on a 6M-parameter model are over-predicted by ~0.1 GiB: the 0.51 GiB per-process runtime was
#   fitted on ru_maxrss, which counts shared library pages the system measure leaves out.
# Strict: a run that comes within TOLERANCE fails here until it is taken off the list.
KNOWN_MISSES = {
    "bench-llama-136m-2ranks-fp32.json:memascend",
    "smollm2-360m-fp32.json:stock",
    "smollm2-360m-fp32.json:memascend",
    "tiny-llama-bf16.json:tuned",
    "tiny-llama-bf16.json:memascend",
    "tiny-llama-fp16.json:tuned",
    "tiny-llama-fp16.json:memascend",
}


def _runs(kind: str):
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, "docs", "bench", kind, "*.json"))):
        with open(path) as f:
            doc = json.load(f)
        for r in doc["runs"]:
            if r["ok"]:
                run_id = f"{os.path.basename(path)}:{r['name']}"
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
    """At least three model shapes, bf16 and fp16, one and two ranks (issue: planner truth on unseen data)."""
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
