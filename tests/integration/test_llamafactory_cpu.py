"""A LLaMA-Factory full-SFT recipe, in their keys, trained by `memascend train` with no edit but its
`deepspeed:` line (tests/assets/llamafactory/tiny_full_sft.yaml, which has that line removed).

Slow: one DeepSpeed launch of ~18 optimizer steps of a tiny random Llama (~1 min on a 2-core VM).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASSETS = os.path.join(REPO, "tests", "assets", "llamafactory")
TOKENIZER_JSON = os.path.join(REPO, "presets", "train", "data", "tokenizer.json")


def tiny_model_dir(path: str) -> str:
    """A local Hugging Face model directory (random tiny Llama, safetensors, a tokenizer with a chat template)."""
    import torch
    from transformers import AutoModelForCausalLM

    from memascend_cli.models import load_preset
    from memascend_engine.data import BUILTIN_TEMPLATES, load_tokenizer
    from memascend_engine.hf_models import to_hf_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(to_hf_config(load_preset("tiny-llama")))
    model.save_pretrained(path, safe_serialization=True)
    tok = load_tokenizer(TOKENIZER_JSON)
    tok.chat_template = BUILTIN_TEMPLATES["chatml"]
    tok.save_pretrained(path)
    return path


def test_llamafactory_full_sft_recipe_runs_unchanged(tmp_path):
    model_dir = tiny_model_dir(str(tmp_path / "tiny-instruct"))
    work = tmp_path / "llamafactory"
    shutil.copytree(ASSETS, work)
    recipe = work / "tiny_full_sft.yaml"
    text = recipe.read_text().replace("MODEL_DIR", model_dir).replace("OUTPUT_DIR", "saves/tiny/full/sft")
    recipe.write_text(text)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MEMASCEND_CACHE": str(tmp_path / "cache")}
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    # As LLaMA-Factory is used: from the folder holding data/ (dataset_dir is relative to it).
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "train", "tiny_full_sft.yaml"], cwd=work,
                       capture_output=True, text=True, env=env, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    run = work / "saves" / "tiny" / "full" / "sft"
    records = [json.loads(l) for l in open(run / "metrics.jsonl")]
    start = next(r for r in records if r["event"] == "start")
    # 40 samples, val_size 0.1 -> 36 to train on; 1 epoch of micro-batch 1 x 2 accumulation steps.
    assert start["train_sequences"] == 36 and start["validation_sequences"] == 4 and start["total_steps"] == 18
    assert [r["step"] for r in records if r["event"] == "step"] == [10, 18]  # logging_steps 10
    evals = [r["loss"] for r in records if r["event"] == "eval"]
    assert len(evals) == 1  # eval_steps 500 > 18 steps: at the end only
    from memascend_engine.data import hf_validation_loss

    data = json.loads((run / "data.json").read_text())
    assert abs(hf_validation_loss(str(run / "export"), data["cache_dir"]) - evals[0]) < 1e-2
    assert evals[0] < hf_validation_loss(model_dir, data["cache_dir"])  # lower than the untrained model's
    ds_config = json.loads((run / "ds_config.json").read_text())
    assert ds_config["bf16"] == {"enabled": True} and ds_config["gradient_accumulation_steps"] == 2
    assert ds_config["scheduler"]["params"]["warmup_num_steps"] == 2  # ceil(0.1 x 18)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = run / "export"
    tok = AutoTokenizer.from_pretrained(export)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(export)
    ids = tok.apply_chat_template([{"role": "user", "content": "Reverse the word.\nriver"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]
    # Same recipe, planned: the job parameters `train` used.
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "plan", "tiny_full_sft.yaml", "--json"], cwd=work,
                       capture_output=True, text=True, env=env, timeout=600)
    job = json.loads(p.stdout)["job"]
    assert (job["seq_len"], job["micro_batch"], job["grad_accum_steps"], job["dtype"]) == (2048, 1, 2, "bf16")
