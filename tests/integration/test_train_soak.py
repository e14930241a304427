"""A short soak (scripts/soak_train.py) of `memascend train` tiny-cpu: checkpoint rotation keeps at most the limit,
and neither the rank's descriptors nor /dev/shm grow from the first checkpoint to the end. The 2,000-step soak is
the same script with its defaults (a benchmark; its memory slope target: below 1 MiB per 100 steps).
Slow: one launch of 40 steps (about a minute on the 2-core VM)."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak_train", os.path.join(REPO, "scripts", "soak_train.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_slope_is_mib_per_100_steps_after_warmup():
    soak = _soak_module()
    flat = [(s, 1.0) for s in range(1, 50)]
    assert soak.slope_mib_per_100_steps(flat, 5) == 0.0
    rising = [(s, 1.0 + s / 1024 / 100) for s in range(1, 50)]  # 1 MiB per 100 steps
    assert soak.slope_mib_per_100_steps(rising, 5) == pytest.approx(1.0)
    assert soak.slope_mib_per_100_steps([(1, 1.0), (9, 9.0)], 5) is None  # one point after warm-up


def test_short_soak_keeps_the_limit_and_leaks_nothing(tmp_path):
    summary = _soak_module().soak(40, 5, 2, str(tmp_path / "run"), sample_s=0.5)
    assert summary["exit"] == 0, summary
    assert summary["checkpoints_at_end"] == 2 and summary["max_checkpoints_seen"] <= 3, summary  # + one renamed in
    first, last = summary["fds_floor_first_last_third"]
    assert last <= first, summary
    during, after = summary["job_segments_max_during_at_end"]  # /dev/shm as a whole moves with other users' jobs
    assert summary["samples"] > 5 and during <= 1 and after == 0, summary
