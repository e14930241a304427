"""Hub ids without the network: the local Hugging Face cache (as from_pretrained finds a model offline) and the
presets a known hub id plans with."""

from __future__ import annotations

import json
import os

import pytest

from memascend_cli import hub, models
from memascend_cli.run.recipe import load_recipe

CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000}


def fake_cache(root, hub_id: str, commit: str = "abc123", config: dict | None = CONFIG) -> str:
    """A cache laid out as huggingface_hub writes it (refs/main -> snapshots/<commit>)."""
    repo = root / ("models--" + hub_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    if config is not None:
        (snap / "config.json").write_text(json.dumps(config))
    return str(snap)


def test_cache_dir_follows_huggingface_hub_env():
    assert hub.hub_cache_dir({"HF_HUB_CACHE": "/a"}) == "/a"
    assert hub.hub_cache_dir({"HF_HOME": "/h"}) == "/h/hub"
    assert hub.hub_cache_dir({"XDG_CACHE_HOME": "/x"}) == "/x/huggingface/hub"


def test_cached_model_is_found_as_from_pretrained_finds_it(tmp_path, monkeypatch):
    snap = fake_cache(tmp_path, "org/Tiny-1B")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert hub.cached_snapshot("org/Tiny-1B") == snap
    spec = models.load_model("org/Tiny-1B")
    assert spec.hidden_size == 256 and spec.source == os.path.join(snap, "config.json")
    assert hub.cached_snapshot("org/Other") is None


def test_snapshot_without_config_is_not_a_model(tmp_path, monkeypatch):
    fake_cache(tmp_path, "org/Empty", config=None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert hub.cached_snapshot("org/Empty") is None


def test_recipe_keeps_the_hub_id_and_its_revision(tmp_path, monkeypatch):
    fake_cache(tmp_path / "cache", "org/Tiny-1B")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "d.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    (tmp_path / "r.yaml").write_text("model: org/Tiny-1B\nrevision: v1\ndataset: d.jsonl\n")
    recipe = load_recipe(str(tmp_path / "r.yaml"))
    assert (recipe.model, recipe.revision) == ("org/Tiny-1B", "v1")  # train resolves it (cache or download)


def test_a_commit_revision_is_its_snapshot(tmp_path, monkeypatch):
    snap = fake_cache(tmp_path, "org/Tiny-1B", commit="a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert hub.cached_snapshot("org/Tiny-1B", "a" * 40) == snap
    assert hub.cached_snapshot("org/Tiny-1B", "b" * 40) is None and hub.cached_snapshot("org/Tiny-1B", "v2") is None


@pytest.mark.parametrize("hub_id, preset", [
    ("Qwen/Qwen2.5-7B", "qwen2.5-7b"), ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"), ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("Qwen/Qwen3-4B-Instruct-2507", None), ("someone/Qwen2.5-7B", None),
])
def test_known_hub_ids_map_to_presets(hub_id, preset):
    assert hub.preset_for(hub_id, models.preset_sources()) == preset


def test_the_offline_fallback_is_the_preset_of_the_same_architecture():
    assert models.hub_id_hint("Qwen/Qwen2.5-7B-Instruct") == "`--model qwen2.5-7b` (the preset with the same architecture)"
    assert "hf download Qwen/Qwen3-4B-Instruct-2507 --local-dir" in models.hub_id_hint("Qwen/Qwen3-4B-Instruct-2507")
    assert models.hub_id_hint("tiny-llama") is None


@pytest.mark.parametrize("names, missing", [
    (["config.json", "model.safetensors", "tokenizer.json"], []),
    (["config.json", "model-00001-of-00002.safetensors", "tokenizer.model"], []),
    (["config.json", "pytorch_model.bin", "tokenizer.json"], ["*.safetensors weights"]),
    ([], ["config.json", "*.safetensors weights", "tokenizer.json"]),
])
def test_what_training_needs_of_a_model_repo(names, missing):
    from memascend_cli.run.hub_download import missing_parts, wanted

    assert missing_parts(names) == missing
    assert wanted("model-00001-of-00002.safetensors") and wanted("tokenizer_config.json")
    assert wanted("model.safetensors") and wanted("model.safetensors.index.json")
    assert not any(wanted(n) for n in ("pytorch_model.bin", "model.pth", "onnx/model.onnx", "model-q4.gguf",
                                       "consolidated.safetensors", "original/model.safetensors"))


def test_the_download_must_fit_next_to_the_region():
    from memascend_cli.run.hub_download import disk_problem

    gib = 1 << 30
    assert disk_problem(10 * gib, 12 * gib, 5 * gib, same_disk=False) is None
    said = disk_problem(10 * gib, 12 * gib, 5 * gib, same_disk=True)
    assert "10.00 GiB download and the 5.00 GiB region file need 15.00 GiB" in said and "12.00 GiB free" in said
    assert disk_problem(10 * gib, None, 0, same_disk=True) is None  # free space unknown: not refused
