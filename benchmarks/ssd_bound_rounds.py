"""All-SSD tokens/s of memascend (fp32 and bf16 Adam moments) against tuned stock DeepSpeed at one SSD throttled to
400 MB/s, in interleaved rounds: each round is one `memascend bench` sitting of the three runs, the same command but
for its --out and title, so that machine drift hits every engine alike; the ratios to tuned stock are the medians of
the rounds' own ratios (each round's engines ran minutes apart).

Each round's bench document is recorded as a regular SSD-bound document (docs/bench/ssd-bound/NAME-roundK.json.gz and
its timeline), and the rounds' summary in docs/bench/ssd-bound-rounds/NAME.json.gz: the load average before and after
every round, the niceness the rounds ran at, and per run the SSD share of its step (the busier direction's bytes at
the throttle over the measured s/step: 1.0 when the SSD never idles) and the CPU the rest of the machine took.

No round starts unless the longest round so far still ends before --until (a quiet window's end). Root (io cgroups).

    nice -n -10 python benchmarks/ssd_bound_rounds.py --name bench-llama-136m-seq512-bf16-ssd400mbs-noclip-rounds \
        --rounds 5 --until 17:38
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

from memascend_cli.bench.document import write_summary

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import striped_bench as sb  # noqa: E402  (loadavg, machine)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "memascend_cli"]
BENCH_DIR = os.path.join(REPO, "docs", "bench", "ssd-bound")
ROUNDS_DIR = os.path.join(REPO, "docs", "bench", "ssd-bound-rounds")
FIRST_ROUND_GUESS_S = 300.0
"""What the first round is assumed to take before one has run (three ~50 s runs, each after up to 30 s of settling,
plus the bench's probes), for --until."""


def bench_args(a, out: str, title: str) -> list[str]:
    """One round's `memascend bench` arguments: identical in every round but for --out and --title. Pure."""
    return ["bench", "--model", a.model, "--seq-len", str(a.seq_len), "--steps", str(a.steps), "--dtype", a.dtype,
            "--runs", a.runs, "--ssd-bandwidth", a.bandwidth, "--gradient-clipping", f"{a.gradient_clipping:g}",
            "--settle-cap", str(a.settle_cap), "--title", title, "--out", out]


def ssd_share(run: dict, throttle: dict) -> float | None:
    """The SSD share of a finished run's step at the throttle (bench.document.ssd_share). Pure."""
    from memascend_cli.bench.document import ssd_share as share

    return share(run, throttle["read_bytes_per_s"], throttle["write_bytes_per_s"]) if run.get("ok") else None


def round_runs(doc: dict) -> dict[str, dict]:
    """Per run of one round's bench document: what the summary keeps of it. Pure."""
    throttle = doc["job"]["ssd_throttle"][0]
    out = {}
    for r in doc["runs"]:
        share = ssd_share(r, throttle)
        out[r["name"]] = {
            "ok": r["ok"], "tokens_per_s": r.get("tokens_per_s"), "seconds_per_step": r.get("seconds_per_step"),
            "ssd_read_bytes_per_step": r.get("ssd_read_bytes_per_step"),
            "ssd_write_bytes_per_step": r.get("ssd_write_bytes_per_step"),
            "ssd_bytes_per_param": r.get("ssd_bytes_per_param"),
            "ssd_share": None if share is None else round(share, 3),
            "others_cpu_seconds": r.get("others_cpu_seconds"), "bench_cpu_seconds": r.get("bench_cpu_seconds"),
            "wall_s": r.get("wall_s"),
            "plan_seconds_per_step": ((r.get("predicted") or {}).get("time") or {}).get("seconds_per_step"),
            "overlap": ((r.get("engine_stats") or [{}])[0] or {}).get("overlap")}
    return out


def summarize(rounds: list[dict], reference: str = "tuned") -> dict:
    """Median tokens/s and SSD share per run over the rounds, and each run's ratio to `reference`: the median of
    the rounds' own ratios (paired within a round) and the ratio of the medians. Pure."""
    names = sorted({n for rd in rounds for n in rd.get("runs", {})})
    ok = {n: [rd["runs"][n] for rd in rounds if rd.get("runs", {}).get(n, {}).get("tokens_per_s")] for n in names}
    med = {n: statistics.median(r["tokens_per_s"] for r in v) for n, v in ok.items() if v}
    share = {n: statistics.median(r["ssd_share"] for r in v) for n, v in ok.items()
             if v and all(r["ssd_share"] is not None for r in v)}
    paired: dict[str, list[float]] = {}
    for rd in rounds:
        ref = rd.get("runs", {}).get(reference, {}).get("tokens_per_s")
        for n, r in rd.get("runs", {}).items():
            if ref and r.get("tokens_per_s") and n != reference:
                paired.setdefault(n, []).append(r["tokens_per_s"] / ref)
    return {"median_tokens_per_s": {n: round(v, 3) for n, v in med.items()},
            "median_ssd_share": {n: round(v, 3) for n, v in share.items()},
            "round_ratios_to_tuned": {n: [round(x, 3) for x in v] for n, v in paired.items()},
            "median_ratio_to_tuned": {n: round(statistics.median(v), 3) for n, v in paired.items()},
            "ratio_of_medians_to_tuned": {n: round(v / med[reference], 3) for n, v in med.items()
                                          if reference in med and n != reference}}


def record(out_dir: str, name: str) -> str:
    """Copy a round's bench.json (gzipped, compact) and its timeline into docs/bench/ssd-bound/ as NAME.json.gz and
    NAME.timeline.json.gz; returns the document's file name."""
    with open(os.path.join(out_dir, "bench.json")) as f:
        doc = json.load(f)
    doc["timeline_file"] = f"{name}.timeline.json.gz"
    shutil.copyfile(os.path.join(out_dir, "bench.timeline.json.gz"), os.path.join(BENCH_DIR, doc["timeline_file"]))
    write_summary(os.path.join(BENCH_DIR, f"{name}.json.gz"), doc)
    return f"{name}.json.gz"


def run_round(a, k: int) -> dict:
    out = os.path.join(a.work_dir, f"round{k}")
    shutil.rmtree(out, ignore_errors=True)  # each round its own region and swap files, as a fresh sitting
    title = f"{a.title}, round {k} of {a.rounds}"
    args = bench_args(a, out, title)
    rec = {"round": k, "bench_args": args, "loadavg_before": sb.loadavg()}
    t0 = time.monotonic()
    p = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=REPO, check=False)
    rec.update({"exit": p.returncode, "wall_s": round(time.monotonic() - t0, 1), "loadavg_after": sb.loadavg()})
    if not os.path.exists(os.path.join(out, "bench.json")):
        rec["stderr_tail"] = p.stderr[-2000:]
        return rec
    rec["document"] = record(out, f"{a.name}-round{k}")
    with open(os.path.join(out, "bench.json")) as f:
        rec["runs"] = round_runs(json.load(f))
    shutil.rmtree(out, ignore_errors=True)  # its region and swap files: ~6 GiB a round, recorded above
    return rec


def commit() -> dict:
    """The engine the rounds ran: HEAD's commit and the tracked files that differ from it (other work in the tree)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO, check=False).stdout

    return {"head": git("rev-parse", "--short", "HEAD").strip(),
            "changed": sorted(line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines())}


def deadline(until: str | None) -> datetime | None:
    """Today's UTC HH:MM as a datetime, or None."""
    if not until:
        return None
    h, m = (int(x) for x in until.split(":"))
    return datetime.now(timezone.utc).replace(hour=h, minute=m, second=0, microsecond=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="the documents' name (docs/bench/ssd-bound/NAME-roundK.json.gz, "
                    "docs/bench/ssd-bound-rounds/NAME.json.gz)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--until", help="UTC HH:MM by which every round must have ended (none starts that would not)")
    ap.add_argument("--work-dir", default="/var/tmp/memascend-ssd-rounds", help="the rounds' bench output folders "
                    "(a disk file system: the bench refuses tmpfs)")
    ap.add_argument("--model", default="bench-llama-136m")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--runs", default="tuned,memascend,memascend-bf16_moments")
    ap.add_argument("--bandwidth", default="400MB/s")
    ap.add_argument("--gradient-clipping", type=float, default=0.0)
    ap.add_argument("--settle-cap", type=float, default=30.0)
    ap.add_argument("--title", default="SSD-bound at 400 MB/s, bf16, no gradient clipping: memascend (fp32 and bf16 "
                    "moments) against tuned stock, interleaved rounds")
    a = ap.parse_args()
    end = deadline(a.until)
    os.makedirs(ROUNDS_DIR, exist_ok=True)
    out = os.path.join(ROUNDS_DIR, f"{a.name}.json.gz")
    doc = {"command": "python benchmarks/ssd_bound_rounds.py " + shlex.join(sys.argv[1:]),
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": sb.machine(),
           "commit": commit(),
           "nice": os.nice(0), "loadavg_start": sb.loadavg(), "rounds": []}
    longest_s = FIRST_ROUND_GUESS_S
    for k in range(1, a.rounds + 1):
        if end and datetime.now(timezone.utc) + timedelta(seconds=longest_s) > end:
            doc["stopped"] = f"round {k} would not end by {a.until} UTC (longest round so far {longest_s:.0f} s)"
            break
        rec = run_round(a, k)
        longest_s = max(longest_s if k > 1 else 0.0, rec["wall_s"])
        doc["rounds"].append(rec)
        print(json.dumps({"round": k, "exit": rec["exit"], "wall_s": rec["wall_s"],
                          "tokens_per_s": {n: r["tokens_per_s"] for n, r in rec.get("runs", {}).items()},
                          "loadavg_before": rec["loadavg_before"]}), flush=True)
        write(doc, out)  # after every round: a sitting cut short keeps what it measured
    doc["loadavg_end"] = sb.loadavg()
    write(doc, out)
    print(json.dumps({k: doc[k] for k in ("median_tokens_per_s", "median_ratio_to_tuned", "median_ssd_share")}))
    return 0


def write(doc: dict, out: str) -> None:
    doc.update(summarize(doc["rounds"]))
    write_summary(out, doc)


if __name__ == "__main__":
    sys.exit(main())
