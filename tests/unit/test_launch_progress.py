"""`memascend launch`'s progress and plan (memascend_cli/run/launch_progress.py) from the files a rank leaves in the
status folder: step lines, the plan of the job DeepSpeed sized (with what it cannot know said, not guessed), the
closing lines. No DeepSpeed, no torch."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from memascend_cli.models import load_model
from memascend_cli.planner import zero
from memascend_cli.planner.job import JobSpec
from memascend_cli.planner.memory import estimate
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.run import anyprogram, launch_progress as lp

GiB = 1 << 30
HW = HardwareSpec(name="test", dram_gib=64.0, cpu_cores=2)
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1024}


def _job(**kw) -> dict:
    zo = zero.zero_section(zero.memascend_knobs(zero.DEEPSPEED_DEFAULTS), "/nvme")
    return {"num_params": 1_000_000, "micro_batch": 2, "grad_accum": 1, "dtype": "bf16", "world_size": 1,
            "ranks_per_node": 1, "zero_init": False, "checkpointing": False, "total_steps": 10,
            "zero_optimization": zo, "aio": zero.aio_section(zero.DEEPSPEED_DEFAULTS), "deepspeed_version": "0.19.8",
            "model_config": True, **kw}


def _step(step, loss=2.0, s=1.5, read=0, written=0, seq=64):
    return {"step": step, "loss": loss, "s_per_step": s, "seq_len": seq, "read_bytes": read, "written_bytes": written,
            "rss_bytes": GiB, "skipped_steps": 0}


def test_new_lines_wait_for_a_complete_line(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": ')
    lines, offset = lp.read_new_lines(str(path), 0)
    assert lines == [{"step": 1}] and offset == len(json.dumps({"step": 1})) + 1
    with open(path, "a") as f:
        f.write('2}\n')
    assert lp.read_new_lines(str(path), offset) == ([{"step": 2}], path.stat().st_size)
    assert lp.read_new_lines(str(tmp_path / "missing"), 5) == ([], 5)


def test_step_line_and_summary():
    prev, rec = _step(1, read=0, written=0), _step(2, loss=1.23456, s=2.0, read=4_000_000_000, written=2_000_000_000)
    assert lp.format_step(rec, 10, prev) == "2/10  loss 1.2346  2.00 s/step  seq 64  host 1.00 GiB  SSD 2.00/1.00 GB/s"
    assert lp.format_step(dict(rec, loss=None, seq_len=None, read_bytes=None), None, None) == \
        "2/?  2.00 s/step  host 1.00 GiB"
    # The first step carries DeepSpeed's warm-up: the median is over the others.
    steps = [_step(1, s=30.0), _step(2, s=2.0), _step(3, s=3.0, loss=0.5), _step(4, s=2.5)]
    assert lp.step_summary(steps) == "4 steps, 2.50 s/step, last loss 2.0000"
    assert lp.step_summary(steps[:1]) == "1 step, 30.00 s/step, last loss 2.0000"


def test_job_spec_is_the_job_deepspeed_sized():
    spec = load_model("tiny-llama")
    job = lp.job_spec(_job(checkpointing=True, zero_init=True, grad_accum=4), spec, 512)
    assert (job.seq_len, job.micro_batch, job.grad_accum_steps, job.dtype) == (512, 2, 4, "bf16")
    assert job.checkpointing == "full" and job.zero_init and job.launcher_processes == 0
    assert job.knobs == zero.from_ds_config({"zero_optimization": _job()["zero_optimization"], "aio": _job()["aio"]})
    assert not job.param_buffer_size_auto  # the buffer size DeepSpeed ran with, not one the plan picks
    # The planner's own number for that job, nothing else.
    expected = estimate(JobSpec(model=spec, seq_len=512, micro_batch=2, grad_accum_steps=4, dtype="bf16",
                                ranks_per_node=1, checkpointing="full", knobs=job.knobs, param_buffer_size_auto=False,
                                zero_init=True, launcher_processes=0), HW, "memascend").host_peak_bytes
    assert lp.estimate_peak(_job(checkpointing=True, zero_init=True, grad_accum=4), spec, 512, HW) == expected


def test_unknown_sequence_length_or_model_is_said_not_guessed(tmp_path):
    with pytest.raises(lp.NotPlanned, match="sequence length is unknown"):
        lp.job_spec(_job(), load_model("tiny-llama"), None)
    with pytest.raises(lp.NotPlanned, match=r"model \(1.0M parameters\) has no Hugging Face config; give --model"):
        lp.model_for(_job(), config_path=str(tmp_path / "none.json"), model=None)
    bad = tmp_path / "gpt2.json"
    bad.write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(lp.NotPlanned, match="model_type 'gpt2' is not supported.*give --model"):
        lp.model_for(_job(), config_path=str(bad), model=None)
    assert lp.model_for(_job(), config_path=str(bad), model="tiny-llama").num_params == \
        load_model("tiny-llama").num_params


def _status(tmp_path, steps, job=None, **record):
    status = tmp_path / "status"
    status.mkdir(exist_ok=True)
    rec = {"pid": 7, "rank": 0, "state": "engaged", "region": "/r", "nvme": True, **record}
    if job is not None:
        rec["job"] = job
        anyprogram.write_model_config(str(status), 7, TINY)
    anyprogram.write_record(str(status), rec)
    anyprogram.write_record(str(status), {"pid": 3, "rank": None, "state": "imported"})  # a launcher
    with open(anyprogram.steps_path(str(status), 7), "a") as f:
        for s in steps:
            f.write(json.dumps(s) + "\n")
    return status


def test_progress_prints_the_plan_once_then_steps_at_most_every_interval(tmp_path):
    status = _status(tmp_path, [_step(1)], job=_job())
    said, now = [], [100.0]
    p = lp.Progress(str(status), model=None, say=lambda level, text: said.append((level, text)), hardware=HW,
                    clock=lambda: now[0])
    p.poll()
    assert [lvl for lvl, _ in said] == ["plan", "step"]
    assert said[0][1].startswith("plan: ") and "host memory per rank with the memascend engine" in said[0][1]
    assert "seq 64, micro-batch 2, bf16, no checkpointing, 1 rank(s)" in said[0][1]
    assert said[1][1].startswith("rank 0: 1/10  loss 2.0000")
    with open(anyprogram.steps_path(str(status), 7), "a") as f:
        f.write(json.dumps(_step(2)) + "\n")
    now[0] += lp.PRINT_INTERVAL_S / 2
    p.poll()
    assert len(said) == 2  # too soon after the last line
    p.poll(final=True)
    assert said[-1][1].startswith("rank 0: 2/10") and len(said) == 3
    p.poll(final=True)
    assert len(said) == 3  # the same step is not shown twice
    # The planned number is the planner's, with the model from the config.json the rank wrote.
    spec = load_model(str(status / "7.config.json"))
    assert p.planned_bytes == lp.estimate_peak(_job(), spec, 64, HW)
    assert f"{p.planned_bytes / GiB:.2f} GiB host memory" in said[0][1]


def test_closing_line_compares_the_peak_with_the_plan(tmp_path):
    status = _status(tmp_path, [_step(1, s=9.0), _step(2), _step(3, loss=1.0)], job=_job(), vm_hwm_bytes=2 * GiB)
    p = lp.Progress(str(status), model=None, say=lambda *a: None, hardware=HW)
    p.poll(final=True)
    p.planned_bytes = 3 * GiB
    assert p.closing() == [("ok", "rank 0: 3 steps, 1.50 s/step, last loss 1.0000; peak RSS 2.00 GiB, plan 3.00 GiB "
                                  "(+50.0%)")]


def test_a_rank_whose_watch_failed_says_why_at_the_end(tmp_path):
    status = _status(tmp_path, [], progress_error="AttributeError: no module")
    p = lp.Progress(str(status), model=None, say=lambda *a: None, hardware=HW)
    p.poll(final=True)
    assert p.closing() == [("warn", "rank 0: no step lines: AttributeError: no module")]


def test_progress_without_a_sequence_length_says_so(tmp_path):
    status = _status(tmp_path, [_step(1, seq=None)], job=_job())
    said = []
    lp.Progress(str(status), model=None, say=lambda level, text: said.append((level, text)), hardware=HW).poll()
    assert said[0] == ("warn", "plan: not estimated: the sequence length is unknown (the engine's forward saw no "
                               "batch with a sequence dimension yet)")


def test_progress_before_initialize_shows_nothing(tmp_path):
    status = _status(tmp_path, [])
    said = []
    p = lp.Progress(str(status), model=None, say=lambda *a: said.append(a), hardware=HW)
    p.poll(final=True)
    assert said == [] and p.closing() == []


def test_model_config_is_not_read_as_a_record(tmp_path):
    status = _status(tmp_path, [_step(1)], job=_job())
    assert sorted(r["pid"] for r in anyprogram.read_records(str(status))) == [3, 7]


def test_a_multi_node_job_plans_its_world(tmp_path):
    spec = load_model("tiny-llama")
    one = lp.estimate_peak(_job(), spec, 64, HW)
    assert lp.estimate_peak(_job(world_size=4, ranks_per_node=2), spec, 64, replace(HW, num_gpus=0)) != one


def test_a_record_the_cli_cannot_follow_stops_the_lines_not_the_command(tmp_path):
    status = _status(tmp_path, [{"step": 1, "s_per_step": "fast"}], job=_job())
    said = []
    p = lp.Progress(str(status), model=None, say=lambda level, text: said.append((level, text)), hardware=HW)
    p.tick()
    p.tick(final=True)
    assert said[-1][0] == "warn" and said[-1][1].startswith("progress lines stopped: ")
    assert [lvl for lvl, t in said if t.startswith("progress lines stopped")] == ["warn"]  # said once
