"""`memascend prepare-ssd A B [C]` on region files (no root): one region striped across them, its dry run, its
refusals, and `--info` naming each member's state. Loop devices and faults: tests/integration/test_striped_region.py."""

from __future__ import annotations

import json
import os

import pytest

from memascend_cli.ssd import region
from tests.cli.test_prepare_ssd_cli import _fstype, run

MiB = 1024**2


@pytest.fixture
def folder(tmp_path):
    fstype = _fstype(str(tmp_path))
    if fstype in ("tmpfs", "ramfs", "overlay"):
        pytest.skip(f"tmp_path is on {fstype}, where O_DIRECT is refused or unenforced")
    return tmp_path


def test_dry_run_lists_every_member_and_touches_nothing(folder):
    paths = [str(folder / f"m{i}.bin") for i in range(3)]
    r = run("prepare-ssd", *paths, "--size", "64MiB", "--dry-run", "--json", "--probe-mib", "8")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert [(a["op"], a.get("target")) for a in d["actions"] if a["op"] in ("write-header", "probe")] == (
        [("write-header", p) for p in paths] + [("probe", p) for p in paths] + [("write-header", p) for p in paths])
    h = d["header"]
    assert h["format_version"] == 3 and [m["path"] for m in h["members"]] == paths
    # Three members of 64 MiB: 63 one-MiB stripes each past the 1 MiB header area.
    assert h["capacity_bytes"] == MiB + 3 * 63 * MiB
    assert not any(os.path.exists(p) for p in paths)


def test_striped_files_are_made_each_with_its_header_copy(folder):
    paths = [str(folder / f"m{i}.bin") for i in range(2)]
    r = run("prepare-ssd", *paths, "--size", "32MiB", "--no-probe", "--yes", "--label", "two")
    assert r.exit_code == 0, r.stderr
    assert "striped across 2 targets" in r.stderr
    headers = [region.read_header(p) for p in paths]
    assert [h.member_index for h in headers] == [0, 1] and headers[0].uuid == headers[1].uuid
    assert [os.path.getsize(p) for p in paths] == [32 * MiB] * 2
    r = run("prepare-ssd", "--info", paths[0], "--json")
    assert r.exit_code == 0, r.stderr
    assert [(m["member"], m["path"], m["state"]) for m in json.loads(r.stdout)["members"]] == [
        (1, paths[0], "ok"), (2, paths[1], "ok")]
    os.truncate(paths[1], 16 * MiB)
    r = run("prepare-ssd", "--info", paths[0])
    assert r.exit_code == 0 and "(resized)" in r.stdout.replace("\n", " ")


@pytest.mark.parametrize("args, message", [
    (["--info", "A", "B"], "error: --info takes one TARGET, got 2"),
    (["--wipe", "A", "B"], "error: --wipe takes one TARGET, got 2"),
    (["A", "A", "--size", "8MiB"], "given twice"),
    ([f"T{i}" for i in range(9)] + ["--size", "8MiB"], "error: 9 targets given, a region stripes over at most 8"),
    (["A", "B", "--size", "1MiB"], "error: the smallest target holds no 1048576 B stripe"),
])
def test_refusals_exit_2(folder, args, message):
    args = [str(folder / a) if a.isalnum() and a[0] in "ABT" else a for a in args]
    r = run("prepare-ssd", *args, "--no-probe", "--yes")
    assert r.exit_code == 2 and message in r.stderr, r.stderr


def test_wipe_removes_every_member(folder):
    paths = [str(folder / f"m{i}.bin") for i in range(3)]
    assert run("prepare-ssd", *paths, "--size", "16MiB", "--no-probe", "--yes").exit_code == 0
    r = run("prepare-ssd", "--wipe", paths[0], "--dry-run", "--json")
    assert [(a["op"], a.get("target")) for a in json.loads(r.stdout)["actions"]] == [
        ("unlink", None), ("unlink", paths[1]), ("unlink", paths[2])]
    r = run("prepare-ssd", "--wipe", paths[0], "--yes")
    assert r.exit_code == 0, r.stderr
    assert not any(os.path.exists(p) for p in paths)


def test_a_nodes_preflight_names_a_missing_member(folder):
    """Each node checks its own region before training starts (engine/cluster_preflight.py)."""
    from memascend_cli.run.node_preflight import assess_node, gather_node_facts

    paths = [str(folder / f"m{i}.bin") for i in range(2)]
    assert run("prepare-ssd", *paths, "--size", "16MiB", "--no-probe", "--yes").exit_code == 0
    assert assess_node(gather_node_facts(paths[0], 1)) is None
    os.unlink(paths[1])
    message, hint = assess_node(gather_node_facts(paths[0], 1))
    assert message.endswith(f"member 2 of 2, {paths[1]}, is missing") and "prepare-ssd" in hint


def test_bench_throttles_every_member_and_plans_with_their_sum(folder):
    """bench --ssd-bandwidth on a striped region: each member's device gets the limit, the time model their sum."""
    from memascend_cli.bench.sweep import region_members, timing
    from memascend_cli.planner.spec import HardwareSpec

    paths = [str(folder / f"m{i}.bin") for i in range(3)]
    assert run("prepare-ssd", *paths, "--size", "16MiB", "--no-probe", "--yes").exit_code == 0
    assert region_members(paths[0]) == paths[1:] and region_members(None) == []
    hw = HardwareSpec(name="local", dram_gib=24.0, num_gpus=0, gpu_mem_gib=0.0, cpu_cores=2)
    t = timing(hw, "fp32", 150.0, 400_000_000, None, 3)
    assert (t["read_gbps"], t["write_gbps"]) == (1.2, 1.2)
