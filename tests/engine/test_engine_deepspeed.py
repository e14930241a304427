"""The engine inside real DeepSpeed ZeRO-3 on the CPU accelerator (params + optimizer on NVMe).

Each run is a fresh subprocess of ``memascend_engine.parity`` (tiny-llama: hidden 512,
intermediate 1024, vocab 1024, 2 layers, so partitions exceed 1 MiB and really swap), with
DS_ACCELERATOR=cpu and the prebuilt ops in TORCH_EXTENSIONS_DIR. Stock and engine runs share the
seed, the data and every knob except what the engine must change; the stock config already uses
max_in_cpu 0 and stage3_max_reuse_distance 0 (the engine forces both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from test_engine_direct_nvme import make_region

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PARITY = str(REPO / "engine" / "parity.py")
STEPS = 5


def _env() -> dict:
    env = dict(os.environ)
    env["DS_ACCELERATOR"] = "cpu"
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".torch_ext"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def run(tmp_path: Path, name: str, *args: str, timeout: int = 900) -> dict:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-m", "memascend_engine.parity", "--steps", str(STEPS), "--out", str(out),
                           *args], env=_env(), capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    """Stock DeepSpeed losses, fp32 and bf16 (computed once per module)."""
    d = tmp_path_factory.mktemp("stock")
    res = {}
    for dtype in ("fp32", "bf16"):
        r = run(d, f"stock-{dtype}", "--mode", "stock", "--dtype", dtype, "--nvme-dir", str(d / f"swap-{dtype}"))
        assert r["swap_files"] > 0, "the stock run must really swap (else parity proves nothing)"
        res[dtype] = r
    return res


@pytest.fixture(scope="module")
def clip83(tmp_path_factory):
    """fp32 with clipping at 8.3, inside the tiny model's gradient norms (7.9-8.7): stock, and the engine with and
    without the overlap (computed once per module: the overlap and bf16-moment tests compare against them)."""
    d = tmp_path_factory.mktemp("clip83")
    for sub in "ab":
        (d / sub).mkdir()
    common = ("--dtype", "fp32", "--clip", "8.3")
    return {"stock": run(d, "stock-clip", "--mode", "stock", *common, "--nvme-dir", str(d / "swap")),
            "on": run(d, "engine-overlap", "--mode", "engine", *common, "--region", make_region(d / "a", "512MiB")),
            "off": run(d, "engine-no-overlap", "--mode", "engine", *common, "--region",
                       make_region(d / "b", "512MiB"), "--off", "overlap_optimizer")}


def _assert_went_through_region(r: dict) -> None:
    s = r["stats"]
    assert s["swap_files_created"] == 0 and r["swap_files"] == 0
    assert s["bytes_written"] > 0 and s["bytes_read"] > 0 and s["requests"] > 0
    io = s["region_io"]
    # The native engine's own counters agree with the handle's: nothing bypassed it.
    assert io["engine_bytes_written"] >= s["bytes_written"] - io["bounce_bytes"]
    assert io["engine_bytes_read"] >= s["bytes_read"] - io["bounce_bytes"]
    assert io["subregion_offset_bytes"] <= io["extents_lowest_offset_bytes"]
    assert io["extents_highest_end_bytes"] <= io["subregion_end_bytes"]


def test_fp32_losses_equal_stock_exactly(tmp_path, stock):
    r = run(tmp_path, "engine-fp32", "--mode", "engine", "--dtype", "fp32", "--region", make_region(tmp_path, "512MiB"),
            "--overflow-probe", "--save-checkpoint", str(tmp_path / "ckpt"))
    assert len(r["losses"]) == STEPS
    assert r["losses"] == stock["fp32"]["losses"]
    _assert_went_through_region(r)
    s = r["stats"]
    # Params and optimizer states were really swapped: every step reads more than the model's fp32 bytes.
    assert s["bytes_read"] > STEPS * 6_294_016 * 4
    assert s["param_pool_plan"] == "attn_kv+attn_o+attn_q 8x262,144, mlp+vocab 7x524,288 x 4 B"
    assert s["param_pool_bytes"] == 8 * 2**20 + 7 * 2**21
    # The bounded engine: no DeepSpeed optimizer pool, no gradient flat buffer, no P2 buffer; bounded windows instead.
    assert s["optimizer_pool_bytes"] == 0 and s["partitioned_swap_buffer_bytes"] == 0
    assert s["counters"]["grad_buffer_in_place"] == 0 and s["counters"]["adam_states_in_place"] == 0
    b = s["bounded"]
    assert b["chunks"] >= 1 and b["optimizer_window_bytes"] > 0 and b["gradient_window_bytes"] > 0
    io = s["bounded_io"]
    # fp32 gradients written once per step and read once by the optimizer: 4 B/param each way (plus the probe's
    # read of the first parameter's gradient, the 1024 x 512 embedding).
    assert io["gradient_write_bytes"] == STEPS * 6_294_016 * 4
    assert io["gradient_read_bytes"] == io["gradient_write_bytes"] + 1024 * 512 * 4
    assert s["counters"]["pool_overflow_allocations"] == 0
    assert s["counters"]["malloc_trims"] == STEPS
    assert s["counters"]["mmap_threshold_bytes"] == 1 << 20  # the allocator policy is on
    # The per-partition overflow check on a real gradient read back from the region, with torch's answer.
    assert r["overflow_probe"] == {"clean": False, "inf": True, "nan": True, "restored": False, "reference_clean": False}
    assert s["counters"]["overflow_scans"] == 4
    # DeepSpeed's checkpoint API writes the region's optimizer state into the checkpoint (offloaded_tensors/, in
    # DeepSpeed's swap-file names; test_ds_checkpoint_api.py resumes from it exactly).
    assert r["save_checkpoint_error"] is None and r["checkpoint_swap_files"] > 0


def test_bf16_losses_equal_stock(tmp_path, stock):
    r = run(tmp_path, "engine-bf16", "--mode", "engine", "--dtype", "bf16", "--region", make_region(tmp_path, "512MiB"))
    assert r["losses"] == stock["bf16"]["losses"]
    # The per-parameter norms of bf16 gradients are taken on a worker thread (bounded_stage3._NormWorker): same bits.
    assert r["grad_norms"] == stock["bf16"]["grad_norms"]
    on_worker = r["stats"]["counters"]["norms_on_worker"]
    assert on_worker > 0 and on_worker % STEPS == 0  # the same parameters every step
    _assert_went_through_region(r)
    # bf16 gradients go to the SSD in bf16: 2 B/param written and read per step.
    assert r["stats"]["bounded_io"]["gradient_write_bytes"] == STEPS * 6_294_016 * 2


def test_tensors_split_across_chunks_still_equal_stock(tmp_path):
    """Sub-groups (and chunks) of 262,144 elements split the embedding, lm_head and MLP matrices: every chunk of a
    sub-group sees the bias correction its first chunk set (the Adam op's beta^t is a running product, untouched by
    a second call at the same step), so the losses still equal stock's bit for bit. From step 4 on, recomputing
    beta2^t as pow(beta2, t - 1) * beta2 instead differs from the running product in float and showed here."""
    kw = ("--dtype", "fp32", "--sub-group-size", "262144")
    ref = run(tmp_path, "stock-split", "--mode", "stock", *kw, "--nvme-dir", str(tmp_path / "swap"))
    r = run(tmp_path, "engine-split", "--mode", "engine", *kw, "--region", make_region(tmp_path, "512MiB"))
    assert r["losses"] == ref["losses"]
    assert r["stats"]["bounded"]["chunks"] > 2 * 9  # 2 layers x 9 tensors + vocab matrices, the big ones split


def test_fp16_overflow_skips_exactly_like_stock(tmp_path):
    """fp16 from loss scale 2**20: the first steps overflow and are skipped; the per-partition scan as gradients
    stream gives the same loss-scale sequence, skipped steps and losses as stock's check of the whole buffer."""
    kw = ("--dtype", "fp16", "--force-cpu-fp16", "--initial-scale-power", "20", "--steps", "6")
    ref = run(tmp_path, "stock-fp16", "--mode", "stock", *kw, "--nvme-dir", str(tmp_path / "swap"))
    r = run(tmp_path, "engine-fp16", "--mode", "engine", *kw, "--region", make_region(tmp_path, "512MiB"))
    assert ref["skipped_steps"] >= 1 and ref["loss_scales"][0] > ref["loss_scales"][-1]
    assert (r["losses"], r["loss_scales"], r["skipped_steps"]) == (ref["losses"], ref["loss_scales"],
                                                                  ref["skipped_steps"])
    assert r["stats"]["counters"]["overflow_scans"] > 0
    # The optimizer overlapped with backward: an overflowing step's speculative parameters are rolled back.
    assert 1 <= r["stats"]["overlap"]["steps_rolled_back"] <= ref["skipped_steps"]


@pytest.mark.parametrize("off", ["streaming", "pinned", "adaptive_pool", "fused_overflow", "bounded_norm",
                                 "malloc_trim", "adam_in_place"])
def test_each_technique_switches_off(tmp_path, stock, off):
    r = run(tmp_path, f"off-{off}", "--mode", "engine", "--dtype", "fp32", "--region", make_region(tmp_path, "512MiB"),
            "--off", off, "--overflow-probe")
    assert r["losses"] == stock["fp32"]["losses"]
    _assert_went_through_region(r)
    s = r["stats"]
    assert s["options"][off] is False
    assert ("bounded" in s) == (off != "streaming")
    if off == "streaming":
        # DeepSpeed's own gradient buffer and optimizer pool, with the engine's in-place techniques on them.
        assert s["optimizer_pool_bytes"] > 0 and s["counters"]["grad_buffer_in_place"] == 1
        assert s["counters"]["adam_states_in_place"] >= 1 and s["region_io"]["zero_fill_reads"] >= 2
    if off == "adaptive_pool":
        assert s["param_pool_plan"] is None and s["param_pool_bytes"] == 0
    if off == "fused_overflow":
        assert s["counters"]["overflow_scans"] == 0 and r["overflow_probe"]["inf"] is True
    if off == "malloc_trim":
        assert s["counters"]["malloc_trims"] == 0 and s["counters"]["mmap_threshold_bytes"] == 0
    if off == "pinned":
        assert s["pinned"]["locked_bytes"] == 0 and s["counters"]["grad_buffer_in_place"] == 0
    if off == "adam_in_place":
        assert s["counters"]["adam_states_in_place"] == 0


def test_direct_nvme_off_uses_swap_files(tmp_path, stock):
    r = run(tmp_path, "off-direct", "--mode", "engine", "--dtype", "fp32", "--off", "direct_nvme",
            "--nvme-dir", str(tmp_path / "swap"))
    assert r["losses"] == stock["fp32"]["losses"]
    assert r["swap_files"] > 0 and r["stats"]["bytes_written"] == 0


@pytest.mark.parametrize("where", ["ssd", "dram"])
def test_offloaded_checkpointing_matches_exactly(tmp_path, stock, where):
    r = run(tmp_path, f"ckpt-{where}", "--mode", "engine", "--dtype", "fp32", "--region",
            make_region(tmp_path, "512MiB"), "--checkpointing", "--checkpoint-offload", where)
    c = r["stats"]["checkpointing"]
    assert c["layer_calls"] >= 2 * STEPS and c["on_ssd"] == (where == "ssd")
    assert r["losses"] == stock["fp32"]["losses"]  # recomputation is exact on CPU
    # The allocator policy with checkpointing: heap blocks up to 32 MiB, trimmed after each layer's forward and after
    # its recompute + backward.
    counters = r["stats"]["counters"]
    assert counters["mmap_threshold_bytes"] == 32 << 20
    assert counters["layer_trims"] == 2 * c["layer_calls"]
    if where == "ssd":
        io = r["stats"]["bounded_io"]
        assert io["checkpoint_write_bytes"] == io["checkpoint_read_bytes"] > 0


def test_chunked_loss_under_zero3_equals_transformers_loss_and_the_engine_stays_exact(tmp_path, stock):
    # 3 tokens of tiny-llama's 1,024-entry vocabulary per chunk: 64 tokens a step make 22 chunks, the last of 1. The
    # lm_head weight is gathered by ZeRO-3 for the one swapped-forward call and gets its gradient from it.
    chunk = str(3 * 1024 * 4)
    plain = run(tmp_path, "stock-chunked", "--mode", "stock", "--dtype", "fp32", "--chunked-loss-bytes", chunk,
                "--nvme-dir", str(tmp_path / "swap"))
    ours = run(tmp_path, "engine-chunked", "--mode", "engine", "--dtype", "fp32", "--chunked-loss-bytes", chunk,
               "--region", make_region(tmp_path, "512MiB"), "--checkpointing")
    assert ours["losses"] == plain["losses"]  # the engine is exact with the chunked loss too
    want = stock["fp32"]["losses"]
    assert plain["losses"] != want  # another summation order ...
    # ... of the same loss: fp32 rounding, compounded over the steps' updates
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(plain["losses"], want)), (plain["losses"], want)


def test_two_ranks_each_in_their_own_subregion(tmp_path, stock):
    region = make_region(tmp_path, "512MiB", ranks=2)
    out = tmp_path / "two.json"
    env = _env()
    proc = subprocess.run([sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port",
                           str(29600 + os.getpid() % 300), PARITY, "--mode", "engine", "--dtype", "fp32",
                           "--steps", str(STEPS), "--region", region, "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    from memascend_cli.ssd import region as region_mod

    header = region_mod.read_header(region)
    results = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in (0, 1)]
    for r, res in enumerate(results):
        assert res["world_size"] == 2 and res["stats"]["rank"] == r
        _assert_went_through_region(res)
        io = res["stats"]["region_io"]
        sub = header.subregion(r)
        assert (io["subregion_offset_bytes"], io["subregion_end_bytes"]) == (sub.offset_bytes, sub.end_bytes)
        # Data really landed in each rank's own bytes of the region file.
        with open(region, "rb") as f:
            f.seek(io["extents_lowest_offset_bytes"])
            assert any(f.read(1 << 20))
    # Data parallelism over the same global batch size per rank: both ranks see the same loss.
    assert results[0]["losses"] == results[1]["losses"]
    assert len(results[0]["losses"]) == STEPS


def test_gradient_accumulation_in_the_dram_window_is_exact_and_writes_once_per_step(tmp_path):
    """Four micro-batches per step: stock accumulates in its fp32 buffer, the engine through the SSD (window off) or
    in its DRAM window (each partition written once, at the boundary). fp32: all three bit-identical."""
    ga, steps = 4, 2  # 8 micro-batches a run: the SSD path reads back and rewrites 3 times a step
    for d in "abc":
        (tmp_path / d).mkdir()
    common = ("--dtype", "fp32", "--grad-accum", str(ga), "--micro-batch", "1", "--steps", str(steps))
    base = run(tmp_path, "stock-ga", "--mode", "stock", *common, "--nvme-dir", str(tmp_path / "swap"))
    # The overlap off: its own test counts what it holds for a redo.
    held = run(tmp_path, "engine-ga-window", "--mode", "engine", *common, "--region",
               make_region(tmp_path / "a", "512MiB"), "--accumulation-bytes", str(1 << 30), "--off", "overlap_optimizer")
    ssd = run(tmp_path, "engine-ga-ssd", "--mode", "engine", *common, "--region",
              make_region(tmp_path / "b", "512MiB"), "--accumulation-bytes", str(1 << 30), "--off", "accumulate_in_dram",
              "--off", "overlap_optimizer")
    overlapped = run(tmp_path, "engine-ga-overlap", "--mode", "engine", *common, "--region",
                     make_region(tmp_path / "c", "512MiB"), "--accumulation-bytes", str(1 << 30), "--clip", "100")
    assert len(base["losses"]) == ga * steps
    assert held["losses"] == base["losses"] and ssd["losses"] == base["losses"]
    # With the overlap the last micro-batch's sums are stepped as they complete: still exact, nothing read back.
    ref = run(tmp_path, "stock-ga-clip", "--mode", "stock", *common, "--clip", "100", "--nvme-dir", str(tmp_path / "s2"))
    assert overlapped["losses"] == ref["losses"] and overlapped["stats"]["overlap"]["steps_committed"] == steps
    assert overlapped["stats"]["bounded_io"]["gradient_read_bytes"] == 0
    io_held, io_ssd = held["stats"]["bounded_io"], ssd["stats"]["bounded_io"]
    assert held["stats"]["bounded"]["accumulation_window_bytes"] == 1 << 30
    assert ssd["stats"]["bounded"]["accumulation_window_bytes"] == 0 and io_ssd["gradient_held_bytes"] == 0
    # Through the SSD: every micro-batch writes every partition, later ones read it first; the window: written once.
    assert io_ssd["gradient_write_bytes"] == ga * io_held["gradient_write_bytes"]
    assert io_held["gradient_held_bytes"] == (ga - 1) * io_held["gradient_write_bytes"]
    assert io_held["gradient_read_bytes"] < io_ssd["gradient_read_bytes"]


def test_optimizer_overlapped_with_backward_commits_redoes_and_stays_exact(tmp_path, clip83):
    """fp32 with clipping at 8.3, inside the tiny model's gradient norms (7.9-8.7): steps under it commit the
    speculative update made during backward, steps over it are redone from the old states, and after a clipped step
    the next one does not speculate. Losses and norms equal stock's and the engine's without the overlap, bit for
    bit; the committed steps read no gradient back. With a DRAM window the gradients kept for a redo stay in memory
    and reach the SSD only when a step is redone or not speculated."""
    for d in "cd":
        (tmp_path / d).mkdir()
    common = ("--dtype", "fp32", "--clip", "8.3")
    ref, on, off = clip83["stock"], clip83["on"], clip83["off"]
    win = run(tmp_path, "engine-overlap-window", "--mode", "engine", *common, "--region",
              make_region(tmp_path / "c", "512MiB"), "--accumulation-bytes", str(1 << 30))
    assert on["losses"] == off["losses"] == win["losses"] == ref["losses"]
    assert on["grad_norms"] == off["grad_norms"] == win["grad_norms"] == ref["grad_norms"]
    clipped = [n > 8.3 for n in ref["grad_norms"]]
    assert any(clipped) and not all(clipped), ref["grad_norms"]
    o = on["stats"]["overlap"]
    assert o["steps_committed"] >= 1 and o["steps_redone"] >= 1
    assert o["steps_committed"] + o["steps_redone"] + o["steps_not_speculated"] == STEPS
    assert o["chunks_committed"] == o["steps_committed"] * on["stats"]["bounded"]["chunks"]
    assert off["stats"].get("overlap") is None
    io_on, io_off = on["stats"]["bounded_io"], off["stats"]["bounded_io"]
    # fp32: a speculating step takes masters from the partitions backward fetched instead of the SSD, the same
    # values: what it copied is exactly what it did not read.
    copy = run(tmp_path, "engine-overlap-no-master-copy", "--mode", "engine", *common, "--region",
               make_region(tmp_path / "d", "512MiB"), "--off", "master_from_params")
    assert copy["losses"] == on["losses"] and copy["stats"]["overlap"]["master_bytes_from_memory"] == 0
    master_per_step = io_off["optimizer_read_bytes"] // (1 + 3 * (STEPS - 1))  # 4 B/param; moments from step 2
    assert 0 < o["master_bytes_from_memory"] <= (o["steps_committed"] + o["steps_redone"]) * master_per_step
    assert io_on["optimizer_read_bytes"] == (copy["stats"]["bounded_io"]["optimizer_read_bytes"]
                                             - o["master_bytes_from_memory"])
    # Clipping is on, so every gradient still goes to the SSD (for a redo); committed steps read none back.
    assert io_on["gradient_write_bytes"] == io_off["gradient_write_bytes"]
    per_step = io_off["gradient_read_bytes"] // STEPS
    assert io_on["gradient_read_bytes"] == (STEPS - o["steps_committed"]) * per_step
    io_win = win["stats"]["bounded_io"]
    assert win["stats"]["overlap"] == o
    assert io_win["gradient_write_bytes"] == io_win["gradient_read_bytes"] == (STEPS - o["steps_committed"]) * per_step
    assert io_win["gradient_held_bytes"] == (o["steps_committed"] + o["steps_redone"]) * per_step


def test_overlap_without_clipping_keeps_gradients_off_the_ssd(tmp_path):
    """bf16 with clipping off: every step commits and no gradient byte touches the SSD; the losses equal stock's
    without clipping, with chunks read ahead in the last step's order and stepped beside backward."""
    ref = run(tmp_path, "stock-noclip", "--mode", "stock", "--dtype", "bf16", "--clip", "0",
              "--nvme-dir", str(tmp_path / "swap"))
    r = run(tmp_path, "engine-noclip", "--mode", "engine", "--dtype", "bf16", "--clip", "0",
            "--region", make_region(tmp_path, "512MiB"))
    assert r["losses"] == ref["losses"]
    assert r["stats"]["overlap"]["steps_committed"] == STEPS
    # From the second step on, chunks are read in the order the step before took them, ahead of their gradients.
    assert r["stats"]["overlap"]["chunks_read_ahead"] > 0
    # Every committed chunk was stepped on the step thread while backward went on, with stock's losses.
    o = r["stats"]["overlap"]
    assert o["chunks_stepped_on_thread"] == o["chunks_committed"] > 0
    io = r["stats"]["bounded_io"]
    assert io["gradient_write_bytes"] == 0 and io["gradient_read_bytes"] == 0
    # bf16 parameters hold the master's upper halves (engine/optimizer_pipeline.py split): 2 of its 4 bytes come from
    # the partitions backward fetched, the residual from the region.
    assert r["stats"]["overlap"]["master_bytes_from_memory"] == STEPS * 6_294_016 * 2


def test_fp32_overlap_takes_every_master_from_the_partitions_backward_fetched(tmp_path):
    """fp32, clipping off: DeepSpeed drops a layer's partitions before its gradients are reduced; the swapper keeps
    them until each chunk has copied its master (engine/ds_internals/swapper.py _keeps_for_master), so every committed
    step reads no master from the SSD, no chunk falls back and nothing is evicted or allocated beyond the pool."""
    r = run(tmp_path, "engine-fp32-noclip", "--mode", "engine", "--dtype", "fp32", "--clip", "0",
            "--region", make_region(tmp_path, "512MiB"))
    o, counters = r["stats"]["overlap"], r["stats"]["counters"]
    assert o["steps_committed"] == STEPS and o["chunks_fallback"] == 0
    assert o["master_bytes_from_memory"] == STEPS * 6_294_016 * 4
    assert counters["master_partitions_evicted"] == 0 and counters["pool_overflow_allocations"] == 0
    assert r["stats"]["bounded_io"]["gradient_write_bytes"] == 0


def test_fp32_parameters_hold_the_master_and_an_invalid_norm_rolls_back_exactly(tmp_path):
    """fp32 without clipping, a NaN loss at step 3: stock skips that step. The engine speculates every step into
    shadow parameter partitions (EngineOptions.params_hold_master) and its extents are exchanged at each commit; the
    NaN step's speculation is dropped with the current partitions untouched, and every loss equals stock's. With the
    master written beside the parameters instead, the same losses for 4 B per element and step more written."""
    for d in "ab":
        (tmp_path / d).mkdir()
    kw = ("--dtype", "fp32", "--clip", "0", "--nan-step", "2")
    ref = run(tmp_path, "stock-nan", "--mode", "stock", *kw, "--nvme-dir", str(tmp_path / "swap"))
    on = run(tmp_path, "engine-nan", "--mode", "engine", *kw, "--region", make_region(tmp_path / "a", "512MiB"))
    off = run(tmp_path, "engine-nan-master", "--mode", "engine", *kw, "--off", "params_hold_master",
              "--region", make_region(tmp_path / "b", "512MiB"))
    assert ref["skipped_steps"] == on["skipped_steps"] == off["skipped_steps"] == 1
    assert on["losses"] == off["losses"] == ref["losses"]
    for r in (on, off):
        o = r["stats"]["overlap"]
        assert (o["steps_committed"], o["steps_rolled_back"]) == (STEPS - 1, 1)
    io_on, io_off = on["stats"]["bounded_io"], off["stats"]["bounded_io"]
    # Per element: moments 8 B per step (the NaN step's speculative ones too) against 4 B more of master per step
    # and initialize()'s.
    n = (io_off["optimizer_write_bytes"] - io_on["optimizer_write_bytes"]) // (4 * (STEPS + 1))
    assert n > 0 and io_on["optimizer_write_bytes"] == 8 * STEPS * n


def test_bf16_moments_halve_the_moment_bytes_and_round_the_same_on_every_path(tmp_path, clip83):
    """Adam's moments on the SSD in bf16 (EngineOptions.optimizer_moments): 8 B per element of master + moments
    each way instead of 12; the losses stay within 1e-3 of fp32 moments over 5 fp32 steps; and with the stochastic
    rounding seeded per chunk and step (not per path), the optimizer overlapped with backward, committing or redoing,
    gives bit for bit the losses of the same engine without the overlap."""
    for d in "bc":
        (tmp_path / d).mkdir()
    common = ("--mode", "engine", "--dtype", "fp32", "--clip", "8.3")
    fp32 = clip83["on"]  # the same engine run with fp32 moments
    bf16 = run(tmp_path, "bf16-moments", *common, "--optimizer-moments", "bf16",
               "--region", make_region(tmp_path / "b", "512MiB"))
    plain = run(tmp_path, "bf16-moments-no-overlap", *common, "--optimizer-moments", "bf16", "--off",
                "overlap_optimizer", "--region", make_region(tmp_path / "c", "512MiB"))
    assert bf16["losses"] == plain["losses"] and bf16["grad_norms"] == plain["grad_norms"]
    assert bf16["losses"] != fp32["losses"]  # the moments really are rounded
    assert bf16["losses"] == pytest.approx(fp32["losses"], rel=1e-3)
    o = bf16["stats"]["overlap"]
    assert o["steps_committed"] >= 1 and o["steps_redone"] >= 1  # both paths taken
    io32, io16 = fp32["stats"]["bounded_io"], plain["stats"]["bounded_io"]
    # Same traffic shape without the overlap's speculative writes: master 4 B + moments 2 x 2 B instead of 2 x 4 B.
    io32_plain = clip83["off"]["stats"]["bounded_io"]
    # Per element: the first step reads only the master (its moments start as zeros). fp32 parameters are the
    # master (EngineOptions.params_hold_master): it is read from them and never written beside them.
    n = io32_plain["optimizer_read_bytes"] // (4 * STEPS + 8 * (STEPS - 1))
    assert io16["optimizer_read_bytes"] == n * (4 * STEPS + 4 * (STEPS - 1))
    assert io32_plain["optimizer_write_bytes"] == n * 8 * STEPS
    assert io16["optimizer_write_bytes"] == n * 4 * STEPS
    assert io32["optimizer_write_bytes"] > bf16["stats"]["bounded_io"]["optimizer_write_bytes"]
