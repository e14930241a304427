"""`memascend launch -- COMMAND`: programs that know nothing of memascend, started through `python`, DeepSpeed's
launcher and `accelerate launch`, get the engine in their rank (bytes through the region, no swap files); the closing
lines say why when it cannot engage; signals reach the whole program and nothing outlives the CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from tests.engine.test_engine_direct_nvme import make_region  # noqa: E402

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
HF_CONFIG = HERE.parent / "assets" / "hf" / "ds_zero3_nvme_auto.json"
VENV_BIN = os.path.dirname(sys.executable)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = dict(os.environ, DS_ACCELERATOR="cpu", PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""), **extra)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".torch_ext"))
    return env


def launch(tmp_path: Path, *command: str, region: str | None = None, env: dict | None = None, timeout: int = 900):
    """Run `memascend launch` to the end; (process, the records of the program's processes, each with the step lines
    it logged under "steps")."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "memascend_cli", "launch", "--run-dir", str(run_dir)]
    if region:
        args += ["--region", region]
    proc = subprocess.run([*args, "--", *command], env=env or _env(), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, check=False)
    records = []
    for p in sorted((run_dir / "status").glob("*.json")):
        if p.stem.isdigit():
            steps = p.with_name(f"{p.stem}.steps.jsonl")
            lines = steps.read_text().splitlines() if steps.exists() else []
            records.append(dict(json.loads(p.read_text()), steps=[json.loads(x) for x in lines]))
    return proc, records


def _assert_progress(proc, r: dict, losses: list[float], seq_len: int | None) -> None:
    """The rank logged every optimizer step with the loss the program computed, and the CLI showed them, the plan
    of the job DeepSpeed sized and, at the end, the rank's peak against it."""
    steps = r["steps"]
    assert [s["step"] for s in steps] == list(range(1, len(losses) + 1))
    assert [s["loss"] for s in steps] == pytest.approx(losses, rel=1e-5)
    assert all(s["seq_len"] == seq_len and s["s_per_step"] > 0 and s["rss_bytes"] > 0 for s in steps)
    if r.get("region"):
        reads = [s["read_bytes"] for s in steps]
        assert reads == sorted(reads) and reads[0] > 0
    assert f"step  rank {r['rank']}: {len(losses)}/" in proc.stderr  # the last step is always shown
    assert f"rank {r['rank']}: {len(losses)} steps, " in proc.stderr


def _engaged_rank(records: list[dict]) -> dict:
    engaged = [r for r in records if r["state"] == "engaged"]
    assert len(engaged) == 1, records
    r = engaged[0]
    assert r["rank"] == 0 and r["nvme"] and r["zero_stage"] == 3
    assert r["bytes_read"] > 0 and r["bytes_written"] > 0 and r["swap_files"] == 0
    return r


def _files(folder: Path) -> list[str]:
    return [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names]


def test_hf_trainer_script_run_with_python(tmp_path):
    """hf_trainer_job.py `plain`: a Trainer script with the HF docs' ZeRO-3 NVMe config ("auto" values) that never
    calls install(); one process, no launcher."""
    out, nvme = tmp_path / "out.json", tmp_path / "nvme"
    env = _env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    proc, records = launch(tmp_path, "python", str(HERE / "hf_trainer_job.py"), "plain", str(HF_CONFIG), "-",
                           str(nvme), str(out), region=make_region(tmp_path, "512MiB"), env=env)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "memascend_engine.install()" not in proc.stderr
    r = _engaged_rank(records)
    assert "rank 0: engine engaged, region read" in proc.stderr
    result = json.loads(out.read_text())
    assert len(result["losses"]) == 3 and result["files"] == []
    # memascend's knobs reached the config the Trainer gave DeepSpeed.
    zo = result["trainer_config"]["zero_optimization"]
    assert zo["offload_param"]["max_in_cpu"] == 0 and zo["stage3_max_reuse_distance"] == 0
    assert r["offload"] == {"offload_param": "nvme", "offload_optimizer": "nvme"}
    _assert_progress(proc, r, result["losses"], seq_len=32)
    # The plan: the job DeepSpeed sized (the model built whole, the Trainer's micro-batch, bf16), the model from the
    # config.json the rank wrote, whose parameter count is the one DeepSpeed counted.
    from memascend_cli.models import load_config_json

    job = r["job"]
    assert (job["micro_batch"], job["dtype"], job["zero_init"], job["checkpointing"]) == (2, "bf16", False, False)
    assert load_config_json(str(tmp_path / "run" / "status" / f"{r['pid']}.config.json")).num_params == \
        job["num_params"]
    assert job["zero_optimization"]["offload_param"]["max_in_cpu"] == 0
    assert "plan: " in proc.stderr and ("GiB host memory per rank with the memascend engine (6.3M params, seq 32, "
                                       "micro-batch 2, bf16, no checkpointing, 1 rank(s)") in proc.stderr
    m = re.search(r"rank 0: 3 steps, .*; peak RSS ([\d.]+) GiB, plan ([\d.]+) GiB \(([-+\d.]+)%\)", proc.stderr)
    assert m, proc.stderr[-3000:]
    assert abs(float(m.group(3))) < 40  # the plan holds the rank's peak (-11% when written)


def test_a_script_that_installs_the_engine_itself_is_left_alone(tmp_path):
    region = make_region(tmp_path, "512MiB")
    env = _env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    proc, records = launch(tmp_path, "python", str(HERE / "hf_trainer_job.py"), "before", str(HF_CONFIG), region,
                           str(tmp_path / "nvme"), str(tmp_path / "out.json"), region=region, env=env)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert [(r["state"], r.get("by_program")) for r in records] == [("engaged", True)]
    assert "rank 0: engine installed by the program itself" in proc.stderr
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["stats"]["bytes_read"] > 0
    _assert_progress(proc, records[0], result["losses"], seq_len=32)  # its steps are shown all the same


def _plain_config(tmp_path: Path, nvme: Path) -> Path:
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3,
                                    "offload_param": {"device": "nvme", "nvme_path": str(nvme), "pin_memory": True},
                                    "offload_optimizer": {"device": "nvme", "nvme_path": str(nvme),
                                                          "pin_memory": True}}}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    return tmp_path / "ds.json"


@pytest.mark.parametrize("ranks", [1, 2])
def test_deepspeed_launcher_with_a_config_path(tmp_path, ranks):
    """ds_plain_job.py through DeepSpeed's own launcher: the config reaches zero.Init and deepspeed.initialize as a
    path (`--deepspeed_config`); the engine installs at zero.Init, each rank in its own sub-region of the region, and
    the launcher processes only import DeepSpeed."""
    nvme, out = tmp_path / "nvme", tmp_path / "out.json"
    proc, records = launch(tmp_path, "deepspeed", "--num_gpus", str(ranks), "--master_port", str(_free_port()),
                           str(HERE / "ds_plain_job.py"), "--deepspeed", "--deepspeed_config",
                           str(_plain_config(tmp_path, nvme)), "--out", str(out),
                           region=make_region(tmp_path, "256MiB", ranks=ranks))
    assert proc.returncode == 0, proc.stderr[-6000:]
    engaged = [r for r in records if r["state"] == "engaged"]
    assert sorted(r["rank"] for r in engaged) == list(range(ranks))
    for r in engaged:
        assert r["nvme"] and r["bytes_read"] > 0 and r["bytes_written"] > 0 and r["swap_files"] == 0
        assert f"rank {r['rank']}: engine engaged, region read" in proc.stderr
    assert {r["state"] for r in records if r["rank"] is None} == {"imported"}  # runner.py and launch.py
    losses = json.loads(out.read_text())["losses"]
    assert len(losses) == 3
    assert _files(nvme) == []
    for r in engaged:  # rank 0's losses are the ones ds_plain_job.py writes; every rank logs its steps
        assert r["job"]["zero_init"] and r["job"]["world_size"] == ranks and len(r["steps"]) == 3
    # Float inputs show no sequence length, and none is guessed.
    _assert_progress(proc, min(engaged, key=lambda r: r["rank"]), losses, seq_len=None)
    # A torch.nn.Sequential has no Hugging Face config: said, not guessed.
    assert "plan: not estimated: the model (0.5M parameters) has no Hugging Face config; give --model" in proc.stderr


def test_without_a_region_the_engine_uses_deepspeeds_swap_files(tmp_path):
    nvme = tmp_path / "nvme"
    proc, records = launch(tmp_path, "deepspeed", "--num_gpus", "1", "--master_port", str(_free_port()),
                           str(HERE / "ds_plain_job.py"), "--deepspeed", "--deepspeed_config",
                           str(_plain_config(tmp_path, nvme)), "--out", str(tmp_path / "out.json"))
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "note: no --region: the engine runs without Direct NVMe" in proc.stderr
    r, = [r for r in records if r["state"] == "engaged"]
    assert r["region"] is None and r["swap_files"] > 0 and len(_files(nvme)) == r["swap_files"]
    assert f"rank 0: engine engaged without a region (no Direct NVMe): {r['swap_files']} DeepSpeed swap files" \
        in proc.stderr


def test_accelerate_launch_with_deepspeed(tmp_path):
    pytest.importorskip("accelerate")
    out, nvme = tmp_path / "out.json", tmp_path / "nvme"
    proc, records = launch(tmp_path, "accelerate", "launch", "--use_deepspeed", "--num_processes", "1",
                           "--num_machines", "1", "--mixed_precision", "bf16", "--dynamo_backend", "no",
                           "--deepspeed_config_file", str(HF_CONFIG), "--main_process_port", str(_free_port()),
                           str(HERE / "hf_trainer_job.py"), "plain", str(HF_CONFIG), "-", str(nvme), str(out),
                           region=make_region(tmp_path, "512MiB"))
    assert proc.returncode == 0, proc.stderr[-6000:]
    r = _engaged_rank(records)
    result = json.loads(out.read_text())
    assert result["files"] == []
    _assert_progress(proc, r, result["losses"], seq_len=32)
    assert "seq 32, micro-batch 2, bf16, no checkpointing, 1 rank(s)" in proc.stderr


def test_no_initialize_and_no_nvme_are_said(tmp_path):
    proc, _ = launch(tmp_path / "a", "python", "-c", "import deepspeed")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("the engine never engaged: the program imported DeepSpeed but never called deepspeed.zero.Init or "
            "deepspeed.initialize") in proc.stderr
    zero2 = ("import torch, deepspeed\n"
             "m = torch.nn.Linear(64, 64)\n"
             "cfg = {'train_batch_size': 2, 'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3}},\n"
             "       'zero_optimization': {'stage': 2, 'offload_optimizer': {'device': 'cpu'}}}\n"
             "deepspeed.initialize(model=m, model_parameters=m.parameters(), config=cfg)\n")
    env = _env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    proc, records = launch(tmp_path / "b", "python", "-c", zero2, region=make_region(tmp_path, "64MiB"), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0: engine installed, but its DeepSpeed config offloads nothing to NVMe (ZeRO stage 2" in proc.stderr
    assert [r["state"] for r in records] == ["engaged"]


# A program that fails in deepspeed.zero.Init: `call`, DeepSpeed's own check of its config there (train_batch_size is
# not micro-batch x accumulation x ranks); `block`, building the model in its `with` block.
FAILS_IN_ZERO_INIT = """
import sys, deepspeed, torch
cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
       "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": sys.argv[2]},
                             "offload_optimizer": {"device": "nvme", "nvme_path": sys.argv[2]}}}
if sys.argv[1] == "call":
    cfg["train_batch_size"] = 3
with deepspeed.zero.Init(config_dict_or_path=cfg):
    model = torch.nn.Linear(256, 256)
    if sys.argv[1] == "block":
        raise RuntimeError("building the model failed")
deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
"""


@pytest.mark.parametrize("where, error", [
    ("call", "AssertionError: Check batch related parameters. train_batch_size is not equal to"),
    ("block", "RuntimeError: building the model failed")])
def test_a_program_that_fails_in_zero_init_is_a_failure_never_engaged(tmp_path, where, error):
    env = _env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    proc, records = launch(tmp_path, "python", "-c", FAILS_IN_ZERO_INIT, where, str(tmp_path / "nvme"),
                           region=make_region(tmp_path, "64MiB"), env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert [(r["state"], r["during"]) for r in records] == [("failed", "deepspeed.zero.Init")]
    assert "engaged" not in proc.stderr
    assert f"rank 0: the program failed in deepspeed.zero.Init before the engine was in use: {error}" in proc.stderr
    assert "the program exited with status 1" in proc.stderr


# A program that starts a grandchild (not Python) in its process group and says when both run.
PROGRAM = """
import os, signal, subprocess, sys, time
out = sys.argv[1]
child = subprocess.Popen(["sleep", "300"])
def on_term(signum, frame):
    open(os.path.join(out, "term"), "w").write(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(out, "pids"), "w").write(f"{os.getpid()} {child.pid}")
time.sleep(300)
"""


def _start_program(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    cli = subprocess.Popen([sys.executable, "-m", "memascend_cli", "launch", "--", "python", "-c", PROGRAM,
                            str(tmp_path)], env=_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "pids").exists():
        assert time.monotonic() < deadline and cli.poll() is None, cli.stderr.read() if cli.poll() is not None else ""
        time.sleep(0.1)
    return cli, [int(p) for p in (tmp_path / "pids").read_text().split()]


def _gone(pids: list[int], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except OSError:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


def test_sigterm_reaches_the_whole_program_and_exits_75(tmp_path):
    cli, pids = _start_program(tmp_path)
    cli.send_signal(signal.SIGTERM)
    _, err = cli.communicate(timeout=120)
    assert cli.returncode == 75, err
    assert (tmp_path / "term").read_text() == str(int(signal.SIGTERM))
    assert "stopping (SIGTERM): SIGTERM sent to the program's processes" in err
    assert _gone(pids)


def test_nothing_outlives_a_killed_cli(tmp_path):
    cli, pids = _start_program(tmp_path)
    cli.kill()
    cli.wait()
    assert _gone(pids), "the program's processes outlived the CLI"


@pytest.mark.skipif(shutil.which("llamafactory-cli") is None, reason="LLaMA-Factory is not installed (not a memascend "
                    "dependency; its pins want their own venv, see docs/engine.md 'Any program, unmodified')")
def test_llamafactory_cli_train_recipe(tmp_path):
    """`llamafactory-cli train RECIPE` with LLaMA-Factory's own ZeRO-3 CPU-offload config ("auto" values): the engine
    installs in the rank torchrun starts and moves the offload to the region (--placement region: the tiny model's
    CPU offload would fit in DRAM, where auto keeps it). The recipe is tests/assets/llamafactory's
    with its `deepspeed:` line back, 3 steps, no eval, and `use_cpu` (this CPU machine)."""
    from tests.integration.test_llamafactory_cpu import ASSETS, tiny_model_dir

    work = tmp_path / "lf"
    shutil.copytree(ASSETS, work)
    shutil.copy(HERE.parent / "assets" / "hf" / "llamafactory_ds_z3_offload_config.json", work / "ds_z3.json")
    text = (work / "tiny_full_sft.yaml").read_text()
    for old, new in (("MODEL_DIR", tiny_model_dir(str(tmp_path / "tiny-instruct"))), ("OUTPUT_DIR", "saves/sft"),
                     ("trust_remote_code: true", "trust_remote_code: true\ndeepspeed: ds_z3.json"),
                     ("num_train_epochs: 1.0", "max_steps: 3"), ("bf16: true", "bf16: true\nuse_cpu: true"),
                     ("preprocessing_num_workers: 16", "preprocessing_num_workers: 1"),
                     ("dataloader_num_workers: 4", "dataloader_num_workers: 0"),
                     ("val_size: 0.1", "val_size: 0.0"), ("eval_strategy: steps", "eval_strategy: 'no'")):
        assert old in text
        text = text.replace(old, new)
    (work / "recipe.yaml").write_text(text)
    run_dir = tmp_path / "run"
    env = _env(FORCE_TORCHRUN="1", NPROC_PER_NODE="1", DISABLE_VERSION_CHECK="1")
    # Its own venv first: LLaMA-Factory starts `torchrun` from PATH, which must be the Python that has llamafactory.
    env["PATH"] = os.path.dirname(shutil.which("llamafactory-cli")) + os.pathsep + env["PATH"]
    proc = subprocess.run([sys.executable, "-m", "memascend_cli", "launch", "--run-dir", str(run_dir), "--region",
                           make_region(tmp_path, "512MiB"), "--placement", "region", "--", "llamafactory-cli", "train", "recipe.yaml"],
                          env=env, cwd=work, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "offload moved to memascend's region (asked: placement 'region')" in proc.stderr
    _engaged_rank([json.loads(p.read_text()) for p in (run_dir / "status").glob("*.json")])
    assert (work / "saves" / "sft" / "model.safetensors").exists()
