"""Datasets: read, render with the chat template, tokenize once into a memory-mapped cache, batch.

Two halves:

* preparing (`build_cache`, run by `memascend train` in a child process before the launch): local
  JSONL / JSON / Parquet / .txt files are read record by record, chat data (alpaca, sharegpt,
  OpenAI messages) is rendered with the tokenizer's chat template (or the recipe's `template:`),
  only assistant tokens count in the loss, BOS/EOS are what the tokenizer and its template
  define; text (pretraining) data gets the tokenizer's own special tokens plus EOS. Tokens and
  loss masks are appended to flat files in a cache folder keyed by every input, so the same data
  is tokenized once and the number of sequences is known before DeepSpeed starts;
* reading (`TokenCache`, in every rank): the files are memory-mapped (the page cache is shared by
  the ranks of a node), a micro-batch copies its rows out and drops the pages from the rank's
  mapping again, and the epoch order is a keyed permutation computed per index, so a rank's host
  memory for data does not grow with the dataset.

Every malformed or empty record is reported as `file:line: what` (DataError), so a bad dataset
gives one `error:` line, not a traceback. The order of sequences is a pure function of
(seed, epoch), so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

IGNORE_INDEX = -100
"""Label of tokens that do not count in the loss (prompt tokens, padding); transformers' convention."""
CACHE_FORMAT = 3
"""3: tool calls and tool results rendered as such (function_call / observation turns), dropped samples by reason."""
META = "meta.json"


class DataError(Exception):
    """A dataset, template or tokenizer problem with a one-line message naming the file (and line)."""


# --- reading records ----------------------------------------------------------------------------


def _iter_file(path: str) -> Iterator[tuple[object, str]]:
    """(record, 'file:line') pairs from JSONL, a JSON list, Parquet, or a .txt file (one sample per line)."""
    name = os.path.basename(path)
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"{name}: reading Parquet needs pyarrow (pip install pyarrow)") from None
        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise DataError(f"{name}: not a Parquet file ({str(exc).splitlines()[0]})") from None
        row = 0
        for batch in pf.iter_batches(batch_size=1024):
            for rec in batch.to_pylist():
                row += 1
                yield rec, f"{name}:row {row}"
        return
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot open ({exc.strerror})") from None
    with f:
        try:
            if path.endswith(".txt"):
                for i, line in enumerate(f, 1):
                    if line.strip():  # blank lines separate paragraphs in plain text
                        yield {"text": line.rstrip("\n")}, f"{name}:{i}"
                return
            head = f.read(4096)
            f.seek(0)
            if path.endswith(".json") or head.lstrip().startswith("["):
                # A JSON list is parsed whole (in the preparing process only; the ranks never see it).
                try:
                    data = json.load(f)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{name}:{exc.lineno}: not valid JSON ({exc.msg})") from None
                if not isinstance(data, list):
                    raise DataError(f"{name}: expected a JSON list of records")
                for i, r in enumerate(data):
                    yield r, f"{name}:record {i + 1}"
                return
            for i, line in enumerate(f, 1):
                if not line.strip():
                    raise DataError(f"{name}:{i}: empty line")
                try:
                    yield json.loads(line), f"{name}:{i}"
                except json.JSONDecodeError as exc:
                    raise DataError(f"{name}:{i}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def iter_records(paths: list[str], max_samples: int | None = None) -> Iterator[tuple[object, str]]:
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"dataset file {path} does not exist")
        for n, item in enumerate(_iter_file(path)):
            if max_samples is not None and n >= max_samples:
                break
            yield item


def count_records(paths: list[str], max_samples: int | None = None) -> int:
    """Records of the files (a first, cheap pass: the validation split needs the total)."""
    total = 0
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"dataset file {path} does not exist")
        n = None
        if path.endswith(".parquet"):
            try:
                import pyarrow.parquet as pq

                n = pq.ParquetFile(path).metadata.num_rows
            except Exception:  # noqa: BLE001 - the reading pass below reports the real error
                n = None
        if n is None:
            n = sum(1 for _ in _iter_file(path))
        total += min(n, max_samples) if max_samples is not None else n
    return total


# --- records -> conversations or text --------------------------------------------------------------

# Tool results are "tool" turns and function calls assistant turns with `tool_calls`, as chat templates expect them
# (LLaMA-Factory's observation / function_call roles); a template renders them with the record's `tools` schemas.
_FUNCTION_CALL = "function_call"
_SHAREGPT_ROLES = {"human": "user", "user": "user", "system": "system", "gpt": "assistant", "assistant": "assistant",
                   "observation": "tool", "function_call": _FUNCTION_CALL, "tool": "tool"}


@dataclass
class Format:
    """How records map to messages (LLaMA-Factory's dataset_info columns and tags)."""

    kind: str
    columns: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)
    text_field: str = "text"


def _str(rec: dict, key: str, where: str, *, required: bool) -> str:
    v = rec.get(key)
    if v is None or v == "":
        if required:
            raise DataError(f"{where}: record needs a non-empty string {key!r}")
        return ""
    if not isinstance(v, str):
        raise DataError(f"{where}: {key!r} must be a string")
    return v


def to_messages(rec, where: str, fmt: Format) -> list[dict]:
    """[{role, content}] of one alpaca or sharegpt/OpenAI record."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected an object (a JSON record)")
    c = fmt.columns
    if fmt.kind == "alpaca":
        instruction = _str(rec, c.get("prompt", "instruction"), where, required=True)
        query = _str(rec, c.get("query", "input"), where, required=False)
        response = _str(rec, c.get("response", "output"), where, required=True)
        system = _str(rec, c.get("system", "system"), where, required=False)
        msgs = [{"role": "system", "content": system}] if system else []
        history = rec.get(c.get("history", "history")) or []
        if not isinstance(history, list):
            raise DataError(f"{where}: 'history' must be a list of [question, answer] pairs")
        for pair in history:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise DataError(f"{where}: 'history' must be a list of [question, answer] pairs")
            msgs += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
        # LLaMA-Factory's alpaca convention: the input follows the instruction on a new line.
        msgs += [{"role": "user", "content": instruction + ("\n" + query if query else "")},
                 {"role": "assistant", "content": response}]
        return msgs
    # sharegpt: {conversations: [{from, value}]}, or OpenAI-style {messages: [{role, content}]}.
    key = c.get("messages")
    if key is None:
        key = "conversations" if "conversations" in rec or "messages" not in rec else "messages"
    openai = key == "messages" and not fmt.tags
    role_tag = fmt.tags.get("role_tag", "role" if openai else "from")
    content_tag = fmt.tags.get("content_tag", "content" if openai else "value")
    roles = dict(_SHAREGPT_ROLES)
    for tag, role in (("user_tag", "user"), ("assistant_tag", "assistant"), ("system_tag", "system"),
                      ("observation_tag", "tool"), ("function_tag", _FUNCTION_CALL)):
        if tag in fmt.tags:
            roles[fmt.tags[tag]] = role
    conv = rec.get(key)
    if not isinstance(conv, list) or not conv:
        raise DataError(f"{where}: sharegpt record needs a non-empty {key!r} list")
    msgs = []
    system = rec.get(c.get("system", "system"))
    if isinstance(system, str) and system:
        msgs.append({"role": "system", "content": system})
    for j, turn in enumerate(conv):
        if not isinstance(turn, dict) or not isinstance(turn.get(content_tag), str) or turn.get(role_tag) not in roles:
            raise DataError(f"{where}: {key}[{j}] needs {role_tag!r} ({'/'.join(sorted(roles))}) and a string "
                            f"{content_tag!r}")
        role = roles[turn[role_tag]]
        msgs.append(_tool_call(turn[content_tag], f"{where}: {key}[{j}]") if role == _FUNCTION_CALL
                    else {"role": role, "content": turn[content_tag]})
    if not any(m["role"] == "assistant" for m in msgs):
        raise DataError(f"{where}: conversation has no assistant turn to learn from")
    return msgs


def _tool_call(content: str, where: str) -> dict:
    """An assistant turn calling tools, from LLaMA-Factory's function_call content: JSON {name, arguments} or a list
    of them."""
    try:
        calls = json.loads(content)
    except ValueError:
        calls = None
    calls = calls if isinstance(calls, list) else [calls]
    if not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
        raise DataError(f"{where}: a function_call turn must be JSON {{\"name\": ..., \"arguments\": ...}} (or a list "
                        "of them)")
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}}
                           for c in calls]}


def record_tools(rec, where: str, fmt: Format) -> list | None:
    """The record's tool schemas (dataset_info's `tools` column: a JSON string or a list), or None."""
    key = fmt.columns.get("tools")
    value = rec.get(key) if key and isinstance(rec, dict) else None
    if value in (None, "", "[]"):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise DataError(f"{where}: {key!r} must hold the tools' JSON schemas") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise DataError(f"{where}: {key!r} must hold the tools' JSON schemas (a list of objects)")
    return value or None


def to_text(rec, where: str, fmt: Format) -> str:
    key = fmt.columns.get("prompt", fmt.text_field) if fmt.columns else fmt.text_field
    value = rec.get(key) if isinstance(rec, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: text record needs a non-empty string {key!r}")
    return value


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

    from transformers import AutoTokenizer, PreTrainedTokenizerFast
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
    from memascend_cli.run.recipe import cache_home

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


def read_meta(folder: str) -> dict:
    try:
        with open(os.path.join(folder, META), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        raise DataError(f"tokenized data cache {folder} is missing or damaged; run `memascend train` again") from None
    if meta.get("cache_format") != CACHE_FORMAT:
        raise DataError(f"tokenized data cache {folder} has format {meta.get('cache_format')}, expected {CACHE_FORMAT}")
    return meta


# --- reading the cache in a rank ----------------------------------------------------------------


def _map(path: str, dtype) -> tuple[np.ndarray, mmap.mmap | None]:
    size = os.path.getsize(path)
    if size == 0:
        return np.empty(0, dtype=dtype), None
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mm, dtype=dtype), mm


class Split:
    """One split's rows, read from the memory-mapped token and mask files."""

    def __init__(self, folder: str, name: str, meta: dict):
        self.seq_len, self.packing = meta["seq_len"], meta["packing"]
        self.pad_id = meta["pad_id"]
        self.num_rows = meta["splits"][name]["rows"]
        self.tokens, self._mm_tokens = _map(os.path.join(folder, f"{name}.tokens"), np.dtype(meta["token_dtype"]))
        self.mask, self._mm_mask = _map(os.path.join(folder, f"{name}.mask"), np.uint8)
        self.offsets, self._mm_offsets = None, None
        if not self.packing:
            self.offsets, self._mm_offsets = _map(os.path.join(folder, f"{name}.offsets"), np.int64)

    def __len__(self) -> int:
        return self.num_rows

    def _span(self, row: int) -> tuple[int, int]:
        if self.packing:
            return row * self.seq_len, (row + 1) * self.seq_len
        return int(self.offsets[row]), int(self.offsets[row + 1])

    def batch(self, rows: list[int]) -> dict[str, np.ndarray]:
        """input_ids and labels (and attention_mask when padding) of the rows, as int64 arrays."""
        spans_of = [self._span(row) for row in rows]
        n = len(rows)
        # Packed rows are seq_len long; padded rows only as long as the longest in the batch (as the
        # HF data collators pad), never longer than seq_len.
        L = self.seq_len if self.packing else max(b - a for a, b in spans_of)
        ids = np.full((n, L), self.pad_id, dtype=np.int64)
        labels = np.full((n, L), IGNORE_INDEX, dtype=np.int64)
        attn = None if self.packing else np.zeros((n, L), dtype=np.int64)
        for j, (a, b) in enumerate(spans_of):
            t = self.tokens[a:b].astype(np.int64)
            m = self.mask[a:b]
            ids[j, :b - a] = t
            labels[j, :b - a] = np.where(m == 1, t, IGNORE_INDEX)
            if attn is not None:
                attn[j, :b - a] = 1
        self._release()
        out = {"input_ids": ids, "labels": labels}
        if attn is not None:
            out["attention_mask"] = attn
        return out

    def _release(self) -> None:
        # The pages stay in the (shared) page cache; dropping them from this rank's mapping keeps its
        # resident set at one micro-batch however much of the dataset it has read. The whole mapping is
        # released, not only the rows read: the kernel maps neighbouring pages on each fault
        # (fault-around), which a per-row release would leave behind. Cheap: only present pages are touched.
        for mm in (self._mm_tokens, self._mm_mask, self._mm_offsets):
            if mm is not None:
                mm.madvise(mmap.MADV_DONTNEED)


class TokenCache:
    """The prepared dataset of a run: meta plus its train and validation splits."""

    def __init__(self, folder: str):
        self.folder = folder
        self.meta = read_meta(folder)
        self.train = Split(folder, "train", self.meta)
        self.validation = Split(folder, "validation", self.meta) if self.meta["splits"]["validation"]["rows"] else None


# --- order ----------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1


def _mix(x: int, key: int) -> int:
    """splitmix64 finalizer of x + key: the Feistel round function."""
    x = (x + key * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def permute(i: int, n: int, seed: int) -> int:
    """Position `i` of a seeded pseudo-random permutation of range(n), in O(1) memory.

    A 4-round balanced Feistel network on the smallest even bit width >= n, cycle-walked back
    into range (fewer than 4 walks on average), so no rank ever materialises an order of the dataset.
    """
    if not 0 <= i < n:
        raise IndexError(f"{i} is outside range({n})")
    if n == 1:
        return 0
    bits = max(2, (n - 1).bit_length())
    bits += bits & 1
    half = bits // 2
    mask = (1 << half) - 1
    x = i
    while True:
        left, right = x >> half, x & mask
        for rnd in range(4):
            left, right = right, left ^ (_mix(right, seed * 4 + rnd) & mask)
        x = (left << half) | right
        if x < n:
            return x


def epoch_row(k: int, num_rows: int, seed: int, epoch: int) -> int:
    """Row at position k of epoch `epoch`; a pure function of (seed, epoch) so resume replays it exactly."""
    return permute(k, num_rows, seed * 1_000_003 + epoch)


def micro_batch_rows(num_rows: int, seed: int, micro_index: int, *, micro_batch: int, world_size: int,
                     rank: int) -> list[int]:
    """Row indices of one rank's micro-batch number `micro_index` (counted over the whole run).

    Global micro-batch k covers world_size x micro_batch consecutive positions of the endless
    sequence epoch 0, epoch 1, ...; rank r takes its slice. The tail of an epoch that does not
    fill a global micro-batch is skipped, so every rank sees full micro-batches.
    """
    per_global = micro_batch * world_size
    per_epoch = num_rows // per_global
    if per_epoch == 0:
        raise DataError(f"the training split has {num_rows} sequences, fewer than one global micro-batch "
                        f"({micro_batch} x {world_size} ranks)")
    epoch, k = divmod(micro_index, per_epoch)
    start = k * per_global + rank * micro_batch
    return [epoch_row(p, num_rows, seed, epoch) for p in range(start, start + micro_batch)]


def hf_validation_loss(model_dir: str, cache_folder: str, micro_batch: int = 2) -> float:
    """Mean loss per trained token of a Hugging Face model directory on a cache's validation split, as the
    worker computes it (a check outside DeepSpeed: e.g. the original model before fine-tuning vs the export)."""
    import torch
    from transformers import AutoModelForCausalLM

    val = TokenCache(cache_folder).validation
    if val is None:
        raise DataError(f"{cache_folder} has no validation split")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(val), micro_batch):
            batch = {k: torch.from_numpy(v) for k, v in val.batch(list(range(start, min(start + micro_batch,
                                                                                         len(val))))).items()}
            n = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
            total += float(model(**batch).loss) * n
            tokens += n
    return total / tokens
