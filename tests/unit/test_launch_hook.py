"""`memascend launch`'s pure parts (memascend_cli/run/anyprogram.py) and its start-up hook
(engine/launch_hook/sitecustomize.py) in plain Python processes: no DeepSpeed, no torch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memascend_cli.run import anyprogram, lifeline

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"


def _env(tmp_path: Path, **extra) -> dict:
    status = tmp_path / "status"
    status.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", anyprogram.ENV)}
    env = anyprogram.build_env(base, hook=anyprogram.hook_dir(), status_dir=str(status), region=None, model=None,
                               lifeline_token=lifeline.token())
    env.update(extra)
    return env


def test_build_env_puts_the_hook_first_once_and_keeps_the_rest():
    base = {"PYTHONPATH": "/a:/hook::/b", "HOME": "/h"}
    env = anyprogram.build_env(base, hook="/hook", status_dir="/run/status", region="/r", model="tiny",
                               lifeline_token="b:1:2:3")
    assert env["PYTHONPATH"] == "/hook:/a:/b"
    assert env["HOME"] == "/h" and base["PYTHONPATH"] == "/a:/hook::/b"
    assert anyprogram.parse_env(env) == {"region": "/r", "model": "tiny", "placement": "auto",
                                         "status_dir": "/run/status"}
    assert env[lifeline.ENV] == "b:1:2:3"
    assert env["THP_MEM_ALLOC_ENABLE"] == "1"  # defaults.ENGINE_ENV, as train's engine ranks get it
    assert anyprogram.build_env({"THP_MEM_ALLOC_ENABLE": "0"}, hook="/h", status_dir="/s", region=None, model=None,
                                lifeline_token="t")["THP_MEM_ALLOC_ENABLE"] == "0"
    assert anyprogram.build_env({}, hook="/hook", status_dir="/s", region=None, model=None,
                                lifeline_token="t")["PYTHONPATH"] == "/hook"


def test_parse_env_outside_a_launch():
    assert anyprogram.parse_env({}) is None
    assert anyprogram.parse_env({anyprogram.ENV: "not json"}) is None
    assert anyprogram.parse_env({anyprogram.ENV: json.dumps({"region": None})}) is None


def test_hook_folder_holds_only_the_hook():
    assert set(os.listdir(anyprogram.hook_dir())) - {"__pycache__"} == {"sitecustomize.py"}


def test_records_round_trip_rank_order(tmp_path):
    for rec in ({"pid": 30, "rank": 1, "state": "imported"}, {"pid": 10, "rank": None, "state": "imported"},
                {"pid": 20, "rank": 0, "state": "imported"}):
        anyprogram.write_record(str(tmp_path), rec)
    (tmp_path / "broken.json").write_text("{")
    assert [r["pid"] for r in anyprogram.read_records(str(tmp_path))] == [20, 30, 10]
    assert anyprogram.read_records(str(tmp_path / "missing")) == []


def _engaged(rank, **kw):
    return {"pid": 100 + rank, "rank": rank, "state": "engaged", "region": "/r", "nvme": True, "zero_stage": 3,
            "offload": {"offload_param": "nvme"}, "bytes_read": 3 << 20, "bytes_written": 5 << 20, "swap_files": 0,
            **kw}


def test_summary_of_engaged_ranks_ignores_launcher_processes():
    lines = anyprogram.summarize([_engaged(0), _engaged(1), {"pid": 7, "rank": None, "state": "imported"}])
    assert lines == [("ok", "rank 0: engine engaged, region read 3.00 MiB, written 5.00 MiB, 0 swap files"),
                     ("ok", "rank 1: engine engaged, region read 3.00 MiB, written 5.00 MiB, 0 swap files")]


def test_summary_says_when_nothing_reaches_the_ssd():
    (level, text), = anyprogram.summarize([_engaged(0, nvme=False, zero_stage=2, offload={})])
    assert level == "warn" and "offloads nothing to NVMe (ZeRO stage 2" in text
    (level, text), = anyprogram.summarize([_engaged(0, bytes_read=0, bytes_written=0)])
    assert level == "warn" and "nothing was read or written in the region" in text
    engaged = _engaged(0)
    del engaged["bytes_read"]
    (level, text), = anyprogram.summarize([engaged])
    assert level == "warn" and "did not exit normally" in text


def test_summary_of_a_cpu_offload_kept_in_dram():
    kept = {"move": False, "pending": False, "kept": "DRAM", "reason": "fits: stock's offload_optimizer cpu needs ..."}
    rank = _engaged(0, nvme=False, offload={"offload_param": "cpu", "offload_optimizer": "cpu"}, placement=kept,
                    bytes_read=0, bytes_written=0)
    (level, text), = anyprogram.summarize([rank])
    assert level == "ok" and text == ("rank 0: engine engaged; offload kept in DRAM as the config writes it, "
                                      "memascend's region not used (fits: stock's offload_optimizer cpu needs ...)")
    (level, _), = anyprogram.summarize([dict(rank, placement=dict(kept, move=True))])
    assert level == "warn"  # moved, yet nothing on NVMe: the old warning stands


def test_summary_of_an_install_the_program_made_itself():
    engaged = _engaged(0, by_program=True)
    assert anyprogram.summarize([engaged])[0] == ("ok", "rank 0: engine engaged, region read 3.00 MiB, written "
                                                        "5.00 MiB, 0 swap files")
    del engaged["bytes_read"]  # it called uninstall() before exit
    (level, text), = anyprogram.summarize([engaged])
    assert level == "ok" and "installed by the program itself" in text


def test_summary_of_a_failed_install():
    lines = anyprogram.summarize([{"pid": 5, "rank": 0, "state": "failed", "error": "SSDNotReady: too small"}])
    assert lines == [("error", "rank 0: installing the engine failed: SSDNotReady: too small")]


def test_summary_of_a_program_that_failed_before_the_engine_was_in_use():
    failed = {**_engaged(0), "state": "failed", "during": "deepspeed.zero.Init", "error": "RuntimeError: boom"}
    assert anyprogram.summarize([failed, {"pid": 7, "rank": None, "state": "imported"}]) == [
        ("error", "rank 0: the program failed in deepspeed.zero.Init before the engine was in use: RuntimeError: boom")]
    (level, text), = anyprogram.summarize([{**_engaged(0), "state": "installed"}])
    assert level == "warn" and "engaged" not in text and "ended before deepspeed.initialize returned" in text


@pytest.mark.parametrize("records, why", [
    ([], "no Python process of the program imported DeepSpeed"),
    ([{"pid": 1, "rank": None, "state": "imported"}], "never called deepspeed.zero.Init or deepspeed.initialize"),
    ([{"pid": 1, "rank": None, "state": "imported"},
      {"pid": 2, "state": "no_engine", "python": "/other/venv/bin/python", "error": "ModuleNotFoundError: x"}],
     "the program's Python (/other/venv/bin/python) cannot import memascend_engine (ModuleNotFoundError: x)"),
])
def test_summary_says_why_the_engine_never_engaged(records, why):
    (level, text), = anyprogram.summarize(records)
    assert level == "warn" and text.startswith("the engine never engaged") and why in text


def test_forwarded_signals():
    assert anyprogram.forwarded_signal(signal.SIGHUP) == signal.SIGTERM
    assert anyprogram.forwarded_signal(signal.SIGINT) == signal.SIGINT
    assert anyprogram.forwarded_signal(signal.SIGTERM) == signal.SIGTERM


def test_hook_imports_nothing_heavy_and_chains_to_the_hidden_sitecustomize(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('yes')\n")
    env = _env(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(other)
    code = "import sys; print(sorted(m for m in ('torch', 'deepspeed', 'memascend_engine.runtime') if m in sys.modules))"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert p.stdout.strip() == "[]"
    assert (tmp_path / "ran").read_text() == "yes"
    assert anyprogram.read_records(str(tmp_path / "status")) == []  # no DeepSpeed: nothing to say


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason=f"needs a Python without memascend at {SYSTEM_PYTHON}")
def test_a_python_without_memascend_runs_the_program_and_says_why(tmp_path):
    env = _env(tmp_path)
    p = subprocess.run([SYSTEM_PYTHON, "-c", "print('program ran')"], env=env, capture_output=True, text=True,
                       timeout=60, check=True)
    assert p.stdout.strip() == "program ran" and p.stderr == ""
    records = anyprogram.read_records(str(tmp_path / "status"))
    assert [r["state"] for r in records] == [anyprogram.NO_ENGINE]
    (level, text), = anyprogram.summarize(records)
    assert SYSTEM_PYTHON in text and "cannot import memascend_engine (ModuleNotFoundError" in text


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memascend_cli", "launch", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def test_bad_input_is_one_line(tmp_path):
    p = _cli("--", "no-such-program-here")
    assert p.returncode == 2 and p.stderr.splitlines()[0] == "error: command 'no-such-program-here' not found"
    p = _cli("--region", str(tmp_path / "none"), "--", "true")
    assert p.returncode == 1 and "error: region" in p.stderr and "does not exist" in p.stderr
    p = _cli("--model", "no-such-model-anywhere", "--", "true")
    assert p.returncode == 2 and p.stderr.startswith("error: ")
    assert "Traceback" not in p.stderr


def test_a_region_another_job_holds_is_refused_before_the_program_starts(tmp_path):
    """Any of its rank sub-regions (the program's rank count is unknown before it starts)."""
    from tests.cli.test_region_owner import _holder, _prepare

    path = _prepare(tmp_path, ranks=2)
    holder = _holder(path, 1)
    try:
        p = _cli("--region", path, "--", "touch", str(tmp_path / "started"))
    finally:
        holder.kill()
        holder.wait()
    assert p.returncode == 1, p.stderr
    assert f"error: region {path}: rank 1's sub-region is in use by pid {holder.pid}" in p.stderr
    assert not (tmp_path / "started").exists()
