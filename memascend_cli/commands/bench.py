"""`memascend bench`: the same job with stock DeepSpeed, tuned stock DeepSpeed and memascend, side by side.

Thin: parse options -> checks (nvme dir, engine) -> for every point of the sweep (layers x sequence length): a
region, one child per run (memascend_cli.bench.runner), the planner's prediction per run, JSON + PNG; then the
sweep summary (flatness, GiB per billion parameters). With --capacity: each engine's search for the largest value of
one axis under --dram-cap (memascend_cli.bench.capacity_run). Exit codes: 0 every run finished (with --capacity: every
probe trained or was OOM-killed), 1 a run failed (the outputs are still written), 2 bad input.
"""

from __future__ import annotations

import typer

from memascend_cli import options
from memascend_cli.bench.capacity import CAPACITY_STEPS, PROBE_TIMEOUT_RULE
from memascend_cli.defaults import (
    DEFAULT_BENCH_MODEL,
    DEFAULT_BENCH_STEPS,
    DEFAULT_GRAD_ACCUM,
    DEFAULT_MICRO_BATCH,
    DEFAULT_PRECISION,
    DEFAULT_SEQ_LEN,
)
from memascend_cli.errors import EXIT_FAIL, BadInput
from memascend_cli.units import parse_size

_J = "Job"
_R = "Runs"
_O = "Output"


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise BadInput(f"{flag} {text!r} is not a comma list of whole numbers", f"e.g. {flag} 8,16,32") from None
    if not values or any(v < 1 for v in values):
        raise BadInput(f"{flag} needs positive whole numbers, got {text!r}", f"e.g. {flag} 8,16,32")
    return values


def _check_capacity(axis: str, *, dram_cap, layers, seq_len, micro_batch, region) -> None:
    """--capacity's own rules: a cap to search under, the searched axis left to the search, the others single."""
    from memascend_cli.bench.capacity import AXES

    if axis not in AXES:
        raise BadInput(f"unknown --capacity axis {axis!r}", "use " + ", ".join(AXES))
    if dram_cap is None:
        raise BadInput("--capacity needs --dram-cap", "e.g. --capacity layers --dram-cap 4GiB (needs root)")
    given = {"layers": layers, "seq": seq_len, "micro-batch": micro_batch}
    flag = {"layers": "--layers", "seq": "--seq-len", "micro-batch": "--micro-batch"}
    if given[axis] is not None:
        raise BadInput(f"{flag[axis]} is what --capacity {axis} searches", f"drop {flag[axis]}")
    for name in ("layers", "seq"):
        if given[name] is not None and "," in str(given[name]):
            raise BadInput(f"{flag[name]} {given[name]!r} is a sweep; --capacity searches one axis",
                           f"give one value to {flag[name]}")
    if region is not None:
        raise BadInput("--region does not apply to --capacity", "each probe sizes its own region in OUT; drop --region")


def bench_command(
    model: str = options.model(_J),
    seq_len: str = options.seq_len(_J),
    layers: str = typer.Option(None, "--layers", help="Decoder layers of the model (same width); a comma list "
                               "sweeps the depth (e.g. 8,16,32). Default: the model's own.", rich_help_panel=_J,
                               show_default=False),
    micro_batch: int = options.micro_batch(_J),
    grad_accum: int = options.grad_accum(_J),
    gradient_clipping: float = typer.Option(None, "--gradient-clipping", help="DeepSpeed's gradient_clipping (global "
                                            "norm; 0: off). Default: DeepSpeed's, 1.0.", rich_help_panel=_J,
                                            show_default=False),
    steps: int = options.steps(_J),
    dtype: str = options.dtype(_J),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and the synthetic token batches.",
                             rich_help_panel=_J),
    checkpointing: str = options.checkpointing(_J),
    loss: str = typer.Option("chunked", "--loss", help="The loss tuned and memascend compute: chunked (lm_head + "
                             "cross-entropy in 64 MiB logit chunks) or hf (transformers' own, full b x s x V "
                             "logits). Stock always computes transformers' own.", rich_help_panel=_J),
    ranks: int = options.ranks(_J),
    host_budget: str = options.host_budget(_J),
    runs: str = typer.Option("stock,tuned,memascend", "--runs", help="Comma list of stock (DeepSpeed as its docs "
                             "configure it), tuned (stock given every stock knob memascend sets), memascend, "
                             "memascend-no-X (one technique off, e.g. memascend-no-verify_checksums), "
                             "memascend-bf16_moments, tuned-glibc_threshold (tuned with glibc's mmap threshold "
                             "fixed at 1 MiB by GLIBC_TUNABLES, the engine's allocator policy).",
                             rich_help_panel=_R),
    ablation: bool = typer.Option(False, "--ablation", help="Add one memascend run per technique switched off "
                                  "(everything else identical; tuned is the 'knobs only' row).", rich_help_panel=_R),
    accelerator: str = typer.Option("auto", "--accelerator", help="auto (CUDA when this machine has an NVIDIA GPU, "
                                    "else CPU), cpu or cuda.", rich_help_panel=_R),
    nvme_dir: str = typer.Option(None, "--nvme-dir", help="Swap directory of the stock runs, on a real SSD file "
                                 "system (tmpfs is refused). Default: OUT/swap.", rich_help_panel=_R),
    region: str = options.region(_R),
    repeat: int = typer.Option(1, "--repeat", help="Runs of each engine, one after another in one sitting; the "
                               "table and JSON report the repeat with the median peak (a failed one if any failed), "
                               "every repeat's peak is kept in the JSON. With --capacity: runs per probe, a value "
                               "fits when every one fits.", rich_help_panel=_R),
    dram_cap: str = options.dram_cap(_R),
    ssd_bandwidth: str = typer.Option(None, "--ssd-bandwidth", help="Throttle each engine's reads and writes to "
                                      "the block device under the region and the swap directory to this much, e.g. "
                                      "400MB/s (its own io cgroup, needs root): compute:I/O like a GPU box's. The "
                                      "plan's predicted s/step uses it.", rich_help_panel=_R, show_default=False),
    cpu_gflops: float = options.cpu_gflops(_R),
    placement: str = options.placement(_R),
    placements: str = typer.Option(None, "--placements", metavar="CAPS", help="DRAM caps to sweep, e.g. 3GiB,6GiB "
                                   "(memory cgroups, root): stock's best config, tuned on the SSD and memascend's "
                                   "placement under each, beside the plan; placements.json, .png", rich_help_panel=_R),
    capacity: str = typer.Option(None, "--capacity", help="Find each engine's largest layers, seq or micro-batch "
                                 "that trains --steps steps under --dram-cap: start at the plan's maximum under the "
                                 "cap, one capped run per probe, up after a fit, down after an OOM kill, until a value "
                                 "fits and the next grid value is OOM-killed (or 'at least' at the grid's end or the "
                                 "SSD space). Writes capacity.json and capacity.png.", rich_help_panel=_R,
                                 show_default=False),
    probe_timeout: float = typer.Option(None, "--probe-timeout", help="With --capacity: longest a probe may run, in "
                                        "seconds; one still running is killed and reads 'stalled' (does not fit: near "
                                        "its cap a job can crawl re-reading its libraries instead of being "
                                        f"OOM-killed). Default: {PROBE_TIMEOUT_RULE}.", rich_help_panel=_R,
                                        show_default=False),
    resume: bool = options.resume(_R),
    settle_cap: float = typer.Option(150.0, "--settle-cap", help="Longest wait, in seconds, for memory to settle "
                                     "before each run.", rich_help_panel=_R),
    out_dir: str = typer.Option("bench-out", "--out", help="Output directory (bench.json, its memory timelines in "
                                "bench.timeline.json.gz, bench.png, run logs; a sweep writes one folder per point and "
                                "sweep.json).", rich_help_panel=_O),
    as_json: bool = options.as_json(_O),
    title: str = typer.Option(None, "--title", help="A title recorded in the JSON (docs/results.md uses it).",
                              rich_help_panel=_O, show_default=False),
) -> None:
    """Run one training job (params + optimizer on NVMe) with stock DeepSpeed, tuned stock DeepSpeed and memascend,
    each in a child process, and compare peak system memory, step time, tokens/s and SSD traffic with the plan.

    Peak system memory = max(MemTotal - MemAvailable) sampled at >= 1 kHz while the child runs, minus the level
    it settled to before the launch (page cache dropped as root). Other jobs on the machine move this number.

    Examples:

        memascend bench --model tiny-llama --seq-len 64 --steps 2 --runs stock,tuned

        memascend bench --layers 8,16,32 --seq-len 2048 --steps 3 --out /mnt/nvme/depth

        memascend bench --ranks 2 --ablation --out /mnt/nvme/bench

        memascend bench --capacity layers --dram-cap 4GiB --dtype fp32 --out /mnt/nvme/cap-depth

        memascend bench --seq-len 512 --steps 3 --ssd-bandwidth 400MB/s --out /mnt/nvme/ssd-bound
    """
    import dataclasses

    from memascend_cli.bench import runner, sweep
    from memascend_cli.bench.placements import SWEEP_RUNS
    from memascend_cli.bench.runs import parse_runs
    from memascend_cli.console import print_json
    from memascend_cli.models import load_model
    from memascend_cli.versions import installed_deepspeed_version

    ranks = 1 if ranks is None else ranks
    _check_modes(capacity, ranks=ranks, dram_cap=dram_cap, layers=layers, seq_len=seq_len, micro_batch=micro_batch,
                 region=region, ssd_bandwidth=ssd_bandwidth, probe_timeout=probe_timeout, resume=resume)
    caps = _check_placements(placements, placement, capacity, dram_cap, layers, seq_len, repeat, runs, ablation)
    seq_lens = _int_list(seq_len or str(DEFAULT_SEQ_LEN), "--seq-len")
    micro_batch = DEFAULT_MICRO_BATCH if micro_batch is None else micro_batch
    grad_accum = DEFAULT_GRAD_ACCUM if grad_accum is None else grad_accum
    steps = (CAPACITY_STEPS if capacity else DEFAULT_BENCH_STEPS) if steps is None else steps
    dtype, checkpointing = dtype or DEFAULT_PRECISION, checkpointing or "full"
    _check_values(micro_batch=micro_batch, grad_accum=grad_accum, steps=steps, repeat=repeat,
                  gradient_clipping=gradient_clipping, checkpointing=checkpointing, loss=loss, dtype=dtype,
                  accelerator=accelerator)
    budget_bytes = parse_size(host_budget, "--host-budget") if host_budget else None
    dram_cap_bytes = _dram_cap_bytes(dram_cap)
    ssd_bytes_per_s = _ssd_bytes_per_s(ssd_bandwidth)
    if cpu_gflops is not None and cpu_gflops <= 0:
        raise BadInput("--cpu-gflops must be positive", "e.g. --cpu-gflops 150")
    run_specs = parse_runs(runs, ablation) if caps is None else list(SWEEP_RUNS)
    base_spec = load_model(model or DEFAULT_BENCH_MODEL)
    depths = _int_list(layers, "--layers") if layers else [base_spec.num_hidden_layers]
    out_dir, nvme_dir, nvme_info, io_limits = sweep.folders(out_dir, nvme_dir, region, ssd_bytes_per_s)
    hw, accelerator, probe_samples = sweep.bench_hardware(dram_cap_bytes=dram_cap_bytes, region=region,
                                                          accelerator=accelerator)
    engine_ok = sweep.engine_ready(run_specs)
    meta = sweep.sitting_meta(title)
    # Every point's job but its depth and context (a capacity search also varies micro-batch).
    template = runner.Point(model=model or DEFAULT_BENCH_MODEL, spec=base_spec, layers=None, seq_len=seq_lens[0],
                            micro_batch=micro_batch, steps=steps, dtype=dtype, seed=seed, checkpointing=checkpointing,
                            ranks=ranks, host_budget_bytes=budget_bytes, accelerator=accelerator, hw=hw,
                            deepspeed_version=installed_deepspeed_version(),
                            timing=sweep.timing(hw, dtype, cpu_gflops, ssd_bytes_per_s, probe_samples,
                                                1 + len(sweep.region_members(region))), loss=loss,
                            grad_accum=grad_accum, gradient_clipping=gradient_clipping)
    try:
        if capacity is not None:
            doc, all_ok = _capacity(capacity, dataclasses.replace(template, layers=depths[0] if layers else None),
                                    run_specs, as_json=as_json, cap_bytes=dram_cap_bytes, out_dir=out_dir,
                                    nvme_dir=nvme_dir, nvme_info=nvme_info, engine_ok=engine_ok,
                                    settle_cap_s=settle_cap, meta=meta, probe_timeout_s=probe_timeout, resume=resume,
                                    repeat=repeat)
        else:
            doc, all_ok = _measure(template, caps, run_specs, [(L, s) for L in depths for s in seq_lens],
                                   bool(layers), placement, out_dir=out_dir, meta=meta, show_tables=not as_json,
                                   nvme_dir=nvme_dir, nvme_info=nvme_info, region=region, engine_ok=engine_ok,
                                   settle_cap_s=settle_cap, io_limits=io_limits, repeat=repeat,
                                   dram_cap_bytes=dram_cap_bytes)
    finally:
        sweep.remove_regions(out_dir, keep=region)  # GiBs each: the records stay, a given --region too
    if as_json:
        print_json(doc)
    if not all_ok:
        raise typer.Exit(EXIT_FAIL)


def _capacity(axis: str, base, run_specs, *, as_json: bool, out_dir: str, **kw) -> tuple[dict, bool]:
    """The --capacity search (bench.capacity_run) and, unless --json, its table."""
    from memascend_cli.bench import capacity_run
    from memascend_cli.console import err

    doc, all_ok = capacity_run.run_capacity(axis, base, run_specs, out_dir=out_dir, **kw)
    if not as_json:
        capacity_run.render_table(doc)
        err.print(f"wrote {out_dir}")
    return doc, all_ok


def _check_modes(capacity: str | None, *, ranks: int, dram_cap, layers, seq_len, micro_batch, region, ssd_bandwidth,
                 probe_timeout: float | None, resume: bool) -> None:
    """The options that go together: --ranks 1 or 2; --capacity's rules; --probe-timeout and --resume with it only."""
    if ranks not in (1, 2):
        raise BadInput(f"--ranks {ranks} is not supported", "use --ranks 1 or --ranks 2")
    if capacity is not None:
        _check_capacity(capacity, dram_cap=dram_cap, layers=layers, seq_len=seq_len, micro_batch=micro_batch,
                        region=region)
        if ssd_bandwidth is not None:
            raise BadInput("--ssd-bandwidth does not apply to --capacity", "drop --ssd-bandwidth")
    elif probe_timeout is not None or resume:
        flag = "--probe-timeout" if probe_timeout is not None else "--resume"
        raise BadInput(f"{flag} applies to --capacity only", f"add --capacity AXIS, or drop {flag}")
    if probe_timeout is not None and probe_timeout <= 0:
        raise BadInput("--probe-timeout must be positive", "give seconds, e.g. --probe-timeout 1800")


def _measure(template, caps: list[int] | None, run_specs, points: list[tuple[int, int]], layers_given: bool,
             placement: str | None, *, repeat: int, dram_cap_bytes: int | None, **kw) -> tuple[dict, bool]:
    """A --placements sweep over `caps` (its one point's depth; a cap and one repeat per point), else the sweep over
    (layers, seq_len) `points`."""
    import dataclasses

    from memascend_cli.bench import placements, sweep

    if caps is None:
        return sweep.run_sweep(template, points, run_specs, layers_given=layers_given, placement=placement,
                               repeat=repeat, dram_cap_bytes=dram_cap_bytes, **kw)
    layers = points[0][0]
    spec = template.spec if layers == template.spec.num_hidden_layers else template.spec.scaled(layers)
    return placements.run_placements(dataclasses.replace(template, spec=spec, layers=layers if layers_given else None),
                                     caps, **kw)


def _check_placements(placements: str | None, placement: str | None, capacity, dram_cap, layers, seq_len,
                      repeat: int, runs: str, ablation: bool) -> list[int] | None:
    """--placements' caps (None without it) and its rules: it picks each point's cap, runs and placements, on one
    job."""
    from memascend_cli.planner.placement import PLACEMENTS

    if placement is not None and placement not in PLACEMENTS:
        raise BadInput(f"unknown --placement {placement!r}", "use " + ", ".join(PLACEMENTS))
    if placements is None:
        return None
    sweeps = [f for f, v in (("--layers", layers), ("--seq-len", seq_len)) if v is not None and "," in str(v)]
    given = [f for f, v in (("--capacity", capacity), ("--dram-cap", dram_cap), ("--placement", placement),
                            ("--ablation", ablation or None)) if v is not None]
    if runs != "stock,tuned,memascend":
        given.append("--runs")
    if repeat != 1:
        given.append("--repeat")
    if given or sweeps:
        flag = (given + sweeps)[0]
        raise BadInput(f"{flag} does not apply to --placements", "--placements picks each point's DRAM cap, runs and "
                       f"placements on one job: drop {flag}")
    from memascend_cli.bench.placements import parse_caps
    from memascend_cli.run.cgroup import check_available

    caps = parse_caps(placements)
    check_available()
    return caps


def _check_values(*, micro_batch: int, grad_accum: int, steps: int, repeat: int, gradient_clipping: float | None,
                  checkpointing: str, loss: str, dtype: str, accelerator: str) -> None:
    from memascend_cli.bench.runs import ACCELERATORS, LOSSES

    for name, value in (("--micro-batch", micro_batch), ("--grad-accum", grad_accum), ("--steps", steps),
                        ("--repeat", repeat)):
        if value < 1:
            raise BadInput(f"{name} must be at least 1", "give a positive whole number")
    if gradient_clipping is not None and gradient_clipping < 0:
        raise BadInput("--gradient-clipping must be 0 (off) or positive", "give e.g. --gradient-clipping 1.0")
    if checkpointing not in ("full", "none"):
        raise BadInput(f"unknown checkpointing {checkpointing!r}", "use full or none")
    if loss not in LOSSES:
        raise BadInput(f"unknown loss {loss!r}", "use " + " or ".join(LOSSES))
    if dtype not in ("bf16", "fp16", "fp32"):
        raise BadInput(f"unknown dtype {dtype!r}", "use bf16, fp16 or fp32")
    if accelerator not in ACCELERATORS:
        raise BadInput(f"unknown accelerator {accelerator!r}", "use " + ", ".join(ACCELERATORS))


def _dram_cap_bytes(dram_cap: str | None) -> int | None:
    """--dram-cap in bytes, after checking that this machine can make memory cgroups."""
    if dram_cap is None:
        return None
    from memascend_cli.run.cgroup import check_available

    cap_bytes = parse_size(dram_cap, "--dram-cap")
    check_available()
    return cap_bytes


def _ssd_bytes_per_s(ssd_bandwidth: str | None) -> int | None:
    """--ssd-bandwidth in bytes/s, after checking that this machine can make io cgroups."""
    if ssd_bandwidth is None:
        return None
    from memascend_cli.run.cgroup import check_available
    from memascend_cli.units import parse_bandwidth_gbps

    limit = int(parse_bandwidth_gbps(ssd_bandwidth, "--ssd-bandwidth") * 1e9)
    check_available("io")
    return limit
