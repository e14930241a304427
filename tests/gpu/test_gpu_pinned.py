"""The engine's exact-size pinned buffers on CUDA (engine/pinned.py, csrc/buffers.cpp). Marker gpu.

torch's CachingHostAllocator rounds each pinned request up to a power of two
(c10::llvm::PowerOf2Ceil in aten/src/ATen/core/CachingHostAllocator.h); the
engine maps exactly the request rounded to the page and cudaHostRegisters it. These tests measure both
on a real GPU: bytes really reserved (torch.cuda.host_memory_stats), copy bandwidth from and to the
engine's buffers against torch's pinned tensors, that a buffer freed while a non_blocking copy is in
flight waits for it, and the fused non-finite scan on what the GPU copied into host buffers.
"""

from __future__ import annotations

import gc
import time

import pytest

torch = pytest.importorskip("torch")

from memascend_engine import native
from memascend_engine.pinned import PinnedAllocator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
MiB = 1 << 20
PAGE = 4096


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _torch_host_reserved() -> int:
    """Bytes torch's pinned allocator holds from CUDA (active + cached blocks, rounded sizes)."""
    stats = torch.cuda.host_memory_stats()
    for key in ("allocated_bytes.current", "reserved_bytes.current"):
        if key in stats:
            return int(stats[key])
    raise AssertionError(f"torch.cuda.host_memory_stats() has no byte counter: {sorted(stats)}")


def _empty_torch_host_cache() -> None:
    for fn in (getattr(torch.accelerator, "empty_host_cache", None), getattr(torch._C, "_host_emptyCache", None)):
        if fn is not None:
            fn()
            return


def _vmlck_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.fixture(scope="module", autouse=True)
def _cuda_ready():
    ok, why = native.available()
    assert ok, why  # on a GPU machine the native core must be built (pip install -e .)
    torch.cuda.init()  # the dlopen'ed runtime shares torch's primary context
    yield
    torch.cuda.synchronize()


@pytest.mark.parametrize("nbytes", [3_000_001, 48 * MiB + 4096, 200_000_000])
def test_exact_size_against_torch_pinned_allocator(nbytes):
    gc.collect()
    _empty_torch_host_cache()
    before = _torch_host_reserved()
    t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    torch_reserved = _torch_host_reserved() - before
    assert t.is_pinned()
    # What torch really reserved from CUDA: the next power of two (the waste the engine removes).
    assert torch_reserved == _next_pow2(nbytes), (torch_reserved, nbytes)

    alloc = PinnedAllocator()
    locked_before, torch_before = _vmlck_bytes(), _torch_host_reserved()
    e = alloc.empty(nbytes, torch.uint8)
    snap = alloc.snapshot()
    assert e.is_pinned(), alloc.first_cuda_error or native.cuda_runtime_status()
    assert snap["live_bytes"] == snap["cuda_registered_bytes"] == _align(nbytes, PAGE)
    assert snap["requested_bytes"] == nbytes
    if snap["locked_bytes"]:  # root / enough RLIMIT_MEMLOCK: the kernel's own count agrees
        assert _vmlck_bytes() - locked_before == _align(nbytes, PAGE)
    assert _torch_host_reserved() == torch_before  # the engine's buffer is not torch's
    assert _align(nbytes, PAGE) < torch_reserved or nbytes == _next_pow2(nbytes)
    del t, e
    gc.collect()
    assert alloc.snapshot()["live_bytes"] == 0


def _copy_gbps(src, dst, repeats: int = 12) -> float:
    """Best-of median bandwidth of dst.copy_(src, non_blocking=True), timed with CUDA events."""
    stream = torch.cuda.current_stream()
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        dst.copy_(src, non_blocking=True)
        b.record(stream)
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return src.numel() * src.element_size() / times[len(times) // 2] / 1e9


def test_register_round_trip_and_bandwidth_against_torch_pinned():
    n = 256 * MiB // 4
    alloc = PinnedAllocator()
    eng = alloc.empty(n, torch.float32)
    assert eng.is_pinned() and alloc.snapshot()["cuda_registered_bytes"] == n * 4
    ref = torch.empty(n, dtype=torch.float32, pin_memory=True)
    dev = torch.empty(n, dtype=torch.float32, device="cuda")
    # Round trip through the registered buffer.
    eng.copy_(torch.arange(n, dtype=torch.float32))
    dev.copy_(eng, non_blocking=True)
    back = alloc.empty(n, torch.float32)
    back.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, eng)
    h2d_eng, h2d_ref = _copy_gbps(eng, dev), _copy_gbps(ref, dev)
    d2h_eng, d2h_ref = _copy_gbps(dev, eng), _copy_gbps(dev, ref)
    print(f"H2D engine {h2d_eng:.1f} GB/s, torch pinned {h2d_ref:.1f}; D2H engine {d2h_eng:.1f}, torch {d2h_ref:.1f}")
    assert h2d_eng >= 0.9 * h2d_ref, (h2d_eng, h2d_ref)
    assert d2h_eng >= 0.9 * d2h_ref, (d2h_eng, d2h_ref)


def test_freeing_a_buffer_waits_for_its_inflight_copy():
    n = 64 * MiB // 4
    alloc = PinnedAllocator()
    dev = torch.full((n,), 7.0, device="cuda")
    host = alloc.empty(n, torch.float32)
    syncs = native.cuda_close_syncs()
    torch.cuda._sleep(1_000_000_000)  # 0.5-3 s of GPU time (clock-dependent) queued ahead of the copy
    host.copy_(dev, non_blocking=True)  # D2H into the engine buffer, behind the sleep
    done = torch.cuda.Event()
    done.record()
    assert not done.query(), "the copy must still be queued when the buffer is released"
    t0 = time.perf_counter()
    del host  # last view: the buffer closes now (munmap), which must wait for the DMA first
    gc.collect()
    waited_s = time.perf_counter() - t0
    assert done.query(), "the buffer was unmapped while a copy into it was still in flight"
    assert native.cuda_close_syncs() == syncs + 1
    assert alloc.snapshot()["live_buffers"] == 0
    assert waited_s > 0.05
    torch.cuda.synchronize()
    assert torch.cuda.current_stream().query()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fused_scan_sees_what_the_gpu_copied_into_host_buffers(dtype):
    n = 50_000_003
    alloc = PinnedAllocator()
    host = alloc.empty(n, dtype)
    dev = torch.randn(n, device="cuda").to(dtype)
    for bad, index in ((float("inf"), n - 1), (float("nan"), 12_345), (float("-inf"), 0), (None, None)):
        d = dev.clone()
        if bad is not None:
            d[index] = bad
        host.copy_(d, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        expected = not bool(torch.isfinite(d).all())
        assert native.has_nonfinite_tensor(host) is expected, (dtype, bad)
    # A device-resident buffer is not the scan's: it refuses it, and the engine's has_overflow then
    # keeps DeepSpeed's own check for it (memascend_engine.ds_internals.stage3 _OptimizerTechniques.has_overflow).
    with pytest.raises(ValueError, match="CPU tensor"):
        native.has_nonfinite_tensor(dev)
