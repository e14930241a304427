"""Each run's DeepSpeed config and child environment, and the planner's prediction of the run. Pure."""

from __future__ import annotations

import json

from memascend_cli.bench.runs import MODES
from memascend_cli.planner.job import DEEPSPEED_GRADIENT_CLIPPING, DTYPE_BYTES
from memascend_cli.run.dsconfig import adamw, ds_config
from memascend_cli.defaults import ENGINE_ENV
from memascend_cli.errors import BadInput
from memascend_cli.planner import zero
from memascend_cli.run.cpu_env import cpu_rank_env


def resolve_settings(mode: str, spec, *, dtype: str, ranks: int, aio_block_size: int | None = None,
                     aio_queue_depth: int | None = None) -> zero.ZeroSettings:
    """The ZeRO settings of one run (zero.resolve: tuned and memascend get the same stock knobs). Pure."""
    if mode not in MODES:
        raise BadInput(f"unknown mode {mode!r}", "modes are " + ", ".join(MODES))
    if dtype not in DTYPE_BYTES:
        raise BadInput(f"unknown dtype {dtype!r}", "use bf16, fp16 or fp32")
    return zero.resolve(mode, model=spec, world_size=ranks, elem_bytes=DTYPE_BYTES[dtype],
                        aio_block_size=aio_block_size, aio_queue_depth=aio_queue_depth)


def build_ds_config(mode: str, spec, *, micro_batch: int, dtype: str, nvme_dir: str, ranks: int, lr: float = 1e-4,
                    aio_block_size: int | None = None, aio_queue_depth: int | None = None,
                    grad_accum: int = 1, gradient_clipping: float | None = None, choice=None) -> dict:
    """The DeepSpeed config of one run (`gradient_clipping` None: DeepSpeed's default; `choice`: its placement,
    planner.placement_choice.Choice, None: every byte on the SSD). Pure.

    stock: what a user writes from DeepSpeed's docs for ZeRO-Infinity (params + optimizer on NVMe), every knob at
      its default except buffer_size, raised to fit the largest partition.
    tuned: stock DeepSpeed given every stock knob memascend sets (zero.memascend_knobs), the same aio settings and
      (child_env) the same exact-size native pinning.
    memascend: byte-for-byte the tuned config; the engine's install() finds nothing to change in it.
    """
    s = resolve_settings(mode, spec, dtype=dtype, ranks=ranks, aio_block_size=aio_block_size,
                         aio_queue_depth=aio_queue_depth)
    if choice is not None:
        s = choice.settings(s)
    return ds_config(s, nvme_path=nvme_dir, micro_batch=micro_batch, grad_accum=grad_accum, precision=dtype,
                     optimizer=adamw(lr), gradient_clipping=gradient_clipping,
                     devices=choice.devices if choice is not None else ("nvme", "nvme"))


def child_env(mode: str, cfg: dict, base: dict, *, cpu_cores: int, ranks: int, accelerator: str = "cpu") -> dict:
    """Environment of a run's child: the accelerator, on the CPU the ranks' threads and MKL branch as `train` sets
    them (run.cpu_env, the same for every mode), the settings' environment (DS_PIN_MEMORY_BACKEND: native for tuned
    and memascend, DeepSpeed's default torch allocator for stock) and, for memascend, the engine's allocator
    environment (defaults.ENGINE_ENV)."""
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"
    if accelerator == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env.update(cpu_rank_env(cpu_cores, ranks))
    elif accelerator == "cuda":
        env["DS_ACCELERATOR"] = "cuda"
    env.pop("DS_PIN_MEMORY_BACKEND", None)
    settings = zero.from_ds_config(cfg, {"DS_PIN_MEMORY_BACKEND": "native" if mode != "stock" else "torch"})
    env.update(settings.env())
    if mode == "memascend":
        env.update(ENGINE_ENV)
    return env


def run_settings(mode: str, cfg: dict) -> zero.ZeroSettings:
    """The settings a run's child really gets (read back from its config and environment, so plan and run cannot
    drift). Pure."""
    return zero.from_ds_config(cfg, child_env(mode, cfg, {}, cpu_cores=1, ranks=1))  # threads decide no setting


def checkpointing_impl(mode: str, disabled: tuple[str, ...] = ()) -> str:
    """Which activation checkpointing a run uses when it checkpoints: `hf` (transformers' non-reentrant, what a stock
    user writes) for stock; memascend's checkpoint function for tuned and memascend (`memascend`, with the engine's
    exact pinned host buffers on a GPU) so tuned stock and memascend run the same implementation."""
    return "hf" if mode == "stock" else "memascend"


def loss_impl(mode: str, loss: str) -> str:
    """The loss a run computes: transformers' own for stock (what a stock user runs); the job's for tuned and
    memascend, so tuned stock gets memascend's chunked loss as it gets its checkpoint function."""
    return "hf" if mode == "stock" else loss


def bench_launcher_processes(ranks: int) -> int:
    """Launcher processes beside the ranks (see child_command): none for one rank, torchrun for more."""
    return 0 if ranks == 1 else 1


def plan_job(mode: str, cfg: dict, spec, *, seq_len: int, micro_batch: int, dtype: str, ranks: int,
             checkpointing: str, deepspeed_version: str, disabled: tuple[str, ...] = (),
             checkpoint_offload: str = "ssd", host_budget_bytes: int | None = None, loss: str = "hf",
             moments: str = "fp32", optimizer_depth: int | None = None):
    """(the planner's JobSpec of one run, the estimate's engine: stock code with the run's own knobs for stock and
    tuned). `disabled`: the memascend techniques switched off (ablation runs); `optimizer_depth`: memascend's chunks
    in flight (None: the planner's default). Pure."""
    from memascend_cli.planner.memory import JobSpec

    offloaded = checkpointing_impl(mode) == "memascend" and (mode != "memascend"
                                                             or "offload_checkpointing" not in disabled)
    ck = "none" if checkpointing != "full" else ("offload" if offloaded else "full")
    job = JobSpec(model=spec, seq_len=seq_len, micro_batch=micro_batch, dtype=dtype, ranks_per_node=ranks,
                  grad_accum_steps=int(cfg.get("gradient_accumulation_steps", 1)),
                  checkpointing=ck, deepspeed_version=deepspeed_version, knobs=run_settings(mode, cfg),
                  checkpoint_copies=0, streaming="streaming" not in disabled,
                  bounded_norm="bounded_norm" not in disabled,
                  accumulate_in_dram="accumulate_in_dram" not in disabled,
                  overlap_optimizer="overlap_optimizer" not in disabled,
                  norm_worker="norm_worker" not in disabled,
                  master_from_params="master_from_params" not in disabled,
                  params_hold_master="params_hold_master" not in disabled,
                  optimizer_moments=moments if mode == "memascend" else "fp32",
                  optimizer_depth=optimizer_depth if mode == "memascend" else None,
                  gradient_clipping=float(cfg.get("gradient_clipping", DEEPSPEED_GRADIENT_CLIPPING)),
                  checkpoint_offload=checkpoint_offload if mode == "memascend" else "dram",
                  host_budget_bytes=host_budget_bytes if mode == "memascend" else None,
                  launcher_processes=bench_launcher_processes(ranks), chunked_loss=loss_impl(mode, loss) == "chunked")
    return job, "memascend" if mode == "memascend" else "stock"


def predict(mode: str, cfg: dict, spec, *, seq_len: int, micro_batch: int, dtype: str, ranks: int,
            checkpointing: str, hw, deepspeed_version: str, disabled: tuple[str, ...] = (),
            checkpoint_offload: str = "ssd", host_budget_bytes: int | None = None, timing: dict | None = None,
            loss: str = "hf", moments: str = "fp32", placement: dict | None = None,
            optimizer_depth: int | None = None) -> dict:
    """memascend plan's estimate for one run (plan_job): node peak plus the host items (for recalibration), and
    with `timing` ({device: planner.time.Device, read_gbps, write_gbps}: the SSD bandwidth the run gets, the
    throttle's under --ssd-bandwidth) the plan's step time (`time`, planner.time.engine_times); `placement`: where
    the run kept its bytes (placed_estimate)."""
    from memascend_cli.planner.memory import estimate

    job, engine = plan_job(mode, cfg, spec, seq_len=seq_len, micro_batch=micro_batch, dtype=dtype, ranks=ranks,
                           checkpointing=checkpointing, deepspeed_version=deepspeed_version, disabled=disabled,
                           checkpoint_offload=checkpoint_offload, host_budget_bytes=host_budget_bytes, loss=loss,
                           moments=moments, optimizer_depth=optimizer_depth)
    est = placed_estimate(job, hw, estimate(job, hw, engine), placement)
    step = None
    if timing is not None and est.traffic is not None:
        from memascend_cli.planner import time as tm

        key = tm.timed_as(mode, job.knobs.prefetch_bucket_size)
        t = tm.engine_times(job, {key: est}, timing["device"], read_gbps=timing["read_gbps"],
                            write_gbps=timing["write_gbps"], cpu_cores=hw.cpu_cores,
                            duplex_io=timing.get("duplex_io", False))[key]
        step = {**t.to_dict(), "read_gbps": timing["read_gbps"], "write_gbps": timing["write_gbps"],
                "device": timing["device"].name, "gflops": None if timing["device"].flops_per_s is None
                else round(timing["device"].flops_per_s / 1e9, 1), "device_source": timing["device"].source}
    return plan_document(est, hw, step)


def placed_estimate(job, hw, est, placement: dict | None):
    """The estimate `est` of a run's config as its placement (runs[].placement, bench --placement / --placements)
    ran it, its DRAM-resident bytes off the SSD. memascend: the dram row (the tier holds every state, checkpoints too,
    the parameters where the run's config put them) or the tier of the bytes per rank the run was given
    (dram_tier_bytes) over the traffic of the path its steps took,
    held by the engine's rule with the overlap as the engine was set (`tier_overlap`: it keeps two generations of
    optimizer chunks whether or not a step commits the speculation; planner.placement.memascend_tier) and in the
    order its engine took (`tier_gradients_first`: False for engines before planner.dram_tier.ORDER). Stock: the dram
    row, offload_optimizer cpu (planner.placement.stock_row); its split is the config's max_in_cpu, which `est`
    already keeps in DRAM (planner.ssd.params_in_dram). Pure."""
    from dataclasses import replace

    from memascend_cli.planner import placement as pl

    where = (placement or {}).get("placement", "ssd")
    if where == "ssd":
        return est
    if placement.get("row_engine") != "memascend":
        return pl.stock_row(job, hw, where).est if where in ("dram", "gpu") else est
    if where == "dram":  # the parameters where the run's config put them (nvme: held in the tier, as runs before)
        # its heap kept between layers where its engine kept it (layer_trims False; None: an engine that trimmed)
        return pl.memascend_dram_row(job, hw, placement.get("offload_param") or pl.PARAMS_FROM_TIER,
                                     layer_trims=placement.get("layer_trims") is not False).est
    rule = replace(job, overlap_optimizer=placement.get("tier_overlap", job.overlap_optimizer))
    _, items, traffic = pl.memascend_tier(rule, hw, est, int(placement.get("dram_tier_bytes") or 0),
                                          gradients_first=placement.get("tier_gradients_first", True))
    return replace(est, items=est.items + items, traffic=traffic)


def plan_document(est, hw, time: dict | None) -> dict:
    """A run's plan as the bench records it: the node peak plus the host items (for recalibration), SSD space and
    traffic, the host budget, and `time` (the step time's document). Pure."""
    return {
        "engine": est.engine,
        "node_host_peak_bytes": est.node_host_peak_bytes,
        "host_peak_bytes_per_rank": est.host_peak_bytes,
        "host_steady_bytes_per_rank": est.host_steady_bytes,
        "gpu_peak_bytes": est.gpu_peak_bytes if hw.num_gpus else None,
        "nvme_bytes_per_rank": est.nvme_bytes,
        "host_items": [{"key": i.key, "kind": i.kind, "bytes": i.bytes} for i in est.items if i.tier == "host"],
        "config_errors": list(est.config_errors),
        "ssd_traffic": est.traffic.to_dict() if est.traffic else None,
        "host_budget": est.budget.to_dict() if est.budget else None,
        "time": time,
    }


def row_prediction(row, hw) -> dict:
    """predict's document from a priced placement row (planner.placement.Priced: its estimate and step time), for a
    run whose placement keeps bytes off the SSD (the run's config alone does not say where DeepSpeed's cpu offload
    or memascend's DRAM tier puts them). Pure."""
    return {**plan_document(row.est, hw, row.time.to_dict() if row.time else None), "placement": row.placement,
            "placement_config": row.config}


REGION_HEADROOM = 1.5
"""A bench region holds the planner's SSD bytes plus the checkpoint stream, 50% more for alignment and metadata."""


def ssd_space_bytes(mode: str, predicted: dict, ranks: int) -> int:
    """SSD space a run takes: memascend's fresh region (REGION_HEADROOM, 64 MiB for its header), stock's and tuned's
    swap files (the planner's SSD bytes). Pure."""
    if mode != "memascend":
        return int(predicted["nvme_bytes_per_rank"] * ranks)
    act = (predicted.get("ssd_traffic") or {}).get("write_bytes", {}).get("activation_checkpoints", 0)
    return int((predicted["nvme_bytes_per_rank"] + act) * ranks * REGION_HEADROOM) + (64 << 20)


def engine_args(predicted: dict) -> list[str]:
    """The memascend child's window arguments: the planner's split of the host budget, so plan and run agree."""
    b = predicted.get("host_budget")
    if not b:
        return []
    return ["--engine-windows", json.dumps(b["windows"]), "--prefetch-layers", str(b["prefetch_layers"])]


def recorded_spec(job: dict):
    """The model a recorded bench job ran: its preset, scaled to the job's layer count. Pure."""
    from memascend_cli.models import load_model

    spec = load_model(job["model"])
    if job.get("layers") and job["layers"] != spec.num_hidden_layers:
        spec = spec.scaled(job["layers"])
    return spec


def recorded_hardware(doc: dict):
    """The machine a recorded bench document ran on, as the planner sees it (CPU-only unless the job used CUDA)."""
    from memascend_cli.planner.spec import HardwareSpec

    cuda = doc["job"].get("accelerator") == "cuda"
    hw_doc = doc.get("hardware") or {}
    return HardwareSpec(name=hw_doc.get("name", "recorded"), dram_gib=float(hw_doc.get("dram_gib", 24.0)),
                        num_gpus=int(hw_doc.get("num_gpus", 0)) if cuda else 0,
                        gpu_mem_gib=float(hw_doc.get("gpu_mem_gib", 0.0)) if cuda else 0.0,
                        cpu_cores=int(hw_doc.get("cpu_cores", 1)))


def _recorded_job_args(j: dict, run: dict) -> dict:
    """plan_job's / predict's job arguments of a recorded run (its document's `job` and the run entry)."""
    disabled = tuple(run.get("disabled") or ())
    bucket = ((run.get("config") or {}).get("zero_optimization") or {}).get("reduce_bucket_size")
    if bucket is not None and int(bucket) > zero.OVERLAP_REDUCE_BUCKET_SIZE:
        disabled += ("overlap_optimizer",)  # recorded before the overlap and its reduce bucket (tuned runs too)
    elif run.get("mode") == "memascend" and not speculation_committed(run):
        disabled += ("overlap_optimizer",)  # its steps clipped: not speculated
    if run.get("mode") == "memascend" and "bounded_norm" not in (_engine_stats(run).get("options") or {}):
        disabled += ("bounded_norm",)  # recorded before the bounded norm: DeepSpeed's 250M-element fp64 pieces
    if run.get("mode") == "memascend" and "norms_on_worker" not in (_engine_stats(run).get("counters") or {}):
        disabled += ("norm_worker",)  # recorded before it: the norms and copies on the thread that drives backward
    if run.get("mode") == "memascend" and "master_from_params" not in (_engine_stats(run).get("options") or {}):
        disabled += ("master_from_params",)  # recorded before it: the master read from the SSD
    if run.get("mode") == "memascend" and "params_hold_master" not in (_engine_stats(run).get("options") or {}):
        disabled += ("params_hold_master",)  # recorded before it: the master written beside the parameters
    elif (run.get("mode") == "memascend" and j["dtype"] == "bf16"
          and "master_split" not in (_engine_stats(run).get("bounded") or {"master_split": False})):
        disabled += ("params_hold_master",)  # bf16 recorded before OptimizerPipeline.split: the master beside them
    return dict(seq_len=j["seq_len"], micro_batch=j["micro_batch"], dtype=j["dtype"], ranks=j["ranks"],
                checkpointing=j["checkpointing"], deepspeed_version=j["deepspeed_version"],
                disabled=disabled, host_budget_bytes=j.get("host_budget_bytes"),
                loss=j.get("loss", "hf"),  # jobs recorded before the chunked loss ran transformers' own
                moments=run.get("optimizer_moments", "fp32"),
                optimizer_depth=recorded_optimizer_depth(run))


def recorded_optimizer_depth(run: dict) -> int | None:
    """The optimizer chunks in flight of a recorded memascend run (bf16 moments ran 3 before
    windows.BF16_MOMENTS_PIPELINE_DEPTH), None where its record does not say. Pure."""
    depth = ((_engine_stats(run).get("bounded") or {}).get("windows") or {}).get("optimizer_depth")
    return None if depth is None else int(depth)


def _engine_stats(run: dict) -> dict:
    """The first rank's engine stats of a recorded run ({} for stock, tuned and runs recorded without them)."""
    return (run.get("engine_stats") or [{}])[0] or {}


def engine_option(run: dict, name: str, default):
    """A recorded memascend run's engine option `name` (its first rank's stats), `default` where the run recorded
    none (stock, tuned, or an engine from before the option). Pure."""
    return (_engine_stats(run).get("options") or {}).get(name, default)


def tier_gradients_first(run: dict) -> bool:
    """Whether a recorded memascend run's DRAM tier took the gradients before the optimizer chunks: its tier's stats
    record the rule's order (planner.dram_tier.ORDER) since it does; a tier recorded without one took the chunks
    first. True for a run without a tier (nothing held: the order decides nothing). Pure."""
    from memascend_cli.planner import dram_tier

    tier = (_engine_stats(run).get("region_io") or {}).get("dram_tier")
    return tier is None or tier.get("order", "params,groups,gradients") == dram_tier.ORDER


def speculation_committed(run: dict) -> bool:
    """Most of a recorded memascend run's steps committed the optimizer's overlap with backward (its engine
    counters; memascend_engine.overlap). The plan assumes they do; a run whose gradient norm stayed above the clip
    did not speculate, and is planned as such. Pure."""
    o = _engine_stats(run).get("overlap") or {}
    done = o.get("steps_committed", 0)
    return done > 0 and done >= o.get("steps_redone", 0) + o.get("steps_not_speculated", 0)


def recorded_plan_job(doc: dict, run: dict):
    """plan_job of a recorded run: (the planner's JobSpec, the estimate's engine). Pure."""
    return plan_job(run["mode"], run["config"], recorded_spec(doc["job"]), **_recorded_job_args(doc["job"], run))


def repredict(doc: dict, run: dict) -> dict:
    """Today's planner on a recorded run: its exact config, job, techniques, placement and machine (CPU-only unless
    the run used CUDA). Pure: what scripts/results.py and the planner-validation test compare with the measured peak."""
    j = doc["job"]
    placement = run.get("placement")
    if placement:  # the tier's rule follows the engine's options, whatever its steps did (placed_estimate)
        placement = {**placement, "tier_overlap": bool(engine_option(run, "overlap_optimizer", True)),
                     "tier_gradients_first": tier_gradients_first(run)}
    return predict(run["mode"], run["config"], recorded_spec(j), hw=recorded_hardware(doc),
                   timing=recorded_timing(j), placement=placement, **_recorded_job_args(j, run))


def recorded_probe_gflops(timing: dict) -> float | None:
    """The CPU probe's own GFLOP/s behind a recorded `job.timing`: its rate over the fraction of its day
    (`cpu_fraction`; 1.0 before documents recorded it); None for a rate that is not the probe's (--cpu-gflops, a
    GPU). Pure."""
    from memascend_cli.compute_probe import PROBE_SOURCE

    if not timing.get("gflops") or not (timing.get("device_source") or "").startswith(PROBE_SOURCE):
        return None
    return timing["gflops"] / timing.get("cpu_fraction", 1.0)


def recorded_timing(job: dict) -> dict | None:
    """The time model's inputs a bench job recorded (`job.timing`: the device's GFLOP/s, the SSD GB/s the runs
    got), for predict; None for jobs recorded without them or with a rate unknown. Pure."""
    from memascend_cli.planner import measured
    from memascend_cli.planner import time as tm

    t = job.get("timing") or {}
    if not (t.get("gflops") and t.get("read_gbps") and t.get("write_gbps")):
        return None
    cuda = job.get("accelerator") == "cuda"
    probe = None if cuda else recorded_probe_gflops(t)
    gflops = t["gflops"] if probe is None else probe * tm.CPU_ACHIEVED_FRACTION  # replanned with today's fraction
    # A GPU run is replanned with the rates measured on its box, when the constants file given is of that GPU.
    device = tm.gpu_device(t.get("device"), measured_tflops=gflops / 1e3,
                           rates=measured.time_rates(t.get("device"))) if cuda else \
        tm.cpu_device(gflops, t.get("device_source") or "recorded", t.get("cpu_model"))
    return {"device": device, "read_gbps": t["read_gbps"], "write_gbps": t["write_gbps"],
            "duplex_io": bool(job.get("ssd_bandwidth_bytes_per_s"))}
