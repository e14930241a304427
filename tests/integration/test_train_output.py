"""`memascend train` with its output in a pipe, as in a log file or CI (no terminal, so no live display): a line per
setup phase with its time, the first step although log_every skips it, and no long silence. The recipe is
the tiny LLaMA-Factory one with `logging_steps: 10`, run for 3 steps: its metrics log only the last.

Slow: one DeepSpeed launch of 3 optimizer steps of a tiny random Llama (~1 min on a 2-core VM).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from tests.integration.test_llamafactory_cpu import REPO, tiny_recipe

pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

SETUP_PHASES = ["tokenizing", "starting the ranks", "starting DeepSpeed", "writing parameters to the region",
                "initializing DeepSpeed", "running the first step"]


def output_gaps():
    """benchmarks/train_output_gaps.py: the command's lines with the second each arrived, and their gaps."""
    spec = importlib.util.spec_from_file_location("train_output_gaps",
                                                  os.path.join(REPO, "benchmarks", "train_output_gaps.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_piped_train_names_each_setup_phase_shows_the_first_step_and_is_never_silent_long(tmp_path):
    def edit(text: str) -> str:
        assert "logging_steps: 10" in text
        return text.replace("bf16: true", "bf16: false") + "max_steps: 3\n"  # fp32: quick on any CPU

    work, _, env = tiny_recipe(tmp_path, edit)
    gaps = output_gaps()
    code, lines = gaps.timed_lines([sys.executable, "-m", "memascend_cli", "train", "tiny_full_sft.yaml"], cwd=work,
                                   env=env, timeout_s=1200)
    said = [line for _, line in lines]
    assert code == 0, "\n".join(said[-40:])
    took = [line.removeprefix("setup: ").split(" took ")[0] for line in said
            if line.startswith("setup: ") and " took " in line]
    assert took == SETUP_PHASES, said
    launching = next(i for i, line in enumerate(said) if line.startswith("launching 1 rank(s)"))
    assert said[launching].endswith(os.path.join("sft", "logs"))  # one line, however long the path
    assert said.index(next(line for line in said if line.startswith("setup: tokenizing took"))) < launching
    first = [line for line in said if line.startswith("step 1/3: loss ")]
    assert len(first) == 1 and first[0].endswith("(then a line every 10 steps)"), said
    assert [line.split()[0] for line in said if line[:4] in ("1/3 ", "2/3 ", "3/3 ")] == ["3/3"]  # log_every 10
    quiet = gaps.silences(lines)
    assert quiet["first_line_after_launching_s"] < 30 and quiet["max_gap_s"] < 60, quiet
    assert quiet["first_step_line"] == first[0]
    # The record behind the lines: rank 0's phases and a progress record for each step the metrics skip.
    records = [json.loads(line) for line in open(work / "saves" / "tiny" / "full" / "sft" / "metrics.jsonl")]
    assert [r["phase"] for r in records if r["event"] == "phase" and "step" not in r] == SETUP_PHASES[2:5]
    assert [r["step"] for r in records if r["event"] == "progress"] == [1, 2]
    assert [r["step"] for r in records if r["event"] == "step"] == [3]
    assert {"saving a checkpoint", "validating", "exporting the model"} <= \
        {r["phase"] for r in records if r["event"] == "phase" and r.get("step") == 3}
