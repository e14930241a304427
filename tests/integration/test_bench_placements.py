"""`memascend bench --placements` for real, as root: a tiny model at two DRAM caps (real memory cgroups, the SSD
throttled as a sweep is run), stock's best config, tuned on the SSD and memascend's placement at each, real DeepSpeed
on the CPU; the compact document, its plot and each point's bench.json, and the placements really taking effect
(stock's DRAM placement moves no swap bytes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from memascend_cli.bench.placements import CURVES, curve
from tests.conftest import require_async_io, require_memory_cgroups

# long: 173 s alone and serial (the other worker waits); tests/unit/test_bench_placements.py covers the sweep's parts
# and tests/cli/test_train_placement_cli.py the configs each placement writes, in the default run.
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.serial, pytest.mark.long]
CAPS = ("3GiB", "6GiB")


def test_two_budget_points_measure_every_curve_beside_the_plan(tmp_path):
    require_async_io()
    require_memory_cgroups("memory")
    require_memory_cgroups("io")
    out = tmp_path / "out"
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    cmd = [sys.executable, "-m", "memascend_cli", "bench", "--model", "tiny-llama", "--seq-len", "64", "--steps", "3",
           "--placements", ",".join(CAPS), "--ssd-bandwidth", "400MB/s", "--settle-cap", "20", "--out", str(out),
           "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc == json.loads((out / "placements.json").read_text())
    assert (out / "placements.png").stat().st_size > 0
    assert [pt["dram_cap_bytes"] for pt in doc["points"]] == [3 << 30, 6 << 30]
    for pt in doc["points"]:
        point_doc = json.loads((out / f"cap-{pt['dram_cap_bytes'] >> 30}GiB" / "bench.json").read_text())
        assert {run["name"] for run in point_doc["runs"]} == {n for n, e in pt["runs"].items() if "same_as" not in e}
        for run in point_doc["runs"]:
            assert run["cgroup"]["limit_bytes"] == pt["dram_cap_bytes"]
            # The child ran the config its placement wrote.
            z = run["config"]["zero_optimization"]
            assert (z.get("offload_optimizer") or {}).get("device", "none") == run["placement"]["offload_optimizer"]
        assert pt["loadavg"] and len(pt["loadavg"]) == 6
    for name in CURVES:
        for p in curve(doc, name):
            assert p["ok"], p["error"]
            assert p["tokens_per_s"] > 0 and p["planned"]["seconds_per_step"] > 0
            assert p["load"]["cores_taken"] is not None
    tuned = curve(doc, "tuned")
    for best, ssd in zip(curve(doc, "stock-best"), tuned):
        if best["placement"] == "dram":  # ZeRO-Offload: no swap traffic, where tuned swaps every step
            assert best["ssd_bytes_per_param"] < 0.1 * ssd["ssd_bytes_per_param"]
            assert best["planned"]["ssd_bytes_per_param"] == 0
    losses = {name: [p["losses"] for p in curve(doc, name)] for name in CURVES}
    assert all(len(run) == 3 for runs in losses.values() for run in runs)
