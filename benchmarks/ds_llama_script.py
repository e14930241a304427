"""A plain DeepSpeed training script as a user writes it (the measured job of user_script_bench.py, never a
calibration input): a transformers Llama built from a config under `deepspeed.zero.Init`, ZeRO-3 with params and
optimizer states offloaded to NVMe with DeepSpeed's default knobs, random token ids, a few steps. With `--region` it
calls `memascend_engine.install(config, region=...)` first, as a user's own script does; nothing else differs.

usage: python ds_llama_script.py --model-dir DIR --nvme-path DIR --out OUT.json
           [--region REGION] [--seq-len 512] [--micro-batch 2] [--steps 3] [--checkpointing]

Writes the losses, /proc/self/status at the end (VmHWM, VmRSS, RssAnon, RssFile, VmLck), the high-water mark and
anonymous RSS after each phase (where a peak happens) and the engine's stats.
"""

from __future__ import annotations

import argparse
import json
import os


def ds_config(nvme_path: str, micro_batch: int) -> dict:
    """ZeRO-3 NVMe offload as DeepSpeed's docs write it (docs/_pages/config-json.md): every knob not named here at
    its default."""
    return {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True}, "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "zero_optimization": {"stage": 3,
                                  "offload_param": {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True},
                                  "offload_optimizer": {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True}}}


def status_kib() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem", "VmLck", "VmPin"):
                out[key] = int(rest.split()[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--nvme-path", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--region")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--local_rank", type=int, default=0)
    args = ap.parse_args()

    import deepspeed
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    cfg = ds_config(args.nvme_path, args.micro_batch)
    handle = None
    if args.region:
        import memascend_engine

        handle = memascend_engine.install(cfg, region=args.region)
    deepspeed.init_distributed()
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.model_dir)
    phases = []

    def mark(name: str) -> None:
        s = status_kib()
        phases.append({"phase": name, "hwm_kib": s["VmHWM"], "rss_anon_kib": s["RssAnon"]})

    mark("imports")
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = LlamaForCausalLM(config)
    mark("zero.Init")
    if args.checkpointing:
        model.gradient_checkpointing_enable()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    mark("initialize")
    losses = []
    for k in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq_len))
        loss = engine(input_ids=ids, labels=ids).loss
        mark(f"forward {k}")
        engine.backward(loss)
        mark(f"backward {k}")
        engine.step()
        mark(f"step {k}")
        losses.append(float(loss))
    result = {"losses": losses, "status_kib": status_kib(), "phases": phases,
              "stats": handle.stats() if handle is not None else None,
              "swap_files": sum(len(n) for _, _, n in os.walk(args.nvme_path))}
    with open(args.out, "w") as f:
        json.dump(result, f, default=str)
    if handle is not None:
        handle.uninstall()


if __name__ == "__main__":
    main()
