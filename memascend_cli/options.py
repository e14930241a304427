"""The options `plan`, `bench` and `train` share, each declared once: one flag set, one help text, one default.

Each function takes the command's help panel and returns the typer.Option; the command's parameter annotation gives
the type (bench's --seq-len is a str, a comma list it sweeps). Every shared option's typer default is None, so a
command can tell "not given" from a value: the default a command then uses is the one the help names, from
memascend_cli.defaults, or the recipe's where a command runs a recipe. Where a command reads an option differently,
the one help text says how.
"""

from __future__ import annotations

import typer

from memascend_cli.bench.capacity import CAPACITY_STEPS
from memascend_cli.defaults import (
    DEFAULT_BENCH_MODEL,
    DEFAULT_BENCH_STEPS,
    DEFAULT_GRAD_ACCUM,
    DEFAULT_MICRO_BATCH,
    DEFAULT_PLAN_MODEL_CPU,
    DEFAULT_PLAN_MODEL_GPU,
    DEFAULT_PRECISION,
    DEFAULT_SEQ_LEN,
)


def model(panel: str):
    return typer.Option(
        None, "--model", "-m", help="Preset name (see `plan --list-models`), a Hugging Face model directory or a "
        ".gguf file; plan and bench also read a config.json or a model YAML, and bench trains random weights. "
        f"[default: the recipe's; plan without one: {DEFAULT_PLAN_MODEL_GPU} with a GPU, {DEFAULT_PLAN_MODEL_CPU} on "
        f"a CPU-only machine; bench: {DEFAULT_BENCH_MODEL}]", rich_help_panel=panel, show_default=False)


def seq_len(panel: str):
    return typer.Option(
        None, "--seq-len", "-s", help="Tokens per sequence; bench takes a comma list and sweeps it (e.g. "
        f"512,2048,8192). [default: the recipe's seq_len, else {DEFAULT_SEQ_LEN}]", rich_help_panel=panel,
        show_default=False)


def micro_batch(panel: str):
    return typer.Option(
        None, "--micro-batch", "-b", help="Sequences per rank per forward/backward. [default: the recipe's "
        f"micro_batch, else {DEFAULT_MICRO_BATCH}]", rich_help_panel=panel, show_default=False)


def grad_accum(panel: str):
    return typer.Option(
        None, "--grad-accum", help="Micro-batches per optimizer step (gradient accumulation); bench's s/step and "
        f"tokens/s count whole steps. [default: the recipe's grad_accum, else {DEFAULT_GRAD_ACCUM}]",
        rich_help_panel=panel, show_default=False)


def dtype(panel: str):
    return typer.Option(
        None, "--dtype", help=f"bf16, fp16 or fp32. [default: the recipe's precision, else {DEFAULT_PRECISION}]",
        rich_help_panel=panel, show_default=False)


def checkpointing(panel: str):
    # Two vocabularies: plan models every mode DeepSpeed and memascend have (offload is memascend's own); bench runs
    # one job on all engines, so it says on (full, which memascend offloads) or off.
    return typer.Option(
        None, "--checkpointing", help="Activation checkpointing. plan: none, selective, full, or offload (full, "
        "checkpoints in host DRAM) [default: offload, as `train` with gradient_checkpointing on]; bench: full "
        "(memascend offloads it) or none [default: full].", rich_help_panel=panel, show_default=False)


def host_budget(panel: str):
    return typer.Option(
        None, "--host-budget", help="memascend's pinned + staging memory per rank, e.g. 4GiB (parameter pool, "
        "optimizer pipeline, gradient and checkpoint windows). [default: what full overlap needs]",
        rich_help_panel=panel, show_default=False)


def ranks(panel: str):
    return typer.Option(
        None, "--ranks", help="Processes per node: plan models any number [default: one per GPU, 1 on CPU]; bench "
        "runs 1, or 2 CPU ranks launched with torchrun (gloo) [default: 1].", rich_help_panel=panel, show_default=False)


def cpu_gflops(panel: str):
    return typer.Option(
        None, "--cpu-gflops", help="CPU matmul GFLOP/s for a CPU-only job's predicted time. [default: this "
        "machine's matmul probe (`memascend inspect --cpu-probe`), cached; plan measures it once if it is not]",
        rich_help_panel=panel, show_default=False)


def dram_cap(panel: str):
    return typer.Option(
        None, "--dram-cap", help="A memory cgroup of this size, e.g. 6GiB: plan plans the node as a job in it "
        "sees it (the whole cap is the job's); train plans and preflights the same node and runs its ranks in one, "
        "bench each engine in its own (needs root); a run OOM-killed in it reads `does not fit` (train: exit 1).",
        rich_help_panel=panel, show_default=False)


def steps(panel: str):
    return typer.Option(
        None, "--steps", help="Optimizer steps per run. bench's s/step averages steps 2..N (step 1 also records "
        "the parameter trace and creates the Adam states). [default: the recipe's steps; bench: "
        f"{DEFAULT_BENCH_STEPS}, {CAPACITY_STEPS} with --capacity (the heap of stock and tuned can grow again in "
        "step 3)]",
        rich_help_panel=panel, show_default=False)


def region(panel: str):
    return typer.Option(
        None, "--region", help="A memascend SSD region prepared by `memascend prepare-ssd` (file or device). "
        "[default: the recipe's region; else train creates one in the run directory, bench one in OUT with "
        "prepare-ssd's checks and bandwidth probe (the time model's SSD rate)]", rich_help_panel=panel,
        show_default=False)


def resume(panel: str):
    return typer.Option(
        False, "--resume", help="Continue where an earlier, cut-off run stopped. train: from the newest complete "
        "checkpoint in the run directory (of a complete run: say so, exit 0); bench, with --capacity only: reuse the "
        "probes an earlier sitting left in --out (same job and cap, checked first; a probe without its bench.json "
        "runs again; each probe's `sitting` says when it ran).", rich_help_panel=panel)


def engine(panel: str):
    return typer.Option(
        "memascend", "--engine", help="memascend (the engine; params and optimizer in the SSD region), tuned (stock "
        "DeepSpeed ZeRO-Infinity given every knob memascend sets; swap files under the run directory) or stock "
        "(DeepSpeed as its docs configure it): train runs it; plan's exit code is its verdict.",
        rich_help_panel=panel)


def as_json(panel: str):
    return typer.Option(
        False, "--json", help="Print JSON instead of the tables: plan's document (schema: docs/plan-json.md), "
        "bench's summary (bench.json).", rich_help_panel=panel)


def placement(panel: str):
    return typer.Option(
        None, "--placement", help="Where the job's states live: gpu (ZeRO-3, no "
        "offload), dram (ZeRO-Offload, device cpu; memascend: parameters where ZeRO-Offload keeps them, optimizer "
        "states in its DRAM tier), split (nvme with max_in_cpu; "
        "memascend: its DRAM tier + the region) or ssd (all on the SSD). train runs it, a placement that does not fit "
        "refused with what binds [default: the plan's fastest placement that fits for --engine]; bench runs every "
        "engine with it [default: ssd, the engines compared on the SSD; --placements sweeps them]; plan shows its "
        "detail tables [default: ssd].", rich_help_panel=panel, show_default=False)
