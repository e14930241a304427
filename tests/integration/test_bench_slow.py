"""Live `memascend bench` from an installed wheel, outside the checkout: a real tiny stock vs tuned vs memascend
DeepSpeed run (params + optimizer on NVMe), 2 steps each, in child processes, with the meminfo sampler, wait4, the
planner prediction and every output file."""

import json
import os
import subprocess
import sys
import sysconfig

import pytest

from memascend_cli.bench import document
from tests.conftest import require_async_io

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wheel_venv(tmp_path) -> str:
    """A venv with memascend installed from a freshly built wheel (not editable), the rest of the environment
    (torch, DeepSpeed) reached through a .pth file; returns its python."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), REPO], check=True,
                   timeout=900)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "zz_outer.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    (whl,) = list(wheels.glob("memascend-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, str(whl)], check=True,
                   timeout=600)
    return py


@pytest.mark.slow
@pytest.mark.serial  # its peaks are machine-wide (MemTotal - MemAvailable): the other worker's jobs move them
@pytest.mark.long  # 133 s alone, building the wheel and its native core; the default run benches every engine from the
# checkout (tests/integration/test_dram_cap.py, test_op_lock_leftovers.py) and checks the document's parts in tests/cli
def test_tiny_bench_from_an_installed_wheel(tmp_path):
    require_async_io()
    py = wheel_venv(tmp_path)
    out = tmp_path / "bench"
    work = tmp_path / "elsewhere"
    work.mkdir()
    # The swap directory is under tmp_path: on this machine a real ext4 file system (tmpfs is refused).
    cmd = [py, "-m", "memascend_cli", "bench", "--model", "tiny-llama", "--seq-len", "64", "--steps", "2",
           "--runs", "stock,tuned,memascend", "--settle-cap", "30", "--out", str(out), "--json"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["DS_ACCELERATOR"] = "cpu"
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=1800, env=env, cwd=str(work))
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    where = subprocess.run([py, "-c", "import memascend_engine, memascend_cli; print(memascend_engine.__file__, "
                            "memascend_cli.__file__)"], capture_output=True, text=True, cwd=str(work)).stdout
    assert REPO not in where and str(tmp_path / "venv") in where
    doc = json.loads(r.stdout)
    assert doc == json.loads((out / "bench.json").read_text())
    assert [x["name"] for x in doc["runs"]] == ["stock", "tuned", "memascend"]
    for run in doc["runs"]:
        assert run["ok"], run["error"]
        # /dev/shm was checked around the run: nothing of it is left (DeepSpeed's allreduce segments are swept); the
        # live segments of jobs beside it (the test suite's other worker) are not the run's.
        shm = run["shm"]
        assert shm["left_by_run"] == [] and shm["after_bytes"] >= 0
        if run["name"] == "memascend":
            continue  # region I/O instead of swap files: checked below
        assert len(run["losses"]) == 2 and run["seconds_per_step"] > 0 and run["tokens_per_s"] > 0
        assert run["peak_system_bytes"] > 0 and run["ru_maxrss_bytes"] > 100 * 2**20
        assert run["max_tree_rss_bytes"] > 0
        # tiny-llama's partitions are >= 1 MiB, so parameters and optimizer states really hit the disk.
        assert run["swap_bytes_on_disk"] > 0 and run["ssd_written_bytes"] > 0
        assert run["sampling"]["samples"] > 100 and "timeline" not in run
        assert run["predicted"]["node_host_peak_bytes"] > 0 and run["prediction_error_percent"] is not None
        assert run["settle"]["waited_s"] >= 6.0
    stock, tuned, mem = doc["runs"]
    assert tuned["env"].get("DS_PIN_MEMORY_BACKEND") == "native" and "DS_PIN_MEMORY_BACKEND" not in stock["env"]
    assert tuned["config"] == mem["config"]
    (stats,) = mem["engine_stats"]
    assert stats["config_changes"] == {} and stats["swap_files_created"] == 0 and stats["bytes_written"] > 0
    assert mem["losses"] == tuned["losses"]
    # Every engine starts from the same weights with the same kernels (equal knobs: run/cpu_env.py for all three).
    assert stock["determinism"] == tuned["determinism"] | {"param_digest_s": stock["determinism"]["param_digest_s"]}
    assert mem["determinism"] == tuned["determinism"] | {"param_digest_s": mem["determinism"]["param_digest_s"]}
    # Same seed, same data: the first loss agrees (max_in_cpu 0 and small sub-groups change summation order only).
    assert tuned["losses"][0] == pytest.approx(stock["losses"][0], rel=1e-3)
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    # Every run's memory timeline is in the side file the summary names, not in the summary.
    assert doc["timeline_file"] == "bench.timeline.json.gz"
    assert {t["run"] for t in document.read_timelines(str(out / "bench.json")) if t["points"]} == {
        "stock", "tuned", "memascend"}
    assert not (out / "swap").exists() or not any((out / "swap").iterdir())
    assert not list(out.glob("**/bench.region"))  # the bench removed the region it made


@pytest.mark.slow
@pytest.mark.long  # which repeat stands for the run: tests/unit/test_bench_repeats.py in the default run
def test_repeated_runs_report_the_median_and_keep_every_repeat(tmp_path):
    require_async_io()
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "memascend_cli", "bench", "--model", "tiny-llama", "--seq-len", "32", "--steps", "1",
           "--runs", "tuned", "--repeat", "2", "--settle-cap", "20", "--out", str(out), "--json"]
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=1200, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    (run,) = json.loads(r.stdout)["runs"]
    first, second = run["repeats"]
    # Two real runs, each with its own logs; the run reports the lower middle of the two peaks.
    assert first["log_path"] != second["log_path"] and all(os.path.exists(x["log_path"]) for x in (first, second))
    assert "repeat1" in first["log_path"] and "repeat2" in second["log_path"]
    assert run["peak_system_bytes"] == min(first["peak_system_bytes"], second["peak_system_bytes"])
    assert run["log_path"] in (first["log_path"], second["log_path"]) and first["ok"] and second["ok"]
