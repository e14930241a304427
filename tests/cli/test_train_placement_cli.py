"""`memascend train --placement` and the plan's choice through the real CLI (dry runs, no DeepSpeed): the placement
printed with why, the DeepSpeed config that carries it, the DRAM tier's budget handed to the engine, and a placement
that does not fit refused with what binds."""

from __future__ import annotations

import json
import os

import pytest

from memascend_cli.run.train_placement import dram_tier_supported

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")
DEVICES = {"gpu": ("none", "none"), "ssd": ("nvme", "nvme")}


def dry_run(cli, tmp_path, *args):
    res = cli("train", TINY, "--dry-run", "--output-dir", str(tmp_path / "run"), *args)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout), res.stderr


def devices(cfg: dict) -> tuple[str, str]:
    z = cfg["zero_optimization"]
    return tuple((z.get(k) or {}).get("device", "none") for k in ("offload_param", "offload_optimizer"))


@pytest.mark.parametrize("engine", ["tuned", "memascend"])
def test_the_plans_choice_is_printed_with_why_and_is_what_the_config_runs(cli, tmp_path, engine):
    doc, err = dry_run(cli, tmp_path, "--engine", engine, "--set", "placement=null")  # the preset asks for ssd
    p = doc["placement"]
    assert p["engine"] == engine and not p["asked"] and p["why"]
    assert f"placement: {p['placement']} ({p['config']}); {p['why']}" in err
    assert devices(doc["ds_config"]) == (p["offload_param"], p["offload_optimizer"])
    if engine == "memascend":
        assert p["row_engine"] == "memascend" or p["placement"] == "gpu"
    # The run is planned (and preflighted) as the chosen row where it runs it.
    if p["placement"] != "ssd" and "note" not in p:
        assert doc["plan"]["host_peak_bytes"] == p["planned_host_peak_bytes"]


def test_tuned_runs_each_placement_that_fits_as_deepspeed_offload(cli, tmp_path):
    for placement, want in (("ssd", ("nvme", "nvme")), ("dram", None), ("split", ("nvme", "nvme"))):
        doc, _ = dry_run(cli, tmp_path / placement, "--engine", "tuned", "--placement", placement)
        p = doc["placement"]
        assert p["asked"] and p["placement"] == placement and p["why"].startswith(f"{placement} as asked")
        got = devices(doc["ds_config"])
        assert got == (want or (p["offload_param"], "cpu"))
        max_in_cpu = doc["ds_config"]["zero_optimization"].get("offload_param", {}).get("max_in_cpu")
        assert max_in_cpu == (p["max_in_cpu"] if placement == "split" else 0 if placement == "ssd" else None)
        if placement == "split":
            assert p["max_in_cpu"] > 0


def test_memascend_keeps_the_region_and_hands_the_dram_tier_to_the_engine(cli, tmp_path):
    doc, err = dry_run(cli, tmp_path, "--placement", "dram")
    p = doc["placement"]
    # The optimizer on the region, its tier in the engine; the parameters resident, as ZeRO-Offload keeps them.
    assert devices(doc["ds_config"]) == ("none", "nvme") and p["dram_tier_bytes"] > 0
    with open(os.path.join(doc["run_dir"], "engine.json")) as f:
        engine = json.load(f)
    if dram_tier_supported():
        assert engine["dram_tier_gib"] * 2**30 == pytest.approx(p["dram_tier_bytes"])
        assert engine["overlap_optimizer"] is False is p["overlap_optimizer"]  # the dram row's engine setting
        assert engine["layer_trims"] is False is p["layer_trims"]
        assert doc["plan"]["host_peak_bytes"] == p["planned_host_peak_bytes"]
    else:
        assert "dram_tier_gib" not in engine and "no DRAM tier yet" in err
    doc, _ = dry_run(cli, tmp_path / "ssd", "--placement", "ssd")
    with open(os.path.join(doc["run_dir"], "engine.json")) as f:
        engine = json.load(f)
    assert "dram_tier_gib" not in engine and engine["checkpoint_offload"] == "ssd"  # the recipe's
    assert doc["placement"]["dram_tier_bytes"] == 0

    # With checkpoints offloaded, the dram row keeps them in DRAM too: no byte reaches the SSD.
    doc, _ = dry_run(cli, tmp_path / "ckpt", "--placement", "dram", "--set", "gradient_checkpointing=true")
    with open(os.path.join(doc["run_dir"], "engine.json")) as f:
        engine = json.load(f)
    if dram_tier_supported():
        assert engine["checkpoint_offload"] == doc["placement"]["checkpoint_offload"] == "dram"


@pytest.mark.parametrize("engine", ["tuned", "memascend"])
def test_a_placement_that_does_not_fit_is_refused_with_what_binds(cli, tmp_path, engine):
    from memascend_cli.hardware import resolve_hardware

    if resolve_hardware(None, None).num_gpus:
        pytest.skip("this machine has a GPU: the gpu placement may fit")
    res = cli("train", TINY, "--dry-run", "--output-dir", str(tmp_path / "run"), "--engine", engine,
              "--placement", "gpu")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert "error: placement gpu does not fit with stock: no GPU on this machine" in lines
    assert any(line.startswith("hint: choose a placement that fits (") for line in lines)
    res = cli("train", TINY, "--dry-run", "--output-dir", str(tmp_path / "run"), "--placement", "disk")
    assert res.exit_code == 2 and "error: unknown --placement 'disk'" in res.stderr


def test_the_recipes_placement_is_asked_for_and_the_flag_wins(cli, tmp_path):
    doc, err = dry_run(cli, tmp_path / "recipe")
    p = doc["placement"]
    assert p["asked"] and p["placement"] == "ssd" and p["why"].startswith("ssd as asked")
    assert devices(doc["ds_config"]) == ("nvme", "nvme")
    doc, _ = dry_run(cli, tmp_path / "flag", "--engine", "tuned", "--placement", "dram")
    assert doc["placement"]["placement"] == "dram" and devices(doc["ds_config"])[1] == "cpu"
