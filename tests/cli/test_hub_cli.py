"""Hub model ids in `plan` and `train --dry-run` without a network: the real huggingface_hub on caches the tests build
(tests/hub_cache.py), HF_HUB_OFFLINE or an HF_ENDPOINT that is a closed port, and a local server refusing as the hub
does (gated, missing revision, missing repo, bad token). Every error is one `error:` line with a `hint:`, exit 2."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
import yaml

from memascend_cli.units import fmt_bytes
from tests import hub_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the socket is: connections are refused


def memascend(args, tmp_path, *, offline=True, endpoint=None, cwd=None, timeout=300, token=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    if token:
        env["HF_TOKEN"] = token
    env.update(HF_HOME=str(tmp_path / "hf"), DS_ACCELERATOR="cpu", MEMASCEND_CACHE=str(tmp_path / "ms-cache"))
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    return subprocess.run([sys.executable, "-m", "memascend_cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd or tmp_path, timeout=timeout)


def one_error(p) -> tuple[str, str]:
    """The error and hint lines; fails on a traceback or several errors."""
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    hints = [line for line in p.stderr.splitlines() if line.startswith("hint:")]
    assert len(errors) == 1 and len(hints) == 1, p.stderr
    return errors[0], hints[0]


def test_plan_offline_with_empty_cache_names_the_config_and_the_preset(tmp_path):
    error, hint = one_error(memascend(["plan", "--model", "Qwen/Qwen2.5-0.5B"], tmp_path))
    assert "Qwen/Qwen2.5-0.5B" in error and "config.json is not in the Hugging Face cache" in error
    assert "HF_HUB_OFFLINE is set" in error
    assert "--model qwen2.5-0.5b" in hint


def test_plan_without_network_names_the_config_and_the_preset(tmp_path):
    # huggingface_hub alone retries a refused connection for ~23 s (backoff 1+2+4+8+8 s): the error comes at once.
    t0 = time.monotonic()
    p = memascend(["plan", "--model", "Qwen/Qwen2.5-0.5B"], tmp_path, offline=False,
                  endpoint=f"http://127.0.0.1:{closed_port()}")
    assert time.monotonic() - t0 < 15
    error, hint = one_error(p)
    assert "config.json is not in the Hugging Face cache" in error and "no connection to http://127.0.0.1:" in error
    assert "--model qwen2.5-0.5b" in hint


def qwen_config() -> dict:
    """Qwen2.5-0.5B's config.json keys (from the preset, which records them)."""
    with open(os.path.join(REPO, "presets", "models", "qwen2.5-0.5b.yaml")) as f:
        preset = yaml.safe_load(f)
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "tie_word_embeddings", "max_position_embeddings")
    return {k: preset[k] for k in keys}, preset["published_num_params"]


def test_plan_reads_the_cached_config_offline(tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    config, published = qwen_config()
    (folder / "config.json").write_text(json.dumps(config))
    hub_cache.model_snapshot(str(tmp_path / "hf" / "hub"), "Qwen/Qwen2.5-0.5B", str(folder))
    p = memascend(["plan", "--model", "Qwen/Qwen2.5-0.5B", "--json"], tmp_path)
    assert p.returncode in (0, 1), p.stderr  # fits or not: a plan either way
    doc = json.loads(p.stdout)
    assert doc["job"]["model"] == "Qwen2.5-0.5B" and doc["job"]["num_params"] == published


@pytest.mark.parametrize("repo, said, hinted", [
    ("org/gated", "model org/gated is gated", "accept the conditions on https://huggingface.co/org/gated"),
    ("org/no-revision", "model org/no-revision has no revision 'v9'", "give a branch, tag or commit"),
    ("org/missing", "model org/missing does not exist on the hub or is private", "check the id"),
    ("org/bad-token", "the hub refused the token while getting org/bad-token (HF_TOKEN is set: invalid credentials)",
     "set HF_TOKEN to a valid token"),
])
def test_hub_refusals_are_one_line(tmp_path, repo, said, hinted):
    endpoint, server = hub_cache.refusing_hub()
    try:
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"model: {repo}\nrevision: {'v9' if 'revision' in repo else 'main'}\n"
                          "dataset: d.jsonl\nsteps: 1\n")
        (tmp_path / "d.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
        for args in (["plan", str(recipe)], ["train", str(recipe), "--dry-run"]):
            p = memascend(args, tmp_path, offline=False, endpoint=endpoint, token="hf_not_a_token")
            error, hint = one_error(p)
            assert said in error and hinted in hint
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.integration.test_llamafactory_cpu import tiny_model_dir

    return tiny_model_dir(str(tmp_path_factory.mktemp("tiny") / "tiny-instruct"))


def test_offline_train_names_the_files_missing_from_the_snapshot(tmp_path, tiny_model):
    hub_cache.model_snapshot(str(tmp_path / "hf" / "hub"), "org/tiny", tiny_model, tree=True,
                             skip=("model.safetensors",))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: org/tiny\ndataset: d.jsonl\nsteps: 1\nseq_len: 32\n")
    (tmp_path / "d.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    error, hint = one_error(memascend(["train", str(recipe), "--dry-run"], tmp_path))
    assert "model org/tiny: the cached copy is incomplete: 1 file(s) are missing (model.safetensors)" in error
    assert "HF_HUB_OFFLINE" in hint


def test_offline_dry_run_names_the_dataset_to_download(tmp_path, tiny_model):
    hub_cache.model_snapshot(str(tmp_path / "hf" / "hub"), "org/tiny", tiny_model, tree=True)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: org/tiny\ndataset: {hub: org/chat-data}\nsteps: 1\nseq_len: 32\n")
    p = memascend(["train", str(recipe), "--dry-run", "-o", str(tmp_path / "run")], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "would download: dataset org/chat-data (split train): size unknown (the hub cannot be reached)" in p.stderr
    doc = json.loads(p.stdout)
    model = doc["downloads"]["model"]
    assert model["commit"] == hub_cache.COMMIT and model["download_files"] == [] and "model.safetensors" in \
        model["cached_files"]
    assert doc["data"]["pending"]["dataset"] == "org/chat-data" and doc["total_steps"] == 1


def test_dry_run_says_what_would_be_downloaded_and_downloads_nothing(tmp_path, tiny_model):
    folder = tmp_path / "repo"
    shutil.copytree(tiny_model, folder)
    (folder / "pytorch_model.bin").write_bytes(b"\0" * 1000)  # a duplicate of the weights: never downloaded
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.json").write_text(json.dumps([{"instruction": "a", "output": "b"}] * 50))
    endpoint, server = hub_cache.serving_hub("org/tiny", str(folder), datasets={"org/chat-data": str(data)})
    try:
        recipe = tmp_path / "r.yaml"
        recipe.write_text("model: org/tiny\ndataset: {hub: org/chat-data}\nsteps: 1\nseq_len: 32\n")
        p = memascend(["train", str(recipe), "--dry-run", "-o", str(tmp_path / "run")], tmp_path, offline=False,
                      endpoint=endpoint)
    finally:
        server.shutdown()
    assert p.returncode == 0, p.stderr
    wanted = sorted(n for n in os.listdir(folder) if n != "pytorch_model.bin")
    size = sum(os.path.getsize(folder / n) for n in wanted if n != "config.json")
    model = json.loads(p.stdout)["downloads"]["model"]
    assert model["cached_files"] == ["config.json"]  # plan read it (a few bytes), alone
    assert sorted(model["download_files"]) == [n for n in wanted if n != "config.json"]
    assert model["download_bytes"] == size and model["commit"] == hub_cache.COMMIT
    assert f"would download: model org/tiny (main): {len(wanted) - 1} files, {fmt_bytes(size)}" in p.stderr
    assert "would download: dataset org/chat-data (split train): at most " \
        f"{fmt_bytes(os.path.getsize(data / 'train.json'))}" in p.stderr
    snapshot = tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / hub_cache.COMMIT
    assert os.listdir(snapshot) == ["config.json"]


DOWNLOAD = """
import json, sys
from memascend_cli.run import hub_download as H
model = H.locate("org/tiny", None)
print(json.dumps(model.to_dict()))
H.check_disk(model, None, 0)
print(H.download(model))
print(json.dumps(H.locate("org/tiny", None).to_dict()))
"""


def test_download_takes_safetensors_tokenizer_and_config_only(tmp_path, tiny_model):
    folder = tmp_path / "repo"
    shutil.copytree(tiny_model, folder)
    for dup in ("pytorch_model.bin", "model.onnx", "model-q4.gguf", "consolidated.pth", "consolidated.safetensors"):
        (folder / dup).write_bytes(b"\0" * 100)
    endpoint, server = hub_cache.serving_hub("org/tiny", str(folder))
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
        env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=endpoint)
        p = subprocess.run([sys.executable, "-c", DOWNLOAD], capture_output=True, text=True, env=env, timeout=300,
                           cwd=REPO)
    finally:
        server.shutdown()
    assert p.returncode == 0, p.stderr
    before, snapshot, after = p.stdout.strip().splitlines()[-3:]
    before, after = json.loads(before), json.loads(after)
    wanted = sorted(n for n in os.listdir(tiny_model))
    assert sorted(before["download_files"]) == wanted and before["snapshot"] is None
    assert before["download_bytes"] == sum(os.path.getsize(folder / n) for n in wanted)
    assert sorted(os.listdir(snapshot)) == wanted  # no .bin / .onnx / .gguf / .pth / consolidated duplicate
    assert after["download_files"] == [] and after["snapshot"] == snapshot and after["commit"] == hub_cache.COMMIT
    assert "downloading org/tiny" in p.stderr


def test_plan_without_huggingface_hub_installed_says_so(tmp_path):
    # As on a light install (`pip install memascend`, no train extras): the package cannot be imported.
    code = ("import sys; sys.modules['huggingface_hub'] = None; sys.argv = ['memascend', 'plan', '--model', "
            "'Qwen/Qwen2.5-0.5B']; from memascend_cli.app import main; sys.exit(main())")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env["HF_HOME"] = str(tmp_path / "hf")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    error, hint = one_error(p)
    assert "huggingface_hub is not installed" in error and "pip install huggingface_hub" in hint
    assert "--model qwen2.5-0.5b" in hint
