"""The Direct NVMe store on a region file served by faultfs (FUSE): every storage fault is named.

Root (FUSE mount). Fast: no DeepSpeed; one mount for the module, rules reset per test. The region
file is made by `memascend prepare-ssd` in the backing directory (ext4) and opened through the
mount, so every O_DIRECT request of the native engine passes the fault layer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
from memascend_engine import native

from tests import faultfs

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(faultfs.unavailable() is not None, reason=str(faultfs.unavailable())),
              pytest.mark.skipif(not native.available()[0], reason="native extension unavailable")]
KiB = 1 << 10
KEY = "/keys/zero_stage_3/optimizer/rank0/exp_avg-5.tensor.swp"


@pytest.fixture(scope="module")
def mount(tmp_path_factory):
    base = tmp_path_factory.mktemp("faultfs")
    backing = base / "backing"
    backing.mkdir()
    subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", str(backing / "region.bin"), "--size",
                    "64MiB", "--no-probe", "--yes"], check=True, capture_output=True)
    with faultfs.Mount(str(backing), str(base / "mnt")) as fs:
        yield fs


@pytest.fixture
def store(mount):
    from memascend_engine.direct_nvme import RegionStore

    mount.set_rules([])
    s = RegionStore(mount.path("region.bin"), 0, block_size=256 * KiB)
    yield s
    mount.set_rules([])
    s.close()


def _tensor(numel=64 * KiB, value=None):
    from memascend_engine.pinned import PinnedAllocator

    t = PinnedAllocator(lock=False).empty(numel, torch.float32)
    t.copy_(torch.randn(numel) if value is None else torch.full((numel,), float(value)))
    return t


def _io(store, op, t, key=KEY):
    store.complete(store.submit(op, t.data_ptr(), t.numel() * 4, store.key(key), 0))


def _extent_range(store, key=KEY):
    e = store.allocator.lookup(store.key(key))
    return [e.offset_bytes, e.end_bytes]


def test_read_eio_names_the_operation_key_extent_and_offset(mount, store):
    from memascend_engine.direct_nvme import RegionIOError

    t = _tensor()
    _io(store, "w", t)
    lo, hi = _extent_range(store)
    mount.set_rules([{"op": "read", "path": "region.bin", "offset": [lo + 128 * KiB, lo + 129 * KiB], "action": "eio"}])
    with pytest.raises(RegionIOError) as info:
        _io(store, "r", _tensor())
    msg = info.value.message
    assert msg.startswith(f"read of {256 * KiB} B at key offset 0 of swap key {KEY} (extent at device bytes "
                          f"{lo}..{hi - 1} of {mount.path('region.bin')}) failed: read of ")
    assert "Input/output error" in msg and info.value.op == "read" and info.value.errno == 5
    assert "offset=" in msg and "--resume" in info.value.hint
    assert mount.status()["fired"][0]["action"] == "eio"


@pytest.mark.parametrize("action, errno_text", [("eio", "Input/output error"), ("enospc", "No space left on device")])
def test_write_errors_are_named(mount, store, action, errno_text):
    from memascend_engine.direct_nvme import RegionIOError

    mount.set_rules([{"op": "write", "path": "region.bin", "offset": [1 << 20, 64 << 20], "action": action}])
    with pytest.raises(RegionIOError, match=rf"^write of {256 * KiB} B at key offset 0 of swap key {KEY} .*{errno_text}"):
        _io(store, "w", _tensor())


@pytest.mark.parametrize("backend", ["io_uring", "threads"])
@pytest.mark.parametrize("keep_bytes", [None, 64 * KiB])
def test_short_write_is_an_error_or_is_completed_never_silent(mount, backend, keep_bytes):
    """A server that stores fewer bytes than asked: the kernel reports a short count (thread
    backend: an aligned remainder is written by a second pwrite, an unaligned one is an error) or
    EIO (io_uring's async direct I/O). Either the write fails naming itself or every byte is there."""
    from memascend_engine.direct_nvme import RegionIOError, RegionStore

    store = RegionStore(mount.path("region.bin"), 0, block_size=256 * KiB, backend=backend)
    try:
        rule = {"op": "write", "path": "region.bin", "offset": [1 << 20, 64 << 20], "action": "short"}
        mount.set_rules([{**rule, "keep_bytes": keep_bytes} if keep_bytes else rule])
        t = _tensor()
        try:
            _io(store, "w", t)
        except RegionIOError as exc:
            assert exc.message.startswith(f"write of {256 * KiB} B at key offset 0 of swap key {KEY}")
            assert "short write of" in exc.message or "Input/output error" in exc.message
            outcome = "error"
            assert mount.status()["fired"]
        else:
            assert mount.status()["fired"]
            mount.set_rules([])
            out = _tensor(value=0)
            _io(store, "r", out)
            assert torch.equal(out, t)
            outcome = "completed"
        if keep_bytes is None and backend == "threads":
            assert outcome == "error"  # an unaligned remainder cannot be continued with O_DIRECT
    finally:
        mount.set_rules([])
        store.close()


@pytest.mark.parametrize("action", ["drop", "torn", "flip"])
def test_lost_torn_or_corrupted_writes_are_caught_on_the_next_read(mount, store, action):
    from memascend_engine.direct_nvme import RegionDataError

    mount.set_rules([{"op": "write", "path": "region.bin", "offset": [1 << 20, 64 << 20], "action": action}])
    _io(store, "w", _tensor())  # acknowledged in full
    assert [f["action"] for f in mount.status()["fired"]] == [action]
    with pytest.raises(RegionDataError) as info:
        _io(store, "r", _tensor(value=0))
    lo, hi = _extent_range(store)
    assert f"checksum mismatch reading swap key {KEY}: key bytes " in info.value.message
    assert f"(extent at device bytes {lo}..{hi - 1})" in info.value.message
    # drop: the first chunk differs; torn (half stored) and flip (middle byte): the chunk at 128 KiB.
    assert info.value.device_offset == lo + (0 if action == "drop" else 128 * KiB)


def test_bit_rot_on_the_read_path_is_caught(mount, store):
    from memascend_engine.direct_nvme import RegionDataError

    _io(store, "w", _tensor())
    mount.set_rules([{"op": "read", "path": "region.bin", "offset": [1 << 20, 64 << 20], "action": "flip"}])
    with pytest.raises(RegionDataError, match="checksum mismatch"):
        _io(store, "r", _tensor(value=0))
    _io(store, "r", _tensor(value=0))  # the next (clean) read of the same bytes verifies


def test_added_latency_only_slows_down(mount, store):
    t = _tensor()
    mount.set_rules([{"op": "read", "path": "region.bin", "offset": [1 << 20, 64 << 20], "action": "delay",
                      "delay_s": 0.2, "count": 2}])
    _io(store, "w", t)
    out = _tensor(value=0)
    t0 = time.monotonic()
    _io(store, "r", out)
    assert time.monotonic() - t0 >= 0.2 and torch.equal(out, t)


def test_region_file_truncated_under_the_store(mount, store):
    from memascend_engine.direct_nvme import RegionIOError

    _io(store, "w", _tensor())
    lo, _ = _extent_range(store)
    size = os.path.getsize(mount.path("region.bin"))
    os.truncate(os.path.join(mount.backing, "region.bin"), lo)  # cut off the whole data area of the extent
    try:
        with pytest.raises(RegionIOError, match=r"short read of .*transferred 0 of"):
            _io(store, "r", _tensor(value=0))
    finally:
        os.truncate(os.path.join(mount.backing, "region.bin"), size)
