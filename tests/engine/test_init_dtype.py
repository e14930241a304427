"""zero.Init keeps the dtype stage 3 gives it (memascend_engine.ds_internals.stage3.keep_explicit_init_dtype): DeepSpeed
drops it for bf16 on a CPU without oneDNN fp16, so a model built outside zero.Init would train in bf16."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")


def _dtype(fp16_supported: bool, dtype):
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero import partition_parameters as pp

    acc = get_accelerator()
    saved = acc.is_fp16_supported
    acc.is_fp16_supported = lambda: fp16_supported
    try:
        init = object.__new__(pp.Init)
        pp.Init._set_dtype(init, None, dtype)
        return init.dtype
    finally:
        acc.is_fp16_supported = saved


def test_stock_drops_a_given_dtype_without_fp16_and_the_patch_keeps_it():
    from memascend_engine.ds_internals.patches import Patches
    from memascend_engine.ds_internals.stage3 import keep_explicit_init_dtype

    assert _dtype(False, torch.float32) == torch.bfloat16  # DeepSpeed's own: the reason for the patch
    assert _dtype(True, torch.float32) == torch.float32
    patches = Patches()
    keep_explicit_init_dtype(patches)
    try:
        assert _dtype(False, torch.float32) == torch.float32
        assert _dtype(False, torch.bfloat16) == torch.bfloat16
        assert _dtype(True, torch.float32) == torch.float32
    finally:
        patches.restore()
    assert _dtype(False, torch.float32) == torch.bfloat16
