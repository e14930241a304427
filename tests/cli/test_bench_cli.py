"""`memascend bench`, pure parts: per-mode DeepSpeed configs and planner knobs, the settle logic on synthetic
series, event summaries, the JSON document and table shape, and the option checks of the command."""

import json
import os

import pytest

from memascend_cli.bench import configs, document, outcome, runner, sampling
from memascend_cli.bench import runs as R
from memascend_cli.defaults import ENGINE_ENV
from memascend_cli.errors import BadInput
from memascend_cli.models import load_model
from memascend_cli.planner import memory, zero

MiB = 1024**2
GiB = 1024**3


@pytest.fixture(scope="module")
def spec():
    return load_model("bench-llama-136m")


def test_stock_config_is_the_documented_default(spec):
    cfg = configs.build_ds_config("stock", spec, micro_batch=2, dtype="bf16", nvme_dir="/x", ranks=1)
    z = cfg["zero_optimization"]
    assert z["stage"] == 3 and z["sub_group_size"] == 10**9 and z["reduce_bucket_size"] == 5 * 10**8
    p, o = z["offload_param"], z["offload_optimizer"]
    assert (p["device"], o["device"]) == ("nvme", "nvme") and p["nvme_path"] == o["nvme_path"] == "/x"
    # The embedding (16384 x 1024 = 16.8M) fits the default 1e8 buffer, so buffer_size stays 1e8.
    assert p["buffer_size"] == 10**8 and p["buffer_count"] == 5 and p["max_in_cpu"] == 10**9
    assert o["buffer_count"] == 4 and p["pin_memory"] and o["pin_memory"]
    assert z["stage3_max_reuse_distance"] == 10**9
    assert cfg["bf16"] == {"enabled": True} and cfg["train_micro_batch_size_per_gpu"] == 2


def test_buffer_size_grows_to_the_largest_partition():
    big = load_model("qwen2.5-7b")  # embedding 152064 x 3584 = 545M elements > 1e8
    cfg = configs.build_ds_config("stock", big, micro_batch=1, dtype="bf16", nvme_dir="/x", ranks=2)
    assert cfg["zero_optimization"]["offload_param"]["buffer_size"] == -(-big.largest_tensor_numel // 2)


def test_tuned_config_is_stock_with_memascends_knobs(spec):
    cfg = configs.build_ds_config("tuned", spec, micro_batch=1, dtype="fp16", nvme_dir="/x", ranks=1)
    z = cfg["zero_optimization"]
    assert z["offload_param"]["max_in_cpu"] == 0
    assert z["offload_param"]["buffer_size"] == spec.largest_tensor_numel
    assert z["sub_group_size"] == zero.MEMASCEND_SUB_GROUP_SIZE
    assert z["reduce_bucket_size"] == zero.OVERLAP_REDUCE_BUCKET_SIZE
    # Required with max_in_cpu 0, else step 2 crashes with "Not enough buffers".
    assert z["stage3_max_reuse_distance"] == 0
    assert cfg["fp16"]["enabled"] and "bf16" not in cfg


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_tuned_and_memascend_runs_differ_in_no_stock_knob(spec, dtype, ranks):
    """The bench's tuned stock gets every stock knob the engine sets: same config, same environment, and the
    engine's install() finds nothing to change (so the two runs differ only in the techniques)."""
    import copy

    kw = {"micro_batch": 1, "dtype": dtype, "nvme_dir": "/x", "ranks": ranks}
    tuned, mem = configs.build_ds_config("tuned", spec, **kw), configs.build_ds_config("memascend", spec, **kw)
    assert tuned == mem
    assert configs.run_settings("tuned", tuned).stock_differences(configs.run_settings("memascend", mem)) == {}
    engine_env = configs.child_env("memascend", mem, {}, cpu_cores=2, ranks=ranks)
    assert configs.child_env("tuned", tuned, {}, cpu_cores=2, ranks=ranks) == {
        k: v for k, v in engine_env.items() if k not in ENGINE_ENV}
    assert ENGINE_ENV.items() <= engine_env.items()
    s = configs.run_settings("memascend", mem)
    after = copy.deepcopy(mem)
    assert zero.write_into_ds_config(after, zero.memascend_knobs(s, largest_partition_numel=-(
        -spec.largest_tensor_numel // ranks))) == {}
    assert after == mem
    # Tuned runs memascend's checkpoint function as memascend does, and the bench plans what each run executes:
    # activations offloaded in both (an ablation switches it off only in memascend), full recomputation without
    # offload for stock, which runs transformers' checkpointing.
    planned = {(mode, off): configs.plan_job(mode, configs.build_ds_config(mode, spec, **kw), spec, seq_len=512,
                                             micro_batch=1, dtype=dtype, ranks=ranks, checkpointing="full",
                                             deepspeed_version="0.19.8", disabled=off)[0].checkpointing
               for mode in ("stock", "tuned", "memascend") for off in ((), ("offload_checkpointing",))}
    assert planned == {("stock", ()): "full", ("stock", ("offload_checkpointing",)): "full",
                       ("tuned", ()): "offload", ("tuned", ("offload_checkpointing",)): "offload",
                       ("memascend", ()): "offload", ("memascend", ("offload_checkpointing",)): "full"}


def test_bad_mode_and_dtype(spec):
    with pytest.raises(BadInput):
        configs.build_ds_config("fast", spec, micro_batch=1, dtype="bf16", nvme_dir="/x", ranks=1)
    with pytest.raises(BadInput):
        configs.build_ds_config("stock", spec, micro_batch=1, dtype="int8", nvme_dir="/x", ranks=1)


def test_child_env_sets_the_pin_backend_and_accelerator(spec):
    cfg = configs.build_ds_config("stock", spec, micro_batch=1, dtype="bf16", nvme_dir="/x", ranks=1)
    base = {"PATH": "/bin", "DS_PIN_MEMORY_BACKEND": "native"}
    kw = {"cpu_cores": 2, "ranks": 1}
    assert "DS_PIN_MEMORY_BACKEND" not in configs.child_env("stock", cfg, base, **kw)
    assert configs.child_env("tuned", cfg, base, **kw)["DS_PIN_MEMORY_BACKEND"] == "native"
    assert configs.child_env("memascend", cfg, base, **kw)["DS_PIN_MEMORY_BACKEND"] == "native"
    assert configs.child_env("stock", cfg, {}, **kw)["DS_ACCELERATOR"] == "cpu"
    assert configs.child_env("stock", cfg, {}, accelerator="cuda", **kw)["DS_ACCELERATOR"] == "cuda"


def test_run_settings_read_back_from_the_config(spec):
    stock = configs.build_ds_config("stock", spec, micro_batch=1, dtype="bf16", nvme_dir="/x", ranks=1)
    tuned = configs.build_ds_config("tuned", spec, micro_batch=1, dtype="bf16", nvme_dir="/x", ranks=1)
    ks, kt = configs.run_settings("stock", stock), configs.run_settings("tuned", tuned)
    assert (ks.max_in_cpu, ks.pin_backend, ks.sub_group_size, ks.param_buffer_size) == (10**9, "torch", 10**9, 10**8)
    assert (kt.max_in_cpu, kt.pin_backend, kt.sub_group_size) == (0, "native", zero.MEMASCEND_SUB_GROUP_SIZE)
    assert kt.param_buffer_size == spec.largest_tensor_numel


def test_the_child_imports_the_run_names_without_the_rest_of_the_bench():
    """memascend_engine.bench_job imports bench/runs.py for MODES and TECHNIQUES: nothing else of the CLI comes in."""
    import subprocess
    import sys

    code = "import sys, memascend_cli.bench.runs; print(*sorted(m for m in sys.modules if m.startswith('memascend')))"
    r = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert r.stdout.split() == ["memascend_cli", "memascend_cli.bench", "memascend_cli.bench.runs", "memascend_cli.errors"]


def test_child_runs_as_a_module_of_the_installed_engine():
    assert runner.child_command(["--x"], 1)[1:] == ["-m", runner.JOB_MODULE, "--x"]
    two = runner.child_command(["--x"], 2)
    assert two[1:3] == ["-m", "torch.distributed.run"] and two[-3:] == ["-m", runner.JOB_MODULE, "--x"]


def test_predictions_order(spec):
    from memascend_cli.planner.spec import HardwareSpec

    hw = HardwareSpec(name="t", dram_gib=24, cpu_cores=2)
    kw = {"seq_len": 512, "micro_batch": 1, "dtype": "bf16", "ranks": 1, "checkpointing": "full", "hw": hw,
          "deepspeed_version": "0.19.8"}
    p = {m: configs.predict(m, configs.build_ds_config(m, spec, micro_batch=1, dtype="bf16", nvme_dir="/x", ranks=1), spec, **kw)
         for m in R.MODES}
    assert p["stock"]["engine"] == p["tuned"]["engine"] == "stock" and p["memascend"]["engine"] == "memascend"
    # Only the order against stock is a property of the configs; memascend vs tuned is what the bench measures.
    assert p["tuned"]["node_host_peak_bytes"] < p["stock"]["node_host_peak_bytes"]
    assert p["memascend"]["node_host_peak_bytes"] < p["stock"]["node_host_peak_bytes"]
    assert {"key", "kind", "bytes"} == set(p["stock"]["host_items"][0])
    two = configs.predict("stock", configs.build_ds_config("stock", spec, micro_batch=1, dtype="bf16", nvme_dir="/x", ranks=2),
                    spec, **{**kw, "ranks": 2})
    # two ranks plus torchrun's launcher process, once per node
    assert two["node_host_peak_bytes"] == 2 * two["host_peak_bytes_per_rank"] + memory.LAUNCHER_PROCESS_BYTES
    one = configs.predict("stock", configs.build_ds_config("stock", spec, micro_batch=1, dtype="bf16", nvme_dir="/x", ranks=1),
                    spec, **kw)
    assert one["node_host_peak_bytes"] == one["host_peak_bytes_per_rank"]  # one rank runs without a launcher


def test_runs_execute_smallest_planned_peak_first():
    # stock, tuned, memascend as listed; memascend first, stock last; ties keep the listed order
    assert runner.execution_order([8 * GiB, 3 * GiB, 1 * GiB]) == [2, 1, 0]
    assert runner.execution_order([2 * GiB, 2 * GiB, 1 * GiB]) == [2, 0, 1]
    assert runner.execution_order([]) == []


def test_a_stock_run_whose_swap_files_do_not_fit_on_the_disk_is_refused_before_it_starts(tmp_path):
    """stock's and tuned's swap files would fill the disk mid-run; memascend's region is allocated before any run."""
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    swap = str(tmp_path / "swap")  # not there yet: its nearest existing folder's file system counts
    big, small = {"nvme_bytes_per_rank": 2 * free}, {"nvme_bytes_per_rank": free // 4}
    why = runner.swap_space_short("stock", big, 1, swap)
    assert why.startswith("does not fit: its swap files need") and f"free at {tmp_path}" in why
    assert runner.swap_space_short("tuned", small, 2, swap) is None
    assert runner.swap_space_short("tuned", small, 8, swap) is not None  # every rank's files
    assert runner.swap_space_short("memascend", big, 1, swap) is None


def test_parse_runs():
    assert [r.name for r in R.parse_runs("stock, tuned", False)] == ["stock", "tuned"]
    runs = R.parse_runs("memascend", True)
    assert len(runs) == 2 + len(R.TECHNIQUES)
    assert runs[1] == R.RunSpec("tuned", "tuned")  # the "knobs only" row
    assert runs[2] == R.RunSpec(f"memascend-no-{R.TECHNIQUES[0]}", "memascend", (R.TECHNIQUES[0],))
    # An opt-in: memascend with Adam's moments in bf16 on the SSD; planned with them too.
    (bf16,) = R.parse_runs("memascend-bf16_moments", False)
    assert bf16 == R.RunSpec("memascend-bf16_moments", "memascend", moments="bf16")
    # tuned with the engine's glibc policy as an environment variable: tuned's config, its own child environment.
    (glibc,) = R.parse_runs("tuned-glibc_threshold", False)
    assert (glibc.mode, dict(glibc.env)) == ("tuned", {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1048576"})
    spec = load_model("tiny-llama")
    cfg = configs.build_ds_config("memascend", spec, micro_batch=1, dtype="fp32", nvme_dir="/x", ranks=1)
    job, _ = configs.plan_job("memascend", cfg, spec, seq_len=64, micro_batch=1, dtype="fp32", ranks=1,
                              checkpointing="full", deepspeed_version="0.19.8", moments="bf16")
    assert job.optimizer_moments == "bf16"
    assert configs.recorded_plan_job({"job": {"model": "tiny-llama", "seq_len": 64, "micro_batch": 1, "dtype": "fp32",
                                              "ranks": 1, "checkpointing": "full", "deepspeed_version": "0.19.8"}},
                                     {"mode": "memascend", "config": cfg, "optimizer_moments": "bf16"}
                                     )[0].optimizer_moments == "bf16"
    for bad in ("", "stock,fast", "stock,stock"):
        with pytest.raises(BadInput):
            R.parse_runs(bad, False)


# --- settling -----------------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_flat_spread_needs_a_full_window():
    assert sampling.flat_spread([(0.0, 5), (3.0, 5)], 6.0) is None
    assert sampling.flat_spread([(0.0, 5), (3.0, 9), (6.0, 7)], 6.0) == 4
    # Only the last window counts.
    assert sampling.flat_spread([(0.0, 100), (1.0, 7), (7.0, 8)], 6.0) == 1


def test_settle_waits_for_a_decaying_level():
    clock = FakeClock()
    # Used memory decays from +900 MiB towards 2 GiB with a 10 s time constant (after a heavy run
    # MemTotal - MemAvailable stays up to ~0.9 GiB above idle for 1-3 minutes while the kernel trims its caches), plus 1 MiB of jitter.
    def read():
        return int(2 * GiB + 900 * MiB * 2.718 ** (-clock.t / 10) + (MiB if int(clock.t * 4) % 2 else 0))

    r = sampling.settle(read, clock=clock, sleep=clock.sleep, interval_s=0.25, cap_s=200)
    assert r.flat and r.spread_bytes <= sampling.SETTLE_TOLERANCE_BYTES
    # 900 MiB x e^(-t/10) must fall to a slope of < 8 MiB per 6 s: t ~ 40 s.
    assert 30 < r.waited_s < 60
    assert abs(r.idle_bytes - 2 * GiB) < 16 * MiB


def test_settle_gives_up_at_the_cap():
    clock = FakeClock()
    r = sampling.settle(lambda: int(clock.t * 10 * MiB), clock=clock, sleep=clock.sleep, cap_s=20)
    assert not r.flat and 20 <= r.waited_s < 21
    assert r.spread_bytes > sampling.SETTLE_TOLERANCE_BYTES


def test_settle_is_quick_when_idle():
    clock = FakeClock()
    r = sampling.settle(lambda: 3 * GiB, clock=clock, sleep=clock.sleep)
    assert r.flat and r.idle_bytes == 3 * GiB and r.waited_s == pytest.approx(sampling.SETTLE_WINDOW_S, abs=0.3)


def test_meminfo_reader():
    rd = sampling.MeminfoReader()
    try:
        used = rd.used_bytes()
        assert 0 < used < rd.total_bytes
    finally:
        rd.close()


def test_bucket_max_and_sampling_stats():
    ts = [10.000, 10.004, 10.009, 10.012, 10.030]
    vs = [1, 5, 3, 2, 9]
    assert sampling.bucket_max(ts, vs, 10.0) == [(0.0, 5), (0.01, 2), (0.03, 9)]
    assert sampling.bucket_max(ts, vs, 10.0, bucket_s=document.SIDE_FILE_BUCKET_S) == [(0.0, 9)]
    st = sampling.sampling_stats(ts)
    assert st["samples"] == 5 and st["rate_hz"] == pytest.approx(4 / 0.03, rel=1e-3) and st["max_gap_ms"] == pytest.approx(18.0)
    assert sampling.nearest([(1.0, 10), (2.0, 20)], 1.8) == 20 and sampling.nearest([], 1.0) is None


def test_busy_cpu_seconds_leave_idle_and_iowait_out():
    text = "cpu  100 20 30 5000 400 6 7 8 0 0\ncpu0 50 10 15 2500 200 3 3 4 0 0\n"
    assert sampling.busy_cpu_seconds(text, 100) == pytest.approx((100 + 20 + 30 + 6 + 7 + 8) / 100)
    assert sampling.busy_cpu_seconds("", 100) == 0.0


# --- events, document, table -------------------------------------------------------------------


def _final(rank, r, w, rs, ws):
    return {"event": "final", "rank": rank, "io": {"read_bytes": r, "write_bytes": w},
            "io_steps": {"read_bytes": rs, "write_bytes": ws}, "swap_bytes_on_disk": 100, "engine_stats": None}


def test_summarize_events_two_ranks():
    steps = [{"event": "step", "step": i, "loss": 7.0 - i, "seconds": s} for i, s in ((1, 4.0), (2, 2.0), (3, 3.0))]
    ev = {0: [{"event": "phase", "name": "zero_init", "t_mono": 1.0}, *steps, _final(0, 10, 20, 5, 6)],
          1: [_final(1, 1, 2, 3, 4)]}
    s = outcome.summarize_events(ev, micro_batch=2, seq_len=100, ranks=2)
    assert s["seconds_per_step"] == pytest.approx(2.5) and s["first_step_seconds"] == 4.0
    assert s["tokens_per_s"] == pytest.approx(2 * 100 * 2 / 2.5)
    assert (s["ssd_read_bytes"], s["ssd_written_bytes"], s["ssd_read_bytes_steps"]) == (11, 22, 8)
    assert s["losses"] == [6.0, 5.0, 4.0] and s["errors"] == [] and "engine_stats" not in s
    # A rank that died leaves no final line: no SSD totals rather than half of them.
    assert "ssd_read_bytes" not in outcome.summarize_events({0: ev[0], 1: []}, micro_batch=2, seq_len=100, ranks=2)


def _result(name, mode, peak, sps, pred=None, pred_s=None):
    r = runner.RunResult(name=name, mode=mode, disabled=[], ok=True, peak_system_bytes=peak, ru_maxrss_bytes=peak // 2,
                    max_tree_rss_bytes=peak // 2, seconds_per_step=sps, tokens_per_s=512 / sps,
                    ssd_read_bytes=int(2e9), ssd_written_bytes=int(3e9), settle={"waited_s": 7.0, "flat": True,
                    "spread_bytes": MiB}, sampling={"rate_hz": 1100.0, "max_gap_ms": 3.0}, timeline=[(0.0, 0), (0.5, peak)])
    if pred is not None:
        r.predicted = {"node_host_peak_bytes": pred, "time": None if pred_s is None else {"seconds_per_step": pred_s}}
    return r


def test_document_and_table_shape(tmp_path):
    runs = [_result("stock", "stock", 4 * GiB, 2.0, pred=int(3.6 * GiB), pred_s=2.5),
            _result("tuned", "tuned", 3 * GiB, 2.2), runner.RunResult(name="memascend", mode="memascend", disabled=[],
                                                                   ok=False, error="engine missing")]
    job = {"model": "m", "num_params": 1, "seq_len": 512, "micro_batch": 1, "steps": 2, "dtype": "bf16", "ranks": 1,
           "ssd_bandwidth_bytes_per_s": 400_000_000, "ssd_throttle": [{"device": "vda"}]}
    doc = document.build_document(job=job, hardware={"name": "local"}, runs=runs, notes=["n"])
    doc = json.loads(json.dumps(doc))  # JSON-serialisable as written to bench.json
    assert doc["schema_version"] == document.JSON_SCHEMA_VERSION
    assert [r["name"] for r in doc["runs"]] == ["stock", "tuned", "memascend"]
    assert doc["runs"][0]["prediction_error_percent"] == pytest.approx(-10.0)
    assert doc["vs_stock"] == {"tuned": {"peak_reduction_percent": 25.0, "step_time_change_percent": 10.0}}
    assert doc["vs_tuned"] == {"stock": {"peak_reduction_percent": pytest.approx(-33.33),
                                         "step_time_change_percent": pytest.approx(-9.09)}}
    rows = document.table_rows(doc)
    assert all(len(row) == len(document.TABLE_COLUMNS) for row in rows)
    assert rows[0] == ("stock", "4.00", "2.00", "2.00", "2.50", "256", "-", "3.60", "-10.0%")
    assert rows[1][3:6] == ("2.20", "-", "233")  # no time prediction recorded
    # The SSD's rate unknown: the plan gives only the step's lower bound.
    low = {**doc["runs"][1], "predicted": {"node_host_peak_bytes": GiB,
                                           "time": {"seconds_per_step": None, "seconds_per_step_at_least": 1.5}}}
    assert document.table_rows({**doc, "runs": [low]})[0][4] == "≥1.50"
    assert document.throttle_text(doc["job"]) == "SSD throttled to 400 MB/s (vda)"
    assert document.throttle_text({**doc["job"], "ssd_bandwidth_bytes_per_s": None}) is None
    assert rows[2][0] == "memascend (failed)" and rows[2][1] == "-"
    document.render_table(doc)  # must not raise on failed runs
    problem = document.write_plot(doc, str(tmp_path / "p.png"))
    if problem is None:
        assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_names_its_timeline_side_file(tmp_path):
    """bench.json holds no timeline; bench.timeline.json.gz beside it holds every run's, and so does a sweep's."""
    runs = [_result("tuned", "tuned", 3 * GiB, 2.2), _result("memascend", "memascend", 1 * GiB, 2.0)]
    job = {"model": "m", "layers": 8, "num_params": 1, "seq_len": 512, "micro_batch": 1, "steps": 2, "dtype": "bf16",
           "ranks": 1}
    doc = document.build_document(job=job, hardware={}, runs=runs, notes=[])
    summary = document.write_document(doc, str(tmp_path / "bench.json"))
    on_disk = json.loads((tmp_path / "bench.json").read_text())
    assert on_disk == summary and summary["timeline_file"] == "bench.timeline.json.gz"
    assert all("timeline" not in r for r in on_disk["runs"]) and doc["runs"][0]["timeline"]  # the plot's copy stays
    got = document.read_timelines(str(tmp_path / "bench.json"))
    assert [(t["layers"], t["seq_len"], t["run"], t["points"]) for t in got] == [
        (8, 512, "tuned", [[0.0, 3 * GiB]]), (8, 512, "memascend", [[0.0, 1 * GiB]])]  # max per 1 s
    first = (tmp_path / "bench.timeline.json.gz").read_bytes()
    document.write_document(doc, str(tmp_path / "bench.json"))
    assert (tmp_path / "bench.timeline.json.gz").read_bytes() == first  # same timelines, same bytes
    sweep = document.write_document(document.sweep_document([doc, {**doc, "job": {**job, "seq_len": 2048}}]),
                                    str(tmp_path / "sweep.json"))
    assert sweep["timeline_file"] == "sweep.timeline.json.gz"
    assert all("timeline" not in r for d in sweep["documents"] for r in d["runs"])
    assert [t["seq_len"] for t in document.read_timelines(str(tmp_path / "sweep.json"))] == [512, 512, 2048, 2048]
    back = document.read_document(str(tmp_path / "sweep.json"))  # what scripts/join_sweep.py joins
    assert "timeline_file" not in back and back["documents"][1]["runs"][0]["timeline"] == [[0.0, 3 * GiB]]


def test_ssd_bytes_reported_next_to_the_placements_minimum():
    """Each run's measured SSD bytes per parameter beside the roofline the plan gives for its config."""
    run = {"name": "memascend", "ssd_bytes_per_param": {"read": 23.0, "write": 20.1},
           "predicted": {"ssd_traffic": {"minimum_read_bytes_per_param": 24.1,
                                         "minimum_write_bytes_per_param": 20.1}}}
    assert document.ssd_minimum(run) == (24.1, 20.1)
    assert document.ssd_line(run) == ("memascend: SSD 23.0 / 20.1 B/param read / write per step, minimum for its placement "
                               "24.1 / 20.1 (-4.6% / +0.0%)")
    # runs recorded before the roofline existed, or without SSD counters, print nothing
    assert document.ssd_line({**run, "predicted": {"ssd_traffic": {}}}) is None
    assert document.ssd_line({**run, "ssd_bytes_per_param": None}) is None


# --- the command's checks (nothing is launched) ---------------------------------------------------


def test_repeats_report_the_median_peak_and_keep_every_repeat():
    def rep(peak, ok=True, log="x"):
        return runner.RunResult(name="tuned", mode="tuned", disabled=[], ok=ok, peak_system_bytes=peak, log_path=log)

    one = rep(5 * GiB)
    assert runner.median_run([one]) is one and one.repeats == []  # a single run is recorded as before
    runs = [rep(6 * GiB, log="a"), rep(4 * GiB, log="b"), rep(5 * GiB, log="c")]
    chosen = runner.median_run(runs)
    assert chosen.log_path == "c" and chosen.peak_system_bytes == 5 * GiB
    assert [r["peak_system_bytes"] for r in chosen.repeats] == [6 * GiB, 4 * GiB, 5 * GiB]  # in the order run
    assert runner.median_run([rep(6 * GiB, log="a"), rep(4 * GiB, log="b")]).log_path == "b"  # the lower middle
    failed = runner.median_run([rep(4 * GiB), rep(None, ok=False, log="dead"), rep(5 * GiB)])
    assert failed.log_path == "dead" and not failed.ok and len(failed.repeats) == 3  # a failure is never hidden
    assert runner.median_run(runs).to_dict()["repeats"][0]["log_path"] == "a"


@pytest.mark.parametrize("args,fragment", [
    (("--ranks", "3"), "--ranks 3"),
    (("--runs", "stock,turbo"), "unknown run"),
    (("--steps", "0"), "--steps must be at least 1"),
    (("--repeat", "0"), "--repeat must be at least 1"),
    (("--dtype", "int4"), "unknown dtype"),
    (("--capacity", "width", "--dram-cap", "4GiB"), "unknown --capacity axis 'width'"),
    (("--capacity", "layers"), "--capacity needs --dram-cap"),
    (("--capacity", "layers", "--dram-cap", "4GiB", "--layers", "8"), "--layers is what --capacity layers searches"),
    (("--capacity", "seq", "--dram-cap", "4GiB", "--seq-len", "512"), "--seq-len is what --capacity seq searches"),
    (("--capacity", "micro-batch", "--dram-cap", "4GiB", "-b", "2"), "--micro-batch is what --capacity micro-batch"),
    (("--capacity", "seq", "--dram-cap", "4GiB", "--layers", "8,16"), "is a sweep; --capacity searches one axis"),
    (("--capacity", "seq", "--dram-cap", "4GiB", "--region", "/x"), "--region does not apply to --capacity"),
    (("--probe-timeout", "60"), "--probe-timeout applies to --capacity only"),
    (("--resume",), "--resume applies to --capacity only"),
    (("--ssd-bandwidth", "fast"), "cannot read --ssd-bandwidth 'fast'"),
    (("--ssd-bandwidth", "0MB/s"), "--ssd-bandwidth must be positive"),
    (("--capacity", "seq", "--dram-cap", "4GiB", "--ssd-bandwidth", "400MB/s"), "--ssd-bandwidth does not apply"),
    (("--cpu-gflops", "-1"), "--cpu-gflops must be positive"),
])
def test_bad_options(cli, tmp_path, args, fragment):
    r = cli("bench", "--out", str(tmp_path), *args)
    assert r.exit_code == 2 and fragment in r.stderr


def test_ssd_bandwidth_without_an_io_cgroup_is_one_error_and_a_hint(cli, tmp_path, monkeypatch):
    from memascend_cli.run import cgroup

    (tmp_path / "mountinfo").write_text("22 1 254:0 / / rw - ext4 /dev/vda rw\n")
    monkeypatch.setattr(cgroup, "MOUNTINFO", str(tmp_path / "mountinfo"))
    r = cli("bench", "--out", str(tmp_path), "--ssd-bandwidth", "400MB/s")
    assert r.exit_code == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines[0].startswith("error: no cgroup file system is mounted") and lines[1].startswith("hint: ")
    assert "--ssd-bandwidth" in lines[1] and len(lines) == 2


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no tmpfs at /dev/shm")
def test_refuses_tmpfs_swap_dir(cli, tmp_path):
    r = cli("bench", "--out", str(tmp_path), "--nvme-dir", f"/dev/shm/memascend-bench-test-{os.getpid()}",
            "--runs", "stock")
    os.rmdir(f"/dev/shm/memascend-bench-test-{os.getpid()}")
    assert r.exit_code == 2 and "keeps file data in RAM" in r.stderr


def test_sweep_document_flatness_and_slope():
    def doc(layers, params, peaks):
        runs = [_result(n, n, int(p * GiB), 2.0) for n, p in peaks.items()]
        job = {"model": "m", "layers": layers, "num_params": params, "seq_len": 2048, "micro_batch": 1, "steps": 2,
               "dtype": "bf16", "ranks": 1}
        return json.loads(json.dumps(document.build_document(job=job, hardware={}, runs=runs, notes=[])))

    docs = [doc(8, int(1e9), {"tuned": 2.0, "memascend": 1.0}), doc(16, int(2e9), {"tuned": 3.0, "memascend": 1.1}),
            doc(32, int(4e9), {"tuned": 5.0, "memascend": 1.1})]
    sweep = document.sweep_document(docs)
    assert [p["layers"] for p in sweep["points"]] == [8, 16, 32]
    assert sweep["series"]["tuned"]["gib_per_billion_params"] == pytest.approx(1.0)
    assert sweep["series"]["memascend"]["spread_bytes"] == int(1.1 * GiB) - int(1.0 * GiB)
    assert abs(sweep["series"]["memascend"]["gib_per_billion_params"]) < 0.05
    document.render_sweep(sweep)


def test_runs_may_name_single_ablation_runs():
    runs = R.parse_runs("memascend,memascend-no-verify_checksums", ablation=False)
    assert runs == [R.RunSpec("memascend", "memascend"),
                    R.RunSpec("memascend-no-verify_checksums", "memascend", ("verify_checksums",))]
    # --ablation adds the rest, never the named one twice.
    full = R.parse_runs("memascend,memascend-no-streaming", ablation=True)
    assert [r.name for r in full].count("memascend-no-streaming") == 1
    assert len(full) == 3 + len(R.TECHNIQUES) - 1
    with pytest.raises(BadInput, match="unknown run"):
        R.parse_runs("memascend-no-magic", ablation=False)


def test_the_predicted_step_time_gets_the_throttle_or_the_probed_bandwidth():
    """bench's time-model inputs: the throttle where it is below the drive's probed rate (an unprobed drive counts as
    faster), the region's probe without one, unknown otherwise; the recorded inputs give the same prediction back."""
    import dataclasses

    from memascend_cli.bench.sweep import timing
    from memascend_cli.planner.spec import HardwareSpec

    hw = HardwareSpec(name="local", dram_gib=24.0, num_gpus=0, gpu_mem_gib=0.0, cpu_cores=2)
    probed = dataclasses.replace(hw, nvme_read_gbps=3.0, nvme_write_gbps=0.3)
    t = timing(probed, "fp32", 150.0, 400_000_000)
    assert (t["read_gbps"], t["write_gbps"], t["duplex_io"], t["device"].flops_per_s) == (0.4, 0.3, True, 150e9)
    assert (timing(hw, "fp32", 150.0, 400_000_000)["read_gbps"], timing(hw, "fp32", 150.0, None)["read_gbps"],
            timing(probed, "fp32", 150.0, None)["source"]) == (0.4, None, "the region's probe")
    job = {"model": "tiny-llama", "layers": None, "seq_len": 64, "micro_batch": 1, "dtype": "fp32", "ranks": 1,
           "checkpointing": "full", "deepspeed_version": "0.19.8", "ssd_bandwidth_bytes_per_s": 400_000_000,
           "timing": runner._timing_doc(t)}
    recorded = configs.recorded_timing(job)
    assert recorded["duplex_io"] and recorded["read_gbps"] == 0.4 and recorded["device"].flops_per_s == 150e9
    cfg = configs.build_ds_config("memascend", configs.recorded_spec(job), micro_batch=1, dtype="fp32",
                                  nvme_dir="/x", ranks=1)
    doc = {"job": job, "hardware": {"cpu_cores": 2}}
    committed = {"mode": "memascend", "config": cfg,
                 "engine_stats": [{"overlap": {"steps_committed": 2}, "counters": {"norms_on_worker": 3}, "options": {
                     "bounded_norm": True, "master_from_params": True, "params_hold_master": True}}]}
    again = configs.repredict(doc, committed)["time"]
    live = configs.predict("memascend", cfg, configs.recorded_spec(job), seq_len=64, micro_batch=1, dtype="fp32",
                           ranks=1, checkpointing="full", hw=hw, deepspeed_version="0.19.8", timing=t)["time"]
    assert again["seconds_per_step"] == live["seconds_per_step"] > 0
    # Recorded before the norm worker (no norms_on_worker counter): planned without its threads' host term (a delta,
    # negative since the one-pass step: the older engine plans slower).
    from memascend_cli.planner import time as tm

    del committed["engine_stats"][0]["counters"]
    before = configs.repredict(doc, committed)["time"]["seconds_per_step"]
    delta = tm.MEMASCEND_WORKER_THREADS_HOST_NS_PER_ELEMENT[recorded["device"].host_cpu]
    assert before > 0 and (before < live["seconds_per_step"]) == (delta > 0)
    # A run whose steps did not speculate (recorded before the overlap, or clipped) is planned without it; one
    # recorded without its engine's options, as before params_hold_master too.
    plain = configs.predict("memascend", cfg, configs.recorded_spec(job), seq_len=64, micro_batch=1, dtype="fp32",
                            ranks=1, checkpointing="full", hw=hw, deepspeed_version="0.19.8", timing=t,
                            disabled=("overlap_optimizer", "params_hold_master"))["time"]
    assert configs.repredict(doc, {"mode": "memascend", "config": cfg})["time"] == plain != live
    assert configs.recorded_timing({**job, "timing": None}) is None
    # The probe's every setting is recorded with the rates, for planning each engine at its own request size.
    samples = [[1 << 20, 8, 2.29, 1.23], [4 << 20, 8, 4.24, 2.79]]
    assert runner._timing_doc(timing(probed, "fp32", 150.0, None, samples))["probe_samples"] == samples
    assert "probe_samples" not in job["timing"]


def test_a_recorded_cpu_probe_is_replanned_with_todays_achieved_fraction(monkeypatch):
    """A document records its CPU rate as the probe's times the fraction of its day (cpu_fraction; documents before it
    took the probe at face value): today's fraction applies to the probe. A rate given with --cpu-gflops is the
    user's, taken as given."""
    from memascend_cli.compute_probe import PROBE_SOURCE
    from memascend_cli.planner import time as tm

    probe = {"device": tm.cpu_device(100.0 * tm.CPU_ACHIEVED_FRACTION, f"{PROBE_SOURCE} 100 GFLOP/s x "
                                     f"{tm.CPU_ACHIEVED_FRACTION}"), "read_gbps": 1.0, "write_gbps": 1.0}
    doc = runner._timing_doc(probe)
    assert doc["cpu_fraction"] == tm.CPU_ACHIEVED_FRACTION
    old = {**doc, "gflops": 100.0, "device_source": f"{PROBE_SOURCE} 100 GFLOP/s x 1.0"}
    del old["cpu_fraction"]
    monkeypatch.setattr(tm, "CPU_ACHIEVED_FRACTION", 0.5)
    for timing in (doc, old):
        assert configs.recorded_timing({"timing": timing})["device"].flops_per_s == pytest.approx(50e9)
    given = runner._timing_doc({**probe, "device": tm.cpu_device(70.0, "--cpu-gflops")})
    assert "cpu_fraction" not in given
    assert configs.recorded_timing({"timing": given})["device"].flops_per_s == pytest.approx(70e9)


def test_a_region_the_bench_creates_is_probed_for_the_time_model(tmp_path):
    """Without --region and --ssd-bandwidth the bench's own region is probed (prepare-ssd's probe, on this disk), so
    its runs get a predicted s/step; rates the bench already had (a throttle, a given region) are kept."""
    probed = runner.create_region(str(tmp_path / "probed.region"), 64 * MiB, 1, probe=True)
    plain = runner.create_region(str(tmp_path / "plain.region"), 64 * MiB, 1)
    assert probed.probe.read_gbps > 0 and probed.probe.samples and plain.probe is None
    unknown = {"device": None, "read_gbps": None, "write_gbps": None, "source": None, "duplex_io": False}
    got = runner.with_region_rates(unknown, probed)
    assert (got["read_gbps"], got["write_gbps"]) == (probed.probe.read_gbps, probed.probe.write_gbps)
    assert got["source"] == "the probe of the region the bench created"
    assert [r[:2] for r in got["probe_samples"]] == [[s.block_bytes, s.queue_depth] for s in probed.probe.samples]
    throttled = {**unknown, "read_gbps": 0.4, "write_gbps": 0.4, "source": "--ssd-bandwidth", "duplex_io": True}
    assert runner.with_region_rates(throttled, probed) is throttled
    assert runner.with_region_rates(unknown, plain) is unknown


def test_the_bench_removes_the_regions_it_made_and_keeps_records_and_a_given_region(tmp_path, capsys):
    from memascend_cli.bench import sweep

    out = tmp_path / "out"
    made = [out / "bench.region", out / "cap-2GiB" / "bench.region", out / "probe-1" / "bench.region"]
    given = out / "cap-4GiB" / "bench.region"  # a --region that happens to sit under OUT
    for path in (*made, given):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * 8192)
        (path.parent / "bench.json").write_text("{}")
    freed = sweep.remove_regions(str(out), keep=str(given))
    assert [p.exists() for p in made] == [False] * 3 and given.exists()
    assert freed >= 3 * 8192 and all((p.parent / "bench.json").exists() for p in (*made, given))
    assert "removed the bench's region files" in capsys.readouterr().err
    assert sweep.remove_regions(str(out), keep=None) >= 8192 and not given.exists()
    assert sweep.remove_regions(str(out), keep=None) == 0 and capsys.readouterr().err.count("removed") == 1
