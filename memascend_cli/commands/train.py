"""`memascend train`: plan, preflight, write the DeepSpeed config, launch, watch.

Thin: recipe (+ overrides) -> planner gate -> preflight -> ds_config.json + recipe.json in the run
directory -> `--dry-run` prints them and the launch command -> else DeepSpeed's launcher runs
`memascend_engine.train_worker` on every rank while a live display tails metrics.jsonl.
Exit codes: 0 done (or stopped by Ctrl-C), 1 does not fit / a rank failed, 2 bad input, 75 stopped by SIGTERM, SIGHUP
or --stop-after with a complete checkpoint (errors.EXIT_STOPPED).
"""

from __future__ import annotations

import os

import typer

from memascend_cli import options
from memascend_cli.errors import BadInput, MemascendError, PlanInfeasible
from memascend_cli.planner.zero import ENGINES
from memascend_cli.units import fmt_bytes

_R = "Recipe overrides"
_M = "Mode"


def train_command(
    recipe_path: str = typer.Argument(..., metavar="RECIPE", help="Recipe YAML (see presets/train/) or a shipped "
                                      "preset name such as tiny-cpu.", show_default=False),
    dry_run: bool = typer.Option(False, "--dry-run", help="Write and print the DeepSpeed config and the exact launch "
                                 "command; start nothing.", rich_help_panel=_M),
    engine: str = options.engine(_M),
    resume: bool = options.resume(_M),
    force: bool = typer.Option(False, "--force", help="Launch even when the planner or the DRAM/memlock preflight "
                               "says it does not fit.", rich_help_panel=_M),
    dram_cap: str = options.dram_cap(_M),
    placement: str = options.placement(_M),
    output_dir: str = typer.Option(None, "--output-dir", "-o", help="Run directory (recipe key output_dir); the "
                                   "final model goes to its export/ folder, or into it for a LLaMA-Factory recipe.",
                                   rich_help_panel=_R, show_default=False),
    steps: int = options.steps(_R),
    seq_len: int = options.seq_len(_R),
    micro_batch: int = options.micro_batch(_R),
    lr: float = typer.Option(None, "--lr", help="Peak learning rate.", rich_help_panel=_R, show_default=False),
    model: str = options.model(_R),
    region: str = options.region(_R),
    set_: list[str] = typer.Option(None, "--set", help="Any recipe key: --set dataset.packing=false --set "
                                   "schedule.warmup_steps=10 (repeatable).", rich_help_panel=_R, show_default=False),
    stop_after: str = typer.Option(None, "--stop-after", metavar="TIME", help="Stop cleanly (checkpoint, exit 75) "
                                   "this long after the start: 3h50m, 90m, 600s.", rich_help_panel=_M,
                                   show_default=False),
    stop_grace: str = typer.Option(None, "--stop-grace", metavar="TIME", help="After a stop request (SIGTERM, SIGHUP, "
                                   "Ctrl-C, --stop-after), stop at once if the step and its checkpoint take longer "
                                   "[default: 25s, inside Slurm's 30 s KillWait].", rich_help_panel=_M,
                                   show_default=False),
) -> None:
    """Fine-tune a model with params and optimizer states on an SSD, using the plan's DeepSpeed config.

    Runs the planner (refuses a job that does not fit unless --force), picks the placement (the plan's
    fastest that fits, or --placement), checks the machine, writes
    `ds_config.json` and `recipe.json` into the run directory and launches DeepSpeed's own
    launcher (one process per GPU; CPU ranks over gloo without a GPU). Ctrl-C, SIGTERM, SIGHUP and
    --stop-after stop after the current step with a checkpoint (exit 75, or 0 for Ctrl-C); a second
    signal or --stop-grace stops at once; `--resume` continues from the newest complete checkpoint.
    No process of the job outlives the command. The final model, a Hugging Face folder, goes to
    RUN/export, or into RUN itself for a LLaMA-Factory recipe (where LLaMA-Factory writes it).

    Examples:

        memascend train presets/train/tiny-cpu.yaml --engine tuned

        memascend train tiny-cpu --steps 40 --output-dir runs/try2

        memascend train recipe.yaml --dry-run

        memascend train recipe.yaml --resume

        memascend train recipe.yaml --dram-cap 6GiB

        memascend train recipe.yaml --engine tuned --placement dram
    """
    import time

    from memascend_cli.console import err
    from memascend_cli.run.launch import DEFAULT_STOP_GRACE_S, StopPolicy
    from memascend_cli.run.prepared import prepare_run
    from memascend_cli.run.recipe import load_recipe_noting, merge, parse_set
    from memascend_cli.units import parse_size

    started = time.monotonic()
    policy = StopPolicy(grace_s=parse_duration_s(stop_grace, "--stop-grace") if stop_grace else DEFAULT_STOP_GRACE_S,
                        stop_at=started + parse_duration_s(stop_after, "--stop-after") if stop_after else None)
    dram_cap_bytes = parse_size(dram_cap, "--dram-cap") if dram_cap else None
    if dram_cap_bytes is not None:
        from memascend_cli.run.cgroup import check_available

        check_available()
    if engine not in ENGINES:
        raise BadInput(f"unknown engine {engine!r}", "use --engine " + ", ".join(ENGINES))
    overrides = parse_set(set_ or [])
    flags = {"output_dir": output_dir, "steps": steps, "seq_len": seq_len, "micro_batch": micro_batch, "lr": lr,
             "model": model, "region": region}
    overrides = merge(overrides, {k: v for k, v in flags.items() if v is not None})
    recipe = load_recipe_noting(recipe_path, overrides)
    prepared = prepare_run(recipe, engine=engine, resume=resume, force=force, dry_run=dry_run,
                           dram_cap_bytes=dram_cap_bytes, placement=placement)
    if prepared.finished:  # --resume of a run with nothing left to do
        err.print(prepared.finished, highlight=False, soft_wrap=True)
        return
    from memascend_cli.run.train_placement import line

    err.print(line(prepared.placement), highlight=False, soft_wrap=True)
    if dry_run:
        from memascend_cli.console import print_json

        print_json(prepared.dry_run_document())
        err.print(f"dry run: wrote {prepared.spec.ds_config_path}; nothing was started")
        return
    code = launch_and_watch(prepared, policy)
    if code:
        raise typer.Exit(code)


def parse_duration_s(text: str, what: str) -> float:
    """Seconds in `3h50m`, `90m`, `600s`, `1h`, `45` (seconds). Pure."""
    import re

    m = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or m is None or not any(m.groups()):
        raise BadInput(f"{what} {text!r} is not a duration", "write it like 3h50m, 90m, 600s or 45")
    h, mi, sec = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mi * 60 + sec


# --- launching ----------------------------------------------------------------------------------


def launch_and_watch(p, policy=None) -> int:
    """Create the region file if the plan asked for one, launch the ranks and show them until they end; the exit
    code (0, or EXIT_STOPPED)."""
    from memascend_cli.console import err
    from memascend_cli.run.launch import run_launch
    from memascend_cli.run.live import LiveView
    from memascend_cli.run.prepared import require_engine
    from memascend_cli.run.rundir import METRICS
    from memascend_cli.ssd.prepare import create_region_file

    if p.engine == "memascend":
        require_engine()
    if p.region_note is not None:
        with err.status(f"creating the region file {p.region_note['create']}"):
            create_region_file(p.region_note["create"], p.region_note["size_bytes"], ranks=p.region_note["ranks"],
                               label="memascend train")
    metrics_path = os.path.join(p.run_dir, METRICS)
    view = LiveView(metrics_path, start_offset=os.path.getsize(metrics_path) if os.path.exists(metrics_path) else 0,
                    log_every=p.log_every)
    what = "memascend engine" if p.engine == "memascend" else f"{p.engine} stock DeepSpeed"
    # soft_wrap: one line in a log too (the path to copy whole; the output's timing starts at it).
    err.print(f"launching {p.spec.num_ranks} rank(s) ({what}); logs in {p.spec.log_dir}", highlight=False,
              soft_wrap=True)
    if p.dram_cap_bytes is None:
        try:
            with view:
                return run_launch(p.spec, on_poll=view.poll, policy=policy)
        finally:
            view.summary()
    from memascend_cli.run.cgroup import MemoryCap

    with MemoryCap(p.dram_cap_bytes, label="train") as cap:
        try:
            with view:
                code = run_launch(p.spec, on_poll=view.poll, policy=policy, preexec_fn=cap.join)
        except MemascendError:
            view.summary()  # the records up to the kill
            # Where the kernel counts no OOM kills, a failed run that reached the cap counts as one.
            result = cap.result(sigkilled=True)
            if result.oom_killed:
                raise PlanInfeasible(f"does not fit: OOM-killed {oom_point(view.latest, p.log_every)} under "
                                     f"--dram-cap {fmt_bytes(p.dram_cap_bytes)}",
                                     f"its memory cgroup peaked at {_peak(result)}; give it more DRAM or lower "
                                     f"seq_len / micro_batch (`memascend plan` estimates the need); logs in "
                                     f"{p.spec.log_dir}") from None
            raise
        finally:
            view.summary()
        result = cap.result()
    err.print(f"--dram-cap {fmt_bytes(p.dram_cap_bytes)}: the run's memory cgroup peaked at {_peak(result)} (its "
              "processes' memory plus the page cache charged to them)"
              + ("" if cap.swap_limited else "; swap was not limited (the kernel does not account it)"),
              highlight=False)
    return code


def _peak(result) -> str:
    return "an unknown amount (the kernel keeps no peak)" if result.peak_bytes is None else fmt_bytes(result.peak_bytes)


def oom_point(latest: dict | None, log_every: int) -> str:
    """Where a run stood when it was killed, from the last metrics.jsonl record of this launch: "at step k (phase)".
    Records follow what they report: a step's after its optimizer step, a checkpoint's after the save."""
    if latest is None:
        return "before step 1 (setup: building the model, DeepSpeed initialize)"
    kind, step, total = latest.get("event"), latest.get("step", 0), latest.get("total_steps")
    if kind == "phase":  # what rank 0 started last (engine/train_worker.py Run.phase)
        phase = latest["phase"]
        return f"after step {step} ({phase})" if "step" in latest else f"before step 1 (setup: {phase})"
    if kind in ("export", "done", "stopped"):
        return f"after step {step} (finishing)"
    if total is not None and step >= total:
        return f"after the last step, {step} (final checkpoint, validation or export)"
    if kind == "step" and log_every > 1:
        return f"at step {step + 1} to {step + log_every} (training; steps are logged every {log_every})"
    return f"at step {step + 1} (training)"
