"""Train a few ZeRO-3 steps (params + optimizer on NVMe), stock or with the memascend engine.

The same seed, data and knobs on both sides, so the per-step losses can be compared; used by the
engine's parity tests and usable by hand or from a launcher (``deepspeed --num_gpus 2 -m`` is not
supported by the launcher, so run the file path)::

    DS_ACCELERATOR=cpu python -m memascend_engine.parity --mode stock  --nvme-dir /var/tmp/sw --out stock.json
    DS_ACCELERATOR=cpu python -m memascend_engine.parity --mode engine --region /var/tmp/r.img --out eng.json

DS_ACCELERATOR=cuda runs it on the GPU: NCCL, inputs on the device, deterministic kernels (so stock and
engine fp32 losses still compare exactly), and the peak GPU memory in the JSON.

Writes JSON: losses, engine stats (bytes through the region, pinned and pool bytes, swap files),
swap files found under the nvme dir, the effective config and, with --overflow-probe, the fused
overflow check's answers on the real gradient buffer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from memascend_engine import cpuinfo_cache
from memascend_engine.procfs import single_rank_defaults


def _count_files(root: str | None) -> int:
    if not root or not os.path.isdir(root):
        return 0
    return sum(len(fs) for _, _, fs in os.walk(root))


def build_config(args, spec) -> dict:
    """Tuned stock settings (zero.resolve: the config both modes run; the engine's install changes nothing in it)."""
    from dataclasses import replace

    from memascend_cli.planner.job import DTYPE_BYTES
    from memascend_cli.run.dsconfig import adamw, ds_config
    from memascend_cli.planner import zero

    given = {"sub_group_size": args.sub_group_size, "reduce_bucket_size": args.reduce_bucket_size}
    base = replace(zero.DEEPSPEED_DEFAULTS, **{k: int(v) for k, v in given.items() if v is not None})
    settings = zero.resolve("tuned", model=spec, world_size=int(os.environ.get("WORLD_SIZE", "1")),
                            elem_bytes=DTYPE_BYTES[args.dtype], base=base)
    return ds_config(settings, nvme_path=args.nvme_dir, micro_batch=args.micro_batch, grad_accum=args.grad_accum,
                     precision=args.dtype, optimizer=adamw(args.lr), gradient_clipping=args.clip,
                     devices=(args.param_device, args.optimizer_device))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["stock", "engine"], required=True)
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--accumulation-bytes", type=int, default=0,
                    help="engine: the DRAM window for gradients accumulated between micro-batches")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=None, help="gradient_clipping (global norm; default: none)")
    ap.add_argument("--sub-group-size", type=float, default=None,
                    help="default: DeepSpeed's (zero.DEEPSPEED_DEFAULTS); capped by memascend's knobs (zero.py)")
    ap.add_argument("--reduce-bucket-size", type=float, default=None,
                    help="default: DeepSpeed's (zero.DEEPSPEED_DEFAULTS); capped by memascend's knobs (zero.py)")
    ap.add_argument("--nvme-dir", default=None, help="swap folder (stock) / key folder (engine; default: temp)")
    ap.add_argument("--region", default=None, help="memascend region (engine mode with direct_nvme)")
    ap.add_argument("--param-device", default="nvme", choices=["nvme", "cpu", "none"],
                    help="offload_param device (none: the partitions stay on the accelerator, as the dram placements)")
    ap.add_argument("--optimizer-device", default="nvme", choices=["nvme", "cpu"],
                    help="offload_optimizer device (cpu: stock's ZeRO-Offload)")
    ap.add_argument("--off", action="append", default=[], help="EngineOptions field to switch off (repeatable)")
    ap.add_argument("--checkpointing", action="store_true", help="engine: enable offloaded checkpointing")
    ap.add_argument("--checkpoint-offload", default="ssd", choices=["ssd", "dram"],
                    help="engine: where offloaded checkpoints go")
    ap.add_argument("--chunked-loss-bytes", type=int, default=None,
                    help="compute the loss with memascend_engine.chunked_loss, chunks of this many fp32 logit bytes")
    ap.add_argument("--overflow-probe", action="store_true", help="check has_overflow on the real grad buffer")
    ap.add_argument("--save-checkpoint", default=None, help="call engine.save_checkpoint(DIR) after training")
    ap.add_argument("--save-at", type=int, default=None, help="save the checkpoint after this step (default: the last)")
    ap.add_argument("--load-checkpoint", default=None,
                    help="engine.load_checkpoint(DIR) before training; the steps it holds are skipped (same data)")
    ap.add_argument("--load-module-only", action="store_true", help="with --load-checkpoint: load_module_only=True")
    ap.add_argument("--no-model-spec", action="store_true", help="engine: install() without a model_spec")
    ap.add_argument("--param-buffer-size", type=float, default=None,
                    help="offload_param.buffer_size in the config (DeepSpeed's default is 1e8)")
    ap.add_argument("--initial-scale-power", type=int, default=None,
                    help="fp16: start dynamic loss scaling at 2**N (a large N overflows the first steps)")
    ap.add_argument("--force-cpu-fp16", action="store_true",
                    help="fp16 on a CPU without oneDNN fp16 (DeepSpeed refuses it; slow kernels, tiny models only)")
    ap.add_argument("--nan-step", type=int, default=None,
                    help="backward a NaN loss at this step (0-based): its gradient norm is invalid, the step skipped")
    ap.add_argument("--optimizer-moments", default="fp32", choices=["fp32", "bf16"],
                    help="engine: Adam's moments on the SSD (EngineOptions.optimizer_moments)")
    ap.add_argument("--dram-tier-gib", type=float, default=0.0,
                    help="engine: EngineOptions.dram_tier_gib (state kept in DRAM instead of the region)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed launcher
    return ap


def _init_device() -> str:
    """Start the process group; the device the inputs go to."""
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    deepspeed.init_distributed(dist_backend=accel.communication_backend_name())
    if accel.device_name() == "cpu":
        return "cpu"
    accel.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # Stock and engine runs are separate processes: with deterministic kernels (cuBLAS needs a
    # fixed workspace, set before its first use) the fp32 losses can be compared exactly.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    return accel.current_device_name()


def _config(args, spec) -> dict:
    """build_config with the command line's overrides of DeepSpeed's own knobs."""
    cfg = build_config(args, spec)
    if args.force_cpu_fp16:
        from memascend_engine.ds_internals import probes

        probes.allow_cpu_fp16()
    if args.initial_scale_power is not None and "fp16" in cfg:
        cfg["fp16"]["initial_scale_power"] = args.initial_scale_power
    if args.param_buffer_size is not None:
        cfg["zero_optimization"]["offload_param"]["buffer_size"] = int(args.param_buffer_size)
    return cfg


def _install(args, cfg: dict, spec):
    """memascend_engine.install() with the command line's EngineOptions (engine mode)."""
    import memascend_engine

    from memascend_cli.planner import zero

    windows = None
    if args.accumulation_bytes:
        windows = zero.EngineWindows(optimizer_chunk_numel=zero.chunk_numel_for(
            zero.from_ds_config(cfg).sub_group_size), checkpoint_offload=args.checkpoint_offload,
            accumulation_bytes=args.accumulation_bytes)
    opts = memascend_engine.EngineOptions(**{name: False for name in args.off},
                                          checkpoint_offload=args.checkpoint_offload, windows=windows,
                                          optimizer_moments=args.optimizer_moments,
                                          dram_tier_gib=args.dram_tier_gib)
    return memascend_engine.install(cfg, region=args.region, model_spec=None if args.no_model_spec else spec,
                                    options=opts)


def _engine(args, cfg: dict, spec, handle):
    """The model built under zero.Init (seeded) and deepspeed.initialize's engine."""
    import deepspeed
    import torch
    from memascend_engine.hf_models import causal_lm_factory, init_weights_under_zero3

    make_model = causal_lm_factory(spec)
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = make_model()
    init_weights_under_zero3(model)
    if args.chunked_loss_bytes:
        from memascend_engine import chunked_loss

        chunked_loss.enable(model, chunk_logits_bytes=args.chunked_loss_bytes)
    if handle is not None and args.checkpointing:
        handle.enable_offloaded_checkpointing(model)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def _load(args, engine) -> tuple[int, str | None]:
    """(the first step to train, the load's error): --load-checkpoint's steps are skipped."""
    if not args.load_checkpoint:
        return 0, None
    try:
        engine.load_checkpoint(args.load_checkpoint, load_module_only=args.load_module_only)
        return int(engine.global_steps), None
    except Exception as exc:  # noqa: BLE001 - reported in the JSON (a refusal or a damaged file)
        return 0, f"{type(exc).__name__}: {exc}"


def _train(args, engine, spec, device: str, start: int, steps: int) -> dict:
    """`steps` steps on seeded random tokens (the data of steps before `start` drawn and skipped), saving where asked:
    losses per micro-batch, loss scales and gradient norms per step, the overflow probe, the save's error."""
    import torch

    out = {"losses": [], "loss_scales": [], "grad_norms": [], "overflow_probe": {}, "save_checkpoint_error": None}

    def save() -> None:
        try:
            engine.save_checkpoint(args.save_checkpoint)
        except RuntimeError as exc:
            out["save_checkpoint_error"] = str(exc)

    gen = torch.Generator().manual_seed(1234)
    t0 = time.time()
    for step in range(steps):
        xs = [torch.randint(0, spec.vocab_size, (args.micro_batch, args.seq_len), generator=gen).to(device)
              for _ in range(args.grad_accum)]
        if step < start:
            continue  # done before the checkpoint: same data from here on
        for x in xs:  # engine.step() steps the optimizer at the last micro-batch (the accumulation boundary)
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss * float("nan") if step == args.nan_step else loss)
            if args.overflow_probe and step == 0:
                from memascend_engine.ds_internals import probes

                out["overflow_probe"] = probes.overflow_probe(engine)
            engine.step()
            out["losses"].append(float(loss))
        out["loss_scales"].append(float(engine.optimizer.loss_scale))
        norm = engine.get_global_grad_norm()
        out["grad_norms"].append(None if norm is None else float(norm))
        if args.save_checkpoint and args.save_at == step + 1:
            save()
    out["seconds"] = time.time() - t0
    if args.save_checkpoint and args.save_at is None:
        save()
    return out


def main(argv=None) -> dict:
    cpuinfo_cache.enable()
    args = _parser().parse_args(argv)

    single_rank_defaults()

    import deepspeed
    import torch

    from memascend_cli.models import load_model

    device = _init_device()
    rank = int(os.environ["RANK"])
    spec = load_model(args.model)
    if args.mode == "stock" and not args.nvme_dir and "nvme" in (args.param_device, args.optimizer_device):
        raise SystemExit("--nvme-dir is required for --mode stock with NVMe offload")
    cfg = _config(args, spec)
    handle = _install(args, cfg, spec) if args.mode == "engine" else None
    engine = _engine(args, cfg, spec, handle)
    start, load_error = _load(args, engine)
    run = _train(args, engine, spec, device, start, args.steps if load_error is None else 0)

    nvme_root = (handle.key_dir if handle is not None else args.nvme_dir)
    result = {
        "mode": args.mode,
        "rank": rank,
        "world_size": int(os.environ["WORLD_SIZE"]),
        "dtype": args.dtype,
        "losses": run["losses"],
        "seconds_per_step": run["seconds"] / max(1, args.steps),
        "swap_files": _count_files(os.path.join(nvme_root, "zero_stage_3")) if nvme_root else 0,
        "checkpoint_swap_files": sum(
            1 for _, _, fs in os.walk(args.save_checkpoint) for f in fs if f.endswith(".swp")
        ) if args.save_checkpoint else 0,
        "stats": handle.stats() if handle is not None else None,
        "overflow_probe": run["overflow_probe"],
        "loss_scales": run["loss_scales"],
        "grad_norms": run["grad_norms"],
        "skipped_steps": int(engine.skipped_steps),
        "save_checkpoint_error": run["save_checkpoint_error"],
        "load_checkpoint_error": load_error,
        "start_step": start,
        "config": cfg,
        "device": device,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if device != "cpu" else None,
        "deepspeed_version": deepspeed.__version__,
    }
    out = args.out if int(os.environ["WORLD_SIZE"]) == 1 else f"{args.out}.rank{rank}"
    with open(out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    if handle is not None:
        engine.destroy()
        del engine
        handle.uninstall()
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
    from memascend_engine.hard_exit import exit_after_flush

    exit_after_flush(0)
