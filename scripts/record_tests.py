"""Run a selection of the test suite (N times in a row) and record each run as compact JSON for docs/results.md.

    python scripts/record_tests.py --long --out docs/raw/long-tests.json
    python scripts/record_tests.py --times 5 --out docs/raw/parity-repeat.json tests/engine/test_engine_deepspeed.py

`--long` selects the tests marked `long` (pyproject.toml): the ones the default run (README's test command)
leaves out for time and that are recorded here instead. Each run is a fresh pytest process; the JSON keeps per-run
pass/fail counts, the failing test ids, every test's seconds, the wall time and whether any child printed C++'s
"terminate called" abort. scripts/results.py renders it.
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


def one_run(index: int, pytest_args: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="record-tests-") as d:
        junit = os.path.join(d, "junit.xml")
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args,
                               f"--junitxml={junit}"], cwd=REPO, capture_output=True, text=True)
        seconds = time.monotonic() - t0
        failed, passed, skipped, per_test = [], 0, 0, {}
        if os.path.exists(junit):
            for case in ET.parse(junit).getroot().iter("testcase"):
                name = f"{case.get('classname')}::{case.get('name')}"
                per_test[name] = round(float(case.get("time") or 0), 1)
                if case.find("failure") is not None or case.find("error") is not None:
                    failed.append(name)
                elif case.find("skipped") is not None:
                    skipped += 1
                else:
                    passed += 1
    output = proc.stdout + proc.stderr
    return {"run": index, "exit_code": proc.returncode, "passed": passed, "failed": failed, "skipped": skipped,
            "seconds": round(seconds, 1), "terminate_called": "terminate called" in output,
            "test_seconds": per_test}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--times", type=int, default=1)
    ap.add_argument("--long", action="store_true", help="the tests marked `long` (left out of the default run)")
    ap.add_argument("--out", required=True)
    ap.add_argument("tests", nargs="*", help="test files or ids (default: the whole suite)")
    args = ap.parse_args(argv)
    pytest_args = [*args.tests, *(["-m", "long"] if args.long else [])]
    runs = []
    for i in range(1, args.times + 1):
        runs.append(one_run(i, pytest_args))
        r = runs[-1]
        print(f"run {i}: exit {r['exit_code']}, {r['passed']} passed, {len(r['failed'])} failed, {r['seconds']} s",
              flush=True)
    command = " ".join(["python scripts/record_tests.py", *(["--times", str(args.times)] if args.times != 1 else []),
                        *(["--long"] if args.long else []), "--out", args.out, *args.tests])
    doc = {"command": command, "tests": " ".join(pytest_args) or "the whole suite",
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "host": f"{platform.node()} ({os.cpu_count()} cores)", "runs": runs}
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))  # one line: the repository counts tracked lines
        f.write("\n")
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
