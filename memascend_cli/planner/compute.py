"""Working memory of the compute device (GPU memory, or host memory on a CPU-only job): gathered parameters, the
reduce bucket, activations and logits. Pure: stdlib only."""

from __future__ import annotations

from memascend_cli.defaults import LOSS_CHUNK_LOGITS_BYTES
from memascend_cli.planner.breakdown import Item
from memascend_cli.planner.context import Context
from memascend_cli.units import GiB

# GPU memory taken by the CUDA context and kernels of torch (typical H100/A100 value, 0.5-0.6 GiB).
CUDA_CONTEXT_BYTES = int(0.6 * GiB)


def flush_copies(c: Context) -> int:
    """Bucket-sized copies a reduce-bucket flush makes on a CPU rank: reduce_scatter_coalesced's torch.cat plus gloo's
    reduce_scatter_tensor copy of its input (measured: tests/integration/test_planner_assumptions.py); none when
    the contiguous bucket is all-reduced in place (reduce_scatter off, stage3.py __avg_scatter_contiguous_grads)."""
    return 0 if c.k.contiguous_gradients and not c.k.reduce_scatter else 2


def loss_backward_blocks(c: Context) -> tuple[list[int], list[int]]:
    """The blocks live at the loss backward's two moments, beyond the gathered params. First cross_entropy's
    backward (torch.nn.functional.cross_entropy = log_softmax + nll_loss): the fp32 logits (transformers'
    ForCausalLMLoss upcasts them, loss/loss_utils.py; 16-bit logits are freed once upcast, fp32 ones are those), the
    log-softmax kept for backward and the gradient it returns. Then lm_head's backward: that gradient in the logits'
    dtype and the lm_head weight's gradient, the first parameter gradient of the step (autograd runs the loss's nodes
    before the model's). Both measured to 0.5% by benchmarks/layer_backward_memory.py --part loss-hf
    (docs/bench/micro/loss-backward-hf-*.json)."""
    if c.job.trainer == "trl":
        return trl_loss_blocks(c)
    if c.job.chunked_loss:
        return chunked_loss_blocks(c)
    bs_vocab = c.job.micro_batch * c.job.seq_len * c.m.vocab_size
    return [4 * bs_vocab] * 3, [c.E * bs_vocab, c.m.vocab_size * c.m.hidden_size * c.E]


TRL_TILE_TOKENS = 4096
"""TRL's fused LM head (trl/trainer/utils.py add_fused_lm_head, which SFTTrainer puts on the model) projects tiles of
this many tokens (trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE, TRL 1.16) ..."""
TRL_TILE_VOCAB = 32768
"""... by this many vocabulary entries (trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE)."""
TRL_TILE_FP32_BYTES = 29
"""Bytes per tile element beside the matmul tile in the compute dtype: the fp32 temporaries of its torch fold on a
device without Triton (chunked_logprob.py _forward_tile, and the backward's recomputed tile); measured with
log_probs, entropy and is_top1 (SFTTrainer's outputs) by benchmarks/layer_backward_memory.py --part loss-trl."""


def trl_loss_blocks(c: Context) -> tuple[list[int], list[int]]:
    """TRL's fused LM head instead of the model's loss, one moment: one tile's temporaries, the weight's and the hidden
    states' gradients accumulated in fp32 (chunked_logprob.py ChunkedLogProbFunction.backward)."""
    m, E = c.m, c.E
    tokens = c.job.micro_batch * c.job.seq_len
    tile = min(tokens, TRL_TILE_TOKENS) * min(m.vocab_size, TRL_TILE_VOCAB)
    return [tile * (TRL_TILE_FP32_BYTES + E), 4 * m.vocab_size * m.hidden_size, 4 * tokens * m.hidden_size], []


def loss_backward_bytes(c: Context) -> int:
    """The larger of the loss backward's moments (loss_backward_blocks)."""
    return max(sum(moment) for moment in loss_backward_blocks(c))


def model_top_bytes(c: Context) -> int:
    """The model's top from the end of forward through the LM head's backward, beside the loss's blocks: the final
    RMSNorm's input in fp32 (kept for its backward: the last layer's output itself in fp32, its upcast in 16-bit,
    transformers' LlamaRMSNorm / Qwen2RMSNorm hidden_states.to(torch.float32)), its normalized product (kept for its
    weight's gradient) and its output (the LM head's input) in the model dtype: 12 B per hidden unit and token in
    fp32, 8 in bf16. Measured with the model's own RMSNorm and either loss to 2% by
    benchmarks/layer_backward_memory.py --part head-hf / head-chunked (docs/bench/micro/head-backward-*.json)."""
    tokens = c.job.micro_batch * c.job.seq_len
    return tokens * c.m.hidden_size * (4 + 2 * c.E)


def loss_chunk_tokens(vocab_size: int, chunk_logits_bytes: int = LOSS_CHUNK_LOGITS_BYTES) -> int:
    """Tokens per chunk of the chunked loss: its fp32 logits take `chunk_logits_bytes`."""
    return max(1, chunk_logits_bytes // (4 * vocab_size))


def chunked_loss_blocks(c: Context) -> tuple[list[int], list[int]]:
    """The chunked loss's two moments (memascend_engine/chunked_loss.py FusedLinearCrossEntropy). At the last chunk
    of its forward: the hidden states' gradient (b*s*h*E), the weight's fp32 gradient (V*h*4), the chunk's fp32
    logits and logsumexp's temporary of the same size (torch.logsumexp: max-shifted exp; a 16-bit matmul output is
    freed once upcast). At its backward: the two gradients and the weight gradient cast to E when E is not fp32.
    Measured by benchmarks/layer_backward_memory.py --part loss-chunked (docs/bench/micro/loss-backward-chunked-*)."""
    m, E = c.m, c.E
    tokens = c.job.micro_batch * c.job.seq_len
    chunk = min(tokens, loss_chunk_tokens(m.vocab_size)) * m.vocab_size
    grads = [tokens * m.hidden_size * E, 4 * m.vocab_size * m.hidden_size]
    return grads + [8 * chunk], grads + [m.vocab_size * m.hidden_size * E if E != 4 else 0]


# Tensors one decoder layer saves for its backward (no recomputation), per token: this many of the activation dtype
# hidden-wide (the two RMSNorms' normalized products and the projections' inputs, the query, the attention output,
# the input and the attention's residual sum), key/value-wide (key and value) and intermediate-wide (gate, up, their
# product, down_proj's input); the attention's logsumexp in fp32 per head; in bf16 / fp16 the two RMSNorm inputs are
# saved as their fp32 upcasts (transformers' LlamaRMSNorm hidden_states.to(torch.float32)). Counted with
# torch.autograd.graph.saved_tensors_hooks on transformers' LlamaDecoderLayer (SDPA), fp32 and bf16, MHA (hidden 768,
# 12 heads) and GQA (hidden 1024, 16 heads, 4 KV heads): the counts give the saved bytes of all four to 0.5%
# (benchmarks/layer_saved_tensors.py).
LAYER_SAVED_TENSORS_PER_TOKEN = {"hidden": 8, "kv": 2, "intermediate": 4}
LAYER_SAVED_UPCAST_HIDDEN = 2


def layer_saved_bytes(c: Context) -> int:
    """One decoder layer's tensors saved for backward (LAYER_SAVED_TENSORS_PER_TOKEN), with the attention scores
    (5as^2b in 16-bit, Korthikanti et al.) where attention is not fused."""
    job, m, t = c.job, c.m, LAYER_SAVED_TENSORS_PER_TOKEN
    tokens = job.micro_batch * job.seq_len
    per_token = c.E * (t["hidden"] * m.hidden_size + t["kv"] * m.num_key_value_heads * m.head_dim_
                       + t["intermediate"] * m.intermediate_size) + 4 * m.num_attention_heads
    if c.E < 4:
        per_token += LAYER_SAVED_UPCAST_HIDDEN * (4 - c.E) * m.hidden_size
    scores = 0 if c.flash else 5 * m.num_attention_heads * job.seq_len * job.seq_len * job.micro_batch * c.E // 2
    return tokens * per_token + scores


def activation_parts(c: Context) -> tuple[int, int, str]:
    """Activation memory of the forward/backward: (kept, recomputed, description). `kept` lives from the end of
    forward through the loss backward (every layer's saved tensors without recomputation, the L x sbh checkpoints in
    the activation dtype with it); `recomputed` is one layer's, only inside its backward."""
    job, m = c.job, c.m
    s, b, h, L = job.seq_len, job.micro_batch, m.hidden_size, m.num_hidden_layers
    full_layer = layer_saved_bytes(c)
    scores = 0 if c.flash else 5 * m.num_attention_heads * s * s * b * c.E // 2
    ck = job.checkpointing
    if ck == "none":
        kept, again = L * full_layer, 0
        desc = "L x a layer's saved tensors, no recomputation"
    elif ck == "selective":
        kept, again = L * (full_layer - scores), scores
        desc = "L x layer without attention scores + one layer's scores (selective recomputation)"
    else:
        kept = 0 if (ck == "offload" and (c.gpu or c.ssd_checkpoints)) else L * 2 * s * b * h * c.E // 2
        again = full_layer
        desc = ("one layer recomputed" if kept == 0 else "L x 2sbh checkpoints + one layer recomputed")
    return int(kept), int(again), desc


# One recomputed decoder layer's backward on a CPU rank peaks in its MLP backward, just after down_proj's weight
# gradient is allocated: per token, this many tensors of the activation dtype are live beside that gradient (hidden-,
# intermediate- and key/value-wide), the layer's checkpointed input and the gradient arriving from above not counted;
# in bf16 / fp16 also LAYER_BACKWARD_UPCAST_BYTES_PER_HIDDEN (transformers' RMSNorm computes in fp32). Measured with
# transformers' Llama and Qwen2 decoder layers (SDPA) by benchmarks/layer_backward_memory.py: the counts give the
# measured bytes per token of four shapes in fp32 and four in bf16 to 0.1% (docs/bench/micro/layer-backward-*.json).
LAYER_BACKWARD_TENSORS_PER_TOKEN = {"hidden": 8, "intermediate": 6, "kv": 2}
LAYER_BACKWARD_UPCAST_BYTES_PER_HIDDEN = 6


def layer_backward_bytes(c: Context) -> int:
    """One recomputed layer's CPU backward at its peak: LAYER_BACKWARD_TENSORS_PER_TOKEN + down_proj's gradient."""
    m, t = c.m, LAYER_BACKWARD_TENSORS_PER_TOKEN
    tokens = c.job.micro_batch * c.job.seq_len
    per_token = c.E * (t["hidden"] * m.hidden_size + t["intermediate"] * m.intermediate_size
                       + t["kv"] * m.num_key_value_heads * m.head_dim_)
    if c.E < 4:
        per_token += LAYER_BACKWARD_UPCAST_BYTES_PER_HIDDEN * m.hidden_size
    return tokens * per_token + m.hidden_size * m.intermediate_size * c.E


def activation_bytes(c: Context) -> tuple[int, str]:
    """All activation memory of the forward/backward at its height (activation_parts: kept + one layer recomputed)."""
    kept, again, desc = activation_parts(c)
    return kept + again, desc


def compute_items(c: Context, tier: str) -> list[Item]:
    """Working memory of the compute device: GPU memory, or host memory on a CPU-only job."""
    job, m, k, E = c.job, c.m, c.k, c.E
    items: list[Item] = []
    pre = f"{tier}/compute/" if tier == "host" else "gpu/"

    def add(key, label, nbytes, formula, source, kind="steady"):
        items.append(Item(pre + key, label, tier, int(nbytes), kind, "", 0, formula, source))

    if tier == "gpu":
        add("cuda_context", "CUDA context", CUDA_CONTEXT_BYTES, "constant", "typical CUDA 12 context + torch kernels")
    small = sum(n * count for n, count in c.part.full_counts.items() if n < k.param_persistence_threshold)
    add("persistent_params", "persistent small params (whole)", small * E,
        f"params below stage3_param_persistence_threshold {k.param_persistence_threshold:,} x E",
        "runtime/zero/parameter_offload.py mark_persistent_parameters (line 317)")
    layer = m.layer_numel()
    vocab = m.vocab_size * m.hidden_size
    live = max(layer, vocab) + min(k.prefetch_bucket_size, layer)
    add("live_params", "gathered params (current + prefetched)", live * E,
        f"(max(layer {layer:,}, vocab matrix {vocab:,}) + min(prefetch bucket, layer)) x E",
        "runtime/zero/partitioned_param_coordinator.py fetch_sub_module prefetch (lines 452-454)")
    # In backward every gathered parameter gets a full-size gradient until its reduce hook copies it
    # into the bucket.
    add("live_param_grads", "gradients of the gathered params", live * E, "= gathered params",
        "stage3 reduce_ready_partitions_and_remove_grads", kind="transient")
    if tier == "gpu" and not c.bounded:
        # Stock's boundary copies: the partition moved to the device and converted to fp32 before the swap-out
        # (stage3.py 2025-2028, 1453), one reduce bucket's worth at a time.
        part_bucket = min(-(-c.reduce_bucket_size // c.world), c.ns)
        per = c.G + (4 if c.G != 4 else 0)
        add("grad_fp32_copies", "fp32 gradient copies before swap-out", per * part_bucket,
            f"({c.G} + 4) B x min(reduce_bucket_size / world, Ns) = {part_bucket:,}",
            "stage3.partition_grads / _offload_grad_partition_at_boundary on the GPU", kind="transient")
    # The IPG bucket is torch.empty(reduce_bucket_size): reserved in full on a GPU, on the host only
    # the pages that backward fills are resident.
    bucket = c.reduce_bucket_size if tier == "gpu" else min(c.reduce_bucket_size, m.num_params)
    add("reduce_bucket", "gradient reduce bucket", bucket * E,
        f"reduce_bucket_size {c.reduce_bucket_size:,} elements x E" + ("" if tier == "gpu" else " (touched part)"),
        "runtime/zero/stage3.py _setup_for_real_optimizer ipg bucket torch.empty (lines 780-784)")
    act, desc = activation_bytes(c)
    add("activations", "activations", act, desc, "Korthikanti et al., arXiv 2205.05198 (Table 2), SwiGLU-adjusted")
    bs = job.micro_batch * job.seq_len
    if job.chunked_loss:
        add("logits", "chunked loss (64 MiB logits chunks)", max(sum(b) for b in chunked_loss_blocks(c)),
            "b*s*h*E hidden grad + V*h*4 weight grad + 2 fp32 logits chunks",
            "memascend_engine/chunked_loss.py FusedLinearCrossEntropy")
    elif job.fused_cross_entropy:
        add("logits", "logits (Liger fused linear CE, chunked)", 8 * bs * m.hidden_size,
            "chunk of ~b*s*h fp32 logits + its grad", "Liger-Kernel FusedLinearCrossEntropy chunking")
    else:
        add("logits", "logits + fp32 loss upcast", bs * m.vocab_size * (E + 4),
            f"b*s {bs:,} x V {m.vocab_size:,} x ({E} + 4) B",
            "transformers loss/loss_utils.py ForCausalLMLoss logits.float() (line 61)")
    return items
