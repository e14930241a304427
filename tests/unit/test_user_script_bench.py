"""The pure parts of benchmarks/user_script_bench.py: the commands it runs, the plan's prediction, the errors and
the table scripts/results.py renders on the results' ecosystem page; and the plan's accuracy on the recorded matrix
(docs/bench/user-script/matrix.json.gz for memascend through install(), matrix-stock.json.gz for stock DeepSpeed; validation
runs, nothing fitted on them): today's plan within 10% of the script's ru_maxrss for both engines, within 5% for
memascend in at least 80% of the combinations, every combination recorded for both engines; and the stock heap
constant fitted on the calibration traces (docs/bench/user-script/trace/, benchmarks/step_memory_trace.py)."""

from __future__ import annotations

import glob
import gzip
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from memascend_cli.app import app
from memascend_cli.bench.document import read_summary

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("user_script_bench",
                                               os.path.join(REPO, "benchmarks", "user_script_bench.py"))
usb = importlib.util.module_from_spec(_spec)
sys.modules["user_script_bench"] = usb  # dataclasses look their module up there
_spec.loader.exec_module(usb)
_spec = importlib.util.spec_from_file_location("capped_user_script",
                                               os.path.join(REPO, "benchmarks", "capped_user_script.py"))
capped = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(capped)
_spec = importlib.util.spec_from_file_location("step_memory_trace",
                                               os.path.join(REPO, "benchmarks", "step_memory_trace.py"))
smt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(smt)

GiB = 1 << 30


def test_stock_never_installs_the_engine_and_memascend_does():
    kw = dict(model_dir="/m", region="/r.bin", nvme_path="/n", out="/o.json", python="py")
    job = usb.Job("ds", True)
    stock, mem = usb.script_command(job, "stock", **kw), usb.script_command(job, "memascend", **kw)
    assert "--region" not in stock and mem[-2:] == ["--region", "/r.bin"]
    assert "--checkpointing" in stock and stock[:2] == ["py", usb.DS_SCRIPT]
    assert mem[:-2] == stock  # the same script and knobs otherwise
    hf = usb.Job("hf", False)
    assert usb.script_command(hf, "stock", **kw)[2] == "plain"
    assert usb.script_command(hf, "memascend", **kw)[2] == "before"
    assert usb.script_command(hf, "stock", **kw)[-6:] == ["/m", "512", "3", "bf16", "nockpt", "eager"]


def test_accelerate_and_trl_run_the_same_knobs_stock_and_memascend():
    kw = dict(model_dir="/m", region="/r.bin", nvme_path="/n", out="/o.json", python="/venv/bin/python",
              config="/w/ds.json", port=1234)
    acc = usb.Job("accelerate", False)
    stock, mem = usb.script_command(acc, "stock", **kw), usb.script_command(acc, "memascend", **kw)
    assert stock[:3] == ["/venv/bin/accelerate", "launch", "--use_deepspeed"]
    assert stock[stock.index("--deepspeed_config_file") + 1] == "/w/ds.json"
    assert stock[stock.index("--main_process_port") + 1] == "1234"
    i = stock.index(usb.HF_SCRIPT)
    assert stock[i + 1:i + 3] == ["plain", "/w/ds.json"] and mem[i + 1] == "before"
    assert [w for w in stock if w not in ("plain", "before")] == [w for w in mem if w not in ("plain", "before")]
    trl = usb.Job("trl", True)
    t_stock, t_mem = usb.script_command(trl, "stock", **kw), usb.script_command(trl, "memascend", **kw)
    assert t_stock[:3] == ["/venv/bin/python", usb.TRL_SCRIPT, "plain"] and t_mem[2] == "before"
    assert t_stock[3:] == t_mem[3:] == ["/w/ds.json", "/r.bin", "/n", "/o.json", "/m", "512", "3"]
    for job in (acc, trl):  # the Trainer fills "auto"; by default the script builds the model without zero.Init
        plan = usb.plan_command(job, model_dir="/m")
        assert plan[plan.index("--model-init") + 1] == "eager"


def test_trl_runs_with_its_default_checkpointing_and_the_hf_trainer_either_way():
    # TRL's SFTConfig turns checkpointing on by default; the HF Trainer script takes gradient_checkpointing.
    kw = dict(model_dir="/m", region="/r", nvme_path="/n", out="/o")
    for job in (usb.Job("trl", False), usb.Job("trl", True, dtype="fp32"), usb.Job("trl", True, zero_init=True),
                usb.Job("hf", False, from_pretrained=True)):
        with pytest.raises(ValueError):
            usb.script_command(job, "stock", **kw)
    assert usb.script_command(usb.Job("hf", True, dtype="fp32", zero_init=True), "stock", **kw)[-3:] == \
        ["fp32", "ckpt", "zero"]
    acc = usb.script_command(usb.Job("accelerate", False, dtype="fp32"), "stock", **kw)
    assert acc[acc.index("--mixed_precision") + 1] == "no"
    trl = usb.plan_command(usb.Job("trl", True), model_dir="/m")
    assert trl[trl.index("--checkpointing") + 1] == "full" and trl[trl.index("--trainer") + 1] == "trl"
    assert [j.name for j in usb.JOBS if j.script == "trl"] == ["trl-ckpt"]


def test_plan_command_matches_the_job():
    cmd = usb.plan_command(usb.Job("ds", True, seq_len=256, micro_batch=4), model_dir="/m", python="py")
    assert cmd[:4] == ["py", "-m", "memascend_cli", "plan"]
    args = dict(zip(cmd[4::1], cmd[5::1]))
    assert args["--model"] == "/m" and args["--seq-len"] == "256" and args["--micro-batch"] == "4"
    assert args["--checkpointing"] == "full" and args["--dtype"] == "bf16" and "--json" in cmd
    hf = usb.plan_command(usb.Job("hf", False), model_dir="/m")
    h = usb.MODEL["hidden_size"]
    assert hf[hf.index("--model-init") + 1] == "eager" and hf[hf.index("--reduce-bucket-size") + 1] == str(h * h)
    ds = usb.plan_command(usb.Job("ds", False), model_dir="/m")
    assert ds[ds.index("--model-init") + 1] == "zero"
    # a user's script computes its model's own loss over the full logits, never memascend train's chunked loss
    assert "--full-logits" in ds and "--full-logits" in hf
    # the trainer's imports: the HF Trainer's (also under accelerate) or TRL's; a DeepSpeed script's are the runtime's
    for script, trainer in (("hf", "hf"), ("accelerate", "hf"), ("trl", "trl")):
        cmd = usb.plan_command(usb.Job(script, False), model_dir="/m")
        assert cmd[cmd.index("--trainer") + 1] == trainer
    assert "--trainer" not in usb.plan_command(usb.Job("ds", False), model_dir="/m")


def test_error_percent():
    assert usb.error_percent(int(1.25 * GiB), int(1.59 * GiB)) == -21.4
    assert usb.error_percent(110, 100) == 10.0
    assert usb.error_percent(None, 100) is None and usb.error_percent(100, 0) is None


def _plan(nvme_bytes=2 * GiB):
    items = [{"key": "host/runtime", "tier": "host", "bytes": 5}, {"key": "nvme/x", "tier": "nvme", "bytes": 7},
             {"key": "host/launcher", "tier": "host", "bytes": 3}]
    eng = {"host_peak_bytes": 100, "node_host_peak_bytes": 103, "peak_phase": "backward", "nvme_bytes": nvme_bytes,
           "items": items}
    return {"engines": {"stock": dict(eng, host_peak_bytes=400), "memascend": eng}}


def test_prediction_is_one_ranks_peak_with_its_host_items():
    p = usb.prediction(_plan(), "memascend")
    assert p["host_peak_bytes"] == 100 and p["node_host_peak_bytes"] == 103
    assert p["items"] == {"host/runtime": 5, "host/launcher": 3}
    assert usb.prediction(_plan(), "stock")["host_peak_bytes"] == 400


def test_region_bytes_rounds_up_to_whole_gib_with_headroom():
    assert usb.region_bytes(_plan(2 * GiB)) == 3 * GiB
    assert usb.region_bytes(_plan(1)) == GiB


def _doc():
    def run(job, engine, peak, ok=True):
        return {"job": job, "script": job.split("-")[0], "checkpointing": job.endswith("-ckpt"), "engine": engine,
                "peak_system_bytes": peak, "ru_maxrss_bytes": peak + GiB // 4, "ok": ok, "error": None if ok else "x",
                "plan": {"host_peak_bytes": GiB}, "others_rss_change_at_peak_bytes": GiB // 10, "error_percent": usb.error_percent(GiB, peak),
                "error_percent_ru_maxrss": usb.error_percent(GiB, peak + GiB // 4)}
    return {"runs": [run("ds-nockpt", "stock", 4 * GiB), run("ds-nockpt", "memascend", GiB),
                     run("hf-nockpt", "stock", 4 * GiB), run("hf-nockpt", "memascend", GiB, ok=False)]}


def test_ratios_need_both_runs_ok():
    assert usb.ratios(_doc()) == [("ds-nockpt", 0.25), ("hf-nockpt", None)]


def test_merge_replaces_the_jobs_measured_again_and_keeps_jobs_order():
    old = [{"job": "ds-nockpt", "engine": "stock", "v": 1}, {"job": "ds-nockpt", "engine": "memascend", "v": 1},
           {"job": "hf-nockpt", "engine": "stock", "v": 1}, {"job": "hf-nockpt", "engine": "memascend", "v": 1}]
    new = [{"job": "ds-nockpt", "engine": "memascend", "v": 2}, {"job": "ds-nockpt", "engine": "stock", "v": 2}]
    merged = usb.merge_runs(old + [{"job": "trl-nockpt", "engine": "stock", "v": 1}], new)  # a retired job: dropped
    assert [(r["job"], r["engine"], r["v"]) for r in merged] == [
        ("ds-nockpt", "stock", 2), ("ds-nockpt", "memascend", 2), ("hf-nockpt", "stock", 1),
        ("hf-nockpt", "memascend", 1)]


def test_median_of_repeats_keeps_the_middle_run_and_every_peak():
    def run(engine, peak, ok=True, others=0):
        return {"job": "trl-ckpt", "engine": engine, "peak_system_bytes": peak, "ok": ok, "ru_maxrss_bytes": 1,
                "others_rss_change_at_peak_bytes": others}
    runs = [run("stock", 4), run("memascend", 9), run("stock", 5), run("memascend", 1, ok=False),
            run("stock", 3), run("memascend", 2)]
    picked = {r["engine"]: r for r in usb.median_runs(runs)}
    assert picked["stock"]["peak_system_bytes"] == 4 and picked["stock"]["median_of"] == "all 3 (clean)"
    assert [x["peak_system_bytes"] for x in picked["stock"]["repeats"]] == [4, 5, 3]
    # The failed repeat is not clean: the median of the two clean ones (2, 9) is the lower.
    assert picked["memascend"]["peak_system_bytes"] == 2 and picked["memascend"]["median_of"] == "2 clean of 3"
    assert usb.median_runs([run("stock", 4)]) == [run("stock", 4)]  # one run: kept as it is


def test_runs_other_processes_disturbed_are_left_out_of_the_median():
    def run(peak, others):
        return {"job": "trl-ckpt", "engine": "stock", "peak_system_bytes": peak, "ok": True,
                "others_rss_change_at_peak_bytes": others}
    # Another job freed 0.9 GiB during the first run (its system peak reads low) and grew during the third.
    runs = [run(3 * GiB, -GiB * 9 // 10), run(4 * GiB, 10 << 20), run(11 * GiB, 7 * GiB), run(int(4.2 * GiB), 0)]
    (picked,) = usb.median_runs(runs)
    assert picked["peak_system_bytes"] == 4 * GiB and picked["median_of"] == "2 clean of 4"
    assert [x["clean"] for x in picked["repeats"]] == [False, True, False, True]
    (unclean,) = usb.median_runs(runs[:1] + runs[2:3])
    assert unclean["median_of"] == "all 2 (none clean)" and unclean["peak_system_bytes"] == 3 * GiB


def test_a_sitting_measured_again_in_later_ones_or_of_retired_jobs_is_gone():
    s = [{"jobs": ["ds-nockpt", "hf-nockpt"]}, {"jobs": ["accelerate-nockpt", "trl-ckpt"]}, {"jobs": ["trl-ckpt"]},
         {"jobs": ["accelerate-nockpt"]}]
    assert usb.kept_sittings(s) == [s[0], s[2], s[3]]
    assert usb.kept_sittings(s[:3]) == s[:3]  # the second sitting's accelerate runs are still its own
    # trl-nockpt was TRL's SFTTrainer measured as if it did not checkpoint (it does by default): retired.
    assert usb.kept_sittings([{"jobs": ["trl-nockpt"]}, s[0]]) == [s[0]]


def test_table_has_a_row_per_run_and_the_ratio_line():
    text = usb.table(_doc())
    lines = text.splitlines()
    assert lines[0].startswith("| engine | script | checkpointing |")
    assert len([ln for ln in lines if ln.startswith("| ")]) == 5
    assert "| memascend | ds | none | bf16 | zero | 1.00 | 1.25 | +0.10 | 1.00 | +0.0% | -20.0% | yes |" in text
    assert "| stock | hf | none | bf16 | eager |" in text  # each script's own build when the run does not say
    assert "no: x" in text and "ds-nockpt 0.25, hf-nockpt ?" in text
    assert "over ru_maxrss (the script's largest process alone" in text and "ds-nockpt 0.29, hf-nockpt ?" in text


def test_results_section_renders_a_document(tmp_path):
    doc = dict(_doc(), sittings=[{"command": "python benchmarks/user_script_bench.py --out X", "date": "d",
                                  "jobs": ["ds-nockpt"]}], host="h",
               machine={"cpus": 2, "dram_gib": 23.5}, use="validation", model=usb.MODEL)
    path = tmp_path / "u.json"
    path.write_text(json.dumps(doc))
    code = ("import sys; sys.path.insert(0, 'scripts'); import results_ecosystem; "
            f"print(results_ecosystem.section_user_scripts({str(path)!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.startswith("## Plan accuracy on user scripts") and "| memascend | ds | none |" in out
    assert "today's plan GiB" in out  # today's planner on the recorded jobs


def test_an_eager_fp32_job_builds_outside_zero_init_and_is_planned_so():
    job = usb.Job("ds", False, dtype="fp32", zero_init=False, model="156m")
    assert job.name == "ds-nockpt-fp32-eager-156m" and usb.Job("ds", False).name == "ds-nockpt"
    cmd = usb.script_command(job, "memascend", model_dir="/m", region="/r.bin", nvme_path="/n", out="/o.json")
    assert "--no-zero-init" in cmd and cmd[cmd.index("--dtype") + 1] == "fp32"
    plan = usb.plan_command(job, model_dir="/m")
    assert plan[plan.index("--model-init") + 1] == "eager" and plan[plan.index("--dtype") + 1] == "fp32"
    assert usb.MODELS[job.model]["num_key_value_heads"] == 4


def test_the_matrix_has_every_script_dtype_build_and_checkpointing_once():
    combos = {(j.script, j.dtype, j.zero_init, j.checkpointing) for j in usb.MATRIX}
    assert len(combos) == len(usb.MATRIX) == 3 * 2 * 2 * 2
    names = [j.name for j in usb.JOBS]
    assert len(set(names)) == len(names)
    # each script's own build keeps the short name: zero.Init in the DeepSpeed script, whole in the Trainer's
    assert usb.Job("hf", False).name == "hf-nockpt" and usb.Job("hf", False, zero_init=True).name == "hf-nockpt-zero"


def test_a_from_pretrained_job_loads_its_weights_and_is_planned_so():
    job = usb.Job("ds", False, dtype="fp32", from_pretrained=True)
    assert job.name == "ds-nockpt-fp32-pretrained" and not job.zero_init
    cmd = usb.script_command(job, "stock", model_dir="/m", region="/r.bin", nvme_path="/n", out="/o.json")
    assert "--from-pretrained" in cmd and "--no-zero-init" in cmd
    plan = usb.plan_command(job, model_dir="/m")
    assert plan[plan.index("--model-init") + 1] == "from-pretrained"


def test_a_capped_run_is_the_eager_fp32_156m_job_and_counts_the_steps_it_finished():
    assert capped.JOB in usb.JOBS and capped.JOB.name == "ds-nockpt-fp32-eager-156m" and capped.JOB.steps == 6
    assert capped.steps_trained({"losses": [9.1, 9.0]}, "") == 2
    log = ('loading\nphase {"phase": "initialize", "hwm_kib": 1}\nphase {"phase": "step 0", "hwm_kib": 2}\n'
           'phase {"phase": "forward 1", "hwm_kib": 2}\nphase {"phase": "step 1", "hwm_kib": 3}\nKilled\n')
    assert capped.steps_trained(None, log) == 2  # OOM-killed in step 3: no result file, the phases it printed


# --- the plan against the recorded matrix ----------------------------------------------------------------------

DOCS = {"memascend": "matrix.json.gz", "stock": "matrix-stock.json.gz"}
TOLERANCE_PERCENT = 10.0
MEMASCEND_CLOSE_PERCENT, MEMASCEND_CLOSE_SHARE = 5.0, 0.8
# Runs planned more than TOLERANCE_PERCENT off: none. Stock in bf16 under the HF Trainer and accelerate was planned
# -10.1% .. -13.3% low until the heap a 16-bit backward's fp32 gradient copies leave kept was modelled
# (host/grad_conversion_heap, fitted on the calibration traces below, never on these runs). Strict: a run that goes
# beyond the tolerance must be listed here, and a listed run that comes within it fails until it is taken off.
KNOWN_MISSES: set[tuple[str, str]] = set()


def _load(name: str) -> dict:
    return read_summary(os.path.join(REPO, "docs", "bench", "user-script", name))


def _todays_plan(job, work: str, models: dict) -> dict:
    """`memascend plan --json` for a job in this process (the harness's own plan command)."""
    cmd = usb.plan_command(job, model_dir=usb.write_model(work, job.model, models[job.model]))
    result = CliRunner().invoke(app, cmd[cmd.index("plan"):])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def errors(tmp_path_factory) -> dict[tuple[str, str], float]:
    """(engine, job) -> today's plan error against ru_maxrss in percent, over every matrix run that trained; the
    plan in this process, once per job."""
    work = str(tmp_path_factory.mktemp("models"))
    plans, out = {}, {}
    for engine, name in DOCS.items():
        doc = _load(name)
        models = dict(doc.get("models") or {"82m": doc["model"]})
        for run in doc["runs"]:
            job = usb.recorded_job(run)
            if run["engine"] != engine or not run.get("ok") or job not in usb.MATRIX:
                continue
            if job.name not in plans:
                plans[job.name] = _todays_plan(job, work, models)
            planned = usb.prediction(plans[job.name], engine)["host_peak_bytes"]
            out[(engine, job.name)] = usb.error_percent(planned, run["ru_maxrss_bytes"])
    return out


def test_every_combination_is_recorded_for_both_engines(errors):
    for engine in DOCS:
        assert {j for e, j in errors if e == engine} == {j.name for j in usb.MATRIX}, engine


def test_plan_within_10_percent_of_ru_maxrss_for_both_engines(errors):
    misses = {k: e for k, e in errors.items() if abs(e) > TOLERANCE_PERCENT}
    assert set(misses) == KNOWN_MISSES, misses  # strict both ways: a new miss, or a known one fixed


def test_memascend_within_5_percent_in_at_least_80_percent(errors):
    mine = [e for (engine, _), e in errors.items() if engine == "memascend"]
    close = [e for e in mine if abs(e) <= MEMASCEND_CLOSE_PERCENT]
    assert mine and len(close) >= MEMASCEND_CLOSE_SHARE * len(mine), sorted(mine)


# --- the calibration traces (benchmarks/step_memory_trace.py): never a matrix run -----------------------------------

TRACES = sorted(glob.glob(os.path.join(REPO, "docs", "bench", "user-script", "trace", "*.json.gz")))


def _small_partition_fp32_bytes(job) -> int:
    from memascend_cli.models import spec_from_hf_config
    from memascend_cli.planner.context import Context
    from memascend_cli.planner.heap import small_partition_fp32_bytes
    from memascend_cli.planner.job import JobSpec
    from memascend_cli.planner.spec import HardwareSpec

    spec = spec_from_hf_config(usb.MODELS[job.model], name=job.model, origin="user-script bench")
    cpu = HardwareSpec(name="cpu", dram_gib=24)
    return small_partition_fp32_bytes(Context(JobSpec(model=spec, dtype=job.dtype), cpu, "stock"))


def test_grad_conversion_heap_fraction_is_the_fit_on_the_16_bit_traces(tmp_path):
    """heap.GRAD_CONVERSION_HEAP_FRACTION is conversion_heap_fit on the 16-bit calibration traces (the heap kept at the
    optimizer step's entries beyond the plan's other kept items), so it cannot drift onto the matrix it is validated
    on; the fp32 trace, whose gradients are never converted, is not fitted on."""
    from memascend_cli.planner.heap import GRAD_CONVERSION_HEAP_FRACTION

    rows = []
    for path in TRACES:
        job = usb.Job(**smt.trace_job(path))
        if job.dtype == "fp32":
            continue
        with gzip.open(path, "rt") as f:
            kept = smt.step_entry_kept_heap_bytes(json.load(f))
        items = usb.prediction(_todays_plan(job, str(tmp_path), usb.MODELS), "stock")["items"]
        assert "host/grad_conversion_heap" in items and "host/grad_conversion_heap" not in smt.KEPT_HEAP_ITEMS
        rows.append((kept, sum(items.get(k, 0) for k in smt.KEPT_HEAP_ITEMS), _small_partition_fp32_bytes(job)))
    assert len(rows) >= 3
    assert smt.conversion_heap_fit(rows) == GRAD_CONVERSION_HEAP_FRACTION


def test_a_traces_name_is_its_job_and_its_kept_heap_the_most_at_a_step_entry():
    assert smt.trace_job("/d/accelerate-ckpt-bf16-zero.json.gz") == {
        "script": "accelerate", "checkpointing": True, "dtype": "bf16", "zero_init": True}
    assert smt.trace_job("ds-nockpt-fp32-eager.json") == {
        "script": "ds", "checkpointing": False, "dtype": "fp32", "zero_init": False}
    def call(name, kept_mib):
        return {"call": name, "enter": {"heap_free_kept_mib": kept_mib}}
    trace = {"calls": [call("DeepSpeedEngine.step", 10.0), call("DeepSpeedEngine.backward", 99.0),
                       call("DeepSpeedEngine.step", 12.5)]}
    assert smt.step_entry_kept_heap_bytes(trace) == int(12.5 * 2**20)
    # a ratio of sums: the larger model weighs more
    assert smt.conversion_heap_fit([(300, 100, 100), (1000, 500, 1000)]) == 0.64
