"""Launch a training run through DeepSpeed's own launcher: a pure builder and a small executor.

`build_launch` returns the exact argv and environment (`train --dry-run` prints them, tests
assert them); `run_launch` runs them, turns Ctrl-C, SIGTERM, SIGHUP and --stop-after into a clean
stop (the workers save a checkpoint and exit), a failing rank into one `error:` line naming its log,
and ends every process of the job when it ends itself (memascend_cli/run/lifeline.py).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from memascend_cli.defaults import ENGINE_ENV
from memascend_cli.errors import EXIT_STOPPED, MemascendError
from memascend_cli.run.cpu_env import cpu_rank_env
from memascend_cli.run.recipe import Recipe
from memascend_cli.run.rundir import (
    DEEPSPEED_ENV,
    DS_CONFIG,
    ERROR_PREFIX,
    EXIT_PREFIX,
    LOG_DIR,
    STARTED_PREFIX,
    STOP_FILE,
    exit_file,
    started_file,
)

WORKER_MODULE = "memascend_engine.train_worker"


@dataclass(kw_only=True, slots=True)
class LaunchSpec:
    """Everything needed to start the run; printing it is the dry run."""

    cmd: list[str]
    """argv of the `deepspeed` launcher."""
    env: dict[str, str]
    """Variables added to the caller's environment."""
    ds_config_path: str
    """The DeepSpeed JSON the workers read."""
    run_dir: str
    """The run directory (recipe.json, ds_config.json, metrics.jsonl, logs/, checkpoints/)."""
    num_ranks: int
    """Processes on this node."""
    log_dir: str = ""
    """Per-rank logs (DeepSpeed's --enable_each_rank_log)."""
    cpu_only: bool = False
    """True: DeepSpeed's CPU accelerator, gloo between ranks."""
    notes: list[str] = field(default_factory=list)
    """Remarks for the user (e.g. about multi-node environments)."""
    deepspeed_env: dict[str, str] = field(default_factory=dict)
    """Multi-node runs: variables written to RUN/.deepspeed_env, which DeepSpeed's runner exports on every node
    (the other nodes' ranks start in an ssh session that has none of this shell's environment)."""

    def shell(self) -> str:
        """The command as one copy-pasteable shell line, environment first."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.cmd)

    def to_dict(self) -> dict:
        return {"cmd": self.cmd, "env": self.env, "ds_config_path": self.ds_config_path, "run_dir": self.run_dir,
                "num_ranks": self.num_ranks, "log_dir": self.log_dir, "cpu_only": self.cpu_only, "shell": self.shell()}


def deepspeed_launcher(python_executable: str | None = None) -> str:
    """The `deepspeed` console script of the venv that runs memascend (never another install's)."""
    py = python_executable or sys.executable
    candidate = os.path.join(os.path.dirname(py), "deepspeed")
    return candidate


def toolchain_env() -> dict[str, str]:
    """PATH with this venv's bin first, when it is not: DeepSpeed's JIT ops (prebuilt by scripts/bootstrap.sh) are
    checked by `ninja` from PATH at every load, and another ninja takes the build as stale and rebuilds it
    (torch/utils/cpp_extension.py _run_ninja_build): minutes of compiling inside the run, and inside its DRAM cap."""
    venv_bin = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] == venv_bin:
        return {}
    return {"PATH": venv_bin + os.pathsep + path}


def free_port() -> int:
    """A TCP port nobody listens on now (the kernel's pick), for rank 0's rendezvous."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_launch(r: Recipe, run_dir: str, *, num_gpus: int, cpu_cores: int, engine: str, resume: bool,
                 master_port: int = 29500, python_executable: str | None = None, extra_env: dict[str, str] | None = None) -> LaunchSpec:
    """The launch for `r` in `run_dir`. Pure.

    Args:
        r: the recipe (ranks, hostfile, num_nodes, master_port).
        run_dir: absolute run directory.
        num_gpus: GPUs on this node (0 = CPU-only: DS_ACCELERATOR=cpu and gloo).
        cpu_cores: logical CPUs on this node (CPU ranks split them).
        engine: memascend, or tuned / stock for stock DeepSpeed (no engine, its swap directory).
        resume: continue from the newest complete checkpoint.
        master_port: rank 0's port when the recipe sets none.
        python_executable: the interpreter whose venv holds `deepspeed` (default: this one).
        extra_env: variables to pass through unchanged (e.g. TORCH_EXTENSIONS_DIR).
    """
    cpu_only = num_gpus == 0
    ranks = r.ranks if r.ranks is not None else (1 if cpu_only else num_gpus)
    log_dir = os.path.join(run_dir, LOG_DIR)
    cmd = [deepspeed_launcher(python_executable)]
    if r.hostfile:
        cmd += ["--hostfile", r.hostfile]
        if r.num_nodes is not None:
            cmd += ["--num_nodes", str(r.num_nodes)]
    # On the CPU accelerator --num_gpus is the number of CPU ranks: DeepSpeed 0.19.8 launcher/runner.py
    # apply_num_nodes_and_gpus (lines 400-403) gives each host num_gpus slots, one rank each.
    cmd += ["--num_gpus", str(ranks), "--master_port", str(r.master_port or master_port),
            "--no_local_rank", f"--enable_each_rank_log={log_dir}",
            "--module", WORKER_MODULE, "--run-dir", run_dir, "--engine", engine]
    if resume:
        cmd.append("--resume")
    env = dict(extra_env or {})
    env["PYTHONUNBUFFERED"] = "1"
    if engine == "memascend":
        env.update(ENGINE_ENV)
    if cpu_only:
        env["DS_ACCELERATOR"] = "cpu"
        env.update(cpu_rank_env(cpu_cores, ranks))
    notes = []
    deepspeed_env = {}
    if r.hostfile:
        deepspeed_env = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}  # DeepSpeed exports PYTHON*
        notes.append(f"multi-node: {DEEPSPEED_ENV} in the run directory carries {', '.join(sorted(deepspeed_env))} "
                     "to every node; the run directory must be on a file system every node sees")
    return LaunchSpec(cmd=cmd, env=env, ds_config_path=os.path.join(run_dir, DS_CONFIG), run_dir=run_dir,
                      num_ranks=ranks, log_dir=log_dir, cpu_only=cpu_only, notes=notes, deepspeed_env=deepspeed_env)


def rank_error(run_dir: str) -> tuple[str, str, str | None] | None:
    """(one-line message, log path, hint or None) of the first rank that recorded an error, if any.

    The worker writes logs/error-rank<N>.json with its one-line message before exiting non-zero.
    """
    log_dir = os.path.join(run_dir, LOG_DIR)
    try:
        names = sorted(n for n in os.listdir(log_dir) if n.startswith(ERROR_PREFIX) and n.endswith(".json"))
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(log_dir, name), encoding="utf-8") as f:
                data = json.load(f)
            return data["message"], data.get("log") or log_dir, data.get("hint")
        except (OSError, ValueError, KeyError):
            continue
    return None


def clear_stale_state(run_dir: str) -> None:
    """Remove the stop request and old rank errors left by a previous launch in the same run dir."""
    for path in [os.path.join(run_dir, STOP_FILE)]:
        if os.path.exists(path):
            os.unlink(path)
    log_dir = os.path.join(run_dir, LOG_DIR)
    if os.path.isdir(log_dir):
        for n in os.listdir(log_dir):
            if n.startswith((ERROR_PREFIX, EXIT_PREFIX, STARTED_PREFIX)):
                os.unlink(os.path.join(log_dir, n))


def run_launch(spec: LaunchSpec, *, on_poll=None, poll_s: float = 0.5, policy: StopPolicy | None = None,
               preexec_fn=None) -> int:
    """Run the launcher until it exits (see _run_launch) and leave nothing behind: leftovers of finished jobs
    (DeepSpeed's shared-memory allreduce buffers, engine key folders) are swept before the launch, and this job's
    after it, once its processes are gone, also after a failed or killed rank (memascend_cli/run/leftovers.py)."""
    from memascend_cli.run import leftovers
    from memascend_cli.console import err

    note = leftovers.sweep().note()
    if note:
        err.print(f"note: {note}", highlight=False)
    try:
        return _run_launch(spec, on_poll=on_poll, poll_s=poll_s, policy=policy or StopPolicy(), preexec_fn=preexec_fn)
    finally:
        leftovers.sweep()


DEFAULT_STOP_GRACE_S = 25.0
"""From the first stop request to the stop at once: under Slurm's default KillWait (30 s between a job's SIGTERM and
its SIGKILL), so the CLI itself ends the ranks and sweeps /dev/shm before SIGKILL comes."""
MULTI_NODE_KILL_WAIT_S = 5.0
"""Stop at once, multi-node: how long DeepSpeed's runner gets for its pdsh kill command before its session is
SIGKILLed."""


@dataclass(kw_only=True, slots=True)
class StopPolicy:
    grace_s: float = DEFAULT_STOP_GRACE_S
    """A stop request not finished after this many seconds stops at once."""
    stop_at: float | None = None
    """time.monotonic() at which to request a stop (--stop-after), None for none."""


@dataclass(slots=True)
class StopState:
    """The stop requests of one launch. Pure: signal handlers and the poll loop call it with the time.

    The first request (Ctrl-C, SIGTERM, SIGHUP, --stop-after) asks the ranks to finish the step, checkpoint and exit;
    a second signal, or the policy's grace running out, stops at once."""

    policy: StopPolicy
    reasons: list[str] = field(default_factory=list)
    first_at: float | None = None
    at_once: str | None = None
    """Why the run was stopped at once, None while it was not."""

    def request(self, reason: str, now: float) -> str:
        """'graceful' for the first request, 'at once' for a later one (or 'none' when it is already stopped)."""
        if self.at_once is not None:
            return "none"
        self.reasons.append(reason)
        if self.first_at is None:
            self.first_at = now
            return "graceful"
        self.at_once = f"a second stop request: {reason}"
        return "at once"

    def tick(self, now: float) -> str:
        """What the poll loop does at `now`: 'graceful' (--stop-after reached), 'at once' (grace over) or 'none'."""
        if self.first_at is None:
            if self.policy.stop_at is not None and now >= self.policy.stop_at:
                return self.request("--stop-after", now)
            return "none"
        if self.at_once is None and now - self.first_at >= self.policy.grace_s:
            self.at_once = f"the stop grace of {self.policy.grace_s:g} s ran out"
            return "at once"
        return "none"

    @property
    def external(self) -> bool:
        """Something other than Ctrl-C asked (SIGTERM, SIGHUP, --stop-after: a scheduler, a script): a clean stop exits
        EXIT_STOPPED; after Ctrl-C, a STOP file written by hand or a stop hook it exits 0."""
        return any(r != "Ctrl-C" for r in self.reasons)


SIGNAL_REASONS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


def _run_launch(spec: LaunchSpec, *, on_poll=None, poll_s: float = 0.5, policy: StopPolicy, preexec_fn=None) -> int:
    """Run the launcher until its processes are gone; returns 0 (done, or stopped by Ctrl-C), EXIT_STOPPED (stopped
    by SIGTERM, SIGHUP or --stop-after with a complete checkpoint), or raises MemascendError naming the failing rank.

    The launcher runs in its own session so a terminal Ctrl-C reaches only us: DeepSpeed's launcher would otherwise
    SIGTERM the workers mid-step. A stop request (see StopState) reaches the ranks through the run directory's STOP
    file; stopping at once SIGKILLs the launcher's session. The launcher dies with this process (PR_SET_PDEATHSIG) and
    the ranks watch this process's lifeline (memascend_cli/run/lifeline.py), so no rank outlives the CLI.

    Args:
        spec: from build_launch.
        on_poll: called every poll_s seconds while the run is alive (the live display).
        policy: the stop grace and --stop-after.
        preexec_fn: run in the launcher's process before exec (--dram-cap: join the run's memory cgroup).
    """
    from memascend_cli.run import lifeline

    os.makedirs(spec.log_dir, exist_ok=True)
    clear_stale_state(spec.run_dir)
    token = lifeline.token()
    if spec.deepspeed_env:
        # The user's MEMASCEND_* switches (e.g. MEMASCEND_VERIFY_CHECKSUMS) reach the other nodes too; the lifeline
        # is watched only by the ranks on this machine (its boot id).
        variables = {**{k: v for k, v in os.environ.items() if k.startswith("MEMASCEND_")}, **spec.deepspeed_env,
                     lifeline.ENV: token}
        with open(os.path.join(spec.run_dir, DEEPSPEED_ENV), "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in sorted(variables.items()))
    launcher_log = os.path.join(spec.log_dir, "launcher.log")
    env = {**os.environ, **spec.env, lifeline.ENV: token}
    state = StopState(policy)
    kill_at: list[float] = []

    def stop(action: str, reason: str) -> None:
        if action == "graceful":
            with open(os.path.join(spec.run_dir, STOP_FILE), "w") as f:
                f.write(f"stop requested by {reason}\n")
            say(f"[yellow]stopping ({reason}):[/yellow] finishing the current step and saving a checkpoint "
                 f"(a second signal, or {policy.grace_s:g} s from now, stops at once)")
        elif action == "at once":
            say(f"[red]stopping at once:[/red] {state.at_once}")
            if spec.deepspeed_env and not kill_at:
                # The multi-node runner ends the other nodes' launchers on SIGTERM (pdsh kill command); then SIGKILL.
                signal_group(proc.pid, signal.SIGTERM, leader_only=True)
                kill_at.append(time.monotonic() + MULTI_NODE_KILL_WAIT_S)
            else:
                signal_group(proc.pid, signal.SIGKILL)

    def on_signal(signum, frame):
        if signum == signal.SIGHUP:
            detach_from_hung_up_terminal()
        reason = SIGNAL_REASONS[signal.Signals(signum)]
        stop(state.request(reason, time.monotonic()), reason)

    with open(launcher_log, "ab") as log:
        try:
            proc = subprocess.Popen(spec.cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    cwd=spec.run_dir,
                                    preexec_fn=lifeline.die_with_parent(then=preexec_fn))
        except FileNotFoundError:
            raise MemascendError(f"DeepSpeed launcher {spec.cmd[0]} not found",
                                 "install the training extras: pip install 'memascend[train]'") from None
        previous = {s: signal.signal(s, on_signal) for s in SIGNAL_REASONS} if main_thread() else {}
        watch = RankWatch(spec.run_dir, spec.num_ranks)
        try:
            # Until the whole session is gone: under systemd or Slurm's scancel every process gets SIGTERM, the
            # single-node runner dies of it at once, and the ranks still finish their step and checkpoint.
            while proc.poll() is None or group_members(proc.pid):
                now = time.monotonic()
                action = state.tick(now)
                if action != "none":
                    stop(action, "--stop-after")
                if kill_at and now >= kill_at[0]:
                    signal_group(proc.pid, signal.SIGKILL)
                watch.poll()
                if on_poll is not None:
                    on_poll()
                time.sleep(poll_s)
            watch.poll()
            if on_poll is not None:
                on_poll()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            wait_group_gone(proc.pid)
    code = proc.returncode
    stopped = stopped_marks(spec.run_dir, spec.num_ranks)
    if stopped is not None:  # also when the grace ran out just after the ranks' checkpoint completed
        step, checkpoint = stopped
        why = f" ({', '.join(dict.fromkeys(state.reasons))})" if state.reasons else ""
        say(f"stopped at step {step}{why}: checkpoint {checkpoint} is complete; continue with "
             "`memascend train RECIPE --resume`")
        return EXIT_STOPPED if state.external else 0
    if code == 0:
        return 0
    if state.at_once is not None:
        raise MemascendError(f"training stopped at once ({state.at_once}); a checkpoint being written is not used, "
                             "the newest complete checkpoint is intact", "continue with `memascend train RECIPE --resume`")
    # DeepSpeed's launcher exits with a dead rank's return code (-9 -> 247).
    killed = _killed_by(code)
    found = rank_error(spec.run_dir)
    silent = first_dead(_silent_ranks(spec), watch.dead_at_poll)
    if silent or (killed and found is None):
        # A killed rank writes nothing; the others then fail on the broken collective, and their error files only
        # echo the cause. The launcher's status is the first dead rank it polled, not always the killed one.
        who = ("rank " + ", ".join(map(str, silent))) if silent else "a rank"
        how = f" by {killed}" if killed else ""
        raise MemascendError(f"{who} was killed{how} (out of memory?); the newest complete checkpoint is intact",
                             f"continue with `memascend train RECIPE --resume`; logs in {spec.log_dir}")
    if found is not None:
        message, log_path, hint = found
        raise MemascendError(message, f"{hint}; full log: {log_path}" if hint else f"full log: {log_path}")
    raise MemascendError(f"the DeepSpeed launcher exited with status {code}", f"see {launcher_log} and {spec.log_dir}")


def stopped_marks(run_dir: str, num_ranks: int) -> tuple[int, str] | None:
    """(step, checkpoint) when every rank of this node ended with a stop and its checkpoint (its exit mark says so),
    else None."""
    found = set()
    for rank in range(num_ranks):
        try:
            with open(exit_file(run_dir, rank), encoding="utf-8") as f:
                mark = json.load(f)
        except (OSError, ValueError):
            return None
        if mark.get("code") != 0 or "stopped" not in mark:
            return None
        found.add((mark["stopped"], mark["checkpoint"]))
    return found.pop() if len(found) == 1 else None


def say(text: str) -> None:
    """A status line on stderr; a terminal that hung up (SIGHUP) must not end the stop."""
    from memascend_cli.console import err

    try:
        err.print(text, highlight=False, soft_wrap=True)
    except (OSError, ValueError):
        pass


def detach_from_hung_up_terminal() -> None:
    """After SIGHUP, writes to the terminal fail (EIO): point stdout/stderr that were a terminal at /dev/null so the
    stop can still finish."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        if os.isatty(fd):
            os.dup2(null, fd)
    os.close(null)


def signal_group(pgid: int, sig: int, *, leader_only: bool = False) -> None:
    try:
        if leader_only:
            os.kill(pgid, sig)
        else:
            os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, from /proc/<pid>/stat."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(name))
    return out


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (state first, then ppid, pgrp, ...); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def wait_group_gone(pgid: int, timeout_s: float = 15.0) -> None:
    """Wait until no process of the launcher's session is left (ranks outliving a killed launcher), so what they
    hold can be swept; SIGKILL them after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            for pid in group_members(pgid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
            return
        time.sleep(0.1)


def _silent_ranks(spec: LaunchSpec) -> list[int]:
    """Ranks of this node that started but left no exit mark (every exit a rank controls, also the launcher's
    SIGTERM to the survivors of a dead rank, writes one): the ones killed by a signal they could not catch."""
    return [r for r in range(spec.num_ranks)
            if os.path.exists(started_file(spec.run_dir, r)) and not os.path.exists(exit_file(spec.run_dir, r))]


class RankWatch:
    """The poll at which each rank of this node was first seen dead, from the pid in its started file.

    A rank killed mid-step can take a survivor down without an exit mark too: DeepSpeed's shared-memory allreduce on
    CPU waits for its peers in C++ with no timeout, so a survivor blocked there never runs its SIGTERM handler and the
    launcher SIGKILLs it 30 s later (deepspeed/launcher/launch.py, terminate_process_tree). The order of deaths
    tells the killed rank from such survivors."""

    def __init__(self, run_dir: str, num_ranks: int):
        self.run_dir, self.num_ranks = run_dir, num_ranks
        self.pids: dict[int, int] = {}
        self.dead_at_poll: dict[int, int] = {}
        self.polls = 0

    def poll(self) -> None:
        self.polls += 1
        for rank in range(self.num_ranks):
            if rank in self.dead_at_poll:
                continue
            pid = self.pids.get(rank) or _started_pid(started_file(self.run_dir, rank))
            if pid is None:
                continue
            self.pids[rank] = pid
            if not _pid_alive(pid):
                self.dead_at_poll[rank] = self.polls


def first_dead(silent: list[int], dead_at_poll: dict[int, int]) -> list[int]:
    """Of the ranks that left no exit mark, those seen dead at the earliest poll, and those never seen dying."""
    seen = [dead_at_poll[r] for r in silent if r in dead_at_poll]
    if len(silent) <= 1 or not seen:
        return silent
    return [r for r in silent if dead_at_poll.get(r, min(seen)) == min(seen)]


def _started_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    """Running and not a zombie (the launcher reaps its ranks only when it polls them)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def _killed_by(code: int) -> str | None:
    """The signal name when `code` is a rank's negative return code as a process exit status."""
    sig = -code if code < 0 else (256 - code if code > 128 else 0)
    if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
        return signal.Signals(sig).name
    return None


def main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
