"""The node part of `train`'s preflight: run on every node, before training starts.

A region is node-local, so the launch node cannot check the other nodes' regions. The first local rank of every node
gathers this node's facts (gather_node_facts) and assess_node turns them into problems (pure); engine/cluster_preflight.py
runs it through DeepSpeed's launcher and stops every rank at once with the first node's problem. The launch node runs
the same check on its own region before launching a single-node run (commands/train.py).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from memascend_cli.ssd.safety import RAM_FILESYSTEMS, is_network_fs


@dataclass(kw_only=True)
class NodeFacts:
    host: str
    region: str
    local_ranks: int
    exists: bool = True
    fstype: str | None = None
    """File system holding a region file (None for a block device)."""
    header_error: str | None = None
    """Why the region header is unusable (not a region, corrupt, unreadable), None if fine."""
    sub_regions: int = 0
    busy: str | None = None
    """Why a sub-region of this node's ranks is taken (another live job holds it), None if free."""


def gather_node_facts(region_path: str, local_ranks: int) -> NodeFacts:
    """Look at this node's region (I/O: stat, mount table, header, owner records)."""
    from memascend_cli.ssd import region
    from memascend_cli.ssd import owner as region_owner
    from memascend_cli.errors import SSDNotReady

    f = NodeFacts(host=socket.gethostname(), region=region_path, local_ranks=local_ranks)
    if not os.path.exists(region_path):
        f.exists = False
        return f
    f.fstype = region_fstype(region_path)
    try:
        header = region.read_header(region_path)
    except region.NoRegion:
        f.header_error = "holds no memascend region (not prepared)"
        return f
    except SSDNotReady as exc:
        f.header_error = exc.message
        return f
    except OSError as exc:
        f.header_error = f"cannot read its region header: {exc.strerror or exc}"
        return f
    from memascend_cli.ssd.members import MemberMismatch, check_members

    try:
        check_members(region_path, header)
    except MemberMismatch as exc:
        f.header_error = exc.message  # a striped region's member missing, swapped or resized on this node
        return f
    f.sub_regions = len(header.ranks)
    if f.sub_regions >= local_ranks:
        try:
            f.busy, _ = region_owner.check_ranks_free(region_path, header, local_ranks)
        except OSError as exc:
            f.header_error = f"cannot check who uses it: {exc.strerror or exc}"
    return f


def region_fstype(path: str) -> str | None:
    """The file system holding a region file (None for a block device or when the mount table says nothing)."""
    from memascend_cli.ssd.blockdev import mount_for_path, read_mountinfo

    real = os.path.realpath(path)
    if _is_block(real):
        return None
    try:
        mount = mount_for_path(real, read_mountinfo())
    except OSError:
        return None
    return mount.fstype if mount is not None else None


def _is_block(path: str) -> bool:
    import stat

    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def assess_node(f: NodeFacts) -> tuple[str, str] | None:
    """The first problem of this node as (message, hint), or None. Pure."""
    where = f"node {f.host}: region {f.region}"
    prepare = f"run `memascend prepare-ssd {f.region} --ranks {f.local_ranks}` on {f.host}"
    if not f.exists:
        return (f"{where} does not exist there (a region is node-local: every node needs its own)",
                f"{prepare}, or give each node its region with `region=PATH` in the hostfile")
    if f.fstype in RAM_FILESYSTEMS or is_network_fs(f.fstype):
        kind = "keeps data in RAM" if f.fstype in RAM_FILESYSTEMS else "is a network file system"
        return (f"{where} is on {f.fstype}, which {kind}; a region must be on a node-local SSD",
                "prepare a region on each node's own SSD (a device or a file on ext4/xfs) and point `region` at it")
    if f.header_error:
        return f"{where} {f.header_error}", prepare
    if f.sub_regions < f.local_ranks:
        return (f"{where} has {f.sub_regions} rank sub-region(s), the node runs {f.local_ranks} rank(s)",
                f"{prepare} (again, with enough ranks)")
    if f.busy:
        return f"node {f.host}: {f.busy}", "wait for that job to end or stop it; a second job needs its own region"
    return None
