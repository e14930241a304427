"""The kit's state on the GPU machine (paths, clock, log, step records) and how it runs a step; the build
environment: libaio unpacked from its .deb files, CUDA_HOME and a private libcuda.so link."""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass, field

from gpukit.phase_io import parse_diskstats
from gpukit.pure import RESERVE_S, cuda_home_of, parse_ldconfig


@dataclass
class StepRecord:
    name: str
    status: str  # ok | failed | timeout | skipped | dry-run
    seconds: float = 0.0
    rc: int | None = None
    note: str = ""
    cmd: str = ""


@dataclass
class Kit:
    """State of one `run`: paths, the clock, the log, the records."""

    args: argparse.Namespace
    out_dir: str
    work: str
    carry: str
    deadline: float
    dry_run: bool
    log_path: str
    steps: list[StepRecord] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    storage: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    background: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)

    # -- paths ---------------------------------------------------------------------------------------
    @property
    def venv(self) -> str:
        return os.path.join(self.work, "venv")

    @property
    def py(self) -> str:
        return os.path.join(self.venv, "bin", "python")

    @property
    def ssd(self) -> str:
        return self.storage.get("dir") or os.path.join(self.work, "ssd")

    def remaining(self) -> float:
        return self.deadline - time.monotonic() - RESERVE_S

    # -- logging -------------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} {max(0, self.remaining()):5.0f}s left] {text}"
        print(line, flush=True)
        with open(self.log_path, "a") as f:
            f.write(line + "\n")

    def append_log_file(self, path: str, max_lines: int = 400) -> None:
        try:
            with open(path, errors="replace") as f:
                lines = f.readlines()
        except OSError:
            return
        cut = lines[-max_lines:]
        with open(self.log_path, "a") as f:
            if len(lines) > len(cut):
                f.write(f"    ... {len(lines) - len(cut)} earlier lines in {path}\n")
            f.writelines("    " + ln for ln in cut)
        for ln in cut[-15:]:
            print("    " + ln, end="", flush=True)

    # -- running -------------------------------------------------------------------------------------
    def run(self, name: str, cmd: list[str], *, cap_s: float, min_s: float = 5.0, env: dict | None = None,
            cwd: str | None = None, stdout_path: str | None = None, echo_lines: int = 400) -> StepRecord:
        """Run `cmd` with a timeout of min(cap_s, time left); its output goes to WORK/logs/NAME.log and
        the main log. In dry-run mode, print it instead."""
        full_env = {**os.environ, **self.env, **(env or {})}
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        text = (shown + " " if shown else "") + shlex.join(cmd)
        timeout = min(cap_s, self.remaining())
        rec = StepRecord(name, "dry-run", cmd=text)
        if self.dry_run:
            print(f"[{name}] (timeout {cap_s:.0f} s){' cwd=' + cwd if cwd else ''}\n    $ {text}", flush=True)
            self.steps.append(rec)
            return rec
        if timeout < min_s:
            rec.status, rec.note = "skipped", f"no time left ({max(0, timeout):.0f} s < {min_s:.0f} s)"
            self.log(f"{name}: skipped, {rec.note}")
            self.steps.append(rec)
            return rec
        log_file = os.path.join(self.work, "logs", f"{name}.log")
        self.log(f"{name}: $ {text}  (timeout {timeout:.0f} s)")
        t0 = time.monotonic()
        with open(log_file, "w") as lf, open(stdout_path, "w") if stdout_path else open(os.devnull, "w") as so:
            try:
                proc = subprocess.Popen(cmd, stdout=so if stdout_path else lf, stderr=lf, env=full_env, cwd=cwd,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                rec.status, rec.note = "failed", f"cannot start: {exc}"
                self.log(f"{name}: {rec.note}")
                self.steps.append(rec)
                return rec
            try:
                rec.rc = proc.wait(timeout=timeout)
                rec.status = "ok" if rec.rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the step's own process group (launchers start ranks)
                proc.wait()
                rec.status, rec.note = "timeout", f"stopped after {timeout:.0f} s"
        rec.seconds = round(time.monotonic() - t0, 1)
        self.log(f"{name}: {rec.status} in {rec.seconds} s" + (f" (rc {rec.rc})" if rec.rc else "")
                 + (f", {rec.note}" if rec.note else ""))
        self.append_log_file(log_file, echo_lines)
        self.steps.append(rec)
        return rec

    def start(self, name: str, cmd: list[str], *, env: dict | None = None) -> None:
        """Start `cmd` in the background (joined by :meth:`join`)."""
        text = shlex.join(cmd)
        if self.dry_run:
            print(f"[{name}] (background)\n    $ {text}", flush=True)
            self.steps.append(StepRecord(name, "dry-run", cmd=text))
            return
        log_file = os.path.join(self.work, "logs", f"{name}.log")
        self.log(f"{name}: started in the background: $ {text}")
        lf = open(log_file, "w")  # noqa: SIM115 - closed in join()
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env={**os.environ, **self.env, **(env or {})},
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.background[name] = (proc, lf, log_file, time.monotonic(), text)

    def join(self, name: str) -> StepRecord | None:
        if self.dry_run or name not in self.background:
            return None
        proc, lf, log_file, t0, text = self.background.pop(name)
        rec = StepRecord(name, "ok", cmd=text)
        try:
            rec.rc = proc.wait(timeout=max(1.0, self.remaining()))
            rec.status = "ok" if rec.rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rec.status, rec.note = "timeout", "out of time"
        lf.close()
        rec.seconds = round(time.monotonic() - t0, 1)
        self.log(f"{name}: {rec.status} after {rec.seconds} s" + (f" (rc {rec.rc})" if rec.rc else ""))
        self.append_log_file(log_file, 60)
        self.steps.append(rec)
        return rec

    def capture(self, cmd: list[str], timeout: float = 60, env: dict | None = None) -> tuple[int, str, str]:
        """A quick query (not a step): rc, stdout, stderr; never raises for a missing program."""
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                               env={**os.environ, **self.env, **(env or {})})
            return r.returncode, r.stdout, r.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 127, "", str(exc)


class DiskSampler:
    """/proc/diskstats of the block device under `path`, every `interval_s` on CLOCK_MONOTONIC (the clock of the bench
    ranks' phase marks), in a thread while a bench run goes: `with DiskSampler(path) as s: ...; s.samples`. No device
    (an overlay or a network file system): no samples, `reason` says why."""

    def __init__(self, path: str, interval_s: float = 0.1):
        self.interval_s, self.samples, self.reason = interval_s, [], ""
        self._stop = threading.Event()
        st = os.stat(path)
        self.major, self.minor = os.major(st.st_dev), os.minor(st.st_dev)
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> dict | None:
        try:
            with open("/proc/diskstats") as f:
                return parse_diskstats(f.read(), self.major, self.minor)
        except OSError as exc:
            self.reason = f"/proc/diskstats: {exc.strerror}"
            return None

    def _loop(self) -> None:
        while not self._stop.is_set():
            counters = self._read()
            if counters is None:
                self.reason = self.reason or f"device {self.major}:{self.minor} is not in /proc/diskstats"
                return
            self.samples.append((time.monotonic(), counters))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def base_site_dirs(python: str) -> list[str]:
    code = ("import json, sys; print(json.dumps([p for p in sys.path if p.rstrip('/').endswith(('site-packages', "
            "'dist-packages'))]))")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def extract_deb(deb: str, dest: str) -> list[str]:
    """`dpkg -x` in Python (an ar archive holding data.tar.*), so no dpkg is needed on the GPU image."""
    members = []
    with open(deb, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise ValueError(f"{deb} is not an ar archive")
        while True:
            header = f.read(60)
            if len(header) < 60:
                break
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            if name.startswith("data.tar"):
                with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
                    tar.extractall(dest, filter="tar") if hasattr(tarfile, "tar_filter") else tar.extractall(dest)
                    members = tar.getnames()
    return members


def aio_env(prefix: str) -> dict:
    """Compiler, linker and loader paths for libaio unpacked under `prefix` (DeepSpeed's is_compatible reads
    CFLAGS/LDFLAGS; its JIT build reads CPATH/LIBRARY_PATH through gcc)."""
    inc = os.path.join(prefix, "usr", "include")
    lib = os.path.join(prefix, "usr", "lib", "x86_64-linux-gnu")

    def prepend(var, value, sep=":"):
        old = os.environ.get(var, "")
        return value + (sep + old if old else "")

    return {"CPATH": prepend("CPATH", inc), "LIBRARY_PATH": prepend("LIBRARY_PATH", lib),
            "LD_LIBRARY_PATH": prepend("LD_LIBRARY_PATH", lib), "CFLAGS": prepend("CFLAGS", f"-I{inc}", " "),
            "LDFLAGS": prepend("LDFLAGS", f"-L{lib}", " ")}




LIBCUDA_DIRS = ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib/x86_64-linux-gnu")
"""Where NVIDIA's driver installs libcuda.so.1 (the container toolkit's mount, Debian/Ubuntu, RHEL) when ldconfig
does not list it."""


def cuda_env(work: str, *, dry_run: bool) -> tuple[dict, list[str]]:
    """(environment, notes) for DeepSpeed's CUDA op builds. DeepSpeed 0.19.8's AsyncIOBuilder links
    `-L$CUDA_HOME -L$CUDA_HOME/lib64 -laio -lcuda -lcudart` (op_builder/async_io.py extra_ldflags), but the driver
    ships only libcuda.so.1 (the unversioned libcuda.so comes with a -dev package or CUDA's lib64/stubs), so
    the link fails. A private folder holding libcuda.so -> the driver's libcuda.so.1 goes first on the linker's
    search path (LIBRARY_PATH, which gcc reads, and LDFLAGS, which DeepSpeed's has_function reads); CUDA_HOME is
    exported from nvcc's place so torch.utils.cpp_extension and DeepSpeed agree on it."""
    env, notes = {}, []
    nvcc = shutil.which("nvcc")
    # A wrapper script on PATH (/usr/local/bin/nvcc exec'ing the real one) would make DIR/bin/nvcc's DIR wrong:
    # the first candidate holding CUDA's headers wins.
    candidates = [os.environ.get("CUDA_HOME"), cuda_home_of(nvcc and os.path.realpath(nvcc)), cuda_home_of(nvcc),
                  "/usr/local/cuda"]
    found = [c for c in candidates if c and os.path.isfile(os.path.join(c, "include", "cuda_runtime.h"))]
    home = found[0] if found else None
    if home:
        env["CUDA_HOME"] = home
    else:
        notes.append("no nvcc found: CUDA_HOME unset, DeepSpeed's CUDA op builds will fail")
    try:
        ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        ldconfig = ""
    driver = parse_ldconfig(ldconfig, "libcuda.so.1") or next(
        (p for d in LIBCUDA_DIRS for p in glob.glob(os.path.join(d, "libcuda.so.1"))), None)
    link_dir = os.path.join(work, "cuda_link")
    if driver:
        if not dry_run:
            os.makedirs(link_dir, exist_ok=True)
            link = os.path.join(link_dir, "libcuda.so")
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(driver, link)
        notes.append(f"libcuda.so -> {driver} in {link_dir}")
        env["LIBRARY_PATH"] = link_dir
        env["LDFLAGS"] = f"-L{link_dir}"
    else:
        notes.append("no libcuda.so.1 (no NVIDIA driver here): the AsyncIOBuilder link of -lcuda will fail")
    return env, notes


def merge_env(base: dict, extra: dict) -> dict:
    """`base` updated with `extra`; search paths and flags both set are joined (extra's first), not replaced."""
    out = dict(base)
    for k, v in extra.items():
        if k in out and k in ("CPATH", "LIBRARY_PATH", "LD_LIBRARY_PATH"):
            out[k] = v + ":" + out[k]
        elif k in out and k in ("CFLAGS", "LDFLAGS"):
            out[k] = v + " " + out[k]
        else:
            out[k] = v
    return out
