"""/proc/self readers shared by the training worker and the benchmark jobs (no torch)."""


def status_kib(field: str) -> int:
    """A /proc/self/status field in KiB (VmRSS, VmHWM, VmLck, ...); 0 when absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0
