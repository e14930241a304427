"""`--ssd-bandwidth` for real, as root: a child in the io cgroup that RunCgroup makes for the block device under a
folder moves O_DIRECT data no faster than the limit, and the cgroup's own counters saw the bytes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from memascend_cli.run import cgroup
from memascend_cli.run.iolimit import resolve_limits
from tests.conftest import require_memory_cgroups

pytestmark = pytest.mark.root

MiB = 1024**2
LIMIT_BYTES_PER_S = 20_000_000
SIZE_BYTES = 16 * MiB
# Writes then reads `size` bytes O_DIRECT (page-aligned mmap buffer, 1 MiB requests) at argv[1], then fsyncs.
DIRECT_IO = """
import mmap, os, sys
path, size = sys.argv[1], int(sys.argv[2])
buf = mmap.mmap(-1, 1 << 20)
buf.write(b"x" * (1 << 20))
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT)
for off in range(0, size, 1 << 20):
    assert os.pwritev(fd, [buf], off) == 1 << 20
os.fsync(fd)
for off in range(0, size, 1 << 20):
    assert os.preadv(fd, [buf], off) == 1 << 20
os.close(fd)
"""


def test_o_direct_io_in_the_throttled_cgroup_takes_at_least_size_over_limit(tmp_path):
    require_memory_cgroups("io")
    limits = resolve_limits([str(tmp_path)], LIMIT_BYTES_PER_S)
    with cgroup.RunCgroup(label="test-io", io_limits=tuple(limits)) as cg:
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-c", DIRECT_IO, str(tmp_path / "data.bin"), str(SIZE_BYTES)],
                           preexec_fn=cg.join, capture_output=True, text=True)
        took_s = time.monotonic() - t0
        counted = cg.io_result()["counted_bytes"][limits[0].maj_min]
    assert p.returncode == 0, p.stderr
    # Reads and writes are limited separately: each direction takes size / limit (the kernel lets a first slice of
    # ~0.1 s through at once: block/blk-throttle.c throtl_slice), so allow 10% less.
    assert took_s >= 0.9 * 2 * SIZE_BYTES / LIMIT_BYTES_PER_S, took_s
    assert counted["read"] >= SIZE_BYTES and counted["write"] >= SIZE_BYTES
    assert not os.path.exists(cg.dirs["io"])  # removed on exit
