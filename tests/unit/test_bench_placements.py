"""`bench --placement` and `--placements` without running DeepSpeed (memascend_cli/bench/placements.py): the caps, the
runs each budget point picks, each run's config and prediction from its placement row, the compact document, and the
options that do not go with a sweep."""

from __future__ import annotations

import pytest

from memascend_cli.bench import placements as bp
from memascend_cli.bench import runner
from memascend_cli.bench.configs import build_ds_config, placed_estimate, row_prediction
from memascend_cli.bench.runs import RunSpec
from memascend_cli.errors import BadInput
from memascend_cli.hardware import resolve_hardware
from memascend_cli.models import load_model
from memascend_cli.planner import time as tm
from memascend_cli.planner.memory import estimate
from memascend_cli.planner.placement_choice import Choice
from memascend_cli.units import GiB

CPU = resolve_hardware("cpu-24g", None)


def point(hw=CPU, model="qwen2.5-0.5b", seq_len=512) -> runner.Point:
    return runner.Point(model=model, spec=load_model(model), layers=None, seq_len=seq_len, micro_batch=1, steps=3,
                        dtype="bf16", seed=0, checkpointing="full", ranks=1, host_budget_bytes=None,
                        accelerator="cpu", hw=hw, deepspeed_version="0.19.8",
                        timing={"device": tm.cpu_device(100.0, "test"), "read_gbps": 0.4, "write_gbps": 0.4,
                                "duplex_io": True})


def test_caps_are_two_or_more_ascending_sizes():
    assert bp.parse_caps("3GiB, 6GiB,12GiB") == [3 * GiB, 6 * GiB, 12 * GiB]
    for bad in ("4GiB", "6GiB,3GiB", "3GiB,3GiB", "3GiB,lots"):
        with pytest.raises(BadInput):
            bp.parse_caps(bad)


def test_each_budget_runs_stocks_best_tuned_on_the_ssd_and_memascends_choice():
    roomy = bp.price(point(CPU.under_dram_cap(20 * GiB)))
    chosen = bp.sweep_choices(roomy)
    assert chosen["tuned"].row is roomy.row("ssd", "stock") and chosen["tuned"].devices == ("nvme", "nvme")
    best = chosen["stock-best"]
    assert best.row.engine == "stock" and best.placement != "ssd" and best.row.fits
    assert chosen["memascend"].row.engine == "memascend" and chosen["memascend"].row.fits
    # Where stock fits nothing but the SSD, tuned's run is stock's best: no second run.
    tight = next(bp.price(point(CPU.under_dram_cap(g * GiB))) for g in (3, 4, 5, 6)
                 if not any(r.fits for r in bp.price(point(CPU.under_dram_cap(g * GiB))).rows
                            if r.engine == "stock" and r.placement != "ssd"))
    assert "stock-best" not in bp.sweep_choices(tight)


def test_stocks_dram_row_runs_even_where_the_plan_ranks_it_behind_tuned():
    """The fastest stock config that fits is measured, not taken from the plan: at a cap where stock's split (nvme +
    max_in_cpu) fits but is planned slower than tuned all on the SSD, both run."""
    import dataclasses

    p = point(CPU.under_dram_cap(int(2.75 * GiB)), model="bench-llama-136m")
    plan = bp.price(dataclasses.replace(p, spec=load_model("bench-llama-136m").scaled(4), dtype="fp32"))
    split, ssd = plan.row("split", "stock"), plan.row("ssd", "stock")
    assert split.fits and ssd.fits and split.time.step_s > ssd.time.step_s
    chosen = bp.sweep_choices(plan)
    assert chosen["stock-best"].row is split and chosen["tuned"].row is ssd
    assert "its all-SSD config is tuned's run" in chosen["stock-best"].why


def test_a_runs_config_and_prediction_come_from_its_placement_row():
    p = point(CPU.under_dram_cap(20 * GiB))
    chosen = bp.sweep_choices(bp.price(p))
    best, mine = chosen["stock-best"], chosen["memascend"]
    cfg = build_ds_config("tuned", p.spec, micro_batch=1, dtype="bf16", nvme_dir="/ssd", ranks=1, choice=best)
    z = cfg["zero_optimization"]
    assert tuple((z.get(k) or {}).get("device", "none") for k in ("offload_param", "offload_optimizer")) == best.devices
    ssd_cfg = build_ds_config("tuned", p.spec, micro_batch=1, dtype="bf16", nvme_dir="/ssd", ranks=1)
    planned = p.predict("tuned", ssd_cfg)
    placed = row_prediction(best.row, p.hw)
    assert set(planned) - {"time"} <= set(placed)  # the rest of the bench reads both alike
    assert placed["node_host_peak_bytes"] == best.row.est.node_host_peak_bytes
    assert placed["time"] == best.row.time.to_dict()
    # memascend's tier row is its prediction only where the engine gets the tier.
    run = RunSpec("memascend", "memascend")
    m_cfg = build_ds_config("memascend", p.spec, micro_batch=1, dtype="bf16", nvme_dir="/ssd", ranks=1, choice=mine)
    assert runner._tier_gib(run, mine, False) is None
    assert runner._prediction(p, run, m_cfg, mine, None) == p.predict("memascend", m_cfg)
    assert runner._placement_args(mine, None) == []  # no tier in the engine: every byte stays on the region
    if mine.dram_tier_bytes:
        assert runner._tier_gib(run, mine, True) == mine.dram_tier_bytes / GiB
        where = ["--checkpoint-offload", mine.row.checkpoint_offload] if mine.row.checkpoint_offload else []
        off = [a for t in ("overlap_optimizer", "layer_trims") if getattr(mine.row, t) is False
               for a in ("--disable", t)]
        assert runner._placement_args(mine, 1.0) == ["--dram-tier-gib", "1.0"] + where + off
        assert runner._prediction(p, run, m_cfg, mine, 1.0)["node_host_peak_bytes"] == \
            mine.row.est.node_host_peak_bytes


def test_a_tuned_config_without_prefetch_is_planned_with_blocking_fetches():
    """Stock's split runs with stage3_prefetch_bucket_size 0 (planner.placement.SPLIT_PREFETCH_BUG): a recorded run
    of such a config is re-planned as its row priced it, each fetch blocking its module (stock's serial forward +
    backward), not with tuned's overlap of reads and compute."""
    p = point()
    cfg = build_ds_config("tuned", p.spec, micro_batch=1, dtype="bf16", nvme_dir="/ssd", ranks=1)
    overlapped = p.predict("tuned", cfg)["time"]
    cfg["zero_optimization"]["stage3_prefetch_bucket_size"] = 0
    blocking = p.predict("tuned", cfg)["time"]
    fb = tm.PHASE_FORWARD_BACKWARD
    assert blocking["phase_seconds"][fb] > overlapped["phase_seconds"][fb]
    assert blocking["overlap"].startswith("forward/backward: compute + SSD")


def test_a_recorded_placement_is_replanned_where_the_run_kept_its_bytes():
    """configs.placed_estimate (what repredict gives a bench --placement run): from the run's config and its recorded
    placement, the estimate the bench priced that placement with (its SSD bytes, DRAM-resident bytes and host peak),
    not the config's all-SSD one; a DRAM tier held with the overlap's two generations of chunks leaves more on the
    SSD than one without them."""
    plans = [bp.price(point(CPU.under_dram_cap(g * GiB))) for g in (3, 4, 5, 6, 8)]
    plan, p = next((pl, point(CPU.under_dram_cap(g * GiB))) for pl, g in zip(plans, (3, 4, 5, 6, 8))
                   if pl.row("split", "memascend").est is not None)
    rows = [r for r in plan.rows if r.est is not None and r.placement != "gpu"]
    assert {(r.placement, r.engine) for r in rows} >= {("dram", "stock"), ("dram", "memascend"),
                                                       ("split", "memascend"), ("ssd", "stock")}
    for row in rows:
        mode = "memascend" if row.engine == "memascend" else "tuned"
        choice = Choice(mode, row, True, "")
        cfg = build_ds_config(mode, p.spec, micro_batch=1, dtype="bf16", nvme_dir="/ssd", ranks=1, choice=choice)
        job, engine = p.plan_job(mode, cfg)
        placement = {**choice.to_dict(), "tier_overlap": job.overlap_optimizer}
        placed = placed_estimate(job, p.hw, estimate(job, p.hw, engine), placement)
        t, want = placed.traffic, row.est.traffic
        assert (t.read_total, t.write_total, t.dram_state_elems) == \
            (want.read_total, want.write_total, want.dram_state_elems), row.placement
        assert placed.node_host_peak_bytes == row.est.node_host_peak_bytes, (row.placement, row.engine)
        if row.placement == "split" and row.engine == "memascend":
            one = placed_estimate(job, p.hw, estimate(job, p.hw, engine), {**placement, "tier_overlap": False})
            two = placed_estimate(job, p.hw, estimate(job, p.hw, engine), {**placement, "tier_overlap": True})
            assert one.traffic.write_total < two.traffic.write_total


SPLIT_0749 = ("docs/bench/placements/bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-quiet5-split-0749/"
              "placements-clip10-quiet5-split-0749-cap-2.3GiB.json.gz")


def test_a_recorded_tier_is_replanned_in_the_order_its_engine_took():
    """A split recorded before planner.dram_tier.ORDER (its tier's stats name no order) held the optimizer chunks
    before the gradients: replanned so, its SSD bytes are what it moved (the parameters resident, 17% of the chunks,
    the gradients kept for a redo written); the same tier in today's order holds the gradients instead, and the step
    writes less and reads more."""
    import copy
    import gzip
    import json

    from memascend_cli.bench.configs import repredict, tier_gradients_first
    from memascend_cli.planner import dram_tier

    with gzip.open(SPLIT_0749) as f:
        doc = json.load(f)
    run = next(r for r in doc["runs"] if r["mode"] == "memascend")
    assert not tier_gradients_first(run)
    old = repredict(doc, run)["ssd_traffic"]
    assert sum(old["write_bytes"].values()) == pytest.approx(run["ssd_write_bytes_per_step"], rel=0.001)
    assert sum(old["read_bytes"].values()) == pytest.approx(run["ssd_read_bytes_per_step"], rel=0.001)
    today = copy.deepcopy(run)
    today["engine_stats"][0]["region_io"]["dram_tier"]["order"] = dram_tier.ORDER
    assert tier_gradients_first(today) and tier_gradients_first(doc["runs"][0])  # tuned: no tier
    new = repredict(doc, today)["ssd_traffic"]
    assert new["write_bytes"]["gradients"] < old["write_bytes"]["gradients"] / 2
    assert new["read_bytes"]["optimizer_states"] > old["read_bytes"]["optimizer_states"]
    assert sum(new["write_bytes"].values()) < 0.9 * sum(old["write_bytes"].values())


def _run(name: str, mode: str, read: float | None) -> dict:
    return {"name": name, "mode": mode, "ok": True, "error": None, "oom_killed": False, "seconds_per_step": 2.0,
            "tokens_per_s": 256.0, "ssd_read_bytes_per_step": read, "ssd_write_bytes_per_step": read and read / 2,
            "peak_system_bytes": GiB, "cgroup": {"peak_bytes": 2 * GiB}, "losses": [1.0], "others_cpu_seconds": 3.0,
            "bench_cpu_seconds": 1.0, "wall_s": 8.0}


def test_the_compact_document_resolves_stocks_best_and_counts_ssd_bytes_per_parameter():
    p = point(CPU.under_dram_cap(20 * GiB))
    plan = bp.price(p)
    chosen = {k: v for k, v in bp.sweep_choices(plan).items() if k != "stock-best"}
    n = p.spec.num_params
    doc = {"job": {"num_params": n}, "runs": [_run("tuned", "tuned", 6.0 * n), _run("memascend", "memascend", 0.0)]}
    pt = bp.point_entry(20 * GiB, plan, chosen, doc, (1.0, 2.0, 3.0, 1.5, 2.5, 3.5))
    assert pt["runs"]["stock-best"] == {"same_as": "tuned"}
    assert pt["runs"]["tuned"]["ssd_bytes_per_param"] == 9.0 and pt["runs"]["memascend"]["ssd_bytes_per_param"] == 0
    assert pt["runs"]["tuned"]["load"]["cores_taken"] == 0.5
    assert pt["runs"]["tuned"]["planned"]["ssd_bytes_per_param"] == round(plan.row("ssd", "stock").ssd_bytes / n, 3)
    summary = {"points": [pt]}
    (best,) = bp.curve(summary, "stock-best")
    assert best["cap_gib"] == 20 and best["mode"] == "tuned" and best["placement"] == "ssd"


@pytest.mark.parametrize("args,fragment", [
    (["--placements", "4GiB"], "two or more DRAM caps"),
    (["--placements", "2GiB,4GiB", "--dram-cap", "4GiB"], "--dram-cap does not apply to --placements"),
    (["--placements", "2GiB,4GiB", "--runs", "tuned"], "--runs does not apply to --placements"),
    (["--placements", "2GiB,4GiB", "--seq-len", "64,128"], "--seq-len does not apply to --placements"),
    (["--placement", "disk"], "unknown --placement 'disk'"),
])
def test_options_that_do_not_go_with_placements_are_bad_input(cli, tmp_path, args, fragment):
    r = cli("bench", "--model", "tiny-llama", "--out", str(tmp_path / "out"), *args)
    assert r.exit_code == 2 and fragment in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr


def test_the_plot_and_table_draw_every_curve(tmp_path):
    p = point(CPU.under_dram_cap(20 * GiB))
    plan = bp.price(p)
    chosen = bp.sweep_choices(plan)
    n = p.spec.num_params
    runs = [_run(name, chosen[name].engine, 1.0 * n) for name in chosen]
    pts = [bp.point_entry(c, plan, chosen, {"job": {"num_params": n}, "runs": runs}, (0.0,) * 6)
           for c in (10 * GiB, 20 * GiB)]
    doc = {"job": {"model": p.model, "num_params": n, "seq_len": p.seq_len}, "points": pts}
    assert bp.write_plot(doc, str(tmp_path / "p.png")) is None and (tmp_path / "p.png").stat().st_size > 0
    bp.render_table(doc)
    assert [c["cap_gib"] for c in bp.curve(doc, "memascend")] == [10, 20]
