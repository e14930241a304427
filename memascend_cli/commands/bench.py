"""`memascend bench`: the same job with stock DeepSpeed, tuned stock DeepSpeed and memascend, side by side.

Thin: parse options -> checks (nvme dir, engine, region) -> one child per run (memascend_cli.bench.run_one)
-> planner prediction per run -> JSON, PNG, Rich table. Exit codes: 0 every run finished, 1 a run
failed (the outputs are still written), 2 bad input.
"""

from __future__ import annotations

import typer

from memascend_cli.errors import EXIT_FAIL, BadInput

_J = "Job"
_R = "Runs"
_O = "Output"


def bench_command(
    model: str = typer.Option("bench-llama-136m", "--model", "-m", help="Model preset, HF config.json or model YAML "
                              "(random weights).", rich_help_panel=_J),
    seq_len: int = typer.Option(512, "--seq-len", "-s", help="Tokens per sequence.", rich_help_panel=_J),
    micro_batch: int = typer.Option(1, "--micro-batch", "-b", help="Sequences per rank per step.", rich_help_panel=_J),
    steps: int = typer.Option(5, "--steps", help="Training steps per run (s/step averages steps 2..N; step 1 also "
                              "records the parameter trace and creates the Adam states).", rich_help_panel=_J),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32.", rich_help_panel=_J),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and the synthetic token batches.",
                             rich_help_panel=_J),
    checkpointing: str = typer.Option("full", "--checkpointing", help="Activation checkpointing: full (memascend "
                                      "offloads it) or none.", rich_help_panel=_J),
    ranks: int = typer.Option(1, "--ranks", help="1, or 2 CPU ranks launched with torchrun (gloo).",
                              rich_help_panel=_J),
    runs: str = typer.Option("stock,tuned,memascend", "--runs", help="Comma list of stock (DeepSpeed as its docs "
                             "configure it), tuned (stock given every stock knob memascend sets), memascend.",
                             rich_help_panel=_R),
    ablation: bool = typer.Option(False, "--ablation", help="Add one memascend run per technique switched off "
                                  "(everything else identical; tuned is the 'knobs only' row).", rich_help_panel=_R),
    accelerator: str = typer.Option("auto", "--accelerator", help="auto (CUDA when this machine has an NVIDIA GPU, "
                                    "else CPU), cpu or cuda.", rich_help_panel=_R),
    nvme_dir: str = typer.Option(None, "--nvme-dir", help="Swap directory of the stock runs, on a real SSD file "
                                 "system (tmpfs is refused). Default: OUT/swap.", rich_help_panel=_R),
    region: str = typer.Option(None, "--region", help="memascend region (file or device) for the memascend runs. "
                               "Default: create OUT/bench.region with prepare-ssd's checks.", rich_help_panel=_R),
    settle_cap: float = typer.Option(150.0, "--settle-cap", help="Longest wait, in seconds, for memory to settle "
                                     "before each run.", rich_help_panel=_R),
    out_dir: str = typer.Option("bench-out", "--out", help="Output directory (bench.json, bench.png, run logs).",
                                rich_help_panel=_O),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document instead of the table.",
                                 rich_help_panel=_O),
) -> None:
    """Run one training job (params + optimizer on NVMe) with stock DeepSpeed, tuned stock DeepSpeed and memascend,
    each in a child process, and compare peak system memory, step time, tokens/s and SSD traffic with the plan.

    Peak system memory = max(MemTotal - MemAvailable) sampled at >= 1 kHz while the child runs, minus the level
    it settled to before the launch (page cache dropped as root). Other jobs on the machine move this number.

    Examples:

        memascend bench --model tiny-llama --seq-len 64 --steps 2 --runs stock,tuned

        memascend bench --ranks 2 --ablation --out /mnt/nvme/bench
    """
    import os

    from memascend_cli import bench as B
    from memascend_cli.commands.plan import installed_deepspeed_version
    from memascend_cli.console import err, print_json, warn
    from memascend_cli.hardware import resolve_hardware
    from memascend_cli.models import load_model

    if ranks not in (1, 2):
        raise BadInput(f"--ranks {ranks} is not supported", "use --ranks 1 or --ranks 2")
    for name, value in (("--seq-len", seq_len), ("--micro-batch", micro_batch), ("--steps", steps)):
        if value < 1:
            raise BadInput(f"{name} must be at least 1", "give a positive whole number")
    if checkpointing not in ("full", "none"):
        raise BadInput(f"unknown checkpointing {checkpointing!r}", "use full or none")
    if dtype not in ("bf16", "fp16", "fp32"):
        raise BadInput(f"unknown dtype {dtype!r}", "use bf16, fp16 or fp32")
    if accelerator not in B.ACCELERATORS:
        raise BadInput(f"unknown accelerator {accelerator!r}", "use " + ", ".join(B.ACCELERATORS))
    run_specs = B.parse_runs(runs, ablation)
    spec = load_model(model)
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    nvme_dir = os.path.abspath(nvme_dir or os.path.join(out_dir, "swap"))
    nvme_info = B.check_nvme_dir(nvme_dir)
    hw = resolve_hardware(None, None)
    if accelerator == "auto":
        accelerator = "cuda" if hw.num_gpus > 0 else "cpu"
    if accelerator == "cpu" and hw.num_gpus > 0:
        import dataclasses

        hw = dataclasses.replace(hw, num_gpus=0)  # the planner then models a CPU-only job, as the runs are
    ds_version = installed_deepspeed_version()
    notes: list[str] = [
        ("peak system memory is machine-wide (MemTotal - MemAvailable): other processes' allocations during a run "
         "count too; others_rss_change_at_peak_bytes / peak_system_minus_others_bytes gauge that, and ru_maxrss / "
         "tree RSS are per process"),
    ]
    if os.geteuid() != 0:
        notes.append("not root: the page cache was not dropped before the runs, so the idle level is less stable")

    region_info = None
    if any(r.mode == "memascend" for r in run_specs):
        ok, why = B.engine_available()
        if not ok:
            warn(f"memascend runs will fail: {why}")
        elif region is None:
            region = os.path.join(out_dir, "bench.region")
            est = B.predict("memascend", B.build_ds_config("memascend", spec, micro_batch=micro_batch, dtype=dtype,
                                                            nvme_dir=nvme_dir, ranks=ranks), spec,
                            seq_len=seq_len, micro_batch=micro_batch, dtype=dtype, ranks=ranks,
                            checkpointing=checkpointing, hw=hw, deepspeed_version=ds_version)
            # The planner's SSD bytes per rank, 50% headroom for alignment and the engine's own metadata.
            size_bytes = int(est["nvme_bytes_per_rank"] * ranks * 1.5) + (64 << 20)
            err.print(f"creating region {region} ({size_bytes / 2**30:.1f} GiB)")
            region_info = B.create_region(region, size_bytes, ranks)

    aio_block, aio_depth = None, None
    if region is not None and os.path.exists(region):
        from memascend_cli import region as region_mod
        from memascend_cli.deepspeed_config import region_aio

        aio_block, aio_depth = region_aio(region_mod.read_header(region))  # what prepare-ssd measured, if probed
    job_args = ["--model", model, "--seq-len", str(seq_len), "--micro-batch", str(micro_batch), "--steps", str(steps),
                "--dtype", dtype, "--seed", str(seed), "--checkpointing", checkpointing]
    results = []
    from memascend_cli.commands.train import step_progress

    with step_progress(err) as progress:
        for run in run_specs:
            cfg = B.build_ds_config(run.mode, spec, micro_batch=micro_batch, dtype=dtype, nvme_dir=nvme_dir, ranks=ranks,
                                    aio_block_size=aio_block, aio_queue_depth=aio_depth)
            res = B.run_one(run, job_args=job_args, cfg=cfg, out_dir=out_dir, nvme_dir=nvme_dir, ranks=ranks,
                            micro_batch=micro_batch, seq_len=seq_len, steps=steps,
                            region=region if run.mode == "memascend" else None, progress=progress,
                            settle_cap_s=settle_cap, accelerator=accelerator)
            res.predicted = B.predict(run.mode, cfg, spec, seq_len=seq_len, micro_batch=micro_batch, dtype=dtype,
                                      ranks=ranks, checkpointing=checkpointing, hw=hw, deepspeed_version=ds_version,
                                      disabled=run.disabled)
            results.append(res)

    job = {"model": model, "num_params": spec.num_params, "seq_len": seq_len, "micro_batch": micro_batch,
           "steps": steps, "dtype": dtype, "seed": seed, "checkpointing": checkpointing, "ranks": ranks,
           "accelerator": accelerator,
           "deepspeed_version": ds_version, "nvme_dir": nvme_dir, "nvme_dir_fstype": nvme_info.get("fstype"),
           "region": region, "region_header": region_info}
    doc = B.build_document(job=job, hardware=hw.to_dict(), runs=results, notes=notes)
    json_path = os.path.join(out_dir, "bench.json")
    png_path = os.path.join(out_dir, "bench.png")
    problem = B.write_plot(doc, png_path)
    if problem:
        doc["notes"].append(problem)
    with open(json_path, "w") as f:
        import json

        json.dump(doc, f, indent=1)
    if as_json:
        print_json(doc)
    else:
        B.render_table(doc)
        err.print(f"wrote {json_path}" + ("" if problem else f" and {png_path}"))
    if not all(r.ok for r in results):
        raise typer.Exit(EXIT_FAIL)
