"""Hub ids without the network: the local Hugging Face cache (as from_pretrained finds a model offline) and the
presets a known hub id plans with."""

from __future__ import annotations

import json
import os

import pytest

from memascend_cli import hub, models
from memascend_cli.errors import BadInput
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


def test_recipe_model_becomes_the_snapshot_folder(tmp_path, monkeypatch):
    snap = fake_cache(tmp_path / "cache", "org/Tiny-1B")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "d.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    (tmp_path / "r.yaml").write_text("model: org/Tiny-1B\ndataset: d.jsonl\n")
    assert load_recipe(str(tmp_path / "r.yaml")).model == snap


@pytest.mark.parametrize("hub_id, preset", [
    ("Qwen/Qwen2.5-7B", "qwen2.5-7b"), ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"), ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("Qwen/Qwen3-4B-Instruct-2507", None), ("someone/Qwen2.5-7B", None),
])
def test_known_hub_ids_map_to_presets(hub_id, preset):
    assert hub.preset_for(hub_id, models.preset_sources()) == preset


def test_plan_uses_the_preset_training_refuses_with_the_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert models.load_model("Qwen/Qwen2.5-7B-Instruct", weights=False).name == "qwen2.5-7b"
    with pytest.raises(BadInput) as e:
        models.load_model("Qwen/Qwen2.5-7B-Instruct")
    assert "not in the local cache" in e.value.hint and "config.json" in e.value.hint
    assert "`plan` uses the preset qwen2.5-7b" in e.value.hint
    with pytest.raises(BadInput) as e:
        models.load_model("Qwen/Qwen3-4B-Instruct-2507", weights=False)
    assert "planning needs only its config.json" in e.value.hint
