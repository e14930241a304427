"""Probes for the parity script (memascend_engine.parity) and the bench job: fp16 on DeepSpeed's CPU accelerator,
and the overflow check on a real gradient."""

from __future__ import annotations

from memascend_engine.ds_internals.optimizer_state import zero3_optimizer
from memascend_engine.ds_internals.version import check_version


def allow_cpu_fp16() -> None:
    """Let DeepSpeed's CPU accelerator run fp16 on a CPU without oneDNN fp16 (it refuses otherwise: 'Type fp16 is not
    supported on your device'); torch's CPU fp16 kernels are slow, so tests use tiny models."""
    check_version()
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.device_name() == "cpu":
        acc.is_fp16_supported = lambda: True
        acc.supported_dtypes = lambda: [__import__("torch").float, __import__("torch").half, __import__("torch").bfloat16]


def overflow_probe(engine) -> dict:
    """The overflow check on a real gradient: clean, with an inf, with a nan, restored; plus torch's answer. With the
    bounded engine the gradient is the first parameter's, read back from the region (the check runs per partition
    as gradients stream); otherwise it is the gradient flat buffer (has_overflow())."""
    import torch

    opt = zero3_optimizer(engine)
    if getattr(opt, "_ma_bounded", False):
        key = next(iter(opt._ma_stream.written))
        nbytes = opt._ma_stream.written[key]
        elem = torch.tensor([], dtype=opt.gradient_accumulation_dtype).element_size()
        buf = opt._ma_stream.read(key, nbytes // elem, opt.gradient_accumulation_dtype, "cpu")

        def check():
            return opt._ma_nonfinite(buf)
    else:
        buf = opt.grad_partitions_flat_buffer

        def check():
            return bool(opt.has_overflow())
    probe = {"clean": check()}
    saved = buf[7].clone()
    buf[7] = float("inf")
    probe["inf"] = check()
    buf[7] = float("nan")
    probe["nan"] = check()
    buf[7] = saved
    probe["restored"] = check()
    probe["reference_clean"] = bool(torch.isinf(buf).any() or torch.isnan(buf).any())
    return probe
