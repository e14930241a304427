"""The SSD bandwidth limit's pure parts: which device gets throttled, the values written to the cgroup and the
counters read back (fixtures: tests/assets/cgroup/README.md)."""

from __future__ import annotations

import json
import os

import pytest

from memascend_cli.run import cgroup as C
from memascend_cli.run import iolimit as IO

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "cgroup")


def text(name: str) -> str:
    with open(os.path.join(ASSETS, name), encoding="utf-8") as f:
        return f.read()


UEVENTS = json.loads(text("sys_class_block_uevents.json"))


@pytest.mark.parametrize("maj_min, expected", [
    ("254:0", ("254:0", "vda")),          # the CI machine's disk: itself
    ("259:2", ("259:0", "nvme0n1")),      # a partition: its disk (the kernel refuses a partition's MAJ:MIN)
    ("259:1", ("259:0", "nvme0n1")),
    ("7:3", ("7:3", "loop3")),            # a loop device has its own queue
    ("259:7", ("7:3", "loop3")),          # ... and a partition on it is the loop device's
    ("252:0", ("252:0", "dm-0")),         # dm: its own (bio-based) queue
    ("0:45", None),                       # btrfs / overlay anonymous device: no block device
])
def test_the_throttled_device_is_the_one_with_a_queue(maj_min, expected):
    assert IO.queue_device(maj_min, UEVENTS) == expected


def test_paths_on_one_device_share_one_limit():
    limits = IO.group_limits({"/var/tmp/out/swap": ("254:0", "vda"), "/var/tmp/out": ("254:0", "vda"),
                              "/dev/nvme0n1p2": ("259:0", "nvme0n1")}, 400_000_000)
    assert [(lim.maj_min, lim.device, lim.paths) for lim in limits] == [
        ("254:0", "vda", ("/var/tmp/out/swap", "/var/tmp/out")), ("259:0", "nvme0n1", ("/dev/nvme0n1p2",))]
    assert limits[0].to_dict()["read_bytes_per_s"] == limits[0].write_bytes_per_s == 400_000_000


def test_values_written_v1_one_device_per_write_v2_one_line_per_device():
    limits = IO.group_limits({"/a": ("254:0", "vda"), "/b": ("259:0", "nvme0n1")}, 400_000_000)
    assert IO.throttle_writes(1, limits) == [
        ("blkio.throttle.read_bps_device", "254:0 400000000"), ("blkio.throttle.write_bps_device", "254:0 400000000"),
        ("blkio.throttle.read_bps_device", "259:0 400000000"), ("blkio.throttle.write_bps_device", "259:0 400000000")]
    assert IO.throttle_writes(2, limits) == [("io.max", "254:0 rbps=400000000 wbps=400000000"),
                                             ("io.max", "259:0 rbps=400000000 wbps=400000000")]


def test_counters_read_back():
    assert IO.io_stat_file(1) == "blkio.throttle.io_service_bytes" and IO.io_stat_file(2) == "io.stat"
    assert IO.io_bytes(1, text("v1_blkio_io_service_bytes")) == {"254:0": (41947136, 41943040)}
    assert IO.io_bytes(2, text("v2_io.stat")) == {"254:0": (41943040, 41943040), "259:0": (0, 4096)}
    assert IO.io_bytes(1, "") == {} and IO.parse_uevent("A=1\nB=x=y\nbad\n") == {"A": "1", "B": "x=y"}


def test_the_io_controller_is_found_like_the_memory_one():
    # This machine: v1 `blkio` beside `memory`, an empty unified hierarchy.
    h = C.detect(text("mountinfo_v1.txt"), text("proc_cgroup_v1.txt"), "", "io")
    assert (h.version, h.mount_point) == (1, "/sys/fs/cgroup/blkio")
    # A v2 host with io delegated: one cgroup there holds both controllers.
    v2 = C.detect(text("mountinfo_v2.txt"), text("proc_cgroup_v2.txt"), "cpu io memory pids", "io")
    assert v2 == C.detect(text("mountinfo_v2.txt"), text("proc_cgroup_v2.txt"), "cpu io memory pids")
    with pytest.raises(C.CapUnavailable) as e:
        C.detect(text("mountinfo_v2.txt"), text("proc_cgroup_v2.txt"), "cpu memory pids", "io")
    assert "no io cgroup controller" in e.value.message and "--ssd-bandwidth" in e.value.hint
    assert e.value.exit_code == 2
