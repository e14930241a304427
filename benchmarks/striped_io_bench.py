"""The striped region's I/O path alone: GB/s written and read through the Direct NVMe store (engine/direct_nvme.py over
engine/striped_io.py) on regions of 1, 2 and 3 loop-device members, each member's device throttled to the same
bandwidth by its own cgroup-v1 blkio limit, in one sitting (rounds interleaved). No training: what the engine's
submission keeps in flight per member, without the step's compute (benchmarks/striped_bench.py measures the job).

Root. The loop devices are benchmarks/striped_bench.py's (sparse files on tmpfs: each member's limit its own). The
process moves itself into a fresh blkio cgroup with one read and one write limit per member device, writes
--total-mib in --request-mib requests (every request submitted, then every one waited for), then reads them back.

    python benchmarks/striped_io_bench.py --out docs/bench/striped/io-400mbs.json.gz
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

from memascend_cli.bench.document import write_summary

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import striped_bench as sb

BLKIO = "/sys/fs/cgroup/blkio"
MiB = 1 << 20


def _maj_min(dev: str) -> str:
    st = os.stat(dev)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def enter_cgroup(devices: list[str], bytes_per_s: int) -> str:
    """A fresh blkio cgroup limiting every device to `bytes_per_s` each way, with this process in it."""
    path = os.path.join(BLKIO, f"memascend-striped-io-{os.getpid()}")
    os.makedirs(path)
    for dev in devices:
        for f in ("blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"):
            with open(os.path.join(path, f), "w") as fh:
                fh.write(f"{_maj_min(dev)} {bytes_per_s}")
    with open(os.path.join(path, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
    return path


def leave_cgroup(path: str) -> None:
    with open(os.path.join(BLKIO, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
    os.rmdir(path)


def measure(region: str, total_mib: int, request_mib: int) -> dict:
    """GB/s of writing then reading `total_mib` in `request_mib` requests, all submitted before the first wait."""
    from memascend_engine.direct_nvme import RegionStore
    from memascend_engine.native import AlignedBuffer

    store = RegionStore(region, 0, verify=False)
    n = total_mib // request_mib
    buf = AlignedBuffer(request_mib * MiB, lock=False)
    try:
        out = {}
        for op in ("w", "r"):
            t0 = time.perf_counter()
            pending = [store.submit(op, buf.address, request_mib * MiB, f"/k/{i}", 0) for i in range(n)]
            for p in pending:
                store.complete(p)
            out["write_gbps" if op == "w" else "read_gbps"] = round(n * request_mib * MiB / (time.perf_counter() - t0) / 1e9, 3)
        out["member_bytes_written"] = [int(e.bytes_written) for e in getattr(store.engine, "engines", [store.engine])]
        return out
    finally:
        store.close()
        buf.close()


def summarize(runs: list[dict]) -> dict:
    """Median write and read GB/s per member count, and their ratios to one member's. Pure."""
    out = {}
    for key in ("write_gbps", "read_gbps"):
        med = {}
        for r in runs:
            med.setdefault(r["members"], []).append(r[key])
        med = {n: statistics.median(v) for n, v in sorted(med.items())}
        out[f"median_{key}"] = {str(n): round(v, 3) for n, v in med.items()}
        if 1 in med:
            out[f"{key}_ratio_to_one_member"] = {str(n): round(v / med[1], 3) for n, v in med.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backing-dir", default="/dev/shm/memascend-striped-io")
    ap.add_argument("--members", default="1,2,3")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bandwidth-mbs", type=int, default=400, help="each member's limit, MB/s (10**6 B/s)")
    ap.add_argument("--total-mib", type=int, default=2048)
    ap.add_argument("--request-mib", type=int, default=8)
    a = ap.parse_args()
    counts = [int(x) for x in a.members.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    loops = sb.attach_loops(a.backing_dir, max(counts), max(1, a.total_mib // 1024 + 1))
    devices = [dev for dev, _ in loops]
    doc = {"command": "python benchmarks/striped_io_bench.py " + shlex.join(sys.argv[1:]),
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": sb.machine(),
           "backing": "loop devices over sparse files on " + a.backing_dir, "nice": os.nice(0),
           "bandwidth_bytes_per_s_per_member": a.bandwidth_mbs * 10**6, "total_mib": a.total_mib,
           "request_mib": a.request_mib, "verify_checksums": False, "runs": []}
    cg = None
    try:
        cg = enter_cgroup(devices, a.bandwidth_mbs * 10**6)
        for rnd in range(a.rounds):
            for n in counts:
                subprocess.run([*sb.CLI, "prepare-ssd", *devices[:n], "--no-probe", "--yes", "--force"], check=True,
                               capture_output=True, cwd=sb.REPO)
                rec = {"round": rnd, "members": n, "loadavg_before": sb.loadavg(),
                       **measure(devices[0], a.total_mib, a.request_mib)}
                doc["runs"].append(rec)
                print(json.dumps(rec), flush=True)
    finally:
        if cg is not None:
            leave_cgroup(cg)
        sb.detach_loops(loops)
    doc["loadavg_end"] = sb.loadavg()
    doc.update(summarize(doc["runs"]))
    write_summary(a.out, doc)  # gzipped where --out ends in .gz, as the repository keeps it
    print(json.dumps({k: v for k, v in doc.items() if k.startswith("median") or k.endswith("member")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
