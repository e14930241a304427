"""Training recipes: one LLaMA-Factory-style YAML file per job, typed, checked, overridable.

A recipe names the model, tokenizer, dataset and the optimisation knobs; `memascend train` turns
it into a plan, a DeepSpeed config and a launch. Relative paths in the file (model directory,
tokenizer, dataset, region) are resolved against the recipe file's folder, so a shipped preset
works from any working directory; `output_dir` is resolved against the current directory, as
LLaMA-Factory and the HF Trainer do.

Pure apart from reading the YAML file: no torch, no DeepSpeed.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from memascend_cli.errors import BadInput, did_you_mean

DATASET_FORMATS = ("alpaca", "sharegpt", "text")
SCHEDULES = ("constant", "cosine", "linear")
PRECISIONS = ("bf16", "fp32", "fp16")


@dataclass(kw_only=True, slots=True)
class DatasetConfig:
    """Where the training text comes from and how it becomes fixed-length sequences."""

    path: str
    """Local JSONL or JSON file (a list of records), or a .txt file; relative to the recipe file."""
    format: str = "alpaca"
    """alpaca ({instruction, input, output}), sharegpt ({conversations: [{from, value}]}) or text."""
    packing: bool = True
    """True: concatenate samples and cut seq_len chunks (no padding waste); False: one padded sample per row."""
    validation_split: float = 0.0
    """Fraction of samples held out for validation loss (0 = none); the split depends only on the seed."""
    text_field: str = "text"
    """Key holding the text in JSONL records when format is text (a .txt file uses one sample per line)."""


@dataclass(kw_only=True, slots=True)
class ScheduleConfig:
    """Learning-rate schedule (DeepSpeed's own schedulers: WarmupLR, WarmupDecayLR, WarmupCosineLR)."""

    name: str = "cosine"
    """constant, cosine or linear (decay to min_lr_ratio x lr at the last step)."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to lr."""
    min_lr_ratio: float = 0.0
    """Final lr as a fraction of lr (cosine and linear)."""


@dataclass(kw_only=True, slots=True)
class Recipe:
    """One fine-tuning job. Required fields have no default."""

    model: str
    """Preset name with random weights (e.g. tiny-llama) or a local Hugging Face model directory (safetensors)."""
    dataset: DatasetConfig
    """Training data."""
    tokenizer: str | None = None
    """tokenizer.json file or a local tokenizer directory; None = the model directory."""
    output_dir: str = "runs/memascend"
    """Run directory: config, metrics, checkpoints, export and (by default) the SSD region file."""
    seq_len: int = 512
    """Tokens per sequence."""
    micro_batch: int = 1
    """Sequences per rank per forward/backward."""
    grad_accum: int = 1
    """Micro-batches accumulated per optimizer step."""
    steps: int | None = None
    """Optimizer steps to run; None = derive from epochs."""
    epochs: float | None = None
    """Passes over the training split (used when steps is None; default 1)."""
    lr: float = 1e-4
    """Peak learning rate (AdamW)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 = off)."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Learning-rate schedule."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward (the memascend engine offloads the checkpoints to host memory)."""
    precision: str = "bf16"
    """bf16, fp32 or fp16 (fp32 makes resume checks bit-exact and is the slowest)."""
    seed: int = 0
    """Seeds model init, data order and the validation split."""
    region: str | None = None
    """Prepared SSD region (file or device) for the memascend engine; None = create a region file in output_dir."""
    region_size: str | None = None
    """Size of the region file created when region is None, e.g. 2GiB; None = what the plan needs plus 25%."""
    swap_dir: str | None = None
    """--baseline only: folder for stock DeepSpeed's swap files; None = output_dir/swap (must allow O_DIRECT)."""
    log_every: int = 1
    """Optimizer steps between metrics lines (metrics.jsonl and the live display)."""
    eval_every: int = 0
    """Optimizer steps between validation losses (0 = only at the end, if there is a validation split)."""
    checkpoint_every: int = 0
    """Optimizer steps between resumable checkpoints (0 = only at the end and on Ctrl-C)."""
    keep_checkpoints: int = 2
    """Newest complete checkpoints kept; older ones are deleted after a new one completes."""
    export: bool = True
    """Write a Hugging Face model directory (config.json + safetensors) to output_dir/export at the end."""
    ranks: int | None = None
    """Processes per node; None = one per GPU, or 1 on a CPU-only machine (more CPU ranks use gloo)."""
    hostfile: str | None = None
    """DeepSpeed hostfile for multi-node runs (`host slots=N` per line)."""
    num_nodes: int | None = None
    """Nodes to use from the hostfile (DeepSpeed's --num_nodes); None = all."""
    master_port: int | None = None
    """Rendezvous port of rank 0; None = a free port picked at launch (two jobs on a node never collide)."""

    def __post_init__(self):
        problems = validate(self)
        if problems:
            raise BadInput("recipe: " + "; ".join(problems), "fix the recipe file or the --set value")

    def to_dict(self) -> dict:
        """Plain JSON-ready dict (the worker reads this back with recipe_from_dict)."""
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        return d


def validate(r: Recipe) -> list[str]:
    """Every problem with the values (not the keys), one phrase each, naming the key."""
    p: list[str] = []
    if not r.model:
        p.append("model must be a preset name or a model directory")
    if r.dataset.format not in DATASET_FORMATS:
        p.append(f"dataset.format {r.dataset.format!r} is not one of {', '.join(DATASET_FORMATS)}")
    if not 0.0 <= r.dataset.validation_split < 1.0:
        p.append(f"dataset.validation_split must be in [0, 1), got {r.dataset.validation_split}")
    for key in ("seq_len", "micro_batch", "grad_accum", "log_every"):
        if getattr(r, key) < 1:
            p.append(f"{key} must be at least 1, got {getattr(r, key)}")
    for key in ("checkpoint_every", "eval_every"):
        if getattr(r, key) < 0:
            p.append(f"{key} must not be negative, got {getattr(r, key)}")
    if r.keep_checkpoints < 1:
        p.append(f"keep_checkpoints must be at least 1, got {r.keep_checkpoints}")
    if r.steps is not None and r.steps < 1:
        p.append(f"steps must be at least 1, got {r.steps}")
    if r.epochs is not None and r.epochs <= 0:
        p.append(f"epochs must be positive, got {r.epochs}")
    if r.steps is not None and r.epochs is not None:
        p.append("give steps or epochs, not both")
    if not r.lr > 0:
        p.append(f"lr must be positive, got {r.lr}")
    if r.weight_decay < 0 or r.max_grad_norm < 0:
        p.append("weight_decay and max_grad_norm must not be negative")
    if len(r.adam_betas) != 2 or not all(0 <= b < 1 for b in r.adam_betas):
        p.append(f"adam_betas must be two numbers in [0, 1), got {list(r.adam_betas)}")
    if r.schedule.name not in SCHEDULES:
        p.append(f"schedule.name {r.schedule.name!r} is not one of {', '.join(SCHEDULES)}")
    if r.schedule.warmup_steps < 0:
        p.append(f"schedule.warmup_steps must not be negative, got {r.schedule.warmup_steps}")
    if not 0.0 <= r.schedule.min_lr_ratio <= 1.0:
        p.append(f"schedule.min_lr_ratio must be in [0, 1], got {r.schedule.min_lr_ratio}")
    if r.precision not in PRECISIONS:
        p.append(f"precision {r.precision!r} is not one of {', '.join(PRECISIONS)}")
    if r.ranks is not None and r.ranks < 1:
        p.append(f"ranks must be at least 1, got {r.ranks}")
    if r.num_nodes is not None and r.num_nodes < 1:
        p.append(f"num_nodes must be at least 1, got {r.num_nodes}")
    if r.num_nodes not in (None, 1) and not r.hostfile:
        p.append("num_nodes > 1 needs a hostfile")
    if r.master_port is not None and not 1 <= r.master_port <= 65535:
        p.append(f"master_port must be a TCP port, got {r.master_port}")
    return p


# --- reading ------------------------------------------------------------------------------------

_NESTED = {"dataset": DatasetConfig, "schedule": ScheduleConfig}
# Paths resolved against the recipe file's folder (output_dir is resolved against the cwd).
_RECIPE_RELATIVE = ("tokenizer", "region", "swap_dir", "hostfile")


def _field_types(cls) -> dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def _coerce(key: str, value: Any, type_text: str, problems: list[str]) -> Any:
    """Check one scalar against its annotation; YAML ints are accepted for floats."""
    optional = "None" in type_text
    base = type_text.replace(" | None", "").strip()
    if value is None:
        if not optional:
            problems.append(f"{key} must not be empty")
        return value
    if base == "bool":
        if not isinstance(value, bool):
            problems.append(f"{key} must be true or false, got {value!r}")
        return value
    if base == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{key} must be a whole number, got {value!r}")
        return value
    if base == "float":
        if isinstance(value, str):
            # YAML 1.1 reads 3e-4 (no dot) as a string; accept any float literal.
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{key} must be a number, got {value!r}")
            return value
        return float(value)
    if base == "str":
        if not isinstance(value, str):
            problems.append(f"{key} must be a string, got {value!r}")
        return value
    if base.startswith("tuple"):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            problems.append(f"{key} must be a list of numbers, got {value!r}")
            return value
        return tuple(float(v) for v in value)
    return value


def _build(cls, data: Any, prefix: str, problems: list[str]) -> dict:
    """Checked keyword arguments for `cls` from a mapping; unknown keys collected into problems."""
    if not isinstance(data, dict):
        problems.append(f"{prefix.rstrip('.') or 'the recipe'} must be a mapping of keys, got {type(data).__name__}")
        return {}
    types = _field_types(cls)
    kw: dict = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in types:
            guess = did_you_mean(str(key), list(types))
            problems.append(f"unknown key {name!r}" + (f" (did you mean {prefix}{guess!r}?)" if guess else ""))
            continue
        if key in _NESTED:
            if isinstance(value, str) and key == "dataset":
                value = {"path": value}  # `dataset: data.jsonl` is shorthand for {path: data.jsonl}
            if isinstance(value, str) and key == "schedule":
                value = {"name": value}
            sub = _build(_NESTED[key], value, f"{name}.", problems)
            try:
                kw[key] = _NESTED[key](**sub)
            except TypeError as exc:
                problems.append(f"{name}: {exc}".replace("__init__() ", ""))
            continue
        kw[key] = _coerce(name, value, types[key], problems)
    return kw


def recipe_from_dict(data: dict, *, origin: str = "recipe") -> Recipe:
    """A Recipe from a mapping; every problem (unknown keys, wrong types, bad values) in one error.

    Raises:
        BadInput: naming `origin` (the file) and each offending key.
    """
    problems: list[str] = []
    kw = _build(Recipe, data, "", problems)
    for required in ("model", "dataset"):
        if required not in kw and not any(required in p for p in problems):
            problems.append(f"{required} is required")
    if not problems:
        try:
            return Recipe(**kw)
        except BadInput as exc:
            problems.append(exc.message.removeprefix("recipe: "))
        except TypeError as exc:
            problems.append(str(exc).replace("__init__() ", ""))
    if problems:
        raise BadInput(f"{origin}: " + "; ".join(problems),
                       "keys: " + ", ".join(_field_types(Recipe)) + " (see presets/train/tiny-cpu.yaml)")
    return Recipe(**kw)


def parse_set(assignments: list[str]) -> dict:
    """`--set a.b=c` strings -> nested dict; values are read as YAML scalars (3e-4, true, null, [0.9, 0.95])."""
    import yaml

    out: dict = {}
    for text in assignments:
        if "=" not in text:
            raise BadInput(f"--set {text!r} is not KEY=VALUE", "e.g. --set dataset.packing=false --set lr=3e-4")
        key, raw = text.split("=", 1)
        key = key.strip()
        if not key:
            raise BadInput(f"--set {text!r} has no key", "e.g. --set steps=20")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str):
            try:
                value = float(value)  # YAML 1.1 reads 3e-4 as a string
            except ValueError:
                pass
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise BadInput(f"--set {text!r} conflicts with another --set of {part}", "give each key once")
        node[parts[-1]] = value
    return out


def merge(base: dict, override: dict) -> dict:
    """Deep merge: mappings merge key by key, everything else is replaced."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        elif isinstance(v, dict) and isinstance(out.get(k), str) and k == "dataset":
            out[k] = merge({"path": out[k]}, v)
        else:
            out[k] = v
    return out


def resolve_recipe_path(name_or_path: str) -> str:
    """A recipe file path, or the name of a shipped preset (presets/train/<name>.yaml)."""
    if os.path.exists(name_or_path):
        return name_or_path
    if os.sep not in name_or_path and not name_or_path.endswith((".yaml", ".yml")):
        from memascend_presets import preset_dir

        candidate = preset_dir("train") / f"{name_or_path}.yaml"
        if candidate.is_file():
            return str(candidate)
        names = sorted(p.name[:-5] for p in preset_dir("train").iterdir() if p.name.endswith(".yaml"))
        guess = did_you_mean(name_or_path, names)
        raise BadInput(f"no recipe file or preset named {name_or_path!r}",
                       (f"did you mean {guess}? " if guess else "") + "presets: " + ", ".join(names))
    raise BadInput(f"recipe file {name_or_path} does not exist", "give a recipe YAML, e.g. presets/train/tiny-cpu.yaml")


def _absolutize(data: dict, base_dir: str) -> dict:
    """Resolve the recipe-relative paths of a raw mapping against `base_dir`."""
    out = dict(data)

    def fix(p):
        return p if not isinstance(p, str) or os.path.isabs(p) else os.path.normpath(os.path.join(base_dir, p))

    for key in _RECIPE_RELATIVE:
        if isinstance(out.get(key), str):
            out[key] = fix(os.path.expanduser(out[key]))
    model = out.get("model")
    # A model is a path (not a preset name) when it looks like one or exists next to the recipe.
    if isinstance(model, str) and (model.startswith((".", "/", "~")) or os.sep in model):
        out["model"] = fix(os.path.expanduser(model))
    ds = out.get("dataset")
    if isinstance(ds, str):
        out["dataset"] = fix(os.path.expanduser(ds))
    elif isinstance(ds, dict) and isinstance(ds.get("path"), str):
        out["dataset"] = {**ds, "path": fix(os.path.expanduser(ds["path"]))}
    return out


def load_recipe(path: str, overrides: dict | None = None) -> Recipe:
    """Read a recipe YAML, apply overrides (already nested), resolve paths, check everything.

    Overrides given on the command line are relative to the current directory, like any CLI path.
    """
    import yaml

    path = resolve_recipe_path(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInput(f"{path}: not valid YAML{where} ({getattr(exc, 'problem', None) or exc})",
                       "fix the syntax; every line is `key: value`") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a mapping of recipe keys, got {type(data).__name__}",
                       "see presets/train/tiny-cpu.yaml")
    data = _absolutize(data, os.path.dirname(os.path.abspath(path)))
    if overrides:
        data = merge(data, _absolutize(overrides, os.getcwd()))
    if isinstance(data.get("output_dir"), str):
        data["output_dir"] = os.path.abspath(os.path.expanduser(data["output_dir"]))
    return recipe_from_dict(data, origin=path)


def recipe_from_json_dict(data: dict) -> Recipe:
    """The worker's reader for run_dir/recipe.json (already resolved and checked once)."""
    return recipe_from_dict(data, origin="recipe.json")


def total_steps(r: Recipe, num_train_sequences: int, world_size: int) -> int:
    """Optimizer steps of the run: `steps`, or epochs x sequences / global batch (at least 1)."""
    if r.steps is not None:
        return r.steps
    per_step = r.micro_batch * r.grad_accum * world_size
    return max(1, int((r.epochs or 1.0) * num_train_sequences // per_step))
