"""A job's processes end with the command that started them, however that command ends.

`memascend train` starts DeepSpeed's launcher in a session of its own (so a terminal's Ctrl-C reaches only the CLI),
and the launcher starts the ranks through a second launcher process (deepspeed/launcher/runner.py runs
deepspeed/launcher/launch.py, which spawns the ranks). Nothing there ends the ranks when the CLI dies: a SIGKILL or an
OOM kill of the CLI left them training, holding the SSD region's lock and their /dev/shm segments. Two parts:

* `die_with_parent()`: a preexec_fn that sets PR_SET_PDEATHSIG on the launcher the CLI starts (prctl(2); the kernel
  signals it when the CLI's thread that forked it ends). It covers one generation only: the kernel clears it in
  every child the launcher forks.
* the lifeline: the CLI puts `token()` (boot id, its pid, start time and session) into the ranks' environment
  (`ENV`); each rank calls `watch()` first thing, and a thread of the rank ends the job's processes once the CLI is
  gone: it unlinks this job's DeepSpeed shared-memory segments (DeepSpeed never does, see leftovers.py) and SIGKILLs
  the rank's process group - the launcher session the CLI created, so the launchers and every local rank go at once,
  also a rank blocked in a collective with the GIL held (a Python thread could not end it). A rank that runs in the
  CLI's own session (nothing created a session for the job) kills only itself rather than the user's shell.

Stdlib only (no torch): the CLI imports it, and the ranks call it before importing torch.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

ENV = "MEMASCEND_LIFELINE"
"""The environment variable that carries the CLI's token to the ranks."""
POLL_S = 0.5
"""How often a rank checks that the CLI is alive (a /proc read; the job ends within this after the CLI)."""
PR_SET_PDEATHSIG = 1
"""<linux/prctl.h>."""
SHM_DIR = "/dev/shm"
SHM_PREFIX = "deepspeed_allreduce_buffer_"
"""DeepSpeed's CPU allreduce segment names (leftovers.py has the layout; repeated here to keep ranks import-light)."""


def boot_id() -> str:
    """This boot's id: a pid means the same process only on the same machine and boot."""
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), None once it is gone (or a
    zombie: dead, only not yet reaped). Together with the pid it names one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def token(pid: int | None = None) -> str:
    """`boot:pid:start:sid` of process `pid` (default: this one), the value of ENV for its job's ranks."""
    pid = os.getpid() if pid is None else pid
    return f"{boot_id()}:{pid}:{start_ticks(pid)}:{os.getsid(pid)}"


def parse(text: str) -> tuple[str, int, int, int] | None:
    """(boot id, pid, start ticks, session id) of a token, None when it is malformed. Pure."""
    parts = text.split(":")
    if len(parts) != 4 or not all(p.isdigit() for p in parts[1:]):
        return None
    return parts[0], int(parts[1]), int(parts[2]), int(parts[3])


def die_with_parent(sig: int = signal.SIGTERM, then=None):
    """A preexec_fn for subprocess.Popen: the child gets `sig` when this process (its forking thread) ends; `then`,
    another preexec_fn, runs after (e.g. joining a memory cgroup).

    SIGTERM, not SIGKILL: DeepSpeed's multi-node runner handles it by ending the other nodes' launchers over pdsh
    (deepspeed/launcher/runner.py, sigkill_handler and PDSHRunner's kill command); the single-node runner has no
    handler and just ends. libc is resolved here, in the parent: the preexec_fn runs between fork and exec, where
    loading a library is not safe.
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody would send the signal
            os.kill(os.getpid(), sig)
        if then is not None:
            then()

    return preexec


def parent_alive(parsed: tuple[str, int, int, int], this_boot: str) -> bool:
    """True while the token's process runs; a token of another machine (a remote node's rank) counts as alive."""
    boot, pid, ticks, _ = parsed
    return boot != this_boot or start_ticks(pid) == ticks


def job_segments(uid: int, addr: str, port: str, names: list[str]) -> list[str]:
    """Of `names` in /dev/shm, the DeepSpeed allreduce segments of the job on MASTER_ADDR:MASTER_PORT. Pure."""
    prefix = f"{SHM_PREFIX}{uid}_{addr}_{port}_"
    return [n for n in names if n.startswith(prefix) and n[len(prefix):].isdigit()]


def end_job(parsed: tuple[str, int, int, int], env=os.environ) -> None:
    """What a rank does once the CLI is gone: unlink the job's segments, then SIGKILL the job's process group (or only
    itself when it shares the CLI's session). Does not return."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        names = []
    for n in job_segments(os.getuid(), env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", ""), names):
        try:
            os.unlink(os.path.join(SHM_DIR, n))
        except OSError:
            pass
    if os.getsid(0) != parsed[3]:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def watch(env=os.environ) -> bool:
    """In a rank: end the job when the CLI named by ENV is gone (now or later). False when there is nothing to watch
    (no token: started without the CLI; a token of another machine: a remote node's rank, ended through its launcher
    by DeepSpeed's pdsh kill command)."""
    parsed = parse(env.get(ENV, ""))
    if parsed is None:
        return False
    this_boot = boot_id()
    if parsed[0] != this_boot:
        return False
    if not parent_alive(parsed, this_boot):
        end_job(parsed, env)

    def loop() -> None:
        while parent_alive(parsed, this_boot):
            time.sleep(POLL_S)
        end_job(parsed, env)

    threading.Thread(target=loop, name="memascend-lifeline", daemon=True).start()
    return True
