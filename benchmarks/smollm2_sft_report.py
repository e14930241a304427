"""Raw JSON and the docs/results.md tables of a `presets/train/smollm2-sft.yaml` run.

    memascend train presets/train/smollm2-sft.yaml --output-dir /var/tmp/smollm2-sft
    python benchmarks/smollm2_sft_report.py --run /var/tmp/smollm2-sft --out docs/raw/smollm2-sft.json
    python benchmarks/smollm2_sft_report.py --table docs/raw/smollm2-sft.json

Collects the run's metrics (per-step losses, validation losses, step times, host memory), what was
prepared (data.json), the export's files, and greedy generations on held-out questions (questions of
the trained kinds that are not in the data set) from the original model (the imported GGUF) and from
the export, both with the tokenizer's chat template.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HELD_OUT = ["What is the capital of Belgium?", "What is 17 plus 25?", "What is the opposite of 'near'?",
            "What is the plural of 'goose'?", "What colour is a lemon?"]


def generate(model_dir: str, questions: list[str]) -> list[str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    out = []
    for q in questions:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        gen = model.generate(ids, max_new_tokens=24, do_sample=False)
        out.append(tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True).strip())
    return out


def collect(run: str) -> dict:
    with open(os.path.join(run, "recipe.json")) as f:
        recipe = json.load(f)
    with open(os.path.join(run, "data.json")) as f:
        data = json.load(f)
    records = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    steps = [r for r in records if r["event"] == "step"]
    evals = [{"step": r["step"], "loss": r["loss"]} for r in records if r["event"] == "eval"]
    from memascend_cli.run.rundir import final_model_dir

    export = final_model_dir(run, in_output_dir=recipe.get("export_in_output_dir", False))
    from transformers import AutoTokenizer, GenerationConfig

    from memascend_engine.data import hf_validation_loss

    tok = AutoTokenizer.from_pretrained(export)
    gen = GenerationConfig.from_pretrained(export)
    original = recipe["model"]
    import subprocess

    plan = subprocess.run([sys.executable, "-m", "memascend_cli", "plan", os.path.join(run, "recipe.json"), "--json"],
                          capture_output=True, text=True)
    planned = json.loads(plan.stdout)["engines"]["memascend"]["node_host_peak_bytes"] / 2**30 if plan.stdout else None
    return {
        "what": "presets/train/smollm2-sft.yaml (benchmarks/smollm2_sft_report.py)",
        "date": time.strftime("%Y-%m-%d"),
        "model": os.path.basename(original).rsplit("-", 1)[0],  # the imported GGUF, without the cache key
        "recipe": {k: recipe[k] for k in ("seq_len", "micro_batch", "grad_accum", "steps", "lr", "precision",
                                          "gradient_checkpointing", "seed")} | {"schedule": recipe["schedule"]},
        "data": {k: data[k] for k in ("template", "samples", "train_sequences", "validation_sequences", "train_tokens",
                                      "train_loss_tokens")},
        "engine": next(r["engine"] for r in records if r["event"] == "start"),
        "losses": [round(r["loss"], 5) for r in steps],
        "validation": evals,
        "seconds_per_step": [round(r["s_per_step"], 3) for r in steps],
        "host_peak_gib": max(r["host_peak_gib"] for r in steps),
        "plan_host_peak_gib": planned,
        "wall_seconds": round(records[-1]["time"] - records[0]["time"], 1),
        "export": {"files": sorted(os.listdir(export)), "chat_template_kept": bool(tok.chat_template),
                   "generation_config": {"bos_token_id": gen.bos_token_id, "eos_token_id": gen.eos_token_id,
                                         "pad_token_id": gen.pad_token_id}},
        "validation_loss_hf": {"original": hf_validation_loss(original, data["cache_dir"]),
                               "fine_tuned": hf_validation_loss(export, data["cache_dir"])},
        "held_out": [{"question": q, "original": a, "fine_tuned": b}
                     for q, a, b in zip(HELD_OUT, generate(original, HELD_OUT), generate(export, HELD_OUT))],
    }


def tables(doc: dict) -> str:
    v = doc["validation"]
    s = doc["seconds_per_step"]
    lines = [f"{doc['model']} ({doc['engine']} engine, {doc['recipe']['precision']}, seq {doc['recipe']['seq_len']} x "
             f"micro-batch {doc['recipe']['micro_batch']}, {len(doc['losses'])} steps, lr {doc['recipe']['lr']:g} cosine): "
             f"{doc['data']['samples']} samples rendered with the {doc['data']['template']}'s chat template into "
             f"{doc['data']['train_sequences']} packed training rows ({doc['data']['train_tokens']:,} tokens, "
             f"{doc['data']['train_loss_tokens']:,} of them assistant tokens in the loss) and "
             f"{doc['data']['validation_sequences']} validation rows.",
             "",
             "| validation loss at step | " + " | ".join(str(e["step"]) for e in v) + " |",
             "|---|" + "---:|" * len(v),
             "| | " + " | ".join(f"{e['loss']:.4f}" for e in v) + " |",
             "",
             f"The same validation rows through transformers outside DeepSpeed: original model "
             f"{doc['validation_loss_hf']['original']:.4f}, fine-tuned export {doc['validation_loss_hf']['fine_tuned']:.4f}.",
             "",
             f"Training losses: first {doc['losses'][0]:.4f}, last {doc['losses'][-1]:.4f}; median "
             f"{sorted(s)[len(s) // 2]:.1f} s/step (first step {s[0]:.1f} s); host peak (VmHWM) {doc['host_peak_gib']:.2f} GiB, "
             f"planned {doc['plan_host_peak_gib']:.2f} GiB; "
             f"{doc['wall_seconds']:.0f} s from start to export. Export: {', '.join(doc['export']['files'])} "
             f"(chat template kept: {doc['export']['chat_template_kept']}; generation config "
             f"eos {doc['export']['generation_config']['eos_token_id']}).",
             "",
             "| held-out question | original SmolLM2-135M-Instruct | fine-tuned export |",
             "|---|---|---|"]
    for h in doc["held_out"]:
        cell = lambda t: t.replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines.append(f"| {h['question']} | {cell(h['original'])} | {cell(h['fine_tuned'])} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="run directory of the smollm2-sft recipe")
    ap.add_argument("--out", help="write the raw JSON here")
    ap.add_argument("--table", help="print the markdown of an existing JSON file and exit")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as f:
            print(tables(json.load(f)))
        return
    if not args.run:
        sys.exit("give --run RUN_DIR or --table FILE")
    doc = collect(args.run)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    print(tables(doc))


if __name__ == "__main__":
    main()
