"""Live check: run stock DeepSpeed ZeRO-3 (params + optimizer on NVMe) on the CPU and compare the
host buffers it allocates with the planner's P1..P5, to the byte.

Regenerate tests/assets/deepspeed_measured.json with benchmarks/measure_ds_buffers.py (see there).
"""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import require_async_io

from tests.unit.test_planner_vs_deepspeed import CASES, assert_matches

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["b", "c"])
def test_live_stock_run_matches_planner(name, tmp_path):
    require_async_io()
    case = CASES[name]
    k = case["knobs"]
    out = tmp_path / "case.json"
    # Swap files on the repo's file system (ext4 here), never tmpfs: O_DIRECT needs a real FS.
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "measure_ds_buffers.py"), "--model", case["model"],
           "--dtype", case["dtype"], "--nvme-dir", str(tmp_path / "swap"), "--out", str(out), "--steps", "1",
           "--param-buffer-count", str(k["param_buffer_count"]), "--param-buffer-size", str(k["param_buffer_size"]),
           "--max-in-cpu", str(k["max_in_cpu"]), "--optimizer-buffer-count", str(k["optimizer_buffer_count"]),
           "--sub-group-size", str(k["sub_group_size"]), "--reduce-bucket-size", str(k["reduce_bucket_size"])]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": REPO}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    live = json.loads(out.read_text())
    assert live["swap_files"] > 0  # parameters >= 1 MiB really went to the SSD
    assert_matches(live)
