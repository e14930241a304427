"""The engine inside real DeepSpeed ZeRO-3 on CUDA (params + optimizer on NVMe). Marker gpu.

Each run is a fresh `memascend_engine.parity` process with DS_ACCELERATOR=cuda (NCCL, inputs on the GPU,
deterministic kernels): stock DeepSpeed with swap files, then the engine with a region made by
`memascend prepare-ssd`. tiny-llama's partitions exceed 1 MiB, so parameters and optimizer states really
go through the SSD, the pinned pools and H2D/D2H copies.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
STEPS = 4


def _env() -> dict:
    env = dict(os.environ)
    env["DS_ACCELERATOR"] = "cuda"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _parity(tmp: Path, name: str, *args: str) -> dict:
    out = tmp / f"{name}.json"
    p = subprocess.run([sys.executable, "-m", "memascend_engine.parity", "--steps", str(STEPS), "--dtype", "fp32",
                        "--out", str(out), *args], env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return json.loads(out.read_text())


def _region(tmp: Path) -> str:
    path = str(tmp / "memascend.region")
    subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", path, "--size", "512MiB", "--no-probe",
                    "--yes"], check=True, capture_output=True, text=True, env=_env())
    return path


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    d = tmp_path_factory.mktemp("stock-cuda")
    r = _parity(d, "stock", "--mode", "stock", "--nvme-dir", str(d / "swap"))
    assert r["device"].startswith("cuda"), r["device"]
    assert r["swap_files"] > 0, "the stock run must really swap (else parity proves nothing)"
    return r


def test_zero3_on_the_region_matches_stock_deepspeed_on_cuda(tmp_path, stock):
    r = _parity(tmp_path, "engine", "--mode", "engine", "--region", _region(tmp_path), "--overflow-probe")
    assert r["device"].startswith("cuda")
    assert len(r["losses"]) == STEPS and all(math.isfinite(x) for x in r["losses"])
    assert r["losses"] == stock["losses"], (r["losses"], stock["losses"])
    s = r["stats"]
    assert s["swap_files_created"] == 0 and r["swap_files"] == 0
    assert s["bytes_read"] > STEPS * 6_294_016 * 4 and s["bytes_written"] > 0  # params + Adam really swapped
    # Every pinned buffer is CUDA-registered: copies from the pools are real asynchronous DMA.
    assert s["pinned"]["cuda_registered_bytes"] == s["pinned"]["live_bytes"] > 0, s["pinned"]
    assert s["pinned"]["live_bytes"] >= s["pool_bytes"]
    assert s["counters"]["pool_overflow_allocations"] == 0
    # The bounded engine, as its CPU twin (tests/engine/test_engine_deepspeed.py::test_fp32_losses_equal_stock_exactly)
    # checks: no DeepSpeed optimizer pool, no gradient flat buffer, no P2 buffer; bounded windows instead.
    assert s["optimizer_pool_bytes"] == 0 and s["partitioned_swap_buffer_bytes"] == 0
    assert s["counters"]["grad_buffer_in_place"] == 0 and s["counters"]["adam_states_in_place"] == 0
    b = s["bounded"]
    assert b["chunks"] >= 1 and b["optimizer_window_bytes"] > 0 and b["gradient_window_bytes"] > 0
    # fp32 gradients written once per step and read once by the optimizer (plus the probe's read of the first
    # parameter's gradient, the 1024 x 512 embedding).
    io = s["bounded_io"]
    assert io["gradient_write_bytes"] == STEPS * 6_294_016 * 4
    assert io["gradient_read_bytes"] == io["gradient_write_bytes"] + 1024 * 512 * 4
    # The fused scan ran on the real (host, pinned) gradient buffer of the CUDA job.
    assert r["overflow_probe"] == {"clean": False, "inf": True, "nan": True, "restored": False,
                                   "reference_clean": False}
    assert s["counters"]["overflow_scans"] == 4
    assert 0 < r["peak_gpu_bytes"] < torch.cuda.get_device_properties(0).total_memory


def test_offloaded_checkpointing_on_cuda_keeps_the_losses(tmp_path, stock):
    r = _parity(tmp_path, "engine-ckpt", "--mode", "engine", "--region", _region(tmp_path), "--checkpointing")
    s = r["stats"]
    # Each decoder layer's input went to an exact-size pinned host buffer through a D2H copy.
    assert s["checkpointing"]["layer_calls"] >= STEPS * 2
    assert s["checkpointing"]["host_bytes_peak"] > 0
    # Recomputation replays the same kernels; only summation order could move the last bits.
    for a, b in zip(r["losses"], stock["losses"]):
        assert a == pytest.approx(b, rel=1e-5)
