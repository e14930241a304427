"""The lifeline (memascend_cli/run/lifeline.py) and the stop policy of a launch (memascend_cli/run/launch.py StopState)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from memascend_cli.run import lifeline
from memascend_cli.run.launch import StopPolicy, StopState, stopped_marks


def test_token_names_this_process_and_round_trips():
    parsed = lifeline.parse(lifeline.token())
    assert parsed == (lifeline.boot_id(), os.getpid(), lifeline.start_ticks(os.getpid()), os.getsid(0))
    assert lifeline.parent_alive(parsed, lifeline.boot_id())
    assert lifeline.parse("") is None and lifeline.parse("b:1:x:3") is None and lifeline.parse("b:1:2") is None


def test_a_reused_pid_or_another_machine():
    boot, pid, ticks, sid = lifeline.parse(lifeline.token())
    assert not lifeline.parent_alive((boot, pid, ticks + 1, sid), boot)  # same pid, another process
    assert lifeline.parent_alive(("other-boot", pid, ticks + 1, sid), boot)  # a remote node's CLI: not ours to judge


def test_job_segments_are_those_of_the_jobs_address_and_port():
    names = ["deepspeed_allreduce_buffer_0_127.0.0.1_29500_0", "deepspeed_allreduce_buffer_0_127.0.0.1_29500_1",
             "deepspeed_allreduce_buffer_0_127.0.0.1_295001_0", "deepspeed_allreduce_buffer_1_127.0.0.1_29500_0",
             "deepspeed_allreduce_buffer_0_127.0.0.1_29500_x", "torch_123"]
    assert lifeline.job_segments(0, "127.0.0.1", "29500", names) == names[:2]


def _running(pid: int) -> bool:
    return lifeline.start_ticks(pid) is not None


def test_the_job_ends_when_the_cli_is_killed(tmp_path):
    """The CLI (a child here, killed with SIGKILL) starts a launcher; the launcher's child watches the lifeline: both
    end within a second or so, the launcher through PR_SET_PDEATHSIG and its process group through the rank."""
    cli = ("import os, sys, subprocess, time; from memascend_cli.run import lifeline; "
           "env = {**os.environ, lifeline.ENV: lifeline.token()}; "
           f"p = subprocess.Popen([sys.executable, '-c', sys.argv[1]], env=env, start_new_session=True, "
           "preexec_fn=lifeline.die_with_parent()); print(p.pid, flush=True); time.sleep(120)")
    pid_file = tmp_path / "rank.pid"
    # Written beside it, then renamed: the test must never read the file between its creation and its write.
    rank = ("import os, time; from memascend_cli.run import lifeline; assert lifeline.watch(); "
            f"open({str(pid_file) + '.tmp'!r}, 'w').write(str(os.getpid())); "
            f"os.replace({str(pid_file) + '.tmp'!r}, {str(pid_file)!r}); time.sleep(120)")
    launcher = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {rank!r}]); time.sleep(120)"
    p = subprocess.Popen([sys.executable, "-c", cli, launcher], stdout=subprocess.PIPE, text=True)
    launcher_pid = int(p.stdout.readline())
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    rank_pid = int(pid_file.read_text())
    assert _running(launcher_pid) and _running(rank_pid)
    p.kill()
    p.wait()
    deadline = time.monotonic() + 5
    while (_running(launcher_pid) or _running(rank_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(launcher_pid) and not _running(rank_pid)


def test_a_rank_without_a_lifeline_watches_nothing():
    assert lifeline.watch(env={}) is False
    assert lifeline.watch(env={lifeline.ENV: "another-boot:1:1:1"}) is False


def test_stop_requests_grace_and_stop_after():
    s = StopState(StopPolicy(grace_s=10, stop_at=None))
    assert s.tick(100.0) == "none"
    assert s.request("SIGTERM", 100.0) == "graceful" and s.at_once is None
    assert s.tick(109.0) == "none"
    assert s.tick(110.0) == "at once" and "grace of 10 s" in s.at_once
    assert s.request("SIGTERM", 111.0) == "none" and s.external

    s = StopState(StopPolicy(grace_s=10))
    s.request("SIGTERM", 0.0)
    assert s.request("SIGHUP", 1.0) == "at once" and s.at_once == "a second stop request: SIGHUP"

    s = StopState(StopPolicy(grace_s=10, stop_at=50.0))
    assert s.tick(49.0) == "none" and s.tick(50.0) == "graceful" and s.reasons == ["--stop-after"]
    assert s.external

    s = StopState(StopPolicy())
    assert not s.external  # the ranks stopped on their own (a STOP file, a stop hook): exit 0
    s.request("Ctrl-C", 0.0)
    assert not s.external  # exit 0 for the user at the terminal


def test_stopped_marks_need_every_rank_stopped_at_one_checkpoint(tmp_path):
    run = str(tmp_path)
    (tmp_path / "logs").mkdir()
    mark = {"code": 0, "stopped": 4, "checkpoint": "/r/checkpoints/step-0000004"}
    (tmp_path / "logs" / "exit-rank0.json").write_text(json.dumps(mark))
    assert stopped_marks(run, 1) == (4, "/r/checkpoints/step-0000004")
    assert stopped_marks(run, 2) is None  # rank 1 left no mark
    (tmp_path / "logs" / "exit-rank1.json").write_text(json.dumps({"code": 0}))
    assert stopped_marks(run, 2) is None  # rank 1 finished the run instead
    (tmp_path / "logs" / "exit-rank1.json").write_text(json.dumps(mark))
    assert stopped_marks(run, 2) == (4, "/r/checkpoints/step-0000004")


@pytest.mark.parametrize("text,seconds", [("3h50m", 13800.0), ("90m", 5400.0), ("600s", 600.0), ("45", 45.0),
                                          ("1.5h", 5400.0)])
def test_durations(text, seconds):
    from memascend_cli.commands.train import parse_duration_s

    assert parse_duration_s(text, "--stop-after") == seconds


@pytest.mark.parametrize("text", ["", "abc", "m", "5x", "-3s"])
def test_bad_durations_are_bad_input(text):
    from memascend_cli.commands.train import parse_duration_s
    from memascend_cli.errors import BadInput

    with pytest.raises(BadInput, match="is not a duration"):
        parse_duration_s(text, "--stop-after")
