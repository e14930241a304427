"""`memascend train --dry-run` through the real CLI, without DeepSpeed: the config and launch command it writes, the
engine windows, the refusals of bad input and of unusable regions."""

from __future__ import annotations

import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")


def test_dry_run_prints_config_and_command(cli, tmp_path):
    res = cli("train", TINY, "--engine", "tuned", "--placement", "ssd", "--dry-run", "--output-dir",
              str(tmp_path / "run"), "--steps", "7", "--set", "dataset.packing=false", "--set", "master_port=29500")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    run = str(tmp_path / "run")
    assert doc["run_dir"] == run and doc["engine"] == "tuned" and doc["final_model_dir"] == run + "/export"
    cmd = doc["launch"]["cmd"]
    assert cmd[0].endswith("/deepspeed") and os.path.dirname(cmd[0]) == os.path.dirname(sys.executable)
    assert cmd[1:] == ["--num_gpus", "1", "--master_port", "29500", "--no_local_rank",
                       f"--enable_each_rank_log={run}/logs", "--module", "memascend_engine.train_worker",
                       "--run-dir", run, "--engine", "tuned"]
    if doc["launch"]["cpu_only"]:
        assert doc["launch"]["env"]["DS_ACCELERATOR"] == "cpu"
    z = doc["ds_config"]["zero_optimization"]
    assert z["offload_param"]["nvme_path"] == os.path.join(run, "swap")
    assert z["offload_param"]["buffer_size"] == 524288
    assert doc["ds_config"]["scheduler"]["params"]["total_num_steps"] == 7
    # Written next to the run, nothing started (no metrics, no logs) and nothing to export (no hf/ skeleton).
    with open(os.path.join(run, "ds_config.json")) as f:
        assert json.load(f) == doc["ds_config"]
    with open(os.path.join(run, "recipe.json")) as f:
        saved = json.load(f)
    assert saved["steps"] == 7 and saved["dataset"]["packing"] is False
    assert not os.path.exists(os.path.join(run, "metrics.jsonl"))
    assert not os.path.exists(os.path.join(run, "logs")) and not os.path.exists(os.path.join(run, "hf"))
    assert "nothing was started" in res.stderr


def test_dry_run_memascend_plans_a_region_file(cli, tmp_path):
    res = cli("train", TINY, "--dry-run", "--output-dir", str(tmp_path / "run"))
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["engine"] == "memascend" and doc["launch"]["cmd"][-2:] == ["--engine", "memascend"]
    assert doc["region"]["create"] == str(tmp_path / "run" / "region.bin")
    assert doc["region"]["size_bytes"] >= doc["plan"]["nvme_bytes_per_rank"]
    assert not os.path.exists(doc["region"]["create"])  # a dry run creates no region file


@pytest.mark.parametrize("args,needle,code", [
    (["--set", "stpes=3"], "unknown key 'stpes'", 2),
    (["--model", "/nonexistent/model-dir"], "no such model directory", 2),
    (["--set", "dataset.path=/nonexistent.jsonl"], "dataset file /nonexistent.jsonl does not exist", 2),
    (["--region", "/nonexistent/region.bin"], "region /nonexistent/region.bin does not exist", 1),
])
def test_bad_input_gives_one_error_line(cli, tmp_path, args, needle, code):
    res = cli("train", TINY, "--dry-run", "--output-dir", str(tmp_path / "run"), *args)
    assert res.exit_code == code, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], res.stderr


def test_unprepared_region_is_refused(cli, tmp_path):
    blank = tmp_path / "blank.bin"
    blank.write_bytes(b"\0" * (2 << 20))
    res = cli("train", TINY, "--dry-run", "--output-dir", str(tmp_path / "run"), "--region", str(blank))
    assert res.exit_code == 1
    assert "holds no memascend region" in res.stderr and "memascend prepare-ssd" in res.stderr


def test_region_too_small_is_refused(cli, tmp_path):
    from memascend_cli.ssd.prepare import create_region_file

    small = tmp_path / "small.region"
    create_region_file(str(small), 8 << 20, ranks=1, label="test")
    res = cli("train", TINY, "--dry-run", "--output-dir", str(tmp_path / "run"), "--region", str(small))
    assert res.exit_code == 1 and "GiB per rank, the job needs" in res.stderr


def test_recipe_module_stays_torch_free():
    import subprocess

    code = ("import sys, memascend_cli.commands.train, memascend_cli.run.launch, memascend_cli.run.dsconfig, "
            "memascend_cli.run.preflight; assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_host_budget_below_the_minimum_is_refused_before_launch(cli, tmp_path):
    res = cli("train", TINY, "--dry-run", "--output-dir", str(tmp_path / "run"), "--set", "host_budget=1MiB")
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and "host budget" in errors[0] and "hint:" in res.stderr
    assert not (tmp_path / "run" / "ds_config.json").exists()


def test_dry_run_writes_the_engine_windows_the_plan_chose(cli, tmp_path):
    res = cli("train", TINY, "--dry-run", "--output-dir", str(tmp_path / "run"), "--set", "checkpoint_offload=dram")
    assert res.exit_code == 0, res.stderr
    with open(tmp_path / "run" / "engine.json") as f:
        chosen = json.load(f)
    assert chosen["checkpoint_offload"] == "dram" and chosen["windows"]["optimizer_depth"] == 3
    assert chosen["overlap_optimizer"] is True
    res = cli("train", TINY, "--dry-run", "--output-dir", str(tmp_path / "off"), "--set", "overlap_optimizer=false")
    assert res.exit_code == 0, res.stderr
    with open(tmp_path / "off" / "engine.json") as f:
        assert json.load(f)["overlap_optimizer"] is False


def test_engine_stock_runs_deepspeeds_documented_knobs(cli, tmp_path):
    """--engine stock: DeepSpeed's defaults (a swap-file run), tuned: memascend's knobs on stock DeepSpeed."""
    docs = {}
    for engine in ("stock", "tuned"):
        res = cli("train", TINY, "--engine", engine, "--dry-run", "--output-dir", str(tmp_path / engine), "--steps", "3")
        assert res.exit_code == 0, res.stderr
        docs[engine] = json.loads(res.stdout)
        assert docs[engine]["engine"] == engine and docs[engine]["launch"]["cmd"][-2:] == ["--engine", engine]
    stock_zero, tuned_zero = (docs[e]["ds_config"]["zero_optimization"] for e in ("stock", "tuned"))
    assert stock_zero["sub_group_size"] == 1e9 and tuned_zero["sub_group_size"] < stock_zero["sub_group_size"]
    res = cli("train", TINY, "--engine", "fast", "--dry-run")
    assert res.exit_code == 2 and "unknown engine 'fast'" in res.stderr
