"""A plain TRL `SFTTrainer` script with `memascend_engine.install()` (run by test_trl_sft_install.py and
benchmarks/user_script_bench.py).

usage: trl_sft_job.py before|after|plain CONFIG.json REGION NVME_PATH OUT.json [MODEL_DIR SEQ_LEN STEPS]

The same shape as hf_trainer_job.py (`before` / `after`: install() before or after SFTConfig; `plain`: never), as a
TRL user writes it: a text dataset (the questions and answers of presets/train/data/smol-instruct.jsonl) that
SFTTrainer tokenizes and packs into blocks of SEQ_LEN tokens itself, a tokenizer (the repo's tiny BPE), and a
random-weight Llama from a config (MODEL_DIR's config.json in the benchmark). Writes what hf_trainer_job.py writes.
"""

from __future__ import annotations

import json
import os

import torch
from datasets import Dataset
from hf_trainer_job import Losses, job_args, model_config, write_result  # beside this file (sys.path[0] as a script)
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

import memascend_engine

STEPS = 2
SEQ = 32
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "presets", "train", "data")


def text_dataset() -> Dataset:
    """One "text" row per conversation: the user's turn and the assistant's answer."""
    rows = []
    with open(os.path.join(DATA, "smol-instruct.jsonl"), encoding="utf-8") as f:
        for line in f:
            turns = json.loads(line)["messages"]
            rows.append({"text": "\n".join(t["content"] for t in turns)})
    return Dataset.from_list(rows)


def main() -> None:
    order, ds_config, region, nvme_path, out, model_dir, seq, steps = job_args(SEQ, STEPS)
    handle = memascend_engine.install(ds_config, region=region) if order == "before" else None
    # packing "wrapped": the texts are concatenated and cut into blocks of exactly max_length tokens (every batch
    # is micro-batch x seq, as in the HF Trainer script), not padded.
    args = SFTConfig(output_dir=os.path.join(os.path.dirname(out), "trl-out"), deepspeed=ds_config, max_steps=steps,
                     per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1, save_strategy="no",
                     report_to=[], use_cpu=True, bf16=True, disable_tqdm=True, max_length=seq, packing=True,
                     packing_strategy="wrapped")
    if order == "after":
        handle = memascend_engine.install(ds_config, region=region)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(DATA, "tokenizer.json"), bos_token="<|begin|>",
                                        eos_token="<|end|>", pad_token="<pad>")
    torch.manual_seed(0)
    losses = Losses()
    trainer = SFTTrainer(model=LlamaForCausalLM(model_config(model_dir)), args=args, train_dataset=text_dataset(),
                         processing_class=tokenizer, callbacks=[losses])
    trainer.train()
    write_result(out, handle, losses, args, nvme_path)


if __name__ == "__main__":
    main()
