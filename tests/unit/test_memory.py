"""The memory model: hand-checked items, version behaviour, monotonicity and memascend <= stock."""

from dataclasses import replace

import pytest

from memascend_cli.errors import BadInput
from memascend_cli.models import list_model_presets, load_preset
from memascend_cli.planner import heap, memory, zero
from memascend_cli.planner.memory import JobSpec, estimate, estimate_all, partition
from memascend_cli.planner.search import check, max_micro_batch, max_seq_len, search
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.units import GiB

GPU = HardwareSpec(name="gpu", dram_gib=128, num_gpus=1, gpu_mem_gib=24, nvme_free_gib=2000)
CPU = HardwareSpec(name="cpu", dram_gib=24)


def job(model="llama-3.1-8b", **kw):
    return JobSpec(model=load_preset(model), **kw)


def test_default_8b_items_match_hand_arithmetic():
    # Llama-3.1-8B, bf16, dp 1, DeepSpeed's defaults with buffer_size raised to the largest partition (the
    # 525,336,576-element embedding) as DeepSpeed requires; 0.19.3 pins everything through torch (pow2).
    est = estimate(job(deepspeed_version="0.19.3"), GPU, "stock")
    e = est.item
    assert e("host/param_swap_pool").bytes == 5 * 525_336_576 * 2  # A(525336576, 512) is exact
    assert e("host/fp16_cpu_params").bytes == 10**9 * 2
    assert e("host/grad_flat_buffer").bytes == 8_030_261_248 * 2
    assert e("host/param_swap_pool").pinned == "torch-pow2"
    # pow2 waste of the grad buffer alone: 14.96 -> 16 GiB
    assert est.pinned_waste_bytes >= (2**34 - 8_030_261_248 * 2)


def test_version_changes_pinning():
    old = estimate(job(deepspeed_version="0.19.3"), GPU, "stock")
    new = estimate(job(deepspeed_version="0.19.8"), GPU, "stock")
    assert old.item("host/optimizer_swap_pool").pinned == "torch-pow2"
    assert new.item("host/optimizer_swap_pool").pinned == "mlock"
    assert new.locked_bytes > 0 and old.locked_bytes == 0
    assert old.pinned_waste_bytes > new.pinned_waste_bytes
    native = estimate(replace(job(), knobs=replace(zero.DEEPSPEED_DEFAULTS, pin_backend="native")), GPU, "stock")
    assert native.pinned_waste_bytes == 0


def test_fp16_overflow_check_only_for_fp16_stock():
    b16 = estimate(job(dtype="bf16"), GPU, "stock")
    f16 = estimate(job(dtype="fp16"), GPU, "stock")
    assert b16.item("host/overflow_check") is None
    assert f16.item("host/overflow_check").bytes == 3 * 8_030_261_248
    assert estimate(job(dtype="fp16"), GPU, "memascend").item("host/overflow_check") is None


def test_small_buffer_size_is_a_config_error():
    est = estimate(replace(job(), param_buffer_size_auto=False), GPU, "stock")
    assert est.config_errors and "buffer_size" in est.config_errors[0]
    assert not check(est, GPU).fits and check(est, GPU).binding == "config"


def test_sub_groups_close_at_size():
    spec = load_preset("tiny-llama")
    p = partition(spec, 1, 10**6)
    assert all(p.sub_group_numel(g) >= 10**6 for g in range(len(p.sub_groups) - 1))
    assert sum(p.sub_group_numels) == spec.num_params
    two = partition(spec, 2, 10**9)
    assert two.ns == sum(-(-t.numel // 2) for t in spec.tensors())


def test_cpu_only_job_puts_compute_on_host():
    est = estimate(job("qwen2.5-0.5b"), CPU, "stock")
    assert est.compute_on_host and est.gpu_peak_bytes == 0
    assert est.item("host/compute/forward_backward").bytes > 0
    assert est.item("host/runtime").bytes < estimate(job("qwen2.5-0.5b"), GPU, "stock").item("host/runtime").bytes


def test_activation_checkpoints_in_dram_scale_with_tokens_and_layers():
    a = estimate(job(seq_len=4096, checkpoint_offload="dram"), GPU, "memascend").item("host/activation_checkpoints")
    b = estimate(job(seq_len=8192, micro_batch=2, checkpoint_offload="dram"), GPU, "memascend").item(
        "host/activation_checkpoints")
    assert a.bytes == 4096 * 4096 * 32 * 2 and b.bytes == 4 * a.bytes  # b*s*h*L*2 B


def test_activation_checkpoints_on_the_ssd_hold_a_window_not_the_layers():
    w = estimate(job(seq_len=4096), GPU, "memascend").item("host/activation_checkpoints").bytes
    assert w == 3 * 4096 * 4096 * 2  # (2 write slots + 1 read buffer) x b*s*h*2 B, whatever the depth
    deep = replace(job(seq_len=4096).model, num_hidden_layers=64)
    assert estimate(replace(job(seq_len=4096), model=deep), GPU, "memascend").item(
        "host/activation_checkpoints").bytes == w


def test_bounded_engine_holds_windows_not_model_sized_buffers():
    est = estimate(job(), GPU, "memascend")
    for key in ("host/grad_flat_buffer", "host/optimizer_swap_pool", "host/partitioned_swap_buffer",
                "host/init_buffers", "host/grad_fp32_copies"):
        assert est.item(key) is None, key
    assert est.item("host/optimizer_pipeline").bytes == 3 * (4 * 4 + 2) * 2_097_152
    assert est.item("host/gradient_window").bytes == 4 * 8 * 2**20
    off = estimate(job(streaming=False), GPU, "memascend")
    assert off.item("host/grad_flat_buffer") is not None and off.item("host/optimizer_pipeline") is None


def test_bf16_moments_read_ahead_two_chunks_more_and_a_budget_gives_them_up_first():
    slot = (4 * 4 + 2) * 2_097_152
    deep = estimate(job(optimizer_moments="bf16"), GPU, "memascend")
    assert deep.item("host/optimizer_pipeline").bytes == zero.BF16_MOMENTS_PIPELINE_DEPTH * slot
    assert deep.budget.windows.optimizer_depth == zero.BF16_MOMENTS_PIPELINE_DEPTH > zero.DEFAULT_PIPELINE_DEPTH
    as_ran = estimate(job(optimizer_moments="bf16", optimizer_depth=3), GPU, "memascend")  # a run recorded so
    assert as_ran.item("host/optimizer_pipeline").bytes == 3 * slot
    # A budget just short of the deep windows keeps every other window and depth 3 (not 2).
    short = deep.budget.total_bytes - 1
    cut = estimate(job(optimizer_moments="bf16", host_budget_bytes=short), GPU, "memascend").budget
    assert cut.windows.optimizer_depth == zero.DEFAULT_PIPELINE_DEPTH
    assert cut.optimizer_bytes == 3 * slot and cut.param_pool_bytes == deep.budget.param_pool_bytes
    assert (cut.gradient_bytes, cut.checkpoint_bytes) == (deep.budget.gradient_bytes, deep.budget.checkpoint_bytes)


def test_memlock_binds_stock_deepspeed_not_memascend():
    hw = replace(GPU, memlock_limit_gib=8 / 1024, can_lock_unlimited=False)
    ests = estimate_all(job(), hw)
    v = check(ests["stock"], hw)
    assert not v.fits and any("RLIMIT_MEMLOCK" in r for r in v.reasons)
    assert check(ests["memascend"], hw).fits


def test_bad_job_inputs():
    with pytest.raises(BadInput):
        job(dtype="fp8")
    with pytest.raises(BadInput):
        job(seq_len=0)
    with pytest.raises(BadInput):
        job(checkpointing="sometimes")
    with pytest.raises(BadInput):
        estimate(job(ranks_per_node=4), GPU, "stock")  # 4 ranks on a 1-GPU node


MACHINES = [GPU, CPU, HardwareSpec(name="8gpu", dram_gib=512, num_gpus=8, gpu_mem_gib=80),
            HardwareSpec(name="2node", dram_gib=256, num_gpus=4, gpu_mem_gib=24, num_nodes=2)]


@pytest.mark.parametrize("hw", MACHINES, ids=lambda h: h.name)
@pytest.mark.parametrize("model", list_model_presets())
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_memascend_never_needs_more_host_memory(hw, model, dtype):
    for version in ("0.19.3", "0.19.8"):
        ests = estimate_all(job(model, dtype=dtype, deepspeed_version=version), hw)
        assert ests["memascend"].host_peak_bytes <= ests["stock"].host_peak_bytes
        assert ests["memascend"].host_steady_bytes <= ests["stock"].host_steady_bytes


@pytest.mark.parametrize("engine", ["stock", "memascend"])
@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "llama-3.1-8b"])
def test_more_dram_never_lowers_a_maximum(engine, model):
    j = job(model, seq_len=1024)
    prev = None
    for dram in (16, 24, 32, 48, 64, 96, 128, 256, 512):
        hw = replace(GPU, dram_gib=dram, gpu_mem_gib=80)
        cur = (max_micro_batch(j, hw, engine)[0] or 0, max_seq_len(j, hw, engine)[0] or 0)
        if prev:
            assert cur[0] >= prev[0] and cur[1] >= prev[1]
        prev = cur


def test_memascend_fits_more_on_the_same_machine():
    # 80 GiB of GPU memory so host DRAM, not the GPU, is what binds.
    hw = replace(GPU, dram_gib=64, gpu_mem_gib=80)
    j = job("llama-3.1-8b", seq_len=4096)
    b, m = search(j, hw, "stock"), search(j, hw, "memascend")
    assert (m.max_seq_len or 0) > (b.max_seq_len or 0)
    assert (m.max_micro_batch or 0) >= (b.max_micro_batch or 0)


def test_host_peak_grows_with_batch_and_context():
    peaks = [estimate(job(seq_len=s, micro_batch=b), GPU, e).host_peak_bytes
             for e in ("stock", "memascend") for s, b in ((1024, 1), (2048, 1), (2048, 2))]
    assert peaks[0] <= peaks[1] <= peaks[2] and peaks[3] <= peaks[4] <= peaks[5]
    assert all(p < 200 * GiB for p in peaks)


def test_launchers_count_once_per_node():
    one = estimate(job("qwen2.5-0.5b", ranks_per_node=2), CPU, "memascend")
    none = estimate(job("qwen2.5-0.5b", ranks_per_node=2, launcher_processes=0), CPU, "memascend")
    item = one.item("host/launcher")
    assert item.kind == "node" and item.bytes == 2 * memory.LAUNCHER_PROCESS_BYTES  # train: runner + launch.py
    assert none.item("host/launcher") is None
    assert one.host_peak_bytes == none.host_peak_bytes  # not a per-rank item
    assert one.node_host_peak_bytes == none.node_host_peak_bytes + item.bytes


def test_cpu_bucket_flush_holds_two_copies_of_the_bucket():
    """torch.cat of the bucket plus gloo's copy of its input (tests/integration/test_planner_assumptions.py)."""
    small = replace(zero.DEEPSPEED_DEFAULTS, reduce_bucket_size=3 * 10**7)
    big = replace(zero.DEEPSPEED_DEFAULTS, reduce_bucket_size=5 * 10**7)
    # seq 16: the flush, not the loss backward nor the embedding's norm copy, is the larger moment (an untied model:
    # no tied-embedding moment)
    # zero_init off: the zero.Init heap the backward reuses is tested on its own below
    fb = [estimate(job("bench-llama-136m", seq_len=16, dtype="fp32", checkpointing="full", knobs=k, zero_init=False),
                   CPU, "stock")
          .item("host/compute/forward_backward").bytes for k in (small, big)]
    assert fb[1] - fb[0] == 2 * 4 * 2 * 10**7


def test_the_largest_gradient_partition_meets_its_fp64_norm_copy_at_the_end_of_backward():
    """DeepSpeed takes each reduced gradient partition's norm on an fp64 copy of up to 250M elements
    (stage3.py _constant_buffered_norm2): for an embedding that is the end of a CPU rank's backward
    (docs/bench/capped/qwen2.5-1.5b-...-memascend.json.gz peaks there). The bounded engine converts 2^24 at a time."""
    from memascend_cli.defaults import DS_NORM_BUFFER_NUMEL, NORM_CHUNK_NUMEL

    m = load_preset("qwen2.5-0.5b")
    V_h = m.vocab_size * m.hidden_size
    assert NORM_CHUNK_NUMEL < V_h < DS_NORM_BUFFER_NUMEL
    for dtype, E in (("fp32", 4), ("bf16", 2)):
        def moment(**kw):
            return estimate(job("qwen2.5-0.5b", seq_len=16, dtype=dtype, checkpointing="full", zero_init=False, **kw),
                            CPU, "memascend").item("host/compute/forward_backward").bytes

        assert moment(bounded_norm=False) == V_h * (E + 8), dtype  # the larger moment at seq 16
        # 2^24 elements of fp64 instead: another moment (the tied embedding's two gradients, the LM head's waiting in
        # autograd's input buffer for the embedding's; a layer's gathered params and gradients) binds
        assert max(2 * E * V_h, V_h * E + 8 * NORM_CHUNK_NUMEL) <= moment() < V_h * (E + 8), dtype


def test_tied_embedding_holds_two_gradients_at_the_end_of_backward():
    m = load_preset("qwen2.5-0.5b")
    assert m.tie_word_embeddings
    two = f"2 gradients {2 * 4 * m.vocab_size * m.hidden_size:,}"
    tied = estimate(job("qwen2.5-0.5b", seq_len=16, dtype="fp32", zero_init=False), CPU, "memascend")
    assert two in tied.item("host/compute/forward_backward").formula
    untied = estimate(JobSpec(model=replace(m, tie_word_embeddings=False), seq_len=16, dtype="fp32",
                              zero_init=False), CPU, "memascend")
    assert "2 gradients" not in untied.item("host/compute/forward_backward").formula


def test_loss_backward_counts_gathered_params_but_no_gradients():
    """Autograd runs cross_entropy's backward before any module's: no parameter has a gradient yet, so the loss
    moment is the gathered params + fp32 logits + fp32 log-softmax + its fp32 gradient; at lm_head's backward the
    logits and the log-softmax have gone and the lm_head weight gradient has come (docs/bench/micro/loss-backward-*).
    On one rank nothing is gathered: DeepSpeed's NoGatherHandle makes the parameter the partition's own tensor."""
    s, V, h = 2048, 16384, 1024
    k = replace(zero.DEEPSPEED_DEFAULTS, prefetch_bucket_size=10**6)
    params = (V * h + 10**6) * 4  # the lm_head matrix (larger than a layer) + the prefetch bucket
    ce, lm_head = s * V * (4 + 8), s * V * 4 + V * h * 4
    assert ce > lm_head  # s > h: the cross-entropy moment is the larger
    top = s * h * 12  # the last layer's output, the final norm's product and output (fp32: docs/bench/micro/head-*)
    for ranks, gathered in ((1, 0), (2, params)):
        est = estimate(job("bench-llama-136m", seq_len=s, dtype="fp32", checkpointing="offload", knobs=k,
                           ranks_per_node=ranks), CPU, "memascend")
        assert est.item("host/compute/forward_backward").bytes == gathered + ce + top
    # at seq 256 the lm_head moment is the larger (its weight gradient is V*h*E, more than b*s*V*4)
    short = estimate(job("bench-llama-136m", seq_len=256, dtype="fp32", checkpointing="offload", knobs=k,
                         ranks_per_node=2), CPU, "memascend")
    assert short.item("host/compute/forward_backward").bytes >= params + 256 * V * 4 + V * h * 4


def test_allocator_keeps_only_blocks_below_the_mmap_threshold():
    """glibc returns blocks >= 32 MiB at free: a vocab-sized logits tensor is not retained, small layer blocks are."""
    k = replace(zero.DEEPSPEED_DEFAULTS, reduce_bucket_size=10**6)
    tiny = estimate(job("tiny-llama", seq_len=256, dtype="fp32", checkpointing="full", knobs=k), CPU, "stock")
    assert tiny.item("host/allocator_retention").bytes == (tiny.item("host/grad_fp32_copies").bytes
                                                           + tiny.item("host/compute/forward_backward").bytes)
    big = estimate(job("qwen2.5-0.5b", seq_len=4096, dtype="fp32", checkpointing="full", knobs=k), CPU, "stock")
    logits = 4096 * 151_936 * 4
    assert logits >= memory.GLIBC_MMAP_THRESHOLD_MAX_BYTES
    assert big.item("host/allocator_retention").bytes < big.item("host/compute/forward_backward").bytes - logits


def test_stock_zero_init_and_the_weights_pass_leave_each_layers_weights_in_the_heap():
    """docs/bench/micro/zero-init-heap-weights-pass.json: after zero.Init and the weights pass, 0.52-0.57 GiB kept at 8
    bench-llama layers, 0.82-0.85 at 16, 1.46-1.49 at 32: about every fp32 weight of a layer per layer (48 MiB)."""
    j = job("bench-llama-136m", seq_len=256, dtype="fp32", checkpointing="full")
    base = estimate(j, CPU, "stock")
    layer_numel = 4 * 1024 * 1024 + 3 * 1024 * 2816 + 2 * 1024
    assert base.item("host/zero_init_heap").bytes == 8 * layer_numel * 4
    assert base.item("host/zero_init_heap").kind == "steady"
    # memascend fixes the mmap threshold before zero.Init; on a GPU the weights are built in device memory
    assert "host/zero_init_heap" not in {i.key for i in estimate(j, CPU, "memascend").items}
    assert "host/zero_init_heap" not in {i.key for i in estimate(j, GPU, "stock").items}
    # llama-3.1-8b: q/o (64 MiB) and the MLP matrices (224 MiB) are mmapped and returned at free, k/v (16 MiB) kept
    assert memory.zero_init_heap_bytes(load_preset("llama-3.1-8b")) == 32 * (2 * 4096 * 1024 + 2 * 4096) * 4


def test_stock_on_a_cpu_is_told_its_heap_varies():
    """The heap glibc keeps is not the same from run to run of one job: the plan says so where it models that heap."""
    j = job("bench-llama-136m", seq_len=256, dtype="fp32", checkpointing="full")

    def told(est):
        return any("glibc keeps varies" in n for n in est.notes)

    assert told(estimate(j, CPU, "stock")) and told(estimate(j, CPU, "tuned"))
    assert not told(estimate(j, CPU, "memascend")) and not told(estimate(j, GPU, "stock"))


def test_stock_on_a_cpu_is_told_where_hidden_wide_blocks_strand():
    """Where each layer's hidden-wide activation blocks strand in glibc's heap (bench-llama-136m: 12 MiB at seq 3072,
    above its 11 MiB weights), the plan says it under-counts that heap; at seq 2048 (intermediate-wide blocks) not."""
    def told(seq_len, engine="stock"):
        j = job("bench-llama-136m", seq_len=seq_len, dtype="fp32", checkpointing="full")
        return any("hidden-wide activation blocks (12 MiB)" in n for n in estimate(j, CPU, engine).notes)

    assert told(3072) and told(3072, "tuned") and not told(3072, "memascend") and not told(2048)


def test_later_backwards_map_their_large_blocks_above_the_kept_heap():
    """From step 2 on, stock's CPU backward maps its blocks of 32 MiB or more (the hf loss's b x s x V logits) above the
    heap step 1 left kept; bench-llama-136m at 8 layers peaked in step 2's backward at seq 1280, 2304 and 3328."""
    from memascend_cli.planner import heap

    j = job("bench-llama-136m", seq_len=2304, dtype="fp32", checkpointing="full")
    j = replace(j, model=j.model.scaled(8))
    est = estimate(j, CPU, "tuned")
    mapped = est.item("host/mapped_backward")
    assert mapped.kind == "later_backward"
    # the fp32 logits, log-softmax and gradient (the 9.4 MiB hidden-wide blocks stay in the heap)
    assert mapped.bytes == 3 * 2304 * 16384 * 4
    phases = est.phase_bytes()
    retained = sum(i.bytes for i in est.items if i.kind == "retained")
    assert retained > 0 and phases["later_backward"] == retained + mapped.bytes
    assert est.peak_phase == "later_backward"
    # at seq 256 the logits (16 MiB each) come from the heap: only the LM head's weight gradient (64 MiB) is mapped
    small = replace(j, seq_len=256)
    assert heap.mapped_backward_bytes(memory.Context(small, CPU, "tuned")) == 16384 * 1024 * 4
    # memascend trims its heap: no such phase
    assert estimate(j, CPU, "memascend").phase_bytes()["later_backward"] == 0


def test_backward_reuses_the_zero_init_heap_before_growing():
    """The backward's heap blocks land in the holes zero.Init left: counted once, at the steady level."""
    k = replace(zero.DEEPSPEED_DEFAULTS, reduce_bucket_size=10**6)
    j = job("bench-llama-136m", seq_len=256, dtype="fp32", checkpointing="full", knobs=k)
    est = estimate(j, CPU, "stock")
    no_zi = replace(j, zero_init=False)
    full = estimate(no_zi, CPU, "stock")
    zi = est.item("host/zero_init_heap").bytes
    fb, fb_full = (e.item("host/compute/forward_backward").bytes for e in (est, full))
    assert 0 < fb_full - fb <= zi
    assert est.item("host/allocator_retention").bytes == max(0, full.item("host/allocator_retention").bytes - zi)


def test_native_pinning_copies_the_gradient_buffer_at_init_on_cpu():
    """stage3.py 791-795: torch.zeros(Ns) then pin_memory(); the native backend pins by copying (mlock), the CPU
    accelerator's torch backend returns the tensor itself."""
    native = replace(zero.DEEPSPEED_DEFAULTS, pin_backend="native")
    j = job("bench-llama-136m", seq_len=256, dtype="fp32", checkpointing="full")
    est = estimate(replace(j, knobs=native), CPU, "stock")
    assert est.item("host/grad_buffer_init_copy").bytes == est.item("host/grad_flat_buffer").bytes
    assert est.item("host/grad_buffer_init_copy").kind == "init"
    assert "host/grad_buffer_init_copy" not in {i.key for i in estimate(j, CPU, "stock").items}


def test_a_16_bit_backward_keeps_its_fp32_gradient_copies_in_the_heap():
    """stage3.py _offload_grad_partition_at_boundary converts each 16-bit gradient partition to fp32 for swap-out
    (grad_buffer.to(fp32)); fp32 gradients are not converted. Below glibc's threshold the copies' heap stays kept
    under the optimizer step and every later backward (docs/bench/user-script/trace/*-bf16-*.json.gz)."""
    from memascend_cli.models import layer_template

    m = load_preset("bench-llama-136m")
    head, layer, tail = layer_template(m)
    tensors = (*head, *layer * m.num_hidden_layers, *tail)  # one rank: a partition is its whole tensor
    small = sum(4 * t.numel for t in tensors if 4 * t.numel < 32 * 2**20)
    assert 0 < small < 4 * m.num_params  # the embeddings' fp32 copies are mmapped
    for dtype in ("bf16", "fp16"):
        for engine in ("stock", "tuned"):
            est = estimate(job("bench-llama-136m", dtype=dtype, checkpointing="full"), CPU, engine)
            kept = est.item("host/grad_conversion_heap")
            assert kept.bytes == int(heap.GRAD_CONVERSION_HEAP_FRACTION * small) and kept.kind == "retained"
    for j, hw, engine in ((job("bench-llama-136m", dtype="fp32", checkpointing="full"), CPU, "stock"),
                          (job("bench-llama-136m", checkpointing="full"), CPU, "memascend"),
                          (job("bench-llama-136m", checkpointing="full"), GPU, "stock")):
        assert "host/grad_conversion_heap" not in {i.key for i in estimate(j, hw, engine).items}, (j.dtype, engine)


def test_optimizer_init_and_first_step_keep_the_small_sub_groups_fp32_blocks():
    """stage3.py _create_fp32_partitions passes each sub-group through an unpinned fp32 buffer (fast_init off) and
    partition_grads converts gradients to fp32 per sub-group: below glibc's 32 MiB threshold those blocks stay in the
    heap (docs/bench/calibration/tuned-heap-*-steps4-fp32.json.gz). Tuned's 2M-element sub-groups are all heap blocks;
    stock's default 1e9-element sub-group is one mmapped block."""
    j = job("bench-llama-136m", seq_len=8192, dtype="fp32", checkpointing="full")
    tuned = estimate(j, CPU, "tuned")
    small = sum(4 * n for n in tuned.sub_group_numels if 4 * n < memory.GLIBC_MMAP_THRESHOLD_MAX_BYTES)
    assert small > 0
    init, step = tuned.item("host/optimizer_init_heap"), tuned.item("host/step_heap")
    assert init.bytes == int(heap.OPTIMIZER_INIT_HEAP_FRACTION * small) and init.kind == "steady"
    assert step.bytes == int(heap.STEP_HEAP_FRACTION * small) and step.kind == "retained"
    stock = {i.key for i in estimate(j, CPU, "stock").items}
    assert not {"host/optimizer_init_heap", "host/step_heap"} & stock  # one 136M-element sub-group: mmapped
    assert not {"host/optimizer_init_heap", "host/step_heap"} & {i.key for i in estimate(j, CPU, "memascend").items}
    assert not {"host/optimizer_init_heap", "host/step_heap"} & {i.key for i in estimate(j, GPU, "tuned").items}
    # stock given small sub-groups keeps them too, unless fast_init converts them in the swapper's pinned buffers
    small_groups = replace(zero.DEEPSPEED_DEFAULTS, sub_group_size=2 * 2**20)
    kept = estimate(replace(j, knobs=small_groups), CPU, "stock")
    assert kept.item("host/optimizer_init_heap").bytes == init.bytes
    fast = estimate(replace(j, knobs=replace(small_groups, fast_init=True)), CPU, "stock")
    assert "host/optimizer_init_heap" not in {i.key for i in fast.items}


def test_later_backward_comes_on_top_of_the_kept_heap_once_blocks_are_mapped():
    """At seq 8192 the hidden-wide blocks (32 MiB) are mapped and steps 2-4's backward measured its whole working set
    above the kept heap (tuned-heap-l16-seq8192-steps4-fp32.json.gz); a tiny model maps nothing and the kept heap
    takes the later backward."""
    long = estimate(job("bench-llama-136m", seq_len=8192, dtype="fp32", checkpointing="full"), CPU, "tuned")
    assert long.item("host/mapped_backward").bytes == long.item("host/compute/forward_backward").bytes
    assert long.item("host/mapped_backward").kind == "later_backward"
    short = estimate(job("tiny-llama", seq_len=256, dtype="fp32", checkpointing="full"), CPU, "tuned")
    assert short.item("host/mapped_backward").bytes == 0


def test_zero_init_heap_is_the_recorded_upper_mode():
    """benchmarks/zero_init_heap.py: the heap zero.Init and the weights pass keep is bimodal (a race in the order of
    frees) and moves between sittings; the plan is within 0.2 GiB of the larger repeat for every recorded shape."""
    import json
    import os

    from memascend_cli.models import load_model

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "bench", "micro",
                        "zero-init-heap-weights-pass.json")
    with open(path) as f:
        cases = json.load(f)["cases"]
    upper: dict = {}
    for c in cases:
        key = (c["model"], c["layers"], c["dtype"])
        upper[key] = max(upper.get(key, 0), c["free_kept_bytes"] + c["weights_pass_free_kept_bytes"])
    assert len(upper) >= 5
    for (model, layers, _dtype), kept in upper.items():
        plan = memory.zero_init_heap_bytes(load_model(model).scaled(layers))
        assert abs(plan - kept) <= 0.2 * GiB, (model, layers, plan, kept)


def test_activation_heap_grows_only_for_blocks_larger_than_the_holes():
    """Stock on a CPU rank: the checkpointed layers' widest blocks below the 32 MiB mmap threshold (s x I x E, or
    s x h x E once those are mmapped) strand heap when larger than the zero.Init holes (the largest fp32 weight)."""
    m = load_preset("bench-llama-136m")  # largest weight 1024 x 2816 fp32 = 11 MiB
    assert memory.activation_heap_block(m, 512, 4) is None  # 5.5 MiB: fits the holes
    assert memory.activation_heap_block(m, 2048, 4) == ("intermediate", 2048 * 2816 * 4)  # 22 MiB
    assert memory.activation_heap_block(m, 4096, 4) == ("hidden", 4096 * 1024 * 4)  # 44 MiB mmapped, 16 MiB strands
    assert memory.activation_heap_block(m, 8192, 4) is None  # 88 and 32 MiB: both mmapped
    j = job("bench-llama-136m", seq_len=2048, dtype="fp32", checkpointing="full")
    est = estimate(j, CPU, "stock")
    k = memory.ACTIVATION_HEAP_BLOCKS_PER_LAYER["intermediate"]
    item, forward = est.item("host/activation_heap"), est.item("host/activation_heap_forward")
    assert (item.kind, forward.kind) == ("retained", "backward")
    assert item.bytes == int(k["retained"] * 2048 * 2816 * 4 * 8)
    assert forward.bytes == int(k["forward"] * 2048 * 2816 * 4 * 8)
    long = estimate(replace(j, seq_len=4096), CPU, "stock").item("host/activation_heap")
    assert long.bytes == int(memory.ACTIVATION_HEAP_BLOCKS_PER_LAYER["hidden"]["retained"] * 4096 * 1024 * 4 * 8)
    assert "host/activation_heap" not in {i.key for i in estimate(j, CPU, "memascend").items}
    assert "host/activation_heap" not in {i.key for i in estimate(replace(j, seq_len=512), CPU, "stock").items}


def test_one_engine_vocabulary():
    ests = estimate_all(job(), GPU)
    assert tuple(ests) == zero.ENGINES == ("stock", "tuned", "memascend")
    assert all(est.engine == name for name, est in ests.items())
    with pytest.raises(BadInput):
        estimate(job(), GPU, "baseline")  # the old name is the CLI's alias, not the planner's


def test_tuned_is_stock_deepspeed_given_memascends_knobs():
    j = job()
    largest = zero.largest_swappable_partition(zero.model_partitions(j.model, 1), j.knobs, 2)
    given = replace(j, knobs=zero.memascend_knobs(j.knobs, largest_partition_numel=largest))
    tuned, stock_given = estimate(j, GPU, "tuned"), estimate(given, GPU, "stock")
    assert [(i.key, i.bytes) for i in tuned.items] == [(i.key, i.bytes) for i in stock_given.items]
    assert tuned.host_peak_bytes < estimate(j, GPU, "stock").host_peak_bytes


def test_the_chunked_loss_replaces_the_logits_by_one_chunk_and_two_gradients():
    """memascend_engine.chunked_loss: at its forward's last chunk the hidden-state gradient (b*s*h*E), the weight's
    fp32 gradient (V*h*4) and two fp32 chunks of 64 MiB of logits; no b*s*V term, so the loss moment stops growing
    with the vocabulary times the context."""
    s, V, h = 16384, 16384, 1024
    k = replace(zero.DEEPSPEED_DEFAULTS, prefetch_bucket_size=10**6)
    plain, chunked = (estimate(job("bench-llama-136m", seq_len=s, dtype="fp32", checkpointing="offload", knobs=k,
                                   chunked_loss=c), CPU, "memascend") for c in (False, True))
    params = (V * h + 10**6) * 4
    loss = s * h * 4 + V * h * 4 + 2 * 64 * 2**20
    kept = 0  # memascend's checkpoints stream to the SSD
    assert chunked.item("host/compute/forward_backward").bytes >= params + loss + kept
    assert plain.item("host/compute/forward_backward").bytes - chunked.item("host/compute/forward_backward").bytes \
        >= s * V * 12 - loss - 1.6 * GiB  # the logits term gone, up to the larger recompute moment now binding
    assert chunked.node_host_peak_bytes < plain.node_host_peak_bytes
    # bf16 adds the matmul's bf16 output beside its fp32 upcast, and the weight gradient's cast at backward
    b16 = estimate(job("bench-llama-136m", seq_len=256, dtype="bf16", chunked_loss=True), CPU, "memascend")
    assert b16.item("host/compute/forward_backward").bytes > 0


def test_gradient_accumulation_window_takes_what_the_budget_leaves():
    """With a host budget the leftover holds accumulated gradients in DRAM (up to all of them); the SSD then sees
    each held partition once per step instead of once per micro-batch."""
    ga = replace(job(), grad_accum_steps=8, overlap_optimizer=False)  # the overlap: test below
    none = estimate(ga, GPU, "memascend")  # no budget: the default windows, no accumulation window
    assert none.item("host/gradient_accumulation") is None and none.budget.windows.accumulation_bytes == 0
    full = none.budget.total_bytes
    grads = none.traffic.write_bytes["gradients"]
    assert none.traffic.read_bytes["gradients"] == grads  # G x opt x 8 each way

    roomy = estimate(replace(ga, host_budget_bytes=full + 64 * GiB), GPU, "memascend")
    held = roomy.item("host/gradient_accumulation").bytes
    assert roomy.budget.windows.accumulation_bytes == held == roomy.budget.total_bytes - full  # all of them, no more
    assert roomy.traffic.write_bytes["gradients"] == grads // 8 == roomy.traffic.read_bytes["gradients"]
    assert roomy.host_steady_bytes == none.host_steady_bytes + held

    part = estimate(replace(ga, host_budget_bytes=full + held // 2), GPU, "memascend")
    w = part.budget.windows.accumulation_bytes
    assert w == held // 2 and part.budget.total_bytes == full + w  # the whole budget, not more
    assert grads // 8 < part.traffic.write_bytes["gradients"] < grads

    off = estimate(replace(ga, host_budget_bytes=full + 64 * GiB, accumulate_in_dram=False), GPU, "memascend")
    assert off.item("host/gradient_accumulation") is None and off.traffic.write_bytes["gradients"] == grads
    one = estimate(replace(ga, grad_accum_steps=1, host_budget_bytes=full + 64 * GiB), GPU, "memascend")
    assert one.item("host/gradient_accumulation") is None  # nothing to accumulate


def test_overlap_steps_the_last_gradients_in_dram_and_doubles_the_state_extents():
    """The optimizer overlapped with backward: the optimizer reads no gradient back; with clipping on (DeepSpeed's
    default) the gradients are still written, for a redo; without it they never touch the SSD. The speculative
    master + moments take a second 12 B per element of SSD space (the master beside the parameters here)."""
    base = job(dtype="bf16", params_hold_master=False)
    off = estimate(replace(base, overlap_optimizer=False), GPU, "memascend")
    clip = estimate(base, GPU, "memascend")
    free = estimate(replace(base, gradient_clipping=0.0), GPU, "memascend")
    g = off.traffic.read_bytes["gradients"]
    assert g > 0 and off.traffic.write_bytes["gradients"] == g
    assert clip.traffic.read_bytes["gradients"] == 0 and clip.traffic.write_bytes["gradients"] == g
    assert free.traffic.read_bytes["gradients"] == 0 == free.traffic.write_bytes["gradients"]
    spec = clip.item("nvme/optimizer_states_speculative").bytes
    assert spec == clip.item("nvme/optimizer_states").bytes
    assert off.item("nvme/optimizer_states_speculative") is None
    # fp16's loss scale can change at the step: its gradients stay on the SSD even without clipping.
    fp16 = estimate(replace(base, dtype="fp16", gradient_clipping=0.0), GPU, "memascend")
    assert fp16.traffic.write_bytes["gradients"] == g
    # Accumulation: the earlier micro-batches' read-modify-write is unchanged; only the last one's read goes.
    ga = estimate(replace(base, grad_accum_steps=4), GPU, "memascend")
    ga_off = estimate(replace(base, grad_accum_steps=4, overlap_optimizer=False), GPU, "memascend")
    assert ga_off.traffic.read_bytes["gradients"] - ga.traffic.read_bytes["gradients"] == g
    # A host budget's leftover keeps the gradients for a redo in DRAM: none written while steps commit.
    roomy = estimate(replace(base, host_budget_bytes=clip.budget.total_bytes + 64 * GiB), GPU, "memascend")
    assert roomy.item("host/gradient_accumulation").bytes == g
    assert roomy.traffic.write_bytes["gradients"] == 0 == roomy.traffic.read_bytes["gradients"]
    assert estimate(replace(base, host_budget_bytes=clip.budget.total_bytes + 64 * GiB, gradient_clipping=0.0), GPU,
                    "memascend").item("host/gradient_accumulation") is None  # nothing to keep without clipping
    # The tuned stock estimate does not change.
    assert estimate(base, GPU, "tuned").traffic.read_bytes == estimate(replace(base, overlap_optimizer=False), GPU,
                                                                       "tuned").traffic.read_bytes


def test_fp32_overlap_takes_the_master_from_the_parameters_not_the_ssd():
    """fp32 with the overlap: each chunk's master comes from the parameters backward fetched (EngineOptions
    .master_from_params), 4 B per element less read (bf16: its upper halves, 2 B); writes, the engine without the
    overlap or the switch and tuned stock are unchanged."""
    base = job(dtype="fp32", gradient_clipping=0.0)
    on = estimate(base, GPU, "memascend")
    off = estimate(replace(base, master_from_params=False), GPU, "memascend")
    n = off.traffic.read_bytes["optimizer_states"] // 12
    assert on.traffic.read_bytes["optimizer_states"] == 8 * n and on.traffic.write_bytes == off.traffic.write_bytes
    assert on.traffic.minimum_per_param[0] == pytest.approx(off.traffic.minimum_per_param[0] - 4, abs=0.1)
    plain = replace(base, overlap_optimizer=False)
    assert (estimate(plain, GPU, "memascend").traffic.read_bytes
            == estimate(replace(plain, master_from_params=False), GPU, "memascend").traffic.read_bytes)
    bf16 = replace(base, dtype="bf16")
    on16, off16 = (estimate(j, GPU, "memascend").traffic for j in (bf16, replace(bf16, master_from_params=False)))
    assert on16.read_bytes["optimizer_states"] == off16.read_bytes["optimizer_states"] * 10 // 12
    assert on16.roofline_per_param[0] == pytest.approx(off16.roofline_per_param[0] - 2, abs=0.1)
    assert estimate(base, GPU, "tuned").traffic.read_bytes == estimate(replace(base, master_from_params=False), GPU,
                                                                       "tuned").traffic.read_bytes


def test_fp32_parameters_hold_the_master_no_master_written_nor_kept():
    """fp32 (EngineOptions.params_hold_master): no master written beside the parameters, 4 B per element less written
    per step; its extent goes, and with the overlap the second set holds shadow parameters instead of a master. bf16:
    the parameters hold the master's upper halves, a 2 B residual beside them (2 B less written). Reads and tuned
    stock are unchanged."""
    base = job(dtype="fp32", gradient_clipping=0.0)
    on = estimate(base, GPU, "memascend")
    off = estimate(replace(base, params_hold_master=False), GPU, "memascend")
    n = off.traffic.write_bytes["optimizer_states"] // 12
    assert on.traffic.write_bytes["optimizer_states"] == 8 * n and on.traffic.read_bytes == off.traffic.read_bytes
    assert on.traffic.minimum_per_param[1] == pytest.approx(off.traffic.minimum_per_param[1] - 4, abs=0.1)
    params = on.item("nvme/params").bytes
    assert on.item("nvme/optimizer_states").bytes == off.item("nvme/optimizer_states").bytes * 2 // 3
    assert (on.item("nvme/optimizer_states_speculative").bytes
            == off.item("nvme/optimizer_states_speculative").bytes * 2 // 3 + params)
    plain = replace(base, overlap_optimizer=False)
    assert estimate(plain, GPU, "memascend").item("nvme/optimizer_states_speculative") is None
    bf16 = replace(base, dtype="bf16", master_from_params=False)
    on16, off16 = (estimate(j, GPU, "memascend") for j in (bf16, replace(bf16, params_hold_master=False)))
    assert on16.traffic.write_bytes["optimizer_states"] == off16.traffic.write_bytes["optimizer_states"] * 10 // 12
    assert on16.traffic.read_bytes == off16.traffic.read_bytes
    assert on16.item("nvme/optimizer_states").bytes == off16.item("nvme/optimizer_states").bytes * 10 // 12
    # The plan's roofline: the master written once however it is held, no gradient.
    assert on16.traffic.roofline_per_param[1] == off16.traffic.roofline_per_param[1] == pytest.approx(12, abs=0.1)
    assert (estimate(base, GPU, "tuned").traffic.write_bytes
            == estimate(replace(base, params_hold_master=False), GPU, "tuned").traffic.write_bytes)


def test_bf16_moments_take_8_bytes_per_parameter_off_the_step_and_4_off_each_state_extent():
    """memascend's Adam moments in bf16 on the SSD (EngineOptions.optimizer_moments): master 4 B + moments 2 x 2 B
    each way per element instead of 12 B; the state extents (and the overlap's second set) shrink alike; stock and
    tuned keep fp32 states; an unknown dtype is bad input."""
    base = job(dtype="bf16", gradient_clipping=0.0, params_hold_master=False)  # the master beside the parameters
    f32 = estimate(base, GPU, "memascend")
    b16 = estimate(replace(base, optimizer_moments="bf16"), GPU, "memascend")
    n = f32.traffic.read_bytes["optimizer_states"] // 12
    assert b16.traffic.read_bytes["optimizer_states"] == 8 * n == b16.traffic.write_bytes["optimizer_states"]
    per_param = [sum(t.values()) / f32.traffic.params_per_rank for t in (f32.traffic.read_bytes,
                                                                         f32.traffic.write_bytes)]
    per_param16 = [sum(t.values()) / b16.traffic.params_per_rank for t in (b16.traffic.read_bytes,
                                                                           b16.traffic.write_bytes)]
    assert sum(per_param) - sum(per_param16) == pytest.approx(8, abs=0.01)
    for key in ("nvme/optimizer_states", "nvme/optimizer_states_speculative"):
        assert b16.item(key).bytes * 12 == f32.item(key).bytes * 8
    for engine in ("stock", "tuned"):
        assert (estimate(replace(base, optimizer_moments="bf16"), GPU, engine).traffic.read_bytes
                == estimate(base, GPU, engine).traffic.read_bytes)
    with pytest.raises(BadInput):
        job(optimizer_moments="fp8")


HEAD_MOMENTS_NOT_MODELLED = {("head-chunked", "bf16", "bench-llama-136m", 16384)}
"""416 MiB measured against 352 planned: past the chunked loss's backward, the final RMSNorm's own backward in 16-bit
(fp32 temporaries of its upcast, the incoming gradient and the head's weight gradients beside the model's top) is the
larger moment there; the planner does not model it, as one recomputed layer's backward (960 MiB at that shape) binds
far above it in a memascend CPU backward."""


def test_layer_and_loss_backward_moments_are_the_measured_ones():
    """layer_backward_bytes, loss_backward_bytes and model_top_bytes reproduce every committed measurement of
    benchmarks/layer_backward_memory.py (docs/bench/micro/{layer,loss,head}-backward-*.json): a recomputed decoder
    layer, transformers' loss, the chunked one and TRL's fused LM head, the first two with the model's top (the last
    layer's output and the final RMSNorm) too, fp32 and bf16, within 3% (the chunked loss's hidden-state gradient is torch.empty: its pages count
    only as the chunks fill them)."""
    import glob
    import json
    import os

    from memascend_cli.planner.compute import layer_backward_bytes, loss_backward_bytes, model_top_bytes
    from memascend_cli.planner.context import Context

    micro = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "bench", "micro")
    docs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(micro, "*-backward-*.json")))]
    assert {(d["part"], d["dtype"]) for d in docs} == {
        (p, dt) for p in ("layer", "loss-hf", "loss-chunked", "loss-trl", "head-hf", "head-chunked")
        for dt in ("fp32", "bf16")}
    for d in docs:
        assert {r["model"] for r in d["rows"]} >= {"bench-llama-136m", "llama-3.2-1b"}
        for r in d["rows"]:
            c = Context(job(r["model"], seq_len=r["tokens"], dtype=d["dtype"], checkpointing="full",
                            chunked_loss=d["part"].endswith("-chunked"),
                            trainer="trl" if d["part"] == "loss-trl" else "deepspeed"), CPU, "memascend")
            plan = layer_backward_bytes(c) if d["part"] == "layer" else \
                loss_backward_bytes(c) + (model_top_bytes(c) if d["part"].startswith("head-") else 0)
            if (d["part"], d["dtype"], r["model"], r["tokens"]) in HEAD_MOMENTS_NOT_MODELLED:
                assert plan < r["peak_rise_bytes"] < layer_backward_bytes(c), "the layer's backward still binds"
                continue
            assert abs(plan / r["peak_rise_bytes"] - 1) < 0.03, (d["part"], d["dtype"], r["model"], r["tokens"])
    # The top's bytes are what the head parts add to the loss parts' measurements (same shapes, fp32 and bf16).
    by = {(d["part"], d["dtype"]): {(r["model"], r["tokens"]): r["peak_rise_bytes"] for r in d["rows"]} for d in docs}
    for dt in ("fp32", "bf16"):
        for (model, tokens), head in by[("head-hf", dt)].items():
            loss = by[("loss-hf", dt)].get((model, tokens))
            if loss:
                c = Context(job(model, seq_len=tokens, dtype=dt, checkpointing="full"), CPU, "memascend")
                assert abs(head - loss - model_top_bytes(c)) < 0.1 * model_top_bytes(c), (dt, model, tokens)


def test_memascend_cpu_backward_grows_with_context_by_one_recomputed_layer():
    """At long context the bucket flush inside a recomputed layer's backward binds: per token that layer's measured
    tensors (8 hidden-, 6 intermediate-, 2 key/value-wide), its checkpoint read back from the SSD and the gradient
    arriving from above."""
    m = load_preset("bench-llama-136m")
    fb = [estimate(job("bench-llama-136m", seq_len=s, dtype="fp32", checkpointing="offload", chunked_loss=True), CPU,
                   "memascend").item("host/compute/forward_backward").bytes for s in (8192, 16384)]
    per_token = 4 * (8 * m.hidden_size + 6 * m.intermediate_size + 2 * m.num_key_value_heads * m.head_dim_
                     + 2 * m.hidden_size)
    assert fb[1] - fb[0] == 8192 * per_token


def test_tied_embedding_and_memascends_pool_in_the_parameter_reads():
    """Llama-3.2-1B (tied, 262,668,288-element embedding), fp32, every parameter on the SSD: each engine fetches every
    partition in forward and in backward and the tied embedding once more (at the LM head); memascend's pool of two
    layers still holds the last two forward layers when backward starts (not fetched again)."""
    knobs = replace(zero.DEEPSPEED_DEFAULTS, max_in_cpu=0)
    base = job("llama-3.2-1b", dtype="fp32", checkpointing="full", knobs=knobs)
    emb, layer, total = 262_668_288, 60_817_408, 1_235_814_400
    swapped = total - 33 * 2048  # the norms stay resident (below min_aio_bytes)
    ma = estimate(base, GPU, "memascend").traffic
    stock = estimate(base, GPU, "stock").traffic
    # With the overlap the embedding's partition, released after the LM head's backward, is kept for its master
    # (bf16: its upper halves) until its gradient comes, so the embedding's backward finds it; with the master
    # beside the parameters it is fetched again.
    assert ma.read_bytes["params"] == 4 * (swapped + swapped - 2 * layer)
    assert ma.backward_param_read_bytes == 4 * (swapped - 2 * layer)
    bf16 = estimate(replace(base, dtype="bf16"), GPU, "memascend").traffic
    assert bf16.read_bytes["params"] == 2 * (swapped + swapped - 2 * layer)
    bf16 = estimate(replace(base, dtype="bf16", params_hold_master=False), GPU, "memascend").traffic
    assert bf16.read_bytes["params"] == 2 * (swapped + emb + swapped - 2 * layer)
    assert stock.read_bytes["params"] == 4 * (2 * swapped + emb)
    assert stock.backward_param_read_bytes == 4 * swapped
    # Untied: two fetches each for stock; with max_in_cpu the embedding (first) stays in DRAM, never fetched.
    untied = estimate(job("bench-llama-136m", dtype="fp32", checkpointing="full", knobs=knobs), GPU, "stock").traffic
    assert untied.read_bytes["params"] == 2 * untied.write_bytes["params"]
    # DeepSpeed keeps only whole leading sub-groups in the max_in_cpu buffer (stage3.py 978-996): with its default
    # sub_group_size 1e9 the first sub-group (embedding + layers) exceeds 300M and nothing stays in DRAM.
    small_groups = replace(knobs, max_in_cpu=300_000_000, sub_group_size=zero.MEMASCEND_SUB_GROUP_SIZE)
    in_cpu = estimate(replace(base, knobs=small_groups), GPU, "stock").traffic
    assert in_cpu.read_bytes["params"] == 2 * in_cpu.write_bytes["params"]
    assert 4 * (total - 300_000_000) <= in_cpu.write_bytes["params"] < 4 * (total - 300_000_000 + 2 * layer)
    assert in_cpu.dram_fetch_bytes == 2 * 4 * total - 2 * in_cpu.write_bytes["params"] - 2 * 4 * 33 * 2048
    whole = estimate(replace(base, knobs=replace(knobs, max_in_cpu=300_000_000)), GPU, "stock").traffic
    assert whole.read_bytes["params"] == stock.read_bytes["params"] and whole.dram_fetch_bytes == 0
