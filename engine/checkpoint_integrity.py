"""Checksummed files of a checkpoint: CRC-32C (the native core's), verification, directory fsync.

Shared by memascend's run checkpoints (memascend_engine.run_checkpoint) and the optimizer files written into
DeepSpeed's checkpoint layout (memascend_engine.ds_internals.checkpoint_files).
"""

from __future__ import annotations

import os

from memascend_cli.errors import MemascendError


class CheckpointCorrupt(MemascendError):
    """A checkpoint file does not match the checksum recorded when it was written."""


CORRUPT_HINT = "move {folder} aside and resume from the previous checkpoint (`memascend train RECIPE --resume`)"


def crc32c(data, crc: int = 0) -> int:
    from memascend_engine import native

    return native.crc32c(data, crc)


def file_crc32c(path: str) -> tuple[int, int]:
    """(CRC-32C, size in bytes) of a file, read in 8 MiB blocks."""
    crc, n = 0, 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(8 << 20)
        view = memoryview(buf)
        while True:
            got = f.readinto(buf)
            if not got:
                break
            crc = crc32c(view[:got], crc)
            n += got
    return crc, n


def verify_file(path: str, crc: int, nbytes: int, recorded_in: str) -> None:
    try:
        got, size = file_crc32c(path)
    except FileNotFoundError:
        raise CheckpointCorrupt(f"checkpoint file {path} is missing ({recorded_in} lists it)",
                                CORRUPT_HINT.format(folder=os.path.dirname(path))) from None
    if (got, size) != (crc, nbytes):
        raise CheckpointCorrupt(
            f"checkpoint file {path} is damaged: {size} B with crc32c 0x{got:08x}, {recorded_in} recorded "
            f"{nbytes} B with crc32c 0x{crc:08x}", CORRUPT_HINT.format(folder=os.path.dirname(path)))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
