"""memascend's bounded engine in host memory: its optimizer chunks (whole parameters, or aligned pieces of larger
ones), the windows DRAM holds while the SSD holds the model state, and one host budget split between them. Pure:
stdlib only. planner/zero.py, where every caller reads ZeRO numbers, imports all of it (this module imports nothing
of the planner, so the two make no cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from memascend_cli.units import MiB

PAGE_BYTES = 4096
MASTER_BYTES = 4
"""fp32 master weights and Adam states (DeepSpeed's optimizer swapper dtype without bf16 master options)."""
CHUNK_ALIGN_NUMEL = 32768
"""A chunk boundary inside a tensor falls on a multiple of this many elements: 64 KiB at 2 B/element, so every
piece of a tensor starts O_DIRECT-aligned (even on a 4 KiB-sector device) and on a checksum chunk of the region
(engine/direct_nvme.py CHECKSUM_CHUNK_BYTES), where a partial write of a key must start."""
MEMASCEND_SUB_GROUP_SIZE = 2_097_152
"""Optimizer sub-group (elements, a multiple of CHUNK_ALIGN_NUMEL): memascend's optimizer chunk (larger tensors split);
8 MiB fp32 requests are large sequential I/O; a slot (master, moments, fp32 gradient, 16-bit staging) is 36 MiB."""
DEFAULT_PREFETCH_LAYERS = 2
"""Decoder layers whose parameter partitions the adaptive pool holds at once: the one being computed and
the prefetched next one (memascend_engine.EngineOptions.prefetch_layers defaults to this)."""


def align_up(n: int, alignment: int) -> int:
    """A(n, a) = ceil(n/a)*a."""
    return -(-int(n) // int(alignment)) * int(alignment)


@dataclass(frozen=True)
class Piece:
    """A slice of one parameter partition inside an optimizer chunk."""

    param: int
    """Index of the parameter inside its DeepSpeed sub-group."""
    param_offset: int
    """First element of the slice, counted from the start of the parameter partition."""
    chunk_offset: int
    """Where the slice starts inside the chunk (elements)."""
    numel: int


@dataclass(frozen=True)
class Chunk:
    """One unit of memascend's optimizer pipeline: at most chunk_numel elements of one DeepSpeed sub-group."""

    sub_group: int
    index: int
    """Position inside the sub-group (0 = the first chunk)."""
    numel: int
    pieces: tuple[Piece, ...]


def optimizer_chunks(sub_group_partitions: Sequence[Sequence[int]], chunk_numel: int) -> list[Chunk]:
    """Split every sub-group (its parameters' partition numels, in order) into chunks of at most chunk_numel elements.

    A chunk holds whole consecutive parameters, or one piece of a parameter larger than a chunk; such pieces start at
    multiples of chunk_numel inside the parameter, so with chunk_numel a multiple of CHUNK_ALIGN_NUMEL each piece's
    byte offset in the parameter's SSD extent is 4 KiB-aligned. Chunks never span sub-groups (the Adam op's
    bias-correction sequence follows sub-groups, see memascend_engine.optimizer_pipeline).
    """
    if chunk_numel <= 0 or chunk_numel % CHUNK_ALIGN_NUMEL:
        raise ValueError(f"chunk_numel must be a positive multiple of {CHUNK_ALIGN_NUMEL}, got {chunk_numel}")
    chunks: list[Chunk] = []
    for g, parts in enumerate(sub_group_partitions):
        index = 0
        pieces: list[Piece] = []
        fill = 0

        def close() -> None:
            nonlocal index, pieces, fill
            if pieces:
                chunks.append(Chunk(g, index, fill, tuple(pieces)))
                index += 1
                pieces, fill = [], 0

        for j, n in enumerate(parts):
            n = int(n)
            if n > chunk_numel:
                close()
                for off in range(0, n, chunk_numel):
                    m = min(chunk_numel, n - off)
                    chunks.append(Chunk(g, index, m, (Piece(j, off, 0, m),)))
                    index += 1
                continue
            if fill + n > chunk_numel:
                close()
            pieces.append(Piece(j, 0, fill, n))
            fill += n
        close()
    return chunks


OPTIMIZER_SLOT_FP32_TENSORS = 4
"""fp32 master, exp_avg, exp_avg_sq and the fp32 gradient of a chunk in flight (DeepSpeedCPUAdam's four tensors)."""
DEFAULT_PIPELINE_DEPTH = 3
"""Chunks in flight: one being read, one being updated, one being written back."""
BF16_MOMENTS_PIPELINE_DEPTH = 5
"""Chunks in flight with bf16 Adam moments: during backward three chunks read ahead of their gradients
(engine/overlap.py Speculator.lookahead, the depth less the two written back). With one read ahead the thread that
drives backward waited on a chunk's reads ~0.3 s a step (bench-llama-136m, seq 512, bf16, 400 MB/s: the region's
read_wait_s 4.4-4.6 s a run at depth 3, 3.2-3.4 at depth 5 or 7, the same losses): with 2 B moments the step is
short enough that one chunk's reads no longer hide behind the gradients before it. Two slots more (2 x 40 MiB at
2M-element chunks) are the price; fp32 moments keep DEFAULT_PIPELINE_DEPTH."""


def default_pipeline_depth(optimizer_moments: str) -> int:
    """Optimizer chunks in flight for full overlap with Adam moments of this dtype on the SSD (fp32 or bf16)."""
    return BF16_MOMENTS_PIPELINE_DEPTH if optimizer_moments == "bf16" else DEFAULT_PIPELINE_DEPTH


DEFAULT_GRADIENT_SLOTS = 4
DEFAULT_GRADIENT_SLOT_BYTES = 8 * MiB
"""Gradient staging window: pieces of reduced gradients on their way to the SSD (4 x 8 MiB)."""
DEFAULT_CHECKPOINT_SLOTS = 2
"""Layer checkpoints in flight to or from the SSD (one being written or prefetched, one in use)."""


def chunk_numel_for(sub_group_size: int) -> int:
    """The optimizer chunk of a sub-group size: rounded down to CHUNK_ALIGN_NUMEL (at least one unit)."""
    return max(CHUNK_ALIGN_NUMEL, int(sub_group_size) // CHUNK_ALIGN_NUMEL * CHUNK_ALIGN_NUMEL)


def optimizer_slot_bytes(chunk_numel: int, elem_bytes: int) -> int:
    """Host bytes of one pipeline slot: four fp32 tensors plus a 16-bit staging buffer (gradient reads and parameter
    write-back in the model dtype), each page-rounded."""
    fp32 = align_up(chunk_numel * MASTER_BYTES, PAGE_BYTES)
    staging = align_up(chunk_numel * elem_bytes, PAGE_BYTES) if elem_bytes != MASTER_BYTES else 0
    return OPTIMIZER_SLOT_FP32_TENSORS * fp32 + staging


@dataclass(frozen=True, kw_only=True)
class EngineWindows:
    """memascend's bounded host windows per rank: DRAM is a staging window, the SSD holds the model state."""

    optimizer_chunk_numel: int = MEMASCEND_SUB_GROUP_SIZE
    """Elements per optimizer chunk (the sub-group size)."""
    optimizer_depth: int = DEFAULT_PIPELINE_DEPTH
    """Chunks in flight in the optimizer pipeline."""
    gradient_slots: int = DEFAULT_GRADIENT_SLOTS
    gradient_slot_bytes: int = DEFAULT_GRADIENT_SLOT_BYTES
    checkpoint_offload: str = "ssd"
    """Activation checkpoints: ssd (through checkpoint_slots buffers), dram (one buffer per layer), off."""
    checkpoint_slots: int = DEFAULT_CHECKPOINT_SLOTS
    accumulation_bytes: int = 0
    """DRAM for gradients accumulated between micro-batches (gradient accumulation only): partitions that fit stay in
    memory until the boundary writes them once; the rest take the read-modify-write through the SSD each micro-batch.
    split_budget gives it what a host budget leaves over (LoHan, arXiv 2403.06504, accumulates in host memory)."""

    def optimizer_bytes(self, elem_bytes: int) -> int:
        return self.optimizer_depth * optimizer_slot_bytes(self.optimizer_chunk_numel, elem_bytes)

    def gradient_bytes(self) -> int:
        return self.gradient_slots * align_up(self.gradient_slot_bytes, PAGE_BYTES)

    def checkpoint_bytes(self, layer_checkpoint_bytes: int, num_layers: int) -> int:
        """Host bytes of the activation-checkpoint window (0 with checkpointing off)."""
        one = align_up(layer_checkpoint_bytes, PAGE_BYTES)
        if self.checkpoint_offload == "ssd":  # the write ring plus one read buffer (bounded.CheckpointStash)
            return (min(self.checkpoint_slots, num_layers) + 1) * one
        if self.checkpoint_offload == "dram":
            return num_layers * one
        return 0

    def to_dict(self) -> dict:
        return asdict(self)


# --- one host budget -------------------------------------------------------------------------------------

MIN_CHUNK_NUMEL = 262_144
"""Smallest optimizer chunk the budget may shrink to: 1 MiB fp32 requests (DeepSpeed's MIN_AIO_BYTES)."""
MIN_GRADIENT_SLOT_BYTES = MiB


class BudgetTooSmall(ValueError):
    """The host budget is below the smallest set of windows the engine runs with."""

    def __init__(self, budget_bytes: int, min_bytes: int):
        super().__init__(f"host budget {budget_bytes} B is below the minimum {min_bytes} B")
        self.budget_bytes, self.min_bytes = budget_bytes, min_bytes


@dataclass(frozen=True)
class BudgetPlan:
    """How a host budget is split between the engine's windows (bytes per rank)."""

    windows: EngineWindows
    prefetch_layers: int
    param_pool_bytes: int
    optimizer_bytes: int
    gradient_bytes: int
    checkpoint_bytes: int
    full_overlap_bytes: int
    """What the default windows (full overlap) need: the budget's default."""
    min_bytes: int
    """The smallest budget that still runs."""

    @property
    def total_bytes(self) -> int:
        return (self.param_pool_bytes + self.optimizer_bytes + self.gradient_bytes + self.checkpoint_bytes
                + self.windows.accumulation_bytes)

    def to_dict(self) -> dict:
        return {"windows": self.windows.to_dict(), "prefetch_layers": self.prefetch_layers,
                "param_pool_bytes": self.param_pool_bytes, "optimizer_bytes": self.optimizer_bytes,
                "gradient_bytes": self.gradient_bytes, "checkpoint_bytes": self.checkpoint_bytes,
                "accumulation_bytes": self.windows.accumulation_bytes, "total_bytes": self.total_bytes,
                "full_overlap_bytes": self.full_overlap_bytes,
                "min_bytes": self.min_bytes}


def split_budget(budget_bytes: int | None, *, param_pool_bytes: Callable[[int], int], elem_bytes: int,
                 layer_checkpoint_bytes: int, num_layers: int, base: EngineWindows,
                 accumulated_gradient_bytes: int = 0) -> BudgetPlan:
    """Split one host budget between the parameter pool, the optimizer pipeline, the gradient window and the
    activation-checkpoint window. None = full overlap (the default windows). A smaller budget gives up overlap in
    this order: optimizer read-ahead (depth 5 -> 3, bf16 moments), write-behind (3 -> 2), gradient slots (4 -> 2), a
    checkpoint slot, the prefetched layer (2 -> 1), then halves the optimizer chunk down to 1 MiB, then single slots;
    below that BudgetTooSmall.
    What a budget leaves over holds accumulated gradients in DRAM (EngineWindows.accumulation_bytes), up to
    ``accumulated_gradient_bytes`` (the rank's gradient partitions in their accumulation dtype; 0 without gradient
    accumulation); without a budget the base's window stays.

    ``param_pool_bytes(prefetch_layers)`` prices the parameter pool (zero.model_param_pool_plan).
    """

    def plan(w: EngineWindows, prefetch: int) -> BudgetPlan:
        return BudgetPlan(w, prefetch, param_pool_bytes(prefetch), w.optimizer_bytes(elem_bytes), w.gradient_bytes(),
                          w.checkpoint_bytes(layer_checkpoint_bytes, num_layers), 0, 0)

    steps: list[tuple[EngineWindows, int]] = [(base, DEFAULT_PREFETCH_LAYERS)]

    def add(**changes) -> None:
        w, p = steps[-1]
        prefetch = changes.pop("prefetch_layers", p)
        steps.append((replace(w, **changes), prefetch))

    add(optimizer_depth=min(base.optimizer_depth, DEFAULT_PIPELINE_DEPTH))  # the read-ahead of bf16 moments first
    add(optimizer_depth=min(base.optimizer_depth, 2))
    add(gradient_slots=min(base.gradient_slots, 2))
    add(checkpoint_slots=1)
    add(prefetch_layers=1)
    chunk = base.optimizer_chunk_numel
    while chunk // 2 >= MIN_CHUNK_NUMEL:
        chunk //= 2
        add(optimizer_chunk_numel=chunk)
    add(optimizer_depth=1, gradient_slots=1, gradient_slot_bytes=MIN_GRADIENT_SLOT_BYTES)
    steps = [(replace(w, accumulation_bytes=0), p) if budget_bytes is not None else (w, p) for w, p in steps]
    plans = [plan(w, p) for w, p in steps]
    full, smallest = plans[0].total_bytes, plans[-1].total_bytes
    if budget_bytes is None:
        chosen = plans[0]
    else:
        fitting = [p for p in plans if p.total_bytes <= budget_bytes]
        if not fitting:
            raise BudgetTooSmall(int(budget_bytes), smallest)
        chosen = fitting[0]
        window = max(0, min(int(accumulated_gradient_bytes), int(budget_bytes) - chosen.total_bytes))
        chosen = replace(chosen, windows=replace(chosen.windows, accumulation_bytes=window))
    return replace(chosen, full_overlap_bytes=full, min_bytes=smallest)
