"""`memascend launch`: a user's own DeepSpeed program, unmodified, with the memascend engine in every rank.

How the engine gets in: the program's environment gets the engine's `launch_hook/` folder first on PYTHONPATH. It
holds one file, `sitecustomize.py`, which Python's site module imports at start-up in every interpreter the program
starts (launchers, ranks, helpers; site.py execsitecustomize). The hook runs the sitecustomize it hides, if any, and
calls memascend_engine.autoinstall.start(), which waits for `import deepspeed` and installs the engine at the
program's first `deepspeed.zero.Init` or `deepspeed.initialize`, with the config that call passes. Each process that
imports DeepSpeed leaves one JSON record in the status folder (`record_path`); `summarize` turns them into the
closing lines (engine engaged or not, and why, or where the program failed before; region bytes read and written).

Stdlib only: the CLI imports it, and so does every process of the program at start-up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

ENV = "MEMASCEND_LAUNCH"
"""JSON {"region", "model", "placement", "status_dir"} for the hook (engine/launch_hook/sitecustomize.py reads it too: a Python
without memascend cannot import this module)."""
HOOK_DIR = "launch_hook"
"""The folder of the memascend_engine package put on PYTHONPATH; it holds nothing but sitecustomize.py."""
STATUS_DIR = "status"
"""RUN/status/<pid>.json: one record per process that imported DeepSpeed (or could not import the engine); beside it
<pid>.steps.jsonl, a line per optimizer step (engine/launch_steps.py), and <pid>.config.json, the model's Hugging
Face config (memascend_cli/run/launch_progress.py plans with it)."""

# The `state` of a record, from least to most engaged.
NO_ENGINE = "no_engine"
"""The process's Python cannot import memascend_engine (written by the hook itself; fields python, error)."""
IMPORTED = "imported"
"""DeepSpeed was imported and nothing called deepspeed.zero.Init or deepspeed.initialize (yet)."""
FAILED = "failed"
"""install() raised, or the program raised inside deepspeed.zero.Init (its call or its `with` block) or
deepspeed.initialize before that returned (fields error, and `during`: the call, for the latter); the program fails
with that exception."""
INSTALLED = "installed"
"""The engine is installed (fields nvme, zero_stage, offload), at the program's first deepspeed.zero.Init or
deepspeed.initialize, and deepspeed.initialize has not returned: no engine of the program's uses it yet."""
ENGAGED = "engaged"
"""deepspeed.initialize returned with the engine installed: the program's DeepSpeed engine uses it (fields as
INSTALLED, and job: what DeepSpeed sized; at a normal exit also bytes_read, bytes_written, swap_files,
vm_hwm_bytes)."""

LEFTOVER_GRACE_S = 10.0
"""After the program's first process exits: how long what it left in its session gets after SIGTERM before SIGKILL."""


def hook_dir() -> str:
    """The engine's launch_hook folder, found without importing the engine (that would import its dependencies)."""
    import importlib.util

    from memascend_cli.errors import MemascendError

    spec = importlib.util.find_spec("memascend_engine")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, HOOK_DIR)
        if os.path.isfile(os.path.join(path, "sitecustomize.py")):
            return path
    raise MemascendError("the memascend engine's start-up hook (memascend_engine/launch_hook) is not installed",
                         "install the training extras: pip install 'memascend[train]'")


def build_env(base: dict[str, str], *, hook: str, status_dir: str, region: str | None, model: str | None,
              lifeline_token: str, placement: str = "auto") -> dict[str, str]:
    """The program's environment: `base` with the hook first on PYTHONPATH, its settings, the CLI's lifeline
    (memascend_cli/run/lifeline.py; the hook starts the watch in every Python process) and the engine ranks'
    variables (defaults.ENGINE_ENV) where `base` does not set them. Pure."""
    from memascend_cli.defaults import ENGINE_ENV
    from memascend_cli.run import lifeline

    env = {**ENGINE_ENV, **base}
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != hook]
    env["PYTHONPATH"] = os.pathsep.join([hook, *rest])
    env[ENV] = json.dumps({"region": region, "model": model, "placement": placement, "status_dir": status_dir})
    env[lifeline.ENV] = lifeline_token
    return env


def parse_env(env) -> dict | None:
    """The hook's settings from the environment, None when the process was not started by `memascend launch`."""
    try:
        cfg = json.loads(env.get(ENV, ""))
    except ValueError:
        return None
    return cfg if isinstance(cfg, dict) and cfg.get("status_dir") else None


def record_path(status_dir: str, pid: int) -> str:
    return os.path.join(status_dir, f"{pid}.json")


def steps_path(status_dir: str, pid: int) -> str:
    return os.path.join(status_dir, f"{pid}.steps.jsonl")


def model_config_path(status_dir: str, pid: int) -> str:
    return os.path.join(status_dir, f"{pid}.config.json")


def write_model_config(status_dir: str, pid: int, config: dict) -> None:
    """The model's Hugging Face config as a config.json (`memascend plan --model` reads the same file)."""
    with open(model_config_path(status_dir, pid), "w", encoding="utf-8") as f:
        json.dump(config, f)


def write_record(status_dir: str, record: dict) -> None:
    """Write (or replace) this process's record atomically: the CLI may read it at any time."""
    path = record_path(status_dir, record["pid"])
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def read_records(status_dir: str) -> list[dict]:
    """Every record in the status folder, by pid; unreadable ones skipped."""
    out = []
    try:
        names = sorted(n for n in os.listdir(status_dir) if n.endswith(".json") and n[:-5].isdigit())
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(status_dir, name), encoding="utf-8") as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: (r.get("rank") is None, r.get("rank") or 0, r.get("pid", 0)))


def who(r: dict) -> str:
    return f"rank {r['rank']}" if r.get("rank") is not None else f"process {r.get('pid')}"


def summarize(records: list[dict]) -> list[tuple[str, str]]:
    """The closing lines, (level, text) with level 'ok', 'warn' or 'error'. Pure.

    Engaged ranks report their region traffic, failed ones where they failed; when no process got the engine, one line
    says why: the program's Python has no memascend, or it never called deepspeed.zero.Init / deepspeed.initialize, or
    no process imported DeepSpeed."""
    from memascend_cli.units import fmt_bytes

    lines: list[tuple[str, str]] = []
    engaged = [r for r in records if r.get("state") == ENGAGED]
    for r in engaged:
        name = who(r)
        kept = r.get("placement") if not r.get("nvme") and r.get("placement") else None
        if kept is not None and not kept.get("move"):
            lines.append(("ok", f"{name}: engine engaged; offload kept in {kept.get('kept', 'DRAM')} as the config "
                                f"writes it, memascend's region not used ({kept.get('reason')})"))
        elif not r.get("nvme"):
            lines.append(("warn", f"{name}: engine installed, but its DeepSpeed config offloads nothing to NVMe (ZeRO "
                                  f"stage {r.get('zero_stage')}, offload {r.get('offload') or 'none'}): nothing went "
                                  "to the SSD; use ZeRO-3, and the engine moves the offload to the region"))
        elif "bytes_read" not in r and r.get("by_program"):
            lines.append(("ok", f"{name}: engine installed by the program itself (memascend_engine.install()); its "
                                "handle's stats() has the region traffic"))
        elif "bytes_read" not in r:
            lines.append(("warn", f"{name}: engine engaged; no I/O totals (the process did not exit normally)"))
        elif r["bytes_read"] + r["bytes_written"] == 0 and r.get("region"):
            lines.append(("warn", f"{name}: engine engaged, but nothing was read or written in the region"))
        elif r.get("region"):
            lines.append(("ok", f"{name}: engine engaged, region read {fmt_bytes(r['bytes_read'])}, written "
                                f"{fmt_bytes(r['bytes_written'])}, {r.get('swap_files', 0)} swap files"))
        else:
            lines.append(("ok", f"{name}: engine engaged without a region (no Direct NVMe): "
                                f"{r.get('swap_files', 0)} DeepSpeed swap files"))
    for r in records:
        if r.get("state") == INSTALLED:
            lines.append(("warn", f"{who(r)}: engine installed, but the process ended before deepspeed.initialize "
                                  "returned: no DeepSpeed engine used it"))
        elif r.get("state") == FAILED and r.get("during"):
            lines.append(("error", f"{who(r)}: the program failed in {r['during']} before the engine was in use: "
                                   f"{r.get('error')}"))
        elif r.get("state") == FAILED:
            lines.append(("error", f"{who(r)}: installing the engine failed: {r.get('error')}"))
    if engaged or any(r.get("state") in (FAILED, INSTALLED) for r in records):
        return lines
    missing = [r for r in records if r.get("state") == NO_ENGINE]
    if missing:  # first: a launcher in memascend's Python can import DeepSpeed while the ranks run in another
        pythons = ", ".join(sorted({r.get("python", "?") for r in missing}))
        lines.append(("warn", f"the engine never engaged: the program's Python ({pythons}) cannot import "
                              f"memascend_engine ({missing[0].get('error')}); run the program with the Python "
                              "memascend is installed in, or install memascend[train] into its environment"))
    elif any(r.get("state") == IMPORTED for r in records):
        lines.append(("warn", "the engine never engaged: the program imported DeepSpeed but never called "
                              "deepspeed.zero.Init or deepspeed.initialize"))
    else:
        lines.append(("warn", "the engine never engaged: no Python process of the program imported DeepSpeed (or "
                              "its interpreter ignores PYTHONPATH: python -E, -I or -S)"))
    return lines


def forwarded_signal(signum: int) -> int:
    """The signal the program's process group gets for one the CLI received: SIGHUP (a closed terminal, a
    scheduler) becomes SIGTERM, the one a training program is most likely to handle; the others pass unchanged."""
    return signal.SIGTERM if signum == signal.SIGHUP else signum


def run_program(cmd: list[str], env: dict[str, str], *, policy, on_tick=None) -> tuple[int, list[str]]:
    """Run `cmd` in a session of its own until none of its processes is left; returns (its exit status as a shell
    reports it, the stop requests received). `on_tick()` runs about once a second while it runs (the progress
    lines).

    The session keeps a terminal's Ctrl-C away from the program: the CLI forwards it (and SIGTERM; SIGHUP as
    SIGTERM) to the whole process group once, and SIGKILLs the group on a second request or when policy.grace_s
    runs out. Every Python process of the program watches the CLI's lifeline (the hook starts it) and SIGKILLs the
    whole session once the CLI is gone, so nothing outlives the CLI. No PR_SET_PDEATHSIG here (unlike train's
    launcher): a program that exits on that SIGTERM before its lifeline fires would leave its other processes
    behind. What the program leaves in its session when its first process exits gets SIGTERM, then SIGKILL after
    LEFTOVER_GRACE_S.
    """
    from memascend_cli.errors import BadInput
    from memascend_cli.run.launch import (
        SIGNAL_REASONS,
        StopState,
        detach_from_hung_up_terminal,
        group_members,
        main_thread,
        say,
        signal_group,
        wait_group_gone,
    )

    state = StopState(policy)

    def on_signal(signum, frame):
        if signum == signal.SIGHUP:
            detach_from_hung_up_terminal()
        reason = SIGNAL_REASONS[signal.Signals(signum)]
        action = state.request(reason, time.monotonic())
        if action == "graceful":
            sig = forwarded_signal(signum)
            say(f"[yellow]stopping ({reason}):[/yellow] {signal.Signals(sig).name} sent to the program's processes "
                f"(a second signal, or {policy.grace_s:g} s from now, stops them at once)")
            signal_group(proc.pid, sig)
        elif action == "at once":
            say(f"[red]stopping at once:[/red] {state.at_once}")
            signal_group(proc.pid, signal.SIGKILL)

    try:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    except (FileNotFoundError, PermissionError) as exc:
        raise BadInput(f"cannot run {cmd[0]}: {exc.strerror}", "check the command after --") from None
    previous = {s: signal.signal(s, on_signal) for s in SIGNAL_REASONS} if main_thread() else {}
    next_tick = time.monotonic() + 1.0
    try:
        while proc.poll() is None:
            if state.tick(time.monotonic()) == "at once":
                say(f"[red]stopping at once:[/red] {state.at_once}")
                signal_group(proc.pid, signal.SIGKILL)
            if on_tick is not None and time.monotonic() >= next_tick:
                on_tick()
                next_tick = time.monotonic() + 1.0
            time.sleep(0.2)
        if group_members(proc.pid):
            signal_group(proc.pid, signal.SIGTERM)
            wait_group_gone(proc.pid, timeout_s=LEFTOVER_GRACE_S)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        wait_group_gone(proc.pid)
    code = proc.returncode
    return (128 - code if code < 0 else code), list(state.reasons)
