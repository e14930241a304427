"""The job `plan` builds from its flags (planner/job_flags.py): the shared defaults, the knob flags and their
warnings, and a recipe's job with the flags on top. Pure: no machine, no files."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memascend_cli.defaults import DEFAULT_MICRO_BATCH, DEFAULT_PRECISION, DEFAULT_SEQ_LEN
from memascend_cli.errors import BadInput
from memascend_cli.models import load_model
from memascend_cli.planner import job_flags, zero
from memascend_cli.planner.spec import HardwareSpec

HW = HardwareSpec(name="t", dram_gib=64.0, num_gpus=0, gpu_mem_gib=0.0, cpu_cores=8)
SPEC = load_model("tiny-llama")
DEFAULTS = zero.version_defaults((0, 19, 8))


def _job(flags=job_flags.JobFlags(), knobs=job_flags.KnobFlags(), notes=None):
    return job_flags.flag_job(SPEC, HW, flags, base=knobs.base(DEFAULTS), defaults=DEFAULTS, knob_flags=knobs,
                              deepspeed_version="0.19.8", model_init="zero", optimizer_moments=None, trainer="deepspeed",
                              note=(notes.append if notes is not None else print))


def test_a_job_without_flags_takes_the_shared_defaults_and_stock_knobs():
    job = _job()
    assert (job.seq_len, job.micro_batch, job.dtype) == (DEFAULT_SEQ_LEN, DEFAULT_MICRO_BATCH, DEFAULT_PRECISION)
    assert job.checkpointing == "offload" and job.chunked_loss and job.param_buffer_size_auto
    assert job.knobs == zero.resolve("stock", model=SPEC, world_size=1, elem_bytes=2, base=DEFAULTS)


def test_liger_replaces_the_chunked_loss():
    job = _job(job_flags.JobFlags(liger=True, chunked_loss=True))
    assert job.fused_cross_entropy and not job.chunked_loss


def test_knob_flags_set_the_base_and_an_explicit_buffer_size_is_kept():
    knobs = job_flags.KnobFlags(sub_group_size="1e8", pipeline=True, param_buffer_size="1e3")
    notes: list[str] = []
    job = _job(knobs=knobs, notes=notes)
    assert job.knobs.sub_group_size == 100_000_000 and job.knobs.pipeline_read and job.knobs.pipeline_write
    assert job.knobs.param_buffer_size == 1000 and not job.param_buffer_size_auto
    # memascend caps a sub-group this large: the plan says so
    assert any("sub_group_size" in n for n in notes)
    assert knobs.given() == ["--sub-group-size", "--param-buffer-size", "--pipeline"]
    assert "train` takes no knob flags" in knobs.recipe_note()
    assert job_flags.KnobFlags().given() == [] and job_flags.KnobFlags().recipe_note() is None


def test_a_bad_dtype_stops_before_any_warning():
    notes: list[str] = []
    with pytest.raises(BadInput, match="unknown dtype 'fp8'"):
        _job(job_flags.JobFlags(dtype="fp8"), job_flags.KnobFlags(sub_group_size="1e9"), notes)
    assert notes == []


def test_a_recipe_job_gets_the_flags_and_a_stock_twin():
    memascend = zero.resolve("memascend", model=SPEC, world_size=1, elem_bytes=2, base=DEFAULTS)
    recipe_job = replace(_job(), knobs=memascend)
    knobs = job_flags.KnobFlags(param_buffer_size="5e6")
    job, stock = job_flags.recipe_jobs(recipe_job, SPEC, HW, engine="memascend", base=knobs.base(DEFAULTS),
                                       defaults=DEFAULTS, knob_flags=knobs, optimizer_moments="bf16", note=print)
    assert job.optimizer_moments == stock.optimizer_moments == "bf16"
    assert job.knobs == replace(memascend, param_buffer_size=5_000_000)
    assert stock.knobs.param_buffer_size == 5_000_000 and stock.knobs != job.knobs
    assert job_flags.recipe_jobs(recipe_job, SPEC, HW, engine="stock", base=DEFAULTS, defaults=DEFAULTS,
                                 knob_flags=job_flags.KnobFlags(), optimizer_moments=None, note=print)[1] is None


def test_a_recipe_is_planned_under_zero_init_unless_model_init_says_how_another_script_builds_it():
    kw = dict(engine="memascend", base=DEFAULTS, defaults=DEFAULTS, knob_flags=job_flags.KnobFlags(),
              optimizer_moments=None, note=print)
    assert job_flags.recipe_jobs(_job(), SPEC, HW, **kw)[0].model_init == "zero"
    job, stock = job_flags.recipe_jobs(_job(), SPEC, HW, model_init="eager", **kw)
    assert (job.model_init, job.zero_init) == (stock.model_init, stock.zero_init) == ("eager", False)
    again = job_flags.recipe_jobs(job, SPEC, HW, model_init="zero", **kw)[0]
    assert (again.model_init, again.zero_init) == ("zero", True)
