"""Size classes for the adaptive buffer pools (pure: stdlib only, no torch, no DeepSpeed).

Stock DeepSpeed stages every parameter partition in one of ``buffer_count`` slots of
``buffer_size`` elements, and ``buffer_size`` must cover the largest partition (the embedding), so
a q_proj of 1/40 that size still occupies a whole embedding-sized slot (memascend-paper.md §4).
Here the pool is derived from the model's real tensor inventory instead:

* every swappable partition (``partition_bytes >= min_aio_bytes``; smaller ones never swap, they
  stay resident) is grouped by role: ``vocab`` (embed_tokens / lm_head), ``mlp``, ``attn_q``,
  ``attn_o``, ``attn_kv`` (GQA k/v) and ``other``;
* a class's slot holds its largest partition, rounded up to the page (so every slot starts
  page-aligned and any slot can do O_DIRECT I/O);
* slot counts follow the prefetch window: ``prefetch_layers`` decoder layers are live at once
  (the layer being computed and the prefetched next one), so a decoder role gets
  ``prefetch_layers x (tensors of that role per layer)`` slots; the vocabulary matrices are never
  live together (embedding at the start of forward / end of backward, lm_head in between), so
  ``vocab`` gets one slot;
* classes whose slots end up the same size are merged (a slot is a slot).

This is exactly the planner's ``_adaptive_param_pool`` (memascend_cli/planner/memory.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PAGE_BYTES = 4096
MIN_AIO_BYTES = 1024 * 1024
"""DeepSpeed swap_tensor/utils.py MIN_AIO_BYTES: partitions below max(this, aio.block_size) never swap."""
AIO_ALIGNED_BYTES = 1024
"""DeepSpeed's per-thread I/O granularity (x aio.intra_op_parallelism)."""
VOCAB_CLASS = "vocab"
DECODER_ROLES = ("attn_q", "attn_kv", "attn_o", "mlp")


def align_up(n: int, alignment: int) -> int:
    """Smallest multiple of ``alignment`` that is >= n."""
    return -(-int(n) // alignment) * alignment


def role_class(role: str) -> str:
    """The pool class of a tensor role (memascend_cli.models.TensorSpec.role)."""
    if role in ("embed", "lm_head"):
        return VOCAB_CLASS
    if role in DECODER_ROLES:
        return role
    return "other"


@dataclass(frozen=True)
class SizeClass:
    """One pool: ``slot_count`` slots of ``slot_numel`` elements each."""

    name: str
    """Role classes merged into this pool, '+'-joined (e.g. 'mlp+vocab')."""
    slot_numel: int
    """Elements per slot: the largest partition of the class, rounded up to the slot alignment."""
    slot_count: int
    """Slots preallocated."""
    largest_partition_numel: int
    """Largest partition the class was sized for (<= slot_numel)."""

    def slot_bytes(self, elem_bytes: int) -> int:
        """Bytes per slot (a multiple of the page)."""
        return self.slot_numel * elem_bytes

    def nbytes(self, elem_bytes: int) -> int:
        """Bytes of the whole pool."""
        return self.slot_count * self.slot_bytes(elem_bytes)


@dataclass(frozen=True)
class PoolPlan:
    """Size classes of one pool, smallest slot first."""

    classes: tuple[SizeClass, ...]
    elem_bytes: int
    """Bytes per element of the pooled dtype."""

    @property
    def total_bytes(self) -> int:
        """Host bytes of all slots together."""
        return sum(c.nbytes(self.elem_bytes) for c in self.classes)

    @property
    def slot_count(self) -> int:
        """Slots over all classes."""
        return sum(c.slot_count for c in self.classes)

    @property
    def largest_slot_numel(self) -> int:
        """Elements of the biggest slot (0 for an empty plan)."""
        return max((c.slot_numel for c in self.classes), default=0)

    def class_for(self, numel: int) -> int | None:
        """Index of the smallest class whose slots hold ``numel`` elements, or None."""
        for i, c in enumerate(self.classes):
            if c.slot_numel >= numel:
                return i
        return None

    def describe(self) -> str:
        """One line per class, for logs and stats."""
        return ", ".join(f"{c.name} {c.slot_count}x{c.slot_numel:,}" for c in self.classes) + f" x {self.elem_bytes} B"


def slot_alignment_bytes(intra_op_parallelism: int = 1) -> int:
    """Slot sizes are multiples of both the page and DeepSpeed's I/O granularity."""
    io_bytes = AIO_ALIGNED_BYTES * max(1, int(intra_op_parallelism))
    a, b = PAGE_BYTES, io_bytes
    while b:
        a, b = b, a % b
    return PAGE_BYTES * io_bytes // a


def partition_numel(numel: int, world_size: int) -> int:
    """ZeRO-3 partition of a tensor: padded to a multiple of the world size, then split
    (deepspeed partition_parameters.Init._aligned_size // world)."""
    return -(-int(numel) // max(1, int(world_size)))


def partition_inventory(spec, world_size: int) -> list[tuple[int, str]]:
    """(partition numel, role) of every parameter of a memascend ModelSpec, in module order."""
    from memascend_cli.models import numels_roles

    numels, roles = numels_roles(spec)
    return [(partition_numel(n, world_size), r) for n, r in zip(numels, roles)]


def per_layer_role_counts(spec) -> dict[str, int]:
    """How many tensors of each role one decoder layer has."""
    from memascend_cli.models import layer_template

    counts: dict[str, int] = {}
    for t in layer_template(spec)[1]:
        counts[t.role] = counts.get(t.role, 0) + 1
    return counts


def param_pool_plan(
    inventory: Iterable[tuple[int, str]],
    *,
    elem_bytes: int,
    per_layer_counts: dict[str, int],
    prefetch_layers: int = 2,
    min_aio_bytes: int = MIN_AIO_BYTES,
    intra_op_parallelism: int = 1,
) -> PoolPlan:
    """Size classes for the parameter swap pool.

    ``inventory``: (partition numel, role) per parameter; ``per_layer_counts``: role -> tensors per
    decoder layer; ``prefetch_layers``: decoder layers whose partitions are resident together.
    """
    if elem_bytes <= 0:
        raise ValueError(f"elem_bytes must be positive, got {elem_bytes}")
    if prefetch_layers < 1:
        raise ValueError(f"prefetch_layers must be >= 1, got {prefetch_layers}")
    align_b = slot_alignment_bytes(intra_op_parallelism)
    largest: dict[str, int] = {}
    for numel, role in inventory:
        if numel * elem_bytes < min_aio_bytes:
            continue  # never swapped: stays resident (P6), needs no slot
        cls = role_class(role)
        largest[cls] = max(largest.get(cls, 0), int(numel))
    merged: dict[int, list] = {}  # slot numel -> [names, count, largest]
    for cls, numel in largest.items():
        if cls == VOCAB_CLASS:
            count = 1
        elif cls == "other":
            count = prefetch_layers
        else:
            count = prefetch_layers * max(1, per_layer_counts.get(cls, 1))
        slot_numel = align_up(numel * elem_bytes, align_b) // elem_bytes
        entry = merged.setdefault(slot_numel, [[], 0, 0])
        entry[0].append(cls)
        entry[1] += count
        entry[2] = max(entry[2], numel)
    classes = tuple(
        SizeClass(name="+".join(sorted(names)), slot_numel=slot_numel, slot_count=count, largest_partition_numel=big)
        for slot_numel, (names, count, big) in sorted(merged.items())
    )
    return PoolPlan(classes=classes, elem_bytes=elem_bytes)


def uniform_pool_plan(*, buffer_count: int, buffer_numel: int, elem_bytes: int, intra_op_parallelism: int = 1) -> PoolPlan:
    """Fallback without a model inventory: DeepSpeed's ``buffer_count x buffer_size`` as one class
    (still exact-size and page-aligned, but not adaptive)."""
    slot_numel = align_up(buffer_numel * elem_bytes, slot_alignment_bytes(intra_op_parallelism)) // elem_bytes
    return PoolPlan(classes=(SizeClass(name="uniform", slot_numel=slot_numel, slot_count=int(buffer_count),
                                       largest_partition_numel=int(buffer_numel)),), elem_bytes=elem_bytes)


def sub_group_numels(partition_numels: Sequence[int], sub_group_size: int) -> list[int]:
    """Elements per optimizer sub-group: a group closes once it reaches ``sub_group_size``
    (deepspeed stage3._create_fp16_sub_groups), so it can exceed it by one partition."""
    total = sum(partition_numels)
    if sub_group_size >= total:
        return [total] if partition_numels else []
    groups, acc = [], 0
    for i, n in enumerate(partition_numels):
        acc += n
        if acc >= sub_group_size or i == len(partition_numels) - 1:
            groups.append(acc)
            acc = 0
    return groups


def optimizer_buffer_count(*, pipeline_read: bool = False, pipeline_write: bool = False, num_states: int = 2) -> int:
    """Optimizer swap buffers Adam really needs: fp32 master + states + gradient per sub-group in
    flight; one more sub-group for each of read prefetch and write-behind (deepspeed-notes §2.2)."""
    per_group = 1 + num_states + 1
    return per_group * (1 + int(bool(pipeline_read)) + int(bool(pipeline_write)))


def optimizer_pool_bytes(largest_sub_group_numel: int, *, buffer_count: int, elem_bytes: int = 4,
                         intra_op_parallelism: int = 1) -> int:
    """Host bytes of the optimizer pool: ``buffer_count`` exact, page-aligned buffers of the largest
    sub-group (io-aligned like DeepSpeed's OptimizerSwapper.largest_numel)."""
    io_numel = AIO_ALIGNED_BYTES * max(1, intra_op_parallelism) // elem_bytes
    numel = align_up(largest_sub_group_numel, io_numel)
    return buffer_count * align_up(numel * elem_bytes, PAGE_BYTES)
