"""How a user's script builds the model before deepspeed.initialize (JobSpec.model_init, host/model_build): the whole
model in fp32, or for from_pretrained the memory-mapped checkpoint in its dtype, counted in the init phase of every
engine."""

from dataclasses import replace

import pytest

from memascend_cli.errors import BadInput
from memascend_cli.models import load_preset
from memascend_cli.planner import host
from memascend_cli.planner.job import MODEL_INITS, JobSpec
from memascend_cli.planner.memory import estimate
from memascend_cli.planner.spec import HardwareSpec

CPU = HardwareSpec(name="cpu", dram_gib=24)
MODEL = load_preset("bench-llama-136m")


def _job(model_init="zero", dtype="fp32", **kw):
    return JobSpec(model=MODEL, seq_len=512, micro_batch=2, dtype=dtype, checkpointing="none",
                   model_init=model_init, **kw)


def _init_items(est):
    return {i.key: i.bytes for i in est.items if i.kind == "init" and i.key.startswith("host/model_")}


@pytest.mark.parametrize("engine", ["stock", "tuned", "memascend"])
def test_a_model_built_under_zero_init_is_never_whole_on_the_host(engine):
    assert _init_items(estimate(_job("zero"), CPU, engine)) == {}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("engine", ["stock", "tuned", "memascend"])
def test_an_eager_build_holds_the_whole_fp32_model_beside_the_process_and_parameter_pool(engine, dtype):
    """Whatever the training dtype, the model is fp32 (transformers' default); initialize partitions it with Init's
    parameter pool allocated, before the optimizer's buffers: the init level is those items plus the model."""
    est = estimate(_job("eager", dtype=dtype), CPU, engine)
    before = sum(i.bytes for i in est.items if i.kind == "steady" and i.key in host.BEFORE_PARTITIONING_KEYS)
    assert 0 < before < est.host_steady_bytes
    assert _init_items(est) == {"host/model_build": max(0, before + 4 * MODEL.num_params - est.host_steady_bytes)}
    assert est.host_steady_bytes + est.phase_bytes()["init"] >= before + 4 * MODEL.num_params


@pytest.mark.parametrize("dtype, elem_bytes", [("fp32", 4), ("bf16", 2)])
def test_from_pretrained_holds_the_mapped_checkpoint_in_the_job_dtype_and_no_second_copy(dtype, elem_bytes):
    """dtype auto: the parameters are the memory-mapped checkpoint's tensors, in its dtype (saved in the job's)."""
    est = estimate(_job("from-pretrained", dtype=dtype), CPU, "memascend")
    before = sum(i.bytes for i in est.items if i.kind == "steady" and i.key in host.BEFORE_PARTITIONING_KEYS)
    model = elem_bytes * MODEL.num_params
    assert _init_items(est) == {"host/model_build": max(0, before + model - est.host_steady_bytes)}
    eager = _init_items(estimate(_job("eager", dtype=dtype), CPU, "memascend"))["host/model_build"]
    assert (_init_items(est)["host/model_build"] == eager) is (dtype == "fp32")


def test_the_build_phase_is_the_peak_when_it_is_larger_than_the_rest():
    """memascend's steady level is small: a model built whole before initialize can be its peak phase."""
    big = replace(MODEL, num_hidden_layers=8 * MODEL.num_hidden_layers, published_num_params=None)
    est = estimate(replace(_job("eager"), model=big, seq_len=16), CPU, "memascend")
    assert est.peak_phase == "init"
    assert est.host_peak_bytes >= 4 * big.num_params


def test_no_zero_init_is_an_eager_build_and_model_init_sets_zero_init():
    assert JobSpec(model=MODEL, zero_init=False).model_init == "eager"
    assert not JobSpec(model=MODEL, model_init="from-pretrained").zero_init
    assert JobSpec(model=MODEL).model_init == "zero" and JobSpec(model=MODEL).zero_init
    assert set(MODEL_INITS) == {"zero", "eager", "from-pretrained"}


def test_an_unknown_model_init_is_bad_input():
    with pytest.raises(BadInput, match="model init"):
        JobSpec(model=MODEL, model_init="lazy")


@pytest.mark.parametrize(("model_init", "trainer", "chunked"), [
    ("zero", "deepspeed", True), ("eager", "deepspeed", False), ("from-pretrained", "deepspeed", False),
    ("zero", "hf", False), ("zero", "trl", False)])
def test_only_memascend_trains_job_plans_the_chunked_loss_by_default(model_init, trainer, chunked):
    # a script of the user's own (another trainer, or a model train never builds) computes its model's loss over the
    # full logits; --chunked-loss / --full-logits still decide
    from memascend_cli.planner import job_flags, zero

    defaults = zero.version_defaults((0, 19, 8))

    def plan(**flags):
        knobs = job_flags.KnobFlags()
        return job_flags.flag_job(MODEL, CPU, job_flags.JobFlags(**flags), base=knobs.base(defaults), defaults=defaults,
                                  knob_flags=knobs, deepspeed_version="0.19.8", model_init=model_init,
                                  optimizer_moments=None, trainer=trainer, note=lambda _: None)

    assert plan().chunked_loss is chunked
    assert plan(chunked_loss=True).chunked_loss and not plan(chunked_loss=False).chunked_loss
