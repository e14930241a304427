"""bench.sitting: the machine's rates recorded with a bench sitting (text pure; the disk probe on a real file
system)."""

import json
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


def test_text_compares_the_memory_bandwidth_with_the_cached_probe_where_the_cache_has_one():
    probe = {"fp32_gflops": 152.0, "cached_fp32_gflops": 181.2, "mem_triad_gbps": 9.3, "cached_mem_triad_gbps": 10.0}
    assert sitting_text(probe) == ("matmul 152 GFLOP/s fp32 (cached probe 181.2: -16%), memory 9.3 GB/s triad "
                                   "(cached probe 10: -7%)")
    del probe["cached_mem_triad_gbps"]  # a cache older than the memory probe
    assert sitting_text(probe) == "matmul 152 GFLOP/s fp32 (cached probe 181.2: -16%), memory 9.3 GB/s triad"


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


def test_the_sitting_records_the_cached_probe_s_rates_beside_its_own(dio_dir, monkeypatch, tmp_path):
    import io

    from rich.console import Console

    from memascend_cli import compute_probe
    from memascend_cli.bench import runner
    from memascend_cli.hardware import local_cpu_model

    monkeypatch.setenv("MEMASCEND_CACHE", str(tmp_path / "cache"))
    for k in compute_probe.KERNEL_ENV:
        monkeypatch.delenv(k, raising=False)
    os.makedirs(os.path.dirname(compute_probe.cache_path()))
    cached = {"fp32_gflops": 180.0, "threads": 2, "cpu_model": local_cpu_model(), "cpu_cores": 2,
              "probe_version": compute_probe.PROBE_VERSION, "kernel_env": {}}
    now = {"threads": 2, "fp32_gflops": 150.0, "fp32_n": 2048, "mem_triad_gbps": 9.0, "mem_triad_bytes": 12}
    monkeypatch.setattr(compute_probe, "run_probe", lambda timeout_s=60.0: dict(now))
    for cache_mem, want in ((None, None), (10.0, 10.0)):  # a cache from before the memory probe, then one with it
        with open(compute_probe.cache_path(), "w") as f:
            json.dump({**cached, **({"mem_triad_gbps": cache_mem} if cache_mem else {})}, f)
        probe = runner._sitting(str(dio_dir / "swap"), 2, Console(file=io.StringIO(), width=200))
        assert (probe["mem_triad_gbps"], probe["cached_fp32_gflops"]) == (9.0, 180.0)
        assert probe.get("cached_mem_triad_gbps") == want
