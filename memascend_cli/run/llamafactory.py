"""LLaMA-Factory SFT recipes: their keys translated into memascend's, or refused with the reason.

A LLaMA-Factory YAML (`llamafactory-cli train x.yaml`) runs with `memascend train x.yaml` once its
`deepspeed:` line is gone: memascend builds the DeepSpeed config from the plan. Every key is in
one of the tables below (docs/llama-factory.md is the human-readable copy, kept equal by a test):
MAPPED keys mean the same thing, IGNORED keys change nothing memascend does, REFUSED values
cannot be honoured. `dataset` + `dataset_dir` are read from their `dataset_info.json`.

Pure apart from reading dataset_info.json: no torch.
"""

from __future__ import annotations

import json
import os

from memascend_cli.errors import BadInput, did_you_mean

# LLaMA-Factory key -> memascend key (dotted for nested ones). Same meaning, same units.
MAPPED = {
    "model_name_or_path": "model",
    "model_revision": "revision",
    "tokenizer_name_or_path": "tokenizer",
    "template": "template",
    "cutoff_len": "seq_len",
    "per_device_train_batch_size": "micro_batch",
    "gradient_accumulation_steps": "grad_accum",
    "learning_rate": "lr",
    "num_train_epochs": "epochs",
    "max_steps": "steps",
    "lr_scheduler_type": "schedule.name",
    "warmup_ratio": "schedule.warmup_ratio",
    "warmup_steps": "schedule.warmup_steps",
    "weight_decay": "weight_decay",
    "max_grad_norm": "max_grad_norm",
    "output_dir": "output_dir",
    "logging_steps": "log_every",
    "save_steps": "checkpoint_every",
    "save_total_limit": "keep_checkpoints",
    "eval_steps": "eval_every",
    "val_size": "dataset.validation_split",
    "max_samples": "dataset.max_samples",
    "overwrite_cache": "dataset.overwrite_cache",
    "tokenized_path": "dataset.cache_dir",
    "packing": "dataset.packing",
    "report_to": "report_to",
    "seed": "seed",
    "overwrite_output_dir": "overwrite_output_dir",
}

# Keys handled by code below (several keys make one memascend value).
COMBINED = {
    "dataset": "dataset.path (file_name) or dataset.hub (hf_hub_url) and format, from dataset_info.json in dataset_dir",
    "dataset_dir": "where dataset_info.json and the data files are (default: data, relative to the current directory)",
    "bf16": "precision: bf16",
    "fp16": "precision: fp16 (neither bf16 nor fp16: fp32, as in LLaMA-Factory)",
    "pure_bf16": "precision: bf16",
    "adam_beta1": "adam_betas[0]",
    "adam_beta2": "adam_betas[1]",
    "disable_gradient_checkpointing": "gradient_checkpointing: false (LLaMA-Factory checkpoints by default, so does memascend)",
    "eval_strategy": "no: no periodic validation; steps: every eval_steps",
    "stage": "sft (chat data) or pt (dataset format text); others refused",
    "finetuning_type": "full; lora, freeze and oft refused",
}

# Accepted and without effect on what memascend does (with the reason, for --dry-run notes and the docs).
IGNORED = {
    "do_train": "memascend train always trains (do_train: false is refused)",
    "trust_remote_code": "only Llama-style architectures are supported; no remote code is ever run",
    "preprocessing_num_workers": "tokenization runs once, in one process, and is cached",
    "dataloader_num_workers": "batches are read from the memory-mapped cache in the rank itself",
    "plot_loss": "losses are in metrics.jsonl and TensorBoard",
    "save_only_model": "checkpoints always hold the optimizer states (they must resume exactly)",
    "ddp_timeout": "DeepSpeed's default timeout",
    "per_device_eval_batch_size": "validation uses the training micro-batch",
    "flash_attn": "transformers' default attention for the device",
    "run_name": "the run is named by output_dir",
    "logging_dir": "TensorBoard events go to output_dir/tensorboard",
    "resume_from_checkpoint": "only null; use `memascend train RECIPE --resume`",
    "cache_dir": "downloads go to the Hugging Face caches (HF_HOME, HF_HUB_CACHE, HF_DATASETS_CACHE)",
    "optim": "only adamw_torch / adamw_hf / adamw_torch_fused (DeepSpeed's AdamW)",
    "lora_rank": "LoRA settings have no effect with finetuning_type: full",
    "lora_alpha": "LoRA settings have no effect with finetuning_type: full",
    "lora_dropout": "LoRA settings have no effect with finetuning_type: full",
    "lora_target": "LoRA settings have no effect with finetuning_type: full",
    "do_eval": "validation runs when val_size is set",
    "streaming": "only false; the tokenized cache is memory-mapped, so data never has to fit in memory",
    "use_v1_kernels": "LLaMA-Factory's fused-kernel plugins; memascend runs the model's own modules",
    "use_reentrant_gc": "activation checkpointing is memascend's own (checkpointing: full or offload)",
    "gradient_checkpointing_kwargs": "activation checkpointing is memascend's own (checkpointing: full or offload)",
}

# key -> (accepted values, reason when another value is given)
RESTRICTED = {
    "do_train": ((True,), "memascend train trains; use `memascend export` to convert a checkpoint"),
    "stage": (("sft", "pt"), "memascend does supervised fine-tuning (sft) and continued pretraining (pt) only; "
                             "reward modelling, PPO, DPO and KTO need a reference or reward model"),
    "finetuning_type": (("full",), "memascend does full fine-tuning with parameters and optimizer states on the SSD; "
                                   "LoRA/freeze/OFT train a small fraction of the weights, whose optimizer states fit "
                                   "in memory anyway - run those with LLaMA-Factory itself"),
    "resume_from_checkpoint": ((None,), "resume with `memascend train RECIPE --resume` (memascend checkpoints)"),
    "streaming": ((False,), "memascend tokenizes the dataset once into a memory-mapped cache, so it never has to fit "
                            "in memory, and counts its sequences for the step count; set streaming: false"),
    "optim": (("adamw_torch", "adamw_hf", "adamw_torch_fused"), "memascend trains with DeepSpeed's AdamW"),
    "eval_strategy": (("no", "steps"), "validation runs every eval_steps steps (eval_strategy: steps) or at the end"),
    "do_predict": ((False,), "memascend trains; generate with the exported model"),
    "enable_liger_kernel": ((False,), "Liger kernels are not used by memascend's trainer"),
    "neat_packing": ((False,), "packing without cross-attention between samples is not implemented; "
                               "use packing: true or false"),
    "lr_scheduler_type": (("cosine", "linear", "constant", "constant_with_warmup"),
                          "DeepSpeed's schedulers cover cosine, linear and constant (with warm-up)"),
}

# Accepted and replaced by memascend's own value (with a one-line note).
REPLACED = {
    "deepspeed": "replaced by memascend's DeepSpeed config (ZeRO-3, params and optimizer on the SSD, from the plan)",
}

REFUSED_KEYS = {
    "adapter_name_or_path": "adapters are not supported (full fine-tuning only)",
    "eval_dataset": "a separate validation dataset is not supported; use val_size",
    "quantization_bit": "quantized training (QLoRA) is not supported",
    "use_unsloth": "unsloth is not used",
    "fsdp": "memascend uses DeepSpeed ZeRO-3, not FSDP",
}

# LLaMA-Factory's training methods other than plain AdamW full fine-tuning: each key refused with its method's reason
# (never a "did you mean" guess: galore_target is not lora_target). Prefix -> (method, reason).
_OPTIMIZER_REASON = ("memascend's engine streams DeepSpeed's CPU AdamW states through the SSD; other optimizers are "
                     "not implemented there")
_MEGATRON_REASON = ("memascend shards with DeepSpeed ZeRO-3 (data parallel, parameters and optimizer on the SSD), not "
                    "Megatron's tensor, pipeline or expert parallelism")
METHOD_PREFIXES = {
    "galore_": ("GaLore", _OPTIMIZER_REASON),
    "use_galore": ("GaLore", _OPTIMIZER_REASON),
    "apollo_": ("APOLLO", _OPTIMIZER_REASON),
    "use_apollo": ("APOLLO", _OPTIMIZER_REASON),
    "badam_": ("BAdam", "BAdam trains one block of layers at a time with its own optimizer; memascend's engine "
                        "updates all parameters with AdamW"),
    "use_badam": ("BAdam", "BAdam trains one block of layers at a time with its own optimizer; memascend's engine "
                           "updates all parameters with AdamW"),
    "use_adam_mini": ("Adam-mini", _OPTIMIZER_REASON),
    "use_muon": ("Muon", _OPTIMIZER_REASON),
    "use_dft_loss": ("DFT", "memascend trains with the plain token cross-entropy; DFT/EAFT/ASFT reweight the loss"),
    "use_eaft_loss": ("EAFT", "memascend trains with the plain token cross-entropy; DFT/EAFT/ASFT reweight the loss"),
    "eaft_": ("EAFT", "memascend trains with the plain token cross-entropy; DFT/EAFT/ASFT reweight the loss"),
    "use_asft_loss": ("ASFT", "memascend trains with the plain token cross-entropy; DFT/EAFT/ASFT reweight the loss"),
    "asft_": ("ASFT", "memascend trains with the plain token cross-entropy; DFT/EAFT/ASFT reweight the loss"),
    "mixture_of_depths": ("MoD", "mixture-of-depths changes the model's architecture; memascend trains the model as "
                                 "it is"),
    "fp8": ("fp8", "memascend trains in bf16, fp16 or fp32"),
    "fp8_": ("fp8", "memascend trains in bf16, fp16 or fp32"),
    "use_llama_pro": ("LLaMA Pro", "LLaMA Pro trains expanded blocks only (a freeze method); memascend does full "
                                   "fine-tuning"),
    "pissa_": ("PiSSA", "PiSSA is a LoRA initialisation; memascend does full fine-tuning"),
    "loraplus_": ("LoRA+", "LoRA+ is a LoRA method; memascend does full fine-tuning"),
    "oft_": ("OFT", "OFT is an adapter method; memascend does full fine-tuning"),
    "image_": ("multimodal", "memascend trains text-only language models"),
    "video_": ("multimodal", "memascend trains text-only language models"),
    "audio_": ("multimodal", "memascend trains text-only language models"),
    "freeze_vision_tower": ("multimodal", "memascend trains text-only language models"),
    "freeze_multi_modal_projector": ("multimodal", "memascend trains text-only language models"),
    "freeze_language_model": ("multimodal", "memascend trains text-only language models"),
    "use_audio_in_video": ("multimodal", "memascend trains text-only language models"),
    "fsdp_": ("FSDP", "memascend uses DeepSpeed ZeRO-3, not FSDP"),
    # LLaMA-Factory's Megatron-Core backend (examples/megatron/).
    **dict.fromkeys((
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
        "sequence_parallel", "use_distributed_optimizer", "overlap_param_gather", "overlap_grad_reduce",
        "moe_grouped_gemm", "moe_token_dispatcher_type", "recompute_granularity", "bias_activation_fusion",
        "apply_rope_fusion"),
        ("Megatron-Core", _MEGATRON_REASON)),
}


def method_of(key: str) -> tuple[str, str] | None:
    """(method, reason) of a LLaMA-Factory method or multimodal key, or None for other keys."""
    for prefix, found in METHOD_PREFIXES.items():
        if key == prefix or (prefix.endswith("_") and key.startswith(prefix)):
            return found
    return None


# Every template name LLaMA-Factory registers (src/llamafactory/data/template.py register_template(name=...), at
# commit ff6d4d12 of August 2026). Those not in TOKENIZER_TEMPLATES / PLAIN_TEMPLATES use the tokenizer's own chat
# template, with a note that LLaMA-Factory's rendering is not reproduced.
LLAMAFACTORY_TEMPLATES = frozenset("""
custom alpaca bailing bailing_v2 breeze chatglm3 chatml chatml_de cohere cpm4 dbrx deepseek deepseek3 deepseekr1 hy3
deepseekcoder default dots_ocr empty ernie ernie_nothink ernie_vl exaone falcon falcon_h1 fewshot gemma gemma2 gemma3
gemma3n gemma4 gemma4n glm4 glm4_moe glm4v glm4_5v glm_ocr glm4_7 glmz1 gpt_oss granite3 granite3_vision granite4
index hunyuan hunyuan_small hy_dense_1_8b hy_dense_7b intern2 intern_vl intern_s1 keye_vl kimi_vl lfm2 lfm2_vl llama2
llama2_zh llama3 llama4 mllama moonlight moss_vl llava llava_next llava_next_llama3 llava_next_mistral llava_next_qwen
llava_next_yi llava_next_video llava_next_video_mistral llava_next_video_yi mimo mimo_v2 mimo_vl minicpm_v
minicpm_v_4_6 minicpm_o minimax1 minimax2 ministral mistral mistral_small ministral3 olmo openchat openchat-3.6
opencoder paligemma paligemma_chat phi phi_small phi4 phi4_mini pixtral qwen qwen3 qwen3_nothink qwen2_audio
qwen2_omni qwen3_omni qwen3_omni_nothink qwen2_vl qwen3_vl qwen3_vl_nothink qwen3_5 qwen3_5_nothink qwen3_6 sailor
seed_coder seed_oss smollm smollm2 solar starchat telechat2 vicuna video_llava xuanyuan yi yi_vl youtu youtu_vl yuan
zephyr aeva
""".split())

# LLaMA-Factory template names whose official chat template the model's tokenizer carries; memascend
# uses the tokenizer's own template for them (LLaMA-Factory's templates reproduce the official ones).
TOKENIZER_TEMPLATES = {"default", "qwen", "qwen2_vl", "qwen3", "llama2", "llama3", "llama4", "mistral", "gemma",
                       "gemma2", "gemma3", "phi", "phi4", "chatml", "chatml_de", "deepseek", "deepseek3", "yi",
                       "smollm", "smollm2", "zephyr", "vicuna", "granite3", "olmo", "cohere", "glm4", "baichuan2"}
PLAIN_TEMPLATES = {"empty": "plain", "alpaca": "plain"}

LF_ONLY_KEYS = set(MAPPED) | set(COMBINED) | set(IGNORED) | set(RESTRICTED) | set(REFUSED_KEYS) | set(REPLACED)
LF_ONLY_KEYS |= {"do_predict"}
LF_ONLY_KEYS -= {"template", "output_dir", "seed", "report_to", "weight_decay", "max_grad_norm",
                 "overwrite_output_dir", "dataset"}


def is_llamafactory(data: dict) -> bool:
    """True when the mapping uses LLaMA-Factory's keys (model_name_or_path, cutoff_len, stage, ...)."""
    return any(k in LF_ONLY_KEYS for k in data)


# Keys of LLaMA-Factory's "v1" configs (`USE_V1=1 llamafactory-cli train x.yaml`: examples/v1/, the dataclasses of
# src/llamafactory/v1/config/, at commit ff6d4d12) that neither its default format nor memascend's recipes have.
# Any of them names the format; its other keys (model, cutoff_len, learning_rate, ...) overlap with both.
V1_KEYS = ("model_class", "train_dataset", "micro_batch_size", "global_batch_size", "dist_config", "kernel_config",
           "peft_config", "quant_config", "init_config", "optim_config", "lr_scheduler_config", "batching_strategy",
           "batching_workers", "enable_activation_checkpointing", "custom_chat_template", "save_ckpt_as_hf",
           "save_epochs", "dp_size", "cp_size", "cp_mode", "mp_replicate_size", "mp_shard_size")


def refuse_v1(data: dict, origin: str) -> None:
    """One line for a LLaMA-Factory v1 config, instead of one unknown key per v1 name.

    Raises:
        BadInput: when the mapping has a v1-only key.
    """
    found = [str(k) for k in data if k in V1_KEYS]
    if found:
        raise BadInput(f"{origin} is a LLaMA-Factory v1 config (USE_V1=1; {', '.join(found[:3])}), a format memascend "
                       "does not read",
                       "write it in LLaMA-Factory's default format (model_name_or_path, dataset, "
                       "per_device_train_batch_size: its examples/train_full/), or as a memascend recipe "
                       "(presets/train/tiny-cpu.yaml)")


def _set(out: dict, dotted: str, value, origin: str, source_key: str) -> None:
    node = out
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if leaf in node and node[leaf] != value:
        raise BadInput(f"{origin}: {source_key} and {dotted} both set", "give one of them")
    node[leaf] = value


def translate(data: dict, *, recipe_dir: str, cwd: str, origin: str, native_keys: set[str]) -> tuple[dict, list[str]]:
    """(memascend recipe mapping, notes) for a LLaMA-Factory YAML mapping; `native_keys`: memascend's own recipe
    keys (passed through as they are).

    Raises:
        BadInput: for every value memascend cannot honour, with the reason.
    """
    out: dict = {}
    notes: list[str] = []
    problems: list[str] = []
    steps_win = isinstance(data.get("max_steps"), int) and data["max_steps"] > 0
    methods: dict[tuple[str, str], list[str]] = {}  # one line per method, naming its keys
    for key, value in data.items():
        if key in REPLACED:
            if value not in (None, ""):
                notes.append(f"{key}: {value} {REPLACED[key]}")
            continue
        if key in REFUSED_KEYS:
            problems.append(f"{key}: {REFUSED_KEYS[key]}")
            continue
        found = method_of(str(key))
        if found is not None:
            if value not in (None, False):
                methods.setdefault(found, []).append(str(key))
            continue
        if key == "num_train_epochs" and steps_win:
            if value is not None:
                notes.append(f"num_train_epochs: ignored (max_steps {data['max_steps']} wins, as in LLaMA-Factory)")
            continue
        if key in RESTRICTED:
            allowed, reason = RESTRICTED[key]
            if value not in allowed and not (key == "lr_scheduler_type" and value is None):
                problems.append(f"{key}: {value!r} is not supported ({reason})")
                continue
        if key == "dataset":
            continue
        if key in MAPPED:
            if value is None:
                continue
            target = MAPPED[key]
            if key == "max_steps" and isinstance(value, int) and value <= 0:
                continue  # the HF Trainer's -1: train by epochs
            if key == "template":
                value = _template(value, problems, notes)
            if key == "lr_scheduler_type" and value == "constant_with_warmup":
                value = "constant"
            if key == "report_to":
                value = _report_to(value, notes)
            if key == "save_steps" and isinstance(value, float) and value < 1:
                problems.append("save_steps: a fraction of the run is not supported; give a step count")
                continue
            _set(out, target, value, origin, key)
        elif key in COMBINED or key in IGNORED or key in RESTRICTED:
            if key in IGNORED and value not in (None, False) and key not in RESTRICTED and key != "do_train":
                notes.append(f"{key}: ignored ({IGNORED[key]})")
        elif key in native_keys:
            if key in out and out[key] != value:
                problems.append(f"{key} is given twice (as a memascend key and through a LLaMA-Factory key)")
            out[key] = value
        else:
            guess = did_you_mean(str(key), sorted(set(MAPPED) | set(COMBINED) | set(IGNORED) | native_keys),
                                 cutoff=0.75)
            problems.append(f"unknown key {key!r}" + (f" (did you mean {guess!r}?)" if guess else ""))
    problems += [f"{', '.join(keys)}: {method} is not supported ({reason})" for (method, reason), keys in methods.items()]
    # Local model and tokenizer paths are relative to the current directory in LLaMA-Factory.
    for key in ("model", "tokenizer"):
        value = out.get(key)
        if isinstance(value, str) and not os.path.isabs(value) and os.path.exists(os.path.join(cwd, value)):
            out[key] = os.path.normpath(os.path.join(cwd, value))
    # Precision: LLaMA-Factory trains in fp32 unless bf16/fp16 is set.
    if data.get("bf16") or data.get("pure_bf16"):
        out.setdefault("precision", "bf16")
    elif data.get("fp16"):
        out.setdefault("precision", "fp16")
    else:
        out.setdefault("precision", "fp32")
    if "adam_beta1" in data or "adam_beta2" in data:
        out["adam_betas"] = [float(data.get("adam_beta1", 0.9)), float(data.get("adam_beta2", 0.999))]
    if data.get("disable_gradient_checkpointing"):
        out["gradient_checkpointing"] = False
    if data.get("eval_strategy") == "no":
        out["eval_every"] = 0
    # The final model goes where LLaMA-Factory's trainer.save_model puts it (output_dir), for its inference recipes.
    out.setdefault("export_in_output_dir", True)
    stage = data.get("stage", "sft")
    native_dataset = isinstance(data.get("dataset"), (dict, list)) or (
        isinstance(data.get("dataset"), str) and str(data["dataset"]).endswith(DATA_SUFFIXES))
    if native_dataset:
        out["dataset"] = data["dataset"] if isinstance(data["dataset"], dict) else {"path": data["dataset"]}
    elif data.get("dataset") is not None:
        try:
            ds = dataset_from_info(str(data["dataset"]), data.get("dataset_dir") or "data", recipe_dir=recipe_dir,
                                   cwd=cwd)
        except BadInput as exc:
            problems.append(exc.message + (f" ({exc.hint})" if exc.hint else ""))
        else:
            if stage == "pt" and ds.get("format") != "text":
                ds["format"] = "text"
            out["dataset"] = {**ds, **out.get("dataset", {})}
    else:
        problems.append("dataset is required (names from dataset_info.json)")
    # LLaMA-Factory packs only for pretraining by default.
    if isinstance(out.get("dataset"), dict):
        out["dataset"].setdefault("packing", stage == "pt")
    if problems:
        raise BadInput(f"{origin}: " + "; ".join(problems),
                       "the LLaMA-Factory keys memascend reads and refuses are listed in docs/llama-factory.md")
    return out, notes


def _template(value, problems: list[str], notes: list[str]):
    v = str(value)
    if v in TOKENIZER_TEMPLATES:
        return None  # the tokenizer's own chat template
    if v in PLAIN_TEMPLATES:
        return PLAIN_TEMPLATES[v]
    if v == "plain":
        return v
    if v in LLAMAFACTORY_TEMPLATES:
        notes.append(f"template: {v!r} rendered with the tokenizer's own chat template (LLaMA-Factory's {v} "
                     "rendering is not reproduced; give a .jinja file to use another)")
        return None
    from memascend_cli.userfiles import looks_like_path

    if looks_like_path(v):
        return v
    guess = did_you_mean(v, sorted(LLAMAFACTORY_TEMPLATES))
    problems.append(f"template: {v!r} is not a LLaMA-Factory template" + (f" (did you mean {guess!r}?)" if guess else "")
                    + "; leave it out to use the tokenizer's own chat template, or give a .jinja file")
    return None


REPORTERS = ("tensorboard", "wandb")
"""Sinks memascend writes besides metrics.jsonl (engine/train_worker.py Reporter)."""


def _report_to(value, notes: list[str]) -> list[str]:
    """LLaMA-Factory's report_to: a sink memascend writes is used when its package is installed; anything else is a
    note (metrics.jsonl is always written), never a refusal."""
    import importlib.util

    items = value if isinstance(value, list) else [s.strip() for s in str(value).split(",")]
    out = []
    for item in items:
        if item in ("none", "jsonl", None, ""):
            continue
        names = ["tensorboard"] if item == "all" else [item]
        for name in names:
            if name in REPORTERS and importlib.util.find_spec(name) is not None:
                out.append(name)
            elif name in REPORTERS:
                notes.append(f"report_to: {name!r} skipped: the {name} package is not installed (pip install {name}); "
                             "metrics go to metrics.jsonl")
            else:
                notes.append(f"report_to: {name!r} skipped: memascend writes metrics.jsonl, TensorBoard and "
                             f"wandb, not {name}")
    return ["jsonl", *out]


# --- dataset_info.json ----------------------------------------------------------------------------

DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".txt")
_REMOTE = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")


def _dataset_dir(dataset_dir: str, recipe_dir: str, cwd: str) -> str:
    """LLaMA-Factory resolves dataset_dir against the current directory; the recipe's folder is tried next."""
    if dataset_dir == "ONLINE":
        raise BadInput("dataset_dir: ONLINE datasets need the network; download them and give a local dataset_dir",
                       "see docs/llama-factory.md")
    for base in (cwd, recipe_dir):
        d = dataset_dir if os.path.isabs(dataset_dir) else os.path.join(base, dataset_dir)
        if os.path.isfile(os.path.join(d, "dataset_info.json")):
            return os.path.normpath(d)
    raise BadInput(f"no dataset_info.json in {dataset_dir} (looked in {cwd} and {recipe_dir})",
                   "set dataset_dir to the folder holding dataset_info.json and the data files")


# The hub library each LLaMA-Factory hub key needs, and the variable that makes LLaMA-Factory prefer it over
# hf_hub_url (its extras/misc.py use_modelscope / use_openmind).
_OTHER_HUBS = {"ms_hub_url": ("modelscope", "USE_MODELSCOPE_HUB"), "om_hub_url": ("openmind", "USE_OPENMIND_HUB")}


def _hub_source(name: str, entry: dict, info_path: str) -> dict | None:
    """The memascend `dataset:` keys of a dataset_info.json entry on a hub (hub, subset, split, folder), None for a
    local file, as LLaMA-Factory's data/parser.py chooses the source: hf_hub_url unless USE_MODELSCOPE_HUB /
    USE_OPENMIND_HUB asks for the other hub, or the entry has no hf_hub_url.

    Raises:
        BadInput: a script or cloud dataset, or a ModelScope / Modelers (openmind) one, with the reason.
    """
    import importlib.util

    if entry.get("file_name") or not any(entry.get(k) for k in _REMOTE):
        return None  # a local file (preferred when an entry has both: it needs no network)
    for key, (library, env) in _OTHER_HUBS.items():
        wants = os.environ.get(env, "0").lower() in ("true", "1")
        if entry.get(key) and (wants or not entry.get("hf_hub_url")):
            installed = importlib.util.find_spec(library) is not None
            raise BadInput(f"dataset {name!r} is on {'ModelScope' if library == 'modelscope' else 'Modelers'} "
                           f"({key}: {entry[key]}); memascend loads hub datasets through Hugging Face `datasets` only"
                           + ("" if installed else f" (and the {library} package is not installed)"),
                           (f"unset {env} to use its hf_hub_url" if entry.get("hf_hub_url") else
                            f"download it and add \"file_name\" to its entry in {info_path}"))
    if entry.get("hf_hub_url"):
        out = {"hub": entry["hf_hub_url"], "split": entry.get("split", "train")}
        out.update({k: entry[k] for k in ("subset", "folder") if entry.get(k)})
        return out
    remote = next(k for k in _REMOTE if entry.get(k))
    raise BadInput(f"dataset {name!r} is remote ({remote}); memascend reads local files and Hugging Face hub datasets",
                   f"download it and add \"file_name\" to its entry in {info_path}")


def dataset_from_info(names: str, dataset_dir: str, *, recipe_dir: str, cwd: str) -> dict:
    """memascend `dataset:` mapping for LLaMA-Factory's `dataset: a,b` with `dataset_dir`.

    Several names must share one format (and columns/tags); their files are read in the given order.
    """
    d = _dataset_dir(dataset_dir, recipe_dir, cwd)
    info_path = os.path.join(d, "dataset_info.json")
    try:
        with open(info_path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError) as exc:
        raise BadInput(f"{info_path}: cannot read ({exc})", "fix the JSON") from None
    paths: list[str] = []
    hubs: list[dict] = []
    shape = None
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        entry = info.get(name)
        if not isinstance(entry, dict):
            guess = did_you_mean(name, list(info))
            raise BadInput(f"dataset {name!r} is not in {info_path}" + (f" (did you mean {guess!r}?)" if guess else ""),
                           "add an entry with file_name and formatting")
        hub = _hub_source(name, entry, info_path)
        columns_given = dict(entry.get("columns") or {})
        if entry.get("ranking") or {"chosen", "rejected"} & set(columns_given):
            raise BadInput(f"dataset {name!r} is a preference (ranking) dataset: training on it needs DPO/ORPO/SimPO "
                           "(a chosen and a rejected answer per prompt)", "memascend trains on SFT data only")
        if "kto_tag" in columns_given:
            raise BadInput(f"dataset {name!r} is a KTO dataset (column {columns_given['kto_tag']!r} marks undesirable "
                           "answers, which SFT would learn like the desirable ones)", "memascend trains on SFT data only")
        media = sorted({"images", "videos", "audios"} & set(columns_given))
        if media:
            raise BadInput(f"dataset {name!r} has {' and '.join(media)} (column {columns_given[media[0]]!r}): "
                           "memascend trains text-only language models, and the <image>/<video> placeholders would "
                           "train as text", "use a text-only dataset")
        fmt = entry.get("formatting", "alpaca")
        if fmt not in ("alpaca", "sharegpt"):
            raise BadInput(f"dataset {name!r}: formatting {fmt!r} is not supported", "use alpaca or sharegpt")
        columns = dict(entry.get("columns") or {})
        tags = dict(entry.get("tags") or {})
        this = (fmt, columns, tags)
        if shape is not None and this != shape:
            raise BadInput(f"datasets {names!r} mix formats or columns", "train on datasets of one format at a time")
        shape = this
        if hub is not None:
            hubs.append(hub)
            continue
        target = os.path.join(d, str(entry.get("file_name", "")))
        if os.path.isdir(target):
            files = sorted(os.path.join(target, n) for n in os.listdir(target) if n.endswith(DATA_SUFFIXES))
            if not files:
                raise BadInput(f"dataset {name!r}: folder {target} has no .json/.jsonl/.parquet files",
                               "put the data files there")
            paths += files
        elif os.path.isfile(target):
            paths.append(target)
        else:
            raise BadInput(f"dataset {name!r}: file {target} does not exist", f"fix file_name in {info_path}")
    if shape is None:
        raise BadInput("dataset: no dataset names given", "e.g. dataset: alpaca_en_demo")
    if hubs and (paths or len(hubs) > 1):
        raise BadInput(f"datasets {names!r}: one hub dataset is trained at a time, not with other datasets",
                       "train on the hub dataset alone, or download it and give its entry a file_name")
    fmt, columns, tags = shape
    out: dict = {**(hubs[0] if hubs else {"path": paths if len(paths) > 1 else paths[0]}), "format": fmt}
    if columns:
        out["columns"] = columns
    if tags:
        out["tags"] = tags
    # pretraining text columns
    if columns.get("prompt") and fmt == "alpaca" and set(columns) == {"prompt"}:
        out["text_field"] = columns["prompt"]
    return out
