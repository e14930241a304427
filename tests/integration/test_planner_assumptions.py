"""The planner's CPU assumptions about code it does not own, measured on the installed torch / DeepSpeed.

Each test runs the real thing in a fresh interpreter (its own ru_maxrss), so an upgrade that changes the behaviour
fails here rather than silently moving the plan.
"""

import json
import os
import subprocess
import sys

import pytest

from memascend_cli.planner import memory

pytest.importorskip("torch")


def _run(code: str) -> dict:
    # A clean environment: what earlier tests left in os.environ (ranks, ports, allocator settings) stays out.
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TORCH_EXTENSIONS_DIR") if k in os.environ}
    env["DS_ACCELERATOR"] = "cpu"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


GLOO_REDUCE_SCATTER = r"""
import json, os, socket, threading, time
import torch, torch.distributed as dist
def anon():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("RssAnon"))
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
numel = 50_000_000
flat = torch.ones(numel)                 # reduce_scatter_coalesced's torch.cat result
out = torch.chunk(flat, 1)[0]            # ... and its output: a view of the input (coalesced_collectives.py)
before, peak, done = anon(), [0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], anon())
        time.sleep(0.0005)
t = threading.Thread(target=sample); t.start()
dist.reduce_scatter_tensor(out, flat)
done.set(); t.join()
print(json.dumps({"input_bytes": numel * 4, "extra_bytes": peak[0] - before}))
"""


def test_gloo_reduce_scatter_copies_its_input_once():
    """The CPU flush item counts two copies of the bucket: torch.cat's and this one."""
    r = _run(GLOO_REDUCE_SCATTER)
    assert 0.8 * r["input_bytes"] <= r["extra_bytes"] <= 1.3 * r["input_bytes"], r


LAUNCHER = r"""
import json, importlib
importlib.import_module(MODULE)
anon = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("RssAnon"))
print(json.dumps({"anon_bytes": anon}))
"""


@pytest.mark.parametrize("module", ["deepspeed.launcher.launch", "deepspeed.launcher.runner", "torch.distributed.run"])
def test_launcher_process_footprint_matches_the_constant(module):
    pytest.importorskip("deepspeed")
    r = _run(LAUNCHER.replace("MODULE", repr(module)))
    assert 0.7 * memory.LAUNCHER_PROCESS_BYTES <= r["anon_bytes"] <= 1.3 * memory.LAUNCHER_PROCESS_BYTES, r


TRAINER_IMPORTS = r"""
import json, sys
def rss():  # anonymous and file-backed: a script's ru_maxrss counts the libraries' mapped pages too
    return sum(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(("RssAnon", "RssFile")))
import deepspeed, torch
from transformers import AutoConfig, LlamaForCausalLM
before = rss()
from transformers import Trainer, TrainerCallback, TrainingArguments
if TRAINER == "trl":
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer
print(json.dumps({"extra_bytes": rss() - before}))
"""


@pytest.mark.parametrize("trainer", ["hf", "trl"])
def test_trainer_imports_match_the_constant(trainer):
    """host/trainer_imports: what the Hugging Face trainers' imports add to a DeepSpeed script's."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    if trainer == "trl":
        pytest.importorskip("trl")
    from memascend_cli.planner.host import TRAINER_IMPORT_BYTES

    r = _run(TRAINER_IMPORTS.replace("TRAINER", repr(trainer)))
    expected = TRAINER_IMPORT_BYTES[trainer]
    assert 0.7 * expected <= r["extra_bytes"] <= 1.3 * expected, r
