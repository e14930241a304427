"""The itemised memory model of one ZeRO-3 job with params and optimizer states on NVMe.

Two engines are modelled on the same job:
  * ``baseline``  - stock DeepSpeed ZeRO-Infinity (version-dependent pinning, DeepSpeed's defaults);
  * ``memascend`` - this project's engine (memascend_engine): exact-size page-aligned pinned buffers,
    size-class parameter pools sized to the prefetch window (engine/pools.py computes the same
    totals), fused overflow scan, Direct NVMe extents, Adam states created in place in the swap
    buffers, the gradient buffer allocated pinned in place, and malloc_trim after backward (no
    allocator retention).

Every item is per rank and carries its formula and source. "deepspeed-notes" below refers to
shared/docs/deepspeed-notes.md (checked against DeepSpeed 0.19.8); P1..P7 are its §3 items.
Pure: stdlib only, no I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

from memascend_cli.errors import BadInput
from memascend_cli.models import ModelSpec, layer_template, numels_roles
from memascend_cli.planner import measured, zero
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.planner.zero import AIO_ALIGNED_BYTES, ZeroSettings

GiB = 1024**3
MIB = 1024**2
PAGE = 4096

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ENGINES = ("baseline", "memascend")
"""What the items model: stock DeepSpeed's code, or the memascend engine's techniques."""
VIEWS = ("baseline", "tuned", "memascend")
"""The three columns of a plan: stock DeepSpeed with the job's knobs, stock DeepSpeed given the stock knobs
memascend sets (zero.memascend_knobs), and memascend (the same knobs plus its techniques)."""
CHECKPOINTING = ("none", "selective", "full", "offload")

# Host memory of a rank before any model data: python + torch + deepspeed (+ transformers), as the system sees it
# (MemTotal - MemAvailable: anonymous memory; shared-library pages are page cache and stay available). CPU-only value
# fitted by scripts/fit_planner.py on the calibration runs of a 6M-parameter model (docs/bench/calibration): what the
# stock and tuned runs measured beyond every other item (medians of 3 repeats), 0.381 and 0.353 GiB. The CUDA value
# adds the host mappings of the CUDA runtime, cuBLAS and NCCL (1-4 GB per process by DeepSpeed's own estimate).
RUNTIME_CPU_BYTES = int(0.37 * GiB)
RUNTIME_CUDA_BYTES = int(2.5 * GiB)
# What the memascend engine itself adds per process (native core, its threads and io_uring rings, the region's
# extent map, huge-page rounding of its tensors): the memascend calibration run's residual beyond the runtime
# (scripts/fit_planner.py).
ENGINE_RUNTIME_BYTES = int(0.07 * GiB)
# A launcher process per node beside the ranks (it imports torch and waits): RssAnon after importing
# deepspeed.launcher.launch 162 MiB, torch.distributed.run 144 MiB (torch 2.13, DeepSpeed 0.19.8, CPU; re-measured by
# tests/integration/test_planner_assumptions.py). `memascend train` runs DeepSpeed's runner and launch.py (2), the
# bench torchrun for more than one rank (1).
LAUNCHER_PROCESS_BYTES = int(0.15 * GiB)
# glibc's largest mmap threshold on 64-bit (malloc/malloc.c DEFAULT_MMAP_THRESHOLD_MAX = 4 MiB x sizeof(long)):
# blocks at least this large are mmapped and returned at free; smaller ones stay in the allocator's arenas.
GLIBC_MMAP_THRESHOLD_MAX_BYTES = 32 * MIB
# Heap glibc keeps per checkpointed layer after stock's first forward + backward on a CPU rank, in units of the
# layer's widest activation block (s x b x I x E) when that block is larger than the heap's holes and below the mmap
# threshold: fitted by scripts/fit_planner.py on docs/bench/calibration/tuned-heap-l32-seq2048-fp32.json (mallinfo2
# free-kept heap +3.72 GiB over 32 layers of 22 MiB blocks).
ACTIVATION_HEAP_BLOCKS_PER_LAYER = 5.4
# GPU memory taken by the CUDA context and kernels of torch (typical H100/A100 value, 0.5-0.6 GiB).
CUDA_CONTEXT_BYTES = int(0.6 * GiB)
# Arrays a micro-batch of the training data is made of (input ids, labels, attention mask).
DATA_ARRAYS = 3


class BudgetError(BadInput):
    """A memascend host budget below what the job needs (a config error in estimates, bad input for the CLI)."""


def _align(n: int, a: int) -> int:
    """A(n, a) = ceil(n/a)*a (deepspeed-notes §3 notation)."""
    return -(-int(n) // a) * a


def _pow2(n: int) -> int:
    """PyTorch CachingHostAllocator rounds a pinned request up to a power of two (deepspeed-notes §4)."""
    return 0 if n <= 0 else 1 << (int(n) - 1).bit_length()


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.19.8' or '0.19.8+abc' -> (0, 19, 8)."""
    core = str(text).split("+")[0].split("rc")[0]
    parts = core.split(".")
    try:
        nums = [int(p) for p in parts[:3]] + [0] * (3 - len(parts[:3]))
    except ValueError:
        raise BadInput(f"cannot read DeepSpeed version {text!r}", "give it as MAJOR.MINOR.PATCH, e.g. 0.19.8") from None
    return (nums[0], nums[1], nums[2])


@dataclass(kw_only=True)
class JobSpec:
    """The training job, identical for both engines."""

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
    deepspeed_version: str = "0.19.8"
    knobs: ZeroSettings = zero.DEEPSPEED_DEFAULTS
    """The stock ZeRO settings of the job (memascend_cli/planner/zero.py: resolve); the memascend engine applies
    zero.memascend_knobs on top, exactly as memascend_engine.install does."""
    streaming: bool = True
    """memascend's bounded engine (gradient streaming + optimizer pipeline); False models DeepSpeed's gradient and
    optimizer path with the engine's other techniques (memascend_engine.EngineOptions.streaming)."""
    checkpoint_offload: str = "ssd"
    """Where memascend's offloaded activation checkpoints go: ssd (a bounded window) or dram (one buffer per layer)."""
    windows: zero.EngineWindows | None = None
    """memascend's host windows; None = zero.EngineWindows for the job's sub-group size (full overlap)."""
    host_budget_bytes: int | None = None
    """memascend's pinned + staging memory per rank (zero.split_budget); None = what full overlap needs."""
    param_buffer_size_auto: bool = True
    """offload_param.buffer_size is raised to the largest swapped partition of the model (what a user must write for
    DeepSpeed to start, and what zero.resolve does); False keeps knobs.param_buffer_size as given."""
    zero_init: bool = True
    """Model constructed under deepspeed.zero.Init (else every process first builds the full fp32 model)."""
    engine_knob_overrides: tuple[tuple[str, object], ...] = ()
    """(ZeroSettings field, value) the engine really ran with instead of what zero.memascend_knobs sets today: for
    re-planning runs recorded by an older engine (memascend_cli.bench.predict)."""
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
        if self.checkpoint_offload not in ("ssd", "dram"):
            raise BadInput(f"unknown checkpoint offload {self.checkpoint_offload!r}", "use ssd or dram")
        for name in ("seq_len", "micro_batch", "grad_accum_steps"):
            if int(getattr(self, name)) < 1:
                raise BadInput(f"{name.replace('_', '-')} must be at least 1", "give a positive whole number")
        if self.knobs.pin_backend not in ("torch", "native"):
            raise BadInput(f"unknown pin backend {self.knobs.pin_backend!r}", "use torch or native")
        if int(self.knobs.sub_group_size) < 1:
            raise BadInput("sub-group-size must be at least 1", "give a positive element count such as 2e7")
        parse_version(self.deepspeed_version)


@dataclass
class Item:
    """One line of the breakdown, per rank."""

    key: str
    """Hierarchical id, e.g. 'host/param_swap_pool' (stable, used in --json)."""
    label: str
    tier: str
    """host, gpu or nvme."""
    bytes: int
    kind: str = "steady"
    """steady (held for the whole run), or the phase it exists in: init, backward, optimizer, or
    retained (freed after backward but kept by the allocator through the optimizer step), or node (once per node,
    not per rank: the launcher)."""
    pinned: str = ""
    """'' (pageable), 'torch-pow2', 'mlock', 'exact' or 'exact, cuda-registered' (memascend)."""
    locked_bytes: int = 0
    """Bytes counted against RLIMIT_MEMLOCK (mlock-based pinning)."""
    formula: str = ""
    source: str = ""


@dataclass
class Estimate:
    """The breakdown of one engine on one job and machine."""

    engine: str
    items: list[Item]
    ranks_per_node: int
    world_size: int
    compute_on_host: bool
    notes: list[str] = field(default_factory=list)
    config_errors: list[str] = field(default_factory=list)
    """Settings the engine would reject at start-up (e.g. buffer_size below the largest partition)."""
    traffic: SsdTraffic | None = None
    """SSD bytes moved per optimizer step (see ssd_traffic)."""
    budget: zero.BudgetPlan | None = None
    """memascend's host budget split (bounded engine only)."""
    budget_error: BadInput | None = None
    """Set when the job's host budget is below the minimum (also listed in config_errors)."""

    def _sum(self, tier: str, kind: str) -> int:
        return sum(i.bytes for i in self.items if i.tier == tier and i.kind == kind)

    def _max(self, tier: str, kind: str) -> int:
        return max((i.bytes for i in self.items if i.tier == tier and i.kind == kind), default=0)

    @property
    def host_steady_bytes(self) -> int:
        return self._sum("host", "steady")

    def phase_bytes(self) -> dict[str, int]:
        """Host bytes on top of the steady level in each phase; 'retained' memory (what the allocator
        kept after backward) adds to the optimizer step."""
        return {
            "init": self._sum("host", "init"),
            "backward": self._sum("host", "backward"),
            "optimizer": self._sum("host", "optimizer") + self._sum("host", "retained"),
        }

    @property
    def host_transient_bytes(self) -> int:
        """The largest phase on top of the steady level."""
        return max(self.phase_bytes().values())

    @property
    def peak_phase(self) -> str:
        phases = self.phase_bytes()
        return max(phases, key=phases.get)

    @property
    def host_peak_bytes(self) -> int:
        """Peak host memory of one rank: steady + the largest phase."""
        return self.host_steady_bytes + self.host_transient_bytes

    @property
    def node_host_peak_bytes(self) -> int:
        """Peak host memory of one node (every rank peaks in the same step)."""
        return self.ranks_per_node * self.host_peak_bytes + self._sum("host", "node")

    @property
    def gpu_peak_bytes(self) -> int:
        return self._sum("gpu", "steady") + self._max("gpu", "transient")

    @property
    def nvme_bytes(self) -> int:
        """SSD space per rank."""
        return self._sum("nvme", "steady")

    @property
    def node_nvme_bytes(self) -> int:
        return self.ranks_per_node * self.nvme_bytes

    @property
    def locked_bytes(self) -> int:
        """mlocked bytes per rank (what RLIMIT_MEMLOCK limits)."""
        return sum(i.locked_bytes for i in self.items)

    @property
    def pinned_waste_bytes(self) -> int:
        return sum(i.bytes for i in self.items if i.key.endswith("pow2_waste"))

    def item(self, key: str) -> Item | None:
        return next((i for i in self.items if i.key == key), None)

    def to_dict(self) -> dict:
        return {
            "engine": self.engine,
            "ranks_per_node": self.ranks_per_node,
            "world_size": self.world_size,
            "compute_on_host": self.compute_on_host,
            "host_steady_bytes": self.host_steady_bytes,
            "host_peak_bytes": self.host_peak_bytes,
            "peak_phase": self.peak_phase,
            "phase_bytes": self.phase_bytes(),
            "node_host_peak_bytes": self.node_host_peak_bytes,
            "gpu_peak_bytes": self.gpu_peak_bytes,
            "nvme_bytes": self.nvme_bytes,
            "node_nvme_bytes": self.node_nvme_bytes,
            "locked_bytes": self.locked_bytes,
            "pinned_waste_bytes": self.pinned_waste_bytes,
            "items": [asdict(i) for i in self.items],
            "notes": list(self.notes),
            "config_errors": list(self.config_errors),
            "ssd_traffic": self.traffic.to_dict() if self.traffic else None,
            "host_budget": self.budget.to_dict() if self.budget else None,
        }


@dataclass
class SsdTraffic:
    """SSD bytes per rank per optimizer step, by what moves (steady state: after the first step)."""

    read_bytes: dict[str, int]
    write_bytes: dict[str, int]
    params_per_rank: int
    """Partition elements of the rank (the denominator of the per-parameter rates)."""
    formula: str = ""
    minimum_per_param: tuple[float, float] = (0.0, 0.0)
    """(read, write) bytes per parameter per step of the placement's roofline: parameters fetched once for forward
    and once for backward, the gradient written and read once in the training dtype, fp32 master + Adam moments read
    and written once, parameters written back once (what an engine with no extra traffic moves)."""

    @property
    def read_total(self) -> int:
        return sum(self.read_bytes.values())

    @property
    def write_total(self) -> int:
        return sum(self.write_bytes.values())

    def per_param(self) -> tuple[float, float]:
        """(read, write) bytes per parameter per step."""
        n = max(1, self.params_per_rank)
        return self.read_total / n, self.write_total / n

    def to_dict(self) -> dict:
        r, w = self.per_param()
        return {"read_bytes": dict(self.read_bytes), "write_bytes": dict(self.write_bytes),
                "read_bytes_per_step": self.read_total, "write_bytes_per_step": self.write_total,
                "read_bytes_per_param": round(r, 3), "write_bytes_per_param": round(w, 3),
                "minimum_read_bytes_per_param": round(self.minimum_per_param[0], 3),
                "minimum_write_bytes_per_param": round(self.minimum_per_param[1], 3),
                "write_bytes_per_1000_steps": 1000 * self.write_total, "formula": self.formula}


# --- partitions and sub-groups ------------------------------------------------------------------


@dataclass(frozen=True)
class Partitioning:
    """How ZeRO-3 splits the model on one rank (deepspeed-notes §2)."""

    partition_numels: tuple[int, ...]
    """ceil(numel/world) per parameter, in module order (Init._partition_param pads to world size)."""
    full_numels: tuple[int, ...]
    roles: tuple[str, ...]
    sub_groups: tuple[tuple[int, ...], ...]
    """Parameter indices per optimizer sub-group (stage3._create_fp16_sub_groups)."""

    sub_group_numels: tuple[int, ...]
    """Partition elements per sub-group."""
    _memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    """Derived sums, computed once per (rule, threshold): searches estimate the same partitioning many times."""

    def swappable_groups(self, min_numel: int) -> tuple[int, ...]:
        """Sub-groups of at least min_numel elements (DeepSpeed swaps only those)."""
        key = ("groups", min_numel)
        if key not in self._memo:
            self._memo[key] = tuple(g for g, n in enumerate(self.sub_group_numels) if n >= min_numel)
        return self._memo[key]

    def aligned_sum(self, what: str, min_numel: int, elem_bytes: int, align_bytes: int) -> int:
        """Sum of A(numel x elem_bytes, align) over the swappable partitions ('params') or sub-groups ('groups')."""
        key = (what, min_numel, elem_bytes, align_bytes)
        if key not in self._memo:
            numels = (self.partition_numels if what == "params"
                      else [self.sub_group_numels[g] for g in self.swappable_groups(min_numel)])
            # Layers repeat the same shapes: sum over distinct sizes.
            self._memo[key] = sum(_align(n * elem_bytes, align_bytes) * k for n, k in Counter(numels).items()
                                  if n >= min_numel)
        return self._memo[key]

    @property
    def ns(self) -> int:
        return sum(self.partition_numels)

    def sub_group_numel(self, g: int) -> int:
        return self.sub_group_numels[g]

    @property
    def largest_sub_group_numel(self) -> int:
        return max(self.sub_group_numels)

    @property
    def largest_partition_numel(self) -> int:
        return max(self.partition_numels)


@lru_cache(maxsize=512)
def partition(model: ModelSpec, world_size: int, sub_group_size: int) -> Partitioning:
    """Partition sizes and optimizer sub-groups, one param group in module order (zero.py's rules)."""
    full, roles = numels_roles(model)
    parts = full if world_size <= 1 else tuple(n for n, _ in zero.model_partitions(model, world_size))
    groups, numels = zero.sub_groups_and_numels(parts, sub_group_size)
    return Partitioning(parts, full, roles, groups, numels)


# --- the model ----------------------------------------------------------------------------------


def resolve_ranks(job: JobSpec, hw: HardwareSpec) -> int:
    if job.ranks_per_node is not None:
        if job.ranks_per_node < 1:
            raise BadInput("ranks per node must be at least 1", "give --ranks 1 or more")
        if hw.num_gpus and job.ranks_per_node > hw.num_gpus:
            raise BadInput(f"{job.ranks_per_node} ranks per node but the node has {hw.num_gpus} GPUs",
                           "use at most one rank per GPU")
        return job.ranks_per_node
    return hw.num_gpus if hw.num_gpus > 0 else 1


class _Ctx:
    """Derived quantities shared by the item functions."""

    def __init__(self, job: JobSpec, hw: HardwareSpec, engine: str):
        if engine not in VIEWS:
            raise BadInput(f"unknown engine {engine!r}", "use " + ", ".join(VIEWS))
        self.view = engine
        self.job, self.hw = job, hw
        self.engine = "memascend" if engine == "memascend" else "baseline"
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
            largest = zero.largest_swappable_partition(zero.model_partitions(self.m, self.world), self.k, self.E)
            self.k = zero.memascend_knobs(self.k, largest_partition_numel=largest or None)
            if job.engine_knob_overrides:
                self.k = replace(self.k, **dict(job.engine_knob_overrides))
        self.sub_group_size = self.k.sub_group_size
        self.reduce_bucket_size = self.k.reduce_bucket_size
        # memascend's bounded engine (memascend_engine.bounded): gradients stream to the SSD, the optimizer runs as a
        # pipeline of chunks; it replaces P2, P4, P5, P7 and the init / fp32-copy transients below.
        self.bounded = engine == "memascend" and job.streaming
        self.windows = job.windows or zero.EngineWindows(
            optimizer_chunk_numel=zero.chunk_numel_for(self.k.sub_group_size),
            checkpoint_offload=job.checkpoint_offload)
        self.ssd_checkpoints = (engine == "memascend" and job.checkpointing == "offload"
                                and self.windows.checkpoint_offload == "ssd")
        self.prefetch_layers = zero.DEFAULT_PREFETCH_LAYERS
        self.budget = None
        self.budget_error: BudgetError | None = None
        if self.bounded:
            try:
                self.budget = self._split_budget(job)
            except BudgetError as exc:  # a config error of this job (searches: "does not fit")
                self.budget_error = exc
                self.budget = self._split_budget(replace(job, host_budget_bytes=None))
            self.windows, self.prefetch_layers = self.budget.windows, self.budget.prefetch_layers
        self.part = partition(self.m, self.world, self.sub_group_size)
        self.ns = self.part.ns
        self.lsg = self.part.largest_sub_group_numel
        iop = max(1, self.k.intra_op_parallelism)
        self.a_p = AIO_ALIGNED_BYTES * iop // self.E  # param swapper numel alignment
        self.a_o = AIO_ALIGNED_BYTES * iop // self.M  # optimizer swapper numel alignment
        self.min_aio_bytes = zero.min_aio_bytes(self.k)
        self.pin_memory = self.k.pin_memory
        self.flash = job.flash_attention if job.flash_attention is not None else True
        key = ("swappable", self.min_aio_bytes, self.E)
        if key not in self.part._memo:
            self.part._memo[key] = tuple(n * self.E >= self.min_aio_bytes for n in self.part.partition_numels)
        self.swappable = self.part._memo[key]

    def _split_budget(self, job: JobSpec) -> zero.BudgetPlan:
        layer = (job.micro_batch * job.seq_len * self.m.hidden_size * self.E
                 if job.checkpointing == "offload" else 0)
        try:
            return zero.split_budget(
                job.host_budget_bytes, elem_bytes=self.E, layer_checkpoint_bytes=layer,
                num_layers=self.m.num_hidden_layers, base=self.windows,
                param_pool_bytes=lambda k: zero.model_param_pool_plan(self.m, self.k, world_size=self.world,
                                                                      elem_bytes=self.E, prefetch_layers=k).total_bytes)
        except zero.BudgetTooSmall as exc:
            raise BudgetError(f"host budget {exc.budget_bytes / GiB:.2f} GiB is below the {exc.min_bytes / GiB:.2f} GiB "
                              "memascend needs for this job (parameter pool, one optimizer chunk, gradient and "
                              "checkpoint slots)", f"give --host-budget {exc.min_bytes / GiB:.2f}GiB or more, or drop "
                              "it for full overlap") from None

    # how DeepSpeed pins: returns (resident bytes, pinned label, locked bytes)
    def pin_swap_pool(self, nbytes: int) -> tuple[int, str, int]:
        """P1/P2/P4: torch pow2 pinning up to 0.19.3, posix_memalign+mlock since 0.19.4 (PR #8212)."""
        if self.engine == "memascend":
            return self.pin_exact(nbytes)
        if self.ver >= (0, 19, 4):
            return nbytes, "mlock", nbytes
        return self.pin_accel(nbytes, True)

    def pin_exact(self, nbytes: int) -> tuple[int, str, int]:
        """memascend: page-aligned exact-size buffers, cudaHostRegister'ed on a GPU machine; mlock is
        best effort (O_DIRECT does not need locked pages), so RLIMIT_MEMLOCK never binds."""
        return _align(nbytes, PAGE), ("exact, cuda-registered" if self.gpu else "exact"), 0

    def pin_accel(self, nbytes: int, pinned: bool) -> tuple[int, str, int]:
        """get_accelerator().pin_memory(): torch CachingHostAllocator (pow2) on CUDA; a no-op on the
        CPU accelerator; mlock exact with DS_PIN_MEMORY_BACKEND=native (deepspeed-notes §1, §11)."""
        if self.engine == "memascend":
            return self.pin_exact(nbytes)
        if not pinned:
            return nbytes, "", 0
        if self.k.pin_backend == "native" and self.ver >= (0, 19, 8):
            return nbytes, "mlock", nbytes
        if not self.gpu:
            return nbytes, "", 0  # CPU_Accelerator.pin_memory returns the tensor unchanged
        return _pow2(nbytes), "torch-pow2", 0


def _host_items(c: _Ctx) -> list[Item]:
    job, k, E, part = c.job, c.k, c.E, c.part
    items: list[Item] = []
    pow2_waste = 0

    def add(key, label, nbytes, *, pinned="", locked=0, kind="steady", formula="", source=""):
        items.append(Item(key, label, "host", int(nbytes), kind, pinned, int(locked), formula, source))

    def add_pinned(key, label, raw_bytes, pin, *, formula, source):
        nonlocal pow2_waste
        resident, how, locked = pin
        if how == "torch-pow2":  # the rounding is shown as its own line
            add(key, label, raw_bytes, pinned=how, locked=locked, formula=formula, source=source)
            pow2_waste += resident - raw_bytes
        else:  # exact allocations: the item is what is resident (page rounding included)
            add(key, label, resident, pinned=how, locked=locked, formula=formula, source=source)

    calibration = "memascend bench calibration runs (scripts/fit_planner.py); deepspeed-notes §3.1 R_rt"
    runtime, runtime_source = (measured.constant("host_runtime_bytes", RUNTIME_CUDA_BYTES, calibration) if c.gpu
                               else (RUNTIME_CPU_BYTES, calibration))
    add("host/runtime", "runtime (python, torch, deepspeed" + (", CUDA" if c.gpu else "") + ")", runtime,
        formula="measured constant per process", source=runtime_source)
    if c.engine == "memascend":
        add("host/engine_runtime", "memascend engine (native core, io_uring rings, region map)",
            ENGINE_RUNTIME_BYTES, formula="measured constant per process",
            source="memascend bench calibration runs (scripts/fit_planner.py): memascend's residual beyond the runtime")

    swappable_parts = [n for n, s in zip(part.partition_numels, c.swappable) if s]
    largest_swappable = max(swappable_parts, default=0)

    # P1: parameter swap pool.
    if c.engine == "baseline":
        buffer_size = max(k.param_buffer_size, largest_swappable) if job.param_buffer_size_auto else k.param_buffer_size
        if largest_swappable > buffer_size:
            c.config_errors.append(
                f"offload_param.buffer_size {buffer_size:,} is below the largest parameter partition "
                f"{largest_swappable:,} (DeepSpeed: 'More elements ... than buffer size')")
        raw = k.param_buffer_count * _align(buffer_size, c.a_p) * E
        add_pinned("host/param_swap_pool", "P1 parameter swap pool", raw, c.pin_swap_pool(raw),
                   formula=f"buffer_count {k.param_buffer_count} x A(buffer_size {buffer_size:,}, {c.a_p}) x {E} B",
                   source="deepspeed-notes §2.1, partitioned_param_swapper.py _configure_aio")
    else:
        raw, desc = _adaptive_param_pool(c)
        add_pinned("host/param_swap_pool", "parameter pools (size classes)", raw, c.pin_swap_pool(raw),
                   formula=desc, source="memascend engine: adaptive buffer pool (paper §4)")

    # Partition elements per rank kept in DRAM: P3 (first max_in_cpu elements, baseline) or none.
    max_in_cpu = k.max_in_cpu
    in_cpu = min(max_in_cpu, c.ns)
    if in_cpu > 0:
        raw = in_cpu * E
        add_pinned("host/fp16_cpu_params", "P3 params kept in DRAM (max_in_cpu)", raw, c.pin_accel(raw, c.pin_memory),
                   formula=f"min(max_in_cpu {max_in_cpu:,}, Ns {c.ns:,}) x {E} B",
                   source="deepspeed-notes §2.1; stage3._create_param_groups_fp16_flat_cpu_memory")

    if c.bounded:
        _bounded_items(c, add_pinned)
    # P2: partitioned swap buffer, only when some sub-group stays on NVMe (params beyond max_in_cpu).
    if c.ns > max_in_cpu and not c.bounded:
        # reserve_partitioned_swap_space gets the FULL numels (param.ds_numel) of the largest sub-group.
        g = max(range(len(part.sub_groups)), key=part.sub_group_numel)
        raw = sum(_align(part.full_numels[i], c.a_p) for i in part.sub_groups[g]) * E
        if c.engine == "memascend":  # partition numels (not full), io-aligned, one page-rounded buffer
            raw = _align(sum(_align(part.partition_numels[i], c.a_p) for i in part.sub_groups[g]) * E, PAGE)
        add_pinned("host/partitioned_swap_buffer", "P2 partitioned swap buffer", raw, c.pin_swap_pool(raw),
                   formula="sum A(numel, a) over the largest sub-group x E",
                   source="deepspeed-notes §2.1; stage3.py reserve_partitioned_swap_space")

    # P4: optimizer swap pool, when some sub-group is large enough to swap.
    # Every chunk of the bounded engine lives on the SSD; DeepSpeed swaps sub-groups of at least min_aio_bytes.
    swappable_groups = part.swappable_groups(0 if c.bounded else -(-c.min_aio_bytes // c.M))
    need = zero.optimizer_buffer_count(pipeline_read=k.pipeline_read, pipeline_write=k.pipeline_write)
    if swappable_groups and not c.bounded:
        bc_o = k.optimizer_buffer_count
        if bc_o < need:
            c.config_errors.append(f"offload_optimizer.buffer_count {bc_o} < {need} needed for Adam with this "
                                   "pipelining (DeepSpeed: 'ran out of swap buffers')")
        raw = bc_o * _align(c.lsg, c.a_o) * c.M
        if c.engine == "memascend":  # exact, page-rounded buffers (zero.memascend_knobs sets bc_o = need)
            raw = zero.optimizer_pool_bytes(c.lsg, buffer_count=bc_o, intra_op_parallelism=k.intra_op_parallelism)
        add_pinned("host/optimizer_swap_pool", "P4 optimizer swap pool", raw, c.pin_swap_pool(raw),
                   formula=f"buffer_count {bc_o} x A(largest sub-group {c.lsg:,}, {c.a_o}) x 4 B",
                   source="deepspeed-notes §2.2; optimizer_utils.py SwapBufferManager")

    # P5: gradient flat buffer, full partition size, with any optimizer offload.
    if not c.bounded:
        raw = c.ns * c.G
        add_pinned("host/grad_flat_buffer", "P5 gradient flat buffer", raw, c.pin_accel(raw, c.pin_memory),
                   formula=f"Ns {c.ns:,} x {c.G} B (grad_accum_dtype)",
                   source="deepspeed-notes §2.3; stage3._setup_for_real_optimizer")

    # P6: partitions below min_aio_bytes never swap; each is pinned separately.
    small = [n for n, s in zip(part.partition_numels, c.swappable) if not s]
    if small:
        raw = sum(n * E for n in small)
        if c.engine == "memascend":
            pin = (sum(_align(n * E, PAGE) for n in small), c.pin_exact(0)[1], 0)
        else:
            per = [c.pin_accel(n * E, c.pin_memory) for n in small]
            pin = (sum(p[0] for p in per), per[0][1], sum(p[2] for p in per))
        add_pinned("host/small_params", f"P6 small params ({len(small)} partitions < {c.min_aio_bytes // MIB} MiB)",
                   raw, pin, formula="sum of partitions below min_aio_bytes x E",
                   source="deepspeed-notes §2.1; partition_parameters.py _partition_param")

    # P7: sub-groups too small to swap keep fp32 master + m + v + fp32 grad in DRAM.
    n = sum(part.sub_group_numels) - sum(part.sub_group_numels[g] for g in swappable_groups)
    if n:
        add("host/small_optimizer_groups", "P7 non-swappable optimizer sub-groups", 16 * n,
            formula=f"{n:,} elements x 16 B (fp32 master, grad, exp_avg, exp_avg_sq)",
            source="deepspeed-notes §3 P7; stage3._create_fp32_partitions")

    if pow2_waste > 0:
        add("host/pinned_pow2_waste", "pinned memory power-of-two waste", pow2_waste, pinned="torch-pow2",
            formula="sum over torch-pinned buffers of 2^ceil(log2 S) - S",
            source="deepspeed-notes §4; CachingHostAllocator PowerOf2Ceil")

    # Activation checkpoints kept in host DRAM (offloaded gradient checkpointing), per rank.
    if c.ssd_checkpoints:
        layer = job.micro_batch * job.seq_len * c.m.hidden_size * E
        add("host/activation_checkpoints", "activation checkpoint window (to/from the SSD)",
            c.windows.checkpoint_bytes(layer, c.m.num_hidden_layers),
            pinned=c.pin_exact(0)[1],
            formula=f"({c.windows.checkpoint_slots} write slots + 1 read buffer) x b x s x h x {E} B",
            source="memascend_engine.bounded.CheckpointStash; SSDTrain (arXiv 2408.10013)")
    elif job.checkpointing == "offload" and c.gpu:
        m = c.m
        # One buffer per layer (memascend: page-rounded pinned buffers).
        per_layer = job.micro_batch * job.seq_len * m.hidden_size * E
        raw = m.num_hidden_layers * (_align(per_layer, PAGE) if c.engine == "memascend" else per_layer)
        add("host/activation_checkpoints", "offloaded activation checkpoints", raw,
            pinned=c.pin_exact(raw)[1] if c.engine == "memascend" else "",
            formula=f"b {job.micro_batch} x s {job.seq_len} x h {m.hidden_size} x L {m.num_hidden_layers} x {E} B",
            source="Korthikanti et al. 2205.05198 full recomputation 2sbh per layer (16-bit); paper §8")

    # The data path (engine/data.py): tokens live in a memory-mapped cache whose pages each micro-batch
    # releases again, so what a rank holds is the micro-batch itself (input ids, labels, attention
    # mask as int64), independent of the dataset size.
    data_bytes = DATA_ARRAYS * 8 * job.micro_batch * job.seq_len
    add("host/data", "data: one micro-batch from the memory-mapped token cache", data_bytes,
        formula=f"{DATA_ARRAYS} int64 arrays x b {job.micro_batch} x s {job.seq_len} x 8 B",
        source="engine/data.py Split.batch (pages dropped with MADV_DONTNEED); docs/results.md data path")
    # The memascend engine fixes the mmap threshold (mallopt) before zero.Init, so it keeps nothing; on a GPU the
    # weights are built in device memory.
    zi_heap = zero_init_heap_bytes(c.m) if c.engine == "baseline" and not c.gpu and job.zero_init else 0
    if zi_heap:
        add("host/zero_init_heap", "zero.Init: freed weights kept in the heap", zi_heap,
            formula=f"L {c.m.num_hidden_layers} x fp32 bytes of each layer's largest weights (below "
                    f"{GLIBC_MMAP_THRESHOLD_MAX_BYTES // MIB} MiB)",
            source="glibc malloc/malloc.c dynamic mmap threshold; mallinfo2 after zero.Init "
                   "(benchmarks/zero_init_heap.py)")
    items.extend(_transients(c, zi_heap))
    return items


def zero_init_heap_bytes(m: ModelSpec) -> int:
    """Heap stock DeepSpeed's zero.Init leaves free but kept (glibc mallinfo2 fordblks) on a CPU rank. Pure.

    Each parameter is built full-size in fp32 on the host, partitioned and swapped out (partition_parameters.py
    Init._post_init_method). The first freed mmapped weight raises glibc's mmap threshold to its size, so the
    later ones come from the heap, and the small allocations made between them split every freed block: the heap
    grows by about one layer's largest weights per layer (recorded in docs/bench/micro/zero-init-heap.json:
    32.5 MiB per bench-llama layer = its three MLP matrices, 28 MiB per SmolLM2 layer; weights of 32 MiB or more
    stay mmapped). Not every shape fragments this way (Qwen2.5-0.5B keeps ~0.06 GiB at 8 layers)."""
    layer = layer_template(m)[1]
    largest = _largest_layer_numel(m)
    return m.num_hidden_layers * sum(_heap(4 * t.numel) for t in layer if t.numel == largest)


def _largest_layer_numel(m: ModelSpec) -> int:
    return max(t.numel for t in layer_template(m)[1])


def activation_heap_block_bytes(m: ModelSpec, tokens: int, elem_bytes: int) -> int:
    """A layer's widest activation block (tokens x intermediate x E) when stock's CPU forward/backward strands it in
    the heap, else 0. Pure. Each checkpointed layer's recomputation frees its blocks while the next layer's input stays
    live above them; blocks larger than the holes zero.Init left (the layer's largest fp32 weight) cannot reuse them
    and the heap grows (mallinfo2 in docs/bench/calibration/tuned-heap-l32-seq2048-fp32.json); blocks of 32 MiB or
    more are mmapped. At seq 256-512 the blocks fit the holes and nothing grows."""
    block = tokens * m.intermediate_size * elem_bytes
    hole = _heap(4 * _largest_layer_numel(m))
    return block if hole < block < GLIBC_MMAP_THRESHOLD_MAX_BYTES else 0


def _bounded_items(c: _Ctx, add_pinned) -> None:
    """The bounded engine's steady windows (memascend_engine.bounded): what DRAM holds instead of P2, P4, P5."""
    w = c.windows
    raw = w.optimizer_bytes(c.E)
    add_pinned("host/optimizer_pipeline", f"optimizer pipeline ({w.optimizer_depth} chunks in flight)", raw,
               c.pin_exact(raw), formula=f"depth {w.optimizer_depth} x chunk {w.optimizer_chunk_numel:,} x "
               f"(4 fp32 tensors x 4 B + 2 x {c.E} B staging)",
               source="memascend_engine.bounded.OptimizerPipeline (MemAscend pipelined optimizer; LoHan)")
    raw = w.gradient_bytes()
    add_pinned("host/gradient_window", "gradient staging window (to the SSD)", raw, c.pin_exact(raw),
               formula=f"{w.gradient_slots} slots x {w.gradient_slot_bytes // MIB} MiB",
               source="memascend_engine.bounded.GradientStream (Lin et al.: gradients to the SSD at once, 16-bit)")


def _adaptive_param_pool(c: _Ctx) -> tuple[int, str]:
    """The engine's size-class pools (zero.param_pool_plan: slots = what the prefetch window holds at once)."""
    plan = zero.model_param_pool_plan(c.m, c.k, world_size=c.world, elem_bytes=c.E, prefetch_layers=c.prefetch_layers)
    return plan.total_bytes, "exact slots: " + plan.describe()


def _transients(c: _Ctx, zero_init_heap: int = 0) -> list[Item]:
    """Host allocations of one phase (kind = init, backward or optimizer); the peak is the steady
    level plus the largest phase (see Estimate.host_peak_bytes)."""
    job = c.job
    out: list[Item] = []

    def add(key, label, nbytes, formula, source, kind):
        out.append(Item(key, label, "host", int(nbytes), kind, "", 0, formula, source))

    # -- init: initialize_optimizer_states allocates an fp32 gradient buffer of the largest sub-group
    # (DeepSpeed code neither engine replaces); fast_init=False adds an fp32 sub-group copy.
    if not c.bounded:  # the bounded engine builds fp32 masters chunk by chunk in its pipeline slots
        add("host/init_buffers", "init: fp32 sub-group buffers", 4 * c.lsg,
            f"4 B x largest sub-group {c.lsg:,}", "deepspeed-notes §2.2; stage3.initialize_optimizer_states", "init")
    if not job.zero_init:
        add("host/model_without_zero_init", "model built without zero.Init (full fp32 model)", 4 * c.m.num_params,
            f"4 B x N {c.m.num_params:,} per process", "deepspeed-notes §3.1", "init")

    # -- backward: per reduce bucket, partition_grads converts the gradients of swappable sub-groups to
    # fp32 host tensors (grad_buffer.to(fp32)) and swaps them out (both engines: DeepSpeed code).
    # A reduce bucket holds full gradients (all ranks' partitions); each rank converts its share of it.
    bucket = min(c.reduce_bucket_size, c.m.num_params)
    part_bucket = min(-(-c.reduce_bucket_size // c.world), c.ns)
    # Stock's CPU backward blocks below the mmap threshold: they first fill zero.Init's free heap, the rest is kept.
    backward_heap = _backward_heap_bytes(c, bucket, part_bucket) if c.engine == "baseline" and not c.gpu else 0
    if not c.bounded and not c.gpu:
        # On a GPU these copies are made on the device (stage3.py 2025-2028 moves the partition there first) and
        # reach the host only through the P4 pool: a GPU item (_compute_items), no host bytes.
        add("host/grad_fp32_copies", "backward: fp32 gradient copies for swap-out", 4 * part_bucket,
            f"4 B x min(reduce_bucket_size / world, Ns) = {part_bucket:,}",
            "stage3._offload_grad_partition_at_boundary (grad_buffer.to(fp32)); measured by memascend bench", "backward")
    copies_when_pinning = c.gpu or (c.k.pin_backend == "native" and c.ver >= (0, 19, 8))
    if not c.bounded and c.pin_memory and c.engine == "baseline" and copies_when_pinning:
        # P5 is torch.zeros(Ns) first, then pin_memory() copies it (stage3.py 791-795): both live at init. torch
        # pins by copying on CUDA, the native backend by copying into an mlocked block (utils/pin_memory.py pin);
        # the CPU accelerator without it returns the tensor itself.
        add("host/grad_buffer_init_copy", "init: gradient buffer before pinning", c.ns * c.G,
            f"Ns {c.ns:,} x {c.G} B", "stage3._setup_for_real_optimizer torch.zeros + accelerator.pin_memory", "init")
    elif job.grad_accum_steps > 1:
        largest = c.part.largest_partition_numel
        add("host/grad_accumulation_readback", "backward: accumulated gradient read back (one partition)",
            c.G * largest, f"{c.G} B x largest partition {largest:,}",
            "memascend_engine.bounded.GradientStream.read (micro-batches after the first)", "backward")
    if not c.gpu:
        # CPU-only: the compute working set is host memory too. The reduce bucket and persistent params
        # stay allocated. Backward has two high moments that never overlap: the loss backward (logits and
        # their fp32 upcast still live, no layer recomputed yet) and a bucket flush inside a layer's backward
        # (that layer's recomputed activations plus reduce_scatter_coalesced's torch.cat of the bucket,
        # coalesced_collectives.py); the logits are freed before the first layer is recomputed.
        by_key = {i.key.rsplit("/", 1)[-1]: i for i in _compute_items(c, tier="host")}
        for key in ("reduce_bucket", "persistent_params"):
            out.append(by_key.pop(key))
        params = by_key["live_params"].bytes
        gathered = params + by_key["live_param_grads"].bytes
        # No parameter has a gradient yet while the loss backward runs: only the gathered params count there.
        loss_bwd = max(sum(moment) for moment in _loss_backward_blocks(c))
        head = params + loss_bwd
        copies = _flush_copies(c)
        flush = gathered + by_key["activations"].bytes + copies * c.E * bucket
        working = max(head, flush)
        # Its blocks below the mmap threshold first fill the heap zero.Init left free (counted there already).
        reused = min(zero_init_heap, backward_heap, working)
        add("host/compute/forward_backward", "forward/backward working set", working - reused,
            f"max(gathered params {params:,} + loss backward {loss_bwd:,} (b*s*V*(E + 8), or b*s*V*(E + 4) + "
            f"the lm_head gradient), gathered params + their grads {gathered:,} + one layer's activations "
            f"{by_key['activations'].bytes:,} + {copies} bucket copies {copies * c.E * bucket:,})"
            + (f" - heap blocks placed in zero.Init's free heap {reused:,}" if reused else ""),
            "Korthikanti et al. 2205.05198; DeepSpeed runtime/comm/coalesced_collectives.py reduce_scatter_coalesced "
            "(torch.cat) + torch ProcessGroupGloo reduce_scatter_tensor (input copy)", "backward")

    # -- optimizer step.
    if c.engine == "baseline" and job.dtype == "fp16":
        add("host/overflow_check", "fp16 overflow check temporaries", 3 * c.ns,
            f"3 B x Ns {c.ns:,} (torch.isinf abs copy 2 B + bool 1 B)",
            "deepspeed-notes §5; stage3.has_overflow(partition_gradients=True)", "optimizer")
    if c.engine == "baseline":
        add("host/first_step_adam", "first optimizer step: Adam states created unpinned", 8 * c.lsg,
            f"8 B x largest sub-group {c.lsg:,}", "deepspeed-notes §2.2, addendum; cpu_adam.py zeros_like",
            "optimizer")
        if not c.gpu:
            # glibc keeps the freed backward blocks below its mmap threshold in its arenas, so the optimizer step
            # comes on top; blocks of 32 MiB and more were mmapped and went back at free. The memascend engine
            # calls malloc_trim after backward.
            # Backward blocks first reuse what zero.Init left free in the heap (host/zero_init_heap).
            retained = max(0, backward_heap - zero_init_heap)
            add("host/allocator_retention", "backward memory kept by the allocator", retained,
                f"the backward items' blocks below glibc's mmap threshold ({GLIBC_MMAP_THRESHOLD_MAX_BYTES // MIB} MiB)"
                " less the zero.Init heap they reuse",
                "glibc malloc/malloc.c DEFAULT_MMAP_THRESHOLD_MAX; memascend bench phase peaks", "retained")
            block = activation_heap_block_bytes(c.m, job.micro_batch * job.seq_len, c.E) \
                if job.checkpointing != "none" else 0
            if block:
                add("host/activation_heap", "checkpointed layers' blocks stranded in the heap",
                    int(ACTIVATION_HEAP_BLOCKS_PER_LAYER * block * c.m.num_hidden_layers),
                    f"{ACTIVATION_HEAP_BLOCKS_PER_LAYER} x L {c.m.num_hidden_layers} x block s*b*I*E {block:,}",
                    "glibc heap growth, mallinfo2 at phase starts; fitted by scripts/fit_planner.py", "retained")
    return out


def _flush_copies(c: _Ctx) -> int:
    """Bucket-sized copies a reduce-bucket flush makes on a CPU rank: reduce_scatter_coalesced's torch.cat plus gloo's
    reduce_scatter_tensor copy of its input (measured: tests/integration/test_planner_assumptions.py); none when
    the contiguous bucket is all-reduced in place (reduce_scatter off, stage3.py __avg_scatter_contiguous_grads)."""
    return 0 if c.k.contiguous_gradients and not c.k.reduce_scatter else 2


def _loss_backward_blocks(c: _Ctx) -> tuple[list[int], list[int]]:
    """The blocks live at the loss backward's two moments, beyond the gathered params. First cross_entropy's
    backward (torch.nn.functional.cross_entropy = log_softmax + nll_loss): the logits (E), the fp32 log-softmax
    kept for backward and the fp32 gradient it returns. Then lm_head's backward: the logits, their fp32 gradient
    and the lm_head weight's gradient, the first parameter gradient of the step (autograd runs the loss's nodes
    before the model's)."""
    bs_vocab = c.job.micro_batch * c.job.seq_len * c.m.vocab_size
    logits = bs_vocab * c.E
    return [logits, 4 * bs_vocab, 4 * bs_vocab], [logits, 4 * bs_vocab, c.m.vocab_size * c.m.hidden_size * c.E]


def _heap(nbytes: int) -> int:
    """`nbytes` if one block of that size comes from glibc's arenas (kept after free), else 0 (mmapped)."""
    return nbytes if nbytes < GLIBC_MMAP_THRESHOLD_MAX_BYTES else 0


def _backward_heap_bytes(c: _Ctx, bucket: int, part_bucket: int) -> int:
    """The CPU backward's high-water mark of arena (non-mmapped) blocks: what the allocator keeps afterwards.
    Same moments as the forward/backward item (loss backward, bucket flush), block by block."""
    job, m, E = c.job, c.m, c.E
    layer_tensors = layer_template(m)[1]
    layer = m.layer_numel()
    layer_heap = sum(_heap(t.numel * E) for t in layer_tensors)
    vocab = m.vocab_size * m.hidden_size
    prefetch = min(c.k.prefetch_bucket_size, layer)
    # gathered params (see _compute_items live_params), by block; in a layer's backward their grads too
    live_heap = (_heap(vocab * E) if vocab > layer else layer_heap) + layer_heap * prefetch // max(1, layer)
    gathered = 2 * live_heap
    bs = job.micro_batch * job.seq_len
    loss = max(sum(_heap(b) for b in moment) for moment in _loss_backward_blocks(c))
    act, _ = _activation_bytes(c)
    widest = bs * max(m.hidden_size, m.intermediate_size) * E  # the largest activation block of a layer
    act_heap = act if widest < GLIBC_MMAP_THRESHOLD_MAX_BYTES else 0
    flush = gathered + act_heap + _flush_copies(c) * _heap(E * bucket)
    # the fp32 copies for swap-out are one block per parameter partition (stock's path: no bounded engine here)
    parts = c.part.partition_numels
    small = sum(n for n in parts if n * 4 < GLIBC_MMAP_THRESHOLD_MAX_BYTES)
    copies = 4 * part_bucket * small // max(1, sum(parts))
    return copies + max(live_heap + loss, flush)


def _activation_bytes(c: _Ctx) -> tuple[int, str]:
    """Activation memory of the forward/backward, 16-bit per Korthikanti et al.; scaled for fp32."""
    job, m = c.job, c.m
    s, b, h, a, L = job.seq_len, job.micro_batch, m.hidden_size, m.num_attention_heads, m.num_hidden_layers
    scale = c.E / 2
    # Per layer, no recomputation: attention 11sbh + 5as^2b (scores, softmax, dropout), MLP 19sbh for a
    # 4h GeLU MLP; a SwiGLU MLP of width I stores input 2sbh + gate/up/act/product 8sbI instead.
    attn = 11 * s * b * h + (0 if c.flash else 5 * a * s * s * b)
    mlp = 2 * s * b * h + 8 * s * b * m.intermediate_size
    norms = 4 * s * b * h
    full_layer = attn + mlp + norms
    ck = job.checkpointing
    if ck == "none":
        total = L * full_layer
        desc = "L x (attention + SwiGLU MLP + norms), no recomputation"
    elif ck == "selective":
        total = L * (full_layer - (0 if c.flash else 5 * a * s * s * b)) + (0 if c.flash else 5 * a * s * s * b)
        desc = "L x layer without attention scores + one layer's scores (selective recomputation)"
    else:
        stored = 0 if (ck == "offload" and (c.gpu or c.ssd_checkpoints)) else L * 2 * s * b * h
        total = stored + full_layer
        desc = ("one layer recomputed" if stored == 0 else "L x 2sbh checkpoints + one layer recomputed")
    return int(total * scale), desc


def _compute_items(c: _Ctx, tier: str) -> list[Item]:
    """Working memory of the compute device: GPU memory, or host memory on a CPU-only job."""
    job, m, k, E = c.job, c.m, c.k, c.E
    items: list[Item] = []
    pre = f"{tier}/compute/" if tier == "host" else "gpu/"

    def add(key, label, nbytes, formula, source, kind="steady"):
        items.append(Item(pre + key, label, tier, int(nbytes), kind, "", 0, formula, source))

    if tier == "gpu":
        add("cuda_context", "CUDA context", CUDA_CONTEXT_BYTES, "constant", "typical CUDA 12 context + torch kernels")
    small = [n for n in c.part.full_numels if n < k.param_persistence_threshold]
    add("persistent_params", "persistent small params (whole)", sum(small) * E,
        f"params below stage3_param_persistence_threshold {k.param_persistence_threshold:,} x E",
        "deepspeed-notes §3.1 GPU items")
    layer = m.layer_numel()
    vocab = m.vocab_size * m.hidden_size
    live = max(layer, vocab) + min(k.prefetch_bucket_size, layer)
    add("live_params", "gathered params (current + prefetched)", live * E,
        f"(max(layer {layer:,}, vocab matrix {vocab:,}) + min(prefetch bucket, layer)) x E",
        "deepspeed-notes §3.1; partitioned_param_coordinator prefetch")
    # In backward every gathered parameter gets a full-size gradient until its reduce hook copies it
    # into the bucket.
    add("live_param_grads", "gradients of the gathered params", live * E, "= gathered params",
        "stage3 reduce_ready_partitions_and_remove_grads", kind="transient")
    if tier == "gpu" and not c.bounded:
        # Stock's boundary copies: the partition moved to the device and converted to fp32 before the swap-out
        # (stage3.py 2025-2028, 1453), one reduce bucket's worth at a time.
        part_bucket = min(-(-c.reduce_bucket_size // c.world), c.ns)
        per = c.G + (4 if c.G != 4 else 0)
        add("grad_fp32_copies", "fp32 gradient copies before swap-out", per * part_bucket,
            f"({c.G} + 4) B x min(reduce_bucket_size / world, Ns) = {part_bucket:,}",
            "stage3.partition_grads / _offload_grad_partition_at_boundary on the GPU", kind="transient")
    # The IPG bucket is torch.empty(reduce_bucket_size): reserved in full on a GPU, on the host only
    # the pages that backward fills are resident.
    bucket = c.reduce_bucket_size if tier == "gpu" else min(c.reduce_bucket_size, m.num_params)
    add("reduce_bucket", "gradient reduce bucket", bucket * E,
        f"reduce_bucket_size {c.reduce_bucket_size:,} elements x E" + ("" if tier == "gpu" else " (touched part)"),
        "deepspeed-notes §8; stage3.py ipg bucket")
    act, desc = _activation_bytes(c)
    add("activations", "activations", act, desc, "Korthikanti et al., arXiv 2205.05198 (Table 2), SwiGLU-adjusted")
    bs = job.micro_batch * job.seq_len
    if job.fused_cross_entropy:
        add("logits", "logits (Liger fused linear CE, chunked)", 8 * bs * m.hidden_size,
            "chunk of ~b*s*h fp32 logits + its grad", "Liger-Kernel FusedLinearCrossEntropy chunking")
    else:
        add("logits", "logits + fp32 loss upcast", bs * m.vocab_size * (E + 4),
            f"b*s {bs:,} x V {m.vocab_size:,} x ({E} + 4) B", "deepspeed-notes §12.3")
    return items


def _nvme_items(c: _Ctx) -> list[Item]:
    """SSD bytes per rank (deepspeed-notes §3.1: ~18 B/param/rank plus checkpoint copies)."""
    part, E = c.part, c.E
    align = PAGE if c.engine == "memascend" else AIO_ALIGNED_BYTES * max(1, c.k.intra_op_parallelism)
    params = part.aligned_sum("params", -(-c.min_aio_bytes // E), E, align)
    opt = part.aligned_sum("groups", 0 if c.bounded else -(-c.min_aio_bytes // c.M), 4, align)
    where = "region extents" if c.engine == "memascend" else "swap files"
    items = [
        Item("nvme/params", f"parameters ({where})", "nvme", params, "steady", "", 0,
             "sum A(partition x E) over swappable params", "deepspeed-notes §7"),
        Item("nvme/optimizer_states", "fp32 master + exp_avg + exp_avg_sq", "nvme", 3 * opt, "steady", "", 0,
             "3 x 4 B x swappable sub-group elements", "deepspeed-notes §7"),
        Item("nvme/gradients", "fp32 gradients", "nvme", opt, "steady", "", 0,
             "4 B x swappable sub-group elements", "deepspeed-notes §2.3, §7"),
    ]
    if c.job.checkpoint_copies:
        items.append(Item("nvme/checkpoints", f"checkpoint copies ({c.job.checkpoint_copies})", "nvme",
                          c.job.checkpoint_copies * 3 * opt, "steady", "", 0,
                          "copies x 12 B/param (optimizer folder without gradients)",
                          "deepspeed-notes §7 checkpointing (copytree)"))
    return items


PARAM_FETCHES_PER_STEP = {"none": 2, "selective": 2, "full": 3, "offload": 3}
"""Times each swapped parameter partition is read per micro-batch: forward and backward, plus the recomputed
forward of activation checkpointing (ZeRO-3 releases a layer's parameters after each module call: stage3
max_reuse_distance 0, which both engines use with params on NVMe)."""


def ssd_traffic(c: _Ctx) -> SsdTraffic:
    """SSD bytes per optimizer step, steady state (the first step reads no Adam moments).

    Stock DeepSpeed (runtime/zero/stage3.py _offload_grad_partition_at_boundary, optimizer_utils.py): fp32 gradients
    written and read back (4 + 4 B), fp32 master + exp_avg + exp_avg_sq read and written (12 + 12 B), 16-bit params
    written back (E B) and fetched for forward, backward (and recompute). The bounded engine writes and reads the
    gradient once in its training dtype (G + G B) instead (Lin et al.; peers' roofline table)."""
    job, part, E, G = c.job, c.part, c.E, c.G
    ga = job.grad_accum_steps
    swapped = part.aligned_sum("params", -(-c.min_aio_bytes // E), 1, 1)  # swapped partition elements
    opt = part.aligned_sum("groups", 0 if c.bounded else -(-c.min_aio_bytes // c.M), 1, 1)
    fetches = PARAM_FETCHES_PER_STEP[job.checkpointing]
    read = {"params": ga * fetches * E * swapped, "optimizer_states": 12 * opt}
    write = {"optimizer_states": 12 * opt, "params": E * swapped}
    if c.bounded:
        # Each micro-batch writes its gradient; later micro-batches read the running sum back first.
        read["gradients"] = G * opt * ga
        write["gradients"] = G * opt * ga
        grad = f"gradients {G} B x {ga} micro-batch(es) each way"
    else:
        read["gradients"] = 4 * opt
        write["gradients"] = 4 * opt
        grad = "fp32 gradients 4 B each way"
    if c.ssd_checkpoints:
        layer = job.micro_batch * job.seq_len * c.m.hidden_size * E
        read["activation_checkpoints"] = write["activation_checkpoints"] = ga * c.m.num_hidden_layers * layer
    n = max(1, c.ns)
    ckpt = read.get("activation_checkpoints", 0) / n
    minimum = ((2 * E * swapped + G * opt + 12 * opt) / n + ckpt, (E * swapped + G * opt + 12 * opt) / n + ckpt)
    return SsdTraffic(read, write, params_per_rank=c.ns,
                      formula=f"params {fetches} fetches x {E} B read, {E} B written; optimizer 12 B each way; {grad}",
                      minimum_per_param=minimum)


def estimate(job: JobSpec, hw: HardwareSpec, engine: str) -> Estimate:
    """The itemised per-rank memory of `engine` running `job` on `hw`."""
    c = _Ctx(job, hw, engine)
    c.config_errors = [c.budget_error.message] if c.budget_error else []
    items = _host_items(c)
    if job.launcher_processes:
        items.append(Item("host/launcher", f"launcher processes ({job.launcher_processes} per node)", "host",
                          job.launcher_processes * LAUNCHER_PROCESS_BYTES, "node", "", 0,
                          f"{job.launcher_processes} x measured constant (once per node)",
                          "RssAnon of a process that imported deepspeed.launcher.launch / torch.distributed.run"))
    if c.gpu:
        items += _compute_items(c, tier="gpu")
    items += _nvme_items(c)
    est = Estimate(engine=c.view, items=items, ranks_per_node=c.ranks, world_size=c.world,
                   compute_on_host=not c.gpu, config_errors=c.config_errors, traffic=ssd_traffic(c), budget=c.budget,
                   budget_error=c.budget_error)
    if not c.gpu:
        est.notes.append("CPU-only job: DeepSpeed runs on the CPU accelerator (gloo); compute memory is host memory")
        if job.checkpointing == "offload":
            est.notes.append("offloaded checkpointing is plain full checkpointing on a CPU-only job")
    if job.dtype != "fp16" and c.engine == "baseline":
        est.notes.append("bf16/fp32: stock ZeRO-3 skips the overflow check (only fp16 pays 3 B/element)")
    return est


def estimate_both(job: JobSpec, hw: HardwareSpec) -> dict[str, Estimate]:
    """baseline and memascend."""
    return {e: estimate(job, hw, e) for e in ENGINES}


def estimate_all(job: JobSpec, hw: HardwareSpec) -> dict[str, Estimate]:
    """baseline, tuned and memascend (VIEWS)."""
    return {e: estimate(job, hw, e) for e in VIEWS}
