"""`memascend plan`: how much memory the job needs, stock DeepSpeed vs memascend, and what fits.

Thin: parse options -> build JobSpec/HardwareSpec -> pure estimate + search -> render.
Exit codes: 0 the job fits (with the engine named by --engine), 1 it does not, 2 bad input.
"""

from __future__ import annotations

import typer

from memascend_cli import options
from memascend_cli.defaults import DEFAULT_OUTPUT_DIR, DEFAULT_PLAN_MODEL_CPU, DEFAULT_PLAN_MODEL_GPU
from memascend_cli.errors import EXIT_FAIL, BadInput
from memascend_cli.planner.zero import DEEPSPEED_DEFAULTS as _DS
from memascend_cli.units import GiB, parse_size
from memascend_cli.versions import installed_deepspeed_version, parse_version

JSON_SCHEMA_VERSION = 2  # 2: engines keyed stock / tuned / memascend (1: baseline / tuned / memascend)

_M = "Model and job"
_H = "Hardware"
_K = "DeepSpeed knobs"
_O = "Output"


def default_model(num_gpus: int) -> str:
    """A model that is a sensible first plan: small on a CPU-only box, 7B with a GPU."""
    return DEFAULT_PLAN_MODEL_GPU if num_gpus > 0 else DEFAULT_PLAN_MODEL_CPU


def plan_command(
    recipe_path: str = typer.Argument(None, metavar="[RECIPE]", help="A training recipe (memascend or LLaMA-Factory "
                                      "YAML): plan exactly the job `memascend train RECIPE` runs. Options given "
                                      "as well override the recipe.", show_default=False),
    model: str = options.model(_M),
    seq_len: int = options.seq_len(_M),
    micro_batch: int = options.micro_batch(_M),
    grad_accum: int = options.grad_accum(_M),
    dtype: str = options.dtype(_M),
    grad_accum_dtype: str = typer.Option(None, "--grad-accum-dtype", help="Gradient buffer dtype (default: the model "
                                         "dtype, as DeepSpeed does).", rich_help_panel=_M),
    checkpointing: str = options.checkpointing(_M),
    flash_attn: str = typer.Option(None, "--flash-attn", metavar="on|off", help="Attention without s^2 scores "
                                   "(default: on, transformers' SDPA; off models eager attention).",
                                   rich_help_panel=_M, show_default=False),
    host_budget: str = options.host_budget(_M),
    checkpoint_offload: str = typer.Option(None, "--checkpoint-offload", help="Where memascend's offloaded "
                                           "activation checkpoints go: ssd or dram. [default: ssd]",
                                           rich_help_panel=_M, show_default=False),
    optimizer_moments: str = typer.Option(None, "--optimizer-moments", help="memascend's Adam moments on the SSD: "
                                          "fp32, or bf16 (8 B per parameter less SSD traffic per step). "
                                          "[default: fp32, or the recipe's]", rich_help_panel=_M, show_default=False),
    liger: bool = typer.Option(False, "--liger", help="Liger-Kernel fused linear cross-entropy.",
                               rich_help_panel=_M),
    chunked_loss: bool = typer.Option(None, "--chunked-loss/--full-logits", help="memascend train's loss in "
                                      "chunks of logits, or transformers' loss over the full b x s x V logits. "
                                      "[default: the recipe's, else chunked for train's own job and full for a "
                                      "script of your own: --model-init eager|from-pretrained, --trainer hf|trl]",
                                      rich_help_panel=_M,
                                      show_default=False),
    overlap_optimizer: bool = typer.Option(None, "--overlap/--no-overlap", help="memascend's optimizer during "
                                           "backward, with a second set of optimizer states on the SSD until the "
                                           "step commits. [default: the recipe's, else on]", rich_help_panel=_M,
                                           show_default=False),
    ranks: int = options.ranks(_M),
    hardware: str = typer.Option(None, "--hardware", help="Hardware profile name or YAML (default: probe this "
                                 "machine).", rich_help_panel=_H),
    nvme_path: str = typer.Option(None, "--nvme-path", help="Swap target (directory, region file or device): its "
                                  "free space and bandwidth are used.", rich_help_panel=_H),
    dram: str = typer.Option(None, "--dram", help="DRAM per node, e.g. 128GiB.", rich_help_panel=_H),
    dram_cap: str = options.dram_cap(_H),
    gpu_mem: str = typer.Option(None, "--gpu-mem", help="Memory per GPU, e.g. 24GiB.", rich_help_panel=_H),
    gpus: int = typer.Option(None, "--gpus", help="GPUs per node (0 = CPU-only).", rich_help_panel=_H),
    nodes: int = typer.Option(None, "--nodes", help="Machines.", rich_help_panel=_H),
    nvme_free: str = typer.Option(None, "--nvme-free", help="Free SSD space per node, e.g. 2TB.", rich_help_panel=_H),
    nvme_read_gbps: str = typer.Option(None, "--nvme-read-gbps", help="SSD read bandwidth, GB/s.", rich_help_panel=_H),
    nvme_write_gbps: str = typer.Option(None, "--nvme-write-gbps", help="SSD write bandwidth, GB/s.",
                                        rich_help_panel=_H),
    cpu_gflops: float = options.cpu_gflops(_H),
    gpu_tflops: float = typer.Option(None, "--gpu-tflops", help="Achieved GPU TFLOP/s (default: the GPU's dense "
                                     "bf16 datasheet peak x 0.45).", rich_help_panel=_H, show_default=False),
    memlock: str = typer.Option(None, "--memlock", help="RLIMIT_MEMLOCK per process, e.g. 64GiB or unlimited.",
                                rich_help_panel=_H),
    deepspeed_version: str = typer.Option(None, "--deepspeed-version", help="Stock DeepSpeed to model (default: "
                                          "the installed one, else 0.19.8).", rich_help_panel=_K),
    pin_backend: str = typer.Option("torch", "--pin-backend", help="Pinned-memory backend of stock "
                                    "DeepSpeed: torch or native (DeepSpeed's pin memory backend variable).",
                                    rich_help_panel=_K),
    sub_group_size: str = typer.Option(None, "--sub-group-size", help="DeepSpeed zero_optimization "
                                       f"sub_group_size (default: {_DS.sub_group_size:.0e}).", rich_help_panel=_K,
                                       show_default=False),
    param_buffer_count: int = typer.Option(_DS.param_buffer_count, "--param-buffer-count",
                                           help="DeepSpeed offload_param buffer_count.", rich_help_panel=_K),
    param_buffer_size: str = typer.Option(None, "--param-buffer-size", help="DeepSpeed offload_param buffer_size "
                                          f"(default: max({_DS.param_buffer_size:.0e}, largest partition)).",
                                          rich_help_panel=_K),
    max_in_cpu: str = typer.Option(None, "--max-in-cpu", help="DeepSpeed offload_param max_in_cpu "
                                   f"(default: {_DS.max_in_cpu:.0e}).", rich_help_panel=_K, show_default=False),
    optimizer_buffer_count: int = typer.Option(_DS.optimizer_buffer_count, "--optimizer-buffer-count",
                                               help="DeepSpeed offload_optimizer buffer_count.", rich_help_panel=_K),
    pipeline: bool = typer.Option(False, "--pipeline", help="DeepSpeed offload_optimizer "
                                  "pipeline_read and pipeline_write.", rich_help_panel=_K),
    reduce_bucket_size: str = typer.Option(None, "--reduce-bucket-size", help="DeepSpeed zero_optimization "
                                           f"reduce_bucket_size (default: {_DS.reduce_bucket_size:.0e}).", rich_help_panel=_K,
                                           show_default=False),
    pin_memory: str = typer.Option(None, "--pin-memory", metavar="on|off", help="DeepSpeed offload pin_memory "
                                   "(default: the version's default).", rich_help_panel=_K, show_default=False),
    no_zero_init: bool = typer.Option(False, "--no-zero-init", help="The same as --model-init eager.",
                                      rich_help_panel=_K),
    model_init: str = typer.Option(None, "--model-init", help="zero, eager or from-pretrained: how the script "
                                   "builds the model before deepspeed.initialize: under deepspeed.zero.Init, whole "
                                   "(LlamaForCausalLM(config): fp32 unless torch_dtype), or whole with "
                                   "from_pretrained. [default: zero, what train does]", rich_help_panel=_K,
                                   show_default=False),
    trainer: str = typer.Option("deepspeed", "--trainer", help="What drives the training loop: deepspeed (its API, "
                                "memascend train), hf (the Hugging Face Trainer, also under accelerate) or trl "
                                "(TRL's SFTTrainer): their imports take host memory too.", rich_help_panel=_K),
    placement: str = options.placement(_O),
    engine: str = options.engine(_O),
    search: bool = typer.Option(True, "--search/--no-search", help="Also search the largest batch, context and "
                                "model that fit.", rich_help_panel=_O),
    details: bool = typer.Option(False, "--details", help="Show each item's formula and source.", rich_help_panel=_O),
    list_models: bool = typer.Option(False, "--list-models", help="List model presets and exit.", rich_help_panel=_O),
    tokens: str = typer.Option(None, "--tokens", help="Tokens to train on, e.g. 50M: the plan says how many hours.",
                               rich_help_panel=_O, show_default=False),
    as_json: bool = options.as_json(_O),
) -> None:
    """Compute the memory a fine-tuning job needs with stock DeepSpeed and with memascend, and what fits.

    Examples:

        memascend plan --model llama-3.1-8b --seq-len 8192

        memascend plan --model qwen2.5-14b --hardware rtx4090-128g --json

        memascend plan recipe.yaml && memascend train recipe.yaml
    """
    from memascend_cli.planner import job_flags

    if list_models:
        return _list_models(as_json)
    _check_choices(engine=engine, pin_backend=pin_backend, model_init=model_init)
    model_init = model_init or ("eager" if no_zero_init else None)
    flags = job_flags.JobFlags(
        seq_len=seq_len, micro_batch=micro_batch, grad_accum=grad_accum, dtype=dtype, grad_accum_dtype=grad_accum_dtype,
        checkpointing=checkpointing, ranks=ranks, flash_attn=_on_off(flash_attn, "--flash-attn"), liger=liger,
        host_budget_bytes=parse_size(host_budget, "--host-budget") if host_budget else None,
        checkpoint_offload=checkpoint_offload, chunked_loss=chunked_loss, overlap_optimizer=overlap_optimizer)
    _check_choices(checkpoint_offload=checkpoint_offload, optimizer_moments=optimizer_moments)
    knobs = job_flags.KnobFlags(
        param_buffer_count=param_buffer_count, param_buffer_size=param_buffer_size, max_in_cpu=max_in_cpu,
        optimizer_buffer_count=optimizer_buffer_count, pipeline=pipeline, sub_group_size=sub_group_size,
        reduce_bucket_size=reduce_bucket_size, pin_memory=_on_off(pin_memory, "--pin-memory"), pin_backend=pin_backend)
    recipe = _recipe(recipe_path, model)
    if recipe is not None and nodes is None:
        nodes = recipe.num_nodes or None
    hw = _machine(recipe, engine, hardware=hardware, nvme_path=nvme_path, dram_cap=dram_cap, dram=dram,
                  gpu_mem=gpu_mem, gpus=gpus, nodes=nodes, nvme_free=nvme_free, nvme_read_gbps=nvme_read_gbps,
                  nvme_write_gbps=nvme_write_gbps, memlock=memlock)
    timing = {"tokens": _tokens(tokens), "cpu_gflops": cpu_gflops, "gpu_tflops": gpu_tflops}
    job, stock_job = _jobs(recipe, model, hw, engine, flags, knobs, deepspeed_version=deepspeed_version,
                           model_init=model_init, optimizer_moments=optimizer_moments, trainer=trainer)
    return _finish(job, hw, engine, search, details, as_json, default_used=recipe is None and model is None,
                   stock_job=stock_job, placement=placement, timing=timing)


def _jobs(recipe, model, hw, engine: str, flags, knobs, *, deepspeed_version, model_init, optimizer_moments,
          trainer):
    """(the job the plan prices, stock DeepSpeed's twin of a recipe's job or None): from the flags alone, or from the
    recipe with the flags on top (job_flags' builders)."""
    from memascend_cli import models
    from memascend_cli.console import warn
    from memascend_cli.planner import job_flags, zero
    from memascend_cli.run.prepared import recipe_job

    model_name = recipe.model if recipe is not None else (model or default_model(hw.num_gpus))
    # A hub id plans from its config.json alone (cached, else downloaded); recipes pin it with `revision`.
    spec = models.load_model(model_name, revision=recipe.revision if recipe is not None else None)
    ds_version = deepspeed_version or installed_deepspeed_version()
    defaults = zero.version_defaults(parse_version(ds_version))
    base = knobs.base(defaults)
    if recipe is None:
        return job_flags.flag_job(spec, hw, flags, base=base, defaults=defaults, knob_flags=knobs,
                                  deepspeed_version=ds_version, model_init=model_init or "zero",
                                  optimizer_moments=optimizer_moments, trainer=trainer, note=warn), None
    if knobs.recipe_note():
        warn(knobs.recipe_note())
    return job_flags.recipe_jobs(
        recipe_job(recipe, spec, hw, engine=engine, deepspeed_version=ds_version, base=base,
                   **flags.recipe_overrides()),
        spec, hw, engine=engine, base=base, defaults=defaults, knob_flags=knobs,
        optimizer_moments=optimizer_moments, model_init=model_init, note=warn)


def _check_choices(*, engine: str | None = None, pin_backend: str | None = None, checkpoint_offload: str | None = None,
                   optimizer_moments: str | None = None, model_init: str | None = None) -> None:
    """The options with a fixed set of values (those given)."""
    from memascend_cli.planner.job import MODEL_INITS, MOMENT_DTYPES
    from memascend_cli.planner.zero import ENGINES

    if engine is not None and engine not in ENGINES:
        raise BadInput(f"unknown engine {engine!r}", "use --engine " + ", ".join(ENGINES[:-1]) + " or " + ENGINES[-1])
    if pin_backend is not None and pin_backend not in ("torch", "native"):
        raise BadInput(f"unknown pin backend {pin_backend!r}", "use torch or native")
    if checkpoint_offload not in (None, "ssd", "dram"):
        raise BadInput(f"unknown --checkpoint-offload {checkpoint_offload!r}", "use ssd or dram")
    if model_init not in (None, *MODEL_INITS):
        raise BadInput(f"unknown --model-init {model_init!r}", "use " + ", ".join(MODEL_INITS))
    if optimizer_moments not in (None, *MOMENT_DTYPES):
        raise BadInput(f"unknown --optimizer-moments {optimizer_moments!r}", "use " + " or ".join(MOMENT_DTYPES))


def _recipe(recipe_path: str | None, model: str | None):
    """The recipe to plan, with --model on top; None without one."""
    if recipe_path is None:
        return None
    from memascend_cli.run.recipe import load_recipe_noting

    return load_recipe_noting(recipe_path, {"model": model} if model else None)


def _machine(recipe, engine: str, *, hardware: str | None, nvme_path: str | None, dram_cap: str | None, **given):
    """The node the plan sees: the profile or this machine probed, with the SSD where `train` would put the data when
    no --nvme-path is given (the recipe's region or run directory), under --dram-cap, with the SSD's rate measured
    when nothing gives one."""
    import os

    from memascend_cli.hardware import resolve_hardware
    from memascend_cli.run.rundir import ssd_location

    run_dir = recipe.output_dir if recipe is not None else os.path.abspath(DEFAULT_OUTPUT_DIR)
    where = ssd_location(run_dir, region=recipe.region if recipe else None,
                         swap_dir=recipe.swap_dir if recipe else None, engine=engine)
    hw = resolve_hardware(hardware, nvme_path, default_nvme_path=where, **given)
    if dram_cap:
        hw = hw.under_dram_cap(parse_size(dram_cap, "--dram-cap"))
    return _measured_ssd(hw)


def _on_off(value: str | None, flag: str) -> bool | None:
    if value is None:
        return None
    if value.lower() in ("on", "true", "yes", "1"):
        return True
    if value.lower() in ("off", "false", "no", "0"):
        return False
    raise BadInput(f"{flag} {value!r}: expected on or off", f"e.g. {flag} off")


def _tokens(text: str | None) -> int | None:
    if text is None:
        return None
    from memascend_cli.planner.time import parse_tokens

    try:
        return parse_tokens(text)
    except ValueError:
        raise BadInput(f"--tokens {text!r}: expected a positive count", "e.g. --tokens 50M") from None


def _time(job, hw, ests, timing: dict, search: bool) -> dict:
    """The time model's document for the plan (planner.time), with the compute device resolved."""
    from memascend_cli.compute_probe import plan_device, slow_precision_note
    from memascend_cli.planner import time as tm

    rates = _local_rates(hw, timing)
    device = plan_device(hw, job.dtype, cpu_gflops=timing["cpu_gflops"], gpu_tflops=timing["gpu_tflops"],
                         rates=rates)
    times = tm.engine_times(job, ests, device, read_gbps=hw.nvme_read_gbps, write_gbps=hw.nvme_write_gbps,
                            cpu_cores=hw.cpu_cores)
    doc = tm.time_document(times, device, read_gbps=hw.nvme_read_gbps, write_gbps=hw.nvme_write_gbps,
                           tokens=timing["tokens"])
    note = slow_precision_note(job.dtype, rates)
    if note:
        doc["precision_note"] = note
    if search:
        doc["fastest"] = tm.fastest(job, hw, device, read_gbps=hw.nvme_read_gbps, write_gbps=hw.nvme_write_gbps)
    return doc


def _measured_ssd(hw):
    """This machine's plan without an SSD rate (no region prepared where the data goes, no --nvme-*-gbps): the rate
    of the folder the data would go to, measured once per device and cached (ssd/folder_probe.py)."""
    import dataclasses
    import os

    if hw.name != "local" or (hw.nvme_read_gbps and hw.nvme_write_gbps) or not hw.nvme_path \
            or not os.path.isdir(hw.nvme_path):
        return hw
    from memascend_cli.console import err
    from memascend_cli.ssd.folder_probe import PROBE_BYTES, folder_rates

    def say() -> None:
        err.print(f"measuring the SSD at {hw.nvme_path} once ({PROBE_BYTES >> 20} MiB "
                  "O_DIRECT write and read; cached for later plans)", highlight=False)

    found = folder_rates(hw.nvme_path, on_probe=say)
    if "error" in found:
        return hw
    return dataclasses.replace(hw, nvme_read_gbps=hw.nvme_read_gbps or found["read_gbps"],
                               nvme_write_gbps=hw.nvme_write_gbps or found["write_gbps"],
                               source=f"{hw.source} + SSD measured at {hw.nvme_path}")


def _local_rates(hw, timing: dict) -> dict | None:
    """This CPU's matmul probe when the plan is of this CPU-only machine and no rate was given: the cached one, else
    measured now (once, ~10 s, then cached) so that the plan can show a time."""
    if hw.num_gpus or hw.name != "local" or timing["cpu_gflops"]:
        return None
    from memascend_cli.compute_probe import local_cpu_rates
    from memascend_cli.hardware import local_cpu_model

    return local_cpu_rates(local_cpu_model(), hw.cpu_cores)


def _finish(job, hw, engine: str, search: bool, details: bool, as_json: bool, *, default_used: bool,
            timing: dict, stock_job=None, placement: str | None = None) -> None:
    """Estimate, search, price the placements, print. `stock_job`: the job with stock DeepSpeed's knobs when `job`
    carries others; `placement`: the one whose items the detail tables show (default: all on the SSD)."""
    from memascend_cli.console import print_json
    from memascend_cli.planner.memory import estimate, estimate_all
    from memascend_cli.planner.search import check
    from memascend_cli.planner.search import search as run_search

    ests = estimate_all(job, hw)
    stock_job = stock_job or job
    if stock_job is not job:
        ests["stock"] = estimate(stock_job, hw, "stock")
    if ests["memascend"].budget_error is not None:
        raise ests["memascend"].budget_error
    verdicts = {e: check(est, hw) for e, est in ests.items()}
    # The searches compare stock as documented with memascend (tuned is in the totals; a third search costs ~0.3 s).
    searches = ({e: run_search(stock_job if e == "stock" else job, hw, e) for e in ("stock", "memascend")}
                if search else {})
    result = build_result(job, hw, ests, verdicts, searches, engine, default_used=default_used)
    result["time"] = _time(job, hw, ests, timing, search)
    placed = _placements(job, hw, ests, timing)
    shown, header = (ests, None) if placement is None else _placement_ests(placed, placement, engine)
    result["placements"] = {**placed.to_dict(hw), "selected": placement}
    if as_json:
        print_json(result)
    else:
        from memascend_cli.render import render_plan
        from memascend_cli.render_placement import render_placements
        from memascend_cli.render_time import render_time

        if header:
            from memascend_cli.console import out

            out.print(header, highlight=False)
        render_plan(result, shown, details=details)
        render_time(result["time"], timing["tokens"])
        render_placements(result["placements"], gpu=bool(hw.num_gpus))
    if not verdicts[engine].fits:
        raise typer.Exit(EXIT_FAIL)


def _placements(job, hw, ests, timing: dict):
    """Every placement priced (planner.placement) on the compute device the time model uses."""
    from memascend_cli.compute_probe import plan_device
    from memascend_cli.planner.placement import price_placements

    device = plan_device(hw, job.dtype, cpu_gflops=timing["cpu_gflops"], gpu_tflops=timing["gpu_tflops"],
                         rates=_local_rates(hw, timing))
    return price_placements(job, hw, ests, device, read_gbps=hw.nvme_read_gbps, write_gbps=hw.nvme_write_gbps)


def _placement_ests(placed, placement: str, engine: str) -> tuple[dict, str]:
    """({stock, memascend: estimate} of `placement` for the detail tables, the line that says what they show). A
    placement that does not fit `engine` (tuned: stock's row) is bad input: exit 2 with what binds."""
    from memascend_cli.planner.placement_choice import row_for

    mine = row_for(placed, placement, engine)  # exit 2 with what binds when it does not fit
    rows = {e: placed.row(placement, e) for e in ("stock", "memascend")}
    rows["memascend"] = rows["memascend"] or rows["stock"]  # gpu: memascend runs stock's ZeRO-3 unchanged
    shown = {e: (r if r.est is not None else mine).est for e, r in rows.items()}
    words = "; ".join(f"{e}: {r.config}" + ("" if r.est is not None else f" ({r.note})") for e, r in rows.items())
    return shown, f"detail tables: placement {placement} ({words})"


def reduction_percent(baseline_bytes: int, memascend_bytes: int) -> float:
    return 0.0 if baseline_bytes <= 0 else 100.0 * (baseline_bytes - memascend_bytes) / baseline_bytes


def build_result(job, hw, ests, verdicts, searches, engine: str, default_used: bool = False) -> dict:
    """The --json document (docs/plan-json.md). Pure."""
    from memascend_cli.planner import cap
    from memascend_cli.run.prepared import job_document

    b, m = ests["stock"], ests["memascend"]
    v = verdicts[engine]
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "model": {**job.model.to_dict(), "default_used": default_used},
        "job": job_document(job, b),
        "hardware": hw.to_dict(),
        "engines": {e: {**ests[e].to_dict(), "verdict": verdicts[e].to_dict(),
                        **({"search": searches[e].to_dict()} if e in searches else {})} for e in ests},
        "reduction_percent": {
            "host_peak": round(reduction_percent(b.host_peak_bytes, m.host_peak_bytes), 2),
            "host_steady": round(reduction_percent(b.host_steady_bytes, m.host_steady_bytes), 2),
            **({"host_peak_vs_tuned": round(reduction_percent(ests["tuned"].host_peak_bytes, m.host_peak_bytes), 2)}
               if "tuned" in ests else {}),
        },
        "verdict": {"engine": engine, "fits": v.fits, "binding": v.binding, "reasons": v.reasons,
                    "line": verdict_line(ests, verdicts, engine, hw)},
        "dram_cap": {"engine": engine, "smallest_bytes": cap.smallest_cap_bytes(ests[engine]),
                     "node_peak_bytes": ests[engine].node_host_peak_bytes,
                     "measured_spread_bytes": cap.MEASURED_SPREAD_BYTES, "line": cap.cap_line(ests[engine])},
    }


def verdict_line(ests, verdicts, engine: str, hw) -> str:
    from memascend_cli.planner.search import RESOURCE_NAMES

    b, m = verdicts["stock"], verdicts["memascend"]
    est = ests[engine]
    who = {"stock": "stock DeepSpeed", "tuned": "tuned stock DeepSpeed", "memascend": "memascend"}[engine]
    head = f"fits with {who} ({est.node_host_peak_bytes / GiB:.1f} of {hw.usable_dram_gib:.1f} GiB host memory)"
    if not verdicts[engine].fits:
        head = (f"does not fit with {engine} ({RESOURCE_NAMES[verdicts[engine].binding]} binds): "
                + "; ".join(verdicts[engine].reasons))
    if engine == "memascend" and m.fits and not b.fits:
        head += "; stock DeepSpeed does not fit (" + RESOURCE_NAMES[b.binding] + (
            ": " + "; ".join(b.reasons) if b.binding == "config" else "") + ")"
    elif engine == "memascend" and m.fits and b.fits:
        head += "; stock DeepSpeed fits too"
    return head


def _list_models(as_json: bool) -> None:
    from memascend_cli import models
    from memascend_cli.console import out, print_json

    specs = [models.load_preset(n) for n in models.list_model_presets()]
    if as_json:
        print_json([s.to_dict() for s in specs])
        return
    from rich.table import Table

    t = Table(title="model presets (exact counts: --json)", title_justify="left")
    for col in ("name", "params", "layers", "hidden", "heads/kv", "vocab", "largest"):
        t.add_column(col, justify="left" if col == "name" else "right", no_wrap=True)
    for s in specs:
        t.add_row(s.name, compact_count(s.num_params), str(s.num_hidden_layers), str(s.hidden_size),
                  f"{s.num_attention_heads}/{s.num_key_value_heads}", f"{s.vocab_size:,}",
                  compact_count(s.largest_tensor_numel))
    out.print(t)


def compact_count(n: int) -> str:
    """6.29M, 7.62B: four significant figures, narrow enough for an 80-column table."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)
