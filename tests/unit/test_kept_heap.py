"""The heap memascend's dram row keeps between layers (planner/heap.py KEPT_HEAP_LAYER_BLOCKS, planner/placement.py
kept_heap_items): its blocks, where it is priced, the row's fallback to the per-layer trims, its fit on the quiet4
sweep's dram rows and its validation on the 06:55 and 09:25 sittings (docs/bench/placements/)."""

import dataclasses
import glob
import importlib.util
import os

import pytest

from memascend_cli.bench import configs as bench
from memascend_cli.bench.document import read_summary, recorded_summaries
from memascend_cli.hardware import resolve_hardware
from memascend_cli.models import load_model
from memascend_cli.planner import heap
from memascend_cli.planner import placement as pl
from memascend_cli.planner.context import Context
from memascend_cli.planner.memory import JobSpec, estimate
from memascend_cli.units import GiB

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLACEMENTS = os.path.join(REPO, "docs", "bench", "placements")
VALIDATION_SITTINGS = [path for hhmm in ("0655", "0925") for path in recorded_summaries(os.path.join(
    PLACEMENTS, f"bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-dram-cap4gib-{hhmm}", "*.json"))]
"""The sittings that validate it: three at 06:55 on the VM the sweep ran on, three at 09:25 on an AMD EPYC VM."""
QUIET4 = os.path.join(PLACEMENTS, "bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-quiet4", "*.json")


def _memascend_run(doc: dict) -> dict:
    return next(r for r in doc["runs"] if r["name"] == "memascend")


def _sweep_point(cap: str):
    """(memascend's job, tuned's job and engine, the node, the time model's inputs) of the quiet4 sweep's point at
    `cap`, as its bench priced it: the recorded jobs on the cgroup's node."""
    doc = read_summary(next(p for p in recorded_summaries(QUIET4) if f"cap-{cap}." in p))
    runs = {r["name"]: r for r in doc["runs"]}
    hw = dataclasses.replace(bench.recorded_hardware(doc), os_reserve_gib=0.0)  # the cap is the job's (under_dram_cap)
    return bench.recorded_plan_job(doc, runs["memascend"])[0], bench.recorded_plan_job(doc, runs["tuned"]), hw, \
        bench.recorded_timing(doc["job"])


def test_one_layers_blocks_are_its_gradients_and_their_fp64_norm_copies_below_the_mmap_threshold():
    """bench-llama-136m (hidden 1024, SwiGLU 2816), fp32: every weight's gradient (4 B) and fp64 norm copy (8 B) is
    below 32 MiB. llama-3.2-1b, fp32: its MLP gradients (2048 x 8192 x 4 B = 64 MiB) and the fp64 copies of q and o
    (32 MiB) are mmapped, so only q/o gradients and k/v's gradients and copies stay in the heap."""
    small = Context(JobSpec(model=load_model("bench-llama-136m"), dtype="fp32"), resolve_hardware("cpu-24g", None),
                    "memascend")
    assert heap.layer_backward_heap_bytes(small) == 12 * (4 * 1024 * 1024 + 3 * 1024 * 2816 + 2 * 1024)
    big = Context(JobSpec(model=load_model("llama-3.2-1b"), dtype="fp32"), resolve_hardware("cpu-24g", None),
                  "memascend")
    kv = 2048 * 512
    assert heap.layer_backward_heap_bytes(big) == 2 * 4 * 2048 * 2048 + 2 * 12 * kv + 2 * 12 * 2048
    assert heap.kept_layer_heap_bytes(big) == int(heap.KEPT_HEAP_LAYER_BLOCKS * heap.layer_backward_heap_bytes(big))


def test_the_kept_heap_is_priced_where_the_engine_keeps_it():
    """On a CPU rank with the per-layer trims off (the dram row's own setting) the row carries the kept heap on top of
    the backward; with the trims on, or on a GPU node, none."""
    j = JobSpec(model=load_model("bench-llama-136m"), dtype="fp32", chunked_loss=True)
    cpu = resolve_hardware("cpu-24g", None)
    kept, trimmed = pl.memascend_dram_row(j, cpu), pl.memascend_dram_row(j, cpu, layer_trims=True)
    item = next(i for i in kept.est.items if i.key == "host/kept_layer_heap")
    assert item.kind == "backward" and item.bytes == heap.kept_layer_heap_bytes(Context(j, cpu, "memascend"))
    assert kept.layer_trims is False and trimmed.layer_trims is True
    assert kept.est.node_host_peak_bytes - trimmed.est.node_host_peak_bytes == item.bytes
    assert not any(i.key == "host/kept_layer_heap" for i in trimmed.est.items)
    gpu = pl.memascend_dram_row(j, resolve_hardware("h100-80g-512g", None))
    assert not any(i.key == "host/kept_layer_heap" for i in gpu.est.items) and gpu.layer_trims is False


@pytest.mark.parametrize("cap,trims", [("2.7GiB", True), ("3.25GiB", False), ("4GiB", False)])
def test_the_dram_row_fits_the_sweeps_caps_trimming_where_the_kept_heap_does_not(cap, trims):
    """The quiet4 sweep's dram points (bench-llama-136m, 4 layers, seq 512, fp32): memascend's dram row still fits at
    2.7, 3.25 and 4 GiB. At 2.7 GiB the kept heap does not fit beside the 0.5 GiB headroom (the run kept it with
    ru_maxrss 2.51 GiB in its 2.7 GiB cgroup): the row trims after every layer there, and says why."""
    jm, (jt, et), hw, t = _sweep_point(cap)
    plan = pl.price_placements(jm, hw, {"tuned": estimate(jt, hw, et), "memascend": estimate(jm, hw, "memascend")},
                               t["device"], read_gbps=t["read_gbps"],
                               write_gbps=t["write_gbps"], duplex_io=t["duplex_io"])
    row = plan.row("dram", "memascend")
    assert row.fits and row.layer_trims is trims
    assert ("heap trimmed after every layer" in row.note) is trims
    assert any(i.key == "host/kept_layer_heap" for i in row.est.items) is not trims


def test_the_constant_is_the_quiet4_fit():
    """KEPT_HEAP_LAYER_BLOCKS is what scripts/fit_planner.py fits on the quiet4 sweep's dram rows (mallinfo2's free-kept
    heap at their step-1 optimizer marks: 539 / 453 / 508 MiB over 147 MiB of one layer's blocks, the median), so it
    cannot drift onto the sittings that validate it."""
    spec = importlib.util.spec_from_file_location("fit_planner", os.path.join(REPO, "scripts", "fit_planner.py"))
    fit_planner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_planner)
    assert fit_planner.KEPT_HEAP_FIT_RUNS == QUIET4
    assert fit_planner.kept_heap_fit(recorded_summaries(QUIET4)) == heap.KEPT_HEAP_LAYER_BLOCKS
    assert not set(recorded_summaries(QUIET4)) & set(VALIDATION_SITTINGS)


SYSTEM_MISSES = {"placements-clip10-dram-cap4gib-0655-sitting3":
                 "its system peak (2.85 GiB) is 0.39 GiB above the rank's own ru_maxrss (2.45): memory outside the "
                 "rank's pages, which the heap does not explain; the plan is within 4.1% of that ru_maxrss"}


def _validation_runs():
    out = []
    for path in VALIDATION_SITTINGS:
        name = os.path.basename(path).removesuffix(".gz").removesuffix(".json")
        marks = [pytest.mark.xfail(strict=True, reason=SYSTEM_MISSES[name])] if name in SYSTEM_MISSES else []
        out.append(pytest.param(path, id=name, marks=marks))
    return out


def test_the_validation_sittings_ran_with_the_heap_kept():
    runs = [_memascend_run(read_summary(p)) for p in VALIDATION_SITTINGS]
    assert len(runs) == 6 and all(r["placement"]["placement"] == "dram" and r["placement"]["layer_trims"] is False
                                  for r in runs)


@pytest.mark.parametrize("path", [pytest.param(p, id=os.path.basename(p)) for p in VALIDATION_SITTINGS])
def test_plan_within_10_percent_of_the_ranks_max_rss(path):
    """The kept heap is the rank's own memory: the plan within 10% of each sitting's ru_maxrss (+2.0 to +7.4%; without
    the item -13.4 to -17.8%)."""
    doc = read_summary(path)
    run = _memascend_run(doc)
    planned = bench.repredict(doc, run)["node_host_peak_bytes"]
    assert abs(planned - run["ru_maxrss_bytes"]) <= 0.10 * run["ru_maxrss_bytes"], planned / GiB


@pytest.mark.parametrize("path", _validation_runs())
def test_plan_within_10_percent_of_the_measured_system_peak(path):
    """The bench's comparison (runs[].prediction_error_percent: the system's peak less its idle): -5.1 and -7.2% at
    06:55, -9.3 / +0.2 / -8.4% at 09:25 (without the item -23.5 / -25.2% and -26.9 / -19.2 / -26.2%)."""
    doc = read_summary(path)
    run = _memascend_run(doc)
    planned = bench.repredict(doc, run)["node_host_peak_bytes"]
    assert abs(planned - run["peak_system_bytes"]) <= 0.10 * run["peak_system_bytes"], planned / GiB


def test_runs_that_trimmed_between_layers_are_priced_without_it():
    """The sittings before the dram row kept the heap (layer_trims not recorded: the engine trimmed) keep their plan."""
    for path in glob.glob(os.path.join(PLACEMENTS, "*-dram-cap4gib-0350", "*.json.gz")):
        doc = read_summary(path)
        items = bench.repredict(doc, _memascend_run(doc))["host_items"]
        assert not any(i["key"] == "host/kept_layer_heap" for i in items)
