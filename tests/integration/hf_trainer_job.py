"""A plain Hugging Face Trainer script with `memascend_engine.install()` (run by test_hf_trainer_install.py).

usage: hf_trainer_job.py before|after|plain CONFIG.json REGION NVME_PATH OUT.json [MODEL_DIR SEQ_LEN STEPS
                         [DTYPE CHECKPOINTING BUILD]]

`before` / `after`: install() is called before or after TrainingArguments; `plain`: never (the script as its user
wrote it, run by `memascend launch` in test_launch_cli.py; REGION is not used). The model is a tiny random Llama built from
a config (no download), or the config.json in MODEL_DIR (benchmarks/user_script_bench.py); the data are random token
ids. Writes the handle's stats, the losses, the files found under NVME_PATH and VmHWM. JOB_PLACEMENT in the
environment is install()'s placement (default auto). DTYPE bf16 (default) or fp32; CHECKPOINTING ckpt (the Trainer's
gradient_checkpointing) or nockpt (default); BUILD eager (default: LlamaForCausalLM(config), whole, in fp32) or zero
(AutoModelForCausalLM.from_config after TrainingArguments: under zero.Init, transformers modeling_utils _from_config).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)

import memascend_engine
from memascend_engine.procfs import status_kib

STEPS = 3
SEQ = 32


class Losses(TrainerCallback):
    """The losses, and the process's high-water mark at each step's end (where in the run the peak falls)."""

    def __init__(self):
        self.losses: list[float] = []
        self.phases: list[dict] = []

    def _phase(self, name: str) -> None:
        self.phases.append({"phase": name, "hwm_kib": status_kib("VmHWM"), "rss_anon_kib": status_kib("RssAnon")})

    def on_train_begin(self, args, state, control, **kwargs):
        self._phase("initialize")

    def on_step_end(self, args, state, control, **kwargs):
        self._phase(f"step {state.global_step - 1}")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def job_args(seq: int, steps: int) -> tuple:
    """(order, ds_config with nvme_path set, region, nvme_path, out, model_dir, seq, steps) from the command line
    both scripts share; `seq` and `steps` are the defaults without MODEL_DIR SEQ_LEN STEPS."""
    order, config_path, region, nvme_path, out = sys.argv[1:6]
    model_dir, seq, steps = (sys.argv[6], int(sys.argv[7]), int(sys.argv[8])) if len(sys.argv) > 6 else (None, seq, steps)
    with open(config_path) as f:
        ds_config = json.load(f)
    for name in ("offload_param", "offload_optimizer"):
        if ds_config["zero_optimization"].get(name, {}).get("device") == "nvme":
            ds_config["zero_optimization"][name]["nvme_path"] = nvme_path
    return order, ds_config, region, nvme_path, out, model_dir, seq, steps


def model_config(model_dir: str | None) -> LlamaConfig:
    """MODEL_DIR's config, else the tiny Llama of the tests."""
    return (LlamaConfig.from_pretrained(model_dir) if model_dir else
            LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
                        num_key_value_heads=8, vocab_size=1024))


def build_args() -> tuple[str, bool, str]:
    """(dtype, gradient checkpointing, build) from the optional DTYPE CHECKPOINTING BUILD arguments."""
    dtype, ckpt, build = (sys.argv[9:12] + ["bf16", "nockpt", "eager"][len(sys.argv[9:12]):])
    if dtype not in ("bf16", "fp32") or ckpt not in ("ckpt", "nockpt") or build not in ("eager", "zero"):
        raise SystemExit(f"bad DTYPE CHECKPOINTING BUILD: {dtype} {ckpt} {build}")
    return dtype, ckpt == "ckpt", build


def main() -> None:
    order, ds_config, region, nvme_path, out, model_dir, seq, steps = job_args(SEQ, STEPS)
    dtype, checkpointing, build = build_args()
    placement = os.environ.get("JOB_PLACEMENT", "auto")
    handle = memascend_engine.install(ds_config, region=region, placement=placement) if order == "before" else None
    args = TrainingArguments(output_dir=os.path.join(os.path.dirname(out), "trainer-out"), deepspeed=ds_config,
                             max_steps=steps, per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1,
                             save_strategy="no", report_to=[], use_cpu=True, bf16=dtype == "bf16", disable_tqdm=True,
                             gradient_checkpointing=checkpointing)
    if order == "after":
        handle = memascend_engine.install(ds_config, region=region, placement=placement)
    torch.manual_seed(0)
    config = model_config(model_dir)
    # from_config builds under zero.Init once TrainingArguments holds a ZeRO-3 config; the constructor never does.
    model = (AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
             if build == "zero" else LlamaForCausalLM(config))
    ids = torch.randint(0, config.vocab_size, (max(16, 2 * steps), seq))
    data = [{"input_ids": row, "labels": row} for row in ids]
    losses = Losses()
    Trainer(model=model, args=args, train_dataset=data, callbacks=[losses]).train()
    write_result(out, handle, losses, args, nvme_path)


def write_result(out: str, handle, losses: Losses, args, nvme_path: str) -> None:
    """The run's result for the test or the benchmark (trl_sft_job.py writes the same), then uninstall()."""
    stats = handle.stats() if handle is not None else None
    files = [os.path.join(d, n) for d, _, names in os.walk(nvme_path) for n in names]
    with open(out, "w") as f:
        json.dump({"stats": stats, "losses": losses.losses, "phases": losses.phases, "files": files,
                   "vm_hwm_kib": status_kib("VmHWM"), "trainer_config": args.hf_deepspeed_config.config},
                  f, default=str)
    if handle is not None:
        handle.uninstall()


if __name__ == "__main__":
    main()
