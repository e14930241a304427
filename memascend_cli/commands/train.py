"""`memascend train`: plan, preflight, write the DeepSpeed config, launch, watch.

Thin: recipe (+ overrides) -> planner gate -> preflight -> ds_config.json + recipe.json in the run
directory -> `--dry-run` prints them and the launch command -> else DeepSpeed's launcher runs
`memascend_engine.train_worker` on every rank while a live display tails metrics.jsonl.
Exit codes: 0 done (or stopped cleanly), 1 does not fit / a rank failed, 2 bad input.
"""

from __future__ import annotations

import json
import os

import typer

from memascend_cli.errors import BadInput, MemascendError, PlanInfeasible, SSDNotReady
from memascend_cli.rundir import CHECKPOINTS, COMPLETE, REGION_FILE, SWAP_DIR
from memascend_cli.units import GiB, MiB

_R = "Recipe overrides"
_M = "Mode"

REGION_HEADROOM = 1.25
"""A created region file is the plan's SSD bytes x this, for extents lost to alignment and holes."""


def train_command(
    recipe_path: str = typer.Argument(..., metavar="RECIPE", help="Recipe YAML (see presets/train/) or a shipped "
                                      "preset name such as tiny-cpu.", show_default=False),
    dry_run: bool = typer.Option(False, "--dry-run", help="Write and print the DeepSpeed config and the exact launch "
                                 "command; start nothing.", rich_help_panel=_M),
    baseline: bool = typer.Option(False, "--baseline", help="Run on stock DeepSpeed ZeRO-Infinity (swap files under "
                                  "the run directory) for comparison.", rich_help_panel=_M),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest complete checkpoint in the run "
                                "directory.", rich_help_panel=_M),
    force: bool = typer.Option(False, "--force", help="Launch even when the planner or the DRAM/memlock preflight "
                               "says it does not fit.", rich_help_panel=_M),
    output_dir: str = typer.Option(None, "--output-dir", "-o", help="Run directory (recipe key output_dir).",
                                   rich_help_panel=_R, show_default=False),
    steps: int = typer.Option(None, "--steps", help="Optimizer steps (recipe key steps).", rich_help_panel=_R,
                              show_default=False),
    seq_len: int = typer.Option(None, "--seq-len", help="Tokens per sequence.", rich_help_panel=_R, show_default=False),
    micro_batch: int = typer.Option(None, "--micro-batch", help="Sequences per rank per step.", rich_help_panel=_R,
                                    show_default=False),
    lr: float = typer.Option(None, "--lr", help="Peak learning rate.", rich_help_panel=_R, show_default=False),
    model: str = typer.Option(None, "--model", help="Preset name or Hugging Face model directory.", rich_help_panel=_R,
                              show_default=False),
    region: str = typer.Option(None, "--region", help="Prepared SSD region (file or device).", rich_help_panel=_R,
                               show_default=False),
    set_: list[str] = typer.Option(None, "--set", help="Any recipe key: --set dataset.packing=false --set "
                                   "schedule.warmup_steps=10 (repeatable).", rich_help_panel=_R, show_default=False),
) -> None:
    """Fine-tune a model with params and optimizer states on an SSD, using the plan's DeepSpeed config.

    Runs the planner (refuses a job that does not fit unless --force), checks the machine, writes
    `ds_config.json` and `recipe.json` into the run directory and launches DeepSpeed's own
    launcher (one process per GPU; CPU ranks over gloo without a GPU). Ctrl-C stops after the
    current step with a checkpoint; `--resume` continues from it.

    Examples:

        memascend train presets/train/tiny-cpu.yaml --baseline

        memascend train tiny-cpu --steps 40 --output-dir runs/try2

        memascend train recipe.yaml --dry-run

        memascend train recipe.yaml --resume
    """
    from memascend_cli.recipe import load_recipe, merge, parse_set

    overrides = parse_set(set_ or [])
    flags = {"output_dir": output_dir, "steps": steps, "seq_len": seq_len, "micro_batch": micro_batch, "lr": lr,
             "model": model, "region": region}
    overrides = merge(overrides, {k: v for k, v in flags.items() if v is not None})
    notes: list[str] = []
    recipe = load_recipe(recipe_path, overrides, notes=notes)
    if notes:
        from memascend_cli.console import err

        for note in notes:
            err.print(f"[dim]note: {note}[/dim]", highlight=False)
    prepared = prepare_run(recipe, baseline=baseline, resume=resume, force=force, dry_run=dry_run)
    if dry_run:
        from memascend_cli.console import err, print_json

        print_json(prepared.dry_run_document())
        err.print(f"dry run: wrote {prepared.spec.ds_config_path}; nothing was started")
        return
    launch_and_watch(prepared)


# --- preparing ----------------------------------------------------------------------------------


class Prepared:
    """Everything decided before the launch (kept together for --dry-run and the launch)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def dry_run_document(self) -> dict:
        return {
            "run_dir": self.run_dir,
            "engine": "baseline" if self.baseline else "memascend",
            "plan": self.plan_summary,
            "preflight": [{"name": c.name, "ok": c.ok, "message": c.message, "hint": c.hint} for c in self.checks],
            "region": self.region_note,
            "data": self.data,
            "total_steps": self.total_steps,
            "ds_config": self.ds_config,
            "launch": self.spec.to_dict(),
        }


def _complete_checkpoints(run_dir: str) -> list[str]:
    d = os.path.join(run_dir, CHECKPOINTS)
    if not os.path.isdir(d):
        return []
    return sorted(n for n in os.listdir(d) if n.startswith("step-") and os.path.exists(os.path.join(d, n, COMPLETE)))


def _check_model_source(name: str) -> None:
    """A model directory must hold safetensors weights (a preset builds random weights)."""
    if not os.path.isdir(name):
        return
    files = os.listdir(name)
    if not any(f.endswith(".safetensors") for f in files):
        hint = "convert the weights to safetensors, or use a preset name for random weights"
        if any(f.endswith(".gguf") for f in files):
            hint = "give the .gguf file itself as model (it is converted once), or `memascend import-gguf FILE DIR`"
        raise BadInput(f"model directory {name} has no *.safetensors weights", hint)


def _check_data_paths(recipe) -> None:
    for path in recipe.dataset.paths:
        if not os.path.isfile(path):
            raise BadInput(f"dataset file {path} does not exist", "fix dataset.path in the recipe")
    tok = recipe.tokenizer or (recipe.model if os.path.isdir(recipe.model) else None)
    if tok is None:
        raise BadInput(f"model {recipe.model} is a preset and the recipe names no tokenizer",
                       "set `tokenizer:` to a tokenizer directory or a tokenizer.json")
    if not os.path.exists(tok):
        raise BadInput(f"tokenizer {tok} does not exist", "set `tokenizer:` to a tokenizer directory or a tokenizer.json")
    if "tensorboard" in recipe.report_to:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise BadInput("report_to includes tensorboard but the tensorboard package is not installed",
                           "pip install tensorboard, or set report_to: jsonl")


def import_gguf_model(recipe):
    """A recipe whose model is a .gguf file, with the model replaced by its imported (cached) directory."""
    import subprocess
    import sys

    from memascend_cli.console import err
    from memascend_cli.recipe import cache_home

    with err.status(f"importing {os.path.basename(recipe.model)} (once; cached in {cache_home('models')})"):
        p = subprocess.run([sys.executable, "-m", "memascend_engine.gguf_import", recipe.model, "--cache-root",
                            cache_home("models")], capture_output=True, text=True)
    if p.returncode != 0:
        last = next((l for l in reversed(p.stderr.splitlines()) if l.startswith("error:")), None) or \
            (p.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise BadInput(f"cannot import {recipe.model}: {last.removeprefix('error: ')}",
                       "check the file; `memascend import-gguf FILE DIR` shows the full error")
    out = p.stdout.strip().splitlines()[-1]
    updates = {"model": out}
    if recipe.tokenizer is None or recipe.tokenizer == recipe.model:
        updates["tokenizer"] = out
    return recipe.model_copy(update=updates)


def prepare_data(recipe, run_dir: str) -> dict:
    """Tokenize the dataset (or reuse its cache) and write the export skeleton, in a child process
    (transformers imports torch); its summary is also written to run_dir/data.json for the ranks."""
    import subprocess
    import sys

    from memascend_cli.console import err
    from memascend_cli.rundir import DATA_JSON

    os.makedirs(run_dir, exist_ok=True)
    request = json.dumps({"recipe": recipe.to_dict(), "run_dir": run_dir})
    with err.status("preparing the data (tokenized once, then cached)") as status:
        proc = subprocess.Popen([sys.executable, "-m", "memascend_engine.tokenize_job"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdin.write(request)
        proc.stdin.close()
        errors = []
        for line in proc.stderr:
            line = line.rstrip()
            if line.startswith("tokenizing:"):
                status.update(line)
            elif line:
                errors.append(line)
        out = proc.stdout.read()
        proc.wait()
    if proc.returncode != 0:
        message = next((l for l in reversed(errors) if l.startswith("error:")), None)
        if message is not None and proc.returncode == 3:
            raise BadInput(message.removeprefix("error: "), "fix the dataset, the tokenizer or `template:` in the "
                           "recipe")
        raise MemascendError(f"preparing the data failed ({(errors or ['no output'])[-1]})",
                             "run `python -m memascend_engine.tokenize_job` by hand to see the traceback")
    summary = json.loads(out.strip().splitlines()[-1])
    with open(os.path.join(run_dir, DATA_JSON), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def _clear_previous_run(run_dir: str) -> None:
    """overwrite_output_dir: delete an earlier run's checkpoints, export and metrics (never anything else)."""
    import shutil

    from memascend_cli.rundir import EXPORT_DIR, METRICS, TENSORBOARD_DIR

    for name in (CHECKPOINTS, EXPORT_DIR, TENSORBOARD_DIR):
        shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
    for name in (METRICS,):
        if os.path.exists(os.path.join(run_dir, name)):
            os.unlink(os.path.join(run_dir, name))


def prepare_run(recipe, *, baseline: bool, resume: bool, force: bool, dry_run: bool) -> Prepared:
    """Plan, preflight and write the run directory's config files (no launch). I/O, but no torch."""
    from memascend_cli import models, preflight
    from memascend_cli.commands.plan import installed_deepspeed_version
    from memascend_cli.deepspeed_config import build_ds_config
    from memascend_cli.hardware import inventory_to_spec, io_backends, probe
    from memascend_cli.launch import build_launch, free_port
    from memascend_cli.planner.memory import estimate
    from memascend_cli.planner.search import check
    from memascend_cli.recipe import job_spec, total_steps
    from memascend_cli.rundir import DS_CONFIG, ENGINE_JSON, RECIPE_JSON

    spec = models.load_model(recipe.model)
    if recipe.model.endswith(".gguf"):
        recipe = import_gguf_model(recipe)
    _check_model_source(recipe.model)
    _check_data_paths(recipe)
    run_dir = recipe.output_dir
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise BadInput(f"output_dir {run_dir} exists and is not a directory", "choose another --output-dir")
    done = _complete_checkpoints(run_dir)
    if resume and not done:
        raise BadInput(f"--resume: no complete checkpoint in {os.path.join(run_dir, CHECKPOINTS)}",
                       "drop --resume to start from scratch, or check --output-dir")
    if not resume and done and not dry_run:
        if not recipe.overwrite_output_dir:
            raise BadInput(f"{run_dir} already holds checkpoints ({done[-1]})",
                           "add --resume to continue it, choose another --output-dir, or set overwrite_output_dir")
        _clear_previous_run(run_dir)

    inv = probe(None)
    hw = inventory_to_spec(inv)
    nodes = _hostfile_nodes(recipe)
    if recipe.num_nodes or nodes:
        import dataclasses

        hw = dataclasses.replace(hw, num_nodes=len(nodes) if nodes else recipe.num_nodes)
    # A region is node-local: with several nodes each has its own (hostfile `region=` or the recipe's path on every
    # node), checked on its node when the run starts (engine/cluster_preflight.py); no region file in the shared run dir.
    node_regions = None
    if len(nodes) > 1 and not baseline:
        from memascend_cli.hostfile import node_regions as regions_of

        node_regions = regions_of(nodes, recipe.region)
    ranks = recipe.ranks if recipe.ranks is not None else (hw.num_gpus or 1)
    world_size = ranks * max(1, hw.num_nodes)
    engine = "baseline" if baseline else "memascend"

    # The region's prepare-ssd probe sets the aio block size and queue depth.
    header, region_error, region_rank_bytes = None, None, None
    if node_regions is not None:
        pass  # checked on each node (the launch node may not even be one of them)
    elif recipe.region:
        header, region_error = _read_region(recipe.region, ranks)
    elif not baseline and os.path.exists(os.path.join(run_dir, REGION_FILE)):
        header, region_error = _read_region(os.path.join(run_dir, REGION_FILE), ranks)
    if header is not None:
        region_rank_bytes = min(r.size_bytes for r in header.ranks)
    # One set of ZeRO settings for the engine and --baseline (stock DeepSpeed given memascend's knobs), and the
    # same job `plan RECIPE` computes (recipe.job_spec).
    job = job_spec(recipe, spec, ranks=ranks, world_size=world_size, baseline=baseline,
                   deepspeed_version=installed_deepspeed_version(), header=header)
    settings = job.knobs
    est = estimate(job, hw, engine)
    if est.budget_error is not None:
        raise est.budget_error
    verdict = check(est, hw)
    if not verdict.fits and not force:
        raise PlanInfeasible(f"the job does not fit with {engine}: " + "; ".join(verdict.reasons),
                             f"see `memascend plan --model {recipe.model} --seq-len {recipe.seq_len} --micro-batch "
                             f"{recipe.micro_batch}`; lower seq_len/micro_batch, or launch anyway with --force")
    nvme_bytes_per_rank = est.nvme_bytes

    # Where the SSD data goes: the given region, a region file created in the run directory, or (--baseline)
    # stock DeepSpeed's swap folder.
    swap_dir = recipe.swap_dir or os.path.join(run_dir, SWAP_DIR)
    region_path, region_note = recipe.region, None
    if not baseline and not recipe.region and node_regions is None:
        region_path = os.path.join(run_dir, REGION_FILE)
        if not os.path.exists(region_path):
            size = _region_file_bytes(recipe, nvme_bytes_per_rank * ranks)
            region_note = {"create": region_path, "size_bytes": size, "ranks": ranks}
            region_rank_bytes = size // ranks
    facts = preflight.Facts(
        dram_available_bytes=int(inv.dram_available_gib * GiB), host_peak_bytes=est.node_host_peak_bytes,
        memlock_limit_bytes=inv.memlock_soft_bytes, can_lock_unlimited=inv.is_root or inv.cap_ipc_lock,
        locked_bytes=est.locked_bytes, baseline=baseline, region_path=region_path, region_error=region_error,
        region_rank_bytes=region_rank_bytes, nvme_bytes_per_rank=nvme_bytes_per_rank,
        swap_dir=swap_dir if baseline else None, num_ranks=ranks, io_backends=io_backends(), num_gpus=hw.num_gpus,
        output_dir=run_dir, output_free_bytes=preflight.free_bytes(run_dir),
        checkpoint_bytes=_checkpoint_bytes(spec.num_params, recipe), node_regions=node_regions,
    )
    if baseline:
        facts.swap_free_bytes = preflight.free_bytes(swap_dir)
        facts.swap_o_direct_ok, facts.swap_o_direct_reason = _o_direct(swap_dir)
    checks = preflight.assess(facts)
    _print_checks(checks, quiet=dry_run)
    stop = preflight.blocking(checks, force)
    if stop:
        first = stop[0]
        cls = SSDNotReady if first.name in ("region", "swap_dir") else MemascendError
        raise cls(first.message, first.hint or None)

    # The data is tokenized here, so the number of steps (and the scheduler DeepSpeed gets) is final.
    data = prepare_data(recipe, run_dir)
    total = total_steps(recipe, data["train_sequences"], world_size)
    ds_config = build_ds_config(recipe, settings, swap_dir=swap_dir, world_size=world_size, total_steps=total)
    os.makedirs(run_dir, exist_ok=True)
    resolved = recipe.to_dict()
    resolved["region"] = region_path if not baseline else recipe.region
    with open(os.path.join(run_dir, DS_CONFIG), "w") as f:
        json.dump(ds_config, f, indent=2)
    with open(os.path.join(run_dir, RECIPE_JSON), "w") as f:
        json.dump(resolved, f, indent=2)
    # The engine's windows as the planner split the host budget (the worker builds EngineOptions from them).
    engine_options = {"checkpoint_offload": recipe.checkpoint_offload}
    if est.budget is not None:
        engine_options.update(windows=est.budget.windows.to_dict(), prefetch_layers=est.budget.prefetch_layers)
    with open(os.path.join(run_dir, ENGINE_JSON), "w") as f:
        json.dump(engine_options, f, indent=2)
    _write_nodes(run_dir, nodes, node_regions)
    passthrough = {k: os.environ[k] for k in ("TORCH_EXTENSIONS_DIR",) if k in os.environ}
    launch = build_launch(recipe, run_dir, num_gpus=hw.num_gpus, cpu_cores=hw.cpu_cores, baseline=baseline,
                          resume=resume, extra_env=passthrough,
                          master_port=recipe.master_port or free_port())
    from memascend_cli.commands.plan import job_document

    plan_summary = {"engine": engine, "fits": verdict.fits, "reasons": verdict.reasons, "job": job_document(job, est),
                    "host_peak_bytes": est.node_host_peak_bytes, "nvme_bytes_per_rank": nvme_bytes_per_rank,
                    "world_size": world_size, "zero_settings": settings.to_dict(),
                    "host_budget": est.budget.to_dict() if est.budget else None}
    return Prepared(recipe=recipe, run_dir=run_dir, baseline=baseline, resume=resume, ds_config=ds_config,
                    spec=launch, checks=checks, plan_summary=plan_summary, region_note=region_note,
                    region_path=region_path, ranks=ranks, data=data, total_steps=total)


def _hostfile_nodes(recipe) -> list:
    """The hostfile's nodes DeepSpeed will launch on (memascend_cli.hostfile), [] without a hostfile."""
    if not recipe.hostfile:
        return []
    from memascend_cli.hostfile import active_nodes, parse_hostfile

    try:
        with open(recipe.hostfile, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read hostfile {recipe.hostfile}: {getattr(exc, 'strerror', None) or exc}",
                       "fix `hostfile` in the recipe") from None
    return active_nodes(parse_hostfile(text, recipe.hostfile), recipe.num_nodes)


def _write_nodes(run_dir: str, nodes: list, node_regions: list[str] | None) -> None:
    """RUN/nodes.json: the nodes in DeepSpeed's node order with their regions (read by engine/cluster_preflight.py)."""
    from memascend_cli.rundir import NODES_JSON

    path = os.path.join(run_dir, NODES_JSON)
    if node_regions is None:
        if os.path.exists(path):
            os.unlink(path)
        return
    doc = {"nodes": [{**n.to_dict(), "region": r} for n, r in zip(nodes, node_regions)]}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)


def _read_region(path: str, ranks: int):
    """(header, None) or (None, one-line reason) for a region the engine is to use."""
    from memascend_cli import region
    from memascend_cli.node_preflight import region_fstype
    from memascend_cli.ssd_safety import is_network_fs

    if not os.path.exists(path):
        return None, f"region {path} does not exist"
    fstype = region_fstype(path)
    if is_network_fs(fstype):
        return None, (f"region {path} is on {fstype}, a network file system; a region must be on a node-local SSD "
                      "(a device, or a file on ext4/xfs)")
    try:
        header = region.read_header(path)
    except region.NoRegion:
        return None, f"{path} holds no memascend region (not prepared)"
    except SSDNotReady as exc:
        return None, f"{path}: {exc.message}"
    except OSError as exc:
        return None, f"cannot read the region header of {path}: {exc.strerror or exc}"
    if len(header.ranks) < ranks:
        return None, f"region {path} has {len(header.ranks)} rank sub-region(s), the job runs {ranks} rank(s)"
    return _check_region_owners(path, header, ranks)


def _check_region_owners(path: str, header, ranks: int):
    """A region another job holds fails here, before DeepSpeed starts; stale owners are announced."""
    from memascend_cli import region_owner
    from memascend_cli.console import err

    try:
        busy, notes = region_owner.check_ranks_free(path, header, ranks)
    except OSError as exc:
        return None, f"cannot check who uses region {path}: {exc.strerror or exc}"
    if busy:
        raise region_owner.RegionBusy(busy, "wait for that job to end or stop it; a second job needs its own region "
                                            "(--region, or another --output-dir)")
    for note in notes:
        err.print(f"note: region {path}: {note}", highlight=False)
    return header, None


def _region_file_bytes(recipe, nvme_bytes: int) -> int:
    from memascend_cli.units import parse_size

    if recipe.region_size:
        return parse_size(recipe.region_size, "region_size")
    # Data area + the 1 MiB header area, rounded up to whole MiB.
    return -(-int(nvme_bytes * REGION_HEADROOM + 64 * MiB) // MiB) * MiB


def _checkpoint_bytes(num_params: int, recipe) -> int:
    # Per kept checkpoint: fp32 master + exp_avg + exp_avg_sq (12 B/param); one more is in flight
    # while the oldest is deleted; the export holds one copy of the weights.
    export = num_params * (4 if recipe.precision == "fp32" else 2) if recipe.export else 0
    return 12 * num_params * (recipe.keep_checkpoints + 1) + export


def _o_direct(path: str) -> tuple[bool | None, str]:
    from memascend_cli.hardware import path_info

    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    info = path_info(p)
    return info.o_direct_ok, info.o_direct_reason


def _print_checks(checks, quiet: bool) -> None:
    from memascend_cli.console import err

    for c in checks:
        if c.ok:
            if not quiet:
                err.print(f"[green]ok[/green]    {c.message}", highlight=False)
        else:
            tag = "[red]fail[/red]" if c.fatal else "[yellow]warn[/yellow]"
            err.print(f"{tag}  {c.message}" + (f" — {c.hint}" if c.hint else ""), highlight=False)


# --- launching ----------------------------------------------------------------------------------


def require_engine() -> None:
    """Fail in one line when the optimized engine cannot be imported; never fall back to stock DeepSpeed.

    Checked in a child interpreter: importing the engine pulls in torch, which this process avoids.
    """
    from memascend_cli.engine_probe import engine_available

    ok, why = engine_available()
    if not ok:
        raise MemascendError(f"the memascend engine is not available in this install ({why})",
                             "run with --baseline for stock DeepSpeed ZeRO-Infinity")


def launch_and_watch(p: Prepared) -> None:
    from memascend_cli.console import err
    from memascend_cli.launch import run_launch
    from memascend_cli.region_setup import create_region_file
    from memascend_cli.rundir import METRICS

    if not p.baseline:
        require_engine()
    if p.region_note is not None:
        with err.status(f"creating the region file {p.region_note['create']}"):
            create_region_file(p.region_note["create"], p.region_note["size_bytes"], ranks=p.region_note["ranks"],
                               label="memascend train")
    metrics_path = os.path.join(p.run_dir, METRICS)
    view = LiveView(metrics_path, start_offset=os.path.getsize(metrics_path) if os.path.exists(metrics_path) else 0)
    err.print(f"launching {p.spec.num_ranks} rank(s) ({'stock DeepSpeed' if p.baseline else 'memascend engine'}); "
              f"logs in {p.spec.log_dir}", highlight=False)
    try:
        with view:
            run_launch(p.spec, on_poll=view.poll)
    finally:
        view.summary()


class LiveView:
    """The live view on stderr, fed by metrics.jsonl: on a terminal a progress bar (steps, elapsed, ETA)
    with a line of figures under it, events printed above it; otherwise one plain line per record.
    Everything fits 80 columns."""

    def __init__(self, path: str, start_offset: int = 0):
        self.path, self.offset = path, start_offset
        self.last: dict | None = None
        self.events: list[dict] = []
        self.live = None
        self.progress = None
        self.task = None
        self.buffer = ""

    def __enter__(self):
        from memascend_cli.console import err

        if err.is_terminal:
            from rich.console import Group
            from rich.live import Live
            from rich.text import Text

            from memascend_cli.console import step_progress

            self.progress = step_progress(err)
            self.task = self.progress.add_task("train", total=None)
            self.stats = Text("starting the ranks", style="dim")
            self.live = Live(Group(self.progress, self.stats), console=err, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)
        return False

    def poll(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except OSError:
            return
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            self._show(rec)

    def _show(self, rec: dict) -> None:
        from memascend_cli.console import err

        kind = rec.get("event")
        if kind in ("start", "resumed") and self.progress is not None:
            total = rec.get("total_steps")
            self.progress.update(self.task, total=total, completed=rec.get("step", 0))
            self.progress.reset(self.task, total=total, completed=rec.get("step", 0))
            self.stats.plain = "first step (DeepSpeed warms up)"
        if kind == "step":
            self.last = rec
            if self.progress is not None:
                self.progress.update(self.task, completed=rec["step"], total=rec.get("total_steps"))
                self.stats.plain = format_stats(rec)
            else:
                err.print(format_step(rec), highlight=False)
            return
        if kind in ("checkpoint", "eval", "export", "stopped"):
            self.events.append(rec)
            (self.live.console if self.live is not None else err).print(format_event(rec), highlight=False)

    def summary(self) -> None:
        self.poll()


def _rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 10_000 else f"{x:,.0f}"


def format_stats(r: dict, sep: str = "  ") -> str:
    """The figures under the bar: loss, lr, tokens/s, host memory (node), SSD GB/s read/written."""
    lr = f"{r['lr']:.1e}".replace("e-0", "e-").replace("e+0", "e")
    return sep.join((f"loss {r['loss']:.4f}", f"lr {lr}", f"{_rate(r['tokens_per_s'])} tok/s",
                     f"host {r['host_rss_gib']:.1f} GiB", f"SSD {_gbps(r['ssd_read_gbps'])}/{_gbps(r['ssd_write_gbps'])} GB/s"))


def _gbps(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def format_step(r: dict) -> str:
    """One plain line per step when stderr is not a terminal (logs, CI): `step/total figures`, 80 columns."""
    return f"{r['step']}/{r.get('total_steps', '?')} " + format_stats(r, " ")


def format_event(e: dict) -> str:
    kind = e.get("event")
    if kind == "checkpoint":
        return f"checkpoint: step {e['step']} -> {e['path']}"
    if kind == "export":
        return f"exported: {e['path']}"
    if kind == "eval":
        return f"validation loss at step {e['step']}: {e['loss']:.4f}"
    if kind == "stopped":
        return f"stopped at step {e['step']}; resume with --resume"
    return json.dumps(e)
