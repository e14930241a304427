"""Nothing a killed rank leaves blocks the next run, and a run blocked on a live lock says so.

Real `memascend bench` runs of tiny-llama on a private copy of the extensions folder (tests/oplock.py): an op build
lock placed by hand is removed with a note and the run completes; a lock a live process holds is named within 10 s
and the run completes once it is released; a rank SIGKILLed at each setup phase (memascend with a region: the owner
record, the engine's key folder, DeepSpeed's /dev/shm segments; tuned: DeepSpeed's swap folder) is followed at once by
a normal run that completes and leaves nothing behind. Slow: about a minute a run on the shared 2-core VM.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from memascend_cli.planner.job import DTYPE_BYTES
from memascend_cli.run import leftovers
from tests import oplock

# Not serial: each run has its own copy of the extensions folder (its locks are its own), the bench's left_by_run
# leaves out the /dev/shm segments another job's live process holds (bench/runner.py _shm_after), and the /tmp check
# is limited to the killed ranks' pids.
pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed")


def _bench(out, ext, *args, on_line=None) -> tuple[int, list[tuple[float, str]], dict | None]:
    cmd = [sys.executable, "-m", "memascend_cli", "bench", "--model", "tiny-llama", "--seq-len", "64", "--steps", "1",
           "--settle-cap", "1", "--out", str(out), *args]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": ext, "DS_ACCELERATOR": "cpu"}
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in p.stdout:
        lines.append((time.monotonic() - t0, line.rstrip("\n")))
        if on_line is not None:
            on_line(lines[-1])
    rc = p.wait(timeout=900)
    try:
        doc = json.loads((out / "bench.json").read_text())
    except OSError:
        doc = None
    return rc, lines, doc


def _text(lines) -> str:
    return "\n".join(t for _, t in lines)


def test_a_stale_lock_placed_by_hand_is_removed_with_a_note_and_the_run_completes(tmp_path):
    ext = oplock.private_extensions(tmp_path / "ext")
    lock = os.path.join(ext, "deepspeed_shm_comm", "lock")
    open(lock, "w").close()
    rc, lines, doc = _bench(tmp_path / "out", ext, "--runs", "tuned")
    assert rc == 0, _text(lines)[-3000:]
    assert f"removed the stale op build lock(s) {lock}" in " ".join(_text(lines).split())
    assert doc["runs"][0]["ok"] and not os.path.exists(lock)
    # The run's record says what decided its losses: its threads (its share of the cores) and the weights it began with.
    det = doc["runs"][0]["determinism"]
    assert det["torch_threads"] == int(det["env"]["OMP_NUM_THREADS"]) == doc["hardware"]["cpu_cores"]
    assert len(det["param_crc32"]) == 1
    assert det["param_bytes"] == DTYPE_BYTES[doc["job"]["dtype"]] * doc["job"]["num_params"]


def test_a_run_blocked_on_a_live_lock_says_so_within_10_s_and_completes_once_it_is_released(tmp_path):
    ext = oplock.private_extensions(tmp_path / "ext")
    lock = os.path.join(ext, "deepspeed_shm_comm", "lock")
    holder = oplock.hold(lock)
    events = tmp_path / "out" / "runs" / "tuned" / "events-rank0.jsonl"
    said = []

    def release_once_the_rank_waits():
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120 and not (events.exists() and '"wait"' in events.read_text()):
            time.sleep(0.2)
        time.sleep(2)  # still held after the report: the rank goes on waiting, it does not give up
        oplock.release(holder)

    threading.Thread(target=release_once_the_rank_waits, daemon=True).start()
    try:
        rc, lines, doc = _bench(tmp_path / "out", ext, "--runs", "tuned",
                                on_line=lambda ln: said.append(ln) if f"pid {holder.pid}" in ln[1] else None)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert rc == 0, _text(lines)[-3000:]
    assert said and "is held by" in said[0][1]  # the CLI's note before the launch
    evs = [json.loads(ln) for ln in events.read_text().splitlines()]
    blocked = next(e["t_mono"] for e in evs if e.get("name") == "init_distributed")  # the shm op's load
    wait = next(e for e in evs if e.get("event") == "wait")
    assert wait["on"] == lock and any(f"pid {holder.pid} " in h for h in wait["holders"])
    assert wait["t_mono"] - blocked < 10
    assert doc["runs"][0]["ok"] and not os.path.exists(lock)


def _rank_pid(events_prefix: str) -> int | None:
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if b"memascend_engine.bench_job" in cmd and events_prefix.encode() in cmd:
            return int(name)
    return None


def _kill_at(out, run: str, phase: str, killed: list) -> None:
    """SIGKILL the run's rank as soon as its events say it started `phase`."""
    events = out / "runs" / run / "events-rank0.jsonl"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 300:
        if events.exists() and any(json.loads(ln).get("name") == phase for ln in events.read_text().splitlines()
                                   if ln.strip()):
            pid = _rank_pid(str(out / "runs" / run / "events"))
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.05)


def _left_behind(ext: str, pids: list[int]) -> list[str]:
    """Op build locks, and the killed ranks' key folders (their pid in the name), left after the runs."""
    return glob.glob(os.path.join(ext, "*", "lock")) + [n for n in os.listdir("/tmp") if leftovers.key_dir_pid(n) in pids]


@pytest.fixture(scope="module")
def region(tmp_path_factory):
    path = tmp_path_factory.mktemp("region") / "region.bin"
    subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", str(path), "--size", "2GiB", "--no-probe",
                    "--yes"], check=True, capture_output=True, timeout=300)
    return str(path)


# The default run kills in init_distributed (where the shm op's lock is taken) and in stock's initialize; the other
# phases are `long` (scripts/record_tests.py --long records them), each ~20 s alone on a serial worker.
LONG = pytest.mark.long


@pytest.mark.parametrize("run, phase", [pytest.param("memascend", "import", marks=LONG),
                                        ("memascend", "init_distributed"),
                                        pytest.param("memascend", "engine_install", marks=LONG),
                                        pytest.param("memascend", "zero_init", marks=LONG),
                                        ("tuned", "initialize")])
def test_a_rank_killed_in_setup_leaves_nothing_that_blocks_the_next_run(tmp_path, region, run, phase):
    ext = oplock.private_extensions(tmp_path / "ext")
    args = ["--runs", run, "--nvme-dir", str(tmp_path / "swap"), *(["--region", region] if run == "memascend" else [])]
    killed: list[int] = []
    killer = threading.Thread(target=_kill_at, args=(tmp_path / "killed", run, phase, killed), daemon=True)
    killer.start()
    rc, lines, doc = _bench(tmp_path / "killed", ext, *args)
    killer.join(10)
    assert killed and rc != 0 and not doc["runs"][0]["ok"], _text(lines)[-2000:]
    assert doc["runs"][0]["shm"]["left_by_run"] == []  # the killed rank's /dev/shm segments, swept after it
    # A normal job right after, on the same region and swap folder.
    rc, lines, doc = _bench(tmp_path / "next", ext, *args)
    assert rc == 0 and doc["runs"][0]["ok"], _text(lines)[-3000:]
    assert doc["runs"][0]["shm"]["left_by_run"] == []
    assert _left_behind(ext, killed) == []
