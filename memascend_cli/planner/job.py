"""The training job the planner models (identical for every engine) and its validation. Pure: stdlib only."""

from __future__ import annotations

from dataclasses import dataclass

from memascend_cli.errors import BadInput
from memascend_cli.models import ModelSpec
from memascend_cli.planner import zero
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.planner.zero import ZeroSettings
from memascend_cli.versions import DEFAULT_DEEPSPEED_VERSION, parse_version

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MOMENT_BYTES = {"fp32": 4, "bf16": 2}
"""Bytes per element of memascend's Adam moments on the SSD (EngineOptions.optimizer_moments; csrc/moments.h)."""
MOMENT_DTYPES = tuple(MOMENT_BYTES)
DEEPSPEED_GRADIENT_CLIPPING = 1.0
"""DeepSpeed's gradient_clipping when a config omits it (runtime/constants.py GRADIENT_CLIPPING_DEFAULT)."""
CHECKPOINTING = ("none", "selective", "full", "offload")
MODEL_INITS = ("zero", "eager", "from-pretrained")
"""How the user's script builds the model before deepspeed.initialize: under deepspeed.zero.Init (what `train` does),
whole on the host (LlamaForCausalLM(config)), or loaded whole with from_pretrained outside zero.Init."""
MODEL_INIT_WORDS = {"zero": "built under zero.Init", "eager": "built whole before initialize (fp32)",
                    "from-pretrained": "loaded whole by from_pretrained before initialize"}
"""What the plan says it assumed for each of MODEL_INITS."""
TRAINERS = ("deepspeed", "hf", "trl")
"""What drives the training loop: DeepSpeed's API (memascend train, a plain DeepSpeed script), the Hugging Face
Trainer (also under accelerate launch) or TRL's SFTTrainer."""


class BudgetError(BadInput):
    """A memascend host budget below what the job needs (a config error in estimates, bad input for the CLI)."""


@dataclass(kw_only=True)
class JobSpec:
    """The training job, identical for every engine (zero.ENGINES)."""

    model: ModelSpec
    seq_len: int = 2048
    micro_batch: int = 1
    grad_accum_steps: int = 1
    dtype: str = "bf16"
    """Model (compute) dtype: bf16, fp16 or fp32."""
    grad_accum_dtype: str | None = None
    """None = model dtype (DeepSpeed engine.py default with ZeRO); 'fp32' doubles the grad buffer."""
    ranks_per_node: int | None = None
    """Processes per node; None = GPUs per node, or 1 on a CPU-only machine."""
    checkpointing: str = "offload"
    """Activation checkpointing: none, selective, full, offload (full, checkpoints kept in host DRAM)."""
    flash_attention: bool | None = None
    """None = on: transformers' default SDPA attention runs torch's flash / memory-efficient kernels (CUDA and CPU)
    for causal batches without a padding mask, so no s^2 scores are materialised; False models eager attention."""
    fused_cross_entropy: bool = False
    """Liger-Kernel fused linear cross-entropy (no full logits)."""
    chunked_loss: bool = False
    """memascend_engine.chunked_loss: lm_head + cross-entropy a 64 MiB chunk of fp32 logits at a time, gradients made
    in the forward (no full logits; what bench gives tuned and memascend)."""
    deepspeed_version: str = DEFAULT_DEEPSPEED_VERSION
    knobs: ZeroSettings = zero.DEEPSPEED_DEFAULTS
    """The stock ZeRO settings of the job (memascend_cli/planner/zero.py: resolve); the memascend engine applies
    zero.memascend_knobs on top, exactly as memascend_engine.install does."""
    streaming: bool = True
    """memascend's bounded engine (gradient streaming + optimizer pipeline); False models DeepSpeed's gradient and
    optimizer path with the engine's other techniques (memascend_engine.EngineOptions.streaming)."""
    bounded_norm: bool = True
    """memascend's bounded engine takes gradient norms in fp64 pieces of defaults.NORM_CHUNK_NUMEL
    (EngineOptions.bounded_norm); False: DeepSpeed's defaults.DS_NORM_BUFFER_NUMEL."""
    accumulate_in_dram: bool = True
    """memascend keeps accumulated gradients in the DRAM a host budget leaves over (EngineOptions.accumulate_in_dram);
    False: every micro-batch's read-modify-write goes through the SSD."""
    overlap_optimizer: bool = True
    """memascend steps each optimizer chunk during the last micro-batch's backward (EngineOptions.overlap_optimizer),
    the common case planned: the step commits the speculation (no clipping triggered, no overflow)."""
    norm_worker: bool = True
    """memascend's engine since its gradient norms went to a worker thread (engine/ds_internals/bounded_stage3.py
    _NormWorker), with the writes' CRC-32C on the region store's checksum thread, a single rank's reduce-scatter handing
    back the gradients themselves and the CPU accelerator's device count asked once; False: an engine recorded before
    them, all on the thread that drives backward (planner.time MEMASCEND_WORKER_THREADS_HOST_NS_PER_ELEMENT)."""
    master_from_params: bool = True
    """With the overlap: memascend copies each chunk's master (bf16: its upper halves) from the parameters backward
    fetched instead of reading it (EngineOptions.master_from_params)."""
    params_hold_master: bool = True
    """fp32: memascend writes no master beside the parameter partitions on the SSD; bf16: a 2 B residual instead of the
    4 B master (EngineOptions.params_hold_master)."""
    gradient_clipping: float = DEEPSPEED_GRADIENT_CLIPPING
    """DeepSpeed's gradient_clipping (its default 1.0; 0 = off). With the overlap, a clipping step is redone from
    the gradients on the SSD, so they still go there; without clipping (bf16 / fp32) they never do."""
    optimizer_moments: str = "fp32"
    """memascend's Adam moments on the SSD: fp32, or bf16 (EngineOptions.optimizer_moments: 8 B per parameter less
    SSD traffic per step). Stock and tuned keep fp32 states."""
    checkpoint_offload: str = "ssd"
    """Where memascend's offloaded activation checkpoints go: ssd (a bounded window) or dram (one buffer per layer)."""
    optimizer_depth: int | None = None
    """memascend's optimizer chunks in flight with full overlap; None = zero.default_pipeline_depth for the moments (a
    recorded run is planned with the depth it ran)."""
    windows: zero.EngineWindows | None = None
    """memascend's host windows; None = zero.EngineWindows for the job's sub-group size (full overlap)."""
    host_budget_bytes: int | None = None
    """memascend's pinned + staging memory per rank (zero.split_budget); None = what full overlap needs."""
    param_buffer_size_auto: bool = True
    """offload_param.buffer_size is raised to the largest swapped partition of the model (what a user must write for
    DeepSpeed to start, and what zero.resolve does); False keeps knobs.param_buffer_size as given."""
    zero_init: bool = True
    """Model constructed under deepspeed.zero.Init; False is model_init 'eager' (kept for the callers that say only
    this), set False by any other model_init."""
    model_init: str = "zero"
    """MODEL_INITS: how the model is built before deepspeed.initialize (host/model_build)."""
    trainer: str = "deepspeed"
    """TRAINERS: the Hugging Face trainers import more of their own (host/trainer_imports)."""
    launcher_processes: int = 2
    """Launcher processes per node beside the ranks: 2 for `memascend train` (DeepSpeed's runner and launch.py)."""
    checkpoint_copies: int = 1
    """Checkpoints kept on the SSD (each copies fp32 master + Adam states, 12 B/param)."""

    def __post_init__(self):
        if self.dtype not in DTYPE_BYTES:
            raise BadInput(f"unknown dtype {self.dtype!r}", "use bf16, fp16 or fp32")
        if self.grad_accum_dtype not in (None, *DTYPE_BYTES):
            raise BadInput(f"unknown grad accumulation dtype {self.grad_accum_dtype!r}", "use bf16, fp16 or fp32")
        if self.checkpointing not in CHECKPOINTING:
            raise BadInput(f"unknown checkpointing {self.checkpointing!r}", "use " + ", ".join(CHECKPOINTING))
        if self.model_init not in MODEL_INITS:
            raise BadInput(f"unknown model init {self.model_init!r}", "use " + ", ".join(MODEL_INITS))
        if not self.zero_init and self.model_init == "zero":
            self.model_init = "eager"
        self.zero_init = self.model_init == "zero"
        if self.trainer not in TRAINERS:
            raise BadInput(f"unknown trainer {self.trainer!r}", "use " + ", ".join(TRAINERS))
        if self.checkpoint_offload not in ("ssd", "dram"):
            raise BadInput(f"unknown checkpoint offload {self.checkpoint_offload!r}", "use ssd or dram")
        if self.optimizer_moments not in MOMENT_DTYPES:
            raise BadInput(f"unknown optimizer moments dtype {self.optimizer_moments!r}", "use " + " or ".join(MOMENT_DTYPES))
        for name in ("seq_len", "micro_batch", "grad_accum_steps"):
            if int(getattr(self, name)) < 1:
                raise BadInput(f"{name.replace('_', '-')} must be at least 1", "give a positive whole number")
        if self.knobs.pin_backend not in ("torch", "native"):
            raise BadInput(f"unknown pin backend {self.knobs.pin_backend!r}", "use torch or native")
        if int(self.knobs.sub_group_size) < 1:
            raise BadInput("sub-group-size must be at least 1", "give a positive element count such as 2e7")
        parse_version(self.deepspeed_version)


def resolve_ranks(job: JobSpec, hw: HardwareSpec) -> int:
    if job.ranks_per_node is not None:
        if job.ranks_per_node < 1:
            raise BadInput("ranks per node must be at least 1", "give --ranks 1 or more")
        if hw.num_gpus and job.ranks_per_node > hw.num_gpus:
            raise BadInput(f"{job.ranks_per_node} ranks per node but the node has {hw.num_gpus} GPUs",
                           "use at most one rank per GPU")
        return job.ranks_per_node
    return hw.num_gpus if hw.num_gpus > 0 else 1
