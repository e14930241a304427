"""The GPU kit's capacity phase and its per-phase SSD sampling for real, rehearsed on the CPU (`--accelerator cpu`),
as root: the memory cgroup the phase checks first, `bench --capacity seq` searching tuned's longest context of
tiny-llama under a 1 GiB cap (real cgroups, real DeepSpeed), the memascend probe at twice it, and a bench phase whose
runs carry what the SSD did in each phase of steps 2..N (/proc/diskstats beside the ranks' phase marks). The kit's
setup is stood in by a venv whose python is this one (nothing installed); what a GPU changes is the checks' outcome,
not the path. Minutes each: long."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_async_io, require_memory_cgroups
from tests.unit.test_gpu_check_device_view import _stand_in_carry

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.serial, pytest.mark.long]
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from gpukit import pure  # noqa: E402


def _kit(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`gpu_check.py run ARGS --accelerator cpu` with WORK/venv/bin/python standing in for the set-up venv."""
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "venv" / "bin").mkdir(parents=True)
    py = work / "venv" / "bin" / "python"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    if os.environ.get("TORCH_EXTENSIONS_DIR"):  # DeepSpeed's ops as built here, not rebuilt in WORK
        (work / "torch_ext").symlink_to(os.environ["TORCH_EXTENSIONS_DIR"])
    carry = _stand_in_carry(tmp_path / "carry")  # nothing is installed from it: the venv stands in for setup
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "run", *args, "--accelerator", "cpu",
                        "--work", str(work), "--out", str(out), "--carry", str(carry), "--settle-cap-s", "5",
                        "--python", sys.executable], capture_output=True, text=True, timeout=1200, cwd=str(REPO),
                       check=False)
    return r, out


def test_the_capacity_phase_searches_tuned_then_probes_memascend_under_a_real_cgroup(tmp_path):
    require_async_io()
    require_memory_cgroups("memory")
    r, out = _kit(tmp_path, "--phases", "capacity", "--models", "tiny-llama", "--dram-cap", "1GiB",
                  "--budget-s", "900")
    doc = json.loads((out / "gpu_capacity.json").read_text())
    assert doc["cgroup"]["ok"] and doc["cgroup"]["version"] in (1, 2), doc["cgroup"]
    log = (tmp_path / "work" / "logs" / "capacity-tuned.log").read_text()
    assert pure.parse_planned_max(log, "tuned") == (True, doc["tuned"]["planned_max"])
    tuned = doc["tuned"]
    assert tuned["stopped_by"].startswith("its search ended"), (tuned, r.stdout[-3000:])
    assert tuned["probes"] and {q["outcome"] for q in tuned["probes"]} <= {pure.FIT, pure.OOM, pure.STALLED}
    assert (tuned["measured_max"], tuned["measured_max_proven"]) == pure.measured_max(tuned["probes"])
    # The kit's probes are bench's own (its capacity.json, written when the search ended).
    stored = json.loads((tmp_path / "work" / "ssd" / "capacity" / "capacity.json").read_text())["engines"][0]
    assert {(q["value"], q["outcome"]) for q in stored["probes"]} == {(q["value"], q["outcome"]) for q in
                                                                      tuned["probes"]}
    assert stored["planned_max"] == tuned["planned_max"]
    m = doc["memascend"]
    assert m["value"] == pure.memascend_probe_value(tuned["measured_max"], True, tuned["planned_max"])[0]
    assert m["probe"]["outcome"] in (pure.FIT, pure.OOM, pure.STALLED) and m["probe"]["phase_io"]["device"]
    assert doc["verdict"] == pure.capacity_verdict(tuned, m)
    assert "synthetic" not in doc


def test_the_bench_phase_records_the_ssd_in_each_phase(tmp_path):
    require_async_io()
    r, out = _kit(tmp_path, "--phases", "bench", "--models", "tiny-llama", "--runs", "memascend,tuned", "--seq-len",
                  "64", "--steps", "3", "--budget-s", "600")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    io = json.loads((out / "gpu_bench.json").read_text())["phase_io"]["tiny-llama"]
    for run in ("memascend", "tuned"):
        assert io[run]["samples"] > 10 and not io[run].get("reason"), io[run]
        opt = io[run]["phases"]["optimizer"]
        # The optimizer reads and writes its states on the SSD in every step.
        assert opt["seconds"] > 0 and opt["read_gbps"] > 0 and opt["write_gbps"] > 0, io[run]


def test_the_placement_phase_runs_each_point_and_records_what_bench_refused(tmp_path):
    """Every point of the sweep is its own bench command: those that run carry their SSD bytes and the call's plan
    of their row; one bench refuses (gpu on a machine without one) keeps bench's own error line."""
    require_async_io()
    r, out = _kit(tmp_path, "--phases", "placements", "--models", "tiny-llama", "--seq-len", "64", "--budget-s", "900")
    doc = json.loads((out / "gpu_placements.json").read_text())
    assert [(p["placement"], p["run"]) for p in doc["points"]] == list(pure.PLACEMENT_SWEEP), r.stdout[-3000:]
    rows = {(row["placement"], row["run"]): row for row in doc["rows"]}
    assert not rows[("gpu", "tuned")]["ok"] and rows[("gpu", "tuned")]["error"].startswith("error: placement gpu")
    for key in (("dram", "tuned"), ("ssd", "memascend"), ("ssd", "tuned")):
        row = rows[key]
        assert row["ok"] and row["seconds_per_step"] > 0 and row["plan"]["placement"] == key[0], row
    assert rows[("dram", "tuned")]["ssd_read_bytes_per_param"] == 0  # DRAM-resident: nothing from the SSD
    assert rows[("ssd", "tuned")]["ssd_read_bytes_per_param"] > 1
    assert doc["phase_io"]["tiny-llama"]["ssd/tuned"]["phases"]["optimizer"]["write_gbps"] > 0
