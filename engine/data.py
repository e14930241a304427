"""Datasets for the training worker: read, check, tokenize, pack or pad, split, order.

Every malformed or empty record is reported as `file:line: what` (DataError), so a bad dataset
gives one `error:` line, not a traceback from deep inside a rank. The order of sequences is a
pure function of (seed, epoch), so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

IGNORE_INDEX = -100
"""Label of tokens that do not count in the loss (prompt tokens, padding); transformers' convention."""


class DataError(Exception):
    """A dataset or tokenizer problem with a one-line message naming the file (and line)."""


@dataclass
class Sample:
    """One training example before tokenization: (text, counts-in-loss) segments."""

    segments: list[tuple[str, bool]]
    where: str
    """file:line, for error messages."""


# --- reading ------------------------------------------------------------------------------------


def _records(path: str) -> list[tuple[object, str]]:
    """(record, 'file:line') pairs from JSONL, a JSON list, or a .txt file (one sample per line)."""
    name = os.path.basename(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if path.endswith(".txt"):
        out = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue  # blank lines separate paragraphs in plain text
            out.append(({"text": line}, f"{name}:{i}"))
        return out
    stripped = text.lstrip()
    if path.endswith(".json") or stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{name}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(data, list):
            raise DataError(f"{name}: expected a JSON list of records")
        return [(r, f"{name}:record {i + 1}") for i, r in enumerate(data)]
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            raise DataError(f"{name}:{i}: empty line")
        try:
            out.append((json.loads(line), f"{name}:{i}"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{name}:{i}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    return out


def _alpaca(rec, where: str) -> Sample:
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected an object with instruction/input/output")
    for key in ("instruction", "output"):
        if not isinstance(rec.get(key), str) or not rec[key].strip():
            raise DataError(f"{where}: alpaca record needs a non-empty string {key!r}")
    inp = rec.get("input") or ""
    if not isinstance(inp, str):
        raise DataError(f"{where}: 'input' must be a string")
    prompt = rec["instruction"] + ("\n" + inp if inp else "") + "\n"
    return Sample(segments=[(prompt, False), (rec["output"], True)], where=where)


_SHAREGPT_ROLES = {"human": False, "user": False, "system": False, "gpt": True, "assistant": True}


def _sharegpt(rec, where: str) -> Sample:
    conv = rec.get("conversations") if isinstance(rec, dict) else None
    if not isinstance(conv, list) or not conv:
        raise DataError(f"{where}: sharegpt record needs a non-empty 'conversations' list")
    segs = []
    for j, turn in enumerate(conv):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str) or turn.get("from") not in _SHAREGPT_ROLES:
            raise DataError(f"{where}: conversations[{j}] needs 'from' (human/gpt/system) and a string 'value'")
        segs.append((turn["value"] + "\n", _SHAREGPT_ROLES[turn["from"]]))
    if not any(train for _, train in segs):
        raise DataError(f"{where}: conversation has no gpt/assistant turn to learn from")
    return Sample(segments=segs, where=where)


def _text(rec, where: str, field: str) -> Sample:
    value = rec.get(field) if isinstance(rec, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: text record needs a non-empty string {field!r}")
    return Sample(segments=[(value, True)], where=where)


def read_samples(path: str, fmt: str, text_field: str = "text") -> list[Sample]:
    """All samples of the file, checked; DataError on the first bad one or an empty file."""
    if not os.path.isfile(path):
        raise DataError(f"dataset file {path} does not exist")
    records = _records(path)
    if not records:
        raise DataError(f"{os.path.basename(path)}: the dataset is empty")
    if fmt == "alpaca":
        return [_alpaca(r, w) for r, w in records]
    if fmt == "sharegpt":
        return [_sharegpt(r, w) for r, w in records]
    return [_text(r, w, text_field) for r, w in records]


# --- tokenizing ---------------------------------------------------------------------------------


class TokenizerWrapper:
    """The few calls the worker needs, over a `tokenizers.Tokenizer` (tokenizer.json)."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer

        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise DataError(f"tokenizer {path}: no tokenizer.json found (only fast tokenizers are supported)")
        try:
            self.tok = Tokenizer.from_file(file)
        except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
            raise DataError(f"tokenizer {file}: cannot load ({str(exc).splitlines()[0]})") from None
        self.file = file
        self.folder = os.path.dirname(file)
        cfg = _tokenizer_config(self.folder) if os.path.isdir(path) else {}
        vocab = self.tok.get_vocab()
        self.eos_token = _pick(cfg.get("eos_token"), vocab, ("<|end|>", "</s>", "<|endoftext|>", "<eos>", "<|im_end|>"))
        self.pad_token = _pick(cfg.get("pad_token"), vocab, ("<pad>", "<|pad|>", "[PAD]")) or self.eos_token
        if self.eos_token is None:
            raise DataError(f"tokenizer {file}: no end-of-sequence token found (looked for </s>, <|end|>, ...)")
        self.eos_id = vocab[self.eos_token]
        self.pad_id = vocab[self.pad_token]
        self.vocab_size = self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


def _tokenizer_config(folder: str) -> dict:
    try:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return {}
    out = {}
    for key in ("eos_token", "pad_token"):
        v = cfg.get(key)
        out[key] = v.get("content") if isinstance(v, dict) else v
    return out


def _pick(preferred, vocab: dict, candidates) -> str | None:
    if isinstance(preferred, str) and preferred in vocab:
        return preferred
    return next((c for c in candidates if c in vocab), None)


def tokenize(sample: Sample, tok: TokenizerWrapper) -> tuple[list[int], list[int]]:
    """(input ids, labels) with prompt tokens masked and an end-of-sequence token appended."""
    ids: list[int] = []
    labels: list[int] = []
    for text, train in sample.segments:
        part = tok.encode(text)
        ids += part
        labels += part if train else [IGNORE_INDEX] * len(part)
    ids.append(tok.eos_id)
    labels.append(tok.eos_id)
    return ids, labels


@dataclass
class Sequences:
    """Fixed-length rows ready for batching (plain lists: the worker turns them into tensors)."""

    input_ids: list[list[int]]
    labels: list[list[int]]
    attention_mask: list[list[int]] | None
    """None when packing (every position is real)."""

    def __len__(self) -> int:
        return len(self.input_ids)


def build_sequences(samples: list[Sample], tok: TokenizerWrapper, seq_len: int, packing: bool) -> Sequences:
    """Pack (concatenate, cut seq_len chunks, drop the tail) or pad (truncate/pad each sample)."""
    if packing:
        stream_ids: list[int] = []
        stream_labels: list[int] = []
        for s in samples:
            ids, labels = tokenize(s, tok)
            stream_ids += ids
            stream_labels += labels
        n = len(stream_ids) // seq_len
        return Sequences([stream_ids[i * seq_len:(i + 1) * seq_len] for i in range(n)],
                         [stream_labels[i * seq_len:(i + 1) * seq_len] for i in range(n)], None)
    rows, labs, masks = [], [], []
    for s in samples:
        ids, labels = tokenize(s, tok)
        ids, labels = ids[:seq_len], labels[:seq_len]
        pad = seq_len - len(ids)
        rows.append(ids + [tok.pad_id] * pad)
        labs.append(labels + [IGNORE_INDEX] * pad)
        masks.append([1] * len(ids) + [0] * pad)
    return Sequences(rows, labs, masks)


def split(samples: list[Sample], fraction: float, seed: int) -> tuple[list[Sample], list[Sample]]:
    """(train, validation): a seeded shuffle of sample indices, validation takes the first share."""
    if fraction <= 0:
        return samples, []
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    n_val = max(1, int(round(fraction * len(samples))))
    if n_val >= len(samples):
        raise DataError(f"validation_split {fraction} leaves no training samples out of {len(samples)}")
    val = set(order[:n_val])
    return [s for i, s in enumerate(samples) if i not in val], [samples[i] for i in sorted(val)]


def epoch_order(num_rows: int, seed: int, epoch: int) -> list[int]:
    """Row order of one epoch; a pure function of (seed, epoch) so resume replays it exactly."""
    order = list(range(num_rows))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def micro_batch_rows(num_rows: int, seed: int, micro_index: int, *, micro_batch: int, world_size: int,
                     rank: int) -> list[int]:
    """Row indices of one rank's micro-batch number `micro_index` (counted over the whole run).

    Global micro-batch k covers world_size x micro_batch consecutive rows of the endless
    sequence epoch 0, epoch 1, ...; rank r takes its slice. The tail of an epoch that does not
    fill a global micro-batch is skipped, so every rank sees full micro-batches.
    """
    per_global = micro_batch * world_size
    per_epoch = num_rows // per_global
    if per_epoch == 0:
        raise DataError(f"the training split has {num_rows} sequences, fewer than one global micro-batch "
                        f"({micro_batch} x {world_size} ranks)")
    epoch, k = divmod(micro_index, per_epoch)
    order = epoch_order(num_rows, seed, epoch)
    start = k * per_global + rank * micro_batch
    return order[start:start + micro_batch]
