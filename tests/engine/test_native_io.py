"""O_DIRECT engine (memascend_engine._native.IOEngine) against plain os.pread/os.pwrite.

Alignment and short-transfer paths only mean something on a filesystem that enforces O_DIRECT
rules (tmpfs does not), so file tests run on tmp_path only when it is not tmpfs/overlay, and
the 4 KiB-sector case uses a loop device (root).
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from memascend_engine import native

OK, WHY = native.available()
if not OK and os.environ.get("MEMASCEND_REQUIRE_NATIVE") == "1":
    raise RuntimeError(WHY)
pytestmark = pytest.mark.skipif(not OK, reason=f"native extension unavailable: {WHY}")

MiB = 1 << 20
BACKENDS = ["io_uring", "threads"]
# Filesystems that ignore or cannot do O_DIRECT alignment rules (tmpfs accepts a 1000-byte O_DIRECT write
# that ext4 refuses with EINVAL).
NO_DIO_RULES = {"tmpfs", "ramfs", "overlay", "fuse", "9p", "nfs", "squashfs"}


def fs_type(path: Path) -> str:
    """Filesystem type of the mount holding `path` (longest mount-point prefix in mountinfo)."""
    real = os.path.realpath(path)
    best, best_type = "", "unknown"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            mnt = left.split()[4].replace("\\040", " ")
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, best_type = mnt, right.split()[0]
    return best_type


@pytest.fixture
def dio_dir(tmp_path: Path) -> Path:
    kind = fs_type(tmp_path)
    if kind in NO_DIO_RULES or kind.startswith("fuse"):
        pytest.skip(f"tmp_path is on {kind}, which does not enforce O_DIRECT alignment; need ext4/xfs/btrfs")
    assert kind != "tmpfs"
    return tmp_path


def make_engine(path: Path | str, backend: str, **kw):
    try:
        return native.IOEngine(str(path), backend=backend, **kw)
    except RuntimeError as exc:
        if backend == "io_uring" and "unavailable" in str(exc):
            pytest.skip(f"io_uring unavailable here: {exc}")
        raise


def fill_random(buf, seed: int) -> bytes:
    data = random.Random(seed).randbytes(buf.nbytes)
    memoryview(buf)[:] = data
    return data


def read_plain(path: Path | str, length: int, offset: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def write_plain(path: Path | str, data: bytes, offset: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert os.pwrite(fd, data, offset) == len(data)
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_engine_write_then_os_pread(dio_dir: Path, backend: str) -> None:
    path = dio_dir / "region.bin"
    nbytes = 3 * MiB + 8192  # not a multiple of block_size: exercises the last, shorter chunk
    with native.AlignedBuffer(nbytes) as buf, make_engine(path, backend, block_size=MiB, queue_depth=4) as eng:
        assert eng.backend == backend
        data = fill_random(buf, 1)
        eng.write(buf.address, nbytes, 4096)
        assert eng.bytes_written == nbytes
        assert eng.size_bytes == 4096 + nbytes
    assert read_plain(path, nbytes, 4096) == data
    assert read_plain(path, 4096, 0) == bytes(4096)  # the hole before the write stays zero


@pytest.mark.parametrize("backend", BACKENDS)
def test_os_pwrite_then_engine_read(dio_dir: Path, backend: str) -> None:
    path = dio_dir / "region.bin"
    nbytes = 2 * MiB + 512
    data = random.Random(2).randbytes(nbytes)
    write_plain(path, data, 1024 * 1024)
    with native.AlignedBuffer(nbytes) as buf, make_engine(path, backend, writable=False, block_size=256 * 1024) as eng:
        eng.read(buf.address, nbytes, MiB)
        assert bytes(memoryview(buf)) == data
        assert eng.bytes_read == nbytes


def test_io_unit_split_round_trip(dio_dir: Path) -> None:
    """io_uring issues block_size chunks as several smaller SQEs when max_io_bytes (or the device) says so."""
    path = dio_dir / "split.bin"
    nbytes = 4 * MiB + 12288
    with (
        native.AlignedBuffer(nbytes) as buf,
        make_engine(path, "io_uring", block_size=MiB, queue_depth=2, max_io_bytes=64 * 1024) as eng,
    ):
        assert eng.io_unit == 64 * 1024 and eng.block_size == MiB
        data = fill_random(buf, 3)
        eng.write(buf.address, nbytes, 0)
        assert read_plain(path, nbytes, 0) == data
        memoryview(buf)[:] = bytes(nbytes)
        eng.read(buf.address, nbytes, 0)
        assert bytes(memoryview(buf)) == data
    with make_engine(path, "io_uring") as eng:  # automatic: a power of two <= block_size
        assert eng.io_unit <= eng.block_size and eng.io_unit & (eng.io_unit - 1) == 0
        assert eng.io_unit % eng.alignment == 0
    with make_engine(path, "threads") as eng:
        assert eng.io_unit == eng.block_size


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_requests_from_several_threads(dio_dir: Path, backend: str) -> None:
    """Writers and readers in 4 Python threads share one engine; every byte lands where asked."""
    path = dio_dir / "region.bin"
    per_thread, nthreads, reqs = 4 * MiB, 4, 8
    req_bytes = per_thread // reqs
    bufs = [native.AlignedBuffer(per_thread) for _ in range(nthreads)]
    expected = [fill_random(b, 10 + i) for i, b in enumerate(bufs)]
    errors: list[BaseException] = []

    with make_engine(path, backend, block_size=128 * 1024, queue_depth=16, num_workers=4) as eng:

        def writer(i: int) -> None:
            try:
                base = i * per_thread
                ids = [
                    eng.submit_write(bufs[i].address + k * req_bytes, req_bytes, base + k * req_bytes)
                    for k in range(reqs)
                ]
                for rid in reversed(ids):  # completion order must not matter
                    eng.wait(rid)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert eng.bytes_written == nthreads * per_thread
        assert eng.outstanding == 0

        for i in range(nthreads):
            assert read_plain(path, per_thread, i * per_thread) == expected[i]

        # Now read everything back concurrently into fresh buffers.
        outs = [native.AlignedBuffer(per_thread) for _ in range(nthreads)]

        def reader(i: int) -> None:
            try:
                for k in range(reqs):
                    eng.submit_read(outs[i].address + k * req_bytes, req_bytes, i * per_thread + k * req_bytes)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        eng.wait_all()
        assert not errors, errors
        for i in range(nthreads):
            assert bytes(memoryview(outs[i])) == expected[i]


@pytest.mark.parametrize("backend", BACKENDS)
def test_submitting_thread_may_exit_before_wait(dio_dir: Path, backend: str) -> None:
    """io_uring ties requests to the issuing task; the engine must not let a short-lived thread be it."""
    path = dio_dir / "region.bin"
    nbytes = 8 * MiB
    with native.AlignedBuffer(nbytes) as buf, make_engine(path, backend, block_size=256 * 1024, queue_depth=4) as eng:
        data = fill_random(buf, 5)
        ids: list[int] = []
        t = threading.Thread(target=lambda: ids.append(eng.submit_write(buf.address, nbytes, 0)))
        t.start()
        t.join()  # the submitter is gone while most chunks are still queued or in flight
        eng.wait(ids[0])
        assert read_plain(path, nbytes, 0) == data


@pytest.mark.parametrize("backend", BACKENDS)
def test_misaligned_requests_rejected_before_submit(dio_dir: Path, backend: str) -> None:
    path = dio_dir / "region.bin"
    write_plain(path, b"\xab" * (64 * 1024), 0)
    with native.AlignedBuffer(64 * 1024) as buf, make_engine(path, backend) as eng:
        a = eng.alignment
        assert a >= 512 and a & (a - 1) == 0
        assert a == native.dio_alignment(str(path))
        cases = {
            "address": (buf.address + 64, 4096, 0),
            "offset": (buf.address, 4096, 100),
            "length": (buf.address, 1000, 0),
        }
        for what, (addr, length, off) in cases.items():
            for op in (eng.write, eng.submit_write, eng.read, eng.submit_read):
                with pytest.raises(native.AlignmentError) as ei:
                    op(addr, length, off)
                msg = str(ei.value)
                assert isinstance(ei.value, ValueError)
                assert str(path) in msg and what in msg, msg
                assert f"offset={off}" in msg and f"length={length}" in msg, msg
        assert eng.outstanding == 0 and eng.bytes_written == 0 and eng.bytes_read == 0
    assert read_plain(path, 64 * 1024, 0) == b"\xab" * (64 * 1024)  # nothing was written


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_read_past_eof_raises(dio_dir: Path, backend: str) -> None:
    path = dio_dir / "region.bin"
    write_plain(path, b"\x11" * 8192, 0)
    with native.AlignedBuffer(64 * 1024) as buf, make_engine(path, backend, block_size=4096) as eng:
        # Straddles EOF: the second 4 KiB chunk and beyond have no data.
        with pytest.raises(native.ShortTransferError) as ei:
            eng.read(buf.address, 16384, 0)
        e = ei.value
        assert isinstance(e, native.IOError) and isinstance(e, OSError)
        assert e.errno == errno.EIO and e.filename == str(path)
        # The chunks past EOF (at 8192 and 12288) fail alike; with worker threads either may report first.
        assert e.offset in (8192, 12288) and e.length == 4096
        msg = str(e)
        assert str(path) in msg and f"offset={e.offset}" in msg and "length=4096" in msg and "transferred 0" in msg, msg
        assert "file size 8192" in msg and "errno" in msg, msg

        # Entirely past EOF, asynchronous path.
        rid = eng.submit_read(buf.address, 4096, MiB)
        with pytest.raises(native.ShortTransferError, match=r"offset=1048576 length=4096"):
            eng.wait(rid)
        # The engine stays usable after failures.
        eng.read(buf.address, 8192, 0)
        assert bytes(memoryview(buf)[:8192]) == b"\x11" * 8192


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_read_of_unaligned_file_tail(dio_dir: Path, backend: str) -> None:
    path = dio_dir / "tail.bin"
    write_plain(path, b"\x22" * 5000, 0)
    with (
        native.AlignedBuffer(8192) as buf,
        make_engine(path, backend) as eng,
        pytest.raises(native.ShortTransferError, match=r"transferred 5000 of 8192 bytes"),
    ):
        eng.read(buf.address, 8192, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_errno_is_reported(dio_dir: Path, backend: str) -> None:
    """A real kernel error (EFBIG from RLIMIT_FSIZE) surfaces with its errno, in a child process."""
    code = textwrap.dedent(
        f"""
        import resource, signal, sys
        from memascend_engine import native
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us instead of returning EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, ({MiB}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        buf = native.AlignedBuffer({MiB})
        eng = native.IOEngine({str(dio_dir / "big.bin")!r}, backend={backend!r})
        try:
            eng.write(buf.address, {MiB}, {MiB})
        except native.IOError as e:
            print("ERRNO", e.errno, e.offset, e.length <= {MiB} and {MiB} % e.length == 0)
            print(e)
            sys.exit(0)
        print("NO ERROR")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if "unavailable" in out.stderr:
        pytest.skip(out.stderr)
    first, msg = out.stdout.splitlines()[:2]
    assert first == f"ERRNO {errno.EFBIG} {MiB} True", out.stdout  # length: the failed chunk's
    assert "big.bin" in msg and f"offset={MiB}" in msg and f"request offset={MiB} length={MiB}" in msg, msg
    assert f"errno {errno.EFBIG}" in msg, msg


@pytest.mark.parametrize("backend", BACKENDS)
def test_gil_released_during_read(dio_dir: Path, backend: str) -> None:
    path = dio_dir / "big.bin"
    nbytes = 32 * MiB
    with native.AlignedBuffer(nbytes) as buf:
        with make_engine(path, backend) as writer:
            writer.write(buf.address, nbytes, 0)
        # Small blocks, one at a time: a deliberately slow read, so the other thread gets time.
        eng = make_engine(path, backend, block_size=64 * 1024, queue_depth=1, num_workers=1, max_io_bytes=64 * 1024)
        with eng:
            counter = 0
            stop = threading.Event()

            def spin() -> None:
                nonlocal counter
                while not stop.is_set():
                    counter += 1

            t = threading.Thread(target=spin)
            t.start()
            time.sleep(0.05)
            before = counter
            t0 = time.perf_counter()
            eng.read(buf.address, nbytes, 0)
            elapsed = time.perf_counter() - t0
            during = counter - before
            stop.set()
            t.join()
    assert during > 1000, f"counter advanced only {during} times during a {elapsed:.3f} s read: GIL held?"


def test_backend_selection_and_validation(dio_dir: Path) -> None:
    path = dio_dir / "f.bin"
    with native.IOEngine(str(path)) as eng:
        assert eng.backend in ("io_uring", "threads") and eng.backend_reason
        assert eng.block_size == MiB and eng.queue_depth == 32 and eng.path == str(path)
    with pytest.raises(ValueError, match="backend must be"):
        native.IOEngine(str(path), backend="libaio")
    with pytest.raises(native.AlignmentError, match="block_size"):
        native.IOEngine(str(path), block_size=1000)
    with pytest.raises(ValueError, match="queue_depth"):
        native.IOEngine(str(path), queue_depth=0)
    with pytest.raises(native.IOError) as ei:
        native.IOEngine(str(dio_dir / "missing" / "x.bin"))
    assert ei.value.errno == errno.ENOENT and "missing" in str(ei.value)


def test_env_var_forces_threads_backend(dio_dir: Path) -> None:
    code = f"from memascend_engine import native; print(native.IOEngine({str(dio_dir / 'f.bin')!r}).backend)"
    env = dict(os.environ, MEMASCEND_IO_BACKEND="threads")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "threads", out.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_request_lifecycle(dio_dir: Path, backend: str) -> None:
    path = dio_dir / "f.bin"
    with native.AlignedBuffer(8192) as buf:
        eng = make_engine(path, backend)
        rid = eng.submit_write(buf.address, 8192, 0)
        eng.wait(rid)
        with pytest.raises(ValueError, match="unknown request id"):
            eng.wait(rid)  # each id is consumed once
        eng.wait(eng.submit_read(buf.address, 0, 0))  # zero-length requests complete at once
        ro = make_engine(path, backend, writable=False)
        with pytest.raises(ValueError, match="read-only"):
            ro.write(buf.address, 4096, 0)
        ro.close()
        eng.submit_write(buf.address, 8192, 8192)
        eng.close()  # waits for the in-flight write before returning
        assert eng.closed and eng.bytes_written == 16384
        with pytest.raises(RuntimeError, match="closed"):
            eng.submit_read(buf.address, 4096, 0)
        eng.close()  # idempotent
    assert os.path.getsize(path) == 16384


def test_readonly_engine_on_missing_file_fails(dio_dir: Path) -> None:
    with pytest.raises(native.IOError) as ei:
        native.IOEngine(str(dio_dir / "nope.bin"), writable=False)
    assert ei.value.errno == errno.ENOENT


# --------------------------------------------------------------------------------------------
# 4 KiB logical sectors via a loop device (losetup --direct-io=on --sector-size 4096): machine-global, root only.
@pytest.fixture
def loop4k(dio_dir: Path):
    if os.geteuid() != 0:
        pytest.skip("loop devices need root")
    if not os.path.exists("/dev/loop-control"):
        pytest.skip("no /dev/loop-control (loop driver not available)")
    if shutil.which("losetup") is None:
        pytest.skip("losetup (util-linux) not installed")
    backing = dio_dir / "loop4k.img"
    with open(backing, "wb") as f:
        f.truncate(16 * MiB)
    out = subprocess.run(
        ["losetup", "-f", "--show", "--direct-io=on", "--sector-size", "4096", str(backing)],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if out.returncode != 0:
        pytest.skip(f"losetup failed: {out.stderr.strip()}")
    dev = out.stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False, timeout=30)


@pytest.mark.root
@pytest.mark.parametrize("backend", BACKENDS)
def test_loop_device_4k_sectors(loop4k: str, backend: str) -> None:
    assert native.dio_alignment(loop4k) == 4096
    with native.AlignedBuffer(64 * 1024) as buf, make_engine(loop4k, backend, block_size=16 * 1024) as eng:
        assert eng.is_block_device and eng.offset_alignment == 4096 and eng.alignment == 4096
        assert eng.size_bytes == 16 * MiB
        # 512-aligned (fine for a 512 B-sector disk) but not 4096-aligned: refused before submission.
        for addr, length, off in [(buf.address, 4096, 512), (buf.address, 512, 0), (buf.address, 4608, 4096)]:
            with pytest.raises(native.AlignmentError, match="4096"):
                eng.write(addr, length, off)
        assert eng.bytes_written == 0
        data = fill_random(buf, 7)
        eng.write(buf.address, 64 * 1024, 8192)
        eng.sync()
        assert read_plain(loop4k, 64 * 1024, 8192) == data
        memoryview(buf)[:] = bytes(64 * 1024)
        eng.read(buf.address, 64 * 1024, 8192)
        assert bytes(memoryview(buf)) == data
        # Past the end of the device: short, never silent.
        with pytest.raises(native.IOError, match=r"offset=16773120"):
            eng.read(buf.address, 8192, 16 * MiB - 4096)
