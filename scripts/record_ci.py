"""Run the README's test command (CI's `.ci/run`) on a fresh clone of this checkout's HEAD and record how long it took,
phase by phase, as compact JSON for docs/results (scripts/results.py renders it).

    python scripts/record_ci.py --out docs/raw/ci-fresh-clone.json

The clone gets no .venv and no prebuilt ops: setup (apt packages already installed are skipped; pip's cache is
whatever this machine has, recorded) and the tests run as CI runs them. The load average before and after is kept:
the figure means little beside other work.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASE = re.compile(r"\[bootstrap (\d+)s\]\S* (.*)")
SUMMARY = re.compile(r"^=*\s*(.*\b(?:passed|failed)\b.*) in ([\d.]+)s")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|warnings?)")
SLOWEST = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)")


def parse_log(text: str) -> dict:
    """Setup phases (the bootstrap's own timestamped lines), the pytest summary and its slowest tests. Pure."""
    phases = [{"at_s": int(m.group(1)), "what": m.group(2).strip()} for m in PHASE.finditer(text)]
    counts, tests_s, slowest = {}, None, []
    failed = [line.split()[1] for line in text.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    for line in text.splitlines():
        m = SUMMARY.match(line)
        if m:
            counts = {k.rstrip("s") if k.startswith(("error", "warning")) else k: int(n)
                      for n, k in COUNT.findall(m.group(1))}
            tests_s = float(m.group(2))
        s = SLOWEST.match(line)
        if s:
            slowest.append({"seconds": float(s.group(1)), "when": s.group(2), "test": s.group(3)})
    return {"phases": phases, "counts": counts, "tests_s": tests_s, "failed": failed, "slowest": slowest[:10]}


def machine() -> dict:
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    return {"host": platform.node(), "cpu": model, "cores": os.cpu_count(), "mem_gib": round(mem_kib / 2**20, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON document; a run is appended to its runs")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, check=True, capture_output=True,
                            text=True).stdout.strip()
    pip_cache = os.path.expanduser("~/.cache/pip")
    with tempfile.TemporaryDirectory(prefix="record-ci-", dir="/var/tmp") as d:
        clone = os.path.join(d, "clone")
        subprocess.run(["git", "clone", "-q", REPO, clone], check=True)
        load_before = os.getloadavg()
        t0 = time.monotonic()
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "TORCH_EXTENSIONS_DIR")}
        proc = subprocess.run(["bash", ".ci/run"], cwd=clone, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - t0
        log = proc.stdout + proc.stderr
        shutil.rmtree(clone, ignore_errors=True)
    run = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
           "exit_code": proc.returncode, "seconds": round(seconds, 1),
           "load_before": [round(x, 2) for x in load_before],
           "load_after": [round(x, 2) for x in os.getloadavg()],
           "pip_cache_warm": os.path.isdir(pip_cache) and any(os.scandir(pip_cache)), "machine": machine(),
           **parse_log(log)}
    doc = {"command": "python scripts/record_ci.py --out " + os.path.relpath(os.path.abspath(args.out), REPO),
           "what": "bash .ci/run (the README's test command) on a fresh clone", "runs": []}
    if os.path.exists(args.out):
        with open(args.out) as f:
            doc["runs"] = json.load(f)["runs"]
    doc["runs"].append(run)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(json.dumps({k: run[k] for k in ("exit_code", "seconds", "tests_s", "counts")}))
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
