"""memascend's DRAM tier: region keys kept in host memory instead of on the SSD (EngineOptions.dram_tier_gib).

:class:`TieredStore` is a :class:`~memascend_engine.direct_nvme.RegionStore` whose held keys live in page-aligned
(mlocked) host buffers: a read or write of one is a memory copy done at submit, everything else goes to the region
as before. Every path that moves state (the parameter swapper, the gradient stream, the optimizer pipeline and its
overlap, checkpoints through the optimizer's own accessors) goes through the store, so the tier changes where bytes
live and never what they are: the losses are those of the all-SSD engine bit for bit, and a checkpoint reads the
held state as it reads the rest.

:func:`assign` decides what is held, after the optimizer pipeline is built and before it writes its first state:
the rule is memascend_cli.planner.dram_tier (parameter partitions, then gradients, then whole optimizer chunks), the
same the planner prices. Keys of held units written before (zero.Init's parameter partitions) move into DRAM then,
and those the training steps write first (Adam moments, gradients) get their locked buffers then too: the tier's
memory is taken and faulted in while the engine sets up, not by the first step.
The tier is static (a fixed set, no eviction), so the order the optimizer walks its chunks moves no SSD byte.

Held bytes are also computed on where they are (:func:`in_dram`): the optimizer pipeline steps a held chunk's moments
(and a single-piece chunk's master, its fp32 parameter partition) in place and the gradient stream copies a gradient
straight into its key, each then submitting the read or write it would have made at the tier's own address, which
the store counts and does not copy. Other copies run on every core (torch's copy; ctypes.memmove is one thread).

A tier that cannot get its memory falls back to the region with one warning: when the process has less room than
the tier plus the placement headroom (its cgroup's limit lowered, MemAvailable short), nothing is held; when mlock
refuses a buffer (RLIMIT_MEMLOCK), that buffer is dropped and nothing more is admitted.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

from memascend_engine import native
from memascend_engine.direct_nvme import RegionDataError, RegionStore, _Pending

from memascend_cli.planner import dram_tier as rule

log = logging.getLogger("memascend_engine")
_MEMMOVE = ctypes.memmove
_THREADED_COPY_BYTES = 1 << 20
"""From this size a copy runs as torch's (on every core: ~2x ctypes.memmove's one thread on this 2-core VM)."""
SHADOW_SUFFIX = "~next"


def shadow_key(key: str) -> str:
    """Where a speculation writes the next values of the parameter partition `key` (OptimizerPipeline.shadowed): a
    key of its own, so the rule (_units) holds both or neither."""
    return key + SHADOW_SUFFIX


STATE_NAMES = ("fp32", "exp_avg", "exp_avg_sq", "lo")
"""The optimizer pipeline's state keys of a chunk (OptimizerPipeline.state_key; "lo": a bf16 master's residual,
optimizer_pipeline.RESIDUAL)."""


@dataclass
class TierStats:
    """What the tier holds and moves (RegionStore.snapshot()['dram_tier'])."""

    asked_bytes: int = 0
    """EngineOptions.dram_tier_gib in bytes."""
    planned_bytes: int = 0
    """What the rule holds at that budget (assign)."""
    resident_bytes: int = 0
    """Bytes of held keys' buffers now."""
    keys: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    in_place_bytes: int = 0
    """Of bytes_read + bytes_written, those submitted at the tier's own address (computed where they live, in_dram):
    counted, not copied."""
    promoted_bytes: int = 0
    """Bytes moved from the region into the tier when it was assigned (written there before)."""
    params_held: int = 0
    chunks_held: int = 0
    grads_held: int = 0
    """Units the rule holds at the budget (assign); what the tier could not take is said in fallback."""
    fallback: str = ""
    """Why the tier holds less than planned (empty: it holds it all)."""
    region_read_at_assign: int = 0
    region_written_at_assign: int = 0
    """The region's bytes_read / bytes_written once the tier was assigned (held keys moved in): what training moved
    since is the rest."""
    order: str = rule.ORDER
    """The order the rule takes its classes in (a record's replan follows it: planner.dram_tier.split)."""


class _Resident:
    """One held key: its buffer and how many bytes of it are content."""

    __slots__ = ("buf", "length", "_bytes")

    def __init__(self, nbytes: int, lock: bool):
        self.buf = native.AlignedBuffer(max(1, nbytes), lock=lock, zero=True, huge_pages=False)
        self.length = 0
        self._bytes = None

    def tensor(self, offset: int, numel: int, dtype):
        """`numel` elements of `dtype` of the buffer from byte `offset` (no copy)."""
        if self._bytes is None:
            import torch

            self._bytes = native.as_tensor(self.buf, torch.uint8)
        return self._bytes.narrow(0, offset, numel * dtype.itemsize).view(dtype)


def _copy(dst: int, src: int, nbytes: int) -> None:
    """Copy `nbytes` between distinct host addresses."""
    if nbytes < _THREADED_COPY_BYTES:
        _MEMMOVE(dst, src, nbytes)
        return
    import torch

    def at(address):
        return torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=torch.uint8)

    at(dst).copy_(at(src))


class TieredStore(RegionStore):
    """A RegionStore whose held keys (hold()) live in DRAM."""

    def __init__(self, *args, tier_bytes: int, lock: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.tier = TierStats(asked_bytes=int(tier_bytes))
        self._lock = lock
        self._held: set[str] = set()
        self._dram: dict[str, _Resident] = {}
        self._closed_to_new = False

    # -- what is held ------------------------------------------------------------------------
    def hold(self, keys, sizes: dict[str, int] | None = None) -> None:
        """Keep `keys` in DRAM from now on; those already on the region move here (read once). A key new to the store
        that `sizes` names (the bytes its first write covers) gets its buffer now, locked and so faulted in: the tier
        takes its memory while the engine sets up, as stock's CPU offload takes its states' at initialize, instead of
        page-faulting it in during the first step's writes."""
        sizes = {self.key(k): int(n) for k, n in (sizes or {}).items()}
        self._held.update(self.key(k) for k in keys)
        for key in sorted(self._held):
            if key in self._dram:
                continue
            with self._mutex:
                st = self._keys.get(key)
            if st is None:
                if key in sizes and self._admit(key, sizes[key]) is None:
                    return
                continue
            n = max(st.written_bytes, st.zero_bytes)
            res = self._admit(key, n)
            if res is None:
                return
            if st.written_bytes:
                super().complete(super().submit("r", res.buf.address, st.written_bytes, key, 0))
            res.length = n
            self.tier.promoted_bytes += n
            super().forget(key)

    def refuse(self, reason: str) -> None:
        """Admit nothing more (what is held stays): `reason` is warned once."""
        self._closed_to_new = True
        if not self.tier.fallback:
            self.tier.fallback = reason
            log.warning("memascend_engine: warning: DRAM tier: %s", reason)

    def _admit(self, key: str, nbytes: int) -> _Resident | None:
        """A DRAM buffer for a held key, None when it goes to the region (not held, or the tier refuses)."""
        if key not in self._held or self._closed_to_new:
            return None
        res = _Resident(nbytes, self._lock)
        if self._lock and not res.buf.locked:
            self.refuse(f"mlock refused {nbytes:,} B ({res.buf.lock_error}); {self.tier.resident_bytes:,} B "
                        "held, the rest stays on the region")
            return None
        self._dram[key] = res
        self.tier.resident_bytes += res.buf.nbytes
        self.tier.keys += 1
        return res

    def _grow(self, key: str, res: _Resident, end: int) -> _Resident:
        if end <= res.buf.nbytes:
            return res
        bigger = _Resident(end, self._lock)
        _copy(bigger.buf.address, res.buf.address, res.length)
        bigger.length = res.length
        self._dram[key] = bigger
        self.tier.resident_bytes += bigger.buf.nbytes - res.buf.nbytes
        return bigger

    def _resident(self, key: str, end: int) -> _Resident | None:
        """The key's DRAM buffer, holding at least `end` bytes; admitted if held and new to the store."""
        res = self._dram.get(key)
        if res is not None:
            return self._grow(key, res, end)
        with self._mutex:
            on_region = key in self._keys or key in self.allocator
        return None if on_region else self._admit(key, end)

    def is_resident(self, key: str) -> bool:
        return self.key(key) in self._dram

    def tensor(self, key: str, file_offset: int, numel: int, dtype, *, write: bool = False):
        """`numel` elements of `dtype` of held `key` from byte `file_offset`, in the tier's buffer (no copy): where a
        read of those bytes comes from, or (`write`) where a write of them goes (the key admitted or grown as that
        write would). None where the key is on the region, or a read's bytes were never written."""
        key = self.key(key)
        end = file_offset + numel * dtype.itemsize
        res = self._resident(key, end) if write else self._dram.get(key)
        if res is None or (not write and end > res.length):
            return None
        return res.tensor(file_offset, numel, dtype)

    # -- RegionStore, for held keys ------------------------------------------------------------
    def submit(self, op: str, address: int, nbytes: int, key: str, file_offset: int) -> _Pending:
        end = file_offset + nbytes
        res = self._resident(key, end) if op == "w" else self._dram.get(key)
        if res is None:
            return super().submit(op, address, nbytes, key, file_offset)
        held = res.buf.address + file_offset
        if op == "r" and end > res.length:
            raise RegionDataError(f"read of {nbytes} B at key offset {file_offset} from DRAM-tier key {key}, "
                                  f"which holds {res.length} B", key=key)
        if address == held:  # the caller computed on the held bytes (in_dram): nothing to copy
            self.tier.in_place_bytes += nbytes
        elif op == "w":
            _copy(held, address, nbytes)
        else:
            _copy(address, held, nbytes)
        if op == "w":
            res.length = max(res.length, end)
            self.tier.bytes_written += nbytes
        else:
            self.tier.bytes_read += nbytes
        return _Pending(request_ids=[], op=op, key=key)

    def extent_for_write(self, key: str, file_offset: int, end_bytes: int):
        if self._resident(key, end_bytes) is not None:
            return None
        return super().extent_for_write(key, file_offset, end_bytes)

    def declare_zero(self, key, nbytes: int) -> None:
        key = self.key(key)
        res = self._resident(key, int(nbytes))
        if res is None:
            return super().declare_zero(key, nbytes)
        if res.length and res.length != int(nbytes):
            raise ValueError(f"declare_zero({key}): the key already holds {res.length} B written")
        res.length = max(res.length, int(nbytes))  # the buffer is zero-filled until written

    def written_bytes(self, key: str) -> int:
        res = self._dram.get(key)
        return res.length if res is not None else super().written_bytes(key)

    def exchange(self, a: str, b: str) -> None:
        ra, rb = self._dram.get(a), self._dram.get(b)
        if ra is not None and rb is not None:
            self._dram[a], self._dram[b] = rb, ra
            return
        for key, res in ((a, ra), (b, rb)):  # one held, one not: the held one goes to the region first
            if res is not None:
                self._demote(key, res)
        super().exchange(a, b)

    def _demote(self, key: str, res: _Resident) -> None:
        del self._dram[key]
        self._held.discard(key)
        self.tier.resident_bytes -= res.buf.nbytes
        self.tier.keys -= 1
        super().complete(super().submit("w", res.buf.address, res.length, key, 0))

    def forget(self, key: str) -> None:
        res = self._dram.pop(key, None)
        if res is None:
            return super().forget(key)
        self.tier.resident_bytes -= res.buf.nbytes
        self.tier.keys -= 1

    def snapshot(self) -> dict:
        d = super().snapshot()
        d["dram_tier"] = dict(vars(self.tier))
        return d


def in_dram(store, key: str, file_offset: int, numel: int, dtype, *, write: bool = False):
    """TieredStore.tensor of `store`'s held `key`; None for a store without a tier or a key it does not hold."""
    return store.tensor(key, file_offset, numel, dtype, write=write) if isinstance(store, TieredStore) else None


def _units(pipeline, targets, *, overlap: bool):
    """The units as the rule sees them, in the order it takes them: ([(keys, numel)] per parameter partition whose
    home is the region (`targets`: the pipeline's targets as backward sees them, every such partition by its key),
    per chunk, per gradient)."""
    shadowed = overlap and pipeline.params_hold_master
    params, seen = [], set()
    for group in targets:
        for fn in group:
            t = fn()
            if t.key is not None and t.key not in seen:
                seen.add(t.key)
                params.append(([t.key, shadow_key(t.key)] if shadowed else [t.key], t.numel))
    gens = (0, 1) if overlap else (0,)
    chunks = [([pipeline.state_key(ci, name, g) for name in STATE_NAMES for g in gens], c.numel)
              for ci, c in enumerate(pipeline.chunks)]
    numel = {}
    for c in pipeline.chunks:
        for p in c.pieces:
            numel[(c.sub_group, p.param)] = max(numel.get((c.sub_group, p.param), 0), p.param_offset + p.numel)
    grads = [([key], numel.get((g, j), 0)) for g, keys in enumerate(pipeline.grad_keys) for j, key in enumerate(keys)]
    return params, chunks, grads


def _first_written(pipeline, held, chunks, grads, *, overlap: bool) -> dict[str, int]:
    """Bytes of the held keys that no setup step writes, as the training steps first write them: the Adam moments
    of held chunks (each generation's, written by the first step that steps it) and the held gradients (the first
    backward). The parameter partitions, their shadows and the masters are written while the engine sets up."""
    gens = (0, 1) if overlap else (0,)
    sizes = {pipeline.state_key(ci, name, g): chunks[ci][1] * pipeline.moment_bytes
             for ci in held.groups for name in ("exp_avg", "exp_avg_sq") for g in gens}
    sizes.update((grads[i][0][0], grads[i][1] * pipeline.grad_bytes) for i in held.grads if grads[i][1])
    return sizes


def process_room() -> tuple[int, int]:
    """(bytes this process may still take: its cgroup's limit or MemAvailable less what it holds, the headroom to
    leave of them: the placement headroom of the plan, planner.placement)."""
    from memascend_engine import procfs

    from memascend_cli.planner.placement import HEADROOM_FRACTION, HEADROOM_MIN_BYTES

    view = procfs.dram_view()
    return (view.available_bytes - view.own_rss_bytes,
            max(HEADROOM_MIN_BYTES, int(HEADROOM_FRACTION * view.available_bytes)))


def assign(store, pipeline, targets, *, overlap: bool, grads_reach_ssd: bool,
           room: tuple[int, int] | None = None) -> None:
    """Hold in `store`'s tier what the rule keeps of `pipeline`'s state at the tier's budget (nothing for a store
    without a tier); gradients only where they `grads_reach_ssd` (not with the overlap, no clipping and one
    micro-batch: they are stepped as they are reduced). `room`: (bytes the process may still take, headroom to leave),
    process_room() when None; a tier that would leave less than the headroom holds nothing (one warning)."""
    if not isinstance(store, TieredStore) or store.tier.asked_bytes <= 0:
        return
    room_bytes, headroom_bytes = process_room() if room is None else room
    params, chunks, grads = _units(pipeline, targets, overlap=overlap)
    grads = grads if grads_reach_ssd else []
    sizes = rule.unit_bytes(param_numels=[n for _, n in params], param_elem_bytes=pipeline.param_bytes,
                            group_numels=[n for _, n in chunks], moment_bytes=pipeline.moment_bytes,
                            master_in_params=pipeline.params_hold_master, overlap=overlap,
                            grad_numels=[n for _, n in grads], grad_elem_bytes=pipeline.grad_bytes)
    tier = store.tier
    held = rule.split(tier.asked_bytes, *sizes)
    tier.planned_bytes = held.total_bytes
    tier.params_held, tier.chunks_held, tier.grads_held = len(held.params), len(held.groups), len(held.grads)
    if rule.granted_bytes(held.total_bytes, room_bytes, headroom_bytes) == 0:
        store.refuse(f"{held.total_bytes / 2**30:.2f} GiB to hold, {room_bytes / 2**30:.2f} GiB free and "
                     f"{headroom_bytes / 2**30:.2f} GiB to keep free (cgroup limit or MemAvailable): everything stays "
                     "on the region")
    else:
        store.hold([k for units, idx in ((params, held.params), (chunks, held.groups), (grads, held.grads))
                    for i in idx for k in units[i][0]], _first_written(pipeline, held, chunks, grads, overlap=overlap))
        log.info("memascend_engine: DRAM tier holds %d of %d parameter partitions, %d of %d optimizer chunks, %d of "
                 "%d gradients (%.2f GiB of %.2f GiB asked)", len(held.params), len(params), len(held.groups),
                 len(chunks), len(held.grads), len(grads), held.total_bytes / 2**30, tier.asked_bytes / 2**30)
    tier.region_read_at_assign, tier.region_written_at_assign = store.stats.bytes_read, store.stats.bytes_written
