"""The run-directory contract of `memascend train`: every file name the CLI and the per-rank worker share.

    RUN/recipe.json                 the resolved recipe (written by the CLI)
    RUN/ds_config.json              the DeepSpeed config `train --dry-run` prints (written by the CLI)
    RUN/ds_config.effective.json    the config DeepSpeed really received (written by rank 0 after install)
    RUN/engine.json                 memascend EngineOptions the plan chose (host-budget windows, checkpoint offload)
    RUN/metrics.jsonl               one JSON record per step / eval / checkpoint (rank 0); `phase` records as rank 0
                                    starts each part of its work, `progress` records for the steps log_every skips
    RUN/STOP                        ask every rank to finish its step, checkpoint and exit 0
    RUN/logs/                       per-rank logs; error-rank<N>.json holds a failing rank's one-line reason
    RUN/checkpoints/step-NNNNNNN/   complete checkpoints (COMPLETE marker written last)
    RUN/data.json                   the prepared data: tokenized cache folder, sequence counts (written by the CLI)
    RUN/hf/                         config, generation config, tokenizer files and params.json of the export
    RUN/tensorboard/                TensorBoard event files (report_to: tensorboard)
    RUN/export/                     the final model (Hugging Face folder) of a memascend recipe; a LLaMA-Factory
                                    recipe's final model is RUN itself, as LLaMA-Factory writes it (final_model_dir)
    RUN/export-step-NNNNNNN/        `memascend export RUN --checkpoint N` (checkpoint_export_dir)
    RUN/swap/                       DeepSpeed's nvme_path: stock DeepSpeed's swap directory (--engine tuned or
                                    stock); with the engine only its key directory
    RUN/region.bin                  the region file created when the recipe names no region
    RUN/nodes.json                  multi-node runs: each node's host, ranks and region, in DeepSpeed's node order
    RUN/.deepspeed_env              multi-node runs: variables DeepSpeed's launcher exports to every node

Pure constants and path helpers (stdlib only); imported by the CLI and by memascend_engine.train_worker.
"""

from __future__ import annotations

import os
import re

RECIPE_JSON = "recipe.json"
DS_CONFIG = "ds_config.json"
EFFECTIVE_DS_CONFIG = "ds_config.effective.json"
ENGINE_JSON = "engine.json"
METRICS = "metrics.jsonl"
STOP_FILE = "STOP"
LOG_DIR = "logs"
CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
EXPORT_DIR = "export"
"""The final model's folder in the run directory of a memascend recipe (see final_model_dir)."""
DATA_JSON = "data.json"
"""The prepared data's summary (engine/tokenize_job.py): the cache folder the ranks memory-map, sequence counts."""
HF_DIR = "hf"
"""Everything of the Hugging Face export but the weights (engine/tokenize_job.py writes it before the launch)."""
TENSORBOARD_DIR = "tensorboard"
SWAP_DIR = "swap"
REGION_FILE = "region.bin"
NODES_JSON = "nodes.json"
DEEPSPEED_ENV = ".deepspeed_env"
"""Read by DeepSpeed's multi-node runner from its working directory (runner.py DEEPSPEED_ENVIRONMENT_PATHS '.'),
which `memascend train` sets to the run directory."""
ERROR_PREFIX = "error-rank"
"""logs/error-rank<N>.json: the one-line reason a rank failed (read by the CLI)."""
STARTED_PREFIX = "started-rank"
"""logs/started-rank<N>: the rank's worker began (written first thing; holds its pid)."""
EXIT_PREFIX = "exit-rank"
"""logs/exit-rank<N>.json: the rank ended on its own terms ({"code": N} or {"sigterm": true}, the launcher stopping
the survivors of a dead rank). A rank of a failed launch without one died of a signal it could not catch."""


def path(run_dir: str, name: str) -> str:
    """RUN/name."""
    return os.path.join(run_dir, name)


def ssd_location(run_dir: str, *, region: str | None, swap_dir: str | None, engine: str) -> str:
    """Where a run's SSD data goes, the one derivation of it: stock DeepSpeed's swap directory (swap_dir, else
    RUN/swap) for tuned and stock, else memascend's region: the given one, else the region file `train` creates in the
    run directory."""
    return region_location(run_dir, region) if engine == "memascend" else swap_directory(run_dir, swap_dir)


def region_location(run_dir: str, region: str | None) -> str:
    """memascend's region: the given one, else the region file `train` creates in the run directory."""
    return region or os.path.join(run_dir, REGION_FILE)


def swap_directory(run_dir: str, swap_dir: str | None) -> str:
    """Stock DeepSpeed's swap directory (its nvme_path): the given one, else RUN/swap."""
    return swap_dir or os.path.join(run_dir, SWAP_DIR)


def started_file(run_dir: str, rank: int) -> str:
    """RUN/logs/started-rank<N>."""
    return os.path.join(run_dir, LOG_DIR, f"{STARTED_PREFIX}{rank}")


def exit_file(run_dir: str, rank: int) -> str:
    """RUN/logs/exit-rank<N>.json."""
    return os.path.join(run_dir, LOG_DIR, f"{EXIT_PREFIX}{rank}.json")


def error_file(run_dir: str, rank: int) -> str:
    """RUN/logs/error-rank<N>.json."""
    return os.path.join(run_dir, LOG_DIR, f"{ERROR_PREFIX}{rank}.json")


def complete_checkpoints(run_dir: str) -> list[str]:
    """The run's checkpoint folders marked COMPLETE, oldest first (step-NNNNNNN names sort by step)."""
    d = os.path.join(run_dir, CHECKPOINTS)
    if not os.path.isdir(d):
        return []
    return sorted(n for n in os.listdir(d) if n.startswith("step-") and os.path.exists(os.path.join(d, n, COMPLETE)))


def checkpoint_step(name: str) -> int:
    """The step of checkpoint folder step-NNNNNNN."""
    return int(name.removeprefix("step-"))


def finished_checkpoint(run_dir: str, total_steps: int, *, final_dir: str | None) -> str | None:
    """The newest complete checkpoint of a run with nothing left to do, else None: it holds step `total_steps` (or a
    later one) and the final model is written (its config.json, written last; `final_dir` None: the run exports
    nothing)."""
    done = complete_checkpoints(run_dir)
    if not done or checkpoint_step(done[-1]) < total_steps:
        return None
    if final_dir is not None and not os.path.isfile(os.path.join(final_dir, MODEL_CONFIG)):
        return None
    return done[-1]


# --- the final model ------------------------------------------------------------------------------

FINAL_MODEL_TMP = ".final-model.tmp"
"""A final model written into the run directory is assembled here first (engine/export.py)."""
MODEL_CONFIG = "config.json"
"""Written last into a final model folder: a model without it is incomplete (from_pretrained refuses it)."""
PREVIOUS_MODEL_NAMES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                        "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin")
"""Files that mark a trained model in an output_dir: LLaMA-Factory's CHECKPOINT_NAMES (extras/constants.py), which
its hparams/parser.py get_train_args refuses to train over without overwrite_output_dir."""
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def final_model_dir(run_dir: str, *, in_output_dir: bool) -> str:
    """Where `memascend train` writes the final model: the run directory itself for a recipe with
    export_in_output_dir (every LLaMA-Factory recipe: LLaMA-Factory's and the HF Trainer's save_model write to
    output_dir, where their inference recipes and from_pretrained(output_dir) look), else RUN/export."""
    return run_dir if in_output_dir else os.path.join(run_dir, EXPORT_DIR)


def checkpoint_export_dir(run_dir: str, checkpoint: str) -> str:
    """`memascend export`'s default folder for checkpoint step-NNNNNNN: RUN/export-step-NNNNNNN."""
    return os.path.join(run_dir, f"export-{checkpoint}")


_OPTIONAL_MODEL_FILES = ("generation_config.json", "chat_template.jinja", "chat_template.json")
"""Files of a final model that a new one may lack; transformers reads a chat_template file before
tokenizer_config.json's template, so a stale one would win."""


def is_model_file(name: str) -> bool:
    """A file of a final model that the next one replaces, or removes when it has none of that name: config.json,
    the optional files above, the safetensors weights and index the export writes (model.safetensors,
    model-00001-of-00003.safetensors, model.safetensors.index.json). The tokenizer files are always rewritten."""
    return (name in (MODEL_CONFIG, "model.safetensors", "model.safetensors.index.json", *_OPTIONAL_MODEL_FILES)
            or _SHARD.fullmatch(name) is not None)


def previous_model(names: list[str]) -> str | None:
    """The first file of a trained model among a folder's file names (PREVIOUS_MODEL_NAMES), else None."""
    return next((n for n in PREVIOUS_MODEL_NAMES if n in names), None)
