"""Stock DeepSpeed's 'Not enough buffers 0 for swapping 1' at step 2 (DeepSpeed issue 3062) against the plan.

The plan (memascend_cli/planner/param_buffers.py) counts the NVMe parameter partitions stock ZeRO-3 keeps fetched at
once for a stage3_max_reuse_distance. Real stock runs on the CPU (tiny-llama, fp32, offload_param.max_in_cpu 1e6 so
that its partitions live on NVMe, 5 parameter swap buffers) just below and just above the smallest reuse distance the
plan says fails must run three steps and fail at step 2 respectively, with and without activation checkpointing.
"""

import json
import os
import subprocess
import sys

import pytest

from memascend_cli.bench import configs
from memascend_cli.models import load_model
from memascend_cli.planner.spec import HardwareSpec
from tests.conftest import require_async_io

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_IN_CPU = 1_000_000
STEP = 20_000
"""Elements either side of the planned bound (a tiny-llama attention matrix is 262,144)."""


def _config(spec, nvme_dir: str, reuse: int) -> dict:
    cfg = configs.build_ds_config("stock", spec, micro_batch=1, dtype="fp32", nvme_dir=nvme_dir, ranks=1)
    z = cfg["zero_optimization"]
    z["offload_param"]["max_in_cpu"] = MAX_IN_CPU
    z["stage3_max_reuse_distance"] = reuse
    return cfg


def _planned_failure(spec, reuse: int, checkpointing: str) -> list[str]:
    hw = HardwareSpec(name="t", dram_gib=24, cpu_cores=2)
    p = configs.predict("stock", _config(spec, "/x", reuse), spec, seq_len=64, micro_batch=1, dtype="fp32", ranks=1,
                        checkpointing=checkpointing, hw=hw, deepspeed_version="0.19.8")
    return [e for e in p["config_errors"] if "Not enough buffers" in e]


def _bound(spec, checkpointing: str) -> int:
    """The smallest reuse distance the plan says fails."""
    lo, hi = 0, 10 ** 9
    assert _planned_failure(spec, hi, checkpointing) and not _planned_failure(spec, lo, checkpointing)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _planned_failure(spec, mid, checkpointing) else (mid, hi)
    return hi


def _run(tmp_path, spec, reuse: int, checkpointing: str) -> tuple[int, str]:
    swap = tmp_path / f"swap-{checkpointing}-{reuse}"
    swap.mkdir()
    cfg_path = tmp_path / f"ds-{checkpointing}-{reuse}.json"
    cfg_path.write_text(json.dumps(_config(spec, str(swap), reuse)))
    events = tmp_path / f"ev-{checkpointing}-{reuse}"
    cmd = [sys.executable, "-m", "memascend_engine.bench_job", "--mode", "stock", "--model", "tiny-llama",
           "--seq-len", "64", "--micro-batch", "1", "--steps", "3", "--dtype", "fp32", "--checkpointing",
           checkpointing, "--ds-config", str(cfg_path), "--events", str(events)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                       env={**os.environ, "DS_ACCELERATOR": "cpu"})
    errors = [json.loads(line).get("message", "") for f in tmp_path.glob(f"{events.name}*")
              for line in f.read_text().splitlines() if '"error"' in line]
    return r.returncode, " ".join(errors) or r.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", ["full", "none"])
def test_stock_fails_at_step_2_exactly_where_the_plan_says(tmp_path, checkpointing):
    require_async_io()
    spec = load_model("tiny-llama")
    bound = _bound(spec, checkpointing)
    rc, why = _run(tmp_path, spec, bound - STEP, checkpointing)
    assert rc == 0, f"planned to run at reuse {bound - STEP:,}: {why}"
    rc, why = _run(tmp_path, spec, bound + STEP, checkpointing)
    assert rc != 0 and "Not enough buffers" in why, f"planned to fail at reuse {bound + STEP:,}: rc {rc}, {why}"
