"""A plain Hugging Face Trainer script with `memascend_engine.install()` (hf_trainer_job.py, one CPU process), with
the HF docs' ZeRO-3 NVMe config ("auto" values) and LLaMA-Factory's CPU-offload config, install() before and after
TrainingArguments: the engine must engage (bytes through the region, no swap files under nvme_path)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.engine.test_engine_direct_nvme import make_region  # noqa: E402

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
ASSETS = HERE.parent / "assets" / "hf"
REPO = HERE.parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(tmp_path: Path, order: str, config: str, script: Path = HERE / "hf_trainer_job.py",
            placement: str = "auto") -> tuple[dict, str]:
    """Run a trainer script (hf_trainer_job.py, or trl_sft_job.py of the same shape) as one rank; its result and
    stderr."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, DS_ACCELERATOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), JOB_PLACEMENT=placement)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".torch_ext"))
    out = tmp_path / "out.json"
    nvme = tmp_path / "nvme"
    proc = subprocess.run([sys.executable, str(script), order, str(ASSETS / config),
                           make_region(tmp_path, "512MiB"), str(nvme), str(out)],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text()), proc.stderr


def _assert_engaged(r: dict) -> None:
    s = r["stats"]
    assert len(r["losses"]) == 3
    assert s["bytes_read"] > 0 and s["bytes_written"] > 0
    assert r["files"] == [] and s["swap_files_created"] == 0
    zo = r["trainer_config"]["zero_optimization"]
    # memascend's knobs reached the config the Trainer gave DeepSpeed, and the Trainer filled its 'auto' keys.
    assert zo["offload_param"]["max_in_cpu"] == 0 and zo["stage3_max_reuse_distance"] == 0
    assert zo["reduce_bucket_size"] == 512 * 512


@pytest.mark.parametrize("order", ["before", "after"])
def test_hf_docs_nvme_config_with_auto_values(tmp_path, order):
    r, err = run_job(tmp_path, order, "ds_zero3_nvme_auto.json")
    _assert_engaged(r)
    assert "could not convert" not in err
    if order == "after":
        assert "install() after TrainingArguments: the Trainer's copy of the DeepSpeed config rewritten" in err


def test_llamafactory_cpu_offload_config_kept_where_it_fits_and_moved_when_asked(tmp_path):
    """The tiny model's CPU offload fits this machine's DRAM: auto keeps it (decided at deepspeed.initialize, in the
    Trainer's own copy of the config, "auto" values filled); placement 'region' moves it and the engine engages."""
    r, err = run_job(tmp_path / "auto", "before", "llamafactory_ds_z3_offload_config.json")
    s = r["stats"]
    assert len(r["losses"]) == 3 and s["bytes_read"] == s["bytes_written"] == 0 and r["files"] == []
    assert s["placement"]["move"] is False and "offload_param.device" not in s["config_changes"]
    zo = r["trainer_config"]["zero_optimization"]
    assert zo["offload_param"]["device"] == zo["offload_optimizer"]["device"] == "cpu"
    assert "offload kept in DRAM as the config writes it" in err
    r, err = run_job(tmp_path / "region", "before", "llamafactory_ds_z3_offload_config.json", placement="region")
    _assert_engaged(r)
    assert "offload moved to memascend's region (asked: placement 'region')" in err
    assert r["stats"]["config_changes"]["offload_param.device"] == {"from": "cpu", "to": "nvme"}


def test_config_without_nvme_is_reported_loudly(tmp_path):
    """ZeRO-2 (or no region) cannot put anything on the SSD: install() warns instead of saying ok."""
    code = ("import json, warnings, memascend_engine\n"
            f"cfg = json.load(open({str(ASSETS / 'llamafactory_ds_z3_offload_config.json')!r}))\n"
            "cfg['zero_optimization']['stage'] = 2\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    h = memascend_engine.install(cfg, region=None)\n"
            "print([str(x.message) for x in w])\n"
            "h.uninstall()\n")
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "offloads nothing to NVMe (ZeRO stage 2" in proc.stdout
