"""Stock DeepSpeed's split placement (offload_param nvme with a partial max_in_cpu) against its NVMe prefetch.

The quiet placement sweep's stock split run failed at step 2 with "param 38 already assigned swap buffer id 4"
(runtime/swap_tensor/partitioned_param_swapper.py:185-186, reached from partitioned_param_coordinator.py
__prefetch_nvme_param_partitions). This runs the smallest job that shows it, the bench's own child
(memascend_engine.bench_job, tuned mode: stock DeepSpeed with memascend's knobs) on tiny-llama, once per case:
which trailing sub-groups stay on NVMe (max_in_cpu holds the rest) and stage3_prefetch_bucket_size. Each case records
its exit status, the error line, its losses and step seconds (planner.placement.SPLIT_PREFETCH_BUG says why the plan
runs stock's split without prefetch).

    python benchmarks/stock_split_prefetch.py --out docs/bench/micro/stock-split-nvme-prefetch-tiny-llama.json

No root needed; about a minute on 2 cores.
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
from datetime import datetime, timezone

from memascend_cli.bench.configs import build_ds_config, child_env
from memascend_cli.models import load_model
from memascend_cli.planner import param_buffers, subgroups, zero
from memascend_cli.versions import installed_deepspeed_version

MODEL, SEQ, STEPS, DTYPE, ELEM = "tiny-llama", 64, 4, "fp32", 4
SUB_GROUP = 524_288
"""Sub-groups of about one large tensor (the LM head's 1024 x 512): each case moves whole tensors to NVMe."""
CASES = (  # (name, trailing sub-groups on NVMe: None = all, 0 = none; stage3_prefetch_bucket_size)
    ("lm-head-on-nvme", 1, 50_000_000),
    ("lm-head-on-nvme-no-prefetch", 1, 0),
    ("last-layer-and-lm-head-on-nvme", 6, 50_000_000),
    ("last-layer-and-lm-head-on-nvme-no-prefetch", 6, 0),
    ("all-on-nvme", None, 50_000_000),
)


def layout(spec, tail_groups: int | None, min_bytes: int) -> tuple[int, int, int]:
    """(max_in_cpu, NVMe-resident partitions, all swappable partitions) of keeping all but the last `tail_groups`
    sub-groups in DRAM (None: every partition on NVMe); a partition swaps from `min_bytes`. Pure."""
    numels = [n for n, _ in zero.model_partitions(spec, 1)]
    groups, group_numels = subgroups.sub_groups_and_numels(numels, SUB_GROUP)
    keep = 0 if tail_groups is None else sum(group_numels[:len(group_numels) - tail_groups])
    swappable = tuple(n * ELEM >= min_bytes for n in numels)
    nvme = param_buffers.nvme_resident(tuple(numels), groups, keep, swappable)
    return keep, sum(nvme), sum(swappable)


def read_events(path: str) -> list[dict]:
    """The child's JSON lines (none when it died before writing any)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(x) for x in f]


def run_case(name: str, tail_groups: int | None, prefetch: int, work: str) -> dict:
    spec = load_model(MODEL)
    cfg = build_ds_config("tuned", spec, micro_batch=1, dtype=DTYPE, nvme_dir=os.path.join(work, name, "swap"),
                          ranks=1, gradient_clipping=10.0)
    keep, on_nvme, swappable = layout(spec, tail_groups, zero.min_aio_bytes(zero.from_ds_config(cfg)))
    z = cfg["zero_optimization"]
    z.update(sub_group_size=SUB_GROUP, stage3_prefetch_bucket_size=prefetch)
    z["offload_param"]["max_in_cpu"] = keep
    os.makedirs(z["offload_param"]["nvme_path"], exist_ok=True)
    cfg_path, events = os.path.join(work, name, "ds.json"), os.path.join(work, name, "ev")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    cmd = [sys.executable, "-m", "memascend_engine.bench_job", "--mode", "tuned", "--model", MODEL,
           "--seq-len", str(SEQ), "--micro-batch", "1", "--steps", str(STEPS), "--dtype", DTYPE,
           "--checkpointing", "full", "--checkpointing-impl", "memascend", "--loss-impl", "chunked",
           "--ds-config", cfg_path, "--events", events]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=child_env("tuned", cfg, dict(os.environ)), capture_output=True, text=True,
                          timeout=600, check=False)
    lines = read_events(f"{events}-rank0.jsonl")
    steps = [e for e in lines if e["event"] == "step"]
    error = next((e["message"] for e in lines if e["event"] == "error"), None)
    where = [x.strip() for x in proc.stderr.splitlines() if x.strip().startswith("File ")][-3:]
    return {"case": name, "max_in_cpu": keep, "nvme_partitions": on_nvme, "swappable_partitions": swappable,
            "stage3_prefetch_bucket_size": prefetch, "buffer_count": z["offload_param"]["buffer_count"],
            "exit": proc.returncode, "steps_done": len(steps), "error": error, "traceback_tail": where if error else [],
            "losses": [round(e["loss"], 6) for e in steps], "step_seconds": [round(e["seconds"], 3) for e in steps],
            "wall_s": round(time.monotonic() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON document to write")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="split-prefetch-")
    load = [round(x, 2) for x in os.getloadavg()]
    runs = [run_case(name, tail, prefetch, work) for name, tail, prefetch in CASES]
    doc = {"kind": "stock_split_prefetch", "command": " ".join(["python", *sys.argv]),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": {"host": platform.node(), "cpu_count": os.cpu_count(), "loadavg_before": load,
                       "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
           "deepspeed_version": installed_deepspeed_version(),
           "job": {"model": MODEL, "seq_len": SEQ, "steps": STEPS, "dtype": DTYPE, "mode": "tuned",
                   "checkpointing": "full", "loss": "chunked", "sub_group_size": SUB_GROUP},
           "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    for r in runs:
        print(f"{r['case']:45s} max_in_cpu {r['max_in_cpu']:>9,} nvme {r['nvme_partitions']:>2}/"
              f"{r['swappable_partitions']} prefetch {r['stage3_prefetch_bucket_size']:>10,}: exit {r['exit']}, "
              f"{r['steps_done']} steps, {r['error'] or 'ok'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
