"""The cgroup runner's pure parts: which hierarchy, where the cgroup goes, and what its counters say (fixtures:
tests/assets/cgroup/README.md)."""

from __future__ import annotations

import os

import pytest

from memascend_cli.run import cgroup as C

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "cgroup")
MiB = 1024**2


def text(name: str) -> str:
    with open(os.path.join(ASSETS, name), encoding="utf-8") as f:
        return f.read()


def counters(case: str) -> dict[str, str | None]:
    folder = os.path.join(ASSETS, case)
    names = C.V2_FILES if case.startswith("v2") else C.V1_FILES
    return {n: text(os.path.join(case, n)) if os.path.exists(os.path.join(folder, n)) else None for n in names}


def test_v1_machine_with_an_empty_unified_hierarchy_caps_in_v1():
    mounts = C.cgroup_mounts(text("mountinfo_v1.txt"))
    assert [m.mount_point for m in mounts if m.version == 2] == ["/sys/fs/cgroup/unified"]
    memory = next(m for m in mounts if "memory" in m.controllers)
    assert memory.mount_point == "/sys/fs/cgroup/memory" and memory.root == "/"
    # The unified hierarchy offers no controllers here (its cgroup.controllers is empty).
    h = C.detect(text("mountinfo_v1.txt"), text("proc_cgroup_v1.txt"), "")
    assert h == C.Hierarchy(version=1, mount_point="/sys/fs/cgroup/memory",
                            own_dir="/sys/fs/cgroup/memory/process_api/465f43e6974719fcbb37eb47414b8fcd")


def test_v2_host_caps_in_v2_from_the_session_scope():
    h = C.detect(text("mountinfo_v2.txt"), text("proc_cgroup_v2.txt"), text("cgroup.controllers_v2"))
    assert h == C.Hierarchy(version=2, mount_point="/sys/fs/cgroup",
                            own_dir="/sys/fs/cgroup/user.slice/user-0.slice/session-3.scope")
    # A scope holds processes, so the cgroup goes under the nearest ancestor that delegates memory.
    assert C.ancestors(h.own_dir, h.mount_point) == [
        "/sys/fs/cgroup/user.slice/user-0.slice", "/sys/fs/cgroup/user.slice", "/sys/fs/cgroup"]


def test_v2_without_the_memory_controller_falls_back_to_v1_or_says_what_is_missing():
    both = text("mountinfo_v1.txt")
    assert C.detect(both, text("proc_cgroup_v1.txt"), "cpu io pids").version == 1
    with pytest.raises(C.CapUnavailable) as e:
        C.detect(text("mountinfo_v2.txt"), text("proc_cgroup_v2.txt"), "cpu io pids")
    assert "no memory cgroup controller" in e.value.message and e.value.hint
    with pytest.raises(C.CapUnavailable, match="no cgroup file system"):
        C.detect(text("mountinfo_v2.txt").replace("cgroup2", "tmpfs"), "", None)


def test_container_sees_only_its_part_of_the_hierarchy():
    h = C.detect(text("mountinfo_container_v1.txt"), text("proc_cgroup_container_v1.txt"), None)
    assert h.version == 1 and h.own_dir == "/sys/fs/cgroup/memory"
    mount = C.cgroup_mounts(text("mountinfo_container_v1.txt"))[0]
    assert C.cgroup_dir(mount, "/docker/4f1c2a/job") == "/sys/fs/cgroup/memory/job"
    assert C.cgroup_dir(mount, "/elsewhere") == "/sys/fs/cgroup/memory"
    assert C.ancestors("/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory") == ["/sys/fs/cgroup/memory"]


def test_mountinfo_octal_escapes_and_combined_controllers():
    line = "50 31 0:40 / /sys/fs/cgroup/my\\040mem rw - cgroup cgroup rw,memory,cpu\n"
    (m,) = C.cgroup_mounts(line)
    assert m.mount_point == "/sys/fs/cgroup/my mem" and {"memory", "cpu"} <= m.controllers
    assert C.proc_cgroup_paths("2:cpu,cpuacct:/a\n0::/b\n") == {"cpu": "/a", "cpuacct": "/a", "": "/b"}


@pytest.mark.parametrize("case, killed, kills, peak", [
    ("v1_oom", True, 1, 200 * MiB),
    ("v1_ok", False, 0, 57556992),
    ("v2_oom", True, 1, 200 * MiB),
    ("v2_ok", False, 0, 57556992),
    ("v2_no_peak", False, 0, None),
])
def test_counters_say_whether_the_oom_killer_fired_and_the_peak(case, killed, kills, peak):
    r = C.judge(2 if case.startswith("v2") else 1, 200 * MiB, counters(case), sigkilled=killed)
    assert (r.oom_killed, r.oom_kills, r.peak_bytes) == (killed, kills, peak)


def test_what_stays_charged_after_the_run_is_read_from_memory_stat():
    """The page cache of a run's buffered writes stays charged to its cgroup after it exits (v1: a child that touched
    50 MiB and wrote an 80 MiB file under a 200 MiB cap, copied from the CI machine); v2 names the same in its own
    keys; a cgroup without memory.stat gives None."""
    v1 = C.judge(1, 200 * MiB, counters("v1_page_cache"), sigkilled=False)
    assert not v1.oom_killed and v1.peak_bytes == 208621568
    assert v1.left_charged_bytes == {"anon": 0, "file": 60 * MiB, "dirty": 0, "writeback": 0, "shmem": 0}
    v2 = C.judge(2, 200 * MiB, counters("v2_ok"), sigkilled=False)
    assert v2.left_charged_bytes == {"anon": 0, "file": 60 * MiB, "dirty": 4096, "writeback": 0, "shmem": 0,
                                     "kernel": 1318912}
    assert C.judge(2, 200 * MiB, counters("v2_oom"), sigkilled=True).left_charged_bytes is None
    assert "left_charged_bytes" in v1.to_dict()


def test_kernel_without_an_oom_kill_counter_needs_the_limit_reached_and_a_sigkill():
    files = counters("v1_no_oom_kill_counter")
    assert C.judge(1, 200 * MiB, files, sigkilled=True).oom_killed
    assert C.judge(1, 200 * MiB, files, sigkilled=True).oom_kills is None
    assert not C.judge(1, 200 * MiB, files, sigkilled=False).oom_killed  # killed by someone else
    assert not C.judge(1, 400 * MiB, files, sigkilled=True).oom_killed  # far below its cap: not an OOM kill
    older = {**files, "memory.max_usage_in_bytes": None, "memory.failcnt": "7\n"}
    assert C.judge(1, 200 * MiB, older, sigkilled=True).oom_killed


def test_limit_writes_order_and_swap():
    assert C.limit_writes(2, 1024, True) == [("memory.max", "1024"), ("memory.swap.max", "0")]
    assert C.limit_writes(2, 1024, False) == [("memory.max", "1024")]
    v1 = C.limit_writes(1, 1024, True)
    assert v1[0] == ("memory.limit_in_bytes", "1024") and v1[-1] == ("memory.memsw.limit_in_bytes", "1024")
    assert ("memory.oom_control", "0") in v1


def test_value_parsers():
    assert C.single_value("max\n") is None and C.single_value("") is None and C.single_value("4096\n") == 4096
    assert C.flat_keyed("oom_kill_disable 0\nunder_oom 1\nbad\n") == {"oom_kill_disable": 0, "under_oom": 1}
    assert C.stale_owner("memascend-train-1234-0") == 1234
    assert C.stale_owner("memascend-bench_memascend-77-3") == 77
    assert C.stale_owner("system.slice") is None


PSI = ("some avg10=12.50 avg60=3.10 avg300=0.80 total=9000000\n"
       "full avg10=10.00 avg60=2.00 avg300=0.50 total={}\n")


def test_psi_full_total_is_read_from_the_full_line():
    assert C.psi_full_total_us(PSI.format(1063843613)) == 1063843613
    assert C.psi_full_total_us("some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n") is None  # no full line
    assert C.psi_full_total_us(None) is None


def test_thrashing_is_the_full_stall_share_of_the_last_window():
    # 0.2 s samples; full stall grows 0.1 s per sample (50%) for 40 s, then 0.15 s per sample (75%)
    samples, us, t = [], 0, 0.0
    for i in range(400):
        samples.append((t, us))
        t += 0.2
        us += 100_000 if i < 200 else 150_000
    assert C.full_stall_share(samples[:100]) is None  # 19.8 s: not a whole window yet
    assert C.full_stall_share(samples[:200]) == pytest.approx(0.5)
    assert C.full_stall_share(samples) == pytest.approx(0.75)
    w = C.PressureWatch("/unused", "the machine's")
    w.samples = samples[:200]
    assert w.thrashing() is None and w.max_share == pytest.approx(0.5)  # below systemd-oomd's 60%
    w.samples = samples
    assert w.thrashing() == pytest.approx(0.75)


def test_the_pressure_watch_keeps_one_window_of_samples(tmp_path):
    f = tmp_path / "memory.pressure"
    w = C.PressureWatch(str(f), "the cgroup's")
    for i in range(1000):
        f.write_text(PSI.format(i * 1000))
        w.sample(i * 0.2)
    assert w.samples[-1][0] - w.samples[0][0] == pytest.approx(C.THRASH_WINDOW_S, abs=0.25)
    assert w.thrashing() is None and w.max_share == pytest.approx(0.005)
