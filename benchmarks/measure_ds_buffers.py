"""Run stock DeepSpeed ZeRO-3 (params + optimizer on NVMe) and record the host buffers it really allocates.

The planner's baseline items P1..P5 are checked against these numbers
(tests/unit/test_planner_vs_deepspeed.py reads the recorded JSON; tests/integration re-runs this).

Usage (CPU, one rank; DeepSpeed JIT-builds its ops on first use):
    DS_ACCELERATOR=cpu python benchmarks/measure_ds_buffers.py --model tiny-llama --dtype bf16 \
        --nvme-dir /var/tmp/ds_swap --out case.json [--max-in-cpu 0 --sub-group-size 1e6 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time

from memascend_engine.procfs import single_rank_defaults, status_kib


def nbytes(t) -> int:
    return int(t.numel() * t.element_size())


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--nvme-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--param-buffer-count", type=int, default=5)
    ap.add_argument("--param-buffer-size", type=float, default=None, help="default: max(1e8, largest param)")
    ap.add_argument("--max-in-cpu", type=float, default=1e9)
    ap.add_argument("--optimizer-buffer-count", type=int, default=4)
    ap.add_argument("--sub-group-size", type=float, default=1e9)
    ap.add_argument("--reduce-bucket-size", type=float, default=5e8)
    args = ap.parse_args(argv)

    single_rank_defaults()

    from dataclasses import replace

    import deepspeed
    import torch
    from memascend_engine.hf_models import causal_lm_factory

    from memascend_cli.run.dsconfig import adamw, ds_config
    from memascend_cli.models import load_model
    from memascend_cli.planner import zero

    deepspeed.init_distributed(dist_backend="gloo")
    import transformers  # noqa: F401  (counted in the runtime level, as a training script has it)

    runtime_rss_kib = status_kib("VmRSS")
    spec = load_model(args.model)
    largest = spec.largest_tensor_numel
    buffer_size = int(args.param_buffer_size) if args.param_buffer_size else max(int(1e8), largest)
    shutil.rmtree(args.nvme_dir, ignore_errors=True)
    os.makedirs(args.nvme_dir)
    settings = replace(
        zero.DEEPSPEED_DEFAULTS, sub_group_size=int(args.sub_group_size), reduce_bucket_size=int(args.reduce_bucket_size),
        param_buffer_count=args.param_buffer_count, param_buffer_size=buffer_size, max_in_cpu=int(args.max_in_cpu),
        optimizer_buffer_count=args.optimizer_buffer_count,
        # max_in_cpu below the model with the default reuse distance crashes in step 2 (zero.memascend_knobs).
        max_reuse_distance=0 if args.max_in_cpu < spec.num_params else zero.DEEPSPEED_DEFAULTS.max_reuse_distance)
    cfg = ds_config(settings, nvme_path=args.nvme_dir, micro_batch=args.micro_batch, precision=args.dtype,
                    optimizer=adamw(1e-3))

    make_model = causal_lm_factory(spec)
    torch.manual_seed(0)
    # No dtype= here: Init._set_dtype reads `dtype or fp16 if fp16-capable else bf16`, so on a CPU
    # without fp16 an explicit torch.float32 silently becomes bf16. The config's dtype is honoured.
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = make_model()
    vmlck_after_zero_init = status_kib("VmLck")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    vmlck_after_initialize = status_kib("VmLck")
    opt = engine.optimizer

    p0 = next(model.parameters())
    swapper = p0.nvme_swapper
    measured = {
        "P1_param_swap_pool": nbytes(swapper.buffers),
        "P2_partitioned_swap_buffer": nbytes(swapper.partitioned_swap_buffer)
        if getattr(swapper, "partitioned_swap_buffer", None) is not None else 0,
        # Placeholders of one element stand for "no CPU flat buffer" (stage3.py).
        "P3_fp16_cpu_params": sum(nbytes(t) for t in opt.param_groups_fp16_flat_cpu_memory if t.numel() > 1),
        "P4_optimizer_swap_pool": sum(nbytes(b) for b in opt.optimizer_swapper.swap_buffer_manager.all_buffers)
        if getattr(opt, "optimizer_swapper", None) is not None else 0,
        "P5_grad_flat_buffer": nbytes(opt.grad_partitions_flat_buffer),
    }
    losses = []
    torch.manual_seed(1)
    x = torch.randint(0, spec.vocab_size, (args.micro_batch, args.seq_len))
    t0 = time.time()
    for _ in range(args.steps):
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    swap_files = sum(len(fs) for _, _, fs in os.walk(args.nvme_dir))
    result = {
        "model": args.model,
        "dtype": args.dtype,
        "deepspeed_version": deepspeed.__version__,
        "torch_version": torch.__version__,
        "knobs": {"param_buffer_count": args.param_buffer_count, "param_buffer_size": buffer_size,
                  "max_in_cpu": int(args.max_in_cpu), "optimizer_buffer_count": args.optimizer_buffer_count,
                  "sub_group_size": int(args.sub_group_size), "reduce_bucket_size": int(args.reduce_bucket_size)},
        "job": {"seq_len": args.seq_len, "micro_batch": args.micro_batch, "steps": args.steps},
        "measured_bytes": measured,
        "vmlck_kib": {"after_zero_init": vmlck_after_zero_init, "after_initialize": vmlck_after_initialize},
        "runtime_rss_kib": runtime_rss_kib,
        "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "losses": losses,
        "seconds_per_step": (time.time() - t0) / max(1, args.steps),
        "swap_files": swap_files,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    shutil.rmtree(args.nvme_dir, ignore_errors=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # DeepSpeed's aio op sometimes aborts in its worker threads at interpreter exit ("terminate called
    # without an active exception"); the results are written, so skip the teardown.
    os._exit(0)
