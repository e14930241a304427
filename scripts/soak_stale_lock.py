"""Soak: runs OOM-killed under a DRAM cap leave nothing that blocks the next run.

Three parts, every command a real `memascend bench` of tiny-llama (seq 64, 2 steps, the tuned engine) on a private
copy of the extensions folder ($TORCH_EXTENSIONS_DIR, so other jobs' loads on the machine do not show up as locks
here):
  capped   - for each cap (150..400 MiB by default) a capped run, OOM-killed somewhere in setup, then at once an
             uncapped run: the capped run's reason, the phase its rank died in, the uncapped run's outcome and the op
             build locks left after each;
  stale    - op build locks placed by hand (an hour old, nobody holding them): the next run's note and outcome;
  live     - a process holding the shm op's lock as torch's FileBaton does: how soon the run names the holder, and
             the run's outcome once the holder lets go (after the rank reported its wait, or 30 s).
Writes compact JSON (date, machine, commands, per-run phase/reason/outcome) to OUT/soak-<date>T<hh-mm>.json. Needs root
(the cap's memory cgroup).

    sudo .venv/bin/python scripts/soak_stale_lock.py --out docs/bench/stale_lock
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

from memascend_cli.bench.document import write_summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = ["bench", "--model", "tiny-llama", "--seq-len", "64", "--steps", "2", "--runs", "tuned", "--settle-cap", "2"]
DEFAULT_CAPS_MIB = (150, 175, 200, 225, 250, 275, 300, 325, 350, 400)
HOLDER = ("import os, sys\n"
          "fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL)\n"  # torch/utils/file_baton.py try_acquire
          "print('ready', flush=True)\n"
          "sys.stdin.readline()\n"
          "os.close(fd)\n"
          "os.remove(sys.argv[1])\n")  # FileBaton.release


def private_extensions(src: str, dst: str) -> str:
    """A copy of the extensions folder (same mtimes, so ninja finds the ops built), without locks. Real copies, not hard
    links: a build in either folder appends to ninja's logs in place."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("lock"))
    return dst


def locks(ext: str) -> list[str]:
    return sorted(os.path.relpath(p, ext) for p in glob.glob(os.path.join(ext, "*", "lock")))


def bench(args: list[str], out: str, env: dict, *, on_line=None, timeout_s: float = 900) -> dict:
    """One `memascend bench` with its output lines timed from the launch; its run's outcome from bench.json."""
    cmd = [os.path.join(os.path.dirname(sys.executable), "memascend"), *BENCH, *args, "--out", out]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in p.stdout:
        lines.append((round(time.monotonic() - t0, 2), line.rstrip("\n")))
        if on_line is not None:
            on_line(lines[-1])
        if time.monotonic() - t0 > timeout_s:
            p.kill()
    rc = p.wait()
    rec = {"command": " ".join(["memascend", *BENCH, *args]), "rc": rc, "wall_s": round(time.monotonic() - t0, 1)}
    try:
        with open(os.path.join(out, "bench.json")) as f:
            run = json.load(f)["runs"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return {**rec, "ok": False, "reason": "no bench.json", "tail": [t for _, t in lines[-5:]]}
    phases = [p["name"] for p in run.get("phases", [])]
    return {**rec, "ok": run["ok"], "reason": run.get("error"), "oom_killed": run.get("oom_killed"),
            "thrashed": run.get("thrashed"), "waited_on": run.get("waited_on"),
            "last_phase": phases[-1] if phases else None, "steps": len(run.get("losses") or []),
            "notes": [t for _, t in lines if t.startswith("note: ") and "lock" in t]}


def died_in(reason: str | None) -> str | None:
    """The phase a bench reason names: 'OOM-killed at step 1 (zero_init) ...' -> 'zero_init'. Pure."""
    m = re.search(r"\(([a-z0-9_.]+)\)", reason or "")
    return m.group(1) if m else None


def capped_part(caps: list[int], work: str, ext: str, env: dict) -> list[dict]:
    rows = []
    for i, cap in enumerate(caps):
        c = bench(["--dram-cap", f"{cap}MiB"], os.path.join(work, f"capped-{i}"), env)
        c.update(cap_mib=cap, died_in=died_in(c["reason"]), locks_after=locks(ext))
        c["reason_names_oom_at_its_phase"] = bool(c["oom_killed"] and "OOM-killed" in (c["reason"] or "")
                                                  and c["died_in"] == c["last_phase"])
        u = bench([], os.path.join(work, f"uncapped-{i}"), env)
        u.update(locks_after=locks(ext))
        rows.append({"capped": c, "uncapped": u})
        print(f"cap {cap} MiB: {c['reason']} | next uncapped: {'ok' if u['ok'] else u['reason']} "
              f"({u['wall_s']} s), locks {u['locks_after']}", flush=True)
    return rows


def stale_part(work: str, ext: str, env: dict) -> dict:
    placed = []
    for op in ("deepspeed_shm_comm", "cpu_adam"):
        lock = os.path.join(ext, op, "lock")
        open(lock, "w").close()
        hour_ago = time.time() - 3600
        os.utime(lock, (hour_ago, hour_ago))
        placed.append(os.path.relpath(lock, ext))
    r = bench([], os.path.join(work, "stale"), env)
    r.update(placed=placed, locks_after=locks(ext))
    print(f"stale locks {placed}: {'ok' if r['ok'] else r['reason']}, notes {r['notes']}", flush=True)
    return r


def live_part(work: str, ext: str, env: dict, *, release_after_s: float = 30.0) -> dict:
    lock = os.path.join(ext, "deepspeed_shm_comm", "lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, lock], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "ready"
    events = os.path.join(work, "live", "runs", "tuned", "events-rank0.jsonl")
    seen: dict = {}

    def on_line(line):
        if f"pid {holder.pid}" in line[1] and "said" not in seen:
            seen["said"] = line[0]

    def release_when_waited():
        t0 = time.monotonic()
        while holder.poll() is None:
            try:
                with open(events) as f:
                    waited = any('"event": "wait"' in ln for ln in f)
            except OSError:
                waited = False
            if waited or time.monotonic() - t0 > release_after_s:
                seen["released_at_s"] = round(time.monotonic() - t0, 1)
                holder.stdin.write("\n")
                holder.stdin.flush()
                holder.wait()
            time.sleep(0.2)

    import threading

    t = threading.Thread(target=release_when_waited, daemon=True)
    t.start()
    r = bench([], os.path.join(work, "live"), env, on_line=on_line)
    with open(events) as f:
        evs = [json.loads(ln) for ln in f if ln.strip()]
    blocked = next((e["t_mono"] for e in evs if e.get("name") == "init_distributed"), None)
    wait = next((e for e in evs if e.get("event") == "wait"), None)
    # The rank reaches the lock in init_distributed (the shm op): its report's time from there bounds the time from
    # being blocked to saying so.
    r["rank_said_after_blocked_s"] = round(wait["t_mono"] - blocked, 2) if wait and blocked else None
    r["rank_wait_event"] = wait
    if holder.poll() is None:
        holder.kill()
        holder.wait()
    t.join(5)
    r.update(held=os.path.relpath(lock, ext), holder_pid=holder.pid, cli_said_after_launch_s=seen.get("said"),
             released_at_s=seen.get("released_at_s"), locks_after=locks(ext))
    print(f"live lock: the CLI named its holder {r['cli_said_after_launch_s']} s after the launch, the rank "
          f"{r['rank_said_after_blocked_s']} s after it was blocked; {'ok' if r['ok'] else r['reason']}", flush=True)
    return r


def machine() -> dict:
    with open("/proc/meminfo") as f:
        mem_kib = int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1])
    return {"host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
            "mem_gib": round(mem_kib / 2**20, 1), "python": platform.python_version()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "bench", "stale_lock"))
    ap.add_argument("--caps", default=",".join(map(str, DEFAULT_CAPS_MIB)), help="MiB, comma-separated")
    ap.add_argument("--parts", default="capped,stale,live")
    a = ap.parse_args(argv)
    env = dict(os.environ)
    src = env.get("TORCH_EXTENSIONS_DIR") or os.path.join(REPO, ".torch_ext")
    work = tempfile.mkdtemp(prefix="memascend-soak-lock-")
    ext = private_extensions(src, os.path.join(work, "ext"))
    env.update(TORCH_EXTENSIONS_DIR=ext, DS_ACCELERATOR=env.get("DS_ACCELERATOR", "cpu"))
    ninja = shutil.which("ninja", path=env.get("PATH"))
    built = {op: ninja is not None and "no work to do" in subprocess.run(
        [ninja, "-n", "-C", os.path.join(ext, op)], capture_output=True, text=True, check=False).stdout
        for op in sorted(os.listdir(ext))}
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout
    doc = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine(),
           "commit": commit.strip(), "command": " ".join(["python", "scripts/soak_stale_lock.py", *(argv or sys.argv[1:])]),
           "extensions": "copy of " + src, "ops_built_at_start": built}
    parts = a.parts.split(",")
    try:
        if "capped" in parts:
            doc["capped"] = capped_part([int(c) for c in a.caps.split(",")], work, ext, env)
            doc["capped_bars"] = {
                "uncapped_completed": sum(r["uncapped"]["ok"] for r in doc["capped"]),
                "runs": len(doc["capped"]),
                "locks_left": sorted({x for r in doc["capped"] for x in r["capped"]["locks_after"]
                                      + r["uncapped"]["locks_after"]}),
                "reasons_name_oom_at_phase": sum(r["capped"]["reason_names_oom_at_its_phase"] for r in doc["capped"]),
                "phases_died_in": sorted({r["capped"]["died_in"] or "?" for r in doc["capped"]})}
        if "stale" in parts:
            doc["stale"] = stale_part(work, ext, env)
        if "live" in parts:
            doc["live"] = live_part(work, ext, env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"soak-{doc['date'][:16].replace(':', '-')}.json.gz")  # as the repository keeps it
    write_summary(path, doc)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
