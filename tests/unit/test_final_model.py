"""Where the final model goes (run/rundir.py), how it joins a run directory (engine/export.py), and what an
output_dir that already holds one allows (run/prepared.py)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from memascend_cli.errors import BadInput
from memascend_cli.run import rundir
from memascend_cli.run.prepared import _check_output_dir
from memascend_engine.export import _begin, _commit


def test_final_model_dir_rule():
    assert rundir.final_model_dir("/r", in_output_dir=True) == "/r"
    assert rundir.final_model_dir("/r", in_output_dir=False) == "/r/export"
    # `memascend export`'s default is the name its --help gives.
    assert rundir.checkpoint_export_dir("/r", "step-0000020") == "/r/export-step-0000020"


@pytest.mark.parametrize("name, model", [("model.safetensors", True), ("model.safetensors.index.json", True),
                                         ("model-00002-of-00003.safetensors", True), ("config.json", True),
                                         ("chat_template.jinja", True), ("generation_config.json", True),
                                         ("model-2-of-3.safetensors", False), ("metrics.jsonl", False),
                                         ("tokenizer.json", False), ("region.bin", False), ("recipe.json", False)])
def test_model_files(name, model):
    assert rundir.is_model_file(name) is model


def test_previous_model_uses_llamafactorys_names():
    assert rundir.previous_model(["config.json", "checkpoints", "metrics.jsonl"]) is None
    assert rundir.previous_model(["config.json", "model.safetensors.index.json"]) == "model.safetensors.index.json"
    assert rundir.previous_model(["pytorch_model.bin"]) == "pytorch_model.bin"


def _files(folder, names):
    os.makedirs(folder, exist_ok=True)
    for n in names:
        with open(os.path.join(folder, n), "w") as f:
            f.write("old")


def test_merge_into_the_run_directory_keeps_the_runs_files(tmp_path):
    run = str(tmp_path)
    _files(run, ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                 "model.safetensors.index.json", "metrics.jsonl", "recipe.json", "tokenizer.json",
                 "chat_template.jinja"])
    _files(os.path.join(run, "checkpoints", "step-0000005"), ["COMPLETE"])
    tmp = _begin(run, merge=True)
    assert tmp == os.path.join(run, rundir.FINAL_MODEL_TMP)
    _files(tmp, ["config.json", "model.safetensors", "tokenizer.json"])  # this model has no chat template
    assert _commit(tmp, run, merge=True) == run
    assert sorted(os.listdir(run)) == ["checkpoints", "config.json", "metrics.jsonl", "model.safetensors",
                                       "recipe.json", "tokenizer.json"]
    assert os.listdir(os.path.join(run, "checkpoints")) == ["step-0000005"]


def test_a_folder_of_its_own_is_replaced_whole(tmp_path):
    out = str(tmp_path / "export")
    _files(out, ["config.json", "stale.txt"])
    tmp = _begin(out, merge=False)
    _files(tmp, ["config.json", "model.safetensors"])
    _commit(tmp, out, merge=False)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"] and not os.path.exists(tmp)


def recipe(**kw):
    return SimpleNamespace(**{"model": "tiny-llama", "tokenizer": None, "overwrite_output_dir": False, **kw})


def test_a_model_without_checkpoints_needs_overwrite_output_dir(tmp_path):
    """As LLaMA-Factory's get_train_args: a trained model in output_dir, no checkpoint to resume -> refused."""
    run = str(tmp_path)
    _files(run, ["config.json", "model.safetensors", "tokenizer.json", "recipe.json", "metrics.jsonl",
                 "generation_config.json"])
    with pytest.raises(BadInput) as e:
        _check_output_dir(recipe(), run, run, [], resume=False, dry_run=False)
    assert e.value.message == f"{run} already holds a trained model (model.safetensors)"
    assert "overwrite_output_dir: true" in e.value.hint
    _check_output_dir(recipe(), run, run, [], resume=False, dry_run=True)  # a dry run writes no model
    assert "model.safetensors" in os.listdir(run)
    # With it: the model's config and weights and the metrics go, nothing else.
    _check_output_dir(recipe(overwrite_output_dir=True), run, run, [], resume=False, dry_run=False)
    assert sorted(os.listdir(run)) == ["recipe.json", "tokenizer.json"]


def test_export_folder_of_a_memascend_recipe_follows_the_same_rule(tmp_path):
    run = str(tmp_path)
    final = rundir.final_model_dir(run, in_output_dir=False)
    _files(final, ["config.json", "model.safetensors"])
    with pytest.raises(BadInput, match="already holds a trained model"):
        _check_output_dir(recipe(), run, final, [], resume=False, dry_run=False)
    _check_output_dir(recipe(overwrite_output_dir=True), run, final, [], resume=False, dry_run=False)
    assert not os.path.exists(final)


def test_checkpoints_without_overwrite_are_refused(tmp_path):
    with pytest.raises(BadInput, match=r"already holds checkpoints \(step-0000005\)") as e:
        _check_output_dir(recipe(), str(tmp_path), str(tmp_path), ["step-0000005"], resume=False, dry_run=False)
    assert "--resume" in e.value.hint
    _check_output_dir(recipe(), str(tmp_path), str(tmp_path), ["step-0000005"], resume=True, dry_run=False)


def test_output_dir_may_not_be_the_model_directory(tmp_path):
    model = str(tmp_path / "model")
    _files(model, ["config.json", "model.safetensors"])
    for r in (recipe(model=model), recipe(tokenizer=model + "/")):
        with pytest.raises(BadInput, match="output_dir .* is the (model|tokenizer) directory"):
            _check_output_dir(r, model, model, [], resume=False, dry_run=False)
    # Its export/ folder is no danger to it.
    with pytest.raises(BadInput, match="already holds checkpoints"):
        _check_output_dir(recipe(model=model), model, model + "/export", ["step-0000001"], resume=False, dry_run=False)


def test_export_never_replaces_a_folder_that_is_not_a_model(tmp_path):
    from memascend_cli.commands.export import export_command

    run = tmp_path / "saves" / "sft"
    _files(str(run / "checkpoints" / "step-0000005"), ["COMPLETE"])
    (run / "recipe.json").write_text('{"precision": "bf16"}')
    for out in (tmp_path, tmp_path / "saves"):  # parents of the run: replacing them would delete it
        with pytest.raises(BadInput, match="exists and is not a model folder") as e:
            export_command(str(run), checkpoint=None, out=str(out), precision=None)
        assert str(run) in e.value.hint


def test_a_run_is_finished_with_its_last_checkpoint_and_final_model(tmp_path):
    run = str(tmp_path / "run")
    for name in ("step-0000005", "step-0000008", ".tmp-step-0000009"):
        _files(os.path.join(run, "checkpoints", name), ["trainer.json"])
    export = os.path.join(run, "export")
    assert rundir.finished_checkpoint(run, 8, final_dir=export) is None  # no checkpoint is COMPLETE yet
    for name in ("step-0000005", "step-0000008"):
        _files(os.path.join(run, "checkpoints", name), [rundir.COMPLETE])
    assert rundir.finished_checkpoint(run, 8, final_dir=export) is None  # the export is not written
    assert rundir.finished_checkpoint(run, 8, final_dir=None) == "step-0000008"
    _files(export, ["model.safetensors"])
    assert rundir.finished_checkpoint(run, 8, final_dir=export) is None  # config.json is written last
    _files(export, [rundir.MODEL_CONFIG])
    assert rundir.finished_checkpoint(run, 8, final_dir=export) == "step-0000008"
    assert rundir.finished_checkpoint(run, 9, final_dir=export) is None  # more steps asked for: resume trains on
