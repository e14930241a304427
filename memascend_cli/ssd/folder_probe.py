"""The SSD bandwidth where a run would put its data when no region has been prepared there: a short O_DIRECT write
and read of a temporary file in that folder with prepare-ssd's own backend, at one setting, measured once per
device and cached, so that `plan` can show a step time on a fresh machine. `prepare-ssd` measures more settings and
keeps its result in the region's header, which the plan prefers."""

from __future__ import annotations

import json
import os
import tempfile

from memascend_cli.units import MiB

PROBE_BYTES = 256 * MiB
"""Written then read once: past a drive's or VM host's write-cache burst, ~0.1 s a direction on a PCIe 4 SSD."""
BLOCK_BYTES = 1 * MiB
QUEUE_DEPTH = 16
"""One request size and depth near the engine's (1 MiB blocks, many in flight), not prepare-ssd's sweep."""
PROBE_VERSION = 1


def _cache_file(st_dev: int) -> str:
    from memascend_cli.defaults import cache_home

    return os.path.join(cache_home("probe"), f"ssd-{os.major(st_dev)}-{os.minor(st_dev)}.json")


def measure(folder: str) -> dict:
    """{"read_gbps", "write_gbps", "backend", "probe_bytes", "block_bytes", "queue_depth", "fstype", "device"} of
    `folder`'s file system, or {"error": why not} (no O_DIRECT, or O_DIRECT not enforced as on tmpfs, no space)."""
    from memascend_cli.ssd.path import path_info
    from memascend_cli.ssd.probe import ProbePlan, probe_bandwidth

    info = path_info(folder)
    if not info.o_direct_ok:
        return {"error": f"{folder}: {info.o_direct_reason}"}
    if (info.free_bytes or 0) < 2 * PROBE_BYTES:
        return {"error": f"{folder}: less than {2 * PROBE_BYTES // MiB} MiB free to measure it"}
    fd, path = tempfile.mkstemp(prefix=".memascend-ssd-probe-", dir=folder)
    try:
        os.posix_fallocate(fd, 0, PROBE_BYTES)
        os.close(fd)
        plan = ProbePlan(offset_bytes=0, length_bytes=PROBE_BYTES, block_sizes_bytes=(BLOCK_BYTES,),
                         queue_depths=(QUEUE_DEPTH,))
        result, _ = probe_bandwidth(path, plan, progress=False)
    except OSError as exc:
        return {"error": f"O_DIRECT I/O in {folder} failed: {exc.strerror}"}
    finally:
        os.unlink(path)
    return {"read_gbps": result.read_gbps, "write_gbps": result.write_gbps, "backend": result.backend,
            "probe_bytes": PROBE_BYTES, "block_bytes": BLOCK_BYTES, "queue_depth": QUEUE_DEPTH,
            "fstype": info.fstype, "device": info.device, "measured_at": result.measured_at}


def folder_rates(folder: str, *, on_probe=None) -> dict:
    """The cached measurement of `folder`'s device, else measure(folder) now (cached when it worked);
    `on_probe()` is called before measuring (a status line)."""
    try:
        st_dev = os.stat(folder).st_dev
    except OSError as exc:
        return {"error": f"{folder}: {exc.strerror}"}
    path = _cache_file(st_dev)
    try:
        with open(path) as f:
            found = json.load(f)
        if found.get("probe_version") == PROBE_VERSION:
            return found
    except (OSError, ValueError):
        pass
    if on_probe is not None:
        on_probe()
    found = measure(folder)
    if "error" in found:
        return found
    found["probe_version"] = PROBE_VERSION
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(found, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: measured again next time
    return found
