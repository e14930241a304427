"""A region striped across real loop devices and across files on faultfs (FUSE): members probed and recorded, a
missing, swapped or resized member refused by name with nothing written, and a member that fails under the store (EIO,
ENOSPC, its device gone) named in the error.

Root (loop devices, FUSE). Fast: no DeepSpeed; the `train` runs on a striped region are in test_striped_train.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
from memascend_engine import native

from tests import faultfs
from tests.integration.test_prepare_ssd_loop import LoopDevice, _loop_skip_reason
from tests.integration.test_train_cpu import REPO

pytestmark = [pytest.mark.root, pytest.mark.skipif(not native.available()[0], reason="native extension unavailable")]
KiB, MiB = 1 << 10, 1 << 20
KEY = "/keys/zero_stage_3/optimizer/rank0/exp_avg-5.tensor.swp"


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    p = subprocess.run([sys.executable, "-m", "memascend_cli", *args], capture_output=True, text=True, cwd=REPO, env=env,
                       check=False)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.fixture
def loops(tmp_path):
    """Two 64 MiB loop devices, prepared as one striped region (probed over 4 MiB); detached afterwards."""
    reason = _loop_skip_reason()
    if reason:
        pytest.skip(reason)
    made = [LoopDevice(str(tmp_path / f"member{i}.img"), 64 * MiB, 512) for i in range(2)]
    try:
        cli("prepare-ssd", *[m.path for m in made], "--probe-mib", "4", "--yes", "--label", "striped-test")
        yield made
    finally:
        for m in made:
            m.close()


def _digest(paths: list[str]) -> list[str]:
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(hashlib.sha256(f.read()).hexdigest())
    return out


def test_members_are_probed_and_recorded(loops, tmp_path):
    info = json.loads(cli("prepare-ssd", "--info", loops[0].path, "--json").stdout)
    header = info["header"]
    assert header["format_version"] == 3 and header["stripe_unit_bytes"] == MiB
    assert [m["path"] for m in header["members"]] == [m.path for m in loops]
    for i, m in enumerate(header["members"]):
        # A loop device's serial is its backing file.
        assert m["identity"]["kind"] == "block" and m["identity"]["serial"] == str(tmp_path / f"member{i}.img")
        assert m["identity"]["size_bytes"] == 64 * MiB and m["read_gbps"] > 0 and m["write_gbps"] > 0
    assert header["probe"]["read_gbps"] == pytest.approx(sum(m["read_gbps"] for m in header["members"]), abs=2e-3)
    assert header["probe"]["write_gbps"] == pytest.approx(sum(m["write_gbps"] for m in header["members"]), abs=2e-3)
    assert [s["state"] for s in info["members"]] == ["ok", "ok"]
    # plan's time model reads the region's bandwidth: the members' sum.
    from memascend_cli.hardware import HardwareSpec
    from memascend_cli.ssd.path import apply_region

    hw = apply_region(HardwareSpec(name="test", dram_gib=16), loops[0].path)
    assert hw.nvme_read_gbps == header["probe"]["read_gbps"]


def _reattach(loop: LoopDevice, image: str) -> None:
    subprocess.run(["losetup", "-d", loop.path], check=True)
    for _ in range(50):  # the detach finishes asynchronously
        if subprocess.run(["losetup", loop.path, image], capture_output=True, check=False).returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"could not re-attach {image} at {loop.path}")


def _swap(loops, tmp_path):
    _reattach(loops[0], str(tmp_path / "member1.img"))
    _reattach(loops[1], str(tmp_path / "member0.img"))


def _resize(loops, tmp_path):
    os.truncate(str(tmp_path / "member1.img"), 96 * MiB)
    subprocess.run(["losetup", "-c", loops[1].path], check=True)


def _detach(loops, tmp_path):
    subprocess.run(["losetup", "-d", loops[1].path], check=True)
    for _ in range(50):
        if not os.path.exists(f"/sys/block/{os.path.basename(loops[1].path)}/loop"):
            return
        time.sleep(0.1)


CASES = {
    # What is done to the members -> what train's one error line says (the region is given by loop 0's path, which
    # after the swap holds member 2's image: its own header says so).
    "swapped": (_swap, r"is member 2 of 2 of striped region striped-test, not its first member"),
    "resized": (_resize, r"member 2 of 2, {1}, is 100663296 B, recorded 67108864 B \(resized\)"),
    "detached": (_detach, r"member 2 of 2, {1}, (has serial \(none\), recorded .*member1\.img and is 0 B|cannot be opened)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_member_not_as_recorded_stops_train_with_exit_2_and_nothing_written(loops, tmp_path, case):
    change, pattern = CASES[case]
    change(loops, tmp_path)
    images = [str(tmp_path / f"member{i}.img") for i in range(2)]
    before = _digest(images)
    run = tmp_path / "run"
    p = cli("train", "tiny-cpu", "--region", loops[0].path, "--output-dir", str(run), "--steps", "1", check=False)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert p.returncode == 2 and len(errors) == 1, p.stderr[-3000:]
    import re

    assert re.search(pattern.format(*[m.path for m in loops]), errors[0]), errors
    assert "hint: " in p.stderr and not run.exists()
    assert _digest(images) == before


# --- faults under the store --------------------------------------------------------------------------------------


def kill_faultfs_server(fs) -> None:
    """SIGKILL faultfs's server, then detach its dead mount (faultfs.Mount leaves a mount it cannot stat)."""
    fs.proc.send_signal(signal.SIGKILL)
    fs.proc.wait()
    subprocess.run(["umount", "-l", fs.mountpoint], check=False, capture_output=True)


class _Attached(LoopDevice):
    """A loop device over an existing image."""

    def __init__(self, image: str):
        self.path = subprocess.run(["losetup", "-f", "--show", image], check=True, capture_output=True,
                                   text=True).stdout.strip()
        self.mountpoint = None


def mount_faultfs(tmp_path):
    """faultfs over tmp_path/backing at tmp_path/mnt, for a fixture to yield from (skips where FUSE is missing)."""
    reason = faultfs.unavailable()
    if reason:
        pytest.skip(reason)
    with faultfs.Mount(str(tmp_path / "backing"), str(tmp_path / "mnt")) as fs:
        yield fs


@pytest.fixture
def fuse(tmp_path):
    yield from mount_faultfs(tmp_path)


def _tensor(nbytes: int):
    from memascend_engine.pinned import PinnedAllocator

    t = PinnedAllocator(lock=False).empty(nbytes // 4, torch.float32)
    t.copy_(torch.randn(t.numel()))
    return t


def _write(store, t):
    store.complete(store.submit("w", t.data_ptr(), t.numel() * 4, store.key(KEY), 0))


@pytest.mark.parametrize("action, errno_, text", [("eio", 5, "Input/output error"), ("enospc", 28, "No space left")])
def test_a_member_failing_on_faultfs_is_named(fuse, action, errno_, text):
    from memascend_engine.direct_nvme import RegionIOError, RegionStore

    members = [fuse.path("member0.bin"), fuse.path("member1.bin")]
    cli("prepare-ssd", *members, "--size", "32MiB", "--no-probe", "--yes")
    store = RegionStore(members[0], 0, block_size=256 * KiB)
    try:
        _write(store, _tensor(4 * MiB))  # healthy first
        fuse.set_rules([{"op": "write", "path": "member1.bin", "action": action}])
        with pytest.raises(RegionIOError) as info:
            _write(store, _tensor(4 * MiB))
    finally:
        fuse.set_rules([])
        store.close()
    assert f"failed: member 2 of 2 ({members[1]}): write of '{members[1]}'" in info.value.message
    assert text in info.value.message and info.value.errno == errno_


def test_a_member_whose_device_goes_away_is_named(fuse, tmp_path):
    """Member 2 is a loop device over a file on faultfs (direct_io): the server is killed under it, as a drive that
    drops off the bus, and every request to it fails."""
    reason = _loop_skip_reason()
    if reason:
        pytest.skip(reason)
    from memascend_engine.direct_nvme import RegionIOError, RegionStore

    subprocess.run(["fallocate", "-l", str(32 * MiB), str(tmp_path / "backing" / "member1.img")], check=True)
    loops, store = [], None
    try:
        loops.append(LoopDevice(str(tmp_path / "member0.img"), 32 * MiB, 512))
        loops.append(_Attached(fuse.path("member1.img")))  # faultfs serves no fallocate: made in its backing folder
        loop0, loop1 = loops
        cli("prepare-ssd", loop0.path, loop1.path, "--no-probe", "--yes")
        store = RegionStore(loop0.path, 0, block_size=256 * KiB)
        _write(store, _tensor(4 * MiB))
        kill_faultfs_server(fuse)
        with pytest.raises(RegionIOError) as info:
            _write(store, _tensor(4 * MiB))
        assert f"failed: member 2 of 2 ({loop1.path}): write of '{loop1.path}'" in info.value.message
        assert info.value.errno == 5
    finally:
        if store is not None:
            store.close()
        for loop in loops:
            loop.close()
