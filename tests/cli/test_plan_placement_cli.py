"""`memascend plan`'s placements end to end: the recommendation on an H100 box for a small and a large model, the
default plan of a profile, the --json `placements` key, --placement and its refusals, 80 columns."""

import json

H100 = ["--hardware", "h100-80g-512g", "--no-search"]


def _placements(cli, *args):
    r = cli("plan", *args, "--json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)["placements"]


def _recommended(doc):
    rec = doc["recommended"]
    return next(r for r in doc["rows"] if (r["placement"], r["engine"]) == (rec["placement"], rec["engine"]))


def test_a_1b_model_on_an_h100_is_recommended_without_the_ssd(cli, monkeypatch):
    doc = _placements(cli, "--model", "llama-3.2-1b", *H100)
    best = _recommended(doc)
    assert best["placement"] in ("gpu", "dram") and best["fits"]
    assert best["ssd_read_bytes_per_step"] == best["ssd_write_bytes_per_step"] == 0
    ssd = next(r for r in doc["rows"] if (r["placement"], r["engine"]) == ("ssd", "memascend"))
    assert best["time"]["seconds_per_step"] < ssd["time"]["seconds_per_step"]
    monkeypatch.setenv("COLUMNS", "80")
    r = cli("plan", "--model", "llama-3.2-1b", *H100)
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "→ recommended: gpu" in text and "Why: the whole training state" in text
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_a_72b_model_on_an_h100_is_recommended_a_dram_and_ssd_split(cli):
    doc = _placements(cli, "--model", "qwen2.5-72b", *H100)
    best = _recommended(doc)
    assert best["placement"] == "split" and 0 < best["dram_tier"]["optimizer_states_share"] < 1
    assert {r["placement"]: r["binding"] for r in doc["rows"] if r["engine"] == "stock"}["gpu"] == "GPU memory"
    assert doc["today"] == doc["recommended"] and "Planned" not in doc["why"]  # the engine runs its DRAM tier


def test_the_default_plan_of_a_profile_prints_a_recommendation_in_80_columns(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = cli("plan", "--hardware", "cpu-24g", "--cpu-gflops", "150", "--no-search")
    assert r.exit_code == 0, r.stderr
    assert "placements" in r.stdout and "s/step" in r.stdout
    # memascend's dram row makes ZeRO-Offload's passes at a lower peak: at the same s/step the lower peak wins.
    assert "→ recommended: dram with memascend" in " ".join(r.stdout.split())
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_json_prices_every_placement_for_both_engines(cli):
    doc = _placements(cli, "--model", "qwen2.5-0.5b", "--hardware", "cpu-24g", "--cpu-gflops", "150",
                      "--nvme-read-gbps", "1", "--no-search")
    rows = {(r["placement"], r["engine"]): r for r in doc["rows"]}
    assert set(rows) == {(p, e) for p in ("dram", "split", "ssd") for e in ("stock", "memascend")} | {("gpu", "stock")}
    assert not rows["gpu", "stock"]["applicable"] and rows["gpu", "stock"]["note"] == "no GPU on this machine"
    for key in ("dram", "stock"), ("ssd", "memascend"):
        r = rows[key]
        assert r["host_peak_bytes"] > 0 and r["time"]["seconds_per_step"] > 0 and r["headroom_bytes"] > 0
    assert all(r["runnable"] for r in rows.values())  # memascend's tier rows too (EngineOptions.dram_tier_gib)
    assert doc["headroom_bytes"] > 0 and doc["selected"] is None


def test_placement_picks_the_detail_tables_and_refuses_what_does_not_fit(cli):
    base = ("plan", "--model", "qwen2.5-0.5b", "--hardware", "cpu-24g", "--no-search")
    r = cli(*base, "--placement", "dram")
    assert r.exit_code == 0, r.stderr
    assert "detail tables: placement dram" in r.stdout and "fp32 master" in r.stdout and "DRAM tier" in r.stdout
    r = cli(*base, "--placement", "gpu")
    assert r.exit_code == 2 and "error: placement gpu does not fit with stock: no GPU on this machine" in r.stderr
    assert "hint: choose a placement that fits (dram, ssd)" in r.stderr  # memascend's rows: its split holds all
    r = cli(*base, "--placement", "dram", "--dram-cap", "6GiB", "--engine", "stock")
    assert r.exit_code == 2 and "DRAM binds" in r.stderr and "Traceback" not in r.stderr
    r = cli(*base, "--placement", "disk")
    assert r.exit_code == 2 and "error: unknown --placement 'disk'" in r.stderr
