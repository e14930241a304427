"""Hardware probing, profiles and overrides: pure parsers on fixtures, real probes on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memascend_cli import hardware
from memascend_cli.errors import BadInput, PresetNotFound
from memascend_cli.hardware import (
    Inventory,
    apply_overrides,
    inventory_to_spec,
    io_backends,
    list_hardware_profiles,
    load_hardware_profile,
    parse_meminfo,
    parse_nvidia_smi_csv,
    probe,
    probe_gpus,
    resolve_hardware,
)
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.ssd.path import PathInfo
from memascend_cli.units import GiB

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "hardware"
REPO = Path(__file__).resolve().parents[2]
PROFILE_FILES = sorted((REPO / "presets" / "hardware").glob("*.yaml"))


# Pure parsers.

def test_parse_meminfo_kib_to_bytes_and_counts():
    info = parse_meminfo((ASSETS / "meminfo_cpu24g.txt").read_text())
    assert info["MemTotal"] == 24684096 * 1024
    assert info["MemAvailable"] == 22853032 * 1024
    assert info["SwapTotal"] == 0
    assert info["Hugepagesize"] == 2048 * 1024
    # HugePages_* have no unit: they are page counts, not sizes.
    assert info["HugePages_Total"] == 0


def test_parse_meminfo_skips_malformed_lines():
    assert parse_meminfo("MemTotal: 1024 kB\ngarbage\nFoo: bar kB\nHugePages_Total:  16\n") == {
        "MemTotal": 1024 * 1024,
        "HugePages_Total": 16,
    }


def test_parse_nvidia_smi_csv_mib_to_gib():
    text = "0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100 80GB HBM3, 81559\n"
    gpus = parse_nvidia_smi_csv(text)
    assert gpus == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.65},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.65},
    ]
    assert parse_nvidia_smi_csv("No devices were found\n") == []


def test_thp_mode_and_capability_helpers():
    assert hardware._thp_mode("always [madvise] never\n") == "madvise"
    assert hardware._thp_mode(None) is None
    status = "Name:\tpython\nCapEff:\t0000000000004000\n"
    assert hardware._has_capability(status, 14)
    assert not hardware._has_capability("CapEff:\t0000000000000000\n", 14)


# O_DIRECT and path probes (real I/O on this machine).

def test_io_backends_shape():
    backends = io_backends()
    assert set(backends) == {"io_uring", "libaio"}
    for status in backends.values():
        assert isinstance(status["available"], bool)
        assert isinstance(status["reason"], str) and status["reason"]
        assert isinstance(status["dev_header"], bool)


def test_io_uring_agrees_with_sysctl():
    try:
        disabled = int(Path("/proc/sys/kernel/io_uring_disabled").read_text())
    except (OSError, ValueError):
        pytest.skip("kernel has no kernel.io_uring_disabled sysctl (before 6.6)")
    if disabled == 2:
        assert io_backends()["io_uring"]["available"] is False


def test_probe_gpus_falls_back_to_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '0, NVIDIA GeForce RTX 4090, 24564'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(hardware, "_probe_gpus_nvml", lambda: None)
    assert probe_gpus() == [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "memory_gib": 23.99}]


def test_probe_gpus_none_without_nvml_or_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(hardware, "_probe_gpus_nvml", lambda: None)
    assert probe_gpus() == []


def test_probe_local_machine(tmp_path):
    inv = probe(str(tmp_path))
    assert inv.dram_total_gib > 0 and 0 <= inv.dram_available_gib <= inv.dram_total_gib
    assert inv.cpu_cores >= 1
    assert inv.hugepage_size_kib >= 0 and inv.hugepages_total >= 0
    assert isinstance(inv.path, PathInfo) and inv.path.exists
    # JSON-serialisable as `inspect --json` prints it.
    json.dumps(inv.to_dict())


def test_probe_does_not_import_torch():
    code = (
        "import sys; from memascend_cli.hardware import probe; probe('.'); "
        "bad = [m for m in ('torch', 'deepspeed', 'memascend_engine') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


# Inventory -> HardwareSpec.

def _inventory(**changes) -> Inventory:
    base = dict(
        dram_total_gib=128.0, dram_available_gib=120.0, swap_total_gib=8.0,
        memlock_soft_bytes=8 * 1024**2, memlock_hard_bytes=8 * 1024**2, is_root=False, cap_ipc_lock=False,
        hugepages_total=0, hugepage_size_kib=2048, thp_mode="madvise", cpu_cores=32, cpu_model="test CPU",
        gpus=[], block_devices=[], path=None, io_backends={}, kernel="6.8.0",
    )
    base.update(changes)
    return Inventory(**base)


def test_inventory_to_spec_cpu_only():
    spec = inventory_to_spec(_inventory())
    assert spec.name == "local" and spec.source == "probe"
    assert spec.dram_gib == 128.0 and spec.dram_available_gib == 120.0 and spec.swap_gib == 8.0
    assert spec.num_gpus == 0 and spec.gpu_mem_gib == 0.0 and spec.gpu_name is None
    assert spec.memlock_limit_gib == pytest.approx(8 / 1024)
    assert spec.can_lock_unlimited is False
    assert spec.nvme_path is None and spec.nvme_free_gib is None


def test_inventory_to_spec_mixed_gpus_uses_smallest_and_path():
    gpus = [
        {"index": 0, "name": "NVIDIA GeForce RTX 4090", "memory_gib": 23.99},
        {"index": 1, "name": "NVIDIA GeForce RTX 3090", "memory_gib": 24.0},
    ]
    path = PathInfo(
        path="/mnt/nvme/ms", exists=True, fstype="xfs", free_bytes=500 * GiB, total_bytes=1000 * GiB,
        o_direct_ok=True, o_direct_reason="ok", dio_mem_align=512, dio_offset_align=512,
        is_block_device=False, device="/dev/nvme0n1",
    )
    spec = inventory_to_spec(_inventory(gpus=gpus, path=path, memlock_soft_bytes=None, cap_ipc_lock=True))
    assert spec.num_gpus == 2 and spec.gpu_mem_gib == 23.99 and spec.gpu_name == "NVIDIA GeForce RTX 4090"
    assert spec.memlock_limit_gib is None and spec.can_lock_unlimited
    assert spec.nvme_path == "/mnt/nvme/ms" and spec.nvme_free_gib == 500.0


# Profiles.

def test_profile_list_matches_files():
    assert list_hardware_profiles() == [p.stem for p in PROFILE_FILES]
    for required in ("rtx4090-128g", "a100-80g-256g", "h100-80g-512g", "2x-rtx3090-64g", "cpu-24g"):
        assert required in list_hardware_profiles()


@pytest.mark.parametrize("profile_file", PROFILE_FILES, ids=[p.stem for p in PROFILE_FILES])
def test_every_profile_loads_and_cites_sources(profile_file):
    spec = load_hardware_profile(profile_file.stem)
    assert isinstance(spec, HardwareSpec)
    assert spec.name == profile_file.stem
    assert spec.dram_gib > 0 and spec.num_nodes >= 1 and spec.cpu_cores >= 1
    assert (spec.num_gpus == 0) == (spec.gpu_mem_gib == 0)
    assert spec.source.startswith("profile ")
    lines = profile_file.read_text().splitlines()
    first_key = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    header = "\n".join(lines[:first_key])
    assert lines[0].startswith(f"# {profile_file.stem}:")
    assert "Source" in header and "memascend plan" in header
    # Same spec through the path form.
    assert load_hardware_profile(str(profile_file)) == spec


def test_profile_numbers_are_floats_where_the_field_is():
    spec = load_hardware_profile("rtx4090-128g")
    assert isinstance(spec.dram_gib, float) and isinstance(spec.num_gpus, int)
    assert spec.num_gpus == 1 and spec.gpu_mem_gib == pytest.approx(24, abs=0.1)
    assert spec.nvme_read_gbps == pytest.approx(7.45)


def test_profile_unknown_key_names_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("dram_gib: 64\nvram_gib: 24\n")
    with pytest.raises(BadInput) as exc:
        load_hardware_profile(str(bad))
    assert str(bad) in exc.value.message and "vram_gib" in exc.value.message
    assert "dram_gib" in exc.value.hint


def test_profile_wrong_types_and_missing_required(tmp_path):
    bad = tmp_path / "types.yaml"
    bad.write_text("dram_gib: lots\nnum_gpus: 1.5\ncan_lock_unlimited: maybe\n")
    with pytest.raises(BadInput) as exc:
        load_hardware_profile(str(bad))
    for key in ("dram_gib", "num_gpus", "can_lock_unlimited"):
        assert key in exc.value.message
    zero = tmp_path / "zero.yaml"
    zero.write_text("dram_gib: 0\n")
    with pytest.raises(BadInput, match="dram_gib must be positive"):
        load_hardware_profile(str(zero))
    missing = tmp_path / "missing.yaml"
    missing.write_text("num_gpus: 0\n")
    with pytest.raises(BadInput, match="dram_gib is required"):
        load_hardware_profile(str(missing))


def test_profile_unknown_name_suggests():
    with pytest.raises(PresetNotFound) as exc:
        load_hardware_profile("rtx4090-128")
    assert "rtx4090-128" in exc.value.message
    assert "did you mean rtx4090-128g" in exc.value.hint and "cpu-24g" in exc.value.hint
    assert exc.value.exit_code == 2


def test_profile_missing_file():
    with pytest.raises(PresetNotFound):
        load_hardware_profile("/nonexistent/box.yaml")


# Overrides.

@pytest.fixture
def cpu_spec() -> HardwareSpec:
    return load_hardware_profile("cpu-24g")


def test_overrides_parse_units(cpu_spec):
    spec = apply_overrides(
        cpu_spec, dram="128GiB", gpu_mem="24GiB", gpus=2, nodes=1, nvme_free="2TB",
        nvme_read_gbps="6.5", nvme_write_gbps="3500MB/s",
    )
    assert spec.dram_gib == 128.0 and spec.dram_available_gib is None
    assert spec.gpu_mem_gib == 24.0 and spec.num_gpus == 2 and spec.num_nodes == 1
    assert spec.nvme_free_gib == pytest.approx(2e12 / GiB)
    assert spec.nvme_read_gbps == 6.5 and spec.nvme_write_gbps == 3.5
    assert "--dram 128GiB" in spec.source and spec.source.startswith("profile ")
    assert spec.name == cpu_spec.name


def test_overrides_none_returns_spec_unchanged(cpu_spec):
    assert apply_overrides(cpu_spec) is cpu_spec


@pytest.mark.parametrize("value", ["128", "-5GiB", "lots", "0GiB"])
def test_overrides_reject_bad_sizes(cpu_spec, value):
    with pytest.raises(BadInput) as exc:
        apply_overrides(cpu_spec, dram=value)
    assert "--dram" in exc.value.message


def test_overrides_memlock(cpu_spec):
    unlimited = apply_overrides(cpu_spec, memlock="unlimited")
    assert unlimited.memlock_limit_gib is None and unlimited.can_lock_unlimited
    limited = apply_overrides(cpu_spec, memlock="64MiB")
    assert limited.memlock_limit_gib == pytest.approx(1 / 16) and limited.can_lock_unlimited is False


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"gpus": 2}, "--gpu-mem"),  # cpu-24g has no GPU memory to assume
        ({"gpu_mem": "24GiB"}, "--gpus"),
        ({"gpus": -1}, "--gpus"),
        ({"nodes": 0}, "--nodes"),
        ({"nvme_read_gbps": "fast"}, "--nvme-read-gbps"),
        ({"nvme_free": "-1TB"}, "--nvme-free"),
    ],
)
def test_overrides_inconsistent_or_invalid(cpu_spec, kwargs, flag):
    with pytest.raises(BadInput) as exc:
        apply_overrides(cpu_spec, **kwargs)
    assert flag in exc.value.message + (exc.value.hint or "")


def test_resolve_hardware_profile_then_overrides():
    spec = resolve_hardware("cpu-24g", "/not/probed/with/a/profile", dram="32GiB")
    assert spec.name == "cpu-24g" and spec.dram_gib == 32.0 and spec.nvme_path == "/not/probed/with/a/profile"


def test_resolve_hardware_local_probe(tmp_path):
    spec = resolve_hardware(None, str(tmp_path), nvme_read_gbps="1.5")
    assert spec.name == "local" and spec.nvme_path == str(tmp_path)
    assert spec.nvme_free_gib > 0 and spec.nvme_read_gbps == 1.5


def test_resolve_hardware_missing_path():
    with pytest.raises(BadInput) as exc:
        resolve_hardware(None, "/nonexistent/memascend")
    assert "--nvme-path" in exc.value.message and "mkdir -p" in exc.value.hint


def test_a_dram_cap_is_all_the_jobs():
    """Under a cap the plan gets the whole cap: its runtime item already counts the libraries a rank maps."""
    box = HardwareSpec(name="box", dram_gib=24, dram_available_gib=20, cpu_cores=2)
    assert box.usable_dram_gib < 24  # the OS's reserve
    capped = box.under_dram_cap(8 * GiB)
    assert capped.usable_dram_gib == 8 and capped.dram_available_gib is None and capped.cpu_cores == 2


def test_a_dram_cap_above_what_the_node_has_changes_nothing_but_says_so():
    box = HardwareSpec(name="box", dram_gib=24, dram_available_gib=20, cpu_cores=2)
    same = box.under_dram_cap(30 * GiB)
    assert same.usable_dram_gib == box.usable_dram_gib and "is not below" in same.source
    assert "under --dram-cap 8.00 GiB" in box.under_dram_cap(8 * GiB).source
