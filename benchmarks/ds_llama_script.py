"""A plain DeepSpeed training script as a user writes it (the measured job of user_script_bench.py and
placement_bench.py, never a calibration input): a transformers Llama built from a config under `deepspeed.zero.Init`,
ZeRO-3 with params and optimizer states offloaded to NVMe (or, `--offload cpu`, to the CPU: ZeRO-Offload) with
DeepSpeed's default knobs, random token ids, a few steps. With `--region` it calls
`memascend_engine.install(config, region=..., placement=...)` first, as a user's own script does; nothing else differs.

usage: python ds_llama_script.py --model-dir DIR --nvme-path DIR --out OUT.json
           [--region REGION] [--seq-len 512] [--micro-batch 2] [--steps 3] [--checkpointing]
           [--offload nvme|cpu] [--dtype bf16|fp32] [--placement auto|dram|region] [--model-spec] [--no-zero-init]
           [--from-pretrained]

Writes the losses, each step's seconds, the offload devices of the config DeepSpeed got, /proc/self/status at the end
(VmHWM, VmRSS, RssAnon, RssFile, VmLck), the high-water mark and anonymous RSS after each phase (where a peak happens)
and the engine's stats.
"""

from __future__ import annotations

import argparse
import json
import os


def ds_config(nvme_path: str, micro_batch: int, offload: str = "nvme", dtype: str = "bf16") -> dict:
    """ZeRO-3 NVMe (or CPU) offload as DeepSpeed's docs write it (docs/_pages/config-json.md): every knob not named
    here at its default; fp32 without a bf16 section."""
    section = {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True} if offload == "nvme" else \
        {"device": "cpu", "pin_memory": True}
    return {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
            **({"bf16": {"enabled": True}} if dtype == "bf16" else {}), "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "zero_optimization": {"stage": 3, "offload_param": dict(section), "offload_optimizer": dict(section)}}


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
    ap.add_argument("--offload", choices=("nvme", "cpu"), default="nvme")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--placement", choices=("auto", "dram", "region"), default="auto")
    ap.add_argument("--model-spec", action="store_true", help="give install() the model directory as model_spec")
    ap.add_argument("--no-zero-init", action="store_true", help="build the model whole, outside deepspeed.zero.Init")
    ap.add_argument("--from-pretrained", action="store_true", help="load the model whole with from_pretrained from "
                    "--model-dir (its weights, dtype auto: the checkpoint's), outside deepspeed.zero.Init")
    ap.add_argument("--local_rank", type=int, default=0)
    args = ap.parse_args()

    import contextlib
    import time

    import deepspeed
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    cfg = ds_config(args.nvme_path, args.micro_batch, args.offload, args.dtype)
    handle = None
    if args.region:
        import memascend_engine

        handle = memascend_engine.install(cfg, region=args.region, placement=args.placement,
                                          model_spec=args.model_dir if args.model_spec else None)
    deepspeed.init_distributed()
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.model_dir)
    phases = []

    def mark(name: str) -> None:
        s = status_kib()
        phases.append({"phase": name, "hwm_kib": s["VmHWM"], "rss_anon_kib": s["RssAnon"]})
        print(f"phase {json.dumps(dict(phases[-1], t=time.time()))}", flush=True)  # a run that dies still says

    mark("imports")
    if args.from_pretrained:  # no HfDeepSpeedConfig here: transformers loads it whole (no zero.Init)
        model = LlamaForCausalLM.from_pretrained(args.model_dir)
    else:
        with contextlib.nullcontext() if args.no_zero_init else deepspeed.zero.Init(config_dict_or_path=cfg):
            model = LlamaForCausalLM(config)
    mark("zero.Init")
    if args.checkpointing:
        model.gradient_checkpointing_enable()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    mark("initialize")
    losses, step_s = [], []
    for k in range(args.steps):
        t0 = time.perf_counter()
        ids = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq_len))
        loss = engine(input_ids=ids, labels=ids).loss
        mark(f"forward {k}")
        engine.backward(loss)
        mark(f"backward {k}")
        engine.step()
        mark(f"step {k}")
        losses.append(float(loss))
        step_s.append(round(time.perf_counter() - t0, 4))
    zo = cfg["zero_optimization"]
    result = {"losses": losses, "step_s": step_s, "status_kib": status_kib(), "phases": phases,
              "offload": {k: zo[k]["device"] for k in ("offload_param", "offload_optimizer")},
              "stats": handle.stats() if handle is not None else None,
              "swap_files": sum(len(n) for _, _, n in os.walk(args.nvme_path))}
    with open(args.out, "w") as f:
        json.dump(result, f, default=str)
    if handle is not None:
        handle.uninstall()


if __name__ == "__main__":
    main()
