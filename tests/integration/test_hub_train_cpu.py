"""A LLaMA-Factory recipe naming a hub model id and a hub dataset (an hf_hub_url entry of dataset_info.json) trains
with HF_HUB_OFFLINE=1 from caches prepared as huggingface_hub and datasets leave them (tests/hub_cache.py): the real
snapshot_download finds the model, the real load_dataset the dataset, memascend tokenizes its Arrow files.

Slow: one DeepSpeed launch of 3 optimizer steps of a tiny random Llama.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests import hub_cache

pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed")
pytest.importorskip("datasets")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASSETS = os.path.join(REPO, "tests", "assets", "llamafactory")


def test_hub_model_and_hub_dataset_train_offline(tmp_path):
    from tests.integration.test_llamafactory_cpu import tiny_model_dir

    hf_home = tmp_path / "hf"
    snapshot = hub_cache.model_snapshot(str(hf_home / "hub"), "org/tiny-instruct",
                                        tiny_model_dir(str(tmp_path / "tiny-instruct")), tree=True)
    hub_cache.dataset_cache(str(hf_home / "datasets"), "llamafactory/alpaca_en_demo",
                            os.path.join(ASSETS, "data", "alpaca_demo.json"))
    work = tmp_path / "llamafactory"
    shutil.copytree(ASSETS, work)
    info = json.loads((work / "data" / "dataset_info.json").read_text())
    info["alpaca_en_demo"] = {"hf_hub_url": "llamafactory/alpaca_en_demo", "ms_hub_url": "llamafactory/alpaca_en_demo"}
    (work / "data" / "dataset_info.json").write_text(json.dumps(info))
    text = (work / "tiny_full_sft.yaml").read_text().replace("MODEL_DIR", "org/tiny-instruct")
    text = text.replace("OUTPUT_DIR", "saves/hub").replace("dataset: alpaca_demo", "dataset: alpaca_en_demo")
    (work / "tiny_full_sft.yaml").write_text(text + "max_steps: 3\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", DS_ACCELERATOR="cpu", MEMASCEND_CACHE=str(tmp_path / "ms"))
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "train", "tiny_full_sft.yaml"], cwd=work,
                       capture_output=True, text=True, env=env, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    run = work / "saves" / "hub"
    records = [json.loads(line) for line in open(run / "metrics.jsonl")]
    start = next(r for r in records if r["event"] == "start")
    # The hub dataset is the 40 samples of alpaca_demo.json: val_size 0.1 holds 4 out.
    assert (start["train_sequences"], start["validation_sequences"], start["total_steps"]) == (36, 4, 3)
    assert [r["step"] for r in records if r["event"] == "step"] == [3]
    sources = json.loads((run / "sources.json").read_text())
    assert sources["model"]["repo_id"] == "org/tiny-instruct" and sources["model"]["commit"] == hub_cache.COMMIT
    assert sources["model"]["snapshot"] == snapshot and "model.safetensors" in sources["model"]["cached_files"]
    assert sources["dataset"]["repo_id"] == "llamafactory/alpaca_en_demo" and sources["dataset"]["split"] == "train"
    assert all(f.startswith(str(hf_home / "datasets" / "llamafactory___alpaca_en_demo"))
               and f.endswith(".arrow") for f in sources["dataset"]["files"])
    assert json.loads((run / "recipe.json").read_text())["model"] == snapshot
    assert os.path.isfile(run / "model.safetensors")
