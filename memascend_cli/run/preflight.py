"""Checks before a launch: probe the facts (I/O), assess them (pure), one line + hint per problem.

Each check yields a `Check(ok, message, hint, fatal)`; a fatal failure stops the launch (unless
`--force` where that makes sense), a non-fatal one is printed as a warning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from memascend_cli.units import GiB


@dataclass(kw_only=True, slots=True)
class Check:
    """One preflight result."""

    name: str
    """Short key: dram, memlock, region, swap_dir, io, gpu, disk."""
    ok: bool
    message: str
    """One line: what was found."""
    hint: str = ""
    """One line: how to fix it (empty when ok)."""
    fatal: bool = True
    """A failure stops the launch (False: warning only)."""
    forceable: bool = False
    """--force launches despite this failure (estimates, not hard facts)."""


@dataclass(kw_only=True, slots=True)
class Facts:
    """What the probes found; assess() turns these into checks without touching the machine."""

    dram_available_bytes: int
    """MemAvailable now."""
    host_peak_bytes: int
    """Planner: node host peak of the chosen engine."""
    memlock_limit_bytes: int | None
    """RLIMIT_MEMLOCK soft limit; None = unlimited."""
    can_lock_unlimited: bool
    locked_bytes: int
    """Planner: bytes one process locks."""
    stock_deepspeed: bool
    """The run is stock DeepSpeed (tuned or stock): a swap directory, no region."""
    region_path: str | None
    """Region used by the memascend engine (None for stock DeepSpeed)."""
    region_error: str | None = None
    """Why the region header could not be used (missing, corrupt, too few ranks), None if fine."""
    region_rank_bytes: int | None = None
    """Smallest per-rank sub-region of the region."""
    nvme_bytes_per_rank: int = 0
    """Planner: SSD bytes one rank needs."""
    swap_dir: str | None = None
    """Stock DeepSpeed's swap directory."""
    swap_free_bytes: int | None = None
    swap_o_direct_ok: bool | None = None
    swap_o_direct_reason: str = ""
    num_ranks: int = 1
    io_backends: dict | None = None
    """hardware.io_backends()."""
    num_gpus: int = 0
    output_dir: str = ""
    output_free_bytes: int | None = None
    checkpoint_bytes: int = 0
    """Planned bytes of checkpoints kept plus the export."""
    node_regions: list[str] | None = None
    """Multi-node runs: each node's region, checked on its own node when the run starts (engine/cluster_preflight.py)."""


def assess(f: Facts) -> list[Check]:
    """All checks, in the order they are printed. Pure."""
    out: list[Check] = []
    # DRAM: MemAvailable is what other jobs leave us now, a harder fact than the plan's usable DRAM.
    peak, avail = f.host_peak_bytes, f.dram_available_bytes
    if peak > avail:
        out.append(Check(name="dram", ok=False, forceable=True,
                         message=f"the job needs about {peak / GiB:.1f} GiB of host memory, {avail / GiB:.1f} GiB is available now",
                         hint="stop other jobs, lower seq_len or micro_batch, or launch anyway with --force"))
    else:
        out.append(Check(name="dram", ok=True, message=f"host memory: needs ~{peak / GiB:.1f} GiB, {avail / GiB:.1f} GiB available"))
    if f.can_lock_unlimited or f.memlock_limit_bytes is None:
        out.append(Check(name="memlock", ok=True, message="memlock: unlimited"))
    elif f.locked_bytes > f.memlock_limit_bytes:
        out.append(Check(name="memlock", ok=False, forceable=True,
                         message=f"each rank locks ~{f.locked_bytes / GiB:.2f} GiB, RLIMIT_MEMLOCK is {f.memlock_limit_bytes / GiB:.3f} GiB",
                         hint="raise it (`ulimit -l unlimited`, or memlock in /etc/security/limits.conf)"
                              + ("" if f.stock_deepspeed else " or let the memascend engine run unlocked")))
    else:
        out.append(Check(name="memlock", ok=True,
                         message=f"memlock: {f.locked_bytes / GiB:.2f} GiB of {f.memlock_limit_bytes / GiB:.2f} GiB"))
    if not f.stock_deepspeed and f.node_regions is not None:
        out.append(Check(name="region", ok=True, message=f"regions: one per node ({len(f.node_regions)} nodes), each "
                                                          "checked on its node before training starts"))
    elif not f.stock_deepspeed:
        if f.region_error:
            out.append(Check(name="region", ok=False, message=f.region_error,
                             hint=f"prepare it with `memascend prepare-ssd {f.region_path or 'TARGET'} --ranks {f.num_ranks}` "
                                  "or drop `region` to create a region file in the run directory"))
        elif f.region_rank_bytes is not None and f.region_rank_bytes < f.nvme_bytes_per_rank:
            out.append(Check(name="region", ok=False,
                             message=f"region {f.region_path} has {f.region_rank_bytes / GiB:.2f} GiB per rank, "
                                     f"the job needs {f.nvme_bytes_per_rank / GiB:.2f} GiB",
                             hint="prepare a larger region (`memascend prepare-ssd PATH --size ...`) or set region_size"))
        else:
            out.append(Check(name="region", ok=True, message=f"region {f.region_path}: ok"))
    else:
        need = f.nvme_bytes_per_rank * f.num_ranks
        if f.swap_o_direct_ok is False:
            out.append(Check(name="swap_dir", ok=False,
                             message=f"swap folder {f.swap_dir} does not support O_DIRECT ({f.swap_o_direct_reason})",
                             hint="set swap_dir to a folder on ext4/xfs (not tmpfs or overlayfs)"))
        elif f.swap_free_bytes is not None and f.swap_free_bytes < need:
            out.append(Check(name="swap_dir", ok=False,
                             message=f"swap folder {f.swap_dir} has {f.swap_free_bytes / GiB:.2f} GiB free, "
                                     f"swap files need {need / GiB:.2f} GiB",
                             hint="free space or set swap_dir to a larger SSD"))
        else:
            out.append(Check(name="swap_dir", ok=True, message=f"swap folder {f.swap_dir}: ok"))
    io = f.io_backends or {}
    libaio = io.get("libaio", {})
    if libaio and not libaio.get("available"):
        out.append(Check(name="io", ok=False, message=f"libaio: {libaio.get('reason', 'not available')}",
                         hint="apt-get install libaio1 libaio-dev (DeepSpeed's async_io op needs it)"))
    else:
        uring = io.get("io_uring", {})
        out.append(Check(name="io", ok=True, message="I/O: libaio ok" + (", io_uring ok" if uring.get("available") else
                                                                     f", io_uring unavailable ({uring.get('reason', '?')})")))
    if f.num_gpus == 0:
        out.append(Check(name="gpu", ok=True, fatal=False,
                         message=f"no GPU: {f.num_ranks} CPU rank(s) on DeepSpeed's CPU accelerator (gloo)"))
    elif f.num_ranks > f.num_gpus:
        out.append(Check(name="gpu", ok=False, message=f"{f.num_ranks} ranks but this node has {f.num_gpus} GPU(s)",
                         hint=f"set ranks to at most {f.num_gpus}"))
    else:
        out.append(Check(name="gpu", ok=True, message=f"GPUs: {f.num_ranks} of {f.num_gpus} used"))
    if f.output_free_bytes is not None and f.output_free_bytes < f.checkpoint_bytes:
        out.append(Check(name="disk", ok=False,
                         message=f"{f.output_dir} has {f.output_free_bytes / GiB:.2f} GiB free, checkpoints and export "
                                 f"need ~{f.checkpoint_bytes / GiB:.2f} GiB",
                         hint="free space, lower keep_checkpoints, or pick another output_dir"))
    else:
        out.append(Check(name="disk", ok=True, message=f"checkpoint space: ~{f.checkpoint_bytes / GiB:.2f} GiB needed"))
    return out


def blocking(checks: list[Check], force: bool) -> list[Check]:
    """The failures that stop the launch (forceable ones pass with --force)."""
    return [c for c in checks if not c.ok and c.fatal and not (force and c.forceable)]


def free_bytes(path: str) -> int | None:
    """Free bytes for an unprivileged writer at `path` or its nearest existing parent."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
