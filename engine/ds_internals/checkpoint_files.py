"""A rank's optimizer state in DeepSpeed's own checkpoint layout, for ``engine.save_checkpoint`` / ``load_checkpoint``.

With the optimizer on NVMe, DeepSpeed's ``save_checkpoint`` writes the scalar optimizer state (loss scaler, step
counts, learning rates) into ``<tag>/zero_pp_rank_R_mp_rank_00_optim_states.pt`` and copies the swap folder into
``<tag>/offloaded_tensors/rank<R>/`` (engine.py save_checkpoint): per sub-group ``<ds_id>.tensor.swp`` (fp32 master),
``exp_avg-<ds_id>.tensor.swp`` and ``exp_avg_sq-<ds_id>.tensor.swp``, raw fp32 padded to DeepSpeed's I/O alignment
(optimizer_utils.py OptimizerStateSwapInfo / SwapTensorContext). With memascend's engine the state lives in region
extents, not in that folder, so checkpoint_api.DeepSpeedApi writes exactly those files from the
region here, plus ``memascend-offloaded.json``: per sub-group its numel, step and each file's size and CRC-32C. Loading
verifies the checksums first, then writes the state back into the region (and the model-dtype parameters derived from
the masters). A folder without the manifest (stock DeepSpeed wrote it, or it is incomplete) is refused.

``access`` is optimizer_state.OptimizerStateAccess: groups (memascend's chunks or DeepSpeed's sub-groups) with
``read(i)``, ``write(i, step, tensors)``, ``numel(i)``, ``subgroup_of(i) -> (sub-group, element offset)`` and
``subgroups() -> [(ds_id, numel)]``.
"""

from __future__ import annotations

import contextlib
import json
import os

import torch
from memascend_engine.checkpoint_integrity import CheckpointCorrupt, crc32c, fsync_dir, verify_file

MANIFEST = "memascend-offloaded.json"
FORMAT_VERSION = 1
STATE_FILES = {"fp32": "{ds_id}.tensor.swp", "exp_avg": "exp_avg-{ds_id}.tensor.swp",
               "exp_avg_sq": "exp_avg_sq-{ds_id}.tensor.swp"}
"""DeepSpeed's swap-file names of a sub-group's fp32 master and Adam moments (SwapTensorContext: f'{ds_id}.tensor.swp',
with state tensors named f'{state}-{ds_id}', optimizer_utils.py _get_state_tensors)."""


class _SubgroupWriter:
    """The open files of one sub-group while its groups stream in."""

    def __init__(self, folder: str, ds_id: str, numel: int, step: int | None, names):
        self.folder, self.ds_id, self.numel, self.step = folder, ds_id, int(numel), step
        self.files = {n: open(os.path.join(folder, STATE_FILES[n].format(ds_id=ds_id)), "wb")  # noqa: SIM115
                      for n in names}  # closed by close()
        self.crc = dict.fromkeys(self.files, 0)
        self.written = 0

    def append(self, tensors: dict) -> None:
        n = None
        for name, f in self.files.items():
            arr = tensors[name].detach().to(torch.float32).contiguous().numpy()
            f.write(memoryview(arr).cast("B"))
            self.crc[name] = crc32c(arr, self.crc[name])
            n = arr.size
        self.written += int(n or 0)

    def close(self, numel_alignment: int) -> dict:
        if self.written != self.numel:
            raise RuntimeError(f"sub-group {self.ds_id}: wrote {self.written} of {self.numel} elements")
        pad = (-self.numel) % max(1, numel_alignment)
        entry = {"ds_id": self.ds_id, "numel": self.numel, "step": self.step, "files": {}}
        for name, f in self.files.items():
            if pad:
                zeros = bytes(4 * pad)
                f.write(zeros)
                self.crc[name] = crc32c(zeros, self.crc[name])
            f.flush()
            os.fsync(f.fileno())
            f.close()
            entry["files"][name] = {"name": os.path.basename(f.name), "bytes": 4 * (self.numel + pad),
                                    "crc32c": self.crc[name]}
        return entry


def export_rank(access, folder: str, *, numel_alignment: int) -> dict:
    """Write every sub-group's master and moments into `folder` (DeepSpeed's names), then the manifest."""
    os.makedirs(folder, exist_ok=True)
    subgroups = access.subgroups()
    entries: list[dict | None] = [None] * len(subgroups)
    current: _SubgroupWriter | None = None
    current_g = None
    for i in range(access.num_groups):
        g, offset = access.subgroup_of(i)
        step, tensors = access.read(i)
        if g != current_g:
            if current is not None:
                entries[current_g] = current.close(numel_alignment)
            ds_id, numel = subgroups[g]
            current, current_g = _SubgroupWriter(folder, ds_id, numel, step, list(tensors)), g
        if offset != current.written:
            raise RuntimeError(f"sub-group {current.ds_id}: group {i} starts at element {offset}, "
                               f"expected {current.written}")
        current.append(tensors)
    if current is not None:
        entries[current_g] = current.close(numel_alignment)
    missing = [g for g, e in enumerate(entries) if e is None]
    if missing:
        raise RuntimeError(f"sub-groups {missing} have no optimizer group")
    manifest = {"format_version": FORMAT_VERSION, "sub_groups": entries}
    path = os.path.join(folder, MANIFEST)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(folder)
    return manifest


def _manifest(folder: str) -> dict:
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        raise CheckpointCorrupt(
            f"{folder} has no {MANIFEST}: the checkpoint was not written with memascend's engine installed (stock "
            "DeepSpeed's NVMe optimizer checkpoints do not restore the optimizer exactly), or it is incomplete",
            "load it without memascend_engine.install(), or use a checkpoint written with the engine installed")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def import_rank(access, folder: str) -> list[int | None]:
    """Restore every group of `access` from `folder` after checking every file against the manifest (CheckpointCorrupt
    on a missing or damaged one). Returns the step of each sub-group (None before the first step)."""
    if not os.path.isdir(folder):
        raise CheckpointCorrupt(f"checkpoint folder {folder} is missing: the checkpoint holds no optimizer state for "
                                "this rank", "load a checkpoint written by engine.save_checkpoint with the same ranks")
    manifest = _manifest(folder)
    subgroups = access.subgroups()
    entries = manifest["sub_groups"]
    if len(entries) != len(subgroups):
        raise CheckpointCorrupt(f"checkpoint {folder} has {len(entries)} optimizer sub-groups, this run "
                                f"{len(subgroups)} (a different model, world size or sub_group_size?)",
                                "load it with the configuration that wrote it")
    for g, (entry, (_, numel)) in enumerate(zip(entries, subgroups)):
        if int(entry["numel"]) != int(numel):
            raise CheckpointCorrupt(f"checkpoint {folder}: sub-group {g} holds {entry['numel']} elements, this run "
                                    f"{numel}", "load it with the configuration that wrote it")
        if "fp32" not in entry["files"]:
            raise CheckpointCorrupt(f"checkpoint {folder}: no fp32 master of sub-group {entry['ds_id']}",
                                    "the checkpoint is incomplete; use an earlier one")
        for meta in entry["files"].values():
            verify_file(os.path.join(folder, meta["name"]), meta["crc32c"], meta["bytes"],
                         os.path.join(folder, MANIFEST))
    with contextlib.ExitStack() as stack:
        handles: dict[str, int] = {}
        for i in range(access.num_groups):
            g, offset = access.subgroup_of(i)
            n = access.numel(i)
            entry = entries[g]
            tensors = {}
            for name, meta in entry["files"].items():
                p = os.path.join(folder, meta["name"])
                if p not in handles:
                    handles[p] = stack.enter_context(open(p, "rb", buffering=0)).fileno()
                buf = bytearray(4 * n)
                got = os.preadv(handles[p], [buf], 4 * offset)
                if got != len(buf):
                    raise CheckpointCorrupt(f"checkpoint file {p} is shorter than recorded",
                                            "the checkpoint is incomplete; use an earlier one")
                tensors[name] = torch.frombuffer(buf, dtype=torch.float32)
            step = entry.get("step")
            if step is None or "exp_avg" not in tensors or "exp_avg_sq" not in tensors:
                step, tensors = None, {"fp32": tensors["fp32"]}
            access.write(i, step, tensors)
    return [e.get("step") for e in entries]
