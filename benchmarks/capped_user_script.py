"""A user's script under `memascend plan`'s recommended DRAM cap: does the job survive the cap the plan advises?

The job is user_script_bench.py's 155.7M-parameter fp32 DeepSpeed script with the model built whole outside zero.Init
(ds-nockpt-fp32-eager-156m: seq 512, micro-batch 2, no checkpointing, 6 steps, memascend through install()). The cap
is what `plan --json` gives as dram_cap.smallest_bytes for that job (the plan's peak plus the measured run-to-run
spread), set on a memory cgroup (memascend_cli/run/cgroup.py: v1 memory.limit_in_bytes, swap capped too where the
kernel accounts it) that the script alone runs in. DeepSpeed's JIT ops are loaded once outside the cap first: a first
run compiles them inside the job's memory (two compilers at ~1 GB each), which no cap advice covers; a run during
which an op's library changed is recorded as not valid.

    python benchmarks/capped_user_script.py --out docs/bench/user-script/capped-156m.json --runs 3

Needs root (cgroups). Each run records the exit status, the steps trained, the cgroup's peak and its OOM kills.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import user_script_bench as usb

JOB = usb.Job("ds", False, steps=6, dtype="fp32", zero_init=False, model="156m")
# The JIT ops a DeepSpeed NVMe-offload script loads on the CPU accelerator (scripts/bootstrap.sh prebuilds the same).
LOAD_OPS = ("from deepspeed.comm.torch import build_shm_op; "
            "from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder; "
            "CPUAdamBuilder().load(); build_shm_op(); AsyncIOBuilder().load()")


def op_libraries(ext_dir: str) -> dict[str, float]:
    """Each built op library under TORCH_EXTENSIONS_DIR with its modification time."""
    return {p: os.path.getmtime(p) for p in glob.glob(os.path.join(ext_dir, "*", "*.so"))}


def steps_trained(script_out: dict | None, log_text: str) -> int:
    """Steps the script finished: its losses, else the 'step N' phases it printed before it died. Pure."""
    if script_out and script_out.get("losses") is not None:
        return len(script_out["losses"])
    return sum(1 for line in log_text.splitlines()
               if line.startswith("phase ") and json.loads(line[6:]).get("phase", "").startswith("step "))


def capped_run(n: int, cap_bytes: int, cmd: list[str], env: dict, out: str, log: str, ext_dir: str) -> dict:
    """One run of `cmd` alone in a memory cgroup capped at `cap_bytes`."""
    from memascend_cli.run.cgroup import MemoryCap

    before = op_libraries(ext_dir)
    load = [round(x, 2) for x in os.getloadavg()]
    with MemoryCap(cap_bytes, label="capped-user-script") as cg, open(log, "wb") as f:
        # cg.join runs plain os calls between fork and exec (this process has no other threads)
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                                preexec_fn=cg.join)  # noqa: PLW1509
        _, status, rusage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        cap = cg.result(sigkilled=proc.returncode == -9)
    script_out = None
    if os.path.exists(out):
        with open(out) as f:
            script_out = json.load(f)
    with open(log, errors="replace") as f:
        steps = steps_trained(script_out, f.read())
    rebuilt = sorted(os.path.relpath(p, ext_dir) for p, t in op_libraries(ext_dir).items() if before.get(p) != t)
    run = {"run": n, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg_at_start": load,
           "exit_code": proc.returncode, "cap_bytes": cap_bytes, "cgroup_max_usage_bytes": cap.peak_bytes,
           "oom_kills": cap.oom_kills, "oom_killed": cap.oom_killed, "steps": steps,
           "ru_maxrss_bytes": rusage.ru_maxrss * 1024,
           "vm_hwm_bytes": (script_out or {}).get("status_kib", {}).get("VmHWM", 0) * 1024 or None,
           "valid": not rebuilt}
    if rebuilt:
        run["why_not"] = f"a JIT op was built during the run ({', '.join(rebuilt)}): not the job alone under the cap"
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default=None, help="scratch folder on the SSD (default: a temporary one under /var/tmp)")
    args = ap.parse_args(argv)
    from memascend_cli.bench.runner import create_region

    work = args.work or tempfile.mkdtemp(prefix="capped-user-script-", dir="/var/tmp")
    model_dir = usb.model_folder(work, JOB)
    plan = usb.run_plan(JOB, model_dir)
    cap_bytes = plan["dram_cap"]["smallest_bytes"]
    region, nvme = os.path.join(work, "region.bin"), os.path.join(work, "nvme")
    create_region(region, usb.region_bytes(plan), ranks=1)
    env = usb.script_env(os.environ)
    subprocess.run([sys.executable, "-c", LOAD_OPS], env=env, check=True, capture_output=True)
    runs = []
    for n in range(1, args.runs + 1):
        shutil.rmtree(nvme, ignore_errors=True)
        os.makedirs(nvme)
        out, log = os.path.join(work, f"run{n}.json"), os.path.join(work, f"run{n}.log")
        cmd = usb.script_command(JOB, "memascend", model_dir=model_dir, region=region, nvme_path=nvme, out=out)
        runs.append(capped_run(n, cap_bytes, cmd, env, out, log, env["TORCH_EXTENSIONS_DIR"]))
        print(json.dumps(runs[-1]), flush=True)
    valid = [r for r in runs if r["valid"]]
    plan_cmd = usb.plan_command(JOB, model_dir="MODEL")
    doc = {"title": "The 155.7M fp32 user script built outside zero.Init under plan's recommended DRAM cap",
           "command": "python benchmarks/capped_user_script.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "cap": "memory cgroup limit = " + " ".join(plan_cmd[plan_cmd.index("plan"):]) + ": dram_cap.smallest_bytes",
           "cap_line": plan["dram_cap"]["line"],
           "script": " ".join(os.path.relpath(c, usb.REPO) if c.startswith(usb.REPO) else c
                              for c in usb.script_command(JOB, "memascend", model_dir="MODEL", region="R",
                                                          nvme_path="N", out="O")[1:]),
           "date": f"{runs[0]['date']} .. {runs[-1]['date']}" if runs else None,
           "plan_peak_bytes": plan["engines"]["memascend"]["host_peak_bytes"], "host": platform.node(),
           "machine": {"cpus": os.cpu_count(),
                       "dram_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / usb.GiB, 1)},
           "model": "benchmarks/user_script_bench.py MODELS['156m']", "runs": runs, "valid_runs": len(valid),
           "valid_runs_trained_all_steps": sum(r["steps"] == JOB.steps and r["exit_code"] == 0 and not r["oom_killed"]
                                               for r in valid)}
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{doc['valid_runs_trained_all_steps']} of {doc['valid_runs']} valid runs trained all {JOB.steps} steps "
          f"under {cap_bytes / usb.GiB:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
