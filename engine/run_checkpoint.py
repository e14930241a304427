"""Exactly resumable checkpoints of a ZeRO-3 run whose optimizer states live on the SSD.

Stock DeepSpeed's save/load with offload_optimizer=nvme does not resume exactly (its own
tests/unit/runtime/zero/test_nvme_checkpointing.py fails for every optimizer-on-NVMe case), so the
state is saved here, from the optimizer itself:

* per optimizer sub-group: the fp32 master partition, Adam exp_avg / exp_avg_sq and the step,
  read by swapping the sub-group in exactly as `step()` does and released without a write;
* the scheduler, the optimizer's learning rates, the loss scaler, the engine's counters, the RNG
  states and the data position (micro-batches consumed).

Layout: checkpoints/step-0000010/{trainer.json, rank-00000.json, rank-00000.bin, ..., COMPLETE}.
Each rank writes raw little-endian fp32 arrays plus a JSON manifest; everything is written into
`.tmp-step-0000010`, fsynced, the COMPLETE marker is written last, and only then is the folder
renamed to its final name. A checkpoint without COMPLETE is never used, so a crash or SIGKILL at
any point leaves the previous complete checkpoint as the newest one.

Integrity: each rank's manifest records the CRC-32C and size of its .bin (computed while writing);
COMPLETE records the CRC-32C of trainer.json and of every rank manifest. `load` verifies the
chain (COMPLETE -> JSON files -> .bin) before using any byte and raises CheckpointCorrupt naming
the file. A failed write (disk full, I/O error) raises CheckpointWriteError; the unfinished
`.tmp-` folder is never used and the previous complete checkpoint stays the newest.
"""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import torch
from memascend_engine.checkpoint_integrity import (
    CORRUPT_HINT,
    CheckpointCorrupt,
    crc32c,
    file_crc32c,
    fsync_dir,
    verify_file,
)
from memascend_engine.ds_internals import optimizer_state as ds_state

from memascend_cli.errors import MemascendError
from memascend_cli.run.rundir import COMPLETE

TRAINER = "trainer.json"
FORMAT_VERSION = 1


class CheckpointWriteError(MemascendError):
    """Writing a checkpoint failed (e.g. the disk is full); the previous complete one is intact."""


def step_dirname(step: int) -> str:
    return f"step-{step:07d}"


def latest_complete(root: str) -> str | None:
    """The newest checkpoint folder under `root` that has its COMPLETE marker, else None."""
    if not os.path.isdir(root):
        return None
    done = [n for n in os.listdir(root)
            if n.startswith("step-") and os.path.isfile(os.path.join(root, n, COMPLETE))
            and os.path.isfile(os.path.join(root, n, TRAINER))]
    return os.path.join(root, max(done)) if done else None


def _write_json(path: str, data: dict) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise _write_error(os.path.dirname(path), exc) from None


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state().tolist(), "python": _py_state_to_json(random.getstate())}


def _py_state_to_json(state):
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _set_rng_state(data: dict) -> None:
    torch.set_rng_state(torch.tensor(data["torch"], dtype=torch.uint8))
    version, internal, gauss = data["python"]
    random.setstate((version, tuple(internal), gauss))


def save_rank_state(engine, folder: str, rank: int) -> None:
    """Write this rank's optimizer partitions into `folder` (rank-R.bin + rank-R.json, fsynced)."""
    access = ds_state.OptimizerStateAccess(engine)
    groups = []
    offset = 0
    bin_path = os.path.join(folder, f"rank-{rank:05d}.bin")
    bin_crc = 0
    with open(bin_path, "wb") as f:
        for i in range(access.num_groups):
            # Read as step() does; the SSD copy is untouched.
            step, tensors = access.read(i)
            entry = {"numel": access.numel(i), "step": step, "tensors": {}}
            for name in ("fp32", *ds_state.ADAM_STATES):
                if name not in tensors:
                    continue
                arr = tensors[name].detach().to(torch.float32).contiguous().numpy()
                f.write(memoryview(arr).cast("B"))  # not arr.tofile: its OSError has no errno (disk full)
                bin_crc = crc32c(arr, bin_crc)
                entry["tensors"][name] = {"offset_bytes": offset, "numel": int(arr.size)}
                offset += arr.nbytes
            groups.append(entry)
        f.flush()
        os.fsync(f.fileno())
    manifest = {
        "format_version": FORMAT_VERSION,
        "rank": rank,
        "groups": groups,
        "lrs": ds_state.optimizer_lrs(engine),
        "loss_scaler": ds_state.loss_scaler_state(engine),
        "rng": _rng_state(),
        "bin": {"bytes": offset, "crc32c": bin_crc},
    }
    _write_json(os.path.join(folder, f"rank-{rank:05d}.json"), manifest)


def _as_int(v):
    if v is None:
        return None
    return int(v.item()) if torch.is_tensor(v) else int(v)


def save(engine, root: str, step: int, trainer_state: dict, *, rank: int, world_size: int, keep: int, barrier) -> str:
    """Collective: every rank calls it after optimizer step `step`. Returns the checkpoint folder."""
    final = os.path.join(root, step_dirname(step))
    tmp = os.path.join(root, ".tmp-" + step_dirname(step))
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    barrier()
    try:
        save_rank_state(engine, tmp, rank)
    except OSError as exc:
        raise _write_error(tmp, exc) from None
    barrier()
    if rank == 0:
        state = {"format_version": FORMAT_VERSION, "step": step, "world_size": world_size,
                 "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
                 "engine": ds_state.engine_counters(engine),
                 **trainer_state}
        _write_json(os.path.join(tmp, TRAINER), state)
        fsync_dir(tmp)
        if os.environ.get("MEMASCEND_FAULT_KILL_DURING_CHECKPOINT") == str(step):
            # Fault injection for tests: die with every file but the marker written.
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        # The marker goes last: everything it vouches for is already on disk.
        names = [TRAINER] + [f"rank-{r:05d}.json" for r in range(world_size)]
        files = {}
        for n in names:
            crc, nbytes = file_crc32c(os.path.join(tmp, n))
            files[n] = {"bytes": nbytes, "crc32c": crc}
        _write_json(os.path.join(tmp, COMPLETE), {"step": step, "files": files})
        fsync_dir(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(root)
        prune(root, keep)
    barrier()
    return final


def _write_error(tmp: str, exc: OSError) -> CheckpointWriteError:
    return CheckpointWriteError(
        f"cannot write checkpoint {tmp}: {exc.strerror or exc} ({exc.filename or tmp}); the previous complete "
        "checkpoint is intact", "free space in the checkpoint directory, then `memascend train RECIPE --resume`")


def verify(folder: str, rank: int) -> None:
    """Check `folder`'s files for `rank` against the checksums recorded at save (CheckpointCorrupt if not).

    Checkpoints written before checksums existed (no "files" in COMPLETE) are accepted as they are."""
    with open(os.path.join(folder, COMPLETE), encoding="utf-8") as f:
        marker = json.load(f)
    files = marker.get("files")
    if files is None:
        return
    rank_json = f"rank-{rank:05d}.json"
    for n in (TRAINER, rank_json):
        if n not in files:
            raise CheckpointCorrupt(f"checkpoint {folder}: COMPLETE lists no checksum for {n}",
                                    CORRUPT_HINT.format(folder=folder))
        verify_file(os.path.join(folder, n), files[n]["crc32c"], files[n]["bytes"], f"{folder}/{COMPLETE}")
    with open(os.path.join(folder, rank_json), encoding="utf-8") as f:
        b = json.load(f).get("bin")
    if b is not None:
        verify_file(os.path.join(folder, f"rank-{rank:05d}.bin"), b["crc32c"], b["bytes"], f"{folder}/{rank_json}")


def prune(root: str, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints, and stale temporary folders."""
    done = sorted(n for n in os.listdir(root) if n.startswith("step-") and os.path.isfile(os.path.join(root, n, COMPLETE)))
    for n in done[:-keep]:
        shutil.rmtree(os.path.join(root, n), ignore_errors=True)
    newest = done[-1] if done else None
    for n in os.listdir(root):
        if n.startswith(".tmp-") and (newest is None or n[len(".tmp-"):] < newest):
            shutil.rmtree(os.path.join(root, n), ignore_errors=True)


def read_trainer_state(folder: str) -> dict:
    with open(os.path.join(folder, TRAINER), encoding="utf-8") as f:
        return json.load(f)


def load(engine, folder: str, *, rank: int, world_size: int) -> dict:
    """Restore this rank from `folder` (collective only through DeepSpeed's own param swap-out).

    Returns the trainer state (step, data position, ...).
    """
    verify(folder, rank)
    state = read_trainer_state(folder)
    if state["world_size"] != world_size:
        raise ValueError(f"checkpoint {folder} was written by {state['world_size']} rank(s), this run has {world_size}")
    with open(os.path.join(folder, f"rank-{rank:05d}.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    access = ds_state.OptimizerStateAccess(engine)
    if len(manifest["groups"]) != access.num_groups:
        raise ValueError(f"checkpoint {folder} has {len(manifest['groups'])} optimizer groups, the run has "
                         f"{access.num_groups} (different sub_group_size, model or engine?)")
    data = np.memmap(os.path.join(folder, f"rank-{rank:05d}.bin"), dtype=np.float32, mode="r")

    def array(meta) -> torch.Tensor:
        start = meta["offset_bytes"] // 4
        return torch.from_numpy(np.array(data[start:start + meta["numel"]]))

    for i, entry in enumerate(manifest["groups"]):
        numel = access.numel(i)
        if entry["numel"] != numel:
            raise ValueError(f"checkpoint {folder}: optimizer group {i} has {entry['numel']} elements, the run {numel}")
        access.write(i, entry["step"], {name: array(meta) for name, meta in entry["tensors"].items()})
    ds_state.set_optimizer_lrs(engine, manifest["lrs"])
    ds_state.set_loss_scaler_state(engine, manifest.get("loss_scaler", {}))
    if engine.lr_scheduler is not None and state.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    ds_state.set_engine_counters(engine, state["engine"])
    steps = [e["step"] for e in manifest["groups"] if e["step"] is not None]
    if steps:
        ds_state.prime_cpu_adam(engine, max(steps))
    ds_state.invalidate_secondary_tensors(engine)
    _set_rng_state(manifest["rng"])
    return state
