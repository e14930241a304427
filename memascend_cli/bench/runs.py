"""Which runs a bench measures: the engines and the memascend techniques an ablation switches off. Pure.

The child (memascend_engine.bench_job) imports this module for MODES and TECHNIQUES, so it stays free of
the rest of the bench and of anything heavier than memascend_cli.errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from memascend_cli.errors import BadInput

MODES = ("stock", "tuned", "memascend")  # zero.ENGINES (tests/unit/test_zero.py); the child imports no planner
TECHNIQUES = ("streaming", "pinned", "adaptive_pool", "fused_overflow", "bounded_norm", "direct_nvme",
              "offload_checkpointing", "malloc_trim", "layer_trims", "accumulate_in_dram", "overlap_optimizer",
              "master_from_params", "params_hold_master", "verify_checksums")
"""The engine's techniques (and its checksum verification, to measure what it costs), each switchable off for the
ablation (memascend_engine.EngineOptions fields)."""
LOSSES = ("chunked", "hf")
"""A bench job's loss: `chunked` (memascend_engine.chunked_loss, no b x s x V logits) or `hf` (transformers' own)."""
ABLATION_PREFIX = "memascend-no-"
"""Run name of memascend with one technique off: memascend-no-<technique>."""
NAMED_RUNS = {"memascend-bf16_moments": ("memascend", {"moments": "bf16"}),
              "tuned-glibc_threshold": ("tuned", {"env": (("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1048576"),)})}
"""Runs of a mode with something switched on: run name -> (mode, RunSpec fields). memascend-bf16_moments: memascend
with Adam's moments in bf16 on the SSD (EngineOptions.optimizer_moments). tuned-glibc_threshold: tuned stock with
glibc's mmap threshold fixed at 1 MiB through glibc's own tunable, no code: the allocator policy the memascend engine
sets with mallopt (memascend_engine.ds_internals.allocator.MMAP_THRESHOLD_BYTES) given to stock DeepSpeed, to measure
how much of memascend's lead over tuned that one variable closes. Each run is planned as its mode (the planner models
DeepSpeed under glibc's default policy)."""
ACCELERATORS = ("auto", "cpu", "cuda")



# ---------------------------------------------------------------------------------------------
# What to run (pure)


@dataclass(frozen=True)
class RunSpec:
    """One measured run: a mode and, for memascend ablations, the techniques switched off."""

    name: str
    mode: str
    disabled: tuple[str, ...] = ()
    moments: str = "fp32"
    """memascend's Adam moments on the SSD (EngineOptions.optimizer_moments)."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables the run's child gets on top of its mode's (NAMED_RUNS)."""


def parse_runs(text: str, ablation: bool) -> list[RunSpec]:
    """'stock,tuned,memascend' (+ one memascend run per technique disabled with --ablation)."""
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if not names:
        raise BadInput("--runs is empty", "give e.g. --runs stock,tuned,memascend")
    ablated = {f"{ABLATION_PREFIX}{t}": t for t in TECHNIQUES}
    bad = [n for n in names if n not in MODES and n not in ablated and n not in NAMED_RUNS]
    if bad:
        raise BadInput(f"unknown run {bad[0]!r}", "runs are " + ", ".join(MODES + tuple(NAMED_RUNS)) +
                       f", or {ABLATION_PREFIX}X with X one of " + ", ".join(TECHNIQUES))
    if len(set(names)) != len(names):
        raise BadInput("--runs names a run twice", "list each of " + ", ".join(MODES) + " at most once")
    runs = [RunSpec(n, "memascend", (ablated[n],)) if n in ablated else
            RunSpec(n, NAMED_RUNS[n][0], **NAMED_RUNS[n][1]) if n in NAMED_RUNS else RunSpec(n, n) for n in names]
    if ablation:
        # The ablation separates config from technique: tuned is "stock + memascend's knobs only", and each
        # memascend-no-X run differs from full memascend in X alone.
        if "tuned" not in names:
            runs.append(RunSpec("tuned", "tuned"))
        runs += [RunSpec(n, "memascend", (t,)) for n, t in ablated.items() if n not in names]
    return runs
