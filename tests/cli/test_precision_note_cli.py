"""bf16 on a CPU without native bf16 kernels: `plan` and `train --dry-run` say so in one note with the measured ratio
and the flag to change; where bf16 is native they say nothing. The rates are the recorded probes of
tests/assets/cpu (one Xeon with AMX, as it is and with oneDNN held to AVX2), cached as this CPU's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from memascend_cli import compute_probe as cp
from memascend_cli.hardware import local_cpu_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASSETS = os.path.join(REPO, "tests", "assets")


def cache_with(tmp_path, name: str) -> str:
    """A cache folder whose CPU probe is the recorded `name`, as if measured on this CPU."""
    with open(os.path.join(ASSETS, "cpu", f"probe-{name}.json")) as f:
        found = json.load(f)
    found.update(cpu_model=local_cpu_model(), cpu_cores=len(os.sched_getaffinity(0)), kernel_env={})
    root = tmp_path / f"cache-{name}"
    (root / "probe").mkdir(parents=True)
    (root / "probe" / "cpu-matmul.json").write_text(json.dumps(found))
    return str(root)


def run(*args, cache: str, cwd=None):
    env = {k: v for k, v in os.environ.items() if k not in cp.KERNEL_ENV}
    env.update(COLUMNS="80", DS_ACCELERATOR="cpu", MEMASCEND_CACHE=cache)
    return subprocess.run([sys.executable, "-m", "memascend_cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_plan_says_a_slow_reduced_precision_with_its_ratio(tmp_path, dtype):
    slow = cache_with(tmp_path, "avx2")
    p = run("plan", "--model", "tiny-llama", "--dtype", dtype, "--no-search", cache=slow)
    assert p.returncode == 0, p.stderr
    rates = json.load(open(os.path.join(slow, "probe", "cpu-matmul.json")))
    ratio = rates["fp32_gflops"] / rates[f"{dtype}_gflops"]
    assert f"note: {dtype} matmuls run {ratio:.0f}x slower than fp32" in flat(p.stdout)
    assert "--dtype fp32" in flat(p.stdout)
    doc = json.loads(run("plan", "--model", "tiny-llama", "--dtype", dtype, "--json", cache=slow).stdout)
    assert f"{ratio:.0f}x slower" in doc["time"]["precision_note"]
    assert doc["time"]["device"]["gflops"] == pytest.approx(rates[f"{dtype}_gflops"] * 0.8, abs=0.06)


def test_plan_says_nothing_in_fp32_or_where_bf16_is_native(tmp_path):
    p = run("plan", "--model", "tiny-llama", "--dtype", "fp32", "--no-search", cache=cache_with(tmp_path, "avx2"))
    assert p.returncode == 0 and "slower than fp32" not in flat(p.stdout)
    p = run("plan", "--model", "tiny-llama", "--dtype", "bf16", "--no-search", cache=cache_with(tmp_path, "native"))
    assert p.returncode == 0 and "slower than fp32" not in flat(p.stdout)
    compute = p.stdout.split("time per step")[1].splitlines()[4].split("│")[2]  # the stock row's compute cell
    assert "s/step" in p.stdout and compute.strip() not in ("", "?")


@pytest.mark.slow
def test_train_dry_run_of_a_bf16_llamafactory_recipe_says_so(tmp_path):
    pytest.importorskip("transformers")
    from tests.integration.test_llamafactory_cpu import tiny_model_dir

    model_dir = tiny_model_dir(str(tmp_path / "tiny-instruct"))
    work = tmp_path / "llamafactory"
    shutil.copytree(os.path.join(ASSETS, "llamafactory"), work)
    recipe = work / "tiny_full_sft.yaml"  # bf16: true, as every LLaMA-Factory example
    recipe.write_text(recipe.read_text().replace("MODEL_DIR", model_dir).replace("OUTPUT_DIR", "out"))
    p = run("train", "tiny_full_sft.yaml", "--dry-run", cache=cache_with(tmp_path, "avx2"), cwd=work)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "note: bf16 matmuls run" in flat(p.stderr) and "bf16: false" in flat(p.stderr)
    assert "x slower than fp32" in json.loads(p.stdout)["plan"]["precision_note"]
    p = run("train", "tiny_full_sft.yaml", "--dry-run", "--force", cache=cache_with(tmp_path, "native"), cwd=work)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "slower than fp32" not in flat(p.stderr) and "precision_note" not in json.loads(p.stdout)["plan"]
