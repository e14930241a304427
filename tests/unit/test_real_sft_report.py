"""benchmarks/real_sft_report.py (the overlap's outcomes and the moments' quality on a real fine-tune), its section of
docs/results/time.md and the real-text data set it trains on (scripts/make_pydoc_sft_data.py): pure parts, and the
collector over run directories written here."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))


def _module(name: str, folder: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, folder, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


rs = _module("real_sft_report", "benchmarks")
data = _module("make_pydoc_sft_data", "scripts")
from results_real_sft import section_real_sft  # noqa: E402

KEYS = ("steps_committed", "steps_redone", "steps_rolled_back", "steps_not_speculated")


def _steps(codes: str, *, seconds: float = 2.0, norm=lambda i: 0.5, loss=lambda i: 2.0) -> list[dict]:
    """Step records as train_worker writes them, the overlap's counters grown by one outcome per step ('-': no
    overlap stats)."""
    counts, out = dict.fromkeys(KEYS, 0), []
    for i, code in enumerate(codes):
        if code != "-":
            counts[KEYS["crbs".index(code)]] += 1
        stats = {} if code == "-" else {"overlap": {**counts, "chunks_committed": 7}}
        out.append({"event": "step", "step": i + 1, "time": 100.0 + 2 * i, "loss": loss(i), "grad_norm": norm(i),
                    "s_per_step": seconds * (3 if code == "r" else 1), "tokens_per_s": 128 / seconds,
                    "engine_stats": stats})
    return out


def test_each_step_gets_the_outcome_whose_counter_grew():
    assert rs.outcomes(_steps("rssccbs")) == "rssccbs"
    assert rs.outcomes(_steps("---")) == "---"
    # A resumed run's process counts from 0 again.
    assert rs.outcomes(_steps("rsc") + _steps("sc")) == "rscsc"


def test_overlap_counts_clipped_steps_and_the_step_time_of_each_outcome():
    run = rs.summarize(_steps("rsscc", norm=lambda i: [3.0, 2.0, 0.9, 0.5, 0.4][i]), {"overlap_optimizer": True}, [])
    o = rs.overlap_counts(run, 1.0)
    assert o["clipped"] == 2 and o["median_grad_norm"] == 0.9
    assert o["by_outcome"]["c"] == {"steps": 2, "median_s_per_step": 2.0}
    # The first step (a redo here) also sets up: its time counts for no outcome.
    assert o["by_outcome"]["r"] == {"steps": 1, "median_s_per_step": None}


def test_speed_compares_the_steps_both_runs_ran_without_the_first():
    on = rs.summarize(_steps("s" * 5, seconds=2.0), {"overlap_optimizer": True}, [])
    off = rs.summarize(_steps("-" * 3, seconds=4.0), {}, [])
    assert rs.speed(on, off) == {"steps": 2, "with_overlap": 64.0, "without_overlap": 32.0, "ratio": 2.0}


def test_summary_takes_the_load_samples_inside_the_run_and_the_placement_from_the_tier():
    loads = [(50.0, 9.0), (99.0, 3.0), (101.0, 5.0), (200.0, 9.0)]
    run = rs.summarize(_steps("ss"), {"dram_tier_gib": 3.4, "optimizer_moments": "bf16"}, loads)
    assert run["loadavg_1min"] == {"min": 3.0, "median": 4.0, "max": 5.0, "samples": 2}
    assert (run["placement"], run["optimizer_moments"]) == ("dram", "bf16")


def test_curve_is_the_mean_loss_of_each_window():
    run = {"loss": [float(i) for i in range(250)]}
    assert [c["mean_loss"] for c in rs.curve(run)] == [49.5, 149.5, 224.5]
    assert [(c["first"], c["last"]) for c in rs.curve(run)] == [(1, 100), (101, 200), (201, 250)]


def _run_dir(root, name: str, steps: list[dict], engine: dict, evals: list[tuple[int, float]]) -> str:
    d = root / name
    d.mkdir()
    recs = steps + [{"event": "eval", "step": s, "loss": v} for s, v in evals]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "engine.json").write_text(json.dumps(engine))
    (d / "recipe.json").write_text(json.dumps({
        "seq_len": 128, "micro_batch": 1, "grad_accum": 1, "steps": 300, "lr": 1e-4, "max_grad_norm": 1.0,
        "schedule": {"name": "cosine"}, "precision": "fp32", "seed": 0, "eval_every": 150,
        "dataset": {"path": "/d.jsonl"}}))
    (d / "data.json").write_text(json.dumps({"train_sequences": 90, "validation_sequences": 5}))
    return str(d)


def test_collected_runs_render_the_overlap_speed_and_quality_tables(tmp_path):
    def loss(i):
        return 2.0 * math.exp(-i / 100) + 0.05 * math.sin(2.1 * i)

    fp32 = _run_dir(tmp_path, "fp32", _steps("r" + "s" * 298 + "c", norm=lambda i: 2.0, loss=loss),
                    {"overlap_optimizer": True, "dram_tier_gib": 3.0}, [(150, 1.5), (300, 1.2)])
    bf16 = _run_dir(tmp_path, "bf16", _steps("r" + "s" * 299, norm=lambda i: 2.0, loss=loss),
                    {"overlap_optimizer": True, "dram_tier_gib": 3.0, "optimizer_moments": "bf16"},
                    [(150, 1.5), (300, 1.21)])
    on = _run_dir(tmp_path, "on", _steps("rssss", seconds=3.0), {"overlap_optimizer": True}, [])
    off = _run_dir(tmp_path, "off", _steps("-----", seconds=3.3), {"overlap_optimizer": False}, [])
    doc = rs.collect([fp32, bf16, on, f"{off}:presets/x.yaml --steps 9"], ["fp32", "bf16"], [["on", "off"]], None,
                     "benchmarks/real_sft.yaml")
    assert sorted(doc["overlap"]) == ["bf16", "fp32", "on"]  # the run without the overlap has no outcomes
    assert doc["overlap"]["fp32"]["by_outcome"]["s"]["steps"] == 298 and doc["overlap"]["fp32"]["clipped"] == 300
    assert doc["speed"][0]["ratio"] == 1.1
    assert doc["quality"]["within_noise"] and len(doc["quality"]["curve"]) == 3
    assert doc["runs"]["off"]["command"] == (f"memascend train presets/x.yaml --steps 9 --placement ssd "
                                             f"--set overlap_optimizer=false --output-dir {off}")
    assert doc["runs"]["on"]["command"].startswith("memascend train benchmarks/real_sft.yaml --placement ssd --output")
    text = section_real_sft(os.path.join(REPO, "docs", "bench", "real-sft", "x.json"), doc)
    assert "| `fp32` | d.jsonl, 128 x 1 | dram | fp32 | 300 | 300 (2.00) | 1 / 1 / 0 / 298 |" in text
    # The longest run with the overlap (the first of equals) speaks for it.
    assert ("Over the 300 steps of `fp32` the overlap committed 1 (0%), redid 1, rolled back 0 and did not speculate "
            "298; 300 steps clipped") in text
    assert "The dram-placed fp32 run's losses are NOT the same as the all-SSD ones" in text
    assert "| `on` / `off` | d.jsonl | ssd | 2-5 | 42.67 | 38.79 | x1.100 | yes |" in text
    assert "x1.100" in text and "| 300 | 1.2000 | 1.2100 | +0.83% |" in text and "Within noise: **yes**" in text


def test_the_real_text_set_cuts_topics_at_paragraphs_within_the_limit():
    text = "a" * 30 + "\n\n" + "b" * 30 + "\n\n\n" + "c" * 80 + "\n\n" + "d" * 10
    assert data.parts(text, 64) == ["a" * 30 + "\n\n" + "b" * 30, "c" * 80, "d" * 10]
    recs = data.records({"zeta": "z", "alpha": text}, 64)
    assert [r["messages"][1]["content"][0] for r in recs] == ["a", "c", "d", "z"]
    assert recs[1]["messages"][0]["content"] == "From the Python reference, topic 'alpha': write part 2 of 3."
