"""`memascend train` leaves nothing behind in /dev/shm, also when a rank is killed with SIGKILL.

Two CPU ranks on one node make DeepSpeed create its shared-memory allreduce segments
(/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>, ~66 MB each, never unlinked by DeepSpeed). The run
kills rank 1 after step 1; when the CLI has exited, no segment of its port is left. A stale segment planted before
the run (no process holds it) is swept at the start; one a live process holds (another job's) survives both sweeps.
Slow: one 2-rank launch of a few steps (~1 min on a 2-core VM).
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

pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")
UID = os.getuid()


def _segments(port: int) -> list[str]:
    return [n for n in leftovers.deepspeed_segments() if (leftovers.parse_shm_name(n) or (0, "", "", 0))[2] == str(port)]


def _rank_pids(run: str) -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{name}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if b"memascend_engine.train_worker" in cmd and run.encode() in cmd and b"-m" in cmd:
            out[int(env.get(b"RANK", b"-1"))] = int(name)
    return out


@pytest.mark.serial  # a stale segment it plants must stay for this run's sweep, not another job's
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this machine")
def test_killed_rank_leaves_no_shared_memory_and_live_segments_are_kept(tmp_path):
    from memascend_cli.run.launch import free_port

    port = free_port()
    stale_port, live_port = free_port(), free_port()
    stale = os.path.join("/dev/shm", leftovers.shm_name(UID, "127.0.0.1", stale_port, 0))
    live = os.path.join("/dev/shm", leftovers.shm_name(UID, "127.0.0.1", live_port, 0))
    for path in (stale, live):
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
    hold = "import sys, time; f = open(sys.argv[1], 'rb'); print('ready', flush=True); time.sleep(900)"
    holder = subprocess.Popen([sys.executable, "-c", hold, live], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "ready"
    run = str(tmp_path / "run")
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    proc = subprocess.Popen([sys.executable, "-m", "memascend_cli", "train", TINY, "--output-dir", run, "--steps", "30",
                             "--set", "ranks=2", "--set", f"master_port={port}", "--set", "export=false",
                             "--set", "checkpoint_every=100"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO)
    seen_during, killed = [], None
    try:
        metrics = os.path.join(run, "metrics.jsonl")
        deadline = time.monotonic() + 600
        while proc.poll() is None and killed is None and time.monotonic() < deadline:
            if os.path.exists(metrics):
                with open(metrics) as f:
                    if any(json.loads(line).get("event") == "step" for line in f if line.strip()):
                        seen_during = _segments(port)
                        killed = _rank_pids(run).get(1)
                        if killed:
                            os.kill(killed, signal.SIGKILL)
            time.sleep(0.1)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        holder.kill()
        holder.wait()
    try:
        assert killed, f"rank 1 was never found running:\n{err[-3000:]}"
        assert proc.returncode == 1 and re.search(r"rank 1 was killed( by SIGKILL)? ", err), err[-3000:]
        # DeepSpeed really made one segment per rank for this job, and none is left.
        assert sorted(seen_during) == [leftovers.shm_name(UID, "127.0.0.1", port, r) for r in (0, 1)], seen_during
        assert _segments(port) == []
        assert "removed" in err and not os.path.exists(stale)  # a stale one, swept at the start (with a note)
        assert os.path.exists(live)  # held by a live process: another job's, never removed
    finally:
        for path in (stale, live):
            if os.path.exists(path):
                os.unlink(path)
