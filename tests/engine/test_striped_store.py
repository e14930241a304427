"""The Direct NVMe store on a region striped across region files (engine/striped_io.py over memascend_cli/ssd/stripe.py).

Made by the real `memascend prepare-ssd A B [C]`, read and written through the native engine: bytes land on the members
row by row as RAID-0 places them, a large request reaches every member, a member's failure is named, and a member that
is missing, swapped, replaced or resized is refused before anything is written. Files on the test's tmp folder (no
root); the loop-device and FUSE cases are in tests/integration/test_striped_region.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from memascend_engine import native

from memascend_cli.ssd import region as region_mod
from tests.engine.test_engine_direct_nvme import NO_DIO_RULES, _fs_type

OK, WHY = native.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"native extension unavailable: {WHY}")
KiB, MiB = 1 << 10, 1 << 20
KEY = "/keys/zero_stage_3/optimizer/rank0/exp_avg-3.tensor.swp"


def make_striped(directory: Path, n: int, size: str = "32MiB") -> list[str]:
    kind = _fs_type(directory)
    if kind in NO_DIO_RULES or kind.startswith("fuse"):
        pytest.skip(f"{directory} is on {kind}, which does not enforce O_DIRECT rules")
    paths = [str(directory / f"member{i}.bin") for i in range(n)]
    subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", *paths, "--size", size, "--no-probe", "--yes"],
                   check=True, capture_output=True, text=True)
    return paths


def _tensor(nbytes: int, seed: int = 0):
    from memascend_engine.pinned import PinnedAllocator

    t = PinnedAllocator(lock=False).empty(nbytes, torch.uint8)
    t.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)))
    return t


def _io(store, op, t, key=KEY):
    store.complete(store.submit(op, t.data_ptr(), t.numel(), store.key(key), 0))


def _logical_data(paths: list[str], header) -> bytes:
    """The data area as the members hold it, interleaved row by row: member 0's unit r, member 1's unit r, ..."""
    unit, start = header.stripe_unit_bytes, header.data_start_bytes
    rows = (header.capacity_bytes - start) // (unit * len(paths))
    blobs = [Path(p).read_bytes() for p in paths]
    return b"".join(b[start + r * unit:start + (r + 1) * unit] for r in range(rows) for b in blobs)


def _digest(paths: list[str]) -> list[str]:
    return [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]


@pytest.mark.parametrize("n", [2, 3])
def test_bytes_land_on_the_members_row_by_row(tmp_path, n):
    from memascend_engine.direct_nvme import RegionStore

    paths = make_striped(tmp_path, n)
    store = RegionStore(paths[0], 0, block_size=256 * KiB)
    try:
        keys = {f"/k/{i}": _tensor(size, seed=i) for i, size in enumerate((5 * MiB + 4096, 1 * MiB, 3 * KiB, 7 * MiB))}
        for k, t in keys.items():
            _io(store, "w", t, k)
        for k, t in keys.items():
            back = _tensor(t.numel(), seed=99)
            _io(store, "r", back, k)
            assert torch.equal(back, t), k
        engines = store.engine.engines
        assert len(engines) == n and all(e.bytes_written > 0 for e in engines)
    finally:
        store.close()
    header = region_mod.read_header(paths[0])
    data = _logical_data(paths, header)
    for k, t in keys.items():
        ext = store.allocator.lookup(k)
        lo = ext.offset_bytes - header.data_start_bytes
        assert data[lo:lo + t.numel()] == t.numpy().tobytes(), k


def test_a_request_of_n_units_keeps_every_member_busy(tmp_path):
    """One 3 MiB write at a unit boundary: each member's engine gets one 1 MiB request, all queued before the wait."""
    from memascend_engine.direct_nvme import RegionStore

    paths = make_striped(tmp_path, 3)
    store = RegionStore(paths[0], 0)
    try:
        store.reserve("/pad", MiB - 4096 * 0)  # the first extent starts at the data start: a unit boundary
        t = _tensor(3 * MiB)
        pending = store.submit("w", t.data_ptr(), t.numel(), "/k", 0)
        per_member = [sorted(m for m, _ in store.engine._requests[rid]) for rid in pending.request_ids]
        store.complete(pending)
        assert per_member == [[0, 1, 2]]
        assert [e.bytes_written for e in store.engine.engines] == [MiB, MiB, MiB]
    finally:
        store.close()


@pytest.mark.parametrize("kind, errno_", [("eio", 5), ("enospc", 28)])
def test_a_failing_member_is_named(tmp_path, monkeypatch, kind, errno_):
    from memascend_engine.direct_nvme import RegionIOError, RegionStore

    paths = make_striped(tmp_path, 2)
    monkeypatch.setenv("MEMASCEND_IO_FAULTS", f"op=write,kind={kind},path=member1.bin")
    store = RegionStore(paths[0], 0, block_size=256 * KiB)
    try:
        with pytest.raises(RegionIOError) as info:
            _io(store, "w", _tensor(4 * MiB))
    finally:
        store.close()
    msg = info.value.message
    assert f"failed: member 2 of 2 ({paths[1]}): write of '{paths[1]}' offset=" in msg, msg
    assert info.value.errno == errno_ and info.value.op == "write"


def test_a_lost_write_on_a_member_fails_the_checksum_naming_its_bytes(tmp_path, monkeypatch):
    from memascend_engine.direct_nvme import RegionDataError, RegionStore

    paths = make_striped(tmp_path, 2)
    monkeypatch.setenv("MEMASCEND_IO_FAULTS", "op=write,kind=drop,path=member1.bin")
    store = RegionStore(paths[0], 0, block_size=256 * KiB)
    try:
        _io(store, "w", _tensor(2 * MiB))
        with pytest.raises(RegionDataError, match=rf"of {paths[0]} = member 2 of 2 \({paths[1]}\) bytes \d+\.\.\d+ "):
            _io(store, "r", _tensor(2 * MiB))
    finally:
        store.close()


def _swap(a: str, b: str) -> None:
    os.rename(a, a + ".t")
    os.rename(b, a)
    os.rename(a + ".t", b)


def _replace(path: str) -> None:
    """A blank file of the same size: another inode without the member's header, as a new drive in its slot."""
    size = os.path.getsize(path)
    with open(path + ".new", "wb") as f:
        f.truncate(size)
    os.replace(path + ".new", path)


def _copy(path: str) -> None:
    """The member copied to a new file (another inode, the same bytes): as a cloned drive."""
    Path(path + ".new").write_bytes(Path(path).read_bytes())
    os.replace(path + ".new", path)


CASES = {
    "missing": (lambda p: os.rename(p[1], p[1] + ".gone"), r"member 2 of 3, {1}, is missing"),
    "swapped": (lambda p: _swap(p[1], p[2]), (r"member 2 of 3, {1}, holds member 3 of this region \(members swapped\); "
                                              r"member 3 of 3, {2}, holds member 2 of this region")),
    "resized": (lambda p: os.truncate(p[2], 48 * MiB), r"member 3 of 3, {2}, is 50331648 B, recorded 33554432 B \(resized\)"),
    "replaced": (lambda p: _replace(p[1]), (r"member 2 of 3, {1}, holds no header of this region \(no memascend region "
                                            r"here .*\) and is file \(device:inode\) \d+:\d+:\d+, recorded")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_member_not_as_recorded_is_refused_by_name_before_any_write(tmp_path, case):
    from memascend_engine.direct_nvme import RegionStore

    from memascend_cli.ssd.members import MemberMismatch

    paths = make_striped(tmp_path, 3)
    change, pattern = CASES[case]
    change(paths)
    present = [p for p in paths if os.path.exists(p)]
    before = _digest(present)
    with pytest.raises(MemberMismatch, match=pattern.format(*paths)) as info:
        RegionStore(paths[0], 0)
    assert info.value.exit_code == 2 and "prepare-ssd --info" in info.value.hint
    assert _digest(present) == before  # not even the owner record was written


def test_a_member_given_as_the_region_is_refused(tmp_path):
    from memascend_engine.direct_nvme import RegionStore

    from memascend_cli.ssd.members import MemberMismatch

    paths = make_striped(tmp_path, 2)
    with pytest.raises(MemberMismatch, match=rf"{paths[1]} is member 2 of 2 of striped region .*, not its first member"):
        RegionStore(paths[1], 0)


def test_a_member_copied_to_another_inode_still_opens(tmp_path):
    """Its own header copy says which member it is: a renumbered device, a moved file or a cloned drive is used."""
    from memascend_cli.ssd.members import check_members
    from memascend_engine.direct_nvme import RegionStore

    paths = make_striped(tmp_path, 2)
    inode = os.stat(paths[1]).st_ino
    _copy(paths[1])
    assert os.stat(paths[1]).st_ino != inode
    check_members(paths[0], region_mod.read_header(paths[0]))
    RegionStore(paths[0], 0).close()
