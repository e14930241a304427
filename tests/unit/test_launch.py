"""The launch spec (exact argv and env) and `train --dry-run` through the real CLI, without DeepSpeed."""

from __future__ import annotations

import json
import os
import sys

import pytest

from memascend_cli.run.launch import RankWatch, _killed_by, build_launch, first_dead, rank_error
from memascend_cli.run.recipe import load_recipe, recipe_from_dict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")


def r(**kw):
    return recipe_from_dict({"model": "tiny-llama", "dataset": "d.jsonl", **kw})


def test_cpu_single_rank_argv_and_env():
    spec = build_launch(r(), "/runs/a", num_gpus=0, cpu_cores=2, baseline=True, resume=False,
                        python_executable="/venv/bin/python")
    assert spec.cmd == ["/venv/bin/deepspeed", "--num_gpus", "1", "--master_port", "29500", "--no_local_rank",
                        "--enable_each_rank_log=/runs/a/logs", "--module", "memascend_engine.train_worker",
                        "--run-dir", "/runs/a", "--baseline"]
    assert spec.env == {"PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "2",
                        "MKL_DYNAMIC": "FALSE", "MKL_CBWR": "AUTO"}
    assert spec.ds_config_path == "/runs/a/ds_config.json" and spec.cpu_only


def test_cpu_two_ranks_split_cores_and_resume():
    spec = build_launch(r(ranks=2, master_port=29612), "/runs/b", num_gpus=0, cpu_cores=2, baseline=False,
                        resume=True, python_executable="/v/bin/python")
    assert spec.cmd[1:5] == ["--num_gpus", "2", "--master_port", "29612"]
    assert spec.cmd[-1] == "--resume" and "--baseline" not in spec.cmd
    assert spec.env["OMP_NUM_THREADS"] == "1" and spec.num_ranks == 2
    assert spec.env["THP_MEM_ALLOC_ENABLE"] == "1"  # the engine's allocator policy; the baseline run above has none


def test_gpu_node_one_rank_per_gpu_no_cpu_accelerator():
    spec = build_launch(r(), "/runs/c", num_gpus=8, cpu_cores=64, baseline=False, resume=False,
                        python_executable="/v/bin/python")
    assert spec.cmd[1:3] == ["--num_gpus", "8"]
    assert "DS_ACCELERATOR" not in spec.env and not spec.cpu_only


def test_multi_node_uses_deepspeeds_hostfile():
    spec = build_launch(r(hostfile="/etc/hosts.ds", num_nodes=2, ranks=4), "/runs/d", num_gpus=4, cpu_cores=32,
                        baseline=False, resume=False, python_executable="/v/bin/python")
    assert spec.cmd[1:7] == ["--hostfile", "/etc/hosts.ds", "--num_nodes", "2", "--num_gpus", "4"]
    assert spec.notes


def test_shell_line_is_quoted():
    spec = build_launch(r(), "/runs/with space", num_gpus=0, cpu_cores=2, baseline=True, resume=False,
                        python_executable="/v/bin/python")
    assert "'/runs/with space'" in spec.shell() and spec.shell().startswith("DS_ACCELERATOR=cpu ")


def test_rank_error_reads_first_error_file(tmp_path):
    assert rank_error(str(tmp_path)) is None
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "error-rank1.json").write_text(json.dumps({"message": "rank 1: boom", "log": "/l"}))
    assert rank_error(str(tmp_path)) == ("rank 1: boom", "/l", None)
    (tmp_path / "logs" / "error-rank1.json").write_text(json.dumps({"message": "m", "log": "/l", "hint": "h"}))
    assert rank_error(str(tmp_path)) == ("m", "/l", "h")


def test_a_rank_killed_by_a_signal_is_named():
    # DeepSpeed's launcher exits with the dead rank's return code: -9 becomes status 247.
    assert _killed_by(247) == "SIGKILL" and _killed_by(-9) == "SIGKILL"
    assert _killed_by(1) is None and _killed_by(2) is None


def test_the_rank_that_died_first_is_named_not_a_survivor_killed_later():
    # Rank 1 killed at poll 3; rank 0, stuck in a collective, SIGKILLed by the launcher at poll 60.
    assert first_dead([0, 1], {1: 3, 0: 60}) == [1]
    assert first_dead([0, 1], {0: 5, 1: 5}) == [0, 1]  # both seen dead at the same poll: both named
    assert first_dead([0, 1], {1: 3}) == [0, 1]  # rank 0's death never seen: it stays named
    assert first_dead([2], {2: 9}) == [2] and first_dead([], {}) == []


def test_rank_watch_sees_a_rank_die_from_its_started_pid(tmp_path):
    import subprocess
    import sys

    from memascend_cli.run.rundir import started_file

    run = str(tmp_path)
    os.makedirs(os.path.dirname(started_file(run, 0)))
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    doomed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for rank, p in ((0, alive), (1, doomed)):
            with open(started_file(run, rank), "w") as f:
                f.write(str(p.pid))
        watch = RankWatch(run, 3)  # rank 2 never started
        watch.poll()
        assert watch.dead_at_poll == {}
        doomed.kill()
        os.waitid(os.P_PID, doomed.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie counts as dead
        watch.poll()
        assert watch.dead_at_poll == {1: 2}
        alive.kill()
        alive.wait()
        watch.poll()
        assert watch.dead_at_poll == {1: 2, 0: 3}
    finally:
        for p in (alive, doomed):
            p.kill()
            p.wait()


def test_dry_run_prints_config_and_command(cli, tmp_path):
    res = cli("train", TINY, "--baseline", "--dry-run", "--output-dir", str(tmp_path / "run"), "--steps", "7",
              "--set", "dataset.packing=false", "--set", "master_port=29500")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    run = str(tmp_path / "run")
    assert doc["run_dir"] == run and doc["engine"] == "tuned" and doc["final_model_dir"] == run + "/export"
    assert "--baseline means --engine tuned" in res.stderr
    cmd = doc["launch"]["cmd"]
    assert cmd[0].endswith("/deepspeed") and os.path.dirname(cmd[0]) == os.path.dirname(sys.executable)
    assert cmd[1:] == ["--num_gpus", "1", "--master_port", "29500", "--no_local_rank",
                       f"--enable_each_rank_log={run}/logs", "--module", "memascend_engine.train_worker",
                       "--run-dir", run, "--baseline"]
    if doc["launch"]["cpu_only"]:
        assert doc["launch"]["env"]["DS_ACCELERATOR"] == "cpu"
    z = doc["ds_config"]["zero_optimization"]
    assert z["offload_param"]["nvme_path"] == os.path.join(run, "swap")
    assert z["offload_param"]["buffer_size"] == 524288
    assert doc["ds_config"]["scheduler"]["params"]["total_num_steps"] == 7
    # Written next to the run, nothing started (no metrics, no logs).
    with open(os.path.join(run, "ds_config.json")) as f:
        assert json.load(f) == doc["ds_config"]
    with open(os.path.join(run, "recipe.json")) as f:
        saved = json.load(f)
    assert saved["steps"] == 7 and saved["dataset"]["packing"] is False
    assert not os.path.exists(os.path.join(run, "metrics.jsonl"))
    assert not os.path.exists(os.path.join(run, "logs"))
    assert "nothing was started" in res.stderr


def test_dry_run_memascend_plans_a_region_file(cli, tmp_path):
    res = cli("train", TINY, "--dry-run", "--output-dir", str(tmp_path / "run"))
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["engine"] == "memascend" and "--baseline" not in doc["launch"]["cmd"]
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
    import sys

    code = ("import sys, memascend_cli.commands.train, memascend_cli.run.launch, memascend_cli.run.dsconfig, "
            "memascend_cli.run.preflight; assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_load_recipe_sanity():
    assert load_recipe(TINY).checkpoint_every == 10


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
        assert docs[engine]["engine"] == engine and "--baseline" in docs[engine]["launch"]["cmd"]
    stock_zero, tuned_zero = (docs[e]["ds_config"]["zero_optimization"] for e in ("stock", "tuned"))
    assert stock_zero["sub_group_size"] == 1e9 and tuned_zero["sub_group_size"] < stock_zero["sub_group_size"]
    res = cli("train", TINY, "--engine", "fast", "--dry-run")
    assert res.exit_code == 2 and "unknown engine 'fast'" in res.stderr
