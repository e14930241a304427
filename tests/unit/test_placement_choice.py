"""The placement a run uses (planner/placement_choice.py) and the DeepSpeed config it writes (run/dsconfig.py): the
plan's fastest row per engine, --placement refused with what binds, and each placement's offload sections as
DeepSpeed's own config classes read them."""

from dataclasses import replace

import pytest

from memascend_cli.errors import BadInput
from memascend_cli.hardware import resolve_hardware
from memascend_cli.models import load_model
from memascend_cli.planner import placement as pl
from memascend_cli.planner import placement_choice as pc
from memascend_cli.planner import time as tm
from memascend_cli.planner import zero
from memascend_cli.planner.memory import JobSpec, estimate_all
from memascend_cli.run.dsconfig import adamw, ds_config
from memascend_cli.units import GiB


def plan(model: str, hw, gflops: float | None = 100.0, read_gbps: float | None = 0.4) -> pl.PlacementPlan:
    spec = load_model(model)
    job = JobSpec(model=spec, knobs=zero.resolve("memascend", model=spec, world_size=1, elem_bytes=2),
                  chunked_loss=True)
    dev = tm.gpu_device(hw.gpu_name) if hw.num_gpus else tm.cpu_device(gflops, "test")
    return pl.price_placements(job, hw, estimate_all(job, hw), dev, read_gbps=read_gbps or hw.nvme_read_gbps,
                               write_gbps=read_gbps or hw.nvme_write_gbps)


def config(choice: pc.Choice, spec) -> dict:
    s = choice.settings(zero.resolve("tuned", model=spec, world_size=1, elem_bytes=2))
    return ds_config(s, nvme_path="/ssd", micro_batch=1, precision="bf16", optimizer=adamw(1e-4),
                     devices=choice.devices)


CPU = resolve_hardware("cpu-24g", None)


def test_each_engine_runs_the_fastest_of_its_own_rows_that_fits():
    p = plan("qwen2.5-0.5b", CPU)
    for engine in ("stock", "tuned", "memascend"):
        c = pc.choose(p, engine)
        mine = [r for r in pc.engine_rows(p, engine) if r.fits]
        assert c.row is pl.recommend(mine) and not c.asked
        assert c.row.engine == pc.side(engine)
        if c.row is p.recommended:
            assert c.why.startswith("the plan's recommendation")
        else:
            assert "the plan recommends" in c.why


def test_stock_dram_writes_zero_offload_and_memascend_keeps_the_optimizer_on_the_region():
    p = plan("qwen2.5-0.5b", CPU)
    spec = load_model("qwen2.5-0.5b")
    z = config(pc.choose(p, "tuned", "dram"), spec)["zero_optimization"]
    # On the CPU accelerator the parameters are host memory already: only the optimizer is offloaded.
    assert "offload_param" not in z and z["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    mine = pc.choose(p, "memascend", "dram")
    z = config(mine, spec)["zero_optimization"]
    # memascend's parameters stay where stock's do; its tier holds the optimizer chunks and gradients only.
    assert "offload_param" not in z and z["offload_optimizer"]["device"] == "nvme"
    t = mine.row.tier
    assert t["params_bytes"] == 0 and mine.dram_tier_bytes == t["optimizer_states_bytes"] + t["gradients_bytes"] > 0
    assert mine.dram_tier_bytes < t["full_bytes"]
    assert mine.to_dict()["dram_tier_gib"] == round(mine.dram_tier_bytes / GiB, 3)


def test_stock_split_writes_the_rows_max_in_cpu():
    p = plan("qwen2.5-0.5b", replace(CPU, dram_gib=16.0))
    row = p.row("split", "stock")
    assert row.fits and row.max_in_cpu > 0
    c = pc.choose(p, "tuned", "split")
    z = config(c, load_model("qwen2.5-0.5b"))["zero_optimization"]
    assert z["offload_param"]["device"] == "nvme" and z["offload_param"]["max_in_cpu"] == row.max_in_cpu
    assert pc.choose(p, "tuned", "ssd").settings(zero.DEEPSPEED_DEFAULTS) == zero.DEEPSPEED_DEFAULTS


def test_gpu_placement_writes_no_offload_and_memascend_runs_it():
    p = plan("llama-3.2-1b", resolve_hardware("h100-80g-512g", None))
    c = pc.choose(p, "memascend")
    assert c.placement == "gpu" and c.devices == ("none", "none")
    z = config(c, load_model("llama-3.2-1b"))["zero_optimization"]
    assert "offload_param" not in z and "offload_optimizer" not in z


@pytest.mark.parametrize("engine", ["tuned", "memascend"])
def test_a_placement_that_does_not_fit_is_bad_input_with_what_binds(engine):
    p = plan("qwen2.5-0.5b", replace(CPU, dram_gib=6.0))
    fits = [r.placement for r in pc.engine_rows(p, engine) if r.fits]
    assert "dram" not in fits
    with pytest.raises(BadInput) as e:
        pc.choose(p, engine, "dram")
    assert "binds" in e.value.message and f"({', '.join(fits) or 'none'})" in e.value.hint
    with pytest.raises(BadInput, match="no GPU on this machine"):
        pc.choose(p, engine, "gpu")
    with pytest.raises(BadInput, match="unknown --placement 'disk'"):
        pc.choose(p, engine, "disk")


def test_deepspeed_reads_each_placements_offload_sections():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

    s = zero.resolve("tuned", model=load_model("tiny-llama"), world_size=1, elem_bytes=2)
    for devices in (("none", "none"), ("none", "cpu"), ("cpu", "cpu"), ("nvme", "nvme")):
        z = DeepSpeedZeroConfig(**zero.zero_section(s, "/ssd", param_device=devices[0], optimizer_device=devices[1]))
        got = tuple("none" if o is None else OffloadDeviceEnum(o.device).value
                    for o in (z.offload_param, z.offload_optimizer))
        assert got == devices
    with pytest.raises(ValueError, match="unknown offload device"):
        zero.zero_section(s, "/ssd", param_device="disk")
