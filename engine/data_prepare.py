"""Preparing a dataset (run by `memascend train` in a child process before the launch): the tokenizer and the chat
template, the loss mask, and the tokenized cache written once.

Chat data is rendered with the tokenizer's chat template (or the recipe's `template:`), only assistant tokens count in
the loss, BOS/EOS are what the tokenizer and its template define; text (pretraining) data gets the tokenizer's own
special tokens plus EOS. Tokens and loss masks are appended to flat files in a cache folder keyed by every input
(data.py reads them in the ranks), so the same data is tokenized once and the number of sequences is known before
DeepSpeed starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field

import numpy as np
from memascend_engine.data import CACHE_FORMAT, META, DataError, permute, read_meta
from memascend_engine.data_records import Format, count_records, iter_records, record_tools, to_messages, to_text


# --- tokenizer and templates ----------------------------------------------------------------------

BUILTIN_TEMPLATES = {
    # ChatML (Qwen, SmolLM2, ...): the turn ends with <|im_end|>, which is trained.
    "chatml": ("{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
               "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"),
    # Llama 3 instruct.
    "llama3": ("{{ bos_token }}{%- for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n'"
               " + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
               "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"),
    # No markers: the prompt on its own line(s), then the answer and the tokenizer's EOS.
    "plain": ("{%- for m in messages %}{%- if m['role'] == 'assistant' %}{{ m['content'] + eos_token }}"
              "{%- else %}{{ m['content'] + '\n' }}{%- endif %}{%- endfor %}"),
}

_EOS_CANDIDATES = ("<|end|>", "</s>", "<|endoftext|>", "<eos>", "<|im_end|>", "<|eot_id|>")
_PAD_CANDIDATES = ("<pad>", "<|pad|>", "[PAD]")
_BOS_CANDIDATES = ("<s>", "<|begin|>", "<|begin_of_text|>", "<bos>")


def load_tokenizer(path: str):
    """A fast Hugging Face tokenizer: AutoTokenizer from a directory, or a bare tokenizer.json.

    A bare tokenizer.json has no special-token settings; its EOS/PAD are found in the vocabulary.
    PAD falls back to EOS (padding positions never count in the loss).
    """
    import logging

    from transformers import PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if os.path.isfile(path):
        if not path.endswith(".json"):
            raise DataError(f"tokenizer {path}: give a tokenizer directory or a tokenizer.json file")
        try:
            tok = PreTrainedTokenizerFast(tokenizer_file=path)
        except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception on malformed JSON
            raise DataError(f"tokenizer {path}: cannot load ({str(exc).splitlines()[0]})") from None
        vocab = tok.get_vocab()
        pick = lambda cands: next((c for c in cands if c in vocab), None)  # noqa: E731
        tok.eos_token = pick(_EOS_CANDIDATES)
        if tok.eos_token is None:
            raise DataError(f"tokenizer {path}: no end-of-sequence token found (looked for {', '.join(_EOS_CANDIDATES)})")
        bos = pick(_BOS_CANDIDATES)
        if bos is not None:
            tok.bos_token = bos
        tok.pad_token = pick(_PAD_CANDIDATES) or tok.eos_token
        tok.model_max_length = 1_000_000
        return tok
    if not os.path.isdir(path):
        raise DataError(f"tokenizer {path} does not exist")
    from transformers import AutoTokenizer  # here: it imports transformers' model registry and torch (2 s)

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True, use_fast=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError/ValueError/... for a bad folder
        raise DataError(f"tokenizer {path}: cannot load with AutoTokenizer ({str(exc).splitlines()[0]})") from None
    if not getattr(tok, "is_fast", False):
        raise DataError(f"tokenizer {path}: only fast (tokenizer.json) tokenizers are supported")
    if tok.eos_token is None:
        raise DataError(f"tokenizer {path}: defines no eos_token (set it in tokenizer_config.json)")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def resolve_template(tok, template: str | None) -> tuple[str, str | None]:
    """(name, jinja text) of the chat template: the recipe's override, else the tokenizer's own."""
    if template is None:
        own = getattr(tok, "chat_template", None)
        if isinstance(own, dict):
            own = own.get("default")
        return ("tokenizer", own) if own else ("none", None)
    if template in BUILTIN_TEMPLATES:
        return template, BUILTIN_TEMPLATES[template]
    if os.path.isfile(template):
        with open(template, encoding="utf-8") as f:
            return os.path.basename(template), f.read()
    raise DataError(f"template {template!r} is neither built in ({', '.join(BUILTIN_TEMPLATES)}) nor a .jinja file")


def special_lead(tok) -> list[int]:
    """Token ids the tokenizer itself puts before a text (e.g. Llama's BOS); [] for most chat tokenizers."""
    with_special = tok("x", add_special_tokens=True)["input_ids"]
    bare = tok("x", add_special_tokens=False)["input_ids"]
    for i in range(len(with_special)):
        if with_special[i:i + len(bare)] == bare:
            return list(with_special[:i])
    return []


class Encoder:
    """Samples -> (token ids, loss mask) with one tokenizer and one template."""

    def __init__(self, tok, template_name: str, template_text: str | None):
        self.tok = tok
        self.template_name = template_name
        self.template = template_text
        self.lead = special_lead(tok)
        self.eos_id = tok.eos_token_id

    def _render(self, messages, *, generation_prompt: bool, tools: list | None = None) -> str:
        try:
            return self.tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                                add_generation_prompt=generation_prompt, chat_template=self.template)
        except Exception as exc:  # noqa: BLE001 - jinja raises TemplateError and friends
            raise DataError(f"chat template {self.template_name}: {str(exc).splitlines()[0]}") from None

    def segments(self, messages: list[dict], where: str, tools: list | None = None) -> list[tuple[str, bool]]:
        """The rendered conversation as (text, trained) pieces: assistant turns (with their end-of-turn
        marker, tool calls included) are trained, everything else (system, user, tool results, the template's role
        headers) is not. With `tools`, the template must render them (else the schemas would be lost silently)."""
        if self.template is None:
            raise DataError(f"{where}: chat data needs a chat template and the tokenizer has none; set `template:` "
                            f"to {', '.join(BUILTIN_TEMPLATES)} or a .jinja file")
        if tools and self._render(messages[:1], generation_prompt=False, tools=tools) == \
                self._render(messages[:1], generation_prompt=False):
            raise DataError(f"{where}: chat template {self.template_name} does not render the record's tools, so the "
                            "function schemas would be lost; use a template that renders `tools` (the model's own, "
                            "e.g. Qwen2.5 or Llama 3.1) or remove the tools column from dataset_info.json")
        out: list[tuple[str, bool]] = []
        done = ""
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            prompt = self._render(messages[:i], generation_prompt=True, tools=tools)
            full = self._render(messages[:i + 1], generation_prompt=False, tools=tools)
            if not prompt.startswith(done) or not full.startswith(prompt):
                raise DataError(f"{where}: chat template {self.template_name} does not render the conversation "
                                "turn by turn (an earlier turn changes when a later one is added); set `template:` "
                                "to chatml, llama3, plain or a .jinja file")
            lost = [c["function"]["name"] for c in m.get("tool_calls") or [] if c["function"]["name"] not in full]
            lost += [t["content"][:40] for t in messages[:i] if t["role"] == "tool" and t["content"].strip() not in full]
            if lost:
                raise DataError(f"{where}: chat template {self.template_name} drops tool calls or tool results "
                                f"({', '.join(map(repr, lost))}), so they would not be trained as such; use a template "
                                "that renders tool_calls and tool turns (the model's own, e.g. Qwen2.5 or Llama 3.1)")
            if len(prompt) > len(done):
                out.append((prompt[len(done):], False))
            out.append((full[len(prompt):], True))
            done = full
        rest = self._render(messages, generation_prompt=False, tools=tools)
        if len(rest) > len(done):
            out.append((rest[len(done):], False))
        return out

    def encode_chat(self, messages: list[dict], where: str, tools: list | None = None) -> tuple[list[int], list[int]]:
        segs = self.segments(messages, where, tools)
        enc = self.tok([s for s, _ in segs], add_special_tokens=False)["input_ids"]
        ids: list[int] = list(self.lead) if self.template_name == "plain" else []
        mask: list[int] = [0] * len(ids)
        for part, (_, train) in zip(enc, segs):
            ids += part
            mask += [1 if train else 0] * len(part)
        return ids, mask

    def encode_text(self, text: str) -> tuple[list[int], list[int]]:
        ids = self.tok(text, add_special_tokens=True)["input_ids"]
        if self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
            ids = ids + [self.eos_id]
        return ids, [1] * len(ids)


def tokenizer_fingerprint(tok, template_text: str | None) -> str:
    h = hashlib.sha256()
    h.update(tok.backend_tokenizer.to_str().encode())
    h.update(json.dumps([tok.bos_token, tok.eos_token, tok.pad_token, template_text or ""]).encode())
    return h.hexdigest()


# --- the cache ------------------------------------------------------------------------------------


@dataclass
class PrepSpec:
    """Everything that decides the tokenized data (the cache key covers all of it)."""

    paths: list[str]
    format: str
    packing: bool
    seq_len: int
    validation_split: float
    seed: int
    columns: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)
    text_field: str = "text"
    max_samples: int | None = None

    @classmethod
    def from_recipe(cls, r) -> "PrepSpec":
        d = r.dataset
        return cls(paths=[os.path.abspath(p) for p in d.paths], format=d.format, packing=d.packing, seq_len=r.seq_len,
                   validation_split=float(d.validation_split), seed=r.seed, columns=dict(d.columns), tags=dict(d.tags),
                   text_field=d.text_field, max_samples=d.max_samples)

    def key(self, tok_fingerprint: str) -> str:
        files = []
        for p in self.paths:
            try:
                st = os.stat(p)
            except OSError:
                raise DataError(f"dataset file {p} does not exist") from None
            files.append([p, st.st_size, st.st_mtime_ns])
        blob = json.dumps({"cache_format": CACHE_FORMAT, "files": files, "tokenizer": tok_fingerprint,
                           **{k: v for k, v in self.__dict__.items() if k != "paths"}}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


def default_cache_root() -> str:
    from memascend_cli.defaults import cache_home

    return cache_home("data")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class _SplitWriter:
    """Append-only token / loss-mask / offset files of one split."""

    def __init__(self, folder: str, name: str, dtype: np.dtype, packing: bool, seq_len: int):
        self.name, self.dtype, self.packing, self.seq_len = name, dtype, packing, seq_len
        self.tokens = open(os.path.join(folder, f"{name}.tokens"), "wb")
        self.mask = open(os.path.join(folder, f"{name}.mask"), "wb")
        self.offsets = None if packing else open(os.path.join(folder, f"{name}.offsets"), "wb")
        self.num_tokens = 0
        self.loss_tokens = 0
        self.samples = 0
        self.dropped = 0
        self.dropped_reasons: dict[str, int] = {}

    def add(self, ids: list[int], mask: list[int]) -> None:
        if not self.packing:
            ids, mask = ids[:self.seq_len], mask[:self.seq_len]
            if not any(mask[1:]):
                # Nothing left to learn after truncation (the label of the first token is never used).
                self.drop(f"no trained token in the first {self.seq_len} tokens (seq_len)")
                return
            np.array([self.num_tokens], dtype=np.int64).tofile(self.offsets)
        np.asarray(ids, dtype=self.dtype).tofile(self.tokens)
        np.asarray(mask, dtype=np.uint8).tofile(self.mask)
        self.num_tokens += len(ids)
        self.loss_tokens += int(sum(mask))
        self.samples += 1

    def drop(self, reason: str) -> None:
        self.dropped += 1
        self.dropped_reasons[reason] = self.dropped_reasons.get(reason, 0) + 1

    def close(self) -> dict:
        if self.offsets is not None:
            np.array([self.num_tokens], dtype=np.int64).tofile(self.offsets)  # end of the last row
            self.offsets.close()
        self.tokens.close()
        self.mask.close()
        rows = self.num_tokens // self.seq_len if self.packing else self.samples
        return {"rows": rows, "tokens": self.num_tokens, "loss_tokens": self.loss_tokens, "samples": self.samples,
                "dropped_samples": self.dropped, "dropped_reasons": dict(self.dropped_reasons)}


def validation_count(fraction: float, total: int) -> int:
    if fraction <= 0:
        return 0
    n = int(fraction) if fraction >= 1 else max(1, int(round(fraction * total)))
    if n >= total:
        raise DataError(f"validation split {fraction:g} leaves no training samples out of {total}")
    return n


def build_cache(spec: PrepSpec, tok, template_name: str, template_text: str | None, *, cache_root: str,
                overwrite: bool = False, progress=None) -> tuple[str, dict]:
    """Tokenize the dataset into `cache_root/<key>/` unless that exists; (folder, meta).

    Host memory is one record at a time (a JSON list file is parsed whole); files are written in
    a temporary folder renamed at the end, so concurrent or interrupted runs never see half a cache.
    """
    fp = tokenizer_fingerprint(tok, template_text)
    key = spec.key(fp)
    folder = os.path.join(cache_root, key)
    if os.path.isfile(os.path.join(folder, META)) and not overwrite:
        return folder, read_meta(folder)
    os.makedirs(cache_root, exist_ok=True)
    tmp = f"{folder}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        total = count_records(spec.paths, spec.max_samples)
        if total == 0:
            raise DataError(f"{', '.join(os.path.basename(p) for p in spec.paths)}: the dataset is empty")
        n_val = validation_count(spec.validation_split, total)
        dtype = token_dtype(len(tok))
        writers = {s: _SplitWriter(tmp, s, dtype, spec.packing, spec.seq_len) for s in ("train", "validation")}
        enc = Encoder(tok, template_name, template_text)
        fmt = Format(spec.format, spec.columns, spec.tags, spec.text_field)
        val_seed = spec.seed * 7919 + 17
        for i, (rec, where) in enumerate(iter_records(spec.paths, spec.max_samples)):
            if spec.format == "text":
                ids, mask = enc.encode_text(to_text(rec, where, fmt))
            else:
                ids, mask = enc.encode_chat(to_messages(rec, where, fmt), where, record_tools(rec, where, fmt))
            # Validation samples: the first n_val of a seeded permutation of the sample indices.
            split = "validation" if n_val and permute(i, total, val_seed) < n_val else "train"
            writers[split].add(ids, mask)
            if progress is not None and (i + 1) % 1000 == 0:
                progress(i + 1, total)
        splits = {s: w.close() for s, w in writers.items()}
        meta = {"cache_format": CACHE_FORMAT, "key": key, "samples": total, "seq_len": spec.seq_len,
                "packing": spec.packing, "token_dtype": dtype.name, "vocab_size": len(tok),
                "pad_id": int(tok.pad_token_id), "eos_id": int(tok.eos_token_id), "template": template_name,
                "format": spec.format, "splits": splits, "files": spec.paths}
        with open(os.path.join(tmp, META), "w") as f:
            json.dump(meta, f, indent=1)
        if os.path.exists(folder):
            shutil.rmtree(folder)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not os.path.isfile(os.path.join(folder, META)):  # another process won the race: use its copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder, meta
