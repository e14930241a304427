"""CUDA runtime constants measured on a GPU machine (scripts/gpukit/cuda_constants.py writes them as
cuda_constants.json), used by the plan instead of its typical values when given.

Given: the file named by $MEMASCEND_CUDA_CONSTANTS. Present: cuda_constants.json beside this module (a measured
file committed with the package). Neither: the plan keeps its typical values and says so in the items' sources.

The time model's rates measured on the same box (the file's `time_rates`: host<->device copies, CPU Adam per core)
replace the PCIe table and the CPU Adam constant only for a plan of that GPU (time_rates: the plan's GPU name is the
file's device); a plan of another machine keeps the datasheet values.
"""

from __future__ import annotations

import functools
import json
import os

from memascend_cli.errors import BadInput

ENV = "MEMASCEND_CUDA_CONSTANTS"
PACKAGED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_constants.json")
KEYS = {"host_runtime_bytes": "host runtime", "cuda_context_gpu_bytes": "CUDA context"}
MIN_SCHEMA_VERSION = 2
"""Files of schema 1 measured the host runtime before the first training step, which loads ~0.9 GiB more
(the GPU kit's H200 runs of 2026-11-26, docs/bench/gpu/)."""


@functools.cache
def _load(path: str) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"cannot read the measured CUDA constants {path}: {exc}",
                       f"unset {ENV} or point it at the cuda_constants.json a GPU kit call wrote") from None
    if (doc.get("schema_version") or 1) < MIN_SCHEMA_VERSION:
        raise BadInput(f"{path} was measured before the first training step (schema {doc.get('schema_version', 1)}): "
                       "its host runtime is short of what a training process keeps",
                       f"re-measure with the GPU kit's constants phase, or unset {ENV} to plan with the typical values")
    missing = [k for k in KEYS if not isinstance(doc.get(k), int)]
    if missing:
        raise BadInput(f"{path} has no {', '.join(missing)}", "use a cuda_constants.json written by the GPU kit")
    return doc


def constant(key: str, typical: int, typical_source: str) -> tuple[int, str]:
    """(bytes, source) of a CUDA constant: the measured one when a file is given or present, else `typical`."""
    path = _path()
    if not path:
        return typical, typical_source
    doc = _load(path)
    return int(doc[key]), (f"measured on {doc.get('device', 'a GPU')} (torch {doc.get('torch', '?')}, "
                           f"{doc.get('measured_at', '?')}) by the GPU kit: {path}")


def _path() -> str | None:
    return os.environ.get(ENV) or (PACKAGED if os.path.isfile(PACKAGED) else None)


def matching_rates(doc: dict, gpu_name: str | None) -> dict | None:
    """The time model's rates of a constants document when it was measured on `gpu_name` (same device name, any
    case): the PCIe rate (the harmonic mean of the pinned host->device and device->host rates: exact for a step that
    moves as many bytes each way) and CPU Adam's elements a second per thread; None otherwise. Pure."""
    rates = doc.get("time_rates") or {}
    needed = ("h2d_pinned_gbps", "d2h_pinned_gbps", "cpu_adam_elems_per_s", "torch_threads")
    if not gpu_name or (doc.get("device") or "").lower() != gpu_name.lower() or not all(rates.get(k) for k in needed):
        return None
    h2d, d2h = rates["h2d_pinned_gbps"], rates["d2h_pinned_gbps"]
    return {"pcie_bytes_per_s": 2e9 / (1 / h2d + 1 / d2h),
            "cpu_adam_elems_per_s_per_core": rates["cpu_adam_elems_per_s"] / rates["torch_threads"],
            "source": f"measured on {doc['device']} ({rates['torch_threads']} threads of {rates.get('cpu_model')}, "
                      f"{doc.get('measured_at', '?')}) by the GPU kit"}


def time_rates(gpu_name: str | None) -> dict | None:
    """matching_rates of the measured constants file, when one is given or present; None otherwise."""
    path = _path()
    return matching_rates(_load(path), gpu_name) if path else None
