"""`memascend plan`'s time model end to end: the table, the --json `time` key, --tokens, the CPU probe cache."""

import json

import pytest

GPU_HW = ["--hardware", "rtx4090-128g", "--nvme-read-gbps", "7", "--nvme-write-gbps", "5"]


def test_plan_json_time_per_engine(cli):
    r = cli("plan", "--model", "qwen2.5-7b", "--seq-len", "4096", *GPU_HW, "--tokens", "50M", "--json")
    assert r.exit_code == 0, r.stderr
    t = json.loads(r.stdout)["time"]
    assert t["device"]["gpu"] and t["device"]["gflops"] > 0
    assert set(t["engines"]) == {"stock", "tuned", "memascend"}
    for e in t["engines"].values():
        assert e["seconds_per_step"] > 0 and e["tokens_per_s"] > 0 and e["hours"] > 0
        assert e["binding"] in ("compute", "SSD read", "SSD write", "CPU Adam", "host copies", "PCIe")
        assert e["hours"] == pytest.approx(50e6 / e["tokens_per_s"] / 3600, rel=1e-3)
    # One 4090 at 7/5 GB/s is SSD-bound at micro-batch 1 (the regime most users' jobs run in).
    assert t["engines"]["stock"]["binding"].startswith("SSD")
    assert set(t["fastest"]) == {"stock", "tuned", "memascend"}
    best = t["fastest"]["memascend"]
    assert best["tokens_per_s"] >= t["engines"]["memascend"]["tokens_per_s"]


def test_plan_table_shows_time_within_80_columns(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = cli("plan", "--model", "qwen2.5-7b", *GPU_HW, "--tokens", "1B", "--no-search")
    assert r.exit_code == 0, r.stderr
    assert "time per step" in r.stdout and "tok/s" in r.stdout and "hours" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_cpu_plan_uses_cpu_gflops_and_says_which_ssd_rate_is_unknown(cli):
    # cpu-24g records a write bandwidth and no read bandwidth.
    r = cli("plan", "--model", "bench-llama-136m", "--hardware", "cpu-24g", "--cpu-gflops", "100", "--dtype", "fp32",
            "--no-search", "--json")
    assert r.exit_code == 0, r.stderr
    t = json.loads(r.stdout)["time"]
    # A preset's CPU is not known: its host work is priced with the default CPU's terms, and the plan says so.
    assert t["device"] == {"name": "CPU", "gflops": 100.0, "source": "--cpu-gflops", "gpu": False,
                           "host_terms": "AMD EPYC", "host_terms_fitted": False}
    m = t["engines"]["memascend"]
    # The unknown read rate may bind: no step time, only its lower bound without the SSD reads.
    assert m["seconds_per_step"] is None and m["binding"] == "unknown" and m["seconds_per_step_at_least"] > 0
    assert m["unknown"] == ["SSD read"]
    assert m["resource_seconds"]["SSD write"] > 0
    assert m["seconds_per_step_at_least"] > m["resource_seconds"]["compute"]


def test_a_cpu_no_host_terms_were_fitted_on_is_named_in_the_plan(cli):
    r = cli("plan", "--model", "bench-llama-136m", "--hardware", "cpu-24g", "--cpu-gflops", "100", "--dtype", "fp32",
            "--nvme-read-gbps", "1", "--no-search")
    assert r.exit_code == 0, r.stderr
    assert "priced with the terms fitted on AMD EPYC (none were fitted on this CPU)" in " ".join(r.stdout.split())


def test_cpu_plan_without_a_rate_reports_unknown(cli):
    r = cli("plan", "--model", "bench-llama-136m", "--hardware", "cpu-24g", "--no-search", "--json")
    assert r.exit_code == 0, r.stderr
    e = json.loads(r.stdout)["time"]["engines"]["stock"]
    assert e["seconds_per_step"] is None and e["binding"] == "unknown"


def test_bad_tokens_is_one_line(cli):
    r = cli("plan", "--model", "qwen2.5-0.5b", "--hardware", "cpu-24g", "--tokens", "lots", "--no-search")
    assert r.exit_code == 2
    assert "error: --tokens 'lots'" in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr


def test_bf16_moments_flag_takes_8_bytes_per_parameter_off_memascend_only(cli):
    def per_param(*extra):
        r = cli("plan", "--model", "qwen2.5-0.5b", "--hardware", "cpu-24g", "--no-search", "--json", *extra)
        assert r.exit_code == 0, r.stderr
        e = json.loads(r.stdout)["engines"]
        return {k: e[k]["ssd_traffic"]["read_bytes_per_param"] + e[k]["ssd_traffic"]["write_bytes_per_param"]
                for k in ("stock", "memascend")}
    fp32, bf16 = per_param(), per_param("--optimizer-moments", "bf16")
    assert fp32["memascend"] - bf16["memascend"] == pytest.approx(8, abs=0.05)
    assert fp32["stock"] == bf16["stock"]
    bad = cli("plan", "--model", "qwen2.5-0.5b", "--optimizer-moments", "fp8")
    assert bad.exit_code == 2 and "error: unknown --optimizer-moments 'fp8'" in bad.stderr
