"""bench --capacity's pure parts (memascend_cli/bench/capacity.py): the grids, the probe sequence, the SSD ceiling, the
plan's maximum under the cap, the summary rows and the section of docs/results/capacity.md. The live search is
tests/integration/test_bench_capacity.py."""

from __future__ import annotations

import dataclasses

import pytest

from memascend_cli.bench import capacity, capacity_run, runner
from memascend_cli.bench.capacity import FAILED, FIT, OOM, STALLED, Conclusion, Grid, next_probe
from memascend_cli.bench.configs import ssd_space_bytes
from memascend_cli.bench.document import recorded_probe
from memascend_cli.bench.runs import RunSpec
from memascend_cli.models import load_model
from memascend_cli.planner import search
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.units import GiB, MiB

LAYERS = capacity.grid("layers")


def run_search(g: Grid, start, fits_up_to: int | None, top=None, top_reason="grid end", stalls=()) -> tuple:
    """Drive next_probe against a job that fits up to `fits_up_to`: (the values probed, the conclusion)."""
    top = g.last if top is None else top
    results = []
    while True:
        nxt = next_probe(g, start, top, top_reason, results)
        if isinstance(nxt, Conclusion):
            return [v for v, _ in results], nxt
        assert nxt not in [v for v, _ in results], "probed a value twice"
        fits = fits_up_to is not None and nxt <= fits_up_to
        results.append((nxt, FIT if fits else (STALLED if nxt in stalls else OOM)))


def test_the_grids_are_the_planner_searches():
    assert (LAYERS.first, LAYERS.step, LAYERS.last) == (1, 1, search.MAX_LAYERS)
    seq = capacity.grid("seq")
    assert (seq.first, seq.step, seq.last) == (search.SEQ_GRANULE, search.SEQ_GRANULE, search.MAX_SEQ_TOKENS)
    assert seq.index(2048) == 7 and seq.value(7) == 2048 and seq.size == search.MAX_SEQ_TOKENS // search.SEQ_GRANULE
    mb = capacity.grid("micro-batch")
    assert (mb.first, mb.step, mb.last) == (1, 1, search.MAX_MICRO_BATCH)
    with pytest.raises(ValueError):
        seq.index(1000)  # not a multiple of the granule
    with pytest.raises(ValueError):
        capacity.grid("width")


def test_a_plan_that_is_right_takes_two_probes():
    probed, c = run_search(LAYERS, start=12, fits_up_to=12)
    assert probed == [12, 13] and c == Conclusion(12, False, "OOM-killed at 13")


def test_up_after_a_fit_down_after_an_oom_kill_doubling_then_bisecting():
    probed, c = run_search(LAYERS, start=10, fits_up_to=20)
    assert probed[:5] == [10, 11, 13, 17, 25] and c.measured_max == 20 and not c.at_least
    assert probed[-1] in (20, 21) and {20, 21} <= set(probed)
    probed, c = run_search(LAYERS, start=30, fits_up_to=21)
    assert probed[:4] == [30, 29, 27, 23] and c.measured_max == 21 and c.reason == "OOM-killed at 22"
    assert len(probed) <= 8


def test_the_seq_grid_steps_by_its_granule():
    seq = capacity.grid("seq")
    probed, c = run_search(seq, start=10752, fits_up_to=11264)
    assert probed[:3] == [10752, 11008, 11520] and c == Conclusion(11264, False, "OOM-killed at 11520")


def test_a_stall_counts_as_does_not_fit_and_is_named():
    probed, c = run_search(LAYERS, start=8, fits_up_to=8, stalls=(9,))
    assert probed == [8, 9] and c == Conclusion(8, False, "stalled (thrashing or timed out) at 9")


def test_nothing_fits_when_the_first_grid_value_is_killed():
    probed, c = run_search(LAYERS, start=None, fits_up_to=None)
    assert probed == [1] and c == Conclusion(None, False, "OOM-killed at 1, the grid's first value")
    probed, c = run_search(LAYERS, start=4, fits_up_to=None)
    assert probed == [4, 3, 1] and c.measured_max is None


def test_a_fit_at_the_ceiling_is_at_least_with_the_ceiling_reason():
    probed, c = run_search(LAYERS, start=100, fits_up_to=10_000, top=137, top_reason="SSD space (...)")
    assert probed == [100, 101, 103, 107, 115, 131, 137] and c == Conclusion(137, True, "SSD space (...)")
    probed, c = run_search(LAYERS, start=500, fits_up_to=10_000, top=137, top_reason="SSD space")
    assert probed == [137] and c.at_least  # the start is clamped to the ceiling
    probed, c = run_search(LAYERS, start=LAYERS.last, fits_up_to=10_000)
    assert probed == [LAYERS.last] and c == Conclusion(LAYERS.last, True, "grid end")


def test_no_probe_when_not_even_the_first_value_has_room():
    assert next_probe(LAYERS, 5, None, "SSD space (x)", []) == Conclusion(None, False, "not probed: SSD space (x)")


def test_a_failed_probe_stops_the_search_as_a_lower_bound():
    c = next_probe(LAYERS, 5, 100, "grid end", [(5, FIT), (6, FAILED)])
    assert c == Conclusion(5, True, "the probe at 6 failed (not an OOM kill)")
    assert capacity.within_one_step(LAYERS, 5, c) is None


def test_within_one_grid_step():
    assert capacity.within_one_step(LAYERS, 12, Conclusion(13, False, "")) is True
    assert capacity.within_one_step(LAYERS, 12, Conclusion(10, False, "")) is False
    assert capacity.within_one_step(LAYERS, None, Conclusion(1, False, "")) is True  # none planned, first fits
    assert capacity.within_one_step(LAYERS, None, Conclusion(None, False, "")) is True
    assert capacity.within_one_step(LAYERS, 3, Conclusion(None, False, "")) is False
    # At a ceiling the measurement is a lower bound: only a plan below it by more than a step is wrong.
    assert capacity.within_one_step(LAYERS, 137, Conclusion(137, True, "SSD")) is True
    assert capacity.within_one_step(LAYERS, 12, Conclusion(137, True, "SSD")) is False


def test_ceiling_is_the_last_value_whose_ssd_space_fits():
    g = Grid("layers", 1, 1, 100, "layers")
    assert capacity.ceiling(g, lambda v: v * GiB, 100 * GiB) == (100, "grid end (100 layers)")
    top, why = capacity.ceiling(g, lambda v: v * GiB, 37 * GiB + 5)
    assert top == 37 and why.startswith("SSD space (38 layers needs 38.0 GiB, 37.0 GiB usable")
    assert capacity.ceiling(g, lambda v: v * GiB, GiB // 2)[0] is None


def test_outcome_of_a_bench_run():
    assert capacity.outcome({"ok": True}) == FIT
    assert capacity.outcome({"ok": False, "oom_killed": True}) == OOM
    assert capacity.outcome({"ok": False, "oom_killed": False, "timed_out": True}) == STALLED
    assert capacity.outcome({"ok": False, "oom_killed": False, "thrashed": True}) == STALLED
    assert capacity.outcome({"ok": False, "oom_killed": False}) == FAILED


def _fixed(model: str = "tiny-llama", seq_len: int = 64) -> runner.Point:
    return runner.Point(model=model, spec=load_model(model), layers=None, seq_len=seq_len, micro_batch=1, steps=2,
                        dtype="fp32", seed=0, checkpointing="full", ranks=1, host_budget_bytes=None, accelerator="cpu",
                        hw=HardwareSpec(name="test", dram_gib=24, cpu_cores=2), deepspeed_version="0.19.8")


def test_the_planned_max_is_the_planner_search_with_the_cap_as_dram():
    fixed, run = _fixed(), RunSpec("tuned", "tuned")
    peaks = {}
    for L in (6, 7):
        p = capacity_run.probe_point(fixed, "layers", L)
        peaks[L] = p.predict("tuned", capacity_run._config(run, p, "/unused"))["node_host_peak_bytes"]
    cap = (peaks[6] + peaks[7]) // 2
    # `bench --dram-cap` gives every point the node its cgroup makes (HardwareSpec.under_dram_cap), once.
    fixed = dataclasses.replace(fixed, hw=fixed.hw.under_dram_cap(cap))
    planned, top = capacity_run.plan_engine(run, "layers", fixed, cap_bytes=cap, nvme_dir="/unused",
                                            usable_disk_bytes=1 << 50)
    assert planned == (6, "dram") and top == (search.MAX_LAYERS, f"grid end ({search.MAX_LAYERS} layers)")
    # On a small disk the SSD space binds both the plan and the probes.
    planned, top = capacity_run.plan_engine(run, "layers", fixed, cap_bytes=cap, nvme_dir="/unused",
                                            usable_disk_bytes=100 * MiB)
    assert top[0] is not None and top[0] < 6 and top[1].startswith("SSD space (") and planned == (top[0], "nvme_space")


def test_a_memascend_probe_needs_its_whole_region():
    fixed = _fixed()
    need = {}
    for name in ("tuned", "memascend"):
        run = RunSpec(name, name)
        p = capacity_run.probe_point(fixed, "layers", 8)
        pred = p.predict(name, capacity_run._config(run, p, "/unused"))
        need[name] = ssd_space_bytes(name, pred, 1), pred["nvme_bytes_per_rank"]
    assert need["tuned"][0] == need["tuned"][1]
    assert need["memascend"][0] >= 1.5 * need["memascend"][1] + (64 << 20)


def _doc() -> dict:
    g = LAYERS
    probes = [capacity.probe_record(12, {"ok": True, "losses": [1.0, 0.9], "cgroup": {"peak_bytes": 3 * GiB},
                                         "predicted": {"node_host_peak_bytes": int(3.9 * GiB)}}, "tuned/layers-12/b.json"),
              capacity.probe_record(13, {"ok": False, "oom_killed": True, "losses": [], "error": "does not fit: ...",
                                         "cgroup": {"peak_bytes": 4 * GiB}}, "tuned/layers-13/b.json")]
    tuned = capacity.engine_entry("tuned", "tuned", g, (12, "dram"), (214, "SSD space (...)"), probes,
                                  Conclusion(12, False, "OOM-killed at 13"))
    mem = capacity.engine_entry("memascend", "memascend", g, (137, "nvme_space"), (137, "SSD space (...)"),
                                [capacity.probe_record(137, {"ok": True, "losses": [1.0, 0.9]}, "m/b.json")],
                                Conclusion(137, True, "SSD space (...)"))
    stock = capacity.engine_entry("stock", "stock", g, (None, "dram"), (214, "SSD space (...)"),
                                  [capacity.probe_record(1, {"ok": False, "oom_killed": True, "losses": []}, "s/b.json")],
                                  Conclusion(None, False, "OOM-killed at 1, the grid's first value"))
    job = {"model": "bench-llama-136m", "layers": None, "seq_len": 2048, "micro_batch": 1, "steps": 2,
           "dtype": "fp32", "checkpointing": "full", "ranks": 1}
    doc = capacity.capacity_document(g=g, cap_bytes=4 * GiB, job=job, hardware={}, disk={}, engines=[stock, tuned, mem],
                                     notes=[])
    doc["meta"] = {"command": "memascend bench --capacity layers --dram-cap 4GiB", "date": "d", "host": "h"}
    return doc


def test_engine_entries_and_rows():
    doc = _doc()
    stock, tuned, mem = doc["engines"]
    assert tuned["planned_binding"] == "DRAM" and mem["planned_binding"] == "SSD space"
    assert tuned["within_one_step"] and mem["within_one_step"] and stock["within_one_step"]
    assert tuned["killed_where_planned_to_fit"] == [] and tuned["probes"][1]["outcome"] == OOM
    assert tuned["probes"][0]["cgroup_peak_bytes"] == 3 * GiB and tuned["probes"][0]["steps_done"] == 2
    rows = capacity.table_rows(doc)
    assert rows[0][:3] == ["stock", "none fits (DRAM)", "none fits"]
    assert rows[1] == ["tuned", "12 (DRAM)", "12", "OOM-killed at 13", "12 fit, 13 OOM", "yes"]
    assert rows[2][2] == "at least 137"
    # An OOM kill at or below the plan's maximum is a wrong plan: it is listed.
    bad = capacity.engine_entry("tuned", "tuned", LAYERS, (14, "dram"), (214, ""), tuned["probes"],
                                Conclusion(12, False, "OOM-killed at 13"))
    assert bad["killed_where_planned_to_fit"] == [13] and bad["within_one_step"] is False


def test_results_section():
    assert capacity.results_section([]) == ""
    text = capacity.results_section([("docs/bench/capacity/depth-4gib.json", _doc())])
    assert text.startswith("## Capacity under a DRAM cap\n")
    # A sitting recorded without --title is headed in words, never by its file's path.
    assert ("\n### bench-llama-136m: the largest depth under a DRAM cap of 4.00 GiB, fp32, stock, tuned, memascend, "
            "2 steps, d\n") in text
    assert "| 4.00 | layers | tuned | 12 (DRAM) | 12 (OOM-killed at 13) | yes | - | 12: fit 3.00; 13: oom 4.00 |" in text
    assert "| 4.00 | layers | memascend | 137 (SSD space) | at least 137 (SSD space (...)) | yes |" in text
    assert "bench-llama-136m, seq len 2048, micro batch 1, 2 steps" in text  # the searched axis is not listed
    assert "2 steps, fp32, checkpointing full, 1 rank(s), tuned and memascend loss hf (stock: hf); d, host `h`" in text
    # A resumed search names the sittings its probes come from.
    doc = _doc()
    doc["engines"][1]["probes"][0]["sitting"], doc["engines"][1]["probes"][1]["sitting"] = "day 1", "day 2"
    assert "; resumed: probes of the sittings started day 1, day 2, host" in capacity.results_section([("p", doc)])


def test_a_probe_gets_the_plans_step_time_with_slack_or_the_fallback_without_one():
    # 2 steps + startup as one more: 3 step times with the slack, after the start allowance.
    assert capacity.probe_timeout_s(20.0, 2) == capacity.PROBE_START_S + capacity.PROBE_STEP_SLACK * 3 * 20.0
    assert capacity.probe_timeout_s(200.0, 2) > capacity.probe_timeout_s(20.0, 2)
    assert capacity.probe_timeout_s(None, 2) == capacity.probe_timeout_s(0.0, 2) == capacity.PROBE_TIMEOUT_FALLBACK_S


def test_todays_plan_of_a_recorded_table():
    """results.md's "today's plan": the current planner on each engine's recorded job and cap, bound by the SSD
    ceiling the search recorded."""
    import json
    import os

    folder = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "bench", "capacity", "cap4gib-layers-fp32")
    with open(os.path.join(folder, "capacity.json")) as f:
        doc = json.load(f)
    today = {e["name"]: capacity.replanned_max(doc, e, recorded_probe(folder, e["probes"][0]["document"]))
             for e in doc["engines"]}
    assert today["stock"] is None  # stock's buffers alone exceed 4 GiB
    assert today["memascend"] == next(e["ceiling"] for e in doc["engines"] if e["name"] == "memascend")  # the disk
    assert 1 <= today["tuned"] < today["memascend"]
    e = {"name": "tuned", "measured_max": 10, "at_least": False, "reason": "OOM-killed at 11"}
    g = capacity.grid("layers")
    assert capacity._today(g, {"tuned": 11}, e) == "11 (within)" and capacity._today(g, {"tuned": 13}, e) == "13 (off)"
    assert capacity._today(g, {}, e) == "-"
    # A plan above the measured maximum says a job fits that was OOM-killed: the column names it.
    e["probes"] = [{"value": 10, "outcome": capacity.FIT}, {"value": 11, "outcome": OOM}]
    assert capacity._today(g, {"tuned": 11}, e) == "11 (within; 11 did not fit)"
    assert capacity._today(g, {"tuned": 10}, e) == "10 (within)"


def _store_probe(out, run: str, point: runner.Point, cap_bytes: int, ok: bool, date: str = "2026-01-01T00:00:00Z",
                 **job_changes) -> None:
    import json
    import os

    folder = os.path.join(out, run, f"layers-{point.spec.num_hidden_layers}")
    os.makedirs(folder)
    job = {**point.job_identity(), "dram_cap_bytes": cap_bytes, "nvme_dir": "/elsewhere", **job_changes}
    r = {"name": run, "ok": ok, "oom_killed": not ok, "losses": [1.0, 0.9] if ok else [],
         "cgroup": {"peak_bytes": cap_bytes - (GiB if ok else 0)}}
    with open(os.path.join(folder, "bench.json"), "w") as f:
        json.dump({"job": job, "runs": [r], "meta": {"date": date}}, f)


def test_resume_reuses_an_earlier_sittings_probes_and_runs_none_it_has(tmp_path, monkeypatch):
    """--resume: stored probes of the same job count as run now (with their sitting), a folder a cut-off probe left
    without bench.json is not a probe, and the search concludes from them without running a probe."""
    fixed, run, cap = _fixed(), RunSpec("tuned", "tuned"), 4 * GiB
    _store_probe(tmp_path, "tuned", capacity_run.probe_point(fixed, "layers", 6), cap, ok=True)
    _store_probe(tmp_path, "tuned", capacity_run.probe_point(fixed, "layers", 7), cap, ok=False)
    (tmp_path / "tuned" / "layers-9" / "runs").mkdir(parents=True)  # cut off: no bench.json
    stored = capacity_run.stored_probes(run, "layers", fixed, cap_bytes=cap, out_dir=str(tmp_path))
    assert [(q["value"], q["outcome"], q["sitting"]) for q in stored] == [
        (6, FIT, "2026-01-01T00:00:00Z"), (7, OOM, "2026-01-01T00:00:00Z")]
    assert stored[0]["document"] == "tuned/layers-6/bench.json" and stored[0]["cgroup_peak_bytes"] == 3 * GiB
    assert capacity_run.stored_probes(RunSpec("memascend", "memascend"), "layers", fixed, cap_bytes=cap,
                                      out_dir=str(tmp_path)) == []

    def no_probe(*a, **k):
        raise AssertionError("a stored probe ran again")

    monkeypatch.setattr(runner, "run_point", no_probe)
    entry = capacity_run.search_engine(run, "layers", fixed, cap_bytes=cap, out_dir=str(tmp_path), nvme_dir="/unused",
                                       nvme_info={}, usable_disk_bytes=1 << 50, engine_ok=True, settle_cap_s=1,
                                       probe_timeout_s=None, meta={"date": "now"}, stored=stored)
    assert entry["measured_max"] == 6 and not entry["at_least"] and entry["reason"] == "OOM-killed at 7"
    assert [q["value"] for q in entry["probes"]] == [6, 7]


@pytest.mark.parametrize("change, says", [({"dram_cap_bytes": 8 * GiB}, "dram_cap_bytes: 8589934592, not 4294967296"),
                                          ({"steps": 3}, "steps: 3, not 2"), ({"dtype": "bf16"}, "dtype: 'bf16'")])
def test_resume_refuses_a_stored_probe_of_another_job(tmp_path, change, says):
    from memascend_cli.errors import BadInput

    fixed, cap = _fixed(), 4 * GiB
    _store_probe(tmp_path, "tuned", capacity_run.probe_point(fixed, "layers", 6), cap, ok=True, **change)
    with pytest.raises(BadInput, match="is another job") as e:
        capacity_run.stored_probes(RunSpec("tuned", "tuned"), "layers", fixed, cap_bytes=cap, out_dir=str(tmp_path))
    assert says in str(e.value)


def test_a_probe_of_several_runs_fits_only_when_every_run_fits():
    """bench --capacity --repeat N: runner.median_run stands a failed repeat for the probe; the record and the results
    table say how many of the runs fit."""
    oom = {"ok": False, "oom_killed": True, "losses": [1.0], "error": "does not fit: OOM-killed at step 2",
           "cgroup": {"peak_bytes": 4 * GiB},
           "repeats": [{"ok": False, "ru_maxrss_bytes": 4 * GiB}, {"ok": True, "ru_maxrss_bytes": int(3.8 * GiB)},
                       {"ok": True, "ru_maxrss_bytes": int(3.9 * GiB)}]}
    q = capacity.probe_record(3328, oom, "tuned/seq-3328/bench.json")
    assert (q["outcome"], q["repeats"], q["repeats_fit"]) == (OOM, 3, 2)
    assert q["ru_maxrss_each_bytes"] == [4 * GiB, int(3.8 * GiB), int(3.9 * GiB)]
    one = capacity.probe_record(3072, {"ok": True, "losses": [1.0, 0.9]}, "tuned/seq-3072/bench.json")
    assert (one["repeats"], one["repeats_fit"], one["ru_maxrss_each_bytes"]) == (1, 1, None)
    doc = _doc()
    doc["job"]["repeat"] = 3
    doc["engines"][1]["probes"][0].update(repeats=3, repeats_fit=3, ru_maxrss_bytes=int(2.95 * GiB),
                                          ru_maxrss_each_bytes=[int(2.9 * GiB), int(2.95 * GiB), int(2.99 * GiB)])
    doc["engines"][1]["probes"][1].update(repeats=3, repeats_fit=2, ru_maxrss_bytes=4 * GiB,
                                          ru_maxrss_each_bytes=[4 * GiB, 4 * GiB, 4 * GiB])
    text = capacity.results_section([("p", doc)])
    # each run's ru_maxrss as lowest-highest; one value when they agree to the table's precision
    assert "12: fit (all 3) 3.00 / 2.90-2.99; 13: oom (2 of 3 fit) 4.00 / 4.00" in text
    assert "(stock: hf), 3 runs per probe (fits when all fit); d" in text


def test_resume_refuses_stored_probes_of_another_repeat_count(tmp_path):
    from memascend_cli.errors import BadInput

    fixed, cap = _fixed(), 4 * GiB
    _store_probe(tmp_path, "tuned", capacity_run.probe_point(fixed, "layers", 6), cap, ok=True)
    with pytest.raises(BadInput, match="repeat: 1, not 3"):
        capacity_run.stored_probes(RunSpec("tuned", "tuned"), "layers", fixed, cap_bytes=cap, out_dir=str(tmp_path),
                                   repeat=3)


def test_a_recorded_sitting_is_its_summary_and_one_bundle_of_probes(tmp_path, monkeypatch):
    """scripts/record_capacity.py: capacity.json plus probes.json.gz (each probe's bench.json and timelines), read
    back by document.recorded_probe exactly as the sitting's OUT has them."""
    import importlib.util
    import json
    import os

    from memascend_cli.bench import document

    spec = importlib.util.spec_from_file_location(
        "record_capacity", os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "record_capacity.py"))
    rec = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rec)
    out = tmp_path / "out"
    doc = _doc()
    for e in doc["engines"]:
        for q in e["probes"]:
            run = {"name": e["name"], "ok": q["outcome"] == FIT, "losses": [], "timeline": [[0.0, 1]]}
            os.makedirs(out / os.path.dirname(q["document"]), exist_ok=True)
            document.write_document({"job": {"layers": q["value"], "seq_len": 64}, "runs": [run]},
                                    str(out / q["document"]))
    (out / "capacity.json").write_text(json.dumps(doc))
    monkeypatch.setattr(rec, "DEST", str(tmp_path / "docs"))
    dst = rec.record(str(out), "cap4gib-layers")
    assert sorted(os.listdir(dst)) == ["capacity.json", document.RECORDED_PROBES_FILE]
    q = doc["engines"][1]["probes"][1]
    with open(out / q["document"]) as f:
        assert document.recorded_probe(dst, q["document"]) == json.load(f) == document.recorded_probe(str(out),
                                                                                                     q["document"])


def test_a_recorded_command_names_the_steps_it_ran_with_when_the_default_has_changed():
    doc = _doc()  # 2 steps, its command without --steps
    assert capacity.CAPACITY_STEPS != 2
    text = capacity.results_section([("p", doc)])
    assert "`memascend bench --capacity layers --dram-cap 4GiB` (run when the default was --steps 2)" in text
    doc["meta"]["command"] += " --steps 2"
    assert "run when the default" not in capacity.results_section([("p", doc)])
    doc = _doc()
    doc["job"]["steps"] = capacity.CAPACITY_STEPS
    assert "run when the default" not in capacity.results_section([("p", doc)])


def test_one_grid_step_costs_what_the_plan_adds_there():
    from memascend_cli.planner.memory import JobSpec, estimate

    job = JobSpec(model=load_model("bench-llama-136m"), seq_len=2048, micro_batch=1, dtype="fp32",
                  checkpointing="full")
    hw = HardwareSpec(name="cap", dram_gib=8, cpu_cores=2)
    peak = {s: estimate(capacity.with_value("seq", job, s), hw, "memascend").node_host_peak_bytes for s in (4096, 4352)}
    assert capacity.step_cost_bytes("seq", job, hw, "memascend", 4096) == peak[4352] - peak[4096] > 0
    deeper = capacity.step_cost_bytes("layers", job, hw, "tuned", 12)
    assert deeper == (estimate(capacity.with_value("layers", job, 13), hw, "tuned").node_host_peak_bytes
                      - estimate(capacity.with_value("layers", job, 12), hw, "tuned").node_host_peak_bytes) > 0


def _repeated(value: int, outcome: str, rss_gib: list[float]) -> dict:
    return {"value": value, "outcome": outcome, "ru_maxrss_each_bytes": [int(g * GiB) for g in rss_gib]}


def test_the_largest_spread_is_of_a_probe_whose_runs_all_fit():
    probes = [_repeated(30, FIT, [7.2, 7.5]), _repeated(31, FIT, [7.4, 7.9, 7.6]), _repeated(33, OOM, [6.0, 8.0]),
              {"value": 29, "outcome": FIT, "ru_maxrss_each_bytes": None}]
    spread, value = capacity.largest_spread(probes)
    assert value == 31 and spread == int(7.9 * GiB) - int(7.4 * GiB)
    assert capacity.largest_spread([_repeated(5, FIT, [3.0])]) is None  # one run: no spread


def test_the_noise_table_and_the_context_ceiling():
    doc = _doc()
    doc["engines"][1]["probes"][0]["ru_maxrss_each_bytes"] = [int(3.5 * GiB), int(3.9 * GiB)]
    text = capacity.results_section([("docs/bench/capacity/depth-4gib/capacity.json", doc)],
                                    steps={"docs/bench/capacity/depth-4gib/capacity.json": {"tuned": GiB // 5}})
    assert "### One grid step against the run-to-run spread" in text
    assert "| 4.00 | layers | tuned | 12 | 0.200 | 0.400 (12) | 2.0 | `depth-4gib` |" in text
    noise = text.split("run-to-run spread")[-1].split("### Every sitting")[0]
    assert "| 4.00 | layers | memascend |" not in noise  # no probe of several runs
    assert "One grid step against" not in capacity.results_section([("p", _doc())])
    seq = dict(doc, axis="seq", engines=[dict(doc["engines"][1], measured_max=4096)])
    assert capacity.context_ceiling_lines(seq, 256 * 1024) == [
        "", "memascend's plan adds 256 KiB of host memory per token at its measured maximum: with no fixed host "
            "memory at all the cap would hold at most 16384 tokens, 4.0x tuned stock's measured maximum."]
    assert capacity.context_ceiling_lines(doc, 256 * 1024) == []  # a depth table
    assert capacity.context_ceiling_lines(seq, None) == []


def _probe(value: int, outcome: str) -> dict:
    return {"value": value, "outcome": outcome}


def test_plans_meeting_both_are_within_one_step_of_every_sitting_and_below_every_failure():
    # one sitting: measured 32 (33 OOM-killed): 31 or 32; 33 is within one step but was killed
    one = [Conclusion(32, False, "OOM-killed at 33")]
    assert capacity.plans_meeting_both(LAYERS, one, [_probe(32, FIT), _probe(33, OOM)]) == [31, 32]
    # a second sitting of the same job measured 30 (31 OOM-killed): no plan is within one step of both and safe
    two = one + [Conclusion(30, False, "OOM-killed at 31")]
    assert capacity.plans_meeting_both(LAYERS, two, [_probe(32, FIT), _probe(33, OOM), _probe(30, FIT),
                                                      _probe(31, OOM)]) == []
    # nothing fits: "none fits" (None), or the grid's first value when it was never killed
    assert capacity.plans_meeting_both(LAYERS, [Conclusion(None, False, "OOM-killed at 1")], [_probe(1, OOM)]) == [None]
    # a failed probe concludes nothing
    assert capacity.plans_meeting_both(LAYERS, [Conclusion(5, True, "the probe at 6 failed")], []) is None


def test_the_agreement_table_joins_the_sittings_of_one_job_and_marks_todays_plan():
    a, b = _doc(), _doc()
    tuned_b = b["engines"][1]
    tuned_b.update(measured_max=10, reason="OOM-killed at 11")
    tuned_b["probes"] = [_probe(10, FIT), _probe(11, OOM)]
    today = {"a": {"tuned": 12, "memascend": 137, "stock": None}, "b": {"tuned": 12, "memascend": 137, "stock": None}}
    text = "\n".join(capacity.agreement_section([("a", a), ("b", b)], today))
    # sittings measured 12 (13 killed) and 10 (11 killed): no plan meets both; today's 12 does not
    assert "| 4.00 | layers | tuned | 2 | 12, 10 | 11, 13 | **none** | 12 (**does not**) |" in text
    assert "| 4.00 | layers | memascend | 2 | at least 137, at least 137 | - | 136 or more | 137 |" in text
    assert "| 4.00 | layers | stock | 2 | none fits, none fits | 1 | none fits | none fits |" in text
    b["job"] = dict(b["job"], steps=4)  # another job: its own row
    text = "\n".join(capacity.agreement_section([("a", a), ("b", b)], today))
    assert "| 4.00 | layers | tuned | 2 | 12 | 13 | 11-12 | 12 |" in text
    assert "| 4.00 | layers | tuned | 4 | 10 | 11 | 9-10 | 12 (**does not**) |" in text
