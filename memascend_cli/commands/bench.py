"""`memascend bench`: the same job with stock DeepSpeed, tuned stock DeepSpeed and memascend, side by side.

Thin: parse options -> checks (nvme dir, engine) -> for every point of the sweep (layers x sequence length): a
region, one child per run (memascend_cli.bench.runner), the planner's prediction per run, JSON + PNG; then the
sweep summary (flatness, GiB per billion parameters). With --capacity: each engine's search for the largest value of
one axis under --dram-cap (memascend_cli.bench.capacity_run). Exit codes: 0 every run finished (with --capacity: every
probe trained or was OOM-killed), 1 a run failed (the outputs are still written), 2 bad input.
"""

from __future__ import annotations

import typer

from memascend_cli.bench.capacity import CAPACITY_STEPS, PROBE_TIMEOUT_RULE
from memascend_cli.errors import EXIT_FAIL, BadInput

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
    model: str = typer.Option("bench-llama-136m", "--model", "-m", help="Model preset, HF config.json or model YAML "
                              "(random weights).", rich_help_panel=_J),
    seq_len: str = typer.Option(None, "--seq-len", "-s", help="Tokens per sequence; a comma list sweeps it "
                                "(e.g. 512,2048,8192). Default: 512; 2048 with --capacity.", rich_help_panel=_J,
                                show_default=False),
    layers: str = typer.Option(None, "--layers", help="Decoder layers of the model (same width); a comma list "
                               "sweeps the depth (e.g. 8,16,32). Default: the model's own.", rich_help_panel=_J,
                               show_default=False),
    micro_batch: int = typer.Option(None, "--micro-batch", "-b", help="Sequences per rank per step. Default: 1.",
                                    rich_help_panel=_J, show_default=False),
    grad_accum: int = typer.Option(1, "--grad-accum", help="Micro-batches per optimizer step (gradient accumulation); "
                                   "s/step and tokens/s count whole steps.", rich_help_panel=_J),
    gradient_clipping: float = typer.Option(None, "--gradient-clipping", help="DeepSpeed's gradient_clipping (global "
                                            "norm; 0: off). Default: DeepSpeed's, 1.0.", rich_help_panel=_J,
                                            show_default=False),
    steps: int = typer.Option(None, "--steps", help="Training steps per run (s/step averages steps 2..N; step 1 also "
                              "records the parameter trace and creates the Adam states). Default: 5; 4 with "
                              "--capacity (the heap of stock and tuned can grow again in step 3).",
                              rich_help_panel=_J, show_default=False),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32.", rich_help_panel=_J),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and the synthetic token batches.",
                             rich_help_panel=_J),
    checkpointing: str = typer.Option("full", "--checkpointing", help="Activation checkpointing: full (memascend "
                                      "offloads it) or none.", rich_help_panel=_J),
    loss: str = typer.Option("chunked", "--loss", help="The loss tuned and memascend compute: chunked (lm_head + "
                             "cross-entropy in 64 MiB logit chunks) or hf (transformers' own, full b x s x V "
                             "logits). Stock always computes transformers' own.", rich_help_panel=_J),
    ranks: int = typer.Option(1, "--ranks", help="1, or 2 CPU ranks launched with torchrun (gloo).",
                              rich_help_panel=_J),
    host_budget: str = typer.Option(None, "--host-budget", help="memascend's pinned + staging memory per rank, e.g. "
                                    "2GiB. Default: what full overlap needs.", rich_help_panel=_J, show_default=False),
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
    region: str = typer.Option(None, "--region", help="memascend region (file or device) for the memascend runs. "
                               "Default: create one in OUT with prepare-ssd's checks and bandwidth probe (the time model's "
                               "SSD rate).", rich_help_panel=_R),
    repeat: int = typer.Option(1, "--repeat", help="Runs of each engine, one after another in one sitting; the "
                               "table and JSON report the repeat with the median peak (a failed one if any failed), "
                               "every repeat's peak is kept in the JSON. With --capacity: runs per probe, a value "
                               "fits when every one fits.", rich_help_panel=_R),
    dram_cap: str = typer.Option(None, "--dram-cap", help="Run every engine in its own memory cgroup of this size, "
                                 "e.g. 6GiB (needs root): a run OOM-killed in it reads `does not fit` and the others "
                                 "still run.", rich_help_panel=_R, show_default=False),
    ssd_bandwidth: str = typer.Option(None, "--ssd-bandwidth", help="Throttle each engine's reads and writes to "
                                      "the block device under the region and the swap directory to this much, e.g. "
                                      "400MB/s (its own io cgroup, needs root): compute:I/O like a GPU box's. The "
                                      "plan's predicted s/step uses it.", rich_help_panel=_R, show_default=False),
    cpu_gflops: float = typer.Option(None, "--cpu-gflops", help="CPU GFLOP/s for the plan's predicted s/step of a "
                                     "CPU run. Default: `memascend inspect --cpu-probe`'s cached measurement.",
                                     rich_help_panel=_R, show_default=False),
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
    resume: bool = typer.Option(False, "--resume", help="With --capacity: reuse the probes an earlier, cut-off "
                                "sitting left in --out (same job and cap, checked first; a probe without its "
                                "bench.json runs again); each probe's `sitting` says when it ran.",
                                rich_help_panel=_R),
    settle_cap: float = typer.Option(150.0, "--settle-cap", help="Longest wait, in seconds, for memory to settle "
                                     "before each run.", rich_help_panel=_R),
    out_dir: str = typer.Option("bench-out", "--out", help="Output directory (bench.json, its memory timelines in "
                                "bench.timeline.json.gz, bench.png, run logs; a sweep writes one folder per point and "
                                "sweep.json).", rich_help_panel=_O),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON summary instead of the table.",
                                 rich_help_panel=_O),
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
    import os

    from memascend_cli.bench import document, runner
    from memascend_cli.bench.runs import ACCELERATORS, LOSSES, parse_runs
    from memascend_cli.run.prepared import engine_available
    from memascend_cli.versions import installed_deepspeed_version
    from memascend_cli.console import err, print_json, warn
    from memascend_cli.hardware import resolve_hardware
    from memascend_cli.models import load_model
    from memascend_cli.units import parse_size

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
    seq_lens = _int_list(seq_len or ("2048" if capacity else "512"), "--seq-len")
    micro_batch = 1 if micro_batch is None else micro_batch
    steps = (CAPACITY_STEPS if capacity else 5) if steps is None else steps
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
    budget_bytes = parse_size(host_budget, "--host-budget") if host_budget else None
    dram_cap_bytes = parse_size(dram_cap, "--dram-cap") if dram_cap else None
    if dram_cap_bytes is not None:
        from memascend_cli.run.cgroup import check_available

        check_available()
    ssd_bytes_per_s = None
    if ssd_bandwidth is not None:
        from memascend_cli.units import parse_bandwidth_gbps

        ssd_bytes_per_s = int(parse_bandwidth_gbps(ssd_bandwidth, "--ssd-bandwidth") * 1e9)
        from memascend_cli.run.cgroup import check_available

        check_available("io")
    if cpu_gflops is not None and cpu_gflops <= 0:
        raise BadInput("--cpu-gflops must be positive", "e.g. --cpu-gflops 150")
    run_specs = parse_runs(runs, ablation)
    base_spec = load_model(model)
    depths = _int_list(layers, "--layers") if layers else [base_spec.num_hidden_layers]
    points = [(L, s) for L in depths for s in seq_lens]
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    nvme_dir = os.path.abspath(nvme_dir or os.path.join(out_dir, "swap"))
    nvme_info = runner.check_nvme_dir(nvme_dir)
    io_limits = ()
    if ssd_bytes_per_s is not None:
        from memascend_cli.run.iolimit import resolve_limits

        # The stock runs' swap files and memascend's region (a fresh one goes into OUT).
        io_limits = tuple(resolve_limits([nvme_dir, os.path.abspath(region) if region else out_dir], ssd_bytes_per_s))
    hw = resolve_hardware(None, None)
    if dram_cap_bytes is not None:
        hw = hw.under_dram_cap(dram_cap_bytes)  # every run's plan is of the node its cgroup makes
    probe_samples = None
    if region is not None and os.path.exists(region):
        from memascend_cli.ssd.path import apply_region, region_header

        hw = apply_region(hw, region)  # its probed bandwidth, when prepare-ssd measured one
        probe = getattr(region_header(region), "probe", None)
        probe_samples = probe.sample_rows() if probe is not None and probe.samples else None
    if accelerator == "auto":
        accelerator = "cuda" if hw.num_gpus > 0 else "cpu"
    if accelerator == "cpu" and hw.num_gpus > 0:
        hw = dataclasses.replace(hw, num_gpus=0)  # the planner then models a CPU-only job, as the runs are
    ds_version = installed_deepspeed_version()
    engine_ok = True
    if any(r.mode == "memascend" for r in run_specs):
        engine_ok, why = engine_available()
        if not engine_ok:
            warn(f"memascend runs will fail: {why}")

    import shlex
    import socket
    import sys
    from datetime import datetime, timezone

    meta = {"command": "memascend bench " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": socket.gethostname(),
            **({"title": title} if title else {})}
    # Every point's job but its depth and context (a capacity search also varies micro-batch).
    timing = _timing(hw, dtype, cpu_gflops, ssd_bytes_per_s, probe_samples)
    template = runner.Point(model=model, spec=base_spec, layers=None, seq_len=seq_lens[0], micro_batch=micro_batch,
                            steps=steps, dtype=dtype, seed=seed, checkpointing=checkpointing, ranks=ranks,
                            host_budget_bytes=budget_bytes, accelerator=accelerator, hw=hw,
                            deepspeed_version=ds_version, timing=timing, loss=loss, grad_accum=grad_accum,
                            gradient_clipping=gradient_clipping)
    if capacity is not None:
        from memascend_cli.bench import capacity_run

        base = dataclasses.replace(template, layers=depths[0] if layers else None)
        doc, all_ok = capacity_run.run_capacity(capacity, base, run_specs, cap_bytes=dram_cap_bytes, out_dir=out_dir,
                                                nvme_dir=nvme_dir, nvme_info=nvme_info, engine_ok=engine_ok,
                                                settle_cap_s=settle_cap, meta=meta,
                                                probe_timeout_s=probe_timeout, resume=resume, repeat=repeat)
        if as_json:
            print_json(doc)
        else:
            capacity_run.render_table(doc)
            err.print(f"wrote {out_dir}")
        if not all_ok:
            raise typer.Exit(EXIT_FAIL)
        return
    docs, all_ok = [], True
    for L, s in points:
        spec = base_spec if L == base_spec.num_hidden_layers else base_spec.scaled(L)
        point_dir = out_dir if len(points) == 1 else os.path.join(out_dir, f"layers{L}-seq{s}")
        os.makedirs(point_dir, exist_ok=True)
        point = dataclasses.replace(template, spec=spec, layers=L if layers else None, seq_len=s)
        doc = runner.run_point(point, run_specs, out_dir=point_dir, nvme_dir=nvme_dir, nvme_info=nvme_info,
                          region=region, engine_ok=engine_ok, settle_cap_s=settle_cap, repeat=repeat,
                          dram_cap_bytes=dram_cap_bytes, io_limits=io_limits)
        doc["meta"] = meta
        png_path = os.path.join(point_dir, "bench.png")
        problem = document.write_plot(doc, png_path)
        if problem:
            doc["notes"].append(problem)
        summary = document.write_document(doc, os.path.join(point_dir, "bench.json"))
        docs.append(doc)
        all_ok = all_ok and all(r["ok"] for r in doc["runs"])
        if not as_json:
            document.render_table(doc)
    result = summary
    if len(points) > 1:
        sweep = document.sweep_document(docs)
        sweep["meta"] = meta
        result = document.write_document(sweep, os.path.join(out_dir, "sweep.json"))
        if not as_json:
            document.render_sweep(result)
    if as_json:
        print_json(result)
    else:
        err.print(f"wrote {out_dir}")
    if not all_ok:
        raise typer.Exit(EXIT_FAIL)


def _timing(hw, dtype: str, cpu_gflops: float | None, ssd_bytes_per_s: int | None,
            probe_samples: list | None = None) -> dict:
    """The time model's inputs for the runs' predicted s/step: the compute device as `plan` resolves it, and the SSD
    bandwidth each run gets: the throttle where it is below the drive's (a drive of unknown speed is taken to be
    faster), else the drive's as prepare-ssd probed it (a region given with --region; runner.with_region_rates adds
    those of a region the bench creates), else unknown. The probe's
    every setting ([block bytes, queue depth, write GB/s, read GB/s]) goes along: the engines do not all issue
    requests of its best setting's size and depth."""
    from memascend_cli.compute_probe import plan_device
    from memascend_cli.hardware import local_cpu_model

    cpu_model = local_cpu_model()
    device = plan_device(hw, dtype, cpu_gflops=cpu_gflops, cpu_model=cpu_model)
    read, write = hw.nvme_read_gbps, hw.nvme_write_gbps
    source = "the region's probe" if read else None
    if ssd_bytes_per_s is not None:
        limit = ssd_bytes_per_s / 1e9
        read, write = min(read or limit, limit), min(write or limit, limit)
        source = "--ssd-bandwidth"
    # A throttle limits reads and writes separately (planner/time.py step_time duplex_io).
    return {"device": device, "read_gbps": read, "write_gbps": write, "source": source, "cpu_model": cpu_model,
            "duplex_io": ssd_bytes_per_s is not None, "probe_samples": probe_samples}
