"""ZeRO-3 settings, decided once: DeepSpeed's defaults, the stock knobs memascend sets, the partition rule (the
sub-group rule: subgroups.py), the swap-pool sizing, and `resolve`, which turns a job into its effective settings;
the bounded engine's optimizer chunks, host windows and budget come from windows.py and are read here too.

Everything that decides a ZeRO number calls this module: the planner (memascend_cli/planner/),
the DeepSpeed config builder (memascend_cli/run/dsconfig.py), `train`, `bench`, and the engine
(memascend_engine.runtime applies `memascend_knobs` to a user's config; on a config generated here that
changes nothing). Pure: stdlib only, no I/O.

The engine axis, one vocabulary everywhere (flags, plan JSON, tables, bench runs): ENGINES.
  * ``stock``     - stock DeepSpeed as a user writes it from DeepSpeed's docs: every knob at its default, except
                    ``offload_param.buffer_size`` raised to the largest partition (DeepSpeed asserts otherwise);
  * ``tuned``     - stock DeepSpeed given every stock knob memascend sets (`memascend_knobs`);
  * ``memascend`` - the same stock knobs as ``tuned`` (the two differ only in the engine's techniques).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache

# The bounded engine's chunks, windows and budget (planner/windows.py): read through this module like every
# other ZeRO number, by the planner and the engine.
from memascend_cli.planner.windows import (  # noqa: F401
    BF16_MOMENTS_PIPELINE_DEPTH,
    CHUNK_ALIGN_NUMEL,
    DEFAULT_PIPELINE_DEPTH,
    DEFAULT_PREFETCH_LAYERS,
    MASTER_BYTES,
    MEMASCEND_SUB_GROUP_SIZE,
    PAGE_BYTES,
    BudgetPlan,
    BudgetTooSmall,
    Chunk,
    EngineWindows,
    Piece,
    align_up,
    chunk_numel_for,
    default_pipeline_depth,
    optimizer_chunks,
    split_budget,
)
from memascend_cli.units import MiB

ENGINES = ("stock", "tuned", "memascend")
"""The engine axis (see the module docstring): what every command, document and table calls the three."""

MIN_AIO_BYTES = MiB
"""deepspeed/runtime/swap_tensor/utils.py MIN_AIO_BYTES: partitions below max(this, aio.block_size) never swap."""
AIO_ALIGNED_BYTES = 1024
"""deepspeed/runtime/swap_tensor/utils.py AIO_ALIGNED_BYTES: swap I/O granularity (x intra_op_parallelism)."""

# Stock knobs memascend sets (see memascend_knobs for why each).
MEMASCEND_REDUCE_BUCKET_SIZE = 50_000_000
"""Reduce bucket (elements): its gradients become fp32 before the swap-out (stage3.py partition_grads): 200 MB (5e8:
2 GB). With the optimizer overlapped with backward (memascend_engine.overlap) OVERLAP_REDUCE_BUCKET_SIZE, one chunk:
gradients reach it a chunk at a time, not in bursts that stall backward on the SSD (docs/bench/ssd-bound/)."""
OVERLAP_REDUCE_BUCKET_SIZE = MEMASCEND_SUB_GROUP_SIZE


@dataclass(frozen=True, kw_only=True)
class ZeroSettings:
    """The DeepSpeed ZeRO-3 NVMe-offload settings of one job (config keys in comments)."""

    sub_group_size: int
    """zero_optimization.sub_group_size (elements)."""
    reduce_bucket_size: int
    """zero_optimization.reduce_bucket_size (elements)."""
    prefetch_bucket_size: int
    """zero_optimization.stage3_prefetch_bucket_size (elements)."""
    max_live_parameters: int
    """zero_optimization.stage3_max_live_parameters (elements)."""
    max_reuse_distance: int
    """zero_optimization.stage3_max_reuse_distance (elements)."""
    param_persistence_threshold: int
    """zero_optimization.stage3_param_persistence_threshold: smaller params stay whole on the compute device."""
    contiguous_gradients: bool
    """zero_optimization.contiguous_gradients."""
    overlap_comm: bool
    """zero_optimization.overlap_comm (DeepSpeed's default is True for stage 3)."""
    reduce_scatter: bool
    """zero_optimization.reduce_scatter: True reduces a bucket through a concatenated copy (reduce_scatter_coalesced);
    False all-reduces the contiguous bucket in place (stage3.py __avg_scatter_contiguous_grads)."""
    param_buffer_count: int
    """offload_param.buffer_count."""
    param_buffer_size: int
    """offload_param.buffer_size (elements); must hold the largest swapped partition."""
    max_in_cpu: int
    """offload_param.max_in_cpu: partition elements per rank kept in (pinned) DRAM even with device nvme."""
    optimizer_buffer_count: int
    """offload_optimizer.buffer_count (Adam: 4, 8 with one of pipeline_read/write, 12 with both)."""
    pipeline_read: bool
    """offload_optimizer.pipeline_read."""
    pipeline_write: bool
    """offload_optimizer.pipeline_write."""
    fast_init: bool
    """offload_optimizer.fast_init."""
    pin_memory: bool
    """offload_param.pin_memory and offload_optimizer.pin_memory (True by default since 0.19.5)."""
    pin_backend: str
    """Environment DS_PIN_MEMORY_BACKEND: 'torch' (CachingHostAllocator, power-of-two) or 'native' (mlock,
    exact size; DeepSpeed >= 0.19.8)."""
    aio_block_size: int
    """aio.block_size (bytes)."""
    aio_queue_depth: int
    """aio.queue_depth."""
    intra_op_parallelism: int
    """aio.intra_op_parallelism (the documented thread_count is ignored by DeepSpeed)."""
    single_submit: bool
    """aio.single_submit."""
    overlap_events: bool
    """aio.overlap_events."""

    def to_dict(self) -> dict:
        return asdict(self)

    def env(self) -> dict[str, str]:
        """Environment variables the settings need in every rank."""
        return {"DS_PIN_MEMORY_BACKEND": self.pin_backend} if self.pin_backend != "torch" else {}

    def stock_differences(self, other: ZeroSettings) -> dict[str, tuple]:
        """Knobs whose values differ: {name: (self, other)}."""
        return {f.name: (getattr(self, f.name), getattr(other, f.name)) for f in fields(self)
                if getattr(self, f.name) != getattr(other, f.name)}


# DeepSpeed 0.19.8's defaults: deepspeed/runtime/zero/config.py (reduce_bucket_size 5e8 line 113, sub_group_size
# 1e9 line 182, stage3_prefetch_bucket_size 5e7 line 222, param_persistence 1e5 line 228, max_live 1e9 line 245,
# max_reuse_distance 1e9 line 251, overlap_comm True for stage 3 line 384-386, contiguous_gradients True line 102,
# reduce_scatter True line 108),
# deepspeed/runtime/zero/offload_config.py (buffer_count 5, buffer_size 1e8, max_in_cpu 1e9 for params; buffer_count 4
# for the optimizer; pin_memory True since 0.19.5), deepspeed/runtime/swap_tensor/aio_config.py (block 1 MiB, depth 8,
# intra_op_parallelism 1, single_submit False, overlap_events True).
DEEPSPEED_DEFAULTS = ZeroSettings(
    sub_group_size=1_000_000_000, reduce_bucket_size=500_000_000, prefetch_bucket_size=50_000_000,
    max_live_parameters=1_000_000_000, max_reuse_distance=1_000_000_000, param_persistence_threshold=100_000,
    contiguous_gradients=True, overlap_comm=True, reduce_scatter=True,
    param_buffer_count=5, param_buffer_size=100_000_000, max_in_cpu=1_000_000_000,
    optimizer_buffer_count=4, pipeline_read=False, pipeline_write=False, fast_init=False, pin_memory=True,
    pin_backend="torch",
    aio_block_size=MiB, aio_queue_depth=8, intra_op_parallelism=1, single_submit=False, overlap_events=True,
)


def version_defaults(version: tuple[int, int, int]) -> ZeroSettings:
    """DeepSpeed's defaults for an older version: pin_memory was False before 0.19.5 (offload_config.py, PR #8207)."""
    return DEEPSPEED_DEFAULTS if version >= (0, 19, 5) else replace(DEEPSPEED_DEFAULTS, pin_memory=False)


# --- partitions and sub-groups --------------------------------------------------------------------


def partition_numel(numel: int, world_size: int) -> int:
    """ZeRO-3 partition of a tensor: padded to a multiple of the world size, then split
    (deepspeed/runtime/zero/partition_parameters.py Init._partition_param / _padding_size)."""
    return -(-int(numel) // max(1, int(world_size)))


def min_aio_bytes(s: ZeroSettings) -> int:
    """Smallest partition / sub-group that swaps (partitioned_param_swapper.py _configure_aio, optimizer_utils.py)."""
    return max(MIN_AIO_BYTES, int(s.aio_block_size))


@lru_cache(maxsize=1024)
def template_partitions(model, world_size: int) -> tuple[tuple[tuple[int, str], ...], ...]:
    """(partition numel, role) per tensor before the decoder layers, of one layer, and after (all layers are alike:
    the plan's depth search asks for models of 1000s of layers)."""
    from memascend_cli.models import template_numels_roles

    w = max(1, int(world_size))
    return tuple(tuple((partition_numel(n, w), r) for n, r in part) for part in template_numels_roles(model))


@lru_cache(maxsize=256)
def model_partitions(model, world_size: int) -> tuple[tuple[int, str], ...]:
    """(partition numel, role) of every parameter of a memascend ModelSpec, in module order (cached: the planner's
    searches ask for the same model many times)."""
    head, layer, tail = template_partitions(model, world_size)
    return head + layer * model.num_hidden_layers + tail


@lru_cache(maxsize=1024)
def distinct_model_partitions(model, world_size: int) -> frozenset[tuple[int, str]]:
    """The distinct (partition numel, role) pairs of model_partitions."""
    return frozenset(pair for part in template_partitions(model, world_size) for pair in part)


@lru_cache(maxsize=1024)
def _largest_swappable(partitions: frozenset, min_bytes: int, elem_bytes: int) -> int:
    return max((n for n, _ in partitions if n * elem_bytes >= min_bytes), default=0)


def largest_swappable_partition(partitions: Iterable[tuple[int, str]], s: ZeroSettings, elem_bytes: int) -> int:
    """Largest partition that goes through the parameter swap pool (0 if none swaps)."""
    return _largest_swappable(frozenset(partitions), min_aio_bytes(s), elem_bytes)


# --- the engines ------------------------------------------------------------------------------------


def optimizer_buffer_count(*, pipeline_read: bool = False, pipeline_write: bool = False, num_states: int = 2) -> int:
    """Optimizer swap buffers Adam really needs: fp32 master + states + gradient per sub-group in flight, one more
    sub-group for each of read prefetch and write-behind (pipelined_optimizer_swapper.py; 'ran out of swap
    buffers' otherwise)."""
    return (1 + num_states + 1) * (1 + int(bool(pipeline_read)) + int(bool(pipeline_write)))


def memascend_knobs(s: ZeroSettings, *, largest_partition_numel: int | None = None,
                    overlap: bool = True) -> ZeroSettings:
    """The stock DeepSpeed knobs memascend sets. Idempotent: memascend_knobs(memascend_knobs(s)) == memascend_knobs(s).

    - sub_group_size <= 2,097,152 and reduce_bucket_size <= 5e7, or one chunk with `overlap` (constants above);
    - reduce_scatter off: with contiguous gradients a bucket is then all-reduced in place instead of being
      concatenated into a second bucket-sized tensor first (coalesced_collectives.py reduce_scatter_coalesced's
      torch.cat; on the CPU gloo's reduce_scatter_tensor copies that again). One rank reduces nothing either way;
      several move twice the bytes of a reduce-scatter over the interconnect, which the SSD-bound step hides;
    - max_in_cpu 0: parameters really live on the SSD (the default 1e9 keeps a < 1B-per-rank model in pinned DRAM,
      stage3.py _create_param_groups_fp16_flat_cpu_memory), and then stage3_max_reuse_distance 0: with the default a
      fetched NVMe partition keeps its buffer once the trace is recorded and step 2 fails with 'Not enough buffers';
    - offload_param.buffer_size = the largest swapped partition when the model is known (the smallest DeepSpeed
      accepts: partitioned_param_swapper.py get_buffer asserts numel <= buffer_size);
    - offload_optimizer.buffer_count = exactly what Adam needs with the chosen pipelining; fast_init off (it hands the
      whole parameter pool to the optimizer init and needs every slot to hold a sub-group);
    - pinned swap buffers, allocated at exact size (DS_PIN_MEMORY_BACKEND=native, deepspeed/utils/pin_memory.py).
    """
    out = replace(
        s,
        sub_group_size=min(int(s.sub_group_size), MEMASCEND_SUB_GROUP_SIZE),
        reduce_bucket_size=min(int(s.reduce_bucket_size),
                               OVERLAP_REDUCE_BUCKET_SIZE if overlap else MEMASCEND_REDUCE_BUCKET_SIZE),
        max_in_cpu=0, max_reuse_distance=0, fast_init=False, pin_memory=True, pin_backend="native",
        reduce_scatter=False,
        optimizer_buffer_count=optimizer_buffer_count(pipeline_read=s.pipeline_read, pipeline_write=s.pipeline_write),
    )
    if largest_partition_numel:
        out = replace(out, param_buffer_size=int(largest_partition_numel))
    return out


def knob_notes(given: ZeroSettings, engine: str, *, defaults: ZeroSettings = DEEPSPEED_DEFAULTS,
               largest_partition_numel: int | None = None) -> list[str]:
    """One line per knob the user gave (a value of `given` other than `defaults`) that `engine` does not run with:
    tuned and memascend cap sub_group_size and reduce_bucket_size and set the other knobs of `memascend_knobs`
    (buffer_size too when `largest_partition_numel` is known); memascend's size-class pools ignore
    param_buffer_count; stock runs every knob as given. Pure."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; engines are {', '.join(ENGINES)}")
    if engine == "stock":
        return []
    effective = memascend_knobs(given, largest_partition_numel=largest_partition_numel)
    caps = {"sub_group_size": MEMASCEND_SUB_GROUP_SIZE, "reduce_bucket_size": OVERLAP_REDUCE_BUCKET_SIZE}
    notes = []
    for name, (mine, theirs) in given.stock_differences(effective).items():
        if getattr(defaults, name) == mine:
            continue  # not given by the user: nothing to say
        if name in caps:
            notes.append(f"{name} {mine:,} is capped to {theirs:,} for tuned and memascend (the largest value "
                         "memascend runs with; stock uses it as given)")
        else:
            shown = [f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v) for v in (mine, theirs)]
            notes.append(f"{name} {shown[0]} is replaced by {shown[1]} for tuned and memascend (a knob memascend "
                         "sets; stock uses it as given)")
    if engine == "memascend" and given.param_buffer_count != defaults.param_buffer_count:
        notes.append(f"param_buffer_count {given.param_buffer_count} is not used by memascend (its parameter pools "
                     "are sized per tensor role); stock and tuned use it")
    return notes


def resolve(engine: str, *, model, world_size: int, elem_bytes: int, base: ZeroSettings | None = None,
            aio_block_size: int | None = None, aio_queue_depth: int | None = None,
            notes: list[str] | None = None) -> ZeroSettings:
    """The effective ZeRO settings of `engine` for `model` on `world_size` ranks.

    Args:
        engine: stock, tuned or memascend (ENGINES; see the module docstring).
        model: a memascend ModelSpec (its tensor inventory sizes the buffers).
        world_size: ranks over all nodes.
        elem_bytes: bytes per element of the model dtype (2 for bf16/fp16, 4 for fp32).
        base: the stock settings to start from (knobs the user gave); default DeepSpeed's defaults.
        aio_block_size / aio_queue_depth: what `prepare-ssd` measured on the region, given to every engine but
            stock (stock keeps DeepSpeed's defaults).
        notes: collects one line per knob given in `base` that `engine` caps or replaces (knob_notes), for the
            caller to print as a warning.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; engines are {', '.join(ENGINES)}")
    s = base or DEEPSPEED_DEFAULTS
    if notes is not None and base is not None:
        notes.extend(knob_notes(base, engine))
    largest = largest_swappable_partition(distinct_model_partitions(model, world_size), s, elem_bytes)
    if engine == "stock":
        # What a user must write for the job to start: buffer_size at least the largest swapped partition.
        return replace(s, param_buffer_size=max(int(s.param_buffer_size), largest))
    if aio_block_size:
        s = replace(s, aio_block_size=int(aio_block_size))
    if aio_queue_depth:
        s = replace(s, aio_queue_depth=int(aio_queue_depth))
    largest = largest_swappable_partition(distinct_model_partitions(model, world_size), s, elem_bytes)
    return memascend_knobs(s, largest_partition_numel=largest or None)


# --- DeepSpeed config sections ---------------------------------------------------------------------

# (ZeroSettings field, config section, key): the one map between settings and DeepSpeed's JSON.
_CONFIG_KEYS = (
    ("sub_group_size", "zero", "sub_group_size"),
    ("reduce_bucket_size", "zero", "reduce_bucket_size"),
    ("prefetch_bucket_size", "zero", "stage3_prefetch_bucket_size"),
    ("max_live_parameters", "zero", "stage3_max_live_parameters"),
    ("max_reuse_distance", "zero", "stage3_max_reuse_distance"),
    ("param_persistence_threshold", "zero", "stage3_param_persistence_threshold"),
    ("contiguous_gradients", "zero", "contiguous_gradients"),
    ("overlap_comm", "zero", "overlap_comm"),
    ("reduce_scatter", "zero", "reduce_scatter"),
    ("param_buffer_count", "offload_param", "buffer_count"),
    ("param_buffer_size", "offload_param", "buffer_size"),
    ("max_in_cpu", "offload_param", "max_in_cpu"),
    ("optimizer_buffer_count", "offload_optimizer", "buffer_count"),
    ("pipeline_read", "offload_optimizer", "pipeline_read"),
    ("pipeline_write", "offload_optimizer", "pipeline_write"),
    ("fast_init", "offload_optimizer", "fast_init"),
    ("aio_block_size", "aio", "block_size"),
    ("aio_queue_depth", "aio", "queue_depth"),
    ("intra_op_parallelism", "aio", "intra_op_parallelism"),
    ("single_submit", "aio", "single_submit"),
    ("overlap_events", "aio", "overlap_events"),
)


_ZERO_ALIASES = {"stage3_prefetch_bucket_size": "prefetch_bucket_size",
                 "stage3_max_live_parameters": "max_live_parameters",
                 "stage3_max_reuse_distance": "max_reuse_distance",
                 "stage3_param_persistence_threshold": "param_persistence_threshold"}
"""DeepSpeed accepts these zero_optimization keys under either name (runtime/zero/config.py Field aliases) and
rejects a config that gives both."""


def _config_key(section: dict, key: str) -> str:
    """The name `section` uses for `key` (its DeepSpeed alias when only that is present)."""
    alias = _ZERO_ALIASES.get(key)
    return alias if alias is not None and key not in section and alias in section else key


def _keys(where: str, s: ZeroSettings) -> dict:
    return {key: getattr(s, f) for f, w, key in _CONFIG_KEYS if w == where}


OFFLOAD_DEVICES = ("none", "cpu", "nvme")
"""Where an offload section puts its tensors: none (no section: on the compute device), cpu (DRAM, ZeRO-Offload) or
nvme (ZeRO-Infinity; memascend's region)."""


def _offload(name: str, device: str, s: ZeroSettings, nvme_path: str) -> dict:
    if device not in OFFLOAD_DEVICES:
        raise ValueError(f"unknown offload device {device!r}; devices are {', '.join(OFFLOAD_DEVICES)}")
    if device == "cpu":  # the swap keys (buffers, aio pipelining) are NVMe's (runtime/zero/offload_config.py)
        return {"device": "cpu", "pin_memory": bool(s.pin_memory)}
    return {"device": "nvme", "nvme_path": nvme_path, "pin_memory": bool(s.pin_memory), **_keys(name, s)}


def zero_section(s: ZeroSettings, nvme_path: str, *, param_device: str = "nvme",
                 optimizer_device: str = "nvme") -> dict:
    """`zero_optimization` of a ZeRO-3 job with its parameters and optimizer states on `param_device` and
    `optimizer_device` (OFFLOAD_DEVICES; NVMe at `nvme_path`)."""
    section = {"stage": 3, **_keys("zero", s)}
    for name, device in (("offload_param", param_device), ("offload_optimizer", optimizer_device)):
        if device != "none":
            section[name] = _offload(name, device, s, nvme_path)
    return section


def aio_section(s: ZeroSettings) -> dict:
    """The `aio` block."""
    return _keys("aio", s)


def _coerce(value, default):
    """A config value as the type of DeepSpeed's default (DeepSpeed accepts counts written as floats, e.g. 5e8)."""
    if value is None:
        return default
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, int):
        return int(float(value))
    return type(default)(value)


def _sections(cfg: dict) -> dict[str, dict]:
    z = cfg.get("zero_optimization") or {}
    return {"zero": z, "offload_param": z.get("offload_param") or {},
            "offload_optimizer": z.get("offload_optimizer") or {}, "aio": cfg.get("aio") or {}}


def from_ds_config(cfg: dict, env: dict | None = None, *, defaults: ZeroSettings = DEEPSPEED_DEFAULTS) -> ZeroSettings:
    """Read the settings back from a DeepSpeed config (missing keys take DeepSpeed's defaults) and the environment
    (DS_PIN_MEMORY_BACKEND). The inverse of zero_section + aio_section."""
    sec = _sections(cfg)
    values = {f: _coerce(sec[where].get(_config_key(sec[where], key)), getattr(defaults, f))
              for f, where, key in _CONFIG_KEYS}
    pin = sec["offload_param"].get("pin_memory", sec["offload_optimizer"].get("pin_memory"))
    backend = (env or {}).get("DS_PIN_MEMORY_BACKEND") or "torch"
    return ZeroSettings(**values, pin_memory=_coerce(pin, defaults.pin_memory),
                        pin_backend=backend if backend in ("torch", "native") else "torch")


def write_into_ds_config(cfg: dict, s: ZeroSettings) -> dict[str, dict]:
    """Write `s` into `cfg` in place (keeping its devices and nvme paths; offload sections only where they exist);
    returns {setting: {"from", "to"}} for every effective value that changed. A config built by zero_section /
    aio_section from the same settings comes back unchanged (and the result is empty)."""
    before = from_ds_config(cfg, s.env())
    z = cfg.setdefault("zero_optimization", {})
    targets = {"zero": z, "aio": cfg.setdefault("aio", {})}
    for name in ("offload_param", "offload_optimizer"):
        if z.get(name):
            targets[name] = z[name]
            z[name]["pin_memory"] = bool(s.pin_memory)
    for f, where, key in _CONFIG_KEYS:
        if where in targets:
            targets[where][_config_key(targets[where], key)] = getattr(s, f)
    after = from_ds_config(cfg, s.env())
    return {k: {"from": a, "to": b} for k, (a, b) in before.stock_differences(after).items()}


# --- swap pools --------------------------------------------------------------------------------------

VOCAB_CLASS = "vocab"
DECODER_ROLES = ("attn_q", "attn_kv", "attn_o", "mlp")


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
        return self.slot_numel * elem_bytes

    def nbytes(self, elem_bytes: int) -> int:
        return self.slot_count * self.slot_bytes(elem_bytes)


@dataclass(frozen=True)
class PoolPlan:
    """Size classes of one pool, smallest slot first."""

    classes: tuple[SizeClass, ...]
    elem_bytes: int
    """Bytes per element of the pooled dtype."""

    @property
    def total_bytes(self) -> int:
        return sum(c.nbytes(self.elem_bytes) for c in self.classes)

    @property
    def slot_count(self) -> int:
        return sum(c.slot_count for c in self.classes)

    @property
    def largest_slot_numel(self) -> int:
        return max((c.slot_numel for c in self.classes), default=0)

    def class_for(self, numel: int) -> int | None:
        """Index of the smallest class whose slots hold ``numel`` elements, or None."""
        for i, c in enumerate(self.classes):
            if c.slot_numel >= numel:
                return i
        return None

    def describe(self) -> str:
        return ", ".join(f"{c.name} {c.slot_count}x{c.slot_numel:,}" for c in self.classes) + f" x {self.elem_bytes} B"


def slot_alignment_bytes(intra_op_parallelism: int = 1) -> int:
    """Slot sizes are multiples of both the page and DeepSpeed's I/O granularity."""
    io_bytes = AIO_ALIGNED_BYTES * max(1, int(intra_op_parallelism))
    a, b = PAGE_BYTES, io_bytes
    while b:
        a, b = b, a % b
    return PAGE_BYTES * io_bytes // a


def per_layer_role_counts(model) -> dict[str, int]:
    """How many tensors of each role one decoder layer has."""
    from memascend_cli.models import layer_template

    counts: dict[str, int] = {}
    for t in layer_template(model)[1]:
        counts[t.role] = counts.get(t.role, 0) + 1
    return counts


def param_pool_plan(partitions: Iterable[tuple[int, str]], *, elem_bytes: int, per_layer_counts: dict[str, int],
                    prefetch_layers: int = DEFAULT_PREFETCH_LAYERS, min_aio_bytes: int = MIN_AIO_BYTES,
                    intra_op_parallelism: int = 1) -> PoolPlan:
    """Size classes of memascend's parameter pool (MemAscend, arXiv 2505.23254: adaptive buffer pool).

    Stock DeepSpeed stages every partition in one of buffer_count slots of buffer_size elements, and buffer_size
    must hold the largest partition (the embedding), so a q_proj 1/40 that size occupies an embedding-sized slot.
    Here every swapped partition is grouped by role (vocab = embed_tokens/lm_head, mlp, attn_q, attn_o, attn_kv,
    other); a class's slot holds its largest partition rounded up to the page and I/O granularity; decoder roles get
    prefetch_layers x (tensors of that role per layer) slots, ``other`` prefetch_layers, and ``vocab`` one slot (the
    embedding and lm_head are never live together); classes with equal slot sizes merge.
    """
    if elem_bytes <= 0:
        raise ValueError(f"elem_bytes must be positive, got {elem_bytes}")
    if prefetch_layers < 1:
        raise ValueError(f"prefetch_layers must be >= 1, got {prefetch_layers}")
    align_b = slot_alignment_bytes(intra_op_parallelism)
    largest: dict[str, int] = {}
    for numel, role in partitions:
        if numel * elem_bytes < min_aio_bytes:
            continue  # never swapped: stays resident, needs no slot
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


@lru_cache(maxsize=256)
def model_param_pool_plan(model, s: ZeroSettings, *, world_size: int, elem_bytes: int,
                          prefetch_layers: int = DEFAULT_PREFETCH_LAYERS) -> PoolPlan:
    """param_pool_plan for a ModelSpec under settings `s` (what the engine allocates and the planner charges)."""
    # Only the largest partition per role matters: distinct (numel, role) pairs are enough.
    return param_pool_plan(distinct_model_partitions(model, world_size), elem_bytes=elem_bytes,
                           per_layer_counts=per_layer_role_counts(model), prefetch_layers=prefetch_layers,
                           min_aio_bytes=min_aio_bytes(s), intra_op_parallelism=s.intra_op_parallelism)


def uniform_pool_plan(*, buffer_count: int, buffer_numel: int, elem_bytes: int, intra_op_parallelism: int = 1) -> PoolPlan:
    """Without a model inventory: DeepSpeed's buffer_count x buffer_size as one class (exact-size, not adaptive)."""
    slot_numel = align_up(buffer_numel * elem_bytes, slot_alignment_bytes(intra_op_parallelism)) // elem_bytes
    return PoolPlan(classes=(SizeClass(name="uniform", slot_numel=slot_numel, slot_count=int(buffer_count),
                                       largest_partition_numel=int(buffer_numel)),), elem_bytes=elem_bytes)


def optimizer_pool_bytes(largest_sub_group_numel: int, *, buffer_count: int, elem_bytes: int = MASTER_BYTES,
                         intra_op_parallelism: int = 1) -> int:
    """Host bytes of memascend's optimizer pool: buffer_count exact, page-aligned buffers of the largest sub-group
    (io-aligned like optimizer_utils.py OptimizerSwapper.largest_numel)."""
    io_numel = AIO_ALIGNED_BYTES * max(1, intra_op_parallelism) // elem_bytes
    numel = align_up(largest_sub_group_numel, io_numel)
    return buffer_count * align_up(numel * elem_bytes, PAGE_BYTES)
