"""The chunked fused linear cross-entropy against transformers' own loss: same value, same gradients, for every
parameter, with ignored labels, several chunks and a last chunk shorter than the others; and it never makes the
b x s x V logits."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from memascend_engine import chunked_loss  # noqa: E402

VOCAB = 96


def tiny_llama(seed: int = 0, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg).double()


def loss_and_grads(model, ids, labels):
    model.zero_grad()
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tie", [False, True])
def test_loss_and_every_gradient_equal_transformers(tie):
    ids = torch.randint(0, VOCAB, (3, 17), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :5] = -100  # a masked prompt
    labels[2, 9] = -100
    reference = tiny_llama(tie=tie)
    chunked = tiny_llama(tie=tie)
    # 4 tokens per chunk: 51 tokens make 12 full chunks and one of 3.
    assert chunked_loss.enable(chunked, chunk_logits_bytes=4 * VOCAB * 4) == 4
    want, want_grads = loss_and_grads(reference, ids, labels)
    got, got_grads = loss_and_grads(chunked, ids, labels)
    # Both upcast the logits to fp32 (ForCausalLMLoss logits.float()), so fp32 rounding bounds the difference.
    assert got.dtype == want.dtype == torch.float32 and torch.allclose(got, want, rtol=1e-6), (got, want)
    with torch.no_grad():  # evaluation takes the loss-only path
        assert torch.allclose(chunked(input_ids=ids, labels=labels).loss, want, rtol=1e-6)
    assert want_grads.keys() == got_grads.keys()
    for name, g in want_grads.items():
        assert torch.allclose(got_grads[name], g, rtol=1e-4, atol=1e-7), name


def test_a_scaled_loss_scales_the_gradients_and_no_full_logits_are_made():
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(2))
    model = tiny_llama()
    chunked_loss.enable(model, chunk_logits_bytes=8 * VOCAB * 4)
    _, once = loss_and_grads(model, ids, ids)
    widest = []
    hook = torch.autograd.graph.saved_tensors_hooks(lambda t: widest.append(t.numel()) or t, lambda t: t)
    model.zero_grad()
    with hook:
        loss = model(input_ids=ids, labels=ids).loss
    (4 * loss).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, 4 * once[name], rtol=1e-12), name
    # Nothing autograd keeps for backward is as large as the logits (b x s x V).
    assert max(widest) < ids.numel() * VOCAB


def test_without_labels_the_model_returns_logits_and_unsupported_heads_are_refused():
    model = tiny_llama()
    chunked_loss.enable(model)
    ids = torch.randint(0, VOCAB, (1, 5))
    assert model(input_ids=ids).logits.shape == (1, 5, VOCAB)
    capped = tiny_llama()
    capped.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        chunked_loss.enable(capped)
