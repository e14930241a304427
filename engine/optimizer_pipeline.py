"""memascend's optimizer step by chunk, none of it touching DeepSpeed (engine/ds_internals/bounded_stage3.py wires it
into ZeRO-3).

:class:`OptimizerPipeline` walks memascend's chunks (zero.optimizer_chunks: sub-groups of at most
``optimizer_chunk_numel`` elements, larger tensors split) through ``optimizer_depth`` slots: the reads of chunk i+1 and
the write-back of chunk i-1 are in flight while chunk i is updated. Each slot holds the fp32 master, exp_avg,
exp_avg_sq and fp32 gradient of one chunk plus a 16-bit staging buffer (gradient reads, parameter write-back in the
model dtype). Gradients come from the GradientStream's extents (bounded.py); keys are region extents of the rank's
RegionStore (engine/direct_nvme.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from memascend_engine import native
from memascend_engine.bounded import IOCounters
from memascend_engine.dram_tier import in_dram, shadow_key
from memascend_engine.one_pass_step import OnePassStep, rounding_seed

from memascend_cli.planner import zero

OPT_PREFIX = "memascend/opt/"
RESIDUAL = "lo"
"""State name of a bf16 chunk's master residual (OptimizerPipeline.split): the master's bits less its bf16 parameters'."""
SPEC_RESIDENT_MAX_BYTES = 64 << 20
"""Resident partitions (OptimizerPipeline.spec_resident) a speculation holds next values of: DeepSpeed keeps only
small ones in memory (below min_aio_bytes, persistent) unless offload_param.max_in_cpu keeps more; beyond this a chunk
with such pieces writes its master instead."""


@dataclass
class ParamTarget:
    """Where one parameter partition lives between steps: a region key (on the SSD) or an in-memory tensor."""

    numel: int
    key: str | None = None
    tensor: torch.Tensor | None = None
    """The in-memory partition (DeepSpeed keeps partitions below min_aio_bytes, and persistent ones, in memory)."""
    resident: bool = False
    """The in-memory partition is the parameter's home (not a swapped one DeepSpeed holds for now): in fp32 it holds
    the master as an SSD partition does (OptimizerPipeline.params_hold_master)."""


@dataclass
class Slot:
    """One chunk's buffers in the optimizer pipeline."""

    master: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    grad: torch.Tensor
    staging: torch.Tensor
    """uint8 buffer: 16-bit gradient pieces in, 16-bit parameter pieces out (at aligned offsets)."""
    pending: list = field(default_factory=list)
    placements: list = field(default_factory=list)
    """(piece, staging byte offset) of the chunk in this slot."""
    widen: int = 0
    """Elements of 16-bit moments read into the upper halves of exp_avg / exp_avg_sq, to widen once they land."""
    join: tuple[int, int, int] | None = None
    """(chunk, generation, elements) whose bf16 parameters and residual were read, to join into the master once they
    land (OptimizerPipeline.split)."""
    stepped: tuple | None = None
    """(chunk, split exceptions or None, parameters staged) of a chunk step_in_one_pass stepped: its 16-bit moments are
    narrowed, its residual made (split) and (parameters staged) its pieces' parameters written at their staging
    offsets already; its writes take them as they are."""
    grads: dict | None = None
    """For step_in_one_pass: chunk offset -> whether the piece's 16-bit gradient waits in staging to be widened (True)
    or is in `grad` (False); a piece absent has none (zeros). None: `grad` holds the whole gradient."""
    direct: set = field(default_factory=set)
    """Chunk offsets of gradient pieces read from the DRAM tier straight into `grad` (none to widen from staging)."""
    home: tuple = field(init=False, default=())
    """The slot's own (master, exp_avg, exp_avg_sq, grad): OptimizerPipeline._bind points those at a held chunk's
    bytes."""

    def __post_init__(self):
        self.home = (self.master, self.exp_avg, self.exp_avg_sq, self.grad)


class OptimizerPipeline(OnePassStep):
    """The optimizer step over memascend's chunks with `depth` slots in flight.

    ``targets[g][j]()``: the ParamTarget of parameter j of sub-group g now (its model-dtype partition);
    ``grad_keys[g][j]``: its gradient's key in the GradientStream, ``grad_written``: the keys written so far (a
    parameter that never received a gradient has a zero gradient, as in DeepSpeed's zero-initialised flat buffer).
    """

    def __init__(self, store, allocator, windows: zero.EngineWindows, chunks: Sequence[zero.Chunk],
                 targets: Sequence[Sequence[Callable[[], ParamTarget]]], grad_keys: Sequence[Sequence[str]], *,
                 param_dtype: torch.dtype, grad_dtype: torch.dtype, counters: IOCounters,
                 grad_written: dict | None = None, key_prefix: str = OPT_PREFIX, moment_bytes: int = 4,
                 params_hold_master: bool = False):
        self.store = store
        self.key_prefix = key_prefix
        """Prefix of the chunk keys: one per optimizer, so two engines in one process never share a key."""
        self.chunks = list(chunks)
        self.targets = targets
        self.grad_keys = grad_keys
        self.grad_written = grad_written if grad_written is not None else {}
        self.param_dtype = param_dtype
        self.grad_dtype = grad_dtype
        self.param_bytes = torch.tensor([], dtype=param_dtype).element_size()
        self.grad_bytes = torch.tensor([], dtype=grad_dtype).element_size()
        self.elem_bytes = max(self.param_bytes, self.grad_bytes)
        if moment_bytes not in (2, 4):
            raise ValueError(f"optimizer moments of {moment_bytes} B on the SSD: 4 (fp32) or 2 (bf16) only")
        self.moment_bytes = moment_bytes
        """Bytes per element of exp_avg / exp_avg_sq on the SSD (in the slots they are fp32, as CPU Adam needs)."""
        self.rounding_step = 0
        """The optimizer step whose moments are written (bounded_stage3 sets it): 16-bit moments' rounding noise."""
        self.counters = counters
        n = windows.optimizer_chunk_numel
        self.chunk_numel = n
        self.moment_upper_byte = 2 * n
        """Where 16-bit moments are read into a slot's fp32 moment buffer: its upper half (O_DIRECT-aligned)."""
        staging_bytes = zero.align_up(2 * n * self.elem_bytes, zero.PAGE_BYTES)
        self.residual_byte = staging_bytes - 2 * n
        """Where a split chunk's residual is read into or written from in a slot's staging buffer: its top 2 B per
        element, above the 16-bit pieces (_place)."""
        self.slots = [Slot(master=allocator.empty(n, torch.float32), exp_avg=allocator.empty(n, torch.float32),
                           exp_avg_sq=allocator.empty(n, torch.float32), grad=allocator.empty(n, torch.float32),
                           staging=allocator.empty(staging_bytes, torch.uint8))
                      for _ in range(max(1, windows.optimizer_depth))]
        self.io_alignment = max(int(store.io_alignment), 1)
        self.states_written: set[int] = set()
        """Chunks whose current generation holds Adam states (absent before the first step: read as zeros, no I/O)."""
        self.settle: Callable[[], None] | None = None
        """Called before read_state / write_state take a slot: the overlap (engine/overlap.py) finishes its chunks
        in flight first, or their buffers would be overwritten under their I/O."""
        self.generation = [0] * len(self.chunks)
        """Which of a chunk's two extent sets holds its current master and moments: the optimizer overlapped with
        backward (engine/overlap.py) writes a speculative update into the other one and flips this on commit."""
        self.mirrored: set[int] = set()
        """fp32 training: chunks whose parameter partitions hold exactly their current master (the master is copied to
        them bit for bit); bf16 with `split`: their upper halves. The overlap takes such a master (or those halves)
        from partitions DeepSpeed holds in memory during backward instead of reading it from the SSD
        (overlap.Speculator). Anything that writes one without the other drops it."""
        self.params_hold_master = params_hold_master and param_dtype in (torch.float32, torch.bfloat16)
        """EngineOptions.params_hold_master: a chunk whose parameter pieces are all on the SSD keeps its master there
        (fp32: the partitions hold its exact values, no master written, 4 B per parameter a step less; bf16: see
        `split`)."""
        self.split = self.params_hold_master and param_dtype == torch.bfloat16
        """bf16: the parameters written from a master are its round to nearest even, so the master is their bits
        shifted up plus a 16-bit residual (key RESIDUAL): 2 B per parameter written for the master instead of 4, the
        same values bit for bit. The rare element whose residual does not fit 16 bits (a tie rounded down, a NaN)
        keeps its master in `exceptions`."""
        self.exceptions: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor] | None] = {}
        """(chunk, generation) -> (element indices, fp32 masters) a split chunk's residual cannot express, or None:
        about one element in 2^17 (a master whose low 16 bits are exactly 0x8000 and whose bf16 rounded down)."""
        self.master_in_params: set[int] = set()
        """Chunks whose current master is their SSD parameter pieces (with `split`, and their residual; their master
        key is stale or absent)."""
        self.shadowed: set[str] = set()
        """Parameter keys a speculation wrote to their shadow (shadow_key), exchanged with them at its commit: until
        then the partitions keep the current master a redo or a rollback needs."""
        self.spec_in_params: set[int] = set()
        """Speculated chunks that wrote no master (their next master is in the shadows)."""
        self.spec_resident: list[tuple[torch.Tensor, torch.Tensor]] = []
        """A speculation's next values of resident partitions' pieces (destination view, values), copied in at its
        commit: the partitions keep the current master until then."""
        self.buffer_resident = False
        """Speculations hold resident partitions' next values apart (prepare_speculation: they are small enough)."""
        self.read_from: dict[str, str] = {}
        """From a commit to the end of its step: parameter key -> the key now holding its values before the step (the
        exchanged shadow), for chunks stepped after the commit (their pieces of the new partition are stale)."""

    @property
    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self.slots
                   for t in (s.master, s.exp_avg, s.exp_avg_sq, s.grad, s.staging))

    def state_key(self, chunk_index: int, name: str, generation: int | None = None) -> str:
        gen = self.generation[chunk_index] if generation is None else generation
        return f"{self.key_prefix}{chunk_index}/{name}" + (f"~{gen}" if gen else "")

    # -- layout of a chunk's 16-bit pieces in the staging buffer ----------------------------------------
    def _place(self, chunk: zero.Chunk) -> list[tuple[zero.Piece, int | None]]:
        """Each piece at an O_DIRECT-aligned staging offset while they fit (None: bounced through the store)."""
        out, off = [], 0
        cap = self.residual_byte if self.split else self.slots[0].staging.numel()
        for p in chunk.pieces:
            nbytes = p.numel * self.elem_bytes
            if off + nbytes <= cap:
                out.append((p, off))
                off = zero.align_up(off + nbytes, self.io_alignment)
            else:
                out.append((p, None))
        return out

    @staticmethod
    def _piece_view(slot: Slot, byte_off: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = numel * torch.tensor([], dtype=dtype).element_size()
        return slot.staging[byte_off:byte_off + nbytes].view(dtype)

    # -- reads ------------------------------------------------------------------------------------------
    def _submit_reads(self, ci: int, slot: Slot, *, with_grads: bool, moments: bool = True,
                      master: bool = True) -> None:
        """Queue chunk ci's master (unless not `master`; with `moments`, exp_avg / exp_avg_sq; with `with_grads`, its
        gradient pieces) into `slot`."""
        chunk = self.chunks[ci]
        n = chunk.numel
        slot.pending = []
        slot.stepped, slot.grads = None, None
        if master:
            self.read_master(ci, slot, wait=False)
        elif self.split:  # the upper halves come from the parameters in memory (overlap.Speculator._copy_master)
            slot.pending.append(self.store.submit("r", self._residual(slot, n).data_ptr(), n * 2,
                                                  self.state_key(ci, RESIDUAL), 0))
            slot.join = (ci, self.generation[ci], n)
            self.counters.optimizer_read_bytes += n * 2
        if moments and ci in self.states_written:
            self._submit_moment_reads(ci, slot)
        elif moments:
            # Before the first step: CPU Adam's states start as zeros (cpu_adam.py zeros_like), no read needed.
            slot.exp_avg.narrow(0, 0, n).zero_()
            slot.exp_avg_sq.narrow(0, 0, n).zero_()
        slot.placements = self._place(chunk)
        slot.direct = set()
        if with_grads:
            gb = self.grad_bytes
            for p, off in slot.placements:
                key = self.grad_keys[chunk.sub_group][p.param]
                if key not in self.grad_written:
                    slot.grad.narrow(0, p.chunk_offset, p.numel).zero_()
                    continue
                if self.grad_bytes == 4 and in_dram(self.store, key, p.param_offset * gb, p.numel, torch.float32) \
                        is not None:  # held in DRAM: one copy into the fp32 gradient (none where _bind bound it there)
                    dst = slot.grad.narrow(0, p.chunk_offset, p.numel)
                    slot.pending.append(self.store.submit("r", dst.data_ptr(), p.numel * gb, key, p.param_offset * gb))
                    slot.direct.add(p.chunk_offset)
                elif off is None:
                    # Rare (many tiny pieces in one chunk): read through the store's bounce into the grad buffer.
                    tmp = torch.empty(p.numel, dtype=self.grad_dtype)
                    self.store.complete(self.store.submit("r", tmp.data_ptr(), p.numel * gb, key, p.param_offset * gb))
                    slot.grad.narrow(0, p.chunk_offset, p.numel).copy_(tmp)
                else:
                    view = self._piece_view(slot, off, p.numel, self.grad_dtype)
                    slot.pending.append(self.store.submit("r", view.data_ptr(), p.numel * gb, key, p.param_offset * gb))
                self.counters.gradient_read_bytes += p.numel * gb

    def read_master(self, ci: int, slot: Slot, *, wait: bool) -> None:
        """Chunk ci's current master from the SSD into the slot (`wait`: now, else with the slot's other reads): its
        master key, or its parameter pieces (master_in_params)."""
        chunk = self.chunks[ci]
        pending, join = [], None
        if ci in self.master_in_params:
            pb = self.param_bytes
            held = self.held(slot, chunk.numel)
            for p in chunk.pieces:
                target = self.targets[chunk.sub_group][p.param]()
                dst = held.narrow(0, p.chunk_offset, p.numel)
                if target.key is None:  # DeepSpeed holds the partition in memory: the same values
                    src = target.tensor.narrow(0, p.param_offset, p.numel)
                    if dst.data_ptr() != src.data_ptr():  # not the partition itself (_bind)
                        dst.copy_(src)
                    continue
                pending.append(self.store.submit("r", dst.data_ptr(), p.numel * pb,
                                                 self.read_from.get(target.key, target.key), p.param_offset * pb))
            if self.split:
                pending.append(self.store.submit("r", self._residual(slot, chunk.numel).data_ptr(), chunk.numel * 2,
                                                 self.state_key(ci, RESIDUAL), 0))
                join = (ci, self.generation[ci], chunk.numel)
        else:
            pending.append(self.store.submit("r", slot.master.data_ptr(), chunk.numel * 4,
                                             self.state_key(ci, "fp32"), 0))
        self.counters.optimizer_read_bytes += chunk.numel * 4
        if wait:
            for request in pending:
                self.store.complete(request)
            slot.join = None  # a join left for step_in_one_pass would read what this one overwrites
            if join is not None:
                self._join(slot, *join)
        else:
            slot.pending.extend(pending)
            slot.join = join

    def held(self, slot: Slot, numel: int) -> torch.Tensor:
        """Where a chunk's parameters' values go in the slot to make its master (master_in_params): fp32, the master
        itself; bf16 (split), the upper half of the master buffer in the parameter dtype, joined with the residual."""
        if not self.split:
            return slot.master
        return slot.master.view(self.param_dtype).narrow(0, self.chunk_numel, numel)

    def _residual(self, slot: Slot, numel: int) -> torch.Tensor:
        """The int16 residual of a split chunk in the slot's staging buffer (`residual_byte`)."""
        return slot.staging.narrow(0, self.residual_byte, 2 * numel).view(torch.int16)

    def _join(self, slot: Slot, ci: int, generation: int, numel: int) -> None:
        """The fp32 master of split chunk ci from its bf16 parameters (upper half of the slot's master) and residual
        (read_master), in place (csrc/moments.h master_join), then the masters its residual could not hold."""
        native.master_join_tensor(slot.master, self._residual(slot, numel), numel, 2 * self.chunk_numel)
        exceptions = self.exceptions.get((ci, generation))
        if exceptions is not None:
            slot.master.index_copy_(0, *exceptions)

    def _split(self, ci: int, slot: Slot, generation: int | None, stepped: tuple | None = None) -> None:
        """Write split chunk ci's residual (its master in the slot less the bf16 round of it, which its parameters
        get) into `generation`; masters it cannot hold go to `exceptions` (csrc/moments.h master_split). `stepped`:
        step_in_one_pass made the residual (Slot.stepped)."""
        n = self.chunks[ci].numel
        residual = self._residual(slot, n)
        gen = self.generation[ci] if generation is None else generation
        if stepped is not None:
            self.exceptions[(ci, gen)] = stepped[1]
        else:
            where = native.master_split_tensor(slot.master, residual, n)
            self.exceptions[(ci, gen)] = (where, slot.master[where].clone()) if where.numel() else None
        slot.pending.append(self.store.submit("w", residual.data_ptr(), n * 2, self.state_key(ci, RESIDUAL, generation),
                                              0))
        self.counters.optimizer_write_bytes += n * 2

    def _mirror(self, ci: int, same: bool) -> None:
        """Whether chunk ci's parameters now hold its current master exactly (fp32), or its upper halves beside its
        current residual (split; see `mirrored`)."""
        if same and (self.param_bytes == 4 or (self.split and ci in self.master_in_params)):
            self.mirrored.add(ci)
        else:
            self.mirrored.discard(ci)

    def _submit_moment_reads(self, ci: int, slot: Slot) -> None:
        """exp_avg / exp_avg_sq of chunk ci into the slot; 16-bit moments land in the upper half of each fp32 buffer
        (moment_upper_byte) and _complete widens them."""
        n = self.chunks[ci].numel
        mb = self.moment_bytes
        upper = 0 if mb == 4 else self.moment_upper_byte
        for name, t in (("exp_avg", slot.exp_avg), ("exp_avg_sq", slot.exp_avg_sq)):
            slot.pending.append(self.store.submit("r", t.data_ptr() + upper, n * mb, self.state_key(ci, name), 0))
        self.counters.optimizer_read_bytes += 2 * n * mb
        slot.widen = n if mb == 2 else 0

    def _complete(self, slot: Slot, *, defer: bool = False) -> None:
        """Wait for the slot's I/O, then widen its 16-bit moments and join its master (`defer`: leave both to
        step_in_one_pass, which the chunk's compute calls)."""
        first = None
        for pending in slot.pending:
            try:
                self.store.complete(pending)
            except Exception as exc:  # noqa: BLE001 - complete every request, raise the first
                first = first or exc
        slot.pending = []
        if first is not None:
            slot.widen, slot.join = 0, None
            raise first
        if defer:
            return
        join, slot.join = slot.join, None
        if slot.widen:
            for t in (slot.exp_avg, slot.exp_avg_sq):
                native.bf16_widen_tensor(t, slot.widen, self.moment_upper_byte)
            slot.widen = 0
        if join is not None:
            self._join(slot, *join)

    # -- writes -----------------------------------------------------------------------------------------
    def _submit_writes(self, ci: int, slot: Slot, *, generation: int | None = None,
                       targets: Sequence[Sequence[Callable[[], ParamTarget]]] | None = None) -> None:
        """Master (unless the parameters hold it), moments (into `generation`, default the current one) and
        parameters of chunk ci. Another generation's (a speculation's) SSD parameters go to their shadows when the
        parameters hold the master."""
        chunk = self.chunks[ci]
        n = chunk.numel
        stepped = slot.stepped if slot.stepped is not None and slot.stepped[0] == ci else None
        slot.stepped = None
        resolved = self._resolve(chunk, targets or self.targets)
        current = generation is None or generation == self.generation[ci]
        in_params = self._in_params(resolved, speculative=not current)
        if not in_params:
            slot.pending.append(self.store.submit("w", slot.master.data_ptr(), n * 4,
                                                  self.state_key(ci, "fp32", generation), 0))
            self.counters.optimizer_write_bytes += n * 4
        elif self.split:
            self._split(ci, slot, generation, stepped)
        self._submit_moment_writes(ci, slot, generation, narrowed=stepped is not None)
        if current:
            self.states_written.add(ci)
            (self.master_in_params.add if in_params else self.master_in_params.discard)(ci)
            self._write_params(chunk, slot, resolved, staged=stepped is not None and stepped[2])
            self._mirror(ci, True)
            return
        (self.spec_in_params.add if in_params else self.spec_in_params.discard)(ci)
        self._write_params(chunk, slot, resolved, shadow=self.params_hold_master,
                           staged=stepped is not None and stepped[2])
        if not in_params:
            self.mirrored.discard(ci)  # pieces written in place are ahead of the current master

    def _in_params(self, resolved: Sequence[ParamTarget], *, speculative: bool = False) -> bool:
        """Whether the parameter partitions at `resolved` hold the chunk's master once written: each on the SSD, or
        resident (a speculation's next values of it held apart: _buffers)."""
        return self.params_hold_master and all(
            t.key is not None or (t.resident and (not speculative or self._buffers(t))) for t in resolved)

    def _buffers(self, target: ParamTarget) -> bool:
        """Whether a speculation holds its next values of this resident partition apart (spec_resident)."""
        return target.resident and self.buffer_resident

    def _resolve(self, chunk: zero.Chunk, targets) -> list[ParamTarget]:
        """Where each piece of `chunk` is now, in chunk.pieces order."""
        return [targets[chunk.sub_group][p.param]() for p in chunk.pieces]

    def _submit_moment_writes(self, ci: int, slot: Slot, generation: int | None = None, *,
                              narrowed: bool = False) -> None:
        """exp_avg / exp_avg_sq of chunk ci from the slot; 16-bit moments are narrowed in place into the lower half
        of each fp32 buffer first unless `narrowed` (step_in_one_pass did; the slot's fp32 moments are spent then)."""
        n = self.chunks[ci].numel
        mb = self.moment_bytes
        for which, (name, t) in enumerate((("exp_avg", slot.exp_avg), ("exp_avg_sq", slot.exp_avg_sq))):
            if mb == 2 and not narrowed:
                native.bf16_narrow_sr_tensor(t, n, rounding_seed(ci, which, self.rounding_step))
            slot.pending.append(self.store.submit("w", t.data_ptr(), n * mb, self.state_key(ci, name, generation), 0))
        self.counters.optimizer_write_bytes += 2 * n * mb

    def _write_params(self, chunk: zero.Chunk, slot: Slot, resolved: Sequence[ParamTarget] | None = None, *,
                      shadow: bool = False, staged: bool = False) -> None:
        """The chunk's updated master to the 16-bit parameter partitions (copy in memory, or write to the SSD; with
        `shadow`, to the SSD partitions' shadows). `staged`: step_in_one_pass wrote the pieces at staging offsets."""
        pb = self.param_bytes
        resolved = resolved or self._resolve(chunk, self.targets)
        for (p, off), target in zip(slot.placements, resolved):
            src = slot.master.narrow(0, p.chunk_offset, p.numel)
            if target.key is None:
                dst = target.tensor.narrow(0, p.param_offset, p.numel)
                if shadow and self._buffers(target):
                    self.spec_resident.append((dst, src.clone()))
                elif dst.data_ptr() != src.data_ptr():  # stepped in place where the master is the partition (_bind)
                    dst.copy_(src)
                continue
            key = target.key
            if shadow:
                self.shadowed.add(key)
                key = shadow_key(key)
            nbytes = p.numel * pb
            dst = in_dram(self.store, key, p.param_offset * pb, p.numel, self.param_dtype, write=True)
            if dst is not None:  # held in DRAM: one copy (none where the master is this partition, _bind)
                if dst.data_ptr() != src.data_ptr():
                    dst.copy_(src)
                slot.pending.append(self.store.submit("w", dst.data_ptr(), nbytes, key, p.param_offset * pb))
            elif off is None:
                tmp = src.to(self.param_dtype)
                self.store.complete(self.store.submit("w", tmp.data_ptr(), nbytes, key, p.param_offset * pb))
            else:
                view = self._piece_view(slot, off, p.numel, self.param_dtype)
                if not staged:
                    view.copy_(src)
                slot.pending.append(self.store.submit("w", view.data_ptr(), nbytes, key, p.param_offset * pb))
            self.counters.param_write_bytes += nbytes

    # -- a speculation's generation (engine/overlap.py) -------------------------------------------------
    def commit_speculation(self, done: Sequence[int]) -> None:
        """The speculative updates of `done` (written, completed) become the current states: their generation flips
        and the shadows written become the parameter partitions (an extent exchange, no I/O)."""
        self.read_from.clear()
        for key in sorted(self.shadowed):
            self.store.exchange(key, shadow_key(key))
            self.read_from[key] = shadow_key(key)
        self.shadowed.clear()
        for dst, values in self.spec_resident:
            dst.copy_(values)
        self.spec_resident.clear()
        for ci in done:
            self.generation[ci] = 1 - self.generation[ci]
            self.states_written.add(ci)
            (self.master_in_params.add if ci in self.spec_in_params else self.master_in_params.discard)(ci)
            self._mirror(ci, True)  # the speculation wrote the parameters from this master
        self.spec_in_params.clear()

    def drop_speculation(self, done: Sequence[int] = ()) -> list[int]:
        """Forget a speculation: the current states stay. Returns the chunks of `done` whose parameters it wrote in
        place (in memory, or without shadows): a rollback rewrites them from the current master."""
        back = [ci for ci in done if ci not in self.spec_in_params]
        self.shadowed.clear()
        self.spec_resident.clear()
        self.spec_in_params.clear()
        return back

    def end_step(self) -> None:
        """Every chunk of the step is stepped: the exchanged shadows' old values are no longer needed."""
        self.read_from.clear()

    def prepare_speculation(self, targets) -> None:
        """Before the first speculation writing to `targets` (params_hold_master): a full copy of each SSD parameter
        partition under its shadow key (reserved at its length, so a speculation can write any piece of it and its
        exchange hands DeepSpeed a partition of the same length); resident partitions are buffered if small."""
        buf = self.slots[0].master
        cap = buf.numel() * buf.element_size()
        resolved = [fn() for group in targets for fn in group]
        self.buffer_resident = sum(4 * t.numel for t in resolved if t.resident) <= SPEC_RESIDENT_MAX_BYTES
        for key in sorted({t.key for t in resolved if t.key is not None}):
            total = self.store.written_bytes(key)
            if not total or self.store.written_bytes(shadow_key(key)):
                continue
            self.store.reserve(shadow_key(key), total)
            for off in range(0, total, cap):
                m = min(cap, total - off)
                self.store.complete(self.store.submit("r", buf.data_ptr(), m, key, off))
                self.store.complete(self.store.submit("w", buf.data_ptr(), m, shadow_key(key), off))
                self.counters.param_read_bytes += m
                self.counters.param_write_bytes += m

    # -- the pipelined walk -----------------------------------------------------------------------------
    def run(self, compute: Callable[[int, zero.Chunk, Slot], None], *, with_grads: bool = True,
            writes: str = "all", chunks: Sequence[int] | None = None) -> None:
        """Read, `compute` (in place on the slot), write back (`writes`: all, params, none), for every chunk or the
        chunk indices `chunks` (ascending); the I/O of neighbours overlaps."""
        depth = len(self.slots)
        order = list(range(len(self.chunks)) if chunks is None else chunks)
        if not order:
            return
        lookahead = max(1, depth - 1)  # with depth 3: chunk i+1 reading, chunk i-1 writing
        one_pass = getattr(compute, "one_pass", False)
        inflight_reads: dict[int, Slot] = {}
        next_read = 0

        def start_read(pos: int) -> None:
            ci = order[pos]
            slot = self.slots[pos % depth]
            self._complete(slot)  # the write-back of the chunk that used this slot before
            self._bind(slot, ci if writes == "all" else None)
            self._submit_reads(ci, slot, with_grads=with_grads, moments=writes == "all")
            inflight_reads[ci] = slot

        try:
            for pos, ci in enumerate(order):
                while next_read < len(order) and next_read <= pos + lookahead - 1:
                    start_read(next_read)
                    next_read += 1
                slot = inflight_reads.pop(ci)
                self._complete(slot, defer=one_pass)
                if with_grads:
                    self._widen_grads(ci, slot, defer=one_pass)
                compute(ci, self.chunks[ci], slot)
                if writes == "all":
                    self._submit_writes(ci, slot)
                elif writes == "params":
                    self._write_params(self.chunks[ci], slot)
                    self._mirror(ci, True)
                if next_read < len(order):
                    start_read(next_read)
                    next_read += 1
        finally:
            first = None
            for s in self.slots:
                try:
                    self._complete(s)
                except Exception as exc:  # noqa: BLE001 - drain every slot, raise the first failure
                    first = first or exc
                self._bind(s, None)  # every other user of a slot (overlap, checkpoints) fills its own buffers
            if first is not None:
                raise first

    def _bind(self, slot: Slot, ci: int | None) -> None:
        """The slot's master and moments: its own buffers, or (`ci`: chunk ci stepped into its current generation,
        run()) chunk ci's bytes held in the DRAM tier (dram_tier.in_dram), so that Adam steps them where they live and
        the store copies nothing for their read and write-back (each submitted at the tier's own address): fp32
        moments, and the master of a one-piece chunk whose fp32 parameter partition holds it (params_hold_master),
        held in the tier or resident in memory (no offload_param: the partition itself, as ZeRO-Offload steps its
        fp32 partitions in place). A speculation (engine/overlap.py) keeps the old states for a redo, so it steps on
        its slots' own buffers."""
        slot.master, slot.exp_avg, slot.exp_avg_sq, slot.grad = slot.home
        if ci is None:
            return
        chunk = self.chunks[ci]
        if self.moment_bytes == 4:
            moments = [in_dram(self.store, self.state_key(ci, name), 0, chunk.numel, torch.float32, write=True)
                       for name in ("exp_avg", "exp_avg_sq")]
            if all(m is not None for m in moments):
                slot.exp_avg, slot.exp_avg_sq = moments
        if len(chunk.pieces) == 1 and self.grad_bytes == 4:
            # A one-piece chunk's fp32 gradient held in the tier is read where it is (its read lands at the tier's
            # own address): written again by the next backward, nothing reads it after this step.
            p = chunk.pieces[0]
            grad = in_dram(self.store, self.grad_keys[chunk.sub_group][p.param], p.param_offset * 4, p.numel,
                           torch.float32)
            if grad is not None:
                slot.grad = grad
        if ci in self.master_in_params and not self.split and len(chunk.pieces) == 1 and not self.read_from:
            p = chunk.pieces[0]
            target = self.targets[chunk.sub_group][p.param]()
            if target.key is not None:
                master = in_dram(self.store, target.key, p.param_offset * 4, p.numel, torch.float32)
            elif target.resident and target.tensor.dtype == torch.float32 and target.tensor.is_contiguous() \
                    and target.tensor.device.type == "cpu":
                # A resident fp32 partition in host memory (the dram placement's parameters on the CPU accelerator,
                # or offload_param cpu) is the master: Adam steps it there; one on a GPU is copied as before.
                master = target.tensor.narrow(0, p.param_offset, p.numel)
                self.counters.master_in_place_bytes += 4 * p.numel
            else:
                master = None
            if master is not None:
                slot.master = master

    def _widen_grads(self, ci: int, slot: Slot, *, defer: bool = False) -> None:
        """16-bit gradient pieces -> the fp32 gradient of the chunk (exact: every 16-bit value is an fp32 value);
        `defer`: left to step_in_one_pass (Slot.grads)."""
        if defer:
            slot.grads = {}
        for p, off in slot.placements:
            staged = off is not None and p.chunk_offset not in slot.direct and \
                self.grad_keys[self.chunks[ci].sub_group][p.param] in self.grad_written
            if defer:
                slot.grads[p.chunk_offset] = staged
            elif staged:
                slot.grad.narrow(0, p.chunk_offset, p.numel).copy_(self._piece_view(slot, off, p.numel,
                                                                                     self.grad_dtype))

    def initialize(self) -> None:
        """Create every chunk's fp32 master from the 16-bit parameter partitions (exp_avg/exp_avg_sq stay absent
        until the first step writes them: they start as zeros, as CPU Adam creates them). A chunk whose fp32
        partitions are all on the SSD already holds it there (params_hold_master)."""
        for ci, chunk in enumerate(self.chunks):
            slot = self.slots[0]
            n = chunk.numel
            pb = self.param_bytes
            in_params = self._in_params(self._resolve(chunk, self.targets))
            if in_params and not self.split:
                self.master_in_params.add(ci)
                self._mirror(ci, True)
                continue
            for p in chunk.pieces:
                target = self.targets[chunk.sub_group][p.param]()
                dst = slot.master.narrow(0, p.chunk_offset, p.numel)
                if target.key is None:
                    dst.copy_(target.tensor.narrow(0, p.param_offset, p.numel))
                    continue
                view = self._piece_view(slot, 0, p.numel, self.param_dtype)
                self.store.complete(self.store.submit("r", view.data_ptr(), p.numel * pb, target.key,
                                                      p.param_offset * pb))
                self.counters.param_read_bytes += p.numel * pb
                dst.copy_(view)
            if in_params:  # split: the master is the parameters exactly, its residual zeros
                self.master_in_params.add(ci)
                slot.pending, slot.stepped = [], None
                self._split(ci, slot, None)
                self._complete(slot)
            else:
                self.store.complete(self.store.submit("w", slot.master.data_ptr(), n * 4, self.state_key(ci, "fp32"),
                                                      0))
                self.counters.optimizer_write_bytes += n * 4
            self._mirror(ci, True)

    def read_state(self, ci: int) -> dict[str, torch.Tensor]:
        """A copy of chunk ci's master and Adam states (zeros before the first step), for checkpoints."""
        if self.settle is not None:
            self.settle()
        slot = self.slots[0]
        n = self.chunks[ci].numel
        slot.pending = []
        self.read_master(ci, slot, wait=False)
        if ci in self.states_written:
            self._submit_moment_reads(ci, slot)
        self._complete(slot)
        out = {"fp32": slot.master.narrow(0, 0, n).clone()}
        if ci in self.states_written:
            out.update(exp_avg=slot.exp_avg.narrow(0, 0, n).clone(), exp_avg_sq=slot.exp_avg_sq.narrow(0, 0, n).clone())
        return out

    def write_state(self, ci: int, tensors: dict[str, torch.Tensor], *, params: bool = True) -> None:
        """Overwrite chunk ci's master (and Adam states when given) and, with `params`, its 16-bit parameters
        (checkpoint load; DeepSpeed's tensor-fragment setters leave the parameters to the next step)."""
        if self.settle is not None:
            self.settle()
        slot = self.slots[0]
        chunk = self.chunks[ci]
        n = chunk.numel
        slot.master.narrow(0, 0, n).copy_(tensors["fp32"])
        slot.pending, slot.stepped = [], None
        resolved = self._resolve(chunk, self.targets)
        in_params = params and self._in_params(resolved)
        if not in_params:
            slot.pending.append(self.store.submit("w", slot.master.data_ptr(), n * 4, self.state_key(ci, "fp32"), 0))
            self.counters.optimizer_write_bytes += n * 4
        elif self.split:
            self._split(ci, slot, None)
        (self.master_in_params.add if in_params else self.master_in_params.discard)(ci)
        if "exp_avg" in tensors:
            slot.exp_avg.narrow(0, 0, n).copy_(tensors["exp_avg"])
            slot.exp_avg_sq.narrow(0, 0, n).copy_(tensors["exp_avg_sq"])
            self._submit_moment_writes(ci, slot)
            self.states_written.add(ci)
        else:
            self.states_written.discard(ci)
        slot.placements = self._place(chunk)
        if params:
            self._write_params(chunk, slot, resolved)
        self._mirror(ci, params)
        self._complete(slot)
