"""What a run leaves behind on this host, and removing it without touching a live job's files.

* DeepSpeed's CPU allreduce: every rank of a job whose ranks are all on one node (WORLD_SIZE == LOCAL_SIZE) creates a
  POSIX shared-memory segment ``/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>`` of
  ~66 MB (ops/csrc/cpu/comm/shm.cpp shm_initialize, called from shm_interface.cpp) and never unlinks it
  (shared_close is never called), for stock DeepSpeed and memascend alike. Its descriptor stays open and its mapping
  stays in place for the life of the rank, so a segment that no process has open or mapped (/proc/<pid>/fd,
  /proc/<pid>/maps) belongs to a job that is gone.
* memascend's engine: the key folder it makes in the temp directory when the DeepSpeed config names no nvme_path
  (``memascend-keys-<pid>-*``, engine/runtime.py); stale when that pid is gone.
* torch's JIT op builds: a process building or loading one of DeepSpeed's ops through torch holds
  ``<extensions dir>/<op>/lock`` (torch/utils/file_baton.py FileBaton: created O_EXCL, its descriptor kept open until
  release() closes it and removes the file); one killed in between (an OOM kill, a SIGKILL during startup) leaves it,
  and every later load of that op sleeps on it forever. memascend's ranks load built ops without it
  (engine/ds_internals/jit_ops.py). Stale when no live process has a file open (the lock's own descriptor included),
  mapped or its cwd in that op's folder (a build runs ninja there) and the lock is older than the run that looks
  (EXT_LOCK_RELEASE_S: release() closes the descriptor just before it removes the file). A lock a live process holds
  is named with its holder in the sweep's note: the run will wait for it.

Only entries of this user are touched (the segment's name and owner must carry our uid). Pure parts (names, parsing)
are separate from the /proc and /dev/shm scans.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

SHM_DIR = "/dev/shm"
SHM_PREFIX = "deepspeed_allreduce_buffer_"
KEY_DIR_PREFIX = "memascend-keys-"
EXT_LOCK = "lock"
"""engine/runtime.py names its temporary key folder KEY_DIR_PREFIX + '<pid>-' + random."""
EXT_LOCK_RELEASE_S = 2.0
"""An op build lock nobody holds is left alone this long: FileBaton.release() closes its descriptor, then removes the
file (microseconds apart)."""


def shm_name(uid: int, addr: str, port: int | str, rank: int) -> str:
    """DeepSpeed's segment name (shm.cpp: "%s_%d_%s_%s" then "%s_%d": prefix, uid, addr, port, rank)."""
    return f"{SHM_PREFIX}{uid}_{addr}_{port}_{rank}"


def parse_shm_name(name: str) -> tuple[int, str, str, int] | None:
    """(uid, addr, port, rank) of a DeepSpeed segment name, else None. The address may hold underscores."""
    if not name.startswith(SHM_PREFIX):
        return None
    rest = name[len(SHM_PREFIX):]
    uid, sep, rest = rest.partition("_")
    parts = rest.rsplit("_", 2)
    if not sep or len(parts) != 3 or not uid.isdigit() or not parts[2].isdigit():
        return None
    return int(uid), parts[0], parts[1], int(parts[2])


def key_dir_pid(name: str) -> int | None:
    """The pid in a key folder's name, else None (folders of older versions carry none and are left alone)."""
    if not name.startswith(KEY_DIR_PREFIX):
        return None
    pid, sep, _ = name[len(KEY_DIR_PREFIX):].partition("-")
    return int(pid) if sep and pid.isdigit() else None


def holders(prefix: str, proc: str = "/proc") -> dict[str, set[int]]:
    """Paths under `prefix` that a live process has open, mapped or as its working directory (the processes /proc lets
    us read), each with the pids that hold it."""
    held: dict[str, set[int]] = {}
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        base = os.path.join(proc, pid)
        try:
            for link in [os.path.join("fd", fd) for fd in os.listdir(os.path.join(base, "fd"))] + ["cwd"]:
                try:
                    target = os.readlink(os.path.join(base, link))
                except OSError:
                    continue
                if target.startswith(prefix):
                    held.setdefault(target.removesuffix(" (deleted)"), set()).add(int(pid))
            with open(os.path.join(base, "maps"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    i = line.find(prefix)
                    if i >= 0:
                        held.setdefault(line[i:].rstrip("\n").removesuffix(" (deleted)"), set()).add(int(pid))
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            continue
    return held


def held_paths(prefix: str, proc: str = "/proc") -> set[str]:
    """Paths under `prefix` that a live process has open, mapped or as its working directory."""
    return set(holders(prefix, proc))


def extension_dirs(env=None) -> list[str]:
    """Where torch builds JIT ops: TORCH_EXTENSIONS_DIR, and its default under ~/.cache (torch/utils/
    cpp_extension.py _get_build_directory)."""
    env = os.environ if env is None else env
    dirs = [env.get("TORCH_EXTENSIONS_DIR"), os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")]
    return [d for d in dirs if d and os.path.isdir(d)]


def extension_locks(root: str) -> list[str]:
    """The op build locks under `root`: <op>/lock, or <python tag>/<op>/lock (torch's default root)."""
    return sorted(glob.glob(os.path.join(root, "*", EXT_LOCK)) + glob.glob(os.path.join(root, "*", "*", EXT_LOCK)))


def ext_lock_holders(lock: str, proc: str = "/proc") -> list[int]:
    """Pids of the live processes that hold an op build lock: its descriptor, or any file open, mapped or as cwd in
    the op's folder (a build)."""
    op_dir = os.path.realpath(os.path.dirname(lock))
    pids: set[int] = set()
    for path, by in holders(op_dir, proc).items():
        if path == op_dir or path.startswith(op_dir + os.sep):
            pids |= by
    return sorted(pids)


def ext_lock_stale(lock: str, pids: list[int], *, now: float, uid: int) -> bool:
    """Whether a lock that its holders scan found held by `pids` is a leftover: nobody holds it, it is this user's, and
    it was there EXT_LOCK_RELEASE_S before `now` (time.time(), the run that looks starting)."""
    try:
        st = os.lstat(lock)
    except OSError:
        return False
    return not pids and st.st_uid == uid and st.st_mtime < now - EXT_LOCK_RELEASE_S


def describe_pid(pid: int, proc: str = "/proc") -> str:
    """'pid N (command line)', shortened, for a note."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
            cmd = " ".join(f.read().replace(b"\0", b" ").decode("utf-8", "replace").split())
    except OSError:
        cmd = ""
    return f"pid {pid} ({cmd[:80]})" if cmd else f"pid {pid}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Sweep:
    """What one sweep removed and what it left because a live process holds it."""

    removed: list[dict] = field(default_factory=list)
    """{"path", "bytes"} of each removed segment or folder."""
    kept_live: int = 0
    """DeepSpeed segments of this user that a live process holds (a running job)."""
    locks_held: list[dict] = field(default_factory=list)
    """{"path", "holders"} of each op build lock a live process holds: a load of that op through torch waits for it."""

    @property
    def removed_bytes(self) -> int:
        return sum(r["bytes"] for r in self.removed)

    def to_dict(self) -> dict:
        return {"removed": self.removed, "removed_bytes": self.removed_bytes, "kept_live": self.kept_live,
                "locks_held": self.locks_held}

    def note(self) -> str | None:
        """One line for the user, or None when nothing was removed and no op build lock is held."""
        parts = []
        locks = [r["path"] for r in self.removed if os.path.basename(r["path"]) == EXT_LOCK]
        if len(self.removed) > len(locks):
            parts.append(f"removed {len(self.removed) - len(locks)} leftover(s) of finished jobs "
                         f"({self.removed_bytes / 2**20:,.0f} MiB: DeepSpeed's shared-memory allreduce buffers, "
                         "memascend key folders)")
        if locks:
            parts.append(f"removed the stale op build lock(s) {', '.join(locks)} (no live process held them; a "
                         "process killed while loading the op left them)")
        parts += [f"the op build lock {h['path']} is held by {', '.join(h['holders'])}: a load of that op waits for "
                  "it" for h in self.locks_held]
        return "; ".join(parts) or None


def _tree_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for n in files:
            try:
                total += os.lstat(os.path.join(root, n)).st_size
            except OSError:
                pass
    return total


def sweep(*, shm_dir: str = SHM_DIR, tmp_dir: str | None = None, proc: str = "/proc", uid: int | None = None,
          ext_dirs: list[str] | None = None) -> Sweep:
    """Remove this user's DeepSpeed segments that no live process holds, memascend key folders of dead pids and
    stale op build locks (`ext_dirs`, default extension_dirs())."""
    uid = os.getuid() if uid is None else uid
    out = Sweep()
    try:
        names = [n for n in os.listdir(shm_dir) if n.startswith(SHM_PREFIX)]
    except OSError:
        names = []
    mine = []
    for n in names:
        parsed = parse_shm_name(n)
        path = os.path.join(shm_dir, n)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if parsed is not None and parsed[0] == uid and st.st_uid == uid:
            mine.append((path, st.st_size))
    if mine:
        held = held_paths(os.path.join(shm_dir, SHM_PREFIX), proc)
        for path, size in mine:
            if path in held:
                out.kept_live += 1
                continue
            try:
                os.unlink(path)
                out.removed.append({"path": path, "bytes": size})
            except FileNotFoundError:
                pass
    tmp_dir = tmp_dir or tempfile.gettempdir()
    try:
        entries = [n for n in os.listdir(tmp_dir) if n.startswith(KEY_DIR_PREFIX)]
    except OSError:
        entries = []
    for n in entries:
        pid = key_dir_pid(n)
        path = os.path.join(tmp_dir, n)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if pid is None or st.st_uid != uid or _alive(pid):
            continue
        size = _tree_bytes(path)
        shutil.rmtree(path, ignore_errors=True)
        out.removed.append({"path": path, "bytes": size})
    _sweep_ext_locks(out, extension_dirs() if ext_dirs is None else ext_dirs, proc=proc, uid=uid)
    return out


def _sweep_ext_locks(out: Sweep, roots: list[str], *, proc: str, uid: int) -> None:
    """Remove the stale op build locks under `roots` and name the held ones (see the module's docstring)."""
    now = time.time()
    for root in roots:
        for lock in extension_locks(root):
            pids = ext_lock_holders(lock, proc)
            if pids:
                out.locks_held.append({"path": lock, "holders": [describe_pid(p, proc) for p in pids]})
            elif ext_lock_stale(lock, pids, now=now, uid=uid):
                try:
                    os.unlink(lock)
                    out.removed.append({"path": lock, "bytes": 0})
                except FileNotFoundError:
                    pass


def shm_used_bytes(shm_dir: str = SHM_DIR) -> int:
    """Bytes in use on the shared-memory file system (what it costs in RAM)."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def deepspeed_segments(shm_dir: str = SHM_DIR) -> list[str]:
    """Names of DeepSpeed's allreduce segments in `shm_dir` (any user), sorted."""
    try:
        return sorted(n for n in os.listdir(shm_dir) if n.startswith(SHM_PREFIX))
    except OSError:
        return []
