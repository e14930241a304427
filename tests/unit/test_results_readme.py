"""The README's headline table (scripts/results_readme.py): generated from the committed JSON between its markers,
each engine's cell from its own run, a variant named where only it ran."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import results_readme as rr  # noqa: E402

GiB = 1 << 30


def test_cells_say_what_happened():
    assert rr.cell({"ok": True, "peak_system_bytes": 3 * GiB, "tokens_per_s": 18.8}) == "3.00 GiB, 19 tok/s"
    assert rr.cell({"ok": False, "oom_killed": True, "peak_system_bytes": 12 * GiB}) == "OOM-killed"
    assert rr.cell({"ok": False, "oom_killed": False, "peak_system_bytes": 1}) == "failed"
    assert rr.cell(None) == "-"
    runs = {"memascend-no-overlap_optimizer": {"ok": True, "peak_system_bytes": 4 * GiB, "tokens_per_s": 5.7}}
    assert rr.engine_cell(runs, "memascend") == "4.00 GiB, 6 tok/s (no-overlap_optimizer)"
    assert rr.engine_cell(runs, "tuned") == "-"


def test_the_block_replaces_only_what_is_between_the_markers():
    readme = f"# x\n\nintro\n{rr.START}\nold table\n{rr.END}\n\n## Quick start\n"
    out = rr.with_headline(readme)
    assert out.startswith("# x\n\nintro\n" + rr.START) and out.endswith(rr.END + "\n\n## Quick start\n")
    assert "old table" not in out and "| job | machine | stock | tuned | memascend |" in out
    assert rr.with_headline(out) == out  # idempotent
    with pytest.raises(SystemExit):
        rr.with_headline("# no markers\n")


def test_the_committed_readme_has_todays_table():
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    assert rr.with_headline(text) == text, "run `python scripts/results.py`"
    # Four jobs, every cell measured (no engine left blank).
    table = text.split(rr.START)[1].split(rr.END)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| job")]
    assert len(rows) == 4 and not any(" - |" in r for r in rows)
