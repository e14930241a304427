"""The allocator policy the bench's tuned-glibc_threshold run gives stock DeepSpeed: glibc's own tunable fixes the
mmap threshold at the engine's value, so a freed mmapped block no longer raises it (malloc/malloc.c free: the
dynamic threshold moves only while mp_.no_dyn_threshold is 0, which setting the tunable clears)."""

from __future__ import annotations

import os
import subprocess
import sys

from memascend_cli.bench import runs
from memascend_engine.ds_internals.allocator import MMAP_THRESHOLD_BYTES

# malloc 2 MiB, free it, malloc 2 MiB again; print the bytes glibc then holds in mmapped chunks (mallinfo2 hblkhd).
CHILD = """
import ctypes
from memascend_engine.procfs import malloc_state
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
n = 2 << 20
libc.free(libc.malloc(n))
p = libc.malloc(n)
print(malloc_state()["mmapped_bytes"])
libc.free(p)
"""


def _mmapped_after_refree(env: dict) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_the_env_run_fixes_the_threshold_the_engine_sets():
    (run,) = runs.parse_runs("tuned-glibc_threshold", False)
    assert dict(run.env)["GLIBC_TUNABLES"] == f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD_BYTES}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GLIBC_TUNABLES", "MALLOC_"))}
    # glibc's default: the freed 2 MiB block raised the threshold, so the second one comes from the heap.
    assert _mmapped_after_refree(base) < 2 << 20
    # With the tunable the threshold stays at 1 MiB: the second block is mmapped again (and returned at free).
    assert _mmapped_after_refree({**base, **dict(run.env)}) >= 2 << 20
