"""`memascend plan`'s step time on bench runs it was not fitted on: within 15% of the measured s/step; its SSD bytes
per step within 10% of the bench's block-I/O counters.

Which runs validate the model is a rule over what each record holds (memascend_cli/bench/validation_scope.py), stated
before any run is compared: a CPU bench record that carries its sitting's own matmul probe and the SSD rate it ran at
is planned with those (placements.plan_at_sitting: what the plan says of that machine that hour) and must come within
TOLERANCE, unless its load gauge shows other jobs on the cores or its sitting's probe ran under the machine's cached
rate. Every other record is history (older records, VMs that no longer exist, contended runs, slow sittings): planned
at its sitting's probe where it carries one, else as the bench planned it, or at the calibrated CPU rate and this VM
disk's probed bandwidth where it recorded no rates, and held to HISTORY_TOLERANCE. A validation run the model misses
is listed in EXPECTED_MISSES with a cause that test_each_expected_miss_has_its_cause_in_its_record finds in its
record; the list holds at most a tenth of the validation runs.

The CPU's achieved GFLOP/s of the older records (CPU_CALIBRATED_GFLOPS) is fitted on docs/bench/depth-sweep-seq2048-
rep3-fp32.json.gz and each host or time term on one run (CALIBRATION_RUNS); test_no_validation_run_was_fitted_on keeps
them apart from every validation run. The older documents record no SSD bandwidth (their regions were made with
--no-probe): READ_GBPS / WRITE_GBPS are the disk's, measured afterwards by `memascend prepare-ssd`'s probe."""

import os
import statistics

import pytest

from memascend_cli.bench import configs
from memascend_cli.bench import validation_scope as scope
from memascend_cli.bench.document import RECORDED_GZIP, read_summary, recorded_summaries
from memascend_cli.bench.placements import plan_at_sitting
from memascend_cli.planner import time as tm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CALIBRATION = scope.CALIBRATION_DOCUMENT
STOCK_HOST_CALIBRATION, MEMASCEND_HOST_CALIBRATION = scope.STOCK_HOST_CALIBRATION, scope.MEMASCEND_HOST_CALIBRATION
STOCK_OFFLOAD_HOST_CALIBRATION = scope.STOCK_OFFLOAD_HOST_CALIBRATION
GRADIENT_BLOCKING_CALIBRATION = scope.GRADIENT_BLOCKING_CALIBRATION
MEMASCEND_DRAM_HOST_CALIBRATION = scope.MEMASCEND_DRAM_HOST_CALIBRATION
NORM_WORKER_CALIBRATION = scope.NORM_WORKER_CALIBRATION
OVERLAP_SERIAL_CALIBRATION = scope.OVERLAP_SERIAL_CALIBRATION
CALIBRATION_RUNS = scope.CALIBRATION_RUNS
TOLERANCE = 0.15
HISTORY_TOLERANCE = 2 * TOLERANCE
"""History's looser check, on each engine's median error (absolute) over its history runs: machines the plan's rates
no longer describe, runs beside other jobs and degraded sittings, where no run is held to TOLERANCE."""
MISSES_SHARE = 0.10
"""EXPECTED_MISSES holds at most this share of the validation runs."""
READ_GBPS, WRITE_GBPS = 3.751, 6.584
"""The VM disk under /var/tmp (where the documents' regions and swap directories were), as `memascend prepare-ssd`'s
bandwidth probe measured it on 2026-11-25 (2 GiB region file, best of 6 block size x queue depth settings)."""
CPU_CALIBRATED_GFLOPS = 184.1
"""fp32 GFLOP/s a DeepSpeed step achieved on the 2-core AMD EPYC VM the documents were recorded on: the mean of
measured / modelled s/step over the six runs of the calibration document (tuned and memascend at 8/16/32 layers; 175.5
before tuned stock got stock's host passes on the CPU accelerator, 2026-11-27)."""

# Why the model misses a validation run by more than TOLERANCE: the kinds of cause, each checked against the run's
# record by test_each_expected_miss_has_its_cause_in_its_record.
SLOW_VM = "slow VM"  # the sitting's stock ZeRO-Offload run (tuned knobs at the dram placement: stock DeepSpeed, which
# no commit of this project changes) took SLOW_VM_FACTOR or more of the same job's median in the validation
# sittings that are no miss: the VM ran slower than its matmul probe said (on 2026-12-07 03:50-03:55 the probe was 2-5%
# under the cache while stock's step took 1.6-1.8x its 2.01-2.04 s of 2026-12-06 22:45); the memascend run beside it
# met the same machine
SLOW_VM_FACTOR = 1.3

AT_CAP = "at its cap"  # the run's cgroup peak took AT_CAP_SHARE or more of its DRAM cap (the page cache charged to
# it reclaimed as it runs): a suspected cause, not a measured one; its record shows no memory stall (pressure full 0)
AT_CAP_SHARE = 0.85  # set after this sitting (its run at 87%); the 4 GiB runs beside it peaked at 65-70%: a dram run
# at a cap near its peak, repeated, decides whether this is the cap or the model

LOADED = "others on the cores"  # the bench's load gauge recorded other processes' CPU over the run of at least
LOADED_CORES = 0.25  # cores (half the rule's CONTENDED_CORES, on these 2-core VMs an eighth of the CPU): the run shared
# the cores with them, though less than the rule sets apart as contended

BEATS_ITS_BOUND = "beat its bound"  # memascend's dram row is priced with ZeRO-Offload's host passes, which bound its
# own from above (planner.time _host_seconds: one copy of each gradient where stock makes two, no master or parameter
# copied in the step); the run beat the sitting's ZeRO-Offload run by BOUND_MARGIN or more. Across the AMD EPYC VM's
# sittings the row's lead over ZeRO-Offload measured -4% to +14% (4 GiB), too unsteady for a term of its own
BOUND_MARGIN = 0.10

REPEAT_SPREAD = "repeats spread"  # the same command's repeats in one sitting (ssd_bound_rounds' rounds) spread by more
# than TOLERANCE (slowest over fastest), so no one plan comes within TOLERANCE of each; the plan is within TOLERANCE of
# their median

EXPECTED_MISSES: dict[str, tuple[str, str]] = {
    **{f"placements-clip10-dram-cap4gib-0350-sitting{n}.json:4:512:{r}": (SLOW_VM, why) for n, r, why in (
        (1, "tuned", "stock -36%: 3.28 s/step against 2.01-2.04 in the 22:45 sittings"),
        (1, "memascend", "-29% beside stock's 3.28"),
        (3, "tuned", "stock -45%: 3.72 s/step against 2.01-2.04 in the 22:45 sittings"),
        (3, "memascend", "-31% beside stock's 3.72"))},
    # 06:55-07:13: stock ZeRO-Offload 1.35-1.8x its 22:45 speed (backward 1.64-2.21 s against 1.33) while the sittings'
    # matmul probes ran at the cached rate (311-325 GFLOP/s): the slowness is stock's alone and no probe shows it yet
    # (the memory-bandwidth probe is recorded from these sittings on; older ones have none to compare with)
    **{f"placements-clip10-dram-cap4gib-0655-sitting{n}.json:4:512:tuned": (SLOW_VM, f"stock {why} against 2.01-2.04 "
                                                                            "in the 22:45 sittings")
       for n, why in ((1, "-26%: 2.73 s/step"), (2, "-31%: 2.94 s/step"), (3, "-30%: 2.87 s/step"))},
    "placements-clip10-quiet4-cap-4GiB.json:4:512:stock-best": (
        SLOW_VM, "stock -45%: 3.64 s/step against 2.01-2.04 in the 22:45 sittings"),
    "placements-clip10-quiet3-cap-3.25GiB.json:4:512:memascend": (
        AT_CAP, "the dram placement at 3.25 GiB peaked at 2.84 GiB (87%): -16% where the 4 GiB runs are -3% to -7%"),
    "placements-clip10-gradsfirst-split-0935-cap-2.3GiB.json:4:512:memascend": (
        LOADED, "-18%: 14.8 s of others' CPU over the run (0.44 cores; the AMD EPYC VM's other validation runs "
                "0-0.09)"),
    **{f"placements-clip10-dram-cap4gib-0925-sitting{n}.json:4:512:memascend": (BEATS_ITS_BOUND, why) for n, why in (
        (1, "+15%: 2.17 s/step against ZeRO-Offload's 2.51 beside it"),
        (2, "+17%: 2.16 s/step against ZeRO-Offload's 2.42 beside it"))},
    **{f"bench-llama-136m-seq512-bf16-ssd400mbs-noclip-rounds-quiet6-round{n}.json:8:512:memascend-bf16_moments": (
        REPEAT_SPREAD, f"{why}: the sitting's 7 rounds 3.92-4.81 s/step, the plan +13% of their median 4.14")
       for n, why in ((3, "+18%"), (4, "+20%"))},
}
"""Every validation run the model misses by more than TOLERANCE, with why (strict: one that comes within fails until
taken off)."""


def _recorded(name: str) -> dict:
    """A calibration run's document by its file name (RECORDED_GZIP or not), under docs/bench/ssd-bound or in a
    placement sitting's folder of records (docs/bench/placements/*/)."""
    import glob

    folders = [os.path.join(REPO, "docs", "bench", "ssd-bound"),
               *sorted(glob.glob(os.path.join(REPO, "docs", "bench", "placements", "*", "")))]
    return read_summary(next(p for f in folders for p in recorded_summaries(os.path.join(f, name))))


def predicted_s(doc: dict, run: dict, gflops: float = CPU_CALIBRATED_GFLOPS) -> float:
    """The time model's s/step for a recorded run as the bench planned it: with the rates it recorded (`job.timing`:
    the CPU probe of the machine it ran on, the SSD throttle or the region's probe) exactly as the bench predicts it
    (configs.repredict); else with the calibrated CPU rate and this VM disk's probed bandwidth."""
    j = doc["job"]
    if configs.recorded_timing(j) is not None:
        return configs.repredict(doc, run)["time"]["seconds_per_step"]
    spec = configs.recorded_spec(j)
    st = configs.repredict(doc, run)["ssd_traffic"]

    class Traffic:
        read_bytes, write_bytes = st["read_bytes"], st["write_bytes"]

    elems = round(st["read_bytes_per_step"] / st["read_bytes_per_param"])
    rank_tokens = j["micro_batch"] * j["seq_len"]
    flops = tm.step_flops(spec, tokens=rank_tokens, seq_len=j["seq_len"], checkpointing=j["checkpointing"])
    ranks = j["ranks"]  # sharing the VM's cores and disk, as planner.time.engine_times divides them
    t = tm.step_time(run["mode"], flops=flops, traffic=Traffic, device=tm.cpu_device(gflops / ranks, "calibrated"),
                     read_bytes_per_s=READ_GBPS * 1e9 / ranks, write_bytes_per_s=WRITE_GBPS * 1e9 / ranks,
                     optimizer_elems=elems,
                     cpu_cores=max(1, doc["hardware"]["cpu_cores"] // j["ranks"]),
                     tokens_per_step=rank_tokens * j["ranks"])
    return t.step_s


def planned(doc: dict, run: dict) -> float:
    """The plan's s/step the checks compare: at the sitting's probe for a run that carries one (the rule's validation
    runs, contended runs and slow sittings: placements.plan_at_sitting), else predicted_s."""
    if scope.history_reason(doc, run) == scope.NO_SITTING_PROBE:
        return predicted_s(doc, run)
    return plan_at_sitting(doc, run)


def _within(doc: dict, run: dict, tolerance: float = TOLERANCE) -> bool:
    return abs(planned(doc, run) - run["seconds_per_step"]) <= tolerance * run["seconds_per_step"]


def _recorded_runs(calibration: bool):
    """(id, document, run) of every trained run of the CPU bench documents (the CALIBRATION document's or every other
    one's), the CALIBRATION_RUNS left out."""
    for name, doc in scope.recorded_documents(os.path.join(REPO, "docs", "bench")):
        if (name == CALIBRATION) != calibration or doc["job"].get("accelerator", "cpu") != "cpu":
            continue
        for r in doc["runs"]:
            rid = scope.run_id(name, doc, r)
            if r["ok"] and not r.get("disabled") and rid not in CALIBRATION_RUNS:
                yield rid, doc, r


def _params(calibration: bool, history: bool = False):
    """pytest params of the runs the rule validates (or, `history`, of the rest); the CALIBRATION document's six."""
    out = []
    for rid, doc, r in _recorded_runs(calibration):
        if not calibration and (scope.history_reason(doc, r) is not None) != history:
            continue
        kind, why = EXPECTED_MISSES.get(rid, (None, None))
        marks = [pytest.mark.xfail(strict=True, reason=f"time model error above 15% ({kind}: {why})")] \
            if kind and not calibration and not history else []
        out.append(pytest.param(doc, r, id=rid, marks=marks))
    return out


VALIDATION = _params(False)
HISTORY = _params(False, history=True)


def test_calibration_constant_is_the_fit():
    """CPU_CALIBRATED_GFLOPS zeroes the mean relative error on the calibration document's six runs, to 0.5 GFLOP/s
    (bisection: the SSD terms make s/step affine, not proportional, in 1 / GFLOP/s)."""
    runs = [(p.values[0], p.values[1]) for p in _params(True)]
    assert len(runs) == 6

    def mean_error(gflops):
        return sum(predicted_s(d, r, gflops) / r["seconds_per_step"] - 1 for d, r in runs) / len(runs)

    lo, hi = 10.0, 10_000.0
    while hi - lo > 0.05:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_error(mid) > 0 else (lo, mid)
    assert abs(lo - CPU_CALIBRATED_GFLOPS) < 0.5, lo


def test_the_rule_reads_the_record_not_the_result():
    """Whether a run validates the model does not change with its measured step time: the rule reads the record's
    probes and load gauge only (a run made 3x slower or faster keeps its place)."""
    for p in VALIDATION + HISTORY:
        doc, run = p.values
        reason = scope.history_reason(doc, run)
        for f in (1 / 3, 3):
            assert scope.history_reason(doc, {**run, "seconds_per_step": run["seconds_per_step"] * f}) == reason


def test_expected_misses_are_validation_runs():
    """Each entry of EXPECTED_MISSES names a run this file validates (a renamed document or run would leave an entry
    that excuses nothing), with a known kind of cause."""
    assert not EXPECTED_MISSES.keys() - {p.id for p in VALIDATION}
    assert {kind for kind, _ in EXPECTED_MISSES.values()} <= {SLOW_VM, AT_CAP, LOADED, BEATS_ITS_BOUND, REPEAT_SPREAD}


def test_expected_misses_are_at_most_a_tenth():
    """The listed misses are at most MISSES_SHARE of the validation runs."""
    assert len(EXPECTED_MISSES) <= MISSES_SHARE * len(VALIDATION), (len(EXPECTED_MISSES), len(VALIDATION))


def test_each_expected_miss_has_its_cause_in_its_record():
    """The cause each entry states is in the records: a cgroup peak near the run's cap, a slow VM, measured by the
    sitting's stock run against the same command's stock runs on the same CPU model in the other validation sittings,
    other processes on the cores (the bench's load gauge), memascend's dram row beating the ZeRO-Offload run its plan
    takes as its bound, or repeats of one command spreading wider than the tolerance."""
    runs = {p.id: p.values for p in VALIDATION}
    for rid, (kind, _) in EXPECTED_MISSES.items():
        doc, run = runs[rid]
        if kind == AT_CAP:
            assert run["cgroup"]["peak_bytes"] >= AT_CAP_SHARE * doc["job"]["dram_cap_bytes"], rid
            continue
        if kind == LOADED:
            assert run["others_cpu_seconds"] >= LOADED_CORES * run["wall_s"], rid
            continue
        if kind == BEATS_ITS_BOUND:
            assert run["mode"] == "memascend" and run["placement"]["placement"] == "dram", rid
            stock = next(r for r in doc["runs"] if _stock_offload(r))
            assert run["seconds_per_step"] <= (1 - BOUND_MARGIN) * stock["seconds_per_step"], rid
            continue
        if kind == REPEAT_SPREAD:
            repeats = _repeats(rid)
            assert max(repeats) >= (1 + TOLERANCE) * min(repeats), (rid, repeats)
            assert abs(planned(doc, run) / statistics.median(repeats) - 1) <= TOLERANCE, rid
            continue
        assert kind == SLOW_VM, rid
        stock = next(r for r in doc["runs"] if _stock_offload(r))
        assert stock["seconds_per_step"] >= SLOW_VM_FACTOR * statistics.median(_same_job_stock(doc)), rid


def _repeats(rid: str) -> list[float]:
    """s/step of the validation runs of the same name in the rounds of `rid`'s sitting (ssd_bound_rounds: documents
    NAME-roundK), `rid`'s own included."""
    import re

    def key(run_id):
        name, _, _, run = run_id.split(":")
        return re.sub(r"-round\d+\.json$", "", name), run

    assert re.search(r"-round\d+\.json:", rid), rid
    return [p.values[1]["seconds_per_step"] for p in VALIDATION if key(p.id) == key(rid)]


def _stock_offload(run: dict) -> bool:
    """Stock DeepSpeed's ZeRO-Offload run of a document (tuned knobs at the dram placement): no commit of this project
    changes what it runs, so its speed gauges the machine's."""
    return run["mode"] == "tuned" and (run.get("placement") or {}).get("placement") == "dram"


def _same_job_stock(doc: dict) -> list[float]:
    """s/step of the stock ZeRO-Offload runs of validation documents with `doc`'s job and cap, no listed miss."""
    key = _job_key(doc)
    out = [r["seconds_per_step"] for p in VALIDATION for d, r in [p.values]
           if _stock_offload(r) and p.id not in EXPECTED_MISSES and _job_key(d) == key]
    assert out, key
    return out


def _job_key(doc: dict) -> tuple:
    """The job and the CPU it ran on: a VM's speed is gauged against the same CPU model's runs."""
    job = doc["job"]
    return job.get("model"), job["layers"], job["seq_len"], job.get("dtype"), job.get("dram_cap_bytes"), _cpu_model(doc)


def _cpu_model(doc: dict) -> str | None:
    return (doc["job"].get("timing") or {}).get("cpu_model")


def test_no_validation_run_was_fitted_on():
    """The calibration runs (CPU_CALIBRATED_GFLOPS: the CALIBRATION document; the host terms: one run each) are
    recorded runs, and none of them is a validation run."""
    fitted = {p.id for p in _params(True)}
    assert len(fitted) == 6 and all(rid.startswith(CALIBRATION + ":") for rid in fitted)
    for rid in CALIBRATION_RUNS:
        name, _, _, run = rid.split(":")
        assert any(r["name"] == run for r in _recorded(name)["runs"]), rid
        fitted.add(rid)
    assert not fitted & {p.id for p in VALIDATION}


def test_validation_holds_every_placement_of_both_engines():
    """The validation runs hold tuned stock and memascend, stock's DRAM rows (ZeRO-Offload and the split) and
    memascend's dram and split placements and all-SSD runs: the rule leaves none of the plan's rows untested."""
    runs = [p.values[1] for p in VALIDATION]
    seen = {(r["mode"], (r.get("placement") or {}).get("placement") or "ssd") for r in runs}
    assert {("tuned", "ssd"), ("tuned", "dram"), ("memascend", "ssd"), ("memascend", "dram"),
            ("memascend", "split")} <= seen, seen


def test_the_plan_ranks_each_sittings_runs_as_measured():
    """Within each validation document (one sitting: a placement point's stock, tuned and memascend runs), the plan
    orders every two runs as they measured wherever their measured s/step differ by more than TOLERANCE: the plan
    picks the placement to recommend by that order."""
    by_doc: dict[int, list] = {}
    for p in VALIDATION:
        by_doc.setdefault(id(p.values[0]), []).append((p.id, *p.values))
    pairs = 0
    for runs in by_doc.values():
        for i, (aid, doc, a) in enumerate(runs):
            for bid, _, b in runs[i + 1:]:
                if {aid, bid} & EXPECTED_MISSES.keys():
                    continue  # a listed miss's measured time is its cause's (a slow VM, its cap), not the model's
                if abs(a["seconds_per_step"] - b["seconds_per_step"]) <= TOLERANCE * max(a["seconds_per_step"],
                                                                                         b["seconds_per_step"]):
                    continue
                pairs += 1
                assert (planned(doc, a) < planned(doc, b)) == (a["seconds_per_step"] < b["seconds_per_step"]), \
                    (a["name"], b["name"], doc["job"].get("dram_cap_bytes"))
    assert pairs >= 10, pairs


@pytest.mark.parametrize("doc,run", VALIDATION)
def test_step_time_within_15_percent(doc, run):
    """The plan at the run's sitting probe within TOLERANCE of its measured s/step."""
    measured = run["seconds_per_step"]
    assert abs(planned(doc, run) - measured) <= TOLERANCE * measured, (planned(doc, run), measured)


def test_history_within_its_looser_tolerance():
    """History runs (validation_scope.history_reason: no sitting probe, contended, a slow sitting), planned at their
    sitting's probe where they carry one, else as the bench planned them: each engine's median error within
    HISTORY_TOLERANCE."""
    errors: dict[str, list[float]] = {}
    for p in HISTORY:
        doc, run = p.values
        errors.setdefault(run["mode"], []).append(abs(planned(doc, run) / run["seconds_per_step"] - 1))
    assert errors.keys() == {"stock", "tuned", "memascend"}
    for engine, errs in errors.items():
        assert statistics.median(errs) <= HISTORY_TOLERANCE, (engine, statistics.median(errs), len(errs))


def _host_term_fit(doc: dict, run: str, terms: dict[str, float], elems: int | None = None) -> dict[str, float]:
    """{phase: ns per element} that would make `run`'s measured phase seconds (steps after the first, median; backward:
    forward to optimizer marks, the step: optimizer to the next forward) the time model's, given `terms` in it."""
    import statistics

    r = next(r for r in doc["runs"] if r["name"] == run)
    at = {p["name"]: p["at_s"] for p in r["phases"]}
    steps = [s for s in range(2, 100) if f"step{s}_optimizer" in at]
    measured = {"backward": statistics.median(at[f"step{s}_optimizer"] - at[f"step{s}_forward"] for s in steps),
                "optimizer": statistics.median(at[f"step{s}_forward"] - at[f"step{s - 1}_optimizer"] for s in steps)}
    p = configs.repredict(doc, r)
    elems = elems or p["ssd_traffic"]["read_bytes_per_step"] / p["ssd_traffic"]["read_bytes_per_param"]
    phase = {"backward": tm.PHASE_FORWARD_BACKWARD, "optimizer": tm.PHASE_OPTIMIZER}
    return {k: (measured[k] - p["time"]["phase_seconds"][phase[k]]) / elems * 1e9 + ns for k, ns in terms.items()}


def test_stock_host_copies_are_the_fit():
    """STOCK_CPU_HOST_NS_PER_ELEMENT is (measured - modelled) phase seconds per element of STOCK_HOST_CALIBRATION's
    stock run, to 0.1 ns."""
    name, _, _, run = STOCK_HOST_CALIBRATION.split(":")
    fitted = _host_term_fit(_recorded(name), run, tm.STOCK_CPU_HOST_NS_PER_ELEMENT)
    for k, ns in tm.STOCK_CPU_HOST_NS_PER_ELEMENT.items():
        assert abs(fitted[k] - ns) < 0.1, (k, fitted)


def _dram_terms_fit(calibration: str, terms: dict[str, float], cpu: str) -> dict[str, float]:
    """_host_term_fit of a run of `cpu` whose every state is in DRAM (its SSD terms none), with the compute at its
    sitting's matmul probe (as plan_at_sitting)."""
    import copy

    name, _, _, run = calibration.split(":")
    doc = copy.deepcopy(_recorded(name))
    assert _cpu_model(doc).startswith(cpu), (calibration, _cpu_model(doc))
    timing = doc["job"]["timing"]
    timing["gflops"] = doc["hardware"]["sitting"]["fp32_gflops"] * timing["cpu_fraction"]  # as plan_at_sitting
    r = next(r for r in doc["runs"] if r["name"] == run)
    assert configs.repredict(doc, r)["ssd_traffic"]["read_bytes_per_step"] == 0  # all in DRAM: the terms apply
    return _host_term_fit(doc, run, terms, elems=doc["job"]["num_params"])


@pytest.mark.parametrize("cpu", tm.HOST_CPUS)
def test_stock_offload_host_terms_are_the_fit(cpu):
    """STOCK_CPU_OFFLOAD_HOST_NS_PER_ELEMENT of each CPU is (measured - modelled) phase seconds per element of that
    CPU's STOCK_OFFLOAD_HOST_CALIBRATION ZeRO-Offload run with the compute at its sitting's matmul probe, to 0.1 ns."""
    terms = tm.STOCK_CPU_OFFLOAD_HOST_NS_PER_ELEMENT[cpu]
    fitted = _dram_terms_fit(STOCK_OFFLOAD_HOST_CALIBRATION[cpu], terms, cpu)
    for k, ns in terms.items():
        assert abs(fitted[k] - ns) < 0.1, (k, fitted)


def test_memascend_dram_host_terms_are_the_fit():
    """MEMASCEND_DRAM_HOST_NS_PER_ELEMENT is (measured - modelled) phase seconds per element of
    MEMASCEND_DRAM_HOST_CALIBRATION's run (memascend's dram row fetching its parameters from the tier: no overlap,
    chunks stepped in place) with the compute at its sitting's matmul probe, to 0.1 ns."""
    fitted = _dram_terms_fit(MEMASCEND_DRAM_HOST_CALIBRATION, tm.MEMASCEND_DRAM_HOST_NS_PER_ELEMENT,
                             "Intel(R) Xeon(R)")
    for k, ns in tm.MEMASCEND_DRAM_HOST_NS_PER_ELEMENT.items():
        assert abs(fitted[k] - ns) < 0.1, (k, fitted)


def _fit_constant(constant: str, calibration: str, predict, hi: float, tol: float, lo: float = 0.0,
                  cpu: str | None = None) -> float:
    """The value of planner.time's `constant` (its `cpu` entry, for a per-CPU term) that makes `calibration`'s run's
    `predict`(doc, run) its measured s/step (bisection over [lo, hi] to `tol`: the step time grows with the constant);
    the constant is restored."""
    name, _, _, run = calibration.split(":")
    doc = _recorded(name)
    r = next(r for r in doc["runs"] if r["name"] == run)
    table = getattr(tm, constant) if cpu else None
    kept = table[cpu] if cpu else getattr(tm, constant)

    def put(value):
        if cpu:
            table[cpu] = value
        else:
            setattr(tm, constant, value)

    try:
        while hi - lo > tol:
            mid = (lo + hi) / 2
            put(mid)
            lo, hi = (mid, hi) if predict(doc, r) < r["seconds_per_step"] else (lo, mid)
    finally:
        put(kept)
    return lo


def test_memascend_host_term_is_the_fit():
    """MEMASCEND_CPU_HOST_NS_PER_ELEMENT makes MEMASCEND_HOST_CALIBRATION's memascend run's planned s/step its
    measured one, to 0.1 ns."""
    fitted = _fit_constant("MEMASCEND_CPU_HOST_NS_PER_ELEMENT", MEMASCEND_HOST_CALIBRATION, predicted_s, 100.0, 0.01)
    assert abs(fitted - tm.MEMASCEND_CPU_HOST_NS_PER_ELEMENT) < 0.1, fitted


def test_gradient_write_blocking_is_the_fit():
    """MEMASCEND_GRADIENT_WRITE_BLOCKING makes GRADIENT_BLOCKING_CALIBRATION's memascend run's plan at its sitting's
    matmul probe (plan_at_sitting: the bench plans with a fresh probe) its measured s/step, to 0.02."""
    fitted = _fit_constant("MEMASCEND_GRADIENT_WRITE_BLOCKING", GRADIENT_BLOCKING_CALIBRATION, plan_at_sitting, 3.0,
                           0.001)
    assert abs(fitted - tm.MEMASCEND_GRADIENT_WRITE_BLOCKING) < 0.02, fitted


def test_overlap_serial_share_is_the_fit():
    """MEMASCEND_OVERLAP_SERIAL_SHARE makes OVERLAP_SERIAL_CALIBRATION's memascend run (all on the SSD, the optimizer
    overlapped, no clipping: no gradient written) plan at its sitting's matmul probe its measured s/step, to 0.005."""
    fitted = _fit_constant("MEMASCEND_OVERLAP_SERIAL_SHARE", OVERLAP_SERIAL_CALIBRATION, plan_at_sitting, 3.0, 0.0005)
    assert abs(fitted - tm.MEMASCEND_OVERLAP_SERIAL_SHARE) < 0.005, fitted


@pytest.mark.parametrize("cpu", tm.HOST_CPUS)
def test_todays_engine_delta_is_the_fit(cpu):
    """MEMASCEND_WORKER_THREADS_HOST_NS_PER_ELEMENT of each CPU makes that CPU's NORM_WORKER_CALIBRATION memascend run
    (today's engine: its counters count norms_on_worker) plan at its sitting's matmul probe its measured s/step, to
    0.1 ns."""
    assert _cpu_model(_recorded(NORM_WORKER_CALIBRATION[cpu].split(":")[0])).startswith(cpu)
    fitted = _fit_constant("MEMASCEND_WORKER_THREADS_HOST_NS_PER_ELEMENT", NORM_WORKER_CALIBRATION[cpu],
                           plan_at_sitting, 60.0, 0.01, lo=-tm.MEMASCEND_CPU_HOST_NS_PER_ELEMENT, cpu=cpu)  # a delta
    assert abs(fitted - tm.MEMASCEND_WORKER_THREADS_HOST_NS_PER_ELEMENT[cpu]) < 0.1, fitted


# The plan's SSD bytes per step against the bench's block-I/O counters: the term every DRAM-resident byte is credited
# in (stock's max_in_cpu, planner.ssd.params_in_dram; memascend's kept partitions), per direction, on every recorded
# run (the GPU kit's too: stock there keeps its parameters in DRAM with max_in_cpu, 16.0 B/param read against tuned's
# 20.5).
BYTES_TOLERANCE = 0.10
MASTER_READ = "master read back"  # engine counters: the fp32 master mostly read from the SSD, not kept partitions
CHECKPOINTS_ON_SSD = "checkpoints on the SSD"  # engine counters: a dram placement's checkpoints went to the region
EXPECTED_BYTE_MISSES: dict[str, tuple[str, str]] = {
    **{f"placements-clip10-quiet-{d}.json:4:512:{r}": (
        CHECKPOINTS_ON_SSD, "the bench passed the dram row's checkpoint_offload to the engine only since these runs: "
        "each step wrote and read its activation checkpoints, 8.4 MB, where the plan keeps them in DRAM")
       for d in ("cap-4GiB", "dram-overlap-on-off-cap4gib", "dram-overlap-on-off-cap8gib") for r in ("memascend",)},
    **{f"llama-3.2-1b-seq1024-fp32-{d}.json:16:1024:memascend": (
        MASTER_READ, "the engine before partitions were kept for the master: reads +30%") for d in (
        "ssd400mbs-noclip-memascend-amd-quiet", "ssd400mbs-noclip-memascend-amd-rerun",
        "unthrottled-noclip-memascend")},
}


def _gpu_runs():
    """(id, document, run) of the GPU kit's recorded bench runs (docs/bench/gpu: one bench document per engine)."""
    for path in sorted(recorded_summaries(os.path.join(REPO, "docs", "bench", "gpu", "*.json"))):
        name = os.path.basename(path).removesuffix(RECORDED_GZIP)
        for model, docs in ((read_summary(path).get("bench") or {}).get("documents") or {}).items():
            for key, doc in docs.items():
                for r in doc.get("runs") or [] if isinstance(doc, dict) else []:
                    if r.get("ok"):
                        yield f"{name}:{model}:{key}:{r['name']}", doc, r


BYTE_RUNS = [pytest.param(doc, run, id=rid, marks=[pytest.mark.xfail(
                 strict=True, reason=f"SSD bytes off by more than 10% ({': '.join(EXPECTED_BYTE_MISSES[rid])})")]
                 if rid in EXPECTED_BYTE_MISSES else [])
             for rid, doc, run in [(p.id, *p.values) for p in VALIDATION + HISTORY + _params(True)] + list(_gpu_runs())
             if run.get("ssd_read_bytes_per_step")]


@pytest.mark.parametrize("doc,run", BYTE_RUNS)
def test_ssd_bytes_per_step_within_10_percent(doc, run):
    """Read and written bytes of a steady step (the bench's block-I/O counters of the run's rank 0) within
    BYTES_TOLERANCE of the plan's traffic (planner.ssd.ssd_traffic), each direction."""
    st = configs.repredict(doc, run)["ssd_traffic"]
    for measured, planned in ((run["ssd_read_bytes_per_step"], st["read_bytes_per_step"]),
                              (run["ssd_write_bytes_per_step"], st["write_bytes_per_step"])):
        assert abs(measured - planned) <= BYTES_TOLERANCE * planned, (measured, planned)


def test_each_expected_byte_miss_has_its_cause_in_its_record():
    """A byte miss is a recorded run whose engine counters show its stated cause: the master mostly read back from the
    SSD (master_bytes_from_memory under half of the 4 B per element a committed step takes from memory), or a dram
    placement's activation checkpoints on the region (checkpointing.on_ssd: the only bytes it moved)."""
    runs = {p.id: p.values for p in BYTE_RUNS}
    for rid, (kind, _) in EXPECTED_BYTE_MISSES.items():
        doc, run = runs[rid]
        if kind == CHECKPOINTS_ON_SSD:  # a dram placement: only the checkpoints, written once and read back once
            assert run["placement"]["placement"] == "dram" and run["engine_stats"][0]["checkpointing"]["on_ssd"], rid
            assert run["ssd_read_bytes_per_step"] == pytest.approx(run["ssd_write_bytes_per_step"], rel=0.01), rid
            continue
        assert kind == MASTER_READ, rid
        st, overlap = configs.repredict(doc, run)["ssd_traffic"], run["engine_stats"][0]["overlap"]
        elems = st["read_bytes_per_step"] / st["read_bytes_per_param"]
        assert overlap["master_bytes_from_memory"] < 0.5 * 4 * elems * overlap["steps_committed"], rid
