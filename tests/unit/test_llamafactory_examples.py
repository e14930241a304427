"""scripts/llamafactory_examples.py: which LLaMA-Factory examples it runs and the one line it changes."""

from __future__ import annotations

import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("llamafactory_examples",
                                              os.path.join(REPO, "scripts", "llamafactory_examples.py"))
lfx = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lfx)


def _write(root, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_full_sft_and_pt_examples_are_selected_and_v1_is_not(tmp_path):
    _write(tmp_path, "examples/train_full/a.yaml", "stage: sft\nfinetuning_type: full\n")
    _write(tmp_path, "examples/extras/b/c.yaml", "stage: pt\nfinetuning_type: full\n")
    _write(tmp_path, "examples/train_lora/d.yaml", "stage: sft\nfinetuning_type: lora\n")
    _write(tmp_path, "examples/train_full/dpo.yaml", "stage: dpo\nfinetuning_type: full\n")
    _write(tmp_path, "examples/v1/train_full/e.yaml", "stage: sft\nfinetuning_type: full\n")
    _write(tmp_path, "examples/deepspeed/ds_z3_config.json", "{}")
    _write(tmp_path, "examples/broken.yaml", "a: [\n")
    assert lfx.full_examples(str(tmp_path)) == ["examples/extras/b/c.yaml", "examples/train_full/a.yaml"]


def test_only_model_name_or_path_changes():
    text = "### model\nmodel_name_or_path: Qwen/Qwen3-4B  # hub id\ntrust_remote_code: true\n"
    assert lfx.with_model(text, "/m/tiny") == "### model\nmodel_name_or_path: /m/tiny\ntrust_remote_code: true\n"
    with pytest.raises(ValueError):
        lfx.with_model("stage: sft\n", "/m/tiny")


def test_what_the_cli_said_is_kept_in_one_line_each():
    said = lfx._said("note: deepspeed: replaced\nwould download: dataset a/b (split train): 1.00 MiB\n"
                     "error: bad key\nhint: remove it\n")
    assert said == {"error": "error: bad key", "hint": "hint: remove it", "notes": ["note: deepspeed: replaced"],
                    "downloads": ["would download: dataset a/b (split train): 1.00 MiB"], "traceback": False}
