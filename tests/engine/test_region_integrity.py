"""CRC-32C of the native core and the Direct NVMe store's checksums against real corruption.

Corruption is made the way it happens: bytes of the region file changed behind the store's back
(a flipped bit, a write that never reached the device, a misdirected write), then read through the
store. The region is a prepare-ssd file on tmp_path (ext4/xfs/btrfs; tmpfs is skipped).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest

torch = pytest.importorskip("torch")
from memascend_engine import native

OK, WHY = native.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"native extension unavailable: {WHY}")
KiB, MiB = 1 << 10, 1 << 20
KEY = "/keys/zero_stage_3/optimizer/rank0/exp_avg-7.tensor.swp"


def test_crc32c_matches_rfc3720_vectors_on_both_backends():
    # RFC 3720 B.4 test vectors, and the classic "123456789" check value.
    vectors = {bytes(32): 0x8A9136AA, b"\xff" * 32: 0x62A8AB43, bytes(range(32)): 0x46DD794E,
               bytes(range(31, -1, -1)): 0x113FDB5C, b"123456789": 0xE3069283}
    code = ("from memascend_engine import native as n; import sys; vs = eval(sys.argv[1]); "
            "print(n.crc32c_backend(), all(n.crc32c(k) == v for k, v in vs.items()))")
    seen = set()
    for env in ({}, {"MEMASCEND_CRC32C": "portable"}):
        out = subprocess.run([sys.executable, "-c", code, repr(vectors)], capture_output=True, text=True,
                             env={**os.environ, **env}, check=True).stdout.split()
        assert out[1] == "True", out
        seen.add(out[0])
    assert "portable" in seen
    assert native.crc32c_backend() in ("sse4.2", "portable")


def test_chunks_over_segments_equal_the_concatenation():
    data = os.urandom(300 * KiB + 123)
    bufs = [native.AlignedBuffer(n, lock=False) for n in (100 * KiB, 4 * KiB, 196 * KiB + 123)]
    pos = 0
    for b in bufs:
        memoryview(b)[:] = data[pos:pos + b.nbytes]
        pos += b.nbytes
    got = native.crc32c_chunks([(b.address, b.nbytes) for b in bufs], 64 * KiB)
    want = b"".join(native.crc32c(data[i:i + 64 * KiB]).to_bytes(4, "little") for i in range(0, len(data), 64 * KiB))
    assert got == want and len(got) == 4 * 5
    # Incremental continuation equals one pass.
    assert native.crc32c(data[1000:], native.crc32c(data[:1000])) == native.crc32c(data)
    assert native.crc32c(data) != zlib.crc32(data)  # Castagnoli, not the zlib polynomial


@pytest.fixture
def store(tmp_path):
    from memascend_engine.direct_nvme import RegionStore
    from test_engine_direct_nvme import make_region

    s = RegionStore(make_region(tmp_path), 0)
    yield s
    s.close()


def _write(store, tensor, key=KEY, offset=0):
    store.complete(store.submit("w", tensor.data_ptr(), tensor.numel() * tensor.element_size(), store.key(key), offset))


def _read(store, tensor, key=KEY, offset=0):
    store.complete(store.submit("r", tensor.data_ptr(), tensor.numel() * tensor.element_size(), store.key(key), offset))


def _pinned(numel, alloc=None):
    from memascend_engine.pinned import PinnedAllocator

    return (alloc or PinnedAllocator(lock=False)).empty(numel, torch.float32)


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))
        f.flush()
        os.fsync(f.fileno())


def test_flipped_byte_is_reported_with_key_chunk_and_device_offset(store):
    from memascend_engine.direct_nvme import RegionDataError

    src = _pinned(MiB // 4)
    src.copy_(torch.randn(src.numel()))
    _write(store, src)
    ext = store.allocator.lookup(store.key(KEY))
    victim = ext.offset_bytes + 200 * KiB + 5  # inside chunk 3 (192..256 KiB)
    _flip(store.region_path, victim)
    dst = _pinned(src.numel())
    with pytest.raises(RegionDataError) as info:
        _read(store, dst)
    msg = info.value.message
    chunk_dev = ext.offset_bytes + 192 * KiB
    assert f"checksum mismatch reading swap key {KEY}: key bytes {192 * KiB}..{256 * KiB - 1}" in msg
    assert f"device bytes {chunk_dev}..{chunk_dev + 64 * KiB - 1} of {store.region_path}" in msg
    assert f"extent at device bytes {ext.offset_bytes}..{ext.end_bytes - 1}" in msg
    assert info.value.device_offset == chunk_dev <= victim < chunk_dev + 64 * KiB
    assert "--resume" in info.value.hint
    # Flip it back: the same read verifies again (nothing is cached).
    _flip(store.region_path, victim)
    _read(store, dst)
    assert torch.equal(dst, src)


def test_partial_reads_verify_whole_chunks(store):
    """A read of a sub-range (DeepSpeed-style file offsets) verifies the chunks it touches, reading
    the rest of its first and last chunk; damage outside those chunks is not its business."""
    from memascend_engine.direct_nvme import RegionDataError

    src = _pinned(MiB // 4)
    src.copy_(torch.arange(src.numel(), dtype=torch.float32))
    _write(store, src)
    ext = store.allocator.lookup(store.key(KEY))
    part = _pinned(2 * KiB)  # 8 KiB at key offset 128 KiB: inside chunk 2, neither end on a chunk boundary
    _read(store, part, offset=128 * KiB)
    assert torch.equal(part, src[32 * KiB: 32 * KiB + 2 * KiB])
    assert store.snapshot()["widened_read_bytes"] == 64 * KiB - 8 * KiB
    _flip(store.region_path, ext.offset_bytes + 128 * KiB + 60 * KiB)  # same chunk, outside the 8 KiB read
    with pytest.raises(RegionDataError, match=rf"key bytes {128 * KiB}\.\.{192 * KiB - 1}"):
        _read(store, part, offset=128 * KiB)
    _read(store, part, offset=64 * KiB)  # chunk 1 is intact


def test_lost_and_misdirected_writes_are_caught(store):
    """A write acknowledged but never stored (old bytes remain), or one that landed at another
    extent's offset, reads back with the wrong checksum."""
    from memascend_engine.direct_nvme import RegionDataError

    a, b = _pinned(64 * KiB), _pinned(64 * KiB)
    a.fill_(1.0)
    b.fill_(2.0)
    _write(store, a, key="k/a.swp")
    _write(store, b, key="k/b.swp")
    ea, eb = (store.allocator.lookup(store.key(k)) for k in ("k/a.swp", "k/b.swp"))
    with open(store.region_path, "rb") as f:
        f.seek(ea.offset_bytes)
        old_a = f.read(256 * KiB)
    a.fill_(3.0)
    _write(store, a, key="k/a.swp")  # the store now expects 3.0 ...
    with open(store.region_path, "r+b") as f:  # ... but the device "lost" the write
        f.seek(ea.offset_bytes)
        f.write(old_a)
        f.seek(eb.offset_bytes)  # and a misdirected copy of a's new data overwrote b
        f.write(a.numpy().tobytes())
    out = _pinned(64 * KiB)
    with pytest.raises(RegionDataError, match="k/a.swp"):
        _read(store, out, key="k/a.swp")
    with pytest.raises(RegionDataError, match="k/b.swp"):
        _read(store, out, key="k/b.swp")


def test_bounced_tails_and_misaligned_buffers_are_checksummed(store):
    from memascend_engine.direct_nvme import RegionDataError

    base = torch.randn(300_001)
    view = base[1:]  # misaligned address, 1,200,000 B: bounced whole
    _write(store, view, key="odd.swp")
    out = torch.zeros(300_001)[1:]
    _read(store, out, key="odd.swp")
    assert torch.equal(out, view)
    ext = store.allocator.lookup(store.key("odd.swp"))
    _flip(store.region_path, ext.offset_bytes + 1_199_990)  # in the padded last chunk
    with pytest.raises(RegionDataError, match=r"key bytes 1179648\.\.1200127"):
        _read(store, out, key="odd.swp")


def test_rewrite_replaces_checksums_and_shorter_rewrite_ends_the_key(store):
    from memascend_engine.direct_nvme import RegionDataError

    t = _pinned(64 * KiB)  # 256 KiB
    t.fill_(1.0)
    _write(store, t)
    t.fill_(2.0)
    _write(store, t)
    out = _pinned(64 * KiB)
    _read(store, out)
    assert torch.equal(out, t)
    short = _pinned(10 * KiB)  # 40 KiB: ends inside chunk 0
    short.fill_(5.0)
    _write(store, short)
    _read(store, _pinned(10 * KiB))
    with pytest.raises(RegionDataError, match="holds only 40960 B written"):
        _read(store, out)
    with pytest.raises(ValueError, match="multiple of the checksum chunk"):
        _write(store, short, offset=4096)
    with pytest.raises(ValueError, match="would leave a hole"):
        _write(store, short, offset=128 * KiB)


def test_verification_switch_off_reads_corrupt_data_silently(tmp_path, monkeypatch):
    """MEMASCEND_VERIFY_CHECKSUMS=0 (benchmarking only) really skips the checks: that is its cost."""
    from memascend_engine.direct_nvme import RegionStore
    from test_engine_direct_nvme import make_region

    monkeypatch.setenv("MEMASCEND_VERIFY_CHECKSUMS", "0")
    s = RegionStore(make_region(tmp_path), 0)
    try:
        assert s.verify is False
        src = _pinned(16 * KiB)
        src.fill_(1.0)
        _write(s, src)
        _flip(s.region_path, s.allocator.lookup(s.key(KEY)).offset_bytes)
        out = _pinned(16 * KiB)
        _read(s, out)
        assert not torch.equal(out, src)
        assert s.snapshot()["verified_bytes"] == 0
    finally:
        s.close()


def test_region_file_deleted_under_an_open_store_keeps_working(store):
    """Unlinking the region file ends no open descriptor: the store's data stays readable and
    verified until it closes (the space is freed then); a new file at that path is another region."""
    src = _pinned(64 * KiB)
    src.copy_(torch.randn(src.numel()))
    _write(store, src)
    os.unlink(store.region_path)
    out = _pinned(64 * KiB)
    _read(store, out)
    assert torch.equal(out, src)
    _write(store, src, key="k/after-unlink.swp")
    _read(store, out, key="k/after-unlink.swp")
    assert torch.equal(out, src)
