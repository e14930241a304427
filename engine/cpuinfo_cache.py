"""One CPU probe per process tree instead of five per DeepSpeed process.

DeepSpeed asks py-cpuinfo about the CPU on every op load and every CPU optimizer: ``OpBuilder.cpu_arch()`` and
``simd_width()`` (deepspeed/ops/op_builder/builder.py, 0.19.x lines 427-500, called by ``cxx_args`` on each ``load()``,
prebuilt ops included: cpu_adam and async_io) and ``DeepSpeedCPUAdam.__init__`` (deepspeed/ops/adam/cpu_adam.py
line 75). Each ``cpuinfo.get_cpu_info()`` starts a Python subprocess (py-cpuinfo ``get_cpu_info_json``) that times
the clock around a 1 s sleep (``CPUID.get_raw_hz``): 1.1 s a call, five calls (5.6 s) in every rank before its first
step, in stock and memascend runs alike. The CPU does not change under a job, so the first answer is kept for this
process and, through ``MEMASCEND_CPU_INFO``, for the processes it starts on this machine: the value names the boot it
was probed in (another node, or a later boot, probes again) and is base64, so it survives the shell ``export`` lines
DeepSpeed's multi-node runner builds from ``.deepspeed_env``.

Only py-cpuinfo's public function is replaced; what DeepSpeed does with the answer is unchanged.
"""

from __future__ import annotations

import base64
import json
import os

ENV = "MEMASCEND_CPU_INFO"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _boot_id() -> str:
    try:
        with open(BOOT_ID, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def encode(info: dict) -> str:
    """The environment value for `info`, probed on this machine in this boot."""
    return f"{_boot_id()}:{base64.urlsafe_b64encode(json.dumps(info).encode()).decode()}"


def decode(value: str) -> dict | None:
    """The CPU info a value holds, or None when it is from another machine or boot, or not ours."""
    boot, sep, payload = value.partition(":")
    if not sep or boot != _boot_id():
        return None
    try:
        info = json.loads(base64.urlsafe_b64decode(payload.encode()))
    except ValueError:
        return None
    return info if isinstance(info, dict) and info else None


def enable() -> None:
    """Answer ``cpuinfo.get_cpu_info()`` from the first probe of this process tree (idempotent)."""
    try:
        import cpuinfo
    except ImportError:
        return  # DeepSpeed then reads lscpu (builder.py _backup_cpuinfo), which is fast: nothing to keep
    if getattr(cpuinfo.get_cpu_info, "memascend_cached", False):
        return
    probe = cpuinfo.get_cpu_info

    def get_cpu_info() -> dict:
        kept = decode(os.environ.get(ENV, ""))
        if kept is not None:
            return kept
        info = probe()  # none kept, or another machine's: probe and replace it
        if info:  # py-cpuinfo answers {} when its subprocess failed: probe again next time
            os.environ[ENV] = encode(info)
        return info

    get_cpu_info.memascend_cached = True
    cpuinfo.get_cpu_info = get_cpu_info
