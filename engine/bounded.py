"""memascend's bounded host memory: the SSD holds the model state, DRAM is a staging window.

Two pieces here, none of which touches DeepSpeed (engine/ds_internals/bounded_stage3.py wires them into ZeRO-3), and
the staging ring they share; the optimizer step by chunk is optimizer_pipeline.py:

* :class:`GradientStream` - every reduced gradient partition leaves the compute device through a ring of
  ``gradient_slots`` aligned host buffers straight to its own extent in the region, in the training dtype (bf16/fp16:
  no fp32 round trip through the SSD). There is no full-size gradient buffer in host memory.
* :class:`CheckpointStash` (activation_checkpointing.py uses it) - activation checkpoints written to the region through
  ``checkpoint_slots`` buffers and prefetched in backward order.

Keys are region extents of the rank's RegionStore (engine/direct_nvme.py), so every byte goes through the same
O_DIRECT engine and counters as DeepSpeed's own (rewired) swap traffic.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

import torch
from memascend_engine import dram_tier

from memascend_cli.planner import zero

GRAD_PREFIX = "memascend/grad/"
ACT_PREFIX = "memascend/act/"


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor."""
    return t.reshape(-1).view(torch.uint8)


@dataclass
class IOCounters:
    """Bytes this module moved through the region (the store counts all traffic; these split it by purpose)."""

    gradient_write_bytes: int = 0
    gradient_read_bytes: int = 0
    optimizer_read_bytes: int = 0
    optimizer_write_bytes: int = 0
    param_read_bytes: int = 0
    param_write_bytes: int = 0
    checkpoint_write_bytes: int = 0
    checkpoint_read_bytes: int = 0
    gradient_held_bytes: int = 0
    """Running sums kept in the DRAM accumulation window instead of written (GradientStream.hold)."""
    master_in_place_bytes: int = 0
    """fp32 masters stepped where their resident parameter partition lives (OptimizerPipeline._bind: no offload_param),
    neither copied into a slot nor back."""


class SlotRing:
    """``count`` aligned host buffers of ``nbytes`` each, handed out in turn; a slot comes back when the I/O that used
    it has completed (its pending request is waited first)."""

    def __init__(self, store, allocator, count: int, nbytes: int):
        self.store = store
        self.nbytes = int(nbytes)
        self.buffers = [allocator.empty(self.nbytes, torch.uint8) for _ in range(int(count))]
        self._free = collections.deque(range(len(self.buffers)))
        self._busy: collections.deque = collections.deque()  # (slot, pending)

    @property
    def total_bytes(self) -> int:
        return len(self.buffers) * self.nbytes

    def take(self) -> tuple[int, torch.Tensor]:
        if not self._free:
            slot, pending = self._busy.popleft()
            self.store.complete(pending)
            self._free.append(slot)
        slot = self._free.popleft()
        return slot, self.buffers[slot]

    def busy(self, slot: int, pending) -> None:
        self._busy.append((slot, pending))

    def drain(self) -> None:
        """Complete every pending request (raises the first I/O error)."""
        first = None
        while self._busy:
            slot, pending = self._busy.popleft()
            try:
                self.store.complete(pending)
            except Exception as exc:  # noqa: BLE001 - complete every request, raise the first failure
                first = first or exc
            self._free.append(slot)
        if first is not None:
            raise first


class GradientStream:
    """Reduced gradient partitions to their region extents through a bounded staging ring."""

    def __init__(self, store, allocator, windows: zero.EngineWindows, counters: IOCounters):
        self.store = store
        self.ring = SlotRing(store, allocator, windows.gradient_slots, windows.gradient_slot_bytes)
        self.counters = counters
        self.written: dict[str, int] = {}
        """key -> bytes of the last complete write (what a read may ask for)."""
        self.window_bytes = int(windows.accumulation_bytes)
        self.held: dict[str, torch.Tensor] = {}
        """key -> running sum kept in DRAM between micro-batches (host memory, at most window_bytes in all)."""
        self.held_bytes = 0

    def hold(self, key: str, grad: torch.Tensor) -> None:
        """Keep a running sum that is not final yet: in the DRAM window when it fits, else on the SSD (write)."""
        nbytes = grad.numel() * grad.element_size()
        if self.held_bytes + nbytes > self.window_bytes:
            self.write(key, grad)
            return
        # A copy: the gradient may be a view of DeepSpeed's reduce bucket, which the next bucket overwrites.
        self.held[key] = torch.empty(grad.numel(), dtype=grad.dtype).copy_(grad.detach().reshape(-1))
        self.held_bytes += nbytes
        self.written.pop(key, None)  # what the SSD holds of it is stale now
        self.counters.gradient_held_bytes += nbytes

    def spill(self) -> None:
        """Every held running sum to the SSD (where step() and the unmanaged boundary read them)."""
        for key in list(self.held):
            grad = self.held.pop(key)
            self.held_bytes -= grad.numel() * grad.element_size()
            self.write(key, grad)

    def drop_held(self) -> None:
        """Forget every held gradient (the step that kept them for a redo committed without one)."""
        self.held.clear()
        self.held_bytes = 0

    @staticmethod
    def key(param_id) -> str:
        return f"{GRAD_PREFIX}{param_id}"

    def write(self, key: str, grad: torch.Tensor) -> torch.Tensor | None:
        """Queue the bytes of `grad` (any device) to `key`; returns once they are staged (the writes run on). A key the
        DRAM tier holds is copied into it at once: returns that copy (a tensor like `grad`, its bytes unchanged until
        the key is written again), else None."""
        src = _bytes_view(grad.detach().contiguous())
        nbytes = src.numel()
        held = dram_tier.in_dram(self.store, key, 0, nbytes, torch.uint8, write=True)
        if held is not None:  # kept in DRAM: one copy into its key (no staging slot), the write counted in place
            held.copy_(src)
            self.store.complete(self.store.submit("w", held.data_ptr(), nbytes, key, 0))
            self.written[key] = nbytes
            self.counters.gradient_write_bytes += nbytes
            return held.view(grad.dtype).view(grad.shape)
        step = self.ring.nbytes
        if nbytes > step:
            # A gradient larger than one slot goes out in several writes: size the key's extent for all of them
            # first, or the first write sizes it to one slot and the second one replaces it (and its content).
            self.store.extent_for_write(key, 0, nbytes)
        for off in range(0, nbytes, step):
            m = min(step, nbytes - off)
            slot, buf = self.ring.take()
            buf[:m].copy_(src[off:off + m])  # device -> pinned host on a GPU
            self.ring.busy(slot, self.store.submit("w", buf.data_ptr(), m, key, off))
        self.written[key] = nbytes
        self.counters.gradient_write_bytes += nbytes
        return None

    def read(self, key: str, numel: int, dtype: torch.dtype, device) -> torch.Tensor:
        """The whole gradient of `key` (for accumulation across micro-batches), on `device`; a held one leaves the
        DRAM window (the caller holds or writes the new sum)."""
        if key in self.held:
            grad = self.held.pop(key)
            self.held_bytes -= grad.numel() * grad.element_size()
            if grad.numel() != numel or grad.dtype != dtype:
                raise RuntimeError(f"memascend gradient stream: read of {key} ({numel} x {dtype}) that holds "
                                   f"{grad.numel()} x {grad.dtype}")
            return grad.to(device)
        self.ring.drain()  # the key's own writes must have landed
        out = torch.empty(numel, dtype=dtype, device=device)
        dst = _bytes_view(out)
        nbytes = dst.numel()
        if self.written.get(key) != nbytes:
            raise RuntimeError(f"memascend gradient stream: read of {key} ({nbytes} B) that holds "
                               f"{self.written.get(key, 0)} B written")
        step = self.ring.nbytes
        for off in range(0, nbytes, step):
            m = min(step, nbytes - off)
            slot, buf = self.ring.take()
            self.store.complete(self.store.submit("r", buf.data_ptr(), m, key, off))
            self.ring._free.append(slot)
            dst[off:off + m].copy_(buf[:m])
        self.counters.gradient_read_bytes += nbytes
        return out

    def flush(self) -> None:
        self.ring.drain()

    @property
    def host_bytes(self) -> int:
        return self.ring.total_bytes


class CheckpointStash:
    on_ssd = True
    """Activation checkpoints on the SSD: each layer's input is written through a ring of `slots` aligned buffers and
    read back in backward order through one more buffer, the next one prefetched while the current layer
    recomputes. Host memory holds (slots + 1) checkpoints, not b x s x h x L."""

    def __init__(self, store, allocator, slots: int, counters: IOCounters):
        self.store = store
        self.allocator = allocator
        self.count = max(1, int(slots))
        self.counters = counters
        self._writes: dict[int, SlotRing] = {}
        self._reads: dict[int, torch.Tensor] = {}
        self._seq = 0
        self._mutex = threading.Lock()
        self._sizes: dict[str, int] = {}
        self._order: list[str] = []
        """Live keys in forward order: backward takes them from the end."""
        self._prefetched: tuple[str, object] | None = None

    def _ring(self, nbytes: int) -> SlotRing:
        ring = self._writes.get(nbytes)
        if ring is None:
            ring = self._writes[nbytes] = SlotRing(self.store, self.allocator, self.count, nbytes)
        return ring

    def _read_buffer(self, nbytes: int) -> torch.Tensor:
        buf = self._reads.get(nbytes)
        if buf is None:
            buf = self._reads[nbytes] = self.allocator.empty(nbytes, torch.uint8)
        return buf

    def put(self, t: torch.Tensor) -> str:
        """Write `t` (any device) to a fresh key; returns the key."""
        with self._mutex:
            key = f"{ACT_PREFIX}{self._seq}"
            self._seq += 1
        src = _bytes_view(t.detach().contiguous())
        ring = self._ring(src.numel())
        slot, buf = ring.take()
        buf.copy_(src)
        ring.busy(slot, self.store.submit("w", buf.data_ptr(), src.numel(), key, 0))
        self.counters.checkpoint_write_bytes += src.numel()
        self._sizes[key] = src.numel()
        self._order.append(key)
        return key

    def _start_read(self, key: str):
        nbytes = self._sizes[key]
        self._ring(nbytes).drain()  # a checkpoint still being written must land before it is read
        buf = self._read_buffer(nbytes)
        return buf, self.store.submit("r", buf.data_ptr(), nbytes, key, 0)

    def take(self, key: str, shape, dtype: torch.dtype, device) -> torch.Tensor:
        """The tensor written under `key`, on `device`; its extent is released and the previous checkpoint (the next
        one backward needs) starts loading."""
        nbytes = self._sizes.pop(key)
        if self._prefetched is not None and self._prefetched[0] == key:
            buf = self._read_buffer(nbytes)
            pending = self._prefetched[1]
            self._prefetched = None
        else:
            if self._prefetched is not None:  # an unexpected order: finish the stray read first
                self.store.complete(self._prefetched[1])
                self._prefetched = None
            self._sizes[key] = nbytes
            buf, pending = self._start_read(key)
            self._sizes.pop(key)
        self.store.complete(pending)
        out = torch.empty(shape, dtype=dtype, device=device)
        _bytes_view(out).copy_(buf[:nbytes])
        self.counters.checkpoint_read_bytes += nbytes
        self.store.forget(key)
        self._order.remove(key)
        if self._order:
            nxt = self._order[-1]
            self._prefetched = (nxt, self._start_read(nxt)[1])
        return out

    @property
    def host_bytes(self) -> int:
        return (sum(r.total_bytes for r in self._writes.values())
                + sum(b.numel() for b in self._reads.values()))
