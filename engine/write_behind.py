"""Writes left in flight by their submitter (the optimizer's last chunks' writes go on into the next forward,
engine/overlap.py Speculator.finish), kept in order for the region store (engine/direct_nvme.py RegionStore): a read
of bytes still being written takes them from the write's source (what the write puts on the device) and reads the
rest; a write over bytes in flight, or a read that cannot be split around them, waits for them first; flush()
completes them all (a checkpoint, the store's close). The device orders none of this itself: concurrent O_DIRECT
requests to the same bytes may land in any order.
"""

from __future__ import annotations

import ctypes
import time


class WritesInFlight:
    """Mixed into RegionStore: `_writing` (key -> its writes submitted and not yet completed, oldest first), guarded
    by `_mutex`; `complete()` takes a write out through `_written`."""

    def _written(self, pending) -> None:
        """A completed write leaves its key's writes in flight."""
        with self._mutex:
            for key, writes in self._writing.items():
                for i, p in enumerate(writes):
                    if p is pending:
                        del writes[i]
                        if not writes:
                            del self._writing[key]
                        return

    def _forward(self, address: int, nbytes: int, key: str, file_offset: int) -> list | None:
        """A read of bytes some writes in flight are writing: those bytes copied from the writes' sources now (what
        the writes put on the device); returns the reads of the rest, submitted. None (after waiting for the writes
        where it cannot split around them) when the read goes the usual way. Writes in flight never overlap each
        other (a write waits for those over its bytes)."""
        ch, end = self.chunk_bytes, file_offset + nbytes
        lo, hi = file_offset // ch * ch, -(-end // ch) * ch  # a read checks whole checksum chunks
        with self._mutex:
            near = [p for p in self._writing.get(key, ()) if p.file_offset < hi and lo < p.file_offset + p.nbytes]
        near.sort(key=lambda p: p.file_offset)
        if not near:
            return None
        gaps, pos = [], file_offset
        for p in near:
            w_end = p.file_offset + p.nbytes
            # Forward only writes inside the read whose ends fall on checksum chunks (inside it): the rest is read
            # and checked in whole chunks no write in flight touches.
            if p.file_offset < file_offset or (w_end < end and w_end % ch) or w_end > end or not p.request_ids:
                self._await_writes(key, lo, hi)
                return None
            if p.file_offset > pos:
                gaps.append((pos, p.file_offset))
            pos = w_end
        if pos < end:
            gaps.append((pos, end))
        for p in near:
            ctypes.memmove(address + p.file_offset - file_offset, p.address, p.nbytes)
        parts = [self.submit("r", address + g0 - file_offset, g1 - g0, key, g0) for g0, g1 in gaps]
        with self._mutex:
            self.stats.forwarded_bytes += sum(p.nbytes for p in near)
        return parts

    def _await_writes(self, key: str, lo: int = 0, hi: int | None = None) -> None:
        """Complete the writes of ``key`` in flight that overlap its bytes [lo, hi) (all of them by default);
        a failed one raises its error here."""
        with self._mutex:
            writes = [p for p in self._writing.get(key, ()) if hi is None or (p.file_offset < hi and
                                                                              lo < p.file_offset + p.nbytes)]
        if not writes:
            return
        t0 = time.perf_counter()
        for pending in writes:
            self.complete(pending)
        with self._mutex:
            self.stats.reads_after_writes += 1
            self.stats.read_after_write_wait_s += time.perf_counter() - t0

    def flush(self) -> None:
        """Complete every write in flight (a checkpoint's or the run's end: the region then holds all that was
        written); raises the first failure."""
        with self._mutex:
            writes = [p for ws in self._writing.values() for p in ws]
        first = None
        for pending in writes:
            try:
                self.complete(pending)
            except Exception as exc:  # noqa: BLE001 - complete every write, raise the first failure
                first = first or exc
        if first is not None:
            raise first
