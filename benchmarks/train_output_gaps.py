"""How long a command's output stays silent: each line of its stdout and stderr (one pipe, so not a terminal, as in
a log file) with the second it arrived, and from the line that starts with `launching` on, the time to the next line
and the longest gap between two lines. What `memascend train` should give: the first line after "launching"
within 30 s, the first step's line printed, no gap over 60 s until the end.

Usage (a LLaMA-Factory recipe, run from the folder holding its data/):
    python benchmarks/train_output_gaps.py --out docs/bench/train_output/NAME.json --cwd WORK \\
        --attach recipe.yaml -- memascend train recipe.yaml
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

LAUNCH_PREFIX = "launching "
"""`memascend train`'s line as it starts DeepSpeed's launcher (commands/train.py launch_and_watch)."""
FIRST_STEP_PREFIX = "step 1/"
"""`memascend train`'s line for the first step when log_every skips it (run/train_progress.py first_step_line)."""


def timed_lines(cmd: list[str], *, cwd: str | None = None, env: dict | None = None,
                timeout_s: float = 3600.0) -> tuple[int, list[tuple[float, str]]]:
    """Run `cmd` with stdout and stderr in one pipe; (exit code, [(seconds since the start, line)]). A command still
    running after timeout_s is killed (exit code -9)."""
    import threading

    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    watchdog = threading.Timer(timeout_s, proc.kill)
    watchdog.start()
    try:
        lines = [(round(time.monotonic() - t0, 2), line.rstrip("\n")) for line in proc.stdout]
        proc.wait()
    finally:
        watchdog.cancel()
    return proc.returncode, lines


def silences(lines: list[tuple[float, str]]) -> dict:
    """From the `launching` line on: seconds to the next line, the longest gap between two lines and the lines
    around it. Pure."""
    start = next((i for i, (_, text) in enumerate(lines) if text.startswith(LAUNCH_PREFIX)), None)
    if start is None:
        return {"launched": False}
    after = lines[start:]
    gaps = [(after[i + 1][0] - after[i][0], i) for i in range(len(after) - 1)]
    widest, at = max(gaps, default=(0.0, None))
    return {"launched": True, "launching_at_s": after[0][0],
            "first_line_after_launching_s": round(gaps[0][0], 2) if gaps else None,
            "max_gap_s": round(widest, 2),
            "max_gap_between": [after[at][1], after[at + 1][1]] if at is not None else None,
            "lines_after_launching": len(after) - 1,
            "first_step_line": next((text for _, text in after if text.startswith(FIRST_STEP_PREFIX)), None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="compact JSON: date, machine, command, the timed lines, the gaps")
    ap.add_argument("--cwd", default=None, help="run the command here")
    ap.add_argument("--attach", action="append", default=[], help="a file (e.g. the recipe) whose text goes into the "
                    "JSON, relative to --cwd (repeatable)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    from memascend_cli.hardware import local_cpu_model

    code, lines = timed_lines(cmd, cwd=args.cwd)
    for t, text in lines:
        print(f"{t:8.2f}  {text}")
    doc = {"what": "seconds at which each output line arrived (stdout and stderr in one pipe, not a terminal)",
           "command": shlex.join(cmd), "cwd": args.cwd,
           "recorded_by": "python benchmarks/train_output_gaps.py " + shlex.join(sys.argv[1:]),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "host": f"{platform.node()} ({os.cpu_count()} cores)", "cpu_model": local_cpu_model(),
           "exit_code": code, **silences(lines), "lines": lines,
           "attached": {name: open(os.path.join(args.cwd or ".", name)).read() for name in args.attach}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(json.dumps({k: doc.get(k) for k in ("exit_code", "first_line_after_launching_s", "max_gap_s",
                                               "max_gap_between", "first_step_line")}))


if __name__ == "__main__":
    main()
