"""The kit as device calls that fit: each call is self-contained (the machine starts bare, so every call does its
own setup), ends by itself within 9 minutes, and leaves its JSON and log in $OUT even when it fails. Calls 1-3
fit one session's 30 minutes of device time with the machine's start-ups; call 4 needs a session of its own."""

from __future__ import annotations

from dataclasses import dataclass

from gpukit.pure import DEFAULT_BUDGET_S, SWEEP_SEQ_LENS

CARRY = (".gpu_carry",)
"""The device call's carry list (everything else travels as the working tree)."""
COMMAND_LIMIT_CHARS = 2000
"""The device tool's `command` argument is at most this long."""
START_S = 90
"""A bare machine's start before the command runs (device tool: a minute or more)."""
DEVICE_BUDGET_S = 15 * 60
"""Device time a task is lent, all calls, starts and idle waits together (the device tool, 2026-11: 15 minutes)."""
WARM_IDLE_S = 30
"""A warm machine goes back after this long idle: the next call must be sent at once to skip a start."""
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

    @property
    def estimate_s(self) -> int:
        """Device time of the call, start included."""
        return int(START_S + min(self.budget_s, SETUP_S + self.work_s))

    @property
    def timeout_s(self) -> int:
        """The device call's timeout_s: the kit's own budget plus a margin for its final writes."""
        return min(600, int(self.budget_s) + 60)

    def command(self) -> str:
        """The device call's `command` (run in the repo root; the log comes back even when the kit fails)."""
        return f"set -o pipefail; PYTHONUNBUFFERED=1 bash scripts/gpu_check.sh call {self.number} 2>&1 | tee $OUT/log"


CALLS = (
    Call(1, "setup + probe + CUDA constants + bench qwen2.5-0.5b (stock, tuned, memascend; random weights, seq 2048, "
            "3 steps)",
         ("--phases", "setup,probe,constants,bench", "--models", "qwen2.5-0.5b", "--runs", RUNS, "--seq-len", "2048",
          "--steps", "3"),
         work_s=40 + 3 * 94,  # bench runs of 85-94 s on an H200 (2026-11-26)
         outputs=("log", "gpu_check.log", "gpu_check.json", "cuda_constants.json", "gpu_bench.json", "gpu_bench.png",
                  "bench_qwen2.5-0.5b.png")),
    Call(2, "setup + probe + pytest -m gpu",
         ("--phases", "setup,probe,tests", "--tests-cap-s", "180"), work_s=30 + 180, budget_s=330.0,
         outputs=("log", "gpu_check.log", "gpu_check.json", "pytest_gpu.xml")),
    Call(3, "setup + probe + CUDA constants + bench llama-3.2-1b (2 steps) + its GPU bench test",
         # tuned before stock: stock as its docs configure it fails at step 2 beyond 1e9 parameters (planner/
         # param_buffers.py; H200, 2026-11-26), and only two runs fitted the call's time then.
         ("--phases", "setup,probe,constants,bench,validate", "--models", "llama-3.2-1b", "--runs",
          "memascend,tuned,stock", "--seq-len", "2048", "--steps", "2"),
         work_s=40 + 3 * 140 + 30,
         outputs=("log", "gpu_check.log", "gpu_check.json", "cuda_constants.json", "gpu_bench.json", "gpu_bench.png",
                  "bench_llama-3.2-1b.png")),
    Call(4, "setup + probe + CUDA constants + context sweep qwen2.5-0.5b ("
         + ", ".join(f"{s // 1024}K" for s in SWEEP_SEQ_LENS)
         + ") per engine until it fails or the time ends, next to the plan's largest context",
         ("--phases", "setup,probe,constants,sweep", "--models", "qwen2.5-0.5b", "--runs", RUNS,
          "--sweep-seq-lens", ",".join(map(str, SWEEP_SEQ_LENS))),
         work_s=30 + 3 * len(SWEEP_SEQ_LENS) * 120,
         outputs=("log", "gpu_check.log", "gpu_check.json", "cuda_constants.json", "gpu_sweep.json")),
    Call(5, "setup + probe + bench llama-3.2-1b (memascend, tuned; 3 steps, gradient clipping 100: the overlapped "
            "optimizer commits instead of redoing every step)",
         # At DeepSpeed's default clipping (1.0) random weights' gradient norms (5-10) made every speculated step a
         # redo in the H100 call of 2026-11-26 (memascend x0.83 of tuned there, from the pipelined optimizer alone);
         # at clipping 10 the H200 call of 2026-11-27 measured norms 10.48-10.62 at seq 2048, still a redo (x0.82).
         ("--phases", "setup,probe,bench", "--models", "llama-3.2-1b", "--runs", "memascend,tuned", "--seq-len",
          "2048", "--steps", "3", "--gradient-clipping", "100"),
         work_s=20 + 2 * 170,  # 2-step runs of 97-127 s on an H100 (2026-11-26), ~25 s per further step
         outputs=("log", "gpu_check.log", "gpu_check.json", "gpu_bench.json", "gpu_bench.png",
                  "bench_llama-3.2-1b.png")),
)


def call_by_number(n: int) -> Call | None:
    return next((c for c in CALLS if c.number == n), None)


def plan_text() -> str:
    """What `bash scripts/gpu_check.sh plan` prints: each call's device-tool arguments and time. Pure."""
    lines = ["GPU kit: device calls, in order (each starts bare and does its own setup; build the carry folder first "
             "with `bash scripts/gpu_check.sh carry`)", ""]
    total = 0
    for c in CALLS:
        cmd = c.command()
        assert len(cmd) <= COMMAND_LIMIT_CHARS, f"call {c.number}: command of {len(cmd)} characters"
        if c.number <= 3:
            total += c.estimate_s
        lines += [f"call {c.number}: {c.title}",
                  f"  run(command={cmd!r}, carry={list(CARRY)!r}, timeout_s={c.timeout_s})",
                  f"  ~{c.estimate_s / 60:.1f} min of device time (start ~{START_S} s, setup ~{SETUP_S} s, then "
                  f"~{c.work_s} s, the kit stops itself at {c.budget_s:.0f} s)",
                  f"  stands for: bash scripts/gpu_check.sh run {' '.join(c.args)}",
                  f"  brings back from $OUT: {', '.join(c.outputs)}", ""]
    lines.append(f"calls 1-3: ~{total / 60:.1f} min of device time, more than the {DEVICE_BUDGET_S // 60} minutes "
                 f"a task is lent: send call 1, then call {second_call().number} at once on the warm machine (it goes "
                 f"back after {WARM_IDLE_S} s idle; no second start): ~{warm_pair_s() / 60:.1f} min (measured "
                 "2026-11-26 on an H200: 367 s + 215 s + the start). Then `bash scripts/gpu_check.sh record` the "
                 "folders they returned. "
                 "Calls 3, 4 and 5 in later sessions (calls 1-3 ran on H200s and an H100 on 2026-11-26, call 5 at "
                 "clipping 10 and call 2 on an H200 on 2026-11-27: call 5 first, then call 4).")
    return "\n".join(lines)


def second_call() -> Call:
    """The call that follows call 1 on the warm machine within DEVICE_BUDGET_S: the GPU tests (call 2)."""
    return call_by_number(2)


def warm_pair_s() -> int:
    """Device time of call 1 and second_call() on one machine: one start, each call its own setup. Pure."""
    return START_S + sum(min(int(c.budget_s), SETUP_S + c.work_s) for c in (CALLS[0], second_call()))
