"""A chunk's optimizer step in one pass (OptimizerPipeline.step_in_one_pass with DeepSpeed's constants,
csrc/moments.h adam_step_fused): widening bf16 moments, joining a split master, DeepSpeed's CPU Adam, splitting and
narrowing again in one native pass gives the bits of the separate passes around DeepSpeed's own op, on a real region
store with the real op (a chunk whose length is a multiple of the op's vector width and one with 13 elements left for
its scalar loop; masters the residual cannot hold; decoupled and L2 weight decay)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_engine_direct_nvme import make_region
from test_split_master import _masters

from memascend_cli.planner import windows as win

N = 13 * win.CHUNK_ALIGN_NUMEL + 77
"""Elements of the one parameter partition: chunks of 10 x 32768 and 3 x 32768 + 77 elements (77 mod 16 = 13)."""
LR, BETAS, EPS, DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01


def _op(adamw: bool):
    """A DeepSpeedCPUAdam's op, as the engine's compute calls it, with its own optimizer id (its own step state)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed's CPU Adam op is what the step calls")
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from memascend_engine.ds_internals.cpu_adam import OpConstants

    opt = DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(1))], lr=LR, betas=BETAS, eps=EPS, weight_decay=DECAY,
                           adamw_mode=adamw)
    return opt, OpConstants(opt.ds_opt_adam, opt.opt_id, BETAS, adamw)


def _pipeline(store, prefix: str):
    from memascend_engine.bounded import IOCounters
    from memascend_engine.optimizer_pipeline import OptimizerPipeline, ParamTarget
    from memascend_engine.pinned import PinnedAllocator

    windows = win.EngineWindows(optimizer_chunk_numel=10 * win.CHUNK_ALIGN_NUMEL, optimizer_depth=2)
    chunks = win.optimizer_chunks([[N]], windows.optimizer_chunk_numel)
    key = f"params/{prefix}"
    zeros = torch.zeros(N, dtype=torch.bfloat16)
    store.complete(store.submit("w", zeros.data_ptr(), 2 * N, key, 0))
    pipe = OptimizerPipeline(store, PinnedAllocator(lock=False, cuda_register=False), windows, chunks,
                             [[lambda: ParamTarget(N, key=key)]], [["grad/0"]], param_dtype=torch.bfloat16,
                             grad_dtype=torch.bfloat16, counters=IOCounters(), grad_written={"grad/0": True},
                             key_prefix=f"opt/{prefix}/", moment_bytes=2, params_hold_master=True)
    return pipe, key


def _compute(pipe, op, step: int, *, fused: bool, used: list):
    """The engine's compute (bounded_stage3._ChunkAdam._ma_adam) without DeepSpeed's engine around it; `fused`: by
    the one-pass step with the op's constants, else each pass on its own around one call of the op."""
    args = (op.opt_id, step, LR, *BETAS, EPS, DECAY, True)

    def compute(ci, chunk, slot):
        def update(start, count):
            op.call(args, slot.master.narrow(0, start, count), slot.grad.narrow(0, start, count),
                    slot.exp_avg.narrow(0, start, count), slot.exp_avg_sq.narrow(0, start, count))
        if fused:
            adam = op.constants(args)
            used.append(adam is not None)
            pipe.step_in_one_pass(ci, slot, update, adam)
        else:
            update(0, chunk.numel)
    compute.one_pass = fused
    return compute


def _state(pipe, key) -> list[list[int]]:
    out = []
    for ci in range(len(pipe.chunks)):
        s = pipe.read_state(ci)
        out += [s[name].view(torch.int32).tolist() for name in ("fp32", "exp_avg", "exp_avg_sq")]
    params = torch.empty(N, dtype=torch.bfloat16)
    pipe.store.complete(pipe.store.submit("r", params.data_ptr(), 2 * N, key, 0))
    return out + [params.view(torch.int16).tolist()]


@pytest.mark.parametrize("adamw", [True, False])
def test_the_one_pass_step_writes_the_bits_of_the_separate_passes(tmp_path, adamw):
    from memascend_engine.direct_nvme import RegionStore

    store = RegionStore(make_region(tmp_path, "64MiB"), 0)
    try:
        pipes = [_pipeline(store, name) for name in ("passes", "fused")]
        ops = [_op(adamw) for _ in pipes]  # (optimizer, OpConstants): each its own optimizer id
        masters = _masters(N)
        masters[~torch.isfinite(masters)] = 1.0  # Adam over a NaN master is NaN either way; keep the values live
        g = torch.Generator().manual_seed(1)
        moments = torch.rand(N, generator=g) * 1e-3
        for pipe, _ in pipes:
            pipe.initialize()
            for chunk in pipe.chunks:
                part = lambda t: t.narrow(0, chunk.pieces[0].param_offset, chunk.numel)  # noqa: E731
                pipe.write_state(chunk.index, {"fp32": part(masters), "exp_avg": part(moments),
                                               "exp_avg_sq": part(moments)})
        assert pipes[0][0].exceptions[(0, 0)] is not None  # the ties the residual cannot hold are in chunk 0
        used = []
        for step in (1, 2):
            grads = torch.randn(N, generator=g).to(torch.bfloat16)  # read from the store into staging, widened
            store.complete(store.submit("w", grads.data_ptr(), 2 * N, "grad/0", 0))
            for (pipe, _), (_, op), fused in zip(pipes, ops, (False, True)):
                pipe.rounding_step = step
                pipe.run(_compute(pipe, op, step, fused=fused, used=used))
        assert used == [True] * 4 and ops[1][1].mismatches == 0  # the fused pass ran for every chunk and step
        passes, fused = (_state(pipe, key) for pipe, key in pipes)
        assert passes == fused
        ex = [{k: None if v is None else [t.tolist() for t in v] for k, v in p.exceptions.items()} for p, _ in pipes]
        assert ex[0] == ex[1]
    finally:
        store.close()


def test_constants_that_miss_the_ops_bits_leave_the_step_to_the_op():
    """A state the op did not go through (a step the follower never saw) fails the probe: no constants."""
    _, op = _op(True)
    args = (op.opt_id, 1, LR, *BETAS, EPS, DECAY, True)
    assert op.constants(args) is not None
    op._beta1_t = op._beta1_t * op._beta1  # as if it had missed a call
    args2 = (op.opt_id, 2, LR, *BETAS, EPS, DECAY, True)
    op.op.adam_update(*args2, *(torch.zeros(16) for _ in range(4)))  # the op's step 2, unseen by the follower
    assert op.constants(args2) is None and op.mismatches == 1
