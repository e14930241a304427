"""Which placement a run uses (`train`, `bench`): the plan's recommendation among the placements its engine runs, or
the one asked for with --placement, refused with what binds when it does not fit; and what DeepSpeed and the engine
are given for it. Pure: stdlib only, no I/O.

The engines run the rows of planner/placement.py: stock and tuned run stock's rows (the plan prices stock's strongest
config with tuned's knobs), memascend its own rows and the gpu row (ZeRO-3 without offload, which it runs unchanged).
memascend's dram and split rows hold their bytes in the engine's DRAM tier (EngineOptions.dram_tier_gib): the
optimizer's DeepSpeed config stays the region's (the parameters' too in the split row; the dram row keeps them where
stock's ZeRO-Offload does), the tier's budget goes to the engine beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memascend_cli.errors import BadInput
from memascend_cli.planner import placement as pl
from memascend_cli.planner.zero import ZeroSettings
from memascend_cli.units import GiB


def side(engine: str) -> str:
    """The rows an engine runs: stock's for stock and tuned, memascend's for memascend."""
    return "memascend" if engine == "memascend" else "stock"


def engine_rows(plan: pl.PlacementPlan, engine: str) -> list[pl.Priced]:
    """The rows `engine` runs, in the plan's order (memascend runs the gpu row unchanged)."""
    s = side(engine)
    return [r for r in plan.rows if r.engine == s or (s == "memascend" and r.placement == "gpu")]


def row_for(plan: pl.PlacementPlan, placement: str, engine: str, *, force: bool = False) -> pl.Priced:
    """The row `engine` runs `placement` with. An unknown placement, or one that does not fit (with what binds) unless
    `force` (train --force runs a job the plan says does not fit), is bad input: exit 2."""
    if placement not in pl.PLACEMENTS:
        raise BadInput(f"unknown --placement {placement!r}", "use " + ", ".join(pl.PLACEMENTS))
    rows = engine_rows(plan, engine)
    row = next(r for r in rows if r.placement == placement)
    if row.est is None or not (row.fits or force):
        what = row.note if row.est is None else f"{row.binds} binds: " + "; ".join(row.verdict.reasons)
        fitting = ", ".join(r.placement for r in rows if r.fits) or "none"
        raise BadInput(f"placement {placement} does not fit with {row.engine}: {what}",
                       f"choose a placement that fits ({fitting}), or drop --placement")
    return row


@dataclass(frozen=True)
class Choice:
    """The placement a run uses, the row that prices it, and why."""

    engine: str
    """The run's engine (stock, tuned, memascend)."""
    row: pl.Priced
    asked: bool
    """True: --placement; False: the plan's choice."""
    why: str

    @property
    def placement(self) -> str:
        return self.row.placement

    @property
    def devices(self) -> tuple[str, str]:
        """(offload_param, offload_optimizer) device of the DeepSpeed config: the row's (memascend's tier rows keep
        the optimizer on the region's nvme: the tier is the engine's)."""
        return self.row.devices

    @property
    def dram_tier_bytes(self) -> int:
        """memascend's DRAM tier per rank (0: every byte on the region)."""
        t = self.row.tier or {}
        return sum(t.get(k, 0) for k in ("params_bytes", "optimizer_states_bytes", "gradients_bytes"))

    def settings(self, s: ZeroSettings) -> ZeroSettings:
        """The engine's ZeRO settings with the placement's max_in_cpu and prefetch (stock's split row), else
        unchanged."""
        if self.row.max_in_cpu is not None:
            s = replace(s, max_in_cpu=int(self.row.max_in_cpu))
        if self.row.prefetch_bucket_size is not None:
            s = replace(s, prefetch_bucket_size=int(self.row.prefetch_bucket_size))
        return s

    def to_dict(self) -> dict:
        r = self.row
        t = r.time
        return {"placement": r.placement, "engine": self.engine, "row_engine": r.engine, "config": r.config,
                "asked": self.asked, "why": self.why, "offload_param": r.devices[0], "offload_optimizer": r.devices[1],
                "max_in_cpu": r.max_in_cpu, "prefetch_bucket_size": r.prefetch_bucket_size,
                "dram_tier_bytes": self.dram_tier_bytes,
                "checkpoint_offload": r.checkpoint_offload, "overlap_optimizer": r.overlap_optimizer,
                "layer_trims": r.layer_trims,
                "dram_tier_gib": round(self.dram_tier_bytes / GiB, 3), "planned_host_peak_bytes":
                r.est.node_host_peak_bytes if r.est else None, "planned_ssd_bytes_per_step": r.ssd_bytes,
                "planned_seconds_per_step": t.step_s if t else None, "binding": r.binds}


def choose(plan: pl.PlacementPlan, engine: str, asked: str | None = None, *, force: bool = False) -> Choice:
    """The placement `engine` runs: `asked` (row_for: refused when it does not fit), else the fastest of its rows that
    fits (placement.recommend), else its all-SSD row (the run's own plan then decides whether it starts)."""
    if asked is not None:
        row = row_for(plan, asked, engine, force=force)
        return Choice(engine, row, True, f"{asked} as asked (--placement or the recipe's placement): {pl.who(row)}, "
                      f"{pl.step_words(row)}")
    rows = engine_rows(plan, engine)
    best = pl.recommend(rows)
    if best is None:
        ssd = next(r for r in rows if r.placement == "ssd")
        return Choice(engine, ssd, False, f"no placement fits with {engine}: {pl.who(ssd)}, as the plan's verdict")
    if best is plan.recommended:
        return Choice(engine, best, False, f"the plan's recommendation: {plan.why}")
    rec = f"; the plan recommends {pl.who(plan.recommended)}" if plan.recommended else ""
    return Choice(engine, best, False, f"the fastest placement {engine} runs that fits: {pl.who(best)}, "
                                       f"{pl.step_words(best)}{rec}")
