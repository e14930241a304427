"""The plan's DRAM-cap advice: the node's planned peak plus the measured spread, said as such."""

from memascend_cli.models import load_preset
from memascend_cli.planner import cap
from memascend_cli.planner.job import JobSpec
from memascend_cli.planner.memory import estimate
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.units import GiB, MiB

CPU = HardwareSpec(name="cpu", dram_gib=24)


def _est(**kw):
    return estimate(JobSpec(model=load_preset("bench-llama-136m"), seq_len=512, micro_batch=2, dtype="fp32",
                            checkpointing="none", **kw), CPU, "memascend")


def test_the_smallest_cap_is_the_node_peak_plus_the_spread_and_the_line_says_both():
    est = _est(model_init="eager")
    assert cap.smallest_cap_bytes(est) == est.node_host_peak_bytes + cap.MEASURED_SPREAD_BYTES
    line = cap.cap_line(est)
    assert f"{cap.smallest_cap_bytes(est) / GiB:.2f} GiB" in line and "measured spread" in line and "run-to-run" in line
    assert f"{cap.MEASURED_SPREAD_BYTES / MiB:.0f} MiB" in line


def test_a_larger_plan_asks_a_larger_cap():
    assert cap.smallest_cap_bytes(_est(model_init="from-pretrained")) >= cap.smallest_cap_bytes(_est())


def test_every_plan_notes_the_first_runs_op_build_beside_the_script():
    est = _est()
    assert cap.op_build_note() in est.notes
    assert f"{cap.OP_BUILD_COMPILER_BYTES / GiB:.1f} GiB" in cap.op_build_note()
