"""Feasibility of an estimate on a machine, and searches for the largest job that fits. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace

from memascend_cli.models import ModelSpec, family_members
from memascend_cli.planner.memory import Estimate, JobSpec, estimate
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.planner.ssd import SPECULATIVE_STATES_KEY
from memascend_cli.units import GiB

RESOURCES = ("config", "dram", "gpu_memory", "nvme_space", "memlock")
GRID_END = "grid_end"
"""A search's binding 'resource' when its largest value is the end of the grid searched: the job may fit beyond."""
RESOURCE_NAMES = {"config": "config", "dram": "DRAM", "gpu_memory": "GPU memory", "nvme_space": "SSD space",
                  "memlock": "memlock", GRID_END: "grid end"}
"""How the plan prints each binding resource."""
MAX_LAYERS = 2048
"""The depth search's grid: 1, 2, ... MAX_LAYERS decoder layers."""
SEQ_GRANULE = 256
MAX_SEQ_TOKENS = 1 << 24
"""The context search's grid: SEQ_GRANULE, 2 x SEQ_GRANULE, ... MAX_SEQ_TOKENS tokens."""
MAX_MICRO_BATCH = 65536
"""The micro-batch search's grid: 1, 2, ... MAX_MICRO_BATCH sequences."""


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


def _overlap_share(est: Estimate, free_bytes: float) -> str:
    """The part of a memascend job's SSD need that its optimizer overlap adds, said when the job fits without it."""
    item = est.item(SPECULATIVE_STATES_KEY)
    extra = item.bytes * est.ranks_per_node if item else 0
    if not extra or est.node_nvme_bytes - extra > free_bytes:
        return ""
    return (f" ({extra / GiB:.1f} GiB of it the optimizer overlap's second set of states: "
            f"{(est.node_nvme_bytes - extra) / GiB:.1f} GiB with --no-overlap, recipe overlap_optimizer: false)")


def check(est: Estimate, hw: HardwareSpec) -> Verdict:
    """Compare an estimate with the machine: it fits when the node's host peak is within the usable DRAM, each GPU's
    peak within its memory, the SSD bytes within the free space and, unless the process may lock without limit, the
    locked bytes within RLIMIT_MEMLOCK."""
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
            where = f" at {hw.nvme_path}" if hw.nvme_path else ""
            reasons.append(f"needs {est.node_nvme_bytes / GiB:.1f} GiB on the SSD, {hw.nvme_free_gib:.1f} GiB free{where}"
                           + _overlap_share(est, hw.nvme_free_gib * GiB))
    if not hw.can_lock_unlimited and hw.memlock_limit_gib is not None:
        limit = hw.memlock_limit_gib * GiB
        util["memlock"] = est.locked_bytes / limit if limit > 0 else (float("inf") if est.locked_bytes else 0.0)
        if util["memlock"] > 1:
            reasons.append(f"locks {est.locked_bytes / GiB:.2f} GiB per process, RLIMIT_MEMLOCK is "
                           f"{hw.memlock_limit_gib:.3f} GiB")
    binding = max(util, key=util.get)
    return Verdict(fits=not reasons, binding=binding, utilisation=util, reasons=reasons)


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


BELOW_CHECKS = 64
"""Grid values below a search's answer checked to fit too (all of them, or this many evenly spaced)."""


def _largest_below_failures(ok, lo: int, hi: int, start: int) -> int | None:
    """_largest_int for an `ok` that is not always monotone: the plan's allocator model changes regime where a tensor
    crosses glibc's mmap threshold (heap.py), so a value can fit above values that do not. A job is no answer
    when a smaller one of the same kind does not fit: the values below the answer are checked (BELOW_CHECKS of
    them) and the search goes on under the first one that fails."""
    n = _largest_int(ok, lo, hi, start=start)
    while n is not None and n > lo:
        stride = max(1, -(-(n - lo) // BELOW_CHECKS))
        bad = next((x for x in range(lo, n, stride) if not ok(x)), None)
        if bad is None:
            return n
        n = None if bad == lo else _largest_int(ok, lo, bad - 1, start=lo)
    return n


def _largest_bound(verdict_at, lo: int, hi: int, start: int) -> tuple[int | None, str]:
    """(largest x in [lo, hi] whose verdict fits and every BELOW_CHECKS-sampled one below too, what binds there): the
    resource the next grid point runs out of, GRID_END when x is the grid's end, or what already fails at lo when
    nothing fits."""
    cache: dict[int, Verdict] = {}

    def at(x: int) -> Verdict:
        if x not in cache:
            cache[x] = verdict_at(x)
        return cache[x]

    n = _largest_below_failures(lambda x: at(x).fits, lo, hi, start)
    if n is None:
        return None, at(lo).binding
    return n, GRID_END if n == hi else at(n + 1).binding


def max_micro_batch(job: JobSpec, hw: HardwareSpec, engine: str,
                    limit: int = MAX_MICRO_BATCH) -> tuple[int | None, str]:
    """Largest micro-batch at the job's sequence length that fits (None: not even 1), and what binds it."""
    return _largest_bound(lambda b: check(estimate(replace(job, micro_batch=b), hw, engine), hw), 1, limit,
                          start=job.micro_batch)


def max_seq_len(job: JobSpec, hw: HardwareSpec, engine: str, granule: int = SEQ_GRANULE,
                limit_tokens: int = MAX_SEQ_TOKENS) -> tuple[int | None, str]:
    """Longest sequence (a multiple of `granule`) at the job's micro-batch that fits, and what binds it."""
    n, binding = _largest_bound(lambda k: check(estimate(replace(job, seq_len=k * granule), hw, engine), hw), 1,
                                limit_tokens // granule, start=max(1, job.seq_len // granule))
    return (None if n is None else n * granule), binding


def max_layers(job: JobSpec, hw: HardwareSpec, engine: str, limit: int = MAX_LAYERS) -> tuple[ModelSpec | None, str]:
    """The deepest version of the job's architecture that fits (scaled architecture search), and what binds it."""
    n, binding = _largest_bound(lambda L: check(estimate(replace(job, model=job.model.scaled(L)), hw, engine), hw),
                                1, limit, start=job.model.num_hidden_layers)
    return (None if n is None else job.model.scaled(n)), binding


def largest_family_member(job: JobSpec, hw: HardwareSpec, engine: str) -> tuple[ModelSpec | None, str]:
    """The largest preset of the job's model family that fits, and what binds: the next larger preset's resource,
    GRID_END when the family's largest fits."""
    best, binding = None, GRID_END
    for m in family_members(job.model):
        v = check(estimate(replace(job, model=m), hw, engine), hw)
        if v.fits:
            best, binding = m, GRID_END
        elif binding == GRID_END:
            binding = v.binding
    return best, binding


@dataclass
class SearchResult:
    engine: str
    max_micro_batch: int | None
    max_seq_len: int | None
    largest_preset: str | None
    largest_preset_params: int | None
    max_layers: int | None
    max_layers_params: int | None
    binding: dict[str, str]
    """What binds each search (max_micro_batch, max_seq_len, largest_preset, max_layers): one of RESOURCES, or
    GRID_END where the value is the end of the grid searched (a lower bound: "at least")."""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def search(job: JobSpec, hw: HardwareSpec, engine: str) -> SearchResult:
    fam, fam_binding = largest_family_member(job, hw, engine)
    deep, deep_binding = max_layers(job, hw, engine)
    batch, batch_binding = max_micro_batch(job, hw, engine)
    seq, seq_binding = max_seq_len(job, hw, engine)
    return SearchResult(
        engine=engine,
        max_micro_batch=batch,
        max_seq_len=seq,
        largest_preset=fam.name if fam else None,
        largest_preset_params=fam.num_params if fam else None,
        max_layers=deep.num_hidden_layers if deep else None,
        max_layers_params=deep.num_params if deep else None,
        binding={"max_micro_batch": batch_binding, "max_seq_len": seq_binding, "largest_preset": fam_binding,
                 "max_layers": deep_binding},
    )
