"""The members of a striped region as they are on this machine (ssd/stripe.py has the layout and the records).

`identify` reads a target's identity (stat, sysfs); `member_problem` compares it and the target's header block with
what the region recorded; `check_members` refuses a region whose members are not all there as recorded, naming
each, before anything is written (`train`'s preflight, the engine's RegionStore, `prepare-ssd --info` shows them).
"""

from __future__ import annotations

import os
import stat

from memascend_cli.errors import EXIT_BAD_INPUT, SSDNotReady
from memascend_cli.ssd import region
from memascend_cli.ssd.stripe import Member, MemberIdentity, identity_differences


class MemberMismatch(SSDNotReady):
    """A member of a striped region is missing, swapped, replaced or resized (bad input: the machine is not set up
    as the region was made; nothing is written)."""

    exit_code = EXIT_BAD_INPUT


def _device_serial(maj_min: str) -> str:
    base = f"/sys/dev/block/{maj_min}"
    for rel in ("device/serial", "wwid", "device/wwid", "loop/backing_file"):
        try:
            with open(os.path.join(base, rel), encoding="utf-8") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text:
            return text
    return ""


def identify(path: str) -> MemberIdentity:
    """The identity of the target at `path` (OSError when it is missing or unreadable)."""
    st = os.stat(path)
    if stat.S_ISBLK(st.st_mode):
        mm = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)
        return MemberIdentity(kind="block", dev=mm, ino=0, size_bytes=size, serial=_device_serial(mm))
    return MemberIdentity(kind="file", dev=f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", ino=st.st_ino,
                          size_bytes=st.st_size, serial="")


def member_problem(index: int, member: Member, region_uuid: str, num_members: int) -> str | None:
    """Why member `index` cannot be used as recorded (reads its identity and its header block), or None."""
    where = f"member {index + 1} of {num_members}, {member.path},"
    try:
        found = identify(member.path)
    except FileNotFoundError:
        return f"{where} is missing"
    except OSError as exc:
        return f"{where} cannot be opened ({exc.strerror or exc})"
    try:
        h, why = region.read_header(member.path), None
    except (SSDNotReady, OSError) as exc:
        h, why = None, getattr(exc, "message", None) or str(exc)
    if h is not None and h.uuid == region_uuid and h.member_index != index:
        return f"{where} holds member {h.member_index + 1} of this region (members swapped)"
    diffs = identity_differences(member.identity, found)
    also = "".join(f" and {d}" for d in diffs.values())
    if "kind" in diffs or "size" in diffs:
        return f"{where} " + " and ".join(diffs.values())
    if h is None:
        return f"{where} holds no header of this region ({why}){also}"
    if h.uuid != region_uuid:
        return f"{where} holds another region ({h.label or h.uuid}){also}"
    return None  # its own header copy says it is this member (a renumbered device, a moved file, a cloned drive)


def check_members(path: str, header) -> None:
    """Refuse a striped region whose members are not all there as recorded (MemberMismatch naming each one); a
    region of one member passes. Reads identities and header blocks only: nothing is written."""
    if not header.members:
        return
    n = len(header.members)
    if header.member_index != 0:
        first = header.members[0].path
        raise MemberMismatch(f"{path} is member {header.member_index + 1} of {n} of striped region "
                             f"{header.label or header.uuid}, not its first member",
                             f"give the region by its first member, {first}")
    problems = [p for i, m in enumerate(header.members) if (p := member_problem(i, m, header.uuid, n))]
    if problems:
        raise MemberMismatch(f"striped region {path} ({header.label or header.uuid}): " + "; ".join(problems),
                             "attach the members recorded (`memascend prepare-ssd --info " + path + "` lists them), "
                             "or re-create the region with `memascend prepare-ssd` (its data is lost)")
