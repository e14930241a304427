"""Live `memascend bench`: a real tiny stock vs tuned DeepSpeed run (params + optimizer on NVMe), 2 steps each,
in child processes, with the meminfo sampler, wait4, the planner prediction and every output file."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import require_async_io

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_tiny_stock_vs_tuned_bench(tmp_path):
    require_async_io()
    out = tmp_path / "bench"
    # The swap directory is under tmp_path: on this machine a real ext4 file system (tmpfs is refused).
    cmd = [sys.executable, "-m", "memascend_cli", "bench", "--model", "tiny-llama", "--seq-len", "64", "--steps", "2",
           "--runs", "stock,tuned", "--settle-cap", "30", "--out", str(out), "--json"]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": REPO}
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=1800, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    doc = json.loads(r.stdout)
    assert doc == json.loads((out / "bench.json").read_text())
    assert [x["name"] for x in doc["runs"]] == ["stock", "tuned"]
    for run in doc["runs"]:
        assert run["ok"], run["error"]
        assert len(run["losses"]) == 2 and run["seconds_per_step"] > 0 and run["tokens_per_s"] > 0
        assert run["peak_system_bytes"] > 0 and run["ru_maxrss_bytes"] > 100 * 2**20
        assert run["max_tree_rss_bytes"] > 0
        # tiny-llama's partitions are >= 1 MiB, so parameters and optimizer states really hit the disk.
        assert run["swap_bytes_on_disk"] > 0 and run["ssd_written_bytes"] > 0
        assert run["sampling"]["samples"] > 100 and run["timeline"]
        assert run["predicted"]["node_host_peak_bytes"] > 0 and run["prediction_error_percent"] is not None
        assert run["settle"]["waited_s"] >= 6.0
    stock, tuned = doc["runs"]
    assert tuned["env"].get("DS_PIN_MEMORY_BACKEND") == "native" and "DS_PIN_MEMORY_BACKEND" not in stock["env"]
    # Same seed, same data: the first loss agrees (max_in_cpu 0 and small sub-groups change summation order only).
    assert tuned["losses"][0] == pytest.approx(stock["losses"][0], rel=1e-3)
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / "swap").exists() or not any((out / "swap").iterdir())
