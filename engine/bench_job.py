"""One measured training job of `memascend bench` (the child process; the parent samples memory).

ZeRO-3 with parameters and optimizer states on NVMe, on the accelerator DeepSpeed detects (DS_ACCELERATOR
decides: CPU with gloo, or CUDA with NCCL), random weights, fixed seed, synthetic token batches. Modes:
  stock, tuned  - stock DeepSpeed with the config the parent wrote (--ds-config);
  memascend     - the same config handed to memascend_engine.install() before zero.Init.

Writes JSON lines to EVENTS-rank<R>.jsonl: {"event": "phase"|"step"|"final"|"error", ...}.
SSD bytes come from /proc/self/io read_bytes/write_bytes (block-layer I/O of this process,
O_DIRECT included); the memascend mode also records the engine's own counters.

Usage (normally launched by `memascend bench`):
    DS_ACCELERATOR=cpu python -m memascend_engine.bench_job --mode stock --model tiny-llama --seq-len 64 \
        --micro-batch 1 --steps 2 --dtype bf16 --seed 0 --ds-config cfg.json --events /tmp/ev
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

from memascend_engine import cpuinfo_cache
from memascend_engine.procfs import io_bytes, malloc_state, single_rank_defaults, status_kib

from memascend_cli.bench.runs import LOSSES, MODES, TECHNIQUES

EXIT_ENGINE_MISSING = 3


class Events:
    """Append-only JSON lines, flushed per line so the parent can follow progress."""

    def __init__(self, prefix: str, rank: int):
        # Open for the whole job (closed at exit): every line is flushed for the parent to follow.
        self.f = open(f"{prefix}-rank{rank}.jsonl", "a", buffering=1)  # noqa: SIM115

    def emit(self, event: str, **kw) -> None:
        kw.update(event=event, t_mono=time.monotonic())
        self.f.write(json.dumps(kw) + "\n")

    def phase(self, name: str) -> None:
        # State at the phase boundary: anonymous RSS and what glibc's arenas hold free, so a recorded run shows
        # how much of its peak is allocator retention rather than live tensors.
        self.emit("phase", name=name, rss_anon_bytes=status_kib("RssAnon") * 1024,
                  rss_file_bytes=status_kib("RssFile") * 1024, malloc=malloc_state())


def io_delta(a: dict, b: dict) -> dict:
    return {k: b[k] - a[k] for k in a}


def dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", required=True, choices=MODES)
    ap.add_argument("--model", required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--dtype", required=True, choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpointing", default="full", choices=["full", "none"])
    ap.add_argument("--loss-impl", default="hf", choices=LOSSES,
                    help="hf: transformers' loss over full logits; chunked: memascend_engine.chunked_loss")
    ap.add_argument("--checkpointing-impl", default="hf", choices=["hf", "memascend"],
                    help="hf: transformers' non-reentrant checkpointing; memascend: memascend_engine.activation_checkpointing")
    ap.add_argument("--ds-config", required=True, help="DeepSpeed config JSON written by the parent")
    ap.add_argument("--events", required=True, help="prefix of the per-rank JSON-lines files")
    ap.add_argument("--region", default=None, help="memascend region file or device (memascend mode)")
    ap.add_argument("--disable", action="append", default=[], choices=TECHNIQUES,
                    help="switch one engine technique off (memascend mode; repeatable)")
    ap.add_argument("--layers", type=int, default=None, help="scale the model to this many decoder layers")
    ap.add_argument("--engine-windows", default=None,
                    help="memascend mode: JSON of zero.EngineWindows (the planner's split of the host budget)")
    ap.add_argument("--prefetch-layers", type=int, default=None, help="memascend mode: layers in the parameter pool")
    ap.add_argument("--dram-tier-gib", type=float, default=None,
                    help="memascend mode: the DRAM tier's budget (EngineOptions.dram_tier_gib; the run's placement)")
    ap.add_argument("--checkpoint-offload", default=None, choices=["ssd", "dram"],
                    help="memascend mode: where offloaded activation checkpoints go (EngineOptions.checkpoint_offload; "
                         "the run's placement)")
    ap.add_argument("--optimizer-moments", default="fp32", choices=["fp32", "bf16"],
                    help="memascend mode: Adam's moments on the SSD (EngineOptions.optimizer_moments)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    from memascend_cli.run import lifeline

    lifeline.watch()  # ends with the `memascend bench` that started it, whatever ends that
    args = parse_args(argv)
    cpuinfo_cache.enable()
    # Single-process defaults; torchrun sets these for multi-rank runs.
    single_rank_defaults()
    rank = int(os.environ["RANK"])
    ev = Events(args.events, rank)
    try:
        return run(args, rank, ev)
    except BaseException as exc:  # noqa: BLE001  (any failure, even SystemExit: the parent reports this line)
        import traceback

        traceback.print_exc()
        ev.emit("error", message=f"rank {rank}: {type(exc).__name__}: {exc}"[:2000])
        return 1


def run(args, rank: int, ev: Events) -> int:
    with open(args.ds_config) as f:
        cfg = json.load(f)
    if args.disable and args.mode != "memascend":
        raise SystemExit("--disable applies to --mode memascend only")

    engine_api = None
    if args.mode == "memascend":
        # Import before torch/deepspeed so a missing engine fails in a second, not after model init.
        try:
            import memascend_engine
        except ImportError as exc:
            ev.emit("error", message=f"memascend mode: cannot import memascend_engine ({exc})")
            print(f"error: cannot import memascend_engine: {exc}", file=sys.stderr)
            return EXIT_ENGINE_MISSING
        engine_api = (memascend_engine.install, memascend_engine.EngineOptions)

    ev.phase("import")
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator
    from memascend_engine import determinism
    from memascend_engine.ds_internals import jit_ops
    from memascend_engine.hf_models import causal_lm_factory, init_weights_under_zero3

    from memascend_cli.models import load_model

    # DeepSpeed's built ops load without torch's build lock; a wait on one is an event the parent reports.
    jit_ops.enable(on_wait=lambda info: ev.emit("wait", **info))
    acc = get_accelerator()
    ev.phase("init_distributed")
    deepspeed.init_distributed(dist_backend=acc.communication_backend_name())
    on_cuda = acc.device_name() == "cuda"
    if on_cuda:
        acc.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if args.dtype == "fp16" and not acc.is_fp16_supported():
        # DeepSpeed's CPU accelerator refuses fp16 without oneDNN fp16; the kernels are slow but correct, which is
        # what a memory measurement of the fp16 path (loss scaling, overflow check) needs.
        from memascend_engine.ds_internals import probes

        probes.allow_cpu_fp16()
    device = acc.current_device_name()  # DeepSpeed does not move inputs: batches go to the compute device
    world = int(os.environ["WORLD_SIZE"])
    spec = load_model(args.model)
    if args.layers:
        spec = spec.scaled(args.layers)
    # transformers is imported here (in the factory), before zero.Init patches tensor constructors.
    make_model = causal_lm_factory(spec)

    handle = None if engine_api is None else _install(engine_api, args, cfg, spec, rank, ev)

    io_start = io_bytes()
    ev.phase("zero_init")
    torch.manual_seed(args.seed)
    # No dtype= here: Init._set_dtype turns an explicit torch.float32 into bf16 on a CPU without fp16
    # (see benchmarks/measure_ds_buffers.py). The config's dtype is honoured.
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = make_model()
    init_weights_under_zero3(model)
    model.config.use_cache = False
    if args.loss_impl == "chunked":
        from memascend_engine import chunked_loss

        chunked_loss.enable(model)
    if args.checkpointing == "full":
        if args.checkpointing_impl == "hf":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif handle is not None and "offload_checkpointing" not in args.disable:
            handle.enable_offloaded_checkpointing(model)  # the same function with the engine's exact pinned buffers
        else:
            from memascend_engine import activation_checkpointing as checkpointing

            checkpointing.enable(model, None)
    ev.phase("initialize")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    model.train()
    # The weights step 1 starts from, before any timed step: its reads count to initialize's I/O (io_init).
    ev.phase("param_digest")
    digest = determinism.param_digest(model)
    io_init_done = io_bytes()
    vmlck_after_init_kib = status_kib("VmLck")

    _train(engine, args, ev, vocab_size=spec.vocab_size, device=device, rank=rank, world=world,
           grad_accum=int(cfg.get("gradient_accumulation_steps", 1)), io_start=io_init_done)
    ev.phase("finish")
    final = _final(args, cfg, spec, handle, rank=rank, world=world, on_cuda=on_cuda,
                   io=(io_start, io_init_done, io_bytes()), vmlck_after_init_kib=vmlck_after_init_kib)
    final["determinism"] = {**determinism.kernels(), **digest}
    if handle is not None:
        final["engine_stats"] = dict(handle.stats())
        handle.uninstall()
    ev.emit("final", **final)
    return 0


def _install(engine_api, args, cfg: dict, spec, rank: int, ev: Events):
    """memascend's engine with the run's techniques (those not --disable'd), windows and moments; its handle."""
    install, options_cls = engine_api
    extra = {}
    if args.engine_windows:
        from memascend_cli.planner.zero import EngineWindows

        extra["windows"] = EngineWindows(**json.loads(args.engine_windows))
    if args.prefetch_layers:
        extra["prefetch_layers"] = args.prefetch_layers
    extra["optimizer_moments"] = args.optimizer_moments
    if args.dram_tier_gib:  # given only where the engine has the tier (memascend_cli.run.train_placement)
        extra["dram_tier_gib"] = args.dram_tier_gib
    if args.checkpoint_offload:
        extra["checkpoint_offload"] = args.checkpoint_offload
    opts = options_cls(**{t: t not in args.disable for t in TECHNIQUES}, **extra)
    ev.phase("engine_install")
    # The region has one sub-region per local rank (prepare-ssd --ranks).
    return install(cfg, region=args.region, model_spec=spec, options=opts, rank=int(os.environ.get("LOCAL_RANK", rank)))


def _train(engine, args, ev: Events, *, vocab_size: int, device, rank: int, world: int, grad_accum: int,
           io_start: dict) -> None:
    """The timed steps: random token batches, one event per optimizer step (loss, seconds, block I/O, tokens/s,
    gradient norm) and a phase per micro-batch's forward, backward and optimizer."""
    import torch

    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    io_prev = io_start
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        losses = []
        for k in range(grad_accum):  # engine.step() steps the optimizer after the last (the accumulation boundary)
            x = torch.randint(0, vocab_size, (args.micro_batch, args.seq_len), generator=gen).to(device)
            name = f"step{step}" + (f".{k + 1}" if grad_accum > 1 else "")
            ev.phase(f"{name}_forward")
            loss = engine(input_ids=x, labels=x).loss
            ev.phase(f"{name}_backward")
            engine.backward(loss)
            ev.phase(f"{name}_optimizer" if k == grad_accum - 1 else f"{name}_accumulate")
            engine.step()
            losses.append(float(loss.detach()))
        dt = time.perf_counter() - t0
        io_now = io_bytes()
        norm = engine.get_global_grad_norm()
        ev.emit("step", step=step, loss=sum(losses) / len(losses), seconds=dt, io=io_delta(io_prev, io_now),
                tokens_per_s=args.micro_batch * args.seq_len * grad_accum * world / dt,
                grad_norm=None if norm is None else float(norm))
        io_prev = io_now


def _final(args, cfg: dict, spec, handle, *, rank: int, world: int, on_cuda: bool, io: tuple,
           vmlck_after_init_kib: int) -> dict:
    """The rank's final record: versions, block I/O (start, after initialize, end), swap bytes, locked and peak
    memory, GPU memory and pinned bytes (engine_stats is filled in by the caller)."""
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    io_start, io_init_done, io_end = io
    # A placement off the SSD has no offload_param section (bench --placement gpu / dram).
    nvme_dir = (cfg["zero_optimization"].get("offload_param") or {}).get("nvme_path")
    gpu_free, gpu_total = torch.cuda.mem_get_info() if on_cuda else (0, 0)
    return {
        "rank": rank,
        "world_size": world,
        "mode": args.mode,
        "disabled": args.disable,
        "deepspeed_version": deepspeed.__version__,
        "torch_version": torch.__version__,
        "num_params": spec.num_params,
        "io": io_delta(io_start, io_end),
        "io_init": io_delta(io_start, io_init_done),
        "io_steps": io_delta(io_init_done, io_end),
        "swap_bytes_on_disk": dir_bytes(nvme_dir) if nvme_dir else 0,
        "vmlck_after_init_kib": vmlck_after_init_kib,
        "vmhwm_kib": status_kib("VmHWM"),
        "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "engine_stats": None,
        "ds_config_effective": cfg,
        "accelerator": get_accelerator().device_name(),
        "peak_gpu_bytes": int(torch.cuda.max_memory_allocated()) if on_cuda else None,
        "peak_gpu_reserved_bytes": int(torch.cuda.max_memory_reserved()) if on_cuda else None,
        # What the plan's GPU figure holds beside torch's pool (gpu/cuda_context): device memory in use that torch's
        # caching allocator does not own (context, kernels, cuBLAS workspace, NCCL buffers).
        "gpu_context_bytes": gpu_total - gpu_free - int(torch.cuda.memory_reserved()) if on_cuda else None,
        # Pinned host bytes: torch's CUDA host allocator plus mlocked memory (stock/tuned), the engine's own buffers.
        # Host stats have no per-pool level: "allocated_bytes.peak" (torch/cuda/memory.py host_memory_stats).
        "pinned_bytes": (handle.stats()["pinned_bytes"] if handle is not None else
                         (int(torch.cuda.host_memory_stats().get("allocated_bytes.peak", 0)) if on_cuda else 0)
                         + status_kib("VmLck") * 1024),
    }


if __name__ == "__main__":
    from memascend_engine.hard_exit import exit_after_flush

    exit_after_flush(main(sys.argv[1:]))
