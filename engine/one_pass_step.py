"""The optimizer step of one chunk in one pass (OptimizerPipeline.step_in_one_pass).

A chunk's step used to be a series of passes over its slot buffers on the thread that also drives backward: widen the
16-bit gradient, widen exp_avg and exp_avg_sq, join the master from its bf16 parameters and residual, scale the
gradient, DeepSpeed's CPU Adam, split the master again, narrow the moments, round the parameters. With the constants of
DeepSpeed's Adam for the call (engine/ds_internals/cpu_adam.py, checked against its op) the widenings, the join, Adam,
the split and the narrowings are one native pass (csrc/moments.h adam_step_fused) over all of the chunk but its last
elements, which DeepSpeed's op steps itself (its scalar loop: not reproduced). Each of them is elementwise (a narrowed
moment's rounding noise hashes its index in the chunk), so the bits are those of the separate passes.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import torch
from memascend_engine import native

OP_TAIL = 16
"""DeepSpeed's CPU Adam steps the last n mod 16 elements of a call in a scalar loop (cpu_adam.h: 16 floats per
AVX-512 vector; AVX2 leaves n mod 8 of them); the fused pass takes the elements before those only."""


def rounding_seed(*parts: int) -> int:
    """A 32-bit seed from integers (chunk, moment, optimizer step): the noise stream of 16-bit moments' stochastic
    rounding (csrc/moments.h), fresh every step and the same on every path of one step (the overlap's speculation and
    its redo)."""
    h = 0x811C9DC5
    for p in parts:
        h = ((h ^ (int(p) & 0xFFFFFFFF)) * 0x01000193) & 0xFFFFFFFF  # FNV-1a over 32-bit words
    return h


class OnePassStep:
    """OptimizerPipeline's one-pass step (the pipeline's buffers, layout and keys are its own)."""

    def take_grad(self, slot, piece, values: torch.Tensor) -> None:
        """Piece `piece` of a chunk being assembled gets its gradient `values` (engine/overlap.py's offers): 16-bit
        values into the piece's staging bytes for step_in_one_pass to widen (a slot taking offers for it: Slot.grads
        is a dict), else widened into the fp32 gradient now."""
        if slot.grads is not None:
            off = {p.chunk_offset: off for p, off in slot.placements}.get(piece.chunk_offset)
            staged = off is not None and values.dtype == self.grad_dtype and self.grad_bytes == 2
            slot.grads[piece.chunk_offset] = staged
            if staged:
                self._piece_view(slot, off, piece.numel, self.grad_dtype).copy_(values)
                return
        slot.grad.narrow(0, piece.chunk_offset, piece.numel).copy_(values)

    def step_in_one_pass(self, ci: int, slot, update: Callable[[int, int], None], adam: tuple | None = None,
                         threads: int = 1) -> None:
        """Step chunk ci in the slot: the gradient pieces waiting in staging (Slot.grads), then with `adam`
        (DeepSpeed's constants for the call: engine/ds_internals/cpu_adam.py) the fused pass over all but the last
        n mod OP_TAIL elements; the rest gets the widening and join _complete(defer=True) left, `update(start,
        count)` (DeepSpeed's op on those elements of the slot's buffers, in place; called even for none: the op
        counts its step per call), the split and the narrowing. Then the parameters' rounding into their staging
        bytes. The writes (_submit_writes) take the result as it is (Slot.stepped). `threads` 2 (a step after
        backward, whose cores are free): a plain fp32 chunk (nothing to widen, join, split or narrow) is stepped by
        DeepSpeed's op on every core, the fused pass's bits (its probe: OpConstants), in a third of one thread's pass
        (84M elements on this 2-core VM, quiet: 0.06-0.13 s against 0.19)."""
        n = self.chunks[ci].numel
        widen, join, grads = slot.widen, slot.join, slot.grads
        slot.widen, slot.join, slot.grads = 0, None, None
        fix = self.exceptions.get(join[:2]) if join is not None else None
        seeds = [rounding_seed(ci, which, self.rounding_step) for which in (0, 1)]
        residual = self._residual(slot, n) if self.split else None
        if grads is not None:
            self._fill_grads(slot, grads)
        found, start = [], 0
        if adam is not None:
            start = n - n % OP_TAIL
            flags = ((native.WIDEN_MOMENTS if widen else 0) | (native.JOIN_MASTER if join is not None else 0)
                     | (native.SPLIT_MASTER if self.split else 0) | (native.NARROW_MOMENTS if self.moment_bytes == 2
                                                                     else 0))
            if flags == 0 and threads > 1:
                update(0, start)
            else:
                found.append(native.adam_step_fused_tensors(
                    slot.master, residual, slot.exp_avg, slot.exp_avg_sq, slot.grad, start, 2 * self.chunk_numel,
                    flags, fix, adam, seeds))
        count = n - start
        if widen:
            for t in (slot.exp_avg, slot.exp_avg_sq):
                native.bf16_widen_tensor(t, count, self.moment_upper_byte, start)
        if join is not None:
            native.master_join_tensor(slot.master, residual, count, 2 * self.chunk_numel, start)
            if fix is not None:
                fixes = fix[0].tolist()
                lo, hi = bisect.bisect_left(fixes, start), len(fixes)
                if hi > lo:
                    slot.master.index_copy_(0, fix[0][lo:hi], fix[1][lo:hi])
        update(start, count)
        if self.split:
            found.append(native.master_split_tensor(slot.master, residual, count, start))
        if self.moment_bytes == 2:
            for t, seed in zip((slot.exp_avg, slot.exp_avg_sq), seeds):
                native.bf16_narrow_sr_tensor(t, count, seed, start)
        # A piece's parameter bytes end below its spent gradient's; a master bound where the parameters live (the
        # tier's key or the resident partition: OptimizerPipeline._bind) is already them, nothing to stage.
        params = self.param_bytes <= self.grad_bytes and slot.master is slot.home[0]
        if params:
            for p, off in slot.placements:
                if off is not None:
                    self._piece_view(slot, off, p.numel, self.param_dtype).copy_(
                        slot.master.narrow(0, p.chunk_offset, p.numel))
        where = torch.cat(found) if found else torch.empty(0, dtype=torch.int64)
        exceptions = (where, slot.master[where].clone()) if where.numel() else None
        slot.stepped = (ci, exceptions, params)

    def _fill_grads(self, slot, grads: dict) -> None:
        """The chunk's fp32 gradient: staged pieces widened, pieces without one zeroed."""
        for p, off in slot.placements:
            staged = grads.get(p.chunk_offset)
            dst = slot.grad.narrow(0, p.chunk_offset, p.numel)
            if staged is None:
                dst.zero_()
            elif staged:
                dst.copy_(self._piece_view(slot, off, p.numel, self.grad_dtype))
