"""Whether a user's own ZeRO-3 CPU offload (`offload_optimizer` / `offload_param` `device: cpu`, or no offload) stays
where the user put it or moves to memascend's region: what `memascend_engine.install()` and `memascend launch` do with
a config that already runs, when its placement fits. Pure: stdlib only, no I/O (the engine reads the machine).

The rule: where the DRAM this process may use holds stock DeepSpeed's own placement of the job (placement.py's
`dram` row, or `gpu` for a config without offload on a GPU node) with the placement headroom left free, the config
stays as written: its step time and peak are stock's, and memascend's region is not used. Otherwise, or when asked,
the offload moves to the region. Where the job cannot be priced (the model is unknown), the config stays as written
and the choice says what it assumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memascend_cli.planner import placement as pl
from memascend_cli.planner import zero
from memascend_cli.planner.job import JobSpec
from memascend_cli.planner.search import RESOURCE_NAMES
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.units import GiB

PLACEMENT_CHOICES = ("auto", "dram", "region")
"""install(placement=...) and `launch --placement`: auto decides; dram keeps the config's own offload; region moves
it to memascend's region."""
ASSUMED_SEQ_LEN = 512
"""A DeepSpeed config does not say the sequence length: the activations are planned at this one (or the model's
max_position_embeddings where that is shorter), without checkpointing, and the choice says so. Short on purpose: the
choice is about where the states go (stock's 16-18 B per parameter in DRAM against memascend's region); the
activations are the job's in either placement, and at seq 2048 they would outweigh the states of a 0.5B model
(12 GiB of its 24-GiB plan on a CPU) and send to the region a job whose config ran."""


@dataclass(frozen=True, kw_only=True)
class DramView:
    """The DRAM this process may use, as the engine read it."""

    mem_available_bytes: int
    """MemAvailable (/proc/meminfo) when read."""
    own_rss_bytes: int = 0
    """This process's RSS when read: MemAvailable already excludes it and the plan's peak counts it (host/runtime)."""
    cgroup_limit_bytes: int | None = None
    """The memory limit of this process's cgroup (the lowest along its ancestors); None when unlimited."""

    @property
    def available_bytes(self) -> int:
        own = self.mem_available_bytes + self.own_rss_bytes
        return own if self.cgroup_limit_bytes is None else min(own, self.cgroup_limit_bytes)

    @property
    def source(self) -> str:
        if self.cgroup_limit_bytes is not None and self.cgroup_limit_bytes < self.mem_available_bytes + self.own_rss_bytes:
            return "the cgroup's memory limit"
        return "MemAvailable + this process's RSS"


@dataclass(frozen=True, kw_only=True)
class OffloadChoice:
    """Keep the config's own offload, or move it to the region; and why."""

    move: bool
    """True: the offload goes to memascend's region; False: the config stays as written."""
    placement: str
    """What was asked (PLACEMENT_CHOICES)."""
    reason: str
    """One line: why."""
    kept: str = "DRAM"
    """Where the config keeps the states when it stays: DRAM (CPU offload) or the GPU (no offload)."""
    peak_bytes: int | None = None
    """Stock's planned node host peak (GPU peak for the GPU) of the kept placement; None when not priced."""
    available_bytes: int | None = None
    headroom_bytes: int | None = None
    """available - peak: what the kept placement leaves free (negative: short by that much)."""
    assumptions: tuple[str, ...] = field(default=())
    pending: bool = False
    """Not decided yet: made again when the model is known (deepspeed.initialize)."""

    def line(self) -> str:
        """The one line install() and launch print."""
        if self.pending:
            return f"placement: offload as the config writes it until then ({self.reason})"
        if self.move:
            text = f"placement: offload moved to memascend's region ({self.reason})"
        else:
            text = f"placement: offload kept in {self.kept} as the config writes it, memascend's region not used " \
                   f"({self.reason})"
        return text + (f"; assumed {', '.join(self.assumptions)}" if self.assumptions else "")

    def to_dict(self) -> dict:
        return {"move": self.move, "pending": self.pending, "placement": self.placement, "kept": self.kept, "reason": self.reason,
                "peak_bytes": self.peak_bytes, "available_bytes": self.available_bytes,
                "headroom_bytes": self.headroom_bytes, "assumptions": list(self.assumptions)}


def _dtype(cfg: dict) -> tuple[str, str | None]:
    """The training dtype the config names, and an assumption where it leaves it to a trainer ("auto")."""
    for key, dtype in (("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16")):
        enabled = (cfg.get(key) or {}).get("enabled")
        if enabled is True:
            return dtype, None
        if enabled == "auto":  # the HF Trainer fills it later: fp32 is the larger of what it can become
            return "fp32", f"dtype fp32 ({key}.enabled 'auto')"
    return "fp32", None


def _count(cfg: dict, key: str, what: str, assumptions: list[str]) -> int:
    value = cfg.get(key)
    if isinstance(value, (int, float)) and value >= 1:
        return int(value)
    assumptions.append(f"{what} 1 ({key} {'absent' if value is None else repr(value)})")
    return 1


def job_for_config(cfg: dict, model, *, ranks_per_node: int, zero_init: bool,
                   env: dict | None = None) -> tuple[JobSpec, list[str]]:
    """The planner's job for a user's DeepSpeed config and `model` (a ModelSpec), and what it had to assume (the
    sequence length, which no config holds; "auto" or missing counts). Pure."""
    assumptions: list[str] = []
    seq = min(ASSUMED_SEQ_LEN, model.max_position_embeddings or ASSUMED_SEQ_LEN)
    assumptions.append(f"seq {seq}, no activation checkpointing (the config says neither)")
    dtype, note = _dtype(cfg)
    if note:
        assumptions.append(note)
    micro = _count(cfg, "train_micro_batch_size_per_gpu", "micro-batch", assumptions)
    accum = _count(cfg, "gradient_accumulation_steps", "gradient accumulation", assumptions) \
        if "gradient_accumulation_steps" in cfg else 1
    cleaned = {"zero_optimization": {k: v for k, v in (cfg.get("zero_optimization") or {}).items() if v != "auto"},
               "aio": cfg.get("aio") or {}}
    job = JobSpec(model=model, seq_len=seq, micro_batch=micro, grad_accum_steps=accum, dtype=dtype,
                  ranks_per_node=max(1, ranks_per_node), checkpointing="none", knobs=zero.from_ds_config(cleaned, env),
                  zero_init=zero_init, launcher_processes=0)
    return job, assumptions


def _asked(placement: str) -> OffloadChoice | None:
    if placement not in PLACEMENT_CHOICES:
        raise ValueError(f"placement={placement!r}: use one of {', '.join(PLACEMENT_CHOICES)}")
    if placement == "region":
        return OffloadChoice(move=True, placement=placement, reason="asked: placement 'region'")
    if placement == "dram":
        return OffloadChoice(move=False, placement=placement, reason="asked: placement 'dram'")
    return None


def decide(job: JobSpec | None, hw: HardwareSpec, view: DramView | None, *, placement: str = "auto",
           offload_none: bool = False, assumptions: tuple[str, ...] | list[str] = ()) -> OffloadChoice:
    """Keep or move a user's offload. `job`: the job priced (job_for_config), None when the model is unknown; `hw`:
    this node; `view`: the DRAM this process may use (None: the node's usable DRAM); `offload_none`: the config
    offloads nothing (on a GPU node the states stay on the GPU: stock's `gpu` placement is priced instead)."""
    asked = _asked(placement)
    if asked is not None:
        return asked
    kept = "GPU memory" if offload_none and hw.num_gpus else "DRAM"
    if job is None:
        return OffloadChoice(move=False, placement=placement, kept=kept, assumptions=tuple(assumptions),
                             reason="the model is unknown, so its size could not be priced")
    node = hw if view is None else hw.under_dram_cap(view.available_bytes)
    row = pl.stock_row(job, node, "gpu" if kept == "GPU memory" else "dram")
    e, v = row.est, row.verdict
    if kept == "GPU memory":
        peak, avail = e.gpu_peak_bytes, int(node.gpu_mem_gib * GiB)
        where = "GPU memory"
    else:
        peak, avail = e.node_host_peak_bytes, int(node.usable_dram_gib * GiB)
        where = "DRAM" if view is None else f"DRAM ({view.source})"
    margin = pl.headroom_bytes(node)
    words = f"stock's {row.config} needs {peak / GiB:.2f} GiB of {avail / GiB:.2f} GiB {where}"
    common = {"placement": placement, "kept": kept, "peak_bytes": peak, "available_bytes": avail,
              "headroom_bytes": avail - peak, "assumptions": tuple(assumptions)}
    if v.fits:
        return OffloadChoice(move=False, reason=f"fits: {words}, {(avail - peak) / GiB:.2f} GiB left (at least "
                                                f"{margin / GiB:.2f} GiB kept free)", **common)
    return OffloadChoice(move=True, reason=f"does not fit: {words} with {margin / GiB:.2f} GiB kept free "
                                           f"({RESOURCE_NAMES[v.binding]} binds)", **common)
