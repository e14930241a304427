"""LLaMA-Factory SFT recipes: their keys mapped, dataset_info.json read, what memascend cannot honour refused."""

from __future__ import annotations

import json
import os
import re

import pytest

from memascend_cli.run import llamafactory as LF
from memascend_cli.errors import BadInput
from memascend_cli.run.recipe import load_recipe

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASSETS = os.path.join(REPO, "tests", "assets", "llamafactory")
EXAMPLE = os.path.join(ASSETS, "tiny_full_sft.yaml")


def lf_recipe(tmp_path, extra: str = "", drop: tuple[str, ...] = ()) -> str:
    """The shipped example with a real model directory and output folder filled in."""
    text = open(EXAMPLE).read().replace("MODEL_DIR", "tiny-llama").replace("OUTPUT_DIR", str(tmp_path / "out"))
    lines = [l for l in text.splitlines() if not any(l.startswith(k + ":") for k in drop)]
    path = tmp_path / "sft.yaml"
    path.write_text("\n".join(lines) + "\n" + extra)
    return str(path)


def test_example_maps_every_key(tmp_path, monkeypatch):
    monkeypatch.chdir(ASSETS)  # LLaMA-Factory resolves dataset_dir against the current directory
    notes: list[str] = []
    r = load_recipe(lf_recipe(tmp_path), notes=notes)
    assert r.model == "tiny-llama"
    assert r.dataset.path == os.path.join(ASSETS, "data", "alpaca_demo.json") and r.dataset.format == "alpaca"
    assert r.dataset.packing is False  # LLaMA-Factory packs only for pretraining
    assert r.dataset.validation_split == 0.1 and r.dataset.max_samples == 1000 and r.dataset.overwrite_cache
    assert r.template is None  # `qwen`: the tokenizer's own chat template
    assert (r.seq_len, r.micro_batch, r.grad_accum, r.lr, r.epochs, r.steps) == (2048, 1, 2, 1e-3, 1.0, None)
    assert r.schedule.name == "cosine" and r.schedule.warmup_ratio == 0.1
    assert r.precision == "bf16" and r.gradient_checkpointing is True
    assert (r.log_every, r.checkpoint_every, r.eval_every) == (10, 500, 500)
    assert r.report_to == ["jsonl"] and r.overwrite_output_dir is True
    assert r.output_dir == str(tmp_path / "out")
    assert any(n.startswith("preprocessing_num_workers: ignored") for n in notes)


def test_absolute_dataset_dir_works_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = lf_recipe(tmp_path, f"dataset_dir: {os.path.join(ASSETS, 'data')}\n", drop=("dataset_dir",))
    r = load_recipe(path)
    assert r.dataset.path.endswith("alpaca_demo.json")


def test_sharegpt_entry_brings_its_columns(tmp_path, monkeypatch):
    monkeypatch.chdir(ASSETS)
    r = load_recipe(lf_recipe(tmp_path, "dataset: sharegpt_demo\n", drop=("dataset",)))
    assert r.dataset.format == "sharegpt" and r.dataset.columns == {"messages": "conversations", "system": "system"}


@pytest.mark.parametrize("line, words", [
    ("finetuning_type: lora", ["finetuning_type: 'lora' is not supported", "LoRA"]),
    ("stage: dpo", ["stage: 'dpo' is not supported"]),
    ("galore_target: all", ["galore_target: GaLore is not supported", "AdamW"]),
    ("use_apollo: true", ["use_apollo: APOLLO is not supported"]),
    ("use_badam: true", ["BAdam is not supported"]),
    ("use_adam_mini: true", ["Adam-mini is not supported"]),
    ("use_muon: true", ["Muon is not supported"]),
    ("use_dft_loss: true", ["DFT is not supported", "cross-entropy"]),
    ("mixture_of_depths: convert", ["MoD is not supported"]),
    ("fp8: true", ["fp8 is not supported"]),
    ("image_max_pixels: 262144", ["multimodal is not supported", "text-only"]),
    ("lr_scheduler_type: polynomial", ["lr_scheduler_type: 'polynomial'"]),
    ("dataset: ms_demo", ["ModelScope", "datasets` only", "file_name"]),
    ("dataset: dpo_demo", ["preference"]),
    ("dataset: alpaca_dem", ["not in", "did you mean 'alpaca_demo'"]),
    ("template: mystery", ["template: 'mystery' is not a LLaMA-Factory template", ".jinja"]),
    ("template: qwen3_nothnk", ["did you mean 'qwen3_nothink'?"]),
    ("eval_dataset: alpaca_demo", ["use val_size"]),
])
def test_refusals_say_why(tmp_path, monkeypatch, line, words):
    monkeypatch.chdir(ASSETS)
    key = line.split(":")[0]
    with pytest.raises(BadInput) as e:
        load_recipe(lf_recipe(tmp_path, line + "\n", drop=(key,)))
    for w in words:
        assert w in e.value.message or w in (e.value.hint or ""), e.value.message


def test_typos_get_close_suggestions_only(tmp_path, monkeypatch):
    monkeypatch.chdir(ASSETS)
    with pytest.raises(BadInput) as e:
        load_recipe(lf_recipe(tmp_path, "learning_rat: 1.0e-4\nwarmup_ration: 0.1\n"))
    m = e.value.message
    assert "unknown key 'learning_rat' (did you mean 'learning_rate'?)" in m
    assert "unknown key 'warmup_ration' (did you mean 'warmup_ratio'?)" in m


def test_precision_defaults_to_fp32_like_llamafactory(tmp_path, monkeypatch):
    monkeypatch.chdir(ASSETS)
    assert load_recipe(lf_recipe(tmp_path, drop=("bf16",))).precision == "fp32"
    assert load_recipe(lf_recipe(tmp_path, "fp16: true\n", drop=("bf16",))).precision == "fp16"


def test_docs_list_every_key():
    """docs/llama-factory.md is the human-readable copy of the tables in memascend_cli/run/llamafactory.py."""
    doc = open(os.path.join(REPO, "docs", "llama-factory.md")).read()
    keys = set(re.findall(r"^\| `([a-z_0-9]+)`", doc, flags=re.M))
    tables = (set(LF.MAPPED) | set(LF.COMBINED) | set(LF.IGNORED) | set(LF.RESTRICTED) | set(LF.REFUSED_KEYS)
              | set(LF.REPLACED))
    assert tables <= keys, sorted(tables - keys)


def test_dataset_dir_falls_back_to_the_recipe_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/ here: the recipe's own folder holds it
    r = load_recipe(EXAMPLE)
    assert r.dataset.path == os.path.join(ASSETS, "data", "alpaca_demo.json")


def test_method_keys_get_no_misleading_suggestion(tmp_path, monkeypatch):
    monkeypatch.chdir(ASSETS)
    with pytest.raises(BadInput) as e:
        load_recipe(lf_recipe(tmp_path, "use_galore: true\ngalore_target: all\napollo_target: all\n"))
    m = e.value.message
    assert "did you mean" not in m and "lora_target" not in m
    assert "use_galore, galore_target: GaLore is not supported" in m and "apollo_target: APOLLO" in m
    # A method switched off is no method.
    assert load_recipe(lf_recipe(tmp_path, "use_galore: false\n")).model == "tiny-llama"


def test_deepspeed_line_is_replaced_with_a_note(tmp_path, monkeypatch):
    monkeypatch.chdir(ASSETS)
    notes: list[str] = []
    load_recipe(lf_recipe(tmp_path, "deepspeed: examples/deepspeed/ds_z3_config.json\n"), notes=notes)
    assert notes.count("deepspeed: examples/deepspeed/ds_z3_config.json replaced by memascend's DeepSpeed config "
                       "(ZeRO-3, params and optimizer on the SSD, from the plan)") == 1


def test_max_steps_wins_over_epochs(tmp_path, monkeypatch):
    monkeypatch.chdir(ASSETS)
    notes: list[str] = []
    r = load_recipe(lf_recipe(tmp_path, "max_steps: 5\n"), notes=notes)
    assert (r.steps, r.epochs) == (5, None)
    assert "num_train_epochs: ignored (max_steps 5 wins, as in LLaMA-Factory)" in notes
    # max_steps: -1 is the HF Trainer's "train by epochs".
    assert load_recipe(lf_recipe(tmp_path, "max_steps: -1\n")).epochs == 1.0
    # --set steps=N on a recipe with epochs: steps wins too.
    notes = []
    r = load_recipe(lf_recipe(tmp_path), {"steps": 3}, notes=notes)
    assert (r.steps, r.epochs) == (3, None) and "epochs: ignored (steps 3 wins)" in notes


@pytest.mark.parametrize("name", sorted(LF.LLAMAFACTORY_TEMPLATES))
def test_every_llamafactory_template_resolves(tmp_path, monkeypatch, name):
    monkeypatch.chdir(ASSETS)
    notes: list[str] = []
    r = load_recipe(lf_recipe(tmp_path, f"template: {name}\n", drop=("template",)), notes=notes)
    if name in LF.TOKENIZER_TEMPLATES:
        assert r.template is None and not any(n.startswith("template:") for n in notes)
    elif name in LF.PLAIN_TEMPLATES:
        assert r.template == "plain"
    else:
        assert r.template is None
        assert f"template: {name!r} rendered with the tokenizer's own chat template" in " ".join(notes)


def test_known_template_tables_are_llamafactory_names():
    # baichuan2 is a name LLaMA-Factory dropped in 2025 (commit 5cccaeec8); older recipes still use it.
    assert set(LF.TOKENIZER_TEMPLATES) | set(LF.PLAIN_TEMPLATES) <= LF.LLAMAFACTORY_TEMPLATES | {"baichuan2"}
    assert {"qwen3_nothink", "qwen3_vl_nothink", "moss_vl"} <= LF.LLAMAFACTORY_TEMPLATES


def test_report_to_loggers_never_refused(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.chdir(ASSETS)
    notes: list[str] = []
    r = load_recipe(lf_recipe(tmp_path, "report_to: [wandb, swanlab, mlflow]\n", drop=("report_to",)), notes=notes)
    if importlib.util.find_spec("wandb") is None:
        assert r.report_to == ["jsonl"]
        assert any(n.startswith("report_to: 'wandb' skipped: the wandb package is not installed") for n in notes)
    else:
        assert r.report_to == ["jsonl", "wandb"]
    assert any(n.startswith("report_to: 'swanlab' skipped") for n in notes)
    assert any(n.startswith("report_to: 'mlflow' skipped") for n in notes)


@pytest.mark.parametrize("entry, words", [
    ({"formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"}},
     ["has images (column 'images')", "text-only", "<image>"]),
    ({"formatting": "sharegpt", "columns": {"messages": "messages", "videos": "videos"}}, ["has videos"]),
    ({"formatting": "sharegpt", "columns": {"messages": "messages", "kto_tag": "label"}},
     ["KTO dataset (column 'label' marks undesirable answers"]),
    ({"formatting": "sharegpt", "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}},
     ["preference (ranking) dataset", "DPO"]),
])
def test_datasets_that_would_change_meaning_are_refused(tmp_path, entry, words):
    (tmp_path / "d.json").write_text("[]")
    (tmp_path / "dataset_info.json").write_text(json.dumps({"x": {"file_name": "d.json", **entry}}))
    with pytest.raises(BadInput) as e:
        LF.dataset_from_info("x", str(tmp_path), recipe_dir=str(tmp_path), cwd=str(tmp_path))
    for w in words:
        assert w in e.value.message


def test_tools_column_is_carried_to_the_dataset(tmp_path):
    (tmp_path / "d.json").write_text("[]")
    entry = {"file_name": "d.json", "formatting": "sharegpt", "columns": {"messages": "conversations", "tools": "tools"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps({"glaive_toolcall_en_demo": entry}))
    ds = LF.dataset_from_info("glaive_toolcall_en_demo", str(tmp_path), recipe_dir=str(tmp_path), cwd=str(tmp_path))
    assert ds["columns"] == {"messages": "conversations", "tools": "tools"}


def test_final_model_goes_to_output_dir_as_in_llamafactory(tmp_path, monkeypatch):
    monkeypatch.chdir(ASSETS)
    assert load_recipe(lf_recipe(tmp_path)).export_in_output_dir is True
    # memascend's own key still decides when given.
    assert load_recipe(lf_recipe(tmp_path, "export_in_output_dir: false\n")).export_in_output_dir is False
    assert load_recipe("tiny-cpu").export_in_output_dir is False


# LLaMA-Factory's examples/v1/train_full/train_full_deepspeed.yaml (commit ff6d4d12), run with USE_V1=1.
V1_EXAMPLE = """model: Qwen/Qwen3-0.6B
model_class: llm

kernel_config:
    name: auto

dist_config:
    name: deepspeed
    config_file: examples/deepspeed/ds_z3_config.json

### data
train_dataset: data/v1_sft_demo.yaml

### training
output_dir: outputs/Qwen3-0.6B-deepspeed
micro_batch_size: 1
cutoff_len: 2048
learning_rate: 1.0e-4
max_steps: 10
"""


def test_the_v1_format_is_named_in_one_problem(tmp_path):
    path = tmp_path / "v1.yaml"
    path.write_text(V1_EXAMPLE)
    with pytest.raises(BadInput) as e:
        load_recipe(str(path))
    assert e.value.message == (f"{path} is a LLaMA-Factory v1 config (USE_V1=1; model_class, kernel_config, "
                               "dist_config), a format memascend does not read")
    assert "per_device_train_batch_size" in e.value.hint
    # Without a key of the default format (cutoff_len) it is still v1, not a memascend recipe with unknown keys.
    path.write_text("model: tiny-llama\ntrain_dataset: data/v1_sft_demo.yaml\nmicro_batch_size: 1\n")
    with pytest.raises(BadInput, match="is a LLaMA-Factory v1 config"):
        load_recipe(str(path))


def test_v1_keys_belong_to_no_other_format():
    from memascend_cli.run.recipe import field_names

    other = set(field_names()) | LF.LF_ONLY_KEYS | set(LF.MAPPED) | set(LF.COMBINED) | set(LF.IGNORED)
    assert not set(LF.V1_KEYS) & other
    assert not [k for k in LF.V1_KEYS if LF.method_of(k)]


def test_hub_entries_load_from_the_hub_as_llamafactory_chooses(monkeypatch):
    from memascend_cli.run.llamafactory import dataset_from_info

    data = os.path.join(ASSETS, "data")
    assert dataset_from_info("remote_demo", data, recipe_dir=data, cwd=data) == \
        {"hub": "llamafactory/alpaca_en", "split": "train", "format": "alpaca"}
    assert dataset_from_info("remote_sharegpt", data, recipe_dir=data, cwd=data) == \
        {"hub": "org/chats", "subset": "en", "split": "train[:100]", "folder": "v2", "format": "sharegpt",
         "columns": {"messages": "conversations"}}
    monkeypatch.setenv("USE_MODELSCOPE_HUB", "1")  # LLaMA-Factory then loads the ms_hub_url
    with pytest.raises(BadInput) as e:
        dataset_from_info("remote_demo", data, recipe_dir=data, cwd=data)
    assert "ModelScope" in e.value.message and "unset USE_MODELSCOPE_HUB" in e.value.hint
    monkeypatch.delenv("USE_MODELSCOPE_HUB")
    with pytest.raises(BadInput) as e:
        dataset_from_info("remote_demo,alpaca_demo", data, recipe_dir=data, cwd=data)
    assert "one hub dataset is trained at a time" in e.value.message
