"""Limits for a process tree in its own cgroups: a DRAM cap (`--dram-cap`) and an SSD bandwidth limit
(`--ssd-bandwidth`, the values from run/iolimit.py), read back and removed after the run.

Each controller goes to the hierarchy that has it: v2 where the unified hierarchy offers it (`memory`, `io`), else
its v1 hierarchy (`memory`, `blkio`). A v2 process is in exactly one cgroup, so the controllers that live in v2 share
one cgroup there; each v1 hierarchy gets its own, and the child joins all of them.

DRAM cap: cgroup v2, where the unified hierarchy has the memory controller: memory.max = cap and memory.swap.max = 0.
cgroup v1 otherwise (a `memory` hierarchy): memory.limit_in_bytes = cap, and memory.memsw.limit_in_bytes = cap
where the kernel accounts swap, so swap cannot stretch the cap. The child joins the cgroup between fork and exec,
so everything it starts is capped with it. After the run the cgroup's own counters say whether the kernel's OOM
killer fired inside it (v2 memory.events oom_kill; v1 memory.oom_control oom_kill, Linux >= 4.13) and its peak
(v2 memory.peak, Linux >= 5.19; v1 memory.max_usage_in_bytes). Both count page cache charged to the cgroup.

Pure: parsing mountinfo, /proc/self/cgroup and the counter files (tests/unit/test_cgroup.py, from fixture files).
I/O: `MemoryCap`, a context manager. Stdlib only: the CLI imports it.

    with RunCgroup(label="train", cap_bytes=6 * GiB, io_limits=limits) as cg:
        proc = subprocess.Popen(argv, preexec_fn=cg.join)
        proc.wait()
        result = cg.result(sigkilled=proc.returncode == -signal.SIGKILL)
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import signal
import time
from dataclasses import dataclass

from memascend_cli.errors import BadInput

MOUNTINFO = "/proc/self/mountinfo"
PROC_CGROUP = "/proc/self/cgroup"
NAME_PREFIX = "memascend-"
"""Our cgroups are NAME_PREFIX + label-pid-n; a dead pid's empty ones are removed by the next cap."""

_counter = itertools.count()


CONTROLLERS = {"memory": "memory", "io": "blkio"}
"""Our controllers by their v2 name, with the name of the v1 hierarchy that has the same job."""
FLAGS = {"memory": "--dram-cap", "io": "--ssd-bandwidth"}
"""The option that asks for each controller (the hints name it)."""


class CapUnavailable(BadInput):
    """This machine (or this user) cannot limit a run with a cgroup (exit 2: the option cannot be honoured here)."""


# --- pure -----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupMount:
    """One cgroup file system from /proc/self/mountinfo."""

    mount_point: str
    root: str
    """The hierarchy's path mounted there ('/' unless a container sees only its own part)."""
    version: int
    """1 (cgroup) or 2 (cgroup2)."""
    controllers: frozenset[str]
    """v1: the controllers of this hierarchy (its super options); v2: empty (they are in cgroup.controllers)."""


@dataclass(frozen=True)
class Hierarchy:
    """Where a memory cgroup can be made."""

    version: int
    mount_point: str
    own_dir: str
    """The caller's own cgroup in that hierarchy, as a directory."""


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (proc(5)).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup_mounts(mountinfo_text: str) -> list[CgroupMount]:
    """The cgroup and cgroup2 mounts of a /proc/self/mountinfo text."""
    mounts = []
    for line in mountinfo_text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        version = 2 if tail[0] == "cgroup2" else 1
        options = frozenset(tail[2].split(",")) if version == 1 else frozenset()
        mounts.append(CgroupMount(mount_point=_unescape(fields[4]), root=_unescape(fields[3]), version=version,
                                  controllers=options))
    return mounts


def proc_cgroup_paths(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup as {controller: path}; the v2 entry ('0::/path') under the key ''."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in (controllers.split(",") if controllers else [""]):
            paths[name] = path
    return paths


def cgroup_dir(mount: CgroupMount, path: str) -> str:
    """The directory of cgroup `path` (as /proc/self/cgroup names it) under `mount`: the mount point where the
    path lies outside the mounted part of the hierarchy."""
    root = mount.root.rstrip("/")
    if path == mount.root or not path.startswith(root + "/"):
        return mount.mount_point
    return os.path.join(mount.mount_point, path[len(root) + 1:])


def detect(mountinfo_text: str, proc_cgroup_text: str, v2_controllers: str | None,
           controller: str = "memory") -> Hierarchy:
    """The hierarchy of `controller` (memory or io): v2 where its root offers it (`v2_controllers`: the text of its
    cgroup.controllers, None when unreadable), else the v1 hierarchy of that job (memory, blkio); CapUnavailable when
    neither."""
    v1_name, flag = CONTROLLERS[controller], FLAGS[controller]
    mounts = cgroup_mounts(mountinfo_text)
    paths = proc_cgroup_paths(proc_cgroup_text)
    v2 = next((m for m in mounts if m.version == 2), None)
    if v2 is not None and controller in (v2_controllers or "").split():
        return Hierarchy(version=2, mount_point=v2.mount_point, own_dir=cgroup_dir(v2, paths.get("", "/")))
    v1 = next((m for m in mounts if m.version == 1 and v1_name in m.controllers), None)
    if v1 is not None:
        return Hierarchy(version=1, mount_point=v1.mount_point, own_dir=cgroup_dir(v1, paths.get(v1_name, "/")))
    if v2 is not None:
        raise CapUnavailable(f"no {controller} cgroup controller: the cgroup v2 hierarchy at {v2.mount_point} does "
                             f"not offer it (cgroup.controllers) and no cgroup v1 `{v1_name}` hierarchy is mounted",
                             f"run on a machine (or container) with the {controller} controller, e.g. a cgroup v2 "
                             f"host where /sys/fs/cgroup/cgroup.controllers lists {controller}, or drop {flag}")
    raise CapUnavailable(f"no cgroup file system is mounted (cgroup2 or cgroup v1 `{v1_name}`; see "
                         "/proc/self/mountinfo)",
                         f"mount one (e.g. `mount -t cgroup2 none /sys/fs/cgroup`) or drop {flag}")


def ancestors(own_dir: str, mount_point: str) -> list[str]:
    """The cgroup directories above `own_dir`, nearest first, up to and including the mount point."""
    out, d = [], own_dir.rstrip("/")
    top = mount_point.rstrip("/")
    while d != top and d.startswith(top + "/"):
        d = os.path.dirname(d)
        out.append(d)
    return out or [top]


def flat_keyed(text: str) -> dict[str, int]:
    """'key value' lines (memory.events, memory.oom_control) as a dict."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def single_value(text: str | None) -> int | None:
    """One number (memory.peak, memory.max_usage_in_bytes, a failcnt); None for 'max', empty or missing."""
    value = (text or "").strip()
    return int(value) if value.isdigit() else None


@dataclass(frozen=True)
class CapResult:
    """What the cgroup recorded about one capped run."""

    version: int
    cap_bytes: int
    oom_killed: bool
    oom_kills: int | None
    """Processes the OOM killer killed in the cgroup; None where the kernel keeps no count (then oom_killed is
    inferred from hitting the limit plus a SIGKILLed run)."""
    peak_bytes: int | None
    """The cgroup's own high-water mark (RSS + page cache + kernel memory charged to it); None if not kept."""
    left_charged_bytes: dict[str, int] | None = None
    """What memory.stat still charged to the cgroup once the run had ended (anon, file = page cache incl. shmem,
    dirty, writeback, shmem; v2 also kernel): the page cache of the run's buffered file I/O stays charged after its
    processes exit, and is part of what the peak counts beside their RSS. None where memory.stat was unreadable."""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


_PAGE_SLACK_BYTES = 1 << 20
"""A peak this close to the cap counts as having reached it (limits are rounded to pages)."""
V2_FILES = ("memory.events", "memory.peak", "memory.stat")
V1_FILES = ("memory.oom_control", "memory.max_usage_in_bytes", "memory.failcnt", "memory.memsw.failcnt", "memory.stat")
STAT_KEYS = {
    # Documentation/admin-guide/cgroup-v2.rst (memory.stat) and cgroup-v1/memory.rst (5.2 stat file: the total_
    # fields count the cgroup with its descendants).
    2: {"anon": "anon", "file": "file", "dirty": "file_dirty", "writeback": "file_writeback", "shmem": "shmem",
        "kernel": "kernel"},
    1: {"anon": "total_rss", "file": "total_cache", "dirty": "total_dirty", "writeback": "total_writeback",
        "shmem": "total_shmem"},
}


def judge(version: int, cap_bytes: int, files: dict[str, str | None], sigkilled: bool) -> CapResult:
    """The run's CapResult from the cgroup's counter files (`files`: name -> text, None when absent).

    Args:
        sigkilled: a process of the run died of SIGKILL; used only where the kernel counts no OOM kills.
    """
    if version == 2:
        events = flat_keyed(files.get("memory.events") or "")
        kills = events.get("oom_kill")
        hit_limit = events.get("oom", 0) > 0
        peak = single_value(files.get("memory.peak"))
    else:
        kills = flat_keyed(files.get("memory.oom_control") or "").get("oom_kill")
        peak = single_value(files.get("memory.max_usage_in_bytes"))
        # With memsw limited to the same cap its counter may be the one that fails; Linux 6.x v1 counts neither
        # failure on an OOM kill, but the peak then sits at the limit.
        hit_limit = any((single_value(files.get(n)) or 0) > 0 for n in ("memory.failcnt", "memory.memsw.failcnt")) \
            or (peak is not None and peak >= cap_bytes - _PAGE_SLACK_BYTES)
    killed = kills > 0 if kills is not None else hit_limit and sigkilled
    stat = flat_keyed(files.get("memory.stat") or "")
    left = {k: stat[f] for k, f in STAT_KEYS[version].items() if f in stat} or None
    return CapResult(version=version, cap_bytes=cap_bytes, oom_killed=killed, oom_kills=kills, peak_bytes=peak,
                     left_charged_bytes=left)


def limit_writes(version: int, cap_bytes: int, swap_file_present: bool) -> list[tuple[str, str]]:
    """The (file, value) writes that set the cap, in order (v1: memsw must stay >= the memory limit)."""
    if version == 2:
        return [("memory.max", str(cap_bytes))] + ([("memory.swap.max", "0")] if swap_file_present else [])
    # oom_kill_disable is inherited from the parent on v1 (mm/memcontrol.c mem_cgroup_css_alloc); 0 lets the
    # kernel kill inside the cap instead of freezing the run.
    writes = [("memory.limit_in_bytes", str(cap_bytes)), ("memory.oom_control", "0")]
    return writes + ([("memory.memsw.limit_in_bytes", str(cap_bytes))] if swap_file_present else [])


def swap_file(version: int) -> str:
    return "memory.swap.max" if version == 2 else "memory.memsw.limit_in_bytes"


def stale_owner(name: str) -> int | None:
    """The pid that made cgroup `name` (NAME_PREFIX + label-pid-n), or None for another name."""
    m = re.fullmatch(re.escape(NAME_PREFIX) + r".*-(\d+)-\d+", name)
    return int(m.group(1)) if m else None


# --- I/O ------------------------------------------------------------------------------------------------------------


UNLIMITED_BYTES = 1 << 62
"""v1 writes "no limit" as 2^63 - 1 rounded down to a page (9223372036854771712); any value this large is none."""


def memory_limit_bytes(h: Hierarchy, read) -> int | None:
    """The memory limit that binds a process in `h.own_dir`: the lowest of its cgroup's and its ancestors' (v2
    memory.max, v1 memory.limit_in_bytes), None where none is set. `read(path)` gives a file's text or None. Pure
    given `read`."""
    name = "memory.max" if h.version == 2 else "memory.limit_in_bytes"
    values = (single_value(read(os.path.join(d, name))) for d in (h.own_dir, *ancestors(h.own_dir, h.mount_point)))
    return min((v for v in values if v is not None and v < UNLIMITED_BYTES), default=None)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(value)


def locate(controller: str = "memory") -> Hierarchy:
    """This machine's hierarchy of `controller` (CapUnavailable when there is none)."""
    mountinfo = _read(MOUNTINFO) or ""
    v2 = next((m for m in cgroup_mounts(mountinfo) if m.version == 2), None)
    controllers = _read(os.path.join(v2.mount_point, "cgroup.controllers")) if v2 is not None else None
    return detect(mountinfo, _read(PROC_CGROUP) or "", controllers, controller)


def own_memory_limit_bytes() -> int | None:
    """The memory limit this process runs under (memory_limit_bytes), None without one or without a memory cgroup."""
    try:
        return memory_limit_bytes(locate("memory"), _read)
    except CapUnavailable:
        return None


def choose_parent(h: Hierarchy, controllers: tuple[str, ...] = ("memory",)) -> str:
    """The directory our cgroup is made in: v1, the caller's own cgroup (so any limit above still holds); v2, the
    nearest ancestor that hands all of `controllers` to its children (a v2 cgroup with processes, like the
    caller's own, cannot: the no-internal-process rule), enabling them at the hierarchy root if needed."""
    flags = " / ".join(FLAGS[c] for c in controllers)
    if h.version == 1:
        parent = h.own_dir if os.path.isdir(h.own_dir) else h.mount_point
    else:
        candidates = ancestors(h.own_dir, h.mount_point)
        parent = next((d for d in candidates if set(controllers) <= set(
            (_read(os.path.join(d, "cgroup.subtree_control")) or "").split())), None)
        if parent is None:
            parent = h.mount_point
            try:
                _write(os.path.join(parent, "cgroup.subtree_control"), " ".join("+" + c for c in controllers))
            except OSError as exc:
                raise CapUnavailable(f"cannot enable the {' and '.join(controllers)} controller for new cgroups in "
                                     f"{parent} (cgroup.subtree_control: {exc.strerror})",
                                     "run as root on the host, or in a container with a delegated cgroup "
                                     "(e.g. `systemd-run --scope -p Delegate=yes`)") from None
    if not os.access(parent, os.W_OK):
        raise CapUnavailable(f"no permission to create a {' and '.join(controllers)} cgroup in {parent} (not root)",
                             f"run as root (sudo), or drop {flags}")
    return parent


def check_available(controller: str = "memory") -> str:
    """Raise CapUnavailable unless a run limited by `controller` can start here; returns the parent cgroup
    directory."""
    return choose_parent(locate(controller), (controller,))


def _procs(path: str) -> list[int]:
    return [int(x) for x in (_read(os.path.join(path, "cgroup.procs")) or "").split()]


def _sweep_stale(parent: str) -> None:
    """Remove empty cgroups left by a memascend that died before removing its own."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(NAME_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = stale_owner(name)
        path = os.path.join(parent, name)
        if pid is not None and not os.path.exists(f"/proc/{pid}") and not _procs(path):
            try:
                os.rmdir(path)
            except OSError:
                pass


def _remove(path: str, timeout_s: float) -> None:
    """Kill what is left in cgroup `path` and remove it (an empty cgroup's rmdir can take a moment on v1)."""
    if not path or not os.path.isdir(path):
        return
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in _procs(path):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(path)
            return
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


PSI_SYSTEM = "/proc/pressure/memory"
"""The machine's memory pressure (Linux >= 4.20 with PSI); a v2 cgroup has its own in memory.pressure."""
THRASH_FULL_SHARE = 0.6
THRASH_WINDOW_S = 30.0
"""A capped job thrashes when all its tasks stalled on memory ("full" pressure) at least THRASH_FULL_SHARE of the last
THRASH_WINDOW_S: systemd-oomd's defaults (oomd.conf DefaultMemoryPressureLimit=60%,
DefaultMemoryPressureDurationSec=30s), the point at which it kills a cgroup. Near its cap a job can re-read the evicted
pages of its libraries for hours before the OOM killer fires."""


def psi_full_total_us(text: str | None) -> int | None:
    """The cumulative 'full' stall time (microseconds) of a PSI file (Documentation/accounting/psi.rst), or None."""
    for line in (text or "").splitlines():
        if line.startswith("full "):
            m = re.search(r"\btotal=(\d+)", line)
            return int(m.group(1)) if m else None
    return None


def full_stall_share(samples: list[tuple[float, int]], window_s: float = THRASH_WINDOW_S) -> float | None:
    """The share of the last `window_s` in which all tasks stalled on memory, from (monotonic s, full total us)
    samples oldest first; None until the samples span the window. Pure."""
    if len(samples) < 2 or samples[-1][0] - samples[0][0] < window_s:
        return None
    t_end, us_end = samples[-1]
    t0, us0 = next((t, u) for t, u in reversed(samples) if t_end - t >= window_s)
    return (us_end - us0) / 1e6 / (t_end - t0)


class PressureWatch:
    """Samples a PSI file while a capped run goes on; `thrashing()` is the full-stall share once it reaches
    THRASH_FULL_SHARE over THRASH_WINDOW_S, else None. `scope` says whose stalls the file counts."""

    def __init__(self, path: str, scope: str):
        self.path, self.scope = path, scope
        self.samples: list[tuple[float, int]] = []
        self.max_share = 0.0

    def sample(self, now_s: float) -> None:
        us = psi_full_total_us(_read(self.path))
        if us is not None:
            self.samples.append((now_s, us))
            # keep a little more than the window
            while len(self.samples) > 2 and now_s - self.samples[1][0] >= THRASH_WINDOW_S:
                self.samples.pop(0)

    def thrashing(self) -> float | None:
        share = full_stall_share(self.samples)
        if share is not None:
            self.max_share = max(self.max_share, share)
        return share if share is not None and share >= THRASH_FULL_SHARE else None


class RunCgroup:
    """The cgroups of one run: a DRAM cap (`cap_bytes`) and/or SSD bandwidth limits (`io_limits`,
    iolimit.IoLimit), created on enter, removed on exit (their leftover processes killed first)."""

    def __init__(self, *, label: str = "run", cap_bytes: int | None = None, io_limits: tuple = ()):
        if cap_bytes is not None and cap_bytes <= 0:
            raise ValueError("cap_bytes must be positive")
        if cap_bytes is None and not io_limits:
            raise ValueError("a RunCgroup needs cap_bytes or io_limits")
        self.cap_bytes = cap_bytes
        self.io_limits = tuple(io_limits)
        self.label = re.sub(r"[^A-Za-z0-9_.]", "_", label)
        self.dirs: dict[str, str] = {}
        """Controller (memory, io) -> the cgroup directory that holds it (one directory for both on v2)."""
        self.versions: dict[str, int] = {}
        self.swap_limited = False
        """False where the kernel does not account swap: a machine with swap may then stretch the cap."""
        self._procs_paths: list[bytes] = []

    @property
    def path(self) -> str:
        """The memory cgroup's directory (the io one without a cap)."""
        return self.dirs.get("memory") or self.dirs.get("io", "")

    @property
    def version(self) -> int:
        return self.versions.get("memory") or self.versions.get("io", 0)

    def __enter__(self) -> RunCgroup:
        from memascend_cli.run.iolimit import throttle_writes

        wanted = (["memory"] if self.cap_bytes else []) + (["io"] if self.io_limits else [])
        groups: dict[str, tuple[Hierarchy, list[str]]] = {}
        for c in wanted:
            h = locate(c)
            groups.setdefault(h.mount_point, (h, []))[1].append(c)
        try:
            for h, controllers in groups.values():
                parent = choose_parent(h, tuple(controllers))
                _sweep_stale(parent)
                path = os.path.join(parent, f"{NAME_PREFIX}{self.label}-{os.getpid()}-{next(_counter)}")
                try:
                    os.mkdir(path)
                except OSError as exc:
                    raise CapUnavailable(f"cannot create the cgroup {path}: {exc.strerror}",
                                         "run as root, or drop " + " / ".join(FLAGS[c] for c in controllers)) from None
                for c in controllers:
                    self.dirs[c], self.versions[c] = path, h.version
                self._procs_paths.append(os.fsencode(os.path.join(path, "cgroup.procs")))
                for c in controllers:
                    if c == "memory":
                        self.swap_limited = os.path.exists(os.path.join(path, swap_file(h.version)))
                        writes = limit_writes(h.version, self.cap_bytes, self.swap_limited)
                    else:
                        writes = throttle_writes(h.version, self.io_limits)
                    for name, value in writes:
                        try:
                            _write(os.path.join(path, name), value)
                        except OSError as exc:
                            raise CapUnavailable(f"cannot set {name} of cgroup {path} to {value!r}: {exc.strerror}",
                                                 f"check that the {c} controller is usable here, or drop "
                                                 f"{FLAGS[c]}") from None
        except BaseException:
            self.remove()
            raise
        return self

    def join(self) -> None:
        """Move the calling process into the cgroups: Popen's preexec_fn, run in the child before exec. Plain os
        calls only (the parent may have other threads, e.g. a live display)."""
        for procs in self._procs_paths:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

    def result(self, sigkilled: bool = False) -> CapResult:
        """What the memory cgroup recorded; call once the run has ended (before leaving the context)."""
        version, path = self.versions["memory"], self.dirs["memory"]
        names = V2_FILES if version == 2 else V1_FILES
        return judge(version, self.cap_bytes, {n: _read(os.path.join(path, n)) for n in names}, sigkilled)

    def pressure_watch(self) -> PressureWatch | None:
        """A watch on the memory cgroup's own pressure (v2 memory.pressure), else on the machine's (v1 has none of
        its own: the capped run is then taken to be what stalls); None without PSI."""
        own = os.path.join(self.dirs["memory"], "memory.pressure")
        if self.versions["memory"] == 2 and psi_full_total_us(_read(own)) is not None:
            return PressureWatch(own, "the cgroup's")
        if psi_full_total_us(_read(PSI_SYSTEM)) is not None:
            return PressureWatch(PSI_SYSTEM, "the machine's")
        return None

    def io_result(self) -> dict:
        """The bandwidth limits and the bytes the io cgroup counted per device (iolimit.io_bytes); call once the
        run has ended."""
        from memascend_cli.run.iolimit import io_bytes, io_stat_file

        version, path = self.versions["io"], self.dirs["io"]
        counted = io_bytes(version, _read(os.path.join(path, io_stat_file(version))) or "")
        return {"version": version, "limits": [lim.to_dict() for lim in self.io_limits],
                "counted_bytes": {mm: {"read": r, "write": w} for mm, (r, w) in counted.items()}}

    def __exit__(self, *exc) -> bool:
        self.remove()
        return False

    def remove(self, timeout_s: float = 10.0) -> None:
        """Kill what is left in the cgroups and remove them."""
        for path in dict.fromkeys(self.dirs.values()):
            _remove(path, timeout_s)


class MemoryCap(RunCgroup):
    """A RunCgroup with a DRAM cap only (`train --dram-cap`)."""

    def __init__(self, cap_bytes: int, *, label: str = "run"):
        if cap_bytes <= 0:
            raise ValueError("cap_bytes must be positive")
        super().__init__(label=label, cap_bytes=cap_bytes)
