"""Measures the CUDA runtime constants the planner otherwise guesses, on the GPU machine; the kit's constants phase
runs it with the venv's python (torch, DeepSpeed, transformers) and DS_ACCELERATOR=cuda:

    python scripts/gpukit/cuda_constants.py OUT.json

Host: the system's used memory (MemTotal - MemAvailable, the plan's view) and this process's RssAnon at each
step: bare interpreter, the imports, the first CUDA tensor (context), a bf16 matmul (cuBLAS and its workspace),
DeepSpeed's init_distributed on NCCL plus one all_reduce (NCCL creates its communicator at the first collective),
then a training step as a bench child makes one (DeepSpeed's cpu_adam and async_io ops loaded, a 2-layer Qwen2.5-
shaped model in bf16 with gradient checkpointing and the chunked loss, forward and backward at 2,048 tokens, the
gradients copied to pinned host memory), its tensors freed: the kernels and library state the first step loads
stay (on an H200 with torch 2.11 the bench's runs kept ~0.9 GiB beyond the state before the step).
GPU: device memory in use that torch's caching allocator does not own (torch.cuda.mem_get_info against
memory_reserved). Time: the rates of time_rates() (host<->device copies, CPU Adam on this box's cores, the global
norm and its barrier), under `time_rates`. `MEMASCEND_CUDA_CONSTANTS=OUT.json memascend plan ...` then plans with
these numbers.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpukit.pure import runtime_constants  # noqa: E402

SCHEMA_VERSION = 2
"""2: host_runtime_bytes is measured after a training step (1: before it, ~0.9 GiB short)."""


def _meminfo_kib() -> dict:
    with open("/proc/meminfo") as f:
        return {ln.split(":")[0]: int(ln.split()[1]) for ln in f}


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith(key + ":"))


def _sample(torch=None) -> dict:
    m = _meminfo_kib()
    s = {"rss_anon_bytes": _status_kib("RssAnon") * 1024,
         "system_used_bytes": (m["MemTotal"] - m["MemAvailable"]) * 1024, "t": time.time()}
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        s["gpu_free_bytes"] = torch.cuda.mem_get_info()[0]
        s["torch_reserved_bytes"] = torch.cuda.memory_reserved()
    return s


def _step_sample(torch, device: str = "cuda") -> tuple[dict, dict]:
    """The sample after one training step's worth of first uses (see the module docstring), its tensors freed.
    device="cpu" rehearses it where there is no GPU (tests/unit/test_gpu_check.py)."""
    ops = {}
    try:
        from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder
        for builder in (CPUAdamBuilder, AsyncIOBuilder):
            try:
                builder().load(verbose=False)
                ops[builder.__name__] = "loaded"
            except Exception as exc:  # noqa: BLE001 - the constant is still measured, without that op
                ops[builder.__name__] = f"not loaded: {type(exc).__name__}: {exc}"[:200]
    except ImportError as exc:
        ops["op_builder"] = f"not importable: {exc}"[:200]
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from memascend_engine import chunked_loss
    from memascend_cli import defaults

    cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=2, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    chunked_loss.enable(model, defaults.LOSS_CHUNK_LOGITS_BYTES)
    ids = torch.randint(0, cfg.vocab_size, (1, 2048), device=device)
    model(input_ids=ids, labels=ids).loss.backward()
    cuda = device == "cuda"
    host = [torch.empty(p.grad.numel(), dtype=p.grad.dtype, pin_memory=cuda) for p in model.parameters()]
    for h, p in zip(host, model.parameters()):
        h.copy_(p.grad.view(-1), non_blocking=cuda)
    if cuda:
        torch.cuda.synchronize()
    del model, ids, host
    import gc
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return _sample(torch), ops


def _best_s(torch, fn, repeats: int, cuda: bool) -> float:
    """The shortest of `repeats` timed calls of `fn` (after one untimed), the device synchronised around each."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def time_rates(torch, device: str = "cuda") -> dict:
    """The time model's per-resource rates on this box (memascend_cli/planner/measured.py uses them when a plan is of
    this GPU): host<->device copies (copy_rates), DeepSpeed's CPU Adam on torch's threads (the optimizer step of
    every offloaded engine), the global norm of a gradient partition and the barrier after it (norm_rates)."""
    out: dict = {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "cpu_model": _cpu_model(),
                 **copy_rates(torch, device)}
    out.update(cpu_adam_rate(torch))
    out.update(norm_rates(torch, device))
    return out


def copy_rates(torch, device: str = "cuda", copy_bytes: int = 512 << 20, repeats: int = 3) -> dict:
    """GB/s of `copy_bytes` copied host -> device and back, from pinned and from pageable host memory. device="cpu"
    rehearses it where there is no GPU (tests/unit/test_gpu_kit_calls.py)."""
    cuda = device == "cuda"
    out: dict = {"copy_bytes": copy_bytes}
    dev = torch.empty(copy_bytes, dtype=torch.uint8, device=device)
    for kind, pinned in (("pinned", cuda), ("pageable", False)):
        host = torch.empty(copy_bytes, dtype=torch.uint8, pin_memory=pinned)
        up = lambda h=host, p=pinned: dev.copy_(h, non_blocking=p)  # noqa: E731 - timed below
        down = lambda h=host, p=pinned: h.copy_(dev, non_blocking=p)  # noqa: E731
        out[f"h2d_{kind}_gbps"] = round(copy_bytes / _best_s(torch, up, repeats, cuda) / 1e9, 2)
        out[f"d2h_{kind}_gbps"] = round(copy_bytes / _best_s(torch, down, repeats, cuda) / 1e9, 2)
    return out


def cpu_adam_rate(torch, numel: int = 128 << 20, repeats: int = 3) -> dict:
    """Elements a second of DeepSpeedCPUAdam's step over `numel` fp32 elements (its states made by an untimed step)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    p = torch.nn.Parameter(torch.zeros(numel))
    p.grad = torch.full((numel,), 1e-3)
    opt = DeepSpeedCPUAdam([p], lr=1e-3)
    return {"adam_numel": numel, "cpu_adam_elems_per_s": round(numel / _best_s(torch, opt.step, repeats, False))}


def norm_rates(torch, device: str = "cuda", numel: int = 256 << 20, repeats: int = 3) -> dict:
    """Elements a second of the 2-norm of a `numel` fp32 gradient partition on the device, and the barrier after it:
    an all_reduce of the norm (when a process group is up) and its .item(), the synchronisation every clipped step
    makes before the optimizer."""
    cuda = device == "cuda"
    g = torch.ones(numel, device=device)
    out = {"norm_numel": numel,
           "norm_elems_per_s": round(numel / _best_s(torch, lambda: torch.linalg.vector_norm(g, 2.0), repeats, cuda))}
    x = torch.ones(1, device=device)
    dist = torch.distributed.is_available() and torch.distributed.is_initialized()

    def barrier():
        if dist:
            torch.distributed.all_reduce(x)
        x.item()
    out["norm_barrier_s"] = round(_best_s(torch, barrier, 20, False), 6)
    out["norm_barrier"] = "all_reduce + .item()" if dist else ".item() (no process group)"
    return out


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        return None


def main(out: str) -> int:
    samples = {"start": _sample()}
    import deepspeed
    import torch
    import transformers  # the bench's children import it too

    samples["imports"] = _sample()
    torch.cuda.set_device(0)
    x = torch.ones(1, device="cuda")
    samples["context"] = _sample(torch)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    float((a @ a).float().sum())
    samples["cublas"] = _sample(torch)
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    deepspeed.init_distributed(dist_backend="nccl")
    torch.distributed.all_reduce(x)
    samples["nccl"] = _sample(torch)
    try:
        samples["step"], ops = _step_sample(torch)
    except Exception as exc:  # noqa: BLE001 - the constants before the step are still worth keeping
        ops = {"step_error": f"{type(exc).__name__}: {exc}"[:300]}
    try:
        rates = time_rates(torch)
    except Exception as exc:  # noqa: BLE001 - the memory constants stand without the rates
        rates = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    props = torch.cuda.get_device_properties(0)
    # Without the step's sample the runtime is the one before it: schema 1, which the planner refuses.
    doc = {"schema_version": SCHEMA_VERSION if "step" in samples else 1, "ops_loaded": ops, "device": props.name,
           "gpu_total_bytes": props.total_memory,
           "torch": torch.__version__, "cuda": torch.version.cuda, "deepspeed": deepspeed.__version__,
           "transformers": transformers.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
           "kernel": os.uname().release, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "samples": samples, "time_rates": rates, **runtime_constants(samples, gpu_total_bytes=props.total_memory)}
    torch.distributed.destroy_process_group()
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps({k: v for k, v in doc.items() if k != "samples"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
