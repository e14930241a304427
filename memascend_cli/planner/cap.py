"""What a DRAM cap (a container's memory limit, a box's size) must give a job beyond its planned peak, and the notes
that say it. Pure: stdlib only."""

from __future__ import annotations

from memascend_cli.planner.breakdown import Estimate
from memascend_cli.units import GiB, MiB

MEASURED_SPREAD_BYTES = 52 * MiB
"""The most the training process's ru_maxrss measured above the plan's rank peak on the user-script harness, DeepSpeed's
ops built: the run-to-run spread and the plan's own miss together. Calibrated on one job,
docs/bench/user-script/fp32-eager-156m.json (memascend, the 155.7M fp32 script built outside zero.Init, repeats 2 and
3: 1,983,426,560 B at most against today's plan of 1,929,312,992 B, the script's loss over the full logits = 51.6 MiB;
the two repeats 1.0 MiB apart); validated on docs/bench/user-script/matrix.json.gz."""

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
    the measured spread (MEASURED_SPREAD_BYTES)."""
    return est.node_host_peak_bytes + MEASURED_SPREAD_BYTES


def cap_line(est: Estimate) -> str:
    """The plan's DRAM-cap advice, saying what it is made of."""
    return (f"smallest DRAM cap this job survives: {smallest_cap_bytes(est) / GiB:.2f} GiB per node = the plan's "
            f"peak {est.node_host_peak_bytes / GiB:.2f} GiB + the measured spread {MEASURED_SPREAD_BYTES / MiB:.0f} MiB "
            "(the most a run measured above its plan, run-to-run spread included), with DeepSpeed's ops already built")


def op_build_note() -> str:
    """Why a script's first run can need more than the plan: DeepSpeed compiles its ops beside it."""
    return (f"a script's first run compiles DeepSpeed's CPU Adam op when it is not built yet: its compilers take up "
            f"to {OP_BUILD_TREE_BYTES / GiB:.1f} GiB beside the script (the largest {OP_BUILD_COMPILER_BYTES / GiB:.1f}"
            " GiB; not in this plan); build the ops "
            "before a capped run (DS_BUILD_CPU_ADAM=1 pip install deepspeed, or one uncapped run)")
