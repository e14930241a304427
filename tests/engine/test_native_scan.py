"""Fused non-finite scan vs torch.isinf(x).any() or torch.isnan(x).any()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc

import pytest
from memascend_engine import native

OK, WHY = native.available()
if not OK and os.environ.get("MEMASCEND_REQUIRE_NATIVE") == "1":
    raise RuntimeError(WHY)
pytestmark = pytest.mark.skipif(not OK, reason=f"native extension unavailable: {WHY}")
torch = pytest.importorskip("torch", reason="the scan is checked against torch")

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
SPECIALS = [float("inf"), float("-inf"), float("nan")]
# Around the vector widths (8-32 lanes) and the 16384-element block, plus sizes that go multi-threaded.
SIZES = [1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1023, 16383, 16384, 16385, 49157]
BIG = (1 << 21) + 37  # > 1M elements per thread for 2 threads; odd tail


def reference(x: torch.Tensor) -> bool:
    return bool(torch.isinf(x).any() or torch.isnan(x).any())


def positions(n: int) -> list[int]:
    """First, last, middle, inside the unaligned tail, and around the 16384-element block edge."""
    pos = {0, n - 1, n // 2, max(0, n - 3), min(n - 1, n - (n % 64) + (n % 64) // 2)}
    pos |= {p for p in (16383, 16384, 16385) if p < n}
    return sorted(pos)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_and_finite(dtype: torch.dtype) -> None:
    assert native.has_nonfinite(0, 0, str(dtype)) is False
    x = torch.empty(0, dtype=dtype)
    assert native.has_nonfinite_tensor(x) is False
    for n in SIZES + [BIG]:
        x = torch.randn(n).to(dtype) * 100
        assert native.has_nonfinite_tensor(x) is False


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_single_special_at_every_interesting_position(dtype: torch.dtype, n: int) -> None:
    base = torch.randn(n).to(dtype)
    for value in SPECIALS:
        for p in positions(n):
            x = base.clone()
            x[p] = value
            assert native.has_nonfinite_tensor(x) is True, (value, p)
            assert reference(x) is True


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_threads", [0, 1, 2, 5])
def test_multithreaded_large(dtype: torch.dtype, num_threads: int) -> None:
    base = torch.randn(BIG).to(dtype)
    assert native.has_nonfinite_tensor(base, num_threads) is False
    for value in SPECIALS:
        for p in positions(BIG) + [BIG // 4, 3 * BIG // 4, (1 << 20) - 1, 1 << 20]:
            x = base.clone()
            x[p] = value
            assert native.has_nonfinite_tensor(x, num_threads) is True, (value, p)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unaligned_start(dtype: torch.dtype) -> None:
    """A view starting one element in (address not vector-aligned) with a special in its last element."""
    storage = torch.randn(4099).to(dtype)
    for off in (1, 2, 3):
        x = storage[off:]
        assert x.data_ptr() % 32 != 0 or off == 0
        assert native.has_nonfinite_tensor(x) is False
        storage[-1] = float("nan")
        assert native.has_nonfinite_tensor(x) is True
        storage[-1] = 0.0
        storage[off] = float("-inf")
        assert native.has_nonfinite_tensor(x) is True
        assert native.has_nonfinite_tensor(storage[off + 1 :]) is False  # just outside the view
        storage[off] = 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_all_16bit_patterns_match_torch(dtype: torch.dtype) -> None:
    """Every one of the 65536 bit patterns, alone, classified like torch does."""
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype).contiguous()
    expected = (torch.isinf(x) | torch.isnan(x)).tolist()
    addr, esize = x.data_ptr(), x.element_size()
    got = [native.has_nonfinite(addr + i * esize, 1, dtype) for i in range(x.numel())]
    assert got == expected
    assert sum(expected) == (2048 if dtype == torch.float16 else 256)  # 2 signs x 2^mantissa_bits (10 or 7)


def test_float32_edge_patterns() -> None:
    cases = {
        0x7F800000: True,  # +inf
        0xFF800000: True,  # -inf
        0x7FC00000: True,  # quiet nan
        0x7F800001: True,  # signalling nan
        0xFFFFFFFF: True,  # negative nan, full payload
        0x7F7FFFFF: False,  # max finite
        0xFF7FFFFF: False,
        0x00000001: False,  # smallest subnormal
        0x80000000: False,  # -0.0
        0x00000000: False,
    }
    for bits, want in cases.items():
        t = torch.tensor([bits - (1 << 32) if bits >= 1 << 31 else bits], dtype=torch.int32).view(torch.float32)
        assert native.has_nonfinite_tensor(t) is want, hex(bits)
        assert reference(t) is want, hex(bits)


def test_random_mixtures_match_torch() -> None:
    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        dtype = DTYPES[trial % 3]
        n = int(torch.randint(1, 70000, (1,), generator=g))
        x = torch.randn(n, generator=g).to(dtype)
        if trial % 2:
            k = int(torch.randint(0, n, (1,), generator=g))
            x[k] = SPECIALS[trial % 3]
        assert native.has_nonfinite_tensor(x) is reference(x)


def test_argument_errors() -> None:
    x = torch.zeros(16, dtype=torch.float16)
    with pytest.raises(ValueError, match="aligned to the element size"):
        native.has_nonfinite(x.data_ptr() + 1, 4, "float16")
    with pytest.raises(ValueError, match="unsupported dtype"):
        native.has_nonfinite(x.data_ptr(), 4, "int8")
    with pytest.raises(ValueError, match="null address"):
        native.has_nonfinite(0, 4, "float32")
    with pytest.raises(ValueError, match="contiguous"):
        native.has_nonfinite_tensor(torch.zeros(8, 8, dtype=torch.float32).t())
    with pytest.raises(ValueError, match="supports"):
        native.has_nonfinite_tensor(torch.zeros(8, dtype=torch.float64))
    for alias in ("half", "fp16", "torch.float16"):
        assert native.has_nonfinite(x.data_ptr(), 16, alias) is False


def test_no_python_allocation() -> None:
    x = torch.zeros(1 << 22, dtype=torch.float16)
    native.has_nonfinite_tensor(x)  # warm up lazy imports/caches
    tracemalloc.start()
    try:
        native.has_nonfinite_tensor(x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"Python-level peak {peak} B"


def test_no_allocation_proportional_to_n() -> None:
    """Peak RSS (VmHWM, reset via clear_refs) while scanning 64M fp16 elements stays flat.

    torch.isinf would add 3 bytes per element (192 MiB) here; the scan must add ~nothing beyond
    thread stacks. Runs in a child so that other tests' memory does not interfere.
    """
    code = textwrap.dedent(
        """
        import json, torch
        from memascend_engine import native
        from memascend_engine.procfs import status_kib as kib
        torch.set_num_threads(2)
        x = torch.zeros(64 << 20, dtype=torch.float16)
        x[-1] = float("inf")
        native.has_nonfinite_tensor(x, 2)  # warm up (thread creation, lazy init)
        def measure(fn):
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError as e:
                return None
            base = kib("VmRSS")
            r = fn()
            return kib("VmHWM") - base, r
        scan = measure(lambda: native.has_nonfinite_tensor(x, 2))
        ref = measure(lambda: bool(torch.isinf(x).any() or torch.isnan(x).any()))
        print(json.dumps({"scan": scan, "torch": ref}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["scan"] is None:
        pytest.skip("cannot reset peak RSS (/proc/self/clear_refs not writable)")
    scan_kib, found = res["scan"]
    torch_kib, torch_found = res["torch"]
    assert found is True and torch_found is True
    assert scan_kib < 4 * 1024, f"scan raised peak RSS by {scan_kib} KiB"
    assert torch_kib > 100 * 1024, f"reference sanity: torch added only {torch_kib} KiB"
