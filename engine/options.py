"""EngineOptions: which techniques memascend_engine.install plugs in (re-exported by the package)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memascend_cli.planner.job import MOMENT_DTYPES
from memascend_cli.planner.zero import DEFAULT_PIPELINE_DEPTH, DEFAULT_PREFETCH_LAYERS


@dataclass(kw_only=True)
class EngineOptions:
    """Which techniques :func:`install` plugs in (all on by default)."""

    pinned: bool = True
    """Exact-size page-aligned pinned allocation at every DeepSpeed pin site (mlocked on CPU,
    cudaHostRegistered on CUDA); off: DeepSpeed's own pinning."""
    adaptive_pool: bool = True
    """Size-class parameter pools from the model inventory (memascend_cli.planner.zero.param_pool_plan);
    off: DeepSpeed's ``buffer_count x buffer_size`` pool. The stock knobs memascend sets (sub-group size,
    reduce bucket, max_in_cpu, ...) do not depend on this switch: they are config, not technique."""
    fused_overflow: bool = True
    """The ZeRO-3 overflow check uses the native one-pass scan (no per-element temporaries)."""
    bounded_norm: bool = True
    """Gradient norms in fp64 pieces of memascend_cli.defaults.NORM_CHUNK_NUMEL elements (needs streaming); off:
    DeepSpeed's 250M-element pieces, an 8 B x min(250M, partition) temporary at each gradient partition, 2 GB for a
    billion-scale model's embedding at the end of backward."""
    direct_nvme: bool = True
    """Swap I/O goes to extents of a `memascend prepare-ssd` region; off: one file per tensor."""
    offload_checkpointing: bool = True
    """`Installed.enable_offloaded_checkpointing` wraps decoder layers; off: it does nothing."""
    malloc_trim: bool = True
    """The allocator policy: large allocations (>= 1 MiB) always mmapped, so freed tensors go back to the OS at once
    (glibc's dynamic mmap threshold otherwise keeps them in the heap), and malloc_trim after backward (the planner
    assumes no allocator retention). Once the engine's checkpointing wraps the layers, the threshold is 32 MiB and the
    heap is trimmed after every layer instead: the layer reuses its own freed blocks, and nothing outlives it."""
    layer_trims: bool = True
    """With malloc_trim and the engine's checkpointing: the heap trimmed after every layer (malloc_trim above). Off
    (memascend's dram row, whose DRAM holds the job): the layers reuse the heap's freed blocks as they are (glibc's
    largest mmap threshold and the trim threshold its own policy pairs with it) and the process takes no transparent
    huge pages (ds_internals.context.PluginContext.keep_heap): each trimmed layer faulted its pages in again, 2 MiB
    zeroed at a time with PyTorch's huge pages (defaults.ENGINE_ENV). Profiled on bench-llama-136m at 4 layers, seq 512,
    fp32, the dram row (perf, 499 Hz, 8 s of steps 2-6): the kernel's page clearing 23% of the rank's CPU samples with
    the trims, 0.1-0.7% without (tuned stock: 0.8%); its ru_maxrss 2.11-2.15 GiB with them, 2.38-2.46 without
    (tuned stock: 3.05-3.18)."""
    fused_kernels: bool = True
    """Liger-Kernel / FlashAttention when installed on a GPU machine (`Installed.apply_fused_kernels`)."""
    adam_in_place: bool = True
    """Create CPU-Adam's states directly in the pinned swap buffers (needs direct_nvme)."""
    prefetch_layers: int = DEFAULT_PREFETCH_LAYERS
    """Decoder layers whose parameter partitions the adaptive pool holds at once."""
    streaming: bool = True
    """Bounded host memory (engine/bounded.py, engine/optimizer_pipeline.py): reduced gradients stream to the SSD in
    the training dtype (no full-size gradient buffer in DRAM) and the optimizer step runs as a pipeline of sub-group
    chunks (no pool sized by the largest tensor). Needs direct_nvme and DeepSpeedCPUAdam; off: DeepSpeed's gradient
    and optimizer path."""
    accumulate_in_dram: bool = True
    """With gradient accumulation, running sums stay in a DRAM window between micro-batches and go to the SSD once
    per step (the window is what the host budget leaves over: windows.accumulation_bytes); off: every micro-batch
    reads and rewrites its gradient partitions on the SSD."""
    overlap_optimizer: bool = True
    """The optimizer overlapped with backward (engine/overlap.py): at the step's last micro-batch each optimizer chunk
    is updated, speculatively, as soon as its gradients are reduced, into a second set of extents (12 B per parameter
    of SSD space), and step() commits it, or redoes the step (clipping triggered) or rolls the parameters back
    (overflow) exactly; without clipping the gradients then never go to the SSD. Needs streaming."""
    master_from_params: bool = True
    """With the overlap: each chunk's master is copied from the parameter partitions backward fetched (DeepSpeed is
    about to drop them; in fp32 they are the master's exact copy, in bf16 with params_hold_master its upper halves)
    instead of read from the SSD: 4 B (bf16: 2 B) per parameter less read per committed step. Needs
    overlap_optimizer; fp16 parameters are not the master."""
    params_hold_master: bool = True
    """fp32: a chunk's parameter partitions on the SSD are its master (the same values bit for bit), so no separate
    master is written (4 B per parameter less written per step) nor kept (4 B less space; the overlap's speculation
    writes the next parameters to shadow partitions exchanged at the commit: 4 B more space instead of 8). bf16: they
    are the master's upper halves (its round to nearest), a 2 B residual beside them restores it exactly (2 B less
    written; optimizer_pipeline.OptimizerPipeline.split). Needs streaming; fp16 parameters are not the master."""
    optimizer_moments: str = "fp32"
    """Adam's exp_avg / exp_avg_sq on the SSD: fp32, or bf16 (opt-in): 8 B per parameter less SSD traffic per step (4 B
    less read and written each) and 4 B less space (8 B with the overlap), rounded stochastically on write
    (csrc/moments.h); Adam itself still runs on fp32 moments. Needs streaming."""
    pipeline_depth: int = DEFAULT_PIPELINE_DEPTH
    """Optimizer chunks in flight (one read, one updated, one written back)."""
    checkpoint_offload: str = "ssd"
    """Where offloaded activation checkpoints go: ssd (a bounded window of the region), dram (one pinned buffer
    per layer)."""
    windows: Any = None
    """memascend_cli.planner.zero.EngineWindows from a host budget (zero.split_budget, what `memascend train` and
    `bench` pass); None: the full-overlap windows for the config's sub-group size, pipeline_depth and
    checkpoint_offload."""
    dram_tier_gib: float = 0.0
    """Host memory each rank may keep optimizer-step state in instead of the region (memascend_engine.dram_tier):
    within it the training-dtype parameter partitions, then the gradients, then whole optimizer chunks (master +
    moments) stay in DRAM (memascend_cli.planner.dram_tier, the rule the plan prices); the rest stays on the region.
    Needs streaming. 0: everything on the region. A tier the process cannot get (a lower cgroup limit, mlock refused)
    falls back to the region with a warning."""
    verify_checksums: bool = True
    """CRC-32C of every region extent written, checked on every read (direct_nvme). Off, or
    MEMASCEND_VERIFY_CHECKSUMS=0: no checksums; for benchmarking the cost only."""

    def __post_init__(self) -> None:
        if not self.dram_tier_gib >= 0:
            raise ValueError(f"EngineOptions.dram_tier_gib {self.dram_tier_gib!r}: use 0 or more GiB")
        if self.optimizer_moments not in MOMENT_DTYPES:
            raise ValueError(f"EngineOptions.optimizer_moments {self.optimizer_moments!r}: use "
                             + " or ".join(MOMENT_DTYPES))
