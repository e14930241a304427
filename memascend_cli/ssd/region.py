"""The on-disk region format and the extent allocator (stdlib only: never import torch here).

A memascend region is a raw block device, a partition or a preallocated file laid out as:

    bytes 0 .. HEADER_BYTES-1        the header block (this module's codec)
    bytes HEADER_BYTES .. data_start  reserved (1 MiB total); from format version 2 it holds the owner
                                      table at 64 KiB: one 4 KiB owner record per rank
                                      (memascend_cli/ssd/owner.py), zero otherwise
    bytes data_start .. capacity      data area, split into one sub-region per rank

Format versions: 1 = no owner records (written by memascend before region ownership; still read,
and its zero reserved area takes owner records as is); 2 = the same header block, and every
opener takes the rank's lock and owner record; 3 = striped across several targets (ssd/stripe.py;
one target stays version 2). An older reader refuses a newer version ("unsupported region format
version 3"), so a memascend that knows no locks, or no striping, cannot open a newer one's region.

Header block layout (format versions 1 and 2, little-endian, HEADER_BYTES = 4096):

    0..7      magic b"MEMASCND"
    8..11     u32 format version
    12..15    u32 header block size in bytes (4096)
    16..19    u32 JSON body length in bytes
    20..23    u32 checksum chunk size in bytes (256)
    24..55    SHA-256 of the whole block with bytes 24..55 zeroed (authoritative integrity check)
    56..59    u32 CRC32 of bytes 60..127 (guards the chunk table)
    60..63    reserved, zero
    64..127   16 x u32 CRC32 of each 256-byte chunk with bytes 24..127 zeroed (locates damage)
    128..     UTF-8 JSON body, then zero padding to the end of the block

The SHA-256 decides whether a header is intact; the per-chunk CRC32s only exist so the error can
name the damaged byte range ("checksum mismatch at header bytes 512..767").
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import json
import mmap
import os
import struct
import uuid as uuid_mod
import zlib
from dataclasses import asdict, dataclass, field

from memascend_cli.errors import SSDNotReady
from memascend_cli.ssd import stripe

MAGIC = b"MEMASCND"
FORMAT_VERSION = 2
STRIPED_FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
"""Versions this code decodes: 1 lacks only the owner table (its reserved area is zero), 3 is striped."""
HEADER_BYTES = 4096
"""Size of the header block; one 4 KiB block is writable with O_DIRECT on 512 B and 4 KiB devices."""
CHUNK_BYTES = 256
NUM_CHUNKS = HEADER_BYTES // CHUNK_BYTES
MIN_ALIGNMENT_BYTES = 4096
"""Extents align to at least 4 KiB (page size) even on 512 B-sector devices, so any buffer
pool built from pages can do O_DIRECT I/O to any extent."""
RESERVED_BYTES = 1024 * 1024
"""The data area starts at 1 MiB (rounded up to the alignment), like partition alignment."""
MAX_RANKS = 64
"""Keeps the JSON body inside the 4 KiB header block (each rank costs ~40 bytes)."""

_PREAMBLE = struct.Struct("<8sIIII32sI4s")  # magic .. reserved, 64 bytes
_CRC_TABLE = struct.Struct(f"<{NUM_CHUNKS}I")
_SHA_RANGE = (24, 56)
_TABLE_CRC_RANGE = (56, 60)
_TABLE_RANGE = (60, 128)  # reserved word + chunk table, guarded by the table CRC
_CHECKSUM_AREA = (24, 128)
BODY_OFFSET = 128
MAX_BODY_BYTES = HEADER_BYTES - BODY_OFFSET
assert _PREAMBLE.size == 64 and _CRC_TABLE.size == 64


class RegionCorrupt(SSDNotReady):
    """A header block failed validation; `field` and the byte range say where.

    `byte_start`/`byte_end` are inclusive offsets inside the header block.
    """

    def __init__(self, message: str, *, field: str, byte_start: int, byte_end: int, hint: str | None = None):
        super().__init__(
            message,
            hint or "re-create the region with `memascend prepare-ssd TARGET --force` (its data is lost)",
        )
        self.field = field
        self.byte_start = byte_start
        self.byte_end = byte_end


class NoRegion(SSDNotReady):
    """The target holds no memascend header (an all-zero header block)."""


class RegionFull(SSDNotReady):
    """An allocation does not fit the rank's sub-region."""


# ---------------------------------------------------------------------------------------------
# Header data model


@dataclass(kw_only=True, slots=True)
class RankSubregion:
    """The byte range one rank owns; ranks never share bytes."""

    rank: int
    """Rank index, 0 .. num_ranks-1."""
    offset_bytes: int
    """Absolute offset from the start of the target (aligned)."""
    size_bytes: int
    """Length in bytes (a multiple of the alignment)."""

    @property
    def end_bytes(self) -> int:
        """First byte past the sub-region."""
        return self.offset_bytes + self.size_bytes


@dataclass(kw_only=True, slots=True)
class ProbeSample:
    """One measured (block size, queue depth) point of the bandwidth probe."""

    block_bytes: int
    """Size of each I/O request."""
    queue_depth: int
    """Requests in flight."""
    write_gbps: float
    """Sequential write bandwidth, GB/s (10**9 bytes per second)."""
    read_gbps: float
    """Sequential read bandwidth, GB/s."""


@dataclass(kw_only=True, slots=True)
class ProbeResult:
    """Measured bandwidth and the I/O settings that reached it; read by `plan` and `train`."""

    read_gbps: float
    """Sequential read bandwidth at the best setting, GB/s (10**9 B/s)."""
    write_gbps: float
    """Sequential write bandwidth at the best setting, GB/s."""
    best_block_bytes: int
    """I/O request size that gave the best combined bandwidth."""
    best_queue_depth: int
    """Requests in flight at the best setting."""
    best_num_workers: int
    """Submission threads used by the backend."""
    backend: str
    """I/O backend measured, e.g. `io_uring`, `libaio`, `python-odirect`."""
    measured_at: str
    """UTC timestamp, ISO 8601."""
    probe_bytes: int = 0
    """Bytes written (and read back) per setting."""
    samples: list[ProbeSample] = field(default_factory=list)
    """Every measured setting, for `--info`."""

    def sample_rows(self) -> list[list]:
        """The samples as [block bytes, queue depth, write GB/s, read GB/s] rows (the header's and bench's form)."""
        return [[s.block_bytes, s.queue_depth, s.write_gbps, s.read_gbps] for s in self.samples]


@dataclass(kw_only=True, slots=True)
class RegionHeader:
    """Everything the header block stores. Offsets are absolute bytes from the start of the target."""

    uuid: str
    """Region identity (uuid4), so a plan can check it talks to the region it measured."""
    label: str
    """Free-form user label (at most 64 characters)."""
    logical_block_bytes: int
    """Device logical block size (512 or 4096); 512 for files."""
    alignment_bytes: int
    """Alignment of every extent and offset: max(4096, device DIO alignment)."""
    capacity_bytes: int
    """Size of the target in bytes."""
    data_start_bytes: int
    """First byte of the data area (after the header and the reserved area)."""
    ranks: list[RankSubregion]
    """One sub-region per rank, disjoint, inside [data_start_bytes, capacity_bytes)."""
    probe: ProbeResult | None = None
    """Measured bandwidth, or None when `--no-probe` was given."""
    created_at: str = ""
    """UTC timestamp, ISO 8601."""
    created_by: str = ""
    """memascend version that wrote the header."""
    members: list[stripe.Member] = field(default_factory=list)
    """A striped region's targets in stripe order (offsets are then logical: stripe.split); empty for one target."""
    stripe_unit_bytes: int = 0
    """Bytes of one stripe unit on one member (0 without members)."""
    member_index: int = 0
    """Which member's copy of the header this is (0: the region's path, which holds the owner table)."""
    format_version: int = FORMAT_VERSION
    """On-disk format version."""
    magic: bytes = MAGIC
    """Always b"MEMASCND"."""

    def to_dict(self) -> dict:
        """JSON-ready view (used by `--info --json`)."""
        d = asdict(self)
        d["magic"] = self.magic.decode("ascii", "replace")
        return d

    def subregion(self, rank: int) -> RankSubregion:
        """The sub-region of `rank`; raises SSDNotReady if the region has no such rank."""
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise SSDNotReady(
            f"region {self.label or self.uuid} has {len(self.ranks)} rank sub-region(s), no rank {rank}",
            f"re-create it with `memascend prepare-ssd TARGET --ranks {rank + 1} --force`",
        )


def utc_now() -> str:
    """Current UTC time as ISO 8601 with seconds precision."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def new_header(
    *,
    capacity_bytes: int,
    num_ranks: int = 1,
    logical_block_bytes: int = 512,
    device_alignment_bytes: int = 512,
    label: str = "",
    created_by: str = "",
) -> RegionHeader:
    """Build a fresh header: pick the alignment, the data start and the per-rank split."""
    alignment_bytes = region_alignment(logical_block_bytes, device_alignment_bytes)
    data_start_bytes = align_up(RESERVED_BYTES, alignment_bytes)
    ranks = split_ranks(capacity_bytes, data_start_bytes, num_ranks, alignment_bytes)
    return RegionHeader(
        uuid=str(uuid_mod.uuid4()),
        label=label,
        logical_block_bytes=logical_block_bytes,
        alignment_bytes=alignment_bytes,
        capacity_bytes=capacity_bytes,
        data_start_bytes=data_start_bytes,
        ranks=ranks,
        created_at=utc_now(),
        created_by=created_by,
    )


# ---------------------------------------------------------------------------------------------
# Arithmetic


def align_up(n: int, alignment: int) -> int:
    """Smallest multiple of `alignment` that is >= n."""
    return -(-n // alignment) * alignment


def align_down(n: int, alignment: int) -> int:
    """Largest multiple of `alignment` that is <= n."""
    return n // alignment * alignment


def region_alignment(logical_block_bytes: int, device_alignment_bytes: int = 0) -> int:
    """max(4 KiB, logical block, DIO offset alignment), rounded up to a power of two."""
    a = max(MIN_ALIGNMENT_BYTES, int(logical_block_bytes or 0), int(device_alignment_bytes or 0))
    return 1 << (a - 1).bit_length()


def split_ranks(capacity_bytes: int, data_start_bytes: int, num_ranks: int, alignment_bytes: int) -> list[RankSubregion]:
    """Split [data_start, capacity) into `num_ranks` equal, aligned, disjoint sub-regions.

    Each rank gets floor(usable / num_ranks) rounded down to the alignment; the tail that does
    not divide evenly stays unused so every rank sees the same size.
    """
    from memascend_cli.errors import BadInput

    if not 1 <= num_ranks <= MAX_RANKS:
        raise BadInput(f"--ranks must be between 1 and {MAX_RANKS}, got {num_ranks}", "one sub-region per local GPU rank")
    if data_start_bytes % alignment_bytes:
        raise ValueError(f"data start {data_start_bytes} is not aligned to {alignment_bytes}")
    usable_bytes = max(0, capacity_bytes - data_start_bytes)
    per_rank_bytes = align_down(usable_bytes // num_ranks, alignment_bytes)
    if per_rank_bytes <= 0:
        raise BadInput(
            f"target of {capacity_bytes} B is too small for {num_ranks} rank(s): "
            f"the header area takes {data_start_bytes} B and each rank needs at least {alignment_bytes} B",
            "use a larger --size or fewer --ranks",
        )
    return [
        RankSubregion(rank=r, offset_bytes=data_start_bytes + r * per_rank_bytes, size_bytes=per_rank_bytes)
        for r in range(num_ranks)
    ]


# ---------------------------------------------------------------------------------------------
# Codec


def _body_dict(h: RegionHeader) -> dict:
    # Ranks as [rank, offset, size] triples: named objects would not fit 64 ranks in 4 KiB.
    probe = None
    if h.probe is not None:
        p = h.probe
        probe = {
            "read_gbps": p.read_gbps,
            "write_gbps": p.write_gbps,
            "best_block_bytes": p.best_block_bytes,
            "best_queue_depth": p.best_queue_depth,
            "best_num_workers": p.best_num_workers,
            "backend": p.backend,
            "measured_at": p.measured_at,
            "probe_bytes": p.probe_bytes,
            "samples": p.sample_rows(),
        }
    return {
        "uuid": h.uuid,
        "label": h.label,
        "logical_block_bytes": h.logical_block_bytes,
        "alignment_bytes": h.alignment_bytes,
        "capacity_bytes": h.capacity_bytes,
        "data_start_bytes": h.data_start_bytes,
        "ranks": [[r.rank, r.offset_bytes, r.size_bytes] for r in h.ranks],
        "probe": probe,
        "created_at": h.created_at,
        "created_by": h.created_by,
        **stripe.body_entry(h),
    }


def _chunk_crcs(block: bytes) -> list[int]:
    zeroed = bytearray(block)
    zeroed[_CHECKSUM_AREA[0] : _CHECKSUM_AREA[1]] = bytes(_CHECKSUM_AREA[1] - _CHECKSUM_AREA[0])
    return [zlib.crc32(zeroed[i * CHUNK_BYTES : (i + 1) * CHUNK_BYTES]) for i in range(NUM_CHUNKS)]


def _sha(block: bytes) -> bytes:
    zeroed = bytearray(block)
    zeroed[_SHA_RANGE[0] : _SHA_RANGE[1]] = bytes(_SHA_RANGE[1] - _SHA_RANGE[0])
    return hashlib.sha256(zeroed).digest()


def validate_header(h: RegionHeader) -> None:
    """Check the geometry invariants a header must satisfy (ranks disjoint, aligned, inside)."""
    a = h.alignment_bytes
    problems = []
    if a < MIN_ALIGNMENT_BYTES or a & (a - 1):
        problems.append(f"alignment {a} is not a power of two >= {MIN_ALIGNMENT_BYTES}")
    if h.data_start_bytes < HEADER_BYTES or h.data_start_bytes % a:
        problems.append(f"data start {h.data_start_bytes} is not an aligned offset past the header")
    if not h.ranks:
        problems.append("no rank sub-regions")
    prev_end = h.data_start_bytes
    for r in sorted(h.ranks, key=lambda r: r.offset_bytes):
        if r.offset_bytes % a or r.size_bytes % a or r.size_bytes <= 0:
            problems.append(f"rank {r.rank} sub-region is not aligned to {a}")
        if r.offset_bytes < prev_end:
            problems.append(f"rank {r.rank} sub-region overlaps the header or another rank")
        prev_end = r.end_bytes
    if prev_end > h.capacity_bytes:
        problems.append(f"sub-regions end at {prev_end}, past the capacity {h.capacity_bytes}")
    if sorted(r.rank for r in h.ranks) != list(range(len(h.ranks))):
        problems.append("ranks are not numbered 0..N-1")
    if len(h.label) > 64:
        problems.append("label is longer than 64 characters")
    problems += stripe.header_problems(h)
    if problems:
        raise ValueError("invalid region header: " + "; ".join(problems))


def encode(header: RegionHeader) -> bytes:
    """Serialise a header into exactly HEADER_BYTES bytes, checksummed."""
    validate_header(header)
    body = json.dumps(_body_dict(header), separators=(",", ":"), sort_keys=True).encode("utf-8")
    if len(body) > MAX_BODY_BYTES:
        raise ValueError(f"region header body is {len(body)} B, more than {MAX_BODY_BYTES} B fit in the header block")
    block = bytearray(HEADER_BYTES)
    block[BODY_OFFSET : BODY_OFFSET + len(body)] = body
    version = STRIPED_FORMAT_VERSION if header.members else FORMAT_VERSION
    block[0:64] = _PREAMBLE.pack(MAGIC, version, HEADER_BYTES, len(body), CHUNK_BYTES, bytes(32), 0, bytes(4))
    block[64:128] = _CRC_TABLE.pack(*_chunk_crcs(block))
    struct.pack_into("<I", block, _TABLE_CRC_RANGE[0], zlib.crc32(block[_TABLE_RANGE[0] : _TABLE_RANGE[1]]))
    block[_SHA_RANGE[0] : _SHA_RANGE[1]] = _sha(block)
    return bytes(block)


def _fmt_ranges(chunks: list[int]) -> str:
    # Merge adjacent damaged chunks into inclusive byte ranges: "256..767, 1024..1279".
    spans: list[list[int]] = []
    for c in chunks:
        if spans and spans[-1][1] == c - 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ", ".join(f"{a * CHUNK_BYTES}..{(b + 1) * CHUNK_BYTES - 1}" for a, b in spans)


def decode(block: bytes) -> RegionHeader:
    """Parse and verify a header block.

    Raises NoRegion for an all-zero block and RegionCorrupt naming the failed field and byte range
    for a bad magic, an unsupported version, a truncated block or a checksum mismatch.
    """
    block = bytes(block)
    if len(block) < HEADER_BYTES:
        raise RegionCorrupt(
            f"region header truncated: got {len(block)} of {HEADER_BYTES} bytes",
            field="length", byte_start=len(block), byte_end=HEADER_BYTES - 1,
        )
    block = block[:HEADER_BYTES]
    if not any(block):
        raise NoRegion("no memascend region here (the header block is all zeros)", "create one with `memascend prepare-ssd TARGET`")
    magic, version = block[0:8], struct.unpack_from("<I", block, 8)[0]
    if magic != MAGIC:
        raise RegionCorrupt(
            f"bad magic at header bytes 0..7: expected {MAGIC!r}, found {magic!r} (not a memascend region, or damaged)",
            field="magic", byte_start=0, byte_end=7,
            hint="run `memascend prepare-ssd --list` to see what the target holds",
        )
    if version not in READABLE_VERSIONS:
        raise RegionCorrupt(
            f"unsupported region format version {version} at header bytes 8..11 (this memascend reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))})",
            field="format_version", byte_start=8, byte_end=11,
            hint="upgrade memascend, or re-create the region with `memascend prepare-ssd TARGET --force`",
        )
    stored_sha = block[_SHA_RANGE[0] : _SHA_RANGE[1]]
    if stored_sha != _sha(block):
        # Localise: table first (if it is damaged the chunk CRCs cannot be trusted), then chunks.
        stored_table_crc = struct.unpack_from("<I", block, _TABLE_CRC_RANGE[0])[0]
        if stored_table_crc != zlib.crc32(block[_TABLE_RANGE[0] : _TABLE_RANGE[1]]):
            raise RegionCorrupt(
                "checksum mismatch in the header's checksum table at header bytes 56..127",
                field="checksum_table", byte_start=56, byte_end=127,
            )
        stored_crcs = _CRC_TABLE.unpack_from(block, 64)
        bad = [i for i, (s, c) in enumerate(zip(stored_crcs, _chunk_crcs(block))) if s != c]
        if bad:
            raise RegionCorrupt(
                f"checksum mismatch at header bytes {_fmt_ranges(bad)}",
                field="body" if bad != [0] else "fields",
                byte_start=bad[0] * CHUNK_BYTES, byte_end=(bad[-1] + 1) * CHUNK_BYTES - 1,
            )
        raise RegionCorrupt(
            "the header's stored SHA-256 at header bytes 24..55 is damaged",
            field="sha256", byte_start=24, byte_end=55,
        )
    # Intact from here on: any failure below is a writer bug, still reported as corruption.
    _, _, header_bytes, body_bytes, chunk_bytes, _, _, _ = _PREAMBLE.unpack_from(block, 0)
    if header_bytes != HEADER_BYTES or chunk_bytes != CHUNK_BYTES or body_bytes > MAX_BODY_BYTES:
        raise RegionCorrupt("inconsistent header geometry at header bytes 12..23", field="geometry", byte_start=12, byte_end=23)
    try:
        d = json.loads(block[BODY_OFFSET : BODY_OFFSET + body_bytes].decode("utf-8"))
        p = d.get("probe")
        probe = None
        if p is not None:
            probe = ProbeResult(
                read_gbps=float(p["read_gbps"]),
                write_gbps=float(p["write_gbps"]),
                best_block_bytes=int(p["best_block_bytes"]),
                best_queue_depth=int(p["best_queue_depth"]),
                best_num_workers=int(p["best_num_workers"]),
                backend=str(p["backend"]),
                measured_at=str(p["measured_at"]),
                probe_bytes=int(p.get("probe_bytes", 0)),
                samples=[ProbeSample(block_bytes=b, queue_depth=q, write_gbps=w, read_gbps=r) for b, q, w, r in p.get("samples", [])],
            )
        header = RegionHeader(
            uuid=str(d["uuid"]),
            label=str(d["label"]),
            logical_block_bytes=int(d["logical_block_bytes"]),
            alignment_bytes=int(d["alignment_bytes"]),
            capacity_bytes=int(d["capacity_bytes"]),
            data_start_bytes=int(d["data_start_bytes"]),
            ranks=[RankSubregion(rank=int(r), offset_bytes=int(o), size_bytes=int(s)) for r, o, s in d["ranks"]],
            probe=probe,
            created_at=str(d.get("created_at", "")),
            created_by=str(d.get("created_by", "")),
            format_version=version,
            **stripe.from_body(d),
        )
        validate_header(header)
    except (ValueError, KeyError, TypeError) as exc:
        raise RegionCorrupt(
            f"region header body at header bytes {BODY_OFFSET}..{BODY_OFFSET + body_bytes - 1} is unreadable: {exc}",
            field="body", byte_start=BODY_OFFSET, byte_end=BODY_OFFSET + max(body_bytes, 1) - 1,
        ) from None
    return header


def looks_like_region(block: bytes) -> bool:
    """True when `block` starts with the memascend magic (intact or not)."""
    return bytes(block[:8]) == MAGIC


# ---------------------------------------------------------------------------------------------
# Header I/O (O_DIRECT-safe)


def aligned_buffer(nbytes: int) -> mmap.mmap:
    """Page-aligned anonymous buffer: O_DIRECT needs aligned memory, and bytes objects are not."""
    return mmap.mmap(-1, align_up(max(nbytes, 1), mmap.PAGESIZE))


def _io(path: str, flags: int, fn):
    """Run fn(fd) on `path` opened with O_DIRECT, or buffered where O_DIRECT is refused (EINVAL)."""
    for extra in (os.O_DIRECT, 0):
        try:
            fd = os.open(path, flags | extra)
        except OSError as exc:
            if extra and exc.errno == errno.EINVAL:
                continue
            raise
        try:
            return fn(fd)
        except OSError as exc:
            if not (extra and exc.errno == errno.EINVAL):
                raise
        finally:
            os.close(fd)
    raise AssertionError("unreachable")


def read_block(path: str, offset_bytes: int, nbytes: int) -> bytes:
    """Read `nbytes` at `offset_bytes`, bypassing the page cache when possible (both aligned)."""
    buf = aligned_buffer(nbytes)
    try:
        n = _io(path, os.O_RDONLY, lambda fd: os.preadv(fd, [buf], offset_bytes))
        return bytes(buf[: min(n, nbytes)])
    finally:
        buf.close()


def write_block(path: str, offset_bytes: int, data: bytes, alignment_bytes: int = HEADER_BYTES) -> None:
    """Write `data` at `offset_bytes` padded with zeros to the alignment, then fsync."""
    nbytes = align_up(len(data), alignment_bytes)
    buf = aligned_buffer(nbytes)
    buf[: len(data)] = data

    def _write(fd: int) -> None:
        n = os.pwritev(fd, [memoryview(buf)[:nbytes]], offset_bytes)
        if n != nbytes:
            raise OSError(errno.EIO, f"short write: {n} of {nbytes} bytes at offset {offset_bytes} of {path}")
        os.fsync(fd)

    try:
        _io(path, os.O_WRONLY, _write)
    finally:
        buf.close()


def read_header(path: str) -> RegionHeader:
    """Read and verify the header at offset 0 of `path` (NoRegion / RegionCorrupt on failure)."""
    return decode(read_block(path, 0, HEADER_BYTES))


def write_header(path: str, header: RegionHeader) -> None:
    """Encode and write the header at offset 0, padded to the region alignment."""
    write_block(path, 0, encode(header), max(HEADER_BYTES, header.alignment_bytes))


def zero_header_area(path: str, header_area_bytes: int = RESERVED_BYTES) -> None:
    """Overwrite bytes 0..header_area_bytes-1 with zeros (what `--wipe` does)."""
    write_block(path, 0, bytes(header_area_bytes), HEADER_BYTES)


# ---------------------------------------------------------------------------------------------
# Extent allocator


@dataclass(frozen=True, slots=True)
class Extent:
    """A live allocation: an aligned, absolute byte range inside one rank's sub-region."""

    offset_bytes: int
    """Absolute offset from the start of the target."""
    length_bytes: int
    """Allocated length, the request rounded up to the alignment."""
    requested_bytes: int
    """What the caller asked for (<= length_bytes)."""

    @property
    def end_bytes(self) -> int:
        """First byte past the extent."""
        return self.offset_bytes + self.length_bytes


class ExtentAllocator:
    """Best-fit allocator of aligned extents inside one rank's sub-region.

    Holes are kept sorted by offset and coalesced on free, so a fully freed allocator is one hole
    again. Nothing is ever placed outside [subregion.offset_bytes, subregion.end_bytes): ranks
    that each use their own allocator cannot overlap.
    """

    def __init__(self, subregion: RankSubregion, alignment_bytes: int = MIN_ALIGNMENT_BYTES):
        self.alignment_bytes = region_alignment(alignment_bytes)
        a = self.alignment_bytes
        start = align_up(subregion.offset_bytes, a)
        end = align_down(subregion.end_bytes, a)
        if end <= start:
            raise ValueError(f"sub-region of rank {subregion.rank} holds no aligned {a}-byte block")
        self.subregion = subregion
        self.start_bytes = start
        self.end_bytes = end
        self._holes: list[tuple[int, int]] = [(start, end - start)]  # (offset, length), sorted by offset
        self._live: dict[object, Extent] = {}

    # -- queries --
    @property
    def capacity_bytes(self) -> int:
        """Aligned bytes the allocator manages."""
        return self.end_bytes - self.start_bytes

    @property
    def free_bytes(self) -> int:
        """Sum of all holes."""
        return sum(length for _, length in self._holes)

    @property
    def used_bytes(self) -> int:
        """Sum of all live (padded) extents."""
        return self.capacity_bytes - self.free_bytes

    @property
    def largest_hole_bytes(self) -> int:
        """Largest single allocation that can succeed now."""
        return max((length for _, length in self._holes), default=0)

    def lookup(self, key) -> Extent | None:
        """The live extent for `key`, or None."""
        return self._live.get(key)

    def __contains__(self, key) -> bool:
        return key in self._live

    def __len__(self) -> int:
        return len(self._live)

    def extents(self) -> dict:
        """Copy of key -> Extent for every live allocation."""
        return dict(self._live)

    def holes(self) -> list[tuple[int, int]]:
        """Copy of the free list as (offset_bytes, length_bytes), sorted by offset."""
        return list(self._holes)

    # -- mutations --
    def allocate(self, key, nbytes: int) -> Extent:
        """Reserve an aligned extent of at least `nbytes` for `key` (best fit, lowest offset on ties)."""
        if key in self._live:
            raise ValueError(f"extent {key!r} is already allocated")
        if nbytes <= 0:
            raise ValueError(f"extent {key!r}: size must be positive, got {nbytes}")
        need = align_up(nbytes, self.alignment_bytes)
        best = None
        for i, (off, length) in enumerate(self._holes):
            if length >= need and (best is None or length < self._holes[best][1]):
                best = i
                if length == need:
                    break
        if best is None:
            from memascend_cli.units import fmt_bytes

            raise RegionFull(
                f"region full: need {fmt_bytes(need)} ({need} B) for {key!r} in rank {self.subregion.rank}'s sub-region, "
                f"free {fmt_bytes(self.free_bytes)}, largest hole {fmt_bytes(self.largest_hole_bytes)}",
                "prepare a larger region (`memascend prepare-ssd --size`) or offload less to NVMe",
            )
        off, length = self._holes[best]
        if length == need:
            del self._holes[best]
        else:
            self._holes[best] = (off + need, length - need)
        ext = Extent(offset_bytes=off, length_bytes=need, requested_bytes=nbytes)
        self._live[key] = ext
        return ext

    def exchange(self, a, b) -> None:
        """Swap the extents of two live keys (a shadow copy becomes the current one without moving a byte)."""
        if a not in self._live or b not in self._live:
            raise KeyError(f"exchange of {a!r} and {b!r}: both need an extent")
        self._live[a], self._live[b] = self._live[b], self._live[a]

    def free(self, key) -> None:
        """Release `key`'s extent and merge it with adjacent holes."""
        ext = self._live.pop(key, None)
        if ext is None:
            raise KeyError(f"no extent allocated for {key!r}")
        import bisect

        off, length = ext.offset_bytes, ext.length_bytes
        i = bisect.bisect_left(self._holes, (off, 0))
        # Merge with the following hole, then with the preceding one.
        if i < len(self._holes) and self._holes[i][0] == off + length:
            length += self._holes[i][1]
            del self._holes[i]
        if i > 0 and self._holes[i - 1][0] + self._holes[i - 1][1] == off:
            off, length = self._holes[i - 1][0], self._holes[i - 1][1] + length
            self._holes[i - 1] = (off, length)
        else:
            self._holes.insert(i, (off, length))
