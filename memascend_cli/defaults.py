"""The job defaults `memascend plan`, `train` and `bench` share (one home, so `plan && train` agree), and where
memascend keeps its caches.

Stdlib only: `plan` imports them without loading the recipe machinery (pydantic's models cost ~80 ms of its start).
"""

import os

DEFAULT_SEQ_LEN = 2048
"""Tokens per sequence (LLaMA-Factory's cutoff_len default)."""
DEFAULT_MICRO_BATCH = 1
"""Sequences per rank per forward/backward."""
DEFAULT_GRAD_ACCUM = 1
"""Micro-batches per optimizer step."""
DEFAULT_PRECISION = "bf16"
"""Model/compute dtype."""
DEFAULT_OUTPUT_DIR = "runs/memascend"
"""Run directory, relative to the current directory; `train` creates the SSD region file in it by default."""
DEFAULT_PLAN_MODEL_GPU = "qwen2.5-7b"
"""The model `plan` without a model or recipe plans on a machine with a GPU: a sensible first plan."""
DEFAULT_PLAN_MODEL_CPU = "qwen2.5-0.5b"
"""The same on a CPU-only machine: small enough to train there."""
DEFAULT_BENCH_MODEL = "bench-llama-136m"
"""The model `bench` runs without --model (random weights)."""
DEFAULT_BENCH_STEPS = 5
"""Steps of a bench run without --steps: step 1 builds the Adam states, steps 2..N give the s/step."""
DEFAULT_GRADIENT_CHECKPOINTING = True
"""Recompute activations in backward (the memascend engine offloads the checkpoints to host memory);
LLaMA-Factory checkpoints by default too. The planner calls it `offload` (`full` on stock DeepSpeed)."""

DEFAULT_CHUNKED_LOSS = True
"""lm_head + cross-entropy in chunks of logits (memascend_engine.chunked_loss) rather than transformers' loss over
the full b x s x V logits."""
LOSS_CHUNK_LOGITS_BYTES = 64 << 20
"""The chunked loss's fp32 logits per chunk (memascend_engine.chunked_loss): at or above glibc's largest mmap
threshold (32 MiB), so a CPU job's chunks are mapped and returned at free rather than stranded in the heap, and
large enough that the matmuls stay efficient."""

ENGINE_ENV = {"THP_MEM_ALLOC_ENABLE": "1"}
"""Environment of every memascend engine rank (stock runs do not get it): PyTorch's CPU allocator backs tensors of
2 MiB and more with transparent huge pages (c10/core/impl/alloc_cpu.cpp reads the variable once, at the first
allocation, so it has to be in the environment before torch starts). With the engine's 1 MiB mmap threshold those
tensors are fresh mappings; huge pages cut their page faults and TLB misses 512-fold: bench-llama-136m at 32 layers,
seq 512, fp32 on the CPU machine ran at 27.0 s/step (45.1 and 40.8 without, in earlier sittings) with the same flat
peak RSS, 1.40 GiB (docs/results/memory.md, allocator policy experiments)."""

DS_NORM_BUFFER_NUMEL = 250_000_000
"""Elements DeepSpeed converts to fp64 at a time for a gradient's norm (deepspeed/runtime/zero/stage3.py
_constant_buffered_norm2, buffer_size default; the norm dtype is fp64 wherever the accelerator has it,
runtime/zero/utils.py get_norm_dtype): an 8 B x min(this, partition) host temporary per gradient partition."""
NORM_CHUNK_NUMEL = 1 << 24
"""The same in the memascend bounded engine (memascend_engine.EngineOptions.bounded_norm): 128 MiB of fp64 at a time,
where stock's 2 GB temporary is the end of a CPU rank's backward at billion scale (a 128K-250K vocabulary's embedding
gradient)."""


def cache_home(kind: str) -> str:
    """Folder for memascend's caches of `kind` (data: tokenized datasets, models: imported GGUF files, probe: the CPU
    and SSD probes): $MEMASCEND_CACHE/kind, else $XDG_CACHE_HOME/memascend/kind, else ~/.cache/memascend/kind."""
    env = os.environ.get("MEMASCEND_CACHE")
    if env:
        return os.path.join(env, kind)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "memascend", kind)
