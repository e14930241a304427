"""faultfs: a fault-injecting FUSE pass-through file system for memascend's storage tests.

    python tests/faultfs.py BACKING_DIR MOUNTPOINT       (foreground; unmount with fusermount3 -u)

Every file under MOUNTPOINT is the same-named file under BACKING_DIR. Files are served with
``direct_io`` (no page cache in the kernel: an O_DIRECT read or write of the region file reaches
this process as one request per kernel chunk), and a file opened with O_DIRECT refuses I/O whose
offset or length is not a multiple of 512 B with EINVAL, as a block device would.

The virtual file ``MOUNTPOINT/.faultfs`` programs it: write a JSON list of rules (replacing the
current ones), read it back for ``{"rules", "requests": {"read": n, "write": n}, "fired": [...]}``.
A rule (all keys optional except ``action``):

    {"op": "read" | "write",           which requests (default both)
     "path": "region",                 substring of the file's path
     "offset": [start, end],           the request must overlap these file bytes
     "after": N,                       let the first N matching requests through
     "count": M,                       fire M times (default 1; -1 = forever)
     "action": "eio" | "enospc"        fail the request with that errno
               | "short"               write only keep_bytes (default: half, minus 100 B) and say so
               | "drop"                acknowledge the whole write, store nothing (a lost write)
               | "torn"                acknowledge the whole write, store only keep_bytes (default: half)
               | "flip"                flip one bit at byte flip_at (default: the middle) of what is
                                       read or written
               | "delay",              sleep delay_s (default 0.05) then serve the request normally
     "keep_bytes": int, "flip_at": int, "delay_s": float}

This is a test helper (RocksDB's FaultInjectionTestFS and SQLite's test VFS play the same role);
nothing in memascend imports it. Needs libfuse3 (Debian `fuse3`) and the PyPI package `mfusepy`.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time

CONTROL = ".faultfs"
_SECTOR = 512


class Rules:
    """The programmable fault plan, shared by the FUSE worker threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rules: list[dict] = []
        self.matched: list[int] = []
        self.requests = {"read": 0, "write": 0}
        self.fired: list[dict] = []

    def set(self, rules: list[dict]) -> None:
        for r in rules:
            if r.get("action") not in ("eio", "enospc", "short", "drop", "torn", "flip", "delay"):
                raise ValueError(f"unknown action in {r}")
        with self.lock:
            self.rules = [dict(r) for r in rules]
            self.matched = [0] * len(rules)
            self.fired = []

    def pick(self, op: str, path: str, offset: int, size: int) -> dict | None:
        """The rule that fires for this request (counting it), or None."""
        with self.lock:
            self.requests[op] += 1
            for i, r in enumerate(self.rules):
                if r.get("op", op) != op or r.get("path", "") not in path:
                    continue
                if "offset" in r:
                    lo, hi = r["offset"]
                    if offset >= hi or offset + size <= lo:
                        continue
                self.matched[i] += 1
                if self.matched[i] <= r.get("after", 0):
                    continue
                count = r.get("count", 1)
                fired = self.matched[i] - r.get("after", 0)
                if count != -1 and fired > count:
                    continue
                self.fired.append({"op": op, "path": path, "offset": offset, "size": size, "action": r["action"]})
                return r
        return None

    def status(self) -> bytes:
        with self.lock:
            return (json.dumps({"rules": self.rules, "requests": self.requests, "fired": self.fired}) + "\n").encode()


def make_operations(backing: str):
    import mfusepy as fuse

    class FaultFS(fuse.Operations):
        use_ns = True

        def __init__(self):
            self.root = os.path.realpath(backing)
            self.rules = Rules()
            self.direct: set[int] = set()  # fds opened with O_DIRECT
            self.control_buf = b""

        def _full(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        # -- metadata --------------------------------------------------------------------------
        def getattr(self, path, fh=None):
            if path == "/" + CONTROL:
                now = time.time_ns()
                return {"st_mode": 0o100600, "st_nlink": 1, "st_size": 1 << 20, "st_uid": os.getuid(),
                        "st_gid": os.getgid(), "st_atime": now, "st_mtime": now, "st_ctime": now}
            st = os.lstat(self._full(path))
            keys = ("st_atime_ns", "st_ctime_ns", "st_gid", "st_mode", "st_mtime_ns", "st_nlink", "st_size", "st_uid",
                    "st_blocks", "st_blksize")
            d = {k.replace("_ns", ""): getattr(st, k) for k in keys}
            return d

        def readdir(self, path, fh):
            return [".", ".."] + os.listdir(self._full(path))

        def statfs(self, path):
            sv = os.statvfs(self._full(path))
            return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                                 "f_files", "f_flag", "f_frsize", "f_namemax")}

        def chmod(self, path, mode):
            os.chmod(self._full(path), mode)
            return 0

        def chown(self, path, uid, gid):
            os.chown(self._full(path), uid, gid)
            return 0

        def utimens(self, path, times=None):
            os.utime(self._full(path), ns=times)
            return 0

        def mkdir(self, path, mode):
            os.mkdir(self._full(path), mode)
            return 0

        def rmdir(self, path):
            os.rmdir(self._full(path))
            return 0

        def unlink(self, path):
            os.unlink(self._full(path))
            return 0

        def rename(self, old, new):
            os.rename(self._full(old), self._full(new))
            return 0

        def truncate(self, path, length, fh=None):
            os.truncate(self._full(path), length)
            return 0

        # -- files -----------------------------------------------------------------------------
        def _open(self, path, flags, mode=None):
            if path == "/" + CONTROL:
                return os.open(os.devnull, os.O_RDWR)
            # Open the backing file without O_DIRECT: this process applies the O_DIRECT rules itself,
            # and the backing file system's page cache only sits behind the fault layer.
            fd = os.open(self._full(path), flags & ~os.O_DIRECT, *(() if mode is None else (mode,)))
            if flags & os.O_DIRECT:
                self.direct.add(fd)
            return fd

        def open(self, path, flags):
            return self._open(path, flags)

        def create(self, path, mode, fi=None):
            return self._open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

        def release(self, path, fh):
            self.direct.discard(fh)
            os.close(fh)
            return 0

        def flush(self, path, fh):
            return 0

        def fsync(self, path, datasync, fh):
            if path != "/" + CONTROL:
                (os.fdatasync if datasync else os.fsync)(fh)
            return 0

        def _check_direct(self, fh, offset, size):
            if fh in self.direct and (offset % _SECTOR or size % _SECTOR):
                raise fuse.FuseOSError(errno.EINVAL)

        def read(self, path, size, offset, fh):
            if path == "/" + CONTROL:
                return self.rules.status()[offset:offset + size]
            self._check_direct(fh, offset, size)
            rule = self.rules.pick("read", path, offset, size)
            action = rule and rule["action"]
            if action in ("eio", "enospc"):
                raise fuse.FuseOSError(errno.EIO if action == "eio" else errno.ENOSPC)
            if action == "delay":
                time.sleep(rule.get("delay_s", 0.05))
            data = os.pread(fh, size, offset)
            if action == "flip" and data:
                at = min(rule.get("flip_at", len(data) // 2), len(data) - 1)
                data = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]
            return data

        def write(self, path, data, offset, fh):
            if path == "/" + CONTROL:
                self.control_buf = data if offset == 0 else self.control_buf + data
                try:
                    self.rules.set(json.loads(self.control_buf.rstrip(b"\0").decode()))
                except ValueError:
                    raise fuse.FuseOSError(errno.EINVAL) from None
                return len(data)
            self._check_direct(fh, offset, len(data))
            rule = self.rules.pick("write", path, offset, len(data))
            action = rule and rule["action"]
            if action in ("eio", "enospc"):
                raise fuse.FuseOSError(errno.EIO if action == "eio" else errno.ENOSPC)
            if action == "delay":
                time.sleep(rule.get("delay_s", 0.05))
            if action == "drop":
                return len(data)
            if action == "torn":
                os.pwrite(fh, data[: rule.get("keep_bytes", len(data) // 2)], offset)
                return len(data)
            if action == "short":
                keep = rule.get("keep_bytes", max(0, len(data) // 2 - 100))
                return os.pwrite(fh, data[:keep], offset)
            if action == "flip" and data:
                at = min(rule.get("flip_at", len(data) // 2), len(data) - 1)
                data = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]
            return os.pwrite(fh, data, offset)

    return FaultFS()


def unavailable() -> str | None:
    """Why faultfs cannot be mounted here (for pytest.skip), or None."""
    import shutil

    if os.geteuid() != 0:
        return "mounting faultfs needs root"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (no FUSE in this kernel or container)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (Debian package fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy / libfuse3 unavailable: {exc}"
    return None


class Mount:
    """A running faultfs: ``with Mount(backing, mountpoint) as fs: fs.set_rules([...])``.

    Unmounts and stops the server on exit (also after a failed test)."""

    def __init__(self, backing: str, mountpoint: str):
        self.backing, self.mountpoint = str(backing), str(mountpoint)
        self.proc = None
        self.log = os.path.join(os.path.dirname(self.backing.rstrip("/")) or ".", "faultfs.log")

    def __enter__(self):
        import subprocess

        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.backing, self.mountpoint],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(self.mountpoint, CONTROL)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                with open(self.log, errors="replace") as f:
                    raise RuntimeError(f"faultfs did not mount on {self.mountpoint}: {f.read()[-2000:]}")
            time.sleep(0.05)
        return self

    def path(self, name: str) -> str:
        return os.path.join(self.mountpoint, name)

    def set_rules(self, rules: list[dict]) -> None:
        fd = os.open(self.path(CONTROL), os.O_WRONLY)
        try:
            os.write(fd, json.dumps(rules).encode())
        finally:
            os.close(fd)

    def status(self) -> dict:
        fd = os.open(self.path(CONTROL), os.O_RDONLY)
        try:
            return json.loads(os.read(fd, 1 << 20).decode())
        finally:
            os.close(fd)

    def __exit__(self, *exc) -> None:
        import subprocess

        if os.path.ismount(self.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", self.mountpoint], check=False, capture_output=True)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    import mfusepy as fuse

    backing, mountpoint = argv
    fuse.FUSE(make_operations(backing), mountpoint, foreground=True, direct_io=True, fsname="faultfs",
              default_permissions=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
