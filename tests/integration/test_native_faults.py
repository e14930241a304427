"""The native engine's test-only fault hook (MEMASCEND_IO_FAULTS) on a loop-device region.

Root (loop devices). The hook sits on the engine's completion path, below the Direct NVMe store,
so it serves raw-device and loop-device regions that FUSE cannot hold. Each case checks the
store's named error; a rule with ``path=`` only touches engines on that device.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from memascend_engine import native

from tests.integration.test_prepare_ssd_loop import LoopDevice, _loop_skip_reason

pytestmark = [pytest.mark.root, pytest.mark.skipif(not native.available()[0], reason="native extension unavailable")]
KiB, MiB = 1 << 10, 1 << 20
KEY = "/keys/zero_stage_3/float32params/rank0/4_param.tensor.swp"


@pytest.fixture
def loop_region(tmp_path):
    """A 64 MiB loop device with 4 KiB sectors, prepared as a region; detached afterwards."""
    reason = _loop_skip_reason()
    if reason:
        pytest.skip(reason)
    loop = LoopDevice(str(tmp_path / "loop.img"), 64 * MiB, 4096)
    try:
        subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", loop.path, "--no-probe", "--yes"],
                       check=True, capture_output=True)
        yield loop.path
    finally:
        loop.close()


def _store(path, monkeypatch, faults, backend="auto"):
    from memascend_engine.direct_nvme import RegionStore

    monkeypatch.setenv("MEMASCEND_IO_FAULTS", faults)
    return RegionStore(path, 0, block_size=256 * KiB, backend=backend)


def _io(store, op, t):
    store.complete(store.submit(op, t.data_ptr(), t.numel() * 4, store.key(KEY), 0))


def _t(value=None):
    from memascend_engine.pinned import PinnedAllocator

    t = PinnedAllocator(lock=False).empty(128 * KiB, torch.float32)  # 512 KiB: two 256 KiB chunks
    t.copy_(torch.randn(t.numel()) if value is None else torch.full((t.numel(),), float(value)))
    return t


@pytest.mark.parametrize("backend", ["io_uring", "threads"])
def test_injected_read_eio_is_named(loop_region, monkeypatch, capfd, backend):
    from memascend_engine.direct_nvme import RegionIOError

    s = _store(loop_region, monkeypatch, f"op=read,kind=eio,after=1,path={os.path.basename(loop_region)}", backend)
    try:
        _io(s, "w", _t())
        with pytest.raises(RegionIOError) as info:
            _io(s, "r", _t(0))
        e = s.allocator.lookup(s.key(KEY))
        assert info.value.message.startswith(f"read of {512 * KiB} B at key offset 0 of swap key {KEY} (extent at "
                                             f"device bytes {e.offset_bytes}..{e.end_bytes - 1} of {loop_region})")
        assert f"offset={e.offset_bytes + 256 * KiB} length={256 * KiB}" in info.value.message  # the 2nd chunk
        assert "errno 5 (Input/output error)" in info.value.message
        assert "MEMASCEND_IO_FAULTS injects EIO into the read" in capfd.readouterr().err
    finally:
        s.close()


def test_injected_enospc_and_short_transfer(loop_region, monkeypatch):
    from memascend_engine.direct_nvme import RegionIOError

    s = _store(loop_region, monkeypatch, "op=write,kind=enospc;op=read,kind=short")
    try:
        with pytest.raises(RegionIOError, match=r"^write of .*errno 28 \(No space left on device\)"):
            _io(s, "w", _t())
        _io(s, "w", _t())  # count=1: the rule fired once
        with pytest.raises(RegionIOError, match=r"^read of .*short read of .*transferred 131072 of 262144 bytes"):
            _io(s, "r", _t(0))
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["drop", "flip"])
def test_dropped_write_and_read_bit_flip_fail_the_checksum(loop_region, monkeypatch, kind):
    from memascend_engine.direct_nvme import RegionDataError

    faults = "op=write,kind=drop,after=1" if kind == "drop" else "op=read,kind=flip"
    s = _store(loop_region, monkeypatch, faults)
    try:
        _io(s, "w", _t())
        with pytest.raises(RegionDataError, match=f"checksum mismatch reading swap key {KEY}") as info:
            _io(s, "r", _t(0))
        e = s.allocator.lookup(s.key(KEY))
        # drop: the second 256 KiB chunk never reached the device; flip: the middle of the first chunk.
        assert info.value.device_offset == e.offset_bytes + (256 * KiB if kind == "drop" else 128 * KiB)
    finally:
        s.close()


def test_rules_are_off_without_the_variable_and_bad_specs_are_refused(loop_region, monkeypatch):
    monkeypatch.delenv("MEMASCEND_IO_FAULTS", raising=False)
    eng = native.IOEngine(loop_region, writable=False)
    eng.close()
    monkeypatch.setenv("MEMASCEND_IO_FAULTS", "op=read,kind=melt")
    with pytest.raises(ValueError, match="unknown kind 'melt'"):
        native.IOEngine(loop_region, writable=False)
