"""Placements priced (planner/placement.py): each placement's memory items against DeepSpeed's allocations, the SSD
bytes a DRAM tier removes, the time model's DRAM credit, and the recommendation on two machine profiles."""

from dataclasses import replace
from itertools import pairwise

import pytest

from memascend_cli.hardware import resolve_hardware
from memascend_cli.models import load_model
from memascend_cli.planner import placement as pl
from memascend_cli.planner import placement_choice as pc
from memascend_cli.planner import time as tm
from memascend_cli.planner import zero
from memascend_cli.planner.context import Context
from memascend_cli.planner.memory import JobSpec, estimate, estimate_all
from memascend_cli.units import GiB


def job(model: str, **kw) -> JobSpec:
    spec = load_model(model)
    knobs = zero.resolve("stock", model=spec, world_size=1, elem_bytes=2 if kw.get("dtype", "bf16") != "fp32" else 4)
    return JobSpec(model=spec, knobs=knobs, chunked_loss=True, **kw)


def priced(model: str, profile: str, *, gflops: float | None = None, hw=None, **kw) -> pl.PlacementPlan:
    j = job(model, **kw)
    hw = hw or resolve_hardware(profile, None)
    dev = tm.gpu_device(hw.gpu_name) if hw.num_gpus else tm.cpu_device(gflops, "test")
    return pl.price_placements(j, hw, estimate_all(j, hw), dev, read_gbps=hw.nvme_read_gbps,
                               write_gbps=hw.nvme_write_gbps)


def items(row: pl.Priced) -> dict[str, int]:
    return {i.key: i.bytes for i in row.est.items}


def test_gpu_placement_holds_16_bytes_per_parameter_on_the_gpu():
    """No offload, bf16: the partition (2 B), its gradient (2 B, stage3.py grad_partitions_flat_buffer on the GPU),
    fp32 master (4 B) and Adam moments (8 B): the ZeRO paper's 2 + 2 + 12 = 16 B; nothing on the SSD."""
    p = priced("llama-3.2-1b", "h100-80g-512g")
    row, ns = p.row("gpu", "stock"), 1_235_814_400
    got = items(row)
    assert (got["gpu/params_partition"], got["gpu/grad_partitions"], got["gpu/master_fp32"],
            got["gpu/adam_moments"]) == (2 * ns, 2 * ns, 4 * ns, 8 * ns)
    assert "gpu/grad_fp32_copies" not in got and not any(k.startswith("nvme/") for k in got)
    assert row.est.gpu_peak_bytes > 16 * ns and row.ssd_bytes == 0


def test_gpu_placement_needs_a_gpu():
    assert priced("qwen2.5-0.5b", "cpu-24g").row("gpu", "stock").est is None


def test_stock_dram_is_zero_offloads_host_items():
    """offload_optimizer cpu: fp32 master 4 + pinned fp32 gradients 4 + Adam moments 8 + the gradient flat buffer G per
    partition element in host memory; on the CPU accelerator the parameters (E) too; none of NVMe's buffers."""
    p = priced("qwen2.5-0.5b", "cpu-24g")
    row = p.row("dram", "stock")
    ns = Context(job("qwen2.5-0.5b"), resolve_hardware("cpu-24g", None), "tuned").ns
    got = items(row)
    assert (got["host/fp32_master"], got["host/fp32_gradients"], got["host/adam_moments"], got["host/grad_flat_buffer"],
            got["host/params_in_dram"]) == (4 * ns, 4 * ns, 8 * ns, 2 * ns, 2 * ns)
    assert not set(got) & pl.OFFLOAD_KEYS - {"host/grad_flat_buffer", "host/grad_buffer_init_copy"}
    assert row.ssd_bytes == 0 and row.est.traffic.dram_state_elems == ns


def test_stock_dram_keeps_the_parameters_on_a_gpu_that_holds_them():
    p = priced("llama-3.2-1b", "h100-80g-512g")
    row = p.row("dram", "stock")
    assert "gpu/params_partition" in items(row) and "host/params_in_dram" not in items(row)
    assert row.config == "offload_optimizer cpu, parameters on the GPU"


def test_memascends_dram_row_keeps_the_parameters_where_zero_offload_does():
    """Its parameters resident (no offload_param on the CPU accelerator, as stock's dram row): no swapper pool, no
    fetch; the tier holds the optimizer chunks and gradients. Records of runs that held the parameters in the tier
    (offload_param nvme) are priced as they ran: the pool and the fetches back."""
    hw, jb = resolve_hardware("cpu-24g", None), job("qwen2.5-0.5b")
    p = priced("qwen2.5-0.5b", "cpu-24g")
    row, before, stock = p.row("dram", "memascend"), pl.memascend_dram_row(jb, hw, pl.PARAMS_FROM_TIER), \
        p.row("dram", "stock")
    got, old = items(row), items(before)
    assert row.devices == ("none", "nvme") and before.devices == ("nvme", "nvme")
    assert got["host/params_in_dram"] == old["host/dram_tier/params"] == before.tier["params_bytes"] > 0
    assert "host/param_swap_pool" not in got and old["host/param_swap_pool"] > 0
    assert row.tier["params_bytes"] == 0 and row.tier["full_bytes"] == before.tier["full_bytes"]
    assert row.est.node_host_peak_bytes < before.est.node_host_peak_bytes < stock.est.node_host_peak_bytes
    assert row.est.traffic.dram_fetch_bytes == 0 < before.est.traffic.dram_fetch_bytes
    assert row.ssd_bytes == before.ssd_bytes == 0


def test_memascends_dram_row_on_a_gpu_keeps_the_parameters_there_when_it_holds_them():
    small = priced("llama-3.2-1b", "h100-80g-512g").row("dram", "memascend")
    assert small.devices == ("none", "nvme") and "gpu/params_partition" in items(small)
    assert "host/params_in_dram" not in items(small) and small.est.traffic.dram_fetch_bytes == 0
    hw = resolve_hardware("h100-80g-512g", None)
    big = pl.memascend_dram_row(job("qwen2.5-72b"), hw)
    c = Context(job("qwen2.5-72b"), hw, "memascend")
    assert big.devices == ("cpu", "nvme") and "host/params_in_dram" in items(big)
    assert big.est.traffic.dram_fetch_bytes == 2 * c.E * c.ns  # forward and backward, as stock's offload_param cpu


def test_memascend_tier_fills_parameters_then_gradients_then_whole_sub_groups():
    """The planner prices the engine's rule (planner.dram_tier) on the job's own partitions and chunks: what it holds
    at a budget is what the engine holds (memascend_engine.dram_tier, tests/engine/test_dram_tier_deepspeed.py).
    With the parameters holding the master (bf16: its upper halves) and the overlap, each partition's unit is its
    shadow too: the tier then holds the parameters twice. The job clips (DeepSpeed's default 1.0): the overlap keeps
    the gradients for a redo, so they reach the SSD, written and never read back, and come before the sub-groups."""
    hw, jb = resolve_hardware("cpu-24g", None), job("qwen2.5-0.5b")
    shadowed = pl.memascend_tier(jb, hw, estimate(jb, hw, "memascend"), None)[0]["params_bytes"]
    jb = replace(jb, params_hold_master=False)
    ms = estimate(jb, hw, "memascend")
    c = Context(jb, hw, "memascend")
    swapped = [n for n in c.part.partition_numels if n >= c.min_swap_numel]
    params = c.E * sum(swapped)
    tier, _, _ = pl.memascend_tier(jb, hw, ms, params // 2)
    assert params // 2 - c.E * max(swapped) < tier["params_bytes"] <= params // 2
    assert 0 < tier["params_share"] < 1  # what the partitions leave may go to small gradients and sub-groups
    assert tier["params_bytes"] + tier["optimizer_states_bytes"] + tier["gradients_bytes"] <= params // 2
    full = pl.memascend_tier(jb, hw, ms, None)[0]
    states, grads = full["optimizer_states_bytes"], full["gradients_bytes"]
    assert full["params_bytes"] == params and full["optimizer_states_share"] == full["gradients_share"] == 1
    assert shadowed == 2 * params and grads == c.G * sum(c.part.partition_numels)
    tier, _, traffic = pl.memascend_tier(jb, hw, ms, params + grads // 2)
    assert tier["params_bytes"] == params and 0.4 < tier["gradients_share"] <= 0.5
    assert tier["optimizer_states_bytes"] < grads // 10  # only what the gradients leave, to small sub-groups
    assert traffic.write_bytes["gradients"] < ms.traffic.write_bytes["gradients"] * 0.6
    assert traffic.read_bytes["optimizer_states"] > ms.traffic.read_bytes["optimizer_states"] * 0.9
    tier, _, traffic = pl.memascend_tier(jb, hw, ms, params + grads + states // 3)
    chunk = max(ms.sub_group_numels) * states // sum(ms.sub_group_numels)
    assert tier["params_bytes"] == params and tier["gradients_bytes"] == grads
    assert states // 3 - chunk < tier["optimizer_states_bytes"] <= states // 3
    assert traffic.read_bytes["params"] == 0 and traffic.write_bytes["gradients"] == 0
    # A record of the engine before planner.dram_tier.ORDER: the sub-groups before the gradients.
    old, _, _ = pl.memascend_tier(jb, hw, ms, params + states // 3, gradients_first=False)
    assert old["params_bytes"] == params and states // 3 - chunk < old["optimizer_states_bytes"] <= states // 3
    assert old["gradients_share"] < 0.1


def test_the_tier_holds_both_generations_of_the_states_with_the_overlap():
    hw, jb = resolve_hardware("cpu-24g", None), job("qwen2.5-0.5b")
    on = pl.memascend_tier(jb, hw, estimate(jb, hw, "memascend"), None)[0]
    off_job = replace(jb, overlap_optimizer=False)
    off = pl.memascend_tier(off_job, hw, estimate(off_job, hw, "memascend"), None)[0]
    assert on["optimizer_states_bytes"] == 2 * off["optimizer_states_bytes"] > 0


def test_ssd_bytes_fall_as_the_dram_budget_grows():
    hw, jb = resolve_hardware("cpu-24g", None), job("qwen2.5-0.5b")
    ms = estimate(jb, hw, "memascend")
    full = pl.memascend_tier(jb, hw, ms, None)[0]["full_bytes"]
    moved = [pl.memascend_tier(jb, hw, ms, b)[2] for b in range(0, full + 1, full // 16)]
    totals = [t.read_total + t.write_total for t in moved]
    assert totals[0] == ms.traffic.read_total + ms.traffic.write_total
    assert all(a >= b for a, b in pairwise(totals)) and totals[0] > totals[8] > totals[-1]
    assert pl.memascend_tier(jb, hw, ms, full)[2].read_total == ms.traffic.read_bytes.get("activation_checkpoints", 0)


def test_tuned_and_memascend_get_no_max_in_cpu_credit_from_the_jobs_stock_knobs():
    """Stock's max_in_cpu 1e9 keeps a 0.5B model's parameters in DRAM (stage3.py 978-996): no parameter reads for
    stock; tuned and memascend run with max_in_cpu 0 (zero.memascend_knobs) and read every swapped partition."""
    hw = resolve_hardware("cpu-24g", None)
    ests = estimate_all(job("qwen2.5-0.5b"), hw)
    assert ests["stock"].traffic.read_bytes["params"] == 0 and ests["stock"].traffic.dram_fetch_bytes > 0
    for e in ("tuned", "memascend"):
        assert ests[e].traffic.read_bytes["params"] > 0 and ests[e].traffic.dram_fetch_bytes == 0
    times = tm.engine_times(job("qwen2.5-0.5b"), ests, tm.cpu_device(100, "test"), read_gbps=1, write_gbps=1,
                            cpu_cores=2)
    assert times["stock"].seconds["SSD read"] < times["tuned"].seconds["SSD read"]


def test_dram_resident_states_are_stepped_after_backward():
    """memascend's optimizer overlapped with backward: moving all states to DRAM takes their Adam out of the window
    and puts it after backward (no I/O to hide it behind)."""
    traffic = estimate(job("qwen2.5-0.5b"), resolve_hardware("cpu-24g", None), "memascend").traffic
    n = traffic.params_per_rank
    kw = {"flops": 1e12, "device": tm.cpu_device(100, "test"), "read_bytes_per_s": 1e9, "write_bytes_per_s": 1e9,
          "optimizer_elems": n, "cpu_cores": 2, "tokens_per_step": 2048, "overlap_window": 0.5}
    ssd = tm.step_time("memascend", traffic=traffic, **kw)
    dram = tm.step_time("memascend", traffic=replace(traffic, dram_state_elems=n), **kw)
    adam = n / (tm.CPU_ADAM_ELEMS_PER_S_PER_CORE * 2)
    assert dram.phase_s[tm.PHASE_OPTIMIZER] == pytest.approx(ssd.phase_s[tm.PHASE_OPTIMIZER] + adam, rel=0.05)


def test_parameters_from_dram_still_cross_pcie():
    traffic = estimate(job("qwen2.5-0.5b"), resolve_hardware("cpu-24g", None), "memascend").traffic
    kw = {"flops": 1e12, "device": tm.gpu_device("NVIDIA H100 80GB HBM3"), "read_bytes_per_s": 1e9,
          "write_bytes_per_s": 1e9, "optimizer_elems": traffic.params_per_rank, "cpu_cores": 8, "tokens_per_step": 2048}
    base = tm.step_time("memascend", traffic=traffic, **kw).seconds["PCIe"]
    more = tm.step_time("memascend", traffic=replace(traffic, dram_fetch_bytes=50 * 10 ** 9), **kw).seconds["PCIe"]
    assert more == pytest.approx(base + 50e9 / kw["device"].pcie_bytes_per_s)


def test_h100_recommends_the_gpu_for_a_1b_model_and_a_split_for_72b():
    small = priced("llama-3.2-1b", "h100-80g-512g")
    assert small.recommended.placement == "gpu" and small.recommended.ssd_bytes == 0
    assert small.recommended.binds == "compute" and "fits in GPU memory" in small.why
    big = priced("qwen2.5-72b", "h100-80g-512g")
    assert big.recommended.placement == "split" and big.recommended.fits
    assert big.row("gpu", "stock").binds == "GPU memory" and big.row("dram", "stock").binds == "DRAM"
    assert big.recommended.runnable and big.recommended.engine == "memascend"
    ssd = big.row("ssd", "memascend")
    assert big.recommended.time.step_s < ssd.time.step_s and big.recommended.ssd_bytes < ssd.ssd_bytes


def test_cpu_24g_recommends_dram_and_a_tight_cap_a_placement_with_the_ssd():
    p = priced("qwen2.5-0.5b", "cpu-24g", gflops=150)
    assert p.recommended.placement == "dram" and p.recommended.runnable and p.recommended.binds == "compute"
    assert p.headroom_bytes == max(pl.HEADROOM_MIN_BYTES, int(0.05 * resolve_hardware("cpu-24g", None)
                                                              .usable_dram_gib * GiB))
    # Without a compute rate the order of the placements decides (fewer SSD bytes first).
    assert priced("qwen2.5-0.5b", "cpu-24g").recommended.placement == "dram"
    capped = resolve_hardware("cpu-24g", None).under_dram_cap(6 * GiB)
    tight = priced("qwen2.5-0.5b", "cpu-24g", gflops=150, hw=capped)
    assert not tight.row("dram", "stock").fits and tight.row("dram", "stock").binds == "DRAM"
    assert tight.recommended.placement in ("split", "ssd") and tight.recommended.ssd_bytes > 0


def test_memascends_dram_row_runs_without_the_optimizer_overlap():
    """The dram row turns the overlap off (Priced.overlap_optimizer, handed to the engine by bench and train) and is
    priced so: its tier holds one generation of the optimizer states and no parameter shadows, the all-SSD row's
    tier both (the job's overlap)."""
    plan = priced("qwen2.5-0.5b", "cpu-24g", gflops=100.0)
    dram, ssd = plan.row("dram", "memascend"), plan.row("ssd", "memascend")
    assert dram.overlap_optimizer is False and ssd.overlap_optimizer is None
    hw, jb = resolve_hardware("cpu-24g", None), job("qwen2.5-0.5b")
    both = pl.memascend_tier(jb, hw, estimate(jb, hw, "memascend"), None)[0]
    assert dram.tier["optimizer_states_bytes"] * 2 == both["optimizer_states_bytes"]
    assert dram.tier["full_bytes"] < both["full_bytes"]


def test_memascends_dram_row_keeps_the_heap_between_layers():
    """The dram row's DRAM holds the job: its engine does not trim the heap after every layer (Priced.layer_trims,
    handed to the engine by bench and train); the other rows keep the engine's own setting."""
    plan = priced("qwen2.5-0.5b", "cpu-24g", gflops=100.0)
    assert plan.row("dram", "memascend").layer_trims is False
    assert {r.layer_trims for r in plan.rows if r.placement != "dram" or r.engine != "memascend"} == {None}


def test_memascends_dram_row_keeps_the_offloaded_checkpoints_in_dram():
    """The dram row prices the checkpoints in DRAM (no SSD byte) and says so to the engine (checkpoint_offload): the
    bench and train hand it on (a dram run that left them on the region wrote 8.4 MB a step, docs/bench/placements/
    bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-quiet/). Without offloaded checkpoints the row leaves them be."""
    plan = priced("qwen2.5-0.5b", "cpu-24g", gflops=100.0, checkpointing="offload")
    row = plan.row("dram", "memascend")
    assert row.checkpoint_offload == "dram" and row.ssd_bytes == 0
    ssd = plan.row("ssd", "memascend")
    assert ssd.checkpoint_offload is None and ssd.est.traffic.write_bytes.get("activation_checkpoints", 0) > 0
    assert priced("qwen2.5-0.5b", "cpu-24g", gflops=100.0, checkpointing="full").row(
        "dram", "memascend").checkpoint_offload is None


def half_the_parameters_in_dram(model: str, profile: str = "cpu-24g"):
    """`profile` under a DRAM cap where stock's split keeps about half of `model`'s parameter partitions in DRAM:
    tuned's all-SSD peak and half the partitions' bytes, with the placement headroom on top."""
    base, j = resolve_hardware(profile, None), job(model)
    c = Context(j, base, "tuned")
    need = estimate(j, base, "tuned").node_host_peak_bytes + c.ns * c.E // 2
    return base.under_dram_cap(max(int(need / (1 - pl.HEADROOM_FRACTION)), need + pl.HEADROOM_MIN_BYTES))


def test_stock_split_runs_without_prefetch_where_parameters_stay_on_nvme():
    """DeepSpeed's NVMe look-ahead queues a parameter twice with a partial max_in_cpu (SPLIT_PREFETCH_BUG): stock's
    split runs with stage3_prefetch_bucket_size 0, in its estimate and in the config a run writes, its fetches priced
    as blocking their modules (forward + backward = compute + SSD + host copies, not tuned's overlap), and the plan
    says why."""
    hw, j, dev = half_the_parameters_in_dram("qwen2.5-0.5b"), job("qwen2.5-0.5b"), tm.cpu_device(100.0, "test")
    row = pl.price_placements(j, hw, estimate_all(j, hw), dev, read_gbps=0.4, write_gbps=0.4).row("split", "stock")
    assert row.fits and 0 < row.max_in_cpu < Context(j, hw, "tuned").ns
    assert row.prefetch_bucket_size == 0 and row.config.endswith("no prefetch")
    assert "partitioned_param_swapper.py:185-186" in row.note and "stage3_prefetch_bucket_size 0" in row.note
    times = tm.engine_times(j, {"stock": row.est, "tuned": row.est}, dev, read_gbps=0.4, write_gbps=0.4,
                            cpu_cores=hw.cpu_cores)
    fb = tm.PHASE_FORWARD_BACKWARD
    assert row.time.phase_s[fb] == times["stock"].phase_s[fb] > times["tuned"].phase_s[fb]
    choice = pc.Choice("tuned", row, True, "test")
    s = choice.settings(zero.resolve("tuned", model=load_model("qwen2.5-0.5b"), world_size=1, elem_bytes=2))
    z = zero.zero_section(s, "/ssd", param_device="nvme", optimizer_device="nvme")
    assert z["stage3_prefetch_bucket_size"] == 0 and z["offload_param"]["max_in_cpu"] == row.max_in_cpu
    assert choice.to_dict()["prefetch_bucket_size"] == 0


def test_stock_split_keeps_prefetch_when_dram_holds_every_parameter_and_is_not_offered_on_a_gpu():
    """Nothing on NVMe: no look-ahead over NVMe partitions, prefetch stays. On a GPU node a partial split would run
    without prefetch, which the GPU time model (fetches overlapped with compute) cannot price: not offered, and why."""
    row = priced("qwen2.5-0.5b", "cpu-24g", gflops=100.0).row("split", "stock")
    assert row.fits and row.max_in_cpu == Context(job("qwen2.5-0.5b"), resolve_hardware("cpu-24g", None), "tuned").ns
    assert row.prefetch_bucket_size is None and "prefetch" not in row.config and not row.note
    capped = half_the_parameters_in_dram("qwen2.5-72b", "h100-80g-512g")
    gpu = priced("qwen2.5-72b", "h100-80g-512g", hw=capped).row("split", "stock")
    assert gpu.est is None and gpu.note.startswith("not offered") and "partitioned_param_swapper.py:185" in gpu.note
