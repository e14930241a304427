"""Fused linear cross-entropy in chunks: a causal LM's loss without its b x s x V logits.

transformers computes ``logits = lm_head(hidden)`` for every token and then ``cross_entropy(logits.float())``
(loss/loss_utils.py ForCausalLMLoss): the logits, their fp32 copy, the log-softmax kept for backward and the
gradient all have b x s x V elements, 6.5 of 7.8 GiB of a 35K-token step of a 32K-vocabulary model. Here the
lm_head and the loss run together, a chunk of tokens at a time: each chunk's logits are made, turned into the
loss and, in the same pass, into the gradients of the hidden states and of the lm_head weight (the loss is
linear in its incoming gradient, so backward only scales them). What lives is one chunk's logits, the hidden
states' gradient (b x s x h) and the weight's fp32 gradient (V x h): the scheme of Liger-Kernel's
FusedLinearCrossEntropy (arXiv 2410.10989), in plain torch so it runs on a CPU as on a GPU.

The loss is ForCausalLMLoss's: labels shifted left by one, -100 ignored, the mean over the tokens that count
(0 where none do, where transformers gives NaN), summed in fp32.

Under ZeRO-3 the lm_head stays the module that owns the weight: ``enable`` replaces the model's forward, not its
modules, so DeepSpeed's hooks gather the weight for the lm_head call and the state dict is unchanged.
"""

from __future__ import annotations

import types

from memascend_cli.defaults import LOSS_CHUNK_LOGITS_BYTES
from memascend_cli.planner.compute import loss_chunk_tokens
from memascend_engine.data import IGNORE_INDEX


def _flat_targets(hidden, labels):
    """(hidden as (tokens, h), each token's target): ForCausalLMLoss's shift, token t predicts label t + 1 and
    each sequence's last position has none."""
    import torch

    target = torch.full_like(labels, IGNORE_INDEX)
    target[..., :-1] = labels[..., 1:]
    return hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)


def _fused_linear_ce():
    import torch

    class FusedLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight, labels, chunk):
            flat, target = _flat_targets(hidden, labels)
            n_tokens = flat.shape[0]
            valid = target != IGNORE_INDEX
            n_valid = int(valid.sum())
            scale = 1.0 / max(n_valid, 1)
            grad_hidden = torch.empty_like(flat)
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for start in range(0, n_tokens, chunk):
                h = flat[start:start + chunk]
                t, v = target[start:start + chunk], valid[start:start + chunk]
                logits = (h @ weight.t()).float()
                lse = torch.logsumexp(logits, dim=-1)
                rows = torch.nonzero(v).squeeze(1)
                if rows.numel():
                    loss += (lse[rows] - logits[rows, t[rows]]).sum()
                # d loss / d logits = (softmax - onehot) / n_valid on the tokens that count, 0 elsewhere.
                probs = logits.sub_(lse.unsqueeze(1)).exp_()
                probs[rows, t[rows]] -= 1.0
                probs[~v] = 0.0
                probs.mul_(scale)
                grad_hidden[start:start + chunk] = (probs if h.dtype == torch.float32 else probs.to(h.dtype)) @ weight
                grad_weight.addmm_(probs.t(), h.float())
                del logits, probs, lse
            ctx.grads = (grad_hidden.reshape(hidden.shape), grad_weight)
            ctx.weight_dtype = weight.dtype
            return loss * scale

        @staticmethod
        def backward(ctx, grad_loss):
            grad_hidden, grad_weight = ctx.grads
            ctx.grads = None  # free them once handed on
            if not torch.equal(grad_loss, torch.ones_like(grad_loss)):  # loss scaling, accumulation weights
                grad_hidden = grad_hidden.mul_(grad_loss.to(grad_hidden.dtype))
                grad_weight = grad_weight.mul_(grad_loss.float())
            return grad_hidden, grad_weight.to(ctx.weight_dtype), None, None

    return FusedLinearCrossEntropy


_FUNCTION = None


def fused_linear_cross_entropy(hidden, weight, labels, chunk: int):
    """The mean causal-LM loss of `hidden` (b, s, h) through `weight` (V, h) against `labels` (b, s)."""
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _fused_linear_ce()
    return _FUNCTION.apply(hidden, weight, labels, chunk)


def _head_loss(self, hidden, labels):
    import torch

    if not torch.is_grad_enabled():  # evaluation: the loss alone, no gradients made
        return _loss_only(hidden, self.weight, labels, self._memascend_loss_chunk)
    return fused_linear_cross_entropy(hidden, self.weight, labels, self._memascend_loss_chunk)


def _loss_only(hidden, weight, labels, chunk: int):
    import torch

    flat, target = _flat_targets(hidden, labels)
    n_tokens = flat.shape[0]
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, n_tokens, chunk):
        logits = (flat[start:start + chunk] @ weight.t()).float()
        total += torch.nn.functional.cross_entropy(logits, target[start:start + chunk], reduction="sum",
                                                   ignore_index=IGNORE_INDEX)
    return total / max(int((target != IGNORE_INDEX).sum()), 1)


def _forward(self, input_ids=None, labels=None, **kwargs):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    hidden = self.get_decoder()(input_ids=input_ids, **kwargs).last_hidden_state
    head = self.get_output_embeddings()
    if labels is None:
        return CausalLMOutputWithPast(logits=head(hidden))
    # Through the lm_head module (its forward swapped), so ZeRO-3's hooks gather and release its weight.
    head.forward = types.MethodType(_head_loss, head)
    try:
        loss = head(hidden, labels)
    finally:
        del head.forward
    return CausalLMOutputWithPast(loss=loss)


def enable(model, chunk_logits_bytes: int = LOSS_CHUNK_LOGITS_BYTES) -> int:
    """Make `model(input_ids=..., labels=...)` compute its loss in chunks; returns the tokens per chunk. A model
    whose loss is not plain ForCausalLMLoss (final logit soft-capping, a scaled lm_head) is refused."""
    cfg = model.config
    for attr in ("final_logit_softcapping", "logit_scale"):
        if getattr(cfg, attr, None):
            raise ValueError(f"the chunked loss does not model {attr} ({type(model).__name__})")
    head = model.get_output_embeddings()
    if head is None or getattr(head, "bias", None) is not None:
        raise ValueError(f"the chunked loss needs a bias-free lm_head ({type(model).__name__})")
    head._memascend_loss_chunk = loss_chunk_tokens(cfg.vocab_size, chunk_logits_bytes)
    model.forward = types.MethodType(_forward, model)
    return head._memascend_loss_chunk
