"""memascend's small patches of DeepSpeed's stage-3 reduce path (ds_internals.stage3): the CPU accelerator's
device_count() cached for the run (stage 3 asks it at every gradient bucket, and without DeepSpeed's launcher each
call forks `numactl --hardware`), and a single rank's reduce-scatter handing back the gradients themselves."""

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


SINGLE_RANK = """
import os, torch
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
import deepspeed
from deepspeed.runtime.comm.coalesced_collectives import reduce_scatter_coalesced as stock
from deepspeed.runtime.zero import stage3
from memascend_engine.ds_internals.stage3 import single_rank_reduce_scatter
from memascend_engine.ds_internals.patches import Patches
deepspeed.init_distributed(dist_backend="gloo")
g = torch.Generator().manual_seed(0)
grads = [torch.randn(n, generator=g).to(torch.bfloat16).view(-1, 1) for n in (7, 1000, 3)]
grads[1][5] = float("-0.0")
expected = [t.clone() for t in stock([t.clone() for t in grads])]
patches = Patches()
single_rank_reduce_scatter(patches)
got = stage3.reduce_scatter_coalesced(grads)
assert [t.shape for t in got] == [t.shape for t in expected]
assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, expected))  # bit for bit
assert all(a.data_ptr() == t.data_ptr() for a, t in zip(got, grads))  # the gradients themselves: no copy
patches.restore()
assert stage3.reduce_scatter_coalesced is stock
print("ok")
"""


def test_a_single_rank_reduce_scatter_hands_back_the_gradients_bit_for_bit():
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PORT": str(port)}
    proc = subprocess.run([sys.executable, "-c", SINGLE_RANK], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
