"""AlignedBuffer: exact-size page-aligned memory, mlock fallback, CUDA registration, torch views."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from memascend_engine import native

OK, WHY = native.available()
if not OK and os.environ.get("MEMASCEND_REQUIRE_NATIVE") == "1":
    raise RuntimeError(WHY)
pytestmark = pytest.mark.skipif(not OK, reason=f"native extension unavailable: {WHY}")

PAGE = os.sysconf("SC_PAGESIZE")


@pytest.mark.parametrize("nbytes", [1, 4095, 4096, 3 * 4096 + 1, 1 << 20])
def test_page_aligned_exact_size(nbytes: int) -> None:
    with native.AlignedBuffer(nbytes, lock=False) as buf:
        assert buf.address % PAGE == 0 and buf.address % 4096 == 0
        assert buf.nbytes == len(buf) == nbytes
        # Rounded to the page only (no power-of-two growth as in torch's pinned allocator).
        assert buf.mapped_bytes == -(-nbytes // PAGE) * PAGE
        mv = memoryview(buf)
        assert mv.nbytes == nbytes and not mv.readonly and mv.format == "B"
        assert bytes(mv) == bytes(nbytes)  # zero-filled
        mv[-1] = 7
        assert bytes(memoryview(buf))[-1] == 7
        del mv


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return "absent"
    return text[text.index("[") + 1 : text.index("]")]


def _smaps_field(address: int, field: str) -> int:
    """kB of `field` for the mapping containing `address`."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


def test_huge_pages_exact_size_and_no_rss_bloat() -> None:
    nbytes = 5 * (2 << 20) + 4096 + 1  # 2 MiB multiples plus an odd tail
    with native.AlignedBuffer(nbytes, lock=False, zero=True) as buf:
        assert buf.address % (2 << 20) == 0, "mappings of >= 2 MiB start on a huge-page boundary"
        assert buf.mapped_bytes == -(-nbytes // PAGE) * PAGE
        assert _smaps_field(buf.address, "Rss") * 1024 == buf.mapped_bytes  # populated, and nothing more
        if _thp_mode() in ("always", "madvise"):
            assert buf.huge_pages
        if buf.huge_pages and _smaps_field(buf.address, "AnonHugePages") == 0:
            pytest.skip("MADV_HUGEPAGE accepted but the kernel gave no huge pages (fragmented memory?)")
    with native.AlignedBuffer(1 << 20, lock=False) as small:
        assert not small.huge_pages  # below 2 MiB there is no huge page to gain
    with native.AlignedBuffer(4 << 20, lock=False, huge_pages=False) as plain:
        assert not plain.huge_pages


def test_zero_false_is_still_usable() -> None:
    with native.AlignedBuffer(1 << 20, lock=False, zero=False) as buf:
        memoryview(buf)[:4] = b"abcd"
        assert bytes(memoryview(buf)[:4]) == b"abcd"


def test_lock_succeeds_or_says_why() -> None:
    with native.AlignedBuffer(1 << 20, lock=True) as buf:
        assert buf.locked or ("mlock" in buf.lock_error and "RLIMIT_MEMLOCK" in buf.lock_error)
    with native.AlignedBuffer(4096, lock=False) as buf:
        assert not buf.locked and buf.lock_error is None


def test_lock_fallback_when_rlimit_memlock_too_small() -> None:
    """In a child without CAP_IPC_LOCK and with a 64 KiB RLIMIT_MEMLOCK, mlock must fail softly."""
    code = textwrap.dedent(
        """
        import json, resource
        from memascend_engine import native
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, 65536))
        cap_eff = int([l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1], 16)
        buf = native.AlignedBuffer(4 << 20, lock=True)
        mv = memoryview(buf); mv[:3] = b"xyz"  # still usable
        print(json.dumps({"locked": buf.locked, "lock_error": buf.lock_error,
                          "ipc_lock": bool(cap_eff >> 14 & 1), "aligned": buf.address % 4096 == 0}))
        """
    )
    cmd = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        # root has CAP_IPC_LOCK, which ignores RLIMIT_MEMLOCK: drop it for the child.
        if shutil.which("setpriv") is None:
            pytest.skip("running as root and setpriv (util-linux) is missing: cannot drop CAP_IPC_LOCK")
        cmd = ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--"] + cmd
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["ipc_lock"]:
        pytest.skip("child still has CAP_IPC_LOCK; cannot force the mlock fallback")
    assert res["aligned"] and res["locked"] is False
    assert "mlock" in res["lock_error"] and "RLIMIT_MEMLOCK soft limit 0.1 MiB" in res["lock_error"], res


def test_close_refuses_live_views_and_is_idempotent() -> None:
    buf = native.AlignedBuffer(8192, lock=False)
    mv = memoryview(buf)
    with pytest.raises(BufferError, match="exported view"):
        buf.close()
    mv.release()
    buf.close()
    buf.close()
    assert buf.closed
    with pytest.raises(BufferError, match="closed"):
        memoryview(buf)
    with pytest.raises(ValueError, match="closed"):
        _ = buf.address


def test_available_reports_a_missing_extension() -> None:
    """Without the compiled module, importing native still works and available() says why."""
    code = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "memascend_engine._native":
                    raise ImportError("blocked for the test")
        sys.meta_path.insert(0, Block())
        from memascend_engine import native
        ok, why = native.available()
        assert ok is False and "blocked for the test" in why and "pip install" in why, why
        try:
            native.IOEngine
        except ImportError as e:
            assert "blocked for the test" in str(e)
        else:
            raise AssertionError("IOEngine resolved without the extension")
        print("OK")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr


def test_invalid_size() -> None:
    with pytest.raises(ValueError, match="nbytes > 0"):
        native.AlignedBuffer(0)


def test_cuda_register_without_cuda_reports_reason() -> None:
    torch = pytest.importorskip("torch", reason="torch decides whether CUDA is present")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here; covered by test_cuda_host_register_gpu")
    with native.AlignedBuffer(1 << 20, cuda_register=True) as buf:
        assert buf.cuda_registered is False
        assert isinstance(buf.cuda_error, str) and buf.cuda_error, "a reason must be reported"
        assert "CUDA" in buf.cuda_error or "cuda" in buf.cuda_error
        # The buffer itself is fine.
        memoryview(buf)[:2] = b"ok"
    assert "unavailable" in native.cuda_runtime_status()


@pytest.mark.gpu
def test_cuda_host_register_gpu() -> None:
    torch = pytest.importorskip("torch", reason="needs torch with CUDA")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.cuda.init()  # share torch's context with the dlopen'ed runtime
    buf = native.AlignedBuffer(8 << 20, cuda_register=True)
    assert buf.cuda_registered, buf.cuda_error
    t = native.as_tensor(buf, torch.float32)
    assert t.is_pinned()
    t.copy_(torch.arange(t.numel(), dtype=torch.float32))
    g = t.to("cuda", non_blocking=True)
    back = torch.empty_like(t)
    back.copy_(g)
    torch.cuda.synchronize()
    assert torch.equal(back, t)
    del t, g
    gc.collect()
    buf.close()  # cudaHostUnregister + munmap


def test_as_tensor_is_a_zero_copy_view() -> None:
    torch = pytest.importorskip("torch", reason="as_tensor builds torch tensors")
    buf = native.AlignedBuffer(1 << 20, lock=False)
    t = native.as_tensor(buf, torch.float16, (512, 1024))
    assert t.shape == (512, 1024) and t.dtype == torch.float16 and t.data_ptr() == buf.address
    t[0, 0] = 1.0
    assert bytes(memoryview(buf)[:2]) == torch.tensor([1.0], dtype=torch.float16).numpy().tobytes()
    whole = native.as_tensor(buf, "float32")
    assert whole.numel() == (1 << 20) // 4
    part = native.as_tensor(buf, torch.bfloat16, 10)
    assert part.shape == (10,)
    with pytest.raises(ValueError, match="needs"):
        native.as_tensor(buf, torch.float32, (1 << 20,))
    with pytest.raises(BufferError):
        buf.close()  # tensors still view it
    # The tensor keeps the buffer alive after the last Python reference to it is gone.
    del whole, part, buf
    gc.collect()
    t.fill_(3.0)
    assert bool((t == 3.0).all())


def test_buffer_is_usable_for_o_direct(tmp_path) -> None:
    """The point of the alignment: O_DIRECT accepts the buffer as is (tmpfs would not tell)."""
    with native.AlignedBuffer(1 << 20) as buf:
        memoryview(buf)[:] = os.urandom(1 << 20)
        path = tmp_path / "direct.bin"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
        try:
            assert os.pwritev(fd, [memoryview(buf)], 0) == 1 << 20
        finally:
            os.close(fd)
        assert path.read_bytes() == bytes(memoryview(buf))
