"""Who is using a region: one exclusive lock per rank sub-region and an owner record on disk.

Stdlib only (the CLI's `prepare-ssd --info` and `train`'s preflight use it without torch).

Lock: an open-file-description (OFD) write lock, ``fcntl(F_OFD_SETLK)``, on the byte range of the
rank's sub-region of the region file or device. Two ranks of one job lock disjoint ranges and
both succeed; a second job opening the same rank is refused at once. The kernel drops OFD locks
when the last descriptor of the open file description closes, so a crashed or ``kill -9``ed owner
never leaves a lock behind (fcntl(2), "Open file description locks"). The lock is advisory:
every memascend opener takes it; other programs are kept out by `prepare-ssd`'s safety checks.

Owner record: one OWNER_SLOT_BYTES block per rank in the region's reserved area (see
memascend_cli/ssd/region.py, format version 2), at OWNER_TABLE_OFFSET_BYTES + rank * OWNER_SLOT_BYTES:

    0..7    magic b"MAOWNER1"
    8..11   u32 record version (1)
    12..15  u32 JSON body length
    16..19  u32 CRC32 of the body (zlib)
    20..    UTF-8 JSON {rank, host, pid, pid_start_ticks, boot_id, job_id, started_at}, zero padded

The record says who holds the lock (for the error message and `--info`); the lock decides. A
record whose lock is free is stale (its process died without clearing it) and is taken over with a
message naming it. An all-zero slot means "no owner".
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import socket
import struct
import sys
import zlib
from dataclasses import dataclass

from memascend_cli.ssd import region as region_mod
from memascend_cli.errors import SSDNotReady

OWNER_TABLE_OFFSET_BYTES = 64 * 1024
"""Start of the owner table inside the reserved area [HEADER_BYTES, data_start)."""
OWNER_SLOT_BYTES = 4096
"""One O_DIRECT-writable block per rank (512 B and 4 KiB sectors)."""
OWNER_MAGIC = b"MAOWNER1"
OWNER_VERSION = 1
_SLOT_HEAD = struct.Struct("<8sIII")
assert OWNER_TABLE_OFFSET_BYTES + region_mod.MAX_RANKS * OWNER_SLOT_BYTES <= region_mod.RESERVED_BYTES

# struct flock on Linux x86-64 / arm64: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid.
_FLOCK = struct.Struct("hhqqi4x")
_F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)


class RegionBusy(SSDNotReady):
    """The sub-region is locked by another live process."""


@dataclass(kw_only=True, slots=True)
class Owner:
    """The process that holds (or last held) a rank's sub-region."""

    rank: int
    host: str
    pid: int
    pid_start_ticks: int = 0
    """Start time of `pid` in clock ticks since boot (/proc/PID/stat field 22): tells a reused pid apart."""
    boot_id: str = ""
    job_id: str = ""
    started_at: str = ""
    """UTC time the sub-region was opened, ISO 8601."""

    def describe(self) -> str:
        job = f", job {self.job_id}" if self.job_id else ""
        since = f", since {self.started_at}" if self.started_at else ""
        return f"pid {self.pid} on host {self.host}{job}{since}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Identity of this process


def _proc_start_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return 0
    # Field 2 (comm) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[19]) if len(fields) > 19 else 0


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def job_id_from_env(env=None) -> str:
    """The job this process belongs to: MEMASCEND_JOB_ID, a batch scheduler's id, else the launch's
    rendezvous address (shared by every rank of one DeepSpeed launch), else empty."""
    env = os.environ if env is None else env
    for name in ("MEMASCEND_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"):
        if env.get(name):
            return str(env[name])
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return ""


def current_owner(rank: int) -> Owner:
    pid = os.getpid()
    return Owner(rank=rank, host=socket.gethostname(), pid=pid, pid_start_ticks=_proc_start_ticks(pid),
                 boot_id=_boot_id(), job_id=job_id_from_env(), started_at=region_mod.utc_now())


def owner_alive(o: Owner) -> bool | None:
    """True/False for an owner on this host (same boot), None when it cannot be told (another host)."""
    if o.host != socket.gethostname() or (o.boot_id and o.boot_id != _boot_id()):
        return None if o.host != socket.gethostname() else False
    ticks = _proc_start_ticks(o.pid)
    return ticks != 0 and (o.pid_start_ticks == 0 or ticks == o.pid_start_ticks)


# ---------------------------------------------------------------------------------------------
# Owner slot codec and I/O


def slot_offset(rank: int) -> int:
    return OWNER_TABLE_OFFSET_BYTES + rank * OWNER_SLOT_BYTES


def encode_owner(o: Owner | None) -> bytes:
    if o is None:
        return bytes(OWNER_SLOT_BYTES)
    body = json.dumps(o.to_dict(), separators=(",", ":"), sort_keys=True).encode("utf-8")
    if len(body) > OWNER_SLOT_BYTES - _SLOT_HEAD.size:
        raise ValueError(f"owner record of {len(body)} B does not fit a {OWNER_SLOT_BYTES} B slot")
    block = bytearray(OWNER_SLOT_BYTES)
    block[: _SLOT_HEAD.size] = _SLOT_HEAD.pack(OWNER_MAGIC, OWNER_VERSION, len(body), zlib.crc32(body))
    block[_SLOT_HEAD.size: _SLOT_HEAD.size + len(body)] = body
    return bytes(block)


def decode_owner(block: bytes) -> Owner | None:
    """The record in a slot; None for an empty slot. A damaged record raises ValueError."""
    if not any(block[: _SLOT_HEAD.size]):
        return None
    magic, version, n, crc = _SLOT_HEAD.unpack_from(block, 0)
    if magic != OWNER_MAGIC or version != OWNER_VERSION:
        raise ValueError(f"owner slot has magic {magic!r} version {version}, expected {OWNER_MAGIC!r} {OWNER_VERSION}")
    body = bytes(block[_SLOT_HEAD.size: _SLOT_HEAD.size + n])
    if len(body) != n or zlib.crc32(body) != crc:
        raise ValueError("owner slot checksum mismatch")
    d = json.loads(body.decode("utf-8"))
    fields = {f.name for f in dataclasses.fields(Owner)}
    return Owner(**{k: v for k, v in d.items() if k in fields})


def read_owner(path: str, rank: int) -> Owner | None:
    try:
        return decode_owner(region_mod.read_block(path, slot_offset(rank), OWNER_SLOT_BYTES))
    except (ValueError, KeyError, TypeError):
        return None  # a damaged record names nobody; the lock still decides


def write_owner(path: str, rank: int, owner: Owner | None) -> None:
    region_mod.write_block(path, slot_offset(rank), encode_owner(owner), OWNER_SLOT_BYTES)


# ---------------------------------------------------------------------------------------------
# Locks


def _flock(fd: int, cmd: int, lock_type: int, start: int, length: int) -> int:
    """One fcntl OFD lock call; returns the l_type the kernel wrote back (F_GETLK) or lock_type."""
    arg = _FLOCK.pack(lock_type, os.SEEK_SET, start, length, 0)
    res = fcntl.fcntl(fd, cmd, arg)
    return _FLOCK.unpack(res)[0]


def lock_range(header: region_mod.RegionHeader, rank: int | None) -> tuple[int, int]:
    """(start, length) locked for `rank`'s sub-region; rank None: the whole region (length 0 = to the end)."""
    if rank is None:
        return 0, 0
    sub = header.subregion(rank)
    return sub.offset_bytes, sub.size_bytes


def is_locked(path: str, start: int, length: int) -> bool:
    """True when another open file description holds a lock overlapping [start, start+length)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _flock(fd, _F_OFD_GETLK, fcntl.F_WRLCK, start, length) != fcntl.F_UNLCK
    finally:
        os.close(fd)


def _busy_message(path: str, what: str, owner: Owner | None) -> RegionBusy:
    who = owner.describe() if owner is not None else "another process (its owner record is not written yet)"
    return RegionBusy(f"region {path}: {what} is in use by {who}",
                      "wait for that job to end or stop it; each concurrent job needs its own region or rank")


class RegionLease:
    """An exclusive hold on one rank's sub-region (or the whole region), released by :meth:`release`,
    by closing, or by the kernel when the process dies."""

    def __init__(self, path: str, rank: int | None, fd: int, owner: Owner, took_over: Owner | None):
        self.path = path
        self.rank = rank
        self._fd = fd
        self.owner = owner
        self.took_over = took_over
        """The stale owner record found and replaced, or None."""

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        """Clear the owner record (if it is still ours) and drop the lock. Idempotent."""
        if self._fd < 0:
            return
        try:
            if self.rank is not None and read_owner(self.path, self.rank) == self.owner:
                write_owner(self.path, self.rank, None)
        except OSError:
            pass  # the region may be gone (deleted file, detached device): the lock goes anyway
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __del__(self):
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)


def acquire(path: str, rank: int | None, header: region_mod.RegionHeader | None = None, *,
            announce=None) -> RegionLease:
    """Take `rank`'s sub-region of the region at `path` (rank None: the whole region) or raise RegionBusy
    naming the owner. A stale owner record (lock free, process gone) is replaced; `announce(message)`
    is called with the takeover message (default: printed to stderr)."""
    header = header or region_mod.read_header(path)
    if rank is not None and slot_offset(rank) + OWNER_SLOT_BYTES > header.data_start_bytes:
        raise SSDNotReady(f"region {path}: its data area starts at byte {header.data_start_bytes}, inside the owner "
                          f"table (bytes {OWNER_TABLE_OFFSET_BYTES}..)", "re-create it with `memascend prepare-ssd`")
    start, length = lock_range(header, rank)
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            _flock(fd, _F_OFD_SETLK, fcntl.F_WRLCK, start, length)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            what = f"rank {rank}'s sub-region" if rank is not None else "the region"
            owners = [read_owner(path, rank)] if rank is not None else [read_owner(path, r.rank) for r in header.ranks]
            live = [o for o in owners if o is not None]
            raise _busy_message(path, what, live[0] if live else None) from None
        me = current_owner(rank if rank is not None else -1)
        stale = None
        if rank is not None:
            stale = read_owner(path, rank)
            if stale is not None:
                alive = owner_alive(stale)
                state = "is gone" if alive is False else ("runs on another host" if alive is None else
                                                           "is alive but no longer holds the lock")
                msg = (f"memascend: taking over rank {rank}'s sub-region of {path} from {stale.describe()}: "
                       f"that process {state} and left its owner record behind")
                (announce or (lambda m: print(m, file=sys.stderr, flush=True)))(msg)
            write_owner(path, rank, me)
        return RegionLease(path, rank, fd, me, stale)
    except BaseException:
        os.close(fd)
        raise


# ---------------------------------------------------------------------------------------------
# Inspection (prepare-ssd --info, train preflight)


def rank_states(path: str, header: region_mod.RegionHeader) -> list[dict]:
    """Per rank: {"rank", "state": "in use" | "stale" | "free", "owner": dict | None}."""
    out = []
    for sub in header.ranks:
        owner = read_owner(path, sub.rank)
        locked = is_locked(path, sub.offset_bytes, sub.size_bytes)
        state = "in use" if locked else ("stale" if owner is not None else "free")
        out.append({"rank": sub.rank, "state": state, "owner": owner.to_dict() if owner else None,
                    "owner_text": owner.describe() if owner else ""})
    return out


def check_ranks_free(path: str, header: region_mod.RegionHeader, ranks: int) -> tuple[str | None, list[str]]:
    """(one-line reason the first `ranks` sub-regions cannot be taken, or None; notes about stale owners)."""
    notes = []
    for st in rank_states(path, header)[:ranks]:
        if st["state"] == "in use":
            return _busy_message(path, f"rank {st['rank']}'s sub-region", Owner(**st["owner"]) if st["owner"]
                                 else None).message, notes
        if st["state"] == "stale":
            notes.append(f"rank {st['rank']}'s sub-region was left by {st['owner_text']} (gone); it will be taken over")
    return None, notes


def require_unused(path: str) -> None:
    """Raise RegionBusy naming the owner if any rank of the region at `path` is in use; a target that
    holds no readable region (or does not exist) passes. For re-preparing, wiping or replacing a region."""
    try:
        header = region_mod.read_header(path)
    except (OSError, SSDNotReady):
        return
    for st in rank_states(path, header):
        if st["state"] == "in use":
            raise _busy_message(path, f"rank {st['rank']}'s sub-region", Owner(**st["owner"]) if st["owner"] else None)
