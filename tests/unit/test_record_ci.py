"""scripts/record_ci.py reads the test command's log: the bootstrap's timestamped phases, pytest's summary counts and
time, its slowest tests; and the reliability page renders the record."""

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import record_ci  # noqa: E402
from results_records import section_ci  # noqa: E402

LOG = """\x1b[36m[bootstrap 0s]\x1b[0m creating .venv
\x1b[36m[bootstrap 3s]\x1b[0m no GPU: installing torch==2.13.0 (CPU)
\x1b[36m[bootstrap 281s]\x1b[0m running the tests on 2 workers
============================= slowest 30 durations =============================
73.54s call     tests/ds_upstream/test_x.py::TestX::test_y[streaming-nvme-none]
18.04s setup    tests/integration/test_train_cpu.py::test_tuned
=========================== short test summary info ============================
FAILED tests/unit/test_a.py::test_b - assert 1 == 2
2 failed, 1839 passed, 23 skipped, 92 xfailed, 7 warnings, 1 error in 1332.49s (0:22:12)
"""


def test_the_log_gives_phases_counts_time_and_the_slowest_tests():
    d = record_ci.parse_log(LOG)
    assert [p["at_s"] for p in d["phases"]] == [0, 3, 281]
    assert d["phases"][2]["what"] == "running the tests on 2 workers"
    assert d["counts"] == {"failed": 2, "passed": 1839, "skipped": 23, "xfailed": 92, "warning": 7, "error": 1}
    assert d["tests_s"] == 1332.49
    assert d["failed"] == ["tests/unit/test_a.py::test_b"]
    assert d["slowest"][0] == {"seconds": 73.54, "when": "call",
                               "test": "tests/ds_upstream/test_x.py::TestX::test_y[streaming-nvme-none]"}
    assert d["slowest"][1]["when"] == "setup"


def test_a_log_without_a_summary_records_no_counts():
    d = record_ci.parse_log("\x1b[36m[bootstrap 0s]\x1b[0m creating .venv\nerror: pip failed\n")
    assert d["counts"] == {} and d["tests_s"] is None and d["slowest"] == [] and d["failed"] == []


def test_the_page_shows_every_run_with_its_setup_and_test_minutes(tmp_path):
    run = {"date": "2026-12-06T12:40:00+00:00", "commit": "0123456789ab", "exit_code": 0, "seconds": 1290.0,
           "load_before": [0.5, 0.4, 0.3], "load_after": [2.1, 2.0, 1.5], "pip_cache_warm": True,
           "machine": {"host": "h", "cpu": "Some CPU", "cores": 2, "mem_gib": 23.4}, **record_ci.parse_log(LOG)}
    path = tmp_path / "ci.json"
    path.write_text(json.dumps({"command": "python scripts/record_ci.py --out x", "what": "bash .ci/run",
                                "runs": [run]}))
    text = section_ci(str(path))
    row = next(l for l in text.splitlines() if l.startswith("| 2026-12-06"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["2026-12-06 12:40", "01234567", "0", "21.5", "4.7", "22.2", "1839 / 2 / 23", "0.5 / 2.1"]
    assert "`tests/ds_upstream/test_x.py::TestX::test_y[streaming-nvme-none]` (call): 74 s" in text
