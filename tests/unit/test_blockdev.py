"""Block device enumeration: lsblk/mountinfo parsing on fixtures, then the real probes on this machine."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from memascend_cli.ssd import blockdev
from memascend_cli.ssd.blockdev import (
    device_for_path,
    find_block_device,
    list_block_devices,
    mount_for_path,
    parse_lsblk_json,
    parse_mountinfo,
)

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "hardware"


@pytest.fixture(scope="module")
def workstation():
    devices = parse_lsblk_json((ASSETS / "lsblk_workstation.json").read_text())
    return {d.name: d for d in devices}


def test_parse_flattens_tree_parents_first(workstation):
    names = list(workstation)
    assert names.index("nvme0n1") < names.index("nvme0n1p3") < names.index("vg0-swapdata")
    assert set(names) == {
        "loop0", "sda", "sda1", "md0", "sdb", "sdb1", "nvme0n1", "nvme0n1p1", "nvme0n1p2", "nvme0n1p3",
        "vg0-swapdata", "nvme1n1", "vda", "vda1", "sr0",
    }


def test_parse_nvme_disk_and_partitions(workstation):
    disk = workstation["nvme0n1"]
    assert disk.type == "disk" and disk.is_nvme and disk.transport == "nvme" and not disk.rotational
    assert disk.size_bytes == 2000398934016
    assert disk.model == "Samsung SSD 990 PRO 2TB"
    assert disk.parent is None
    assert disk.children == ["nvme0n1p1", "nvme0n1p2", "nvme0n1p3"]
    # Partitions are not holders: the disk itself is not "in use by" a stacked device.
    assert disk.holders == []

    root = workstation["nvme0n1p2"]
    assert root.type == "part" and root.parent == "nvme0n1"
    # lsblk reports transport and model only for the disk; partitions inherit them.
    assert root.is_nvme and root.transport == "nvme" and root.model == "Samsung SSD 990 PRO 2TB"
    assert root.mountpoints == ["/", "/var/snap/bind"]
    assert root.fstype == "ext4"
    assert root.path == "/dev/nvme0n1p2"
    assert root.maj_min == "259:2"


def test_parse_lvm_on_nvme_is_nvme_and_holds_partition(workstation):
    lv = workstation["vg0-swapdata"]
    assert lv.type == "lvm" and lv.kname == "dm-0" and lv.path == "/dev/mapper/vg0-swapdata"
    assert lv.parent == "nvme0n1p3" and lv.is_nvme
    assert lv.mountpoints == ["/mnt/swap data"]
    assert workstation["nvme0n1p3"].holders == ["vg0-swapdata"]


def test_parse_4kn_nvme_block_sizes(workstation):
    data = workstation["nvme1n1"]
    assert (data.logical_block_bytes, data.physical_block_bytes) == (4096, 4096)
    assert data.fstype == "xfs" and data.mountpoints == ["/mnt/nvme"]


def test_parse_raid_member_listed_once_with_both_parents_linked(workstation):
    md = workstation["md0"]
    assert md.type == "raid1" and md.parent == "sda1" and not md.is_nvme
    assert workstation["sda1"].children == ["md0"] and workstation["sdb1"].children == ["md0"]
    assert workstation["sda1"].holders == ["md0"] and workstation["sdb1"].holders == ["md0"]
    assert workstation["sda1"].transport == "sata"


def test_parse_loop_virtio_and_rom(workstation):
    loop = workstation["loop0"]
    assert loop.type == "loop" and loop.size_bytes == 268435456 and loop.mountpoints == [] and not loop.is_nvme
    vda = workstation["vda"]
    assert vda.rotational and vda.transport is None and vda.model is None and not vda.is_nvme
    assert (vda.logical_block_bytes, vda.physical_block_bytes) == (512, 4096)
    assert workstation["vda1"].mountpoints == ["/data"]
    assert workstation["sr0"].read_only and workstation["sr0"].type == "rom"


def test_parse_old_lsblk_strings_and_single_mountpoint():
    devices = {d.name: d for d in parse_lsblk_json((ASSETS / "lsblk_old.json").read_text())}
    vda = devices["vda"]
    assert vda.size_bytes == 274877906944 and vda.rotational and not vda.read_only
    assert vda.path == "/dev/vda"  # no PATH column before util-linux 2.33
    assert vda.physical_block_bytes == 4096
    assert devices["vda1"].mountpoints == ["/"] and devices["vda1"].parent == "vda"
    nvme = devices["nvme0n1"]
    assert nvme.is_nvme and not nvme.rotational and nvme.mountpoints == ["/mnt/nvme"]


def test_parse_without_block_size_columns_defaults_to_512():
    text = '{"blockdevices": [{"name": "sdz", "type": "disk", "size": 1048576, "rota": false}]}'
    (dev,) = parse_lsblk_json(text)
    assert (dev.logical_block_bytes, dev.physical_block_bytes) == (512, 512)
    assert dev.mountpoints == [] and dev.kname == "sdz"


def test_to_dict_has_contract_keys(workstation):
    d = workstation["nvme0n1p2"].to_dict()
    for key in ("name", "path", "type", "size_bytes", "model", "serial", "rotational", "transport", "is_nvme",
                "logical_block_bytes", "physical_block_bytes", "mountpoints", "fstype", "parent", "children",
                "holders", "read_only"):
        assert key in d


@pytest.fixture(scope="module")
def mounts():
    return parse_mountinfo((ASSETS / "mountinfo_stacked.txt").read_text())


def test_parse_mountinfo_fields_and_escapes(mounts):
    by_mp = {m.mountpoint: m for m in mounts}
    assert by_mp["/"].fstype == "ext4" and by_mp["/"].source == "/dev/vda" and by_mp["/"].maj_min == "254:0"
    # Optional fields (shared:8 master:2) sit before the separator and must not shift the rest.
    swap = by_mp["/mnt/swap data"]
    assert swap.fstype == "xfs" and swap.source == "/dev/mapper/vg0-swapdata" and swap.maj_min == "253:0"
    assert "noatime" in swap.options


@pytest.mark.parametrize(
    ("path", "mountpoint", "fstype"),
    [
        ("/dev/shm/x", "/dev/shm", "tmpfs"),
        ("/mnt/nvme/memascend/swap", "/mnt/nvme", "xfs"),
        ("/mnt/nvme", "/mnt/nvme", "xfs"),
        ("/mnt/nvme2/data", "/", "ext4"),  # a prefix of the name, not of the path
        ("/mnt/swap data/x", "/mnt/swap data", "xfs"),
        ("/home/user", "/", "ext4"),
    ],
)
def test_mount_for_path_longest_prefix(mounts, path, mountpoint, fstype):
    entry = mount_for_path(path, mounts)
    assert (entry.mountpoint, entry.fstype) == (mountpoint, fstype)


def test_mount_for_path_stacked_mount_last_wins(mounts):
    assert mount_for_path("/dev/shm/a", mounts).source == "shm"


# Real probes on this machine.

needs_sysfs = pytest.mark.skipif(
    not os.path.isdir("/sys/block"), reason="no /sys/block (not Linux, or sysfs not mounted)"
)


@needs_sysfs
def test_list_block_devices_matches_sysfs():
    devices = list_block_devices()
    assert devices, "a Linux machine has at least one block device"
    for dev in devices:
        queue = Path("/sys/block") / (dev.kname or dev.name) / "queue"
        if queue.is_dir():
            assert dev.logical_block_bytes == int((queue / "logical_block_size").read_text())
            assert dev.physical_block_bytes == int((queue / "physical_block_size").read_text())
            assert dev.rotational == ((queue / "rotational").read_text().strip() == "1")


@needs_sysfs
def test_sysfs_fallback_agrees_with_lsblk(monkeypatch):
    with_lsblk = {(d.name, d.type, d.size_bytes, d.logical_block_bytes, d.rotational) for d in list_block_devices()}
    monkeypatch.setattr(blockdev, "_run_lsblk", lambda: None)
    sysfs_only = {(d.name, d.type, d.size_bytes, d.logical_block_bytes, d.rotational) for d in list_block_devices()}
    assert sysfs_only == with_lsblk


def _first_device_node() -> blockdev.BlockDevice:
    for dev in list_block_devices():
        if os.path.exists(dev.path) and stat.S_ISBLK(os.stat(dev.path).st_mode):
            return dev
    pytest.skip("no block device node under /dev that matches the device list")


@needs_sysfs
def test_find_block_device_by_path_and_symlink(tmp_path):
    dev = _first_device_node()
    assert find_block_device(dev.path).name == dev.name
    link = tmp_path / "dev-link"
    link.symlink_to(dev.path)
    assert find_block_device(str(link)).name == dev.name


def test_find_block_device_rejects_files_and_missing_paths(tmp_path):
    regular = tmp_path / "file"
    regular.write_bytes(b"x")
    assert find_block_device(str(regular)) is None
    assert find_block_device(str(tmp_path / "missing")) is None


@needs_sysfs
def test_device_for_path_matches_st_dev(tmp_path):
    st_dev = os.stat(tmp_path).st_dev
    if os.major(st_dev) == 0:
        pytest.skip(f"{tmp_path} is on a filesystem without a block device (major 0)")
    dev = device_for_path(str(tmp_path))
    assert dev is not None
    assert dev.maj_min == f"{os.major(st_dev)}:{os.minor(st_dev)}"


def test_device_for_path_tmpfs_is_none():
    if not os.path.isdir("/dev/shm") or os.major(os.stat("/dev/shm").st_dev) != 0:
        pytest.skip("/dev/shm is absent or not an anonymous (tmpfs) mount here")
    assert device_for_path("/dev/shm") is None
