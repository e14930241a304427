"""Run the engine's parity tests N times in a row and record each run (issue: parity tests not flaky).

    python scripts/parity_repeat.py --times 5 --out docs/raw/parity-repeat.json

Each run is a fresh `pytest tests/engine/test_engine_deepspeed.py`; the JSON keeps per-run pass/fail counts, the
failing test ids, the wall time and whether any child printed C++'s "terminate called" abort. scripts/results.py
renders it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = "tests/engine/test_engine_deepspeed.py"


def one_run(index: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="parity-repeat-") as d:
        junit = os.path.join(d, "junit.xml")
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TESTS,
                               f"--junitxml={junit}"], cwd=REPO, capture_output=True, text=True)
        seconds = time.monotonic() - t0
        cases = ET.parse(junit).getroot().iter("testcase")
        failed, passed, skipped = [], 0, 0
        for case in cases:
            name = f"{case.get('classname')}::{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(name)
            elif case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    output = proc.stdout + proc.stderr
    return {"run": index, "exit_code": proc.returncode, "passed": passed, "failed": failed, "skipped": skipped,
            "seconds": round(seconds, 1), "terminate_called": "terminate called" in output}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--times", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    runs = []
    for i in range(1, args.times + 1):
        runs.append(one_run(i))
        r = runs[-1]
        print(f"run {i}: exit {r['exit_code']}, {r['passed']} passed, {len(r['failed'])} failed, {r['seconds']} s",
              flush=True)
    doc = {"command": f"python scripts/parity_repeat.py --times {args.times} --out {args.out}", "tests": TESTS,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "host": f"{platform.node()} ({os.cpu_count()} cores)", "runs": runs}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
