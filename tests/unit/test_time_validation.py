"""`memascend plan`'s step time on bench runs it was not fitted on: within 15% of the measured s/step.

The CPU's achieved GFLOP/s (CPU_CALIBRATED_GFLOPS) is fitted on docs/bench/depth-sweep-seq2048-rep3-fp32.json.gz and
stock's host copies on the CPU accelerator (planner.time.STOCK_CPU_HOST_NS_PER_ELEMENT) on one stock run
(STOCK_HOST_CALIBRATION); every other committed bench run is validation. The older documents record no SSD
bandwidth (their regions were made with --no-probe): READ_GBPS / WRITE_GBPS are the disk's, measured afterwards by
`memascend prepare-ssd`'s probe, not fitted. Documents that record the time model's inputs (`job.timing`, bench since
--ssd-bandwidth: their machine's CPU probe, the throttle or the region's probe) are predicted with those."""

import os

import pytest

from memascend_cli.bench import configs
from memascend_cli.bench.document import RECORDED_GZIP, read_summary, recorded_summaries
from memascend_cli.planner import time as tm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CALIBRATION = "depth-sweep-seq2048-rep3-fp32.json"
STOCK_HOST_CALIBRATION = "bench-llama-136m-seq512-fp32-ssd400mbs-three-engines-clip10-budget1gib.json:8:512:stock"
MEMASCEND_HOST_CALIBRATION = ("bench-llama-136m-seq512-fp32-unthrottled-three-engines-clip10-amd-counters.json:8:512:"
                              "memascend")
TOLERANCE = 0.15
READ_GBPS, WRITE_GBPS = 3.751, 6.584
"""The VM disk under /var/tmp (where the documents' regions and swap directories were), as `memascend prepare-ssd`'s
bandwidth probe measured it on 2026-11-25 (2 GiB region file, best of 6 block size x queue depth settings)."""
CPU_CALIBRATED_GFLOPS = 184.1
"""fp32 GFLOP/s a DeepSpeed step achieved on the 2-core AMD EPYC VM the documents were recorded on: the mean of
measured / modelled s/step over the six runs of the calibration document (tuned and memascend at 8/16/32 layers; 175.5
before tuned stock got stock's host passes on the CPU accelerator, 2026-11-27)."""

# Runs the model misses by more than TOLERANCE today (strict: one that comes within it fails until taken off):
# - documents recorded before 2026-11-24T04:00 (OTHER_VM_BEFORE) ran on the earlier AVX2 VM (see
#   test_planner_validation.py), 31-61% slower than this model of the AVX-512 VM; the calibrated rate is not theirs
#   (two tuned runs there come within: OTHER_VM_WITHIN);
# - tiny-llama bf16 / fp16: 3.3 s per step of DeepSpeed's CPU 16-bit path for a 6M model, not in the model (-97%);
# - seq 256 with one rank (tiny-llama fp32, SmolLM2-360M 32 layers, Qwen2.5-0.5B 8 layers): 15-40% short (SmolLM2's
#   tuned run too since parameters count 2 fetches per step, not 3: -18.5%), and
#   two ranks 30-43% short: a per-layer, per-step cost (hooks, fetch latency, gloo) that long contexts hide and that
#   the model has no term for;
# - the SSD-bound sittings (docs/bench/ssd-bound/, 2026-11-25, an Intel VM whose CPU probe the documents record):
#   runs during which the bench's samplers and other jobs on the shared 2 cores took 0.7-1.2 cores
#   (runs[].others_cpu_seconds + bench_cpu_seconds; sitting 1 has no gauge) compute up to 2.3x slower than the
#   probe's rate for both cores; docs/results/time.md's "plan at the cores got" gives the same model at the cores
#   they got.
# - gradient accumulation 8 at 400 MB/s (ssd-bound/...-ga8, 2026-11-26): +26%. On the CPU accelerator the model adds
#   each micro-batch's parameter reads to its compute, and memascend's pool keeps the last forward layers for
#   backward (72 B/param read where the plan counts 81); over 8 micro-batches both add up (at 1 micro-batch, the
#   same sitting's -ga1 run is within 4%).
# - qwen2.5-1.5b bf16 seq 1024 under a 12 GiB cap (capped/, 2026-11-26): 54.4 s/step, where the calibrated fp32 rate
#   gives 85 s (+57%) and the CPU probe's bf16 GEMM rate (893.6 GFLOP/s, 6x its fp32 one) 26 s (-53%): a DeepSpeed
#   bf16 step on this CPU gets neither; the model has no bf16 CPU rate of its own yet. The same at 400 MB/s on
#   bench-llama-136m bf16 (ssd-bound/...-bf16-...-overlap-clip10, 2026-11-26): memascend -13% / -11%. And again in
#   capped/...-bounded-norm (2026-11-26, another VM): memascend 63.2 s/step, the calibrated rate 85 s (+35%).
# - llama-3.2-1b fp32 under a 12 GiB cap: capped/llama-3.2-1b-fp32-seq1024-cap12gib (2026-11-26 02:13, the Intel VM,
#   fp32 probe 144.5 GFLOP/s) 81.9 s/step and capped/llama-...-bounded-norm (2026-11-26 18:37, an AMD EPYC VM, probe
#   172.2) 96.0 s/step, both 20% or more longer than the plan. The capped runs record no SSD rate, so the test plans
#   them at the calibrated CPU rate (fitted on the AMD EPYC VM's depth sweep), not the probe's.
# - unthrottled with the overlap (ssd-bound/...-unthrottled-overlap-clip10, 2026-11-26, the Intel VM, no other jobs):
#   tuned +17%, memascend +16% with the host terms fitted on the AMD VM (-16% and -32% without them; stock +8%).
#   The same for memascend in tuned-glibc-threshold-l8-seq2816-fp32 (2026-11-26, unthrottled, seq 2816): -25%.
# - tuned on bench-llama-136m fp32 at 400 MB/s (ssd-bound/...-fp32-ssd400mbs-overlap-*, -bf16-moments-clip10,
#   2026-11-26): +17% to +20%. Its optimizer phase is within 2% of the model (6.7-6.8 s against 6.9 s: the two
#   embedding sub-groups serial, the layers' overlapped, _serial_swaps), but forward + backward took 4.3 s where the
#   model adds the 2.7 s of parameter reads to the 3.5 s of compute: DeepSpeed's NVMe prefetch hid the reads behind
#   the fp32 matmuls there (the forward took about its reads, the backward about its compute), while on
#   llama-3.2-1b the same engine's forward and backward took about compute + reads. The model keeps the sum.
OTHER_VM_BEFORE = "2026-11-24T04:00"
OTHER_VM_WITHIN = {"bench-llama-136m-fp32.json:8:512:tuned", "tuned-heap-l32-seq2048-fp32.json:32:2048:tuned"}
_SSD = "bench-llama-136m-seq512-fp32-"
CONTENDED = {f"{_SSD}{doc}.json:8:512:{run}" for doc, runs in (
    ("ssd400mbs-sitting1", "tuned"), ("ssd400mbs-sitting3", "tuned"),
    ("unthrottled-sitting1", "stock tuned memascend"), ("unthrottled-sitting2", "stock tuned memascend"),
    ("unthrottled-sitting3", "stock"), ("unthrottled-sitting4", "stock tuned memascend")) for run in runs.split()} | {
    # a memory validation run (2026-11-27) beside benchmarks/layer_backward_memory.py: 460 CPU-s of other processes
    "llama-3.2-1b-fp32-seq1024-cap12gib-layer-backward.json:16:1024:memascend"}
KNOWN_MISSES = {f"{doc}:{run}" for doc in ("tiny-llama-bf16.json:2:256", "tiny-llama-fp16.json:2:128",
                                           "bench-llama-136m-2ranks-fp32.json:8:256")
                for run in ("stock", "tuned", "memascend")} | {"tiny-llama-fp32.json:2:256:memascend",
                                                               "qwen2.5-0.5b-8l-fp32.json:8:256:memascend",
                                                               "smollm2-360m-fp32.json:32:256:tuned",
                                                               "smollm2-360m-fp32.json:32:256:memascend",
                                                               "qwen2.5-1.5b-bf16-seq1024-cap12gib-memascend.json:28:"
                                                               "1024:memascend",
                                                               "qwen2.5-1.5b-bf16-seq1024-cap12gib-bounded-norm.json:"
                                                               "28:1024:memascend",
                                                               *(f"llama-3.2-1b-fp32-seq1024-cap12gib{d}.json:16:1024:"
                                                                 "memascend" for d in ("", "-bounded-norm")),
                                                               "bench-llama-136m-seq512-fp32-ssd400mbs-ga8.json:8:512:"
                                                               "memascend",
                                                               *(f"{_SSD}unthrottled-overlap-clip10.json:8:512:{run}"
                                                                 for run in ("tuned", "memascend")),
                                                               "tuned-glibc-threshold-l8-seq2816-fp32.json:8:2816:"
                                                               "memascend",
                                                               *(f"{_SSD}ssd400mbs-{d}.json:8:512:tuned"
                                                                 for d in ("overlap-clip1", "overlap-clip10",
                                                                           "overlap-clip10-budget1gib",
                                                                           "overlap-noclip", "bf16-moments-clip10")),
                                                               # The same job, 3 repeats (2026-11-27; the median-peak
                                                               # one 7.85 s; 7.34-7.85) against 9.3 s with the host term
                                                               # (MEMASCEND_CPU_HOST_NS_PER_ELEMENT): +19%; a single
                                                               # sitting of it an hour earlier (8.9 s) is within
                                                               f"{_SSD}ssd400mbs-params-hold-master-clip10-budget1gib"
                                                               "-repeat3.json:8:512:memascend",
                                                               # Unthrottled on the AMD VM (2026-11-27, no other
                                                               # jobs): stock -18% (the same job an hour later, -5%)
                                                               f"{_SSD}unthrottled-three-engines-clip10-amd.json:8:512:"
                                                               "stock",
                                                               # The host terms on the earlier Intel VM (2026-11-25/26):
                                                               # its throttled memascend runs hid the host work under
                                                               # the I/O where the AMD VM's did not (+24% to +31%), and
                                                               # its stage3 passes took less than stock's fitted ones in
                                                               # tuned (+32%, unthrottled sitting 3)
                                                               *(f"{_SSD}ssd400mbs-{d}.json:8:512:memascend" for d in (
                                                                   "overlap-clip10-budget1gib", "overlap-noclip")),
                                                               f"{_SSD}ssd400mbs-bf16-moments-clip10.json:8:512:"
                                                               "memascend-bf16_moments",
                                                               f"{_SSD}unthrottled-sitting3.json:8:512:tuned",
                                                               # The calibrated rate (CPU_CALIBRATED_GFLOPS) with
                                                               # tuned's host passes: tuned's runs at seq 2048 and below
                                                               # 15-29% long, and memascend's without the overlap 17-20%
                                                               # short, as the calibration document's own runs (tuned
                                                               # +8-13%, memascend -7 to -13%): at seq 2048 tuned's
                                                               # stage3 passes hide partly behind its compute, which the
                                                               # model does not take
                                                               "context-sweep-lt-rep3-fp32.json:8:512:tuned",
                                                               "context-sweep-lt-rep3-fp32.json:8:512:memascend",
                                                               "depth-sweep-seq2048-rep3-mmap1mib-fp32.json:"
                                                               "8:2048:tuned",
                                                               "depth-sweep-seq2048-rep3-mmap1mib-fp32.json:32:2048:"
                                                               "memascend",
                                                               # -22%: the same job again (2026-11-27 21:32, its own
                                                               # bench-created region): 157.9 s/step; forward 45 s,
                                                               # backward 102-109 s. Its reads, 20.5 B/param, were the
                                                               # engine's before partitions were kept for the master:
                                                               # the master of every chunk without a slot at its layer's
                                                               # release was read from the SSD (3.2 B/param the plan,
                                                               # master_from_params, never counted), and the tied
                                                               # embedding fetched three times
                                                               "llama-3.2-1b-seq1024-fp32-ssd400mbs-noclip-memascend-"
                                                               "amd-rerun.json:16:1024:memascend",
                                                               # Engines before partitions were kept for the master,
                                                               # whose reads the plan no longer counts (it counts the
                                                               # tied embedding's third fetch and the pool's last
                                                               # forward layers kept for backward): llama-3.2-1b at 400
                                                               # MB/s on 2026-11-26, 119.7 s/step against 146.6
                                                               # (+22%), and the Intel VM's 136M sitting at 400 MB/s
                                                               # with clipping at 1.0 (2026-11-26), 10.6 against 12.2
                                                               # (+15.4%)
                                                               "llama-3.2-1b-seq1024-fp32-ssd400mbs-noclip-memascend."
                                                               "json:16:1024:memascend",
                                                               f"{_SSD}ssd400mbs-overlap-clip1.json:8:512:memascend",
                                                               # -16%: llama-3.2-1b with partitions kept for the master
                                                               # (2026-11-28 00:16): its reads are the plan's (15.75
                                                               # against 15.71 B/param), its time is not: 147.9 s/step
                                                               # against 123.9, forward 48.7 s; the same job at 01:24,
                                                               # the VM quiet, ran 142.4 (-13%, within)
                                                               "llama-3.2-1b-seq1024-fp32-ssd400mbs-noclip-memascend-"
                                                               "kept-master.json:16:1024:memascend",
                                                               # Unthrottled on 2026-11-28 00:30-00:45, after 2.5 h of
                                                               # benches: a 2048^2 matmul ran 160 GFLOP/s where the
                                                               # recorded probe says 181.6, and tuned stock took 6.45,
                                                               # then 8.0 s/step (plan 6.7) in two sittings 15 minutes
                                                               # apart; stock -18%, memascend -23% and -17%
                                                               *(f"{_SSD}unthrottled-three-engines-clip10-kept-master."
                                                                 f"json:8:512:{run}" for run in ("stock", "memascend")),
                                                               f"{_SSD}unthrottled-kept-master-ablation-clip10.json:8:"
                                                               "512:memascend",
                                                               # +19%: the allocator calibration at seq 4096
                                                               "tuned-heap-l16-seq4096-fp32.json:16:4096:tuned",
                                                               # Stock's CPU passes at seq 3072 (2026-11-29, a quiet
                                                               # VM): 21-27% longer than the model at 8 and 16 layers
                                                               # in stock and tuned, as at seq 4096 above, where the
                                                               # hidden-wide blocks strand in glibc's heap; the seq
                                                               # 2048 calibration and the context sweep's 8192 are
                                                               # within 15%. Likely the machine of that day (below:
                                                               # the calibration's own job ran 1.5x slower 2 h later)
                                                               *(f"heap-arenas-seq3072-fp32.json:{L}:3072:{run}"
                                                                 for L in (8, 16) for run in ("stock", "tuned")),
                                                               "heap-steps5-tuned-l16-seq3072-fp32.json:16:3072:tuned",
                                                               # the same seq-3072 tuned job 5 times (2026-11-29
                                                               # 10:21, run-to-run variation): 25.7 s/step, plan 21.9
                                                               "tuned-l8-seq3072-steps4-repeat5-fp32.json:8:3072:tuned",
                                                               # -24% to -34%: the calibration document's tuned job
                                                               # again (2026-11-29 02:30), 22.4 / 36.5 / 72.2 s/step
                                                               # against its 14.2 / 26.2 / 48.2; memascend at 8 layers
                                                               # in the next sitting as slow (21.3 against 13.9). The
                                                               # matmul probe was unchanged (181.2 GFLOP/s), the VM's
                                                               # disk read 1.6 and wrote 1.3 GB/s (dd, O_DIRECT, 4 MiB),
                                                               # and step 2's backward took 14-15 s of the 22. The
                                                               # machine, not the code: the code of 2026-11-24
                                                               # (30e69ff) ran the same job 21.4 s/step on 2026-11-29
                                                               # 04:45 (today's 20.9); on a RAM-backed ext4 loop device
                                                               # 18.7; plain transformers forward + backward, no
                                                               # DeepSpeed, 13.3 s, the calibration's DeepSpeed step's
                                                               # compute; matmul 152-191 GFLOP/s, copy 31-33 GB/s
                                                               *(f"heap-depth-tuned-seq2048-steps3-fp32.json:{L}:2048:"
                                                                 "tuned" for L in (8, 16, 32)),
                                                               # 28% to 54% longer: the allocator calibration sitting
                                                               # of 2026-11-29 07:19-08:30, the same day's slow VM as
                                                               # above (its matmul probes 133-193 GFLOP/s, cached
                                                               # 181.2: hardware.sitting)
                                                               *(f"tuned-heap-l{L}-seq{S}-steps4-fp32.json:{L}:{S}:"
                                                                 "tuned" for L, S in ((4, 2048), (20, 2048), (28, 2048),
                                                                              (12, 3584), (16, 8192), (4, 16384),
                                                                              (8, 16384)))}


def _date(doc: dict) -> str:
    return (doc.get("meta") or {}).get("date") or doc["job"]["region_header"]["created_at"]


def _docs():
    """(name, point document) of every recorded bench summary; the name is the file's, without RECORDED_GZIP."""
    for path in recorded_summaries(os.path.join(REPO, "docs", "bench", "**", "*.json")):
        if os.sep + "capacity" + os.sep in path:
            continue  # capacity probes: runs at their DRAM cap, where reclaim sets the pace, not the time model
        d = read_summary(path)
        for doc in d.get("documents") or [d]:
            # `memascend bench` documents only: docs/bench also holds user-script and placement harness records.
            if "runs" in doc and "hardware" in doc and "layers" in (doc.get("job") or {}):
                yield os.path.basename(path).removesuffix(RECORDED_GZIP), doc


def _ssd_bound(name: str) -> dict:
    path = os.path.join(REPO, "docs", "bench", "ssd-bound", name)
    return read_summary(path if os.path.exists(path) else path + RECORDED_GZIP)


def predicted_s(doc: dict, run: dict, gflops: float = CPU_CALIBRATED_GFLOPS) -> float:
    """The time model's s/step for a recorded run: with the rates a bench run recorded (`job.timing`: the CPU probe
    of the machine it ran on, the SSD throttle or the region's probe) exactly as the bench predicts it
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


def miss_reason(rid: str, date: str) -> str | None:
    """Why the model is expected to miss a run by more than TOLERANCE, or None."""
    if rid in CONTENDED:
        return "cores taken by other jobs: CONTENDED"
    if rid in KNOWN_MISSES:
        return "KNOWN_MISSES"
    if date < OTHER_VM_BEFORE and rid not in OTHER_VM_WITHIN:
        return f"recorded on the earlier AVX2 VM, before {OTHER_VM_BEFORE}: OTHER_VM_BEFORE"
    return None


def _params(calibration: bool):
    out = []
    for name, doc in _docs():
        if (name == CALIBRATION) != calibration or doc["job"].get("accelerator", "cpu") != "cpu":
            continue
        j = doc["job"]
        for r in doc["runs"]:
            if not r["ok"] or r.get("disabled"):
                continue
            rid = f"{name}:{j['layers']}:{j['seq_len']}:{r['name']}"
            if rid in (STOCK_HOST_CALIBRATION, MEMASCEND_HOST_CALIBRATION):
                continue  # fitted on, not validated by
            why = miss_reason(rid, _date(doc))
            marks = [pytest.mark.xfail(strict=True, reason=f"time model error above 15% ({why})")] \
                if why and not calibration else []
            out.append(pytest.param(doc, r, id=rid, marks=marks))
    return out


VALIDATION = _params(False)
FITTED_MEMASCEND_NS = tm.MEMASCEND_CPU_HOST_NS_PER_ELEMENT


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


def test_every_listed_miss_is_a_recorded_validation_run():
    """Each entry of the lists names a run this file validates (a renamed document or run would leave an entry that
    excuses nothing), is in one list only, and OTHER_VM_WITHIN names runs of the earlier VM only."""
    dates = {p.id: _date(p.values[0]) for p in VALIDATION}
    assert not (KNOWN_MISSES | CONTENDED | OTHER_VM_WITHIN) - dates.keys()
    assert not KNOWN_MISSES & CONTENDED and not (KNOWN_MISSES | CONTENDED) & OTHER_VM_WITHIN
    assert all(dates[rid] < OTHER_VM_BEFORE for rid in OTHER_VM_WITHIN)


def test_validation_covers_all_three_engines_within_tolerance():
    """At least a third of every engine's validation runs are within 15%, listed as misses or not: an engine the model
    misses everywhere fails here even with all its runs listed."""
    runs, within = {}, {}
    for p in VALIDATION:
        doc, run = p.values
        runs[run["mode"]] = runs.get(run["mode"], 0) + 1
        if abs(predicted_s(doc, run) - run["seconds_per_step"]) <= TOLERANCE * run["seconds_per_step"]:
            within[run["mode"]] = within.get(run["mode"], 0) + 1
    assert runs.keys() == {"stock", "tuned", "memascend"}
    for engine, n in runs.items():
        assert within.get(engine, 0) >= n / 3, (engine, within.get(engine, 0), n)


@pytest.mark.parametrize("doc,run", VALIDATION)
def test_step_time_within_15_percent(doc, run):
    measured = run["seconds_per_step"]
    assert abs(predicted_s(doc, run) - measured) <= TOLERANCE * measured, (predicted_s(doc, run), measured)


def test_stock_host_copies_are_the_fit():
    """STOCK_CPU_HOST_NS_PER_ELEMENT is (measured - modelled) phase seconds per element of STOCK_HOST_CALIBRATION's
    stock run (steps after the first, median), to 0.1 ns: backward (forward to optimizer marks) and the step."""
    import statistics

    name, layers, seq, run = STOCK_HOST_CALIBRATION.split(":")
    doc = _ssd_bound(name)
    r = next(r for r in doc["runs"] if r["name"] == run)
    at = {p["name"]: p["at_s"] for p in r["phases"]}
    steps = [s for s in range(2, 100) if f"step{s}_optimizer" in at]
    measured = {"backward": statistics.median(at[f"step{s}_optimizer"] - at[f"step{s}_forward"] for s in steps),
                "optimizer": statistics.median(at[f"step{s}_forward"] - at[f"step{s - 1}_optimizer"] for s in steps)}
    p = configs.repredict(doc, r)
    elems = p["ssd_traffic"]["read_bytes_per_step"] / p["ssd_traffic"]["read_bytes_per_param"]
    phase = {"backward": tm.PHASE_FORWARD_BACKWARD, "optimizer": tm.PHASE_OPTIMIZER}
    for k, ns in tm.STOCK_CPU_HOST_NS_PER_ELEMENT.items():
        fitted = (measured[k] - p["time"]["phase_seconds"][phase[k]]) / elems * 1e9 + ns
        assert abs(fitted - ns) < 0.1, (k, fitted)



def test_memascend_host_term_is_the_fit():
    """MEMASCEND_CPU_HOST_NS_PER_ELEMENT makes MEMASCEND_HOST_CALIBRATION's memascend run's planned s/step its
    measured one, to 0.1 ns (bisection: the step time grows with the term)."""
    name, _, _, run = MEMASCEND_HOST_CALIBRATION.split(":")
    doc = _ssd_bound(name)
    r = next(r for r in doc["runs"] if r["name"] == run)
    lo, hi = 0.0, 100.0
    try:
        while hi - lo > 0.01:
            tm.MEMASCEND_CPU_HOST_NS_PER_ELEMENT = ns = (lo + hi) / 2
            lo, hi = (ns, hi) if predicted_s(doc, r) < r["seconds_per_step"] else (lo, ns)
    finally:
        tm.MEMASCEND_CPU_HOST_NS_PER_ELEMENT = FITTED_MEMASCEND_NS
    assert abs(lo - FITTED_MEMASCEND_NS) < 0.1, lo
