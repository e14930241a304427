"""The launch spec (exact argv and env), rank errors and the rank watch (run/launch.py); train's CLI tests are in
tests/cli/test_train_cli.py."""

from __future__ import annotations

import json
import os

from memascend_cli.run.launch import RankWatch, _killed_by, build_launch, first_dead, rank_error
from memascend_cli.run.recipe import recipe_from_dict


def r(**kw):
    return recipe_from_dict({"model": "tiny-llama", "dataset": "d.jsonl", **kw})


def test_cpu_single_rank_argv_and_env():
    spec = build_launch(r(), "/runs/a", num_gpus=0, cpu_cores=2, engine="tuned", resume=False,
                        python_executable="/venv/bin/python")
    assert spec.cmd == ["/venv/bin/deepspeed", "--num_gpus", "1", "--master_port", "29500", "--no_local_rank",
                        "--enable_each_rank_log=/runs/a/logs", "--module", "memascend_engine.train_worker",
                        "--run-dir", "/runs/a", "--engine", "tuned"]
    assert spec.env == {"PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "2",
                        "MKL_DYNAMIC": "FALSE", "MKL_CBWR": "AUTO"}
    assert spec.ds_config_path == "/runs/a/ds_config.json" and spec.cpu_only


def test_cpu_two_ranks_split_cores_and_resume():
    spec = build_launch(r(ranks=2, master_port=29612), "/runs/b", num_gpus=0, cpu_cores=2, engine="memascend",
                        resume=True, python_executable="/v/bin/python")
    assert spec.cmd[1:5] == ["--num_gpus", "2", "--master_port", "29612"]
    assert spec.cmd[-3:] == ["--engine", "memascend", "--resume"]
    assert spec.env["OMP_NUM_THREADS"] == "1" and spec.num_ranks == 2
    assert spec.env["THP_MEM_ALLOC_ENABLE"] == "1"  # the engine's allocator policy; the tuned run above has none


def test_gpu_node_one_rank_per_gpu_no_cpu_accelerator():
    spec = build_launch(r(), "/runs/c", num_gpus=8, cpu_cores=64, engine="memascend", resume=False,
                        python_executable="/v/bin/python")
    assert spec.cmd[1:3] == ["--num_gpus", "8"]
    assert "DS_ACCELERATOR" not in spec.env and not spec.cpu_only


def test_multi_node_uses_deepspeeds_hostfile():
    spec = build_launch(r(hostfile="/etc/hosts.ds", num_nodes=2, ranks=4), "/runs/d", num_gpus=4, cpu_cores=32,
                        engine="memascend", resume=False, python_executable="/v/bin/python")
    assert spec.cmd[1:7] == ["--hostfile", "/etc/hosts.ds", "--num_nodes", "2", "--num_gpus", "4"]
    assert spec.notes


def test_shell_line_is_quoted():
    spec = build_launch(r(), "/runs/with space", num_gpus=0, cpu_cores=2, engine="tuned", resume=False,
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
