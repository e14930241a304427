"""The derived quantities of one job on one machine for one engine (partitions, sub-groups, knobs, windows) and how
each engine pins host memory: what every item module reads. Pure: stdlib only."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache

from memascend_cli.defaults import DS_NORM_BUFFER_NUMEL, NORM_CHUNK_NUMEL
from memascend_cli.errors import BadInput
from memascend_cli.models import ModelSpec, numels_roles, template_numels_roles
from memascend_cli.planner import subgroups, zero
from memascend_cli.planner.job import DTYPE_BYTES, BudgetError, JobSpec, resolve_ranks
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.planner.zero import AIO_ALIGNED_BYTES, ENGINES, PAGE_BYTES, align_up
from memascend_cli.units import GiB
from memascend_cli.versions import parse_version


def pow2_bytes(n: int) -> int:
    """torch's CachingHostAllocator (tensor.pin_memory() on CUDA) rounds a pinned request up to a power of two."""
    return 0 if n <= 0 else 1 << (int(n) - 1).bit_length()


@dataclass(frozen=True)
class Partitioning:
    """How ZeRO-3 splits the model on one rank (DeepSpeed 0.19.8 runtime/zero/partition_parameters.py
    _partition_param line 1778, stage3.py _create_fp16_sub_groups line 1210)."""

    partition_numels: tuple[int, ...]
    """ceil(numel/world) per parameter, in module order (Init._partition_param pads to world size)."""
    full_numels: tuple[int, ...]
    roles: tuple[str, ...]
    group_ends: tuple[int, ...]
    """One past the last parameter index of each optimizer sub-group (stage3._create_fp16_sub_groups)."""

    sub_group_numels: tuple[int, ...]
    """Partition elements per sub-group."""
    partition_counts: dict[int, int] = field(compare=False, hash=False, repr=False)
    """How many partitions have each size (sums over partitions in O(distinct sizes))."""
    full_counts: dict[int, int] = field(compare=False, hash=False, repr=False)
    """How many parameters have each full size."""
    group_counts: dict[int, int] = field(compare=False, hash=False, repr=False)
    """How many sub-groups have each size."""
    _memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    """Derived sums, computed once per (rule, threshold): searches estimate the same partitioning many times."""

    @property
    def sub_groups(self) -> tuple[range, ...]:
        """Parameter indices per optimizer sub-group."""
        if "ranges" not in self._memo:
            self._memo["ranges"] = subgroups.group_ranges(self.group_ends)
        return self._memo["ranges"]

    def sub_group(self, g: int) -> range:
        """Parameter indices of sub-group g."""
        return range(self.group_ends[g - 1] if g else 0, self.group_ends[g])

    def groups_from(self, min_numel: int) -> tuple[tuple[int, int], ...]:
        """(size, count) of the sub-groups of at least min_numel elements (DeepSpeed swaps only those)."""
        return tuple((n, k) for n, k in self.group_counts.items() if n >= min_numel)

    def aligned_sum(self, what: str, min_numel: int, elem_bytes: int, align_bytes: int) -> int:
        """Sum of A(numel x elem_bytes, align) over the swappable partitions ('params') or sub-groups ('groups')."""
        key = (what, min_numel, elem_bytes, align_bytes)
        if key not in self._memo:
            counts = self.partition_counts if what == "params" else self.group_counts
            # Layers repeat the same shapes: sum over distinct sizes.
            self._memo[key] = sum(align_up(n * elem_bytes, align_bytes) * k for n, k in counts.items()
                                  if n >= min_numel)
        return self._memo[key]

    @property
    def ns(self) -> int:
        return sum(n * k for n, k in self.partition_counts.items())

    def partitions_below(self, min_numel: int) -> tuple[tuple[int, int], ...]:
        """(size, count) of the partitions below min_numel (those DeepSpeed does not swap)."""
        return tuple((n, k) for n, k in self.partition_counts.items() if n < min_numel)

    def sub_group_numel(self, g: int) -> int:
        return self.sub_group_numels[g]

    @property
    def largest_sub_group_numel(self) -> int:
        return max(self.sub_group_numels)

    @property
    def largest_partition_numel(self) -> int:
        return max(self.partition_counts)

    def largest_partition_from(self, min_numel: int) -> int:
        """Largest partition of at least min_numel elements (0 if none)."""
        return max((n for n in self.partition_counts if n >= min_numel), default=0)


def _counts(head: tuple[int, ...], layer: tuple[int, ...], tail: tuple[int, ...], num_layers: int) -> dict[int, int]:
    """How many of head + layer x num_layers + tail have each size."""
    out = Counter(head + tail)
    for n, k in Counter(layer).items():
        out[n] += k * num_layers
    return dict(out)


@lru_cache(maxsize=512)
def partition(model: ModelSpec, world_size: int, sub_group_size: int) -> Partitioning:
    """Partition sizes and optimizer sub-groups, one param group in module order (zero.py's rules), derived from one
    decoder layer: the plan's depth search asks for models of 1000s of layers."""
    full, roles = numels_roles(model)
    L = model.num_hidden_layers
    full_counts = _counts(*(tuple(n for n, _ in part) for part in template_numels_roles(model)), L)
    head, layer, tail = (tuple(n for n, _ in part) for part in zero.template_partitions(model, world_size))
    ends, numels = subgroups.layered_sub_group_ends(head, layer, L, tail, sub_group_size)
    return Partitioning(head + layer * L + tail, full, roles, ends, numels, _counts(head, layer, tail, L),
                        full_counts, dict(Counter(numels)))


class Context:
    """Derived quantities shared by the item functions."""

    def __init__(self, job: JobSpec, hw: HardwareSpec, engine: str):
        if engine not in ENGINES:
            raise BadInput(f"unknown engine {engine!r}", "use " + ", ".join(ENGINES))
        self.engine = engine
        # The memascend engine's techniques, else stock DeepSpeed's code (stock and tuned differ only in knobs).
        self.memascend = engine == "memascend"
        self.job, self.hw = job, hw
        # Settings the engine would reject at start-up (the item functions add theirs).
        self.config_errors: list[str] = []
        self.k = job.knobs
        self.m = job.model
        self.ranks = resolve_ranks(job, hw)
        self.world = self.ranks * max(1, hw.num_nodes)
        self.gpu = hw.num_gpus > 0
        self.ver = parse_version(job.deepspeed_version)
        self.E = DTYPE_BYTES[job.dtype]
        self.G = DTYPE_BYTES[job.grad_accum_dtype or job.dtype]
        self.M = 4  # fp32 master weights and Adam states
        if engine in ("tuned", "memascend"):
            # The stock knobs the engine's install() sets on any config (zero.py is the one home).
            largest = zero.largest_swappable_partition(zero.distinct_model_partitions(self.m, self.world), self.k,
                                                      self.E)
            self.k = zero.memascend_knobs(self.k, largest_partition_numel=largest or None,
                                          overlap=job.overlap_optimizer)
        self.sub_group_size = self.k.sub_group_size
        self.reduce_bucket_size = self.k.reduce_bucket_size
        # memascend's bounded engine (memascend_engine.bounded): gradients stream to the SSD, the optimizer runs as a
        # pipeline of chunks; it replaces P2, P4, P5, P7 and the init / fp32-copy transients below.
        self.bounded = self.memascend and job.streaming
        # Elements of a gradient partition converted to fp64 at a time for its norm.
        self.norm_chunk = NORM_CHUNK_NUMEL if self.bounded and job.bounded_norm else DS_NORM_BUFFER_NUMEL
        # The optimizer overlapped with backward (memascend_engine.overlap), planned as committing; the gradients go
        # to the SSD only for a possible redo (clipping on, or fp16's loss scale changing).
        self.overlap = self.bounded and job.overlap_optimizer
        self.overlap_keeps_grads = job.gradient_clipping > 0 or job.dtype == "fp16"
        # The parameter partitions on the SSD hold the master (OptimizerPipeline.params_hold_master): fp32 all of it,
        # none written beside them; bf16 its upper halves, a 2 B residual beside them (OptimizerPipeline.split). The
        # overlap's speculation writes shadow partitions exchanged at its commit.
        self.params_hold_master = self.bounded and job.params_hold_master and job.dtype in ("fp32", "bf16")
        # The speculation copies the master (bf16: its upper halves) from the parameters backward fetched
        # (Speculator.released).
        self.master_from_params = self.overlap and job.master_from_params and (self.E == 4 or self.params_hold_master)
        # Gradients a DRAM window can hold instead of the SSD: running sums between micro-batches, and the last
        # micro-batch's kept for a redo (dropped when the step commits).
        self.holds_gradients = job.grad_accum_steps > 1 or (self.overlap and self.overlap_keeps_grads)
        self.windows = job.windows or zero.EngineWindows(
            optimizer_chunk_numel=zero.chunk_numel_for(self.k.sub_group_size),
            optimizer_depth=job.optimizer_depth or zero.default_pipeline_depth(job.optimizer_moments),
            checkpoint_offload=job.checkpoint_offload)
        self.ssd_checkpoints = (self.memascend and job.checkpointing == "offload"
                                and self.windows.checkpoint_offload == "ssd")
        self.prefetch_layers = zero.DEFAULT_PREFETCH_LAYERS
        self.part = partition(self.m, self.world, self.sub_group_size)
        self.budget = None
        self.budget_error: BudgetError | None = None
        if self.bounded:
            try:
                self.budget = self._split_budget(job)
            except BudgetError as exc:  # a config error of this job (searches: "does not fit")
                self.budget_error = exc
                self.budget = self._split_budget(replace(job, host_budget_bytes=None))
            self.windows, self.prefetch_layers = self.budget.windows, self.budget.prefetch_layers
        if self.budget_error is not None:
            self.config_errors.append(self.budget_error.message)
        self.ns = self.part.ns
        self.lsg = self.part.largest_sub_group_numel
        iop = max(1, self.k.intra_op_parallelism)
        self.a_p = AIO_ALIGNED_BYTES * iop // self.E  # param swapper numel alignment
        self.a_o = AIO_ALIGNED_BYTES * iop // self.M  # optimizer swapper numel alignment
        self.min_aio_bytes = zero.min_aio_bytes(self.k)
        self.pin_memory = self.k.pin_memory
        self.flash = job.flash_attention if job.flash_attention is not None else True
        # Partitions of at least this many elements go through the swapper (n x E >= min_aio_bytes).
        self.min_swap_numel = -(-self.min_aio_bytes // self.E)

    def _split_budget(self, job: JobSpec) -> zero.BudgetPlan:
        layer = (job.micro_batch * job.seq_len * self.m.hidden_size * self.E
                 if job.checkpointing == "offload" else 0)
        try:
            return zero.split_budget(
                job.host_budget_bytes, elem_bytes=self.E, layer_checkpoint_bytes=layer,
                num_layers=self.m.num_hidden_layers, base=self.windows,
                accumulated_gradient_bytes=(self.G * self.part.ns if self.holds_gradients and job.accumulate_in_dram
                                            else 0),
                param_pool_bytes=lambda k: zero.model_param_pool_plan(self.m, self.k, world_size=self.world,
                                                                      elem_bytes=self.E, prefetch_layers=k).total_bytes)
        except zero.BudgetTooSmall as exc:
            raise BudgetError(f"host budget {exc.budget_bytes / GiB:.2f} GiB is below the {exc.min_bytes / GiB:.2f} GiB "
                              "memascend needs for this job (parameter pool, one optimizer chunk, gradient and "
                              "checkpoint slots)", f"give --host-budget {exc.min_bytes / GiB:.2f}GiB or more, or drop "
                              "it for full overlap") from None

    # how DeepSpeed pins: returns (resident bytes, pinned label, locked bytes)
    def pin_swap_pool(self, nbytes: int) -> tuple[int, str, int]:
        """P1/P2/P4: torch pow2 pinning up to 0.19.3, posix_memalign + mlock since 0.19.4 (PR #8212; 0.19.8
        swap_tensor/utils.py line 191 new_cpu_locked_tensor, ops/csrc/pin_memory/page_alloc.cpp lines 19-24)."""
        if self.memascend:
            return self.pin_exact(nbytes)
        if self.ver >= (0, 19, 4):
            return nbytes, "mlock", nbytes
        return self.pin_accel(nbytes, True)

    def pin_exact(self, nbytes: int) -> tuple[int, str, int]:
        """memascend: page-aligned exact-size buffers, cudaHostRegister'ed on a GPU machine; mlock is
        best effort (O_DIRECT does not need locked pages), so RLIMIT_MEMLOCK never binds."""
        return align_up(nbytes, PAGE_BYTES), ("exact, cuda-registered" if self.gpu else "exact"), 0

    def pin_accel(self, nbytes: int, pinned: bool) -> tuple[int, str, int]:
        """get_accelerator().pin_memory(): torch CachingHostAllocator (pow2) on CUDA; a no-op on the CPU accelerator
        (accelerator/cpu_accelerator.py line 283); mlock exact with DS_PIN_MEMORY_BACKEND=native (utils/pin_memory.py
        lines 20-53, selected at line 199; DeepSpeed >= 0.19.8)."""
        if self.memascend:
            return self.pin_exact(nbytes)
        if not pinned:
            return nbytes, "", 0
        if self.k.pin_backend == "native" and self.ver >= (0, 19, 8):
            return nbytes, "mlock", nbytes
        if not self.gpu:
            return nbytes, "", 0  # CPU_Accelerator.pin_memory returns the tensor unchanged
        return pow2_bytes(nbytes), "torch-pow2", 0
