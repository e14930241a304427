"""DeepSpeed's CPU Adam op's constants for a call, for the optimizer pipeline's fused pass (csrc/moments.h
adam_step_fused, engine/one_pass_step.py).

The op (ops/csrc/includes/cpu_adam.h) keeps beta1^t and beta2^t per optimizer id, advanced by each call's step
(IncrementStep: times beta for the next step, std::pow after a jump or a change of betas), and derives the bias
corrections and the step size from them in float (update_state, Step_AVX). :class:`OpConstants` follows that state
through every call this optimizer makes and computes the constants the same way; before the first fused pass of a call
it runs the op itself and the fused pass on one probe and keeps the constants only if every bit agrees (a build of the
op that computes them otherwise, or a call it did not see, leaves the step on the op: OpConstants.mismatches).
"""

from __future__ import annotations

import math

PROBE_NUMEL = 64
"""Elements of the probe: a multiple of the op's vector width, so that it takes the op's vector loop only."""


class OpConstants:
    """The op's step state for one optimizer id and the checked constants of its current call."""

    def __init__(self, op, opt_id: int, betas, adamw: bool):
        import numpy as np

        self.op, self.opt_id, self.adamw = op, opt_id, bool(adamw)
        self._f32 = np.float32
        self._step = 0
        self._beta1, self._beta2 = np.float32(betas[0]), np.float32(betas[1])
        self._beta1_t = self._beta2_t = np.float32(1.0)  # Adam_Optimizer's constructor
        self._checked: tuple | None = None
        self.mismatches = 0
        """Calls whose constants did not give the op's bits on the probe (their chunks stepped by the op alone)."""

    def call(self, args: tuple, master, grad, exp_avg, exp_avg_sq) -> None:
        """The op on fp32 tensors; `args`: (opt id, step, lr, beta1, beta2, eps, weight decay, bias correction)."""
        self._increment(int(args[1]), args[3], args[4])
        self.op.adam_update(*args, master, grad, exp_avg, exp_avg_sq)

    def constants(self, args: tuple) -> tuple | None:
        """(the nine constants of adam_step_fused, decoupled decay) for the call `args`, checked on the probe
        (once per call), or None where they do not give the op's bits."""
        if self._checked is None or self._checked[0] != args:
            self._checked = (args, self._probe(args))
        return self._checked[1]

    def _increment(self, step: int, beta1: float, beta2: float) -> None:
        """cpu_adam.h IncrementStep, in float as the op keeps it (std::pow(float, size_t) is pow in double)."""
        f32 = self._f32
        b1, b2 = f32(beta1), f32(beta2)
        if b1 != self._beta1 or b2 != self._beta2:
            self._step, self._beta1, self._beta2 = step, b1, b2
            self._beta1_t, self._beta2_t = f32(math.pow(float(b1), step)), f32(math.pow(float(b2), step))
        elif step == self._step + 1:
            self._step += 1
            self._beta1_t, self._beta2_t = self._beta1_t * self._beta1, self._beta2_t * self._beta2
        elif step != self._step:
            self._beta1_t, self._beta2_t = f32(math.pow(float(b1), step)), f32(math.pow(float(b2), step))
            self._step = step

    def _candidates(self, args: tuple):
        """update_state and Step_AVX's constants; `1 / sqrt(1 - beta2^t)` in float or in double (which overload the
        op's build took is not visible from here: the probe decides)."""
        f32 = self._f32
        lr, eps, wd, bias_correction = f32(args[2]), f32(args[5]), f32(args[6]), bool(args[7])
        one = f32(1.0)
        for in_double in (False, True):
            bc1, bc2 = one, one
            if bias_correction:
                bc1, rest = one - self._beta1_t, one - self._beta2_t
                bc2 = f32(1.0 / math.sqrt(float(rest))) if in_double else one / f32(math.sqrt(float(rest)))
            values = (self._beta1, self._beta2, one - self._beta1, one - self._beta2, eps, bc2, f32(-lr) / bc1, wd,
                      f32(-lr) * wd)
            yield [float(v) for v in values], self.adamw

    def _probe(self, args: tuple) -> tuple | None:
        import torch
        from memascend_engine import native

        g = torch.Generator().manual_seed(0)
        inputs = (torch.randn(PROBE_NUMEL, generator=g), torch.randn(PROBE_NUMEL, generator=g),
                  torch.rand(PROBE_NUMEL, generator=g) * 1e-3, torch.rand(PROBE_NUMEL, generator=g) * 1e-6)
        want = [t.clone() for t in inputs]
        self.call(args, *want)  # the op's own call for this step: its state as the chunks' calls find it
        for adam in self._candidates(args):
            got = [t.clone() for t in inputs]
            native.adam_step_fused_tensors(got[0], None, got[2], got[3], got[1], PROBE_NUMEL, 0, 0, None, adam, (0, 0))
            if all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(got, want)):
                return adam
        self.mismatches += 1
        return None
