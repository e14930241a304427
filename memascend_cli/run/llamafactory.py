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
    "dataset": "dataset.path and format, from dataset_info.json in dataset_dir",
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
    "cache_dir": "no downloads happen (models are local)",
    "optim": "only adamw_torch / adamw_hf / adamw_torch_fused (DeepSpeed's AdamW)",
    "lora_rank": "LoRA settings have no effect with finetuning_type: full",
    "lora_alpha": "LoRA settings have no effect with finetuning_type: full",
    "lora_dropout": "LoRA settings have no effect with finetuning_type: full",
    "lora_target": "LoRA settings have no effect with finetuning_type: full",
    "do_eval": "validation runs when val_size is set",
    "streaming": "only false; the tokenized cache is memory-mapped, so data never has to fit in memory",
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
    "streaming": ((False,), "the tokenized cache is memory-mapped instead; set streaming: false"),
    "optim": (("adamw_torch", "adamw_hf", "adamw_torch_fused"), "memascend trains with DeepSpeed's AdamW"),
    "eval_strategy": (("no", "steps"), "validation runs every eval_steps steps (eval_strategy: steps) or at the end"),
    "do_predict": ((False,), "memascend trains; generate with the exported model"),
    "enable_liger_kernel": ((False,), "Liger kernels are not used by memascend's trainer"),
    "neat_packing": ((False,), "packing without cross-attention between samples is not implemented; "
                               "use packing: true or false"),
    "lr_scheduler_type": (("cosine", "linear", "constant", "constant_with_warmup"),
                          "DeepSpeed's schedulers cover cosine, linear and constant (with warm-up)"),
}

REFUSED_KEYS = {
    "deepspeed": "memascend generates the DeepSpeed config (ZeRO-3, params and optimizer on the SSD) from the plan; "
                 "delete the `deepspeed:` line",
    "adapter_name_or_path": "adapters are not supported (full fine-tuning only)",
    "eval_dataset": "a separate validation dataset is not supported; use val_size",
    "quantization_bit": "quantized training (QLoRA) is not supported",
    "use_unsloth": "unsloth is not used",
    "fsdp": "memascend uses DeepSpeed ZeRO-3, not FSDP",
}

# LLaMA-Factory template names whose official chat template the model's tokenizer carries; memascend
# uses the tokenizer's own template for them (LLaMA-Factory's templates reproduce the official ones).
TOKENIZER_TEMPLATES = {"default", "qwen", "qwen2_vl", "qwen3", "llama2", "llama3", "llama4", "mistral", "gemma",
                       "gemma2", "gemma3", "phi", "phi4", "chatml", "chatml_de", "deepseek", "deepseek3", "yi",
                       "smollm", "smollm2", "zephyr", "vicuna", "granite3", "olmo", "cohere", "glm4", "baichuan2"}
PLAIN_TEMPLATES = {"empty": "plain", "alpaca": "plain"}

LF_ONLY_KEYS = set(MAPPED) | set(COMBINED) | set(IGNORED) | set(RESTRICTED) | set(REFUSED_KEYS) | {"do_predict"}
LF_ONLY_KEYS -= {"template", "output_dir", "seed", "report_to", "weight_decay", "max_grad_norm",
                 "overwrite_output_dir", "dataset"}


def is_llamafactory(data: dict) -> bool:
    """True when the mapping uses LLaMA-Factory's keys (model_name_or_path, cutoff_len, stage, ...)."""
    return any(k in LF_ONLY_KEYS for k in data)


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
    for key, value in data.items():
        if key in REFUSED_KEYS:
            if key == "deepspeed" and value in (None, ""):
                continue
            problems.append(f"{key}: {REFUSED_KEYS[key]}")
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
                value = _template(value, problems)
            if key == "lr_scheduler_type" and value == "constant_with_warmup":
                value = "constant"
            if key == "report_to":
                value = _report_to(value, problems)
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


def _template(value, problems: list[str]):
    v = str(value)
    if v in TOKENIZER_TEMPLATES:
        return None  # the tokenizer's own chat template
    if v in PLAIN_TEMPLATES:
        return PLAIN_TEMPLATES[v]
    if v == "plain":
        return v
    from memascend_cli.userfiles import looks_like_path

    if looks_like_path(v):
        return v
    problems.append(f"template: {v!r} is not known to memascend (use the tokenizer's own chat template by "
                    f"leaving it out, or one of {', '.join(sorted(TOKENIZER_TEMPLATES))})")
    return None


def _report_to(value, problems: list[str]) -> list[str]:
    items = value if isinstance(value, list) else [s.strip() for s in str(value).split(",")]
    out = []
    for item in items:
        if item in ("none", "jsonl"):
            continue
        if item == "tensorboard":
            out.append(item)
        elif item == "all":
            out.append("tensorboard")
        else:
            problems.append(f"report_to: {item!r} is not supported (tensorboard or none; metrics.jsonl is always "
                            "written, and nothing leaves the machine)")
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
    shape = None
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        entry = info.get(name)
        if not isinstance(entry, dict):
            guess = did_you_mean(name, list(info))
            raise BadInput(f"dataset {name!r} is not in {info_path}" + (f" (did you mean {guess!r}?)" if guess else ""),
                           "add an entry with file_name and formatting")
        remote = [k for k in _REMOTE if entry.get(k)]
        if remote and not entry.get("file_name"):
            raise BadInput(f"dataset {name!r} is remote ({remote[0]}); memascend reads local files only",
                           f"download it and add \"file_name\" to its entry in {info_path}")
        if entry.get("ranking"):
            raise BadInput(f"dataset {name!r} is a preference (ranking) dataset", "memascend trains on SFT data only")
        fmt = entry.get("formatting", "alpaca")
        if fmt not in ("alpaca", "sharegpt"):
            raise BadInput(f"dataset {name!r}: formatting {fmt!r} is not supported", "use alpaca or sharegpt")
        columns = dict(entry.get("columns") or {})
        tags = dict(entry.get("tags") or {})
        this = (fmt, columns, tags)
        if shape is not None and this != shape:
            raise BadInput(f"datasets {names!r} mix formats or columns", "train on datasets of one format at a time")
        shape = this
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
    fmt, columns, tags = shape
    out: dict = {"path": paths if len(paths) > 1 else paths[0], "format": fmt}
    if columns:
        out["columns"] = columns
    if tags:
        out["tags"] = tags
    # pretraining text columns
    if columns.get("prompt") and fmt == "alpaca" and set(columns) == {"prompt"}:
        out["text_field"] = columns["prompt"]
    return out
