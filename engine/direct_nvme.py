"""Direct NVMe engine: DeepSpeed's swap "files" become extents of a memascend region.

DeepSpeed's swappers name every swapped tensor by a file path
(``.../zero_stage_3/bfloat16params/rank0/12_param.tensor.swp``, ``.../optimizer/rank0/exp_avg-3_5.tensor.swp``,
``..._gradient_<offset>_<length>.tensor.swp``) and move bytes through an ``aio_handle``
(deepspeed/ops/csrc/aio/py_lib/deepspeed_py_io_handle.cpp, the op behind ops/op_builder/async_io.py).
:class:`~memascend_engine.direct_nvme_aio.DirectNvmeHandle` is a duck-typed ``aio_handle``: the path is only
a key; the first write of a key allocates an aligned extent in this rank's sub-region of the
region (``ExtentAllocator``) and every transfer goes to ``extent.offset + file_offset`` through the
native O_DIRECT engine. No file is created, opened or stat'ed per request.

All handles of one process share one :class:`RegionStore` (one key space, one allocator, one
``IOEngine``): the parameter swapper writes with its write handle and reads with its read handle,
and the optimizer swapper reads parameter keys during fast init.

Alignment: DeepSpeed pads swap lengths to 1024 B x intra_op_parallelism and places views at such
offsets inside its pools; the device may need more (4 KiB on 4Kn). A request whose address and
length are aligned goes straight to the device; otherwise the aligned body goes straight and the
tail (< one alignment unit) goes through a small page-aligned bounce block; a misaligned address
is bounced whole. Bounced bytes are counted (``bounce_bytes``) so a benchmark can see them.

Integrity: every write records a CRC-32C per CHECKSUM_CHUNK_BYTES chunk of what it put on the
device (the native core's SSE4.2 crc32, computed on the store's checksum thread while the write is in
flight; complete() returns once it is recorded); every read checks
the chunks it covers, widening itself to whole chunks with small extra reads when it starts or ends
inside one, so a partial read is verified too. A mismatch, a read of a key never written, or a
read past what a key holds raises :class:`RegionDataError` naming the key (DeepSpeed's swap path:
the tensor), the extent and the device offsets; a failed transfer raises :class:`RegionIOError`
naming the operation, the key and the extent. Adam states that DeepSpeed would create with
``zeros_like`` are declared with :meth:`RegionStore.declare_zero` and read as zeros without I/O
until their first write. ``verify=False`` (``EngineOptions.verify_checksums`` /
``MEMASCEND_VERIFY_CHECKSUMS=0``) skips the checksums, for benchmarking only.

Ownership: opening a store takes the rank's sub-region lock and owner record
(memascend_cli/ssd/owner.py); :meth:`RegionStore.close` releases them, and the kernel drops the
lock if the process dies.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from memascend_engine import native

from memascend_cli.errors import MemascendError

_MEMSET = ctypes.memset
_MEMMOVE = ctypes.memmove

CHECKSUM_CHUNK_BYTES = 64 * 1024
"""Checksum granularity: 4 B of DRAM per 64 KiB on the SSD (64 MiB per TiB); a read verifies whole
chunks, so a read that starts or ends inside one reads at most 2 x 64 KiB more."""
VERIFY_ENV = "MEMASCEND_VERIFY_CHECKSUMS"
"""Set to 0 to skip checksums (benchmarking only); EngineOptions.verify_checksums=False does the same."""
_RESUME_HINT = ("the newest complete checkpoint is intact: check the SSD (dmesg, smartctl), then continue with "
                "`memascend train RECIPE --resume` (on another region if this one keeps failing)")


def verify_from_env(default: bool = True) -> bool:
    """False when MEMASCEND_VERIFY_CHECKSUMS is 0/false/no/off."""
    v = os.environ.get(VERIFY_ENV)
    if v is None:
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


class RegionDataError(MemascendError):
    """Data read from the region is not what was written (checksum mismatch, never written, too short)."""

    def __init__(self, message: str, *, key: str, device_offset: int | None = None):
        super().__init__(message, _RESUME_HINT)
        self.key = key
        self.device_offset = device_offset

    def __reduce__(self):
        # Picklable with its keywords: a rank's error reaches the parent process (multiprocessing) intact.
        return functools.partial(RegionDataError, key=self.key, device_offset=self.device_offset), (self.message,)


class RegionIOError(MemascendError):
    """A read or write of the region failed (the kernel returned an error or a short transfer)."""

    def __init__(self, message: str, *, key: str, op: str, errno_: int | None):
        super().__init__(message, _RESUME_HINT)
        self.key = key
        self.op = op
        self.errno = errno_

    def __reduce__(self):
        return functools.partial(RegionIOError, key=self.key, op=self.op, errno_=self.errno), (self.message,)


@dataclass
class RegionStats:
    """Traffic through the region (counted here, cross-checked with the native engine's counters)."""

    bytes_read: int = 0
    bytes_written: int = 0
    requests: int = 0
    read_requests: int = 0
    write_requests: int = 0
    zero_fill_reads: int = 0
    """Reads of keys declared zero (declare_zero) and not yet written, served by zero-filling (no I/O)."""
    bounce_bytes: int = 0
    """Bytes staged through bounce blocks because the caller's address or length was misaligned."""
    reallocations: int = 0
    """Keys rewritten with a larger length (their extent was replaced)."""
    keys: int = 0
    checksummed_bytes: int = 0
    """Bytes whose CRC-32C was computed on write."""
    verified_bytes: int = 0
    """Bytes whose CRC-32C was checked on read (whole chunks, widened reads included)."""
    widened_read_bytes: int = 0
    """Extra bytes read to verify chunks that a read only partly covered."""
    read_wait_s: float = 0.0
    """Seconds callers spent blocked in complete() until their reads had landed (any thread; a checked read: and
    passed its checksums on the verify thread): the share of the region's time the caller could not hide (the time
    model overlaps it)."""
    write_wait_s: float = 0.0
    """The same for writes."""
    checksum_s: float = 0.0
    """Seconds computing writes' CRC-32C, on the store's checksum thread while the writes are in flight."""
    verify_s: float = 0.0
    """Seconds checking reads' CRC-32C, on the store's verify thread as each read lands."""


@dataclass
class _KeyState:
    """What the store knows about one key's content."""

    written_bytes: int = 0
    """Logical bytes written (reads past this are refused, as DeepSpeed's aio op refuses short files)."""
    image_bytes: int = 0
    """Bytes on the device from key offset 0 (written_bytes padded to the I/O alignment)."""
    crcs: bytearray = field(default_factory=bytearray)
    """Packed little-endian CRC-32C per chunk of [0, image_bytes); the last chunk may be short."""
    zero_bytes: int = 0
    """Declared all-zero and never written (declare_zero); 0 otherwise."""


@dataclass
class _Verify:
    """A read's checksum check, done once its transfers are complete."""

    key: str
    lo: int
    """Key offset of the first verified chunk (chunk-aligned)."""
    segments: list[tuple[int, int]]
    """(address, bytes) of the device image [lo, hi) in order: widening blocks, body, bounce."""
    expected: bytes
    extent_offset: int
    extent_bytes: int


@dataclass
class _Pending:
    """One submitted aio-level operation: native request ids plus the post-read copies."""

    request_ids: list[int]
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # (dst address, src address, nbytes)
    keepalive: list = field(default_factory=list)  # bounce blocks and tensors to keep until completion
    op: str = "r"
    key: str = ""
    file_offset: int = 0
    nbytes: int = 0
    extent: object = None
    verify: _Verify | None = None
    checksum: Future | None = None
    """A write's CRC-32C on the checksum thread (RegionStore._checksum), done before complete() returns."""
    landed: Future | None = None
    """A checked read's wait and checksum check on the verify thread (RegionStore._land)."""


class RegionStore:
    """One rank's sub-region of a memascend region: key -> extent map plus the I/O engine."""

    def __init__(self, region_path: str, rank: int, *, queue_depth: int | None = None, num_workers: int | None = None,
                 block_size: int | None = None, backend: str = "auto", verify: bool | None = None):
        from memascend_cli.ssd import region as region_mod
        from memascend_cli.ssd import owner as region_owner

        self.region_path = str(region_path)
        self.header = region_mod.read_header(self.region_path)
        self.rank = int(rank)
        self.subregion = self.header.subregion(self.rank)
        # A striped region's members must all be there as recorded before anything is written (the lease is).
        from memascend_cli.ssd.members import check_members

        check_members(self.region_path, self.header)
        self.lease = region_owner.acquire(self.region_path, self.rank, self.header)
        try:
            self._open_engine(region_mod, queue_depth, num_workers, block_size, backend)
        except BaseException:
            self.lease.release()
            raise
        self.verify = verify_from_env() if verify is None else bool(verify)
        self.chunk_bytes = max(CHECKSUM_CHUNK_BYTES, self.io_alignment)
        self.stats = RegionStats()
        self._keys: dict[str, _KeyState] = {}
        self._mutex = threading.Lock()
        self._bounce_free: list = []  # spare io_alignment-sized AlignedBuffers
        self._checksums: ThreadPoolExecutor | None = None
        self._verifier: ThreadPoolExecutor | None = None

    def _open_engine(self, region_mod, queue_depth, num_workers, block_size, backend) -> None:
        self.allocator = region_mod.ExtentAllocator(self.subregion, self.header.alignment_bytes)
        probe = self.header.probe
        qd = queue_depth or (probe.best_queue_depth if probe else 32)
        workers = num_workers or (probe.best_num_workers if probe else 4)
        bs = block_size or (probe.best_block_bytes if probe else 1 << 20)
        if self.header.members:
            from memascend_engine.striped_io import StripedEngine

            self.engine = StripedEngine(self.header, backend=backend, queue_depth=int(qd), num_workers=int(workers))
        else:
            self.engine = native.IOEngine(self.region_path, writable=True, backend=backend, queue_depth=int(qd),
                                          num_workers=int(workers), block_size=int(bs))
        if self.engine.size_bytes < self.subregion.end_bytes:
            size = self.engine.size_bytes
            self.engine.close()
            raise ValueError(
                f"region {self.region_path} is {size} B but rank {self.rank}'s sub-region ends at "
                f"{self.subregion.end_bytes} B; re-create it with `memascend prepare-ssd`")
        self.mem_alignment = max(1, int(self.engine.mem_alignment))
        self.offset_alignment = max(1, int(self.engine.offset_alignment))
        self.io_alignment = max(self.mem_alignment, self.offset_alignment)

    # -- keys and extents --------------------------------------------------------------------
    @staticmethod
    def key(filename) -> str:
        """The extent key of a DeepSpeed swap path."""
        return os.path.normpath(os.fspath(filename))

    def _where(self, key: str, ext=None) -> str:
        if ext is None:
            return f"swap key {key} (no extent)"
        return (f"swap key {key} (extent at device bytes {ext.offset_bytes}..{ext.end_bytes - 1} of "
                f"{self.region_path})")

    def extent_for_write(self, key: str, file_offset: int, end_bytes: int):
        """The extent of ``key``, allocated (or grown) to hold ``end_bytes``; checks the write keeps
        the key's checksummed content contiguous."""
        with self._mutex:
            ext = self.allocator.lookup(key)
            st = self._keys.get(key)
            if ext is not None and ext.length_bytes < end_bytes:
                # DeepSpeed rewrites a swap file from offset 0 with its whole content, so a larger
                # rewrite replaces the extent.
                self.allocator.free(key)
                self._keys.pop(key, None)
                st = None
                ext = None
                self.stats.reallocations += 1
                self.stats.keys -= 1  # counted again when the new extent is allocated
            if file_offset % self.chunk_bytes:
                raise ValueError(f"write to swap key {key} at key offset {file_offset}: writes must start at a "
                                 f"multiple of the checksum chunk ({self.chunk_bytes} B)")
            if file_offset > (st.image_bytes if st is not None else 0):
                raise ValueError(f"write to swap key {key} at key offset {file_offset} would leave a hole "
                                 f"(the key holds {st.written_bytes if st is not None else 0} B)")
            if ext is None:
                ext = self.allocator.allocate(key, end_bytes)
                self.stats.keys += 1
            return ext

    def declare_zero(self, key, nbytes: int) -> None:
        """Declare that ``key`` holds ``nbytes`` zero bytes (the value DeepSpeed's optimizer would give a
        fresh Adam state) until it is first written; reads of it then zero-fill without I/O."""
        key = self.key(key)
        with self._mutex:
            st = self._keys.get(key)
            if st is not None and st.written_bytes:
                raise ValueError(f"declare_zero({key}): the key already holds {st.written_bytes} B written")
            if st is None:
                st = self._keys[key] = _KeyState()
            st.zero_bytes = max(st.zero_bytes, int(nbytes))

    def reserve(self, key: str, nbytes: int) -> None:
        """Allocate ``key``'s extent for ``nbytes`` before it is written piece by piece (a first write
        would otherwise size it to its own end)."""
        self.extent_for_write(key, 0, int(nbytes))

    def written_bytes(self, key: str) -> int:
        """Logical bytes written to ``key`` (0: never written)."""
        with self._mutex:
            st = self._keys.get(key)
            return st.written_bytes if st is not None else 0

    def exchange(self, a: str, b: str) -> None:
        """Swap two keys' extents and what is known of their content: ``b``, written as the next
        version of ``a``, becomes ``a`` and the old ``a`` stays readable as ``b``. No I/O; nothing
        of either may be in flight."""
        with self._mutex:
            self.allocator.exchange(a, b)
            sa, sb = self._keys.pop(a, None), self._keys.pop(b, None)
            if sb is not None:
                self._keys[a] = sb
            if sa is not None:
                self._keys[b] = sa

    def forget(self, key: str) -> None:
        """Free ``key``'s extent (e.g. when a swapper drops a tensor for good)."""
        with self._mutex:
            if key in self.allocator:
                self.allocator.free(key)
            self._keys.pop(key, None)

    # -- bounce blocks -----------------------------------------------------------------------
    def _bounce(self, nbytes: int):
        if nbytes == self.io_alignment:
            with self._mutex:
                if self._bounce_free:
                    return self._bounce_free.pop()
        return native.AlignedBuffer(nbytes, lock=False, zero=False, huge_pages=False)

    def _release_bounce(self, buf) -> None:
        if buf.nbytes == self.io_alignment:
            with self._mutex:
                if len(self._bounce_free) < 64:
                    self._bounce_free.append(buf)

    # -- transfers ---------------------------------------------------------------------------
    def submit(self, op: str, address: int, nbytes: int, key: str, file_offset: int) -> _Pending:
        """Queue one read ('r') or write ('w') of ``nbytes`` at ``address`` for key ``key``."""
        end = file_offset + nbytes
        if op == "w":
            ext = self.extent_for_write(key, file_offset, end)
        else:
            with self._mutex:
                ext = self.allocator.lookup(key)
                st = self._keys.get(key)
                if st is not None and not st.written_bytes and st.zero_bytes:
                    if end > st.zero_bytes:
                        raise RegionDataError(f"read of {nbytes} B at key offset {file_offset} from "
                                              f"{self._where(key)}, declared as {st.zero_bytes} zero bytes, "
                                              "passes its end", key=key)
                    self.stats.zero_fill_reads += 1
                    self.stats.requests += 1
                    self.stats.read_requests += 1
                    _MEMSET(address, 0, nbytes)
                    return _Pending(request_ids=[], op=op, key=key)
                written = st.written_bytes if st is not None else 0
            if ext is None or st is None:
                raise RegionDataError(f"read of {nbytes} B at key offset {file_offset} from {self._where(key)}: "
                                      "nothing was ever written to this key", key=key)
            if end > written:
                raise RegionDataError(f"read of {end} B from {self._where(key, ext)} that holds only {written} B "
                                      "written (DeepSpeed's aio op would reject it: file_offset + nbytes > file size)",
                                      key=key, device_offset=ext.offset_bytes + file_offset)
        device_offset = ext.offset_bytes + file_offset
        if device_offset % self.offset_alignment:
            raise ValueError(f"swap key {key}: file offset {file_offset} is not a multiple of the device alignment "
                             f"{self.offset_alignment}")
        pending = _Pending(request_ids=[], op=op, key=key, file_offset=file_offset, nbytes=nbytes, extent=ext)
        a = self.io_alignment
        if address % self.mem_alignment == 0:
            body = nbytes - nbytes % a
            tail = nbytes - body
            body_addr = address
        else:
            body, tail, body_addr = 0, nbytes, address
        image: list[tuple[int, int]] = []  # device image of [file_offset, file_offset + padded)
        if body:
            self._submit_native(op, pending, body_addr, body, device_offset)
            image.append((body_addr, body))
        if tail:
            bounce_bytes = -(-tail // a) * a
            bounce = self._bounce(bounce_bytes)
            pending.keepalive.append(bounce)
            if op == "w":
                _MEMMOVE(bounce.address, address + body, tail)
                if bounce_bytes > tail:
                    _MEMSET(bounce.address + tail, 0, bounce_bytes - tail)
                self._submit_native(op, pending, bounce.address, bounce_bytes, device_offset + body)
            else:
                # Never read past the extent: the padded tail stays inside it because extents are
                # aligned to the region alignment (>= the device alignment).
                self._submit_native(op, pending, bounce.address, bounce_bytes, device_offset + body)
                pending.copies.append((address + body, bounce.address, tail))
            image.append((bounce.address, bounce_bytes))
            with self._mutex:
                self.stats.bounce_bytes += tail
        image_end = file_offset + sum(n for _, n in image)
        if op == "w":
            st = self._note_written(key, file_offset, end, image_end)
            if self.verify:
                pending.checksum = self._checksum_thread().submit(self._checksum, st, file_offset, image)
        elif self.verify:
            pending.verify = self._plan_verify(pending, key, ext, file_offset, image_end, image)
        with self._mutex:
            self.stats.requests += 1
            if op == "w":
                self.stats.write_requests += 1
                self.stats.bytes_written += nbytes
                self.stats.checksummed_bytes += image_end - file_offset if self.verify else 0
            else:
                self.stats.read_requests += 1
                self.stats.bytes_read += nbytes
        if pending.verify is not None:
            if self._verifier is None:
                self._verifier = ThreadPoolExecutor(1, thread_name_prefix="memascend-verify")
            pending.landed = self._verifier.submit(self._land, pending)
        return pending

    def _note_written(self, key: str, file_offset: int, end: int, image_end: int) -> _KeyState:
        """The key's new length; its chunks' checksums are zeros until the checksum thread has them (_checksum)."""
        ch = self.chunk_bytes
        with self._mutex:
            st = self._keys.setdefault(key, _KeyState())
            st.zero_bytes = 0
            first = file_offset // ch
            if image_end % ch and image_end < st.image_bytes:
                # The write ends inside a chunk that held more: the key now ends here (its old tail
                # is no longer covered by a checksum).
                st.image_bytes, st.written_bytes = image_end, end
            else:
                st.image_bytes = max(st.image_bytes, image_end)
                st.written_bytes = max(st.written_bytes, end)
            if self.verify:
                count = -(-(image_end - file_offset) // ch)
                st.crcs[first * 4:] = bytes(4 * count) + st.crcs[(first + count) * 4:]
                del st.crcs[-(-st.image_bytes // ch) * 4:]
        return st

    def _checksum_thread(self) -> ThreadPoolExecutor:
        # Writes' CRC-32C off the thread that submits them (it drives backward and the optimizer: the time
        # model overlaps the SSD with that thread's compute), as reads' checks are (_land). One thread each: a
        # write's checksum never waits behind a read that has not landed.
        if self._checksums is None:
            self._checksums = ThreadPoolExecutor(1, thread_name_prefix="memascend-crc")
        return self._checksums

    def _checksum(self, st: _KeyState, file_offset: int, image) -> None:
        """On the checksum thread, while the write is in flight (both only read the buffer): its chunks' CRC-32C
        into the key's table, unless a later write has replaced the key or cut it short."""
        t0 = time.perf_counter()
        crcs = native.crc32c_chunks(image, self.chunk_bytes)
        lo = file_offset // self.chunk_bytes * 4
        with self._mutex:
            hi = min(lo + len(crcs), len(st.crcs))
            if hi > lo:
                st.crcs[lo:hi] = crcs[:hi - lo]
            self.stats.checksum_s += time.perf_counter() - t0

    def _plan_verify(self, pending: _Pending, key: str, ext, file_offset: int, image_end: int, image) -> _Verify:
        """Whole chunks covering the read: extra reads for the parts of its first and last chunks it misses."""
        ch = self.chunk_bytes
        with self._mutex:
            st = self._keys[key]
            lo = file_offset // ch * ch
            hi = min(-(-image_end // ch) * ch, st.image_bytes)
            expected = bytes(st.crcs[lo // ch * 4: -(-hi // ch) * 4])
        segments = list(image)
        base = ext.offset_bytes
        for start, stop, front in ((lo, file_offset, True), (image_end, hi, False)):
            if stop <= start:
                continue
            blk = native.AlignedBuffer(stop - start, lock=False, zero=False, huge_pages=False)
            pending.keepalive.append(blk)
            self._submit_native("r", pending, blk.address, stop - start, base + start)
            segments.insert(0, (blk.address, stop - start)) if front else segments.append((blk.address, stop - start))
            with self._mutex:
                self.stats.widened_read_bytes += stop - start
        return _Verify(key=key, lo=lo, segments=segments, expected=expected, extent_offset=ext.offset_bytes,
                       extent_bytes=ext.length_bytes)

    def _check(self, v: _Verify) -> None:
        got = native.crc32c_chunks(v.segments, self.chunk_bytes)
        with self._mutex:
            self.stats.verified_bytes += sum(n for _, n in v.segments)
        if got == v.expected:
            return
        ch = self.chunk_bytes
        common = min(len(got), len(v.expected))
        i = next((i for i in range(0, common, 4) if got[i:i + 4] != v.expected[i:i + 4]), common) // 4
        if 4 * i >= len(v.expected) or 4 * i >= len(got):
            raise RegionDataError(f"reading swap key {v.key}: {len(got) // 4} chunk checksums computed, "
                                  f"{len(v.expected) // 4} recorded (the store's checksum table is inconsistent)",
                                  key=v.key, device_offset=v.extent_offset + v.lo)
        key_start = v.lo + i * ch
        key_end = min(key_start + ch, v.lo + sum(n for _, n in v.segments))
        dev = v.extent_offset + key_start
        want = int.from_bytes(v.expected[i * 4:i * 4 + 4], "little")
        have = int.from_bytes(got[i * 4:i * 4 + 4], "little")
        raise RegionDataError(
            f"checksum mismatch reading swap key {v.key}: key bytes {key_start}..{key_end - 1} = device bytes "
            f"{dev}..{dev + key_end - key_start - 1} of {self._device(dev, key_end - key_start)} (extent at device bytes {v.extent_offset}.."
            f"{v.extent_offset + v.extent_bytes - 1}): crc32c 0x{have:08x}, written 0x{want:08x}",
            key=v.key, device_offset=dev)

    def _device(self, offset: int, nbytes: int) -> str:
        """Where region bytes live: the region's path, and a striped region's member bytes."""
        return self.region_path + (f" = {self.engine.where(offset, nbytes)}" if self.header.members else "")

    def _submit_native(self, op: str, pending: _Pending, address: int, nbytes: int, offset: int) -> None:
        if op == "w":
            pending.request_ids.append(self.engine.submit_write(address, nbytes, offset))
        else:
            pending.request_ids.append(self.engine.submit_read(address, nbytes, offset))

    def _io_error(self, pending: _Pending, exc: OSError) -> RegionIOError:
        what = "read" if pending.op == "r" else "write"
        ext = pending.extent
        return RegionIOError(
            f"{what} of {pending.nbytes} B at key offset {pending.file_offset} of {self._where(pending.key, ext)} "
            f"failed: {exc.strerror if isinstance(exc.strerror, str) else exc}",
            key=pending.key, op=what, errno_=exc.errno)

    def _land(self, pending: _Pending) -> None:
        """Wait for ``pending``'s native requests (each once: all of them, then raise the first failure) and check a
        read's checksums (on the verify thread for a checked read, as soon as it lands)."""
        first_error = None
        for rid in pending.request_ids:
            try:
                self.engine.wait(rid)
            except OSError as exc:
                first_error = first_error or self._io_error(pending, exc)
            except Exception as exc:  # noqa: BLE001
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        if pending.verify is not None:
            t0 = time.perf_counter()
            self._check(pending.verify)
            with self._mutex:
                self.stats.verify_s += time.perf_counter() - t0

    def complete(self, pending: _Pending) -> None:
        """Wait until ``pending`` has landed (a read checked against its checksums, a write's checksums recorded),
        then finish bounced reads."""
        first_error = None
        t0 = time.perf_counter()
        try:
            if pending.landed is not None:
                pending.landed.result()
            else:
                self._land(pending)
        except Exception as exc:  # noqa: BLE001 - the write's checksum below is still waited
            first_error = exc
        if pending.checksum is not None:
            try:
                pending.checksum.result()  # before the caller may reuse the buffer
            except Exception as exc:  # noqa: BLE001
                first_error = first_error or exc
        t1 = time.perf_counter()
        try:
            if first_error is not None:
                raise first_error
            with self._mutex:
                if pending.op == "w":
                    self.stats.write_wait_s += t1 - t0
                else:
                    self.stats.read_wait_s += t1 - t0
            for dst, src, n in pending.copies:
                _MEMMOVE(dst, src, n)
        finally:
            for buf in pending.keepalive:
                if isinstance(buf, native.AlignedBuffer):
                    self._release_bounce(buf)
            pending.keepalive.clear()

    def snapshot(self) -> dict:
        """Counters plus allocator occupancy and the native engine's own byte counters."""
        with self._mutex:
            d = dict(vars(self.stats))
            d["extent_bytes"] = self.allocator.used_bytes
            d["subregion_bytes"] = self.allocator.capacity_bytes
            d["subregion_offset_bytes"] = self.subregion.offset_bytes
            d["subregion_end_bytes"] = self.subregion.end_bytes
            exts = list(self.allocator.extents().values())
            d["extents_lowest_offset_bytes"] = min((e.offset_bytes for e in exts), default=None)
            d["extents_highest_end_bytes"] = max((e.end_bytes for e in exts), default=None)
            d["checksum_bytes"] = sum(len(s.crcs) for s in self._keys.values())
        d["engine_bytes_read"] = int(self.engine.bytes_read)
        d["engine_bytes_written"] = int(self.engine.bytes_written)
        d["backend"] = self.engine.backend
        d["io_alignment"] = self.io_alignment
        d["verify"] = self.verify
        d["checksum_chunk_bytes"] = self.chunk_bytes
        return d

    def close(self) -> None:
        """Wait for in-flight I/O, close the device and release the sub-region's lock."""
        if not self.engine.closed:
            self.engine.close()
        for pool in (self._checksums, self._verifier):
            if pool is not None:
                pool.shutdown(wait=True)
        self.lease.release()

