"""Making a region: the checked, exact write plan `prepare-ssd` shows and applies, and one call that creates a region
file for `train` and `bench` with the same checks and steps (no probe).

Build, then run: `ssd_probe.gather_target_facts` (I/O, read-only) -> `ssd_safety.assess` (pure) -> `build_actions`
(pure: the exact byte ranges to write; `prepare-ssd --dry-run` prints them) -> `apply_actions` (I/O).
"""

from __future__ import annotations

import errno
import os
from dataclasses import asdict, dataclass

from memascend_cli import __version__

from memascend_cli.ssd import region
from memascend_cli.errors import SSDNotReady
from memascend_cli.units import MiB, fmt_bytes

TAIL_ZERO_BYTES = MiB
"""Zeroed at the end of a device: backup GPT and RAID superblocks (md 0.90/1.0) live there."""


@dataclass(kw_only=True, slots=True)
class Action:
    """One step of applying a region, with the exact bytes it writes (inclusive range)."""

    op: str
    """`create`, `fallocate`, `resize`, `zero`, `write-header`, `probe`, `unlink`, `reread-partitions`."""
    what: str
    """Human description."""
    start_byte: int | None = None
    end_byte: int | None = None
    """Inclusive; None for actions that write no device bytes."""
    target: str | None = None
    """The member of a striped region it touches (ssd/prepare_striped.py); None: the one target."""

    @property
    def nbytes(self) -> int:
        """Bytes written by this action (0 when none)."""
        return 0 if self.start_byte is None else self.end_byte - self.start_byte + 1

    def to_dict(self) -> dict:
        """JSON-ready view with the byte count."""
        d = asdict(self)
        d["bytes"] = self.nbytes
        if self.target is None:
            del d["target"]
        return d



def build_actions(facts, header: region.RegionHeader, probe_plan) -> list[Action]:
    """The write plan for `prepare`: every byte range touched, in order.

    Args:
        facts: ssd_safety.TargetFacts of the target.
        header: the header to write (its capacity is the region size).
        probe_plan: ssd_probe.ProbePlan, or None for `--no-probe`.
    """
    actions: list[Action] = []
    cap = header.capacity_bytes
    if facts.kind == "file":
        if not facts.exists:
            actions.append(Action(op="create", what=f"create {facts.real_path}"))
            actions.append(Action(op="fallocate", what=f"preallocate {fmt_bytes(cap)} (reads as zeros)", start_byte=0, end_byte=cap - 1))
        else:
            if facts.size_bytes != cap:
                actions.append(Action(op="resize", what=f"resize from {fmt_bytes(facts.size_bytes)} to {fmt_bytes(cap)} and preallocate", start_byte=0, end_byte=cap - 1))
            actions.append(Action(op="zero", what="clear the old header area", start_byte=0, end_byte=header.data_start_bytes - 1))
    else:
        # Clear signatures at both ends so nothing (blkid, udev, mdadm) mistakes the region for
        # what the device held before.
        actions.append(Action(op="zero", what="clear the header area and old signatures", start_byte=0, end_byte=header.data_start_bytes - 1))
        tail_start = max(header.data_start_bytes, region.align_down(cap - TAIL_ZERO_BYTES, header.alignment_bytes))
        if tail_start < cap:
            actions.append(Action(op="zero", what="clear old signatures at the end of the device", start_byte=tail_start, end_byte=cap - 1))
        if facts.partitions:
            actions.append(Action(op="reread-partitions", what=f"ask the kernel to drop partitions {', '.join(facts.partitions)}"))
    actions.append(
        Action(op="write-header", what=f"write the region header (format v{region.FORMAT_VERSION}, uuid {header.uuid})", start_byte=0, end_byte=region.HEADER_BYTES - 1)
    )
    if probe_plan is not None:
        n = len(probe_plan.block_sizes_bytes) * len(probe_plan.queue_depths)
        actions.append(
            Action(
                op="probe",
                what=f"bandwidth probe: write random data then read it back, {n} settings",
                start_byte=probe_plan.offset_bytes, end_byte=probe_plan.end_bytes - 1,
            )
        )
        actions.append(Action(op="write-header", what="rewrite the header with the measured GB/s and best I/O settings", start_byte=0, end_byte=region.HEADER_BYTES - 1))
    return actions


def preallocate(path: str, size_bytes: int, create: bool) -> None:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        try:
            if not create and os.fstat(fd).st_size > size_bytes:
                os.ftruncate(fd, size_bytes)
            # posix_fallocate reserves real blocks: the region cannot run out of space mid-training
            # the way a sparse file can.
            os.posix_fallocate(fd, 0, size_bytes)
        except OSError as exc:
            if create:
                os.close(fd)
                fd = -1
                os.unlink(path)
            if exc.errno == errno.ENOSPC:
                raise SSDNotReady(f"not enough space to preallocate {fmt_bytes(size_bytes)} at {path}", "use a smaller --size or free space") from None
            raise
        os.fsync(fd)
    finally:
        if fd >= 0:
            os.close(fd)


def reread_partitions(path: str) -> str | None:
    # BLKRRPART (_IO(0x12, 95)): drop the kernel's stale partitions after the table is zeroed.
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.ioctl(fd, 0x125F)
        finally:
            os.close(fd)
    except OSError as exc:
        return f"could not re-read the partition table of {path} ({exc.strerror}); run `partprobe {path}` or reboot"
    return None


def apply_actions(facts, header: region.RegionHeader, actions: list[Action], probe_plan, *, progress: bool = True) -> tuple[region.RegionHeader, str | None]:
    """Execute `build_actions` output in order; returns the final header and a backend note.

    OS errors become SSDNotReady naming the step and the byte range it was writing.
    """
    note = None
    wrote_header = False
    for a in actions:
        try:
            note = _apply_one(a, facts.real_path, header, probe_plan, wrote_header=wrote_header, progress=progress) or note
        except OSError as exc:
            where = f" (bytes {a.start_byte:,}..{a.end_byte:,})" if a.start_byte is not None else ""
            hint = (
                "check `dmesg` for device errors; the target may be left without a valid header"
                if facts.kind == "block"
                else "check free space and permissions of the file system"
            )
            raise SSDNotReady(f"{a.what} failed on {facts.real_path}{where}: {exc.strerror or exc}", hint) from None
        wrote_header = wrote_header or a.op == "write-header"
    return header, note


def _apply_one(a: Action, path: str, header: region.RegionHeader, probe_plan, *, wrote_header: bool, progress: bool) -> str | None:
    """Run one action; returns the probe's backend note, else None."""
    from memascend_cli.console import err, warn

    if a.op == "create":
        return None  # done by fallocate, which creates the file exclusively
    if a.op in ("fallocate", "resize"):
        with err.status(f"preallocating {fmt_bytes(header.capacity_bytes)} at {path}"):
            preallocate(path, header.capacity_bytes, create=a.op == "fallocate")
    elif a.op == "zero":
        region.write_block(path, a.start_byte, bytes(a.nbytes), max(512, header.logical_block_bytes))
    elif a.op == "reread-partitions":
        problem = reread_partitions(path)
        if problem:
            warn(problem)
    elif a.op == "write-header":
        region.write_header(path, header)
        # Read back through O_DIRECT: a header that does not decode must fail here, not in train.
        if region.read_header(path) != header:
            raise SSDNotReady(f"the header read back from {path} differs from what was written", "the device may be failing; try another target")
    elif a.op == "probe":
        if not wrote_header:
            raise AssertionError("the probe must run after the header is written")
        from memascend_cli.ssd.probe import probe_bandwidth

        try:
            header.probe, note = probe_bandwidth(path, probe_plan, progress=progress)
        except OSError as exc:
            # The header is already valid (without bandwidth): say so, the region is usable.
            raise SSDNotReady(
                f"bandwidth probe on {path} failed: {exc.strerror or exc}; the region header was written without measurements",
                "rerun with --force --no-probe to keep the region unmeasured, or check the device (`dmesg`)",
            ) from None
        return note
    else:
        raise AssertionError(f"unknown action {a.op}")
    return None


def checked_facts(target: str, operation: str, force: bool, requested_size_bytes: int | None = None):
    from memascend_cli.ssd.probe import gather_target_facts
    from memascend_cli.ssd.safety import assess, refusal_message

    facts = gather_target_facts(target, requested_size_bytes=requested_size_bytes)
    verdict = assess(facts, operation=operation, force=force)
    if not verdict.ok:
        message, hint = refusal_message(facts, verdict, operation=operation)
        raise SSDNotReady(message, hint)
    if verdict.warnings_needing_force:
        from memascend_cli.console import warn

        for w in verdict.warnings_needing_force:
            warn(f"--force given: {facts.path}: {w}")
    return facts, verdict



def create_region_file(path: str, size_bytes: int, *, ranks: int, label: str,
                       probe_mib: int | None = None) -> region.RegionHeader:
    """A fresh region file of `size_bytes` with `ranks` sub-regions, with prepare-ssd's own safety checks and steps
    (what `train` and `bench` create when no region is given), its bandwidth probed over `probe_mib` MiB when given.
    An existing file at `path` is replaced."""
    if os.path.isfile(path):
        from memascend_cli.ssd.owner import require_unused

        require_unused(path)  # a run still using it keeps its region
        os.unlink(path)  # our own file from an earlier run: prepare-ssd would ask before overwriting
    facts, _ = checked_facts(path, "prepare", False, size_bytes)
    alignment_bytes = region.region_alignment(facts.logical_block_bytes)
    header = region.new_header(capacity_bytes=region.align_down(size_bytes, alignment_bytes), num_ranks=ranks,
                               logical_block_bytes=facts.logical_block_bytes, device_alignment_bytes=alignment_bytes,
                               label=label, created_by=__version__)
    probe_plan = None
    if probe_mib is not None:
        from memascend_cli.ssd.probe import plan_probe

        probe_plan = plan_probe(header, probe_mib)
    header, _ = apply_actions(facts, header, build_actions(facts, header, probe_plan), probe_plan, progress=False)
    return header
