"""Direct NVMe engine: DeepSpeed's swap "files" become extents of a memascend region.

DeepSpeed's swappers name every swapped tensor by a file path
(``.../zero_stage_3/bfloat16params/rank0/12_param.tensor.swp``, ``.../optimizer/rank0/exp_avg-3_5.tensor.swp``,
``..._gradient_<offset>_<length>.tensor.swp``) and move bytes through an ``aio_handle``
(deepspeed-notes §6.1). :class:`DirectNvmeHandle` is a duck-typed ``aio_handle``: the path is only
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

A key that was never written reads as zeros (a fresh scratch extent), which lets the engine create
Adam states in place (see deepspeed_plugin) without writing zeros first.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, field

from memascend_engine import native

_MEMSET = ctypes.memset
_MEMMOVE = ctypes.memmove


@dataclass
class RegionStats:
    """Traffic through the region (counted here, cross-checked with the native engine's counters)."""

    bytes_read: int = 0
    bytes_written: int = 0
    requests: int = 0
    read_requests: int = 0
    write_requests: int = 0
    zero_fill_reads: int = 0
    """Reads of keys never written, served by zero-filling the buffer (no I/O)."""
    bounce_bytes: int = 0
    """Bytes staged through bounce blocks because the caller's address or length was misaligned."""
    reallocations: int = 0
    """Keys rewritten with a larger length (their extent was replaced)."""
    keys: int = 0


@dataclass
class _Pending:
    """One submitted aio-level operation: native request ids plus the post-read copies."""

    request_ids: list[int]
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # (dst address, src address, nbytes)
    keepalive: list = field(default_factory=list)  # bounce blocks and tensors to keep until completion


class RegionStore:
    """One rank's sub-region of a memascend region: key -> extent map plus the I/O engine."""

    def __init__(self, region_path: str, rank: int, *, queue_depth: int | None = None, num_workers: int | None = None,
                 block_size: int | None = None, backend: str = "auto"):
        from memascend_cli import region as region_mod

        self.region_path = str(region_path)
        self.header = region_mod.read_header(self.region_path)
        self.rank = int(rank)
        self.subregion = self.header.subregion(self.rank)
        self.allocator = region_mod.ExtentAllocator(self.subregion, self.header.alignment_bytes)
        probe = self.header.probe
        qd = queue_depth or (probe.best_queue_depth if probe else 32)
        workers = num_workers or (probe.best_num_workers if probe else 4)
        bs = block_size or (probe.best_block_bytes if probe else 1 << 20)
        self.engine = native.IOEngine(self.region_path, writable=True, backend=backend, queue_depth=int(qd),
                                      num_workers=int(workers), block_size=int(bs))
        if self.engine.size_bytes < self.subregion.end_bytes:
            raise ValueError(
                f"region {self.region_path} is {self.engine.size_bytes} B but rank {self.rank}'s sub-region ends at "
                f"{self.subregion.end_bytes} B; re-create it with `memascend prepare-ssd`")
        self.mem_alignment = max(1, int(self.engine.mem_alignment))
        self.offset_alignment = max(1, int(self.engine.offset_alignment))
        self.io_alignment = max(self.mem_alignment, self.offset_alignment)
        self.stats = RegionStats()
        self._written_bytes: dict[str, int] = {}  # key -> high-water mark of bytes written
        self._mutex = threading.Lock()
        self._bounce_free: list = []  # spare io_alignment-sized AlignedBuffers

    # -- keys and extents --------------------------------------------------------------------
    @staticmethod
    def key(filename) -> str:
        """The extent key of a DeepSpeed swap path."""
        return os.path.normpath(os.fspath(filename))

    def extent_for_write(self, key: str, end_bytes: int):
        """The extent of ``key``, allocated (or grown) to hold ``end_bytes``."""
        with self._mutex:
            ext = self.allocator.lookup(key)
            if ext is not None and ext.length_bytes >= end_bytes:
                return ext
            if ext is not None:
                # DeepSpeed rewrites a swap file from offset 0 with its whole content, so a larger
                # rewrite replaces the extent.
                self.allocator.free(key)
                self._written_bytes.pop(key, None)
                self.stats.reallocations += 1
            else:
                self.stats.keys += 1
            return self.allocator.allocate(key, end_bytes)

    def extent_for_read(self, key: str, end_bytes: int):
        """The extent of ``key`` or None if it was never written; errors like DeepSpeed's aio op when
        the read would pass the bytes written (a short swap file)."""
        with self._mutex:
            ext = self.allocator.lookup(key)
            if ext is None:
                return None
            written = self._written_bytes.get(key, 0)
        if end_bytes > written:
            raise ValueError(f"read of {end_bytes} B from swap key {key} that holds only {written} B written "
                             "(DeepSpeed's aio op would reject it: file_offset + nbytes > file size)")
        return ext

    def note_written(self, key: str, end_bytes: int) -> None:
        with self._mutex:
            self._written_bytes[key] = max(self._written_bytes.get(key, 0), end_bytes)

    def forget(self, key: str) -> None:
        """Free ``key``'s extent (e.g. when a swapper drops a tensor for good)."""
        with self._mutex:
            if key in self.allocator:
                self.allocator.free(key)
                self._written_bytes.pop(key, None)

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
            ext = self.extent_for_write(key, end)
        else:
            ext = self.extent_for_read(key, end)
            if ext is None:
                _MEMSET(address, 0, nbytes)
                with self._mutex:
                    self.stats.zero_fill_reads += 1
                    self.stats.requests += 1
                    self.stats.read_requests += 1
                return _Pending(request_ids=[])
        device_offset = ext.offset_bytes + file_offset
        if device_offset % self.offset_alignment:
            raise ValueError(f"swap key {key}: file offset {file_offset} is not a multiple of the device alignment "
                             f"{self.offset_alignment}")
        pending = _Pending(request_ids=[])
        a = self.io_alignment
        if address % self.mem_alignment == 0:
            body = nbytes - nbytes % a
            tail = nbytes - body
            body_addr = address
        else:
            body, tail, body_addr = 0, nbytes, address
        if body:
            self._submit_native(op, pending, body_addr, body, device_offset)
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
            with self._mutex:
                self.stats.bounce_bytes += tail
        with self._mutex:
            self.stats.requests += 1
            if op == "w":
                self.stats.write_requests += 1
                self.stats.bytes_written += nbytes
            else:
                self.stats.read_requests += 1
                self.stats.bytes_read += nbytes
        if op == "w":
            self.note_written(key, end)
        return pending

    def _submit_native(self, op: str, pending: _Pending, address: int, nbytes: int, offset: int) -> None:
        if op == "w":
            pending.request_ids.append(self.engine.submit_write(address, nbytes, offset))
        else:
            pending.request_ids.append(self.engine.submit_read(address, nbytes, offset))

    def complete(self, pending: _Pending) -> None:
        """Wait for ``pending``'s native requests, then finish bounced reads."""
        first_error = None
        for rid in pending.request_ids:
            try:
                self.engine.wait(rid)
            except Exception as exc:  # noqa: BLE001 - wait every id (each must be waited once), raise the first
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        for dst, src, n in pending.copies:
            _MEMMOVE(dst, src, n)
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
        d["engine_bytes_read"] = int(self.engine.bytes_read)
        d["engine_bytes_written"] = int(self.engine.bytes_written)
        d["backend"] = self.engine.backend
        d["io_alignment"] = self.io_alignment
        return d

    def close(self) -> None:
        """Wait for in-flight I/O and close the device."""
        if not self.engine.closed:
            self.engine.close()


class DirectNvmeHandle:
    """Duck-typed ``deepspeed.ops.aio.aio_handle`` over a :class:`RegionStore`.

    Constructor arguments mirror the aio op's (block_size, queue_depth, single_submit,
    overlap_events, intra_op_parallelism); they are reported by the getters but the transfers use
    the store's native engine settings. ``wait()`` returns the number of operations completed since
    the last ``wait()``, as the swappers assert.
    """

    def __init__(self, store: RegionStore, allocator, block_size: int = 1 << 20, queue_depth: int = 128,
                 single_submit: bool = False, overlap_events: bool = False, intra_op_parallelism: int = 1):
        self._store = store
        self._allocator = allocator
        self._block_size = int(block_size)
        self._queue_depth = int(queue_depth)
        self._single_submit = bool(single_submit)
        self._overlap_events = bool(overlap_events)
        self._iop = max(1, int(intra_op_parallelism))
        self._pending: list[_Pending] = []

    # -- configuration getters (aio_handle API) ----------------------------------------------
    def get_block_size(self) -> int:
        return self._block_size

    def get_queue_depth(self) -> int:
        return self._queue_depth

    def get_single_submit(self) -> bool:
        return self._single_submit

    def get_overlap_events(self) -> bool:
        return self._overlap_events

    def get_intra_op_parallelism(self) -> int:
        return self._iop

    def get_alignment(self) -> int:
        return max(512 * self._iop, self._store.io_alignment)

    # -- transfers ---------------------------------------------------------------------------
    def _op(self, op: str, buffer, filename, file_offset: int) -> _Pending:
        if buffer.device.type != "cpu":
            raise ValueError(f"Direct NVMe swap needs a host buffer, got a {buffer.device} tensor")
        if not buffer.is_contiguous():
            raise ValueError("Direct NVMe swap needs a contiguous buffer")
        nbytes = buffer.numel() * buffer.element_size()
        pending = self._store.submit(op, buffer.data_ptr(), nbytes, self._store.key(filename), int(file_offset))
        pending.keepalive.append(buffer)
        return pending

    def async_pread(self, buffer, filename, file_offset: int = 0) -> int:
        self._pending.append(self._op("r", buffer, filename, file_offset))
        return 0

    def async_pwrite(self, buffer, filename, file_offset: int = 0) -> int:
        self._pending.append(self._op("w", buffer, filename, file_offset))
        return 0

    def sync_pread(self, buffer, filename, file_offset: int = 0) -> int:
        self._store.complete(self._op("r", buffer, filename, file_offset))
        return 1

    def sync_pwrite(self, buffer, filename, file_offset: int = 0) -> int:
        self._store.complete(self._op("w", buffer, filename, file_offset))
        return 1

    def pread(self, buffer, filename, validate=False, async_op=False, file_offset: int = 0) -> int:
        if async_op:
            return self.async_pread(buffer, filename, file_offset)
        return self.sync_pread(buffer, filename, file_offset)

    def pwrite(self, buffer, filename, validate=False, async_op=False, file_offset: int = 0) -> int:
        if async_op:
            return self.async_pwrite(buffer, filename, file_offset)
        return self.sync_pwrite(buffer, filename, file_offset)

    def read(self, buffer, filename, validate=False, file_offset: int = 0) -> int:
        return self.sync_pread(buffer, filename, file_offset)

    def write(self, buffer, filename, validate=False, file_offset: int = 0) -> int:
        return self.sync_pwrite(buffer, filename, file_offset)

    def wait(self) -> int:
        """Complete every operation submitted through this handle; return how many there were."""
        pending, self._pending = self._pending, []
        first_error = None
        for p in pending:
            try:
                self._store.complete(p)
            except Exception as exc:  # noqa: BLE001 - finish the rest (their buffers must be released)
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return len(pending)

    # -- pinned buffers (aio_handle API) -----------------------------------------------------
    def new_cpu_locked_tensor(self, num_elem, example_tensor):
        return self._allocator.empty(int(num_elem), example_tensor.dtype)

    def free_cpu_locked_tensor(self, tensor) -> bool:
        self._allocator.free(tensor)
        return True

    def is_pinned(self, tensor) -> bool:
        if self._allocator.is_pinned(tensor):
            return True
        try:
            return bool(tensor.is_pinned())
        except RuntimeError:
            return False


class DirectNvmeOp:
    """What ``AsyncIOBuilder().load()`` returns: an object with an ``aio_handle`` constructor."""

    def __init__(self, store: RegionStore, allocator):
        self._store = store
        self._allocator = allocator

    def aio_handle(self, block_size: int = 1 << 20, queue_depth: int = 128, single_submit: bool = False,
                   overlap_events: bool = False, intra_op_parallelism: int = 1) -> DirectNvmeHandle:
        return DirectNvmeHandle(self._store, self._allocator, block_size, queue_depth, single_submit,
                                overlap_events, intra_op_parallelism)


class DirectNvmeBuilder:
    """Stands in for DeepSpeed's ``AsyncIOBuilder`` in the swapper modules."""

    def __init__(self, store: RegionStore, allocator):
        self._op = DirectNvmeOp(store, allocator)

    def __call__(self):
        # The swappers call ``AsyncIOBuilder()`` (an instance) then ``.load()``.
        return self

    def load(self, verbose: bool = True):
        return self._op

    def is_compatible(self, verbose: bool = False) -> bool:
        return True
