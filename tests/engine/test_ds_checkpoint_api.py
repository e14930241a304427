"""DeepSpeed's own checkpoint API (engine.save_checkpoint / load_checkpoint) with memascend's engine installed.

Real DeepSpeed ZeRO-3 on the CPU accelerator through memascend_engine.parity (tiny-llama, params and optimizer on
NVMe, fp32 so losses compare bit for bit), in three modes: the bounded engine (default), DeepSpeed's own
optimizer swapper on region keys (EngineOptions(streaming=False)), and the bounded engine with bf16 moments on the SSD
(checkpoints hold them widened to fp32). A run saves with DeepSpeed's API after step 3 and
goes on to step 6; a fresh process loads that checkpoint and runs steps 4-6: its losses must equal the uninterrupted
run's. The checkpoint is DeepSpeed's layout with the optimizer state in offloaded_tensors/rank00 (never the empty swap
folder), checked against its manifest on load; partial loads are refused at once.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from test_engine_deepspeed import run
from test_engine_direct_nvme import make_region

pytestmark = pytest.mark.slow
MODES = {"streaming": (), "swapper": ("--off", "streaming"), "bf16_moments": ("--optimizer-moments", "bf16")}


def _dir(p):
    p.mkdir(parents=True, exist_ok=True)
    return p


@pytest.mark.parametrize("mode", list(MODES))
def test_save_and_load_checkpoint_resume_exactly(tmp_path, mode):
    ckpt = tmp_path / "ckpt"
    kw = ("--mode", "engine", "--dtype", "fp32", *MODES[mode])
    full = run(tmp_path, "full", *kw, "--steps", "6", "--region", make_region(_dir(tmp_path / "a"), "512MiB"),
               "--save-checkpoint", str(ckpt), "--save-at", "3")
    assert full["save_checkpoint_error"] is None and len(full["losses"]) == 6
    tag = (ckpt / "latest").read_text().strip()
    assert tag == "global_step3"
    rank_dir = ckpt / tag / "offloaded_tensors" / "rank00"
    manifest = json.loads((rank_dir / "memascend-offloaded.json").read_text())
    files = {f["name"]: f for g in manifest["sub_groups"] for f in g["files"].values()}
    # Every sub-group's master and both Adam moments, in DeepSpeed's swap-file names, after 3 steps.
    assert all(g["step"] == 3 and set(g["files"]) == {"fp32", "exp_avg", "exp_avg_sq"} for g in manifest["sub_groups"])
    assert sum(g["numel"] for g in manifest["sub_groups"]) == 6_294_016
    assert {p.name for p in rank_dir.glob("*.tensor.swp")} == set(files)
    assert all((rank_dir / n).stat().st_size == f["bytes"] for n, f in files.items())

    resumed = run(tmp_path, "resumed", *kw, "--steps", "6", "--region", make_region(_dir(tmp_path / "b"), "512MiB"),
                  "--load-checkpoint", str(ckpt))
    assert resumed["load_checkpoint_error"] is None and resumed["start_step"] == 3
    assert resumed["losses"] == full["losses"][3:]


def test_damaged_offloaded_file_is_named_on_load(tmp_path):
    ckpt = tmp_path / "ckpt"
    run(tmp_path, "save", "--mode", "engine", "--dtype", "fp32", "--steps", "2",
        "--region", make_region(_dir(tmp_path / "a"), "512MiB"), "--save-checkpoint", str(ckpt))
    rank_dir = ckpt / "global_step2" / "offloaded_tensors" / "rank00"
    victim = min(rank_dir.glob("exp_avg-*.tensor.swp"))
    with open(victim, "r+b") as f:
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0x10]))
    r = run(tmp_path, "load", "--mode", "engine", "--dtype", "fp32", "--steps", "3",
            "--region", make_region(_dir(tmp_path / "b"), "512MiB"), "--load-checkpoint", str(ckpt))
    assert "CheckpointCorrupt" in r["load_checkpoint_error"] and victim.name in r["load_checkpoint_error"]
    assert r["losses"] == []


def test_partial_loads_are_refused_at_once(tmp_path):
    ckpt = tmp_path / "ckpt"
    run(tmp_path, "save", "--mode", "engine", "--dtype", "fp32", "--steps", "1",
        "--region", make_region(_dir(tmp_path / "a"), "512MiB"), "--save-checkpoint", str(ckpt))
    r = run(tmp_path, "load", "--mode", "engine", "--dtype", "fp32", "--steps", "2",
            "--region", make_region(_dir(tmp_path / "b"), "512MiB"), "--load-checkpoint", str(ckpt), "--load-module-only")
    assert r["load_checkpoint_error"].startswith("DeepSpeedApiRefused:") and "load_module_only" in r["load_checkpoint_error"]


def test_param_pool_without_model_spec_is_sized_from_the_model_deepspeed_receives(tmp_path):
    """install() without a model_spec and DeepSpeed's default buffer_size (1e8 elements): the pool is sized per
    tensor role from the transformers model deepspeed.initialize receives (zero.Init's writes borrow buffers until the
    first fetch), exactly as with a model_spec, not 5 x 1e8 x 4 B (the uniform fallback without any inventory:
    tests/unit/test_models.py)."""
    runs = {name: run(tmp_path, name, "--mode", "engine", "--dtype", "fp32", "--steps", "2",
                      "--param-buffer-size", "1e8", "--region", make_region(_dir(tmp_path / name), "512MiB"), *flag)
            for name, flag in (("spec", ()), ("nospec", ("--no-model-spec",)))}
    s, ref = runs["nospec"]["stats"], runs["spec"]["stats"]
    assert s["param_pool_plan"] == ref["param_pool_plan"] and not s["param_pool_plan"].startswith("uniform")
    assert s["param_pool_bytes"] == ref["param_pool_bytes"] < 5 * 100_000_000 * 4
    # The pool sized before deepspeed.initialize (init_weights_under_zero3 fetches first) is freed, not kept.
    assert s["pinned"]["live_bytes"] == ref["pinned"]["live_bytes"], (s["pinned"], ref["pinned"])
    assert runs["nospec"]["losses"] == runs["spec"]["losses"] and len(runs["spec"]["losses"]) == 2


def test_chunks_start_on_region_checksum_chunks():
    """Optimizer chunks split tensors at multiples of CHUNK_ALIGN_NUMEL; a partial write of a region key must start
    on a checksum chunk, so those boundaries must fall on one for 2-byte parameters."""
    from memascend_engine.direct_nvme import CHECKSUM_CHUNK_BYTES

    from memascend_cli.planner import zero

    assert (zero.CHUNK_ALIGN_NUMEL * 2) % CHECKSUM_CHUNK_BYTES == 0
