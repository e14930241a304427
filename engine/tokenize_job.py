"""Run preparation before the launch, in a child process of `memascend train`: tokenize the dataset, write RUN/hf/.

    echo '{"recipe": {...}, "run_dir": "..."}' | python -m memascend_engine.tokenize_job

transformers (AutoTokenizer, chat templates) imports torch, which the CLI process never does, so
this runs as a child. It

* loads a hub dataset into the `datasets` cache (engine/hub_data.py; a dry run only looks there);
* loads the tokenizer with AutoTokenizer (model directory or `tokenizer:`), resolves the chat
  template, and tokenizes the dataset into the shared cache (engine/data_prepare.py), or reuses it;
* writes RUN/hf/: config.json, generation_config.json and the tokenizer files with the chat template
  used in training - everything of the Hugging Face export except the weights, which the final
  export and `memascend export --checkpoint N` add;
* prints one JSON object on stdout: the cache folder and the sequence counts the CLI needs to fix
  the number of steps (and so the DeepSpeed scheduler) before DeepSpeed starts.

Expected failures print `error: ...` on stderr and exit 3 (the CLI turns that into exit code 2).
"""

from __future__ import annotations

import json
import os
import sys

EXIT_DATA_ERROR = 3


def model_config(recipe, model_spec):
    """The transformers config of the model: the directory's own, or the preset's."""
    if os.path.isdir(recipe.model):
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(recipe.model, local_files_only=True)
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        return cfg
    from memascend_engine.hf_models import to_hf_config

    return to_hf_config(model_spec)


def generation_config(recipe, cfg, tok):
    """The model directory's generation_config.json, else one from the tokenizer's special tokens."""
    from transformers import GenerationConfig

    if os.path.isdir(recipe.model) and os.path.isfile(os.path.join(recipe.model, "generation_config.json")):
        return GenerationConfig.from_pretrained(recipe.model, local_files_only=True)
    gen = GenerationConfig.from_model_config(cfg)
    gen.bos_token_id = tok.bos_token_id
    gen.eos_token_id = tok.eos_token_id
    gen.pad_token_id = tok.pad_token_id
    return gen


TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def write_hf_skeleton(folder: str, recipe, model_spec, tok, template_text: str | None) -> None:
    """config.json + generation_config.json + tokenizer files (with the training chat template) in `folder`."""
    import shutil

    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    cfg = model_config(recipe, model_spec)
    cfg.dtype = TORCH_DTYPE[recipe.precision]
    cfg.save_pretrained(tmp)
    generation_config(recipe, cfg, tok).save_pretrained(tmp)
    if template_text is not None:
        tok.chat_template = template_text
    tok.save_pretrained(tmp)
    # The parameter list the ranks wrote (for `memascend export --checkpoint`) survives a later prepare of the same
    # run directory (--dry-run, --resume); the ranks rewrite it at every start.
    from memascend_engine.export import PARAMS_FILE

    if os.path.isfile(os.path.join(folder, PARAMS_FILE)):
        shutil.copy2(os.path.join(folder, PARAMS_FILE), os.path.join(tmp, PARAMS_FILE))
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)


def prepare(recipe, run_dir: str, *, dry_run: bool = False) -> dict:
    """Tokenize (or reuse the cache) and write the export skeleton; the summary for the CLI.

    dry_run: a hub dataset that is not cached is not downloaded (the summary says so: {"pending": ...}), and the
    export skeleton is not written."""
    from memascend_engine import data_prepare as P
    from memascend_engine.data import DataError

    from memascend_cli.models import load_model

    prep = P.PrepSpec.from_recipe(recipe)
    if recipe.dataset.hub is not None:
        from memascend_engine import hub_data

        try:
            prep.paths = hub_data.arrow_files(recipe.dataset, dry_run=dry_run)
        except hub_data.NotCached as exc:
            if not dry_run:
                raise
            return {"pending": {"dataset": recipe.dataset.hub, "subset": recipe.dataset.subset,
                                "split": recipe.dataset.split, "folder": recipe.dataset.folder, "why": str(exc)}}

    spec = load_model(recipe.model)
    tok_path = recipe.tokenizer or recipe.model
    tok = P.load_tokenizer(tok_path)
    if len(tok) > spec.vocab_size:
        raise DataError(f"tokenizer {tok_path} has {len(tok)} tokens, model {recipe.model} only "
                        f"{spec.vocab_size} embeddings")
    name, text = P.resolve_template(tok, recipe.template)
    if recipe.dataset.format != "text" and text is None:
        raise DataError(f"tokenizer {tok_path} has no chat template and the recipe sets no `template:`; "
                        f"chat data ({recipe.dataset.format}) needs one: set template to "
                        f"{', '.join(P.BUILTIN_TEMPLATES)} or a .jinja file")
    root = recipe.dataset.cache_dir or P.default_cache_root()

    def progress(done, total):
        print(f"tokenizing: {done:,}/{total:,} samples", file=sys.stderr, flush=True)

    folder, meta = P.build_cache(prep, tok, name, text, cache_root=root,
                                 overwrite=recipe.dataset.overwrite_cache, progress=progress)
    train = meta["splits"]["train"]
    dropped: dict[str, int] = {}
    for split in meta["splits"].values():
        for reason, n in split.get("dropped_reasons", {}).items():
            dropped[reason] = dropped.get(reason, 0) + n
    for reason, n in dropped.items():
        print(f"data: {n:,} of {meta['samples']:,} samples dropped: {reason}", file=sys.stderr, flush=True)
    if train["rows"] == 0:
        what = "too little data for one packed sequence; lower seq_len or set dataset.packing: false" \
            if recipe.dataset.packing else "every sample was empty after truncation"
        source = recipe.dataset.hub or ", ".join(os.path.basename(p) for p in prep.paths)
        raise DataError(f"{source}: no training sequence of {recipe.seq_len} tokens ({what})")
    from memascend_cli.run.rundir import HF_DIR

    hf_dir = os.path.join(run_dir, HF_DIR)
    if not dry_run:  # a dry run exports nothing; the skeleton's transformers config imports torch (3 s a launch)
        write_hf_skeleton(hf_dir, recipe, spec, tok, text)
    return {"cache_dir": folder, "hf_dir": hf_dir, "template": name, "vocab_size": len(tok),
            "train_sequences": train["rows"], "validation_sequences": meta["splits"]["validation"]["rows"],
            "train_tokens": train["tokens"], "train_loss_tokens": train["loss_tokens"], "samples": meta["samples"],
            "dropped_samples": train["dropped_samples"] + meta["splits"]["validation"]["dropped_samples"],
            "dropped_reasons": dropped, "dataset_files": prep.paths}


def main() -> int:
    from memascend_engine.data import DataError

    from memascend_cli.errors import MemascendError
    from memascend_cli.run.recipe import recipe_from_json_dict

    request = json.load(sys.stdin)
    try:
        recipe = recipe_from_json_dict(request["recipe"])
        os.makedirs(request["run_dir"], exist_ok=True)
        summary = prepare(recipe, request["run_dir"], dry_run=bool(request.get("dry_run")))
    except (DataError, MemascendError) as exc:
        print(f"error: {getattr(exc, 'message', None) or exc}", file=sys.stderr, flush=True)
        if getattr(exc, "hint", None):
            print(f"hint: {exc.hint}", file=sys.stderr, flush=True)
        return EXIT_DATA_ERROR
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
