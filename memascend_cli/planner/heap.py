"""Stock DeepSpeed's glibc heap on a CPU rank: blocks below the mmap threshold stay in the allocator after free, so
zero.Init, the backward and the checkpointed layers leave memory the optimizer step comes on top of. Pure."""

from __future__ import annotations

from memascend_cli.models import ModelSpec, layer_template
from memascend_cli.planner.compute import activation_bytes, activation_parts, flush_copies, loss_backward_blocks
from memascend_cli.planner.context import Context
from memascend_cli.units import MiB

# glibc's largest mmap threshold on 64-bit (malloc/malloc.c DEFAULT_MMAP_THRESHOLD_MAX = 4 MiB x sizeof(long)):
# blocks at least this large are mmapped and returned at free; smaller ones stay in the allocator's arenas.
GLIBC_MMAP_THRESHOLD_MAX_BYTES = 32 * MiB
# Heap glibc keeps per checkpointed layer after stock's first forward + backward on a CPU rank, in units of the
# layer's stranded activation block (activation_heap_block): "retained" from the forward's start to the optimizer
# step beyond the step's own blocks (host/step_heap), "forward" the part grown during the forward (the checkpointed
# inputs stay live above the freed blocks). Fitted by scripts/fit_planner.py on mallinfo2 at phase starts of the
# calibration runs of today's tuned config (docs/bench/calibration/tuned-heap-*-steps4-fp32.json.gz): intermediate-wide
# blocks at seq 2048, hidden-wide ones, once the intermediate blocks are mmapped, at seq 3584.
ACTIVATION_HEAP_BLOCKS_PER_LAYER = {"intermediate": {"retained": 4.2, "forward": 1.6},
                                    "hidden": {"retained": 9.2, "forward": 6.5}}
# Share of the fp32 bytes of the optimizer sub-groups below the mmap threshold that glibc keeps free after
# deepspeed.initialize on a CPU rank: each such sub-group passes through an unpinned fp32 buffer on its way to NVMe
# (stage3.py _create_fp32_partitions, offload_optimizer.fast_init off), freed between small allocations. Fitted by
# scripts/fit_planner.py on mallinfo2 between the initialize and step-1 forward marks of the calibration runs.
OPTIMIZER_INIT_HEAP_FRACTION = 0.43
# The same share for the first step's heap growth on a CPU rank when no activation block strands (blocks of 32 MiB
# and more are mmapped): each bucket's gradients are converted to fp32 for swap-out (stage3.py partition_grads,
# grad_buffer.to(fp32)) in blocks of the sub-groups' sizes. Fitted by scripts/fit_planner.py on mallinfo2 between the
# step-1 forward and optimizer marks of the calibration runs without a stranded activation block.
STEP_HEAP_FRACTION = 0.16
# Heap glibc keeps after a 16-bit backward on a CPU rank beyond the other kept items, per fp32 byte of the parameter
# partitions below the mmap threshold: each gradient partition is converted to an fp32 copy for swap-out
# (runtime/zero/stage3.py _offload_grad_partition_at_boundary, line 1453: grad_buffer.to(fp32); in fp32 training the
# call returns the tensor itself), blocks twice the size of the 16-bit ones around them that are freed after the
# bucket's swap-out and left between them. Fitted by conversion_heap_fit (benchmarks/step_memory_trace.py) on the
# calibration traces docs/bench/user-script/trace/*-bf16-*.json.gz: mallinfo2's free-kept heap at the optimizer
# step's entries, the most over the traced steps, less the plan's kept heap items.
GRAD_CONVERSION_HEAP_FRACTION = 0.99


def arena_bytes(nbytes: int) -> int:
    """`nbytes` if one block of that size comes from glibc's arenas (kept after free), else 0 (mmapped)."""
    return nbytes if nbytes < GLIBC_MMAP_THRESHOLD_MAX_BYTES else 0


def backward_heap_bytes(c: Context, bucket: int, part_bucket: int) -> int:
    """The CPU backward's high-water mark of arena (non-mmapped) blocks: what the allocator keeps afterwards.
    Same moments as the forward/backward item (loss backward, bucket flush), block by block."""
    job, m, E = c.job, c.m, c.E
    layer_tensors = layer_template(m)[1]
    layer = m.layer_numel()
    layer_heap = sum(arena_bytes(t.numel * E) for t in layer_tensors)
    vocab = m.vocab_size * m.hidden_size
    prefetch = min(c.k.prefetch_bucket_size, layer)
    # gathered params (see compute_items live_params), by block; in a layer's backward their grads too
    live_heap = (arena_bytes(vocab * E) if vocab > layer else layer_heap) + layer_heap * prefetch // max(1, layer)
    gathered = 2 * live_heap
    bs = job.micro_batch * job.seq_len
    loss = max(sum(arena_bytes(b) for b in moment) for moment in loss_backward_blocks(c))
    act, _ = activation_bytes(c)
    widest = bs * max(m.hidden_size, m.intermediate_size) * E  # the largest activation block of a layer
    act_heap = act if widest < GLIBC_MMAP_THRESHOLD_MAX_BYTES else 0
    flush = gathered + act_heap + flush_copies(c) * arena_bytes(E * bucket)
    # the fp32 copies for swap-out are one block per parameter partition (stock's path: no bounded engine here)
    copies = part_bucket * small_partition_fp32_bytes(c) // max(1, c.part.ns)
    return copies + max(live_heap + loss, flush)


def small_partition_fp32_bytes(c: Context) -> int:
    """fp32 bytes of the parameter partitions whose fp32 copy is a heap block (below glibc's mmap threshold). Pure."""
    return 4 * sum(n * k for n, k in c.part.partitions_below(-(-GLIBC_MMAP_THRESHOLD_MAX_BYTES // 4)))


def grad_conversion_heap_bytes(c: Context) -> int:
    """Heap a 16-bit job's fp32 gradient copies for swap-out leave free but kept on a CPU rank
    (GRAD_CONVERSION_HEAP_FRACTION of the partitions' fp32 bytes below the mmap threshold); none in fp32, where the
    gradients are not converted. Pure."""
    return int(GRAD_CONVERSION_HEAP_FRACTION * small_partition_fp32_bytes(c)) if c.E < 4 else 0


def mapped_backward_bytes(c: Context) -> int:
    """The CPU backward's blocks of GLIBC_MMAP_THRESHOLD_MAX_BYTES or more at its highest moment: glibc maps them
    afresh every step, so from the second step on they come on top of the heap the first step left kept (the
    arena blocks reuse it). Moments as backward_heap_bytes: the loss backward beside the model's top, or one
    recomputed layer's activations."""
    job, m, E = c.job, c.m, c.E
    tokens = job.micro_batch * job.seq_len
    loss = max(sum(b for b in moment if not arena_bytes(b)) for moment in loss_backward_blocks(c))
    hidden_block = tokens * m.hidden_size
    top = 0 if arena_bytes(4 * hidden_block) else hidden_block * (4 + 2 * E)  # compute.model_top_bytes' blocks
    _, again, _ = activation_parts(c)
    # activation_parts' one recomputed layer, split by width: with full recomputation its SwiGLU blocks are
    # intermediate-wide (8sbI in 16-bit units), the rest hidden-wide.
    inter = 8 * tokens * m.intermediate_size * E // 2 if job.checkpointing in ("full", "offload") else 0
    layer = ((inter if not arena_bytes(tokens * m.intermediate_size * E) else 0)
             + (again - inter if not arena_bytes(hidden_block * E) else 0))
    return max(loss + top, layer)


def zero_init_heap_bytes(m: ModelSpec) -> int:
    """Heap stock DeepSpeed's zero.Init and the weights pass after it leave free but kept (glibc mallinfo2 fordblks)
    on a CPU rank. Pure.

    Each parameter is built full-size in fp32 on the host, partitioned and swapped out (partition_parameters.py
    Init._post_init_method). The first freed mmapped weight raises glibc's mmap threshold to its size, so the
    later ones come from the heap, and the small allocations made between them split every freed block. Then the
    weights are written once more, one module's parameters gathered at a time (transformers' initialize_weights_zero3
    after _from_config, _load_state_dict_into_zero3_model for a checkpoint, the bench's init_weights_under_zero3):
    afterwards the heap keeps about every fp32 weight of a layer per layer (benchmarks/zero_init_heap.py,
    docs/bench/micro/zero-init-heap-weights-pass.json: 0.52-0.57 GiB at 8 bench-llama layers, 0.82-0.85 at 16,
    1.46-1.49 at 32, whose layers' weights take 48 MiB each; zero.Init alone kept the three MLP matrices, 32.5 MiB;
    within 0.2 GiB for the eight recorded shapes). Weights of 32 MiB or more stay mmapped."""
    layer = layer_template(m)[1]
    return m.num_hidden_layers * sum(arena_bytes(4 * t.numel) for t in layer)


def small_sub_group_fp32_bytes(c: Context) -> int:
    """fp32 bytes of the optimizer sub-groups whose master copy is a heap block (below glibc's mmap threshold). Pure."""
    return sum(4 * n * k for n, k in c.part.group_counts.items() if arena_bytes(4 * n))


def optimizer_init_heap_bytes(c: Context) -> int:
    """Heap deepspeed.initialize leaves free but kept on a CPU rank: OPTIMIZER_INIT_HEAP_FRACTION of the sub-groups'
    fp32 buffers below the mmap threshold. With fast_init the sub-groups are converted in the swapper's pinned
    buffers instead; with DeepSpeed's default sub_group_size (1e9) the buffer is mmapped and nothing stays. Pure."""
    if c.k.fast_init:
        return 0
    return int(OPTIMIZER_INIT_HEAP_FRACTION * small_sub_group_fp32_bytes(c))


def step_heap_bytes(c: Context) -> int:
    """Heap the first step's fp32 gradient blocks leave free but kept on a CPU rank (STEP_HEAP_FRACTION of the
    sub-groups' fp32 bytes below the mmap threshold); the stranded activation blocks (ACTIVATION_HEAP_BLOCKS_PER_LAYER)
    come on top. Pure."""
    return int(STEP_HEAP_FRACTION * small_sub_group_fp32_bytes(c))


def largest_layer_numel(m: ModelSpec) -> int:
    return max(t.numel for t in layer_template(m)[1])


def activation_heap_block(m: ModelSpec, tokens: int, elem_bytes: int) -> tuple[str, int] | None:
    """(width, bytes) of the activation block stock's CPU forward/backward strands in the heap, or None. Pure.

    Each checkpointed layer's recomputation frees its blocks while the next layer's input stays live above them;
    blocks larger than the holes zero.Init left (the layer's largest fp32 weight) cannot reuse them and the heap
    grows; blocks of 32 MiB or more are mmapped and go back at free. The widest block below the threshold strands:
    tokens x intermediate, or tokens x hidden once the intermediate blocks are mmapped (mallinfo2 in
    docs/bench/calibration/tuned-heap-*.json.gz). At seq 256-512 the blocks fit the holes and nothing grows."""
    hole = arena_bytes(4 * largest_layer_numel(m))
    widths = sorted((("intermediate", m.intermediate_size), ("hidden", m.hidden_size)), key=lambda w: -w[1])
    for width, size in widths:
        block = tokens * size * elem_bytes
        if block < GLIBC_MMAP_THRESHOLD_MAX_BYTES:
            return (width, block) if block > hole else None
    return None


# memascend's heap kept between layers on a CPU rank (EngineOptions.layer_trims off: its dram row), in units of one
# layer's backward blocks (layer_backward_heap_bytes). Nothing is trimmed from the first layer's forward to the end of
# backward (engine/runtime.py:517-518, ds_internals/context.py keep_heap; the one trim is ds_internals/stage3.py:93-94,
# after backward), so every page a freed block below the 32 MiB mmap threshold touched stays resident until then:
# glibc's free() only merges a chunk with free neighbours (malloc/malloc.c _int_free), gives the main arena's top back
# only past M_TRIM_THRESHOLD (64 MiB here: ds_internals/allocator.py KEPT_HEAP_TRIM_THRESHOLD_BYTES; malloc.c systrim)
# and a thread's 64 MiB heaps likewise (malloc/arena.c heap_trim, HEAP_MAX_SIZE); the gradients' fp64 norm copies
# come from the norm worker's own arena (ds_internals/bounded_stage3.py _NormWorker). The layers repeat their shapes,
# so a layer's blocks reuse the last one's and the kept heap is not priced per layer: a first backward grows the
# arenas by 0.12-0.41 GiB at 4, 16 and 28 layers alike (mallinfo2 at the phase marks, docs/bench/placements/ and
# docs/bench/capped/, trims or not). Fitted by scripts/fit_planner.py (kept_heap_fit) on the quiet4 sweep's dram rows
# only (docs/bench/placements/bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-quiet4/, caps 2.7 / 3.25 / 4 GiB):
# mallinfo2's free-kept heap at the step-1 optimizer mark, the median; validated on the 06:55 sittings and those of
# 09:25 on another VM (tests/unit/test_kept_heap.py). One shape ran with the trims off: bench-llama-136m, 4 layers,
# seq 512, fp32.
KEPT_HEAP_LAYER_BLOCKS = 3.45


def layer_backward_heap_bytes(c: Context) -> int:
    """One layer's backward blocks below glibc's mmap threshold on a CPU rank: each weight's gradient in the gradient
    dtype and the fp64 copy its norm takes (at most c.norm_chunk elements a copy: DeepSpeed runtime/zero/stage3.py
    _constant_buffered_norm2, zero/utils.py get_norm_dtype). Pure."""
    return sum(arena_bytes(c.G * t.numel) + arena_bytes(8 * min(t.numel, c.norm_chunk))
               for t in layer_template(c.m)[1])


def kept_layer_heap_bytes(c: Context) -> int:
    """Heap memascend's CPU rank keeps resident to the end of backward when it trims nothing between layers
    (KEPT_HEAP_LAYER_BLOCKS x layer_backward_heap_bytes). Pure."""
    return int(KEPT_HEAP_LAYER_BLOCKS * layer_backward_heap_bytes(c))
