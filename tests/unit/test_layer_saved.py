"""The planner's count of a decoder layer's saved tensors (compute.layer_saved_bytes) against the recorded
measurement (benchmarks/layer_saved_tensors.py, docs/bench/micro/layer-saved-tensors.json): today's plan, each case."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "bench", "micro", "layer-saved-tensors.json")
_spec = importlib.util.spec_from_file_location("layer_saved_tensors",
                                               os.path.join(REPO, "benchmarks", "layer_saved_tensors.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
CASES = json.load(open(DOC))["cases"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['case']}-{c['dtype']}")
def test_the_plan_counts_a_layers_saved_tensors_to_within_one_percent(case):
    shape = {k: case[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")}
    planned = bench.planned_bytes(shape, case["dtype"], case["micro_batch"], case["seq_len"])
    assert abs(planned - case["measured_bytes"]) <= 0.01 * case["measured_bytes"]


def test_grouped_query_attention_saves_less_than_multi_head_of_the_same_width():
    mha = dict(bench.CASES["gqa-156m"], num_key_value_heads=16)
    assert bench.planned_bytes(bench.CASES["gqa-156m"], "fp32", 2, 512) < bench.planned_bytes(mha, "fp32", 2, 512)
