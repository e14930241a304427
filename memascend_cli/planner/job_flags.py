"""The job `memascend plan` plans from its command line: the job values and DeepSpeed knob flags as given, the stock
ZeRO settings they make, the job without a recipe, and a recipe's job with the flags on top. Pure: no I/O; the
warnings come back as text for the command to print."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

from memascend_cli.defaults import (
    DEFAULT_CHUNKED_LOSS,
    DEFAULT_GRAD_ACCUM,
    DEFAULT_GRADIENT_CHECKPOINTING,
    DEFAULT_MICRO_BATCH,
    DEFAULT_PRECISION,
    DEFAULT_SEQ_LEN,
)
from memascend_cli.errors import BadInput
from memascend_cli.planner import zero
from memascend_cli.planner.job import DTYPE_BYTES, JobSpec
from memascend_cli.units import parse_count


@dataclass(frozen=True, kw_only=True)
class JobFlags:
    """The job values given on the command line; None: not given (the recipe's, else the shared default)."""

    seq_len: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    dtype: str | None = None
    grad_accum_dtype: str | None = None
    checkpointing: str | None = None
    ranks: int | None = None
    flash_attn: bool | None = None
    liger: bool = False
    host_budget_bytes: int | None = None
    checkpoint_offload: str | None = None
    chunked_loss: bool | None = None
    overlap_optimizer: bool | None = None

    def __post_init__(self):
        if self.liger:
            object.__setattr__(self, "chunked_loss", False)  # Liger's fused loss replaces the chunked one

    def recipe_overrides(self) -> dict:
        """recipe_job's keyword arguments (run/prepared.py): every value, None where not given."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, kw_only=True)
class KnobFlags:
    """plan's DeepSpeed knob flags as typed (sizes and counts still text)."""

    param_buffer_count: int = zero.DEEPSPEED_DEFAULTS.param_buffer_count
    param_buffer_size: str | None = None
    max_in_cpu: str | None = None
    optimizer_buffer_count: int = zero.DEEPSPEED_DEFAULTS.optimizer_buffer_count
    pipeline: bool = False
    sub_group_size: str | None = None
    reduce_bucket_size: str | None = None
    pin_memory: bool | None = None
    pin_backend: str = "torch"

    def base(self, defaults: zero.ZeroSettings) -> zero.ZeroSettings:
        """DeepSpeed's settings of the modelled version (`defaults`) with the flags given."""
        return replace(
            defaults,
            param_buffer_count=self.param_buffer_count,
            max_in_cpu=parse_count(self.max_in_cpu, "--max-in-cpu") if self.max_in_cpu else defaults.max_in_cpu,
            optimizer_buffer_count=self.optimizer_buffer_count,
            pipeline_read=self.pipeline, pipeline_write=self.pipeline,
            sub_group_size=(max(1, parse_count(self.sub_group_size, "--sub-group-size")) if self.sub_group_size
                            else defaults.sub_group_size),
            reduce_bucket_size=(parse_count(self.reduce_bucket_size, "--reduce-bucket-size") if self.reduce_bucket_size
                                else defaults.reduce_bucket_size),
            pin_memory=defaults.pin_memory if self.pin_memory is None else self.pin_memory,
            pin_backend=self.pin_backend,
        )

    def buffer_size(self) -> int | None:
        """An explicit --param-buffer-size, kept as given (too small shows as a config error)."""
        return parse_count(self.param_buffer_size, "--param-buffer-size") if self.param_buffer_size else None

    def given(self) -> list[str]:
        """The knob flags given (a count flag at DeepSpeed's default reads as not given)."""
        ds = zero.DEEPSPEED_DEFAULTS
        values = (("--sub-group-size", self.sub_group_size), ("--reduce-bucket-size", self.reduce_bucket_size),
                  ("--max-in-cpu", self.max_in_cpu), ("--param-buffer-size", self.param_buffer_size),
                  ("--pin-memory", self.pin_memory), ("--pipeline", self.pipeline or None),
                  ("--param-buffer-count", self.param_buffer_count if self.param_buffer_count != ds.param_buffer_count
                   else None),
                  ("--optimizer-buffer-count", self.optimizer_buffer_count
                   if self.optimizer_buffer_count != ds.optimizer_buffer_count else None))
        return [flag for flag, v in values if v is not None]

    def recipe_note(self) -> str | None:
        """The warning for knob flags given with a recipe: `train` takes none."""
        given = self.given()
        if not given:
            return None
        return (f"{', '.join(given)}: applied to this plan as DeepSpeed's settings before memascend's rules; "
                "`train` takes no knob flags, so it runs the recipe with DeepSpeed's defaults under the same rules")


def stock_knobs(spec, world: int, dtype: str, base: zero.ZeroSettings, buffer_size: int | None) -> zero.ZeroSettings:
    """Stock DeepSpeed's settings for the job: DeepSpeed as documented from `base`, with an explicit buffer size."""
    knobs = zero.resolve("stock", model=spec, world_size=world, elem_bytes=DTYPE_BYTES[dtype], base=base)
    return knobs if buffer_size is None else replace(knobs, param_buffer_size=buffer_size)


def capped_notes(base: zero.ZeroSettings, defaults: zero.ZeroSettings, spec, world: int, dtype: str,
                 stock: zero.ZeroSettings, buffer_size: int | None) -> list[str]:
    """A warning per knob flag that the tuned and memascend columns cap or ignore (zero.knob_notes)."""
    given = replace(base, param_buffer_size=stock.param_buffer_size) if buffer_size is not None else base
    largest = zero.largest_swappable_partition(zero.distinct_model_partitions(spec, world), base, DTYPE_BYTES[dtype])
    return zero.knob_notes(given, "memascend", defaults=defaults, largest_partition_numel=largest or None)


def world_size(ranks: int | None, hw) -> int:
    return (ranks or hw.num_gpus or 1) * max(1, hw.num_nodes)


def flag_job(spec, hw, flags: JobFlags, *, base: zero.ZeroSettings, defaults: zero.ZeroSettings,
             knob_flags: KnobFlags, deepspeed_version: str, model_init: str, optimizer_moments: str | None,
             trainer: str, note: Callable[[str], None]) -> JobSpec:
    """The job of a plan without a recipe: the flags given, the shared defaults for the rest, stock DeepSpeed's
    knobs. `note` gets each knob warning (capped_notes) before the job's own checks run."""
    dtype = flags.dtype or DEFAULT_PRECISION
    if dtype not in DTYPE_BYTES:
        raise BadInput(f"unknown dtype {dtype!r}", "use bf16, fp16 or fp32")
    world = world_size(flags.ranks, hw)
    buffer_size = knob_flags.buffer_size()
    knobs = stock_knobs(spec, world, dtype, base, buffer_size)
    for text in capped_notes(base, defaults, spec, world, dtype, knobs, buffer_size):
        note(text)
    # Only memascend train computes the loss in chunks (memascend_engine.chunked_loss); a script of the user's own
    # (another trainer, or a model built outside zero.Init, which train never does) calls install() and computes its
    # model's loss over the full logits (transformers loss/loss_utils.py ForCausalLMLoss).
    own_script = trainer != "deepspeed" or model_init != "zero"
    chunked_loss = DEFAULT_CHUNKED_LOSS and not own_script if flags.chunked_loss is None else flags.chunked_loss
    return JobSpec(model=spec, seq_len=flags.seq_len or DEFAULT_SEQ_LEN,
                   micro_batch=flags.micro_batch or DEFAULT_MICRO_BATCH,
                   grad_accum_steps=flags.grad_accum or DEFAULT_GRAD_ACCUM, dtype=dtype,
                   grad_accum_dtype=flags.grad_accum_dtype, ranks_per_node=flags.ranks,
                   checkpointing=flags.checkpointing or ("offload" if DEFAULT_GRADIENT_CHECKPOINTING else "none"),
                   flash_attention=flags.flash_attn, fused_cross_entropy=flags.liger,
                   deepspeed_version=deepspeed_version, knobs=knobs, model_init=model_init,
                   param_buffer_size_auto=buffer_size is None, host_budget_bytes=flags.host_budget_bytes,
                   checkpoint_offload=flags.checkpoint_offload or "ssd", optimizer_moments=optimizer_moments or "fp32",
                   chunked_loss=chunked_loss, trainer=trainer,
                   overlap_optimizer=True if flags.overlap_optimizer is None else flags.overlap_optimizer)


def recipe_jobs(job: JobSpec, spec, hw, *, engine: str, base: zero.ZeroSettings, defaults: zero.ZeroSettings,
                knob_flags: KnobFlags, optimizer_moments: str | None, model_init: str | None = None,
                note: Callable[[str], None]) -> tuple[JobSpec, JobSpec | None]:
    """(the job `train` runs with `engine`, with --optimizer-moments and an explicit buffer size on top; the same job
    with stock DeepSpeed's knobs for the stock column, None when `engine` is stock). `job`: the recipe's
    (run/prepared.py recipe_job); `note` gets each knob warning."""
    if optimizer_moments:
        job = replace(job, optimizer_moments=optimizer_moments)
    if model_init:  # train builds under zero.Init; the flag plans the recipe's job as another script builds it
        job = replace(job, model_init=model_init, zero_init=model_init == "zero")
    world = world_size(job.ranks_per_node, hw)
    buffer_size = knob_flags.buffer_size()
    stock = stock_knobs(spec, world, job.dtype, base, buffer_size)
    if buffer_size is not None:
        job = replace(job, knobs=replace(job.knobs, param_buffer_size=buffer_size))
    for text in capped_notes(base, defaults, spec, world, job.dtype, stock, buffer_size):
        note(text)
    # The job carries the knobs train writes for `engine` (memascend's unless stock); the stock column is DeepSpeed
    # as documented, with the knob flags.
    return job, (replace(job, knobs=stock) if engine != "stock" else None)
