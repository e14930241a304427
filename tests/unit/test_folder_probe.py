"""ssd.folder_probe: the SSD rate of the folder a run would use, measured once per device (real O_DIRECT on the
test machine's file system) and cached; refused on file systems that are not an SSD's."""

import json
import os
import subprocess

import pytest

from memascend_cli.ssd import folder_probe as fp


@pytest.fixture
def dio_dir(tmp_path, monkeypatch):
    """tmp_path where it is on an SSD's kind of file system (ext4, xfs), which the probe is for; a private cache."""
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip()
    if kind in ("tmpfs", "overlayfs", "overlay"):
        pytest.skip(f"tmp_path is on {kind}: the probe is for the SSD's file system (ext4, xfs)")
    monkeypatch.setenv("MEMASCEND_CACHE", str(tmp_path / "cache"))
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


def test_measures_once_per_device_and_leaves_nothing_behind(dio_dir):
    calls = []
    found = fp.folder_rates(str(dio_dir), on_probe=lambda: calls.append(1))
    assert found["read_gbps"] > 0 and found["write_gbps"] > 0, found
    assert found["probe_bytes"] == fp.PROBE_BYTES and found["queue_depth"] == fp.QUEUE_DEPTH
    assert os.listdir(dio_dir) == [] and calls == [1]
    # Another folder of the same file system: the cached rate, no second measurement.
    (dio_dir / "other").mkdir()
    assert fp.folder_rates(str(dio_dir / "other"), on_probe=lambda: calls.append(2)) == found and calls == [1]
    cached = os.listdir(dio_dir.parent / "cache" / "probe")
    assert len(cached) == 1 and json.load(open(dio_dir.parent / "cache" / "probe" / cached[0])) == found


def test_tmpfs_is_not_an_ssd(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMASCEND_CACHE", str(tmp_path / "cache"))
    if subprocess.run(["stat", "-f", "-c", "%T", "/dev/shm"], capture_output=True, text=True).stdout.strip() \
            != "tmpfs":
        pytest.skip("/dev/shm is not a tmpfs here")
    found = fp.folder_rates("/dev/shm")
    assert set(found) == {"error"} and "/dev/shm" in found["error"]
    assert not (tmp_path / "cache" / "probe").exists()  # a refusal is not cached


def test_a_missing_folder_is_an_error():
    assert "error" in fp.folder_rates("/nonexistent/memascend")
