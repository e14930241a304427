"""`--help`, `inspect` and `plan` never import torch/deepspeed and start well under a second."""

import json
import os
import subprocess
import sys

import pytest

CHECK = """
import sys, json
from memascend_cli.app import main
try:
    main({args!r})
except SystemExit:
    pass
heavy = [m for m in ("torch", "deepspeed", "transformers", "memascend_engine") if m in sys.modules]
sys.stderr.write("HEAVY=" + json.dumps(heavy) + "\\n")
"""


@pytest.mark.parametrize("args", [["--help"], ["plan", "--hardware", "cpu-24g"], ["plan", "--json"], ["inspect"]])
def test_no_heavy_imports(args):
    r = subprocess.run([sys.executable, "-c", CHECK.format(args=args)], capture_output=True, text=True, timeout=60)
    line = [x for x in r.stderr.splitlines() if x.startswith("HEAVY=")][-1]
    assert json.loads(line[len("HEAVY="):]) == []


def _cpu_seconds(cmd, n=3):
    """Best-of-n CPU time (user + sys) of the command: unlike wall time it does not depend on what
    else the 2-core CI machine is running."""
    best = float("inf")
    for _ in range(n):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "COLUMNS": "120"})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        best = min(best, usage.ru_utime + usage.ru_stime)
    return best


def test_plan_starts_fast():
    exe = [sys.executable, "-m", "memascend_cli"]
    assert _cpu_seconds(exe + ["--help"]) < 0.5
    assert _cpu_seconds(exe + ["plan", "--hardware", "h100-80g-512g", "--model", "llama-3.1-8b"]) < 1.0
    assert _cpu_seconds(exe + ["plan", "--no-search"]) < 0.6
