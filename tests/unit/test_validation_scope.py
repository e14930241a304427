"""validation_scope.history_reason: which part of the rule keeps a recorded bench run out of the time model's
validation, from the record alone."""

from memascend_cli.bench import validation_scope as scope

_TIMING = {"gflops": 252.3, "cpu_fraction": 0.8, "device_source": "`memascend inspect --cpu-probe` 315.4 GFLOP/s x 0.8",
           "read_gbps": 0.4, "write_gbps": 0.4}


def _record(sitting: dict | None = None, timing: dict | None = None, dtype: str = "fp32") -> dict:
    return {"job": {"dtype": dtype, "timing": _TIMING if timing is None else timing},
            "hardware": {} if sitting is None else {"sitting": sitting}}


def _run(others_s: float | None = 0.0, wall_s: float = 60.0) -> dict:
    return {"others_cpu_seconds": others_s, "wall_s": wall_s, "seconds_per_step": 5.0}


AT_SPEED = {"fp32_gflops": 322.7, "bf16_gflops": 1990.1, "cached_fp32_gflops": 315.4}


def test_a_sitting_at_the_machines_speed_uncontended_validates():
    assert scope.history_reason(_record(AT_SPEED), _run()) is None
    assert scope.history_reason(_record(AT_SPEED, dtype="bf16"), _run(others_s=29.0)) is None  # under half a core


def test_each_part_of_the_rule():
    assert scope.history_reason(_record(None), _run()) == scope.NO_SITTING_PROBE
    assert scope.history_reason(_record(AT_SPEED, timing={}), _run()) == scope.NO_SITTING_PROBE  # no rates recorded
    cli_rate = {**_TIMING, "device_source": "--cpu-gflops"}  # not the cached probe: nothing to put the sitting's in for
    assert scope.history_reason(_record(AT_SPEED, timing=cli_rate), _run()) == scope.NO_SITTING_PROBE
    no_bf16 = {k: v for k, v in AT_SPEED.items() if k != "bf16_gflops"}
    assert scope.history_reason(_record(no_bf16, dtype="bf16"), _run()) == scope.NO_SITTING_PROBE
    assert scope.history_reason(_record(AT_SPEED), _run(others_s=None)) == scope.NO_GAUGE
    assert scope.history_reason(_record(AT_SPEED), _run(others_s=30.0)) == scope.CONTENDED  # half a core
    slow = {**AT_SPEED, "fp32_gflops": 0.94 * 315.4}
    assert scope.history_reason(_record(slow), _run()) == scope.SLOW_SITTING
    assert scope.history_reason(_record({**AT_SPEED, "fp32_gflops": 0.95 * 315.4}), _run()) is None


def test_a_dram_run_with_the_optimizer_overlapped_is_a_configuration_the_plan_never_makes():
    def dram(mode: str, overlap: bool | None) -> dict:
        options = {} if overlap is None else {"overlap_optimizer": overlap}
        return {**_run(), "mode": mode, "placement": {"placement": "dram"}, "engine_stats": [{"options": options}]}

    assert scope.history_reason(_record(AT_SPEED), dram("memascend", True)) == scope.UNPRICED_CONFIG
    assert scope.history_reason(_record(AT_SPEED), dram("memascend", False)) is None
    assert scope.history_reason(_record(AT_SPEED), dram("tuned", None)) is None  # stock's ZeRO-Offload
    split = {**dram("memascend", True), "placement": {"placement": "split"}}  # overlapped where the SSD binds: priced
    assert scope.history_reason(_record(AT_SPEED), split) is None
