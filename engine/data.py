"""Training data in a rank: the tokenized cache's format, its memory-mapped splits and the order of samples.

The cache is written once before the launch (data_prepare.py: records read by data_records.py, rendered with the chat
template, tokenized). Every rank memory-maps its files (the page cache is shared by the ranks of a node), a
micro-batch copies its rows out and drops the pages from the rank's mapping again, and the epoch order is a keyed
permutation computed per index, so a rank's host memory for data does not grow with the dataset. The order of
sequences is a pure function of (seed, epoch), so a resumed run sees exactly the batches it would have seen.

Every malformed or empty record, template or tokenizer problem is a DataError with a one-line message naming the file
(and line), so a bad dataset gives one `error:` line, not a traceback.
"""

from __future__ import annotations

import json
import mmap
import os

import numpy as np

IGNORE_INDEX = -100
"""Label of tokens that do not count in the loss (prompt tokens, padding); transformers' convention."""
CACHE_FORMAT = 3
"""3: tool calls and tool results rendered as such (function_call / observation turns), dropped samples by reason."""
META = "meta.json"


class DataError(Exception):
    """A dataset, template or tokenizer problem with a one-line message naming the file (and line)."""


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
