"""`--dram-cap` for real, as root: a memory cgroup on this machine (v1 here and on CI, v2 where the unified hierarchy
has the memory controller), a child allocating past it OOM-killed and reported, the cgroup gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from memascend_cli.run import cgroup
from tests.conftest import require_memory_cgroups

pytestmark = pytest.mark.root

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")
MiB = 1024**2
# Allocates `n` MiB in 10 MiB pieces (touched: bytearray zero-fills), then says so.
ALLOCATE = "import sys\nb = [bytearray(10 << 20) for _ in range(int(sys.argv[1]) // 10)]\nprint('allocated')"


@pytest.fixture(autouse=True)
def _root_and_cgroups():
    require_memory_cgroups()


def ours(pid: int | None = None, controller: str = "memory") -> list[str]:
    """The cgroups of `controller` process `pid` (default: this one) made and left behind."""
    parent = cgroup.check_available(controller)
    pid = os.getpid() if pid is None else pid
    return [n for n in os.listdir(parent) if n.startswith(cgroup.NAME_PREFIX) and cgroup.stale_owner(n) == pid]


def capped_python(cap_bytes: int, mib: int):
    with cgroup.MemoryCap(cap_bytes, label="test") as cap:
        assert os.path.isdir(cap.path)
        p = subprocess.run([sys.executable, "-c", ALLOCATE, str(mib)], preexec_fn=cap.join, capture_output=True,
                           text=True)
        result = cap.result(sigkilled=p.returncode == -9)
    return p, result


def test_a_child_past_its_cap_is_oom_killed_and_the_next_run_is_unaffected():
    p, result = capped_python(128 * MiB, 400)
    assert p.returncode == -9 and "allocated" not in p.stdout
    assert result.oom_killed and result.peak_bytes is not None and result.peak_bytes <= 128 * MiB
    assert ours() == []  # the cgroup was removed
    # The same allocation under a cap that holds it, right after.
    p, result = capped_python(512 * MiB, 100)
    assert p.returncode == 0 and "allocated" in p.stdout
    assert not result.oom_killed and result.oom_kills in (0, None) and 100 * MiB <= result.peak_bytes < 512 * MiB
    assert ours() == []


def test_the_page_cache_a_run_leaves_charged_is_reported(tmp_path):
    """A child's buffered file writes stay charged to its cgroup as page cache after it exits (what the cgroup's peak
    counts beside RSS); anonymous memory does not."""
    path = tmp_path / "written"
    write = f"import os\nwith open({str(path)!r}, 'wb') as f:\n    f.write(os.urandom(64 << 20))\n"
    with cgroup.MemoryCap(512 * MiB, label="test") as cap:
        p = subprocess.run([sys.executable, "-c", write], preexec_fn=cap.join)
        left = cap.result().left_charged_bytes
    assert p.returncode == 0 and left is not None
    assert left["file"] >= 32 * MiB and left["anon"] < 8 * MiB, left


def test_grandchildren_are_capped_and_killed_with_the_cgroup():
    # The child starts a grandchild that outlives it; leaving the context kills it and removes the cgroup.
    script = ("import subprocess, sys\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], stdout=subprocess.DEVNULL,\n"
              "                 stderr=subprocess.DEVNULL)\n"
              f"subprocess.run([sys.executable, '-c', {ALLOCATE!r}, '400'])\n")
    with cgroup.MemoryCap(128 * MiB, label="test") as cap:
        p = subprocess.run([sys.executable, "-c", script], preexec_fn=cap.join, capture_output=True, text=True)
        assert p.returncode == 0  # the child survived; its allocating grandchild did not
        assert cap.result().oom_killed
        assert len(cgroup._procs(cap.path)) == 1  # the sleeper
    assert ours() == []


def test_without_root_the_cap_names_what_is_missing():
    # An unprivileged user may not read this interpreter's files (a pyenv under /root): import, then drop root.
    code = ("import os\nfrom memascend_cli.run import cgroup\nos.setgid(65534); os.setuid(65534)\n"
            "try:\n    cgroup.check_available()\nexcept cgroup.CapUnavailable as e:\n    print(e.message); print(e.hint)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    message, hint = p.stdout.splitlines()
    assert message.startswith("no permission to create a memory cgroup in ") and "(not root)" in message
    assert "root" in hint


def test_a_unified_hierarchy_without_the_memory_controller_is_named():
    # This machine's (and CI's) v2 hierarchy is empty: the memory controller is bound to v1. Choosing it anyway must
    # fail on the real file system in one line, not create an uncapped cgroup.
    v2 = next((m for m in cgroup.cgroup_mounts(cgroup._read(cgroup.MOUNTINFO) or "") if m.version == 2), None)
    if v2 is None or "memory" in (cgroup._read(os.path.join(v2.mount_point, "cgroup.controllers")) or "").split():
        pytest.skip("needs a cgroup2 mount without the memory controller (a v1 machine with an empty unified tree)")
    h = cgroup.Hierarchy(version=2, mount_point=v2.mount_point, own_dir=v2.mount_point)
    with pytest.raises(cgroup.CapUnavailable, match="cannot enable the memory controller"):
        cgroup.choose_parent(h)


def test_the_plan_and_preflight_see_the_cap(tmp_path):
    def dry_run(cap):
        return subprocess.run([sys.executable, "-m", "memascend_cli", "train", TINY, "--dram-cap", cap, "--dry-run",
                               "--output-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)

    small = dry_run("400MiB")
    # the whole cap is the job's (HardwareSpec.under_dram_cap)
    assert small.returncode == 1 and "does not fit" in small.stderr and "0.4 GiB usable" in small.stderr
    fits = dry_run("4GiB")
    assert fits.returncode == 0, fits.stderr[-2000:]
    doc = json.loads(fits.stdout)
    assert doc["dram_cap_bytes"] == 4 << 30
    (dram,) = [c for c in doc["preflight"] if c["name"] == "dram"]
    assert dram["ok"] and dram["message"].endswith(", 4.0 GiB available")


@pytest.mark.slow
def test_train_under_a_cap_too_small_is_reported_as_oom_killed(tmp_path):
    pytest.importorskip("deepspeed")
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    # The plan refuses a job above the cap; --force launches it anyway to find out. 250 MiB is below what the
    # launcher's two interpreters alone keep (~2 x 166 MiB anonymous with torch imported), so the kill does not hang
    # on how far page-cache reclaim stretches a machine's cap (CI once trained 2 steps under 400 MiB).
    p = subprocess.Popen([sys.executable, "-m", "memascend_cli", "train", TINY, "--dram-cap", "250MiB", "--force",
                          "--steps", "2", "--output-dir", str(tmp_path / "run")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    stdout, stderr = p.communicate(timeout=900)
    assert p.returncode == 1, stdout[-2000:] + stderr[-3000:]
    error = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert error and error[0].startswith("error: does not fit: OOM-killed "), stderr[-3000:]
    assert "--dram-cap 250.00 MiB" in error[0]
    assert ours(p.pid) == []  # the run's cgroup is gone
    # The next capped run on the machine is unaffected.
    again, result = capped_python(512 * MiB, 100)
    assert again.returncode == 0 and not result.oom_killed


@pytest.mark.slow
def test_bench_runs_each_engine_under_the_cap_and_reports_an_oom_kill(tmp_path):
    """`bench --dram-cap`: each engine in its own cgroup; a run the cap kills reads `does not fit` with the step and
    phase, the other engines still run, the cgroup's own peak is recorded and nothing is left behind. With
    --ssd-bandwidth beside it (both controllers, one cgroup per v1 hierarchy) the limit is recorded too."""
    require_memory_cgroups("io")
    out = tmp_path / "b"
    # No settling (--settle-cap 1): the peak is not what this test is about.
    cmd = [sys.executable, "-m", "memascend_cli", "bench", "--model", "tiny-llama", "--seq-len", "128", "--steps", "2",
           "--dtype", "fp32", "--runs", "stock,memascend", "--dram-cap", "200MiB", "--settle-cap", "1",
           "--ssd-bandwidth", "2GB/s", "--out", str(out), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 1, p.stderr[-3000:]  # a run failed: the cap is below the runtime alone (~0.4 GiB)
    doc = json.loads(p.stdout)
    assert doc["job"]["dram_cap_bytes"] == 200 * MiB and {r["name"] for r in doc["runs"]} == {"memascend", "stock"}
    for run in doc["runs"]:
        assert run["oom_killed"] and run["error"].startswith("does not fit: OOM-killed at step 1 ("), run["error"]
        assert run["cgroup"]["limit_bytes"] == 200 * MiB and run["cgroup"]["oom_killed"]
        assert [lim["read_bytes_per_s"] for lim in run["io_throttle"]["limits"]] == [2_000_000_000]
    assert doc["job"]["ssd_bandwidth_bytes_per_s"] == 2_000_000_000
    assert ours() == [] and ours(controller="io") == []
