"""The kit as calls: each call is one command on the GPU machine, self-contained (it does its own setup, so a machine
that starts fresh for every command runs it as well), ends by itself within its time budget (`call N --budget-s`) and
leaves its JSON and log in the output folder ($OUT) even when it fails. `plan` lays the calls out for the time you
have on the GPU machine (`plan --total-s`)."""

from __future__ import annotations

from dataclasses import dataclass

from gpukit.pure import (CAPACITY_DRAM_CAP, CAPACITY_MODEL, CAPACITY_STEPS, DEFAULT_BUDGET_S, MEMASCEND_PROBE_FACTOR,
                         PLACEMENT_MODELS, PLACEMENT_STEPS, PLACEMENT_SWEEP, SWEEP_SEQ_LENS)

CARRY = (".gpu_carry",)
"""The folders that go to the GPU machine beside the working tree (git-ignored, so not part of it)."""
COMMAND_LIMIT_CHARS = 2000
"""Each call's command is one short line, for job runners that take the command as a string."""
COMMAND_LIMIT_S = 600
"""A call's command ends within this many seconds with the default budgets (its timeout there)."""
DEFAULT_START_S = 90
"""A fresh GPU machine's start before the command runs (`plan --start-s`)."""
DEFAULT_TOTAL_S = 15 * 60
"""The time on the GPU machine `plan` lays the calls out for: all calls, start-ups and idle waits together
(`plan --total-s`)."""
MIN_WORK_S = 90
"""A second call on call 1's machine is worth sending when this much is left after its setup (a probe and the CUDA
constants with the time model's rates)."""
WARM_MARGIN_S = 30
"""Between call 1's end and call 2's start on its machine: the reply, the output's transfer, the next command's send."""
DEFAULT_IDLE_S = 30
"""A GPU machine that shuts down after this long idle (`plan --idle-s`) gets its next call at once, or starts again."""
SETUP_S = 150
"""Venv, installs from the carry folder, the native core, DeepSpeed's async_io and cpu_adam built with nvcc."""
RUNS = "memascend,stock,tuned"
"""The engines, the most wanted first: when the disk is slower than the time model hoped, the last is left out."""


@dataclass(frozen=True)
class Call:
    number: int
    title: str
    args: tuple[str, ...]
    """`gpu_check.py run` options this call stands for."""
    work_s: int
    """Estimated seconds after setup (the kit skips what does not fit its budget, with the reason)."""
    budget_s: float = DEFAULT_BUDGET_S
    outputs: tuple[str, ...] = ("log", "gpu_check.log", "gpu_check.json")
    """At most 8 files, in the output folder."""

    def estimate_s(self, start_s: float = DEFAULT_START_S) -> int:
        """Time of the call on a fresh GPU machine, its start included."""
        return int(start_s + min(self.budget_s, SETUP_S + self.work_s))

    @property
    def timeout_s(self) -> int:
        """The command's timeout on the GPU machine: the kit's own budget plus a margin for its final writes."""
        return min(COMMAND_LIMIT_S, int(self.budget_s) + 60)

    def command(self, budget_s: int | None = None) -> str:
        """The call's command (run in the repo root with OUT set to the output folder; the log is written there even
        when the kit fails); `budget_s`: the kit stops itself then instead of at its own budget."""
        budget = "" if budget_s is None else f" --budget-s {budget_s}"
        return (f"set -o pipefail; PYTHONUNBUFFERED=1 bash scripts/gpu_check.sh call {self.number}{budget} 2>&1 | "
                "tee $OUT/log")


CLIP_OFF = ("--gradient-clipping", "0")
"""Random weights' gradient norms (5-10 on the H100 and H200 calls of 2026-11-26/27) are over any clipping a real
model's would pass, and a clipped step makes memascend's overlapped optimizer redo it: off, so the overlap commits
(the calls say so, and the recorded runs carry gradient_clipping in their config)."""

CALLS = (
    # The most valuable first: the capacity bars have never been measured on a GPU, and both come out of one call;
    # the time model's GPU runs are recorded on two models and two GPUs (docs/bench/gpu/) and lack only the
    # per-resource rates, which the next call measures first thing.
    Call(1, f"setup + probe + capacity under a DRAM cap of {CAPACITY_DRAM_CAP} (a memory cgroup, checked first): "
            f"{CAPACITY_MODEL}, tuned's longest context (bench --capacity seq), then memascend at "
            f"{MEMASCEND_PROBE_FACTOR}x it (random weights, clipping off, {CAPACITY_STEPS} steps a probe)",
         ("--phases", "setup,probe,capacity", "--models", CAPACITY_MODEL, "--dram-cap", CAPACITY_DRAM_CAP),
         work_s=30 + 4 * 80, budget_s=480.0,  # ~80 s a probe of a 360M model at tens of thousands of tokens
         outputs=("log", "gpu_check.log", "gpu_check.json", "gpu_capacity.json")),
    Call(2, "setup + probe + CUDA constants and the time model's rates (host<->device copies, CPU Adam on this "
            "box's cores, the global-norm barrier) + bench qwen2.5-0.5b (memascend, tuned; random weights, clipping "
            "off, seq 2048, 3 steps; the SSD sampled per phase: the parameter fetches' rate and queue depth)",
         ("--phases", "setup,probe,constants,bench", "--models", "qwen2.5-0.5b", "--runs", "memascend,tuned",
          "--seq-len", "2048", "--steps", "3", *CLIP_OFF),
         work_s=40 + 25 + 2 * 94,  # bench runs of 85-94 s on an H200 (2026-11-26); the rates ~25 s
         outputs=("log", "gpu_check.log", "gpu_check.json", "cuda_constants.json", "gpu_bench.json", "gpu_bench.png",
                  "bench_qwen2.5-0.5b.png")),
    Call(3, "setup + probe + placement sweep " + " then ".join(PLACEMENT_MODELS) + " (bench --placement: "
            + ", ".join(f"{p} {r}" for p, r in PLACEMENT_SWEEP) + f"; random weights, clipping off, seq 2048, "
            f"{PLACEMENT_STEPS} steps; the second preset when time is left)",
         ("--phases", "setup,probe,placements", "--models", ",".join(PLACEMENT_MODELS), "--seq-len", "2048"),
         work_s=30 + 7 * 45 + 2 * 31 + 2 * 62,  # start-up ~45 s a run, the SSD's share (estimate_run_s, 2 GB/s)
         outputs=("log", "gpu_check.log", "gpu_check.json", "gpu_placements.json")),
    Call(4, "setup + probe + bench llama-3.2-1b (memascend, tuned; 3 steps, clipping off: the overlapped optimizer "
            "commits instead of redoing every step; the SSD sampled per phase)",
         # At DeepSpeed's default clipping (1.0) random weights' gradient norms (5-10) made every speculated step a
         # redo in the H100 call of 2026-11-26 (memascend x0.83 of tuned there, from the pipelined optimizer alone);
         # at clipping 10 the H200 call of 2026-11-27 measured norms 10.48-10.62 at seq 2048, still a redo (x0.82).
         ("--phases", "setup,probe,bench", "--models", "llama-3.2-1b", "--runs", "memascend,tuned", "--seq-len",
          "2048", "--steps", "3", *CLIP_OFF),
         work_s=20 + 2 * 170,  # 2-step runs of 97-127 s on an H100 (2026-11-26), ~25 s per further step
         outputs=("log", "gpu_check.log", "gpu_check.json", "gpu_bench.json", "gpu_bench.png",
                  "bench_llama-3.2-1b.png")),
    Call(5, "setup + probe + pytest -m gpu",
         ("--phases", "setup,probe,tests", "--tests-cap-s", "180"), work_s=30 + 180, budget_s=330.0,
         outputs=("log", "gpu_check.log", "gpu_check.json", "pytest_gpu.xml")),
    Call(6, "setup + probe + CUDA constants + bench llama-3.2-1b (2 steps) + its GPU bench test",
         # tuned before stock: stock as its docs configure it fails at step 2 beyond 1e9 parameters (planner/
         # param_buffers.py; H200, 2026-11-26), and only two runs fitted the call's time then.
         ("--phases", "setup,probe,constants,bench,validate", "--models", "llama-3.2-1b", "--runs",
          "memascend,tuned,stock", "--seq-len", "2048", "--steps", "2"),
         work_s=40 + 3 * 140 + 30,
         outputs=("log", "gpu_check.log", "gpu_check.json", "cuda_constants.json", "gpu_bench.json", "gpu_bench.png",
                  "bench_llama-3.2-1b.png")),
    Call(7, "setup + probe + CUDA constants + context sweep qwen2.5-0.5b ("
         + ", ".join(f"{s // 1024}K" for s in SWEEP_SEQ_LENS)
         + ") per engine until it fails or the time ends, next to the plan's largest context",
         ("--phases", "setup,probe,constants,sweep", "--models", "qwen2.5-0.5b", "--runs", RUNS,
          "--sweep-seq-lens", ",".join(map(str, SWEEP_SEQ_LENS))),
         work_s=30 + 3 * len(SWEEP_SEQ_LENS) * 120,
         outputs=("log", "gpu_check.log", "gpu_check.json", "cuda_constants.json", "gpu_sweep.json")),
)


def call_by_number(n: int) -> Call | None:
    return next((c for c in CALLS if c.number == n), None)


def plan_text(total_s: float = DEFAULT_TOTAL_S, start_s: float = DEFAULT_START_S,
              idle_s: float = DEFAULT_IDLE_S) -> str:
    """What `bash scripts/gpu_check.sh plan` prints: each call's command, timeout and time, and how the calls fit
    `total_s` on the GPU machine. Pure."""
    lines = ["GPU kit: the calls, in order. Each is one command on the GPU machine, run in the repo root with OUT set "
             "to an output folder; it does its own setup. Build the carry folder first (`bash scripts/gpu_check.sh "
             f"carry`) and copy {', '.join(CARRY)} there with the working tree.", ""]
    for c in CALLS:
        cmd = c.command()
        assert len(cmd) <= COMMAND_LIMIT_CHARS, f"call {c.number}: command of {len(cmd)} characters"
        lines += [f"call {c.number}: {c.title}",
                  f"  command: {cmd}",
                  f"  needs: the working tree and {', '.join(CARRY)}; timeout {c.timeout_s} s",
                  f"  ~{c.estimate_s(start_s) / 60:.1f} min on a fresh machine (start ~{start_s:.0f} s, setup "
                  f"~{SETUP_S} s, then ~{c.work_s} s; the kit stops itself at {c.budget_s:.0f} s, `--budget-s` to "
                  "change)",
                  f"  stands for: bash scripts/gpu_check.sh run {' '.join(c.args)}",
                  f"  leaves in $OUT: {', '.join(c.outputs)}", ""]
    second, budget = second_call(), second_budget_s(total_s, start_s)
    if budget >= SETUP_S + MIN_WORK_S:
        lines.append(f"Within {total_s / 60:.0f} minutes on the GPU machine: call 1, then call {second.number} at once "
                     f"on the same machine (sent within {idle_s:.0f} s of call 1's end, no second start), stopping "
                     f"itself at what is left, {budget} s: {second.command(budget)} (timeout {budget + 60} s); "
                     f"~{warm_pair_s(start_s, budget) / 60:.1f} min in all.")
    else:
        lines.append(f"Call 1 leaves {budget} s of {total_s / 60:.0f} minutes on its machine, less than call "
                     f"{second.number}'s setup and a phase: run each on a fresh machine.")
    rest = [c for c in CALLS if c.number not in (1, second_call().number)]
    lines.append("Then " + ", ".join(f"call {c.number} (~{c.estimate_s(start_s) / 60:.1f} min)" for c in rest)
                 + ", each on a machine of its own. Last, `bash scripts/gpu_check.sh record` the output folders, in "
                 "call order.")
    return "\n".join(lines)


def second_call() -> Call:
    """The call that follows call 1 on the same machine: the time model's rates and bench (call 2)."""
    return call_by_number(2)


def second_budget_s(total_s: float = DEFAULT_TOTAL_S, start_s: float = DEFAULT_START_S) -> int:
    """What the second call may take on call 1's machine: `total_s` less the start, call 1 at its whole budget plus
    the writes after it, and WARM_MARGIN_S. Pure."""
    return int(total_s - start_s - CALLS[0].timeout_s - WARM_MARGIN_S)


def warm_pair_s(start_s: float = DEFAULT_START_S, second_budget: int | None = None) -> int:
    """Time of call 1 and second_call() on one machine: one start, each call its own setup; the second stops itself
    at `second_budget` when given. Pure."""
    second = second_call()
    cap = second.budget_s if second_budget is None else second_budget
    first = min(int(CALLS[0].budget_s), SETUP_S + CALLS[0].work_s)
    return int(start_s + first + min(int(cap), SETUP_S + second.work_s))
