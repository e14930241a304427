"""One region striped across several targets (devices, partitions or files on different drives): the layout, the
address math, the header's member table and the checks that the members are the ones recorded.

Layout (format version 3; a region of one member is version 2 and carries none of this). Every member starts with
its own copy of the header block (the same body, its own `member_index`) and the reserved area; the owner table is
member 0's (the region's path: every opener locks there). The data area is RAID-0 over the members:

    logical byte x < data_start            member 0, byte x (header and owner table)
    logical byte x >= data_start           stripe s = (x - data_start) // unit on member s % N,
                                           at data_start + (s // N) * unit + (x - data_start) % unit

so the extent allocator, the rank split and the checksums work in logical bytes as for one target, and any request
of N stripe units or more keeps every member busy. Capacity = data_start + N * stripes * unit, `stripes` the
smallest member's whole units past data_start.

Identity: each member's kind, device number (block: its own; file: the file system's), inode (files), size and serial
are recorded, so a member that is missing, was swapped with another, replaced or resized is refused by name before any
I/O (ssd/members.py reads them).

Pure, stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_MEMBERS = 8
"""At most 8 members (a DGX's 8 NVMe drives); keeps 64 ranks and the member table inside the 4 KiB header block."""
DEFAULT_STRIPE_UNIT_BYTES = 1 << 20
"""Stripe unit when no probe chose an I/O size: the native engine's default request size."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemberIdentity:
    """What identifies one member target."""

    kind: str
    """`block` or `file`."""
    dev: str
    """MAJ:MIN: the block device's own number, or the file system's under a file."""
    ino: int
    """A file's inode; 0 for a block device."""
    size_bytes: int
    """The device's or the file's size."""
    serial: str
    """sysfs serial or WWID of a device (a loop device: its backing file); empty when there is none (files)."""


@dataclass(kw_only=True, slots=True)
class Member:
    """One target of a striped region, as recorded in the header."""

    path: str
    """Absolute path the member was prepared at."""
    identity: MemberIdentity
    read_gbps: float | None = None
    """This member's probed sequential read bandwidth, GB/s (None: not probed)."""
    write_gbps: float | None = None
    """This member's probed sequential write bandwidth, GB/s."""
    best_block_bytes: int = 0
    """The member's probed best request size (0: not probed)."""
    best_queue_depth: int = 0
    """The member's probed best queue depth (0: not probed)."""

    def to_list(self) -> list:
        """Compact JSON form (a header block holds 8 of them beside 64 ranks)."""
        i = self.identity
        return [self.path, i.kind, i.dev, i.ino, i.size_bytes, i.serial, self.read_gbps, self.write_gbps,
                self.best_block_bytes, self.best_queue_depth]

    @classmethod
    def from_list(cls, v: list) -> Member:
        path, kind, dev, ino, size, serial, read, write, block, qd = v
        return cls(path=str(path), identity=MemberIdentity(kind=str(kind), dev=str(dev), ino=int(ino),
                                                          size_bytes=int(size), serial=str(serial)),
                   read_gbps=None if read is None else float(read), write_gbps=None if write is None else float(write),
                   best_block_bytes=int(block), best_queue_depth=int(qd))


@dataclass(frozen=True, slots=True)
class Piece:
    """One member's part of a logical request."""

    member: int
    member_offset: int
    """Byte offset on the member."""
    buffer_offset: int
    """Offset of this part inside the caller's buffer."""
    nbytes: int


# --- pure: geometry -------------------------------------------------------------------------------------------------


def stripe_unit(alignment_bytes: int, io_bytes: int) -> int:
    """The stripe unit: the I/O request size (the probe's best block, else 1 MiB), at least the alignment, a power of
    two (so a unit holds whole aligned blocks and one request of the unit's size lands on one member)."""
    n = max(int(io_bytes or DEFAULT_STRIPE_UNIT_BYTES), int(alignment_bytes))
    return 1 << (n - 1).bit_length()


def stripes_per_member(member_sizes: list[int], data_start_bytes: int, unit_bytes: int) -> int:
    """Whole stripe units past the data start on the smallest member."""
    return max(0, min((s - data_start_bytes) // unit_bytes for s in member_sizes))


def striped_capacity(member_sizes: list[int], data_start_bytes: int, unit_bytes: int) -> int:
    """Logical capacity of a region striped over members of `member_sizes` bytes."""
    return data_start_bytes + len(member_sizes) * stripes_per_member(member_sizes, data_start_bytes, unit_bytes) * unit_bytes


def member_end_bytes(capacity_bytes: int, data_start_bytes: int, num_members: int) -> int:
    """First byte past what the region uses on each member (every member holds as many units)."""
    return data_start_bytes + (capacity_bytes - data_start_bytes) // num_members


def split(offset: int, nbytes: int, *, data_start_bytes: int, unit_bytes: int, num_members: int) -> list[Piece]:
    """The member pieces of logical bytes [offset, offset + nbytes), in logical order.

    One member, or a range inside the header area, maps to itself; a range must not straddle the data start (extents
    live in the data area, header I/O in the header area)."""
    if num_members <= 1 or offset + nbytes <= data_start_bytes:
        return [Piece(0, offset, 0, nbytes)]
    if offset < data_start_bytes:
        raise ValueError(f"logical bytes {offset}..{offset + nbytes - 1} straddle the data start {data_start_bytes}")
    pieces, done, rel = [], 0, offset - data_start_bytes
    while done < nbytes:
        s, within = divmod(rel + done, unit_bytes)
        take = min(unit_bytes - within, nbytes - done)
        member_offset = data_start_bytes + (s // num_members) * unit_bytes + within
        pieces.append(Piece(s % num_members, member_offset, done, take))
        done += take
    return pieces


# --- pure: header ---------------------------------------------------------------------------------------------------


def body_entry(h) -> dict:
    """The header body's `stripe` entry of RegionHeader `h` (absent for a region of one member)."""
    if not h.members:
        return {}
    return {"stripe": {"unit": h.stripe_unit_bytes, "index": h.member_index, "members": [m.to_list() for m in h.members]}}


def from_body(d: dict) -> dict:
    """RegionHeader keyword arguments from a body's `stripe` entry (none when absent)."""
    s = d.get("stripe")
    if s is None:
        return {}
    return {"stripe_unit_bytes": int(s["unit"]), "member_index": int(s["index"]),
            "members": [Member.from_list(v) for v in s["members"]]}


def header_problems(h) -> list[str]:
    """What is wrong with RegionHeader `h`'s stripe geometry (empty when fine, or when it has no members)."""
    members, unit_bytes, member_index = h.members, h.stripe_unit_bytes, h.member_index
    alignment_bytes, data_start_bytes, capacity_bytes = h.alignment_bytes, h.data_start_bytes, h.capacity_bytes
    if not members:
        return [] if unit_bytes == 0 and member_index == 0 else ["a stripe unit or member index without members"]
    out = []
    n = len(members)
    if not 2 <= n <= MAX_MEMBERS:
        out.append(f"{n} members (a striped region has 2..{MAX_MEMBERS})")
    if unit_bytes <= 0 or unit_bytes % alignment_bytes or unit_bytes & (unit_bytes - 1):
        out.append(f"stripe unit {unit_bytes} is not a power of two multiple of the alignment {alignment_bytes}")
    elif (capacity_bytes - data_start_bytes) % (n * unit_bytes):
        out.append(f"data area of {capacity_bytes - data_start_bytes} B is not whole rows of {n} x {unit_bytes} B")
    if not 0 <= member_index < n:
        out.append(f"member index {member_index} outside 0..{n - 1}")
    per_member_end = member_end_bytes(capacity_bytes, data_start_bytes, n)
    out += [f"member {i + 1} ({m.path}) of {m.identity.size_bytes} B is smaller than its {per_member_end} B"
            for i, m in enumerate(members) if m.identity.size_bytes < per_member_end]
    return out


def identity_differences(recorded: MemberIdentity, found: MemberIdentity) -> dict[str, str]:
    """How the target found differs from the member recorded, by field (kind, serial, dev, size); a serial recorded
    empty is not compared.

    Only a different kind or size is refused by itself (resized, or not the target the region was made on): a device
    renumbered after a reboot, a file moved or a drive cloned still holds the member's own header copy, which says
    which member it is (ssd/members.py); the others explain a target that holds no such copy."""
    out = {}
    if found.kind != recorded.kind:
        return {"kind": f"is a {found.kind}, recorded a {recorded.kind}"}
    if found.serial != recorded.serial and recorded.serial:
        out["serial"] = f"has serial {found.serial or '(none)'}, recorded {recorded.serial}"
    if found.dev != recorded.dev or found.ino != recorded.ino:
        what = "device" if found.kind == "block" else "file (device:inode)"
        out["dev"] = (f"is {what} {found.dev}{'' if found.kind == 'block' else ':' + str(found.ino)}, recorded "
                      f"{recorded.dev}{'' if recorded.kind == 'block' else ':' + str(recorded.ino)}")
    if found.size_bytes != recorded.size_bytes:
        out["size"] = f"is {found.size_bytes} B, recorded {recorded.size_bytes} B (resized)"
    return out
