"""Helpers of the op build lock tests: a process holding a torch op build lock as FileBaton does, and a private copy
of the extensions folder (tests/engine/test_jit_ops.py, tests/unit/test_leftovers.py,
tests/integration/test_op_lock_leftovers.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

_HOLD = ("import os, sys\n"
         "fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL)\n"  # torch/utils/file_baton.py try_acquire
         "print('ready', flush=True)\n"
         "sys.stdin.readline()\n"
         "os.close(fd)\n"
         "os.remove(sys.argv[1])\n")  # FileBaton.release


def hold(lock) -> subprocess.Popen:
    """A process that takes `lock` as torch's FileBaton does (O_CREAT | O_EXCL, the descriptor kept open) and
    releases it (close, remove) when release() is called."""
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def release(p: subprocess.Popen) -> None:
    """Let the holder release its lock and exit (or kill it if it already went)."""
    if p.poll() is None:
        p.stdin.write("\n")
        p.stdin.flush()
    p.wait(timeout=10)


BUILT_OPS = ("deepspeed_shm_comm", "cpu_adam", "pin_memory", "async_io")


def private_extensions(dst) -> str:
    """A copy of this checkout's extensions folder (same mtimes: ninja finds the ops built), with no lock in it, so
    other jobs on the machine neither see nor take the test's locks. Real copies, not hard links: a build in either
    folder appends to ninja's logs in place. Skips where the ops are not built, or need a build (another process is
    rebuilding them)."""
    src = os.environ.get("TORCH_EXTENSIONS_DIR", "")
    missing = [op for op in BUILT_OPS if not os.path.exists(os.path.join(src, op, f"{op}.so"))]
    if missing:
        pytest.skip(f"DeepSpeed's ops {missing} are not built in {src!r} (bash scripts/bootstrap.sh test builds them)")
    shutil.copytree(src, str(dst), ignore=shutil.ignore_patterns("lock"))
    ninja = shutil.which("ninja")
    stale = [op for op in BUILT_OPS if ninja is None or "no work to do" not in subprocess.run(
        [ninja, "-n", "-C", os.path.join(str(dst), op)], capture_output=True, text=True, check=False).stdout]
    if stale:
        pytest.skip(f"DeepSpeed's ops {stale} in {src!r} need a build with this PATH's ninja")
    return str(dst)
