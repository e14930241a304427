"""Per-step progress of a program run by `memascend launch` (called by engine/autoinstall.py once the program's
`deepspeed.initialize` returned its engine; the CLI side is memascend_cli/run/anyprogram.py).

What the CLI cannot know from outside, read from the engine DeepSpeed built: the job (parameters, micro-batch,
gradient accumulation, dtype, world size, the ZeRO and aio settings DeepSpeed received, the model's Hugging Face
config when it has one) goes into the process's record once; then the engine's own methods are wrapped on the
instance (DeepSpeed's public API, nothing internal): `forward` notes the sequence length of the batches it sees,
`backward` the losses, and `step` appends one line per optimizer step (step, loss, s/step, seq length, region bytes
read and written, host RSS) to RUN/status/<pid>.steps.jsonl (anyprogram.steps_path).
"""

from __future__ import annotations

import json
import os
import time

from memascend_cli.run import anyprogram
from memascend_engine import procfs


def job_fields(engine, model_was_partitioned: bool, ds_config: dict | None) -> dict:
    """The job as DeepSpeed sized it, for the record's `job` key (anyprogram.job_spec reads it back)."""
    import deepspeed

    params = engine.module.parameters()
    numel = sum(int(getattr(p, "ds_numel", 0) or p.numel()) for p in params)
    dtype = "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"
    cfg = ds_config if isinstance(ds_config, dict) else (engine.config if isinstance(engine.config, dict) else {})
    sched = (cfg.get("scheduler") or {}).get("params") or {}
    total = sched.get("total_num_steps")
    checkpointing = getattr(engine.module, "is_gradient_checkpointing", None)
    return {"num_params": numel, "micro_batch": int(engine.train_micro_batch_size_per_gpu()),
            "grad_accum": int(engine.gradient_accumulation_steps()), "dtype": dtype,
            "world_size": int(getattr(engine, "world_size", 1) or 1),
            # torchrun / accelerate set LOCAL_WORLD_SIZE, DeepSpeed's launcher LOCAL_SIZE; else one node.
            "ranks_per_node": int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE")
                                  or getattr(engine, "world_size", 1) or 1),
            # zero.Init partitions the layers as they are built; a model built whole is partitioned by initialize.
            "zero_init": model_was_partitioned,
            "checkpointing": None if checkpointing is None else bool(checkpointing),
            "total_steps": total if isinstance(total, int) and total > 0 else None,
            "zero_optimization": cfg.get("zero_optimization") or {}, "aio": cfg.get("aio") or {},
            "deepspeed_version": deepspeed.__version__}


def model_config(module) -> dict | None:
    """The model's Hugging Face config (what `memascend plan --model config.json` reads), None for other models."""
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "to_json_string"):
        return None
    try:
        return json.loads(config.to_json_string())
    except (TypeError, ValueError):
        return None


def seq_len_of(args: tuple, kwargs: dict) -> int | None:
    """The sequence length of a forward call's batch of token ids: `input_ids`, else the first integer tensor
    argument of two or more dimensions, last dimension. None when the call shows none (a float input's last dimension
    is a feature size, not a length)."""
    for x in [kwargs.get("input_ids"), *args, *kwargs.values()]:
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if shape is not None and len(shape) >= 2 and getattr(dtype, "is_floating_point", True) is False:
            return int(shape[-1])
    return None


class StepWatch:
    """Wraps one DeepSpeed engine's forward, backward and step (on the instance) and appends a line per optimizer
    step to `path`. `region_bytes` returns (read, written) through the region so far, or None."""

    def __init__(self, engine, path: str, region_bytes):
        self.engine, self.path, self.region_bytes = engine, path, region_bytes
        self.losses: list = []
        self.seq_len: int | None = None
        self.t_last = time.monotonic()
        # Bound methods, so the wrappers call DeepSpeed's own code whatever the instance attribute holds later.
        self._forward, self._backward, self._step = engine.forward, engine.backward, engine.step
        engine.forward, engine.backward, engine.step = self.forward, self.backward, self.step

    def forward(self, *args, **kwargs):
        seq = seq_len_of(args, kwargs)
        if seq is not None:
            self.seq_len = seq
        return self._forward(*args, **kwargs)

    def backward(self, loss, *args, **kwargs):
        # Kept as a detached tensor: reading its value here would make a GPU wait every micro-step.
        self.losses.append(loss.detach() if hasattr(loss, "detach") else loss)
        return self._backward(loss, *args, **kwargs)

    def step(self, *args, **kwargs):
        before = self.engine.global_steps
        result = self._step(*args, **kwargs)
        if self.engine.global_steps != before:  # an optimizer step (the accumulation boundary), skipped or not
            self._record()
        return result

    def _record(self) -> None:
        now = time.monotonic()
        losses, self.losses = self.losses, []
        loss = sum(float(x) for x in losses) / len(losses) if losses else None
        io = self.region_bytes()
        rec = {"step": int(self.engine.global_steps), "loss": loss, "s_per_step": round(now - self.t_last, 3),
               "seq_len": self.seq_len, "read_bytes": io[0] if io else None, "written_bytes": io[1] if io else None,
               "rss_bytes": procfs.status_kib("VmRSS") * 1024,
               "skipped_steps": int(getattr(self.engine, "skipped_steps", 0) or 0)}
        self.t_last = now
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError:  # the CLI's temporary run folder is gone: it no longer reads them
            pass


def watch(engine, status_dir: str, region_bytes) -> StepWatch:
    """Start the per-step lines of this process (anyprogram.steps_path)."""
    return StepWatch(engine, anyprogram.steps_path(status_dir, os.getpid()), region_bytes)
