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
    assert s["optimizer_pool_bytes"] > 0 and s["pinned_bytes"] >= s["pool_bytes"]
    assert s["counters"]["adam_states_in_place"] >= 1 and s["region_io"]["zero_fill_reads"] >= 2
    assert s["counters"]["pool_overflow_allocations"] == 0
    assert s["counters"]["malloc_trims"] == STEPS
    assert s["counters"]["grad_buffer_in_place"] == 1  # P5 allocated pinned directly, no zeros + copy
    # Fused overflow check on the real gradient buffer, with the stock reference on the same data.
    assert r["overflow_probe"] == {"clean": False, "inf": True, "nan": True, "restored": False, "reference_clean": False}
    assert s["counters"]["overflow_scans"] == 4
    # Checkpoint save copies the (empty) swap folder: no crash, no swap files anywhere.
    assert r["checkpoint_swap_files"] == 0


def test_bf16_losses_within_1e3_of_stock(tmp_path, stock):
    r = run(tmp_path, "engine-bf16", "--mode", "engine", "--dtype", "bf16", "--region", make_region(tmp_path, "512MiB"))
    ref = stock["bf16"]["losses"]
    assert len(r["losses"]) == STEPS
    for a, b in zip(r["losses"], ref):
        assert abs(a - b) <= 1e-3 * abs(b)
    _assert_went_through_region(r)


@pytest.mark.parametrize("off", ["pinned", "adaptive_pool", "fused_overflow", "malloc_trim", "adam_in_place"])
def test_each_technique_switches_off(tmp_path, stock, off):
    r = run(tmp_path, f"off-{off}", "--mode", "engine", "--dtype", "fp32", "--region", make_region(tmp_path, "512MiB"),
            "--off", off, "--overflow-probe")
    assert r["losses"] == stock["fp32"]["losses"]
    _assert_went_through_region(r)
    s = r["stats"]
    assert s["options"][off] is False
    if off == "adaptive_pool":
        assert s["param_pool_plan"] is None and s["param_pool_bytes"] == 0
    if off == "fused_overflow":
        assert s["counters"]["overflow_scans"] == 0 and r["overflow_probe"]["inf"] is True
    if off == "malloc_trim":
        assert s["counters"]["malloc_trims"] == 0
    if off == "pinned":
        assert s["pinned"]["locked_bytes"] == 0 and s["counters"]["grad_buffer_in_place"] == 0
    if off == "adam_in_place":
        assert s["counters"]["adam_states_in_place"] == 0


def test_direct_nvme_off_uses_swap_files(tmp_path, stock):
    r = run(tmp_path, "off-direct", "--mode", "engine", "--dtype", "fp32", "--off", "direct_nvme",
            "--nvme-dir", str(tmp_path / "swap"))
    assert r["losses"] == stock["fp32"]["losses"]
    assert r["swap_files"] > 0 and r["stats"]["bytes_written"] == 0


def test_offloaded_checkpointing_trains_and_matches(tmp_path, stock):
    r = run(tmp_path, "ckpt", "--mode", "engine", "--dtype", "fp32", "--region", make_region(tmp_path, "512MiB"),
            "--checkpointing")
    assert r["stats"]["checkpointing"]["layer_calls"] >= 2 * STEPS
    for a, b in zip(r["losses"], stock["fp32"]["losses"]):
        assert abs(a - b) <= 1e-6 * abs(b)


def test_two_ranks_each_in_their_own_subregion(tmp_path, stock):
    region = make_region(tmp_path, "512MiB", ranks=2)
    out = tmp_path / "two.json"
    env = _env()
    proc = subprocess.run([sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port",
                           str(29600 + os.getpid() % 300), PARITY, "--mode", "engine", "--dtype", "fp32",
                           "--steps", str(STEPS), "--region", region, "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    from memascend_cli import region as region_mod

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
