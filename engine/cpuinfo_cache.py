"""One CPU probe per process tree instead of five per DeepSpeed process.

DeepSpeed asks py-cpuinfo about the CPU on every op load and every CPU optimizer: ``OpBuilder.cpu_arch()`` and
``simd_width()`` (deepspeed/ops/op_builder/builder.py, 0.19.x lines 427-500, called by ``cxx_args`` on each ``load()``,
prebuilt ops included: cpu_adam and async_io) and ``DeepSpeedCPUAdam.__init__`` (deepspeed/ops/adam/cpu_adam.py
line 75). Each ``cpuinfo.get_cpu_info()`` starts a Python subprocess (py-cpuinfo ``get_cpu_info_json``) that times
the clock around a 1 s sleep (``CPUID.get_raw_hz``): 1.1 s a call, five calls (5.6 s) in every rank before its first
step, in stock and memascend runs alike. The CPU does not change under a job, so the first answer is kept for this
process and, through ``MEMASCEND_CPU_INFO`` (JSON), for the processes it starts.

Only py-cpuinfo's public function is replaced; what DeepSpeed does with the answer is unchanged.
"""

from __future__ import annotations

import json
import os

ENV = "MEMASCEND_CPU_INFO"


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
        kept = os.environ.get(ENV)
        if kept:
            try:
                return json.loads(kept)
            except ValueError:
                pass  # not ours (or damaged): probe again and replace it
        info = probe()
        if info:  # py-cpuinfo answers {} when its subprocess failed: probe again next time
            os.environ[ENV] = json.dumps(info)
        return info

    get_cpu_info.memascend_cached = True
    cpuinfo.get_cpu_info = get_cpu_info
