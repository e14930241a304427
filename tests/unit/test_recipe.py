"""Recipes: typed loading, unknown keys named with the file, overrides, path resolution."""

from __future__ import annotations

import os

import pytest

from memascend_cli.errors import BadInput
from memascend_cli.run.recipe import load_recipe, merge, parse_set, recipe_from_dict, total_steps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")


def write(tmp_path, text: str) -> str:
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return str(p)


def test_shipped_tiny_recipe_loads_with_paths_next_to_it():
    r = load_recipe(TINY)
    assert r.model == "tiny-llama"
    assert r.dataset.path == os.path.join(REPO, "presets", "train", "data", "tiny-alpaca.jsonl")
    assert os.path.isfile(r.dataset.path) and os.path.isfile(r.tokenizer)
    assert r.precision == "fp32" and r.steps == 30
    assert os.path.isabs(r.output_dir)


def test_preset_name_resolves_to_shipped_file():
    assert load_recipe("tiny-cpu").seq_len == load_recipe(TINY).seq_len


def test_unknown_keys_are_all_named_with_the_file(tmp_path):
    path = write(tmp_path, "model: tiny-llama\ndataset: {path: d.jsonl, fromat: alpaca}\nlearnin_rates: 1\nstpes: 3\n")
    with pytest.raises(BadInput) as e:
        load_recipe(path)
    msg = e.value.message
    assert msg.startswith(path)
    assert "'dataset.fromat'" in msg and "'learnin_rates'" in msg and "'stpes'" in msg
    assert "did you mean 'steps'" in msg


def test_bad_values_are_collected():
    with pytest.raises(BadInput) as e:
        recipe_from_dict({"model": "m", "dataset": {"path": "x", "format": "csv"}, "seq_len": 0, "precision": "fp8"})
    m = e.value.message
    assert "dataset.format 'csv'" in m and "seq_len must be at least 1" in m and "precision 'fp8'" in m


def test_wrong_types_and_missing_required():
    with pytest.raises(BadInput) as e:
        recipe_from_dict({"seq_len": "long", "dataset": {"path": "x"}})
    assert "seq_len must be a whole number" in e.value.message and "model is required" in e.value.message


def test_malformed_yaml_names_line(tmp_path):
    path = write(tmp_path, "model: tiny-llama\ndataset: [unclosed\n")
    with pytest.raises(BadInput) as e:
        load_recipe(path)
    assert "not valid YAML" in e.value.message and path in e.value.message


def test_steps_and_epochs_exclusive():
    with pytest.raises(BadInput, match="not both"):
        recipe_from_dict({"model": "m", "dataset": "d", "steps": 3, "epochs": 1.0})


def test_parse_set_nested_and_typed():
    assert parse_set(["dataset.packing=false", "lr=3e-4", "adam_betas=[0.9, 0.95]", "region=null"]) == {
        "dataset": {"packing": False}, "lr": 3e-4, "adam_betas": [0.9, 0.95], "region": None}
    with pytest.raises(BadInput):
        parse_set(["novalue"])


def test_overrides_win_and_paths_are_cwd_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = load_recipe(TINY, merge(parse_set(["dataset.packing=false", "steps=7"]), {"output_dir": "out", "region": "r.bin"}))
    assert r.steps == 7 and r.dataset.packing is False
    assert r.dataset.format == "alpaca"  # untouched nested keys survive the merge
    assert r.output_dir == str(tmp_path / "out") and r.region == str(tmp_path / "r.bin")


def test_dataset_shorthand_and_round_trip():
    r = recipe_from_dict({"model": "m", "dataset": "d.jsonl", "adam_betas": [0.9, 0.95]})
    assert r.dataset.path == "d.jsonl" and r.adam_betas == (0.9, 0.95)
    assert recipe_from_dict(r.to_dict()) == r


def test_total_steps_from_epochs():
    r = recipe_from_dict({"model": "m", "dataset": "d", "epochs": 2.0, "micro_batch": 4, "grad_accum": 2})
    assert total_steps(r, 100, world_size=2) == 12  # 2 x 100 // 16
    assert total_steps(recipe_from_dict({"model": "m", "dataset": "d", "steps": 5}), 100, 1) == 5


def test_docs_recipes_md_is_generated_from_the_models():
    from memascend_cli.run.recipe import reference_markdown

    with open(os.path.join(REPO, "docs", "recipes.md"), encoding="utf-8") as f:
        assert f.read() == reference_markdown(), "regenerate: python -c 'from memascend_cli.run.recipe import " \
            "reference_markdown; open(\"docs/recipes.md\", \"w\").write(reference_markdown())'"


def test_llamafactory_and_native_keys_do_not_clash(tmp_path):
    path = write(tmp_path, "model: m\ndataset: d.jsonl\nlearning_rate: 1.0e-4\nlr: 2.0e-4\n")
    with pytest.raises(BadInput, match="learning_rate and lr both set|lr is given twice"):
        load_recipe(path)
