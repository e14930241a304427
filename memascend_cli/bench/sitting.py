"""What the machine delivers in this sitting, recorded next to a bench's runs: the same job's step time moved 1.5x
between sittings of one VM (2026-11-24 against 2026-11-29, the same code) while the cached matmul probe stood still,
and nothing in the documents told the two sittings apart. A matmul probe and a sequential O_DIRECT write/read in the
swap directory, a few seconds before the first run."""

from __future__ import annotations

import mmap
import os
import tempfile
import time

from memascend_cli.units import MiB

DISK_PROBE_BYTES = 256 * MiB
"""Written then read once: past the VM host's write cache bursts, still ~0.5 s at 1 GB/s."""
DISK_REQUEST_BYTES = 4 * MiB
"""One request at a time, as `dd bs=4M oflag=direct` (the figure the notes and GPU kit quote)."""


def disk_probe(directory: str, *, size_bytes: int = DISK_PROBE_BYTES,
               request_bytes: int = DISK_REQUEST_BYTES) -> dict:
    """Sequential O_DIRECT write (then fdatasync) and read of a temporary file in `directory`:
    {"write_gbps", "read_gbps"}, or {"error"} where the file system refuses O_DIRECT or space runs out."""
    try:
        fd_tmp, path = tempfile.mkstemp(prefix=".memascend-sitting-", dir=directory)
    except OSError as exc:
        return {"error": f"cannot create a probe file in {directory}: {exc.strerror}"}
    os.close(fd_tmp)
    buf = mmap.mmap(-1, request_bytes)  # page aligned, as O_DIRECT needs
    try:
        buf.write(os.urandom(4096) * (request_bytes // 4096))
        fd = os.open(path, os.O_RDWR | os.O_DIRECT)
        try:
            n = size_bytes // request_bytes
            t0 = time.perf_counter()
            for i in range(n):
                os.pwritev(fd, [buf], i * request_bytes)
            os.fdatasync(fd)
            t1 = time.perf_counter()
            for i in range(n):
                os.preadv(fd, [buf], i * request_bytes)
            t2 = time.perf_counter()
        finally:
            os.close(fd)
        done = n * request_bytes
        return {"write_gbps": round(done / (t1 - t0) / 1e9, 3), "read_gbps": round(done / (t2 - t1) / 1e9, 3)}
    except OSError as exc:
        return {"error": f"O_DIRECT I/O in {directory} failed: {exc.strerror}"}
    finally:
        buf.close()
        os.unlink(path)


def sitting_probe(directory: str) -> dict:
    """This sitting's matmul GFLOP/s and memory triad GB/s (compute_probe's child process; absent when torch fails)
    and disk_probe's rates in `directory`, with what was measured."""
    from memascend_cli.compute_probe import run_probe

    out: dict = {"disk_request_bytes": DISK_REQUEST_BYTES, "disk_probe_bytes": DISK_PROBE_BYTES}
    found = run_probe()
    if found:
        out.update({k: v for k, v in found.items() if k.startswith(("fp32_", "bf16_", "fp16_", "onednn_", "mem_"))
                    or k in ("threads", "incomplete")})
        out["matmul_n"] = found.get("fp32_n")
    out.update({"disk_" + k: v for k, v in disk_probe(directory).items()})
    return out


def sitting_text(probe: dict | None) -> str | None:
    """One line for the console and results.md: "matmul 152 GFLOP/s fp32 (cached probe 181.2: -16%), memory 9.8 GB/s
    triad (cached probe 10.5: -7%), disk 1.20 / 1.00 GB/s write / read (O_DIRECT, 4 MiB, one at a time)"; None without
    a probe. Pure."""
    if not probe:
        return None
    parts = []
    for key, what in (("fp32_gflops", "matmul {:g} GFLOP/s fp32"), ("mem_triad_gbps", "memory {:g} GB/s triad")):
        if probe.get(key):
            part = what.format(probe[key])
            cached = probe.get(f"cached_{key}")
            if cached:
                part += f" (cached probe {cached:g}: {(probe[key] - cached) / cached * 100:+.0f}%)"
            parts.append(part)
    if probe.get("disk_write_gbps"):
        parts.append(f"disk {probe['disk_write_gbps']:.2f} / {probe['disk_read_gbps']:.2f} GB/s write / read "
                     f"(O_DIRECT, {probe['disk_request_bytes'] // MiB} MiB, one at a time)")
    elif probe.get("disk_error"):
        parts.append(f"disk not measured ({probe['disk_error']})")
    return ", ".join(parts) or None
