"""A DRAM cap for a process tree: its own memory cgroup, read back and removed after the run.

cgroup v2, where the unified hierarchy has the memory controller: memory.max = cap and memory.swap.max = 0.
cgroup v1 otherwise (a `memory` hierarchy): memory.limit_in_bytes = cap, and memory.memsw.limit_in_bytes = cap
where the kernel accounts swap, so swap cannot stretch the cap. The child joins the cgroup between fork and exec,
so everything it starts is capped with it. After the run the cgroup's own counters say whether the kernel's OOM
killer fired inside it (v2 memory.events oom_kill; v1 memory.oom_control oom_kill, Linux >= 4.13) and its peak
(v2 memory.peak, Linux >= 5.19; v1 memory.max_usage_in_bytes). Both count page cache charged to the cgroup.

Pure: parsing mountinfo, /proc/self/cgroup and the counter files (tests/unit/test_cgroup.py, from fixture files).
I/O: `MemoryCap`, a context manager. Stdlib only: the CLI imports it.

    with MemoryCap(6 * GiB, label="train") as cap:
        proc = subprocess.Popen(argv, preexec_fn=cap.join)
        proc.wait()
        result = cap.result(sigkilled=proc.returncode == -signal.SIGKILL)
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import signal
import time
from dataclasses import dataclass

from memascend_cli.errors import MemascendError

MOUNTINFO = "/proc/self/mountinfo"
PROC_CGROUP = "/proc/self/cgroup"
NAME_PREFIX = "memascend-"
"""Our cgroups are NAME_PREFIX + label-pid-n; a dead pid's empty ones are removed by the next cap."""

_counter = itertools.count()


class CapUnavailable(MemascendError):
    """This machine (or this user) cannot cap a run's memory with a cgroup."""


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


def detect(mountinfo_text: str, proc_cgroup_text: str, v2_controllers: str | None) -> Hierarchy:
    """The hierarchy to cap memory in: v2 where its root offers the memory controller (`v2_controllers`: the text
    of its cgroup.controllers, None when unreadable), else the v1 `memory` hierarchy; CapUnavailable when neither."""
    mounts = cgroup_mounts(mountinfo_text)
    paths = proc_cgroup_paths(proc_cgroup_text)
    v2 = next((m for m in mounts if m.version == 2), None)
    if v2 is not None and "memory" in (v2_controllers or "").split():
        return Hierarchy(version=2, mount_point=v2.mount_point, own_dir=cgroup_dir(v2, paths.get("", "/")))
    v1 = next((m for m in mounts if m.version == 1 and "memory" in m.controllers), None)
    if v1 is not None:
        return Hierarchy(version=1, mount_point=v1.mount_point, own_dir=cgroup_dir(v1, paths.get("memory", "/")))
    if v2 is not None:
        raise CapUnavailable(f"no memory cgroup controller: the cgroup v2 hierarchy at {v2.mount_point} does not "
                             "offer it (cgroup.controllers) and no cgroup v1 `memory` hierarchy is mounted",
                             "run on a machine (or container) with the memory controller, e.g. a cgroup v2 host "
                             "where /sys/fs/cgroup/cgroup.controllers lists memory")
    raise CapUnavailable("no cgroup file system is mounted (cgroup2 or cgroup v1 `memory`; see /proc/self/mountinfo)",
                         "mount one (e.g. `mount -t cgroup2 none /sys/fs/cgroup`) or run without the cap")


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

    def to_dict(self) -> dict:
        return dict(self.__dict__)


_PAGE_SLACK_BYTES = 1 << 20
"""A peak this close to the cap counts as having reached it (limits are rounded to pages)."""
V2_FILES = ("memory.events", "memory.peak")
V1_FILES = ("memory.oom_control", "memory.max_usage_in_bytes", "memory.failcnt", "memory.memsw.failcnt")


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
    return CapResult(version=version, cap_bytes=cap_bytes, oom_killed=killed, oom_kills=kills, peak_bytes=peak)


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


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(value)


def locate() -> Hierarchy:
    """This machine's memory hierarchy (CapUnavailable when there is none)."""
    mountinfo = _read(MOUNTINFO) or ""
    v2 = next((m for m in cgroup_mounts(mountinfo) if m.version == 2), None)
    controllers = _read(os.path.join(v2.mount_point, "cgroup.controllers")) if v2 is not None else None
    return detect(mountinfo, _read(PROC_CGROUP) or "", controllers)


def choose_parent(h: Hierarchy) -> str:
    """The directory our cgroup is made in: v1, the caller's own cgroup (so any limit above still holds); v2, the
    nearest ancestor that hands the memory controller to its children (a v2 cgroup with processes, like the
    caller's own, cannot: the no-internal-process rule), enabling it at the hierarchy root if needed."""
    if h.version == 1:
        parent = h.own_dir if os.path.isdir(h.own_dir) else h.mount_point
    else:
        candidates = ancestors(h.own_dir, h.mount_point)
        parent = next((d for d in candidates if "memory" in (_read(os.path.join(d, "cgroup.subtree_control"))
                                                             or "").split()), None)
        if parent is None:
            parent = h.mount_point
            try:
                _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
            except OSError as exc:
                raise CapUnavailable(f"cannot enable the memory controller for new cgroups in {parent} "
                                     f"(cgroup.subtree_control: {exc.strerror})",
                                     "run as root on the host, or in a container with a delegated cgroup "
                                     "(e.g. `systemd-run --scope -p Delegate=yes`)") from None
    if not os.access(parent, os.W_OK):
        raise CapUnavailable(f"no permission to create a memory cgroup in {parent} (not root)",
                             "run as root (sudo), or drop --dram-cap")
    return parent


def check_available() -> str:
    """Raise CapUnavailable unless a capped run can start here; returns the parent cgroup directory."""
    return choose_parent(locate())


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


class MemoryCap:
    """A memory cgroup for one run: created on enter, removed on exit (its leftover processes killed first)."""

    def __init__(self, cap_bytes: int, *, label: str = "run"):
        if cap_bytes <= 0:
            raise ValueError("cap_bytes must be positive")
        self.cap_bytes = cap_bytes
        self.label = re.sub(r"[^A-Za-z0-9_.]", "_", label)
        self.version = 0
        self.path = ""
        self.swap_limited = False
        """False where the kernel does not account swap: a machine with swap may then stretch the cap."""
        self._procs_path = b""

    def __enter__(self) -> MemoryCap:
        h = locate()
        parent = choose_parent(h)
        _sweep_stale(parent)
        self.version = h.version
        self.path = os.path.join(parent, f"{NAME_PREFIX}{self.label}-{os.getpid()}-{next(_counter)}")
        try:
            os.mkdir(self.path)
        except OSError as exc:
            raise CapUnavailable(f"cannot create the memory cgroup {self.path}: {exc.strerror}",
                                 "run as root, or drop --dram-cap") from None
        try:
            self.swap_limited = os.path.exists(os.path.join(self.path, swap_file(self.version)))
            for name, value in limit_writes(self.version, self.cap_bytes, self.swap_limited):
                _write(os.path.join(self.path, name), value)
        except OSError as exc:
            self.remove()
            raise CapUnavailable(f"cannot set the memory limit of cgroup {self.path}: {exc.strerror}",
                                 "check that the memory controller is usable here") from None
        self._procs_path = os.fsencode(os.path.join(self.path, "cgroup.procs"))
        return self

    def join(self) -> None:
        """Move the calling process into the cgroup: Popen's preexec_fn, run in the child before exec. Plain os
        calls only (the parent may have other threads, e.g. a live display)."""
        fd = os.open(self._procs_path, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    def result(self, sigkilled: bool = False) -> CapResult:
        """What the cgroup recorded; call once the run has ended (before leaving the context)."""
        names = V2_FILES if self.version == 2 else V1_FILES
        return judge(self.version, self.cap_bytes, {n: _read(os.path.join(self.path, n)) for n in names}, sigkilled)

    def __exit__(self, *exc) -> bool:
        self.remove()
        return False

    def remove(self, timeout_s: float = 10.0) -> None:
        """Kill what is left in the cgroup and remove it (an empty cgroup's rmdir can take a moment on v1)."""
        if not self.path or not os.path.isdir(self.path):
            return
        deadline = time.monotonic() + timeout_s
        while True:
            for pid in _procs(self.path):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(self.path)
                return
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
