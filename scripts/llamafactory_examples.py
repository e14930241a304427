"""Every full-parameter SFT / pre-training example of a LLaMA-Factory checkout through `memascend plan` and
`memascend train --dry-run`, with only `model_name_or_path` changed (to a local tiny Llama), recorded as JSON.

    python scripts/llamafactory_examples.py --repo /path/to/LLaMA-Factory --out docs/raw/llamafactory-examples.json.gz

--repo is a checkout or a bare git directory (its HEAD is read with `git archive`). The examples run from a folder
holding the checkout's own `data/` (dataset_info.json and the demo datasets), as LLaMA-Factory's README runs them.
Examples of LLaMA-Factory's v1 trainer (examples/v1/, another config format) are not recipes of the CLI and are
skipped. scripts/results.py renders the JSON (gzipped where --out ends in .gz, as it is committed).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tarfile
import tempfile

import yaml

from memascend_cli.bench.document import write_summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER_JSON = os.path.join(REPO, "presets", "train", "data", "tokenizer.json")
STAGES = ("sft", "pt")


def export_tree(repo: str, dest: str) -> str:
    """examples/ and data/ of `repo`'s HEAD into dest; returns the commit."""
    git = ["git", "-C", repo] if os.path.isdir(os.path.join(repo, ".git")) else ["git", f"--git-dir={repo}"]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    archive = os.path.join(dest, "tree.tar")
    subprocess.run([*git, "archive", "-o", archive, "HEAD", "examples", "data"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    os.unlink(archive)
    return commit


def full_examples(root: str) -> list[str]:
    """The examples (paths relative to root) with finetuning_type full and stage sft or pt."""
    found = []
    for folder, _, files in os.walk(os.path.join(root, "examples")):
        for name in files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if not name.endswith((".yaml", ".yml")) or rel.startswith("examples/v1/"):
                continue
            try:
                with open(path) as f:
                    doc = yaml.safe_load(f)
            except yaml.YAMLError:
                continue
            if isinstance(doc, dict) and doc.get("finetuning_type") == "full" and doc.get("stage") in STAGES:
                found.append(rel)
    return sorted(found)


def tiny_model_dir(path: str) -> str:
    """A local Hugging Face model directory: a random tiny Llama and a tokenizer with a chat template."""
    import torch
    from memascend_engine.data_prepare import BUILTIN_TEMPLATES, load_tokenizer
    from memascend_engine.hf_models import to_hf_config
    from transformers import AutoModelForCausalLM

    from memascend_cli.models import load_preset

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(to_hf_config(load_preset("tiny-llama"))).save_pretrained(path)
    tok = load_tokenizer(TOKENIZER_JSON)
    tok.chat_template = BUILTIN_TEMPLATES["chatml"]
    tok.save_pretrained(path)
    return path


def with_model(text: str, model_dir: str) -> str:
    """The example's text with only model_name_or_path changed."""
    new, n = re.subn(r"(?m)^model_name_or_path:.*$", f"model_name_or_path: {model_dir}", text)
    if n != 1:
        raise ValueError("no single model_name_or_path line")
    return new


def _said(stderr: str) -> dict:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    error = next((line for line in lines if line.startswith("error:")), None)
    return {"error": error, "hint": next((line for line in lines if line.startswith("hint:")), None),
            "notes": [line for line in lines if line.startswith("note:")],
            "downloads": [line for line in lines if line.startswith("would download:")],
            "traceback": "Traceback" in stderr}


def run_example(root: str, rel: str, model_dir: str) -> dict:
    with open(os.path.join(root, rel)) as f:
        text = with_model(f.read(), model_dir)
    name = os.path.basename(rel)
    with open(os.path.join(root, name), "w") as f:  # beside data/, as `llamafactory-cli train examples/...` runs
        f.write(text)
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    out = {"example": rel}
    for step, args in (("plan", ["plan", name]), ("dry_run", ["train", name, "--dry-run"])):
        p = subprocess.run([sys.executable, "-m", "memascend_cli", *args], cwd=root, capture_output=True, text=True,
                           env=env, timeout=600)
        out[step] = {"exit": p.returncode, **_said(p.stderr)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="a LLaMA-Factory checkout or bare git directory")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lf-examples-") as d:
        commit = export_tree(args.repo, d)
        model_dir = tiny_model_dir(os.path.join(d, "tiny-instruct"))
        results = []
        for rel in full_examples(d):
            results.append(run_example(d, rel, model_dir))
            r = results[-1]
            print(f"{rel}: plan exit {r['plan']['exit']}, dry run exit {r['dry_run']['exit']} "
                  f"{r['dry_run']['error'] or ''}", flush=True)
    doc = {"command": f"python scripts/llamafactory_examples.py --repo LLaMA-Factory --out {args.out}",
           "llamafactory_commit": commit,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "host": f"{platform.node()} ({os.cpu_count()} cores)", "examples": results}
    write_summary(args.out, doc)  # one line: the repository counts tracked lines
    return 0 if not any(r[s]["traceback"] for r in results for s in ("plan", "dry_run")) else 1


if __name__ == "__main__":
    sys.exit(main())
