"""bench.sitting: the machine's rates recorded with a bench sitting (text pure; the disk probe on a real file
system)."""

import os
import subprocess

import pytest

from memascend_cli.bench.sitting import disk_probe, sitting_text
from memascend_cli.units import MiB


@pytest.fixture
def dio_dir(tmp_path):
    """tmp_path where it is on an SSD's kind of file system (ext4, xfs), which the probe is for."""
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip()
    if kind in ("tmpfs", "overlayfs", "overlay"):
        pytest.skip(f"tmp_path is on {kind}: the probe is for the SSD's file system (ext4, xfs)")
    return tmp_path


def test_text_compares_the_matmul_with_the_cached_probe_and_names_the_disk_probe():
    probe = {"fp32_gflops": 152.0, "cached_fp32_gflops": 181.2, "disk_write_gbps": 1.234, "disk_read_gbps": 0.98,
             "disk_request_bytes": 4 * MiB}
    assert sitting_text(probe) == ("matmul 152 GFLOP/s fp32 (cached probe 181.2: -16%), disk 1.23 / 0.98 GB/s write "
                                   "/ read (O_DIRECT, 4 MiB, one at a time)")


def test_text_without_a_cached_probe_or_a_disk():
    assert sitting_text({"fp32_gflops": 150.5, "disk_error": "no O_DIRECT"}) == (
        "matmul 150.5 GFLOP/s fp32, disk not measured (no O_DIRECT)")
    assert sitting_text(None) is None
    assert sitting_text({}) is None


def test_disk_probe_measures_o_direct_and_leaves_nothing_behind(dio_dir):
    out = disk_probe(str(dio_dir), size_bytes=8 * MiB, request_bytes=1 * MiB)
    assert out["write_gbps"] > 0 and out["read_gbps"] > 0, out
    assert os.listdir(dio_dir) == []


def test_disk_probe_reports_a_directory_it_cannot_use(tmp_path):
    out = disk_probe(str(tmp_path / "missing"))
    assert set(out) == {"error"} and "cannot create a probe file" in out["error"]


def test_the_bench_probes_a_swap_directory_a_capacity_search_removed(dio_dir, monkeypatch):
    import io

    from rich.console import Console

    from memascend_cli import compute_probe
    from memascend_cli.bench import runner

    monkeypatch.setattr(compute_probe, "run_probe", lambda timeout_s=60.0: None)  # the matmul: tested via inspect
    out = io.StringIO()
    probe = runner._sitting(str(dio_dir / "swap"), 2, Console(file=out, width=200))
    assert probe["disk_write_gbps"] > 0 and (dio_dir / "swap").is_dir()
    assert out.getvalue().startswith("this sitting: disk ")
