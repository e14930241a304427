"""Run setup, shared by `plan RECIPE`, `train` and `bench`: a recipe becomes a typed, checked run.

recipe -> planner JobSpec (`job_spec`, the one translation plan and train share) -> region and node sizing ->
preflight -> the run directory's config files (`prepare_run`, no launch). Torch-free: data preparation and GGUF
import run in child processes.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from memascend_cli.errors import BadInput, MemascendError, PlanInfeasible, SSDNotReady
from memascend_cli.run.rundir import (
    CHECKPOINTS,
    complete_checkpoints,
    final_model_dir,
    region_location,
    swap_directory,
)
from memascend_cli.units import GiB, MiB
from memascend_cli.versions import installed_deepspeed_version

if TYPE_CHECKING:
    from memascend_cli.run.recipe import Recipe

REGION_HEADROOM = 1.25
"""A created region file is the plan's SSD bytes x this, for extents lost to alignment and holes."""
PASSED = "_passed"
"""Suffix of the placement document's keys that name an EngineOptions field the placement hands the engine."""


def checkpointing_mode(r: Recipe, engine: str) -> str:
    """The planner's activation checkpointing for the recipe: offloaded with the memascend engine."""
    if not r.gradient_checkpointing:
        return "none"
    return "offload" if engine == "memascend" else "full"


def job_spec(r: Recipe, model_spec, *, ranks: int | None, world_size: int, engine: str, deepspeed_version: str,
             header=None, base=None):
    """The planner JobSpec of a recipe: the single translation `plan RECIPE` and `train RECIPE` share.

    Its knobs are the ZeRO settings train writes into the DeepSpeed config: memascend and tuned stock get
    planner/zero.py resolve("memascend") (with the aio block size and queue depth of the region's prepare-ssd
    probe in `header`), stock gets DeepSpeed's defaults as its docs configure them. `base`: the stock settings to
    start from (plan's knob flags), default DeepSpeed's.
    """
    from memascend_cli.planner import zero
    from memascend_cli.planner.memory import DTYPE_BYTES, JobSpec
    from memascend_cli.run.dsconfig import region_aio
    from memascend_cli.units import parse_size

    block_bytes, queue_depth = region_aio(header)
    settings = zero.resolve("stock" if engine == "stock" else "memascend", model=model_spec, world_size=world_size,
                            elem_bytes=DTYPE_BYTES[r.precision], base=base, aio_block_size=block_bytes,
                            aio_queue_depth=queue_depth)
    budget = parse_size(r.host_budget, "host_budget") if r.host_budget else None
    return JobSpec(model=model_spec, seq_len=r.seq_len, micro_batch=r.micro_batch, grad_accum_steps=r.grad_accum,
                   dtype=r.precision, ranks_per_node=ranks, checkpointing=checkpointing_mode(r, engine),
                   deepspeed_version=deepspeed_version, knobs=settings, checkpoint_copies=0,
                   checkpoint_offload=r.checkpoint_offload, host_budget_bytes=budget, chunked_loss=r.chunked_loss,
                   gradient_clipping=r.max_grad_norm, overlap_optimizer=r.overlap_optimizer,
                   optimizer_moments=r.optimizer_moments)


def recipe_job(recipe, spec, hw, *, engine: str, seq_len, micro_batch, grad_accum, dtype, checkpointing, ranks,
               flash_attn, liger, grad_accum_dtype, deepspeed_version, host_budget_bytes=None,
               checkpoint_offload=None, base=None, chunked_loss=None, overlap_optimizer=None):
    """The JobSpec `train RECIPE` plans (job_spec, with the recipe's region probe), with the options
    given on the command line on top."""
    import dataclasses

    ranks = ranks if ranks is not None else (recipe.ranks if recipe.ranks is not None else (hw.num_gpus or 1))
    region = region_location(recipe.output_dir, recipe.region) if engine == "memascend" else recipe.region
    header = read_region(region, ranks)[0] if region and os.path.exists(region) else None
    job = job_spec(recipe, spec, ranks=ranks, world_size=ranks * max(1, hw.num_nodes), engine=engine,
                   deepspeed_version=deepspeed_version or installed_deepspeed_version(), header=header, base=base)
    given = {"seq_len": seq_len, "micro_batch": micro_batch, "grad_accum_steps": grad_accum, "dtype": dtype,
             "checkpointing": checkpointing, "flash_attention": flash_attn, "grad_accum_dtype": grad_accum_dtype,
             "fused_cross_entropy": liger or None, "host_budget_bytes": host_budget_bytes,
             "checkpoint_offload": checkpoint_offload, "chunked_loss": chunked_loss,
             "overlap_optimizer": overlap_optimizer}
    return dataclasses.replace(job, **{k: v for k, v in given.items() if v is not None})


def job_document(job, est) -> dict:
    """The job parameters as `plan --json` and `train --dry-run` print them (so they can be compared)."""
    return {
        "model": job.model.name, "num_params": job.model.num_params,
        "seq_len": job.seq_len, "micro_batch": job.micro_batch, "grad_accum_steps": job.grad_accum_steps,
        "dtype": job.dtype, "grad_accum_dtype": job.grad_accum_dtype or job.dtype,
        "checkpointing": job.checkpointing, "flash_attention": job.flash_attention,
        "fused_cross_entropy": job.fused_cross_entropy, "chunked_loss": job.chunked_loss,
        "deepspeed_version": job.deepspeed_version,
        "ranks_per_node": est.ranks_per_node, "world_size": est.world_size,
        "knobs": job.knobs.to_dict(), "zero_init": job.zero_init, "model_init": job.model_init,
        "trainer": job.trainer,
        "checkpoint_copies": job.checkpoint_copies, "overlap_optimizer": job.overlap_optimizer,
    }


# --- preparing a train run ----------------------------------------------------------------------------------


class Prepared:
    """Everything decided before the launch (kept together for --dry-run and the launch)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def dry_run_document(self) -> dict:
        return {
            "run_dir": self.run_dir,
            "final_model_dir": (final_model_dir(self.run_dir, in_output_dir=self.recipe.export_in_output_dir)
                                if self.recipe.export else None),
            "engine": self.engine,
            "plan": self.plan_summary,
            "preflight": [{"name": c.name, "ok": c.ok, "message": c.message, "hint": c.hint} for c in self.checks],
            "region": self.region_note,
            "data": self.data,
            "total_steps": self.total_steps,
            "ds_config": self.ds_config,
            "launch": self.spec.to_dict(),
            "dram_cap_bytes": self.dram_cap_bytes,
            "downloads": self.downloads,
            "placement": self.placement,
        }


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


def _check_data_paths(recipe, *, hub_model=None) -> None:
    for path in recipe.dataset.paths:
        if not os.path.isfile(path):
            raise BadInput(f"dataset file {path} does not exist", "fix dataset.path in the recipe")
    tok = recipe.tokenizer or (recipe.model if os.path.isdir(recipe.model) else None)
    if tok is None and hub_model is not None:
        return  # the hub model's own tokenizer, downloaded with it
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
    from memascend_cli.defaults import cache_home

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


def prepare_data(recipe, run_dir: str, *, dry_run: bool = False) -> dict:
    """Tokenize the dataset (or reuse its cache) and write the export skeleton, in a child process
    (transformers imports torch); its summary is also written to run_dir/data.json for the ranks. A dry run
    downloads no hub dataset: its summary is {"pending": ...} when the cache does not hold it."""
    import subprocess
    import sys
    import time

    from memascend_cli.console import err
    from memascend_cli.run.lifeline import die_with_parent
    from memascend_cli.run.rundir import DATA_JSON
    from memascend_cli.run.train_progress import SETUP_HEARTBEAT_S, fmt_duration

    os.makedirs(run_dir, exist_ok=True)
    request = json.dumps({"recipe": recipe.to_dict(), "run_dir": run_dir, "dry_run": dry_run})
    started = said = time.time()
    with err.status("preparing the data (tokenized once, then cached)") as status:
        # Tokenizing a large dataset takes a while: it ends with the CLI (run/lifeline.py).
        proc = subprocess.Popen([sys.executable, "-m", "memascend_engine.tokenize_job"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=die_with_parent())
        proc.stdin.write(request)
        proc.stdin.close()
        errors = []
        for line in proc.stderr:
            line = line.rstrip()
            if line.startswith("tokenizing:"):
                status.update(line)
                if not err.is_terminal and time.time() - said >= SETUP_HEARTBEAT_S:  # a log has no status line
                    err.print(line, highlight=False)
                    said = time.time()
            elif line:
                errors.append(line)
        out = proc.stdout.read()
        proc.wait()
    if proc.returncode != 0:
        message = next((l for l in reversed(errors) if l.startswith("error:")), None)
        hint = next((l for l in reversed(errors) if l.startswith("hint:")), None)
        if message is not None and proc.returncode == 3:
            raise BadInput(message.removeprefix("error: "), hint.removeprefix("hint: ") if hint else
                           "fix the dataset, the tokenizer or `template:` in the recipe")
        raise MemascendError(f"preparing the data failed ({(errors or ['no output'])[-1]})",
                             "run `python -m memascend_engine.tokenize_job` by hand to see the traceback")
    summary = json.loads(out.strip().splitlines()[-1])
    if "pending" in summary:
        return summary
    err.print(f"setup: tokenizing took {fmt_duration(time.time() - started)} ({summary['train_sequences']:,} training "
              "sequences)", highlight=False)
    with open(os.path.join(run_dir, DATA_JSON), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def _clear_previous_run(run_dir: str, final_dir: str) -> None:
    """overwrite_output_dir: delete an earlier run's checkpoints, metrics and final model (never anything else: in
    the run directory itself, only the model's config, weights and chat template files)."""
    import shutil

    from memascend_cli.run.rundir import METRICS, TENSORBOARD_DIR, is_model_file

    for name in (CHECKPOINTS, TENSORBOARD_DIR):
        shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
    if final_dir != run_dir:
        shutil.rmtree(final_dir, ignore_errors=True)
    doomed = [METRICS]
    if final_dir == run_dir and os.path.isdir(run_dir):
        doomed += [n for n in os.listdir(run_dir) if is_model_file(n)]
    for name in doomed:
        if os.path.isfile(os.path.join(run_dir, name)):
            os.unlink(os.path.join(run_dir, name))


def _check_output_dir(recipe, run_dir: str, final_dir: str, done: list[str], *, resume: bool, dry_run: bool) -> None:
    """What an output_dir may already hold: refused, or cleared with overwrite_output_dir."""
    if final_dir == run_dir:
        for what, source in (("model", recipe.model), ("tokenizer", recipe.tokenizer)):
            if source and os.path.isdir(source) and os.path.realpath(source) == os.path.realpath(run_dir):
                raise BadInput(f"output_dir {run_dir} is the {what} directory: the final model is written into "
                               "output_dir and would replace it", "choose another output_dir")
    if resume or dry_run:
        return
    if done:
        if not recipe.overwrite_output_dir:
            raise BadInput(f"{run_dir} already holds checkpoints ({done[-1]})",
                           "add --resume to continue it, choose another --output-dir, or set overwrite_output_dir")
    else:
        from memascend_cli.run.rundir import previous_model

        found = previous_model(os.listdir(final_dir)) if os.path.isdir(final_dir) else None
        if found is None:
            return
        if not recipe.overwrite_output_dir:
            # As LLaMA-Factory's hparams/parser.py get_train_args: a model and no checkpoint need overwrite_output_dir.
            raise BadInput(f"{final_dir} already holds a trained model ({found})",
                           "set overwrite_output_dir: true to replace it, or choose another --output-dir")
    _clear_previous_run(run_dir, final_dir)


def prepare_run(recipe, *, engine: str, resume: bool, force: bool, dry_run: bool,
                dram_cap_bytes: int | None = None, placement: str | None = None) -> Prepared:
    """Plan, preflight and write the run directory's config files (no launch). I/O, but no torch.

    dram_cap_bytes: --dram-cap; the plan and the preflight see a node with that much DRAM, all of it usable (the OS
    and other processes are outside the run's cgroup). placement: --placement (None: the plan's choice,
    run/train_placement.py)."""
    from memascend_cli import models
    from memascend_cli.run.dsconfig import build_ds_config
    from memascend_cli.run.recipe import total_steps

    from memascend_cli.run import hub_download

    spec = models.load_model(recipe.model, revision=recipe.revision)
    # A hub id: its cached snapshot, or what is to download.
    recipe, hub_model = hub_download.resolve(recipe, resume=resume)
    if recipe.model.endswith(".gguf"):
        recipe = import_gguf_model(recipe)
    _check_model_source(recipe.model)
    _check_data_paths(recipe, hub_model=hub_model)
    run_dir = recipe.output_dir
    _check_run_dir(recipe, run_dir, resume=resume, dry_run=dry_run)
    stock_deepspeed = engine != "memascend"  # tuned or stock: its swap directory instead of a region
    inv, hw, nodes = _node(recipe, dram_cap_bytes)
    # A region is node-local: with several nodes each has its own (hostfile `region=` or the recipe's path on every
    # node), checked on its node when the run starts (engine/node_check.py); no region file in the shared run dir.
    node_regions = None
    if len(nodes) > 1 and not stock_deepspeed:
        from memascend_cli.run.hostfile import node_regions as regions_of

        node_regions = regions_of(nodes, recipe.region)
    ranks = recipe.ranks if recipe.ranks is not None else (hw.num_gpus or 1)
    world_size = ranks * max(1, hw.num_nodes)
    precision_note = cpu_precision_note(recipe.precision, hw)
    # The region's prepare-ssd probe sets the aio block size and queue depth.
    header, region_error = None, None
    if node_regions is not None:
        pass  # checked on each node (the launch node may not even be one of them)
    elif recipe.region:
        header, region_error = read_region(recipe.region, ranks)
    elif not stock_deepspeed and os.path.exists(region_location(run_dir, None)):
        header, region_error = read_region(region_location(run_dir, None), ranks)
    # One set of ZeRO settings for memascend and tuned (stock DeepSpeed given memascend's knobs), and the same job
    # `plan RECIPE` computes (job_spec).
    job = job_spec(recipe, spec, ranks=ranks, world_size=world_size, engine=engine,
                   deepspeed_version=installed_deepspeed_version(), header=header)
    choice, placement_doc, est, verdict, nvme_bytes = _placed_plan(job, hw, engine, recipe, placement or recipe.placement,
                                                                   force=force)
    # Where the SSD data goes: the given region, a region file created in the run directory, or stock DeepSpeed's
    # swap directory.
    swap_dir = swap_directory(run_dir, recipe.swap_dir)
    region_path, region_note = recipe.region, None
    region_rank_bytes = min(r.size_bytes for r in header.ranks) if header is not None else None
    if not stock_deepspeed and not recipe.region and node_regions is None:
        region_path = region_location(run_dir, None)
        if not os.path.exists(region_path):
            size = _region_file_bytes(recipe, nvme_bytes * ranks)
            region_note = {"create": region_path, "size_bytes": size, "ranks": ranks}
            region_rank_bytes = size // ranks
    checks = _preflight(
        inv, hw, est, recipe, spec, force=force, quiet=dry_run, dram_cap_bytes=dram_cap_bytes,
        stock_deepspeed=stock_deepspeed, region_path=region_path, region_error=region_error,
        region_rank_bytes=region_rank_bytes, swap_dir=swap_dir, ranks=ranks, node_regions=node_regions,
        nvme_bytes=nvme_bytes)
    recipe = hub_download.fetch(recipe, hub_model, dry_run=dry_run, region_path=region_path,
                                region_create_bytes=(region_note or {}).get("size_bytes", 0))
    # The data is tokenized here, so the number of steps (and the scheduler DeepSpeed gets) is final. A dry run
    # whose model or dataset is still on the hub tokenizes nothing: the steps are known when the run starts.
    model_pending = hub_model is not None and hub_model.snapshot is None
    data = {"pending": {"model": hub_model.repo_id}} if model_pending and dry_run else \
        prepare_data(recipe, run_dir, dry_run=dry_run)
    download_doc = hub_download.downloads(hub_model, recipe, data) if dry_run else None
    if download_doc:
        hub_download.say_downloads(download_doc)
    steps_known = "train_sequences" in data or recipe.steps is not None
    total = total_steps(recipe, data["train_sequences"], world_size) if "train_sequences" in data else recipe.steps or 0
    if resume:
        finished = _finished(recipe, run_dir, total)
        if finished is not None:
            return Prepared(recipe=recipe, run_dir=run_dir, finished=finished)
    ds_config = build_ds_config(recipe, choice.settings(job.knobs), swap_dir=swap_dir, world_size=world_size,
                                total_steps=total, devices=choice.devices)
    if not steps_known:  # set when the data is tokenized, at the run's start
        total = None
        if "total_num_steps" in ds_config.get("scheduler", {}).get("params", {}):
            ds_config["scheduler"]["params"]["total_num_steps"] = None
    _write_run_files(recipe, run_dir, ds_config, est, region=recipe.region if stock_deepspeed else region_path,
                     passed={k.removesuffix(PASSED): v for k, v in placement_doc.items()
                             if k.endswith(PASSED) and v is not None})
    _write_nodes(run_dir, nodes, node_regions)
    hub_download.record(run_dir, hub_model, recipe, data)
    launch = _launch_spec(recipe, run_dir, hw, engine=engine, resume=resume)
    return Prepared(recipe=recipe, run_dir=run_dir, engine=engine, resume=resume, ds_config=ds_config,
                    spec=launch, checks=checks, plan_summary=plan_summary(job, est, verdict, engine, world_size, precision_note),
                    region_note=region_note, region_path=region_path, ranks=ranks, data=data, total_steps=total,
                    dram_cap_bytes=dram_cap_bytes, log_every=recipe.log_every, finished=None, downloads=download_doc,
                    placement=placement_doc)


def _check_run_dir(recipe, run_dir: str, *, resume: bool, dry_run: bool) -> None:
    """The run directory may hold what this run continues (--resume) or replaces (overwrite_output_dir) only."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise BadInput(f"output_dir {run_dir} exists and is not a directory", "choose another --output-dir")
    done = complete_checkpoints(run_dir)
    if resume and not done:
        raise BadInput(f"--resume: no complete checkpoint in {os.path.join(run_dir, CHECKPOINTS)}",
                       "drop --resume to start from scratch, or check --output-dir")
    _check_output_dir(recipe, run_dir, final_model_dir(run_dir, in_output_dir=recipe.export_in_output_dir), done,
                      resume=resume, dry_run=dry_run)


def _node(recipe, dram_cap_bytes: int | None):
    """(this machine's inventory, the node the run is planned on: under --dram-cap, with the recipe's or hostfile's
    node count, the hostfile's nodes)."""
    import dataclasses

    from memascend_cli.hardware import inventory_to_spec, probe

    inv = probe(None)
    hw = inventory_to_spec(inv)
    nodes = _hostfile_nodes(recipe)
    if dram_cap_bytes is not None:
        if len(nodes) > 1 or (recipe.num_nodes or 1) > 1:
            raise BadInput("--dram-cap caps the processes of this node only, and this run spans nodes",
                           "drop --dram-cap, or run on one node")
        slack = hw.slack_cap_note(dram_cap_bytes)
        if slack:
            from memascend_cli.console import err

            err.print(f"note: {slack}: the plan uses the node's, the cgroup still records the peak", highlight=False)
        hw = hw.under_dram_cap(dram_cap_bytes)
    if recipe.num_nodes or nodes:
        hw = dataclasses.replace(hw, num_nodes=len(nodes) if nodes else recipe.num_nodes)
    return inv, hw, nodes


def _plan(job, hw, engine: str, recipe, *, force: bool):
    """(the estimate, its verdict); a job that does not fit stops here unless --force."""
    from memascend_cli.planner.memory import estimate
    from memascend_cli.planner.search import check

    est = estimate(job, hw, engine)
    if est.budget_error is not None:
        raise est.budget_error
    verdict = check(est, hw)
    if not verdict.fits and not force:
        raise PlanInfeasible(f"the job does not fit with {engine}: " + "; ".join(verdict.reasons),
                             f"see `memascend plan --model {recipe.model} --seq-len {recipe.seq_len} --micro-batch "
                             f"{recipe.micro_batch}`; lower seq_len/micro_batch, or launch anyway with --force")
    return est, verdict


def _placed_plan(job, hw, engine: str, recipe, asked: str | None, *, force: bool):
    """(the placement's Choice, its document, the estimate and verdict the run is planned by, its SSD bytes per
    rank): the chosen row's, or the all-SSD plan's (_plan, which also refuses a host budget too small) where the run
    keeps every byte on the SSD. A memascend DRAM tier the engine has goes to it (the document's
    dram_tier_gib_passed); memascend's region still holds every byte (the tier keeps copies in DRAM)."""
    from memascend_cli.run import train_placement

    est, verdict = _plan(job, hw, engine, recipe, force=force)
    supported = engine == "memascend" and train_placement.dram_tier_supported()
    choice, doc, as_row = train_placement.choose(job, hw, engine, asked, tier_supported=supported, force=force)
    if not as_row or choice.placement == "ssd":
        return choice, doc, est, verdict, est.nvme_bytes
    if supported and choice.dram_tier_bytes:
        doc["dram_tier_gib_passed"] = choice.dram_tier_bytes / GiB
        # The row's checkpoints in DRAM (memascend's dram row): its windows were planned so (planner.placement).
        doc["checkpoint_offload_passed"] = choice.row.checkpoint_offload
        doc["overlap_optimizer_passed"] = choice.row.overlap_optimizer  # off in memascend's dram row
        doc["layer_trims_passed"] = choice.row.layer_trims  # off in memascend's dram row (DRAM holds the job)
    row = choice.row.est
    return choice, doc, row, choice.row.verdict, est.nvme_bytes if engine == "memascend" else row.nvme_bytes


def _preflight(inv, hw, est, recipe, spec, *, force: bool, quiet: bool, dram_cap_bytes: int | None,
               stock_deepspeed: bool, region_path, region_error, region_rank_bytes, swap_dir: str, ranks: int,
               node_regions, nvme_bytes: int) -> list:
    """The machine's checks (run/preflight.py), printed unless `quiet`; the first blocking one stops the run."""
    from memascend_cli.hardware import io_backends
    from memascend_cli.run import preflight

    run_dir = recipe.output_dir
    dram_available_bytes = int(inv.dram_available_gib * GiB)
    if dram_cap_bytes is not None:
        dram_available_bytes = min(dram_available_bytes, dram_cap_bytes)
    facts = preflight.Facts(
        dram_available_bytes=dram_available_bytes, host_peak_bytes=est.node_host_peak_bytes,
        memlock_limit_bytes=inv.memlock_soft_bytes, can_lock_unlimited=inv.is_root or inv.cap_ipc_lock,
        locked_bytes=est.locked_bytes, stock_deepspeed=stock_deepspeed, region_path=region_path,
        region_error=region_error, region_rank_bytes=region_rank_bytes, nvme_bytes_per_rank=nvme_bytes,
        swap_dir=swap_dir if stock_deepspeed else None, num_ranks=ranks, io_backends=io_backends(),
        num_gpus=hw.num_gpus,
        output_dir=run_dir, output_free_bytes=preflight.free_bytes(run_dir),
        checkpoint_bytes=_checkpoint_bytes(spec.num_params, recipe), node_regions=node_regions,
    )
    if stock_deepspeed:
        facts.swap_free_bytes = preflight.free_bytes(swap_dir)
        facts.swap_o_direct_ok, facts.swap_o_direct_reason = _o_direct(swap_dir)
    checks = preflight.assess(facts)
    _print_checks(checks, quiet=quiet)
    stop = preflight.blocking(checks, force)
    if stop:
        first = stop[0]
        cls = SSDNotReady if first.name in ("region", "swap_dir") else MemascendError
        raise cls(first.message, first.hint or None)
    return checks


def _write_run_files(recipe, run_dir: str, ds_config: dict, est, *, region: str | None,
                     passed: dict | None = None) -> None:
    """ds_config.json, recipe.json (the recipe as run, with the region it uses) and engine.json (the engine's
    windows as the planner split the host budget and `passed`, the EngineOptions fields the placement sets: the DRAM
    tier's budget, where its checkpoints go, whether it overlaps the optimizer with backward and trims the heap after
    every layer; the worker builds EngineOptions from them)."""
    from memascend_cli.run.rundir import DS_CONFIG, ENGINE_JSON, RECIPE_JSON

    os.makedirs(run_dir, exist_ok=True)
    resolved = recipe.to_dict()
    resolved["region"] = region
    engine_options = {"checkpoint_offload": recipe.checkpoint_offload, "overlap_optimizer": recipe.overlap_optimizer,
                      "optimizer_moments": recipe.optimizer_moments}
    if est.budget is not None:
        engine_options.update(windows=est.budget.windows.to_dict(), prefetch_layers=est.budget.prefetch_layers)
    engine_options.update(passed or {})
    for name, doc in ((DS_CONFIG, ds_config), (RECIPE_JSON, resolved), (ENGINE_JSON, engine_options)):
        with open(os.path.join(run_dir, name), "w") as f:
            json.dump(doc, f, indent=2)


def _launch_spec(recipe, run_dir: str, hw, *, engine: str, resume: bool):
    """The launch command (run/launch.py build_launch) with this environment's build variables."""
    from memascend_cli.run.launch import build_launch, free_port, toolchain_env

    # CXX with the extensions folder: the compiler line is part of a built op's identity (ninja rebuilds it when it
    # changes), so every rank, on every node, loads the ops with the compiler that built them.
    passthrough = {k: os.environ[k] for k in ("TORCH_EXTENSIONS_DIR", "CXX") if k in os.environ}
    if not recipe.hostfile:  # other nodes have their own PATH (and .deepspeed_env would carry this one there)
        passthrough.update(toolchain_env())
    return build_launch(recipe, run_dir, num_gpus=hw.num_gpus, cpu_cores=hw.cpu_cores, engine=engine,
                        resume=resume, extra_env=passthrough, master_port=recipe.master_port or free_port())


def plan_summary(job, est, verdict, engine: str, world_size: int, precision_note: str | None) -> dict:
    """The plan as `train --dry-run` prints it. Pure."""
    return {"engine": engine, "fits": verdict.fits, "reasons": verdict.reasons, "job": job_document(job, est),
            "host_peak_bytes": est.node_host_peak_bytes, "nvme_bytes_per_rank": est.nvme_bytes,
            "world_size": world_size, "zero_settings": job.knobs.to_dict(),
            "host_budget": est.budget.to_dict() if est.budget else None,
            **({"precision_note": precision_note} if precision_note else {})}


def _finished(recipe, run_dir: str, total: int) -> str | None:
    """What `train --resume` says of a run with nothing left to do (rundir.finished_checkpoint), else None."""
    from memascend_cli.run.rundir import finished_checkpoint

    final_dir = final_model_dir(run_dir, in_output_dir=recipe.export_in_output_dir) if recipe.export else None
    last = finished_checkpoint(run_dir, total, final_dir=final_dir)
    if last is None:
        return None
    return (f"{run_dir} is complete: {last} holds the last of its {total} steps"
            + (f" and the final model is in {final_dir}" if final_dir else "")
            + "; nothing to resume (to train further, raise steps: --steps)")


def cpu_precision_note(precision: str, hw) -> str | None:
    """On a CPU-only node, the note that `precision` (bf16/fp16) matmuls run a slow fallback here, printed now; None
    with a GPU, in fp32, or where they are fast. Probes this CPU once when no probe is cached."""
    if hw.num_gpus or precision == "fp32":
        return None
    from memascend_cli.compute_probe import local_cpu_rates, slow_precision_note
    from memascend_cli.console import err
    from memascend_cli.hardware import local_cpu_model

    note = slow_precision_note(precision, local_cpu_rates(local_cpu_model(), hw.cpu_cores))
    if note:
        err.print(f"[yellow]note: {note}[/yellow]", highlight=False)
    return note


def _hostfile_nodes(recipe) -> list:
    """The hostfile's nodes DeepSpeed will launch on (memascend_cli.run.hostfile), [] without a hostfile."""
    if not recipe.hostfile:
        return []
    from memascend_cli.run.hostfile import active_nodes, parse_hostfile

    try:
        with open(recipe.hostfile, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read hostfile {recipe.hostfile}: {getattr(exc, 'strerror', None) or exc}",
                       "fix `hostfile` in the recipe") from None
    return active_nodes(parse_hostfile(text, recipe.hostfile), recipe.num_nodes)


def _write_nodes(run_dir: str, nodes: list, node_regions: list[str] | None) -> None:
    """RUN/nodes.json: the nodes in DeepSpeed's node order with their regions (read by engine/node_check.py)."""
    from memascend_cli.run.rundir import NODES_JSON

    path = os.path.join(run_dir, NODES_JSON)
    if node_regions is None:
        if os.path.exists(path):
            os.unlink(path)
        return
    doc = {"nodes": [{**n.to_dict(), "region": r} for n, r in zip(nodes, node_regions)]}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)


def read_region(path: str, ranks: int):
    """(header, None) or (None, one-line reason) for a region the engine is to use."""
    from memascend_cli.run.node_preflight import region_fstype
    from memascend_cli.ssd import region
    from memascend_cli.ssd.safety import is_network_fs

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
    from memascend_cli.ssd.members import check_members

    check_members(path, header)  # a striped region's missing, swapped or resized member: bad input, exit 2
    if len(header.ranks) < ranks:
        return None, f"region {path} has {len(header.ranks)} rank sub-region(s), the job runs {ranks} rank(s)"
    return _check_region_owners(path, header, ranks)


def _check_region_owners(path: str, header, ranks: int):
    """A region another job holds fails here, before DeepSpeed starts; stale owners are announced."""
    from memascend_cli.console import err
    from memascend_cli.ssd import owner

    try:
        busy, notes = owner.check_ranks_free(path, header, ranks)
    except OSError as exc:
        return None, f"cannot check who uses region {path}: {exc.strerror or exc}"
    if busy:
        raise owner.RegionBusy(busy, "wait for that job to end or stop it; a second job needs its own region "
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
    from memascend_cli.ssd.path import path_info

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


def engine_available() -> tuple[bool, str]:
    """(True, "") when memascend_engine imports, else (False, why); asked in a child interpreter, since importing the
    engine pulls in torch, which the CLI process avoids."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", "import memascend_engine as m; m.install, m.EngineOptions"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 0:
        return True, ""
    return False, "memascend_engine cannot be imported: " + (p.stderr.strip().splitlines() or ["unknown error"])[-1]


def require_engine() -> None:
    """Fail in one line when the optimized engine cannot be imported; never fall back to stock DeepSpeed."""
    ok, why = engine_available()
    if not ok:
        raise MemascendError(f"the memascend engine is not available in this install ({why})",
                             "run with --engine tuned (or stock) for stock DeepSpeed ZeRO-Infinity")
