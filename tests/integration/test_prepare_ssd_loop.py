"""prepare-ssd against real loop devices (root), and two ranks writing one region at once.

Loop devices are a machine-global resource: every test takes a free one with `losetup -f --show`
over an image in tmp_path and detaches it (after unmounting) in teardown, also on failure.
Nothing here writes to any device other than the loop devices it created.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from memascend_cli.ssd import region
from memascend_cli.app import main

MiB = 1024**2
RANK_PATTERN = {0: 0xA5, 1: 0x5A}


class _Entry:
    name = "memascend"

    def main(self, args=(), prog_name=None, **_):
        main(list(args))


def run(*args: str):
    return CliRunner().invoke(_Entry(), list(args))


def _loop_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to attach loop devices"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control (loop driver not available)"
    if shutil.which("losetup") is None:
        return "losetup (util-linux) is not installed"
    return None


def _need_tool(name: str) -> None:
    if shutil.which(name) is None:
        pytest.skip(f"{name} is not installed")


class LoopDevice:
    """A loop device over a fallocated image; `close()` unmounts and detaches."""

    def __init__(self, image: str, size_bytes: int, sector_bytes: int):
        subprocess.run(["fallocate", "-l", str(size_bytes), image], check=True)
        args = ["losetup", "-f", "--show"]
        if sector_bytes != 512:
            # 4Kn emulation needs direct I/O on the backing file (--direct-io=on).
            args += ["--direct-io=on", "--sector-size", str(sector_bytes)]
        self.path = subprocess.run(args + [image], check=True, capture_output=True, text=True).stdout.strip()
        self.mountpoint: str | None = None

    def mount(self, mountpoint: str) -> None:
        os.makedirs(mountpoint, exist_ok=True)
        subprocess.run(["mount", self.path, mountpoint], check=True)
        self.mountpoint = mountpoint

    def close(self) -> None:
        if self.mountpoint is not None:
            subprocess.run(["umount", self.mountpoint], check=False)
            self.mountpoint = None
        subprocess.run(["losetup", "-d", self.path], check=False)


@pytest.fixture
def make_loop(tmp_path):
    reason = _loop_skip_reason()
    if reason:
        pytest.skip(reason)
    loops: list[LoopDevice] = []

    def make(size_bytes: int = 64 * MiB, sector_bytes: int = 512) -> LoopDevice:
        loop = LoopDevice(str(tmp_path / f"loop{len(loops)}.img"), size_bytes, sector_bytes)
        loops.append(loop)
        return loop

    yield make
    for loop in reversed(loops):
        loop.close()


def _sha(path: str, offset: int, nbytes: int) -> str:
    return hashlib.sha256(region.read_block(path, offset, nbytes)).hexdigest()


# ---------------------------------------------------------------------------------------------
# Loop devices (root)


@pytest.mark.root
@pytest.mark.parametrize("sector_bytes", [512, 4096])
def test_blank_loop_is_accepted(make_loop, sector_bytes):
    loop = make_loop(64 * MiB, sector_bytes)
    r = run("prepare-ssd", loop.path, "--yes", "--probe-mib", "8", "--ranks", "2", "--label", "loop", "--json")
    assert r.exit_code == 0, r.stderr
    h = json.loads(r.stdout)["header"]
    assert h["logical_block_bytes"] == sector_bytes and h["alignment_bytes"] == 4096
    assert h["capacity_bytes"] == 64 * MiB and h["probe"]["read_gbps"] > 0
    header = region.read_header(loop.path)
    assert header.uuid == h["uuid"] and header.label == "loop"

    r = run("prepare-ssd", "--info", loop.path, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["header"]["uuid"] == h["uuid"]

    # Re-initialising needs --force; wiping needs confirmation, then the header is gone.
    assert run("prepare-ssd", loop.path, "--yes", "--no-probe").exit_code == 1
    assert run("prepare-ssd", "--wipe", loop.path, "--yes").exit_code == 0
    with pytest.raises(region.NoRegion):
        region.read_header(loop.path)


@pytest.mark.root
def test_device_needs_confirmation_and_dry_run_touches_nothing(make_loop):
    loop = make_loop(32 * MiB)
    with open(loop.path, "r+b", buffering=0) as f:
        f.seek(8 * MiB)
        f.write(b"keep me" * 100)  # data in the middle: no signature, first MiB still blank
    before = (_sha(loop.path, 0, 32 * MiB),)
    r = run("prepare-ssd", loop.path, "--dry-run", "--ranks", "2")
    assert r.exit_code == 0 and "nothing was touched" in r.stdout
    r = run("prepare-ssd", loop.path, "--no-probe")  # no TTY, no --yes
    assert r.exit_code == 2 and "needs confirmation" in r.stderr and "--yes" in r.stderr
    assert (_sha(loop.path, 0, 32 * MiB),) == before


@pytest.mark.root
def test_loop_with_ext4_signature_needs_force(make_loop):
    _need_tool("mkfs.ext4")
    loop = make_loop(64 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", loop.path], check=True)
    r = run("prepare-ssd", loop.path, "--yes", "--no-probe")
    assert r.exit_code == 1
    assert "without --force" in r.stderr and "ext4" in r.stderr
    with pytest.raises(region.RegionCorrupt, match="bad magic"):
        region.read_header(loop.path)

    r = run("prepare-ssd", loop.path, "--yes", "--force", "--no-probe")
    assert r.exit_code == 0, r.stderr
    assert "--force given" in r.stderr
    region.read_header(loop.path)
    if shutil.which("wipefs"):
        out = subprocess.run(["wipefs", "--no-act", "--json", loop.path], capture_output=True, text=True).stdout
        assert "ext4" not in out, "the old signature must be cleared"


@pytest.mark.root
def test_loop_with_mounted_ext4_is_refused_even_with_force(make_loop, tmp_path):
    _need_tool("mkfs.ext4")
    _need_tool("mount")
    loop = make_loop(64 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", loop.path], check=True)
    loop.mount(str(tmp_path / "mnt"))
    before = _sha(loop.path, 0, 2 * MiB)
    for extra in ([], ["--force"]):
        r = run("prepare-ssd", loop.path, "--yes", "--no-probe", *extra)
        assert r.exit_code == 1
        assert f"it is mounted: {loop.path} on {tmp_path / 'mnt'}" in r.stderr
        assert "nothing overrides this" in r.stderr
    r = run("prepare-ssd", "--wipe", loop.path, "--yes", "--force")
    assert r.exit_code == 1 and "mounted" in r.stderr
    assert _sha(loop.path, 0, 2 * MiB) == before


@pytest.mark.root
def test_loop_listed_with_verdicts(make_loop):
    _need_tool("mkfs.ext4")
    blank, ext4 = make_loop(16 * MiB), make_loop(16 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", ext4.path], check=True)
    r = run("prepare-ssd", "--list", "--json")
    assert r.exit_code == 0, r.stderr
    by_path = {d["path"]: d for d in json.loads(r.stdout)["devices"]}
    assert by_path[blank.path]["status"] == "safe"
    assert by_path[ext4.path]["status"] == "force" and "ext4" in by_path[ext4.path]["signatures"][0]


# ---------------------------------------------------------------------------------------------
# Two ranks writing one region at once


def _rank_writer(path: str, rank: int, seed: int, barrier, results) -> None:
    """Allocate extents in this rank's sub-region and fill them with the rank's byte, via O_DIRECT."""
    header = region.read_header(path)
    alloc = region.ExtentAllocator(header.subregion(rank), header.alignment_bytes)
    rng = random.Random(seed)
    extents = []
    for i in range(400):
        n = rng.choice([1, 4095, 4096, 65536, rng.randrange(1, 512 * 1024)])
        if alloc.largest_hole_bytes < region.align_up(n, alloc.alignment_bytes):
            break
        extents.append(alloc.allocate(i, n))
        if i % 5 == 4:  # free some so later extents land in reused holes
            victim = rng.randrange(len(extents))
            alloc.free(list(alloc.extents())[victim % len(alloc)])
    live = list(alloc.extents().values())
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    try:
        barrier.wait()  # both ranks start writing at the same moment
        for e in live:
            buf = region.aligned_buffer(e.length_bytes)
            buf.write(bytes([RANK_PATTERN[rank]]) * e.length_bytes)
            assert os.pwritev(fd, [memoryview(buf)[: e.length_bytes]], e.offset_bytes) == e.length_bytes
            buf.close()
        os.fsync(fd)
    finally:
        os.close(fd)
    results.put((rank, [(e.offset_bytes, e.length_bytes) for e in live]))


def _two_ranks_at_once(path: str) -> None:
    header = region.read_header(path)
    header_block = region.read_block(path, 0, region.HEADER_BYTES)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_rank_writer, args=(path, rank, 1000 + rank, barrier, results)) for rank in (0, 1)]
    for p in procs:
        p.start()
    written = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    data = region.read_block(path, 0, header.capacity_bytes)
    # Expected content of every byte: rank patterns in live extents, zeros elsewhere.
    expected = bytearray(header.capacity_bytes)
    expected[: region.HEADER_BYTES] = header_block
    for rank, spans in written.items():
        sub = header.subregion(rank)
        assert spans, f"rank {rank} wrote nothing"
        for off, n in spans:
            assert sub.offset_bytes <= off and off + n <= sub.end_bytes
            expected[off : off + n] = bytes([RANK_PATTERN[rank]]) * n
    if data != bytes(expected):
        first = next(i for i in range(len(data)) if data[i] != expected[i])
        owner = next((r.rank for r in header.ranks if r.offset_bytes <= first < r.end_bytes), None)
        pytest.fail(f"byte {first} is {data[first]:#x}, expected {expected[first]:#x} (sub-region of rank {owner})")
    assert region.read_header(path) == header


def test_two_ranks_writing_at_once_never_touch_each_other(tmp_path):
    path = str(tmp_path / "two-ranks.region")
    r = run("prepare-ssd", path, "--size", "48MiB", "--ranks", "2", "--no-probe")
    assert r.exit_code == 0, r.stderr
    _two_ranks_at_once(path)


@pytest.mark.root
def test_two_ranks_writing_at_once_on_a_4kn_loop(make_loop):
    loop = make_loop(48 * MiB, 4096)
    r = run("prepare-ssd", loop.path, "--yes", "--ranks", "2", "--no-probe")
    assert r.exit_code == 0, r.stderr
    _two_ranks_at_once(loop.path)


# ---------------------------------------------------------------------------------------------
# Bandwidth probe backends


def _native_skip_reason() -> str | None:
    try:
        from memascend_engine import native
    except ImportError as exc:
        return f"memascend_engine is not importable: {exc}"
    ok, why = native.available()
    return None if ok else why


@pytest.mark.parametrize("prefer_native", [False, True], ids=["python-odirect", "native"])
def test_probe_touches_only_its_range(tmp_path, prefer_native):
    from memascend_cli.ssd import probe as ssd_probe

    if prefer_native and (why := _native_skip_reason()):
        pytest.skip(f"native I/O core unavailable: {why}")
    path = str(tmp_path / "probe.region")
    assert run("prepare-ssd", path, "--size", "24MiB", "--ranks", "2", "--no-probe").exit_code == 0
    header = region.read_header(path)
    plan = ssd_probe.plan_probe(header, probe_mib=8)
    assert plan.offset_bytes == header.data_start_bytes and plan.length_bytes == 8 * MiB
    result, note = ssd_probe.probe_bandwidth(path, plan, progress=False, prefer_native=prefer_native)
    assert (note is None) == prefer_native
    assert result.backend != "python-odirect" if prefer_native else result.backend == "python-odirect"
    assert result.read_gbps > 0 and result.write_gbps > 0 and len(result.samples) == 6
    assert (result.best_block_bytes, result.best_queue_depth) in {(s.block_bytes, s.queue_depth) for s in result.samples}
    data = region.read_block(path, 0, header.capacity_bytes)
    assert region.decode(data[: region.HEADER_BYTES]) == header
    assert not any(data[region.HEADER_BYTES : plan.offset_bytes]), "probe wrote into the reserved area"
    assert not any(data[plan.end_bytes :]), "probe wrote past its range"
    assert any(data[plan.offset_bytes : plan.end_bytes])


def test_probe_plan_clamps_to_the_data_area():
    from memascend_cli.ssd import probe as ssd_probe

    header = region.new_header(capacity_bytes=3 * MiB, num_ranks=1)
    plan = ssd_probe.plan_probe(header, probe_mib=256)
    assert plan.offset_bytes == header.data_start_bytes
    assert plan.end_bytes <= header.ranks[-1].end_bytes
    assert all(plan.length_bytes % bs == 0 for bs in plan.block_sizes_bytes)
