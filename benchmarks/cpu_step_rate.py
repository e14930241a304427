"""How fast a plain transformers training step runs on this CPU against `memascend inspect --cpu-probe`'s matmul
rate: the data behind the time model's CPU_ACHIEVED_FRACTION (memascend_cli/planner/time.py).

No DeepSpeed, no SSD: the bench's own model (random weights), activation checkpointing and memascend's chunked loss
as `memascend bench` runs them, forward and backward timed per step; FLOPs from the planner's phase_flops. The probe
(a best-of-5 square matmul) runs in the same sitting, before and after the steps. What a DeepSpeed step adds beyond
this (hooks, fetches, gradient partitioning, the optimizer) is the bench's to measure, not this script's.

Usage (about 5 minutes on 2 cores for the defaults):
    python benchmarks/cpu_step_rate.py --out docs/bench/micro/cpu-step-rate-fp32.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time

DEFAULT_JOBS = ("llama-3.2-1b:16:1024", "bench-llama-136m:8:512")


def child(model: str, layers: int, seq_len: int, steps: int) -> dict:
    import torch

    from memascend_cli.models import load_model
    from memascend_cli.planner.time import phase_flops
    from memascend_engine import chunked_loss
    from memascend_engine.hf_models import causal_lm_factory

    torch.manual_seed(0)
    spec = load_model(model).scaled(layers)
    net = causal_lm_factory(spec)()
    net.config.use_cache = False
    chunked_loss.enable(net)
    net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    net.train()
    x = torch.randint(0, spec.vocab_size, (1, seq_len))
    fwd_flops, bwd_flops = phase_flops(spec, tokens=seq_len, seq_len=seq_len, checkpointing="full",
                                       chunked_loss=True)
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = net(input_ids=x, labels=x).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        net.zero_grad(set_to_none=True)
        out.append({"forward_s": round(t1 - t0, 3), "backward_s": round(t2 - t1, 3)})
    return {"model": model, "layers": layers, "seq_len": seq_len, "threads": torch.get_num_threads(),
            "forward_gflop": round(fwd_flops / 1e9, 1), "backward_gflop": round(bwd_flops / 1e9, 1), "steps": out}


def probe() -> float:
    from memascend_cli.compute_probe import run_probe

    found = run_probe()
    if not found:
        sys.exit("error: the CPU probe failed (torch missing?)")
    return found["fp32_gflops"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", nargs="+", default=list(DEFAULT_JOBS), help="MODEL:LAYERS:SEQ_LEN")
    ap.add_argument("--steps", type=int, default=3, help="steps per job; the first is a warm-up, not counted")
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        model, layers, seq = args.child.split(":")
        print(json.dumps(child(model, int(layers), int(seq), args.steps)))
        return
    from memascend_cli.hardware import local_cpu_model

    probes = [probe()]
    jobs = []
    for spec in args.jobs:  # each in a fresh process: no allocator state carried from one model to the next
        res = subprocess.run([sys.executable, __file__, "--child", spec, "--steps", str(args.steps), "--out", "-"],
                             capture_output=True, text=True, check=True)
        job = json.loads(res.stdout.strip().splitlines()[-1])
        counted = job["steps"][1:] or job["steps"]
        seconds = sum(s["forward_s"] + s["backward_s"] for s in counted) / len(counted)
        job["gflops"] = round((job["forward_gflop"] + job["backward_gflop"]) / seconds, 1)
        jobs.append(job)
        print(f"{spec}: {seconds:.1f} s/step, {job['gflops']} GFLOP/s", flush=True)
    probes.append(probe())
    probe_gflops = max(probes)
    for job in jobs:
        job["of_probe"] = round(job["gflops"] / probe_gflops, 3)
    doc = {"what": "plain transformers steps (chunked loss, full checkpointing, fp32) against the matmul probe",
           "command": "python benchmarks/cpu_step_rate.py " + " ".join(sys.argv[1:]),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "host": platform.node(), "cpu_model": local_cpu_model(),
           "probe_fp32_gflops": probes, "jobs": jobs}
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"of the probe ({probe_gflops} GFLOP/s): " + ", ".join(f"{j['model']} {j['of_probe']}" for j in jobs))


if __name__ == "__main__":
    main()
