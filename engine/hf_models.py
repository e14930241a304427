"""Hugging Face model construction from a memascend ModelSpec (random weights, no downloads)."""

from __future__ import annotations

_CONFIG_CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}


def to_hf_config(spec, **overrides):
    """A transformers config with exactly the spec's shapes."""
    import transformers

    cls = getattr(transformers, _CONFIG_CLASSES[spec.model_type])
    kw = dict(
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim_,
        vocab_size=spec.vocab_size,
        tie_word_embeddings=spec.tie_word_embeddings,
        max_position_embeddings=spec.max_position_embeddings or 4096,
    )
    if spec.model_type in ("llama", "qwen3"):
        kw["attention_bias"] = spec.attention_bias
    if spec.model_type == "llama":
        kw["mlp_bias"] = spec.mlp_bias
    kw.update(overrides)
    return cls(**kw)


def causal_lm_factory(spec, **overrides):
    """A zero-argument callable that builds the randomly initialised model.

    All transformers imports happen here, before the caller enters deepspeed.zero.Init: importing a
    transformers submodule lazily inside zero.Init fails (zero.Init patches tensor constructors).
    """
    from transformers import AutoModelForCausalLM

    cfg = to_hf_config(spec, **overrides)
    model_class = AutoModelForCausalLM._model_mapping[type(cfg)]
    return lambda: model_class(cfg)


def init_weights_under_zero3(model) -> None:
    """Hugging Face's weight initialisation, redone on full tensors for a model built inside ``deepspeed.zero.Init``.

    The model's post_init ran after zero.Init had partitioned every module's parameters into empty tensors, so
    ``_init_weights`` (N(0, initializer_range) for Linear and Embedding) wrote nothing and torch's defaults stayed:
    nn.Embedding's N(0, 1), which with tied embeddings is also the output layer (first losses in the thousands).
    transformers redoes it the same way after its own zero.Init (integrations/deepspeed.py initialize_weights_zero3,
    called from modeling_utils.py _from_config): one module's parameters gathered at a time, rank 0 writes them and
    GatheredParameters(modifier_rank=0) hands them to the other ranks' partitions.
    """
    import deepspeed
    import torch

    writer = deepspeed.comm.get_rank() == 0
    with torch.no_grad():
        for module in model.modules():
            params = list(module.parameters(recurse=False))
            if not params:
                continue  # buffers (rotary frequencies) are not partitioned: post_init set them
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                if writer:
                    model._init_weights(module)
