#!/usr/bin/env python3
"""The GPU kit: everything a GPU machine needs to test and measure memascend, as calls that fit its limits.

The GPU machine it is made for (one H100 or H200, Python 3.12 with torch for CUDA, nvcc; no DeepSpeed, no libaio, no
package index) receives the working tree without .git plus the carry folder (at most 64 MiB in all: `carry
--limit-mib`), may stop a command after 10 minutes (each call ends by itself within its budget: `call N
--budget-s`), and may start fresh for every command (each call does its own setup). So:

Here (a machine that reaches PyPI and Debian's archive), from the repo root:

    bash scripts/gpu_check.sh carry      # builds .gpu_carry/ (git-ignored) and checks the 64 MiB limit
    bash scripts/gpu_check.sh plan       # the calls in order: command, what travels, time (--total-s: your time)
    bash scripts/gpu_check.sh record DIR...   # afterwards: the calls' outputs into docs/bench/gpu/ (results.py)

  The carry folder holds the DeepSpeed wheel built from its sdist (pure Python: its ops are JIT-built there
  with nvcc), Python 3.12 wheels of DeepSpeed's requirements the image may lack and of the native core's build
  requirements, and libaio's .deb files for DeepSpeed's async_io op (unpacked into a private prefix there; the
  native core needs no liburing: it drives io_uring through raw system calls), with a manifest.

There, one command per call (`plan` prints them): `bash scripts/gpu_check.sh call N` runs call N of
gpukit/calls.py: its setup (private venv over the image's Python, installs from the carry folder with
--no-index, the native core, DeepSpeed's async_io and cpu_adam ops; a failed op build stops the kit), then its
phases: probe (O_DIRECT and io_uring on the work disk, an ext4 loop device when O_DIRECT is refused, dd
bandwidth), constants (the CUDA runtime constants the planner uses), tests (`pytest -m gpu`), bench
(`memascend bench` per preset and engine, random weights), validate (the 1B-class bench test on the bench's
output), sweep (growing context per engine), capacity (tuned's longest context under --dram-cap, a memory
cgroup, then memascend at twice it), placements (`bench --placement` gpu, dram, split, ssd per preset). The
bench runs sample the SSD's /proc/diskstats per phase (gpukit/phase_io.py). The first seconds say what this
machine cannot do (gVisor, no io_uring, no O_DIRECT, no loop device) and which phases still make sense.
`call N --dry-run` (or `run --dry-run`) runs anywhere: it checks the inputs and prints every command; the capacity
and placement phases also write their JSON there from the plan's numbers, marked synthetic.

Outputs in $OUT (--out; at most 8 files a call): log (the call's tee), gpu_check.log, gpu_check.json (summary,
written even when a phase fails), and per phase pytest_gpu.xml, cuda_constants.json, gpu_bench.json,
gpu_bench.png, bench_<model>.png, gpu_sweep.json, gpu_capacity.json, gpu_placements.json.

Stdlib only: it runs on the image's python3 before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpukit.bench import phase_bench, phase_sweep  # noqa: E402
from gpukit.capacity import cap_bytes, phase_capacity  # noqa: E402
from gpukit.calls import (CALLS, DEFAULT_IDLE_S, DEFAULT_START_S, DEFAULT_TOTAL_S, call_by_number,  # noqa: E402
                          plan_text)
from gpukit.carry import build_carry, check_manifest, travelling_bytes  # noqa: E402
from gpukit.kit import Kit, aio_env, cuda_env, merge_env  # noqa: E402
from gpukit.placements import phase_placements  # noqa: E402
from gpukit.phases import (phase_constants, phase_probe, phase_setup, phase_tests, phase_validate,  # noqa: E402
                           probe_host)
from gpukit.record import record  # noqa: E402
from gpukit.pure import (BENCH_RUNS, CAPACITY_DRAM_CAP, CARRY_DIR, CARRY_LIMIT_BYTES, DEFAULT_BUDGET_S,  # noqa: E402
                         DEFAULT_DISK_GBPS,
                         DEFAULT_MODELS, PHASES, REPO, SWEEP_SEQ_LENS, WORK_DIR, GiB, MiB, what_can_run)

PHASE_FUNCTIONS = {"setup": phase_setup, "probe": phase_probe, "constants": phase_constants, "tests": phase_tests,
                   "bench": phase_bench, "validate": phase_validate, "sweep": phase_sweep, "capacity": phase_capacity,
                   "placements": phase_placements}
NEEDS_SETUP = ("constants", "tests", "bench", "validate", "sweep", "capacity", "placements")
CARRY_LIMIT_HELP = "the most the working tree and the carry folder may take together, in MiB (default %(default)g)"


def collect_facts(kit: Kit) -> None:
    facts = {"python": kit.args.python, "host": os.uname().nodename, "kernel": os.uname().release,
             "cpu_count": os.cpu_count()}
    rc, out, _ = kit.capture(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    facts["gpus"] = [ln.strip() for ln in out.splitlines() if ln.strip()] if rc == 0 else []
    rc, out, _ = kit.capture(["nvcc", "--version"])
    facts["nvcc"] = out.strip().splitlines()[-1] if rc == 0 and out.strip() else None
    code = ("import json, sys, torch; print(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__, "
            "'cuda': torch.version.cuda, 'cuda_available': torch.cuda.is_available(), 'capability': "
            "'.'.join(map(str, torch.cuda.get_device_capability())) if torch.cuda.is_available() else None}))")
    rc, out, err = kit.capture([kit.args.python, "-c", code], timeout=120)
    try:
        facts["torch"] = json.loads(out)
    except json.JSONDecodeError:
        facts["torch"] = {"error": err.strip()[-300:]}
    try:
        with open("/proc/meminfo") as f:
            facts["mem_total_kib"] = int(f.readline().split()[1])
    except OSError:
        pass
    facts["work_free_bytes"] = shutil.disk_usage(kit.work).free
    # The first seconds: what this machine cannot do, and what can still be measured.
    facts["host"] = probe_host(kit.work)
    lost, facts["phases_possible"] = what_can_run(facts["host"])
    facts["limits"] = lost
    kit.facts = facts
    say = print if kit.dry_run else kit.log
    say("this machine: " + json.dumps(facts))
    for line in lost:
        say("LIMIT: " + line)


def check_inputs(kit: Kit) -> list[str]:
    """What must hold before a call can run (the dry mode's checks)."""
    problems = []
    manifest_path = os.path.join(kit.carry, "manifest.json")
    if not os.path.isfile(manifest_path):
        problems.append(f"{manifest_path} is missing: build the carry folder first (bash scripts/gpu_check.sh carry)")
    else:
        with open(manifest_path) as f:
            problems += check_manifest(json.load(f), kit.carry)
    for m in kit.args.models.split(","):
        if not os.path.isfile(os.path.join(REPO, "presets", "models", f"{m}.yaml")):
            problems.append(f"preset {m} not found in presets/models/")
    for t in ("tests/gpu/test_gpu_pinned.py", "tests/gpu/test_gpu_deepspeed.py", "tests/gpu/test_gpu_cli.py"):
        if not os.path.isfile(os.path.join(REPO, t)):
            problems.append(f"{t} is missing")
    bad_runs = [r for r in kit.args.runs.split(",") if r not in BENCH_RUNS]
    if bad_runs:
        problems.append(f"unknown bench run(s) {bad_runs}; runs are {', '.join(BENCH_RUNS)}")
    bad_phases = [p for p in kit.args.phases.split(",") if p not in PHASES]
    if bad_phases:
        problems.append(f"unknown phase(s) {bad_phases}; phases are {', '.join(PHASES)}")
    try:
        cap_bytes(kit.args.dram_cap)
    except ValueError as exc:
        problems.append(str(exc))
    if os.path.isdir(kit.carry):
        size = travelling_bytes(REPO, [kit.carry], int(kit.args.carry_limit_mib * MiB))
        kit.summary["travelling"] = size
        if size["total_bytes"] > size["limit_bytes"]:
            problems.append(f"working tree + carry folder = {size['total_bytes'] / MiB:.1f} MiB > "
                            f"{kit.args.carry_limit_mib:g} MiB (--carry-limit-mib)")
    return problems


def main_run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    work = os.path.abspath(args.work)
    out_dir = args.out or os.environ.get("OUT") or os.path.join(work, "out")
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    kit = Kit(args=args, out_dir=out_dir, work=work, carry=os.path.abspath(args.carry), deadline=t0 + args.budget_s,
              dry_run=args.dry_run, log_path=os.path.join(out_dir, "gpu_check.log"))
    if not args.dry_run:
        open(kit.log_path, "w").close()
    cuda, cuda_notes = cuda_env(work, dry_run=args.dry_run)
    kit.env = merge_env({
        "PATH": os.pathsep.join([os.path.join(kit.venv, "bin"), os.path.dirname(args.python),
                                 os.environ.get("PATH", "")]),
        "DS_ACCELERATOR": args.accelerator, "TORCH_EXTENSIONS_DIR": os.path.join(work, "torch_ext"),
        "MAX_JOBS": str(max(1, (os.cpu_count() or 2) // 2)), "MEMASCEND_BUILD_JOBS": str(os.cpu_count() or 2),
        "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        **aio_env(os.path.join(work, "aio"))}, cuda)
    collect_facts(kit)
    kit.facts["cuda_build"] = cuda_notes
    problems = check_inputs(kit)
    cap = (kit.facts.get("torch") or {}).get("capability")
    if cap:
        kit.env["TORCH_CUDA_ARCH_LIST"] = cap  # build the ops for this GPU only
    phases = [p for p in args.phases.split(",") if p]
    if args.dry_run:
        print(f"gpu_check run --dry-run: repo {REPO}, carry {kit.carry}, work {work}, out {out_dir}")
        print("CUDA build: " + "; ".join(cuda_notes))
        print("environment of every step:\n" + "\n".join(f"    {k}={v}" for k, v in kit.env.items()))
        size = kit.summary.get("travelling")
        if size:
            print(f"travels with the call: tree {size['tree_bytes'] / MiB:.2f} MiB + carry "
                  f"{sum(size['carried_bytes'].values()) / MiB:.2f} MiB = {size['total_bytes'] / MiB:.2f} MiB "
                  f"(limit {size['limit_bytes'] / MiB:.0f} MiB)")
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        print("hint: bash scripts/gpu_check.sh carry builds .gpu_carry/ on a machine that reaches PyPI",
              file=sys.stderr)
        if not args.dry_run:
            write_summary(kit, {}, t0, problems=problems)
        return 2
    results: dict = {}
    possible = kit.facts.get("phases_possible") or list(PHASES)
    for phase in [p for p in PHASES if p in phases]:
        if results.get("setup") is False:
            kit.log(f"{phase} and what follows: not run, the setup failed (its errors are above)")
            break
        if phase not in possible and not args.dry_run:
            kit.log(f"{phase}: not run, this machine cannot ({'; '.join(kit.facts.get('limits', []))})")
            continue
        if not args.dry_run:
            kit.log(f"=== phase {phase} ===")
        if phase in NEEDS_SETUP and not kit.storage:
            kit.storage = {"dir": os.path.join(work, "ssd")}
        try:
            results[phase] = PHASE_FUNCTIONS[phase](kit)
        except Exception:  # noqa: BLE001 - the summary and the log must reach $OUT whatever broke
            if args.dry_run:
                raise
            results[phase] = False
            kit.summary.setdefault("crashes", {})[phase] = traceback.format_exc()[-3000:]
            kit.log(f"{phase} crashed:\n{traceback.format_exc()}")
        if args.dry_run and phase == "bench":
            for d in kit.summary.get("bench_decisions", []):
                print(f"[bench] {d['model']}: ~{d['estimate_s']:.0f} s per run at {DEFAULT_DISK_GBPS} GB/s "
                      f"(re-estimated there from the dd probe), ~{d['need_disk_bytes'] / GiB:.1f} GiB SSD space"
                      + ("" if d["run"] else f": SKIPPED, {d['reason']}"))
    for name in list(kit.background):
        kit.join(name)
    if args.dry_run:
        # The capacity and placement phases wrote their JSON from the plan's numbers: the summary beside them, so
        # `record` (allow_synthetic) and the results page can be rehearsed on the folder.
        kit.summary["synthetic"] = True
        write_summary(kit, results, t0)
        print("inputs OK; the commands above are what this call executes on the GPU machine")
        return 0
    cleanup(kit)
    summary = write_summary(kit, results, t0)
    kit.log(f"done in {summary['seconds']} s: " + ", ".join(f"{k} {'ok' if v else 'NOT ok'}" for k, v in
                                                           results.items()) + f"; outputs in {kit.out_dir}")
    return 0 if summary["ok"] else 1


def write_summary(kit: Kit, results: dict, t0: float, problems: list[str] | None = None) -> dict:
    summary = {"schema_version": 2, "ok": bool(results) and all(results.values()) and not problems,
               "phases": results, "problems": problems or [], "seconds": round(time.monotonic() - t0, 1),
               "budget_s": kit.args.budget_s, "call": getattr(kit.args, "call", None), "run_args": run_args(kit.args),
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "facts": kit.facts,
               "storage": kit.storage, "steps": [asdict(s) for s in kit.steps], **kit.summary}
    with open(os.path.join(kit.out_dir, "gpu_check.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def run_args(args: argparse.Namespace) -> str:
    """The `gpu_check.py run` options that decide what was measured (results.md names a hand-chosen run by them)."""
    clip = getattr(args, "gradient_clipping", None)
    return (f"--phases {args.phases} --models {args.models} --runs {args.runs} --seq-len {args.seq_len} "
            f"--steps {args.steps} --budget-s {args.budget_s:g}"
            + ("" if clip is None else f" --gradient-clipping {clip:g}")
            + (f" --dram-cap {args.dram_cap}" if "capacity" in args.phases.split(",") else ""))


def cleanup(kit: Kit) -> None:
    """Unmount and detach the loop fallback (machine-global resources)."""
    if kit.storage.get("loop_mount"):
        kit.capture(["umount", kit.storage["loop_mount"]])
    if kit.storage.get("loop_device"):
        kit.capture(["losetup", "-d", kit.storage["loop_device"]])
        img = os.path.join(kit.work, "ssd.img")
        if os.path.exists(img):
            os.unlink(img)


def add_run_options(r: argparse.ArgumentParser) -> None:
    r.add_argument("--dry-run", action="store_true", help="check the inputs and print every command; run nothing")
    r.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {', '.join(PHASES)}")
    r.add_argument("--models", default=",".join(DEFAULT_MODELS), help="bench presets, smallest first")
    r.add_argument("--runs", default=",".join(BENCH_RUNS), help="bench runs per preset, the most wanted first")
    r.add_argument("--seq-len", type=int, default=2048)
    r.add_argument("--steps", type=int, default=3, help="bench steps per run (s/step averages steps 2..N)")
    r.add_argument("--gradient-clipping", type=float, default=None,
                   help="bench: clip at this norm (default DeepSpeed's 1.0; random weights' norms are 5-10, so "
                        "memascend's overlapped optimizer redoes every step there)")
    r.add_argument("--dram-cap", default=CAPACITY_DRAM_CAP,
                   help="capacity: the memory cgroup's size, in GiB (default %(default)s)")
    r.add_argument("--sweep-seq-lens", default=",".join(map(str, SWEEP_SEQ_LENS)), help="the sweep's contexts")
    r.add_argument("--settle-cap-s", type=float, default=20.0, help="bench: longest wait for memory to settle")
    r.add_argument("--accelerator", default="cuda", choices=["cuda", "cpu"],
                   help="DS_ACCELERATOR of every step and the bench's --accelerator (cpu: rehearse on a CPU box)")
    r.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help="wall time of the whole run, outputs written (default %(default)g: within a 10-minute limit)")
    r.add_argument("--carry-limit-mib", type=float, default=CARRY_LIMIT_BYTES / MiB,
                   help=CARRY_LIMIT_HELP)
    r.add_argument("--tests-cap-s", type=float, default=300.0, help="longest time for `pytest -m gpu`")
    r.add_argument("--python", default=sys.executable, help="the image's interpreter (the one with torch)")
    r.add_argument("--out", default=None, help="output folder (default $OUT, else WORK/out)")
    r.add_argument("--carry", default=CARRY_DIR, help="the carry folder (default .gpu_carry in the repo root)")
    r.add_argument("--work", default=WORK_DIR, help="work folder (default .gpu_work in the repo root)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring for details.")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("carry", help="here: build .gpu_carry/ (needs PyPI and apt)")
    c.add_argument("--python", default=sys.executable, help="interpreter whose pip builds and downloads the wheels")
    c.add_argument("--carry", default=CARRY_DIR, help="folder to build (default .gpu_carry in the repo root)")
    c.add_argument("--limit-mib", type=float, default=CARRY_LIMIT_BYTES / MiB,
                   help=CARRY_LIMIT_HELP)
    pl = sub.add_parser("plan", help="print the calls in order: command, what travels, time")
    pl.add_argument("--total-s", type=float, default=DEFAULT_TOTAL_S,
                    help="time you have on the GPU machine, all calls and start-ups together (default %(default)g)")
    pl.add_argument("--start-s", type=float, default=DEFAULT_START_S,
                    help="a fresh machine's start before the command runs (default %(default)g)")
    pl.add_argument("--idle-s", type=float, default=DEFAULT_IDLE_S,
                    help="the machine shuts down after this long idle (default %(default)g)")
    rec = sub.add_parser("record", help="here: the calls' output folders merged into docs/bench/gpu/ (results.py)")
    rec.add_argument("folders", nargs="+", help="the calls' output folders, copied back from the GPU machine, in call "
                                                "order")
    rec.add_argument("--out-dir", default=os.path.join(REPO, "docs", "bench", "gpu"))
    rec.add_argument("--run-args", default=None,
                     help="the `run` options of folders whose gpu_check.json predates recording them")
    k = sub.add_parser("call", help="one call (gpukit/calls.py) on the GPU machine, setup included; --dry-run anywhere")
    k.add_argument("call", type=int, choices=[x.number for x in CALLS])
    k.add_argument("--dry-run", action="store_true", help="check the inputs and print every command; run nothing")
    k.add_argument("--budget-s", type=float, default=None,
                   help="wall time of the call, outputs written (default: the call's own, within 9 minutes)")
    k.add_argument("--carry-limit-mib", type=float, default=CARRY_LIMIT_BYTES / MiB,
                   help=CARRY_LIMIT_HELP)
    for name, default in (("--python", sys.executable), ("--out", None), ("--carry", CARRY_DIR), ("--work", WORK_DIR)):
        k.add_argument(name, default=default)
    add_run_options(sub.add_parser("run", help="the phases chosen by hand (a call is this with its options)"))
    args = ap.parse_args(argv)
    if args.command == "carry":
        return build_carry(os.path.abspath(args.carry), args.python, int(args.limit_mib * MiB))
    if args.command == "plan":
        print(plan_text(args.total_s, args.start_s, args.idle_s))
        return 0
    if args.command == "record":
        try:
            print("wrote", record(args.folders, args.out_dir, args.run_args))
        except (OSError, ValueError) as exc:
            print(f"error: {exc}\nhint: pass the calls' output folders, copied back from the GPU machine",
                  file=sys.stderr)
            return 2
        return 0
    if args.command == "call":
        call = call_by_number(args.call)
        budget_s = call.budget_s if args.budget_s is None else args.budget_s
        rest = [*call.args, "--budget-s", str(budget_s), "--carry-limit-mib", str(args.carry_limit_mib),
                "--python", args.python, "--carry", args.carry,
                "--work", args.work, *(["--out", args.out] if args.out else []),
                *(["--dry-run"] if args.dry_run else [])]
        r = argparse.ArgumentParser()
        add_run_options(r)
        run_args = r.parse_args(rest)
        run_args.call = call.number
        if args.dry_run:
            print(f"call {call.number}: {call.title}\n  command: {call.command()} (the working tree and .gpu_carry; "
                  f"timeout {call.timeout_s} s)\n  = gpu_check.py run {' '.join(rest)}")
        return main_run(run_args)
    return main_run(args)


if __name__ == "__main__":
    sys.exit(main())
