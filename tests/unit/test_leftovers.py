"""memascend_cli.run.leftovers: DeepSpeed's shared-memory segments and engine key folders, swept only when nobody holds
them. Real files and real processes (a child holds a segment open and mapped, as a DeepSpeed rank does)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from memascend_cli.run import leftovers
from tests import oplock

UID = os.getuid()


def test_names_round_trip_and_junk_is_ignored():
    name = leftovers.shm_name(UID, "127.0.0.1", 29500, 1)
    assert name == f"deepspeed_allreduce_buffer_{UID}_127.0.0.1_29500_1"
    assert leftovers.parse_shm_name(name) == (UID, "127.0.0.1", "29500", 1)
    assert leftovers.parse_shm_name(leftovers.shm_name(7, "node_a.lan", 1, 3)) == (7, "node_a.lan", "1", 3)
    for junk in ("deepspeed_allreduce_buffer_", "deepspeed_allreduce_buffer_x_1_2_3", "other_0_a_1_2",
                 "deepspeed_allreduce_buffer_0_addr_port_rank"):
        assert leftovers.parse_shm_name(junk) is None
    assert leftovers.key_dir_pid("memascend-keys-1234-abcd") == 1234
    assert leftovers.key_dir_pid("memascend-keys-abcd") is None and leftovers.key_dir_pid("other") is None


def _hold(path: str) -> subprocess.Popen:
    """A process that keeps `path` open and mapped until killed, as a DeepSpeed rank keeps its segment."""
    code = ("import mmap, sys, time\n"
            "f = open(sys.argv[1], 'r+b')\n"
            "m = mmap.mmap(f.fileno(), 0)\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _segment(d, *args, nbytes: int = 4096) -> str:
    path = os.path.join(d, leftovers.shm_name(*args))
    with open(path, "wb") as f:
        f.write(b"\0" * nbytes)
    return path


def test_sweep_removes_only_segments_nobody_holds(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    stale = _segment(shm, UID, "127.0.0.1", 1, 0, nbytes=8192)
    live = _segment(shm, UID, "127.0.0.1", 1, 1)
    other_user = _segment(shm, UID + 1, "127.0.0.1", 1, 0)
    unrelated = shm / "not-deepspeed"
    unrelated.write_bytes(b"x")
    holder = _hold(live)
    try:
        s = leftovers.sweep(shm_dir=str(shm), tmp_dir=str(tmp_path / "none"), ext_dirs=[])
        assert [r["path"] for r in s.removed] == [stale] and s.removed_bytes == 8192 and s.kept_live == 1
        assert os.path.exists(live) and os.path.exists(other_user) and unrelated.exists()
        assert "1 leftover(s)" in s.note()
    finally:
        holder.kill()
        holder.wait()
    s = leftovers.sweep(shm_dir=str(shm), tmp_dir=str(tmp_path / "none"), ext_dirs=[])
    assert [r["path"] for r in s.removed] == [live] and s.kept_live == 0
    assert os.path.exists(other_user)  # another user's segment is never ours to remove
    assert leftovers.sweep(shm_dir=str(shm), tmp_dir=str(tmp_path / "none"), ext_dirs=[]).note() is None


def test_sweep_removes_key_folders_of_dead_processes_only(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / f"memascend-keys-{dead.pid}-abc"
    (gone / "zero_stage_3").mkdir(parents=True)
    (gone / "zero_stage_3" / "f").write_bytes(b"123")
    mine = tmp_path / f"memascend-keys-{os.getpid()}-def"
    mine.mkdir()
    old_style = tmp_path / "memascend-keys-xyz"
    old_style.mkdir()
    s = leftovers.sweep(shm_dir=str(tmp_path / "no-shm"), tmp_dir=str(tmp_path), ext_dirs=[])
    assert [r["path"] for r in s.removed] == [str(gone)] and s.removed_bytes == 3
    assert mine.exists() and old_style.exists()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this machine")
def test_held_paths_sees_a_real_dev_shm_mapping():
    """On the real /dev/shm (without sweeping it: other users' leftovers are not this test's to remove)."""
    path = os.path.join("/dev/shm", leftovers.shm_name(UID, "memascend-test", os.getpid(), 0))
    prefix = os.path.join("/dev/shm", leftovers.SHM_PREFIX)
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    try:
        holder = _hold(path)
        try:
            assert path in leftovers.held_paths(prefix)
            assert os.path.basename(path) in leftovers.deepspeed_segments()
        finally:
            holder.kill()
            holder.wait()
        t0 = time.monotonic()
        while path in leftovers.held_paths(prefix) and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        assert path not in leftovers.held_paths(prefix)
        assert leftovers.shm_used_bytes() > 0
    finally:
        os.unlink(path)


def test_sweep_removes_an_op_build_lock_nobody_holds_whatever_its_age(tmp_path):
    """torch's FileBaton lock of a JIT op (<dir>/<op>/lock): one that no live process holds (its descriptor, or a
    build's cwd in the folder) is stale once older than the release window, however young; a held one stays and is
    named with its holder; another user's stays."""
    ext = tmp_path / "ext"
    past = time.time() - 2 * leftovers.EXT_LOCK_RELEASE_S
    locks = {}
    for op in ("cpu_adam", "async_io", "py311_cpu/pin_memory", "fresh", "held", "others"):
        (ext / op).mkdir(parents=True)
        locks[op] = ext / op / "lock"
        if op != "held":
            locks[op].touch()
            if op != "fresh":
                os.utime(locks[op], (past, past))
    os.chown(locks["others"], UID + 1, -1)
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=ext / "async_io")
    holder = oplock.hold(locks["held"])
    os.utime(locks["held"], (past, past))
    try:
        time.sleep(0.2)
        assert leftovers.ext_lock_holders(str(locks["held"])) == [holder.pid]
        assert leftovers.ext_lock_holders(str(locks["async_io"])) == [builder.pid]
        s = leftovers.sweep(shm_dir=str(tmp_path / "no-shm"), tmp_dir=str(tmp_path / "none"), ext_dirs=[str(ext)])
        assert sorted(r["path"] for r in s.removed) == sorted([str(locks["cpu_adam"]),
                                                                str(locks["py311_cpu/pin_memory"])])
        assert [h["path"] for h in s.locks_held] == sorted([str(locks["async_io"]), str(locks["held"])])
        note = s.note()
        assert "removed the stale op build lock(s)" in note and str(locks["cpu_adam"]) in note
        assert f"{locks['held']} is held by pid {holder.pid} (" in note and "a load of that op waits for it" in note
        assert all(locks[op].exists() for op in ("async_io", "fresh", "held", "others"))
    finally:
        builder.kill()
        holder.kill()
        builder.wait()
        holder.wait()
    time.sleep(leftovers.EXT_LOCK_RELEASE_S)
    s = leftovers.sweep(shm_dir=str(tmp_path / "no-shm"), tmp_dir=str(tmp_path / "none"), ext_dirs=[str(ext)])
    assert sorted(r["path"] for r in s.removed) == sorted(str(locks[op]) for op in ("async_io", "fresh", "held"))
    assert locks["others"].exists() and not s.locks_held
