"""What a DRAM cap (a container's memory limit, a box's size) must give a job beyond its planned peak, and the notes
that say it. Pure: stdlib only."""

from __future__ import annotations

from memascend_cli.planner.breakdown import Estimate
from memascend_cli.units import GiB, MiB

RUN_TO_RUN_SPREAD_BYTES = 48 * MiB
"""The largest spread of the training process's ru_maxrss between repeats of one job on the user-script harness
(docs/bench/user-script/fp32-eager-156m.json: memascend, 3 repeats of the 155.7M fp32 script built outside
zero.Init, max - min). The cap the plan recommends is its peak plus this."""

OP_BUILD_COMPILER_BYTES = int(2.03 * GiB)
"""The largest compiler process of DeepSpeed building its CPU Adam op just in time (torch cpp_extension, ninja, g++ 12
at -O3): docs/bench/user-script/op-build-cpu-adam.json (largest_child_maxrss_bytes, 2.03 GiB). A script's first run
builds it when DeepSpeedCPUAdam is constructed, beside the script; a harness reading the script's ru_maxrss (wait4)
sees the compiler's."""
OP_BUILD_TREE_BYTES = int(4.29 * GiB)
"""The same build's summed RSS (ninja runs the two sources' compilers at once; max_tree_rss_bytes, 4.29 GiB): what a
cgroup cap charges beside the script."""


def smallest_cap_bytes(est: Estimate) -> int:
    """The smallest DRAM cap per node the job survives once DeepSpeed's ops are built: the node's planned peak plus
    the measured run-to-run spread."""
    return est.node_host_peak_bytes + RUN_TO_RUN_SPREAD_BYTES


def cap_line(est: Estimate) -> str:
    """The plan's DRAM-cap advice, saying what it is made of."""
    return (f"smallest DRAM cap this job survives: {smallest_cap_bytes(est) / GiB:.2f} GiB per node = the plan's "
            f"peak {est.node_host_peak_bytes / GiB:.2f} GiB + the measured run-to-run spread "
            f"{RUN_TO_RUN_SPREAD_BYTES / MiB:.0f} MiB, with DeepSpeed's ops already built")


def op_build_note() -> str:
    """Why a script's first run can need more than the plan: DeepSpeed compiles its ops beside it."""
    return (f"a script's first run compiles DeepSpeed's CPU Adam op when it is not built yet: its compilers take up "
            f"to {OP_BUILD_TREE_BYTES / GiB:.1f} GiB beside the script (the largest {OP_BUILD_COMPILER_BYTES / GiB:.1f}"
            " GiB; not in this plan); build the ops "
            "before a capped run (DS_BUILD_CPU_ADAM=1 pip install deepspeed, or one uncapped run)")
