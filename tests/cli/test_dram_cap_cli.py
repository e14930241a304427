"""One DRAM cap, one machine: `plan --dram-cap` plans the node `train --dram-cap` and `bench --dram-cap` run in
(HardwareSpec.under_dram_cap), so `plan RECIPE --dram-cap X` is what `train RECIPE --dram-cap X` runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run(*args):
    # The user's cache: its CPU and SSD probes are measured once, not in every test.
    env = {**os.environ, "COLUMNS": "80", "DS_ACCELERATOR": "cpu"}
    return subprocess.run([sys.executable, "-m", "memascend_cli", *args], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="train --dram-cap checks for a memory cgroup it can create (root)")
@pytest.mark.parametrize("engine", ["memascend", "tuned"])
def test_plan_and_train_dry_run_plan_the_same_node_under_a_cap(tmp_path, engine):
    plan = run("plan", "tiny-cpu", "--dram-cap", "6GiB", "--engine", engine, "--json")
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)
    assert planned["hardware"]["usable_dram_gib"] == 6.0  # the whole cap is the job's, no OS reserve
    dry = run("train", "tiny-cpu", "--dram-cap", "6GiB", "--engine", engine, "--placement", "ssd", "--dry-run",
              "--output-dir", str(tmp_path / "run"))
    assert dry.returncode == 0, dry.stderr
    trained = json.loads(dry.stdout)["plan"]
    assert trained["host_peak_bytes"] == planned["engines"][engine]["node_host_peak_bytes"]
    assert trained["job"] == planned["job"]


def test_plan_without_a_cap_keeps_the_os_reserve(tmp_path):
    p = run("plan", "tiny-cpu", "--dram", "6GiB", "--json")
    assert p.returncode == 0, p.stderr
    # --dram describes a machine (the OS keeps its share); --dram-cap a cgroup on this one.
    assert json.loads(p.stdout)["hardware"]["usable_dram_gib"] == pytest.approx(5.0)
    above = run("plan", "tiny-cpu", "--dram-cap", f"{10 ** 4}GiB", "--no-search")
    assert above.returncode == 0 and "is not below" in " ".join(above.stdout.split())
