"""A GGUF file -> a normal Hugging Face model directory (safetensors, config, tokenizer, generation config).

    python -m memascend_engine.gguf_import FILE.gguf OUT_DIR [--dtype fp32|bf16]

transformers reads GGUF with `gguf_file=` (the `gguf` package de-quantizes the tensors);
`save_pretrained` of such a model needs its GGUF quantizer detached first, or it writes a
config that claims the weights are still quantized. `memascend import-gguf` runs this, and
`memascend train` runs it once (cached) for a recipe whose `model:` is a .gguf file.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class GGUFError(Exception):
    """A one-line reason the file cannot be imported."""


def file_key(path: str) -> str:
    """Cache key of a GGUF file: its path, size and modification time (hashing 100s of MB each run is waste)."""
    st = os.stat(path)
    return hashlib.sha256(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]


def import_gguf(path: str, out_dir: str, dtype: str = "fp32") -> str:
    """Write `out_dir` (atomically: a temporary folder renamed at the end). Returns out_dir."""
    if not os.path.isfile(path):
        raise GGUFError(f"{path}: no such GGUF file")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{path}: not a GGUF file (no GGUF magic)")
    try:
        import gguf  # noqa: F401 - transformers needs it to read the file
    except ImportError:
        raise GGUFError("reading GGUF needs the gguf package (pip install gguf)") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True,
                                                     dtype=getattr(torch, DTYPES[dtype]))
    except (ValueError, KeyError, OSError) as exc:
        raise GGUFError(f"{path}: transformers cannot load it ({str(exc).splitlines()[0]})") from None
    # Detach the GGUF quantizer: the tensors are already de-quantized, the saved model is a plain one.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = os.path.basename(out_dir.rstrip("/"))
    tmp = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.rename(tmp, out_dir)
    return out_dir


def cached_import(path: str, cache_root: str) -> str:
    """The imported directory of `path` under cache_root (imported on first use)."""
    stem = os.path.basename(path)[: -len(".gguf")] if path.endswith(".gguf") else os.path.basename(path)
    out = os.path.join(cache_root, f"{stem}-{file_key(path)}")
    if not os.path.isfile(os.path.join(out, "config.json")):
        import_gguf(path, out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--cache-root", help="import into CACHE_ROOT/<name>-<key> unless already there; print the folder")
    args = ap.parse_args(argv)
    try:
        if args.cache_root:
            print(cached_import(args.file, args.cache_root))
        else:
            print(import_gguf(args.file, args.out_dir, args.dtype))
    except GGUFError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
