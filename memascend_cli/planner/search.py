"""Feasibility of an estimate on a machine, and searches for the largest job that fits. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace

from memascend_cli.models import ModelSpec, family_members
from memascend_cli.planner.memory import Estimate, JobSpec, estimate
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.units import GiB

RESOURCES = ("config", "dram", "gpu_memory", "nvme_space", "memlock")


@dataclass
class Verdict:
    """Whether one engine's job fits, and which resource binds (the fullest one)."""

    fits: bool
    binding: str
    """One of RESOURCES: the violated resource with the largest need/limit, else the fullest."""
    utilisation: dict[str, float]
    """need / limit per checked resource (1.0 = exactly full)."""
    reasons: list[str]
    """One line per violated resource."""

    def to_dict(self) -> dict:
        return {"fits": self.fits, "binding": self.binding,
                "utilisation": {k: round(v, 4) for k, v in self.utilisation.items()}, "reasons": self.reasons}


def check(est: Estimate, hw: HardwareSpec) -> Verdict:
    """Compare an estimate with the machine (deepspeed-notes §3.1 'Feasible iff ...')."""
    util: dict[str, float] = {}
    reasons: list[str] = []
    if est.config_errors:
        reasons.extend(est.config_errors)
        util["config"] = float("inf")
    dram = hw.usable_dram_gib * GiB
    util["dram"] = est.node_host_peak_bytes / dram if dram > 0 else float("inf")
    if util["dram"] > 1:
        top = max((i for i in est.items if i.tier == "host"), key=lambda i: i.bytes, default=None)
        why = f" (largest item: {top.label}, {top.bytes / GiB:.1f} GiB per rank)" if top is not None else ""
        reasons.append(f"needs {est.node_host_peak_bytes / GiB:.1f} GiB of host memory per node, "
                       f"{hw.usable_dram_gib:.1f} GiB usable{why}")
    if hw.num_gpus > 0:
        util["gpu_memory"] = est.gpu_peak_bytes / (hw.gpu_mem_gib * GiB) if hw.gpu_mem_gib > 0 else float("inf")
        if util["gpu_memory"] > 1:
            reasons.append(f"needs {est.gpu_peak_bytes / GiB:.1f} GiB per GPU, the GPU has {hw.gpu_mem_gib:.1f} GiB")
    if hw.nvme_free_gib is not None:
        util["nvme_space"] = est.node_nvme_bytes / (hw.nvme_free_gib * GiB) if hw.nvme_free_gib > 0 else float("inf")
        if util["nvme_space"] > 1:
            reasons.append(f"needs {est.node_nvme_bytes / GiB:.1f} GiB on the SSD, {hw.nvme_free_gib:.1f} GiB free")
    if not hw.can_lock_unlimited and hw.memlock_limit_gib is not None:
        limit = hw.memlock_limit_gib * GiB
        util["memlock"] = est.locked_bytes / limit if limit > 0 else (float("inf") if est.locked_bytes else 0.0)
        if util["memlock"] > 1:
            reasons.append(f"locks {est.locked_bytes / GiB:.2f} GiB per process, RLIMIT_MEMLOCK is "
                           f"{hw.memlock_limit_gib:.3f} GiB")
    binding = max(util, key=util.get)
    return Verdict(fits=not reasons, binding=binding, utilisation=util, reasons=reasons)


def fits(job: JobSpec, hw: HardwareSpec, engine: str) -> bool:
    return check(estimate(job, hw, engine), hw).fits


def _largest_int(ok, lo: int, hi: int, start: int | None = None) -> int | None:
    """Largest x in [lo, hi] with ok(x), assuming ok is monotone (True then False).

    Probes exponentially from `start` (a likely answer, e.g. the job's own value) so the number of
    estimates stays logarithmic.
    """
    start = lo if start is None else max(lo, min(hi, start))
    if start > lo and not ok(start):
        return _largest_int(ok, lo, start - 1)
    if start == lo and not ok(lo):
        return None
    good, step = start, 1
    while good + step <= hi and ok(good + step):
        good += step
        step *= 2
    bad = min(hi + 1, good + step)
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def max_micro_batch(job: JobSpec, hw: HardwareSpec, engine: str, limit: int = 65536) -> int | None:
    """Largest micro-batch at the job's sequence length that fits (None: not even 1)."""
    return _largest_int(lambda b: fits(replace(job, micro_batch=b), hw, engine), 1, limit, start=job.micro_batch)


def max_seq_len(job: JobSpec, hw: HardwareSpec, engine: str, granule: int = 256, limit_tokens: int = 1 << 24) -> int | None:
    """Longest sequence (a multiple of `granule`) at the job's micro-batch that fits."""
    n = _largest_int(lambda k: fits(replace(job, seq_len=k * granule), hw, engine), 1, limit_tokens // granule,
                     start=max(1, job.seq_len // granule))
    return None if n is None else n * granule


def max_layers(job: JobSpec, hw: HardwareSpec, engine: str, limit: int = 2048) -> ModelSpec | None:
    """The deepest version of the job's architecture that fits (scaled architecture search)."""
    n = _largest_int(lambda L: fits(replace(job, model=job.model.scaled(L)), hw, engine), 1, limit,
                     start=job.model.num_hidden_layers)
    return None if n is None else job.model.scaled(n)


def largest_family_member(job: JobSpec, hw: HardwareSpec, engine: str) -> ModelSpec | None:
    """The largest preset of the job's model family that fits."""
    best = None
    for m in family_members(job.model):
        if fits(replace(job, model=m), hw, engine):
            best = m
    return best


@dataclass
class SearchResult:
    engine: str
    max_micro_batch: int | None
    max_seq_len: int | None
    largest_preset: str | None
    largest_preset_params: int | None
    max_layers: int | None
    max_layers_params: int | None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def search(job: JobSpec, hw: HardwareSpec, engine: str) -> SearchResult:
    fam = largest_family_member(job, hw, engine)
    deep = max_layers(job, hw, engine)
    return SearchResult(
        engine=engine,
        max_micro_batch=max_micro_batch(job, hw, engine),
        max_seq_len=max_seq_len(job, hw, engine),
        largest_preset=fam.name if fam else None,
        largest_preset_params=fam.num_params if fam else None,
        max_layers=deep.num_hidden_layers if deep else None,
        max_layers_params=deep.num_params if deep else None,
    )
