"""Host memory per rank: DeepSpeed's NVMe-offload buffers (or memascend's replacements), the runtime, the data and
the transients of each phase. Pure: stdlib only.

P1..P7 label the host buffers of stock DeepSpeed's NVMe offload (each item's `source` names its DeepSpeed 0.19.8 code):
P1 the parameter swap pool, P2 the partitioned swap buffer, P3 the parameters kept in DRAM (max_in_cpu), P4 the
optimizer swap pool, P5 the gradient flat buffer, P6 the partitions too small to swap, P7 the optimizer sub-groups
too small to swap.
"""

from __future__ import annotations

from memascend_cli.planner import measured, param_buffers, zero
from memascend_cli.planner.breakdown import Item
from memascend_cli.planner.compute import (
    activation_parts,
    compute_items,
    flush_copies,
    layer_backward_bytes,
    loss_backward_bytes,
    model_top_bytes,
)
from memascend_cli.planner.context import Context
from memascend_cli.planner.heap import (
    ACTIVATION_HEAP_BLOCKS_PER_LAYER,
    GLIBC_MMAP_THRESHOLD_MAX_BYTES,
    GRAD_CONVERSION_HEAP_FRACTION,
    OPTIMIZER_INIT_HEAP_FRACTION,
    STEP_HEAP_FRACTION,
    activation_heap_block,
    backward_heap_bytes,
    grad_conversion_heap_bytes,
    mapped_backward_bytes,
    optimizer_init_heap_bytes,
    small_partition_fp32_bytes,
    small_sub_group_fp32_bytes,
    step_heap_bytes,
    zero_init_heap_bytes,
)
from memascend_cli.planner.zero import PAGE_BYTES, align_up
from memascend_cli.units import GiB, MiB

# Host memory of a rank before any model data: python + torch + deepspeed (+ transformers), as the system sees it
# (MemTotal - MemAvailable; about a rank's RSS, RssFile included: RssAnon 0.27 + RssFile 0.09 GiB once torch and
# DeepSpeed are loaded, the phases of docs/bench/capacity/ probes). CPU-only value
# fitted by scripts/fit_planner.py on the calibration runs of a 6M-parameter model (docs/bench/calibration): what the
# stock and tuned runs measured beyond every other item (medians of 3 repeats), 0.381 and 0.353 GiB. The CUDA value
# adds the CUDA runtime, cuBLAS, NCCL and the kernels a first training step loads: fitted the same way on the GPU
# kit's bench runs (qwen2.5-0.5b bf16, one H200, torch 2.11 + CUDA 13.0, docs/bench/gpu/): memascend 1.77, stock
# 1.94, tuned 1.54 GiB beyond every other item; the median. A GPU kit's cuda_constants.json replaces it.
RUNTIME_CPU_BYTES = int(0.35 * GiB)
RUNTIME_CUDA_BYTES = int(1.77 * GiB)
# What the memascend engine itself adds per process (native core, its threads and io_uring rings, the region's
# extent map, huge-page rounding of its tensors): the memascend calibration run's residual beyond the runtime
# (scripts/fit_planner.py).
ENGINE_RUNTIME_BYTES = int(0.12 * GiB)
# A launcher process per node beside the ranks (it imports torch and waits): RssAnon after importing
# deepspeed.launcher.launch 162 MiB, torch.distributed.run 144 MiB (torch 2.13, DeepSpeed 0.19.8, CPU; re-measured by
# tests/integration/test_planner_assumptions.py). `memascend train` runs DeepSpeed's runner and launch.py (2), the
# bench torchrun for more than one rank (1).
LAUNCHER_PROCESS_BYTES = int(0.15 * GiB)
# What a Hugging Face trainer's imports add to a DeepSpeed script's (deepspeed, torch, transformers' model classes), as
# RSS, the file-backed pages of the libraries they map included (host/runtime counts both too; a script's ru_maxrss
# does): after `from transformers import Trainer, TrainingArguments` RssAnon 46.1 + RssFile 39.1 MiB more, and with
# TRL's SFTConfig / SFTTrainer and datasets 50.2 + 39.1 MiB (transformers 5.25, TRL 1.16, torch 2.13, CPU;
# re-measured by tests/integration/test_planner_assumptions.py).
TRAINER_IMPORT_BYTES = {"deepspeed": 0, "hf": 85 * MiB, "trl": 89 * MiB}



def launcher_item(processes: int) -> Item:
    """The launcher processes of one node (counted once per node, not per rank)."""
    return Item("host/launcher", f"launcher processes ({processes} per node)", "host",
                processes * LAUNCHER_PROCESS_BYTES, "node", "", 0, f"{processes} x measured constant (once per node)",
                "RssAnon of a process that imported deepspeed.launcher.launch / torch.distributed.run")


# Arrays a micro-batch of the training data is made of (input ids, labels, attention mask).
DATA_ARRAYS = 3


class _HostItems:
    """A rank's host items as they are listed, with torch's power-of-two pinning waste summed apart."""

    def __init__(self):
        self.items: list[Item] = []
        self.pow2_waste = 0

    def add(self, key, label, nbytes, *, pinned="", locked=0, kind="steady", formula="", source=""):
        self.items.append(Item(key, label, "host", int(nbytes), kind, pinned, int(locked), formula, source))

    def add_pinned(self, key, label, raw_bytes, pin, *, formula, source):
        resident, how, locked = pin
        if how == "torch-pow2":  # the rounding is shown as its own line
            self.add(key, label, raw_bytes, pinned=how, locked=locked, formula=formula, source=source)
            self.pow2_waste += resident - raw_bytes
        else:  # exact allocations: the item is what is resident (page rounding included)
            self.add(key, label, resident, pinned=how, locked=locked, formula=formula, source=source)


def host_items(c: Context) -> list[Item]:
    """Every host item of a rank: the runtime, the parameter and optimizer buffers (P1..P7 or the bounded engine's
    windows), the pinning waste, the activation checkpoints, the data and the heap, then each phase's transients."""
    h = _HostItems()
    _runtime_items(c, h)
    _parameter_items(c, h)
    _optimizer_items(c, h)
    if h.pow2_waste > 0:
        h.add("host/pinned_pow2_waste", "pinned memory power-of-two waste", h.pow2_waste, pinned="torch-pow2",
              formula="sum over torch-pinned buffers of 2^ceil(log2 S) - S",
              source="torch CachingHostAllocator (power-of-two size classes)")
    _checkpoint_items(c, h)
    zi_heap = _data_and_heap_items(c, h)
    h.items.extend(transient_items(c, zi_heap))
    h.items.extend(model_build_items(c, h.items))
    return h.items


def _runtime_items(c: Context, h: _HostItems) -> None:
    """The process: python, torch, DeepSpeed (and CUDA), a trainer's imports, the memascend engine's own."""
    calibration = "memascend bench calibration runs (scripts/fit_planner.py)"
    runtime, runtime_source = (measured.constant("host_runtime_bytes", RUNTIME_CUDA_BYTES, calibration) if c.gpu
                               else (RUNTIME_CPU_BYTES, calibration))
    h.add("host/runtime", "runtime (python, torch, deepspeed" + (", CUDA" if c.gpu else "") + ")", runtime,
          formula="measured constant per process", source=runtime_source)
    trainer_imports = TRAINER_IMPORT_BYTES[c.job.trainer]
    if trainer_imports:
        h.add("host/trainer_imports", f"the {c.job.trainer} trainer's imports", trainer_imports,
              formula="measured constant per process", source="RssAnon + RssFile of its imports beyond a DeepSpeed "
              "script's (tests/integration/test_planner_assumptions.py)")
    if c.memascend:
        h.add("host/engine_runtime", "memascend engine (native core, io_uring rings, region map)",
              ENGINE_RUNTIME_BYTES, formula="measured constant per process",
              source="memascend bench calibration runs (scripts/fit_planner.py): memascend's residual beyond the "
                     "runtime")


def _parameter_items(c: Context, h: _HostItems) -> None:
    """P1 (or memascend's size-class pools), P3, the bounded engine's windows, P2."""
    job, k, E, part = c.job, c.k, c.E, c.part
    largest_swappable = part.largest_partition_from(c.min_swap_numel)

    # P1: parameter swap pool.
    if not c.memascend:
        buffer_size = max(k.param_buffer_size, largest_swappable) if job.param_buffer_size_auto else k.param_buffer_size
        if largest_swappable > buffer_size:
            c.config_errors.append(
                f"offload_param.buffer_size {buffer_size:,} is below the largest parameter partition "
                f"{largest_swappable:,} (DeepSpeed: 'More elements ... than buffer size')")
        raw = k.param_buffer_count * align_up(buffer_size, c.a_p) * E
        h.add_pinned("host/param_swap_pool", "P1 parameter swap pool", raw, c.pin_swap_pool(raw),
                     formula=f"buffer_count {k.param_buffer_count} x A(buffer_size {buffer_size:,}, {c.a_p}) x {E} B",
                     source="runtime/swap_tensor/partitioned_param_swapper.py _configure_aio (lines 100-125)")
        _param_buffer_failure(c)
    else:
        raw, desc = adaptive_param_pool(c)
        h.add_pinned("host/param_swap_pool", "parameter pools (size classes)", raw, c.pin_swap_pool(raw),
                     formula=desc, source="memascend engine: adaptive buffer pool (MemAscend, arXiv 2505.23254)")

    # Partition elements per rank kept in DRAM: P3 (first max_in_cpu elements, stock DeepSpeed) or none.
    max_in_cpu = k.max_in_cpu
    in_cpu = min(max_in_cpu, c.ns)
    if in_cpu > 0:
        raw = in_cpu * E
        h.add_pinned("host/fp16_cpu_params", "P3 params kept in DRAM (max_in_cpu)", raw, c.pin_accel(raw, c.pin_memory),
                     formula=f"min(max_in_cpu {max_in_cpu:,}, Ns {c.ns:,}) x {E} B",
                     source="runtime/zero/stage3.py _create_param_groups_fp16_flat_cpu_memory (line 888)")

    if c.bounded:
        bounded_items(c, h.add_pinned)
    # P2: partitioned swap buffer, only when some sub-group stays on NVMe (params beyond max_in_cpu).
    if c.ns > max_in_cpu and not c.bounded:
        # reserve_partitioned_swap_space gets the FULL numels (param.ds_numel) of the largest sub-group.
        g = part.sub_group_numels.index(c.lsg)  # the first largest
        raw = sum(align_up(part.full_numels[i], c.a_p) for i in part.sub_group(g)) * E
        if c.memascend:  # partition numels (not full), io-aligned, one page-rounded buffer
            raw = align_up(sum(align_up(part.partition_numels[i], c.a_p) for i in part.sub_group(g)) * E, PAGE_BYTES)
        h.add_pinned("host/partitioned_swap_buffer", "P2 partitioned swap buffer", raw, c.pin_swap_pool(raw),
                     formula="sum A(numel, a) over the largest sub-group x E",
                     source="runtime/swap_tensor/partitioned_param_swapper.py reserve_partitioned_swap_space "
                            "(line 393)")


def _optimizer_items(c: Context, h: _HostItems) -> None:
    """P4, P5, P6, P7."""
    k, E, part = c.k, c.E, c.part
    # P4: optimizer swap pool, when some sub-group is large enough to swap.
    # Every chunk of the bounded engine lives on the SSD; DeepSpeed swaps sub-groups of at least min_aio_bytes.
    min_group_numel = 0 if c.bounded else -(-c.min_aio_bytes // c.M)
    need = zero.optimizer_buffer_count(pipeline_read=k.pipeline_read, pipeline_write=k.pipeline_write)
    if part.groups_from(min_group_numel) and not c.bounded:
        bc_o = k.optimizer_buffer_count
        if bc_o < need:
            c.config_errors.append(f"offload_optimizer.buffer_count {bc_o} < {need} needed for Adam with this "
                                   "pipelining (DeepSpeed: 'ran out of swap buffers')")
        raw = bc_o * align_up(c.lsg, c.a_o) * c.M
        if c.memascend:  # exact, page-rounded buffers (zero.memascend_knobs sets bc_o = need)
            raw = zero.optimizer_pool_bytes(c.lsg, buffer_count=bc_o, intra_op_parallelism=k.intra_op_parallelism)
        h.add_pinned("host/optimizer_swap_pool", "P4 optimizer swap pool", raw, c.pin_swap_pool(raw),
                     formula=f"buffer_count {bc_o} x A(largest sub-group {c.lsg:,}, {c.a_o}) x 4 B",
                     source="runtime/swap_tensor/optimizer_utils.py lines 185-187, utils.py SwapBufferManager "
                            "(line 180)")

    # P5: gradient flat buffer, full partition size, with any optimizer offload.
    if not c.bounded:
        raw = c.ns * c.G
        h.add_pinned("host/grad_flat_buffer", "P5 gradient flat buffer", raw, c.pin_accel(raw, c.pin_memory),
                     formula=f"Ns {c.ns:,} x {c.G} B (grad_accum_dtype)",
                     source="runtime/zero/stage3.py _setup_for_real_optimizer (lines 791-795)")

    # P6: partitions below min_aio_bytes never swap; each is pinned separately.
    small = part.partitions_below(c.min_swap_numel)  # (size, count)
    if small:
        raw = sum(n * E * count for n, count in small)
        if c.memascend:
            pin = (sum(align_up(n * E, PAGE_BYTES) * count for n, count in small), c.pin_exact(0)[1], 0)
        else:
            per = [(c.pin_accel(n * E, c.pin_memory), count) for n, count in small]
            pin = (sum(p[0] * count for p, count in per), per[0][0][1], sum(p[2] * count for p, count in per))
        n_small = sum(count for _, count in small)
        h.add_pinned("host/small_params", f"P6 small params ({n_small} partitions < {c.min_aio_bytes // MiB} MiB)",
                     raw, pin, formula="sum of partitions below min_aio_bytes x E",
                     source="runtime/zero/partition_parameters.py _partition_param (lines 1820-1823: only swappable "
                            "partitions go to NVMe)")

    # P7: sub-groups too small to swap keep fp32 master + m + v + fp32 grad in DRAM.
    n = sum(numel * count for numel, count in part.group_counts.items() if numel < min_group_numel)
    if n:
        h.add("host/small_optimizer_groups", "P7 non-swappable optimizer sub-groups", 16 * n,
              formula=f"{n:,} elements x 16 B (fp32 master, grad, exp_avg, exp_avg_sq)",
              source="runtime/zero/stage3.py _create_fp32_partitions (lines 1146-1160: non-swappable sub-groups "
                     "stay in DRAM)")


def _checkpoint_items(c: Context, h: _HostItems) -> None:
    """Activation checkpoints kept in host DRAM: memascend's window to the SSD, or one buffer per layer."""
    job, E = c.job, c.E
    # Activation checkpoints kept in host DRAM (offloaded gradient checkpointing), per rank.
    if c.ssd_checkpoints:
        layer = job.micro_batch * job.seq_len * c.m.hidden_size * E
        h.add("host/activation_checkpoints", "activation checkpoint window (to/from the SSD)",
              c.windows.checkpoint_bytes(layer, c.m.num_hidden_layers),
              pinned=c.pin_exact(0)[1],
              formula=f"({c.windows.checkpoint_slots} write slots + 1 read buffer) x b x s x h x {E} B",
              source="memascend_engine.bounded.CheckpointStash; SSDTrain (arXiv 2408.10013)")
    elif job.checkpointing == "offload" and c.gpu:
        m = c.m
        # One buffer per layer (memascend: page-rounded pinned buffers).
        per_layer = job.micro_batch * job.seq_len * m.hidden_size * E
        raw = m.num_hidden_layers * (align_up(per_layer, PAGE_BYTES) if c.memascend else per_layer)
        h.add("host/activation_checkpoints", "offloaded activation checkpoints", raw,
              pinned=c.pin_exact(raw)[1] if c.memascend else "",
              formula=f"b {job.micro_batch} x s {job.seq_len} x h {m.hidden_size} x L {m.num_hidden_layers} x {E} B",
              source="Korthikanti et al. 2205.05198 full recomputation 2sbh per layer (16-bit); MemAscend "
                     "(arXiv 2505.23254) offloaded checkpointing")


def _data_and_heap_items(c: Context, h: _HostItems) -> int:
    """The micro-batch, and the heap zero.Init and deepspeed.initialize leave behind; the zero.Init heap's bytes."""
    job = c.job
    # The data path (engine/data.py): tokens live in a memory-mapped cache whose pages each micro-batch
    # releases again, so what a rank holds is the micro-batch itself (input ids, labels, attention
    # mask as int64), independent of the dataset size.
    data_bytes = DATA_ARRAYS * 8 * job.micro_batch * job.seq_len
    h.add("host/data", "data: one micro-batch from the memory-mapped token cache", data_bytes,
          formula=f"{DATA_ARRAYS} int64 arrays x b {job.micro_batch} x s {job.seq_len} x 8 B",
          source="engine/data.py Split.batch (pages dropped with MADV_DONTNEED)")
    # The memascend engine fixes the mmap threshold (mallopt) before zero.Init, so it keeps nothing; on a GPU the
    # weights are built in device memory.
    zi_heap = zero_init_heap_bytes(c.m) if not c.memascend and not c.gpu and job.zero_init else 0
    if zi_heap:
        h.add("host/zero_init_heap", "zero.Init + weights pass: freed weights kept in the heap", zi_heap,
              formula=f"L {c.m.num_hidden_layers} x fp32 bytes of a layer's weights below "
                      f"{GLIBC_MMAP_THRESHOLD_MAX_BYTES // MiB} MiB each",
              source="glibc malloc/malloc.c dynamic mmap threshold; mallinfo2 after zero.Init and the weights pass "
                     "(benchmarks/zero_init_heap.py)")
    if not c.memascend and not c.gpu:  # the bounded engine builds masters in its pipeline slots
        opt_heap = optimizer_init_heap_bytes(c)
        if opt_heap:
            h.add("host/optimizer_init_heap", "deepspeed.initialize: freed fp32 sub-group buffers kept in the heap",
                  opt_heap, formula=f"{OPTIMIZER_INIT_HEAP_FRACTION} x fp32 bytes of the sub-groups below "
                                    f"{GLIBC_MMAP_THRESHOLD_MAX_BYTES // MiB} MiB {small_sub_group_fp32_bytes(c):,}",
                  source="runtime/zero/stage3.py _create_fp32_partitions (unpinned_fp32_buffer); mallinfo2 at the "
                         "initialize and step-1 marks, fitted by scripts/fit_planner.py")
    return zi_heap


def bounded_items(c: Context, add_pinned) -> None:
    """The bounded engine's steady windows (memascend_engine.bounded, optimizer_pipeline): what DRAM holds instead of
    P2, P4, P5."""
    w = c.windows
    raw = w.optimizer_bytes(c.E)
    add_pinned("host/optimizer_pipeline", f"optimizer pipeline ({w.optimizer_depth} chunks in flight)", raw,
               c.pin_exact(raw), formula=f"depth {w.optimizer_depth} x chunk {w.optimizer_chunk_numel:,} x "
               f"(4 fp32 tensors x 4 B + 2 x {c.E} B staging)",
               source="memascend_engine.optimizer_pipeline.OptimizerPipeline (MemAscend pipelined optimizer; LoHan)")
    raw = w.gradient_bytes()
    add_pinned("host/gradient_window", "gradient staging window (to the SSD)", raw, c.pin_exact(raw),
               formula=f"{w.gradient_slots} slots x {w.gradient_slot_bytes // MiB} MiB",
               source="memascend_engine.bounded.GradientStream (Lin et al.: gradients to the SSD at once, 16-bit)")
    if c.holds_gradients and w.accumulation_bytes:
        raw = min(w.accumulation_bytes, c.G * c.ns)
        add_pinned("host/gradient_accumulation", "gradients held in DRAM (accumulation; a redo)", raw,
                   (raw, "", 0), formula=f"min(window {w.accumulation_bytes / GiB:.2f} GiB, Ns {c.ns:,} x {c.G} B)",
                   source="memascend_engine.bounded.GradientStream.hold (LoHan, arXiv 2403.06504: accumulation in "
                          "DRAM)")


def adaptive_param_pool(c: Context) -> tuple[int, str]:
    """The engine's size-class pools (zero.param_pool_plan: slots = what the prefetch window holds at once)."""
    plan = zero.model_param_pool_plan(c.m, c.k, world_size=c.world, elem_bytes=c.E, prefetch_layers=c.prefetch_layers)
    return plan.total_bytes, "exact slots: " + plan.describe()


def transient_items(c: Context, zero_init_heap: int = 0) -> list[Item]:
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
            f"4 B x largest sub-group {c.lsg:,}", "runtime/zero/stage3.py initialize_optimizer_states (line 1305)",
            "init")

    # -- backward: per reduce bucket, partition_grads converts the gradients of swappable sub-groups to
    # fp32 host tensors (grad_buffer.to(fp32)) and swaps them out (both engines: DeepSpeed code).
    # A reduce bucket holds full gradients (all ranks' partitions); each rank converts its share of it.
    bucket = min(c.reduce_bucket_size, c.m.num_params)
    part_bucket = min(-(-c.reduce_bucket_size // c.world), c.ns)
    # Stock's CPU backward blocks below the mmap threshold: they first fill zero.Init's free heap, the rest is kept.
    backward_heap = backward_heap_bytes(c, bucket, part_bucket) if not c.memascend and not c.gpu else 0
    if not c.bounded and not c.gpu:
        # On a GPU these copies are made on the device (stage3.py 2025-2028 moves the partition there first) and
        # reach the host only through the P4 pool: a GPU item (compute_items), no host bytes.
        add("host/grad_fp32_copies", "backward: fp32 gradient copies for swap-out", 4 * part_bucket,
            f"4 B x min(reduce_bucket_size / world, Ns) = {part_bucket:,}",
            "stage3._offload_grad_partition_at_boundary (grad_buffer.to(fp32)); measured by memascend bench", "backward")
    copies_when_pinning = c.gpu or (c.k.pin_backend == "native" and c.ver >= (0, 19, 8))
    if not c.bounded and c.pin_memory and not c.memascend and copies_when_pinning:
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
    working_left = 0
    if not c.gpu:
        working_left = _cpu_working_set(c, zero_init_heap, backward_heap, bucket, add, out)

    # -- optimizer step.
    if not c.memascend and job.dtype == "fp16":
        add("host/overflow_check", "fp16 overflow check temporaries", 3 * c.ns,
            f"3 B x Ns {c.ns:,} (torch.isinf abs copy 2 B + bool 1 B)",
            "runtime/zero/stage3.py has_overflow(partition_gradients=True) (lines 3009-3018)", "optimizer")
    if not c.memascend:
        add("host/first_step_adam", "first optimizer step: Adam states created unpinned", 8 * c.lsg,
            f"8 B x largest sub-group {c.lsg:,}", "ops/adam/cpu_adam.py step_subgroup zeros_like (lines 202-203)",
            "optimizer")
        if not c.gpu:
            _cpu_retained(c, zero_init_heap, backward_heap, working_left, add)
    return out


# Bytes per element of a model built outside zero.Init: transformers builds fp32 unless torch_dtype is given
# (torch's default dtype; LlamaForCausalLM(config) takes none), whatever dtype DeepSpeed trains in.
EAGER_BUILD_ELEM_BYTES = 4


# Steady items already allocated while deepspeed.initialize partitions a model built whole: the process, and the
# parameter pool Init creates before it converts the module's parameters (partition_parameters.py lines 1172-1181:
# param_swapper, then _convert_to_zero_parameters). The optimizer's buffers, the gradient window, the reduce bucket
# and the data come after the model's parameters are freed.
BEFORE_PARTITIONING_KEYS = ("host/runtime", "host/trainer_imports", "host/engine_runtime", "host/param_swap_pool")


def model_build_items(c: Context, steady: list[Item]) -> list[Item]:
    """The whole model a script holds before deepspeed.initialize partitions it (job.model_init), as an "init" item:
    what it adds above the steady level at its highest moment, the model beside the items of
    BEFORE_PARTITIONING_KEYS; each parameter is freed as it is partitioned. None under zero.Init (each parameter is
    partitioned as it is built). Pure."""
    job, n = c.job, c.m.num_params
    if job.model_init == "zero":
        return []
    level = sum(i.bytes for i in steady if i.kind == "steady")
    before = sum(i.bytes for i in steady if i.kind == "steady" and i.key in BEFORE_PARTITIONING_KEYS)
    source = ("runtime/zero/parameter_offload.py _convert_to_zero_parameters (lines 258-279: a module not built "
              "under zero.Init is partitioned in deepspeed.initialize by Init(module=...)), partition_parameters.py "
              "_convert_to_zero_parameters (lines 1209-1215: one parameter at a time)")
    if job.model_init == "from-pretrained":
        # transformers 5 loads with dtype "auto" (the checkpoint's) from safetensors memory-mapped: the parameters are
        # views of the mapped file (core_model_loading.py _materialize_copy: no copy without a dtype or device
        # change), resident as partitioning reads them, and the mapping goes only with its last tensor. Measured:
        # from_pretrained itself adds 14 MiB of high-water mark (docs/bench/user-script/matrix.json.gz phases).
        model, what = c.E * n, f"{c.E} B x N {n:,} (the checkpoint, memory-mapped, saved in the job's dtype)"
        source += "; transformers modeling_utils from_pretrained (safe_open backend mmap, dtype auto)"
    else:
        model, what = EAGER_BUILD_ELEM_BYTES * n, (f"{EAGER_BUILD_ELEM_BYTES} B x N {n:,} (transformers builds fp32 "
                                                   "without torch_dtype)")
    label = "model loaded whole by from_pretrained" if job.model_init == "from-pretrained" else \
        "model built whole before initialize (eager, fp32)"
    return [Item("host/model_build", label, "host", max(0, before + model - level), "init",
                 formula=f"the process and parameter pool {before:,} + {what} - the steady level {level:,}",
                 source=source)]


def _cpu_working_set(c: Context, zero_init_heap: int, backward_heap: int, bucket: int, add, out: list[Item]) -> int:
    """A CPU-only rank's forward/backward working set (the compute items in host memory) into `out`; what of it is
    not placed in zero.Init's free heap."""
    job = c.job
    # CPU-only: the compute working set is host memory too. The reduce bucket and persistent params
    # stay allocated. Backward has two high moments that never overlap: the loss backward (logits and
    # their fp32 upcast still live, no layer recomputed yet) and a bucket flush inside a layer's backward
    # (that layer's recomputed activations plus reduce_scatter_coalesced's torch.cat of the bucket,
    # coalesced_collectives.py); the logits are freed before the first layer is recomputed.
    by_key = {i.key.rsplit("/", 1)[-1]: i for i in compute_items(c, tier="host")}
    for key in ("reduce_bucket", "persistent_params"):
        out.append(by_key.pop(key))
    params = by_key["live_params"].bytes
    gathered = params + by_key["live_param_grads"].bytes
    # No parameter has a gradient yet while the loss backward runs: only the gathered params count there, with
    # the activations forward left for backward (all of them without checkpointing, else the checkpoints):
    # autograd frees a layer's saved tensors only when its backward node runs (torch/csrc/autograd/engine.cpp).
    loss_bwd = loss_backward_bytes(c)
    top = model_top_bytes(c)
    kept = activation_parts(c)[0]
    # The gathered matrix there is the LM head; on one CPU rank DeepSpeed gathers nothing (partition_parameters.py
    # _no_gather_coalesced / NoGatherHandle: param.data = ds_tensor.data.to(cpu), the pool's own tensor).
    gathered_params = params if c.world > 1 else 0
    head = gathered_params + loss_bwd + top + kept
    copies = flush_copies(c)
    # A tied LM head / input embedding: autograd sums a leaf's gradients in its input buffer before the
    # AccumulateGrad node runs (torch/csrc/autograd/input_buffer.cpp), so the LM head's gradient waits there
    # through the whole backward and meets the embedding's dense gradient at its end (the matrix itself is in
    # the parameter pool).
    vocab = c.m.vocab_size * c.m.hidden_size
    head_grad = c.E * vocab if c.m.tie_word_embeddings else 0
    tied = 2 * head_grad
    if c.memascend and job.checkpointing in ("full", "offload"):
        # A bucket flush inside a recomputed layer's backward: that layer at its peak (layer_backward_bytes), the
        # gradient arriving from the layer above, its checkpointed input when the checkpoints are not kept in
        # memory (read back), and a tied LM head's waiting gradient. Stock and tuned keep the gathered-params
        # form below: their allocator retention (heap.py, host/allocator_retention) is fitted on it.
        tokens_h = job.micro_batch * job.seq_len * c.m.hidden_size * c.E
        layer_bwd = layer_backward_bytes(c) + tokens_h * (1 if kept else 2)
        flush = gathered_params + kept + layer_bwd + head_grad + copies * c.E * bucket
        flush_desc = (f"checkpoints kept {kept:,} + one recomputed layer's backward {layer_bwd:,}"
                      + (f" + the tied LM head's waiting gradient {head_grad:,}" if head_grad else ""))
    else:
        flush = gathered + by_key["activations"].bytes + copies * c.E * bucket
        flush_desc = f"gathered params + their grads {gathered:,} + activations {by_key['activations'].bytes:,}"
    # Each reduced gradient partition's norm is taken on an fp64 copy, c.norm_chunk elements at a time
    # (stage3.py _constant_buffered_norm2, from partition_grads): the largest partition (an embedding's, at the
    # end of backward) beside that copy and, in the bounded engine, its copy in the gradient dtype.
    largest = c.part.largest_partition_numel
    reduce_norm = largest * (c.E + (c.G if c.bounded and c.G != c.E else 0)) + 8 * min(c.norm_chunk, largest)
    working = max(head, flush, tied, reduce_norm)
    # Its blocks below the mmap threshold first fill the heap zero.Init left free (counted there already).
    reused = min(zero_init_heap, backward_heap, working)
    add("host/compute/forward_backward", "forward/backward working set", working - reused,
        f"max(gathered params {gathered_params:,} + loss backward {loss_bwd:,} (3 fp32 b*s*V, or b*s*V*E + "
        f"the lm_head gradient) + the last layer's output and final norm {top:,} + activations kept for "
        f"backward {kept:,}, {flush_desc} + {copies} bucket "
        f"copies {copies * c.E * bucket:,}"
        + (f", tied embedding at the end of backward: 2 gradients {tied:,}" if tied else "")
        + f", largest gradient partition + its fp64 norm copy ({c.norm_chunk:,} elements at a time) "
          f"{reduce_norm:,})"
        + (f" - heap blocks placed in zero.Init's free heap {reused:,}" if reused else ""),
        "Korthikanti et al. 2205.05198; DeepSpeed runtime/comm/coalesced_collectives.py reduce_scatter_coalesced "
        "(torch.cat) + torch ProcessGroupGloo reduce_scatter_tensor (input copy); runtime/zero/stage3.py "
        "_constant_buffered_norm2", "backward")
    return working - reused


def _cpu_retained(c: Context, zero_init_heap: int, backward_heap: int, working_left: int, add) -> None:
    """What stock's and tuned's glibc heap keeps on a CPU-only rank after backward and the first step, and later
    steps' backward above it."""
    job = c.job
    # glibc keeps the freed backward blocks below its mmap threshold in its arenas, so the optimizer step
    # comes on top; blocks of 32 MiB and more were mmapped and went back at free. The memascend engine
    # calls malloc_trim after backward.
    # Backward blocks first reuse what zero.Init left free in the heap (host/zero_init_heap).
    retained = max(0, backward_heap - zero_init_heap)
    add("host/allocator_retention", "backward memory kept by the allocator", retained,
        f"the backward items' blocks below glibc's mmap threshold ({GLIBC_MMAP_THRESHOLD_MAX_BYTES // MiB} MiB)"
        " less the zero.Init heap they reuse",
        "glibc malloc/malloc.c DEFAULT_MMAP_THRESHOLD_MAX; memascend bench phase peaks", "retained")
    step_heap = step_heap_bytes(c)
    if step_heap:
        add("host/step_heap", "first step: freed fp32 gradient blocks kept in the heap", step_heap,
            f"{STEP_HEAP_FRACTION} x fp32 bytes of the sub-groups below "
            f"{GLIBC_MMAP_THRESHOLD_MAX_BYTES // MiB} MiB {small_sub_group_fp32_bytes(c):,}",
            "runtime/zero/stage3.py partition_grads (grad_buffer.to(fp32)); mallinfo2 at the step-1 marks, "
            "fitted by scripts/fit_planner.py", "retained")
    conversion_heap = grad_conversion_heap_bytes(c)
    if conversion_heap:
        add("host/grad_conversion_heap", f"{job.dtype} backward: freed fp32 gradient copies kept in the heap",
            conversion_heap, f"{GRAD_CONVERSION_HEAP_FRACTION} x fp32 bytes of the parameter partitions below "
            f"{GLIBC_MMAP_THRESHOLD_MAX_BYTES // MiB} MiB {small_partition_fp32_bytes(c):,}",
            "runtime/zero/stage3.py _offload_grad_partition_at_boundary (grad_buffer.to(fp32), 16-bit only); "
            "mallinfo2 at the optimizer step's entries (benchmarks/step_memory_trace.py)", "retained")
    stranded = activation_heap_block(c.m, job.micro_batch * job.seq_len, c.E) \
        if job.checkpointing != "none" else None
    if stranded:
        width, block = stranded
        L = c.m.num_hidden_layers
        dim = "I" if width == "intermediate" else "h"
        for key, kind, part, label in (
                ("host/activation_heap_forward", "backward", "forward",
                 "checkpointed layers' blocks stranded in the heap during the forward"),
                ("host/activation_heap", "retained", "retained",
                 "checkpointed layers' blocks stranded in the heap")):
            k = ACTIVATION_HEAP_BLOCKS_PER_LAYER[width][part]
            add(key, label, int(k * block * L), f"{k} x L {L} x block s*b*{dim}*E {block:,}",
                "glibc heap growth, mallinfo2 at phase starts; fitted by scripts/fit_planner.py", kind)
    # Measured (docs/bench/calibration/tuned-heap-*-steps4: RSS at the phase starts, steps 2-4 peaks): once
    # blocks are mapped, the heap blocks made between them do not find the kept holes either and the whole
    # working set comes on top again (seq 8192: 2.0 GiB over the step-2 start, 1.6 mapped); without mapped
    # blocks the kept heap takes it.
    mapped = mapped_backward_bytes(c)
    add("host/mapped_backward", "later steps' backward above the kept heap",
        max(mapped, working_left) if mapped else 0,
        f"max(the backward's blocks of {GLIBC_MMAP_THRESHOLD_MAX_BYTES // MiB} MiB or more at its highest "
        f"moment (loss backward, or a recomputed layer) {mapped:,}, the first backward's working set)",
        "glibc malloc/malloc.c mmap threshold; memascend bench: steps 2-4's backward peaks", "later_backward")


def _param_buffer_failure(c: Context) -> None:
    """Stock's parameter swap buffers run out at step 2 when NVMe partitions are kept for reuse (param_buffers.py)."""
    k = c.k
    if k.max_reuse_distance <= 0 or c.ns <= k.max_in_cpu:
        return
    from memascend_cli.models import layer_template

    part = c.part
    swappable = tuple(map(c.min_swap_numel.__le__, part.partition_numels))
    nvme = param_buffers.nvme_resident(part.partition_numels, part.sub_groups, k.max_in_cpu, swappable)
    head, layer, tail = layer_template(c.m)
    last = max(i for i, t in enumerate(layer) if t.role not in ("norm", "bias"))
    order = param_buffers.trace(len(head), len(layer), c.m.num_hidden_layers, len(tail),
                                recompute=c.job.checkpointing != "none", last_module=last)
    found = param_buffers.failure(part.full_numels, nvme, order, buffer_count=k.param_buffer_count,
                                  persistent_below=k.param_persistence_threshold,
                                  max_reuse_distance=k.max_reuse_distance)
    if found:
        c.config_errors.append(found)
