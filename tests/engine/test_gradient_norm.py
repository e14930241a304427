"""The bounded engine's gradient norm (EngineOptions.bounded_norm): DeepSpeed's own _constant_buffered_norm2, fp64
NORM_CHUNK_NUMEL elements at a time instead of 250M, which is the planner's reduce_norm moment (planner/host.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memascend_cli import defaults as zero

# One fresh process per measurement: VmHWM reset (clear_refs 5) right before the norm, so the rise is its temporary.
CHILD = """
import json, sys, torch
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as S
n, chunk = int(sys.argv[1]), int(sys.argv[2])
x = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 1e-3
def kib(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
open("/proc/self/clear_refs", "w").write("5")
before = kib("VmRSS")
norm = S._constant_buffered_norm2(None, x, chunk) if chunk else S._constant_buffered_norm2(None, x)
print(json.dumps({"rise": kib("VmHWM") - before, "norm": norm.item(), "dtype": str(norm.dtype)}))
"""


def _norm(n: int, chunk: int = 0) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(chunk)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_deepspeeds_buffer_size_is_the_one_the_planner_models():
    import inspect

    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as S

    default = inspect.signature(S._constant_buffered_norm2).parameters["buffer_size"].default
    assert default == zero.DS_NORM_BUFFER_NUMEL


def test_a_partition_up_to_the_chunk_sums_exactly_as_in_deepspeed():
    n = 3_000_000  # below NORM_CHUNK_NUMEL: one piece either way
    assert _norm(n, zero.NORM_CHUNK_NUMEL)["norm"] == _norm(n)["norm"]


@pytest.mark.slow
def test_a_large_partition_needs_one_chunk_of_fp64_not_a_copy_of_itself():
    n = 4 * zero.NORM_CHUNK_NUMEL  # 67M elements: DeepSpeed's fp64 copy is 537 MB
    stock, bounded = _norm(n), _norm(n, zero.NORM_CHUNK_NUMEL)
    assert stock["dtype"] == bounded["dtype"] == "torch.float64"
    assert stock["rise"] >= 0.9 * 8 * n
    assert bounded["rise"] <= 8 * zero.NORM_CHUNK_NUMEL + (32 << 20)
    # The pieces' squared norms add up in another order: equal to fp64 rounding, far below fp32's.
    assert bounded["norm"] == pytest.approx(stock["norm"], rel=1e-12)
