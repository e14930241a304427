"""Measures the CUDA runtime constants the planner otherwise guesses, on the GPU machine; the kit's constants phase
runs it with the venv's python (torch, DeepSpeed, transformers) and DS_ACCELERATOR=cuda:

    python scripts/gpukit/cuda_constants.py OUT.json

Host: the system's used memory (MemTotal - MemAvailable, the plan's view) and this process's RssAnon at each
step: bare interpreter, the imports, the first CUDA tensor (context), a bf16 matmul (cuBLAS and its workspace),
DeepSpeed's init_distributed on NCCL plus one all_reduce (NCCL creates its communicator at the first collective).
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
    props = torch.cuda.get_device_properties(0)
    doc = {"schema_version": 1, "device": props.name, "gpu_total_bytes": props.total_memory,
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
