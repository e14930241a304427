"""`--help`, `inspect` and `plan` never import torch/deepspeed and start well under a second."""

import json
import os
import subprocess
import sys
import time

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


def _best_of(cmd, n=3):
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, timeout=60, env={**os.environ, "COLUMNS": "120"})
        best = min(best, time.perf_counter() - t)
    return best


def test_plan_starts_fast():
    exe = [sys.executable, "-m", "memascend_cli"]
    assert _best_of(exe + ["--help"]) < 1.0
    assert _best_of(exe + ["plan", "--hardware", "h100-80g-512g", "--model", "llama-3.1-8b"]) < 1.0
