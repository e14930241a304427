"""docs/results.md is generated from the committed raw JSON (scripts/results.py), never typed by hand."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_results_md_is_what_the_raw_json_gives():
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "results.py"), "--check"], capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stderr
