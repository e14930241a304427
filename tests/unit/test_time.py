"""planner.time: FLOPs, devices, overlap rules and the binding resource (pure)."""

import pytest

from memascend_cli.models import load_model
from memascend_cli.planner import time as tm
from memascend_cli.planner.memory import SsdTraffic


def _traffic(params=0, states=0, grads=0, ckpt=0):
    rd = {"params": params, "optimizer_states": states, "gradients": grads}
    wr = {"params": params // 3, "optimizer_states": states, "gradients": grads}
    if ckpt:
        rd["activation_checkpoints"] = wr["activation_checkpoints"] = ckpt
    return SsdTraffic(rd, wr, params_per_rank=1)


def test_flops_are_6n_plus_attention_and_recompute_adds_the_layers_forward():
    m = load_model("qwen2.5-0.5b")
    n = m.num_params - (0 if m.tie_word_embeddings else m.vocab_size * m.hidden_size)
    attn = 2 * m.num_hidden_layers * 1024 * m.num_attention_heads * m.head_dim_
    head = 2 * m.vocab_size * m.hidden_size
    none = tm.step_flops(m, tokens=1024, seq_len=1024, checkpointing="none")
    assert none == pytest.approx(3 * (2 * n + attn) * 1024)
    # Checkpointing recomputes the decoder layers, not the LM head (transformers checkpoints each decoder layer).
    full = none + (2 * n + attn - head) * 1024
    assert tm.step_flops(m, tokens=1024, seq_len=1024, checkpointing="full") == pytest.approx(full)
    assert tm.step_flops(m, tokens=1024, seq_len=1024, checkpointing="offload") == pytest.approx(full)
    sel = tm.step_flops(m, tokens=1024, seq_len=1024, checkpointing="selective")
    assert none < sel < full


def test_chunked_loss_moves_the_heads_backward_into_forward():
    m = load_model("llama-3.2-1b")
    kw = dict(tokens=1024, seq_len=1024, checkpointing="full")
    fwd, bwd = tm.phase_flops(m, **kw)
    cfwd, cbwd = tm.phase_flops(m, chunked_loss=True, **kw)
    head_backward = 2 * 2 * m.vocab_size * m.hidden_size * 1024
    assert cfwd == pytest.approx(fwd + head_backward) and cbwd == pytest.approx(bwd - head_backward)
    assert cfwd + cbwd == pytest.approx(tm.step_flops(m, **kw))


def test_tied_lm_head_counts_as_a_matmul():
    m = load_model("qwen2.5-0.5b")
    assert m.tie_word_embeddings
    f = tm.step_flops(m, tokens=1, seq_len=1, checkpointing="none")
    assert f >= 6 * m.num_params


@pytest.mark.parametrize("name,key", [("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"),
                                      ("NVIDIA H200", "H200"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
                                      ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA L40S", "L40S")])
def test_gpu_table_matches_names(name, key):
    d = tm.gpu_device(name)
    assert d.flops_per_s == pytest.approx(tm.GPU_BF16_DENSE_TFLOPS[key] * tm.GPU_ACHIEVED_FRACTION * 1e12)
    assert d.gpu and d.pcie_bytes_per_s


def test_measured_gpu_replaces_the_table_and_unknown_gpu_is_unknown():
    assert tm.gpu_device("NVIDIA H100", measured_tflops=400).flops_per_s == 400e12
    assert tm.gpu_device("Some Accelerator").flops_per_s is None


def _step(engine, traffic, *, gflops=1.0, pipelined=False, gpu=False):
    dev = tm.gpu_device("H100", measured_tflops=gflops / 1e3) if gpu else tm.cpu_device(gflops, "test")
    return tm.step_time(engine, flops=10e9, traffic=traffic, device=dev, read_bytes_per_s=1e9, write_bytes_per_s=1e9,
                        optimizer_elems=0, cpu_cores=1, tokens_per_step=100, pipelined_optimizer=pipelined)


def test_ssd_bound_step_binds_on_the_ssd_and_memascend_overlaps_its_optimizer():
    tr = _traffic(params=3e9, states=12e9, grads=4e9)
    stock, mem = _step("stock", tr, gflops=100, gpu=True), _step("memascend", tr, gflops=100, gpu=True)
    assert stock.binding in ("SSD read", "SSD write")
    # Optimizer I/O: 16 GB read + 13 GB written, Adam 0 s: both take the I/O time; forward/backward max(0.1, 3 + 4)
    assert stock.step_s == pytest.approx(7 + 16 + 13)
    assert mem.step_s == pytest.approx(stock.step_s)
    # The two phases the bench marks, as the plan splits the step.
    assert stock.phase_s == pytest.approx({tm.PHASE_FORWARD_BACKWARD: 7, tm.PHASE_OPTIMIZER: 16 + 13})
    assert stock.to_dict()["phase_seconds"] == {"forward+backward": 7.0, "optimizer": 29.0}


def test_overlapped_optimizer_runs_beside_the_last_backward():
    """memascend with the overlap: the optimizer's I/O hides behind the backward's window, Adam adds to it; on the CPU
    accelerator MEMASCEND_OVERLAP_SERIAL_SHARE of the window's shorter side adds to its longer."""
    tr = _traffic(params=3e9, states=12e9, grads=0)
    kw = dict(flops=10e9, traffic=tr, device=tm.cpu_device(1.0, "t"), read_bytes_per_s=1e9, write_bytes_per_s=1e9,
              optimizer_elems=0, cpu_cores=1, tokens_per_step=100, duplex_io=True)
    plain = tm.step_time("memascend", **kw)
    over = tm.step_time("memascend", overlap_window=0.75, **kw)
    fb = 10 + 3  # compute + the parameter reads (the CPU accelerator adds them)
    assert plain.step_s == pytest.approx(fb + max(12, 12 + 1))  # optimizer: max(SSD read, SSD write)
    # Before the window: the forward's 2.5 s of compute beside its prefetched half of the reads (1.5 s), in part.
    share = tm.MEMASCEND_OVERLAP_SERIAL_SHARE
    before = max(2.5, 1.5) + share * min(2.5, 1.5)
    # the last backward is 0.75 of the compute and fetches the other half of the parameters, which share the read
    # budget with the optimizer's 12
    window, io = 10 * 0.75 + 3 / 2, max(3 / 2 + 12, 12 + 1)
    assert over.step_s == pytest.approx(before + max(window, io) + share * min(window, io))
    assert over.step_s < plain.step_s
    # Only memascend overlaps; a window larger than the phase is capped.
    assert tm.step_time("tuned", overlap_window=0.75, **kw).step_s == tm.step_time("tuned", **kw).step_s
    assert tm.step_time("memascend", overlap_window=5, **kw).step_s == \
        tm.step_time("memascend", overlap_window=1, **kw).step_s


def test_the_last_backwards_window_holds_its_own_transfers():
    """The window beside which the optimizer runs holds the transfers that happen in backward (the second of the two
    parameter fetches, every gradient write), not a FLOP share of all of them: the forward before it reads the other
    half of the parameters and writes nothing (bench documents: throttled memascend forwards write no bytes)."""
    tr = _traffic(params=4e9, states=8e9, grads=6e9)  # reads: params 4, states 8, gradients 6; writes 4/3, 8, 6
    kw = dict(flops=8e9, traffic=tr, device=tm.cpu_device(1.0, "t"), read_bytes_per_s=1e9, write_bytes_per_s=1e9,
              optimizer_elems=0, cpu_cores=1, tokens_per_step=100, duplex_io=True, overlap_window=0.75)
    got = tm.step_time("memascend", **kw)
    # the forward's compute beside its prefetch of half the parameters (in part: MEMASCEND_OVERLAP_SERIAL_SHARE)
    forward = max(8 * 0.25, 2) + tm.MEMASCEND_OVERLAP_SERIAL_SHARE * min(8 * 0.25, 2)
    work = 8 * 0.75 + 2 + tm.MEMASCEND_GRADIENT_WRITE_BLOCKING * 6  # backward's compute, its fetch, its writes' wait
    io = max(2 + (8 + 6),  # reads beside it: that fetch, the optimizer states and gradients
             6 + (8 + 4 / 3))  # writes: every gradient, then the states and parameters
    window = max(work, io) + tm.MEMASCEND_OVERLAP_SERIAL_SHARE * min(work, io)
    assert got.step_s == pytest.approx(forward + window)
    assert got.phase_s == pytest.approx({tm.PHASE_FORWARD_BACKWARD: forward + window, tm.PHASE_OPTIMIZER: 0})
    # Accumulating 2 micro-batches: the first micro-batch's transfers all precede the window.
    acc = tm.step_time("memascend", **{**kw, "overlap_window": 0.375, "grad_accum": 2,
                                       "traffic": _traffic(params=8e9, states=8e9, grads=6e9)})
    assert acc.phase_s[tm.PHASE_FORWARD_BACKWARD] > got.phase_s[tm.PHASE_FORWARD_BACKWARD]


def test_the_embeddings_chunks_are_stepped_after_backward():
    """The chunks whose gradients come last (tail_elems: the input embedding) cannot hide behind backward: their
    reads, Adam and writes follow it. Where backward's compute binds the window that adds their time; where the I/O
    binds it, the same bytes move either way."""
    kw = dict(flops=40e9, device=tm.cpu_device(1.0, "t"), read_bytes_per_s=1e9, write_bytes_per_s=1e9,
              optimizer_elems=1000, cpu_cores=1, tokens_per_step=100, duplex_io=True, overlap_window=0.75)
    tr = _traffic(params=3e9, states=12e9, grads=0)
    fb = 40 + 1.5  # compute and the window's own fetch; the forward's 1.5 s of reads ran beside its 10 s of compute
    none = tm.step_time("memascend", traffic=tr, **kw)
    tail = tm.step_time("memascend", traffic=tr, tail_elems=250, **kw)  # a quarter of the optimizer's elements
    share = tm.MEMASCEND_OVERLAP_SERIAL_SHARE  # of the window's I/O beside its backward: 1.5 s of its fetch + 12 / 9
    # the rest hid behind the 31.5 s of the last backward, as the forward's reads behind its compute
    assert none.step_s == pytest.approx(fb + share * (1.5 + 13.5))
    # the quarter's writes (states + params) after it
    assert tail.step_s == pytest.approx(fb + share * (1.5 + 10.5) + 0.25 * (12 + 1))
    io_bound = _traffic(params=3e9, states=120e9, grads=0)
    # (to within the window's reads, which the other direction then hides: 133.25 against 133.0 s)
    assert tm.step_time("memascend", traffic=io_bound, tail_elems=250, **kw).step_s == \
        pytest.approx(tm.step_time("memascend", traffic=io_bound, **kw).step_s, rel=0.01)


def test_cpu_accelerator_adds_fetches_to_compute():
    tr = _traffic(params=3e9)
    cpu = _step("stock", tr, gflops=1.0)
    assert cpu.step_s == pytest.approx(10 + 3 + 1)  # compute + parameter reads + parameter write-back


def test_tuned_prefetch_hides_fetches_behind_compute_on_the_cpu():
    # tuned's forward + backward: the longer of compute and the parameter reads; its write-back stays in the step
    assert _step("tuned", _traffic(params=3e9), gflops=1.0).phase_s[tm.PHASE_FORWARD_BACKWARD] == pytest.approx(10)
    assert _step("tuned", _traffic(params=30e9), gflops=1.0).phase_s[tm.PHASE_FORWARD_BACKWARD] == pytest.approx(30)


def test_stock_optimizer_is_serial_unless_pipelined():
    tr = _traffic(states=1e9)
    kw = dict(flops=0, traffic=tr, device=tm.cpu_device(1.0, "t"), read_bytes_per_s=1e9, write_bytes_per_s=1e9,
              optimizer_elems=int(3 * tm.CPU_ADAM_ELEMS_PER_S_PER_CORE), cpu_cores=1, tokens_per_step=1)
    host = _stock_host_s(kw["optimizer_elems"])
    serial = tm.step_time("stock", **kw)
    piped = tm.step_time("tuned", pipelined_optimizer=True, **kw)
    bounded = tm.step_time("memascend", **kw)
    # stock and tuned run the same stage3.py code: its host passes on the CPU accelerator, serial with the swaps ...
    assert serial.step_s == pytest.approx(1 + 3 + 1 + host)
    assert serial.binding == "host copies"
    # ... and beside them where the swapper pipelines its reads and writes
    opt_host = kw["optimizer_elems"] * tm.STOCK_CPU_HOST_NS_PER_ELEMENT["optimizer"] * 1e-9
    assert piped.phase_s[tm.PHASE_OPTIMIZER] == pytest.approx(max(2, 3 + opt_host))
    assert bounded.step_s == pytest.approx(3)


def _stock_host_s(elems: int) -> float:
    return elems * sum(tm.STOCK_CPU_HOST_NS_PER_ELEMENT.values()) * 1e-9


def test_host_copies_count_on_the_cpu_accelerator_only():
    tr = _traffic(params=1e8, states=1e9, grads=1e8)
    for gpu in (False, True):
        dev = tm.gpu_device("H100", measured_tflops=1.0) if gpu else tm.cpu_device(1.0, "t")
        kw = dict(flops=1e9, traffic=tr, device=dev, read_bytes_per_s=1e9, write_bytes_per_s=1e9,
                  optimizer_elems=10**8, cpu_cores=2, tokens_per_step=1)
        stock, tuned = tm.step_time("stock", **kw), tm.step_time("tuned", **kw)
        fb_host = 10**8 * tm.STOCK_CPU_HOST_NS_PER_ELEMENT["backward"] * 1e-9
        compute, fb_io = 1e9 / dev.flops_per_s, (1e8 + 1e8) / 1e9  # parameter reads + gradient writes
        assert stock.phase_s[tm.PHASE_FORWARD_BACKWARD] == pytest.approx(
            max(compute, fb_io) if gpu else compute + fb_io + fb_host)
        assert tuned.phase_s[tm.PHASE_FORWARD_BACKWARD] == pytest.approx(
            max(compute, fb_io) if gpu else max(compute + fb_host, fb_io))
        assert stock.seconds["host copies"] == pytest.approx(0.0 if gpu else _stock_host_s(10**8))


def test_memascend_host_work_runs_on_the_backward_thread_on_the_cpu_only():
    """MEMASCEND_CPU_HOST_NS_PER_ELEMENT, with today's engine's delta (MEMASCEND_WORKER_THREADS_HOST_NS_PER_ELEMENT),
    joins the overlap window's compute on the CPU accelerator: it lengthens a
    compute-bound window and hides under an I/O-bound one; a GPU step has none."""
    elems = 10**8
    delta = tm.MEMASCEND_WORKER_THREADS_HOST_NS_PER_ELEMENT[tm.DEFAULT_HOST_CPU]  # cpu_device's CPU: no model given
    host = elems * (tm.MEMASCEND_CPU_HOST_NS_PER_ELEMENT + delta) * 1e-9

    def fb(gpu, read_gbps):
        dev = tm.gpu_device("H100", measured_tflops=1.0) if gpu else tm.cpu_device(1.0, "t")
        t = tm.step_time("memascend", flops=4e9, traffic=_traffic(states=4e8), device=dev,
                         read_bytes_per_s=read_gbps * 1e9, write_bytes_per_s=read_gbps * 1e9,
                         optimizer_elems=elems, cpu_cores=2, tokens_per_step=1, overlap_window=0.75)
        return t.phase_s[tm.PHASE_FORWARD_BACKWARD], t.seconds["host copies"]

    adam = elems / (tm.CPU_ADAM_ELEMS_PER_S_PER_CORE * 2)
    fast, fast_host = fb(False, 100.0)  # I/O of 8 ms: the window is compute + Adam + host work
    assert fast == pytest.approx(4 + adam + host, rel=1e-2) and fast_host == pytest.approx(host)
    slow, _ = fb(False, 0.01)  # 80 s of optimizer I/O: the window waits for it, the host work hides but its share
    assert slow == pytest.approx(1 + 80 + tm.MEMASCEND_OVERLAP_SERIAL_SHARE * (3 + adam + host), rel=1e-2)
    assert fb(True, 100.0)[1] == 0.0


def test_compute_bound_step_and_hours():
    t = _step("tuned", _traffic(params=1e6, states=1e6), gflops=1.0)
    assert t.binding == "compute"
    assert t.tokens_per_s == pytest.approx(100 / t.step_s)
    assert t.hours_for(3600 * 100) == pytest.approx(t.step_s)


def test_unknown_rates_are_reported_not_guessed():
    t = tm.step_time("stock", flops=1e9, traffic=_traffic(states=1e9), device=tm.cpu_device(None, "?"),
                     read_bytes_per_s=None, write_bytes_per_s=None, optimizer_elems=1, cpu_cores=1,
                     tokens_per_step=1)
    assert t.step_s is None and t.binding == "unknown"
    assert {"compute", "SSD read", "SSD write"} <= set(t.unknown)


def test_gpu_step_counts_pcie():
    t = _step("stock", _traffic(params=3e9), gflops=1e6, gpu=True)
    assert t.seconds["PCIe"] > 0


@pytest.mark.parametrize("text,n", [("50M", 50_000_000), ("2B", 2_000_000_000), ("1.5e6", 1_500_000),
                                    ("300_000", 300_000), ("10k", 10_000)])
def test_parse_tokens(text, n):
    assert tm.parse_tokens(text) == n


@pytest.mark.parametrize("text", ["", "abc", "-5M", "0"])
def test_parse_tokens_rejects(text):
    with pytest.raises(ValueError):
        tm.parse_tokens(text)


def test_fastest_fits_and_beats_micro_batch_1_where_the_ssd_binds():
    from memascend_cli.hardware import apply_overrides, load_hardware_profile
    from memascend_cli.planner import zero
    from memascend_cli.planner.memory import JobSpec, estimate_all
    from memascend_cli.planner.search import check

    hw = apply_overrides(load_hardware_profile("rtx4090-128g"), nvme_read_gbps="7", nvme_write_gbps="5")
    m = load_model("qwen2.5-7b")
    job = JobSpec(model=m, seq_len=4096, micro_batch=1, dtype="bf16", deepspeed_version="0.19.8",
                  knobs=zero.resolve("stock", model=m, world_size=1, elem_bytes=2), checkpointing="offload")
    dev = tm.gpu_device(hw.gpu_name)
    base = tm.engine_times(job, estimate_all(job, hw), dev, read_gbps=7, write_gbps=5, cpu_cores=hw.cpu_cores)
    best = tm.fastest(job, hw, dev, read_gbps=7, write_gbps=5)
    assert base["memascend"].binding.startswith("SSD")
    # Stock as its docs configure it cannot run a 7B model at all: its NVMe partitions outnumber the swap buffers at
    # step 2 (planner/param_buffers.py), so it has no fastest shape.
    assert best.pop("stock") is None
    for e, b in best.items():
        assert b["tokens_per_s"] > 2 * base[e].tokens_per_s
        from dataclasses import replace

        cand = replace(job, micro_batch=b["micro_batch"], grad_accum_steps=b["grad_accum"])
        key = {"stock": "baseline"}.get(e, e)
        ests = estimate_all(cand, hw)
        assert check(ests.get(key) or ests[e], hw).fits
    assert tm.fastest(job, hw, tm.gpu_device("unknown accelerator"), read_gbps=7, write_gbps=5) == {}


def test_a_per_direction_throttle_overlaps_reads_and_writes_where_they_alternate_within_its_slice():
    # 2 GB read and 2 GB written by the optimizer at 1 GB/s each way, Adam ~0 s.
    tr = _traffic(states=2e9)
    kw = dict(flops=0, traffic=tr, device=tm.cpu_device(1.0, "t"), read_bytes_per_s=1e9, write_bytes_per_s=1e9,
              optimizer_elems=100_000_000, cpu_cores=1, tokens_per_step=1)
    assert tm.step_time("memascend", **kw).step_s == pytest.approx(4)  # one drive: read + write
    assert tm.step_time("memascend", duplex_io=True, **kw).step_s == pytest.approx(2)  # separate budgets: the longer
    # Stock waits for every sub-group's swap-in and swap-out: serial, unless a sub-group's write (here 2 GB x 1/1000
    # at 1 GB/s = 2 ms) is short enough that the waiting direction keeps its budget.
    adam = 100_000_000 / tm.CPU_ADAM_ELEMS_PER_S_PER_CORE + _stock_host_s(100_000_000)  # stock's host copies too
    small = (100_000,) * 1000
    assert tm.step_time("stock", duplex_io=True, sub_group_numels=small, **kw).step_s == pytest.approx(2 + adam)
    one_group = tm.step_time("stock", duplex_io=True, sub_group_numels=(100_000_000,), **kw)
    assert one_group.step_s == pytest.approx(4 + adam)
    # Sub-group by sub-group: a parameter larger than sub_group_size is a sub-group of its own (an embedding), whose
    # 1 s of writes does not fit; the 1,000 small ones beside it still overlap.
    mixed = (50_000_000,) + (50_000,) * 1000
    assert tm.step_time("stock", duplex_io=True, sub_group_numels=mixed, **kw).step_s == pytest.approx(1 + 2 + adam)
    edge = tm.THROTTLE_OVERLAP_BURST_S
    groups = (int(edge * 5e7), 100_000_000 - int(edge * 5e7))  # the first one's write takes exactly the edge
    t = tm.step_time("stock", duplex_io=True, sub_group_numels=groups, **kw).step_s
    assert t == pytest.approx(edge + 2 * (2 - edge) + adam)  # the first overlaps, the second is serial


def test_stock_sub_groups_follow_deepspeeds_grouping():
    """The time model's sub-groups are DeepSpeed's: parameters in module order, a group closing once it reaches
    sub_group_size (stage3.py _create_fp16_sub_groups), so an embedding larger than it is a group of its own. They
    are the engine's own: tuned runs with memascend's sub_group_size whatever the job's knobs say (the plan's job
    carries stock's, DeepSpeed's default of one group)."""
    from memascend_cli.hardware import load_hardware_profile
    from memascend_cli.planner import zero
    from memascend_cli.planner.memory import JobSpec, estimate

    hw = load_hardware_profile("rtx4090-128g")
    m = load_model("bench-llama-136m").scaled(8)
    for knobs_of in ("tuned", "stock"):
        job = JobSpec(model=m, seq_len=512, micro_batch=1, dtype="fp32", deepspeed_version="0.19.8",
                      knobs=zero.resolve(knobs_of, model=m, world_size=1, elem_bytes=4))
        groups = estimate(job, hw, "tuned").sub_group_numels
        assert sum(groups) == m.num_params
        assert zero.MEMASCEND_SUB_GROUP_SIZE < m.vocab_size * m.hidden_size <= max(groups)
        assert len(groups) > 8  # every layer's matrices, not one group
    assert estimate(job, hw, "stock").sub_group_numels == (m.num_params,)


def test_memascend_prefetched_reads_overlap_the_compute_before_the_window_in_part():
    """Before the overlap window memascend's prefetched parameter reads run beside the layers' matmuls on the CPU
    accelerator: that part takes the longer of the two plus MEMASCEND_OVERLAP_SERIAL_SHARE of the shorter, not their
    sum (the AMD EPYC VM's bf16 rounds hid 1.4 s of matmuls behind 3.3 s of reads); in the window the fetches still
    block the layer that needs them."""
    def fb(params_bytes: int) -> float:
        t = tm.step_time("memascend", flops=4e9, traffic=_traffic(params=params_bytes), device=tm.cpu_device(1.0, "t"),
                         read_bytes_per_s=1e9, write_bytes_per_s=1e9, optimizer_elems=1, cpu_cores=2,
                         tokens_per_step=1, overlap_window=0.5, duplex_io=True)
        return t.phase_s[tm.PHASE_FORWARD_BACKWARD]

    # 4 s of matmuls, 2 s before the window. Forward and backward each read the parameters once (half the reads are
    # the window's own), so 1e9 B put 0.5 s of reads before the window and 0.5 s in it, whose 0.33 s of parameter
    # writes hide under the window's work.
    s = tm.MEMASCEND_OVERLAP_SERIAL_SHARE
    assert fb(10**9) - fb(0) == pytest.approx((s * 0.5) + 0.5 + s * 0.5)
    # Reads longer than the matmuls: 4 s before the window take 4 s plus the share of the 2 s of matmuls.
    assert fb(8 * 10**9) - fb(0) == pytest.approx((4 + s * 2 - 2) + 4 + s * 4)


def test_host_terms_follow_the_cpu_model_and_say_when_none_was_fitted():
    """A CPU whose model name starts with a HOST_CPUS entry is priced with that entry's terms; another CPU, or none
    known, with DEFAULT_HOST_CPU's, flagged as not fitted on it (the plan's note)."""
    assert tm.host_terms_of("Intel(R) Xeon(R) Processor") == ("Intel(R) Xeon(R)", True)
    assert tm.host_terms_of("AMD EPYC") == ("AMD EPYC", True)
    assert tm.host_terms_of("Apple M2") == (tm.DEFAULT_HOST_CPU, False)
    assert tm.host_terms_of(None) == (tm.DEFAULT_HOST_CPU, False)
    dev = tm.cpu_device(100.0, "t", "Apple M2")
    assert (dev.host_cpu, dev.host_cpu_fitted) == (tm.DEFAULT_HOST_CPU, False)
    doc = tm.time_document({}, dev, read_gbps=1.0, write_gbps=1.0, tokens=None)
    assert doc["device"]["host_terms"] == tm.DEFAULT_HOST_CPU and doc["device"]["host_terms_fitted"] is False
    # ZeRO-Offload's host work (every state in DRAM) on each CPU's own terms.
    elems = 10**8
    traffic = SsdTraffic({}, {}, params_per_rank=elems, dram_state_elems=elems)
    for cpu, model in (("AMD EPYC", "AMD EPYC"), ("Intel(R) Xeon(R)", "Intel(R) Xeon(R) Processor")):
        t = tm.step_time("tuned", flops=0, traffic=traffic, device=tm.cpu_device(1.0, "t", model),
                         read_bytes_per_s=1e9, write_bytes_per_s=1e9, optimizer_elems=elems, cpu_cores=2,
                         tokens_per_step=1)
        assert t.seconds["host copies"] == pytest.approx(
            elems * sum(tm.STOCK_CPU_OFFLOAD_HOST_NS_PER_ELEMENT[cpu].values()) * 1e-9)
