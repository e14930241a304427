"""The optimizer step overlapped with backward (EngineOptions.overlap_optimizer).

At the micro-batch that ends a step, each optimizer chunk (zero.optimizer_chunks) is updated as soon as the last of its
gradient pieces is reduced, while backward goes on: its master and moments are read into one of the pipeline's slots
when its first piece arrives, Adam runs when its last piece does (on a step thread, beside backward), and the update
goes to the chunk's other extent set (OptimizerPipeline.generation) and to its parameters. The old master and moments
stay where they are until step() decides:

* commit: the step's own unscale-and-clip factor is the one the speculation used (no clipping, the same loss scale, no
  overflow): the chunk's generation flips, nothing else moves;
* redo: clipping triggered or the loss scale changed: the speculation is dropped and the ordinary pipeline steps every
  chunk from the old states and the gradients on the SSD (which stream there as before whenever clipping is on);
* rollback: an overflow or an invalid norm skips the step: the speculation is dropped and the parameters are rewritten
  from the old masters.

In fp32 the parameter partitions are the master's exact copy (OptimizerPipeline.mirrored): a chunk then takes its master
from the partitions backward fetched, as DeepSpeed drops them (Speculator.released), and reads only its moments
(EngineOptions.master_from_params: 4 B per parameter less read per step; in bf16 the partitions hold the master's upper
halves, OptimizerPipeline.split, and a chunk reads only the 2 B residual beside them). DeepSpeed drops a layer's partitions before
its gradients are reduced, when most of its chunks cannot have a slot yet: the param swapper keeps such a partition in
its pool slot until the gradient's offer has copied it (engine/ds_internals/swapper.py _keeps_for_master), or until a
fetch needs the slot. With EngineOptions.params_hold_master the partitions on the SSD are the only master: the
speculation writes the next parameters to shadow partitions, exchanged with the current ones at the commit, so a redo or
a rollback still finds the old master in place (4 B per parameter less written per step; bf16: 2 B).

Both paths make the same DeepSpeedCPUAdam op calls on the same values, so a committed step is bit-identical to the step
without overlap (speculation, then validation: SuperOffload, arXiv 2509.21271; the optimizer overlapped with backward:
LoHan, arXiv 2403.06504).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from memascend_engine.optimizer_pipeline import OptimizerPipeline, Slot

NEW, ASSEMBLING, DONE, FALLBACK = "new", "assembling", "done", "fallback"


@dataclass
class OverlapCounters:
    """What the overlap did, over the run."""

    chunks_committed: int = 0
    """Chunks whose speculative update became the step's."""
    chunks_fallback: int = 0
    """Chunks that found no free slot during backward and were stepped after it, as without overlap."""
    steps_committed: int = 0
    steps_redone: int = 0
    """Steps whose speculation clipping or a loss-scale change invalidated: stepped again from the old states."""
    steps_rolled_back: int = 0
    """Steps an overflow or invalid norm skipped: the parameters rewritten from the old masters."""
    steps_not_speculated: int = 0
    """Steps that did not speculate because the previous step clipped (a redo is then likely)."""
    master_bytes_from_memory: int = 0
    """Master bytes taken from parameter partitions DeepSpeed held in memory instead of read from the SSD (fp32: the
    master; bf16 with OptimizerPipeline.split: its upper halves; a chunk missing a piece reads its whole master: its
    copies do not count)."""
    chunks_read_ahead: int = 0
    """Chunks whose reads started before their first gradient piece or partition release (Speculator._read_ahead)."""
    chunks_stepped_on_thread: int = 0
    """Chunks stepped on the step thread while backward went on (Speculator._step_thread)."""


@dataclass
class _Step:
    compute: Callable[[int, object, Slot], None]
    state: list[str]
    remaining: list[int]
    slot_of: dict[int, Slot] = field(default_factory=dict)
    copied: dict[int, set[int]] = field(default_factory=dict)
    """Chunks taking their master from the parameters (OptimizerPipeline.mirrored) -> chunk offsets of the pieces
    copied so far."""
    updated: list[int] = field(default_factory=list)
    """Chunk indices in the order they were updated (their gradients complete in that order every step): the next
    step's read-ahead order. Not the order they took a slot: a chunk started at its partition's release (the tied
    embedding's, long before its gradient) would then be read ahead first and hold its slot through backward."""
    cursor: int = 0
    """Position in the read-ahead order (Speculator.order) up to which every chunk has started."""


class Speculator:
    """Speculative chunk updates during the last micro-batch's backward, on `pipeline`'s slots (no other memory).

    `spec_targets[g][j]()`: where to write parameter j of sub-group g while backward runs (the SSD extent of a
    swapped partition even while DeepSpeed holds a copy in memory, which it drops unwritten after backward).
    """

    def __init__(self, pipeline: OptimizerPipeline, spec_targets, counters: OverlapCounters, *,
                 master_from_params: bool = False):
        self.pipeline = pipeline
        self.master_from_params = master_from_params
        """EngineOptions.master_from_params: copy the fp32 master of a mirrored chunk (bf16: its upper halves) from its
        parameters."""
        self.spec_targets = spec_targets
        self.counters = counters
        self.pieces: dict[tuple[int, int], list[tuple[int, object]]] = {}
        """(sub-group, parameter) -> [(chunk index, piece)] of that parameter."""
        for ci, chunk in enumerate(pipeline.chunks):
            for p in chunk.pieces:
                self.pieces.setdefault((chunk.sub_group, p.param), []).append((ci, p))
        pipeline.settle = self.settle
        self.step: _Step | None = None
        self.finished: tuple[list[int], list[int]] | None = None
        """finish()'s result once taken (by settle() before step())."""
        self.skipped = False
        """This step decided not to speculate (reset by step())."""
        self.invalidated = False
        """Optimizer states or gradients were set between backward and step(): the step is redone (reset with it)."""
        self.consumed: set[str] = set()
        """Gradient keys stepped during backward and kept nowhere (clipping off): unreadable until step()."""
        self._busy: list[Slot] = []
        """Slots whose speculative writes are in flight (or whose step still runs), oldest first."""
        self._stepping: dict[int, tuple[int, Future]] = {}
        """id(slot) -> (chunk, its step on the step thread) for updated chunks whose writes are not submitted yet."""
        self._step_thread: ThreadPoolExecutor | None = None
        """One thread steps the updated chunks, in update order (DeepSpeed's op counts its calls), while the thread
        that drives backward goes on computing the gradients; their writes are submitted from that thread once a
        step is done (_submit_stepped), so the store is used from one thread as before."""
        self.order: list[int] = []
        """The order in which the last speculated step's chunks took a slot: backward reduces the same gradients in
        the same order every step, so the next step reads them in that order ahead of their gradients."""
        self.lookahead = max(1, len(pipeline.slots) - 2)
        """Chunks read ahead at once: with 3 slots one, so that two hold writes in flight (fp32 writes 16 B per
        parameter a step against 12 read)."""

    @property
    def active(self) -> bool:
        return self.step is not None

    def begin(self, compute: Callable[[int, object, Slot], None]) -> None:
        """Start speculating this step with `compute(ci, chunk, slot)` (Adam on the slot, in place)."""
        chunks = self.pipeline.chunks
        self.step = _Step(compute, [NEW] * len(chunks), [len(c.pieces) for c in chunks])
        self._read_ahead()

    def _spare_slots(self) -> int:
        """Slots no assembling chunk holds."""
        held = {id(s) for s in self.step.slot_of.values()}
        return sum(id(s) not in held for s in self.pipeline.slots)

    def _free_slot(self) -> Slot | None:
        held = {id(s) for s in self.step.slot_of.values()}
        free = [s for s in self.pipeline.slots if id(s) not in held]
        if not free:
            return None
        idle = [s for s in free if not s.pending and id(s) not in self._stepping]
        if idle:
            return idle[0]
        oldest = next(s for s in self._busy if id(s) not in held)  # wait for its step and its writes
        self._busy.remove(oldest)
        self._submit_stepped(oldest)
        self.pipeline._complete(oldest)
        return oldest

    def offer(self, g: int, j: int, grad: torch.Tensor | None) -> bool:
        """Parameter j of sub-group g has its final gradient `grad` (its whole partition, any device; None: no data on
        this rank, zeros): copy its pieces into their chunks' slots and update every chunk it completes. Returns
        whether some chunk of it fell back (its gradient must then go to the SSD for the step)."""
        st = self.step
        self._submit_ready()
        flat = None if grad is None else grad.detach().reshape(-1)
        fell_back = False
        for ci, p in self.pieces.get((g, j), ()):
            if st.state[ci] == NEW:
                self._start(ci)
            if st.state[ci] == FALLBACK:
                fell_back = True
                continue
            slot = st.slot_of[ci]
            if ci in st.copied:
                target = self.pipeline.targets[g][j]()
                if target.key is None:  # a partition DeepSpeed keeps in memory
                    self._copy_master(ci, p, target.tensor)
            if flat is not None:
                self.pipeline.take_grad(slot, p, flat.narrow(0, p.param_offset, p.numel))
            st.remaining[ci] -= 1
            if st.remaining[ci] == 0:
                self._update(ci)
        return fell_back

    def _start(self, ci: int) -> None:
        """Chunk ci's first piece: a slot and its reads (moments; the master too unless the chunk's parameters mirror
        it), or FALLBACK without a free slot."""
        st, pipe = self.step, self.pipeline
        slot = self._free_slot()
        if slot is None:
            st.state[ci] = FALLBACK
            self.counters.chunks_fallback += 1
            return
        st.state[ci] = ASSEMBLING
        st.slot_of[ci] = slot
        mirrored = self.master_from_params and ci in pipe.mirrored
        if mirrored:
            st.copied[ci] = set()
        pipe._submit_reads(ci, slot, with_grads=False, master=not mirrored)
        if getattr(st.compute, "one_pass", False):
            slot.grads = {}  # pieces offered wait in staging, those never offered are zeros (step_in_one_pass)
        else:
            slot.grad.narrow(0, 0, pipe.chunks[ci].numel).zero_()

    def released(self, g: int, j: int, partition: torch.Tensor) -> bool:
        """DeepSpeed is about to drop parameter j's swapped-in partition (backward is done with it): fp32, its values
        are the master's (OptimizerPipeline.mirrored), so each chunk of it not yet updated takes its master piece
        from here instead of the SSD; a chunk not started starts now if a slot is spare (the swapper drops a layer's
        partitions before its gradients' bucket is reduced). Returns whether a chunk of it has still to start: the
        swapper then keeps the partition until the gradient's offer copies it (or it needs the slot). A chunk with a
        piece never seen in memory reads its whole master."""
        st = self.step
        self._submit_ready()
        waiting = False
        for ci, p in self.pieces.get((g, j), ()):
            if st.state[ci] == NEW and ci in self.pipeline.mirrored and self._spare_slots() >= 2:
                # A layer's release spans several chunks whose gradients come later: starting them all would take
                # the slot the gradient being reduced now needs (a fallback); one stays for the offers.
                self._start(ci)
            if st.state[ci] == ASSEMBLING and ci in st.copied:
                self._copy_master(ci, p, partition)
            waiting |= st.state[ci] == NEW and ci in self.pipeline.mirrored
        return waiting

    def _copy_master(self, ci: int, p, partition: torch.Tensor) -> None:
        """Piece p of a parameter's partition (fp32, in memory) into chunk ci's master in its slot."""
        copied = self.step.copied[ci]
        if p.chunk_offset in copied:
            return
        flat = partition.reshape(-1)
        slot = self.step.slot_of[ci]
        held = self.pipeline.held(slot, self.pipeline.chunks[ci].numel)
        held.narrow(0, p.chunk_offset, p.numel).copy_(flat.narrow(0, p.param_offset, p.numel))
        copied.add(p.chunk_offset)
        self.counters.master_bytes_from_memory += p.numel * self.pipeline.param_bytes

    def _update(self, ci: int) -> None:
        st = self.step
        slot = st.slot_of.pop(ci)
        pipe = self.pipeline
        # The master (or the moments only: see _copy_master) and moments; a one-pass compute converts them itself.
        pipe._complete(slot, defer=getattr(st.compute, "one_pass", False))
        pieces = pipe.chunks[ci].pieces
        copied = st.copied.pop(ci, None)
        if copied is not None and len(copied) < len(pieces):
            pipe.read_master(ci, slot, wait=True)  # a piece's partition was not in memory: the SSD has every piece
            self.counters.master_bytes_from_memory -= sum(pipe.param_bytes * p.numel for p in pieces
                                                          if p.chunk_offset in copied)
        if self._step_thread is None:
            self._step_thread = ThreadPoolExecutor(1, thread_name_prefix="memascend-step")
        self._stepping[id(slot)] = (ci, self._step_thread.submit(st.compute, ci, pipe.chunks[ci], slot))
        self.counters.chunks_stepped_on_thread += 1
        st.state[ci] = DONE
        st.updated.append(ci)
        self._busy.append(slot)
        self._submit_ready()
        self._read_ahead()

    def _submit_ready(self) -> None:
        """Submit the writes of the chunks the step thread has finished, in update order: called at every offer and
        release too, so that a finished step's writes do not wait for the next chunk's update."""
        for s in list(self._busy):
            if id(s) in self._stepping and not self._stepping[id(s)][1].done():
                return
            self._submit_stepped(s)

    def _submit_stepped(self, slot: Slot) -> None:
        """Wait for the step of the chunk in `slot` (if not submitted yet) and submit its speculative writes."""
        got = self._stepping.pop(id(slot), None)
        if got is None:
            return
        ci, stepping = got
        stepping.result()
        pipe = self.pipeline
        pipe._submit_writes(ci, slot, generation=1 - pipe.generation[ci], targets=self.spec_targets)

    def _read_ahead(self) -> None:
        """Start the next chunks of the last step's order: their moments (and a master not taken from the
        parameters) are read while backward computes the gradients they wait for, instead of after the first one
        arrives, with the thread that drives backward waiting on them (a py-spy profile of bench-llama-136m's fp32
        step at 400 MB/s: 15% of it). Up to `lookahead` chunks assemble at once, and a slot always stays for a chunk
        out of that order (none free: it falls back)."""
        st = self.step
        while len(st.slot_of) < self.lookahead and self._spare_slots() >= 2:
            while st.cursor < len(self.order) and st.state[self.order[st.cursor]] != NEW:
                st.cursor += 1
            if st.cursor >= len(self.order):
                return
            self._start(self.order[st.cursor])
            self.counters.chunks_read_ahead += 1

    def settle(self) -> None:
        """Finish the speculation now: a checkpoint or DeepSpeed's tensor-fragment API reads the optimizer states
        through the pipeline's slots between backward and step() (they see the states before the step)."""
        if self.step is not None and self.finished is None:
            self.finished = self._finish()

    def finish(self) -> tuple[list[int], list[int]]:
        """End of backward: update the chunks still assembling (their missing pieces had no gradient: zeros, as in
        DeepSpeed's zeroed buffer) and wait for every write. Returns (speculated, not speculated) chunk indices."""
        self.settle()
        return self.finished

    def _finish(self) -> tuple[list[int], list[int]]:
        st = self.step
        st.cursor = len(self.order)  # backward is over: nothing more to read ahead
        for ci in sorted(st.slot_of):
            self._update(ci)
        first = None
        for slot in self._busy:
            try:
                self._submit_stepped(slot)
            except Exception as exc:  # noqa: BLE001 - a failed step: its writes are never submitted
                first = first or exc
            try:
                self.pipeline._complete(slot)
            except Exception as exc:  # noqa: BLE001 - drain every slot, raise the first
                first = first or exc
        self._busy = []
        if first is not None:
            self.step = None
            self.pipeline.drop_speculation()
            raise first
        self.order = st.updated
        done = [ci for ci, s in enumerate(st.state) if s == DONE]
        rest = [ci for ci, s in enumerate(st.state) if s != DONE]
        return done, rest

    def commit(self, done: list[int]) -> None:
        """The speculative updates of `done` become the current states."""
        self.pipeline.commit_speculation(done)
        self.counters.chunks_committed += len(done)
        self.counters.steps_committed += 1
        self.drop()

    def drop(self, done: list[int] = ()) -> list[int]:
        """Forget the speculation (the old generation stays current). Returns the chunks of `done` whose parameters
        it wrote in place: a rollback rewrites them."""
        self.step, self.finished, self.invalidated = None, None, False
        self.consumed.clear()
        return self.pipeline.drop_speculation(done)

