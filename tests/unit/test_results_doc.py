"""docs/results.md and its topic pages docs/results/*.md are generated from the committed raw JSON
(scripts/results.py), never typed by hand, and a reader can find their way through them."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_results_md_is_what_the_raw_json_gives():
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "results.py"), "--check"], capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stderr


def _results_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("results", os.path.join(REPO, "scripts", "results.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses resolve their string annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def _capped_run(name: str, *, ok: bool, cgroup_peak_gib: float, system_peak_gib: float, planned_gib: float) -> dict:
    GiB = 1 << 30
    run = {"name": name, "ok": ok, "losses": [11.0, 10.9] if ok else [],
           "peak_system_bytes": int(system_peak_gib * GiB), "peak_system_minus_others_bytes": None,
           "ru_maxrss_bytes": None, "peak_phase": "initialize",
           "predicted": {"node_host_peak_bytes": int(planned_gib * GiB)}, "seconds_per_step": 95.0 if ok else None,
           "ssd_read_bytes_per_step": None, "ssd_write_bytes_per_step": None, "ssd_bytes_per_param": None,
           "oom_killed": not ok, "cgroup": {"version": 1, "peak_bytes": int(cgroup_peak_gib * GiB)}}
    if not ok:
        run["error"] = "does not fit: OOM-killed at step 1 (initialize) under the DRAM cap"
    return run


def test_a_capped_run_reads_as_its_steps_or_its_oom_kill_with_the_plan_error_on_both_peaks():
    _results_module()  # puts scripts/ on sys.path
    import results_memory as results

    doc = {"job": {"dram_cap_bytes": 12 << 30},
           "runs": [_capped_run("memascend", ok=True, cgroup_peak_gib=5.0, system_peak_gib=4.0, planned_gib=5.5),
                    _capped_run("tuned", ok=False, cgroup_peak_gib=12.0, system_peak_gib=11.0, planned_gib=20.5)]}
    today = {"memascend": int(5.5 * 2**30), "tuned": int(20.5 * 2**30)}
    mem, tuned = results.capped_rows(doc, plan=lambda r: today[r["name"]])
    assert len(mem) == len(results.CAP_HEADER)
    assert mem[1] == "ran 2 steps" and mem[2] == "5.00" and mem[3] == "4.00" and mem[8] == "+37.5% / +10.0%"
    assert tuned[1] == "**does not fit: OOM-killed at step 1 (initialize)**" and tuned[9] == "-"
    assert tuned[8] == "plan above the cap: as measured"
    today["tuned"] = 11 << 30
    assert results.capped_rows(doc, plan=lambda r: today[r["name"]])[1][8] == "**plan below the cap: wrong**"


def test_a_capped_row_errs_with_todays_plan_and_shows_the_recorded_one_beside_it():
    """The memory page's billion-scale rows: today's planner on the recorded run, the bench's own plan in brackets."""
    from memascend_cli.bench.configs import repredict
    from memascend_cli.bench.document import read_summary

    _results_module()
    import results_memory as results

    doc = read_summary(os.path.join(REPO, "docs", "bench", "capped",
                                    "qwen2.5-1.5b-bf16-seq1024-cap12gib-bounded-norm.json.gz"))
    row = results.capped_rows(doc)[0]
    run = doc["runs"][0]
    today = repredict(doc, run)["node_host_peak_bytes"]
    assert today != run["predicted"]["node_host_peak_bytes"]  # the planner moved since that sitting
    assert row[7] == f"{today / 2**30:.2f} ({run['predicted']['node_host_peak_bytes'] / 2**30:.2f})"
    measured = run["peak_system_bytes"]
    assert row[8].startswith(f"{100 * (today - measured) / measured:+.1f}%")


def test_phase_seconds_are_the_mean_of_the_steps_after_the_first():
    """A run's forward + backward and optimizer seconds from the bench's phase marks (each phase's start)."""
    _results_module()  # puts scripts/ on sys.path
    from results_common import phase_seconds

    marks = [("step1_forward", 10.0), ("step1_backward", 11.0), ("step1_optimizer", 12.0),
             ("step2_forward", 20.0), ("step2_backward", 21.0), ("step2_optimizer", 23.0),
             ("step3_forward", 30.0), ("step3_backward", 31.5), ("step3_optimizer", 34.0), ("finish", 40.0)]
    run = {"phases": [{"name": n, "at_s": t} for n, t in marks]}
    assert phase_seconds(run, 3) == {"forward+backward": 3.5, "optimizer": 6.5}
    assert phase_seconds(run, 1) is None  # no step after the first
    accumulated = {"phases": [{"name": "step2.1_forward", "at_s": 1.0}, {"name": "finish", "at_s": 2.0}]}
    assert phase_seconds(accumulated, 2) is None


def test_a_repeated_run_reads_as_the_median_of_its_repeats_step_times():
    """`bench --repeat`: the plot's s/step is the median of the repeats' (the run's own fields are the median-peak
    repeat's), listed in the order run; a single run is its own."""
    _results_module()
    from results_time import step_seconds

    reps = [{"ok": True, "seconds_per_step": s} for s in (8.9, 8.1, 8.4)]
    assert step_seconds({"seconds_per_step": 8.9, "repeats": reps}) == (8.4, "median of 3: 8.90, 8.10, 8.40")
    four = reps + [{"ok": False, "seconds_per_step": None}, {"ok": True, "seconds_per_step": 9.0}]
    assert step_seconds({"seconds_per_step": 8.9, "repeats": four})[0] == (8.4 + 8.9) / 2  # the failed one left out
    assert step_seconds({"seconds_per_step": 7.5}) == (7.5, "")


def test_recorded_summaries_are_read_gzipped_or_not(tmp_path):
    """A summary committed gzipped (NAME.json.gz) reads as its plain twin; timeline side files and capacity probe
    bundles beside it are not summaries."""
    import gzip
    import json

    from memascend_cli.bench.document import read_summary, recorded_summaries

    (tmp_path / "a.json").write_text(json.dumps({"kind": "bench", "n": 1}))
    with gzip.open(tmp_path / "b.json.gz", "wt") as f:
        json.dump({"kind": "sweep", "n": 2}, f)
    for side in ("a.timeline.json.gz", "probes.json.gz"):
        (tmp_path / side).write_bytes(b"")
    paths = recorded_summaries(str(tmp_path / "*.json"))
    assert [os.path.basename(p) for p in paths] == ["a.json", "b.json.gz"]
    assert [read_summary(p)["n"] for p in paths] == [1, 2]


def test_a_summary_written_gzipped_reads_back_the_same_and_its_bytes_repeat(tmp_path):
    """write_summary gzips where the name ends in .gz: one compact line, gzip's header time fixed at 0 (rewriting the
    same document gives the same bytes, so a record rewritten unchanged leaves git clean); recorded_stem names what
    sits beside a record (its folder of records, its plot) either way."""
    import gzip

    from memascend_cli.bench.document import read_summary, recorded_stem, write_summary

    doc = {"job": {"seq_len": 512}, "runs": [{"name": "tuned", "seconds_per_step": 7.51}]}
    plain, packed = tmp_path / "a.json", tmp_path / "a.json.gz"
    write_summary(str(plain), doc)
    write_summary(str(packed), doc)
    raw = packed.read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # gzip's MTIME field (RFC 1952 2.3)
    assert gzip.decompress(raw) == plain.read_bytes() == b'{"job":{"seq_len":512},"runs":[{"name":"tuned",' \
        b'"seconds_per_step":7.51}]}'
    assert read_summary(str(plain)) == read_summary(str(packed)) == doc
    stem = "docs/bench/placements/x-quiet4"
    assert recorded_stem(stem + ".json.gz") == recorded_stem(stem + ".json") == stem


def test_a_variation_row_is_each_runs_peak_against_one_grid_step_of_todays_plan():
    """docs/bench/variation: the spread of the repeats' ru_maxrss, and in brackets that spread in grid steps."""
    _results_module()  # puts scripts/ on sys.path
    from results_variation import variation_rows

    from memascend_cli.bench import capacity
    from memascend_cli.bench.configs import recorded_hardware, recorded_plan_job
    from memascend_cli.bench.document import read_summary
    from memascend_cli.units import GiB

    path = "docs/bench/variation/tuned-l24-seq2048-steps4-repeat5-fp32.json.gz"
    doc = read_summary(os.path.join(REPO, path))
    (row,) = variation_rows(path, doc)
    rss = [x["ru_maxrss_bytes"] for x in doc["runs"][0]["repeats"]]
    assert row[1:3] == ["tuned", "5"] and row[5] == f"{(max(rss) - min(rss)) / GiB:.2f}"
    job, engine = recorded_plan_job(doc, doc["runs"][0])
    layer = capacity.step_cost_bytes("layers", job, recorded_hardware(doc), engine, 24)
    assert row[7] == f"{layer / GiB:.3f} ({(max(rss) - min(rss)) / layer:.1f})"
    doc["runs"][0]["repeats"] = doc["runs"][0]["repeats"][:1]  # one run: no spread, no row
    assert variation_rows(path, doc) == []
