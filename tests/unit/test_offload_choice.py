"""install() / launch keeping a user's ZeRO-3 CPU offload where the DRAM holds it (planner/offload_choice.py): the
decision against stock's `dram` placement (planner/placement.py) for fits / does not fit / a cgroup limit below
MemAvailable / forced placements, the job read from a user's config, and the cgroup limit read from the files."""

from pathlib import Path

import pytest

from memascend_cli.hardware import resolve_hardware
from memascend_cli.models import load_model
from memascend_cli.planner import offload_choice as oc
from memascend_cli.planner import placement as pl
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.run import cgroup
from memascend_cli.units import GiB

CGROUP_ASSETS = Path(__file__).resolve().parents[1] / "assets" / "cgroup"
CPU_OFFLOAD = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
               "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                     "offload_optimizer": {"device": "cpu"}}}
NODE = HardwareSpec(name="test", dram_gib=64.0, cpu_cores=2)


def job(model: str = "qwen2.5-0.5b", cfg: dict = CPU_OFFLOAD):
    return oc.job_for_config(cfg, load_model(model), ranks_per_node=1, zero_init=True)


def stock_peak(j, available: int) -> tuple[int, int]:
    """Stock's dram peak on the node as the choice sees it, and the headroom it keeps free."""
    node = NODE.under_dram_cap(available)
    return pl.stock_row(j, node, "dram").est.node_host_peak_bytes, pl.headroom_bytes(node)


def test_kept_in_dram_where_stock_placement_fits_with_the_headroom():
    j, assumed = job()
    peak, _ = stock_peak(j, 40 * GiB)
    avail = peak + 4 * GiB
    _, margin = stock_peak(j, avail)
    c = oc.decide(j, NODE, oc.DramView(mem_available_bytes=avail), assumptions=assumed)
    assert not c.move and c.kept == "DRAM" and c.peak_bytes == peak
    assert c.available_bytes == avail and c.headroom_bytes == avail - peak > margin
    assert c.line().startswith("placement: offload kept in DRAM as the config writes it, memascend's region not used")
    assert "seq 512" in c.line()  # what it assumed is said


def test_moved_to_the_region_where_the_headroom_is_missing():
    j, _ = job()
    peak, _ = stock_peak(j, 40 * GiB)
    c = oc.decide(j, NODE, oc.DramView(mem_available_bytes=peak + GiB // 4))
    assert c.move and 0 < c.headroom_bytes < GiB // 2
    assert "does not fit" in c.reason and "DRAM binds" in c.reason
    assert c.line().startswith("placement: offload moved to memascend's region")


def test_this_process_rss_counts_as_available():
    """MemAvailable excludes what this process already holds; the plan's peak includes it."""
    j, _ = job()
    peak, _ = stock_peak(j, 40 * GiB)
    short = peak + GiB // 4  # below the headroom (at least 0.5 GiB)
    assert oc.decide(j, NODE, oc.DramView(mem_available_bytes=short)).move
    assert not oc.decide(j, NODE, oc.DramView(mem_available_bytes=short, own_rss_bytes=2 * GiB)).move


def test_a_cgroup_limit_below_mem_available_decides():
    j, _ = job()
    peak, _ = stock_peak(j, 40 * GiB)
    view = oc.DramView(mem_available_bytes=peak + 20 * GiB, cgroup_limit_bytes=peak - GiB)
    c = oc.decide(j, NODE, view)
    assert c.move and c.available_bytes == peak - GiB and "the cgroup's memory limit" in c.reason
    assert not oc.decide(j, NODE, oc.DramView(mem_available_bytes=peak + 20 * GiB,
                                              cgroup_limit_bytes=peak + 20 * GiB)).move


@pytest.mark.parametrize("placement,move", [("region", True), ("dram", False)])
def test_a_forced_placement_is_not_priced(placement, move):
    j, _ = job()
    roomy, tight = oc.DramView(mem_available_bytes=60 * GiB), oc.DramView(mem_available_bytes=GiB)
    for view in (roomy, tight):
        c = oc.decide(j, NODE, view, placement=placement)
        assert c.move is move and c.peak_bytes is None and f"asked: placement '{placement}'" in c.line()


def test_an_unknown_placement_is_refused():
    with pytest.raises(ValueError, match="placement='ssd'"):
        oc.decide(None, NODE, None, placement="ssd")


def test_an_unknown_model_keeps_the_config_and_says_what_it_assumed():
    c = oc.decide(None, NODE, oc.DramView(mem_available_bytes=GiB), assumptions=["it fits (no config)"])
    assert not c.move and c.peak_bytes is None
    assert "the model is unknown" in c.line() and "assumed it fits (no config)" in c.line()


def test_no_offload_on_a_gpu_node_prices_the_gpu_placement():
    h100 = resolve_hardware("h100-80g-512g", None)
    none = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1}
    small = oc.decide(job("qwen2.5-0.5b", none)[0], h100, None, offload_none=True)
    assert not small.move and small.kept == "GPU memory" and small.available_bytes == int(h100.gpu_mem_gib * GiB)
    big = oc.decide(job("qwen2.5-72b", none)[0], h100, None, offload_none=True)
    assert big.move and "GPU memory binds" in big.reason


def test_job_for_config_reads_the_config_and_lists_its_assumptions():
    spec = load_model("qwen2.5-0.5b")
    cfg = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 4, "bf16": {"enabled": "auto"},
           "zero_optimization": {"stage": 3, "sub_group_size": 5e8, "reduce_bucket_size": "auto",
                                 "offload_optimizer": {"device": "cpu"}}}
    j, assumed = oc.job_for_config(cfg, spec, ranks_per_node=2, zero_init=False)
    assert (j.micro_batch, j.grad_accum_steps, j.dtype, j.ranks_per_node, j.zero_init) == (1, 4, "fp32", 2, False)
    assert j.knobs.sub_group_size == 500_000_000 and j.seq_len == oc.ASSUMED_SEQ_LEN
    assert any("micro-batch 1" in a for a in assumed) and any("bf16.enabled 'auto'" in a for a in assumed)
    short = load_model("tiny-llama")
    if short.max_position_embeddings and short.max_position_embeddings < oc.ASSUMED_SEQ_LEN:
        assert oc.job_for_config(cfg, short, ranks_per_node=1, zero_init=True)[0].seq_len == \
            short.max_position_embeddings


def test_dram_view_takes_the_lower_of_mem_available_and_the_cgroup_limit():
    assert oc.DramView(mem_available_bytes=10, own_rss_bytes=2).available_bytes == 12
    v = oc.DramView(mem_available_bytes=10, own_rss_bytes=2, cgroup_limit_bytes=5)
    assert v.available_bytes == 5 and v.source == "the cgroup's memory limit"


def test_the_memory_limit_of_a_cgroup_is_the_lowest_along_its_ancestors():
    mountinfo = (CGROUP_ASSETS / "mountinfo_v1.txt").read_text()
    proc = (CGROUP_ASSETS / "proc_cgroup_v1.txt").read_text()
    h = cgroup.detect(mountinfo, proc, None, "memory")
    parent = str(Path(h.own_dir).parent)
    files = {f"{h.own_dir}/memory.limit_in_bytes": "9223372036854771712\n",
             f"{h.mount_point}/memory.limit_in_bytes": "9223372036854771712\n"}
    assert cgroup.memory_limit_bytes(h, files.get) is None  # v1's "no limit"
    files[f"{parent}/memory.limit_in_bytes"] = str(6 * GiB)
    assert cgroup.memory_limit_bytes(h, files.get) == 6 * GiB
    files[f"{h.own_dir}/memory.limit_in_bytes"] = str(2 * GiB)
    assert cgroup.memory_limit_bytes(h, files.get) == 2 * GiB
    v2 = cgroup.detect((CGROUP_ASSETS / "mountinfo_v2.txt").read_text(),
                       (CGROUP_ASSETS / "proc_cgroup_v2.txt").read_text(),
                       (CGROUP_ASSETS / "cgroup.controllers_v2").read_text(), "memory")
    assert cgroup.memory_limit_bytes(v2, {f"{v2.own_dir}/memory.max": "max\n"}.get) is None
    assert cgroup.memory_limit_bytes(v2, {f"{v2.own_dir}/memory.max": f"{3 * GiB}\n"}.get) == 3 * GiB
