"""Region ownership: per-rank OFD locks and owner records, with real processes on a real region file.

No torch: the lock/owner module is stdlib only. The region is a file made by `memascend prepare-ssd`
on tmp_path (O_DIRECT needs ext4/xfs/btrfs, never tmpfs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from memascend_cli.ssd import region

from memascend_cli.ssd import owner as region_owner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HOLDER = textwrap.dedent("""
    import sys, time
    from memascend_cli.ssd import owner as region_owner
    lease = region_owner.acquire(sys.argv[1], int(sys.argv[2]))
    print("held", flush=True)
    time.sleep(120)
""")


def _prepare(tmp_path, ranks: int = 2) -> str:
    path = str(tmp_path / "owned.region")
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", path, "--size", "32MiB", "--ranks",
                        str(ranks), "--no-probe", "--yes"], capture_output=True, text=True, check=False)
    if p.returncode != 0 and "O_DIRECT" in p.stderr:
        pytest.skip(f"{tmp_path} does not support O_DIRECT: {p.stderr.strip()[-200:]}")
    assert p.returncode == 0, p.stderr
    return path


def _holder(path: str, rank: int, env=None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, path, str(rank)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, cwd=REPO)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_owner_record_roundtrip_and_damage():
    o = region_owner.Owner(rank=3, host="h", pid=42, job_id="j", started_at="2026-01-01T00:00:00+00:00")
    block = region_owner.encode_owner(o)
    assert len(block) == region_owner.OWNER_SLOT_BYTES and region_owner.decode_owner(block) == o
    assert region_owner.decode_owner(region_owner.encode_owner(None)) is None
    bad = bytearray(block)
    bad[40] ^= 1
    with pytest.raises(ValueError, match="checksum mismatch"):
        region_owner.decode_owner(bytes(bad))


def test_job_id_comes_from_the_environment():
    assert region_owner.job_id_from_env({"SLURM_JOB_ID": "77"}) == "77"
    assert region_owner.job_id_from_env({"MEMASCEND_JOB_ID": "a", "SLURM_JOB_ID": "77"}) == "a"
    assert region_owner.job_id_from_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}) == "127.0.0.1:29500"
    assert region_owner.job_id_from_env({}) == ""


def test_second_opener_is_refused_naming_the_owner_and_ranks_are_independent(tmp_path):
    path = _prepare(tmp_path)
    holder = _holder(path, 0, env={"MEMASCEND_JOB_ID": "job-A"})
    try:
        with pytest.raises(region_owner.RegionBusy) as info:
            region_owner.acquire(path, 0)
        msg = info.value.message
        assert f"rank 0's sub-region is in use by pid {holder.pid} on host {os.uname().nodename}, job job-A" in msg
        # The other rank of the same region is free for another process (two ranks of one job).
        with region_owner.acquire(path, 1) as lease:
            assert lease.took_over is None
            assert region_owner.read_owner(path, 1).pid == os.getpid()
            # A whole-region opener (wipe, re-prepare) conflicts with every rank.
            with pytest.raises(region_owner.RegionBusy, match="the region is in use by pid"):
                region_owner.acquire(path, None)
        assert region_owner.read_owner(path, 1) is None  # released: record cleared
        states = region_owner.rank_states(path, region.read_header(path))
        assert [s["state"] for s in states] == ["in use", "free"]
        assert states[0]["owner"]["pid"] == holder.pid and states[0]["owner"]["job_id"] == "job-A"
    finally:
        holder.kill()
        holder.wait()


def test_kill_9_owner_is_taken_over_with_a_message(tmp_path, cli):
    path = _prepare(tmp_path)
    holder = _holder(path, 0)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    # The kernel dropped the lock; the record stays until the next opener replaces it.
    r = cli("prepare-ssd", "--info", path, "--json")
    owners = json.loads(r.stdout)["owners"]
    assert owners[0]["state"] == "stale" and owners[0]["owner"]["pid"] == holder.pid
    r = cli("prepare-ssd", "--info", path)
    assert "stale" in r.stdout and f"pid {holder.pid}" in r.stdout
    messages = []
    lease = region_owner.acquire(path, 0, announce=messages.append)
    try:
        assert lease.took_over.pid == holder.pid
        assert len(messages) == 1 and f"taking over rank 0's sub-region of {path} from pid {holder.pid}" in messages[0]
        assert "that process is gone" in messages[0]
        r = cli("prepare-ssd", "--info", path, "--json")
        assert json.loads(r.stdout)["owners"][0]["state"] == "in use"
    finally:
        lease.release()


def test_prepare_and_wipe_refuse_a_region_in_use_even_with_force(tmp_path, cli):
    path = _prepare(tmp_path)
    holder = _holder(path, 1)
    try:
        for args in (("prepare-ssd", path, "--size", "32MiB", "--no-probe", "--yes", "--force"),
                     ("prepare-ssd", "--wipe", path, "--yes", "--force")):
            r = cli(*args)
            assert r.exit_code == 1, r.stderr
            assert f"error: region {path}: rank 1's sub-region is in use by pid {holder.pid}" in r.stderr
        assert region.read_header(path).ranks  # untouched
    finally:
        holder.kill()
        holder.wait()
    assert cli("prepare-ssd", "--wipe", path, "--yes").exit_code == 0


def test_lock_is_per_open_file_description_not_per_process(tmp_path):
    """OFD locks (not POSIX process locks): a second open in the same process is refused too, and
    closing an unrelated descriptor of the file does not drop the lock."""
    path = _prepare(tmp_path)
    lease = region_owner.acquire(path, 0)
    try:
        fd = os.open(path, os.O_RDONLY)
        os.close(fd)  # with POSIX locks this close would release the lock
        with pytest.raises(region_owner.RegionBusy, match=f"in use by pid {os.getpid()}"):
            region_owner.acquire(path, 0)
    finally:
        lease.release()
    region_owner.acquire(path, 0).release()


def test_train_on_a_region_in_use_fails_at_once_naming_the_owner(tmp_path):
    path = _prepare(tmp_path, ranks=1)
    holder = _holder(path, 0, env={"MEMASCEND_JOB_ID": "first-run"})
    try:
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "memascend_cli", "train", "tiny-cpu", "--region", path,
                            "--output-dir", str(tmp_path / "run"), "--steps", "2"],
                           capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
        elapsed = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert p.returncode == 1, p.stderr
    assert len(errors) == 1 and f"rank 0's sub-region is in use by pid {holder.pid}" in errors[0], p.stderr
    assert "job first-run" in errors[0] and "hint:" in p.stderr
    assert elapsed < 30  # refused by the preflight, before DeepSpeed starts
