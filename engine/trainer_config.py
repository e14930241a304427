"""DeepSpeed configs written for Hugging Face-style trainers: `"auto"` values, the Trainer's own copy of the config,
and offload that never reaches the SSD.

The HF Trainer fills `"auto"` in two stages (transformers/integrations/deepspeed.py, HfTrainerDeepSpeedConfig):
`trainer_config_process` at TrainingArguments time (batch sizes, lr, betas, dtype) on a deep copy of the user's dict
(HfDeepSpeedConfig.__init__), and `trainer_config_finalize` right before `deepspeed.initialize` (the hidden-size
based ZeRO keys and the scheduler steps). So a dict rewritten by install() after TrainingArguments is not the one
the Trainer uses, and a dict rewritten before it can still hold `"auto"` in `zero_optimization`.

The pure helpers here are torch-free; `hf_live_config` only looks at transformers when a script already imported it.
"""

from __future__ import annotations

import sys
from typing import Any

AUTO = "auto"

HIDDEN_SIZE_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
"""The `zero_optimization` keys HF fills from the model's hidden size (trainer_config_finalize)."""


def setting_names(keys) -> set[str]:
    """The memascend_cli.planner.zero.ZeroSettings names of `zero_optimization` keys (DeepSpeed's 'stage3_' prefix
    dropped)."""
    return {key.removeprefix("stage3_") for key in keys}


def auto_paths(cfg: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every `"auto"` value in `cfg` (e.g. 'zero_optimization.reduce_bucket_size')."""
    if isinstance(cfg, dict):
        return [p for k, v in cfg.items() for p in auto_paths(v, f"{prefix}{k}.")]
    return [prefix[:-1]] if cfg == AUTO else []


def zero_auto_paths(cfg: dict) -> list[str]:
    """The `"auto"` values that memascend's ZeRO knobs read (zero_optimization and aio)."""
    return [p for p in auto_paths(cfg) if p.split(".")[0] in ("zero_optimization", "aio")]


def hidden_size_values(hidden_size: int, *, zero3: bool) -> dict[str, int]:
    """What HF's trainer_config_finalize writes for the hidden-size keys (transformers 4.x-5.x: h*h, 0.9*h*h, 10*h;
    the last two only under ZeRO-3)."""
    h = int(hidden_size)
    values = {"reduce_bucket_size": h * h}
    if zero3:
        values.update(stage3_prefetch_bucket_size=int(0.9 * h * h), stage3_param_persistence_threshold=10 * h)
    return values


def check_zero_auto(cfg: dict) -> list[str]:
    """The `"auto"` ZeRO paths; ValueError for one that neither DeepSpeed nor the HF Trainer fills (it would reach
    DeepSpeed as a string, which fails later with a bare 'could not convert string to float')."""
    paths = zero_auto_paths(cfg)
    unknown = [p for p in paths if p.removeprefix("zero_optimization.") not in HIDDEN_SIZE_KEYS]
    if unknown:
        raise ValueError(f"'auto' is not a value DeepSpeed or the Hugging Face Trainer fills for {', '.join(unknown)}; "
                         "give a number")
    return paths


def resolve_zero_auto(cfg: dict, hidden_size: int | None) -> dict[str, dict]:
    """Fill the `"auto"` ZeRO keys in place as the HF integration would; returns {path: {"from", "to"}}.

    Raises ValueError for an `"auto"` HF never fills (it would reach DeepSpeed as a string) and, without a hidden
    size, for the hidden-size keys."""
    zo = cfg.get("zero_optimization") or {}
    paths = check_zero_auto(cfg)
    if not paths:
        return {}
    if hidden_size is None:
        raise ValueError(f"{', '.join(paths)} are 'auto' and the model's hidden size is unknown")
    values = hidden_size_values(hidden_size, zero3=int(zo.get("stage", 0) or 0) == 3)
    changes = {}
    for path in paths:
        key = path.removeprefix("zero_optimization.")
        if key in values:
            zo[key] = values[key]
            changes[path] = {"from": AUTO, "to": values[key]}
    return changes


def model_hidden_size(model: Any) -> int | None:
    """The hidden size HF reads from a transformers model (trainer_config_finalize's order), or None."""
    config = getattr(model, "config", None)
    for c in (config, getattr(config, "text_config", None)):
        if c is None:
            continue
        if getattr(c, "hidden_size", None):
            return int(c.hidden_size)
        if getattr(c, "hidden_sizes", None):
            return int(max(c.hidden_sizes))
    return None


def offload_devices(cfg: dict) -> dict[str, str]:
    """{'offload_param' / 'offload_optimizer': device} for the offload sections the config has."""
    zo = cfg.get("zero_optimization") or {}
    return {name: str((zo.get(name) or {}).get("device") or "none") for name in ("offload_param", "offload_optimizer")
            if zo.get(name)}


def move_offload_to_nvme(cfg: dict) -> dict[str, dict]:
    """Under ZeRO-3, point both offload sections at NVMe (creating them where missing, keeping their other keys);
    returns {section.device: {"from", "to"}}. Params and optimizer states then live in the region, which is what
    install() with a region is for; DeepSpeed's CPU offload keeps them all in host memory."""
    zo = cfg.setdefault("zero_optimization", {})
    changes = {}
    for name in ("offload_param", "offload_optimizer"):
        section = zo.get(name) or {}
        before = section.get("device") or "none"
        if before != "nvme":
            section["device"] = "nvme"
            zo[name] = section
            changes[f"{name}.device"] = {"from": before, "to": "nvme"}
    return changes


def zero_stage(cfg: dict) -> int:
    return int((cfg.get("zero_optimization") or {}).get("stage", 0) or 0)


def hf_live_config() -> dict | None:
    """The dict the HF Trainer will hand to DeepSpeed, when a TrainingArguments with `deepspeed=` exists in this
    process (transformers keeps a weak reference to its HfTrainerDeepSpeedConfig); None otherwise. Never imports
    transformers."""
    mod = sys.modules.get("transformers.integrations.deepspeed")
    ref = getattr(mod, "_hf_deepspeed_config_weak_ref", None) if mod else None
    obj = ref() if ref is not None else None
    config = getattr(obj, "config", None)
    return config if isinstance(config, dict) else None


def initialize_config(kwargs: dict) -> dict | None:
    """The config dict a `deepspeed.initialize(...)` call passes (keyword `config` or `config_params`; a path or
    `args.deepspeed_config` is read by DeepSpeed itself and left alone), or None."""
    for key in ("config", "config_params"):
        if isinstance(kwargs.get(key), dict):
            return kwargs[key]
    return None
