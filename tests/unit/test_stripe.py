"""Striping math, the striped header and the member checks that need no device (memascend_cli/ssd/stripe.py,
region.py's v3 header, prepare_striped.py's write plan)."""

from __future__ import annotations

import dataclasses
import json
import random
import struct

import pytest

from memascend_cli.ssd import prepare_striped, region, stripe
from memascend_cli.ssd.safety import TargetFacts

MiB = 1 << 20


def _reference_map(offset: int, nbytes: int, *, data_start: int, unit: int, sizes: list[int]) -> list[tuple[int, int]]:
    """(member, member byte) of every logical byte, from the data areas interleaved row by row (RAID-0 as a picture:
    row r holds member 0's r-th unit, then member 1's, ...), not from split's divmod."""
    n = len(sizes)
    rows = stripe.stripes_per_member(sizes, data_start, unit)
    layout = [(m, data_start + r * unit + i) for r in range(rows) for m in range(n) for i in range(unit)]
    return [(0, x) if x < data_start else layout[x - data_start] for x in range(offset, offset + nbytes)]


def _expand(pieces: list[stripe.Piece]) -> list[tuple[int, int]]:
    out = []
    for p in pieces:
        out += [(p.member, p.member_offset + i) for i in range(p.nbytes)]
    return out


@pytest.mark.parametrize("n", [2, 3, 5])
def test_split_matches_the_row_by_row_layout(n):
    data_start, unit = 64, 16
    sizes = [data_start + 7 * unit + 5] * n  # a tail past the last whole unit is not used
    cap = stripe.striped_capacity(sizes, data_start, unit)
    assert cap == data_start + n * 7 * unit
    rng = random.Random(n)
    for _ in range(200):
        off = rng.randrange(data_start, cap)
        nbytes = rng.randrange(1, cap - off + 1)
        pieces = stripe.split(off, nbytes, data_start_bytes=data_start, unit_bytes=unit, num_members=n)
        assert _expand(pieces) == _reference_map(off, nbytes, data_start=data_start, unit=unit, sizes=sizes)
        # The caller's buffer is covered once, in order, and no piece crosses a stripe unit.
        assert [p.buffer_offset for p in pieces] == [sum(q.nbytes for q in pieces[:i]) for i in range(len(pieces))]
        assert all((p.member_offset - data_start) // unit == (p.member_offset + p.nbytes - 1 - data_start) // unit
                   for p in pieces)


def test_a_request_of_n_units_gives_each_member_one():
    pieces = stripe.split(MiB + 3 * MiB, 3 * MiB, data_start_bytes=MiB, unit_bytes=MiB, num_members=3)
    assert sorted(p.member for p in pieces) == [0, 1, 2] and all(p.nbytes == MiB for p in pieces)


def test_one_member_and_the_header_area_map_to_themselves():
    assert stripe.split(12345, 999, data_start_bytes=MiB, unit_bytes=MiB, num_members=1) == [stripe.Piece(0, 12345, 0, 999)]
    assert stripe.split(4096, 4096, data_start_bytes=MiB, unit_bytes=MiB, num_members=3) == [stripe.Piece(0, 4096, 0, 4096)]
    with pytest.raises(ValueError, match="straddle the data start"):
        stripe.split(MiB - 4096, 8192, data_start_bytes=MiB, unit_bytes=MiB, num_members=2)


def test_capacity_follows_the_smallest_member():
    sizes = [MiB + 10 * MiB, MiB + 4 * MiB + 4096, MiB + 7 * MiB]
    assert stripe.stripes_per_member(sizes, MiB, MiB) == 4
    assert stripe.striped_capacity(sizes, MiB, MiB) == MiB + 3 * 4 * MiB
    assert stripe.member_end_bytes(MiB + 12 * MiB, MiB, 3) == MiB + 4 * MiB


@pytest.mark.parametrize("alignment, io_bytes, unit", [(4096, 0, MiB), (4096, MiB, MiB), (4096, 3 * MiB, 4 * MiB),
                                                       (65536, 4096, 65536), (4096, 300_000, 512 * 1024)])
def test_stripe_unit_is_a_power_of_two_at_least_the_alignment(alignment, io_bytes, unit):
    assert stripe.stripe_unit(alignment, io_bytes) == unit


# --- the header ---------------------------------------------------------------------------------------------------


def _identity(i: int, size: int) -> stripe.MemberIdentity:
    return stripe.MemberIdentity(kind="block", dev=f"259:{i}", ino=0, size_bytes=size, serial=f"S4EWNX0R{i:06d}")


def striped(n: int = 3, member_bytes: int = 64 * MiB, num_ranks: int = 2, path_len: int = 12) -> region.RegionHeader:
    unit = MiB
    sizes = [member_bytes] * n
    h = region.new_header(capacity_bytes=stripe.striped_capacity(sizes, MiB, unit), num_ranks=num_ranks, label="s")
    h.members = [stripe.Member(path="/dev/" + f"nvme{i}n1".ljust(path_len, "x"), identity=_identity(i, member_bytes),
                               read_gbps=3.1, write_gbps=2.2, best_block_bytes=MiB, best_queue_depth=32)
                 for i in range(n)]
    h.stripe_unit_bytes, h.format_version = unit, region.STRIPED_FORMAT_VERSION
    return h


def test_striped_header_round_trips_as_version_3():
    h = striped()
    block = region.encode(h)
    assert struct.unpack_from("<I", block, 8)[0] == 3
    assert region.decode(block) == h
    copy = prepare_striped.member_copy(h, 2)
    assert region.decode(region.encode(copy)).member_index == 2


def test_a_region_of_one_target_is_unchanged_on_disk():
    """Version 2, no `stripe` entry: the bytes an older memascend wrote and reads."""
    h = region.new_header(capacity_bytes=64 * MiB)
    block = region.encode(h)
    assert struct.unpack_from("<I", block, 8)[0] == 2
    body = json.loads(block[region.BODY_OFFSET:].rstrip(b"\0"))
    assert "stripe" not in body and sorted(body) == ["alignment_bytes", "capacity_bytes", "created_at", "created_by",
                                                     "data_start_bytes", "label", "logical_block_bytes", "probe",
                                                     "ranks", "uuid"]


def test_eight_members_with_long_paths_fit_beside_64_ranks_and_a_probe():
    h = striped(n=stripe.MAX_MEMBERS, member_bytes=4 << 40, num_ranks=region.MAX_RANKS, path_len=40)
    h.probe = region.ProbeResult(read_gbps=24.8, write_gbps=17.6, best_block_bytes=MiB, best_queue_depth=32,
                                 best_num_workers=4, backend="io_uring", measured_at="2026-12-06T10:00:00+00:00",
                                 probe_bytes=256 * MiB,
                                 samples=[region.ProbeSample(block_bytes=b, queue_depth=q, write_gbps=17.6, read_gbps=24.8)
                                          for b in (256 * 1024, MiB, 4 * MiB) for q in (8, 32)])
    assert region.decode(region.encode(h)) == h


@pytest.mark.parametrize("change, problem", [
    (lambda h: setattr(h, "stripe_unit_bytes", 3 * 4096), "is not a power of two multiple of the alignment"),
    (lambda h: setattr(h, "member_index", 3), "member index 3 outside 0..2"),
    (lambda h: setattr(h, "members", h.members * 3), "9 members (a striped region has 2..8)"),
    (lambda h: setattr(h, "members", h.members[:1]), "1 members"),
    (lambda h: h.members.__setitem__(1, dataclasses.replace(h.members[1], identity=_identity(1, 8 * MiB))),
     "member 2 (/dev/nvme1n1xxxxx) of 8388608 B is smaller than its"),
    (lambda h: setattr(h, "capacity_bytes", h.capacity_bytes - MiB), "is not whole rows of 3 x 1048576 B"),
])
def test_bad_stripe_geometry_is_refused(change, problem):
    h = striped()
    change(h)
    with pytest.raises(ValueError, match="invalid region header: .*" + problem.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        region.encode(h)


def test_identity_differences_are_named():
    rec = _identity(1, 64 * MiB)
    assert stripe.identity_differences(rec, rec) == {}
    assert stripe.identity_differences(rec, dataclasses.replace(rec, serial="OTHER")) == {
        "serial": "has serial OTHER, recorded S4EWNX0R000001"}
    assert stripe.identity_differences(rec, dataclasses.replace(rec, size_bytes=32 * MiB)) == {
        "size": f"is {32 * MiB} B, recorded {64 * MiB} B (resized)"}
    assert stripe.identity_differences(rec, dataclasses.replace(rec, dev="259:7")) == {
        "dev": "is device 259:7, recorded 259:1"}
    f = stripe.MemberIdentity(kind="file", dev="254:0", ino=11, size_bytes=MiB, serial="")
    assert stripe.identity_differences(f, dataclasses.replace(f, ino=12)) == {
        "dev": "is file (device:inode) 254:0:12, recorded 254:0:11"}
    assert stripe.identity_differences(f, rec) == {"kind": "is a block, recorded a file"}


# --- the write plan -----------------------------------------------------------------------------------------------


def _facts(path: str, size: int, kind: str = "block") -> TargetFacts:
    return TargetFacts(path=path, real_path=path, kind=kind, exists=kind == "block", size_bytes=size,
                       logical_block_bytes=512)


def test_write_plan_makes_every_member_before_any_header_and_probes_each():
    from memascend_cli.ssd.probe import plan_probe

    facts = [_facts(f"/dev/loop{i}", 64 * MiB) for i in range(2)]
    h = striped(n=2)
    plan = plan_probe(h, 8)
    ops = [(a.op, a.target) for a in prepare_striped.build_striped_actions(facts, h, plan)]
    first_header = ops.index(("write-header", "/dev/loop0"))
    assert {op for op, _ in ops[:first_header]} == {"zero", "identify"} and ops[first_header - 1][0] == "identify"
    assert [t for op, t in ops if op == "probe"] == ["/dev/loop0", "/dev/loop1"]
    assert [t for op, t in ops if op == "write-header"] == ["/dev/loop0", "/dev/loop1"] * 2
    # Each member's tail is cleared at its own end, not at the region's logical capacity.
    tails = [a for a in prepare_striped.build_striped_actions(facts, h, plan) if a.op == "zero" and a.start_byte > 0]
    assert [a.end_byte for a in tails] == [64 * MiB - 1] * 2
    # The probe runs on each member's own data area.
    assert plan.end_bytes <= 64 * MiB


def test_summed_probe_adds_every_setting_over_the_members():
    def result(r, w):
        return region.ProbeResult(read_gbps=r, write_gbps=w, best_block_bytes=MiB, best_queue_depth=32,
                                  best_num_workers=4, backend="io_uring", measured_at="t", probe_bytes=MiB,
                                  samples=[region.ProbeSample(block_bytes=MiB, queue_depth=8, write_gbps=w, read_gbps=r),
                                           region.ProbeSample(block_bytes=MiB, queue_depth=32, write_gbps=w / 2,
                                                              read_gbps=r / 2)])

    s = prepare_striped.summed_probe([result(3.0, 2.0), result(1.5, 1.0)], MiB)
    assert (s.read_gbps, s.write_gbps, s.best_block_bytes) == (4.5, 3.0, MiB)
    assert s.sample_rows() == [[MiB, 8, 3.0, 4.5], [MiB, 32, 1.5, 2.25]]
