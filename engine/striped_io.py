"""One I/O engine over the members of a striped region (memascend_cli/ssd/stripe.py has the layout).

:class:`StripedEngine` stands where :class:`RegionStore` (direct_nvme.py) holds one native ``IOEngine``: it takes
logical offsets, splits each request into stripe-unit pieces (``stripe.split``) and submits every piece at once to
its member's own native engine. Each member engine keeps up to its queue depth of requests in flight
(csrc/io_engine.h: chunks are carved from the pending requests into free io_uring slots as completions free them), so
one request of N units or more, or several smaller ones landing on different members, keeps every member's queue
full. A failed piece is reported as an ``OSError`` naming the member (its number and path) with the member engine's
own message (offset, length, errno).
"""

from __future__ import annotations

import threading

from memascend_engine import native

from memascend_cli.ssd import stripe


class StripedEngine:
    """The native engine API (submit_read/submit_write/wait, sizes, counters) over a striped region's members."""

    def __init__(self, header, *, backend: str, queue_depth: int, num_workers: int):
        self.members = [m.path for m in header.members]
        self.data_start_bytes = header.data_start_bytes
        self.unit_bytes = header.stripe_unit_bytes
        self.engines = []
        try:
            for m in header.members:
                # Each member at its own probed depth; requests of one stripe unit (a piece is never larger).
                qd = m.best_queue_depth or queue_depth
                self.engines.append(native.IOEngine(m.path, writable=True, backend=backend, queue_depth=int(qd),
                                                    num_workers=int(num_workers), block_size=int(self.unit_bytes)))
        except BaseException:
            self.close()
            raise
        self.mem_alignment = max(int(e.mem_alignment) for e in self.engines)
        self.offset_alignment = max(int(e.offset_alignment) for e in self.engines)
        self.backend = self.engines[0].backend
        self._requests: dict[int, list[tuple[int, int]]] = {}
        self._next_id = 1
        self._lock = threading.Lock()

    @property
    def size_bytes(self) -> int:
        """Logical bytes the members can hold (the smallest member's data area, times the members)."""
        n = len(self.engines)
        return self.data_start_bytes + n * min(int(e.size_bytes) - self.data_start_bytes for e in self.engines)

    @property
    def bytes_read(self) -> int:
        return sum(int(e.bytes_read) for e in self.engines)

    @property
    def bytes_written(self) -> int:
        return sum(int(e.bytes_written) for e in self.engines)

    @property
    def closed(self) -> bool:
        return all(e.closed for e in self.engines)

    def _submit(self, write: bool, address: int, nbytes: int, offset: int) -> int:
        pieces = stripe.split(offset, nbytes, data_start_bytes=self.data_start_bytes, unit_bytes=self.unit_bytes,
                              num_members=len(self.engines))
        ids = []
        try:
            for p in pieces:
                e = self.engines[p.member]
                submit = e.submit_write if write else e.submit_read
                ids.append((p.member, submit(address + p.buffer_offset, p.nbytes, p.member_offset)))
        except BaseException:
            for member, rid in ids:  # the pieces already queued still use the buffer: wait for them
                try:
                    self.engines[member].wait(rid)
                except OSError:
                    pass
            raise
        with self._lock:
            rid, self._next_id = self._next_id, self._next_id + 1
            self._requests[rid] = ids
        return rid

    def submit_read(self, address: int, nbytes: int, offset: int) -> int:
        return self._submit(False, address, nbytes, offset)

    def submit_write(self, address: int, nbytes: int, offset: int) -> int:
        return self._submit(True, address, nbytes, offset)

    def member_name(self, member: int) -> str:
        """'member 2 of 3 (/dev/nvme2n1)'."""
        return f"member {member + 1} of {len(self.engines)} ({self.members[member]})"

    def where(self, offset: int, nbytes: int) -> str:
        """The member bytes behind logical bytes [offset, offset + nbytes): 'member 2 of 3 (PATH) bytes A..B, ...'."""
        pieces = stripe.split(offset, nbytes, data_start_bytes=self.data_start_bytes, unit_bytes=self.unit_bytes,
                              num_members=len(self.engines))
        return ", ".join(f"{self.member_name(p.member)} bytes {p.member_offset}..{p.member_offset + p.nbytes - 1}"
                         for p in pieces)

    def wait(self, request_id: int) -> None:
        """Wait for every piece of the request (each once); raise the first failure as an OSError naming its
        member."""
        with self._lock:
            ids = self._requests.pop(request_id)
        first = None
        for member, rid in ids:
            try:
                self.engines[member].wait(rid)
            except OSError as exc:
                if first is None:
                    first = OSError(exc.errno, f"{self.member_name(member)}: {exc.strerror or exc}")
        if first is not None:
            raise first

    def close(self) -> None:
        for e in self.engines:
            if not e.closed:
                e.close()
