"""The pure parts of benchmarks/ssd_bound_rounds.py: every round's bench command, a run's SSD share of its step, the
rounds' medians and paired ratios to tuned stock; and their section on the time page."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("ssd_bound_rounds",
                                               os.path.join(REPO, "benchmarks", "ssd_bound_rounds.py"))
sr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sr)
sys.path.insert(0, os.path.join(REPO, "scripts"))
import results_ssd  # noqa: E402

THROTTLE = {"read_bytes_per_s": 400e6, "write_bytes_per_s": 400e6}


def _args() -> argparse.Namespace:
    return argparse.Namespace(model="bench-llama-136m", seq_len=512, steps=4, dtype="bf16",
                              runs="tuned,memascend,memascend-bf16_moments", bandwidth="400MB/s",
                              gradient_clipping=0.0, settle_cap=30.0)


def test_every_round_runs_the_same_bench_but_for_its_out_and_title():
    one, two = sr.bench_args(_args(), "/w/round1", "t, round 1"), sr.bench_args(_args(), "/w/round2", "t, round 2")
    assert [x for x in one if x not in ("/w/round1", "t, round 1")] == [x for x in two
                                                                         if x not in ("/w/round2", "t, round 2")]
    assert one[one.index("--gradient-clipping") + 1] == "0" and one[one.index("--ssd-bandwidth") + 1] == "400MB/s"


def test_ssd_share_is_the_busier_direction_over_the_step():
    run = {"ok": True, "seconds_per_step": 5.0, "ssd_read_bytes_per_step": 1.6e9, "ssd_write_bytes_per_step": 1.2e9}
    assert sr.ssd_share(run, THROTTLE) == 0.8  # reads: 4 s of the 5
    assert sr.ssd_share({**run, "ssd_write_bytes_per_step": 2.0e9}, THROTTLE) == 1.0
    assert sr.ssd_share({**run, "ok": False}, THROTTLE) is None


def _round(tuned: float, fp32: float | None, bf16: float) -> dict:
    def run(tps):
        return {"ok": True, "tokens_per_s": tps, "ssd_share": 0.8, "ssd_bytes_per_param": {"read": 13.5, "write": 12.1},
                "others_cpu_seconds": 1.0, "bench_cpu_seconds": 1.0, "wall_s": 40.0}
    return {"bench_args": sr.bench_args(_args(), "/w/r", "t"),
            "runs": {"tuned": run(tuned), "memascend": run(fp32), "memascend-bf16_moments": run(bf16)}}


def test_ratios_are_the_medians_of_each_rounds_own_ratio():
    rounds = [_round(50.0, 80.0, 110.0), _round(40.0, 70.0, 90.0), _round(60.0, None, 120.0)]  # a failed run
    s = sr.summarize(rounds)
    assert s["median_tokens_per_s"] == {"memascend": 75.0, "memascend-bf16_moments": 110.0, "tuned": 50.0}
    assert s["round_ratios_to_tuned"]["memascend"] == [1.6, 1.75]
    assert s["median_ratio_to_tuned"] == {"memascend": 1.675, "memascend-bf16_moments": 2.2}
    assert s["ratio_of_medians_to_tuned"] == {"memascend": 1.5, "memascend-bf16_moments": 2.2}


def test_the_time_page_says_each_ratio_against_its_target():
    rounds = [_round(50.0, 80.0, 105.0), _round(40.0, 70.0, 85.0)]
    doc = {"command": "python benchmarks/ssd_bound_rounds.py --name n", "date": "2026-12-06T17:15:00Z",
           "machine": {"host": "vm", "cpu": "cpu", "cores": 2}, "nice": -10, "loadavg_start": [0.5, 0, 0],
           "loadavg_end": [2.0, 0, 0], "rounds": rounds, **sr.summarize(rounds)}
    text = results_ssd.section_ssd_rounds([("docs/bench/ssd-bound-rounds/n.json", doc)])
    assert "| memascend | 2 | 75.0 | x1.68 (1.60, 1.75) | x1.6: met |" in text
    assert "| memascend-bf16_moments | 2 | 95.0 | x2.11 (2.10, 2.12) | x2.2: not met |" in text
    assert "gradient clipping 0" in text and "--out DIR" in text and "/w/r" not in text and "Failed" not in text
    assert "commit" not in text  # a document from before the rounds recorded it
    doc["commit"] = {"head": "abc1234", "changed": ["engine/overlap.py"]}
    assert ", commit abc1234 with 1 tracked files changed," in results_ssd.section_ssd_rounds([("n.json", doc)])
    rounds[1]["runs"]["tuned"].update(ok=False, tokens_per_s=None)
    rounds[1]["round"] = 2
    doc.update(rounds=rounds, **sr.summarize(rounds))
    text = results_ssd.section_ssd_rounds([("docs/bench/ssd-bound-rounds/n.json", doc)])
    assert "| memascend | 2 | 75.0 | x1.60 (1.60) | x1.6: met |" in text and "round 2: tuned" in text
