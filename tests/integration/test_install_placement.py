"""A plain DeepSpeed script with its own ZeRO-3 CPU-offload config, fp32 (benchmarks/ds_llama_script.py --offload
cpu), run through `memascend_engine.install()` with a region on this CPU machine: where the DRAM holds stock's
placement the config keeps its CPU offload and nothing goes through the region; asked (placement='region'), or under
a cgroup cap too small for DRAM, the offload moves to the region and the engine engages."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from tests.conftest import require_memory_cgroups  # noqa: E402
from tests.engine.test_engine_direct_nvme import make_region  # noqa: E402
from tests.integration.test_hf_trainer_install import _free_port  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "ds_llama_script.py"
MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
         "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000,
         "max_position_embeddings": 512, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
"""38M parameters: stock's CPU offload in fp32 holds about 20 B of each in DRAM (0.7 GiB), well above what
memascend's region run keeps, so a cap between the two moves the offload and still runs."""
STEPS = 2


def run_script(tmp_path: Path, *args: str, preexec_fn=None) -> tuple[dict, str]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(MODEL))
    nvme, out = tmp_path / "nvme", tmp_path / "out.json"
    nvme.mkdir(exist_ok=True)
    env = dict(os.environ, DS_ACCELERATOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".torch_ext"))
    cmd = [sys.executable, str(SCRIPT), "--model-dir", str(model), "--nvme-path", str(nvme), "--out", str(out),
           "--region", make_region(tmp_path, "2GiB"), "--offload", "cpu", "--dtype", "fp32", "--seq-len", "64",
           "--steps", str(STEPS), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False,
                          preexec_fn=preexec_fn)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(out.read_text())
    assert len(result["losses"]) == STEPS and all(math.isfinite(x) for x in result["losses"])
    return result, proc.stderr


def placement_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "memascend_engine: placement:" in line]


def test_cpu_offload_that_fits_stays_in_dram_and_the_region_is_not_used(tmp_path):
    r, err = run_script(tmp_path)
    s = r["stats"]
    assert r["offload"] == {"offload_param": "cpu", "offload_optimizer": "cpu"}
    assert s["bytes_read"] == s["bytes_written"] == s["requests"] == 0
    assert "offload_param.device" not in s["config_changes"]
    assert s["placement"]["move"] is False and s["placement"]["pending"] is False
    assert s["placement"]["headroom_bytes"] > 0
    # Decided at deepspeed.initialize (no model_spec), said when install() deferred it and when it was made.
    pending, decided = placement_lines(err)
    assert "until then" in pending and "offload kept in DRAM" in decided and "region not used" in decided


def test_placement_region_moves_the_cpu_offload_to_the_region(tmp_path):
    r, err = run_script(tmp_path, "--placement", "region")
    s = r["stats"]
    assert r["offload"] == {"offload_param": "nvme", "offload_optimizer": "nvme"}
    assert s["bytes_read"] > 0 and s["bytes_written"] > 0 and r["swap_files"] == 0
    assert s["placement"]["move"] is True
    assert any("moved to memascend's region (asked: placement 'region')" in line for line in placement_lines(err))


@pytest.mark.root
def test_a_cgroup_cap_too_small_for_dram_moves_it_at_initialize(tmp_path):
    """auto under a memory cgroup whose limit holds memascend's run but not stock's CPU offload with its headroom:
    decided at deepspeed.initialize (the model is built whole, no zero.Init), the engine wired again for the region."""
    require_memory_cgroups()
    from memascend_cli.models import load_config_json
    from memascend_cli.planner import offload_choice as oc
    from memascend_cli.planner import placement as pl
    from memascend_cli.planner.spec import HardwareSpec
    from memascend_cli.run import cgroup
    from memascend_cli.units import GiB

    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "config.json").write_text(json.dumps(MODEL))
    job, _ = oc.job_for_config({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}},
                               load_config_json(str(tmp_path / "plan" / "config.json")), ranks_per_node=1,
                               zero_init=False)
    node = HardwareSpec(name="cap", dram_gib=2.0, os_reserve_gib=0.0)
    cap = pl.stock_row(job, node, "dram").est.node_host_peak_bytes + pl.headroom_bytes(node) - GiB // 4
    with cgroup.MemoryCap(cap, label="test") as cg:
        r, err = run_script(tmp_path, "--no-zero-init", preexec_fn=cg.join)
        assert not cg.result().oom_killed
    s = r["stats"]
    assert r["offload"] == {"offload_param": "nvme", "offload_optimizer": "nvme"}
    assert s["placement"]["move"] is True and s["placement"]["available_bytes"] <= cap
    assert s["bytes_read"] > 0 and s["bytes_written"] > 0
    assert any("the cgroup's memory limit" in line and "does not fit" in line for line in placement_lines(err))
