"""Training recipes: one YAML file per job, validated with pydantic, overridable.

A recipe names the model, tokenizer, dataset and the optimisation knobs; `memascend train` turns
it into a plan, a DeepSpeed config and a launch, and `memascend plan RECIPE` plans exactly that job
(`memascend_cli.run.prepared.job_spec` is the one place a recipe becomes a planner JobSpec). Relative paths in the file
(model directory, tokenizer, dataset, region) are resolved against the recipe file's folder, so a
shipped preset works from any working directory; `output_dir` is resolved against the current
directory, as LLaMA-Factory and the HF Trainer do. LLaMA-Factory's own SFT keys are translated by
`memascend_cli.run.llamafactory` before validation (docs/llama-factory.md).

Pure apart from reading the YAML file: no torch, no DeepSpeed.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from memascend_cli.defaults import (
    DEFAULT_CHUNKED_LOSS,
    DEFAULT_GRAD_ACCUM,
    DEFAULT_GRADIENT_CHECKPOINTING,
    DEFAULT_MICRO_BATCH,
    DEFAULT_OUTPUT_DIR,
    DEFAULT_PRECISION,
    DEFAULT_SEQ_LEN,
)
from memascend_cli.errors import BadInput, did_you_mean
from memascend_cli.userfiles import looks_like_path


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


_HUB_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class DatasetConfig(_Strict):
    """Where the training text comes from and how it becomes fixed-length sequences."""

    path: str | list[str] | None = None
    """Local JSONL, JSON (a list of records), Parquet or .txt file(s); relative to the recipe file. Give path or hub."""
    hub: str | None = None
    """A dataset repo on the Hugging Face hub (org/name), loaded with `datasets.load_dataset` into its cache (with
    HF_HUB_OFFLINE, from the cache only), then tokenized like a local file."""
    subset: str | None = None
    """hub: the dataset's configuration (load_dataset's name)."""
    split: str = "train"
    """hub: the split trained on."""
    folder: str | None = None
    """hub: the repo folder holding the data files (load_dataset's data_dir)."""
    format: Literal["alpaca", "sharegpt", "text"] = "alpaca"
    """alpaca ({instruction, input, output}), sharegpt ({conversations: [{from, value}]} or OpenAI
    {messages: [{role, content}]}) - both rendered with the chat template - or text (pretraining)."""
    packing: bool = True
    """True: concatenate samples and cut seq_len chunks (no padding waste); False: one padded sample per row."""
    validation_split: float = Field(0.0, ge=0.0)
    """Held-out samples for the validation loss: a fraction in [0, 1), or a count >= 1; seeded."""
    text_field: str = "text"
    """Key holding the text in records when format is text (a .txt file uses one sample per line)."""
    columns: dict[str, str] = Field(default_factory=dict)
    """Column names as in LLaMA-Factory's dataset_info.json (prompt, query, response, system, history, messages, text)."""
    tags: dict[str, str] = Field(default_factory=dict)
    """sharegpt role/content tags as in dataset_info.json (role_tag, content_tag, user_tag, assistant_tag, system_tag)."""
    max_samples: int | None = Field(None, ge=1)
    """Use only the first N samples of each file."""
    cache_dir: str | None = None
    """Where tokenized data is cached (memory-mapped by the ranks); None = $MEMASCEND_CACHE or ~/.cache/memascend.
    Several nodes: a folder every node sees (as output_dir must be)."""
    overwrite_cache: bool = False
    """Tokenize again even when a cache for the same inputs exists."""

    @field_validator("validation_split")
    @classmethod
    def _split(cls, v: float) -> float:
        if v >= 1.0 and v != int(v):
            raise ValueError(f"must be a fraction in [0, 1) or a whole count, got {v}")
        return v

    @model_validator(mode="after")
    def _source(self):
        if (self.path is None) == (self.hub is None):
            raise ValueError("give path (local files) or hub (a hub dataset repo), one of them")
        if self.hub is not None and not _HUB_REPO.fullmatch(self.hub):
            raise ValueError(f"hub must be a hub dataset repo id (org/name), got {self.hub!r}")
        return self

    @property
    def paths(self) -> list[str]:
        """The local files ([] for a hub dataset)."""
        if self.path is None:
            return []
        return [self.path] if isinstance(self.path, str) else list(self.path)


class ScheduleConfig(_Strict):
    """Learning-rate schedule (DeepSpeed's own schedulers: WarmupLR, WarmupDecayLR, WarmupCosineLR)."""

    name: Literal["constant", "cosine", "linear"] = "cosine"
    """constant, cosine or linear (decay to min_lr_ratio x lr at the last step)."""
    warmup_steps: int = Field(0, ge=0)
    """Optimizer steps of linear warm-up from 0 to lr."""
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    """Warm-up as a fraction of the run's steps (used when warmup_steps is 0)."""
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """Final lr as a fraction of lr (cosine and linear)."""


class Recipe(_Strict):
    """One fine-tuning job. Required fields have no default."""

    model: str
    """Preset name with random weights (e.g. tiny-llama), a local Hugging Face model directory
    (safetensors), a .gguf file (converted once into a cached model directory), or
    package:MODULE/FILE for a file shipped in an installed Python package."""
    dataset: DatasetConfig
    """Training data."""
    tokenizer: str | None = None
    """Tokenizer directory (AutoTokenizer) or a tokenizer.json file; None = the model directory."""
    revision: str | None = None
    """Hub model ids: the branch, tag or commit of the repo (None = main); the commit trained is recorded in
    output_dir/sources.json."""
    template: str | None = None
    """Chat template: None = the tokenizer's own; chatml, llama3 or plain (built in); or a .jinja file."""
    output_dir: str = DEFAULT_OUTPUT_DIR
    """Run directory: config, metrics, checkpoints, the final model (in export/, or here with export_in_output_dir)
    and (by default) the SSD region file."""
    seq_len: int = Field(DEFAULT_SEQ_LEN, ge=1)
    """Tokens per sequence (longer samples are cut)."""
    micro_batch: int = Field(DEFAULT_MICRO_BATCH, ge=1)
    """Sequences per rank per forward/backward."""
    grad_accum: int = Field(DEFAULT_GRAD_ACCUM, ge=1)
    """Micro-batches accumulated per optimizer step."""
    steps: int | None = Field(None, ge=1)
    """Optimizer steps to run; None = derive from epochs."""
    epochs: float | None = Field(None, gt=0)
    """Passes over the training split (used when steps is None; default 1)."""
    lr: float = Field(1e-4, gt=0)
    """Peak learning rate (AdamW)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)."""
    max_grad_norm: float = Field(1.0, ge=0)
    """Gradient clipping by global norm (0 = off)."""
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    """Learning-rate schedule."""
    gradient_checkpointing: bool = DEFAULT_GRADIENT_CHECKPOINTING
    """Recompute activations in backward (the memascend engine offloads the checkpoints, see checkpoint_offload)."""
    chunked_loss: bool = DEFAULT_CHUNKED_LOSS
    """lm_head + cross-entropy a 64 MiB chunk of fp32 logits at a time (memascend_engine.chunked_loss): no
    b x s x V logits, which dominate host memory at long context; false = transformers' own loss."""
    checkpoint_offload: Literal["ssd", "dram"] = "ssd"
    """Where the memascend engine keeps activation checkpoints: ssd (a few layers' window in DRAM, the rest on the
    region) or dram (one pinned buffer per layer)."""
    overlap_optimizer: bool = True
    """The memascend engine steps the optimizer during the last micro-batch's backward (exact; 12 B/param more SSD
    space for the speculative states); false: after backward, as stock does."""
    optimizer_moments: Literal["fp32", "bf16"] = "fp32"
    """Adam's exp_avg / exp_avg_sq on the SSD with the memascend engine: fp32, or bf16 (8 B per parameter less SSD
    traffic per step, rounded stochastically; opt-in until the quality check in docs/results.md says otherwise)."""
    host_budget: str | None = None
    """memascend's pinned + staging host memory per rank, e.g. 4GiB, split between the parameter pool, optimizer
    pipeline, gradient and checkpoint windows; with gradient accumulation, what is left over holds the accumulated
    gradients in DRAM (written to the SSD once per step). None = what full overlap needs. Below the minimum: refused."""
    precision: Literal["bf16", "fp32", "fp16"] = DEFAULT_PRECISION
    """bf16, fp32 or fp16 (fp32 makes resume checks bit-exact and is the slowest)."""
    seed: int = 0
    """Seeds model init, data order and the validation split."""
    placement: Literal["gpu", "dram", "split", "ssd"] | None = None
    """Where the job's states live (`--placement`, which wins): gpu, dram, split or ssd; None = the plan's fastest
    placement that fits for the engine."""
    region: str | None = None
    """Prepared SSD region (file or device) for the memascend engine; None = create a region file in output_dir."""
    region_size: str | None = None
    """Size of the region file created when region is None, e.g. 2GiB; None = what the plan needs plus 25%."""
    swap_dir: str | None = None
    """Stock DeepSpeed only (--engine tuned or stock): its swap directory; None = output_dir/swap (must allow O_DIRECT)."""
    log_every: int = Field(1, ge=1)
    """Optimizer steps between metrics lines (metrics.jsonl, TensorBoard and the live display)."""
    eval_every: int = Field(0, ge=0)
    """Optimizer steps between validation losses (0 = only at the end, if there is a validation split)."""
    checkpoint_every: int = Field(0, ge=0)
    """Optimizer steps between resumable checkpoints (0 = only at the end and on Ctrl-C)."""
    keep_checkpoints: int = Field(2, ge=1)
    """Newest complete checkpoints kept; older ones are deleted after a new one completes."""
    export: bool = True
    """Write the final model, a Hugging Face model directory (weights, config, tokenizer with the chat template,
    generation config), to output_dir/export (or output_dir itself, see export_in_output_dir)."""
    export_in_output_dir: bool = False
    """Write the final model into output_dir itself, beside the run's files, as LLaMA-Factory and the HF Trainer do
    (set for every LLaMA-Factory recipe, so its inference recipes and from_pretrained(output_dir) find it)."""
    report_to: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(default_factory=lambda: ["jsonl", "tensorboard"])
    """Metrics sinks: jsonl (output_dir/metrics.jsonl, always written: the live view reads it), tensorboard (event
    files in output_dir/tensorboard) and wandb (Weights & Biases; WANDB_MODE=offline keeps it on the machine)."""
    overwrite_output_dir: bool = False
    """Start afresh in an output_dir that holds an earlier run or model (its checkpoints, metrics and final model are
    deleted); without it such an output_dir is refused (--resume continues the run)."""
    ranks: int | None = Field(None, ge=1)
    """Processes per node; None = one per GPU, or 1 on a CPU-only machine (more CPU ranks use gloo)."""
    hostfile: str | None = None
    """DeepSpeed hostfile for multi-node runs (`host slots=N` per line)."""
    num_nodes: int | None = Field(None, ge=1)
    """Nodes to use from the hostfile (DeepSpeed's --num_nodes); None = all."""
    master_port: int | None = Field(None, ge=1, le=65535)
    """Rendezvous port of rank 0; None = a free port picked at launch (two jobs on a node never collide)."""

    @field_validator("adam_betas")
    @classmethod
    def _betas(cls, v):
        if not all(0 <= b < 1 for b in v):
            raise ValueError(f"must be two numbers in [0, 1), got {list(v)}")
        return v

    @field_validator("report_to", mode="before")
    @classmethod
    def _reporters(cls, v):
        if isinstance(v, str):
            v = [s.strip() for s in v.split(",") if s.strip()]
        if isinstance(v, list):
            v = [s for s in v if s != "none"]
            if "jsonl" not in v:
                v = ["jsonl", *v]
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if not v:
            raise ValueError("must be a preset name, a model directory or a .gguf file")
        return v

    @model_validator(mode="after")
    def _cross(self):
        if self.steps is not None and self.epochs is not None:
            raise ValueError("give steps or epochs, not both")
        if self.num_nodes not in (None, 1) and not self.hostfile:
            raise ValueError("num_nodes > 1 needs a hostfile")
        return self

    def to_dict(self) -> dict:
        """Plain JSON-ready dict (the worker reads this back with recipe_from_json_dict)."""
        d = self.model_dump()
        d["adam_betas"] = list(self.adam_betas)
        return d


def field_names(cls=Recipe) -> list[str]:
    return list(cls.model_fields)


# --- turning pydantic's errors into one line per problem -----------------------------------------

_NESTED = {"dataset": DatasetConfig, "schedule": ScheduleConfig}


def _loc(loc: tuple) -> str:
    # Drop pydantic's union/branch markers ('str', 'list[str]', 'function-after[...]'), keep keys and indices.
    parts = [str(p) for p in loc if isinstance(p, int) or (isinstance(p, str) and "[" not in p and p not in
                                                               ("str", "int", "float", "bool", "list"))]
    return ".".join(parts)


def _describe(e: dict) -> str:
    loc, kind, value = _loc(e["loc"]), e["type"], e.get("input")
    if loc.split(".")[0] == "adam_betas":
        return "adam_betas must be two numbers in [0, 1), e.g. [0.9, 0.999]"
    if kind == "literal_error":
        loc = ".".join(p for p in loc.split(".") if not p.isdigit())  # report_to.1 -> report_to
    if kind == "extra_forbidden":
        *parent, key = loc.split(".")
        owner = Recipe
        for p in parent:
            owner = _NESTED.get(p, owner)
        guess = did_you_mean(str(key), field_names(owner), cutoff=0.75)
        prefix = ".".join(parent) + "." if parent else ""
        return f"unknown key {loc!r}" + (f" (did you mean {prefix}{guess!r}?)" if guess else "")
    if kind == "missing":
        return f"{loc} is required"
    if kind == "literal_error":
        expected = e.get("ctx", {}).get("expected", "").replace("'", "")
        return f"{loc} {value!r} is not one of {expected.replace(' or ', ', ')}"
    if kind in ("greater_than_equal", "greater_than", "less_than", "less_than_equal"):
        ctx = e.get("ctx", {})
        if kind == "greater_than_equal" and ctx.get("ge") == 1:
            return f"{loc} must be at least 1, got {value!r}"
        if kind == "greater_than_equal" and ctx.get("ge") == 0:
            return f"{loc} must not be negative, got {value!r}"
        if kind == "greater_than" and ctx.get("gt") == 0:
            return f"{loc} must be positive, got {value!r}"
        return f"{loc}: {e['msg'].lower()}, got {value!r}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"{loc} must be a whole number, got {value!r}"
    if kind in ("float_parsing", "float_type"):
        return f"{loc} must be a number, got {value!r}"
    if kind in ("bool_parsing", "bool_type"):
        return f"{loc} must be true or false, got {value!r}"
    if kind in ("string_type",):
        return f"{loc} must be a string, got {value!r}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{loc or 'the recipe'} must be a mapping of keys, got {type(value).__name__}"
    if kind == "value_error":
        msg = str(e.get("ctx", {}).get("error", e["msg"])).removeprefix("Value error, ")
        return f"{loc} {msg}" if loc else msg
    return f"{loc}: {e['msg']}" + (f" (got {value!r})" if value is not None and not isinstance(value, dict) else "")


def _problems(exc: ValidationError) -> list[str]:
    out: list[str] = []
    seen_union: set[str] = set()
    for e in exc.errors(include_url=False):
        text = _describe(e)
        # A `str | list[str]` field fails once per branch; one line is enough.
        key = _loc(e["loc"])
        if len(e["loc"]) > len(key.split(".")) and key in seen_union:
            continue
        seen_union.add(key)
        if text not in out:
            out.append(text)
    return out


def _prepare(data: Any) -> Any:
    """Shorthands: `dataset: file.jsonl` is {path: file.jsonl}; `schedule: cosine` is {name: cosine}."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    if isinstance(out.get("dataset"), (str, list)):
        out["dataset"] = {"path": out["dataset"]}
    if isinstance(out.get("schedule"), str):
        out["schedule"] = {"name": out["schedule"]}
    return out


def recipe_from_dict(data: dict, *, origin: str = "recipe") -> Recipe:
    """A Recipe from a mapping; every problem (unknown keys, wrong types, bad values) in one error.

    Raises:
        BadInput: naming `origin` (the file) and each offending key.
    """
    if not isinstance(data, dict):
        raise BadInput(f"{origin}: expected a mapping of recipe keys, got {type(data).__name__}",
                       "see presets/train/tiny-cpu.yaml")
    try:
        return Recipe.model_validate(_prepare(data))
    except ValidationError as exc:
        raise BadInput(f"{origin}: " + "; ".join(_problems(exc)),
                       "recipe keys: " + ", ".join(field_names()) + " (docs/recipes.md; LLaMA-Factory keys: "
                       "docs/llama-factory.md)") from None


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
        elif isinstance(v, dict) and isinstance(out.get(k), (str, list)) and k == "dataset":
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


# Paths resolved against the recipe file's folder (output_dir is resolved against the cwd).
_RECIPE_RELATIVE = ("tokenizer", "region", "swap_dir", "hostfile", "template")


def _absolutize(data: dict, base_dir: str) -> dict:
    """Resolve the recipe-relative paths of a raw mapping against `base_dir`."""
    out = dict(data)

    def fix(p):
        return p if not isinstance(p, str) or os.path.isabs(p) else os.path.normpath(os.path.join(base_dir, p))

    for key in _RECIPE_RELATIVE:
        value = out.get(key)
        if isinstance(value, str) and (key != "template" or looks_like_path(value)):
            out[key] = fix(os.path.expanduser(value))
    model = out.get("model")
    if isinstance(model, str) and model.startswith("package:"):
        from memascend_cli.models import resolve_package_file

        out["model"] = model = resolve_package_file(model)
    # A model is a path (not a preset name) when it looks like one. A hub id (org/name) that does not exist next to
    # the recipe stays as given: `plan` reads its config.json, `train` its snapshot (cached or downloaded).
    if isinstance(model, str) and looks_like_path(model):
        candidate = fix(os.path.expanduser(model))
        from memascend_cli.hub import looks_like_hub_id

        if os.path.exists(candidate) or not looks_like_hub_id(model):
            out["model"] = candidate
    ds = out.get("dataset")
    if isinstance(ds, (str, list)):
        ds = {"path": ds}
    if isinstance(ds, dict):
        ds = dict(ds)
        if isinstance(ds.get("path"), str):
            ds["path"] = fix(os.path.expanduser(ds["path"]))
        elif isinstance(ds.get("path"), list):
            ds["path"] = [fix(os.path.expanduser(p)) if isinstance(p, str) else p for p in ds["path"]]
        if isinstance(ds.get("cache_dir"), str):
            ds["cache_dir"] = fix(os.path.expanduser(ds["cache_dir"]))
        out["dataset"] = ds
    return out


def read_yaml(path: str) -> dict:
    from memascend_cli.userfiles import load_yaml

    data = load_yaml(path)  # an unreadable or malformed file is one BadInput line
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a mapping of recipe keys, got {type(data).__name__}",
                       "see presets/train/tiny-cpu.yaml")
    return data


def load_recipe(path: str, overrides: dict | None = None, *, notes: list[str] | None = None) -> Recipe:
    """Read a recipe YAML (memascend or LLaMA-Factory keys), apply overrides (already nested),
    resolve paths, check everything.

    Overrides given on the command line are relative to the current directory, like any CLI path.
    `notes` collects what the LLaMA-Factory translation wants the user to know (ignored keys).
    """
    from memascend_cli.run import llamafactory

    path = resolve_recipe_path(path)
    data = read_yaml(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    llamafactory.refuse_v1(data, path)
    if llamafactory.is_llamafactory(data):
        data, lf_notes = llamafactory.translate(data, recipe_dir=base_dir, cwd=os.getcwd(), origin=path,
                                                native_keys=set(field_names()))
        if notes is not None:
            notes.extend(lf_notes)
    data = _absolutize(data, base_dir)
    if overrides:
        data = merge(data, _absolutize(overrides, os.getcwd()))
    if isinstance(data.get("output_dir"), str):
        data["output_dir"] = os.path.abspath(os.path.expanduser(data["output_dir"]))
    if data.get("steps") is not None and data.get("epochs") is not None:
        # As in the HF Trainer and LLaMA-Factory (max_steps overrides num_train_epochs): short test runs set both.
        if notes is not None:
            notes.append(f"epochs: ignored (steps {data['steps']} wins)")
        data.pop("epochs")
    return recipe_from_dict(data, origin=path)


def load_recipe_noting(path: str, overrides: dict | None = None) -> Recipe:
    """load_recipe, with what the translation changed said as `note:` lines on stderr (the `deepspeed:` line replaced,
    a template rendered with the tokenizer's own chat template, keys ignored): `plan RECIPE` and `train RECIPE` say
    the same."""
    from memascend_cli.console import err

    notes: list[str] = []
    recipe = load_recipe(path, overrides, notes=notes)
    for note in notes:
        err.print(f"[dim]note: {note}[/dim]", highlight=False)
    return recipe


def recipe_from_json_dict(data: dict) -> Recipe:
    """The worker's reader for run_dir/recipe.json (already resolved and checked once)."""
    return recipe_from_dict(data, origin="recipe.json")


def total_steps(r: Recipe, num_train_sequences: int, world_size: int) -> int:
    """Optimizer steps of the run: `steps`, or epochs x sequences / global batch (at least 1)."""
    if r.steps is not None:
        return r.steps
    per_step = r.micro_batch * r.grad_accum * world_size
    return max(1, int((r.epochs or 1.0) * num_train_sequences // per_step))


def warmup_steps(r: Recipe, total: int) -> int:
    """Warm-up steps: schedule.warmup_steps, else warmup_ratio x total (rounded up, as the HF Trainer does)."""
    import math

    if r.schedule.warmup_steps:
        return r.schedule.warmup_steps
    return math.ceil(r.schedule.warmup_ratio * total)


def reference_markdown() -> str:
    """docs/recipes.md: every recipe key with its type, default and meaning, from the models themselves
    (tests/unit/test_recipe.py keeps the file equal to this)."""

    def rows(cls, prefix: str) -> list[str]:
        out = []
        for name, f in cls.model_fields.items():
            ann = str(f.annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
            ann = "mapping" if name in _NESTED else ann.replace("|", "\\|")
            if f.is_required():
                default = "required"
            elif f.default_factory is not None:
                default = f"`{f.default_factory()!r}`"
            else:
                default = f"`{f.default!r}`"
            if name in _NESTED:
                default = "see below"
            desc = " ".join((f.description or "").split()).replace("|", "\\|")
            out.append(f"| `{prefix}{name}` | `{ann}` | {default} | {desc} |")
        return out

    head = ["| key | type | default | meaning |", "|---|---|---|---|"]
    parts = ["# Recipe keys", "",
             "Generated from `memascend_cli/run/recipe.py` (pydantic models; unknown keys are refused with a close "
             "suggestion). Paths are relative to the recipe file, `output_dir` to the current directory. "
             "LLaMA-Factory's keys are translated first: docs/llama-factory.md.", "",
             *head, *rows(Recipe, ""), "", "## dataset", "", "`dataset: file.jsonl` is short for "
             "`dataset: {path: file.jsonl}`.", "", *head, *rows(DatasetConfig, "dataset."), "", "## schedule", "",
             "`schedule: cosine` is short for `schedule: {name: cosine}`.", "", *head,
             *rows(ScheduleConfig, "schedule."), ""]
    return "\n".join(parts)
