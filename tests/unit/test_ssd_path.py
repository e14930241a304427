"""ssd.path: where a run's SSD data would go, and whether O_DIRECT really works there (real probes on this machine's
file systems, a loop device as root)."""

from __future__ import annotations

import os
import subprocess

import pytest

from memascend_cli.ssd.path import path_info


def _fstype_of(path: str) -> str | None:
    from memascend_cli.ssd.blockdev import mount_for_path, read_mountinfo

    entry = mount_for_path(os.path.realpath(path), read_mountinfo())
    return entry.fstype if entry else None


def test_path_info_on_disk_filesystem_o_direct_ok(tmp_path):
    fstype = _fstype_of(str(tmp_path))
    if fstype not in ("ext4", "xfs", "btrfs"):
        pytest.skip(f"tmp_path is on {fstype}, not a disk filesystem that enforces O_DIRECT")
    before = set(os.listdir(tmp_path))
    info = path_info(str(tmp_path))
    assert info.exists and not info.is_block_device
    assert info.fstype == fstype
    assert info.o_direct_ok is True, info.o_direct_reason
    assert "EINVAL" in info.o_direct_reason
    assert info.free_bytes > 0 and info.total_bytes >= info.free_bytes
    # The probe file is removed.
    assert set(os.listdir(tmp_path)) == before


def test_path_info_reports_dio_alignment_on_ext4(tmp_path):
    if _fstype_of(str(tmp_path)) != "ext4":
        pytest.skip("statx DIOALIGN values are pinned for ext4 only (platform notes §7.1)")
    info = path_info(str(tmp_path))
    if info.dio_offset_align is None:
        pytest.skip("kernel does not report STATX_DIOALIGN (Linux < 6.1)")
    # ext4 on a 512-byte logical block device: 512/512 (platform notes §7.1).
    assert info.dio_offset_align in (512, 4096) and info.dio_mem_align in (512, 4096)


def test_path_info_on_tmpfs_rejected_with_reason():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("/dev/shm is absent on this machine")
    if _fstype_of("/dev/shm") != "tmpfs":
        pytest.skip("/dev/shm is not tmpfs on this machine")
    info = path_info("/dev/shm")
    assert info.fstype == "tmpfs"
    assert info.o_direct_ok is False
    assert "tmpfs" in info.o_direct_reason and "without enforcing" in info.o_direct_reason
    assert info.device is None


def test_path_info_regular_file_probes_its_directory(tmp_path):
    region = tmp_path / "region.bin"
    region.write_bytes(b"\0" * 8192)
    info = path_info(str(region))
    assert info.exists and not info.is_block_device
    assert info.path == str(region)
    assert info.o_direct_ok is not None
    assert region.read_bytes() == b"\0" * 8192  # the region itself is never written


def test_path_info_character_device_is_not_probed():
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null on this machine")
    info = path_info("/dev/null")
    assert info.exists and info.o_direct_ok is None and "not a directory" in info.o_direct_reason


def test_path_info_missing_path():
    info = path_info("/nonexistent/memascend/swap")
    assert info.exists is False and info.o_direct_ok is None and info.free_bytes is None


def test_path_info_unwritable_directory_is_unknown(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root can write into a mode-0555 directory, so the probe cannot be refused")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    info = path_info(str(locked))
    assert info.o_direct_ok is None and "cannot create a probe file" in info.o_direct_reason


@pytest.fixture
def loop_4kn(tmp_path):
    """A 16 MiB loop device with 4096-byte logical sectors (platform notes §7.3), detached afterwards."""
    import shutil

    if os.geteuid() != 0:
        pytest.skip("attaching a loop device needs root")
    if not os.path.exists("/dev/loop-control") or shutil.which("losetup") is None:
        pytest.skip("no /dev/loop-control or no losetup on this machine")
    image = tmp_path / "region.img"
    with open(image, "wb") as f:
        f.truncate(16 * 1024**2)
    proc = subprocess.run(
        ["losetup", "-f", "--show", "--direct-io=on", "--sector-size", "4096", str(image)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"losetup failed: {proc.stderr.strip()}")
    device = proc.stdout.strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


@pytest.mark.root
def test_path_info_on_loop_device_reads_only(loop_4kn):
    from memascend_cli.ssd.blockdev import find_block_device

    dev = find_block_device(loop_4kn)
    assert dev is not None and dev.type == "loop" and dev.logical_block_bytes == 4096
    assert dev.size_bytes == 16 * 1024**2
    info = path_info(loop_4kn)
    assert info.is_block_device and info.device == loop_4kn
    assert info.o_direct_ok is True, info.o_direct_reason
    assert "read rejected" in info.o_direct_reason
    # Nothing on the device: all of it is free for a raw region.
    assert info.free_bytes == info.total_bytes == 16 * 1024**2
    assert info.dio_offset_align == 4096
