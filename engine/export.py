"""Hugging Face export that streams: one tensor in host memory at a time, never a whole shard.

safetensors files are a JSON header (names, dtypes, shapes, byte offsets) followed by the raw
tensor bytes. Every shape and dtype is known before the first byte (ZeRO-3 keeps `ds_shape` on
each partitioned parameter; a checkpoint export reads them from RUN/hf/params.json), so the shard
layout and headers are planned first and each tensor is written the moment it has been gathered,
then dropped. Two sources use the same writer:

* `export_model` - the live ZeRO-3 model at the end of training (every rank gathers each parameter
  in turn, rank 0 writes it);
* `export_checkpoint` - the fp32 master partitions of a saved checkpoint (engine/run_checkpoint.py
  layout), re-assembled per tensor from the ranks' files with numpy only: no torch, no DeepSpeed.

The output folder gets the run's config.json, generation_config.json and tokenizer files (with the
chat template) from RUN/hf/ (engine/tokenize_job.py), and is renamed into place only when complete; with
`merge` (the final model of a LLaMA-Factory recipe, written into the run directory itself) its files are moved in
beside the run's own, config.json last.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct

import numpy as np

from memascend_cli.run.rundir import FINAL_MODEL_TMP, MODEL_CONFIG, is_model_file

SHARD_BYTES = 2 * 1024**3
"""Largest safetensors file (bytes); a bigger single tensor gets a file of its own."""
PARAMS_FILE = "params.json"
"""RUN/hf/params.json: [name, shape] of every parameter in the order the optimizer partitions them."""
ST_DTYPES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "float16": ("F16", 2)}
PRECISION_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class ExportError(Exception):
    """A one-line reason the export cannot be written."""


class ShardedSafetensorsWriter:
    """Writes tensors, in a fixed order, into planned safetensors shards (+ index when several)."""

    def __init__(self, folder: str, entries: list[tuple[str, tuple[int, ...], str]], shard_bytes: int = SHARD_BYTES):
        self.folder = folder
        self.entries = entries
        shards: list[list[int]] = [[]]
        size = 0
        for i, (_, shape, dtype) in enumerate(entries):
            nbytes = math.prod(shape) * ST_DTYPES[dtype][1]
            if shards[-1] and size + nbytes > shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(i)
            size += nbytes
        self.shards = shards
        n = len(shards)
        self.names = ["model.safetensors"] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
        self.shard_of = {i: k for k, idx in enumerate(shards) for i in idx}
        self.next = 0
        self.file = None
        self.current = -1
        self.expected_bytes = 0
        self.written = 0
        self.total_bytes = sum(math.prod(s) * ST_DTYPES[d][1] for _, s, d in entries)

    def _open(self, k: int) -> None:
        if self.file is not None:
            self._finish()
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for i in self.shards[k]:
            name, shape, dtype = self.entries[i]
            nbytes = math.prod(shape) * ST_DTYPES[dtype][1]
            header[name] = {"dtype": ST_DTYPES[dtype][0], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
        self.file = open(os.path.join(self.folder, self.names[k]), "wb")
        self.file.write(struct.pack("<Q", len(blob)))
        self.file.write(blob)
        self.current, self.expected_bytes, self.written = k, offset, 0

    def _finish(self) -> None:
        if self.written != self.expected_bytes:
            raise ExportError(f"{self.names[self.current]}: wrote {self.written} of {self.expected_bytes} bytes")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self.file = None

    def write(self, name: str, data: np.ndarray) -> None:
        """The bytes of the next tensor (raw little-endian, already in the entry's dtype)."""
        if self.next >= len(self.entries) or self.entries[self.next][0] != name:
            want = self.entries[self.next][0] if self.next < len(self.entries) else "nothing"
            raise ExportError(f"export order: got {name}, expected {want}")
        _, shape, dtype = self.entries[self.next]
        buf = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if buf.size != math.prod(shape) * ST_DTYPES[dtype][1]:
            raise ExportError(f"{name}: {buf.size} bytes, expected shape {shape} of {dtype}")
        k = self.shard_of[self.next]
        if k != self.current:
            self._open(k)
        self.file.write(memoryview(buf))
        self.written += buf.size
        self.next += 1

    def close(self) -> None:
        if self.next != len(self.entries):
            raise ExportError(f"export stopped after {self.next} of {len(self.entries)} tensors")
        if self.file is not None:
            self._finish()
        if len(self.names) > 1:
            weight_map = {self.entries[i][0]: self.names[k] for k, idx in enumerate(self.shards) for i in idx}
            with open(os.path.join(self.folder, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}, f, indent=1)


def fp32_to(arr: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 -> the export dtype with round-to-nearest-even (what torch's .to() does); bf16 as uint16 bits."""
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if dtype == "float32":
        return arr
    if dtype == "float16":
        with np.errstate(over="ignore"):  # out of fp16 range -> inf, as torch does
            return arr.astype(np.float16)
    bits = arr.view(np.uint32).astype(np.uint64)
    out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    out[np.isnan(arr)] = 0x7FC0
    return out


def _copy_skeleton(hf_dir: str, out: str) -> None:
    if not os.path.isdir(hf_dir):
        raise ExportError(f"{hf_dir} is missing (config and tokenizer files); run `memascend train` in this run "
                          "directory first")
    for name in os.listdir(hf_dir):
        if name != PARAMS_FILE:
            shutil.copy2(os.path.join(hf_dir, name), os.path.join(out, name))


def _begin(out_dir: str, merge: bool) -> str:
    tmp = os.path.join(out_dir, FINAL_MODEL_TMP) if merge else out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    return tmp


def _commit(tmp: str, out_dir: str, merge: bool) -> str:
    if not merge:
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
        return out_dir
    # Beside other files: the previous config.json goes first and the new one comes last, so a folder caught in
    # between holds no config.json (from_pretrained refuses it) rather than old and new weights mixed; files of the
    # previous model the new one does not have (another shard count, a chat template) are removed.
    new = set(os.listdir(tmp))
    config = os.path.join(out_dir, MODEL_CONFIG)
    if os.path.exists(config):
        os.unlink(config)
    for name in os.listdir(out_dir):
        if is_model_file(name) and name not in new:
            os.unlink(os.path.join(out_dir, name))
    for name in sorted(new - {MODEL_CONFIG}) + [MODEL_CONFIG]:
        os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
    os.rmdir(tmp)
    return out_dir


def write_params_file(model, hf_dir: str) -> None:
    """RUN/hf/params.json from the ZeRO-3 model (rank 0, at the start of training)."""
    params = [[name, list(getattr(p, "ds_shape", p.shape))] for name, p in model.named_parameters()]
    tmp = os.path.join(hf_dir, PARAMS_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(params, f)
    os.replace(tmp, os.path.join(hf_dir, PARAMS_FILE))


def export_model(model, out_dir: str, hf_dir: str, rank: int, precision: str, shard_bytes: int = SHARD_BYTES, *,
                 merge: bool = False) -> str:
    """Collective: gather each parameter of the ZeRO-3 model in turn; rank 0 streams it into the export.

    merge: out_dir holds other files (the run directory): the model's files join them instead of replacing the
    folder."""
    import deepspeed
    import torch

    dtype = PRECISION_DTYPE[precision]
    params = list(model.named_parameters())
    writer = tmp = None
    if rank == 0:
        tmp = _begin(out_dir, merge)
        entries = [(n, tuple(getattr(p, "ds_shape", p.shape)), dtype) for n, p in params]
        writer = ShardedSafetensorsWriter(tmp, entries, shard_bytes)
    torch_dtype = getattr(torch, dtype)
    for name, param in params:
        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            if rank == 0:
                t = param.data.detach().to("cpu", torch_dtype).contiguous()
                writer.write(name, t.view(-1).view(torch.uint8).numpy())
                del t
    if rank != 0:
        return out_dir
    writer.close()
    _copy_skeleton(hf_dir, tmp)
    return _commit(tmp, out_dir, merge)


def export_checkpoint(checkpoint_dir: str, hf_dir: str, out_dir: str, precision: str,
                      shard_bytes: int = SHARD_BYTES, *, merge: bool = False) -> str:
    """Re-assemble the fp32 master weights of a checkpoint and stream them into an HF export (numpy only); merge as
    in export_model."""
    try:
        with open(os.path.join(hf_dir, PARAMS_FILE), encoding="utf-8") as f:
            params = [(n, tuple(s)) for n, s in json.load(f)]
        with open(os.path.join(checkpoint_dir, "trainer.json"), encoding="utf-8") as f:
            world = int(json.load(f)["world_size"])
    except (OSError, ValueError, KeyError) as exc:
        raise ExportError(f"cannot read the run's parameter list or {checkpoint_dir}/trainer.json ({exc})") from None
    # Rank r's fp32 stream: its sub-groups' master partitions back to back, i.e. the partitions of the
    # parameters in order, each ceil(numel / world) elements (partition_parameters.py _partition_param).
    streams = []
    for r in range(world):
        with open(os.path.join(checkpoint_dir, f"rank-{r:05d}.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        data = np.memmap(os.path.join(checkpoint_dir, f"rank-{r:05d}.bin"), dtype=np.float32, mode="r")
        pieces = [(g["tensors"]["fp32"]["offset_bytes"] // 4, g["tensors"]["fp32"]["numel"]) for g in manifest["groups"]]
        streams.append((data, pieces))
    part = [-(-math.prod(s) // world) for _, s in params]
    expected = sum(part)
    for data, pieces in streams:
        if sum(n for _, n in pieces) != expected:
            raise ExportError(f"{checkpoint_dir}: the checkpoint holds {sum(n for _, n in pieces)} master elements per "
                              f"rank, the model's {len(params)} parameters need {expected}")

    def read(stream, start: int, n: int) -> np.ndarray:
        data, pieces = stream
        out, pos, need = [], 0, n
        for off, length in pieces:
            if start < pos + length and need:
                a = max(start, pos) - pos
                take = min(length - a, need)
                out.append(np.asarray(data[off + a: off + a + take]))
                need -= take
                start += take
            pos += length
        return np.concatenate(out) if len(out) != 1 else out[0]

    dtype = PRECISION_DTYPE[precision]
    tmp = _begin(out_dir, merge)
    writer = ShardedSafetensorsWriter(tmp, [(n, s, dtype) for n, s in params], shard_bytes)
    offset = 0
    for (name, shape), p in zip(params, part):
        full = np.concatenate([read(streams[r], offset, p) for r in range(world)])[: math.prod(shape)]
        writer.write(name, fp32_to(full, dtype))
        offset += p
        del full
    writer.close()
    _copy_skeleton(hf_dir, tmp)
    return _commit(tmp, out_dir, merge)
