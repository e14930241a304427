#!/usr/bin/env python3
"""Fused non-finite scan vs `torch.isinf(x).any() or torch.isnan(x).any()` on CPU.

For each dtype: wall time (median of --repeats) and extra peak memory of one call, measured as
VmHWM - VmRSS after resetting the peak with `echo 5 > /proc/self/clear_refs` (proc(5), Linux >= 4.0).
The data is finite by default (both sides must read every element: the worst case for the scan,
and what a healthy training step looks like); --special puts an inf/nan at first/middle/last.

Quick:  python benchmarks/scan_bench.py --numel 16M
Full:   python benchmarks/scan_bench.py --numel 256M
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from memascend_engine.procfs import status_kib


def parse_count(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    return int(float(t[:-1]) * units[t[-1]]) if t[-1] in units else int(t)


def peak_delta_mib(fn):
    """(result, extra peak MiB over the RSS at call time) for one call of fn."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM (and ru_maxrss) to the current RSS
    base = status_kib("VmRSS")
    result = fn()
    return result, (status_kib("VmHWM") - base) / 1024


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", default="256M", help="elements per tensor (default 256M)")
    p.add_argument("--dtypes", default="float16,bfloat16,float32")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="scan threads (0: all cores)")
    p.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: leave default)")
    p.add_argument("--special", choices=["none", "first", "middle", "last"], default="none")
    p.add_argument("--json", help="write the raw results here (scripts/results.py reads docs/bench/micro/*.json)")
    args = p.parse_args()
    n = parse_count(args.numel)

    import torch
    from memascend_engine import native

    ok, why = native.available()
    if not ok:
        sys.exit(f"native extension unavailable: {why}")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(
        f"numel {n:,} ({n / 2**20:.0f}M), special={args.special}, scan threads={args.threads or 'all'}, "
        f"torch threads={torch.get_num_threads()}, repeats={args.repeats}"
    )
    print(
        f"{'dtype':9} {'MiB':>6} {'scan ms':>9} {'torch ms':>9} {'speedup':>8} {'scan GB/s':>9} "
        f"{'scan +MiB':>9} {'torch +MiB':>10}  agree"
    )

    rows = []
    for name in args.dtypes.split(","):
        dt = getattr(torch, name)
        x = torch.empty(n, dtype=dt).uniform_(-100.0, 100.0)
        if args.special != "none":
            x[{"first": 0, "middle": n // 2, "last": n - 1}[args.special]] = float("inf")

        def scan(x=x):
            return native.has_nonfinite_tensor(x, args.threads)

        def ref(x=x):
            return bool(torch.isinf(x).any() or torch.isnan(x).any())

        scan(), ref()  # warm up: page-in, thread pools, lazy init
        scan_t, ref_t = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            a = scan()
            scan_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b = ref()
            ref_t.append(time.perf_counter() - t0)
        a, scan_mib = peak_delta_mib(scan)
        b, ref_mib = peak_delta_mib(ref)
        s, r = statistics.median(scan_t), statistics.median(ref_t)
        nbytes = x.numel() * x.element_size()
        print(
            f"{name:9} {nbytes / 2**20:6.0f} {s * 1e3:9.1f} {r * 1e3:9.1f} {r / s:7.1f}x {nbytes / s / 1e9:9.1f} "
            f"{scan_mib:9.1f} {ref_mib:10.1f}  {a == b} ({a})"
        )
        rows.append({"dtype": name, "bytes": nbytes, "scan_s": scan_t, "torch_s": ref_t, "scan_extra_mib": scan_mib,
                     "torch_extra_mib": ref_mib, "agree": a == b})
        del x
    if args.json:
        import json
        import socket
        from datetime import datetime, timezone

        with open(args.json, "w") as f:
            json.dump({"kind": "scan_bench", "command": "python benchmarks/scan_bench.py " + " ".join(sys.argv[1:]),
                       "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": socket.gethostname(),
                       "numel": n, "special": args.special, "threads": args.threads,
                       "torch_threads": torch.get_num_threads(), "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
