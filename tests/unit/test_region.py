"""Region header codec, geometry and extent allocator (memascend_cli/ssd/region.py)."""

from __future__ import annotations

import dataclasses
import random
import struct

import pytest

from memascend_cli.ssd import region
from memascend_cli.errors import BadInput, SSDNotReady
from memascend_cli.ssd.region import (
    HEADER_BYTES,
    ExtentAllocator,
    NoRegion,
    ProbeResult,
    ProbeSample,
    RankSubregion,
    RegionCorrupt,
    RegionFull,
)

MiB = 1024**2
GiB = 1024**3


def _header(num_ranks: int = 4, capacity_bytes: int = 64 * GiB, with_probe: bool = True, logical_block_bytes: int = 512) -> region.RegionHeader:
    h = region.new_header(
        capacity_bytes=capacity_bytes, num_ranks=num_ranks, logical_block_bytes=logical_block_bytes,
        device_alignment_bytes=logical_block_bytes, label="node0-nvme1", created_by="0.1.0",
    )
    if with_probe:
        h.probe = ProbeResult(
            read_gbps=6.512, write_gbps=4.875, best_block_bytes=1 * MiB, best_queue_depth=32, best_num_workers=4,
            backend="io_uring", measured_at="2026-01-02T03:04:05+00:00", probe_bytes=256 * MiB,
            samples=[ProbeSample(block_bytes=bs, queue_depth=qd, write_gbps=4.1, read_gbps=6.0) for bs in (256 * 1024, MiB, 4 * MiB) for qd in (8, 32)],
        )
    return h


# ---------------------------------------------------------------------------------------------
# Codec


@pytest.mark.parametrize("num_ranks", [1, 3, 8, region.MAX_RANKS])
@pytest.mark.parametrize("with_probe", [True, False])
def test_round_trip(num_ranks, with_probe):
    h = _header(num_ranks, with_probe=with_probe)
    block = region.encode(h)
    assert len(block) == HEADER_BYTES
    assert block[:8] == b"MEMASCND"
    assert region.decode(block) == h


def test_round_trip_survives_trailing_bytes():
    # read_header may hand decode a larger aligned read; only the first block counts.
    h = _header()
    assert region.decode(region.encode(h) + b"\xff" * 4096) == h


def test_encode_is_deterministic_and_little_endian():
    h = _header()
    block = region.encode(h)
    assert block == region.encode(h)
    assert struct.unpack_from("<I", block, 8)[0] == region.FORMAT_VERSION
    assert struct.unpack_from("<I", block, 12)[0] == HEADER_BYTES


def test_every_flipped_byte_is_detected_and_located():
    block = region.encode(_header())
    fields_seen = set()
    for i in range(HEADER_BYTES):
        damaged = bytearray(block)
        damaged[i] ^= 0xFF
        with pytest.raises(RegionCorrupt) as info:
            region.decode(bytes(damaged))
        exc = info.value
        assert exc.byte_start <= i <= exc.byte_end, f"byte {i}: error names bytes {exc.byte_start}..{exc.byte_end}: {exc.message}"
        assert f"{exc.byte_start}..{exc.byte_end}" in exc.message or exc.field == "body", exc.message
        assert exc.hint
        fields_seen.add(exc.field)
    # Each class of damage is told apart.
    assert {"magic", "format_version", "sha256", "checksum_table", "fields", "body"} <= fields_seen


def test_single_bit_flips_in_body_name_the_chunk():
    block = region.encode(_header())
    damaged = bytearray(block)
    damaged[1000] ^= 0x01
    with pytest.raises(RegionCorrupt, match=r"checksum mismatch at header bytes 768\.\.1023"):
        region.decode(bytes(damaged))


def test_bad_magic_names_bytes_0_to_7():
    block = bytearray(region.encode(_header()))
    block[0:8] = b"XFSB\x00\x00\x10\x00"
    with pytest.raises(RegionCorrupt, match=r"bad magic at header bytes 0\.\.7") as info:
        region.decode(bytes(block))
    assert info.value.field == "magic"
    assert isinstance(info.value, SSDNotReady)


def test_unsupported_version_is_named():
    block = bytearray(region.encode(_header()))
    struct.pack_into("<I", block, 8, 4)
    with pytest.raises(RegionCorrupt, match=r"unsupported region format version 4 at header bytes 8\.\.11"):
        region.decode(bytes(block))


def test_version_1_header_is_still_read():
    """Regions made before ownership (format 1) stay usable: same block layout, zero reserved area."""
    block = bytearray(region.encode(_header()))
    struct.pack_into("<I", block, 8, 1)
    block[24:56] = region._sha(bytes(block))  # re-seal: the SHA-256 covers the version word
    h = region.decode(bytes(block))
    assert h.format_version == 1 and h.ranks == _header().ranks


def test_truncated_block():
    block = region.encode(_header())
    with pytest.raises(RegionCorrupt, match=r"truncated: got 100 of 4096 bytes") as info:
        region.decode(block[:100])
    assert info.value.field == "length"


def test_blank_block_is_no_region_not_corruption():
    with pytest.raises(NoRegion, match="no memascend region"):
        region.decode(bytes(HEADER_BYTES))


def test_encode_rejects_overlapping_ranks():
    h = _header(2)
    h.ranks[1] = RankSubregion(rank=1, offset_bytes=h.ranks[0].offset_bytes + 4096, size_bytes=h.ranks[1].size_bytes)
    with pytest.raises(ValueError, match="overlaps"):
        region.encode(h)


def test_encode_rejects_ranks_past_capacity():
    h = _header(1)
    h.capacity_bytes -= 4096
    with pytest.raises(ValueError, match="past the capacity"):
        region.encode(h)


def test_to_dict_is_json_ready():
    import json

    d = _header().to_dict()
    assert d["magic"] == "MEMASCND"
    assert d["probe"]["best_queue_depth"] == 32
    json.dumps(d)


def test_subregion_lookup():
    h = _header(2)
    assert h.subregion(1).rank == 1
    with pytest.raises(SSDNotReady, match="no rank 2"):
        h.subregion(2)


# ---------------------------------------------------------------------------------------------
# Geometry


@pytest.mark.parametrize(
    "logical, dio, expected",
    [(512, 512, 4096), (4096, 4096, 4096), (512, 0, 4096), (8192, 512, 8192), (3000, 0, 4096), (4096, 65536, 65536)],
)
def test_region_alignment(logical, dio, expected):
    assert region.region_alignment(logical, dio) == expected


@pytest.mark.parametrize("num_ranks", [1, 2, 3, 7, 8, 64])
@pytest.mark.parametrize("alignment", [4096, 65536])
def test_split_ranks_disjoint_aligned_inside(num_ranks, alignment):
    capacity = 10 * GiB + 12345
    start = region.align_up(region.RESERVED_BYTES, alignment)
    ranks = region.split_ranks(capacity, start, num_ranks, alignment)
    assert [r.rank for r in ranks] == list(range(num_ranks))
    assert len({r.size_bytes for r in ranks}) == 1
    prev_end = start
    for r in ranks:
        assert r.offset_bytes % alignment == 0 and r.size_bytes % alignment == 0
        assert r.offset_bytes >= prev_end
        prev_end = r.end_bytes
    assert prev_end <= capacity
    # The unused tail is smaller than one alignment unit per rank.
    assert capacity - prev_end < alignment * num_ranks + alignment


def test_split_ranks_too_small_is_bad_input():
    with pytest.raises(BadInput, match="too small for 4 rank"):
        region.split_ranks(region.RESERVED_BYTES + 8192, region.RESERVED_BYTES, 4, 4096)


@pytest.mark.parametrize("num_ranks", [0, region.MAX_RANKS + 1])
def test_split_ranks_count_bounds(num_ranks):
    with pytest.raises(BadInput, match="--ranks"):
        region.split_ranks(GiB, region.RESERVED_BYTES, num_ranks, 4096)


def test_new_header_4kn_device():
    h = region.new_header(capacity_bytes=GiB, num_ranks=2, logical_block_bytes=4096, device_alignment_bytes=4096)
    assert h.alignment_bytes == 4096 and h.logical_block_bytes == 4096
    assert h.data_start_bytes == region.RESERVED_BYTES
    region.validate_header(h)


# ---------------------------------------------------------------------------------------------
# Header I/O (tmp_path is on ext4 on the CI boxes: O_DIRECT alignment is enforced there)


def test_write_then_read_header(tmp_path):
    path = tmp_path / "r.region"
    with open(path, "wb") as f:
        f.truncate(8 * MiB)
    h = _header(2, capacity_bytes=8 * MiB, with_probe=False)
    region.write_header(str(path), h)
    assert region.read_header(str(path)) == h
    # Only the header block was written: the data area is still zero.
    data = path.read_bytes()
    assert not any(data[HEADER_BYTES:])


def test_zero_header_area_removes_region(tmp_path):
    path = tmp_path / "r.region"
    with open(path, "wb") as f:
        f.truncate(4 * MiB)
    region.write_header(str(path), _header(1, capacity_bytes=4 * MiB))
    region.zero_header_area(str(path))
    with pytest.raises(NoRegion):
        region.read_header(str(path))


def test_read_header_of_foreign_file_names_magic(tmp_path):
    path = tmp_path / "foreign.bin"
    path.write_bytes(b"\x7fELF" + bytes(8188))
    with pytest.raises(RegionCorrupt, match="bad magic"):
        region.read_header(str(path))


# ---------------------------------------------------------------------------------------------
# Extent allocator


def _sub(offset_bytes: int = 1 * MiB, size_bytes: int = 64 * MiB, rank: int = 0) -> RankSubregion:
    return RankSubregion(rank=rank, offset_bytes=offset_bytes, size_bytes=size_bytes)


def test_allocate_aligns_and_pads():
    alloc = ExtentAllocator(_sub(), 512)
    assert alloc.alignment_bytes == 4096  # never below 4 KiB, whatever the device says
    e = alloc.allocate("a", 1000)
    assert e.offset_bytes == 1 * MiB and e.length_bytes == 4096 and e.requested_bytes == 1000
    assert alloc.lookup("a") == e and "a" in alloc and len(alloc) == 1
    assert alloc.used_bytes == 4096 and alloc.free_bytes == 64 * MiB - 4096


def test_free_coalesces_back_to_one_hole():
    alloc = ExtentAllocator(_sub(), 4096)
    for k in range(10):
        alloc.allocate(k, 3 * 4096)
    for k in (1, 3, 2, 0, 9, 5, 7, 6, 8, 4):
        alloc.free(k)
    assert alloc.holes() == [(1 * MiB, 64 * MiB)]
    assert alloc.free_bytes == alloc.capacity_bytes


def test_exchange_swaps_two_live_extents_and_nothing_else():
    alloc = ExtentAllocator(_sub(), 4096)
    a, b = alloc.allocate("a", 4096), alloc.allocate("b", 2 * 4096)
    holes = alloc.holes()
    alloc.exchange("a", "b")
    assert (alloc.lookup("a"), alloc.lookup("b"), alloc.holes()) == (b, a, holes)
    with pytest.raises(KeyError):
        alloc.exchange("a", "missing")
    assert alloc.lookup("a") == b  # a refused exchange changes nothing


def test_best_fit_prefers_the_smallest_hole():
    alloc = ExtentAllocator(_sub(), 4096)
    for k, n in enumerate([8, 1, 2, 1, 4, 1]):
        alloc.allocate(k, n * 4096)
    alloc.free(0)  # 8-page hole at the start
    alloc.free(2)  # 2-page hole
    alloc.free(4)  # 4-page hole
    e = alloc.allocate("x", 2 * 4096)
    assert e.offset_bytes == alloc.extents()[1].end_bytes  # exactly the 2-page hole
    e = alloc.allocate("y", 3 * 4096)
    assert e.offset_bytes == alloc.extents()[3].end_bytes  # the 4-page hole, not the 8-page one


def test_region_full_message_names_need_free_and_largest_hole():
    alloc = ExtentAllocator(_sub(size_bytes=16 * 4096), 4096)
    for k in range(16):
        alloc.allocate(k, 4096)
    for k in range(0, 16, 2):
        alloc.free(k)  # 8 free pages, none adjacent
    with pytest.raises(RegionFull) as info:
        alloc.allocate("big", 2 * 4096)
    msg = info.value.message
    assert msg.startswith("region full: need 8.00 KiB (8192 B)")
    assert "free 32.00 KiB" in msg and "largest hole 4.00 KiB" in msg
    assert info.value.hint


def test_misuse_is_a_programming_error():
    alloc = ExtentAllocator(_sub(), 4096)
    alloc.allocate("a", 1)
    with pytest.raises(ValueError, match="already allocated"):
        alloc.allocate("a", 1)
    with pytest.raises(ValueError, match="positive"):
        alloc.allocate("b", 0)
    with pytest.raises(KeyError):
        alloc.free("missing")


def test_unaligned_subregion_is_trimmed_inward():
    alloc = ExtentAllocator(_sub(offset_bytes=1 * MiB + 100, size_bytes=8 * MiB), 4096)
    assert alloc.start_bytes == 1 * MiB + 4096
    assert alloc.end_bytes == 9 * MiB  # align_down(1 MiB + 100 + 8 MiB)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("alignment", [4096, 65536])
def test_random_operations_keep_invariants(seed, alignment):
    rng = random.Random(seed)
    sub = _sub(offset_bytes=3 * alignment, size_bytes=32 * MiB + 3 * 4096, rank=seed)
    alloc = ExtentAllocator(sub, alignment)
    live: dict[int, region.Extent] = {}
    full_errors = 0
    for step in range(3000):
        if live and (rng.random() < 0.45 or len(live) > 200):
            key = rng.choice(list(live))
            alloc.free(key)
            del live[key]
        else:
            n = rng.choice([1, 4095, 4096, 4097, rng.randrange(1, 2 * MiB), rng.randrange(1, 64 * 1024)])
            try:
                live[step] = alloc.allocate(step, n)
            except RegionFull:
                full_errors += 1
                assert alloc.largest_hole_bytes < region.align_up(n, alloc.alignment_bytes)
                continue
            assert live[step].requested_bytes == n
        # Invariants after every operation.
        spans = sorted((e.offset_bytes, e.end_bytes) for e in live.values())
        for e in live.values():
            assert e.offset_bytes % alignment == 0 and e.length_bytes % alignment == 0
            assert sub.offset_bytes <= e.offset_bytes and e.end_bytes <= sub.end_bytes
        for (_, a_end), (b_start, _) in zip(spans, spans[1:]):
            assert a_end <= b_start, "live extents overlap"
        holes = alloc.holes()
        for (h_off, h_len), (n_off, _) in zip(holes, holes[1:]):
            assert h_off + h_len < n_off, "adjacent holes were not coalesced"
        assert alloc.used_bytes == sum(e.length_bytes for e in live.values())
        assert alloc.free_bytes + alloc.used_bytes == alloc.capacity_bytes
        # Holes and extents tile the managed range exactly.
        pieces = sorted(spans + [(o, o + n) for o, n in holes])
        assert pieces[0][0] == alloc.start_bytes and pieces[-1][1] == alloc.end_bytes
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    assert alloc.extents() == live
    for key in list(live):
        alloc.free(key)
    assert alloc.holes() == [(alloc.start_bytes, alloc.capacity_bytes)]


def test_two_ranks_allocators_never_overlap():
    h = region.new_header(capacity_bytes=256 * MiB, num_ranks=2)
    a0, a1 = (ExtentAllocator(h.subregion(r), h.alignment_bytes) for r in (0, 1))
    e0 = [a0.allocate(i, 5 * MiB) for i in range(100) if a0.largest_hole_bytes >= 5 * MiB]
    e1 = [a1.allocate(i, 5 * MiB) for i in range(100) if a1.largest_hole_bytes >= 5 * MiB]
    assert max(e.end_bytes for e in e0) <= min(e.offset_bytes for e in e1)


def test_header_dataclass_fields_carry_units():
    # Names say their unit (style rule): catches a field added without one.
    unitless = {"uuid", "label", "ranks", "probe", "created_at", "created_by", "format_version", "magic", "members",
                "member_index"}
    for f in dataclasses.fields(region.RegionHeader):
        assert f.name in unitless or f.name.endswith("_bytes"), f.name
