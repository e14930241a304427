"""DeepSpeed's ``aio_handle`` over a memascend region: :class:`DirectNvmeHandle` (duck-typed, the swap path only a key
of the rank's :class:`~memascend_engine.direct_nvme.RegionStore`), the op and the builder that stand in for
``AsyncIOBuilder`` in DeepSpeed's swapper modules (engine/ds_internals/aio.py patches them in)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memascend_engine.direct_nvme import RegionStore, _Pending


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
