"""memascend_cli/planner/zero.py: the ZeRO settings resolver, partition rules and pool sizing (pure)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from memascend_cli.run.dsconfig import adamw, ds_config
from memascend_cli.models import list_model_presets, load_model
from memascend_cli.planner import memory, subgroups, zero
from memascend_cli.planner import zero as pools
from memascend_cli.planner.context import Context
from memascend_cli.planner.host import adaptive_param_pool
from memascend_cli.units import MiB


def plan_for(name: str, world: int = 1, elem_bytes: int = 2, prefetch_layers: int = 2) -> pools.PoolPlan:
    spec = load_model(name)
    return pools.param_pool_plan(pools.model_partitions(spec, world), elem_bytes=elem_bytes,
                                 per_layer_counts=pools.per_layer_role_counts(spec), prefetch_layers=prefetch_layers)


def test_tiny_llama_fp32_classes():
    # fp32 partitions of tiny-llama: q/k/v/o 512x512 (1 MiB, swappable), MLP 1024x512 and the
    # vocabulary matrices 1024x512 (2 MiB); norms (2 KiB) never swap.
    plan = plan_for("tiny-llama", elem_bytes=4)
    by_size = {c.slot_numel: c for c in plan.classes}
    assert set(by_size) == {262_144, 524_288}
    attn = by_size[262_144]
    assert attn.name == "attn_kv+attn_o+attn_q"
    assert attn.slot_count == 2 * (1 + 2 + 1)  # two layers in the window x (q, k, v, o)
    big = by_size[524_288]
    assert big.name == "mlp+vocab"
    assert big.slot_count == 2 * 3 + 1  # gate/up/down per layer x 2 + one vocab slot
    assert plan.total_bytes == 8 * 1 * MiB + 7 * 2 * MiB


def test_bf16_drops_partitions_below_min_aio_bytes():
    plan = plan_for("tiny-llama", elem_bytes=2)
    # 512x512 bf16 = 512 KiB < 1 MiB: attention never swaps, so it needs no slot.
    assert [c.name for c in plan.classes] == ["mlp+vocab"]
    assert plan.classes[0].slot_numel == 524_288


def test_world_size_shrinks_partitions():
    one, two = plan_for("tiny-llama", 1, 4), plan_for("tiny-llama", 2, 4)
    assert two.largest_slot_numel == one.largest_slot_numel // 2


@pytest.mark.parametrize("name", ["tiny-llama", "llama-3.1-8b", "qwen2.5-7b"])
@pytest.mark.parametrize("world", [1, 4])
def test_matches_planner_adaptive_pool(name, world):
    """The engine allocates exactly what the planner's memascend model says (bf16)."""
    from memascend_cli.planner.spec import HardwareSpec

    spec = load_model(name)
    job = memory.JobSpec(model=spec, dtype="bf16", ranks_per_node=world)
    hw = HardwareSpec(name="test", dram_gib=1024.0, num_gpus=world)
    planner_bytes, _ = adaptive_param_pool(Context(job, hw, "memascend"))
    assert plan_for(name, world, elem_bytes=2).total_bytes == planner_bytes


def test_adaptive_pool_is_far_smaller_than_stock_for_a_real_model():
    spec = load_model("llama-3.1-8b")
    plan = plan_for("llama-3.1-8b")
    stock = 5 * spec.largest_tensor_numel * 2  # buffer_count 5 x buffer_size = embedding, bf16
    assert plan.total_bytes < stock / 2
    # Every slot is page-aligned and holds its class's largest partition.
    for c in plan.classes:
        assert (c.slot_numel * 2) % pools.PAGE_BYTES == 0
        assert c.slot_numel >= c.largest_partition_numel


def test_gqa_kv_gets_its_own_smaller_class():
    plan = plan_for("llama-3.1-8b")
    kv = [c for c in plan.classes if "attn_kv" in c.name]
    q = [c for c in plan.classes if "attn_q" in c.name]
    assert kv and q and kv[0].slot_numel < q[0].slot_numel
    assert kv[0].slot_numel == 1024 * 4096


def test_class_for_routes_to_smallest_fitting_class():
    plan = plan_for("tiny-llama", elem_bytes=4)
    assert plan.classes[plan.class_for(262_144)].slot_numel == 262_144
    assert plan.classes[plan.class_for(262_145)].slot_numel == 524_288
    assert plan.class_for(524_289) is None


def test_prefetch_window_scales_decoder_slots_only():
    p2, p3 = plan_for("tiny-llama", elem_bytes=4), plan_for("tiny-llama", elem_bytes=4, prefetch_layers=3)
    assert p3.slot_count - p2.slot_count == 4 + 3  # one more layer of q/k/v/o and of gate/up/down


def test_slot_alignment_follows_intra_op_parallelism():
    assert pools.slot_alignment_bytes(1) == 4096
    assert pools.slot_alignment_bytes(8) == 8192


def test_uniform_fallback_is_stock_shape():
    plan = pools.uniform_pool_plan(buffer_count=5, buffer_numel=1000, elem_bytes=2)
    assert plan.slot_count == 5 and plan.classes[0].slot_numel == 2048  # 2000 B -> one page


def test_optimizer_buffer_count():
    assert pools.optimizer_buffer_count() == 4
    assert pools.optimizer_buffer_count(pipeline_read=True) == 8
    assert pools.optimizer_buffer_count(pipeline_read=True, pipeline_write=True) == 12


def test_sub_groups_match_planner_partitioning():
    spec = load_model("qwen2.5-7b")
    parts = [n for n, _ in pools.model_partitions(spec, 2)]
    expected = memory.partition(spec, 2, zero.MEMASCEND_SUB_GROUP_SIZE).sub_group_numels
    assert tuple(subgroups.sub_group_numels(parts, zero.MEMASCEND_SUB_GROUP_SIZE)) == expected


def test_optimizer_pool_bytes_is_exact_and_page_aligned():
    assert pools.optimizer_pool_bytes(1000, buffer_count=4) == 4 * 4096
    assert pools.optimizer_pool_bytes(262_144, buffer_count=4) == 4 * MiB


def test_bad_arguments():
    with pytest.raises(ValueError):
        pools.param_pool_plan([], elem_bytes=0, per_layer_counts={})
    with pytest.raises(ValueError):
        pools.param_pool_plan([], elem_bytes=2, per_layer_counts={}, prefetch_layers=0)
    assert pools.param_pool_plan([], elem_bytes=2, per_layer_counts={}).total_bytes == 0


# --- the resolver -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny-llama", "bench-llama-136m", "qwen2.5-7b", "llama-3.1-70b"])
@pytest.mark.parametrize("world", [1, 2, 8])
def test_tuned_and_memascend_differ_in_no_stock_knob(name, world):
    spec = load_model(name)
    t = zero.resolve("tuned", model=spec, world_size=world, elem_bytes=2)
    m = zero.resolve("memascend", model=spec, world_size=world, elem_bytes=2)
    assert t.stock_differences(m) == {}
    assert t.env() == m.env() == {"DS_PIN_MEMORY_BACKEND": "native"}


@pytest.mark.parametrize("name", list_model_presets())
def test_memascend_knobs_are_idempotent(name):
    spec = load_model(name)
    m = zero.resolve("memascend", model=spec, world_size=2, elem_bytes=2)
    largest = zero.largest_swappable_partition(zero.model_partitions(spec, 2), m, 2)
    assert zero.memascend_knobs(m, largest_partition_numel=largest) == m


def test_stock_is_deepspeed_defaults_with_a_buffer_that_fits():
    spec = load_model("qwen2.5-7b")  # embedding 152064 x 3584 > 1e8
    s = zero.resolve("stock", model=spec, world_size=1, elem_bytes=2)
    assert s.stock_differences(zero.DEEPSPEED_DEFAULTS) == {"param_buffer_size": (spec.largest_tensor_numel, 100_000_000)}
    small = zero.resolve("stock", model=load_model("tiny-llama"), world_size=1, elem_bytes=2)
    assert small == zero.DEEPSPEED_DEFAULTS


def test_what_memascend_sets_and_why():
    spec = load_model("bench-llama-136m")
    m = zero.resolve("memascend", model=spec, world_size=1, elem_bytes=2)
    d = zero.DEEPSPEED_DEFAULTS
    changed = set(m.stock_differences(d))
    assert changed == {"sub_group_size", "reduce_bucket_size", "max_in_cpu", "max_reuse_distance",
                       "param_buffer_size", "pin_backend", "reduce_scatter"}
    assert m.param_buffer_size == spec.largest_tensor_numel
    assert m.reduce_scatter is False and m.contiguous_gradients  # the bucket is all-reduced in place


def test_probed_aio_goes_to_tuned_and_memascend_not_stock():
    spec = load_model("tiny-llama")
    kw = dict(model=spec, world_size=1, elem_bytes=2, aio_block_size=4 << 20, aio_queue_depth=32)
    assert zero.resolve("stock", **kw).aio_block_size == 1 << 20
    for p in ("tuned", "memascend"):
        s = zero.resolve(p, **kw)
        assert (s.aio_block_size, s.aio_queue_depth) == (4 << 20, 32)


def test_a_larger_block_size_shrinks_what_swaps():
    spec = load_model("tiny-llama")
    s = zero.resolve("tuned", model=spec, world_size=1, elem_bytes=4, aio_block_size=4 << 20)
    assert zero.min_aio_bytes(s) == 4 << 20
    # Nothing in tiny-llama reaches 4 MiB: no partition swaps, buffer_size keeps DeepSpeed's default.
    assert zero.largest_swappable_partition(zero.model_partitions(spec, 1), s, 4) == 0
    assert s.param_buffer_size == zero.DEEPSPEED_DEFAULTS.param_buffer_size


def test_config_round_trip_and_engine_rewrite_is_a_no_op():
    spec = load_model("bench-llama-136m")
    m = zero.resolve("memascend", model=spec, world_size=1, elem_bytes=2)
    cfg = ds_config(m, nvme_path="/x", micro_batch=1, precision="bf16", optimizer=adamw(1e-4))
    assert zero.from_ds_config(cfg, m.env()) == m
    before = copy.deepcopy(cfg)
    assert zero.write_into_ds_config(cfg, m) == {}
    assert cfg == before


def test_engine_rewrite_of_a_stock_config_reports_each_change():
    spec = load_model("bench-llama-136m")
    s = zero.resolve("stock", model=spec, world_size=1, elem_bytes=2)
    cfg = ds_config(s, nvme_path="/x", micro_batch=1, precision="bf16", optimizer=adamw(1e-4))
    m = zero.memascend_knobs(s, largest_partition_numel=spec.largest_tensor_numel)
    changes = zero.write_into_ds_config(cfg, m)
    assert changes["max_in_cpu"] == {"from": 1_000_000_000, "to": 0}
    assert changes["sub_group_size"] == {"from": 1_000_000_000, "to": zero.MEMASCEND_SUB_GROUP_SIZE}
    assert cfg["zero_optimization"]["offload_param"]["nvme_path"] == "/x"


def test_from_ds_config_takes_deepspeed_defaults_and_float_counts():
    s = zero.from_ds_config({"zero_optimization": {"reduce_bucket_size": 5e7, "offload_param": {"device": "nvme"}}})
    assert s == replace(zero.DEEPSPEED_DEFAULTS, reduce_bucket_size=50_000_000)


def test_old_deepspeed_did_not_pin_by_default():
    assert zero.version_defaults((0, 19, 3)).pin_memory is False
    assert zero.version_defaults((0, 19, 8)) == zero.DEEPSPEED_DEFAULTS


def test_resolve_rejects_unknown_engine():
    with pytest.raises(ValueError):
        zero.resolve("fast", model=load_model("tiny-llama"), world_size=1, elem_bytes=2)


def test_deepspeed_key_aliases_are_read_and_written_under_the_name_the_config_uses():
    # DeepSpeed accepts param_persistence_threshold for stage3_param_persistence_threshold (and rejects both at once).
    cfg = {"zero_optimization": {"stage": 3, "param_persistence_threshold": 1024, "max_live_parameters": 100,
                                 "offload_param": {"device": "nvme"}}}
    s = zero.from_ds_config(cfg)
    assert (s.param_persistence_threshold, s.max_live_parameters) == (1024, 100)
    zero.write_into_ds_config(cfg, zero.memascend_knobs(s))
    z = cfg["zero_optimization"]
    assert "stage3_param_persistence_threshold" not in z and z["param_persistence_threshold"] == 1024
    assert "stage3_max_live_parameters" not in z and "stage3_max_reuse_distance" in z
    assert z["stage3_max_reuse_distance"] == 0


def test_capped_knobs_the_user_gave_are_reported():
    given = replace(zero.DEEPSPEED_DEFAULTS, reduce_bucket_size=1_000_000_000, optimizer_buffer_count=8)
    notes = zero.knob_notes(given, "memascend")
    assert len(notes) == 2
    assert any(n.startswith("reduce_bucket_size 1,000,000,000 is capped to 2,097,152") for n in notes)
    assert any(n.startswith("optimizer_buffer_count 8 is replaced by 4") for n in notes)
    assert zero.knob_notes(given, "tuned") == notes
    assert zero.knob_notes(given, "stock") == []  # stock runs every knob as given
    # memascend's pools are sized per tensor role: a buffer count is used by stock and tuned only.
    pools_given = replace(zero.DEEPSPEED_DEFAULTS, param_buffer_count=8)
    assert zero.knob_notes(pools_given, "tuned") == []
    assert zero.knob_notes(pools_given, "memascend") == [
        "param_buffer_count 8 is not used by memascend (its parameter pools are sized per tensor role); stock and "
        "tuned use it"]
    sized = replace(zero.DEEPSPEED_DEFAULTS, param_buffer_size=200_000_000)
    assert zero.knob_notes(sized, "tuned", largest_partition_numel=136_134_656) == [
        "param_buffer_size 200,000,000 is replaced by 136,134,656 for tuned and memascend (a knob memascend sets; "
        "stock uses it as given)"]
    # DeepSpeed's defaults are capped too, but the user gave none of them: nothing to say.
    assert zero.knob_notes(zero.DEEPSPEED_DEFAULTS, "memascend") == []


def test_resolve_collects_the_notes_of_the_knobs_it_caps():
    spec = load_model("tiny-llama")
    notes: list[str] = []
    base = replace(zero.DEEPSPEED_DEFAULTS, sub_group_size=10**8)
    s = zero.resolve("memascend", model=spec, world_size=1, elem_bytes=2, base=base, notes=notes)
    assert s.sub_group_size == zero.MEMASCEND_SUB_GROUP_SIZE
    assert notes == [f"sub_group_size 100,000,000 is capped to {zero.MEMASCEND_SUB_GROUP_SIZE:,} for tuned and "
                     "memascend (the largest value memascend runs with; stock uses it as given)"]
    zero.resolve("stock", model=spec, world_size=1, elem_bytes=2, base=base, notes=notes)
    assert len(notes) == 1


def test_the_bench_runs_the_engines():
    from memascend_cli.bench.runs import MODES  # kept free of the planner for the child process

    assert MODES == zero.ENGINES
