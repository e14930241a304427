"""Offloaded gradient checkpointing (engine/activation_checkpointing.py) on a plain transformers Llama."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def _tiny_llama():
    from memascend_engine.hf_models import causal_lm_factory

    from memascend_cli.models import ModelSpec

    spec = ModelSpec(name="t", model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=97)
    return causal_lm_factory(spec)


def _grads(model, x):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_recompute_gives_identical_loss_and_gradients():
    from memascend_engine.activation_checkpointing import enable
    from memascend_engine.pinned import PinnedAllocator

    make = _tiny_llama()
    torch.manual_seed(0)
    ref_model = make()
    torch.manual_seed(0)
    model = make()
    x = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(3))
    ref_loss, ref_grads = _grads(ref_model.train(), x)
    ck = enable(model, PinnedAllocator())
    loss, grads = _grads(model, x)
    assert ck.calls == 3  # one per decoder layer
    assert torch.equal(loss, ref_loss)
    assert ref_grads.keys() == grads.keys()
    for name in grads:
        assert torch.equal(grads[name], ref_grads[name]), name


def test_rejects_models_without_checkpointing_support():
    from memascend_engine.activation_checkpointing import enable

    with pytest.raises(ValueError, match="does not support gradient checkpointing"):
        enable(torch.nn.Linear(2, 2), None)


@pytest.mark.gpu
def test_layer_inputs_live_in_pinned_host_memory_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from memascend_engine.activation_checkpointing import enable
    from memascend_engine.pinned import PinnedAllocator

    make = _tiny_llama()
    torch.manual_seed(0)
    ref = make().cuda().train()
    torch.manual_seed(0)
    model = make().cuda()
    x = torch.randint(0, 97, (2, 16), device="cuda")
    ref_loss, ref_grads = _grads(ref, x)
    alloc = PinnedAllocator()
    ck = enable(model, alloc)
    loss, grads = _grads(model, x)
    assert ck.stash.peak_bytes == 3 * 2 * 16 * 64 * 4  # L x b x s x h x fp32, exact size
    assert ck.stash.live_bytes == 0
    assert alloc.snapshot()["cuda_registered_bytes"] > 0
    assert torch.allclose(loss, ref_loss)
    for name in grads:
        assert torch.allclose(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.gpu
def test_fused_kernels_only_on_cuda():
    from memascend_engine import EngineOptions
    from memascend_engine.runtime import Installed

    inst = Installed(options=EngineOptions(), ds_config={}, spec=None, rank=0, region=None)
    if not torch.cuda.is_available():
        assert inst.attn_implementation() is None and inst.apply_fused_kernels("llama") == []
        pytest.skip("needs CUDA for the positive case")
    try:
        import flash_attn  # noqa: F401
        assert inst.attn_implementation() == "flash_attention_2"
    except ImportError:
        assert inst.attn_implementation() is None
    off = Installed(options=EngineOptions(fused_kernels=False), ds_config={}, spec=None, rank=0, region=None)
    assert off.attn_implementation() is None and off.apply_fused_kernels("llama") == []
