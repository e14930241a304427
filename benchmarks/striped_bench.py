"""Several SSDs as one region: memascend's SSD-bound tokens/s on a region of 1, 2 and 3 members, each member a loop
device throttled to the same bandwidth (`memascend bench --ssd-bandwidth`, one io-cgroup limit per member device),
the same job and knobs, in one sitting. What it asks: 2 members near 2x one member's tokens/s, 3 near 3x.

Root (loop devices, io cgroups). Each member is a loop device over a sparse file in --backing-dir, by default on tmpfs:
a loop device's own I/O to its backing file is charged to the run's io cgroup (memascend_cli/run/iolimit.py), and the
bench also throttles the disk under its swap folder (--work-dir), so backing files on that disk would put every member
behind that one disk's limit; on tmpfs each member's limit is its own, as separate drives' would be. The regions are
made with `prepare-ssd --no-probe` (every region's engine then runs the same default queue depth and request size),
re-made over the first N loops for each N. Rounds go 1, 2, 3 members, then again
(--rounds), so machine load drifting during the sitting hits every count alike. The machine's load average is recorded
before and after every run, and the niceness the sitting ran at (on a shared machine, `nice -n -10` keeps the runs'
compute from queueing behind other jobs, so the SSD limits bind as they would on a machine of its own).

    python benchmarks/striped_bench.py --out docs/bench/striped/llama-136m-fp32-400mbs.json.gz
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

from memascend_cli.bench.document import write_summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "memascend_cli"]


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def attach_loops(backing_dir: str, count: int, member_gib: int) -> list[tuple[str, str]]:
    """(loop device, backing file) for `count` fresh members of `member_gib` GiB each (sparse: what the runs write
    takes memory on tmpfs, nothing more)."""
    os.makedirs(backing_dir, exist_ok=True)
    loops = []
    for i in range(count):
        path = os.path.join(backing_dir, f"member{i}.img")
        if os.path.exists(path):
            os.unlink(path)
        with open(path, "wb") as f:
            f.truncate(member_gib << 30)
        dev = subprocess.run(["losetup", "-f", "--show", path], check=True, capture_output=True, text=True).stdout.strip()
        loops.append((dev, path))
    return loops


def detach_loops(loops: list[tuple[str, str]]) -> None:
    for dev, path in loops:
        subprocess.run(["losetup", "-d", dev], check=False)
        if os.path.exists(path):
            os.unlink(path)


def bench_args(a, region: str, out: str) -> list[str]:
    """The bench run of one member count: identical but for the region. Pure."""
    return ["bench", "--model", a.model, "--seq-len", str(a.seq_len), "--steps", str(a.steps), "--dtype", a.dtype,
            "--runs", a.run, "--ssd-bandwidth", a.bandwidth, "--gradient-clipping", str(a.gradient_clipping),
            "--settle-cap", "30", "--region", region, "--out", out, "--json"]


def run_one(a, loops: list[tuple[str, str]], n: int, out: str) -> dict:
    members = [dev for dev, _ in loops[:n]]
    subprocess.run([*CLI, "prepare-ssd", *members, "--no-probe", "--yes", "--force", "--label", f"striped-{n}"],
                   check=True, capture_output=True, cwd=REPO)
    args = bench_args(a, members[0], out)
    before = loadavg()
    t0 = time.monotonic()
    p = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=REPO, check=False)
    wall = time.monotonic() - t0
    rec = {"members": n, "devices": members, "bench_args": args, "exit": p.returncode, "wall_s": round(wall, 1),
           "loadavg_before": before, "loadavg_after": loadavg()}
    if p.returncode != 0:
        rec["stderr_tail"] = p.stderr[-2000:]
        return rec
    run = json.loads(p.stdout)["runs"][0]
    job = json.loads(p.stdout)["job"]
    rec.update({k: run.get(k) for k in ("tokens_per_s", "seconds_per_step", "first_step_seconds",
                                        "ssd_read_bytes_per_step", "ssd_write_bytes_per_step", "cpu_seconds")})
    rec["ssd_throttle"] = [{"device": t["device"], "read_bytes_per_s": t["read_bytes_per_s"],
                            "write_bytes_per_s": t["write_bytes_per_s"]} for t in job.get("ssd_throttle") or []]
    return rec


def summarize(runs: list[dict]) -> dict:
    """Median tokens/s per member count and its ratio to one member's. Pure."""
    by_n: dict[int, list[float]] = {}
    for r in runs:
        if r.get("tokens_per_s"):
            by_n.setdefault(r["members"], []).append(r["tokens_per_s"])
    med = {n: statistics.median(v) for n, v in sorted(by_n.items())}
    base = med.get(1)
    return {"median_tokens_per_s": {str(n): round(v, 3) for n, v in med.items()},
            "ratio_to_one_member": {str(n): round(v / base, 3) for n, v in med.items()} if base else {}}


def machine() -> dict:
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    return {"host": platform.node(), "kernel": platform.release(), "cpu": cpu, "cores": os.cpu_count(),
            "mem_gib": round(mem_kib / 2**20, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON record to write")
    ap.add_argument("--backing-dir", default="/dev/shm/memascend-striped", help="the loop devices' backing files")
    ap.add_argument("--work-dir", default="/var/tmp/memascend-striped", help="the bench runs' output and swap folders "
                    "(a disk file system: the bench refuses tmpfs)")
    ap.add_argument("--members", default="1,2,3")
    ap.add_argument("--member-gib", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bandwidth", default="400MB/s")
    ap.add_argument("--model", default="bench-llama-136m")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--run", default="memascend")
    ap.add_argument("--gradient-clipping", type=float, default=10.0)
    a = ap.parse_args()
    counts = [int(x) for x in a.members.split(",")]
    # A SIGTERM (a timeout) unwinds through `finally`, which detaches the loop devices.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    loops = attach_loops(a.backing_dir, max(counts), a.member_gib)
    doc = {"command": "python benchmarks/striped_bench.py " + shlex.join(sys.argv[1:]),
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": machine(),
           "loadavg_start": loadavg(), "backing": "loop devices over sparse files on " + a.backing_dir,
           "nice": os.nice(0), "runs": []}
    try:
        for rnd in range(a.rounds):
            for n in counts:
                rec = run_one(a, loops, n, os.path.join(a.work_dir, f"out-{n}-{rnd}"))
                rec["round"] = rnd
                doc["runs"].append(rec)
                print(json.dumps({k: rec.get(k) for k in ("round", "members", "exit", "tokens_per_s",
                                                          "seconds_per_step", "loadavg_before")}), flush=True)
                write(doc, a.out)  # after every run: a sitting cut short keeps what it measured
    finally:
        detach_loops(loops)
    doc["loadavg_end"] = loadavg()
    write(doc, a.out)
    print(json.dumps({k: doc[k] for k in ("median_tokens_per_s", "ratio_to_one_member")}))
    return 0


def write(doc: dict, out: str) -> None:
    doc.update(summarize(doc["runs"]))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_summary(out, doc)  # gzipped where --out ends in .gz, as the repository keeps it


if __name__ == "__main__":
    sys.exit(main())
