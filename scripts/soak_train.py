"""Soak run of `memascend train`: a long tiny-cpu run stays flat (host memory, descriptors, /dev/shm and
checkpoints).

    python scripts/soak_train.py --steps 2000 --checkpoint-every 100 --keep 2 --output-dir runs/soak --json soak.json

Runs the real CLI (memascend engine, region file in the run directory) and samples every --sample-s seconds each
rank's open file descriptors, /dev/shm usage (all of it, and the job's DeepSpeed segments) and the number of checkpoints kept; host memory per rank comes from
metrics.jsonl (logged every step). Prints one JSON summary: the RSS slope after warm-up in MiB per 100 steps (the target:
below 1), the most checkpoints seen at once (at most --keep, plus the one being written), and /dev/shm and descriptor
counts from the first checkpoint to the end. A benchmark: run it on an idle machine (other jobs move both memory and timing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")
MiB = 1 << 20


def slope_mib_per_100_steps(points: list[tuple[int, float]], warmup_steps: int) -> float | None:
    """Least-squares slope of (step, host RSS GiB per rank) after `warmup_steps`, in MiB per 100 steps. Pure."""
    pts = [(s, v) for s, v in points if s > warmup_steps]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx = sum(s for s, _ in pts) / n
    my = sum(v for _, v in pts) / n
    sxx = sum((s - mx) ** 2 for s, _ in pts)
    if sxx == 0:
        return None
    sxy = sum((s - mx) * (v - my) for s, v in pts)
    return sxy / sxx * 100 * 1024  # GiB/step -> MiB per 100 steps


def rss_points(metrics_path: str) -> list[tuple[int, float]]:
    """(step, host RSS GiB per rank) of every step record (host_rss_gib is the sum over the ranks)."""
    world, out = 1, []
    with open(metrics_path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("event") == "start":
                world = rec.get("world_size", 1)
            elif rec.get("event") == "step":
                out.append((rec["step"], rec["host_rss_gib"] / world))
    return out


def _rank_pids(run: str) -> list[int]:
    logs = os.path.join(run, "logs")
    pids = []
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
        if name.startswith("started-rank"):
            try:
                with open(os.path.join(logs, name)) as f:
                    pids.append(int(f.read().strip()))
            except (OSError, ValueError):
                pass
    return pids


def _fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _steady_fds(samples: list[dict]) -> list[list[int]] | None:
    """Per rank, the fewest descriptors open in the first and in the last third of the samples. A sample can land
    while a checkpoint file is open (one more, for a moment); a leak raises the floor, so the floors are compared."""
    if not samples:
        return None
    window = max(1, len(samples) // 3)
    return [[min(col) for col in zip(*(s["fds"] for s in part))] for part in (samples[:window], samples[-window:])]


def _checkpoints(run: str) -> int:
    ck = os.path.join(run, "checkpoints")
    return sum(1 for n in os.listdir(ck) if n.startswith("step-")) if os.path.isdir(ck) else 0


def soak(steps: int, checkpoint_every: int, keep: int, run: str, sample_s: float = 1.0, ranks: int = 1) -> dict:
    from memascend_cli.run.launch import free_port
    from memascend_cli.run.leftovers import deepspeed_segments, parse_shm_name, shm_used_bytes

    port = free_port()

    def job_segments() -> int:
        return sum(1 for n in deepspeed_segments() if (parse_shm_name(n) or (0, "", "", 0))[2] == str(port))

    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    shm_before = shm_used_bytes()
    cmd = [sys.executable, "-m", "memascend_cli", "train", TINY, "--output-dir", run, "--steps", str(steps),
           "--set", f"checkpoint_every={checkpoint_every}", "--set", f"keep_checkpoints={keep}",
           "--set", "export=false", "--set", f"ranks={ranks}", "--set", "overwrite_output_dir=true",
           "--set", f"master_port={port}"]
    samples = []
    t0 = time.monotonic()
    with open(os.path.join(os.path.dirname(os.path.abspath(run)), "soak-cli.log"), "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        while proc.poll() is None:
            fds = [_fds(p) for p in _rank_pids(run)]
            # From the first checkpoint on: the engine is set up and every kind of file has been opened once.
            if fds and all(f is not None for f in fds) and _checkpoints(run) >= 1:
                samples.append({"t_s": round(time.monotonic() - t0, 1), "fds": fds, "shm_bytes": shm_used_bytes(),
                                "job_segments": job_segments(),
                                "checkpoints": _checkpoints(run)})
            time.sleep(sample_s)
    points = rss_points(os.path.join(run, "metrics.jsonl"))
    warmup = max(1, steps // 10)
    return {"exit": proc.returncode, "steps": steps, "checkpoint_every": checkpoint_every, "keep": keep,
            "rss_slope_mib_per_100_steps": slope_mib_per_100_steps(points, warmup), "warmup_steps": warmup,
            "rss_gib_first_last": [points[warmup][1], points[-1][1]] if len(points) > warmup else None,
            "max_checkpoints_seen": max((s["checkpoints"] for s in samples), default=0),
            "checkpoints_at_end": _checkpoints(run),
            "fds_floor_first_last_third": _steady_fds(samples),
            "shm_bytes_before_first_last_after": [shm_before, samples[0]["shm_bytes"] if samples else None,
                                                  samples[-1]["shm_bytes"] if samples else None, shm_used_bytes()],
            "job_segments_max_during_at_end": [max((s["job_segments"] for s in samples), default=0), job_segments()],
            "samples": len(samples)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--keep", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--sample-s", type=float, default=1.0)
    ap.add_argument("--output-dir", default="runs/soak")
    ap.add_argument("--json", help="also write the summary here")
    a = ap.parse_args(argv)
    summary = {"command": "python scripts/soak_train.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": os.uname().nodename,
               **soak(a.steps, a.checkpoint_every, a.keep, os.path.abspath(a.output_dir), a.sample_s, a.ranks)}
    text = json.dumps(summary, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0 if summary["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
