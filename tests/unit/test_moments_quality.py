"""The verdict of benchmarks/moments_quality.py (bf16 vs fp32 Adam moments on SmolLM2): pure parts."""

from __future__ import annotations

import importlib.util
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("moments_quality", os.path.join(REPO, "benchmarks", "moments_quality.py"))
mq = importlib.util.module_from_spec(_spec)
sys.modules["moments_quality"] = mq
_spec.loader.exec_module(mq)


def _curve(shift: float, wiggle: float = 0.05) -> list[float]:
    # A decaying loss with a step-to-step wiggle (the fp32 run's noise), optionally shifted.
    return [2.0 * math.exp(-i / 60) + wiggle * math.sin(2.1 * i) + shift for i in range(200)]


def test_a_curve_inside_the_noise_passes_and_one_outside_fails():
    val = [{"step": s, "loss": 1.0} for s in (10, 100, 200)]
    same = mq.compare(_curve(0), _curve(0.005), val, [{"step": s, "loss": 1.01} for s in (10, 100, 200)])
    assert same["within_noise"] and same["max_smoothed_gap"] <= same["noise"]
    assert [v["relative"] for v in same["validation"]] == [0.01] * 3
    apart = mq.compare(_curve(0), _curve(0.2), val, val)
    assert not apart["within_noise"] and apart["max_smoothed_gap"] > apart["noise"]
    # A validation loss off by more than the tolerance fails even when the training curves agree.
    off = mq.compare(_curve(0), _curve(0), val, [{"step": s, "loss": 1.05} for s in (10, 100, 200)])
    assert not off["within_noise"]


def test_table_says_the_verdict():
    val = [{"step": 10, "loss": 1.0}]
    doc = {"criterion": {"window_steps": mq.WINDOW, "validation_tolerance": mq.VALIDATION_TOLERANCE},
           "runs": {k: {"losses": _curve(0), "seconds_per_step": 9.0,
                        "optimizer_bytes": {"read": 12, "written": 12}} for k in ("fp32", "bf16")},
           "comparison": mq.compare(_curve(0), _curve(0), val, val)}
    text = mq.tables(doc)
    assert "Within noise: **yes**" in text and "| 10 | 1.0000 | 1.0000 | +0.00% |" in text
