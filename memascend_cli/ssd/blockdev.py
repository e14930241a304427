"""Block device enumeration: what disks, partitions and stacked devices this machine has.

Parsing (`parse_lsblk_json`, `parse_mountinfo`) is pure and tested on fixture text; probing
(`list_block_devices`, `find_block_device`, `device_for_path`) runs one `lsblk` subprocess and
reads sysfs. Without `lsblk` the same records are built from /sys/block alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from dataclasses import asdict, dataclass, field

SYS_BLOCK = "/sys/block"
SYS_CLASS_BLOCK = "/sys/class/block"
SYS_DEV_BLOCK = "/sys/dev/block"
MOUNTINFO = "/proc/self/mountinfo"

# sysfs counts `size` in 512-byte sectors whatever the device's logical block size.
SYSFS_SECTOR_BYTES = 512
# The kernel's default sector size; used when neither lsblk nor sysfs says otherwise.
DEFAULT_BLOCK_BYTES = 512

# Explicit columns for lsblk builds that reject -O (PATH needs util-linux >= 2.33).
_LSBLK_COLUMNS = "NAME,KNAME,PATH,MAJ:MIN,TYPE,SIZE,MODEL,SERIAL,ROTA,TRAN,LOG-SEC,PHY-SEC,MOUNTPOINT,FSTYPE,RO"
_LSBLK_TIMEOUT_S = 5.0


@dataclass
class BlockDevice:
    """One node of the block device tree (a disk, a partition, a loop, dm or md device)."""

    name: str
    """lsblk name, e.g. 'nvme0n1p2', 'vda', 'vg0-swap' (dm devices use their mapper name)."""
    path: str
    """Device node, e.g. '/dev/nvme0n1p2' or '/dev/mapper/vg0-swap'."""
    type: str
    """lsblk TYPE: 'disk', 'part', 'loop', 'raid1', 'lvm', 'crypt', 'rom', ..."""
    size_bytes: int
    model: str | None
    serial: str | None
    rotational: bool
    """True for spinning disks, and for virtual disks that do not say otherwise (virtio, loop)."""
    transport: str | None
    """'nvme', 'sata', 'usb', ... or None when the kernel does not say (virtio, loop, dm)."""
    is_nvme: bool
    """The device is an NVMe namespace, or sits on one (partition, LVM volume, RAID member)."""
    logical_block_bytes: int
    """Smallest addressable unit; O_DIRECT offsets and lengths must be multiples of it."""
    physical_block_bytes: int
    """Internal sector size; I/O aligned to it avoids read-modify-write."""
    mountpoints: list[str]
    fstype: str | None
    parent: str | None
    """Name of the device this one sits on (the disk of a partition), None for top-level disks."""
    children: list[str]
    """Names of partitions and stacked devices directly on this one."""
    holders: list[str]
    """Names of devices stacked on this one (dm, md); a device with holders is in use."""
    read_only: bool
    kname: str | None = None
    """Kernel name ('dm-0' for 'vg0-swap'), the name used under /sys/block."""
    maj_min: str | None = None
    """'major:minor', the key that links a file's st_dev to its device."""

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return asdict(self)


@dataclass
class MountEntry:
    """One line of /proc/self/mountinfo."""

    maj_min: str
    """st_dev of files on this mount; major 0 for filesystems without a block device (tmpfs, overlay)."""
    mountpoint: str
    fstype: str
    source: str
    options: list[str] = field(default_factory=list)


def _as_int(value, default: int = 0) -> int:
    # lsblk < 2.33 prints numbers as JSON strings; newer versions as numbers.
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _as_bool(value) -> bool:
    # Newer lsblk prints booleans, older ones "0"/"1".
    if isinstance(value, str):
        return value.strip() not in ("", "0", "false")
    return bool(value)


def _as_str(value) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _mountpoints_of(raw: dict) -> list[str]:
    # util-linux >= 2.37 lists every mount point (bind mounts, btrfs subvolumes); older only one.
    if "mountpoints" in raw:
        return [m for m in raw["mountpoints"] or [] if m]
    return [raw["mountpoint"]] if raw.get("mountpoint") else []


def parse_lsblk_json(text: str) -> list[BlockDevice]:
    """Parse `lsblk -J -b` output into a flat list, parents before their children.

    Partitions and stacked devices inherit model, transport and NVMe-ness from the device they sit
    on (lsblk reports those only for the disk). A device with several parents (RAID over two
    partitions) appears once, with the first parent.

    Args:
        text: the JSON printed by `lsblk -J -b -O` or `lsblk -J -b -o ...`.

    Returns:
        One BlockDevice per distinct device name.
    """
    doc = json.loads(text)
    devices: dict[str, BlockDevice] = {}

    def visit(raw: dict, parent: BlockDevice | None) -> None:
        name = str(raw["name"])
        kname = _as_str(raw.get("kname")) or name
        if name in devices:
            # Seen under another parent (RAID/LVM spanning devices): link, do not duplicate.
            if parent is not None and name not in parent.children:
                parent.children.append(name)
                parent.holders.append(name)
            return
        transport = _as_str(raw.get("tran"))
        model = _as_str(raw.get("model"))
        is_nvme = transport == "nvme" or kname.startswith("nvme")
        if parent is not None:
            transport = transport or parent.transport
            model = model or parent.model
            is_nvme = is_nvme or parent.is_nvme
        logical = _as_int(raw.get("log-sec"), DEFAULT_BLOCK_BYTES)
        dev = BlockDevice(
            name=name,
            path=_as_str(raw.get("path")) or f"/dev/{name}",
            type=_as_str(raw.get("type")) or "disk",
            size_bytes=_as_int(raw.get("size")),
            model=model,
            serial=_as_str(raw.get("serial")),
            rotational=_as_bool(raw.get("rota")),
            transport=transport,
            is_nvme=is_nvme,
            logical_block_bytes=logical,
            physical_block_bytes=_as_int(raw.get("phy-sec"), logical),
            mountpoints=_mountpoints_of(raw),
            fstype=_as_str(raw.get("fstype")),
            parent=parent.name if parent is not None else None,
            children=[],
            holders=[],
            read_only=_as_bool(raw.get("ro")),
            kname=kname,
            maj_min=_as_str(raw.get("maj:min")),
        )
        devices[name] = dev
        if parent is not None:
            parent.children.append(name)
            # Partitions belong to their disk; anything else on top of a device holds it.
            if dev.type != "part":
                parent.holders.append(name)
        for child in raw.get("children") or []:
            visit(child, dev)

    for raw in doc.get("blockdevices") or []:
        visit(raw, None)
    return list(devices.values())


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape_mount(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Parse /proc/self/mountinfo (see proc(5)); order is kept, later entries stack on earlier ones."""
    entries = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 6 or len(fields) < sep + 3:
            continue
        entries.append(
            MountEntry(
                maj_min=fields[2],
                mountpoint=_unescape_mount(fields[4]),
                fstype=fields[sep + 1],
                source=_unescape_mount(fields[sep + 2]),
                options=fields[5].split(","),
            )
        )
    return entries


def read_mountinfo() -> list[MountEntry]:
    """The mount table of this process."""
    with open(MOUNTINFO, encoding="utf-8", errors="replace") as f:
        return parse_mountinfo(f.read())


def mount_for_path(path: str, entries: list[MountEntry]) -> MountEntry | None:
    """The mount a path lives on: the longest mount point prefix, the last-mounted on ties.

    Args:
        path: an absolute path, already resolved with os.path.realpath.
        entries: parse_mountinfo output.
    """
    best: MountEntry | None = None
    for entry in entries:
        mp = entry.mountpoint
        inside = mp == "/" or path == mp or path.startswith(mp.rstrip("/") + "/")
        # `>=` so that a later mount on the same point (stacked mounts) wins.
        if inside and (best is None or len(mp) >= len(best.mountpoint)):
            best = entry
    return best


def _read_sys(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _sys_dir(kname: str) -> str:
    # /sys/class/block has partitions too; /sys/block only whole devices.
    return os.path.join(SYS_CLASS_BLOCK, kname)


def _queue_dir(kname: str) -> str | None:
    # Partitions have no queue/ of their own: it lives in the parent disk's directory.
    own = os.path.join(_sys_dir(kname), "queue")
    if os.path.isdir(own):
        return own
    parent_queue = os.path.join(os.path.dirname(os.path.realpath(_sys_dir(kname))), "queue")
    return parent_queue if os.path.isdir(parent_queue) else None


def _kname_to_name(kname: str) -> str:
    # dm devices are known by their mapper name (lsblk does the same); others by kernel name.
    return _read_sys(os.path.join(_sys_dir(kname), "dm", "name")) or kname


def _sys_holders(kname: str) -> list[str] | None:
    try:
        return sorted(_kname_to_name(h) for h in os.listdir(os.path.join(_sys_dir(kname), "holders")))
    except OSError:
        return None


def _enrich_from_sysfs(devices: list[BlockDevice], mounts: list[MountEntry]) -> None:
    """Fill block sizes, rotational and holders from sysfs; fstype from the mount table if missing."""
    fstype_by_dev = {m.maj_min: m.fstype for m in mounts}
    for dev in devices:
        kname = dev.kname or dev.name
        queue = _queue_dir(kname)
        if queue is not None:
            logical = _read_sys(os.path.join(queue, "logical_block_size"))
            physical = _read_sys(os.path.join(queue, "physical_block_size"))
            dev.logical_block_bytes = _as_int(logical, dev.logical_block_bytes)
            dev.physical_block_bytes = _as_int(physical, dev.physical_block_bytes)
            rotational = _read_sys(os.path.join(queue, "rotational"))
            if rotational is not None:
                dev.rotational = rotational == "1"
        holders = _sys_holders(kname)
        if holders is not None:
            dev.holders = holders
        if dev.fstype is None and dev.maj_min in fstype_by_dev:
            # lsblk reads fstype from udev/blkid, which containers often lack; the kernel knows
            # the type of anything mounted.
            dev.fstype = fstype_by_dev[dev.maj_min]


def _sysfs_type(kname: str) -> str:
    base = _sys_dir(kname)
    if os.path.exists(os.path.join(base, "partition")):
        return "part"
    if kname.startswith("loop"):
        return "loop"
    if kname.startswith("sr"):
        return "rom"
    if os.path.isdir(os.path.join(base, "md")):
        return _read_sys(os.path.join(base, "md", "level")) or "md"
    if os.path.isdir(os.path.join(base, "dm")):
        # Same mapping lsblk uses: the dm UUID prefix names the subsystem (LVM-, CRYPT-, ...).
        uuid = _read_sys(os.path.join(base, "dm", "uuid")) or ""
        prefix = uuid.split("-", 1)[0].lower() if "-" in uuid else ""
        return prefix or "dm"
    return "disk"


def _sysfs_transport(kname: str) -> str | None:
    if kname.startswith("nvme"):
        return "nvme"
    real = os.path.realpath(_sys_dir(kname))
    if "/usb" in real:
        return "usb"
    if "/ata" in real:
        return "sata"
    return None


def _sysfs_device(kname: str, parent: BlockDevice | None, mounts: list[MountEntry]) -> BlockDevice:
    base = _sys_dir(kname)
    maj_min = _read_sys(os.path.join(base, "dev"))
    mountpoints = [m.mountpoint for m in mounts if m.maj_min == maj_min]
    dm_name = _read_sys(os.path.join(base, "dm", "name"))
    name = dm_name or kname
    if parent is not None:
        model, transport, is_nvme = parent.model, parent.transport, parent.is_nvme
    else:
        model = _read_sys(os.path.join(base, "device", "model")) or None
        transport = _sysfs_transport(kname)
        is_nvme = transport == "nvme"
    serial = _read_sys(os.path.join(base, "device", "serial")) or _read_sys(os.path.join(base, "serial"))
    return BlockDevice(
        name=name,
        path=f"/dev/mapper/{dm_name}" if dm_name else f"/dev/{kname}",
        type=_sysfs_type(kname),
        size_bytes=_as_int(_read_sys(os.path.join(base, "size"))) * SYSFS_SECTOR_BYTES,
        model=model,
        serial=serial or None,
        rotational=False,
        transport=transport,
        is_nvme=is_nvme,
        logical_block_bytes=DEFAULT_BLOCK_BYTES,
        physical_block_bytes=DEFAULT_BLOCK_BYTES,
        mountpoints=mountpoints,
        fstype=next((m.fstype for m in mounts if m.maj_min == maj_min), None),
        parent=parent.name if parent is not None else None,
        children=[],
        holders=[],
        read_only=_read_sys(os.path.join(base, "ro")) == "1",
        kname=kname,
        maj_min=maj_min,
    )


def _list_from_sysfs(mounts: list[MountEntry]) -> list[BlockDevice]:
    """Build the device list from /sys/block alone (no lsblk on the machine)."""
    try:
        knames = sorted(os.listdir(SYS_BLOCK))
    except OSError:
        return []
    devices: list[BlockDevice] = []
    for kname in knames:
        disk = _sysfs_device(kname, None, mounts)
        # lsblk hides detached loop devices; they have size 0.
        if disk.type == "loop" and disk.size_bytes == 0:
            continue
        devices.append(disk)
        base = os.path.join(SYS_BLOCK, kname)
        for entry in sorted(os.listdir(base)):
            if os.path.exists(os.path.join(base, entry, "partition")):
                part = _sysfs_device(entry, disk, mounts)
                disk.children.append(part.name)
                devices.append(part)
        slaves = sorted(os.listdir(os.path.join(base, "slaves"))) if os.path.isdir(os.path.join(base, "slaves")) else []
        if slaves:
            # dm/md devices: the first underlying device stands as parent, like lsblk's tree.
            disk.parent = _kname_to_name(slaves[0])
    by_name = {d.name: d for d in devices}
    for dev in devices:
        if dev.parent is not None and dev.type != "part" and dev.parent in by_name:
            parent = by_name[dev.parent]
            parent.children.append(dev.name)
            dev.is_nvme = dev.is_nvme or parent.is_nvme
    return devices


def _run_lsblk() -> str | None:
    exe = shutil.which("lsblk")
    if exe is None:
        return None
    for args in (["-J", "-b", "-O"], ["-J", "-b", "-o", _LSBLK_COLUMNS]):
        try:
            proc = subprocess.run(
                [exe, *args], capture_output=True, text=True, timeout=_LSBLK_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout
    return None


def list_block_devices() -> list[BlockDevice]:
    """All block devices of this machine, parents before children.

    Uses `lsblk -J -b -O` (falling back to explicit columns for older util-linux), then sysfs for
    block sizes, rotational and holders, which lsblk may report from a stale udev database.
    Without lsblk, everything comes from /sys/block.
    """
    try:
        mounts = read_mountinfo()
    except OSError:
        mounts = []
    text = _run_lsblk()
    devices: list[BlockDevice] | None = None
    if text is not None:
        try:
            devices = parse_lsblk_json(text)
        except (ValueError, KeyError, TypeError):
            devices = None
    if devices is None:
        devices = _list_from_sysfs(mounts)
    _enrich_from_sysfs(devices, mounts)
    return devices


def _dev_key(st_dev: int) -> str:
    return f"{os.major(st_dev)}:{os.minor(st_dev)}"


def _find_by_maj_min(maj_min: str, devices: list[BlockDevice]) -> BlockDevice | None:
    for dev in devices:
        if dev.maj_min == maj_min:
            return dev
    # lsblk output without MAJ:MIN: go through the kernel name.
    target = os.path.realpath(os.path.join(SYS_DEV_BLOCK, maj_min))
    kname = os.path.basename(target) if os.path.exists(target) else None
    return next((d for d in devices if kname is not None and (d.kname or d.name) == kname), None)


def find_block_device(path: str) -> BlockDevice | None:
    """The block device behind a device node such as /dev/loop3 or /dev/disk/by-id/nvme-...

    Symlinks are resolved; returns None when the path is not a block device (or is a detached loop).
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISBLK(st.st_mode):
        return None
    return _find_by_maj_min(_dev_key(st.st_rdev), list_block_devices())


def device_for_path(path: str) -> BlockDevice | None:
    """The block device that stores a file or directory, or None (tmpfs, overlay, network FS).

    Raises OSError (FileNotFoundError, ...) when the path cannot be stat'ed.

    Matches the file's st_dev (major:minor) against the device list; for filesystems that report
    an anonymous st_dev (btrfs, some overlays) the mount table's source device is used instead.
    """
    real = os.path.realpath(path)
    st = os.stat(real)
    if stat.S_ISBLK(st.st_mode):
        return find_block_device(real)
    devices = list_block_devices()
    if os.major(st.st_dev) != 0:
        found = _find_by_maj_min(_dev_key(st.st_dev), devices)
        if found is not None:
            return found
    try:
        mount = mount_for_path(real, read_mountinfo())
    except OSError:
        mount = None
    if mount is None or not mount.source.startswith("/dev/"):
        return None
    try:
        source_dev = os.stat(mount.source).st_rdev
    except OSError:
        return None
    return _find_by_maj_min(_dev_key(source_dev), devices)
