"""The I/O half of `prepare-ssd`: gather facts about a target, and measure its bandwidth.

`gather_target_facts()` reads sysfs, /proc, `wipefs` and the target's first MiB, and never
writes; `ssd_safety.assess()` judges the result. `probe_bandwidth()` writes and reads the region's
data area (never the header) with the native I/O core when it loads, else with a pure-Python
O_DIRECT fallback, and returns a `region.ProbeResult` for the header.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from memascend_cli.ssd import region
from memascend_cli.ssd.safety import Signature, TargetFacts, parse_blkid_export, parse_wipefs_json
from memascend_cli.units import KiB, MiB

HEAD_CHECK_BYTES = MiB
"""How much of a device is read to decide whether it is blank (signatures live in the first MiB)."""
_TOOL_TIMEOUT_S = 10.0

DEFAULT_BLOCK_SIZES_BYTES = (256 * KiB, 1 * MiB, 4 * MiB)
DEFAULT_QUEUE_DEPTHS = (8, 32)
DEFAULT_PROBE_MIB = 256
DEFAULT_NUM_WORKERS = 4
"""Submission threads of the native engine (its default)."""


# ---------------------------------------------------------------------------------------------
# Facts


def _region_state(path: str) -> tuple[str, str | None, str | None, bytes | None]:
    """(state, label, error, head) from the first MiB of `path`; never raises for I/O errors."""
    try:
        head = region.read_block(path, 0, HEAD_CHECK_BYTES)
    except OSError as exc:
        return "unreadable", None, exc.strerror or str(exc), None
    if len(head) < region.HEADER_BYTES:
        return "none", None, None, head
    try:
        header = region.decode(head[: region.HEADER_BYTES])
    except region.NoRegion:
        return "none", None, None, head
    except region.RegionCorrupt as exc:
        if region.looks_like_region(head):
            return "corrupt", None, exc.message, head
        return "none", None, None, head
    return "intact", header.label or None, None, head


def _signatures(path: str) -> tuple[list[Signature], str | None]:
    """Signatures found by `wipefs --no-act --json` (or `blkid -p`), and why neither worked if so."""
    errors = []
    wipefs = shutil.which("wipefs")
    if wipefs:
        try:
            proc = subprocess.run([wipefs, "--no-act", "--json", path], capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, check=False)
            if proc.returncode == 0:
                return parse_wipefs_json(proc.stdout), None
            errors.append(f"wipefs: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f'exit {proc.returncode}'}")
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            errors.append(f"wipefs: {exc}")
    blkid = shutil.which("blkid")
    if blkid:
        try:
            proc = subprocess.run([blkid, "-p", "-o", "export", path], capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, check=False)
            # blkid exits 2 when it finds nothing: that is an answer, not a failure.
            if proc.returncode in (0, 2):
                return parse_blkid_export(proc.stdout), None
            errors.append(f"blkid: {proc.stderr.strip() or f'exit {proc.returncode}'}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(f"blkid: {exc}")
    if not errors:
        errors.append("neither `wipefs` nor `blkid` is installed (util-linux)")
    return [], "; ".join(errors)


def _active_swaps() -> list[str]:
    try:
        with open("/proc/swaps", encoding="utf-8") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    # /proc/swaps escapes spaces as \040, like mountinfo.
    return [line.split()[0].replace("\\040", " ") for line in lines if line.strip()]


def _same_file(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    if stat.S_ISBLK(sa.st_mode) and stat.S_ISBLK(sb.st_mode):
        return sa.st_rdev == sb.st_rdev
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _root_device_knames() -> set[str]:
    """Kernel names of every block device the root file system sits on (slaves, parent disks)."""
    from memascend_cli.ssd.blockdev import mount_for_path, read_mountinfo

    st_dev = os.stat("/").st_dev
    maj_min = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    if os.major(st_dev) == 0:
        # overlay/btrfs report an anonymous device: use the mount table's source instead.
        try:
            mount = mount_for_path("/", read_mountinfo())
            maj_min = mount.maj_min if mount is not None else maj_min
            if mount is not None and mount.source.startswith("/dev/"):
                rdev = os.stat(mount.source).st_rdev
                maj_min = f"{os.major(rdev)}:{os.minor(rdev)}"
        except OSError:
            return set()
    sys_path = f"/sys/dev/block/{maj_min}"
    if not os.path.exists(sys_path):
        return set()
    found: set[str] = set()
    todo = [os.path.realpath(sys_path)]
    while todo:
        real = todo.pop()
        kname = os.path.basename(real)
        if kname in found:
            continue
        found.add(kname)
        if os.path.exists(os.path.join(real, "partition")):
            todo.append(os.path.dirname(real))  # the disk a partition belongs to
        slaves = os.path.join(real, "slaves")
        if os.path.isdir(slaves):
            todo.extend(os.path.realpath(os.path.join(slaves, s)) for s in os.listdir(slaves))
    return found


def _exclusive_open_busy(path: str) -> str | None:
    # O_EXCL on a block device (without O_CREAT) asks the kernel for exclusive use: it fails with
    # EBUSY while anything (a mount, md, dm, another exclusive opener) holds the device.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_EXCL)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return "an exclusive open failed with EBUSY (something holds it open)"
        return None
    os.close(fd)
    return None


def _block_facts(facts: TargetFacts, devices: list | None) -> None:
    from memascend_cli.ssd.blockdev import list_block_devices, read_mountinfo

    if devices is None:
        devices = list_block_devices()
    rdev = os.stat(facts.real_path).st_rdev
    maj_min = f"{os.major(rdev)}:{os.minor(rdev)}"
    by_name = {d.name: d for d in devices}
    dev = next((d for d in devices if d.maj_min == maj_min), None)
    if dev is None:
        kname = os.path.basename(os.path.realpath(f"/sys/dev/block/{maj_min}"))
        dev = next((d for d in devices if (d.kname or d.name) == kname), None)
    # The device plus everything on it (partitions, volumes): any of them in use blocks it.
    family = []
    todo = [dev] if dev is not None else []
    while todo:
        d = todo.pop()
        if d in family:
            continue
        family.append(d)
        todo.extend(by_name[c] for c in d.children if c in by_name)
    family_maj_min = {d.maj_min for d in family if d.maj_min} | {maj_min}
    try:
        fd = os.open(facts.real_path, os.O_RDONLY)
        try:
            facts.size_bytes = os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)
    except OSError as exc:
        facts.open_error = exc.strerror or str(exc)
        facts.size_bytes = dev.size_bytes if dev is not None else 0
    if dev is not None:
        facts.device_name = dev.name
        facts.device_type = dev.type
        facts.logical_block_bytes = dev.logical_block_bytes
        facts.read_only = dev.read_only
        facts.partitions = [d.name for d in family[1:] if d.type == "part"]  # family[0] is the target itself
        facts.holders = sorted({h for d in family for h in d.holders})
    else:
        facts.device_name = os.path.basename(facts.real_path)
    mounts = {f"{d.path} on {mp}" for d in family for mp in d.mountpoints}
    try:
        names = {d.maj_min: d.path for d in family}
        mounts |= {f"{names.get(m.maj_min, m.source)} on {m.mountpoint}" for m in read_mountinfo() if m.maj_min in family_maj_min}
    except OSError:
        pass
    facts.mounts = sorted(mounts)
    facts.swap = [s for s in _active_swaps() if any(_same_file(s, d.path) for d in family) or _same_file(s, facts.real_path)]
    root = _root_device_knames()
    facts.holds_root_fs = any((d.kname or d.name) in root for d in family) or os.path.basename(os.path.realpath(f"/sys/dev/block/{maj_min}")) in root
    if facts.open_error is not None:
        # Nothing below can look at a device we cannot open; the refusal says why.
        facts.region_state, facts.region_error = "unreadable", facts.open_error
        return
    facts.busy_reason = _exclusive_open_busy(facts.real_path)
    facts.signatures, facts.signature_probe_error = _signatures(facts.real_path)
    facts.region_state, facts.region_label, facts.region_error, head = _region_state(facts.real_path)
    facts.head_blank = (not any(head)) if head is not None else None


def gather_target_facts(path: str, *, requested_size_bytes: int | None = None, devices: list | None = None) -> TargetFacts:
    """Look at `path` without writing to it and return what `ssd_safety.assess` needs.

    Args:
        path: a block device, or a region file (existing or to create).
        requested_size_bytes: `--size` for a file target.
        devices: `blockdev.list_block_devices()` output, to reuse when asking about many devices.
    """
    from memascend_cli.ssd.path import path_info

    real = os.path.realpath(path)
    facts = TargetFacts(path=path, real_path=real, kind="file", exists=os.path.exists(real), requested_size_bytes=requested_size_bytes)
    if not facts.exists:
        parent = os.path.dirname(real) or "."
        facts.parent_exists = os.path.isdir(parent)
        if facts.parent_exists:
            info = path_info(parent)
            facts.fstype, facts.o_direct_ok, facts.o_direct_reason, facts.free_bytes = info.fstype, info.o_direct_ok, info.o_direct_reason, info.free_bytes
            facts.logical_block_bytes = _file_block_bytes(info.dio_offset_align)
        return facts
    st = os.stat(real)
    if stat.S_ISBLK(st.st_mode):
        facts.kind = "block"
        _block_facts(facts, devices)
        return facts
    if stat.S_ISDIR(st.st_mode):
        facts.kind = "dir"
        return facts
    if not stat.S_ISREG(st.st_mode):
        facts.kind = "other"
        return facts
    facts.size_bytes = st.st_size
    info = path_info(real)
    facts.fstype, facts.o_direct_ok, facts.o_direct_reason, facts.free_bytes = info.fstype, info.o_direct_ok, info.o_direct_reason, info.free_bytes
    facts.logical_block_bytes = _file_block_bytes(info.dio_offset_align)
    facts.swap = [s for s in _active_swaps() if _same_file(s, real)]
    facts.region_state, facts.region_label, facts.region_error, _ = _region_state(real)
    return facts


def _file_block_bytes(dio_offset_align: int | None) -> int:
    # A file's "logical block" is the file system's DIO offset alignment (statx), 512 if unknown.
    return dio_offset_align if dio_offset_align and dio_offset_align > 0 else 512


# ---------------------------------------------------------------------------------------------
# Bandwidth probe


@dataclass(kw_only=True, slots=True)
class ProbePlan:
    """What the probe will touch: one contiguous range of the data area."""

    offset_bytes: int
    """First byte written (the region's data start)."""
    length_bytes: int
    """Bytes written then read per setting."""
    block_sizes_bytes: tuple[int, ...]
    queue_depths: tuple[int, ...]

    @property
    def end_bytes(self) -> int:
        """First byte past the probed range."""
        return self.offset_bytes + self.length_bytes

    @property
    def total_io_bytes(self) -> int:
        """Bytes moved by the whole probe (write + read, every setting)."""
        return 2 * self.length_bytes * len(self.block_sizes_bytes) * len(self.queue_depths)


def plan_probe(header: region.RegionHeader, probe_mib: int = DEFAULT_PROBE_MIB) -> ProbePlan:
    """Choose the probed range (inside the data area, never the header) and the settings."""
    # A striped region is probed member by member, on each member's own (physical) data area.
    data_bytes = (header.ranks[-1].end_bytes - header.data_start_bytes) // max(1, len(header.members))
    length_bytes = region.align_down(min(probe_mib * MiB, data_bytes), header.alignment_bytes)
    block_sizes = tuple(bs for bs in DEFAULT_BLOCK_SIZES_BYTES if bs <= length_bytes) or (header.alignment_bytes,)
    # Every block size must divide the range so each pass moves exactly length_bytes.
    length_bytes = region.align_down(length_bytes, max(block_sizes))
    return ProbePlan(offset_bytes=header.data_start_bytes, length_bytes=length_bytes, block_sizes_bytes=block_sizes, queue_depths=DEFAULT_QUEUE_DEPTHS)


def _native_engine():
    """The native I/O module, or (None, why not)."""
    try:
        from memascend_engine import native  # lazy: optional compiled extension
    except Exception as exc:  # an optional extension may fail to import in many ways
        return None, f"native I/O core not importable ({type(exc).__name__}: {exc})"
    try:
        ok, why = native.available()
    except Exception as exc:
        return None, f"native I/O core failed its availability check: {exc}"
    return (native, None) if ok else (None, f"native I/O core unavailable: {why}")


class _PythonBackend:
    """O_DIRECT pwritev/preadv from a thread pool (the GIL is released during the syscalls)."""

    name = "python-odirect"

    def __init__(self, path: str, block_bytes: int, queue_depth: int):
        self.fd = os.open(path, os.O_RDWR | os.O_DIRECT)
        self.buf = region.aligned_buffer(block_bytes)
        # Random bytes: some SSDs compress or deduplicate zeros and would report fantasy numbers.
        self.buf[:block_bytes] = os.urandom(block_bytes)
        self.block_bytes = block_bytes
        self.pool = ThreadPoolExecutor(max_workers=queue_depth)
        self.num_workers = queue_depth

    def run(self, write: bool, offsets: list[int], on_done) -> None:
        view = memoryview(self.buf)[: self.block_bytes]
        op = os.pwritev if write else os.preadv

        def one(off: int) -> None:
            n = op(self.fd, [view], off)
            if n != self.block_bytes:
                raise OSError(errno.EIO, f"short {'write' if write else 'read'}: {n} of {self.block_bytes} B at offset {off}")
            on_done(n)

        try:
            for f in [self.pool.submit(one, off) for off in offsets]:
                f.result()
            if write:
                os.fsync(self.fd)  # flush the device cache: the write pass counts until data is durable
        finally:
            view.release()

    def close(self) -> None:
        self.pool.shutdown()
        os.close(self.fd)
        self.buf.close()


class _NativeBackend:
    """The native I/O core (io_uring/libaio); submits in batches so progress can advance."""

    def __init__(self, native, path: str, block_bytes: int, queue_depth: int, num_workers: int):
        self.eng = native.IOEngine(path, writable=True, queue_depth=queue_depth, num_workers=num_workers, block_size=block_bytes)
        self.name = str(getattr(self.eng, "backend", "native"))
        try:
            self.buffer = native.AlignedBuffer(block_bytes, lock=False)
            # Random bytes, as in the fallback (zeros may be compressed by the SSD).
            with memoryview(self.buffer) as view:
                view[:block_bytes] = os.urandom(block_bytes)
        except BaseException:
            self.eng.close()
            raise
        self.block_bytes = block_bytes
        self.batch = max(queue_depth * 2, 1)
        self.num_workers = int(getattr(self.eng, "num_workers", num_workers))

    def run(self, write: bool, offsets: list[int], on_done) -> None:
        submit = self.eng.submit_write if write else self.eng.submit_read
        for i in range(0, len(offsets), self.batch):
            chunk = offsets[i : i + self.batch]
            for off in chunk:
                submit(self.buffer.address, self.block_bytes, off)
            self.eng.wait_all()
            on_done(len(chunk) * self.block_bytes)
        if write:
            self.eng.sync()  # same rule as the fallback: the write pass counts until data is durable

    def close(self) -> None:
        self.eng.close()
        self.buffer.close()


def probe_bandwidth(path: str, plan: ProbePlan, *, progress: bool = True, prefer_native: bool = True) -> tuple[region.ProbeResult, str | None]:
    """Sequentially write then read `plan`'s range at every (block size, queue depth).

    Args:
        path: the region (device or file); only bytes inside the plan's range are touched.
        plan: from `plan_probe`.
        progress: show a Rich progress bar on stderr.
        prefer_native: try the native I/O core first.

    Returns:
        (result, note): the best setting by harmonic mean of read and write GB/s, and why the
        Python fallback was used (None when the native core ran).
    """
    native, note = _native_engine() if prefer_native else (None, "native I/O core not requested")
    offsets_by_bs = {bs: list(range(plan.offset_bytes, plan.end_bytes, bs)) for bs in plan.block_sizes_bytes}
    samples: list[region.ProbeSample] = []
    backend_name = _PythonBackend.name
    num_workers_used: dict[tuple[int, int], int] = {}

    bar = None
    if progress:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        from memascend_cli.console import err

        bar = Progress(
            TextColumn("[cyan]probe[/cyan] {task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
            console=err, transient=True,
        )
    lock = threading.Lock()
    task = None

    def advance(nbytes: int) -> None:
        if bar is not None:
            with lock:
                bar.advance(task, nbytes)

    try:
        if bar is not None:
            bar.start()
            task = bar.add_task("", total=plan.total_io_bytes)
        for bs in plan.block_sizes_bytes:
            for qd in plan.queue_depths:
                backend = None
                if native is not None:
                    try:
                        backend = _NativeBackend(native, path, bs, qd, DEFAULT_NUM_WORKERS)
                    except Exception as exc:  # keep measuring with the fallback rather than fail prepare-ssd
                        note, native = f"native I/O core failed to open {path}: {exc}", None
                if backend is None:
                    backend = _PythonBackend(path, bs, qd)
                backend_name = backend.name
                num_workers_used[(bs, qd)] = backend.num_workers
                try:
                    gbps = {}
                    for write in (True, False):
                        if bar is not None:
                            bar.update(task, description=f"{'write' if write else 'read '} {bs // KiB:>5} KiB x QD {qd:<3}")
                        t0 = time.perf_counter()
                        backend.run(write, offsets_by_bs[bs], advance)
                        elapsed_s = time.perf_counter() - t0
                        gbps[write] = plan.length_bytes / max(elapsed_s, 1e-9) / 1e9
                finally:
                    backend.close()
                samples.append(region.ProbeSample(block_bytes=bs, queue_depth=qd, write_gbps=round(gbps[True], 3), read_gbps=round(gbps[False], 3)))
    finally:
        if bar is not None:
            bar.stop()

    def score(s: region.ProbeSample) -> float:
        # Training both reads (parameters) and writes (optimizer state): favour the balanced setting.
        return 2.0 / (1.0 / max(s.read_gbps, 1e-9) + 1.0 / max(s.write_gbps, 1e-9))

    best = max(samples, key=score)
    result = region.ProbeResult(
        read_gbps=best.read_gbps,
        write_gbps=best.write_gbps,
        best_block_bytes=best.block_bytes,
        best_queue_depth=best.queue_depth,
        best_num_workers=num_workers_used[(best.block_bytes, best.queue_depth)],
        backend=backend_name,
        measured_at=region.utc_now(),
        probe_bytes=plan.length_bytes,
        samples=samples,
    )
    return result, note
