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
memory_reserved). `MEMASCEND_CUDA_CONSTANTS=OUT.json memascend plan ...` then plans with these numbers.
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
    props = torch.cuda.get_device_properties(0)
    # Without the step's sample the runtime is the one before it: schema 1, which the planner refuses.
    doc = {"schema_version": SCHEMA_VERSION if "step" in samples else 1, "ops_loaded": ops, "device": props.name,
           "gpu_total_bytes": props.total_memory,
           "torch": torch.__version__, "cuda": torch.version.cuda, "deepspeed": deepspeed.__version__,
           "transformers": transformers.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
           "kernel": os.uname().release, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "samples": samples, **runtime_constants(samples, gpu_total_bytes=props.total_memory)}
    torch.distributed.destroy_process_group()
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps({k: v for k, v in doc.items() if k != "samples"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
