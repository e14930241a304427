"""The plan against plain user scripts: host memory of training scripts written as users write them, run without
the memascend CLI, stock DeepSpeed and then the same script and knobs with the memascend engine
(a DeepSpeed script and an HF Trainer script). Validation only: no number measured here feeds scripts/fit_planner.py.

Scripts (one CPU process each, a random-weight transformers Llama built from MODEL's config.json, random token ids):
  ds  benchmarks/ds_llama_script.py: DeepSpeed's own API, ZeRO-3 params + optimizer on NVMe, DeepSpeed's default
      knobs, zero.Init; the engine run calls `memascend_engine.install(config, region=R)` first. With and without
      activation checkpointing (transformers' gradient_checkpointing_enable()).
  hf  tests/integration/hf_trainer_job.py: the HF Trainer with the HF docs' ZeRO-3 NVMe config
      (tests/assets/hf/ds_zero3_nvme_auto.json, "auto" values); the engine run calls install() before
      TrainingArguments, the stock run never.
  accelerate  the same HF Trainer script under `accelerate launch --use_deepspeed --deepspeed_config_file CONFIG`
      (one process; the measured tree holds accelerate's launcher and the rank it starts).
  trl  tests/integration/trl_sft_job.py: TRL's SFTTrainer with the same config, a text dataset it tokenizes and
      packs into seq-length blocks itself; install() before SFTConfig in the engine run, never in the stock run.
      Checkpointed: SFTConfig turns gradient checkpointing on by default (trl/trainer/sft_config.py), the HF
      Trainer leaves it off.

Each run: sync, drop caches (root), wait until MemTotal - MemAvailable is flat, launch the script, sample it at
>= 1 kHz until it exits (memascend_cli/bench/sampling.py); peak = max(MemTotal - MemAvailable) - idle, next to the
script's ru_maxrss (os.wait4) and its own /proc/self/status. The plan's prediction is `memascend plan --model
MODEL_DIR --json` with the script's seq / micro-batch / dtype / checkpointing (and, for the HF Trainer, the knobs
it fills for "auto" and no zero.Init), taken before the run.

    python benchmarks/user_script_bench.py --out docs/raw/user-script-bench.json.gz
    python benchmarks/user_script_bench.py --out docs/bench/user-script/matrix.json.gz --update --engines memascend \
        --settle-cap-s 20 --jobs $(python -c "import user_script_bench as u; print(','.join(j.name for j in u.MATRIX))")
    python benchmarks/user_script_bench.py --out docs/raw/user-script-bench.json.gz --update \
        --jobs accelerate-nockpt,trl-ckpt --repeat 3

`--repeat N` runs stock and memascend in turn N times per job and keeps, per engine, the run with the median system
peak of the clean repeats (other processes' RSS moved by at most CLEAN_OTHERS_BYTES between idle and the peak; of all
repeats when none is clean), every repeat's peaks listed under "repeats": on a shared machine one run can meet
another job's peak.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DS_SCRIPT = os.path.join(REPO, "benchmarks", "ds_llama_script.py")
HF_SCRIPT = os.path.join(REPO, "tests", "integration", "hf_trainer_job.py")
TRL_SCRIPT = os.path.join(REPO, "tests", "integration", "trl_sft_job.py")
HF_CONFIG = os.path.join(REPO, "tests", "assets", "hf", "ds_zero3_nvme_auto.json")
GiB = 1 << 30

MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768,
         "intermediate_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 12,
         "vocab_size": 16384, "max_position_embeddings": 2048, "tie_word_embeddings": False,
         "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}
"""82M parameters: a few steps of seq 512 take seconds on two cores, and the parameter and optimizer pools are
still well apart from the runtime's own memory."""
MODELS = {"82m": MODEL,
          "156m": dict(MODEL, hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=4,
                       vocab_size=32000)}
"""The models a job can name: MODEL, and a 155.7M-parameter Llama with grouped-query attention (a user's fp32 script
built outside zero.Init was planned 15% low on it)."""

ENGINES = ("stock", "memascend")


HF_SCRIPTS = ("hf", "accelerate", "trl")
"""The jobs whose script is a Hugging Face trainer: it fills the config's "auto" values."""


@dataclass(frozen=True)
class Job:
    script: str
    """ds, hf, accelerate or trl (see the module docstring)."""
    checkpointing: bool
    seq_len: int = 512
    micro_batch: int = 2
    steps: int = 3
    dtype: str = "bf16"
    zero_init: bool | None = None
    """The script builds the model under deepspeed.zero.Init (the HF scripts: AutoModelForCausalLM.from_config after
    TrainingArguments), else whole, in fp32, before initialize (LlamaForCausalLM(config)); None: as its docs write
    it, under zero.Init in the ds script, whole in the HF ones (the name says the other build)."""
    model: str = "82m"
    """A key of MODELS."""
    from_pretrained: bool = False
    """The ds script loads the model whole with from_pretrained from a model folder with weights in the job's dtype
    (save_pretrained; zero_init False)."""

    def __post_init__(self):
        if self.zero_init is None:
            object.__setattr__(self, "zero_init", self.script not in HF_SCRIPTS and not self.from_pretrained)

    @property
    def model_init(self) -> str:
        """How `memascend plan --model-init` names the build."""
        return "from-pretrained" if self.from_pretrained else "zero" if self.zero_init else "eager"

    @property
    def name(self) -> str:
        default = "eager" if self.script in HF_SCRIPTS else "zero"
        build = [] if self.model_init == default else ["pretrained" if self.from_pretrained else self.model_init]
        extra = ([self.dtype] if self.dtype != "bf16" else []) + build + ([self.model] if self.model != "82m" else [])
        return "-".join([self.script, "ckpt" if self.checkpointing else "nockpt", *extra])


MATRIX = tuple(Job(script, ckpt, dtype=dtype, zero_init=zero_init) for script in ("ds", "hf", "accelerate")
               for dtype in ("bf16", "fp32") for zero_init in (True, False) for ckpt in (False, True))
"""The validation's combinations: each script in fp32 and bf16, built under zero.Init and outside it, with and without
activation checkpointing, 3 steps of the 82M model (validation)."""
JOBS = (*MATRIX, Job("trl", True),
        Job("ds", False, steps=6, dtype="fp32", zero_init=False, model="156m"),
        *(Job("ds", False, dtype=dtype, from_pretrained=True) for dtype in ("bf16", "fp32")))


def script_command(job: Job, engine: str, *, model_dir: str, region: str, nvme_path: str, out: str,
                   python: str = sys.executable, config: str = HF_CONFIG, port: int = 29500) -> list[str]:
    """The user's script for one run; `engine` stock never installs the engine. `config` is the DeepSpeed config of
    the Hugging Face scripts (accelerate reads it too: a copy whose nvme_path is `nvme_path`), `port` accelerate's
    main process port. Pure."""
    if job.script == "ds":
        cmd = [python, DS_SCRIPT, "--model-dir", model_dir, "--nvme-path", nvme_path, "--out", out,
               "--seq-len", str(job.seq_len), "--micro-batch", str(job.micro_batch), "--steps", str(job.steps)]
        cmd += ["--checkpointing"] if job.checkpointing else []
        cmd += ["--dtype", job.dtype] + ([] if job.zero_init else ["--no-zero-init"])
        cmd += ["--from-pretrained"] if job.from_pretrained else []
        return cmd + (["--region", region] if engine == "memascend" else [])
    if job.script not in HF_SCRIPTS:
        raise ValueError(f"unknown script {job.script!r}")
    if job.micro_batch != 2 or job.from_pretrained or (job.script == "trl" and (
            not job.checkpointing or job.dtype != "bf16" or job.zero_init)):
        raise ValueError("the Hugging Face trainer scripts run micro-batch 2 from a config; TRL's SFTTrainer bf16, "
                         "with its default checkpointing, the model built whole")
    script = TRL_SCRIPT if job.script == "trl" else HF_SCRIPT
    cmd = [python, script, "before" if engine == "memascend" else "plain", config, region, nvme_path, out,
           model_dir, str(job.seq_len), str(job.steps)]
    if job.script == "trl":
        return cmd
    cmd += [job.dtype, "ckpt" if job.checkpointing else "nockpt", "zero" if job.zero_init else "eager"]
    if job.script != "accelerate":
        return cmd
    # accelerate's own executable, beside this Python (the venv's bin); it runs the script with the same Python.
    launcher = os.path.join(os.path.dirname(python), "accelerate")
    return [launcher, "launch", "--use_deepspeed", "--num_processes", "1", "--num_machines", "1",
            "--mixed_precision", "bf16" if job.dtype == "bf16" else "no", "--dynamo_backend", "no",
            "--deepspeed_config_file", config, "--main_process_port", str(port), *cmd[1:]]


def hf_auto_knobs(hidden_size: int) -> list[str]:
    """The plan flags for what the HF Trainer writes over "auto" (transformers integrations/deepspeed.py,
    trainer_config_finalize: reduce_bucket_size = hidden^2). Pure."""
    return ["--reduce-bucket-size", str(hidden_size * hidden_size)]


def plan_command(job: Job, *, model_dir: str, python: str = sys.executable) -> list[str]:
    """`memascend plan --json` for the same job as the script: its build (--model-init) and its model's own loss over
    the full logits (memascend train's chunked loss is not in a user's script). Pure."""
    cmd = [python, "-m", "memascend_cli", "plan", "--model", model_dir, "--seq-len", str(job.seq_len),
           "--micro-batch", str(job.micro_batch), "--dtype", job.dtype,
           "--checkpointing", "full" if job.checkpointing else "none", "--no-search", "--json", "--full-logits",
           "--model-init", job.model_init]
    if job.script not in HF_SCRIPTS:
        return cmd
    return cmd + hf_auto_knobs(MODELS[job.model]["hidden_size"]) + ["--trainer", "trl" if job.script == "trl" else "hf"]


def prediction(plan: dict, engine: str) -> dict:
    """The plan's numbers for one engine: the rank's peak, the phase and the host items (key -> bytes). A user's
    `python script.py` is one process, without the launchers the plan's node peak adds (host/launcher, `memascend
    train`'s runner): the rank's host_peak_bytes is the prediction. Pure."""
    e = plan["engines"][engine]
    return {"host_peak_bytes": e["host_peak_bytes"], "node_host_peak_bytes": e["node_host_peak_bytes"],
            "peak_phase": e["peak_phase"],
            "nvme_bytes": e["nvme_bytes"],
            "items": {i["key"]: i["bytes"] for i in e["items"] if i["tier"] == "host"}}


def error_percent(predicted_bytes: int | None, measured_bytes: int | None) -> float | None:
    """(plan - measured) / measured in percent, one decimal; None without both. Pure."""
    if not predicted_bytes or not measured_bytes:
        return None
    return round(100.0 * (predicted_bytes - measured_bytes) / measured_bytes, 1)


def region_bytes(plan: dict) -> int:
    """Region size for the engine runs: the plan's SSD bytes for memascend with a quarter on top, whole GiB. Pure."""
    return max(1, math.ceil(plan["engines"]["memascend"]["nvme_bytes"] * 1.25 / GiB)) * GiB


def _gib(b) -> str:
    return "?" if b is None else f"{b / GiB:.2f}"


def _pct(x) -> str:
    return "?" if x is None else f"{x:+.1f}%"


def rows(doc: dict, today: dict | None = None) -> list[list[str]]:
    """One table row per run: engine, script, checkpointing, measured peaks, plan, errors; with `today` (job name ->
    plan JSON, todays_plans) today's planner's peak and its errors too. Pure."""
    out = []
    for r in doc["runs"]:
        others = r.get("others_rss_change_at_peak_bytes")
        job = recorded_job(r)
        row = [r["engine"], r["script"], "full" if r["checkpointing"] else "none", job.dtype, job.model_init,
               _gib(r.get("peak_system_bytes")), _gib(r.get("ru_maxrss_bytes")),
               "?" if others is None else f"{others / GiB:+.2f}",
               _gib(r["plan"]["host_peak_bytes"]), _pct(r.get("error_percent")),
               _pct(r.get("error_percent_ru_maxrss"))]
        if today is not None:
            p = prediction(today[r["job"]], r["engine"])["host_peak_bytes"]
            row += [_gib(p), _pct(error_percent(p, r.get("peak_system_bytes"))),
                    _pct(error_percent(p, r.get("ru_maxrss_bytes")))]
        out.append(row + ["yes" if r.get("ok") else "no: " + str(r.get("error"))])
    return out


HEADER = ["engine", "script", "checkpointing", "dtype", "build", "peak system GiB", "ru_maxrss GiB", "others' RSS change at peak GiB",
          "plan GiB", "plan error",
          "plan error vs ru_maxrss", "ok"]
TODAY_HEADER = ["today's plan GiB", "today's error", "today's error vs ru_maxrss"]
"""The columns rows() adds before "ok" with today's plans."""


def recorded_job(run: dict) -> Job:
    """The Job of a recorded run (what the run does not record takes Job's default, as when it was measured). Pure."""
    keys = ("seq_len", "micro_batch", "steps", "dtype", "zero_init", "model", "from_pretrained")
    return Job(run["script"], run["checkpointing"], **{k: run[k] for k in keys if k in run})


def todays_plans(doc: dict) -> dict[str, dict]:
    """Today's `memascend plan --json` for each job of a recorded sitting, its model's config.json written to a
    temporary directory (each run keeps the plan of its own day)."""
    jobs = {r["job"]: recorded_job(r) for r in doc["runs"]}
    models = dict(doc.get("models") or {"82m": doc["model"]})
    with tempfile.TemporaryDirectory() as d:
        return {name: run_plan(job, write_model(d, job.model, models[job.model])) for name, job in jobs.items()}


def write_model(work: str, key: str, config: dict) -> str:
    """The folder of model `key`'s config.json under `work`."""
    model_dir = os.path.join(work, f"model-{key}")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f)
    return model_dir


def write_pretrained(work: str, key: str, config: dict, dtype: str) -> str:
    """A model folder of model `key` with random weights in `dtype` (save_pretrained, safetensors), for the
    from_pretrained jobs; built in a child process so that the harness's own memory stays as it was."""
    model_dir = os.path.join(work, f"model-{key}-{dtype}-weights")
    if not os.path.exists(os.path.join(model_dir, "model.safetensors")):
        code = ("import json, sys, torch; from transformers import LlamaConfig, LlamaForCausalLM; "
                "torch.manual_seed(0); m = LlamaForCausalLM(LlamaConfig(**json.loads(sys.argv[1]))); "
                "m.to(getattr(torch, sys.argv[2])).save_pretrained(sys.argv[3])")
        subprocess.run([sys.executable, "-c", code, json.dumps(config),
                        "bfloat16" if dtype == "bf16" else "float32", model_dir], check=True)
    return model_dir


def model_folder(work: str, job: Job) -> str:
    """The folder the job's script and plan read: config.json, with weights for a from_pretrained job."""
    if job.from_pretrained:
        return write_pretrained(work, job.model, MODELS[job.model], job.dtype)
    return write_model(work, job.model, MODELS[job.model])


def ratios(doc: dict, key: str = "peak_system_bytes") -> list[tuple[str, float | None]]:
    """memascend's peak over stock's, per job, for the system peak (or another peak `key` of the runs). Pure."""
    by = {(r["job"], r["engine"]): r for r in doc["runs"]}
    out = []
    for job in dict.fromkeys(r["job"] for r in doc["runs"]):
        s, m = by.get((job, "stock")), by.get((job, "memascend"))
        ok = s and m and s.get("ok") and m.get("ok") and s.get(key) and m.get(key)
        out.append((job, round(m[key] / s[key], 3) if ok else None))
    return out


CLEAN_OTHERS_BYTES = 256 << 20
"""A run during which every other process's RSS together moved by more than this from the idle reading to the peak
is not a clean measurement of the script (the system peak counts the whole machine)."""


def clean(run: dict) -> bool:
    """The run trained every step and other processes stayed still (CLEAN_OTHERS_BYTES). Pure."""
    others = run.get("others_rss_change_at_peak_bytes")
    return bool(run.get("ok")) and others is not None and abs(others) <= CLEAN_OTHERS_BYTES


def median_runs(runs: list[dict]) -> list[dict]:
    """One run per (job, engine): of its repeats, the one with the median system peak (the lower middle of an even
    count; a failed repeat counts as the highest), taken over the clean repeats where there are any (clean), with
    every repeat's peaks under "repeats" and "median_of" saying over which. Pure."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["job"], r["engine"]), []).append(r)
    out = []
    keys = ("peak_system_bytes", "ru_maxrss_bytes", "max_tree_rss_bytes", "others_rss_change_at_peak_bytes", "ok")
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        clean_runs = [r for r in group if clean(r)]
        pool = clean_runs or group
        ranked = sorted(pool, key=lambda r: (not r.get("ok") or r.get("peak_system_bytes") is None,
                                             r.get("peak_system_bytes") or 0))
        out.append(dict(ranked[(len(ranked) - 1) // 2], repeats=[dict({k: r.get(k) for k in keys}, clean=clean(r))
                                                                 for r in group],
                        median_of=f"{len(pool)} clean of {len(group)}" if 0 < len(clean_runs) < len(group)
                        else f"all {len(group)} ({'clean' if clean_runs else 'none clean'})"))
    return out


def kept_sittings(sittings: list[dict]) -> list[dict]:
    """The sittings (oldest first) that still hold a job's runs: a sitting whose jobs were all measured again in a
    later one, or are no longer in JOBS, is gone. Pure."""
    covered: set[str] = set()
    current = {j.name for j in JOBS}
    out = []
    for s in reversed(sittings):
        if set(s["jobs"]) & current - covered:
            out.append(s)
        covered |= set(s["jobs"])
    return out[::-1]


def merge_runs(kept: list[dict], new: list[dict]) -> list[dict]:
    """`kept` without the jobs `new` measured again or no longer in JOBS (a job redefined gets a new name), then
    `new`, in JOBS order. Pure."""
    again = {r["job"] for r in new}
    order = {j.name: i for i, j in enumerate(JOBS)}
    return sorted([r for r in kept if r["job"] not in again and r["job"] in order] + new,
                  key=lambda r: (order[r["job"]], ENGINES.index(r["engine"])))


def table(doc: dict, today: dict | None = None) -> str:
    """The markdown table of one document (scripts/results.py renders it, with todays_plans). Pure."""
    header = HEADER[:-1] + (TODAY_HEADER if today is not None else []) + HEADER[-1:]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(doc, today)]
    def listed(pairs):
        return ", ".join(f"{j} {'?' if x is None else f'{x:.2f}'}" for j, x in pairs)

    lines += ["", f"memascend's peak over stock's (system peak, same script and knobs): {listed(ratios(doc))}.",
              # The system peak counts every process of the machine; ru_maxrss only the script's largest process.
              "", f"The same over ru_maxrss (the script's largest process alone; what other processes on a shared "
              f"machine do cannot enter it): {listed(ratios(doc, 'ru_maxrss_bytes'))}."]
    return "\n".join(lines)


# --- I/O below: the measurement itself -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script_env(base: dict, launcher: bool = False) -> dict:
    """One rank of a single-process job, as the integration tests start hf_trainer_job.py; under a `launcher`
    (accelerate) the launcher sets the rank's variables."""
    env = dict(base, DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1")
    if not launcher:
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    return env


def measure(cmd: list[str], env: dict, log_path: str, settle_cap_s: float | None = None) -> dict:
    """Settle (at most `settle_cap_s`, else the bench's cap), run `cmd`, sample host memory until it exits (the
    bench's sampler threads)."""
    from memascend_cli.bench.sampling import (MeminfoReader, MemSampler, TreeSampler, drop_caches, nearest,
                                              others_rss_bytes, sampling_stats, settle)

    reader = MeminfoReader()
    try:
        st = settle(reader.used_bytes, dropped_caches=drop_caches(),
                    **({} if settle_cap_s is None else {"cap_s": settle_cap_s}))
        others_at_idle = others_rss_bytes({os.getpid()})
        sampler = MemSampler(reader)
        switch_s = sys.getswitchinterval()
        sys.setswitchinterval(0.0002)  # as the bench: keep the tree sampler from holding the meminfo thread off
        sampler.start()
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        tree = TreeSampler(proc.pid)
        tree.start()
        try:
            _, status, rusage = os.wait4(proc.pid, 0)
        finally:
            proc.returncode = -1  # reaped by wait4
            t1 = time.monotonic()
            sampler.stop()
            tree.stop()
            sys.setswitchinterval(switch_s)
    finally:
        reader.close()
    used = [(t, u) for t, u in zip(sampler.t_s, sampler.used_bytes) if t0 <= t <= t1]
    t_pk, u_pk = max(used, key=lambda x: x[1]) if used else (None, None)
    at_peak = nearest(tree.others_rss_bytes, t_pk) if used else None
    return {"exit_code": os.waitstatus_to_exitcode(status), "wall_s": round(t1 - t0, 1),
            "idle_bytes": st.idle_bytes, "settle": {"waited_s": round(st.waited_s, 1), "flat": st.flat},
            "peak_system_bytes": (u_pk - st.idle_bytes) if used else None,
            "peak_at_s": round(t_pk - t0, 2) if used else None,
            # The bench's cross-check for a shared machine: how much other processes' RSS moved from idle to the
            # peak (1 Hz, a gauge, not a correction).
            "others_rss_change_at_peak_bytes": None if at_peak is None else at_peak - others_at_idle,
            "ru_maxrss_bytes": rusage.ru_maxrss * 1024, "max_tree_rss_bytes": tree.max_tree_rss_bytes,
            "sampling": sampling_stats(sampler.t_s)}


def run_plan(job: Job, model_dir: str) -> dict:
    r = subprocess.run(plan_command(job, model_dir=model_dir), capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def run_job(job: Job, engine: str, plan: dict, *, model_dir: str, region: str, work: str,
            settle_cap_s: float | None = None) -> dict:
    nvme = os.path.join(work, "nvme")
    shutil.rmtree(nvme, ignore_errors=True)
    os.makedirs(nvme)
    out = os.path.join(work, f"{job.name}-{engine}.json")
    log = os.path.join(work, f"{job.name}-{engine}.log")
    config = os.path.join(work, "ds_config.json")
    with open(HF_CONFIG) as f:
        cfg = json.load(f)
    for name in ("offload_param", "offload_optimizer"):  # accelerate reads the file itself: the run's own nvme_path
        cfg["zero_optimization"][name]["nvme_path"] = nvme
    # The HF docs' configs carry "bf16": {"enabled": "auto"} beside fp16: without it the Trainer fills no bf16 before
    # the model is built, and zero.Init partitions it in fp32 (partition_parameters.py Init._set_dtype).
    cfg.setdefault("bf16", {"enabled": "auto"})
    with open(config, "w") as f:
        json.dump(cfg, f)
    cmd = script_command(job, engine, model_dir=model_dir, region=region, nvme_path=nvme, out=out, config=config,
                         port=_free_port())
    m = measure(cmd, script_env(os.environ, launcher=job.script == "accelerate"), log, settle_cap_s)
    res = {"job": job.name, "script": job.script, "checkpointing": job.checkpointing, "engine": engine,
           "seq_len": job.seq_len, "micro_batch": job.micro_batch, "steps": job.steps, "dtype": job.dtype,
           "zero_init": job.zero_init, "model": job.model, "from_pretrained": job.from_pretrained,
           "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
           "command": " ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c
                               for c in (["accelerate", *cmd[1:]] if job.script == "accelerate" else cmd[1:])),
           **m, "plan": prediction(plan, engine)}
    script_out = json.load(open(out)) if os.path.exists(out) else {}
    # The script writes its result after the last step; stock DeepSpeed may still abort in interpreter teardown
    # ("terminate called without an active exception", exit -6), after the peak: kept as exit_code, not a failure.
    res["ok"] = len(script_out.get("losses") or []) == job.steps
    if not res["ok"]:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - 1500))
            res["error"] = f.read().decode(errors="replace")
    stats = script_out.get("stats") or {}
    res["script_report"] = {"losses": script_out.get("losses"), "status_kib": script_out.get("status_kib"),
                            "phases": script_out.get("phases"),
                            "vm_hwm_kib": script_out.get("vm_hwm_kib"),
                            "swap_files": script_out.get("swap_files", len(script_out.get("files") or [])),
                            "engine": {k: stats.get(k) for k in ("bytes_read", "bytes_written", "pinned_bytes",
                                                                 "param_pool_bytes", "optimizer_pool_bytes",
                                                                 "partitioned_swap_buffer_bytes", "swap_files_created",
                                                                 "config_changes")} if stats else None}
    res["error_percent"] = error_percent(res["plan"]["host_peak_bytes"], m["peak_system_bytes"])
    res["error_percent_ru_maxrss"] = error_percent(res["plan"]["host_peak_bytes"], m["ru_maxrss_bytes"])
    shutil.rmtree(nvme, ignore_errors=True)
    return res


def _open_doc(path: str, mode: str):
    """The harness document at `path`, gzipped when its name ends in .gz (docs/ keeps its records compressed)."""
    return gzip.open(path, mode) if path.endswith(".gz") else open(path, mode)


def _read_doc(path: str) -> dict:
    with _open_doc(path, "rt") as f:
        return json.load(f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", default=",".join(j.name for j in JOBS), help="comma-separated job names")
    ap.add_argument("--work", default=None, help="scratch folder on the SSD (default: a temporary one under /var/tmp)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per engine and job, stock and memascend in turn; the "
                    "document keeps the run with the median system peak of the clean repeats of each and lists every "
                    "repeat's peaks")
    ap.add_argument("--update", action="store_true", help="keep the runs of the other jobs in an existing --out "
                    "(each job's stock / memascend pair is one sitting; the document lists its sittings)")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated engines to run (default both)")
    ap.add_argument("--settle-cap-s", type=float, default=None, help="the longest wait for host memory to settle "
                    "before a run (default the bench's): on a shared machine a short one keeps the sitting short, the "
                    "script's own ru_maxrss does not depend on it, the system peak does")
    args = ap.parse_args(argv)
    from memascend_cli.bench.runner import create_region

    want = args.jobs.split(",")
    unknown = set(want) - {j.name for j in JOBS}
    if unknown:
        ap.error(f"unknown jobs {', '.join(sorted(unknown))}; the jobs: {', '.join(j.name for j in JOBS)}")
    jobs = [j for j in JOBS if j.name in want]
    work = args.work or tempfile.mkdtemp(prefix="user-script-bench-", dir="/var/tmp")
    model_dirs = {j.name: model_folder(work, j) for j in jobs}
    plans = {j.name: run_plan(j, model_dirs[j.name]) for j in jobs}
    region = os.path.join(work, "region.bin")
    create_region(region, max(region_bytes(p) for p in plans.values()), ranks=1)
    runs = []
    repeats = max(1, args.repeat)
    for job, repeat, engine in ((j, i, e) for j in jobs for i in range(repeats)
                                  for e in ENGINES if e in args.engines.split(",")):
        print(f"{job.name} {engine} ({repeat + 1}/{repeats}) ...", flush=True)
        runs.append(run_job(job, engine, plans[job.name], model_dir=model_dirs[job.name], region=region, work=work,
                            settle_cap_s=args.settle_cap_s))
        r = runs[-1]
        print(f"  ok={r['ok']} peak {_gib(r['peak_system_bytes'])} GiB, ru_maxrss {_gib(r['ru_maxrss_bytes'])} "
              f"GiB, others' RSS change {_gib(r['others_rss_change_at_peak_bytes'])} GiB, plan "
              f"{_gib(r['plan']['host_peak_bytes'])} GiB ({_pct(r['error_percent'])})", flush=True)
    sitting = {"command": "python benchmarks/user_script_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "jobs": [j.name for j in jobs],
               "load_avg_at_end": [round(x, 2) for x in os.getloadavg()]}
    old = _read_doc(args.out) if args.update and os.path.exists(args.out) else {"runs": [], "sittings": []}
    runs = merge_runs(old["runs"], median_runs(runs))
    sittings = kept_sittings(old["sittings"] + [sitting])
    doc = {"title": "Plan accuracy on user scripts", "use": "validation (never an input of scripts/fit_planner.py)",
           "sittings": sittings, "host": platform.node(),
           "machine": {"cpus": os.cpu_count(), "dram_gib": round(os.sysconf("SC_PHYS_PAGES") *
                                                                os.sysconf("SC_PAGE_SIZE") / GiB, 1)},
           "model": MODEL, "models": MODELS, "runs": runs, "ratios": dict(ratios({"runs": runs}))}
    with _open_doc(args.out, "wt") as f:
        json.dump(doc, f, separators=(",", ":"))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
