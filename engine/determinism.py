"""What decides a run's losses, for its record: the CPU kernels torch runs (its thread counts, the ISA ATen dispatches
to, the OpenMP / MKL / oneDNN environment) and a digest of the parameters as training starts. Two runs of one job whose
step-1 losses differ are then told apart: other weights (the digests differ) or other math (they are equal)."""

from __future__ import annotations

import os
import time
import zlib


def kernels() -> dict:
    """This process's kernel choices: torch's intra- and inter-op threads, ATen's CPU capability, the variables of
    memascend_cli.run.cpu_env.KERNEL_ENV_PREFIXES that are set."""
    import torch

    from memascend_cli.run.cpu_env import kernel_env

    return {"torch_threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "env": kernel_env(os.environ)}


def param_digest(model) -> dict:
    """CRC-32 of every parameter's full values (its dtype's bytes; a tied one once), module by module in
    model.modules() order, with the bytes hashed and the seconds it took. Under ZeRO-3 each module's parameters are
    gathered in turn (as hf_models.init_weights_under_zero3 writes them: one module's full tensors in memory at a
    time) and partitioned again unchanged, which writes nothing back; a module outside ZeRO needs no gather. Every
    rank must call it."""
    import torch

    t0 = time.perf_counter()
    crc, nbytes, seen = 0, 0, set()
    with torch.no_grad():
        for module in model.modules():
            params = [p for p in module.parameters(recurse=False) if id(p) not in seen]  # tied weights once
            if not params:
                continue
            seen.update(id(p) for p in params)
            with _gathered(params):
                for p in params:
                    # bytes of the dtype as stored (numpy has no bf16): a one-ulp change moves the digest
                    data = p.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy()
                    crc = zlib.crc32(data, crc)
                    nbytes += data.nbytes
    return {"param_crc32": f"{crc:08x}", "param_bytes": nbytes, "param_digest_s": round(time.perf_counter() - t0, 3)}


def _gathered(params):
    """deepspeed.zero.GatheredParameters for ZeRO-3 parameters (a read: modifier_rank None), else nothing."""
    import contextlib

    if not any(hasattr(p, "ds_id") for p in params):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
