"""`memascend launch`: run the user's own DeepSpeed program, unmodified, with the memascend engine in every rank.

Thin: check the region (prepared, not held by another job) and the engine -> the program's environment with the
start-up hook (memascend_cli/run/anyprogram.py) -> run it in its own session, forwarding stop signals, with a progress
line per step and the plan of the job DeepSpeed sized (memascend_cli/run/launch_progress.py) -> one line per rank that
says whether the engine engaged (and why not, or where the program failed first), its steps and its peak against the
plan. Exit codes: the program's own status, 75 when a signal stopped it (errors.EXIT_STOPPED), 2 bad input.
"""

from __future__ import annotations

import os

import typer

from memascend_cli.errors import EXIT_STOPPED, BadInput


def launch_command(
    command: list[str] = typer.Argument(..., metavar="COMMAND...", help="The program and its arguments, after "
                                        "`--`: deepspeed train.py ..., accelerate launch train.py ..., python "
                                        "train.py ..., llamafactory-cli train recipe.yaml.", show_default=False),
    region: str = typer.Option(None, "--region", help="SSD region made by `memascend prepare-ssd` (file or device) "
                               "with a rank sub-region per local rank. Without it the engine runs without Direct "
                               "NVMe (DeepSpeed's swap files under the config's nvme_path).", show_default=False),
    model: str = typer.Option(None, "--model", help="Preset name or Hugging Face model directory of the model the "
                              "program trains: sizes the engine's parameter pool (without it: DeepSpeed's "
                              "buffer_count x buffer_size, still exact-size) and the plan line (without it: the "
                              "model's own Hugging Face config).", show_default=False),
    placement: str = typer.Option("auto", "--placement", metavar="auto|dram|region", help="A ZeRO-3 config's own "
                                  "CPU offload (or none): auto keeps it where this machine's DRAM (or its cgroup's "
                                  "limit) holds stock DeepSpeed's placement and moves it to the region where not; "
                                  "dram keeps it; region moves it. A line per rank says which and why."),
    run_dir: str = typer.Option(None, "--run-dir", help="Keep the per-process engine records (status/PID.json) "
                                "here [default: a temporary folder, removed at the end].", show_default=False),
    stop_grace_s: float = typer.Option(None, "--stop-grace", metavar="SECONDS", help="After the first SIGTERM, SIGHUP "
                                       "or Ctrl-C is passed on, kill the program's processes if they still run "
                                       "after this long [default: 25, as train].", min=0.0, show_default=False),
) -> None:
    """Run your own DeepSpeed program with the memascend engine installed in every rank, without editing it.

    The program runs as it is; a start-up hook on PYTHONPATH installs the engine in each Python process at its
    first `deepspeed.zero.Init` or `deepspeed.initialize`, with the config the program passes (HF `"auto"` values
    and CPU offload under ZeRO-3 handled as `memascend_engine.install()` does: kept where the DRAM holds it, see
    --placement). Its output goes to this terminal.
    Ctrl-C, SIGTERM and SIGHUP go to all its processes (SIGHUP as SIGTERM; exit 75); a second signal, or
    --stop-grace, kills them. No process of the program outlives the command. While it trains, a line now and
    then gives the first rank's step, loss, s/step, host memory and SSD traffic, and once its first step ran, the
    plan's host memory for the job DeepSpeed sized (parameters, micro-batch, dtype, ZeRO settings, the sequence
    length of its batches). At the end one line per rank says whether the engine engaged (deepspeed.initialize
    returned with it) and what went through the region, or where the program failed before that (deepspeed.zero.Init,
    deepspeed.initialize), or why it never engaged (the program never called deepspeed.initialize, its config
    offloads nothing to NVMe, its Python cannot import memascend), and its steps and peak memory against the plan.

    Examples:

        memascend launch --region /dev/nvme1n1p3 -- deepspeed train.py --deepspeed ds_config.json

        memascend launch --region /mnt/nvme/region.bin -- accelerate launch --use_deepspeed train.py

        memascend launch --region /mnt/nvme/region.bin -- llamafactory-cli train recipe.yaml
    """
    import shutil
    import tempfile

    from memascend_cli.console import err
    from memascend_cli.run import anyprogram, launch_progress, leftovers, lifeline
    from memascend_cli.run.launch import DEFAULT_STOP_GRACE_S, StopPolicy
    from memascend_cli.run.prepared import require_engine

    from memascend_cli.planner.offload_choice import PLACEMENT_CHOICES

    if placement not in PLACEMENT_CHOICES:
        raise BadInput(f"unknown --placement {placement!r}", f"use one of {', '.join(PLACEMENT_CHOICES)}")
    if not command:
        raise BadInput("no command to run", "put the program after --: memascend launch --region R -- python train.py")
    if shutil.which(command[0]) is None:
        raise BadInput(f"command {command[0]!r} not found", "check the command after --, and that its environment "
                       "is active")
    if model is not None:
        from memascend_cli.models import load_model

        load_model(model)
    if region is not None:
        _check_region(region)
    else:
        err.print("note: no --region: the engine runs without Direct NVMe (DeepSpeed's swap files under the config's "
                  "nvme_path); prepare one with `memascend prepare-ssd`", highlight=False,
                  soft_wrap=True)
    require_engine()
    hook = anyprogram.hook_dir()
    keep = run_dir is not None
    run_dir = os.path.abspath(run_dir) if keep else tempfile.mkdtemp(prefix="memascend-launch-")
    status_dir = os.path.join(run_dir, anyprogram.STATUS_DIR)
    shutil.rmtree(status_dir, ignore_errors=True)  # an earlier launch's records
    os.makedirs(status_dir)
    env = anyprogram.build_env(dict(os.environ), hook=hook, status_dir=status_dir,
                               region=os.path.abspath(region) if region else None, model=model,
                               lifeline_token=lifeline.token(), placement=placement)
    note = leftovers.sweep().note()
    if note:
        err.print(f"note: {note}", highlight=False, soft_wrap=True)
    tags = {"ok": "[green]ok[/green]  ", "warn": "[yellow]warn[/yellow]", "error": "[red]fail[/red]",
            "plan": "[cyan]plan[/cyan]", "step": "[dim]step[/dim]"}

    def say(level: str, text: str) -> None:
        err.print(f"{tags[level]}  {text}", highlight=False, soft_wrap=True)

    progress = launch_progress.Progress(status_dir, model=model, say=say)
    try:
        code, stops = anyprogram.run_program(command, env, policy=StopPolicy(
            grace_s=DEFAULT_STOP_GRACE_S if stop_grace_s is None else stop_grace_s), on_tick=progress.tick)
        progress.tick(final=True)
        for level, text in anyprogram.summarize(anyprogram.read_records(status_dir)) + progress.closing():
            say(level, text)
    finally:
        leftovers.sweep()  # the program's DeepSpeed shared-memory segments and engine key folders
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    if stops:
        err.print(f"stopped ({', '.join(dict.fromkeys(stops))}); the program exited with status {code}",
                  highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_STOPPED)
    if code:
        err.print(f"the program exited with status {code}", highlight=False)
        raise typer.Exit(code)


def _check_region(path: str) -> None:
    """The region is prepared, on a local file system, and none of its rank sub-regions is held by another job."""
    from memascend_cli.console import err
    from memascend_cli.errors import SSDNotReady
    from memascend_cli.run.prepared import read_region
    from memascend_cli.ssd import region as region_mod
    from memascend_cli.units import fmt_bytes

    try:
        ranks = len(region_mod.read_header(path).ranks)
    except Exception:  # noqa: BLE001 - read_region below says what is wrong in one line
        ranks = 1
    header, error = read_region(path, ranks)
    if error is not None:
        raise SSDNotReady(error, "prepare one with `memascend prepare-ssd` (see --help)")
    n = len(header.ranks)
    err.print(f"region {path}: {n} rank sub-region(s) of {fmt_bytes(min(r.size_bytes for r in header.ranks))}, "
              f"for local rank{f's 0-{n - 1}' if n > 1 else ' 0'}", highlight=False, soft_wrap=True)
