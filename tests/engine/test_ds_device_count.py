"""The CPU accelerator's device_count() cached for the run (ds_internals.stage3.cache_cpu_device_count): stage 3 asks
it at every gradient bucket, and without DeepSpeed's launcher each call forks `numactl --hardware`."""

from __future__ import annotations

import pytest


def test_the_cpu_accelerator_counts_its_devices_once_and_the_patch_comes_off(monkeypatch):
    from deepspeed.accelerator import get_accelerator
    from deepspeed.utils import numa
    from memascend_engine.ds_internals import stage3
    from memascend_engine.ds_internals.patches import Patches

    acc = get_accelerator()
    if acc.device_name() != "cpu":
        pytest.skip("needs DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu)")
    monkeypatch.delenv("LOCAL_SIZE", raising=False)  # DeepSpeed's launcher sets it: no numactl then
    counted = acc.device_count()
    patches = Patches()
    stage3.cache_cpu_device_count(patches)
    try:
        monkeypatch.setattr(numa, "get_numa_cores", lambda: pytest.fail("device_count ran numactl again"))
        assert [acc.device_count() for _ in range(3)] == [counted] * 3
    finally:
        patches.restore()
    assert "device_count" not in vars(acc)
