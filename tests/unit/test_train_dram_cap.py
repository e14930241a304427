"""`train --dram-cap`: where an OOM-killed run stood (from its last metrics record), and the flag's input checks."""

from __future__ import annotations

import os

from memascend_cli.commands.train import oom_point

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")


def test_where_the_run_stood():
    assert oom_point(None, 1) == "before step 1 (setup: building the model, DeepSpeed initialize)"
    assert oom_point({"event": "start", "total_steps": 30}, 1) == "at step 1 (training)"
    assert oom_point({"event": "step", "step": 4, "total_steps": 30}, 1) == "at step 5 (training)"
    assert oom_point({"event": "checkpoint", "step": 10, "total_steps": 30}, 1) == "at step 11 (training)"
    assert oom_point({"event": "step", "step": 4, "total_steps": 30}, 5) == \
        "at step 5 to 9 (training; steps are logged every 5)"
    assert oom_point({"event": "resumed", "step": 10, "total_steps": None}, 1) == "at step 11 (training)"
    assert oom_point({"event": "step", "step": 30, "total_steps": 30}, 1).startswith("after the last step, 30")
    assert oom_point({"event": "export", "step": 30, "total_steps": 30}, 1) == "after step 30 (finishing)"
    # What rank 0 said it started last (engine/train_worker.py Run.phase).
    assert oom_point({"event": "phase", "phase": "writing parameters to the region"}, 1) == \
        "before step 1 (setup: writing parameters to the region)"
    assert oom_point({"event": "phase", "phase": "saving a checkpoint", "step": 10, "total_steps": 30}, 1) == \
        "after step 10 (saving a checkpoint)"
    assert oom_point({"event": "progress", "step": 4, "total_steps": 30}, 10) == "at step 5 (training)"


def test_a_bad_cap_is_bad_input(cli):
    for value, words in (("6", "has no unit"), ("0GiB", "must be positive"), ("lots", "cannot read")):
        res = cli("train", TINY, "--dry-run", "--dram-cap", value)
        assert res.exit_code == 2 and words in res.stderr and "--dram-cap" in res.stderr


def test_the_ranks_get_this_venvs_ninja_first(monkeypatch):
    import sys

    from memascend_cli.run.launch import toolchain_env

    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin")
    env = toolchain_env()
    assert env["PATH"] == os.path.dirname(sys.executable) + ":/usr/local/bin:/usr/bin"
    monkeypatch.setenv("PATH", env["PATH"])
    assert toolchain_env() == {}  # already first: the launch environment stays as the user's
