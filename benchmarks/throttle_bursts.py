"""How a per-direction cgroup throttle (`bench --ssd-bandwidth`) treats reads and writes that alternate: the data behind
the time model's THROTTLE_OVERLAP_BURST_S (memascend_cli/planner/time.py).

Stock DeepSpeed's optimizer swaps each sub-group in (reads), steps it, and swaps it out (writes), waiting for each; the
kernel budgets reads and writes separately. A child process in a throttled cgroup does exactly that with O_DIRECT
bursts of one size, read then write, and reports the elapsed time over one direction's time at the limit: 1.0 when the
directions overlap as if concurrent (the waiting one kept its budget), 2.0 when they add up.

Usage (root; cgroup v1 blkio or v2 io; a file system on a disk, not tmpfs; about a minute):
    python benchmarks/throttle_bursts.py --dir /var/tmp/thr --out docs/bench/micro/throttle-bursts.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import mmap
import os
import platform
import subprocess
import sys
import time

MiB = 1 << 20
BUF_BYTES = 8 * MiB
DEFAULT_BURSTS_MIB = (8, 16, 32, 48, 64, 72, 76, 80, 96, 128, 256)


def child(path: str, bursts_mib: list[int], volume_bytes: int, bytes_per_s: int) -> list[dict]:
    buf = mmap.mmap(-1, BUF_BYTES)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(BUF_BYTES))
    src, dst = path + ".read", path + ".write"
    for name in (src, dst):
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
        try:
            for off in range(0, volume_bytes, BUF_BYTES):
                os.pwritev(fd, [buf], off)
        finally:
            os.close(fd)
    rfd, wfd = os.open(src, os.O_RDONLY | os.O_DIRECT), os.open(dst, os.O_WRONLY | os.O_DIRECT)
    out = []
    try:
        for mib in bursts_mib:
            burst = mib * MiB
            n = max(2, volume_bytes // burst)
            t0 = time.perf_counter()
            for i in range(n):
                off = (i * burst) % max(BUF_BYTES, volume_bytes - burst + 1)
                off -= off % BUF_BYTES
                for o in range(0, burst, BUF_BYTES):
                    os.preadv(rfd, [buf], off + o)
                for o in range(0, burst, BUF_BYTES):
                    os.pwritev(wfd, [buf], off + o)
            elapsed = time.perf_counter() - t0
            one_direction = n * burst / bytes_per_s
            out.append({"burst_bytes": burst, "burst_s_at_limit": round(burst / bytes_per_s, 4), "bursts": n,
                        "elapsed_s": round(elapsed, 3), "over_one_direction": round(elapsed / one_direction, 3)})
    finally:
        os.close(rfd)
        os.close(wfd)
        for name in (src, dst):
            os.unlink(name)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="a folder on the disk to throttle (ext4, xfs; not tmpfs)")
    ap.add_argument("--bandwidth-mbs", type=int, default=400, help="the limit each way, MB/s (default 400)")
    ap.add_argument("--bursts-mib", default=",".join(map(str, DEFAULT_BURSTS_MIB)))
    ap.add_argument("--volume-mib", type=int, default=800, help="bytes moved each way per burst size")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", help="write the JSON here (default: stdout)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    bps = a.bandwidth_mbs * 1_000_000
    bursts = [int(x) for x in a.bursts_mib.split(",")]
    path = os.path.join(a.dir, "burst")
    if a.child:
        json.dump(child(path, bursts, a.volume_mib * MiB, bps), sys.stdout)
        return 0

    from memascend_cli.run.cgroup import RunCgroup
    from memascend_cli.run.iolimit import resolve_limits

    os.makedirs(a.dir, exist_ok=True)
    limits = resolve_limits([a.dir], bps)
    runs = []
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--dir", a.dir, "--bandwidth-mbs",
           str(a.bandwidth_mbs), "--bursts-mib", a.bursts_mib, "--volume-mib", str(a.volume_mib)]
    for _ in range(a.repeat):
        with RunCgroup(label="throttle-bursts", io_limits=tuple(limits)) as cg:
            res = subprocess.run(cmd, preexec_fn=cg.join, capture_output=True, text=True, check=True)
        runs.append(json.loads(res.stdout))
    doc = {"schema_version": 1, "kind": "throttle-bursts",
           "what": "serial O_DIRECT read-then-write bursts in a cgroup throttled each way: elapsed over one "
                   "direction's time at the limit (1.0: the directions overlap, 2.0: they add up)",
           "bytes_per_s_each_way": bps, "device": limits[0].device,
           "rotational": _read(f"/sys/block/{limits[0].device}/queue/rotational"),
           "kernel": platform.release(), "repeats": runs,
           "meta": {"command": "python " + " ".join(["benchmarks/throttle_bursts.py"] + (argv or sys.argv[1:])),
                    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "host": platform.node()}}
    text = json.dumps(doc, separators=(",", ":")) + "\n"  # compact: the repository counts lines
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    for rows in zip(*runs):
        print(f"{rows[0]['burst_bytes'] // MiB:5d} MiB ({rows[0]['burst_s_at_limit']:.3f} s at the limit): "
              + " ".join(f"{r['over_one_direction']:.2f}" for r in rows), file=sys.stderr)
    return 0


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
