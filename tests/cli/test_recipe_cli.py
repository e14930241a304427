"""`plan RECIPE` and `train RECIPE`: one set of defaults and job parameters; help and tables at 80 columns."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMANDS = ["", "inspect", "plan", "prepare-ssd", "train", "bench", "export", "import-gguf"]


def run(*args, env=None, cwd=None):
    e = {**os.environ, "COLUMNS": "80", "DS_ACCELERATOR": "cpu", **(env or {})}
    return subprocess.run([sys.executable, "-m", "memascend_cli", *[a for a in args if a]], capture_output=True,
                          text=True, env=e, cwd=cwd, timeout=600)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_and_lists_exit_codes(command):
    p = run(command, "--help")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert all(len(l) <= 80 for l in lines), max(lines, key=len)
    assert "…" not in p.stdout, [l for l in lines if "…" in l]
    assert "Exit codes: 0" in " ".join(p.stdout.split())


def test_list_models_fits_80_columns():
    p = run("plan", "--list-models")
    assert p.returncode == 0 and "…" not in p.stdout and all(len(l) <= 80 for l in p.stdout.splitlines())
    assert "qwen2.5-72b" in p.stdout and "72.7B" in p.stdout


@pytest.mark.parametrize("hardware", ["rtx4090-128g", "cpu-24g"])
def test_plan_tables_and_details_fit_80_columns(hardware):
    p = run("plan", "--model", "qwen2.5-7b", "--hardware", hardware, "--details")
    assert p.returncode in (0, 1), p.stderr
    assert all(len(l) <= 80 for l in p.stdout.splitlines()) and "…" not in p.stdout
    assert "buffer_count 5 x A(buffer_size" in " ".join(p.stdout.split())  # formulas are printed, not cut


def test_plan_and_train_agree_on_every_job_parameter(tmp_path):
    env = {"MEMASCEND_CACHE": str(tmp_path / "cache")}
    plan = run("plan", "tiny-cpu", "--json", env=env)
    assert plan.returncode == 0, plan.stderr
    dry = run("train", "tiny-cpu", "--dry-run", "--output-dir", str(tmp_path / "run"), env=env)
    assert dry.returncode == 0, dry.stderr
    planned, trained = json.loads(plan.stdout)["job"], json.loads(dry.stdout)["plan"]["job"]
    assert planned == trained
    assert (planned["seq_len"], planned["micro_batch"], planned["dtype"], planned["checkpointing"]) == \
        (128, 4, "fp32", "none")
    doc = json.loads(dry.stdout)
    # The steps are known before the launch, so the scheduler DeepSpeed gets is final.
    assert doc["total_steps"] == 30 and doc["ds_config"]["scheduler"]["params"]["total_num_steps"] == 30
    assert doc["data"]["train_sequences"] > 0 and os.path.isdir(doc["data"]["cache_dir"])


def test_plan_defaults_are_trains_defaults(tmp_path):
    from memascend_cli.run.recipe import recipe_from_dict

    r = recipe_from_dict({"model": "tiny-llama", "dataset": "d.jsonl"})
    p = run("plan", "--model", "tiny-llama", "--hardware", "cpu-24g", "--json")
    job = json.loads(p.stdout)["job"]
    assert (job["seq_len"], job["micro_batch"], job["grad_accum_steps"], job["dtype"]) == \
        (r.seq_len, r.micro_batch, r.grad_accum, r.precision)
    assert job["checkpointing"] == ("offload" if r.gradient_checkpointing else "none")


def test_hub_ids_and_gguf_paths_get_hints(tmp_path):
    p = run("plan", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct", env={"HF_HUB_OFFLINE": "1",
                                                                          "HF_HOME": str(tmp_path / "hf")})
    said = " ".join(p.stderr.split())
    assert p.returncode == 2 and "config.json is not in the Hugging Face cache" in said
    assert "hf download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir" in said
    p = run("plan", "--model", str(tmp_path / "missing.gguf"))
    assert p.returncode == 2 and "no such GGUF file" in p.stderr
    notgguf = tmp_path / "x.gguf"
    notgguf.write_bytes(b"not a gguf")
    p = run("plan", "--model", str(notgguf))
    assert p.returncode == 2 and "not a GGUF file" in p.stderr


def test_recipe_errors_are_one_line_with_a_hint(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("model: tiny-llama\ndataset: d.jsonl\nseq_len: 0\nprecision: fp8\nschedule: {name: step}\n")
    p = run("train", str(bad), "--dry-run")
    assert p.returncode == 2
    err = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and "Traceback" not in p.stderr
    text = " ".join(p.stderr.split())
    assert "seq_len must be at least 1" in text and "precision 'fp8' is not one of bf16, fp32, fp16" in text
    assert "schedule.name 'step' is not one of constant, cosine, linear" in text
    assert re.search(r"hint: recipe keys: model, dataset", text)


# Large but real-world values: a long run, a high loss, a fast node with much memory and a fast SSD.
BIG_STEP = {"event": "step", "step": 12345, "total_steps": 20000, "loss": 10.3456, "lr": 1.5e-4, "tokens_per_s": 98765.4,
            "s_per_step": 12.3, "host_rss_gib": 123.45, "host_peak_gib": 130.0, "ssd_read_gbps": 12.34,
            "ssd_write_gbps": 9.87}


def test_train_progress_fits_80_columns():
    from rich.console import Console, Group
    from rich.text import Text

    from memascend_cli.run.live import format_event, format_stats, format_step
    from memascend_cli.console import step_progress

    assert len(format_step(BIG_STEP)) <= 80 and len(format_stats(BIG_STEP)) <= 80
    assert len(format_event({"event": "eval", "step": 12345, "loss": 1.23456})) <= 80
    console = Console(width=80, record=True, force_terminal=True, color_system=None)
    progress = step_progress(console)
    task = progress.add_task("memascend(no-fused-check): backward", total=20000)
    progress.update(task, completed=12345)
    console.print(Group(progress, Text(format_stats(BIG_STEP))))
    text = console.export_text()
    assert all(len(l) <= 80 for l in text.splitlines()), text
    assert "12345/20000" in text and "eta" in text and "tok/s" in text


def test_plan_prints_the_translation_notes_train_prints(tmp_path, monkeypatch):
    """The LLaMA-Factory example with its `deepspeed:` line back: `plan RECIPE` says what `train RECIPE --dry-run`
    says the translation changed (the line replaced, the template, the keys ignored)."""
    import shutil

    pytest.importorskip("transformers")
    from memascend_cli.run.recipe import load_recipe
    from tests.integration.test_llamafactory_cpu import ASSETS, tiny_model_dir

    work = tmp_path / "lf"
    shutil.copytree(ASSETS, work)
    text = (work / "tiny_full_sft.yaml").read_text()
    for old, new in (("MODEL_DIR", tiny_model_dir(str(tmp_path / "tiny-instruct"))), ("OUTPUT_DIR", "saves/sft"),
                     ("template: qwen", "template: qwen3_nothink"),
                     ("trust_remote_code: true", "trust_remote_code: true\ndeepspeed: examples/deepspeed/ds_z3.json")):
        assert old in text
        text = text.replace(old, new)
    (work / "recipe.yaml").write_text(text + "max_steps: 5\n")
    monkeypatch.chdir(work)
    notes: list[str] = []
    load_recipe("recipe.yaml", notes=notes)
    assert any(n.startswith("deepspeed: examples/deepspeed/ds_z3.json replaced") for n in notes)
    assert any(n.startswith("template: 'qwen3_nothink' rendered with the tokenizer's own") for n in notes)
    assert any(n.startswith("ddp_timeout: ignored") for n in notes)
    env = {"MEMASCEND_CACHE": str(tmp_path / "cache")}
    plan = run("plan", "recipe.yaml", "--cpu-gflops", "10", env=env, cwd=work)
    assert plan.returncode in (0, 1), plan.stderr
    dry = run("train", "recipe.yaml", "--dry-run", env=env, cwd=work)
    assert dry.returncode == 0, dry.stderr
    for note in notes:
        assert f"note: {note}" in " ".join(plan.stderr.split()), note
        assert f"note: {note}" in " ".join(dry.stderr.split()), note


@pytest.mark.parametrize("command", [("plan",), ("train", "--dry-run")])
def test_a_llamafactory_v1_config_is_refused_in_one_line(tmp_path, command):
    from tests.unit.test_llamafactory import V1_EXAMPLE

    path = tmp_path / "v1.yaml"
    path.write_text(V1_EXAMPLE)
    p = run(command[0], str(path), *command[1:])
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    text = " ".join(p.stderr.split())
    assert [l for l in p.stderr.splitlines() if l.startswith("error:")] == [p.stderr.splitlines()[0]]
    assert f"error: {path} is a LLaMA-Factory v1 config (USE_V1=1;" in text and "did you mean" not in text
    assert "hint: write it in LLaMA-Factory's default format" in text
