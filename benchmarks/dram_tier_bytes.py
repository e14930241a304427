"""SSD bytes per step against the DRAM tier's budget (EngineOptions.dram_tier_gib), measured and planned.

The engine's parity harness (engine/parity.py: tiny-llama, real DeepSpeed ZeRO-3 on the CPU accelerator, the region
in a fresh file) runs at each budget twice, for a few steps and for four more; the region store's counters of the two
runs differ by four steady steps (set-up and the first step, which reads no Adam moments, cancel). The plan's bytes
per step are memascend_cli.planner.placement.memascend_tier over the planner's estimate of the same DeepSpeed config
(memascend_cli.bench.configs.plan_job), at the same budget.

    DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$PWD/.torch_ext .venv/bin/python benchmarks/dram_tier_bytes.py \\
        --out docs/bench/dram-tier/bytes-per-step-bf16.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2**20
BUDGETS_BYTES = (0, 4 * MIB, 8 * MIB, 48 * MIB, 100 * MIB, 1024 * MIB)
"""Nothing, half the parameter partitions, all of them, + one optimizer chunk, + three, everything (tiny-llama)."""
SHORT_STEPS, EXTRA_STEPS = 3, 4


def _parity(budget_bytes: int, steps: int, args, work: str) -> dict:
    region = os.path.join(work, f"r-{budget_bytes}-{steps}.region")
    out = os.path.join(work, f"r-{budget_bytes}-{steps}.json")
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", region, "--size", "512MiB", "--ranks", "1",
                    "--no-probe", "--yes"], check=True, capture_output=True, env=env)
    proc = subprocess.run([sys.executable, "-m", "memascend_engine.parity", "--mode", "engine", "--dtype", args.dtype,
                           "--clip", str(args.clip), "--steps", str(steps), "--region", region,
                           "--dram-tier-gib", repr(budget_bytes / 2**30), "--out", out],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"error: the parity run failed:\n{proc.stderr[-3000:]}")
    os.unlink(region)
    with open(out) as f:
        return json.load(f)


def _planned(run: dict, budget_bytes: int) -> dict:
    """The plan's SSD bytes per steady step at this budget, for the run's own DeepSpeed config."""
    from memascend_cli.bench.configs import plan_job
    from memascend_cli.models import load_model
    from memascend_cli.planner.memory import estimate
    from memascend_cli.planner.placement import memascend_tier
    from memascend_cli.planner.spec import HardwareSpec

    hw = HardwareSpec(name="cpu", dram_gib=24.0)
    job, engine = plan_job("memascend", run["config"], load_model("tiny-llama"), seq_len=32, micro_batch=2,
                           dtype=run["dtype"], ranks=1, checkpointing="none",
                           deepspeed_version=run["deepspeed_version"])
    est = estimate(job, hw, engine)
    tier, _, traffic = memascend_tier(job, hw, est, budget_bytes)
    return {"read_bytes": traffic.read_total, "write_bytes": traffic.write_total, "tier": tier}


def _point(budget_bytes: int, args, work: str) -> dict:
    short, long = (_parity(budget_bytes, s, args, work) for s in (SHORT_STEPS, SHORT_STEPS + EXTRA_STEPS))
    assert short["losses"] == long["losses"][:len(short["losses"])]
    io_s, io_l = short["stats"]["region_io"], long["stats"]["region_io"]
    measured = {k: (io_l[f"bytes_{k}"] - io_s[f"bytes_{k}"]) // EXTRA_STEPS for k in ("read", "written")}
    plan = _planned(long, budget_bytes)
    return {"budget_bytes": budget_bytes, "measured_read_bytes_per_step": measured["read"],
            "measured_write_bytes_per_step": measured["written"], "planned_read_bytes_per_step": plan["read_bytes"],
            "planned_write_bytes_per_step": plan["write_bytes"], "planned_tier": plan["tier"],
            "engine_tier": io_l.get("dram_tier"), "losses": long["losses"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--clip", type=float, default=100.0,
                    help="gradient clipping (on: the overlap keeps each gradient for a redo, on the SSD or the tier)")
    args = ap.parse_args(argv)
    sys.path.insert(0, REPO)
    with tempfile.TemporaryDirectory(prefix="dram-tier-", dir="/var/tmp") as work:
        points = [_point(b, args, work) for b in BUDGETS_BYTES]
    doc = {"title": "SSD bytes per steady step against the DRAM tier's budget: measured (region store) and planned",
           "command": "python benchmarks/dram_tier_bytes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
           "machine": {"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg()},
           "job": {"model": "tiny-llama", "dtype": args.dtype, "clip": args.clip, "seq_len": 32, "micro_batch": 2,
                   "steps": [SHORT_STEPS, SHORT_STEPS + EXTRA_STEPS]},
           "points": points}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    for p in points:
        print(f"{p['budget_bytes'] / MIB:8.0f} MiB  measured r/w {p['measured_read_bytes_per_step'] / MIB:8.1f} / "
              f"{p['measured_write_bytes_per_step'] / MIB:8.1f} MiB  planned {p['planned_read_bytes_per_step'] / MIB:8.1f}"
              f" / {p['planned_write_bytes_per_step'] / MIB:8.1f} MiB per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
