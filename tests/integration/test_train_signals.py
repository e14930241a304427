"""A `memascend train` job lives and dies with its command, whatever signal ends the command.

Each case starts the real CLI on tiny-cpu (memascend engine, region file in the run directory) in a session of its
own, as a shell job or a batch script runs it, and signals it once a step is logged: SIGKILL of the CLI, SIGKILL of
its whole process group (an OOM kill, `kill -9 -PGID`), SIGHUP (the terminal closes) and SIGTERM (scancel, systemd).
Afterwards no DeepSpeed launcher or rank of the run is left within 10 s, DeepSpeed's /dev/shm segments of the job are
gone, and the region is free for the next `memascend train` at once. SIGTERM and SIGHUP stop cleanly: exit 75 and one
line naming the complete checkpoint; `--resume` from it gives the uninterrupted run's fp32 losses bit for bit.

A second SIGTERM stops at once (exit 1, one error line) with no partial checkpoint under a final name.
Slow: 7 launches of up to 6 steps and 3 dry runs (about 5 min on the shared 2-core VM). Helpers from test_train_cpu and test_train_leftovers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from memascend_cli.run import leftovers
from memascend_cli.run.launch import free_port
from tests.integration.test_train_cpu import REPO, TINY, losses, memascend

pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed")
COMMON = ("--steps", "6", "--set", "checkpoint_every=100", "--set", "export=false")
GONE_WITHIN_S = 10.0


def _job_processes(run: str) -> list[str]:
    """DeepSpeed's launchers and the ranks of the run (not zombies: those are dead), as 'pid cmdline'."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and run in cmd and ("deepspeed" in cmd or "train_worker" in cmd):
            out.append(f"{name} {cmd}")
    return out


def _segments(port: int) -> list[str]:
    return [n for n in leftovers.deepspeed_segments() if (leftovers.parse_shm_name(n) or (0, "", "", 0))[2] == str(port)]


def _start(run: str, port: int, *extra: str) -> subprocess.Popen:
    """`memascend train` in a session of its own; returns once its first step is logged (the ranks train)."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    os.makedirs(run, exist_ok=True)
    with open(os.path.join(run, "..", "cli.log"), "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "memascend_cli", "train", TINY, "--output-dir", run, *COMMON,
                                 "--set", f"master_port={port}", *extra], stdout=log, stderr=log, env=env, cwd=REPO,
                                start_new_session=True)
    metrics = os.path.join(run, "metrics.jsonl")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(metrics):
            with open(metrics) as f:
                if any(json.loads(line).get("event") == "step" for line in f if line.strip()):
                    return proc
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the run never logged a step (exit {proc.poll()}):\n{_cli_log(run)[-3000:]}")


def _cli_log(run: str) -> str:
    with open(os.path.join(run, "..", "cli.log"), encoding="utf-8", errors="replace") as f:
        return f.read()


def _assert_job_gone(run: str, port: int) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while _job_processes(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _job_processes(run)
    for line in left:  # never leave them to the next test
        os.kill(int(line.split()[0]), signal.SIGKILL)
    assert left == [], f"still running {GONE_WITHIN_S:g} s after the CLI ended:\n" + "\n".join(left)
    assert _segments(port) == []


def _region_free_for_a_new_run(run: str, tmp_path) -> None:
    """The next `memascend train` on the same region passes its preflight (which refuses a region in use)."""
    p = memascend(TINY, "--output-dir", str(tmp_path / "next"), *COMMON, "--region", os.path.join(run, "region.bin"),
                  "--dry-run", check=False)
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.parametrize("whom", ["cli", "group"])
def test_sigkill_leaves_no_process_shared_memory_or_lock(tmp_path, whom):
    run, port = str(tmp_path / "run"), free_port()
    proc = _start(run, port)
    if whom == "cli":
        os.kill(proc.pid, signal.SIGKILL)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    _assert_job_gone(run, port)
    _region_free_for_a_new_run(run, tmp_path)


# Long (25 s): SIGHUP stops the job by SIGTERM's path (run/launch.py on_signal; only the hung-up terminal's detach
# differs, and here the CLI has no terminal), which the default run checks end to end below, exact resume included.
@pytest.mark.long
def test_sighup_stops_cleanly_and_leaves_nothing(tmp_path):
    run, port = str(tmp_path / "run"), free_port()
    proc = _start(run, port)
    os.kill(proc.pid, signal.SIGHUP)
    assert proc.wait(timeout=120) == 75, _cli_log(run)[-3000:]
    _assert_job_gone(run, port)
    assert re.search(r"stopped at step \d+ \(SIGHUP\): checkpoint \S+ is complete", _cli_log(run))
    _region_free_for_a_new_run(run, tmp_path)


def test_sigterm_checkpoints_exits_75_and_resume_is_exact(tmp_path):
    reference = str(tmp_path / "reference")
    memascend(TINY, "--output-dir", reference, *COMMON)
    run, port = str(tmp_path / "run"), free_port()
    proc = _start(run, port)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 75, _cli_log(run)[-3000:]
    _assert_job_gone(run, port)
    lines = [line for line in _cli_log(run).splitlines() if line.startswith("stopped at step")]
    assert len(lines) == 1, _cli_log(run)[-3000:]
    m = re.fullmatch(r"stopped at step (\d+) \(SIGTERM\): checkpoint (\S+) is complete; continue with "
                     r"`memascend train RECIPE --resume`", lines[0])
    assert m and os.path.isfile(os.path.join(m.group(2), "COMPLETE")), lines
    assert max(losses(run)) == int(m.group(1)) < 6
    # The next run takes the same region at once (its lock went with the ranks) and ends where the reference did.
    memascend(TINY, "--output-dir", run, *COMMON, "--resume")
    assert losses(run) == losses(reference)


def test_a_second_sigterm_stops_at_once_without_a_partial_checkpoint(tmp_path):
    run, port = str(tmp_path / "run"), free_port()
    proc = _start(run, port)
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 1, _cli_log(run)[-3000:]
    _assert_job_gone(run, port)
    errors = [line for line in _cli_log(run).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "stopped at once (a second stop request: SIGTERM)" in errors[0], errors
    ck = os.path.join(run, "checkpoints")
    names = os.listdir(ck) if os.path.isdir(ck) else []
    # A checkpoint cut short keeps its temporary name; nothing under a final name lacks its COMPLETE marker.
    assert all(os.path.isfile(os.path.join(ck, n, "COMPLETE")) for n in names if n.startswith("step-")), names
