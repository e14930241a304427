"""A LLaMA-Factory full-SFT recipe, in their keys, trained by `memascend train` with no edit but its
`deepspeed:` line (tests/assets/llamafactory/tiny_full_sft.yaml, which has that line removed) and, as short test
runs do, a `max_steps` beside `num_train_epochs`; its output_dir then loads as LLaMA-Factory's does.

Slow: one DeepSpeed launch of 5 optimizer steps of a tiny random Llama (~20 s on a 2-core VM).
"""

from __future__ import annotations

import importlib.util
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


def tiny_model_dir(path: str) -> str:
    """A local Hugging Face model directory (random tiny Llama, a tokenizer with a chat template): the model that
    scripts/llamafactory_examples.py puts in every LLaMA-Factory example."""
    spec = importlib.util.spec_from_file_location("llamafactory_examples",
                                                  os.path.join(REPO, "scripts", "llamafactory_examples.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.tiny_model_dir(path)


def tiny_recipe(tmp_path, edit) -> tuple:
    """(folder, model directory, environment) of tiny_full_sft.yaml with the tiny model, output_dir
    saves/tiny/full/sft (in the folder) and `edit(text)` applied, in a copy of the assets under tmp_path."""
    model_dir = tiny_model_dir(str(tmp_path / "tiny-instruct"))
    work = tmp_path / "llamafactory"
    shutil.copytree(ASSETS, work)
    recipe = work / "tiny_full_sft.yaml"
    text = recipe.read_text().replace("MODEL_DIR", model_dir).replace("OUTPUT_DIR", "saves/tiny/full/sft")
    recipe.write_text(edit(text))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MEMASCEND_CACHE": str(tmp_path / "cache")}
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    return work, model_dir, env


def test_llamafactory_full_sft_recipe_runs_unchanged(tmp_path):
    work, model_dir, env = tiny_recipe(tmp_path, lambda text: text + "max_steps: 5\n")
    recipe = work / "tiny_full_sft.yaml"
    # As LLaMA-Factory is used: from the folder holding data/ (dataset_dir is relative to it).
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "train", "tiny_full_sft.yaml"], cwd=work,
                       capture_output=True, text=True, env=env, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    run = work / "saves" / "tiny" / "full" / "sft"
    records = [json.loads(l) for l in open(run / "metrics.jsonl")]
    start = next(r for r in records if r["event"] == "start")
    # 40 samples, val_size 0.1 -> 36 to train on; max_steps 5 wins over the epoch's 18 steps.
    assert start["train_sequences"] == 36 and start["validation_sequences"] == 4 and start["total_steps"] == 5
    assert [r["step"] for r in records if r["event"] == "step"] == [5]  # logging_steps 10: the last step only
    evals = [r["loss"] for r in records if r["event"] == "eval"]
    assert len(evals) == 1  # eval_steps 500 > 5 steps: at the end only
    # The final model is output_dir itself, as LLaMA-Factory writes it, beside the run's own files.
    assert next(r for r in records if r["event"] == "export")["path"] == str(run)
    assert f"final model: {run}" in p.stderr
    names = set(os.listdir(run))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "checkpoints", "metrics.jsonl", "recipe.json", "hf"} <= names and "export" not in names
    assert not any(n.endswith(".tmp") for n in names)
    from memascend_engine.data import hf_validation_loss

    data = json.loads((run / "data.json").read_text())
    assert abs(hf_validation_loss(str(run), data["cache_dir"]) - evals[0]) < 1e-2
    assert evals[0] < hf_validation_loss(model_dir, data["cache_dir"])  # lower than the untrained model's
    ds_config = json.loads((run / "ds_config.json").read_text())
    assert ds_config["bf16"] == {"enabled": True} and ds_config["gradient_accumulation_steps"] == 2
    assert ds_config["scheduler"]["params"]["warmup_num_steps"] == 1  # ceil(0.1 x 5)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # What LLaMA-Factory's inference recipes do with `model_name_or_path: saves/tiny/full/sft`.
    tok = AutoTokenizer.from_pretrained(run)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template  # the template trained with (`template: qwen`)
    model = AutoModelForCausalLM.from_pretrained(run)
    messages = [{"role": "user", "content": "Reverse the word.\nriver"}]
    assert tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        "<|im_start|>user\nReverse the word.\nriver<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]
    # `memascend export` of the last checkpoint into output_dir itself: the same weights, the run's files kept.
    import torch
    from safetensors.torch import load_file

    final = load_file(run / "model.safetensors")
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "export", str(run), "-o", str(run)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    again = load_file(run / "model.safetensors")
    assert sorted(final) == sorted(again) and all(torch.equal(final[k], again[k]) for k in final)
    assert set(os.listdir(run)) == names
    # A second run over that model without overwrite_output_dir stops before launching, as LLaMA-Factory does.
    shutil.rmtree(run / "checkpoints")
    recipe.write_text(recipe.read_text().replace("overwrite_output_dir: true", "overwrite_output_dir: false"))
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "train", "tiny_full_sft.yaml"], cwd=work,
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 2 and f"error: {run} already holds a trained model (model.safetensors)" in p.stderr
    assert "hint: set overwrite_output_dir: true" in p.stderr
    # Same recipe, planned: the job parameters `train` used.
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "plan", "tiny_full_sft.yaml", "--json"], cwd=work,
                       capture_output=True, text=True, env=env, timeout=600)
    job = json.loads(p.stdout)["job"]
    assert (job["seq_len"], job["micro_batch"], job["grad_accum_steps"], job["dtype"]) == (2048, 1, 2, "bf16")
