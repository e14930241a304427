"""`memascend train` and `memascend bench` on one GPU, as a user runs them. Marker gpu.

The bench test checks a 1B-class preset (llama-3.2-1b, random weights, seq 2048): stock, tuned stock
and memascend on CUDA. scripts/gpu_check.sh runs that bench once for its measurements and then points
this test at the output (MEMASCEND_GPU_BENCH_DIR=<dir>/{stock,tuned,memascend}/bench.json) instead of
running it twice; without the variable the test runs the three bench runs itself (several minutes).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")
BENCH_MODEL = "llama-3.2-1b"
BENCH_RUNS = ("stock", "tuned", "memascend")


def _env() -> dict:
    # NCCL_DEBUG=VERSION: NCCL prints "NCCL version X+cudaY" when a rank creates its communicator (NCCL's
    # environment-variable docs); DeepSpeed 0.19.8's own accelerator line is INFO under a WARNING logger and
    # never printed (utils/logging.py, accelerator/real_accelerator.py).
    env = {**os.environ, "DS_ACCELERATOR": "cuda", "NCCL_DEBUG": "VERSION"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _events(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_memascend_train_tiny_recipe_on_one_gpu(tmp_path):
    run = str(tmp_path / "run")
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "train", TINY, "--output-dir", run, "--steps", "6",
                        "--set", "checkpoint_every=3"], capture_output=True, text=True, env=_env(), timeout=900,
                       cwd=str(tmp_path), check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ev = _events(run)
    start = next(e for e in ev if e["event"] == "start")
    assert start["world_size"] == 1 and start["engine"] == "memascend"
    steps = {e["step"]: e for e in ev if e["event"] == "step"}
    assert sorted(steps) == list(range(1, 7))
    assert all(math.isfinite(e["loss"]) for e in steps.values())
    assert steps[6]["loss"] < steps[1]["loss"]
    # The engine ran in a CUDA process: its pinned buffers are registered with the driver.
    pinned = steps[6]["engine_stats"]["pinned"]
    assert pinned["cuda_registered_bytes"] == pinned["live_bytes"] > 0, pinned
    assert any(e["event"] == "checkpoint" and e["step"] == 6 for e in ev)
    assert os.path.isfile(os.path.join(run, "export", "config.json"))
    # Each rank's output (DeepSpeed's --enable_each_rank_log) shows it ran NCCL, which runs on CUDA devices only.
    names = os.listdir(os.path.join(run, "logs"))
    logs = ""
    for n in names:
        with open(os.path.join(run, "logs", n), errors="replace") as f:
            logs += f.read()
    assert "NCCL version" in logs, f"no NCCL line in {names}"


def _bench_docs(tmp_path) -> dict:
    """The bench document of each engine; the GPU kit may have left the last engine out for its time budget."""
    given = os.environ.get("MEMASCEND_GPU_BENCH_DIR")
    root = given or str(tmp_path / "bench")
    if not given:
        for run in BENCH_RUNS:
            p = subprocess.run([sys.executable, "-m", "memascend_cli", "bench", "--model", BENCH_MODEL, "--seq-len",
                                "2048", "--steps", "2", "--runs", run, "--accelerator", "cuda", "--settle-cap", "20",
                                "--out", os.path.join(root, run), "--json"],
                               capture_output=True, text=True, env=_env(), timeout=1200, cwd=REPO, check=False)
            assert p.returncode in (0, 1), p.stderr[-3000:]  # 1: a run failed, the document says why
    docs = {}
    for run in BENCH_RUNS:
        path = os.path.join(root, run, "bench.json")
        if os.path.isfile(path):
            with open(path) as f:
                docs[run] = json.load(f)
    return docs


def test_memascend_bench_1b_class_preset(tmp_path):
    docs = _bench_docs(tmp_path)
    assert "memascend" in docs and len(docs) >= 2, f"bench documents: {sorted(docs)}"
    runs, peaks = {}, {}
    gpu_total = torch.cuda.get_device_properties(0).total_memory
    for name, doc in docs.items():
        assert doc["job"]["model"] == BENCH_MODEL and doc["job"]["seq_len"] == 2048
        (r,) = [x for x in doc["runs"] if x["name"] == name]
        assert r["env"]["DS_ACCELERATOR"] == "cuda", f"{name} did not run on CUDA: {r['env']}"
        peaks[name] = r["peak_system_bytes"]
        planned = [e for e in r["predicted"]["config_errors"] if "Not enough buffers" in e]
        if planned:
            # Stock as its docs configure it, beyond max_in_cpu (planner/param_buffers.py): fails at step 2 as planned.
            assert name == "stock"
            assert not r["ok"] and "Not enough buffers" in (r["error"] or "") and len(r["losses"]) == 1, r["error"]
            continue
        assert r["ok"], r["error"]
        assert r["losses"] and all(math.isfinite(x) for x in r["losses"])
        assert r["seconds_per_step"] > 0 and r["tokens_per_s"] > 0
        assert r["ssd_read_bytes"] > 0 and r["ssd_written_bytes"] > 0
        assert 0 < r["peak_gpu_bytes"] < gpu_total
        assert r["predicted"]["node_host_peak_bytes"] > 0
        runs[name] = r
    # Same seed, same data, same first step before any optimizer difference.
    first = {name: (r["losses"] or [None])[0] for name, d in docs.items() for r in d["runs"] if r["losses"]}
    for name, loss in first.items():
        assert loss == pytest.approx(first["memascend"], rel=1e-2), name
    # The point of the engine: less host memory than stock DeepSpeed, tuned or not (stock's until it failed).
    for name, peak in peaks.items():
        if name != "memascend":
            assert peaks["memascend"] < peak, name
