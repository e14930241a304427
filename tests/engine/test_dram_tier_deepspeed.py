"""memascend's DRAM tier (EngineOptions.dram_tier_gib, engine/dram_tier.py) inside real DeepSpeed ZeRO-3 on the CPU.

The parity harness's tiny-llama (test_engine_deepspeed.py) for 20 steps (4 in the default run) at budgets that hold
nothing, part of the parameter partitions, all of them, the gradients and some optimizer chunks, and everything: the
losses equal the all-SSD engine's bit for bit, the region moves fewer bytes the more the tier holds (none once it
holds everything), a checkpoint saved at one budget resumes exactly at another, and a tier the process has no room
for stays on the region with a warning.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from test_engine_deepspeed import _env, run
from test_engine_direct_nvme import make_region

from tests.conftest import require_memory_cgroups

pytestmark = pytest.mark.slow
STEPS = 20
"""The bit-identity run's length (`pytest -m long`); the default run trains SHORT steps, the resumes 2 x SHORT."""
SHORT = 4
MIB = 2**20
# tiny-llama in bf16: 8 parameter partitions of 1 MiB on the region (the MLP matrices, the embedding and the LM head;
# the attention ones are below DeepSpeed's min_aio_bytes), 5 optimizer chunks of ~30 MB with the overlap's two
# generations, 12 MB of gradients (kept on the SSD for a redo when clipping is on): 172 MB in all. The rule takes the
# gradients before the chunks (planner.dram_tier.ORDER): 64 MiB hold the partitions, the gradients and one chunk.
BUDGETS_GIB = {"none": 0.0, "half the parameters": 4 * MIB / 2**30, "parameters, gradients + a chunk": 64 * MIB / 2**30,
               "everything": 1.0}


def _tier(r: dict) -> dict:
    return r["stats"]["region_io"]["dram_tier"]


def _since_assign(r: dict) -> tuple[int, int]:
    """Region bytes (read, written) moved after the tier was assigned: training's own traffic."""
    io, t = r["stats"]["region_io"], _tier(r)
    return io["bytes_read"] - t["region_read_at_assign"], io["bytes_written"] - t["region_written_at_assign"]


def _engine(tmp_path, name: str, budget_gib: float, *args: str, steps: int = SHORT) -> dict:
    (tmp_path / name).mkdir()
    return run(tmp_path, name, "--mode", "engine", "--steps", str(steps), "--region",
               make_region(tmp_path / name, "512MiB"), "--dram-tier-gib", str(budget_gib), *args)


@pytest.mark.parametrize("steps", [SHORT, pytest.param(STEPS, marks=pytest.mark.long)])
def test_every_budget_trains_the_same_losses_and_the_ssd_bytes_fall_with_it(tmp_path, steps):
    # Clipping on (never triggered at 100): the overlap keeps each gradient for a redo, so gradients reach the SSD.
    kw = ("--dtype", "bf16", "--clip", "100")
    ref = _engine(tmp_path, "all-ssd", 0.0, *kw, steps=steps)
    assert "dram_tier" not in ref["stats"]["region_io"]  # budget 0: the plain region store
    runs = {k: _engine(tmp_path, k.replace(" ", "-"), b, *kw, steps=steps) for k, b in BUDGETS_GIB.items() if b}
    assert len(ref["losses"]) == steps
    # The dram placement's layout (the parameters resident, no overlap): bf16 chunks held whole, stepped in one pass.
    runs["dram row"] = _engine(tmp_path, "dram-row", 1.0, *kw, "--off", "overlap_optimizer", "--param-device", "none",
                               steps=steps)
    for name, r in runs.items():
        assert r["losses"] == ref["losses"], name
        assert r["grad_norms"] == ref["grad_norms"], name
        assert _tier(r)["fallback"] == "", name
    assert _since_assign(runs.pop("dram row")) == (0, 0)
    half, mid, full = (_tier(runs[k]) for k in ("half the parameters", "parameters, gradients + a chunk", "everything"))
    total_params = full["params_held"]
    assert 0 < half["params_held"] < total_params and half["chunks_held"] == 0
    assert mid["params_held"] == total_params and 0 < mid["chunks_held"] < full["chunks_held"]
    assert mid["grads_held"] == full["grads_held"] and mid["order"] == "params,gradients,groups"
    assert full["grads_held"] > 0  # clipping on: the gradients reach the SSD, so the tier takes them too
    assert full["resident_bytes"] == full["planned_bytes"] <= 2**30
    # Training's SSD traffic falls with the budget, to nothing once the tier holds everything.
    moved = [(ref["stats"]["region_io"]["bytes_read"], ref["stats"]["region_io"]["bytes_written"])]
    moved += [_since_assign(runs[k]) for k in ("half the parameters", "parameters, gradients + a chunk", "everything")]
    reads, writes = zip(*moved)
    assert reads[0] > reads[1] > reads[2] > reads[3] == 0, reads
    assert writes[0] > writes[1] > writes[2] > writes[3] == 0, writes
    # The tier changes where the bytes go, never how many: at every budget the tier's and the region's (less the
    # partitions read once to move them into the tier) add up to the all-SSD run's, both ways.
    io_ref = ref["stats"]["region_io"]
    for name, r in runs.items():
        io, t = r["stats"]["region_io"], _tier(r)
        assert io["bytes_read"] - t["promoted_bytes"] + t["bytes_read"] == io_ref["bytes_read"], name
        assert io["bytes_written"] + t["bytes_written"] == io_ref["bytes_written"], name


def test_fp32_shadowed_parameters_and_chunks_in_dram_stay_exact(tmp_path):
    """fp32: the overlap speculates into shadow parameter partitions exchanged at each commit; held partitions and
    their shadows are exchanged in DRAM, the rest on the region, with losses equal to the all-SSD engine's. The dram
    placement's engine (planner.placement's dram row: the parameters resident as under stock's ZeRO-Offload, every
    chunk and gradient held, no overlap, the checkpoints in DRAM and the heap kept between layers) steps the held
    chunks' moments in place, and their masters in the resident fp32 partitions, and copies the gradients straight
    into their keys: the losses of the all-SSD engine and of ZeRO-Offload, no region byte moved, and more bytes
    computed in place than the gradients alone."""
    ref = _engine(tmp_path, "fp32-ssd", 0.0, "--dtype", "fp32", "--clip", "0")
    r = _engine(tmp_path, "fp32-tier", 48 * MIB / 2**30, "--dtype", "fp32", "--clip", "0")
    assert r["losses"] == ref["losses"]
    t = _tier(r)
    assert t["params_held"] > 0 and t["fallback"] == ""
    assert r["stats"]["overlap"]["steps_committed"] == SHORT
    assert sum(_since_assign(r)) < ref["stats"]["region_io"]["bytes_read"] + ref["stats"]["region_io"]["bytes_written"]
    dram = _engine(tmp_path, "fp32-dram-row", 1.0, "--dtype", "fp32", "--clip", "0", "--off", "overlap_optimizer",
                   "--param-device", "none", "--checkpointing", "--checkpoint-offload", "dram", "--off", "layer_trims")
    assert dram["config"]["zero_optimization"].get("offload_param") is None
    assert dram["losses"] == ref["losses"] and dram["grad_norms"] == ref["grad_norms"]
    offload = run(tmp_path, "zero-offload", "--mode", "stock", "--steps", str(SHORT), "--dtype", "fp32", "--clip", "0",
                  "--param-device", "none", "--optimizer-device", "cpu")
    assert offload["swap_files"] == 0 and dram["losses"] == offload["losses"]
    t = _tier(dram)
    assert t["fallback"] == "" and t["params_held"] == 0 and t["chunks_held"] > 0 and _since_assign(dram) == (0, 0)
    assert t["in_place_bytes"] > dram["stats"]["bounded_io"]["gradient_write_bytes"] > 0
    assert dram["stats"]["bounded_io"]["master_in_place_bytes"] > 0  # stepped in the resident partitions
    # The heap kept between layers (EngineOptions.layer_trims off): no trim after a layer, glibc's largest mmap
    # threshold with the trim threshold it pairs with it, no huge pages; the trim after backward stays.
    c = dram["stats"]["counters"]
    assert dram["stats"]["checkpointing"]["layer_calls"] >= 2 * SHORT and c["layer_trims"] == 0
    assert (c["mmap_threshold_bytes"], c["trim_threshold_bytes"], c["huge_pages_off"]) == (32 * MIB, 64 * MIB, 1)
    assert c["malloc_trims"] == SHORT


# `pytest -m long`: the default run resumes across budgets in test_a_checkpoint_resumes_exactly_when_the_budget_changed.
@pytest.mark.long
def test_the_dram_rows_checkpoint_resumes_exactly_all_on_the_ssd(tmp_path):
    """The dram placement's engine (everything held, no overlap, fp32) saves the states it stepped in place (read
    through the pipeline's own slots): resumed with no tier, the losses are the all-SSD run's."""
    steps = 2 * SHORT
    ref = _engine(tmp_path, "straight", 0.0, "--dtype", "fp32", "--off", "overlap_optimizer", steps=steps)
    ckpt = tmp_path / "ckpt"
    saved = _engine(tmp_path, "saved", 1.0, "--dtype", "fp32", "--off", "overlap_optimizer", "--save-checkpoint",
                    str(ckpt), "--save-at", str(SHORT), steps=steps)
    assert saved["save_checkpoint_error"] is None and saved["losses"] == ref["losses"]
    assert _tier(saved)["in_place_bytes"] > 0
    resumed = _engine(tmp_path, "resumed", 0.0, "--dtype", "fp32", "--off", "overlap_optimizer", "--load-checkpoint",
                      str(ckpt), steps=steps)
    assert resumed["load_checkpoint_error"] is None and resumed["start_step"] == SHORT
    assert resumed["losses"] == ref["losses"][SHORT:]


# Saved with everything in DRAM, resumed with nothing: `pytest -m long` (the default run resumes the other way).
@pytest.mark.parametrize("saved_gib,resumed_gib", [(4 * MIB / 2**30, 1.0),
                                                  pytest.param(1.0, 0.0, marks=pytest.mark.long)])
def test_a_checkpoint_resumes_exactly_when_the_budget_changed(tmp_path, saved_gib, resumed_gib):
    steps = 2 * SHORT
    ref = _engine(tmp_path, "straight", 0.0, "--dtype", "bf16", steps=steps)
    ckpt = tmp_path / "ckpt"
    saved = _engine(tmp_path, "saved", saved_gib, "--dtype", "bf16", "--save-checkpoint", str(ckpt),
                    "--save-at", str(SHORT), steps=steps)
    assert saved["save_checkpoint_error"] is None and saved["losses"] == ref["losses"]
    resumed = _engine(tmp_path, "resumed", resumed_gib, "--dtype", "bf16", "--load-checkpoint", str(ckpt), steps=steps)
    assert resumed["load_checkpoint_error"] is None and resumed["start_step"] == SHORT
    assert resumed["losses"] == ref["losses"][SHORT:]


def test_a_tier_without_room_under_the_cgroup_limit_stays_on_the_region_with_a_warning(tmp_path):
    """The run's own peak (~0.6 GiB) fits the cap; the tier's 0.16 GiB plus the placement headroom (0.5 GiB) does
    not: the engine warns once, keeps everything on the region and trains the all-SSD losses, no OOM kill."""
    require_memory_cgroups()
    from memascend_cli.run import cgroup

    ref = _engine(tmp_path, "ref", 0.0, "--dtype", "bf16")
    (tmp_path / "capped").mkdir()
    region, out = make_region(tmp_path / "capped", "512MiB"), tmp_path / "capped.json"
    argv = [sys.executable, "-m", "memascend_engine.parity", "--mode", "engine", "--dtype", "bf16", "--steps", "4",
            "--region", region, "--dram-tier-gib", "1", "--out", str(out)]
    with cgroup.RunCgroup(label="test-dram-tier", cap_bytes=int(1.1 * 2**30)) as cg:
        p = subprocess.run(argv, env=_env(), preexec_fn=cg.join, capture_output=True, text=True, timeout=600,
                           check=False)
        cap = cg.result(sigkilled=p.returncode == -signal.SIGKILL)
    assert p.returncode == 0 and not cap.oom_killed, p.stderr[-3000:]
    r = json.loads(out.read_text())
    t = _tier(r)
    assert t["keys"] == 0 and t["resident_bytes"] == 0 and "everything stays on the region" in t["fallback"]
    assert sum("warning: DRAM tier" in line for line in p.stderr.splitlines()) == 1
    assert r["losses"] == ref["losses"]


@pytest.mark.root
def test_a_tier_that_mlock_refuses_stays_on_the_region_with_a_warning(tmp_path):
    """Without CAP_IPC_LOCK and with RLIMIT_MEMLOCK at 0.5 MiB the tier's first buffer cannot be locked: one warning,
    nothing held, the all-SSD losses."""
    if os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("prlimit")):
        pytest.skip("needs root, setpriv and prlimit to drop CAP_IPC_LOCK under a low RLIMIT_MEMLOCK")
    ref = _engine(tmp_path, "ref", 0.0, "--dtype", "bf16", steps=3)
    (tmp_path / "locked").mkdir()
    region, out = make_region(tmp_path / "locked", "512MiB"), tmp_path / "locked.json"
    argv = ["setpriv", "--bounding-set=-ipc_lock", "prlimit", "--memlock=524288:524288", sys.executable, "-m",
            "memascend_engine.parity", "--mode", "engine", "--dtype", "bf16", "--steps", "3", "--region", region,
            "--dram-tier-gib", "1", "--out", str(out)]
    p = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    t = _tier(r)
    assert t["keys"] == 0 and t["resident_bytes"] == 0 and t["fallback"].startswith("mlock refused")
    assert sum("warning: DRAM tier: mlock refused" in line for line in p.stderr.splitlines()) == 1
    assert r["losses"] == ref["losses"]
