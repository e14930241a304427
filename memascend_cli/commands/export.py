"""`memascend export RUN_DIR --checkpoint N`: a Hugging Face model directory from a saved checkpoint.

Thin: the run directory's checkpoint + RUN/hf (config, generation config, tokenizer with its chat
template, parameter list) -> memascend_engine.export.export_checkpoint, which re-assembles the fp32
master weights one tensor at a time with numpy (no torch, no DeepSpeed, no GPU).
"""

from __future__ import annotations

import json
import os

import typer

from memascend_cli.errors import BadInput, MemascendError


def export_command(
    run_dir: str = typer.Argument(..., metavar="RUN_DIR", help="Run directory of `memascend train` (its output_dir).",
                                  show_default=False),
    checkpoint: int = typer.Option(None, "--checkpoint", "-c", help="Step of the checkpoint to export (default: the "
                                   "newest complete one).", show_default=False),
    out: str = typer.Option(None, "--out", "-o", help="Output folder (default: RUN_DIR/export-step-NNNNNNN, e.g. "
                            "export-step-0000020); RUN_DIR itself puts the model beside the run's files, where "
                            "`train` writes a LLaMA-Factory recipe's final model.", show_default=False),
    precision: str = typer.Option(None, "--precision", help="bf16, fp16 or fp32 (default: the run's precision).",
                                  show_default=False),
) -> None:
    """Write a Hugging Face model directory (safetensors, config, tokenizer, chat template, generation
    config) from a checkpoint of a run; `AutoModelForCausalLM.from_pretrained` loads it. (`train` writes the
    final model itself, to RUN_DIR/export, or to RUN_DIR for a LLaMA-Factory recipe.)

    Examples:

        memascend export runs/smollm2-sft --checkpoint 20

        memascend export runs/smollm2-sft -o /models/smollm2-ft --precision fp32

        memascend export saves/qwen3-4b/sft --checkpoint 500 -o saves/qwen3-4b/sft
    """
    from memascend_cli.console import err
    from memascend_cli.run.rundir import (CHECKPOINTS, COMPLETE, DATA_JSON, HF_DIR, MODEL_CONFIG, RECIPE_JSON,
                                          checkpoint_export_dir, complete_checkpoints)

    if not os.path.isdir(run_dir):
        raise BadInput(f"run directory {run_dir} does not exist", "give the output_dir of a `memascend train` run")
    done = complete_checkpoints(run_dir)
    if not done:
        raise BadInput(f"{run_dir} has no complete checkpoint", "train with checkpoint_every, or let a run finish")
    if checkpoint is None:
        name = done[-1]
    else:
        name = f"step-{checkpoint:07d}"
        if name not in done:
            steps = ", ".join(str(int(n[5:])) for n in done)
            raise BadInput(f"{run_dir} has no complete checkpoint at step {checkpoint}", f"complete checkpoints: {steps}")
    folder = os.path.join(run_dir, CHECKPOINTS, name)
    assert os.path.isfile(os.path.join(folder, COMPLETE))
    try:
        with open(os.path.join(run_dir, RECIPE_JSON), encoding="utf-8") as f:
            run_precision = json.load(f)["precision"]
    except (OSError, ValueError, KeyError):
        raise BadInput(f"{run_dir}/recipe.json is missing or unreadable", "give the output_dir of a `memascend train` run") \
            from None
    precision = precision or run_precision
    if precision not in ("bf16", "fp16", "fp32"):
        raise BadInput(f"unknown precision {precision!r}", "use bf16, fp16 or fp32")
    hf_dir = os.path.join(run_dir, HF_DIR)
    try:
        with open(os.path.join(run_dir, DATA_JSON), encoding="utf-8") as f:
            hf_dir = json.load(f).get("hf_dir", hf_dir)
    except (OSError, ValueError):
        pass
    target = out or checkpoint_export_dir(run_dir, name)
    merge = os.path.realpath(target) == os.path.realpath(run_dir)
    replaced = not merge and os.path.isdir(target) and bool(os.listdir(target))
    if replaced and not os.path.isfile(os.path.join(target, MODEL_CONFIG)):
        # The folder is replaced as a whole: never one that is not a model (a parent of the run, say).
        raise BadInput(f"--out {target} exists and is not a model folder (it would be replaced)",
                       f"give a new folder, or {run_dir} itself to put the model beside the run's files")
    from memascend_engine.export import ExportError, export_checkpoint

    try:
        with err.status(f"exporting {name} to {target}"):
            path = export_checkpoint(folder, hf_dir, target, precision, merge=merge)
    except ExportError as exc:
        raise MemascendError(str(exc), "the checkpoint and the run directory must come from the same run") from None
    err.print(f"exported {name} ({precision}) to {path}", highlight=False)
