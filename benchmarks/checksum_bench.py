#!/usr/bin/env python3
"""CRC-32C throughput of the native core vs raw O_DIRECT I/O, and the Direct NVMe store with and
without checksums, on this machine.

Measures (medians of --repeats, GB/s = 10**9 B/s):
  crc32c sse4.2 / portable   native.crc32c_chunks over --size of page-aligned memory, 64 KiB chunks
                             (the store's granularity); "portable" runs in a child with
                             MEMASCEND_CRC32C=portable
  zlib.crc32                 the stdlib's CRC-32 over the same bytes, for scale
  raw write / read           native.IOEngine, sequential 1 MiB O_DIRECT requests, queue depth 32,
                             on a region file in --dir (not tmpfs)
  store write / read         RegionStore.submit/complete in 4 MiB keys, verify on and off: what the
                             checksums cost on the data path (computed while the write is in flight,
                             checked after the read)

Quick:  python benchmarks/checksum_bench.py --size 256M --dir /var/tmp --out /tmp/checksum.json
Table:  python benchmarks/checksum_bench.py --table docs/checksum-bench/run*.json   (markdown from the JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHUNK_BYTES = 64 * 1024
KEY_BYTES = 4 << 20


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    return int(float(t[:-1]) * units[t[-1]]) if t[-1] in units else int(t)


def _median_gbps(nbytes: int, fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def crc_gbps(size: int, repeats: int) -> dict:
    from memascend_engine import native

    buf = native.AlignedBuffer(size, lock=False)
    memoryview(buf)[:] = os.urandom(1 << 20) * (size >> 20)
    gbps = _median_gbps(size, lambda: native.crc32c_chunks([(buf.address, size)], CHUNK_BYTES), repeats)
    return {"backend": native.crc32c_backend(), "gbps": gbps}


def zlib_gbps(size: int, repeats: int) -> float:
    data = os.urandom(1 << 20) * (size >> 20)
    return _median_gbps(size, lambda: zlib.crc32(data), repeats)


def raw_io_gbps(path: str, size: int, repeats: int) -> dict:
    from memascend_engine import native

    buf = native.AlignedBuffer(size, lock=False)
    memoryview(buf)[:] = os.urandom(1 << 20) * (size >> 20)
    with native.IOEngine(path, writable=True, queue_depth=32, block_size=1 << 20) as eng:
        w = _median_gbps(size, lambda: eng.write(buf.address, size, 0), repeats)
        r = _median_gbps(size, lambda: eng.read(buf.address, size, 0), repeats)
        backend = eng.backend
    return {"write_gbps": w, "read_gbps": r, "backend": backend}


def store_gbps(region: str, size: int, repeats: int, verify: bool) -> dict:
    from memascend_engine import native
    from memascend_engine.direct_nvme import RegionStore

    store = RegionStore(region, 0, verify=verify, queue_depth=32, block_size=1 << 20)
    try:
        n = size // KEY_BYTES
        bufs = [native.AlignedBuffer(KEY_BYTES, lock=False) for _ in range(n)]
        for b in bufs:
            memoryview(b)[:] = os.urandom(KEY_BYTES)

        def run(op):
            # DeepSpeed's pattern: submit a batch of keys, then wait for all of them.
            pend = [store.submit(op, b.address, KEY_BYTES, f"/k/{i}.swp", 0) for i, b in enumerate(bufs)]
            for p in pend:
                store.complete(p)

        run("w")
        w = _median_gbps(n * KEY_BYTES, lambda: run("w"), repeats)
        r = _median_gbps(n * KEY_BYTES, lambda: run("r"), repeats)
        return {"verify": verify, "write_gbps": w, "read_gbps": r}
    finally:
        store.close()


def measure(args) -> dict:
    sys.path.insert(0, str(REPO))
    size = parse_size(args.size)
    if size % (KEY_BYTES) or size < KEY_BYTES:
        raise SystemExit(f"--size must be a multiple of {KEY_BYTES >> 20} MiB")
    out = {"size_bytes": size, "chunk_bytes": CHUNK_BYTES, "repeats": args.repeats, "host": platform.node(),
           "cpu": _cpu_model(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out["crc32c"] = crc_gbps(size, args.repeats)
    child = subprocess.run([sys.executable, __file__, "--crc-only", "--size", args.size, "--repeats", str(args.repeats)],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "MEMASCEND_CRC32C": "portable", "PYTHONPATH": str(REPO)})
    out["crc32c_portable"] = json.loads(child.stdout)
    out["zlib_crc32_gbps"] = zlib_gbps(size, args.repeats)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        raw = os.path.join(d, "raw.bin")
        out["raw_io"] = raw_io_gbps(raw, size, args.repeats)
        os.unlink(raw)
        region = os.path.join(d, "bench.region")
        subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", region, "--size",
                        f"{(size >> 20) + 64}MiB", "--no-probe", "--yes"], check=True, capture_output=True)
        out["store_verify_on"] = store_gbps(region, size, args.repeats, True)
        out["store_verify_off"] = store_gbps(region, size, args.repeats, False)
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def table(docs: list[dict]) -> str:
    """Markdown: one row per measurement, one column per run (write / read, or the checksum rate)."""
    def cell(doc, key):
        if key in ("crc32c", "crc32c_portable"):
            return f"{doc[key]['gbps']:.2f}"
        if key == "zlib":
            return f"{doc['zlib_crc32_gbps']:.2f}"
        return f"{doc[key]['write_gbps']:.2f} / {doc[key]['read_gbps']:.2f}"

    names = [("crc32c", f"crc32c, {docs[0]['crc32c']['backend']} (64 KiB chunks)"),
             ("crc32c_portable", "crc32c, portable tables"),
             ("zlib", "zlib.crc32 (stdlib, for scale)"),
             ("raw_io", f"raw O_DIRECT write / read ({docs[0]['raw_io']['backend']}, 1 MiB, QD 32)"),
             ("store_verify_on", "Direct NVMe store write / read, checksums on"),
             ("store_verify_off", "Direct NVMe store write / read, checksums off")]
    head = "| GB/s | " + " | ".join(d["measured_at"] for d in docs) + " |"
    lines = [head, "|---|" + "---:|" * len(docs)]
    lines += [f"| {label} | " + " | ".join(cell(d, key) for d in docs) + " |" for key, label in names]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="256M", help="bytes per measurement (multiple of 4M)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", default="/var/tmp", help="directory for the raw-I/O file and the region (ext4/xfs)")
    p.add_argument("--out", help="write the JSON here")
    p.add_argument("--table", metavar="JSON", nargs="+", help="print the markdown table of saved JSON runs and exit")
    p.add_argument("--crc-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.table:
        print(table([json.loads(Path(t).read_text()) for t in args.table]))
        return 0
    if args.crc_only:
        sys.path.insert(0, str(REPO))
        print(json.dumps(crc_gbps(parse_size(args.size), args.repeats)))
        return 0
    doc = measure(args)
    text = json.dumps(doc, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    print(table([doc]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
