"""The placement of a `train` run: every placement priced on the node the run is planned on (planner/placement.py,
as `plan RECIPE` prices them), the one the run uses (planner/placement_choice.py), and whether the installed engine
has the DRAM tier that memascend's dram and split placements hand their budget to. Torch-free."""

from __future__ import annotations

import dataclasses

DRAM_TIER_OPTION = "dram_tier_gib"
"""EngineOptions' field of the DRAM tier's budget per rank (0: every byte on the region)."""


def dram_tier_supported() -> bool:
    """Whether the installed engine's EngineOptions has the DRAM tier (memascend_engine.options imports no torch)."""
    try:
        from memascend_engine.options import EngineOptions
    except ImportError:
        return False
    return DRAM_TIER_OPTION in {f.name for f in dataclasses.fields(EngineOptions)}


def price(job, hw):
    """Every placement of `job` on `hw` (planner.placement.price_placements), timed on the compute device the plan
    uses: the GPU's table rate, else this CPU's cached matmul probe (no probe is run here: without one the
    placements rank by their SSD bytes)."""
    from memascend_cli.compute_probe import plan_device
    from memascend_cli.hardware import local_cpu_model
    from memascend_cli.planner.memory import estimate_all
    from memascend_cli.planner.placement import price_placements

    ests = estimate_all(job, hw, ("tuned", "memascend"))
    device = plan_device(hw, job.dtype, cpu_model=None if hw.num_gpus else local_cpu_model())
    return price_placements(job, hw, ests, device, read_gbps=hw.nvme_read_gbps, write_gbps=hw.nvme_write_gbps)


def choose(job, hw, engine: str, asked: str | None, *, tier_supported: bool, force: bool = False):
    """(the Choice, its document for `train --dry-run`, whether the run is planned as the chosen row: False where
    memascend's DRAM tier is not in the engine, so the run keeps every byte on the region and is planned all-SSD)."""
    from memascend_cli.planner.placement_choice import choose as choose_row

    choice = choose_row(price(job, hw), engine, asked, force=force)
    doc = choice.to_dict()
    as_row = not (engine == "memascend" and choice.dram_tier_bytes and not tier_supported)
    if not as_row:
        doc["note"] = (f"this engine has no DRAM tier yet (EngineOptions.{DRAM_TIER_OPTION}): the run keeps every "
                       "byte on the region, as --placement ssd")
    return choice, doc, as_row


def line(doc: dict) -> str:
    """The one line train prints: the placement and why."""
    return f"placement: {doc['placement']} ({doc['config']}); {doc['why']}" + (
        f"; note: {doc['note']}" if doc.get("note") else "")
