#!/usr/bin/env python3
"""Sequential O_DIRECT read/write bandwidth: memascend engine vs fio vs DeepSpeed's aio op.

All tools move the same number of bytes, sequentially, with the same block size and queue depth,
on the same target (a preallocated, fully written file, or a block device / loop device):

* engine io_uring  <->  fio --ioengine=io_uring --iodepth=QD --numjobs=1
  (engine-io_uring-4k: the same with a buffer without transparent huge pages)
* engine threads   <->  fio --ioengine=psync --numjobs=W (each job streams its own 1/W of the range)
* DeepSpeed aio_handle(block_size, QD, single_submit=False, overlap_events=True, intra_op_parallelism=1)
  (libaio, JIT-built; DS_ACCELERATOR=cpu, TORCH_EXTENSIONS_DIR=<repo>/.torch_ext by default)

Each measurement is repeated (--repeats) with the tool order rotated; the median and best GB/s are
printed, with the ratios engine/fio and engine/DeepSpeed. Writes overwrite an already-written file
(no allocation or unwritten-extent conversion in the timed region).

Quick:  python benchmarks/io_bench.py --size 128M --repeats 2
Full:   python benchmarks/io_bench.py --size 1G --repeats 5
Loop:   python benchmarks/io_bench.py --loop --size 512M      (root; 4 KiB sectors with --sector-size 4096)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


# ---------------------------------------------------------------------------------------------
# Target preparation
def prepare_file(path: Path, size: int, native) -> None:
    """Allocate and fully write the file once so that later writes are pure overwrites."""
    if path.exists() and path.stat().st_size >= size:
        return
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)
    chunk = min(size, 64 << 20)
    with native.AlignedBuffer(chunk, lock=False) as buf, native.IOEngine(str(path)) as eng:
        memoryview(buf)[:] = os.urandom(1 << 20) * (chunk >> 20)
        for off in range(0, size, chunk):
            eng.write(buf.address, min(chunk, size - off), off)
        eng.sync()


def attach_loop(backing: Path, size: int, sector_size: int) -> str:
    if os.geteuid() != 0 or not os.path.exists("/dev/loop-control"):
        sys.exit("--loop needs root and /dev/loop-control")
    with open(backing, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)
    out = subprocess.run(
        ["losetup", "-f", "--show", "--direct-io=on", "--sector-size", str(sector_size), str(backing)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


# ---------------------------------------------------------------------------------------------
# Runners: each returns seconds for moving `size` bytes (fio: bytes / its own bandwidth).
def engine_runner(native, target: str, size: int, args, backend: str, op: str) -> Callable[[], float]:
    # "io_uring-4k": same engine, buffer without transparent huge pages (one DMA segment per 4 KiB
    # page, like an ordinary malloc'd buffer) -- shows how much of the result is the buffer's doing.
    small_pages = backend.endswith("-4k")
    backend = backend.removesuffix("-4k")
    buf = native.AlignedBuffer(size, lock=True, huge_pages=not small_pages)
    memoryview(buf)[:] = os.urandom(1 << 20) * (size >> 20) + os.urandom(size & ((1 << 20) - 1))
    eng = native.IOEngine(
        target, backend=backend, block_size=args.block_size, queue_depth=args.queue_depth, num_workers=args.num_workers
    )
    if eng.backend != backend:
        raise RuntimeError(f"engine backend {eng.backend} != {backend}: {eng.backend_reason}")
    fn = eng.write if op == "write" else eng.read

    def run() -> float:
        t0 = time.perf_counter()
        fn(buf.address, size, 0)
        return time.perf_counter() - t0

    run.resources = (buf, eng)  # keep alive for the closure's lifetime
    return run


def fio_runner(target: str, size: int, args, ioengine: str, op: str) -> Callable[[], float]:
    queued = ioengine in ("io_uring", "libaio")  # one job, queue_depth in flight; else one I/O per job
    jobs = 1 if queued else args.num_workers
    per_job = size // jobs // args.block_size * args.block_size
    cmd = [
        "fio",
        "--name=seq",
        f"--filename={target}",
        f"--rw={op}",
        f"--bs={args.block_size}",
        "--direct=1",
        f"--ioengine={ioengine}",
        f"--size={per_job}",
        f"--numjobs={jobs}",
        f"--offset_increment={per_job}",
        "--group_reporting",
        "--output-format=json",
        "--thread",
        "--end_fsync=0",
        "--invalidate=1",
    ]
    if queued:
        cmd.append(f"--iodepth={args.queue_depth}")

    def run() -> float:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        res = json.loads(out.stdout[out.stdout.index("{") :])
        job = res["jobs"][0][op]
        if job.get("io_bytes", 0) != per_job * jobs or res["jobs"][0].get("error", 0):
            raise RuntimeError(
                f"fio moved {job.get('io_bytes')} bytes, expected {per_job * jobs}: {out.stdout[-2000:]}"
            )
        return per_job * jobs / job["bw_bytes"] * (size / (per_job * jobs))

    run.cmd = " ".join(cmd)
    return run


def deepspeed_runner(target: str, size: int, args, op: str) -> Callable[[], float]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".torch_ext"))
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not AsyncIOBuilder().is_compatible(verbose=False):
        raise RuntimeError("DeepSpeed AsyncIOBuilder is not compatible here (libaio-dev missing?)")
    mod = AsyncIOBuilder().load(verbose=False)
    h = mod.aio_handle(args.block_size, args.queue_depth, False, True, 1)
    buf = h.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
    buf.copy_(torch.randint(0, 255, (size,), dtype=torch.uint8))
    fn = h.sync_pwrite if op == "write" else h.sync_pread

    def run() -> float:
        t0 = time.perf_counter()
        n = fn(buf, target, 0)
        dt = time.perf_counter() - t0
        if n < 1:  # DeepSpeed reports a count of completed ops; 0 means it did nothing
            raise RuntimeError(f"DeepSpeed {op} returned {n}")
        return dt

    run.resources = (h, buf)
    return run


# ---------------------------------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="existing block device, or file path (created/filled); default: a file in --dir")
    p.add_argument("--dir", default=None, help="directory for the default file target (default: system temp dir)")
    p.add_argument("--loop", action="store_true", help="benchmark a fresh loop device (root) over a file in --dir")
    p.add_argument("--sector-size", type=int, default=512, help="loop device logical sector size (--loop)")
    p.add_argument("--size", default="1G", help="bytes per measurement (default 1G)")
    p.add_argument("--block-size", default="1M", help="I/O block size (default 1M)")
    p.add_argument("--queue-depth", type=int, default=32)
    p.add_argument("--num-workers", type=int, default=4, help="thread backend workers = fio psync numjobs")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ops", default="write,read")
    p.add_argument(
        "--tools",
        default="engine-io_uring,fio-io_uring,engine-threads,fio-psync,deepspeed,engine-io_uring-4k",
        help="comma list of engine-io_uring, engine-threads, engine-io_uring-4k, engine-threads-4k, "
        "fio-io_uring, fio-libaio, fio-psync, deepspeed",
    )
    p.add_argument("--json", help="write the raw results here")
    p.add_argument("--keep", action="store_true", help="keep the default file target")
    args = p.parse_args()
    args.size = parse_size(args.size)
    args.block_size = parse_size(args.block_size)
    if args.size % args.block_size:
        p.error("--size must be a multiple of --block-size")

    from memascend_engine import native

    ok, why = native.available()
    if not ok:
        sys.exit(f"native engine unavailable: {why}")
    tools = [t for t in args.tools.split(",") if t]
    ops = [o for o in args.ops.split(",") if o]

    with ExitStack() as stack:
        workdir = Path(args.dir or tempfile.gettempdir())
        if args.loop:
            backing = workdir / f"memascend_io_bench_loop_{os.getpid()}.img"
            dev = attach_loop(backing, args.size, args.sector_size)
            stack.callback(backing.unlink, missing_ok=True)
            stack.callback(subprocess.run, ["losetup", "-d", dev], check=False)
            target = dev
        elif args.target:
            target = args.target
        else:
            target = str(workdir / "memascend_io_bench.bin")
            if not args.keep:
                stack.callback(Path(target).unlink, missing_ok=True)
        is_blk = Path(target).is_block_device() if Path(target).exists() else False
        if not is_blk:
            prepare_file(Path(target), args.size, native)
        fs = subprocess.run(
            ["stat", "-f", "-c", "%T", target], check=False, capture_output=True, text=True
        ).stdout.strip()
        print(
            f"target {target} ({'block device' if is_blk else 'file on ' + fs}), size {args.size / 2**20:.0f} MiB, "
            f"bs {args.block_size // 1024} KiB, qd {args.queue_depth}, workers {args.num_workers}, "
            f"alignment {native.dio_alignment(target)}, repeats {args.repeats}"
        )

        results: dict[str, dict[str, list[float]]] = {op: {} for op in ops}
        skipped: dict[str, str] = {}
        for op in ops:
            runners: dict[str, Callable[[], float]] = {}
            for tool in tools:
                try:
                    if tool.startswith("engine-"):
                        runners[tool] = engine_runner(native, target, args.size, args, tool.split("-", 1)[1], op)
                    elif tool.startswith("fio-"):
                        if shutil.which("fio") is None:
                            raise RuntimeError("fio not installed (apt-get install fio)")
                        runners[tool] = fio_runner(target, args.size, args, tool.split("-", 1)[1], op)
                        if op == ops[0]:
                            print(f"  {tool}: {runners[tool].cmd}")
                    elif tool == "deepspeed":
                        if is_blk:
                            raise RuntimeError(
                                "DeepSpeed's aio op sizes files with stat(); block devices read as 0 bytes"
                            )
                        runners[tool] = deepspeed_runner(target, args.size, args, op)
                    else:
                        raise RuntimeError(f"unknown tool {tool}")
                except Exception as exc:  # noqa: BLE001 - report and continue with the others
                    skipped[tool] = f"{type(exc).__name__}: {exc}"
            for tool, run in runners.items():  # warm-up, untimed (fio file layout, DS first-touch)
                run()
            names = list(runners)
            for rep in range(args.repeats):
                order = names[rep % len(names) :] + names[: rep % len(names)]
                for tool in order:
                    results[op].setdefault(tool, []).append(gbps(args.size, runners[tool]()))
            runners.clear()

        print(f"\n{'op':6} {'tool':16} {'median GB/s':>12} {'best GB/s':>10}   runs")
        for op in ops:
            for tool, vals in results[op].items():
                print(
                    f"{op:6} {tool:16} {statistics.median(vals):12.3f} {max(vals):10.3f}   "
                    + " ".join(f"{v:.3f}" for v in vals)
                )
        print("\nratios (median / median):")
        pairs = [
            ("engine-io_uring", "fio-io_uring"),
            ("engine-threads", "fio-psync"),
            ("engine-io_uring", "deepspeed"),
            ("engine-threads", "deepspeed"),
        ]
        for op in ops:
            med = {t: statistics.median(v) for t, v in results[op].items()}
            for a, b in pairs:
                if a in med and b in med:
                    print(f"  {op:6} {a} / {b} = {med[a] / med[b]:.3f}")
        for tool, why in skipped.items():
            print(f"skipped {tool}: {why}")
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "args": {k: v for k, v in vars(args).items()},
                        "target": target,
                        "results": results,
                        "skipped": skipped,
                    },
                    indent=2,
                )
            )
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # DeepSpeed's aio worker threads can destroy tensors during interpreter finalization, take the
    # GIL, get pthread_exit'ed and abort the process ("terminate called without an active
    # exception"); all results are printed by now, so leave without finalization.
    os._exit(rc)
