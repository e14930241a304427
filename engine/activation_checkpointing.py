"""Offloaded gradient checkpointing: each decoder layer's input lives on the SSD or in pinned host memory.

With an SSD stash (memascend_engine.bounded.CheckpointStash, the default with a region) the input is written to
the region through a small ring of aligned buffers and read back, one layer ahead, in backward: host memory holds a
few layers' checkpoints, not b x s x h x L. With the DRAM stash:

Forward runs every decoder layer under ``no_grad`` and keeps only the layer's input hidden states;
on a GPU they are copied (non-blocking) into an exact-size pinned host buffer from the engine's
allocator (no power-of-two rounding, cudaHostRegistered so the copy is a real async DMA). Backward
copies the input back, recomputes the layer with grad enabled and back-propagates through it
(reentrant checkpointing, which ZeRO-3's module hooks support: the recompute fetches the layer's
parameters again). RNG state is forked and restored so a recompute sees the same random numbers.

On a CPU-only job with the DRAM stash the hidden states already live in host memory; the input is kept as is
(plain full checkpointing, as the planner models it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class _HostStash:
    """Reusable pinned host buffers keyed by (dtype, numel) (one per live checkpoint).

    On CUDA the buffers are only ever touched by non_blocking copies, so what orders their reuse is
    a CUDA event per buffer: ``take`` makes the current stream wait for the last copy that read
    the buffer before the next copy writes it, whichever stream each ran on.
    """

    def __init__(self, allocator):
        self._allocator = allocator
        self._free: dict[tuple, list] = {}
        self._mutex = threading.Lock()
        self.live_bytes = 0
        self.peak_bytes = 0

    def take(self, like) -> Any:
        import torch

        key = (like.dtype, like.numel())
        with self._mutex:
            bucket = self._free.get(key)
            buf, last_read = bucket.pop() if bucket else (None, None)
        if buf is None:
            buf = self._allocator.empty(like.numel(), like.dtype) if self._allocator is not None else \
                torch.empty(like.numel(), dtype=like.dtype, pin_memory=True)
        elif last_read is not None:
            torch.cuda.current_stream(like.device).wait_event(last_read)
        with self._mutex:
            self.live_bytes += buf.numel() * buf.element_size()
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return buf

    def give_back(self, buf, last_read=None) -> None:
        """``last_read``: a CUDA event recorded after the last copy that reads ``buf`` (None on CPU)."""
        with self._mutex:
            self.live_bytes -= buf.numel() * buf.element_size()
            self._free.setdefault((buf.dtype, buf.numel()), []).append((buf, last_read))


def _make_function(after_layer: Callable[[], None] | None):
    import torch

    class OffloadedCheckpoint(torch.autograd.Function):
        """Reentrant checkpoint of ``run_function(hidden_states, *rest)`` with a host-resident input."""

        @staticmethod
        def forward(ctx, run_function, stash, hidden_states, *rest):
            ctx.run_function = run_function
            ctx.stash = stash
            ctx.device = hidden_states.device
            ctx.input_requires_grad = hidden_states.requires_grad
            ctx.cpu_rng = torch.get_rng_state()
            ctx.cuda_rng = torch.cuda.get_rng_state(hidden_states.device) if hidden_states.is_cuda else None
            ctx.key = None
            if getattr(stash, "on_ssd", False):
                ctx.key = stash.put(hidden_states)
                ctx.shape, ctx.dtype = hidden_states.shape, hidden_states.dtype
                ctx.host = None
                ctx.save_for_backward(*rest) if rest else None
            elif hidden_states.is_cuda:
                host = stash.take(hidden_states)
                host.copy_(hidden_states.detach().reshape(-1), non_blocking=True)
                # The D2H copy runs on the current stream after the kernels that produced the
                # hidden states; backward may run on another stream, so it waits for this event.
                ctx.written = torch.cuda.Event()
                ctx.written.record()
                ctx.host = host
                ctx.shape = hidden_states.shape
                ctx.save_for_backward(*rest) if rest else None
            else:
                ctx.host = None
                ctx.save_for_backward(hidden_states.detach(), *rest)
            ctx.num_rest = len(rest)
            with torch.no_grad():
                out = run_function(hidden_states, *rest)
            if after_layer is not None:
                after_layer()
            return out

        @staticmethod
        def backward(ctx, *grad_outputs):
            saved = ctx.saved_tensors
            if ctx.key is not None:
                x = ctx.stash.take(ctx.key, ctx.shape, ctx.dtype, ctx.device)
                ctx.key = None
                rest = saved
            elif ctx.host is not None:
                stream = torch.cuda.current_stream(ctx.device)
                stream.wait_event(ctx.written)
                x = ctx.host.to(ctx.device, non_blocking=True).view(ctx.shape)
                # The buffer is free for the next forward once this H2D copy has read it.
                read = torch.cuda.Event()
                read.record(stream)
                ctx.stash.give_back(ctx.host, read)
                ctx.host = None
                rest = saved
            else:
                x, rest = saved[0], saved[1:]
            x = x.detach().requires_grad_(ctx.input_requires_grad)
            devices = [ctx.device] if ctx.cuda_rng is not None else []
            with torch.random.fork_rng(devices=devices):
                torch.set_rng_state(ctx.cpu_rng)
                if ctx.cuda_rng is not None:
                    torch.cuda.set_rng_state(ctx.cuda_rng, ctx.device)
                with torch.enable_grad():
                    out = ctx.run_function(x, *rest)
            outs = out if isinstance(out, tuple) else (out,)
            pairs = [(o, g) for o, g in zip(outs, grad_outputs)
                     if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            del out, outs, pairs
            if after_layer is not None:
                after_layer()
            grads_rest = tuple(None for _ in range(ctx.num_rest))
            return (None, None, x.grad if ctx.input_requires_grad else None) + grads_rest

    return OffloadedCheckpoint


class OffloadedCheckpointer:
    """The ``gradient_checkpointing_func`` handed to transformers' ``_set_gradient_checkpointing``."""

    def __init__(self, allocator, ssd_stash=None, after_layer: Callable[[], None] | None = None):
        """``ssd_stash``: a memascend_engine.bounded.CheckpointStash (checkpoints on the SSD); None: pinned DRAM.
        ``after_layer``: called after each layer's forward and after its recompute + backward (the engine's heap
        trim)."""
        self.stash = ssd_stash if ssd_stash is not None else _HostStash(allocator)
        self._fn = _make_function(after_layer)
        self.calls = 0

    def __call__(self, function: Callable, *args, **kwargs):
        import torch

        if kwargs:
            # transformers binds keyword arguments into a partial; anything left is forwarded as is.
            function = _bind(function, kwargs)
        if not args or not isinstance(args[0], torch.Tensor):
            raise TypeError("offloaded checkpointing expects the layer's hidden states as the first argument")
        tensors_rest = all(isinstance(a, torch.Tensor) for a in args[1:])
        if not tensors_rest:
            hidden, extra = args[0], args[1:]
            self.calls += 1
            return self._fn.apply(lambda h: function(h, *extra), self.stash, hidden)
        self.calls += 1
        return self._fn.apply(function, self.stash, *args)


def _bind(function, kwargs):
    def bound(*a):
        return function(*a, **kwargs)

    return bound


def enable(model, allocator, ssd_stash=None, after_layer: Callable[[], None] | None = None) -> OffloadedCheckpointer:
    """Turn on offloaded checkpointing of every decoder layer of a transformers model (on the SSD with a stash)."""
    if not getattr(model, "supports_gradient_checkpointing", False) or not hasattr(model, "_set_gradient_checkpointing"):
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing (needs a transformers "
                         "PreTrainedModel with GradientCheckpointingLayer decoder layers)")
    checkpointer = OffloadedCheckpointer(allocator, ssd_stash, after_layer)
    model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=checkpointer)
    if getattr(model.config, "use_cache", False):
        model.config.use_cache = False  # a KV cache is incompatible with recomputation
    model.train()
    return checkpointer
