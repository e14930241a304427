"""The plan's count of stock's fetched NVMe parameter partitions (planner/param_buffers.py); the real runs on both
sides of its bound are tests/integration/test_param_buffer_failure.py."""

import pytest

from memascend_cli.bench import configs
from memascend_cli.models import load_model
from memascend_cli.planner import param_buffers as pb
from memascend_cli.planner.spec import HardwareSpec


def test_trace_forward_then_backward_with_the_recompute_after_the_last_module():
    # one head param, two layers of [a, b, c, norm] (c the last module), one tail param
    plain = pb.trace(1, 4, 2, 1, recompute=False, last_module=2)
    assert plain == (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
    rec = pb.trace(1, 4, 2, 1, recompute=True, last_module=2)
    assert rec[:10] == tuple(range(10)) and rec[10] == 9
    assert rec[11:19] == (7, 5, 6, 7, 8, 8, 6, 5)  # layer 2: c first, the recompute a b c norm, then the rest back
    assert rec[-1] == 0 and len(rec) == 10 + 1 + 2 * 8 + 1


def test_nvme_resident_follows_the_flat_buffer_by_whole_sub_groups():
    parts = (10, 10, 10, 10)
    groups = ((0, 1), (2, 3))
    assert pb.nvme_resident(parts, groups, 25, (True,) * 4) == (False, False, True, True)
    assert pb.nvme_resident(parts, groups, 15, (True,) * 4) == (True,) * 4  # the first group does not fit whole
    assert pb.nvme_resident(parts, groups, 15, (True, False, True, False)) == (True, False, True, False)
    assert pb.nvme_resident(parts, groups, 40, (True,) * 4) == (False,) * 4


def test_peak_held_grows_with_the_reuse_distance():
    numels = (100,) * 6
    order = pb.trace(0, 3, 2, 0, recompute=False, last_module=2)  # 0..5 then 5..0
    nvme = (True,) * 6
    assert pb.peak_held(numels, nvme, order, 1, 0) == 1  # released after every use
    assert pb.peak_held(numels, nvme, order, 1, 10 ** 9) == 6  # all kept
    # Param 5 is reused at once, param 4 after 200 elements (param 5 twice), param 3 after 400.
    assert pb.peak_held(numels, nvme, order, 1, 1) == 1
    assert pb.peak_held(numels, nvme, order, 1, 250) == 2
    assert pb.peak_held(numels, nvme, order, 1, 450) == 3
    assert pb.peak_held(numels, (False,) * 6, order, 1, 10 ** 9) == 0
    assert pb.peak_held(numels, nvme, order, 101, 10 ** 9) == 0  # all persistent


@pytest.mark.parametrize("model, fails", [("llama-3.2-1b", True), ("qwen2.5-0.5b", False)])
def test_the_docs_config_fails_beyond_max_in_cpu_and_the_tuned_one_never(model, fails):
    # 1.24B params exceed the default max_in_cpu (1e9): the H200 run of 2026-11-26 failed at step 2 with this error;
    # qwen2.5-0.5b stays in DRAM and ran.
    spec = load_model(model)
    hw = HardwareSpec(name="t", dram_gib=126, cpu_cores=16, num_gpus=1, gpu_mem_gib=140)
    kw = {"seq_len": 2048, "micro_batch": 1, "dtype": "bf16", "ranks": 1, "checkpointing": "full", "hw": hw,
          "deepspeed_version": "0.19.8"}
    for mode in ("stock", "tuned"):
        cfg = configs.build_ds_config(mode, spec, micro_batch=1, dtype="bf16", nvme_dir="/x", ranks=1)
        errors = [e for e in configs.predict(mode, cfg, spec, **kw)["config_errors"] if "Not enough buffers" in e]
        assert bool(errors) == (fails and mode == "stock"), (mode, errors)
