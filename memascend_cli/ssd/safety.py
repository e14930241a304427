"""Whether `prepare-ssd` may write a target: pure rules over facts gathered elsewhere.

`ssd_probe.gather_target_facts()` does the I/O (sysfs, /proc, `wipefs`, an exclusive open) and
fills a `TargetFacts`; `assess()` turns it into a `Verdict` without touching anything, so every
rule is unit-tested on hand-written facts.

Two kinds of reasons not to write:
- refusals: hard stops no flag overrides (mounted, root file system, in use, swap, read-only,
  RAM-backed or non-O_DIRECT file system, not enough space);
- warnings needing `--force`: data that would be destroyed but is not in use (a file-system or
  other signature, a partition table, a RAID/LVM member, an existing memascend region).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from memascend_cli.units import fmt_bytes

# Signature types that mark a device as part of a larger volume: writing it breaks the array or
# volume group even when nothing is mounted.
MEMBER_SIGNATURES = frozenset(
    {
        "linux_raid_member", "LVM2_member", "LVM1_member", "zfs_member", "ddf_raid_member",
        "isw_raid_member", "adaptec_raid_member", "hpt45x_raid_member", "lsi_mega_raid_member",
        "nvidia_raid_member", "promise_fasttrack_raid_member", "silicon_medley_raid_member",
        "via_raid_member", "jmicron_raid_member", "bcache", "ceph_bluestore", "drbd", "VMFS_volume_member",
    }
)

# File systems whose pages live in memory: a region there would put "offloaded" state back in RAM.
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs", "proc", "sysfs", "devpts", "cgroup", "cgroup2"})

# Network and cluster file systems (mountinfo types; FUSE ones as `fuse.<name>`): a region is node-local state that
# every step reads and writes, and on a shared file system two nodes' ranks would open the same file.
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "9p", "afs", "ceph", "lustre", "gpfs", "beegfs", "glusterfs",
    "ocfs2", "gfs2", "pvfs2", "orangefs", "panfs", "quobyte", "wekafs", "davfs", "coda",
})


def is_network_fs(fstype: str | None) -> bool:
    """True for a network or cluster file system (also its FUSE clients: fuse.sshfs, fuse.glusterfs, ...)."""
    if not fstype:
        return False
    name = fstype.removeprefix("fuse.")
    return (fstype in NETWORK_FILESYSTEMS or name in NETWORK_FILESYSTEMS
            or (fstype.startswith("fuse.") and name in {"sshfs", "s3fs", "rclone", "juicefs", "cephfs", "gcsfuse",
                                                       "goofys", "davfs2", "moosefs", "mfs", "lizardfs"}))


@dataclass(kw_only=True, slots=True)
class Signature:
    """A signature found on a device by `wipefs` or `blkid` (file system, partition table, RAID...)."""

    type: str
    """e.g. `ext4`, `gpt`, `linux_raid_member`, `swap`."""
    offset_bytes: int | None = None
    """Where the magic was found, when the tool says."""
    label: str | None = None
    uuid: str | None = None

    def describe(self) -> str:
        """`ext4 (label data) at byte 0x438`."""
        text = self.type
        if self.label:
            text += f" (label {self.label})"
        if self.offset_bytes is not None:
            text += f" at byte {self.offset_bytes:#x}"
        return text


@dataclass(kw_only=True, slots=True)
class TargetFacts:
    """Everything `assess` needs to know about a target; gathered by `ssd_probe.gather_target_facts`."""

    path: str
    """The target as given (resolved symlinks in `real_path`)."""
    real_path: str
    kind: str
    """`block` (disk, partition, loop...), `file` (regular file or a path to create), `dir`, `other`."""
    exists: bool = True
    size_bytes: int = 0
    """Current size: the device size, or the file's size (0 for a file to create)."""
    requested_size_bytes: int | None = None
    """`--size` for file targets."""
    # --- block devices
    device_name: str | None = None
    """Kernel/lsblk name (`loop3`, `nvme0n1p2`); what the confirmation prompt asks to type."""
    device_type: str | None = None
    """lsblk TYPE: disk, part, loop, lvm, raid1..."""
    logical_block_bytes: int = 512
    read_only: bool = False
    open_error: str | None = None
    """Why the device could not be opened for reading (EACCES, EPERM); None when it could."""
    mounts: list[str] = field(default_factory=list)
    """`name on mountpoint` for the device and every partition or volume on it."""
    holds_root_fs: bool = False
    swap: list[str] = field(default_factory=list)
    """Active swap areas on the device (or this swap file)."""
    holders: list[str] = field(default_factory=list)
    """Devices stacked on it or its partitions (dm, md): they keep it in use."""
    busy_reason: str | None = None
    """Why an exclusive open failed (EBUSY), None when it succeeded or was not tried."""
    partitions: list[str] = field(default_factory=list)
    signatures: list[Signature] = field(default_factory=list)
    signature_probe_error: str | None = None
    """Set when neither `wipefs` nor `blkid` could look at the device."""
    head_blank: bool | None = None
    """True when the first MiB reads as zeros; None when not read."""
    # --- file targets
    fstype: str | None = None
    """File system holding a file target."""
    o_direct_ok: bool | None = None
    o_direct_reason: str | None = None
    free_bytes: int | None = None
    """Free space on the file system holding a file target."""
    parent_exists: bool = True
    # --- memascend region (both kinds)
    region_state: str = "none"
    """`intact`, `corrupt` (our magic, failed checks), `none` (no header) or `unreadable`."""
    region_label: str | None = None
    region_error: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready view."""
        return asdict(self)


@dataclass(kw_only=True, slots=True)
class Verdict:
    """The outcome of `assess`: `ok` says whether to go ahead with the operation."""

    ok: bool
    refusals: list[str]
    """Hard stops: no flag overrides them."""
    warnings_needing_force: list[str]
    """Data that would be destroyed; `--force` accepts them."""
    notes: list[str] = field(default_factory=list)
    """Facts worth showing that do not block anything."""

    @property
    def status(self) -> str:
        """One word for `--list`: `safe`, `force` or `refused`."""
        if self.refusals:
            return "refused"
        if self.warnings_needing_force:
            return "force"
        return "safe"

    def to_dict(self) -> dict:
        """JSON-ready view, with `status`."""
        d = asdict(self)
        d["status"] = self.status
        return d


def parse_wipefs_json(text: str) -> list[Signature]:
    """Parse `wipefs --no-act --json DEVICE` output (empty output means no signatures)."""
    if not text.strip():
        return []
    doc = json.loads(text)
    sigs = []
    for s in doc.get("signatures") or []:
        offset = s.get("offset")
        try:
            offset_bytes = int(str(offset), 0) if offset is not None else None
        except ValueError:
            offset_bytes = None
        sigs.append(Signature(type=str(s.get("type") or "unknown"), offset_bytes=offset_bytes, label=s.get("label"), uuid=s.get("uuid")))
    return sigs


def parse_blkid_export(text: str) -> list[Signature]:
    """Parse `blkid -p -o export DEVICE` output (KEY=value lines) into at most one signature."""
    kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    kind = kv.get("TYPE") or kv.get("PTTYPE")
    if not kind:
        return []
    offset = kv.get("SBMAGIC_OFFSET") or kv.get("PTMAGIC_OFFSET")
    return [Signature(type=kind, offset_bytes=int(offset) if offset and offset.isdigit() else None, label=kv.get("LABEL"), uuid=kv.get("UUID"))]


def assess(facts: TargetFacts, *, operation: str = "prepare", force: bool = False) -> Verdict:
    """Decide whether `operation` (`prepare` or `wipe`) may write the target.

    Args:
        facts: what the target is and what is on it.
        operation: `prepare` creates or re-initialises a region; `wipe` removes one.
        force: accept the warnings that destroy data not in use.

    Returns:
        A Verdict; `ok` is False when any refusal exists, or when warnings exist without `force`.
    """
    if operation not in ("prepare", "wipe"):
        raise ValueError(f"unknown operation {operation!r}")
    if facts.kind == "block":
        refusals, warnings, notes = _assess_block(facts, operation)
    elif facts.kind == "file":
        refusals, warnings, notes = _assess_file(facts, operation)
    elif facts.kind == "dir":
        refusals, warnings, notes = [f"{facts.path} is a directory; give a file path inside it, e.g. {facts.path.rstrip('/')}/memascend.region"], [], []
    elif not facts.exists and operation == "wipe":
        refusals, warnings, notes = [f"{facts.path} does not exist"], [], []
    else:
        refusals, warnings, notes = [f"{facts.path} is neither a block device nor a regular file"], [], []
    return Verdict(ok=not refusals and (force or not warnings), refusals=refusals, warnings_needing_force=warnings, notes=notes)


def _region_rules(facts: TargetFacts, operation: str, refusals: list[str], warnings: list[str]) -> None:
    label = f" (label {facts.region_label})" if facts.region_label else ""
    if operation == "prepare":
        if facts.region_state == "intact":
            warnings.append(f"it already holds a memascend region{label}; re-initialising destroys its data")
        elif facts.region_state == "corrupt":
            warnings.append(f"it holds a damaged memascend region header ({facts.region_error})")
    else:  # wipe removes only what we made: anything else needs a tool that knows what it is
        if facts.region_state == "none":
            refusals.append("it holds no memascend region, so there is nothing to wipe")
        elif facts.region_state == "unreadable":
            refusals.append(f"its header cannot be read ({facts.region_error})")
        elif facts.region_state == "corrupt":
            warnings.append(f"its memascend region header is damaged ({facts.region_error})")


def _assess_block(facts: TargetFacts, operation: str) -> tuple[list[str], list[str], list[str]]:
    refusals: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    # Hard stops first: writing any of these corrupts a live system.
    if facts.holds_root_fs:
        refusals.append("it holds the root file system")
    if facts.mounts:
        refusals.append("it is mounted: " + ", ".join(facts.mounts))
    if facts.swap:
        refusals.append("it is active swap: " + ", ".join(facts.swap))
    if facts.holders:
        refusals.append("it is in use by " + ", ".join(facts.holders) + " (device-mapper/RAID/LVM on top of it)")
    if facts.busy_reason and not (facts.mounts or facts.swap or facts.holders):
        refusals.append(f"it is in use: {facts.busy_reason}")
    if facts.read_only:
        refusals.append("it is read-only")
    if facts.open_error:
        refusals.append(f"it cannot be opened: {facts.open_error}")
    # Destroys data that is not in use: allowed with --force.
    members = [s for s in facts.signatures if s.type in MEMBER_SIGNATURES]
    others = [s for s in facts.signatures if s.type not in MEMBER_SIGNATURES]
    if members:
        warnings.append("it is a RAID/LVM member: " + ", ".join(s.describe() for s in members))
    if facts.partitions:
        warnings.append("it has partitions: " + ", ".join(facts.partitions))
    if others:
        warnings.append("it holds a signature: " + ", ".join(s.describe() for s in others))
    if not facts.signatures and facts.region_state == "none" and facts.head_blank is False:
        # No tool recognised anything, but the first MiB is not blank: someone's raw data.
        why = f" (`wipefs` could not check it: {facts.signature_probe_error})" if facts.signature_probe_error else ""
        warnings.append(f"its first MiB holds data that is not a recognised signature{why}")
    elif facts.signature_probe_error and facts.head_blank is None:
        warnings.append(f"its signatures could not be checked: {facts.signature_probe_error}")
    _region_rules(facts, operation, refusals, warnings)
    return refusals, warnings, notes


def _assess_file(facts: TargetFacts, operation: str) -> tuple[list[str], list[str], list[str]]:
    refusals: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    if not facts.parent_exists:
        refusals.append("its directory does not exist")
        return refusals, warnings, notes
    if operation == "wipe":
        if not facts.exists:
            refusals.append("it does not exist")
            return refusals, warnings, notes
        if facts.swap:
            refusals.append("it is an active swap file")
        _region_rules(facts, operation, refusals, warnings)
        return refusals, warnings, notes
    fstype = facts.fstype or "unknown"
    if fstype in RAM_FILESYSTEMS:
        refusals.append(f"it is on {fstype}, which keeps file data in RAM (and does not honour O_DIRECT alignment): offloading there saves no memory")
    elif is_network_fs(fstype):
        refusals.append(f"it is on {fstype}, a network file system: a region must be on a node-local SSD (every "
                        "step reads and writes it; on a shared file system other nodes could open the same file)")
    elif facts.o_direct_ok is False:
        refusals.append(f"its file system ({fstype}) does not support O_DIRECT: {facts.o_direct_reason or 'open with O_DIRECT failed'}")
    if facts.swap:
        refusals.append("it is an active swap file")
    if facts.exists:
        if facts.region_state == "none" or facts.region_state == "unreadable":
            refusals.append("it exists and is not a memascend region; refusing to overwrite an unknown file")
        else:
            _region_rules(facts, operation, refusals, warnings)
    need_bytes = facts.requested_size_bytes or 0
    # Growing an existing file only needs the difference.
    extra_bytes = max(0, need_bytes - (facts.size_bytes if facts.exists else 0))
    if facts.free_bytes is not None and extra_bytes > facts.free_bytes:
        refusals.append(f"its file system has {fmt_bytes(facts.free_bytes)} free, {fmt_bytes(extra_bytes)} needed")
    return refusals, warnings, notes


def refusal_message(facts: TargetFacts, verdict: Verdict, *, operation: str = "prepare") -> tuple[str, str]:
    """The `error:` and `hint:` lines for a Verdict that is not ok."""
    verb = "prepare" if operation == "prepare" else "wipe"
    if verdict.refusals:
        hint = "nothing overrides this; choose another target (`memascend prepare-ssd --list` shows candidates)"
        if any("directory" in r for r in verdict.refusals):
            hint = "give a file path, e.g. `memascend prepare-ssd /mnt/nvme/memascend.region --size 200GiB`"
        elif any("RAM" in r or "O_DIRECT" in r or "network file system" in r for r in verdict.refusals):
            hint = "put the region file on an ext4/xfs file system on an SSD, e.g. `--size 200GiB /mnt/nvme/memascend.region`"
        elif any("nothing to wipe" in r for r in verdict.refusals):
            hint = "`memascend prepare-ssd --info TARGET` shows what is there; other signatures are for `wipefs`"
        return f"refusing to {verb} {facts.path}: " + "; ".join(verdict.refusals), hint
    return (
        f"refusing to {verb} {facts.path} without --force: " + "; ".join(verdict.warnings_needing_force),
        "check it is the right target (`memascend prepare-ssd --list`), then add --force to destroy what is on it",
    )
