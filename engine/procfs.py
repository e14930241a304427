"""Process helpers shared by the training worker, the parity script and the benchmark jobs (no torch)."""

import os


def status_kib(field: str) -> int:
    """A /proc/self/status field in KiB (VmRSS, VmHWM, VmLck, ...); 0 when absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def single_rank_defaults() -> None:
    """Environment of a one-process job started without a launcher (else DeepSpeed's init_distributed
    tries MPI discovery): rank 0 of 1 on the CPU accelerator, a port derived from the pid."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
