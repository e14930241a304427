"""The hub checks, run without a network and recorded as JSON: hub model ids and hub datasets through the real
huggingface_hub and datasets, on caches built as they build them (tests/hub_cache.py).

    python scripts/hub_bars.py --out docs/bench/hub/bars.json

1. `plan --model Qwen/Qwen2.5-0.5B` with an empty cache and no network (HF_ENDPOINT a closed port), then with its
   config.json in the cache (Qwen2.5-0.5B's shapes, from the preset that records them) and HF_HUB_OFFLINE=1;
2. a LLaMA-Factory recipe naming a hub model (a tiny random Llama, org/tiny-instruct) and an hf_hub_url dataset
   (llamafactory/alpaca_en_demo, the 40 samples of tests/assets/llamafactory/data/alpaca_demo.json): `train --dry-run`
   against a local server serving both repos as the hub does, then `train` (3 steps) with HF_HUB_OFFLINE=1;
3. the hub's refusals (gated repo, missing revision, bad token) from a local server answering as the hub does, and
   no network: exit code and the error and hint lines.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests import hub_cache  # noqa: E402  (the caches and the local hub the tests use)

ASSETS = os.path.join(REPO, "tests", "assets", "llamafactory")


def run(args: list[str], hf_home: str, *, cwd: str, offline: bool, endpoint: str | None = None,
        token: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    if token:
        env["HF_TOKEN"] = token
    env.update(HF_HOME=hf_home, DS_ACCELERATOR="cpu", MEMASCEND_CACHE=os.path.join(hf_home, "..", "ms"))
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "memascend_cli", *args], cwd=cwd, capture_output=True, text=True,
                       env=env, timeout=1800)
    lines = p.stderr.splitlines()
    return {"command": "memascend " + " ".join(args),
            "env": {k: env[k] for k in ("HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_TOKEN") if k in env},
            "exit": p.returncode, "seconds": round(time.monotonic() - started, 1),
            "error": next((x for x in lines if x.startswith("error:")), None),
            "hint": next((x for x in lines if x.startswith("hint:")), None),
            "would_download": [x for x in lines if x.startswith("would download:")],
            "traceback": "Traceback" in p.stderr, "stdout": p.stdout}


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def plan_bars(work: str) -> list[dict]:
    import yaml

    hf = os.path.join(work, "plan-hf")
    out = [run(["plan", "--model", "Qwen/Qwen2.5-0.5B"], hf, cwd=work, offline=False, endpoint=closed_port_url())]
    with open(os.path.join(REPO, "presets", "models", "qwen2.5-0.5b.yaml")) as f:
        preset = yaml.safe_load(f)
    folder = os.path.join(work, "qwen-config")
    os.makedirs(folder)
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "tie_word_embeddings", "max_position_embeddings")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({k: preset[k] for k in keys}, f)
    hub_cache.model_snapshot(os.path.join(hf, "hub"), "Qwen/Qwen2.5-0.5B", folder)
    cached = run(["plan", "--model", "Qwen/Qwen2.5-0.5B", "--json"], hf, cwd=work, offline=True)
    doc = json.loads(cached.pop("stdout"))
    cached["plan"] = {"model": doc["job"]["model"], "num_params": doc["job"]["num_params"],
                      "published_num_params": preset["published_num_params"],
                      "verdict": {k: doc["verdict"].get(k) for k in ("engine", "fits", "binding", "line")}}
    out[0].pop("stdout")
    return out + [cached]


def train_bars(work: str) -> list[dict]:
    from tests.integration.test_llamafactory_cpu import tiny_model_dir

    hf = os.path.join(work, "train-hf")
    model = tiny_model_dir(os.path.join(work, "tiny-instruct"))
    lf = os.path.join(work, "llamafactory")
    shutil.copytree(ASSETS, lf)
    with open(os.path.join(lf, "data", "dataset_info.json")) as f:
        info = json.load(f)
    info["alpaca_en_demo"] = {"hf_hub_url": "llamafactory/alpaca_en_demo", "ms_hub_url": "llamafactory/alpaca_en_demo"}
    with open(os.path.join(lf, "data", "dataset_info.json"), "w") as f:
        json.dump(info, f)
    with open(os.path.join(lf, "tiny_full_sft.yaml")) as f:
        text = f.read().replace("MODEL_DIR", "org/tiny-instruct").replace("OUTPUT_DIR", "saves/hub")
    with open(os.path.join(lf, "tiny_full_sft.yaml"), "w") as f:
        f.write(text.replace("dataset: alpaca_demo", "dataset: alpaca_en_demo") + "max_steps: 3\n")
    data = os.path.join(work, "alpaca_en_demo")  # the dataset repo the local hub serves: one JSON file
    os.makedirs(data)
    shutil.copy(os.path.join(ASSETS, "data", "alpaca_demo.json"), os.path.join(data, "alpaca_en_demo.json"))
    endpoint, server = hub_cache.serving_hub("org/tiny-instruct", model, datasets={"llamafactory/alpaca_en_demo": data})
    try:
        dry = run(["train", "tiny_full_sft.yaml", "--dry-run"], hf, cwd=lf, offline=False, endpoint=endpoint)
    finally:
        server.shutdown()
    dry["downloads"] = json.loads(dry.pop("stdout"))["downloads"]
    shutil.rmtree(os.path.join(hf, "hub"))  # the dry run's config.json: the offline run gets the whole snapshot
    hub_cache.model_snapshot(os.path.join(hf, "hub"), "org/tiny-instruct", model, tree=True)
    hub_cache.dataset_cache(os.path.join(hf, "datasets"), "llamafactory/alpaca_en_demo",
                            os.path.join(ASSETS, "data", "alpaca_demo.json"))
    trained = run(["train", "tiny_full_sft.yaml"], hf, cwd=lf, offline=True)
    trained.pop("stdout")
    run_dir = os.path.join(lf, "saves", "hub")
    if trained["exit"] == 0:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        trained["steps"] = [r["step"] for r in records if r["event"] == "step"]
        trained["losses"] = [r["loss"] for r in records if r["event"] == "step"]
        trained["total_steps"] = next(r for r in records if r["event"] == "start")["total_steps"]
        with open(os.path.join(run_dir, "sources.json")) as f:
            sources = json.load(f)
        trained["sources"] = {"model": {k: sources["model"][k] for k in ("repo_id", "revision", "commit")},
                              "dataset": {k: sources["dataset"][k] for k in ("repo_id", "split")}}
    return [dry, trained]


def refusal_bars(work: str) -> list[dict]:
    endpoint, server = hub_cache.refusing_hub()
    out = []
    try:
        for repo, revision in (("org/gated", "main"), ("org/no-revision", "v9"), ("org/bad-token", "main")):
            recipe = os.path.join(work, f"{repo.split('/')[1]}.yaml")
            with open(recipe, "w") as f:
                f.write(f"model: {repo}\nrevision: {revision}\ndataset: d.jsonl\nsteps: 1\n")
            out.append(run(["train", recipe, "--dry-run"], os.path.join(work, "refusal-hf"), cwd=work,
                           offline=False, endpoint=endpoint, token="hf_not_a_token" if "token" in repo else None))
    finally:
        server.shutdown()
    out.append(run(["train", os.path.join(work, "gated.yaml"), "--dry-run"], os.path.join(work, "refusal-hf"),
                   cwd=work, offline=False, endpoint=closed_port_url()))
    for r in out:
        r.pop("stdout")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hub-bars-") as work:
        with open(os.path.join(work, "d.jsonl"), "w") as f:
            f.write('{"instruction": "a", "output": "b"}\n')
        doc = {"command": f"python scripts/hub_bars.py --out {args.out}",
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "host": f"{platform.node()} ({os.cpu_count()} cores)",
               "memascend_commit": subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True,
                                                  text=True).stdout.strip(),
               "plan": plan_bars(work), "train": train_bars(work), "refusals": refusal_bars(work)}
    text = json.dumps(doc, separators=(",", ":")).replace(work, "$WORK")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
