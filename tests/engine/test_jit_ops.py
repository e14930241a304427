"""memascend_engine.ds_internals.jit_ops: DeepSpeed's built ops load without torch's build lock, and a wait on a lock
says what it waits on and ends. Real processes hold the locks; the loads are real DeepSpeed ops of this checkout's
extensions folder (in a child process: a loaded op stays loaded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tests import oplock

pytest.importorskip("deepspeed")

from memascend_engine.ds_internals import jit_ops


def test_no_lock_no_wait(tmp_path):
    t0 = time.monotonic()
    jit_ops.wait_for_lock(str(tmp_path / "lock"), op="cpu_adam")
    assert time.monotonic() - t0 < 0.5


def test_a_lock_nobody_holds_is_removed_with_a_note(tmp_path, capfd):
    lock = tmp_path / "lock"
    lock.touch()
    past = time.time() - 60
    os.utime(lock, (past, past))
    jit_ops.wait_for_lock(str(lock), op="deepspeed_shm_comm")
    assert not lock.exists()
    assert f"note: removed the stale op build lock {lock} (no live process held it" in capfd.readouterr().err


def test_a_held_lock_is_named_then_the_wait_ends_with_its_reason(tmp_path, capfd):
    lock = tmp_path / "lock"
    holder = oplock.hold(lock)
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError) as exc:
            jit_ops.wait_for_lock(str(lock), op="cpu_adam", note_s=0.5, limit_s=2.0)
        waited = time.monotonic() - t0
        err = capfd.readouterr().err
        assert f"waiting on {lock}, held by pid {holder.pid} (" in err and "DeepSpeed's cpu_adam op" in err
        assert f"gave up waiting on {lock}" in str(exc.value) and f"pid {holder.pid}" in str(exc.value)
        assert 2.0 <= waited < 5.0
        assert lock.exists()  # a live process's lock is never taken from it
    finally:
        oplock.release(holder)


def test_a_released_lock_ends_the_wait(tmp_path):
    lock = tmp_path / "lock"
    holder = oplock.hold(lock)
    threading.Timer(1.0, oplock.release, [holder]).start()
    t0 = time.monotonic()
    jit_ops.wait_for_lock(str(lock), op="async_io", note_s=0.2, limit_s=30)
    assert 0.9 < time.monotonic() - t0 < 5 and not lock.exists()


_LOAD = """
import json, sys
import torch.utils.file_baton as fb
taken = []
acquire = fb.FileBaton.try_acquire
fb.FileBaton.try_acquire = lambda self: taken.append(self.lock_file_path) or acquire(self)
from deepspeed.accelerator import get_accelerator
from memascend_engine.ds_internals import jit_ops
assert jit_ops.enable()
files = {}
for name in sys.argv[1:]:
    builder = get_accelerator().create_op_builder(name)
    files[builder.name] = builder.load().__file__
print(json.dumps({"files": files, "batons": taken}))
"""


def _load(ext: str, *builders: str) -> dict:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": ext, "DS_ACCELERATOR": "cpu"}
    r = subprocess.run([sys.executable, "-c", _LOAD, *builders], check=False, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_built_ops_load_without_the_build_lock(tmp_path):
    """DeepSpeed's own load() of each op memascend runs (the shm allreduce, CPU Adam, async I/O and the pin_memory op
    it loads first) imports the built library and takes no FileBaton."""
    ext = oplock.private_extensions(tmp_path / "ext")
    out = _load(ext, "ShareMemCommBuilder", "CPUAdamBuilder", "AsyncIOBuilder")
    assert out["batons"] == []
    assert out["files"] == {op: os.path.join(ext, op, f"{op}.so") for op in ("deepspeed_shm_comm", "cpu_adam",
                                                                              "async_io")}


def _load_built_shm(ext: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": ext, "DS_ACCELERATOR": "cpu"}
    code = ("from deepspeed.accelerator import get_accelerator\n"
            "from memascend_engine.ds_internals import jit_ops\n"
            "print(jit_ops.load_built(get_accelerator().create_op_builder('ShareMemCommBuilder')))\n")
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.slow
def test_an_op_that_needs_a_build_is_left_to_deepspeed(tmp_path):
    """An object file gone (ninja's dry run finds work): load_built declines without taking a lock or building."""
    ext = oplock.private_extensions(tmp_path / "ext")
    os.unlink(os.path.join(ext, "deepspeed_shm_comm", "shm.o"))
    r = _load_built_shm(ext)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "None"
    assert not os.path.exists(os.path.join(ext, "deepspeed_shm_comm", "shm.o"))  # nothing was built
    assert not os.path.exists(os.path.join(ext, "deepspeed_shm_comm", "lock"))


@pytest.mark.slow
def test_a_failed_dry_run_is_an_error_not_a_load_under_the_lock(tmp_path):
    """ninja's dry run failing (as when it is killed under a cap) must not hand the op to torch's locked load."""
    ext = oplock.private_extensions(tmp_path / "ext")
    manifest = os.path.join(ext, "deepspeed_shm_comm", "build.ninja")
    os.unlink(manifest)  # a hard link: write a new file, not through it
    with open(manifest, "w") as f:
        f.write("build: this is not ninja syntax\n")
    r = _load_built_shm(ext)
    assert r.returncode != 0
    assert "could not check whether DeepSpeed's deepspeed_shm_comm op" in r.stderr and "`ninja -n` ended" in r.stderr
    assert not os.path.exists(os.path.join(ext, "deepspeed_shm_comm", "lock"))
