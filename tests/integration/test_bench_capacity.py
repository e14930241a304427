"""`bench --capacity` for real, as root: tuned stock DeepSpeed on tiny-llama under a cap the plan puts between two
depths, searched from the plan's maximum until a depth trains and the next one is OOM-killed in its cgroup."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from memascend_cli.bench import capacity, capacity_run, runner
from memascend_cli.bench.configs import build_ds_config
from memascend_cli.models import load_model
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.units import MiB
from memascend_cli.versions import installed_deepspeed_version
from tests.conftest import require_async_io, require_memory_cgroups

# long: 8 capped probes (~3 min). The default run keeps the search's rules (tests/unit/test_bench_capacity.py) and a
# real OOM kill under a cap (tests/integration/test_dram_cap.py).
pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.long]

SEQ = 64
PLANNED_DEPTH = 16
"""The cap sits halfway between the plan's peaks at this depth and the next, so the plan's maximum is this depth: about
1.1 GiB, clear of what importing torch and DeepSpeed takes in a cgroup that also holds their page cache (~0.7 GiB
here: below that a run is OOM-killed or crawls while still importing)."""


def planned_peak(layers: int) -> int:
    base = runner.Point(model="tiny-llama", spec=load_model("tiny-llama"), layers=None, seq_len=SEQ, micro_batch=1,
                        steps=2, dtype="fp32", seed=0, checkpointing="full", ranks=1, host_budget_bytes=None,
                        accelerator="cpu", hw=HardwareSpec(name="test", dram_gib=24, cpu_cores=2),
                        deepspeed_version=installed_deepspeed_version())
    p = capacity_run.probe_point(base, "layers", layers)
    cfg = build_ds_config("tuned", p.spec, micro_batch=1, dtype="fp32", nvme_dir="/unused", ranks=1)
    return p.predict("tuned", cfg)["node_host_peak_bytes"]


def test_capacity_search_finds_the_depth_that_fits_and_the_next_that_is_oom_killed(tmp_path):
    require_memory_cgroups()
    require_async_io()
    cap_bytes = (planned_peak(PLANNED_DEPTH) + planned_peak(PLANNED_DEPTH + 1)) // 2
    out = tmp_path / "cap"
    cmd = [sys.executable, "-m", "memascend_cli", "bench", "--capacity", "layers", "--model", "tiny-llama",
           "--seq-len", str(SEQ), "--dtype", "fp32", "--runs", "tuned", "--dram-cap", f"{cap_bytes // MiB}MiB",
           "--settle-cap", "5", "--probe-timeout", "120", "--out", str(out), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc == json.loads((out / capacity_run.SUMMARY_FILE).read_text())
    assert doc["axis"] == "layers" and doc["dram_cap_bytes"] == cap_bytes // MiB * MiB
    assert doc["job"]["layers"] is None and doc["job"]["seq_len"] == SEQ
    (e,) = doc["engines"]
    assert e["name"] == "tuned" and e["planned_max"] == PLANNED_DEPTH and e["planned_binding"] == "DRAM"
    probes = {q["value"]: q for q in e["probes"]}
    assert e["probes"][0]["value"] == PLANNED_DEPTH  # the search starts at the plan's maximum
    # The measured maximum trained every step; the grid point above it did not fit; the kernel really OOM-killed
    # inside the cap (at m + 1 or above; a probe may instead crawl at its cap and be stopped as stalled).
    m = e["measured_max"]
    assert m is not None and not e["at_least"], e
    assert probes[m]["outcome"] == capacity.FIT and probes[m]["steps_done"] == 2
    assert probes[m + 1]["outcome"] in capacity.DOES_NOT_FIT and e["reason"].endswith(f" at {m + 1}")
    assert any(q["outcome"] == capacity.OOM and "OOM-killed" in q["error"] for q in e["probes"])
    assert probes[m]["cgroup_peak_bytes"] <= cap_bytes
    assert len(e["probes"]) <= 10, e["probes"]  # galloping from the plan's maximum, then bisecting (8 here)
    for q in e["probes"]:
        assert (out / q["document"]).is_file() and q["planned_peak_bytes"] is not None
    assert not list(out.glob("**/bench.region"))  # each probe's region is gone
    assert (out / capacity_run.PLOT_FILE).is_file()

