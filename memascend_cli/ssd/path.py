"""Where a run's SSD data would go: a directory, a region file or a block device, and whether direct I/O really
works there (O_DIRECT accepted and enforced, the DIO alignment statx reports), its free space, and the memascend
region a path may hold. `memascend inspect --nvme-path`, `plan`, `train`'s preflight and `prepare-ssd` ask it."""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import mmap
import os
import platform
import stat
import struct
import tempfile
from dataclasses import asdict, dataclass

from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.ssd.blockdev import device_for_path, find_block_device, mount_for_path, read_mountinfo
from memascend_cli.units import GiB

# O_DIRECT probe sizes: 4096 B satisfies every common logical block size (512e and 4Kn); 1000 B
# is a multiple of nothing, so a filesystem that enforces direct I/O must reject it with EINVAL.
_PROBE_BYTES = 4096
_UNALIGNED_PROBE_BYTES = 1000

# statx(2) by syscall number: Python 3.11 does not wrap it.
_SYS_STATX = {"x86_64": 332, "aarch64": 291}
_STATX_DIOALIGN = 0x2000
_STATX_BUF_BYTES = 256
# Offsets in struct statx (include/uapi/linux/stat.h): stx_mask at 0, stx_dio_mem_align at 152.
_STATX_DIO_OFFSET = 152
_AT_FDCWD = -100


@dataclass
class PathInfo:
    """Where swap data would go (--nvme-path): its filesystem, space, and direct-I/O behaviour."""

    path: str
    exists: bool
    fstype: str | None
    """Filesystem of the mount holding the path ('ext4', 'xfs', 'tmpfs'), or the device's own."""
    free_bytes: int | None
    """Space a non-root user may still write; for a raw device, its size if nothing is on it, else 0."""
    total_bytes: int | None
    o_direct_ok: bool | None
    """True: O_DIRECT works and is enforced. False: refused or not enforced. None: could not test."""
    o_direct_reason: str
    dio_mem_align: int | None
    """Buffer address alignment for O_DIRECT (statx STATX_DIOALIGN), None if the kernel does not say."""
    dio_offset_align: int | None
    """File offset and length alignment for O_DIRECT, None if the kernel does not say."""
    is_block_device: bool
    device: str | None
    """The block device backing the path ('/dev/nvme0n1p2'), None for tmpfs, overlay, NFS, ..."""

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return asdict(self)


def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def statx_dioalign(path: str) -> tuple[int | None, int | None]:
    """(dio_mem_align, dio_offset_align) from statx(STATX_DIOALIGN); (None, None) if unavailable.

    Needs Linux >= 6.1 and a filesystem that reports it (ext4, xfs, block devices since 6.11);
    (0, 0) means the kernel says the file does not support direct I/O.
    """
    nr = _SYS_STATX.get(platform.machine())
    if nr is None:
        return None, None
    buf = ctypes.create_string_buffer(_STATX_BUF_BYTES)
    rc = libc().syscall(
        ctypes.c_long(nr), ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(os.fsencode(path)),
        ctypes.c_int(0), ctypes.c_uint(_STATX_DIOALIGN), buf,
    )
    if rc != 0:
        return None, None
    (mask,) = struct.unpack_from("=I", buf, 0)
    if not mask & _STATX_DIOALIGN:
        return None, None
    mem_align, offset_align = struct.unpack_from("=II", buf, _STATX_DIO_OFFSET)
    return mem_align, offset_align


def _o_direct_roundtrip(fd: int, probe_bytes: int, writable: bool, fstype: str | None) -> tuple[bool, str]:
    """Aligned I/O must succeed and an unaligned length must fail, or O_DIRECT is not really in effect."""
    # Anonymous mmap memory is page aligned, which satisfies any DIO memory alignment.
    pattern = bytes(range(256)) * (probe_bytes // 256)
    out_buf, in_buf = mmap.mmap(-1, probe_bytes), mmap.mmap(-1, probe_bytes)
    try:
        out_buf.write(pattern)
        if writable:
            written = os.pwritev(fd, [out_buf], 0)
            if written != probe_bytes:
                return False, f"aligned O_DIRECT write returned {written} of {probe_bytes} B"
        read = os.preadv(fd, [in_buf], 0)
        if read != probe_bytes:
            return False, f"aligned O_DIRECT read returned {read} of {probe_bytes} B"
        if writable and in_buf[:] != pattern:
            return False, "O_DIRECT read back different bytes than were written"
        view = memoryview(out_buf if writable else in_buf)
        part = view[:_UNALIGNED_PROBE_BYTES]
        try:
            if writable:
                os.pwritev(fd, [part], 0)
            else:
                os.preadv(fd, [part], 0)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                op = "write" if writable else "read"
                return True, (
                    f"aligned {probe_bytes} B round-trip OK, "
                    f"unaligned {_UNALIGNED_PROBE_BYTES} B {op} rejected (EINVAL)"
                )
            return True, f"aligned {probe_bytes} B round-trip OK, unaligned I/O failed: {exc.strerror}"
        finally:
            part.release()
            view.release()
        fs = fstype or "this filesystem"
        why = "it keeps files in RAM, so it is not an SSD" if fstype == "tmpfs" else "I/O goes through the page cache"
        return False, (
            f"{fs} accepts O_DIRECT without enforcing alignment "
            f"(an unaligned {_UNALIGNED_PROBE_BYTES} B I/O succeeded): {why}"
        )
    finally:
        out_buf.close()
        in_buf.close()


def _probe_o_direct_dir(directory: str, fstype: str | None) -> tuple[bool | None, str, int | None, int | None]:
    """O_DIRECT probe with a temporary file in `directory`; also returns its statx DIO alignment."""
    try:
        fd_tmp, tmp_path = tempfile.mkstemp(prefix=".memascend-odirect-", dir=directory)
    except OSError as exc:
        return None, f"cannot create a probe file in {directory}: {exc.strerror}", None, None
    os.close(fd_tmp)
    try:
        # ext4 and xfs report DIO alignment only for regular files, so ask about the probe file.
        mem_align, offset_align = statx_dioalign(tmp_path)
        try:
            fd = os.open(tmp_path, os.O_RDWR | os.O_DIRECT)
        except OSError as exc:
            return False, f"{fstype or 'filesystem'} refuses O_DIRECT: {exc.strerror}", mem_align, offset_align
        try:
            ok, reason = _o_direct_roundtrip(fd, max(_PROBE_BYTES, offset_align or 0), True, fstype)
        except OSError as exc:
            ok, reason = False, f"aligned O_DIRECT I/O failed: {exc.strerror}"
        finally:
            os.close(fd)
        return ok, reason, mem_align, offset_align
    finally:
        os.unlink(tmp_path)


def _probe_o_direct_device(device_path: str, size_bytes: int, block_bytes: int) -> tuple[bool | None, str]:
    """Read-only O_DIRECT probe of a block device: its data is never written."""
    probe_bytes = max(_PROBE_BYTES, block_bytes)
    if size_bytes < probe_bytes:
        return None, f"device is smaller than {probe_bytes} B"
    try:
        fd = os.open(device_path, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        return None, f"cannot open {device_path}: {exc.strerror}"
    try:
        return _o_direct_roundtrip(fd, probe_bytes, False, None)
    except OSError as exc:
        return False, f"aligned O_DIRECT read failed: {exc.strerror}"
    finally:
        os.close(fd)


def _path_info_block_device(path: str, real: str) -> PathInfo:
    dev = find_block_device(real)
    size_bytes = dev.size_bytes if dev is not None else None
    block_bytes = dev.logical_block_bytes if dev is not None else _PROBE_BYTES
    in_use = dev is not None and bool(dev.mountpoints or dev.fstype or dev.children or dev.holders)
    ok, reason = _probe_o_direct_device(real, size_bytes or 0, block_bytes)
    mem_align, offset_align = statx_dioalign(real)
    return PathInfo(
        path=path,
        exists=True,
        fstype=dev.fstype if dev is not None else None,
        # A device that carries a filesystem, partitions or stacked devices is not free for raw use.
        free_bytes=(0 if in_use else size_bytes),
        total_bytes=size_bytes,
        o_direct_ok=ok,
        o_direct_reason=reason,
        dio_mem_align=mem_align,
        # Block devices accept any multiple of the logical block size; older kernels do not report it.
        dio_offset_align=offset_align if offset_align is not None else (dev.logical_block_bytes if dev else None),
        is_block_device=True,
        device=dev.path if dev is not None else real,
    )


def path_info(path: str) -> PathInfo:
    """Filesystem type, free space and O_DIRECT behaviour of a swap location.

    A directory is probed with a temporary file written and read with O_DIRECT; a regular file
    through its directory; a block device read-only. A missing path gives exists=False and no probe.
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return PathInfo(
            path=path, exists=False, fstype=None, free_bytes=None, total_bytes=None, o_direct_ok=None,
            o_direct_reason="path does not exist", dio_mem_align=None, dio_offset_align=None,
            is_block_device=False, device=None,
        )
    if stat.S_ISBLK(st.st_mode):
        return _path_info_block_device(path, real)
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        # A character device, FIFO or socket: never drop a probe file next to it (e.g. into /dev).
        return PathInfo(
            path=path, exists=True, fstype=None, free_bytes=None, total_bytes=None, o_direct_ok=None,
            o_direct_reason="not a directory, regular file or block device", dio_mem_align=None,
            dio_offset_align=None, is_block_device=False, device=None,
        )
    directory = real if stat.S_ISDIR(st.st_mode) else os.path.dirname(real)
    try:
        mount = mount_for_path(real, read_mountinfo())
    except OSError:
        mount = None
    fstype = mount.fstype if mount is not None else None
    vfs = os.statvfs(directory)
    ok, reason, mem_align, offset_align = _probe_o_direct_dir(directory, fstype)
    if stat.S_ISREG(st.st_mode):
        # The region file itself is what the engine opens; its alignment is the one that counts.
        mem_align, offset_align = statx_dioalign(real)
    dev = device_for_path(real)
    return PathInfo(
        path=path,
        exists=True,
        fstype=fstype,
        free_bytes=vfs.f_bavail * vfs.f_frsize,
        total_bytes=vfs.f_blocks * vfs.f_frsize,
        o_direct_ok=ok,
        o_direct_reason=reason,
        dio_mem_align=mem_align,
        dio_offset_align=offset_align,
        is_block_device=False,
        device=dev.path if dev is not None else None,
    )


def free_space_at(path: str) -> tuple[str, int]:
    """(the nearest existing folder at or above `path`, the bytes a non-root user may still write there)."""
    folder = os.path.abspath(path)
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    vfs = os.statvfs(folder)
    return folder, vfs.f_bavail * vfs.f_frsize


def region_header(path: str):
    """The memascend region header at `path` (ssd.region.RegionHeader), or None for a path without a region (a swap
    directory, another file). A region that is corrupt is an error (the plan would otherwise use a wrong size)."""
    from memascend_cli.ssd import region

    if os.path.isdir(path) or (os.path.isfile(path) and os.path.getsize(path) < region.HEADER_BYTES):
        return None
    block = region.read_block(path, 0, region.HEADER_BYTES)
    return region.decode(block) if region.looks_like_region(block) else None


def apply_region(spec: HardwareSpec, path: str) -> HardwareSpec:
    """If `path` holds a memascend region (region_header), its data area is the SSD space and its probe the
    bandwidth; a path without a region keeps the file system's free space."""
    header = region_header(path)
    if header is None:
        return spec
    probe_result = header.probe
    return dataclasses.replace(
        spec,
        nvme_free_gib=round((header.capacity_bytes - header.data_start_bytes) / GiB, 3),
        nvme_read_gbps=probe_result.read_gbps if probe_result is not None else spec.nvme_read_gbps,
        nvme_write_gbps=probe_result.write_gbps if probe_result is not None else spec.nvme_write_gbps,
        source=spec.source + f"+region {path}",
    )
