"""`memascend plan` end to end through app.main: tables, --json schema, exit codes, error lines."""

import json

import pytest

FIXED_HW = ["--hardware", "h100-80g-512g"]


def test_plan_json_schema(cli):
    r = cli("plan", "--model", "llama-3.1-8b", "--seq-len", "4096", *FIXED_HW, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 2
    assert set(doc) >= {"model", "job", "hardware", "engines", "reduction_percent", "verdict"}
    assert set(doc["engines"]) == {"stock", "tuned", "memascend"}
    for engine in ("stock", "tuned", "memascend"):
        e = doc["engines"][engine]
        assert e["engine"] == engine
        assert {"host_peak_bytes", "node_host_peak_bytes", "gpu_peak_bytes", "nvme_bytes", "items", "verdict",
                } <= set(e)
        assert ("search" in e) == (engine != "tuned")  # the searches compare stock as documented with memascend
        assert {i["tier"] for i in e["items"]} == {"host", "gpu", "nvme"}
        assert all(i["formula"] and i["source"] for i in e["items"])
    assert doc["engines"]["memascend"]["host_peak_bytes"] < doc["engines"]["stock"]["host_peak_bytes"]
    assert doc["reduction_percent"]["host_peak"] > 0
    assert doc["verdict"]["fits"] is True
    assert doc["model"]["num_params"] == 8_030_261_248


def test_plan_table_and_exit_codes(cli):
    r = cli("plan", "--model", "qwen2.5-7b", *FIXED_HW)
    assert r.exit_code == 0
    assert "stock DeepSpeed" in r.stdout and "memascend" in r.stdout and "tuned" in r.stdout
    assert "less than tuned" in r.stdout
    assert "fits with memascend" in r.stdout
    big = cli("plan", "--model", "qwen2.5-72b", "--hardware", "rtx4090-128g", "--no-search")
    assert big.exit_code == 1
    assert "does not fit" in big.stdout


def test_engine_choice_sets_exit_code(cli):
    # 10 GiB: memascend fits a 0.5B CPU-only job that stock DeepSpeed does not (the SSD space given: the machine's
    # own free space would decide whether the region fits).
    args = ("plan", "--model", "qwen2.5-0.5b", "--gpus", "0", "--dram", "10GiB", "--nvme-free", "1TB", "--no-search",
            "--json")
    m = cli(*args)
    s = cli(*args, "--engine", "stock")
    doc = json.loads(m.stdout)
    assert doc["engines"]["memascend"]["verdict"]["fits"] and not doc["engines"]["stock"]["verdict"]["fits"]
    assert (m.exit_code, s.exit_code) == (0, 1)
    assert doc["engines"]["stock"]["verdict"]["binding"] == "dram"
    assert json.loads(s.stdout)["verdict"]["engine"] == "stock"
    # One vocabulary: stock, tuned, memascend; the old name "baseline" is an unknown engine.
    b = cli(*args, "--engine", "baseline")
    assert b.exit_code == 2 and "error: unknown engine 'baseline'" in b.stderr


def test_capped_knobs_are_warned(cli):
    r = cli("plan", "--model", "qwen2.5-0.5b", *FIXED_HW, "--reduce-bucket-size", "1e9", "--no-search", "--json")
    assert r.exit_code == 0, r.stderr
    warned = " ".join(r.stderr.split())  # rich wraps the line
    assert "reduce_bucket_size 1,000,000,000 is capped to 2,097,152 for tuned and memascend" in warned
    d = json.loads(r.stdout)
    assert d["job"]["knobs"]["reduce_bucket_size"] == 1_000_000_000  # stock runs it as given
    assert "reduce_bucket_size" not in cli("plan", "--model", "qwen2.5-0.5b", *FIXED_HW, "--no-search").stderr


@pytest.mark.parametrize("args,fragment", [
    (("--model", "qwen9-7b"), "unknown model"),
    (("--model", "/nonexistent/dir"), "no such"),
    (("--model", "/tmp/definitely-missing-config.json"), "no such file"),
    (("--dram", "128"), "no unit"),
    (("--dram", "-4GiB"), "negative"),
    (("--hardware", "no-such-box"), "hardware"),
    (("--dtype", "fp8"), "dtype"),
    (("--sub-group-size", "lots"), "cannot read"),
    (("--nvme-path", "/nonexistent/swap"), "/nonexistent/swap"),
    (("--gpus", "-1"), "gpus"),
    (("--trainer", "lightning"), "unknown trainer"),
])
def test_bad_input_is_one_error_line(cli, args, fragment):
    r = cli("plan", *args)
    assert r.exit_code == 2
    assert r.stderr.startswith("error:"), r.stderr
    assert fragment in r.stderr.splitlines()[0]
    assert any(line.startswith("hint:") for line in r.stderr.splitlines())
    assert "Traceback" not in r.stderr + r.stdout


def test_trainer_imports_count_for_the_hugging_face_trainers(cli):
    def peak(trainer):
        r = cli("plan", "--model", "qwen2.5-0.5b", *FIXED_HW, "--no-search", "--json", "--trainer", trainer)
        d = json.loads(r.stdout)
        items = {i["key"]: i["bytes"] for i in d["engines"]["memascend"]["items"]}
        return d["job"]["trainer"], d["engines"]["memascend"]["host_peak_bytes"], items.get("host/trainer_imports")
    ds, hf, trl = peak("deepspeed"), peak("hf"), peak("trl")
    assert ds[0] == "deepspeed" and ds[2] is None
    assert hf[0] == "hf" and hf[1] - ds[1] == hf[2] > 0
    assert trl[2] > hf[2]


def test_yaml_model_with_unknown_key(cli, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model_type: llama\nhidden: 1\n")
    r = cli("plan", "--model", str(p))
    assert r.exit_code == 2 and "unknown key 'hidden'" in r.stderr


def test_model_directory(cli, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}))
    r = cli("plan", "--model", str(tmp_path), *FIXED_HW, "--no-search", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["model"]["num_params"] == 494_032_768


def test_list_models(cli):
    r = cli("plan", "--list-models", "--json")
    names = [m["name"] for m in json.loads(r.stdout)]
    assert "llama-3.1-8b" in names and "mistral-nemo-12b" in names


def test_local_machine_default_plan(cli):
    # The quick-start command: probes this machine, picks a default model, exits 0 or 1 (not 2).
    r = cli("plan", "--json")
    assert r.exit_code in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert doc["model"]["default_used"] and doc["hardware"]["name"] == "local"


def test_region_sets_ssd_space_and_bandwidth(cli, tmp_path):
    region = tmp_path / "region.bin"
    made = cli("prepare-ssd", str(region), "--size", "64MiB", "--probe-mib", "8", "--yes")
    assert made.exit_code == 0, made.stderr
    r = cli("plan", "--model", "tiny-llama", "--nvme-path", str(region), "--no-search", "--json")
    hw = json.loads(r.stdout)["hardware"]
    assert hw["nvme_free_gib"] == pytest.approx((64 * 2**20 - 2**20) / 2**30, abs=1e-3)  # data area after 1 MiB
    assert hw["nvme_read_gbps"] > 0 and "region" in hw["source"]
    # A job whose SSD data exceed the region does not fit, and the SSD is what binds.
    big = cli("plan", "--model", "qwen2.5-0.5b", "--nvme-path", str(region), "--no-search", "--json")
    doc = json.loads(big.stdout)
    assert big.exit_code == 1 and doc["verdict"]["binding"] == "nvme_space"


def test_host_budget_splits_or_refuses_with_the_minimum(cli):
    full = json.loads(cli("plan", "--model", "llama-3.1-8b", *FIXED_HW, "--json", "--no-search").stdout)
    b = full["engines"]["memascend"]["host_budget"]
    assert b["total_bytes"] == b["full_overlap_bytes"] and b["min_bytes"] < b["full_overlap_bytes"]
    mid = (b["min_bytes"] + b["full_overlap_bytes"]) // 2
    r = cli("plan", "--model", "llama-3.1-8b", *FIXED_HW, "--json", "--no-search", "--host-budget", f"{mid}B")
    got = json.loads(r.stdout)["engines"]["memascend"]["host_budget"]
    assert got["total_bytes"] <= mid and got["windows"]["optimizer_depth"] <= 2
    assert json.loads(r.stdout)["engines"]["memascend"]["host_peak_bytes"] < full["engines"]["memascend"]["host_peak_bytes"]
    r = cli("plan", "--model", "llama-3.1-8b", *FIXED_HW, "--host-budget", "64MiB")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.exit_code == 2 and len(errors) == 1 and "below the" in errors[0] and "hint: give --host-budget" in r.stderr


def test_plan_reports_ssd_traffic_and_endurance(cli):
    d = json.loads(cli("plan", "--model", "llama-3.1-8b", *FIXED_HW, "--json", "--no-search").stdout)
    for engine in ("stock", "tuned", "memascend"):
        t = d["engines"][engine]["ssd_traffic"]
        assert t["read_bytes_per_param"] >= t["minimum_read_bytes_per_param"] > 0
        assert t["write_bytes_per_1000_steps"] == 1000 * t["write_bytes_per_step"]
    # Gradients once in bf16 instead of an fp32 round trip: memascend moves less than stock.
    assert (d["engines"]["memascend"]["ssd_traffic"]["write_bytes_per_param"]
            < d["engines"]["stock"]["ssd_traffic"]["write_bytes_per_param"])


def test_70b_on_one_box_fits_with_memascend_only(cli):
    r = cli("plan", "--model", "llama-3.1-70b", "--dram", "64GiB", "--gpus", "1", "--gpu-mem", "80GiB",
            "--nvme-free", "4TB", "--seq-len", "4096", "--json", "--no-search")
    d = json.loads(r.stdout)
    assert r.exit_code == 0
    assert d["engines"]["memascend"]["verdict"]["fits"] and not d["engines"]["stock"]["verdict"]["fits"]
    assert d["engines"]["stock"]["verdict"]["binding"] == "dram"
    assert "largest item" in d["engines"]["stock"]["verdict"]["reasons"][0]


def test_plan_recipe_labels_each_engine_by_what_it_is(cli):
    # A recipe's job carries the knobs train writes (memascend's): tuned runs them on stock DeepSpeed, stock
    # runs DeepSpeed's own defaults.
    d = json.loads(cli("plan", "tiny-cpu", "--json", "--no-search").stdout)
    stock, tuned = d["engines"]["stock"], d["engines"]["tuned"]
    assert stock["engine"] == "stock" and tuned["engine"] == "tuned"
    assert stock["host_peak_bytes"] > tuned["host_peak_bytes"]
    assert d["reduction_percent"]["host_peak"] > d["reduction_percent"]["host_peak_vs_tuned"]


def test_ssd_space_where_the_region_would_be_is_checked(cli, tmp_path, monkeypatch):
    # No --nvme-path: train's default region file (runs/memascend/region.bin under the current directory) does not
    # exist yet, so the free space of the folder it would be created in is what the plan checks.
    import os

    monkeypatch.chdir(tmp_path)
    vfs = os.statvfs(tmp_path)
    free_gib = vfs.f_bavail * vfs.f_frsize / 2**30
    r = cli("plan", "--model", "qwen2.5-72b", "--json")
    doc = json.loads(r.stdout)
    assert doc["hardware"]["nvme_path"] == str(tmp_path)
    assert doc["hardware"]["nvme_free_gib"] == pytest.approx(free_gib, abs=0.5)
    need_gib = doc["engines"]["memascend"]["node_nvme_bytes"] / 2**30
    if free_gib >= need_gib:
        pytest.skip(f"{tmp_path} has {free_gib:.0f} GiB free, enough for qwen2.5-72b's {need_gib:.0f} GiB")
    # 13 GiB of host memory fit this machine; 2 TB of SSD data do not.
    assert r.exit_code == 1 and not doc["verdict"]["fits"] and doc["verdict"]["binding"] == "nvme_space"
    text = cli("plan", "--model", "qwen2.5-72b")
    assert text.exit_code == 1 and "✓" not in text.stdout
    verdict = " ".join(text.stdout.split())
    assert "does not fit with memascend (SSD space binds)" in verdict and f"free at {tmp_path}" in verdict
    # A recipe's region location counts: the folder its run directory would be created in.
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: tiny-llama\ndataset: d.jsonl\noutput_dir: {tmp_path / 'new' / 'run'}\n")
    assert json.loads(cli("plan", str(recipe), "--json", "--no-search").stdout)["hardware"]["nvme_path"] == \
        str(tmp_path)


def test_each_largest_line_names_what_binds_and_the_grid_end_is_at_least(cli, monkeypatch):
    from memascend_cli.console import out

    monkeypatch.setattr(out, "width", 160)  # one line per row
    args = ("plan", "--model", "tiny-llama", "--hardware", "h100-80g-512g", "--nvme-free", "1000TB")
    doc = json.loads(cli(*args, "--json").stdout)
    search = doc["engines"]["memascend"]["search"]
    assert search["max_layers"] == 2048 and search["binding"]["max_layers"] == "grid_end"
    assert set(search["binding"]) == {"max_micro_batch", "max_seq_len", "largest_preset", "max_layers"}
    rows = [line for line in cli(*args).stdout.splitlines() if line.count("│") == 4]

    def row(label):
        return next(line for line in rows if line.split("│")[1].strip().startswith(label))

    assert "at least 2048 (5.37B) [grid end]" in row("deepest scaled model")
    for label in ("largest micro-batch", "longest context", "largest preset in family"):
        assert row(label).count("[") == 2, row(label)  # stock's and memascend's binding resource


def test_no_overlap_optimizer_plans_memascend_without_the_second_set_of_states(cli, tmp_path):
    """--no-overlap (and a recipe's overlap_optimizer: false) plans the job train runs without the overlap:
    one set of optimizer states on the SSD; stock's need does not change."""
    args = ("plan", "--model", "llama-3.2-1b", "--dtype", "bf16", *FIXED_HW, "--json", "--no-search")
    on, off = (json.loads(cli(*args, *flag).stdout) for flag in ((), ("--no-overlap",)))
    assert on["job"]["overlap_optimizer"] is True and off["job"]["overlap_optimizer"] is False
    ssd = {doc["job"]["overlap_optimizer"]: {e: doc["engines"][e]["nvme_bytes"] for e in ("stock", "memascend")}
           for doc in (on, off)}
    assert ssd[True]["stock"] == ssd[False]["stock"] and ssd[False]["memascend"] < ssd[True]["memascend"]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: llama-3.2-1b\ndataset: d.jsonl\noutput_dir: {tmp_path / 'run'}\nprecision: bf16\n"
                      "overlap_optimizer: false\n")
    doc = json.loads(cli("plan", str(recipe), *FIXED_HW, "--json", "--no-search").stdout)
    assert doc["job"]["overlap_optimizer"] is False
    assert json.loads(cli("plan", str(recipe), *FIXED_HW, "--json", "--no-search", "--overlap").stdout)[
        "job"]["overlap_optimizer"] is True
