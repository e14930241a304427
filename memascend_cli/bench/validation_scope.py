"""Which recorded bench runs test the time model as a user meets it: a rule over what each record holds, never over
whether its plan misses. A user's plan uses the machine's measured rates (`memascend inspect`'s cached probe); a bench
record that carries its sitting's own matmul probe (hardware.sitting, seconds before the runs) and the SSD rate it ran
at is planned with those (placements.plan_at_sitting): what the plan says of that machine that hour. The rest stays
as history, reported beside it: records without a sitting probe (older ones, VMs that no longer exist), runs whose
load gauge shows other jobs on the cores, and sittings whose probe ran under the machine's cached rate (a degraded VM:
on 2026-12-06 21:00-21:50 the probe ran 6-25% under the cache while stock ZeRO-Offload took 1.7-2.2x the step it took
at 16:58 and 22:45 in the same config). Stdlib at import: scripts/results.py reads the documents through it."""

from __future__ import annotations

CONTENDED_CORES = 0.5
"""Cores of the node other processes kept busy while a run ran (the bench's gauge: runs[].others_cpu_seconds over its
wall_s) from which the run's step time is the load's, not the machine's: on these 2-core VMs a quarter of the CPU."""
MACHINE_SPEED = 0.95
"""A sitting whose fp32 matmul probe ran under this fraction of the cached probe the plan used (cached_fp32_gflops)
ran on a slower machine than the one the plan describes."""

CALIBRATION_DOCUMENT = "depth-sweep-seq2048-rep3-fp32.json"
"""The document the older records' CPU rate is fitted on (every run of it; tests/unit/test_time_validation.py)."""
STOCK_HOST_CALIBRATION = "bench-llama-136m-seq512-fp32-ssd400mbs-three-engines-clip10-budget1gib.json:8:512:stock"
MEMASCEND_HOST_CALIBRATION = ("bench-llama-136m-seq512-fp32-unthrottled-three-engines-clip10-amd-counters.json:8:512:"
                              "memascend")
STOCK_OFFLOAD_HOST_CALIBRATION = {
    "Intel(R) Xeon(R)": "placements-clip10-quiet-dram-overlap-on-off-cap4gib.json:4:512:tuned",
    "AMD EPYC": "placements-clip10-dram-cap4gib-0925-sitting1.json:4:512:tuned"}
GRADIENT_BLOCKING_CALIBRATION = "placements-clip10-quiet-cap-2.75GiB.json:4:512:memascend"
MEMASCEND_DRAM_HOST_CALIBRATION = "placements-clip10-dram-cap4gib-2245-sitting1.json:4:512:memascend"
NORM_WORKER_CALIBRATION = {
    "Intel(R) Xeon(R)": "placements-clip10-quiet3-calibration-split-cap2.5gib.json:4:512:memascend",
    "AMD EPYC": "bench-llama-136m-seq512-bf16-ssd400mbs-noclip-rounds-quiet6-round1.json:8:512:memascend"}
"""The per-CPU terms' runs, by the CPU (planner.time HOST_CPUS); on the AMD EPYC VM the first quiet run of its kind."""
OVERLAP_SERIAL_CALIBRATION = "bench-llama-136m-seq512-bf16-ssd400mbs-noclip-rounds-quiet-round1.json:8:512:memascend"
CALIBRATION_RUNS = (STOCK_HOST_CALIBRATION, MEMASCEND_HOST_CALIBRATION, GRADIENT_BLOCKING_CALIBRATION,
                    OVERLAP_SERIAL_CALIBRATION, *STOCK_OFFLOAD_HOST_CALIBRATION.values(),
                    MEMASCEND_DRAM_HOST_CALIBRATION, *NORM_WORKER_CALIBRATION.values())
"""The runs (document file name:layers:seq_len:run) a planner.time host or time term is fitted on, one each (one per
CPU for the per-CPU terms), named in its docstring: not validation runs."""

NO_SITTING_PROBE = "no sitting probe"
NO_GAUGE = "no load gauge"
CONTENDED = "contended"
SLOW_SITTING = "slow sitting"
UNPRICED_CONFIG = "a configuration the plan never makes"
"""memascend's dram placement run with its optimizer overlapped with backward (its engine options): the plan's dram
row runs without the overlap (planner.placement.memascend_dram_row) and the time model has no term for the tier's
copies at submit the overlap makes on the thread that drives backward (engine/dram_tier.py TieredStore.submit, 2.7 GB
a step); the validation tests the configurations the plan recommends."""


def history_reason(doc: dict, run: dict) -> str | None:
    """None where the recorded `run` of bench document `doc` tests the time model (planned at its sitting's probe);
    else which part of the rule keeps it as history. Reads the record only. Pure."""
    from memascend_cli.bench.configs import engine_option, recorded_probe_gflops, recorded_timing

    job = doc["job"]
    sitting = (doc.get("hardware") or {}).get("sitting") or {}
    if (recorded_timing(job) is None or recorded_probe_gflops(job.get("timing") or {}) is None
            or not sitting.get(f"{job.get('dtype', 'fp32')}_gflops") or not sitting.get("fp32_gflops")
            or not sitting.get("cached_fp32_gflops")):
        return NO_SITTING_PROBE
    if run.get("others_cpu_seconds") is None or not run.get("wall_s"):
        return NO_GAUGE
    if (run.get("placement") or {}).get("placement") == "dram" and run.get("mode") == "memascend" and \
            engine_option(run, "overlap_optimizer", False):
        return UNPRICED_CONFIG
    if run["others_cpu_seconds"] / run["wall_s"] >= CONTENDED_CORES:
        return CONTENDED
    if sitting["fp32_gflops"] < MACHINE_SPEED * sitting["cached_fp32_gflops"]:
        return SLOW_SITTING
    return None


def recorded_documents(bench_dir: str):
    """(file name without RECORDED_GZIP, document) of every `memascend bench` point document under `bench_dir`
    (docs/bench), a sweep's points one by one; capacity probes (runs at their DRAM cap, where reclaim sets the pace,
    not the time model) and the user-script and placement harness records left out."""
    import os

    from memascend_cli.bench.document import RECORDED_GZIP, read_summary, recorded_summaries

    for path in recorded_summaries(os.path.join(bench_dir, "**", "*.json")):
        if os.sep + "capacity" + os.sep in path:
            continue
        d = read_summary(path)
        for doc in d.get("documents") or [d]:
            if "runs" in doc and "hardware" in doc and "layers" in (doc.get("job") or {}):
                yield os.path.basename(path).removesuffix(RECORDED_GZIP), doc


def run_id(name: str, doc: dict, run: dict) -> str:
    """A recorded run's id: document file name:layers:seq_len:run name. Pure."""
    return f"{name}:{doc['job']['layers']}:{doc['job']['seq_len']}:{run['name']}"
