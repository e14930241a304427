"""An SSD bandwidth limit for a run (`bench --ssd-bandwidth`): the block devices under the run's SSD paths and the
cgroup values that throttle them (run/cgroup.py RunCgroup writes them).

cgroup v1 `blkio.throttle.read_bps_device` / `write_bps_device` ("MAJ:MIN BYTES_PER_S", one device per write), v2
`io.max` ("MAJ:MIN rbps=N wbps=N"). The kernel throttles the bios a cgroup's tasks submit to that device's request
queue (block/blk-throttle.c), so the device is the one with a queue: a partition's disk (the kernel refuses a
partition: block/blk-cgroup.c blkcg_conf_open_bdev), a loop, dm or md device itself (each has its own queue; a loop
device's own I/O to its backing file is then charged to the same cgroup, so the limit holds once either way).

What is throttled: O_DIRECT I/O, i.e. memascend's region (io_uring; its io-wq workers are threads of the process,
so in its cgroup) and DeepSpeed's swap files (libaio, opened O_DIRECT: DeepSpeed 0.19.8
csrc/aio/common/deepspeed_aio_common.cpp:269 open_file), and buffered reads that miss the page cache (submitted by
the reading task). Not throttled: buffered writes on cgroup v1 (the kernel's flusher threads write them back later,
charged to the root cgroup); v2 charges writeback to the cgroup that dirtied the pages
(Documentation/admin-guide/cgroup-v2.rst, "Writeback"). Page cache hits are no I/O at all.

Pure: uevent parsing, the device choice, the values written and the counters read (tests/unit/test_iolimit.py,
fixture tests/assets/cgroup/sys_class_block_uevents.json). I/O: `resolve_limits` (stat, sysfs, mountinfo).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from memascend_cli.errors import BadInput

SYS_CLASS_BLOCK = "/sys/class/block"
MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class IoLimit:
    """One throttled block device."""

    maj_min: str
    device: str
    """Kernel name of the device throttled (e.g. 'vda', 'nvme0n1', 'loop3')."""
    read_bytes_per_s: int
    write_bytes_per_s: int
    paths: tuple[str, ...]
    """The run's SSD paths (swap directory, region) on this device."""

    def to_dict(self) -> dict:
        return {"maj_min": self.maj_min, "device": self.device, "read_bytes_per_s": self.read_bytes_per_s,
                "write_bytes_per_s": self.write_bytes_per_s, "paths": list(self.paths)}


# --- pure -----------------------------------------------------------------------------------------------------------


def parse_uevent(text: str) -> dict[str, str]:
    """A sysfs `uevent` file (KEY=VALUE lines) as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def queue_device(maj_min: str, uevents: dict[str, str]) -> tuple[str, str] | None:
    """(MAJ:MIN, kernel name) of the device with a request queue that serves device `maj_min`: a partition's disk
    (the sysfs directory above the partition's), any other block device itself; None when `maj_min` is no block
    device here.

    Args:
        uevents: sysfs device directory (the resolved /sys/class/block/NAME) -> its uevent text.
    """
    by_dir = {d: parse_uevent(t) for d, t in uevents.items()}
    found = next((d for d, u in by_dir.items() if f"{u.get('MAJOR')}:{u.get('MINOR')}" == maj_min), None)
    if found is None:
        return None
    u = by_dir[found]
    if u.get("DEVTYPE") == "partition":
        disk = by_dir.get(os.path.dirname(found.rstrip("/")))
        if disk is None:
            return None
        u = disk
    return f"{u['MAJOR']}:{u['MINOR']}", u.get("DEVNAME", "?")


def group_limits(devices: dict[str, tuple[str, str]], bytes_per_s: int) -> list[IoLimit]:
    """One IoLimit per device from {path: (MAJ:MIN, name)}, the same limit for reads and writes, in path order."""
    by_dev: dict[str, list[str]] = {}
    names: dict[str, str] = {}
    for path, (mm, name) in devices.items():
        by_dev.setdefault(mm, []).append(path)
        names[mm] = name
    return [IoLimit(mm, names[mm], bytes_per_s, bytes_per_s, tuple(paths)) for mm, paths in by_dev.items()]


def throttle_writes(version: int, limits) -> list[tuple[str, str]]:
    """The (file, value) writes that set `limits` in a cgroup of `version`; v1 takes one device per write."""
    if version == 2:
        return [("io.max", f"{lim.maj_min} rbps={lim.read_bytes_per_s} wbps={lim.write_bytes_per_s}")
                for lim in limits]
    out = []
    for lim in limits:
        out += [("blkio.throttle.read_bps_device", f"{lim.maj_min} {lim.read_bytes_per_s}"),
                ("blkio.throttle.write_bps_device", f"{lim.maj_min} {lim.write_bytes_per_s}")]
    return out


def io_stat_file(version: int) -> str:
    """The counter file of the bytes a cgroup moved per device."""
    return "io.stat" if version == 2 else "blkio.throttle.io_service_bytes"


def io_bytes(version: int, text: str) -> dict[str, tuple[int, int]]:
    """{MAJ:MIN: (bytes read, bytes written)} from io.stat (v2: 'MAJ:MIN rbytes=N wbytes=N ...') or
    blkio.throttle.io_service_bytes (v1: 'MAJ:MIN Read N' / 'MAJ:MIN Write N' lines, a 'Total N' line)."""
    out: dict[str, list[int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or ":" not in parts[0]:
            continue
        rw = out.setdefault(parts[0], [0, 0])
        if version == 2:
            kv = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
            rw[0], rw[1] = int(kv.get("rbytes", 0)), int(kv.get("wbytes", 0))
        elif len(parts) == 3 and parts[1] in ("Read", "Write") and parts[2].isdigit():
            rw[0 if parts[1] == "Read" else 1] = int(parts[2])
    return {mm: (r, w) for mm, (r, w) in out.items()}


# --- I/O ------------------------------------------------------------------------------------------------------------


def read_uevents(root: str = SYS_CLASS_BLOCK) -> dict[str, str]:
    """Every block device's resolved sysfs directory -> its uevent text."""
    out = {}
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for name in names:
        d = os.path.realpath(os.path.join(root, name))
        try:
            with open(os.path.join(d, "uevent"), encoding="utf-8") as f:
                out[d] = f.read()
        except OSError:
            continue
    return out


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return p


def path_device(path: str) -> str:
    """MAJ:MIN of the block device under `path` (a block device itself, a file, a folder, or one not made yet: its
    nearest existing parent). A file system without its own device number (btrfs, overlay) is looked up by its
    mount's source device. BadInput when there is no block device under it (tmpfs, a network file system)."""
    from memascend_cli.ssd.blockdev import mount_for_path, parse_mountinfo

    real = os.path.realpath(_nearest_existing(path))
    st = os.stat(real)
    if stat.S_ISBLK(st.st_mode):
        return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    if os.major(st.st_dev) != 0:
        return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    try:
        with open(MOUNTINFO, encoding="utf-8") as f:
            mount = mount_for_path(real, parse_mountinfo(f.read()))
    except OSError:
        mount = None
    if mount is not None and mount.source.startswith("/dev/"):
        try:
            src = os.stat(mount.source)
            if stat.S_ISBLK(src.st_mode):
                return f"{os.major(src.st_rdev)}:{os.minor(src.st_rdev)}"
        except OSError:
            pass
    fs = mount.fstype if mount is not None else "?"
    raise BadInput(f"--ssd-bandwidth: {path} is on {fs}, which has no block device to throttle",
                   "put --out, --nvme-dir and --region on a file system on a disk (ext4, xfs) or a block device")


def resolve_limits(paths: list[str], bytes_per_s: int) -> list[IoLimit]:
    """The limits that throttle every path of `paths` (one per block device with a queue under them)."""
    uevents = read_uevents()
    devices = {}
    for p in paths:
        mm = path_device(p)
        dev = queue_device(mm, uevents)
        if dev is None:
            raise BadInput(f"--ssd-bandwidth: the device {mm} under {p} is not in {SYS_CLASS_BLOCK}",
                           "run on a machine whose block devices sysfs lists, or drop --ssd-bandwidth")
        devices[p] = dev
    return group_limits(devices, bytes_per_s)
