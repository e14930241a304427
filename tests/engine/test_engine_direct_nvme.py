"""Direct NVMe handle and pinned allocator against a real region file (no DeepSpeed).

The region is a preallocated file on tmp_path, made by `memascend prepare-ssd` (the CLI path a
user takes); tmp_path must enforce O_DIRECT rules (ext4/xfs/btrfs), never tmpfs.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from memascend_engine import native

from memascend_cli.ssd import region as region_mod

OK, WHY = native.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"native extension unavailable: {WHY}")
MiB = 1 << 20
NO_DIO_RULES = {"tmpfs", "ramfs", "overlay", "9p", "nfs"}


def _fs_type(path: Path) -> str:
    real, best, kind = os.path.realpath(path), "", "unknown"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            mnt = left.split()[4]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, right.split()[0]
    return kind


def make_region(directory: Path, size: str = "64MiB", ranks: int = 1) -> str:
    """A region file made by the real `memascend prepare-ssd` (no bandwidth probe)."""
    kind = _fs_type(directory)
    if kind in NO_DIO_RULES or kind.startswith("fuse"):
        pytest.skip(f"{directory} is on {kind}, which does not enforce O_DIRECT rules")
    path = str(directory / "memascend.region")
    subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", path, "--size", size, "--ranks", str(ranks),
                    "--no-probe", "--yes"], check=True, capture_output=True, text=True)
    return path


@pytest.fixture
def store_and_handle(tmp_path):
    from memascend_engine.direct_nvme import RegionStore
    from memascend_engine.direct_nvme_aio import DirectNvmeBuilder
    from memascend_engine.pinned import PinnedAllocator

    store = RegionStore(make_region(tmp_path), 0)
    alloc = PinnedAllocator()
    handle = DirectNvmeBuilder(store, alloc)().load().aio_handle(block_size=MiB, queue_depth=8)
    yield store, handle, alloc
    store.close()


def test_roundtrip_aligned_goes_straight_to_the_region(store_and_handle):
    store, h, _ = store_and_handle
    src = h.new_cpu_locked_tensor(512 * 1024, torch.empty(0, dtype=torch.float32))
    assert h.is_pinned(src) and src.data_ptr() % 4096 == 0
    src.copy_(torch.arange(src.numel(), dtype=torch.float32))
    assert h.async_pwrite(src, "/keys/zero_stage_3/float32params/rank0/3_param.tensor.swp") == 0
    assert h.wait() == 1
    dst = h.new_cpu_locked_tensor(src.numel(), src)
    h.async_pread(dst, "/keys/zero_stage_3/float32params/rank0/3_param.tensor.swp")
    assert h.wait() == 1
    assert torch.equal(src, dst)
    s = store.snapshot()
    assert s["bytes_written"] == s["bytes_read"] == 2 * MiB
    assert s["engine_bytes_written"] == s["engine_bytes_read"] == 2 * MiB  # counted by the native engine
    assert s["bounce_bytes"] == 0
    # Where the caller's time went: blocked on each direction, computing and checking the CRC-32C.
    assert s["write_wait_s"] > 0 and s["read_wait_s"] > 0 and s["checksum_s"] > 0 and s["verify_s"] > 0
    ext = store.allocator.lookup(store.key("/keys/zero_stage_3/float32params/rank0/3_param.tensor.swp"))
    assert store.subregion.offset_bytes <= ext.offset_bytes < ext.end_bytes <= store.subregion.end_bytes
    # The bytes really are at the extent's offset of the region file.
    with open(store.region_path, "rb") as f:
        f.seek(ext.offset_bytes)
        assert f.read(16) == src[:4].numpy().tobytes()


def test_misaligned_address_and_length_are_bounced(store_and_handle):
    store, h, _ = store_and_handle
    base = torch.randn(300_001)
    view = base[1:]  # 4-byte aligned address, length 1,200,000 B (not a multiple of 512)
    h.sync_pwrite(view, "k/odd.swp")
    out = torch.empty(300_000)[0:]
    out2 = torch.zeros(300_001)[1:]
    h.sync_pread(out2, "k/odd.swp")
    assert torch.equal(out2, view)
    h.sync_pread(out, "k/odd.swp")
    assert torch.equal(out, view)
    assert store.snapshot()["bounce_bytes"] > 0


def test_unaligned_tail_with_aligned_address(store_and_handle):
    _, h, _ = store_and_handle
    t = h.new_cpu_locked_tensor(1000, torch.empty(0, dtype=torch.float32))  # 4000 B: 3584 body + 416 tail
    t.copy_(torch.randn(1000))
    h.async_pwrite(t, "tail.swp")
    h.wait()
    r = h.new_cpu_locked_tensor(1000, t)
    h.async_pread(r, "tail.swp")
    h.wait()
    assert torch.equal(r, t)


def test_unwritten_key_is_an_error_unless_declared_zero_and_short_read_is_refused(store_and_handle):
    from memascend_engine.direct_nvme import RegionDataError

    store, h, _ = store_and_handle
    t = torch.full((1024,), 7.0)
    with pytest.raises(RegionDataError, match=r"swap key never/written.swp \(no extent\): nothing was ever written"):
        h.sync_pread(t, "never/written.swp")
    store.declare_zero("adam/exp_avg-1.swp", 4096)
    h.sync_pread(t, "adam/exp_avg-1.swp")
    assert not t.any()
    assert store.snapshot()["zero_fill_reads"] == 1
    with pytest.raises(RegionDataError, match="declared as 4096 zero bytes, passes its end"):
        h.sync_pread(torch.empty(2048), "adam/exp_avg-1.swp")
    h.sync_pwrite(torch.ones(1024), "adam/exp_avg-1.swp")  # the first write ends the zero declaration
    h.sync_pread(t, "adam/exp_avg-1.swp")
    assert torch.equal(t, torch.ones(1024))
    h.sync_pwrite(torch.ones(1024), "short.swp")
    with pytest.raises(RegionDataError, match="holds only 4096 B written") as caught:
        h.sync_pread(torch.empty(2048), "short.swp")
    # A rank's error crosses to its parent process (multiprocessing pickles it) with its message and key.
    import pickle

    back = pickle.loads(pickle.dumps(caught.value))
    assert (type(back), str(back), back.key, back.hint) == (RegionDataError, str(caught.value), caught.value.key,
                                                            caught.value.hint)


def test_growing_a_key_reallocates(store_and_handle):
    store, h, _ = store_and_handle
    h.sync_pwrite(torch.ones(1024), "g.swp")
    h.sync_pwrite(torch.full((4096,), 2.0), "g.swp")
    out = torch.empty(4096)
    h.sync_pread(out, "g.swp")
    assert torch.equal(out, torch.full((4096,), 2.0))
    assert store.snapshot()["reallocations"] == 1


def test_exchange_hands_a_key_its_shadow_content_and_checksums(store_and_handle):
    """A shadow reserved at its key's length, written piece by piece in any order, becomes the key by an extent
    exchange (no I/O), and the old content stays readable, checksums and all, under the shadow's name."""
    store, h, _ = store_and_handle
    n = 3 * 16384  # three 64 KiB pieces
    h.sync_pwrite(torch.ones(n), "p.swp")
    key = store.key("p.swp")
    store.reserve(key + "~next", store.written_bytes(key))
    h.sync_pwrite(torch.zeros(n), key + "~next")  # the first full copy, as prepare_speculation makes it
    for piece in (2, 0):  # the next values of two pieces, out of order
        h.sync_pwrite(torch.full((16384,), float(piece + 2)), key + "~next", file_offset=piece * 16384 * 4)
    before = store.snapshot()["requests"]
    store.exchange(key, key + "~next")
    assert store.snapshot()["requests"] == before
    out = torch.empty(n)
    h.sync_pread(out, "p.swp")
    assert out[:16384].eq(2).all() and out[16384:32768].eq(0).all() and out[32768:].eq(4).all()
    h.sync_pread(out, key + "~next")
    assert out.eq(1).all()
    with pytest.raises(KeyError):
        store.exchange(key, "never-written")


def test_wait_counts_per_handle(store_and_handle):
    store, h, alloc = store_and_handle
    from memascend_engine.direct_nvme_aio import DirectNvmeHandle

    other = DirectNvmeHandle(store, alloc)
    bufs = [torch.full((1024,), float(i)) for i in range(3)]
    for i, b in enumerate(bufs):
        h.async_pwrite(b, f"w{i}.swp")
    other.async_pwrite(torch.zeros(1024), "x.swp")
    assert h.wait() == 3
    assert other.wait() == 1
    assert h.wait() == 0


def test_ranks_stay_in_their_own_subregion(tmp_path):
    from memascend_engine.direct_nvme import RegionStore
    from memascend_engine.direct_nvme_aio import DirectNvmeHandle
    from memascend_engine.pinned import PinnedAllocator

    path = make_region(tmp_path, "64MiB", ranks=2)
    alloc = PinnedAllocator()
    stores = [RegionStore(path, r) for r in (0, 1)]
    try:
        for r, store in enumerate(stores):
            handle = DirectNvmeHandle(store, alloc)
            handle.sync_pwrite(torch.full((256 * 1024,), float(r + 1)), "same/key.swp")  # same key on both ranks
        header = region_mod.read_header(path)
        for r, store in enumerate(stores):
            ext = store.allocator.lookup(store.key("same/key.swp"))
            sub = header.subregion(r)
            assert sub.offset_bytes <= ext.offset_bytes and ext.end_bytes <= sub.end_bytes
            out = torch.empty(256 * 1024)
            store.complete(store.submit("r", out.data_ptr(), out.numel() * 4, store.key("same/key.swp"), 0))
            assert torch.equal(out, torch.full_like(out, float(r + 1)))
    finally:
        for s in stores:
            s.close()


def test_rank_without_subregion_is_a_clear_error(tmp_path):
    from memascend_engine.direct_nvme import RegionStore

    from memascend_cli.errors import SSDNotReady

    with pytest.raises(SSDNotReady, match="no rank 1"):
        RegionStore(make_region(tmp_path), 1)


def test_pinned_allocator_is_exact_and_frees_with_the_last_view():
    from memascend_engine.pinned import PinnedAllocator

    alloc = PinnedAllocator()
    t = alloc.empty(1_000_001, torch.bfloat16)  # 2,000,002 B -> 489 pages, not 2 MiB (pow2 would be 2 MiB+)
    assert t.numel() == 1_000_001 and t.data_ptr() % 4096 == 0 and not t.any()
    snap = alloc.snapshot()
    assert snap["live_bytes"] == -(-2_000_002 // 4096) * 4096
    assert snap["requested_bytes"] == 2_000_002
    view = t[10:20]
    assert alloc.is_pinned(view) and not alloc.is_pinned(torch.empty(10))
    copy = alloc.pin(torch.arange(10, dtype=torch.float32).view(2, 5))
    assert copy.shape == (2, 5) and alloc.is_pinned(copy) and alloc.pin(copy) is copy
    del t
    gc.collect()
    assert alloc.snapshot()["live_buffers"] == 2  # the view keeps the first buffer alive
    del view, copy
    gc.collect()
    assert alloc.snapshot()["live_bytes"] == 0


def test_pinned_allocator_without_lock_is_still_aligned():
    from memascend_engine.pinned import PinnedAllocator

    alloc = PinnedAllocator(lock=False, cuda_register=False)
    t = alloc.empty(10, torch.float32)
    assert t.data_ptr() % 4096 == 0 and alloc.snapshot()["locked_bytes"] == 0


@pytest.mark.gpu
def test_cuda_registered_buffers_are_pinned_for_torch():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from memascend_engine.pinned import PinnedAllocator

    alloc = PinnedAllocator()
    t = alloc.empty(3_000_000, torch.float16)
    assert t.is_pinned(), native.cuda_runtime_status()
    assert alloc.snapshot()["cuda_registered_bytes"] == -(-6_000_000 // 4096) * 4096
    t.copy_(torch.randn(3_000_000).half())
    d = t.to("cuda", non_blocking=True)
    back = alloc.empty(3_000_000, torch.float16)
    back.copy_(d, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, t)


def test_gradient_stream_holds_running_sums_in_its_window_and_spills_the_rest(store_and_handle):
    """GradientStream.hold: sums that fit the DRAM window stay there (read back without SSD I/O, leaving the window),
    the rest go to the region; spill() writes every held sum, after which reads come from the region."""
    from memascend_cli.planner import zero
    from memascend_engine import bounded

    store, _, alloc = store_and_handle
    io = bounded.IOCounters()
    stream = bounded.GradientStream(store, alloc, zero.EngineWindows(gradient_slots=2, gradient_slot_bytes=MiB,
                                                                      accumulation_bytes=3 * MiB // 2), io)
    a, b = torch.full((MiB // 4,), 1.5), torch.arange(MiB // 4, dtype=torch.float32)
    stream.hold("g/a", a)
    a.zero_()  # the stream kept a copy (DeepSpeed reuses its bucket)
    stream.hold("g/b", b)  # 1 MiB more does not fit the 1.5 MiB window: to the region
    assert set(stream.held) == {"g/a"} and stream.held_bytes == MiB and io.gradient_held_bytes == MiB
    assert io.gradient_write_bytes == MiB and "g/b" in stream.written and "g/a" not in stream.written
    got = stream.read("g/a", MiB // 4, torch.float32, "cpu")
    assert torch.equal(got, torch.full((MiB // 4,), 1.5)) and stream.held_bytes == 0 and io.gradient_read_bytes == 0
    assert torch.equal(stream.read("g/b", MiB // 4, torch.float32, "cpu"), b) and io.gradient_read_bytes == MiB
    stream.hold("g/a", got.add_(1.0))
    stream.spill()
    stream.flush()
    assert not stream.held and stream.held_bytes == 0 and stream.written["g/a"] == MiB
    assert torch.equal(stream.read("g/a", MiB // 4, torch.float32, "cpu"), torch.full((MiB // 4,), 2.5))
    with pytest.raises(RuntimeError, match="holds"):
        stream.hold("g/c", torch.zeros(8))
        stream.read("g/c", 16, torch.float32, "cpu")
