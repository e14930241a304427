"""Where each byte of a job lives, and what that costs per step: every placement priced for stock DeepSpeed (its
strongest config there) and for memascend, and the fastest that fits. Pure: stdlib only, no I/O.

The placements (PLACEMENTS):
  * ``gpu``   - ZeRO-3 with no offload: parameters, gradients, fp32 master and Adam moments on the GPU (a GPU box);
  * ``dram``  - ZeRO-Offload (offload_optimizer device cpu; offload_param device cpu when the GPU cannot hold the
                parameters): no SSD traffic. memascend: the parameters where ZeRO-Offload keeps them, its DRAM
                tier holding every optimizer chunk and gradient;
  * ``split`` - stock: offload_param nvme with the largest max_in_cpu the DRAM holds (without prefetch where parameters
                stay on NVMe: SPLIT_PREFETCH_BUG); memascend: its DRAM tier holds the
                training-dtype parameter partitions first, then the gradients, then whole optimizer sub-groups, the
                rest on the region (EngineOptions.dram_tier_gib);
  * ``ssd``   - everything on the SSD: tuned stock (stock given memascend's knobs) and memascend.
memascend's tier is what planner.dram_tier holds at the budget (the rule the engine applies); the memory of every row
is built from the items of the all-SSD estimates (planner.memory) with each placement's own items, cited.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from memascend_cli.planner import dram_tier
from memascend_cli.planner import time as tm
from memascend_cli.planner.breakdown import Estimate, Item, SsdTraffic
from memascend_cli.planner.context import Context
from memascend_cli.planner.heap import KEPT_HEAP_LAYER_BLOCKS, kept_layer_heap_bytes, layer_backward_heap_bytes
from memascend_cli.planner.job import DTYPE_BYTES, MOMENT_BYTES, JobSpec
from memascend_cli.planner.memory import estimate
from memascend_cli.planner.search import RESOURCE_NAMES, Verdict, check
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.planner.ssd import params_in_dram
from memascend_cli.planner.windows import optimizer_chunks
from memascend_cli.units import GiB

PLACEMENTS = ("gpu", "dram", "split", "ssd")
HEADROOM_FRACTION = 0.05
HEADROOM_MIN_BYTES = GiB // 2
"""DRAM a placement leaves free beyond its planned peak: max(0.5 GiB, 5% of the usable DRAM). The plan's peaks of
stock on a CPU vary by 0.1-0.6 GiB between runs of one job (glibc's kept heap, docs/bench/capacity/), and a DRAM tier
sized to the last byte would turn that spread into an OOM kill."""

GPU_HBM_GBPS = {
    # HBM bandwidth per GPU (vendor datasheets), matched like time.GPU_BF16_DENSE_TFLOPS.
    "H200": 4800.0, "H100 PCIe": 2000.0, "H100": 3350.0, "A100": 2039.0, "L40S": 864.0, "RTX 4090": 1008.0,
    "A10": 600.0, "L4": 300.0,
}
DEFAULT_HBM_GBPS = 1000.0
ADAM_HBM_BYTES_PER_ELEM = 28
"""Adam with no offload reads the fp32 master, gradient and both moments and writes the master and moments: 7 x 4 B
per element (the same stream DeepSpeedCPUAdam makes, time.CPU_ADAM_ELEMS_PER_S_PER_CORE), plus the gradient's fp32
copy (stage3.py _prepare_fp32_grad_for_sub_group) and the parameters' copy back in the training dtype."""

# Items of the all-SSD estimates that belong to NVMe offload (host.py P1-P7 and their transients); a placement
# without the SSD drops them and adds its own.
OFFLOAD_KEYS = frozenset({
    "host/param_swap_pool", "host/fp16_cpu_params", "host/partitioned_swap_buffer", "host/optimizer_swap_pool",
    "host/grad_flat_buffer", "host/small_params", "host/small_optimizer_groups", "host/pinned_pow2_waste",
    "host/grad_buffer_init_copy", "host/first_step_adam"})
# On the GPU placement the host keeps only the process and the data (and offloaded checkpoints).
GPU_PLACEMENT_HOST_KEYS = frozenset({"host/runtime", "host/trainer_imports", "host/launcher", "host/data",
                                     "host/activation_checkpoints"})


@dataclass
class Priced:
    """One placement for one engine: its memory (an Estimate), whether it fits, and its step time."""

    placement: str
    engine: str
    """stock (DeepSpeed's own config) or memascend."""
    config: str
    """What runs it, in words (the DeepSpeed offload settings, or memascend's tier)."""
    runnable: bool
    """False where the engine cannot run it yet (none today)."""
    est: Estimate | None = None
    verdict: Verdict | None = None
    time: tm.StepTime | None = None
    note: str = ""
    """Why a row is not applicable (est None), or what it assumes."""
    tier: dict = field(default_factory=dict)
    """memascend's DRAM tier: bytes per rank of parameters, optimizer states and gradients held, and their shares."""
    devices: tuple[str, str] = ("nvme", "nvme")
    """(offload_param, offload_optimizer) device the row runs with: none (no section), cpu or nvme."""
    max_in_cpu: int | None = None
    """offload_param.max_in_cpu of stock's split row; None: the engine's own knob."""
    prefetch_bucket_size: int | None = None
    """stage3_prefetch_bucket_size of stock's split row (0: no prefetch, SPLIT_PREFETCH_BUG); None: the engine's."""
    checkpoint_offload: str | None = None
    """Where memascend's engine keeps the offloaded activation checkpoints in this row (EngineOptions.
    checkpoint_offload): dram in its dram row, so that no byte reaches the SSD; None: the job's own."""
    overlap_optimizer: bool | None = None
    """memascend's optimizer overlapped with backward in this row (EngineOptions.overlap_optimizer): off in its dram
    row (memascend_placements says why); None: the job's own."""
    layer_trims: bool | None = None
    """memascend's heap trimmed after every checkpointed layer in this row (EngineOptions.layer_trims): off in its dram
    row, whose DRAM holds the job (the layers reuse the heap's blocks instead of faulting fresh pages in); None: the
    engine's own."""

    @property
    def fits(self) -> bool:
        return self.verdict is not None and self.verdict.fits

    @property
    def ssd_bytes(self) -> int:
        """SSD bytes read + written per step, per node."""
        t = self.est.traffic if self.est else None
        return 0 if t is None else (t.read_total + t.write_total) * self.est.ranks_per_node

    @property
    def binds(self) -> str:
        """What binds: the step's resource when it fits, else the memory resource that runs out."""
        if self.est is None:
            return "n/a"
        if not self.fits:
            return RESOURCE_NAMES[self.verdict.binding]
        return self.time.binding if self.time else "unknown"

    def to_dict(self, hw: HardwareSpec) -> dict:
        d = {"placement": self.placement, "engine": self.engine, "config": self.config, "runnable": self.runnable,
             "applicable": self.est is not None, "note": self.note, "fits": self.fits, "binding": self.binds}
        if self.est is None:
            return d
        e, t = self.est, self.est.traffic
        d.update(host_peak_bytes=e.node_host_peak_bytes, gpu_peak_bytes=e.gpu_peak_bytes if hw.num_gpus else None,
                 ssd_space_bytes=e.node_nvme_bytes,
                 ssd_read_bytes_per_step=t.read_total * e.ranks_per_node if t else 0,
                 ssd_write_bytes_per_step=t.write_total * e.ranks_per_node if t else 0,
                 headroom_bytes=int(hw.usable_dram_gib * GiB) - e.node_host_peak_bytes,
                 verdict=self.verdict.to_dict(), time=self.time.to_dict() if self.time else None,
                 dram_tier=dict(self.tier))
        return d


@dataclass
class PlacementPlan:
    """Every placement priced, and the recommendation."""

    rows: list[Priced]
    headroom_bytes: int
    """DRAM each placement but the all-SSD ones leaves free (HEADROOM_FRACTION)."""
    dram_budget_bytes: int
    """memascend's DRAM tier per node at this budget: usable DRAM - headroom - the all-SSD placement's peak (capped by
    the job's host budget per rank)."""
    recommended: Priced | None
    today: Priced | None
    """The fastest row the engines run today (the recommended one when it is runnable)."""
    why: str

    def row(self, placement: str, engine: str) -> Priced | None:
        return next((r for r in self.rows if r.placement == placement and r.engine == engine), None)

    def to_dict(self, hw: HardwareSpec) -> dict:
        def ref(r):
            return None if r is None else {"placement": r.placement, "engine": r.engine}

        return {"headroom_bytes": self.headroom_bytes, "dram_budget_bytes": self.dram_budget_bytes,
                "rows": [r.to_dict(hw) for r in self.rows], "recommended": ref(self.recommended),
                "today": ref(self.today), "why": self.why}


def headroom_bytes(hw: HardwareSpec) -> int:
    """HEADROOM_FRACTION of the node's usable DRAM, at least HEADROOM_MIN_BYTES."""
    return max(HEADROOM_MIN_BYTES, int(HEADROOM_FRACTION * hw.usable_dram_gib * GiB))


def _with_headroom(hw: HardwareSpec, headroom: int) -> HardwareSpec:
    """The node with `headroom` bytes less to give a job."""
    return replace(hw, os_reserve_gib=hw.dram_gib - hw.usable_dram_gib + headroom / GiB)


def _item(key, label, tier, nbytes, source, formula, kind="steady", pinned="") -> Item:
    return Item(key, label, tier, int(nbytes), kind, pinned, 0, formula, source)


def _derived(base: Estimate, engine: str, items: list[Item], traffic: SsdTraffic | None) -> Estimate:
    """An estimate made of `items` with `base`'s job shape (ranks, world, sub-groups, notes)."""
    return Estimate(engine=engine, items=items, ranks_per_node=base.ranks_per_node, world_size=base.world_size,
                    compute_on_host=base.compute_on_host, notes=list(base.notes), traffic=traffic,
                    sub_group_numels=base.sub_group_numels, pipelined_optimizer=base.pipelined_optimizer,
                    budget=base.budget)


def _no_ssd(ns: int, *, dram_fetch: int = 0, dram_states: int = 0) -> SsdTraffic:
    return SsdTraffic({}, {}, params_per_rank=ns, formula="no SSD traffic", dram_fetch_bytes=dram_fetch,
                      dram_state_elems=dram_states)


def gpu_placement(job: JobSpec, hw: HardwareSpec, tuned: Estimate) -> Priced:
    """ZeRO-3 with no offload (stock; memascend runs it unchanged): 2E + 12 B per partition element on the GPU (the
    ZeRO paper's 16 B per parameter of mixed-precision Adam, Rajbhandari et al. 2020, section 3.1, with G = E) plus
    the fp32 gradient of the sub-group being stepped and the working set of the all-SSD estimate."""
    config = "ZeRO-3, no offload; memascend runs it unchanged"
    if not hw.num_gpus:
        return Priced("gpu", "stock", config, True, note="no GPU on this machine", devices=("none", "none"))
    c = Context(job, hw, "tuned")
    ns, E, G = c.ns, c.E, c.G
    items = [i for i in tuned.items if i.tier == "gpu" and i.key != "gpu/grad_fp32_copies"]
    items += [
        _item("gpu/params_partition", "parameter partitions", "gpu", E * ns,
              "runtime/zero/stage3.py _create_fp16_partitions_with_defragmentation: lp_param_buffer (no offload_param)",
              f"Ns {ns:,} x {E} B"),
        _item("gpu/grad_partitions", "gradient partitions", "gpu", G * ns,
              "runtime/zero/stage3.py _setup_for_real_optimizer grad_partitions_flat_buffer (lines 791-793; device: "
              "the GPU without offload_optimizer, line 333)", f"Ns {ns:,} x {G} B"),
        _item("gpu/master_fp32", "fp32 master", "gpu", 4 * ns,
              "runtime/zero/stage3.py _create_fp32_partitions (line 1172)", f"Ns {ns:,} x 4 B"),
        _item("gpu/adam_moments", "Adam exp_avg + exp_avg_sq", "gpu", 8 * ns,
              "torch.optim.AdamW / FusedAdam state, fp32 (ZeRO, arXiv 1910.02054, section 3.1: K = 12)",
              f"Ns {ns:,} x 8 B"),
        _item("gpu/fp32_grad_sub_group", "fp32 gradient of the sub-group stepped", "gpu", 4 * c.lsg,
              "runtime/zero/stage3.py _prepare_fp32_grad_for_sub_group (line 2686)",
              f"largest sub-group {c.lsg:,} x 4 B", kind="transient"),
    ]
    items += [i for i in tuned.items if i.key in GPU_PLACEMENT_HOST_KEYS]
    return Priced("gpu", "stock", config, True, est=_derived(tuned, "stock", items, _no_ssd(ns)),
                  devices=("none", "none"))


def stock_dram_placement(job: JobSpec, hw: HardwareSpec, tuned: Estimate, headroom_hw: HardwareSpec) -> Priced:
    """ZeRO-Offload with tuned stock's knobs: offload_optimizer device cpu, and offload_param device cpu unless the GPU
    holds the parameter partitions too. Host per partition element: fp32 master 4 + fp32 gradient 4 (pinned) + Adam
    moments 8 + the gradient flat buffer G (pinned) (+ E for parameters in DRAM)."""
    c = Context(job, hw, "tuned")
    ns, E, G = c.ns, c.E, c.G
    keep = [i for i in tuned.items if i.key not in OFFLOAD_KEYS and i.tier != "nvme"]
    host = [
        _item("host/fp32_master", "fp32 master (offload_optimizer cpu)", "host", 4 * ns,
              "runtime/zero/stage3.py _create_fp32_partitions (lines 1158-1160: converted to fp32 on the CPU)",
              f"Ns {ns:,} x 4 B"),
        _item("host/fp32_gradients", "fp32 gradient partitions", "host", 4 * ns,
              "runtime/zero/stage3.py initialize_optimizer_states (lines 1337-1342)", f"Ns {ns:,} x 4 B",
              pinned="mlock"),
        _item("host/adam_moments", "Adam exp_avg + exp_avg_sq", "host", 8 * ns,
              "ops/adam/cpu_adam.py step (lines 202-203: zeros_like at the first step)", f"Ns {ns:,} x 8 B"),
        _item("host/grad_flat_buffer", "gradient flat buffer", "host", G * ns,
              "runtime/zero/stage3.py _setup_for_real_optimizer (lines 791-795; device cpu with offload_optimizer, "
              "line 333)", f"Ns {ns:,} x {G} B", pinned="mlock"),
        _item("host/grad_buffer_init_copy", "init: gradient buffer before pinning", "host", G * ns,
              "runtime/zero/stage3.py 791-795: torch.zeros, then pin_memory copies it (utils/pin_memory.py)",
              f"Ns {ns:,} x {G} B", kind="init"),
    ]
    params = _item("host/params_in_dram", "parameter partitions (offload_param cpu)", "host", E * ns,
                   "runtime/zero/stage3.py _create_param_groups_fp16_flat_cpu_memory (line 906)", f"Ns {ns:,} x {E} B",
                   pinned="mlock")
    on_gpu = _item("gpu/params_partition", "parameter partitions", "gpu", E * ns,
                   "runtime/zero/stage3.py _create_fp16_partitions_with_defragmentation: lp_param_buffer",
                   f"Ns {ns:,} x {E} B")
    if hw.num_gpus:
        est = _derived(tuned, "stock", keep + host + [on_gpu], _no_ssd(ns, dram_fetch=E * ns, dram_states=ns))
        if est.gpu_peak_bytes <= hw.gpu_mem_gib * GiB:
            return Priced("dram", "stock", "offload_optimizer cpu, parameters on the GPU", True, est=est,
                          devices=("none", "cpu"))
        # The parameters come from DRAM for every fetch, forward and backward.
        fetch = 2 * max(1, job.grad_accum_steps) * E * ns
        return Priced("dram", "stock", "offload_optimizer cpu + offload_param cpu", True,
                      est=_derived(tuned, "stock", keep + host + [params], _no_ssd(ns, dram_fetch=fetch,
                                                                                 dram_states=ns)),
                      devices=("cpu", "cpu"))
    # On the CPU accelerator the parameters are host memory whatever the offload (the device is the CPU).
    return Priced("dram", "stock", "offload_optimizer cpu", True,
                  est=_derived(tuned, "stock", keep + host + [params], _no_ssd(ns, dram_states=ns)),
                  devices=("none", "cpu"))


def stock_row(job: JobSpec, hw: HardwareSpec, placement: str) -> Priced:
    """Stock DeepSpeed's `placement` alone ('gpu' or 'dram'), checked as price_placements checks it (headroom_bytes
    left free): what install() keeps when a user's config already runs it and it fits (planner/offload_choice.py)."""
    roomy = _with_headroom(hw, headroom_bytes(hw))
    tuned = estimate(job, hw, "tuned")
    row = gpu_placement(job, hw, tuned) if placement == "gpu" else stock_dram_placement(job, hw, tuned, roomy)
    if row.est is not None:
        row.verdict = check(row.est, roomy)
    return row


def memascend_tier(job: JobSpec, hw: HardwareSpec, ms: Estimate, per_rank_bytes: int | None, *,
                   gradients_first: bool = True) -> tuple[dict, list[Item], SsdTraffic]:
    """memascend's DRAM tier of `per_rank_bytes` (None: all of it) over its all-SSD estimate `ms`, as the engine holds
    it (planner.dram_tier, the rule memascend_engine.dram_tier applies): the parameter partitions on the region first,
    then the gradients where they reach the SSD, then whole optimizer chunks (the bounded engine's sub-groups, split at
    its chunk size; MLP-Offload, SC'25, caches sub-groups the same way). `gradients_first` False: the chunks before
    the gradients (a record of an engine before planner.dram_tier.ORDER). Returns (the tier, its host items, the SSD
    traffic that remains)."""
    c = Context(job, hw, "memascend")
    t = ms.traffic
    params = [n for n in c.part.partition_numels if n >= c.min_swap_numel]
    # The engine's unit is its optimizer chunk: sub-groups of at most the window's chunk size, larger ones split.
    chunks = optimizer_chunks([[c.part.partition_numels[i] for i in g] for g in c.part.sub_groups],
                              c.windows.optimizer_chunk_numel)
    groups = [ch.numel for ch in chunks]
    grads = list(c.part.partition_numels) if t.read_bytes.get("gradients", 0) + t.write_bytes.get("gradients", 0) \
        else []
    sizes = dram_tier.unit_bytes(param_numels=params, param_elem_bytes=c.E, group_numels=groups,
                                 moment_bytes=MOMENT_BYTES[job.optimizer_moments], master_in_params=c.params_hold_master,
                                 overlap=c.overlap, grad_numels=grads, grad_elem_bytes=c.G)
    held = dram_tier.split(per_rank_bytes, *sizes, gradients_first=gradients_first)

    def share(numels, idx):
        return sum(numels[i] for i in idx) / sum(numels) if sum(numels) else 1.0

    fp, fs, fg = share(params, held.params), share(groups, held.groups), share(grads, held.grads)
    rd, wr = dict(t.read_bytes), dict(t.write_bytes)
    scale = {"params": 1 - fp, "optimizer_states": 1 - fs, "gradients": 1 - fg}
    traffic = replace(t, read_bytes={k: int(v * scale.get(k, 1)) for k, v in rd.items()},
                      write_bytes={k: int(v * scale.get(k, 1)) for k, v in wr.items()},
                      backward_param_read_bytes=int((t.backward_param_read_bytes or 0) * (1 - fp)),
                      dram_fetch_bytes=int(rd.get("params", 0) * fp),
                      dram_state_elems=int(t.params_per_rank * fs),
                      formula=f"memascend's DRAM tier holds {fp:.0%} of the parameters, {fs:.0%} of the optimizer "
                              f"states, {fg:.0%} of the gradients; the rest as {t.formula}")
    src = "memascend_engine.dram_tier (EngineOptions.dram_tier_gib), planner.dram_tier's rule"
    full = [sum(x) for x in sizes]
    items = [_item(f"host/dram_tier/{k}", f"DRAM tier: {label}", "host", n, src, f"{share_:.0%} of {total:,} B",
                   pinned="mlock")
             for k, label, n, share_, total in (
                 ("params", "parameter partitions", held.params_bytes, fp, full[0]),
                 ("optimizer_states", "optimizer sub-groups", held.groups_bytes, fs, full[1]),
                 ("gradients", "gradients", held.grads_bytes, fg, full[2])) if n]
    tier = {"params_bytes": held.params_bytes, "optimizer_states_bytes": held.groups_bytes,
            "gradients_bytes": held.grads_bytes, "params_share": round(fp, 4), "optimizer_states_share": round(fs, 4),
            "gradients_share": round(fg, 4), "full_bytes": sum(full)}
    return tier, items, traffic


PARAMS_FROM_TIER = "nvme"
"""memascend_dram_row's `param_device` of records made before the dram row kept the parameters resident: offload_param
nvme, their partitions held in the tier and fetched through the engine's parameter swapper."""


def kept_heap_items(job: JobSpec, hw: HardwareSpec, layer_trims: bool) -> list[Item]:
    """The heap memascend's CPU rank keeps between layers when it trims nothing there (heap.KEPT_HEAP_LAYER_BLOCKS), on
    top of the backward until the trim after it; none with the per-layer trims, nor on a GPU, whose layers' blocks are
    device memory (no record: not priced)."""
    if layer_trims or hw.num_gpus:
        return []
    c = Context(job, hw, "memascend")
    return [_item("host/kept_layer_heap", "heap kept between layers (no trim until backward ends)", "host",
                  kept_layer_heap_bytes(c), "glibc malloc/malloc.c _int_free + systrim (M_TRIM_THRESHOLD), "
                  "malloc/arena.c heap_trim; engine/runtime.py:517 (keep_heap); fitted by scripts/fit_planner.py "
                  "kept_heap_fit", f"{KEPT_HEAP_LAYER_BLOCKS} x one layer's backward blocks below the mmap threshold "
                  f"{layer_backward_heap_bytes(c):,}", kind="backward")]


def memascend_dram_row(job: JobSpec, hw: HardwareSpec, param_device: str | None = None, *,
                       layer_trims: bool = False) -> Priced:
    """memascend's dram row: the optimizer on the region (offload_optimizer nvme), every chunk and gradient held in its
    DRAM tier and stepped in place there, offloaded checkpoints kept in DRAM; the parameter partitions where stock's
    ZeRO-Offload keeps them (`param_device` None: none on the CPU accelerator or on a GPU that holds them, else cpu),
    so a step copies no parameter and fetches none; PARAMS_FROM_TIER prices how runs recorded before ran it.
    `layer_trims` False (the row's own): the heap kept between layers (kept_heap_items); True: trimmed after each."""
    # No optimizer overlap in the dram row: with no SSD read to hide it only moves the CPU's Adam into backward on
    # the same cores, while a redo needs the states' second generation and the parameters' shadows kept beside them
    # (planner.dram_tier.unit_bytes: a tier of 2.21 GiB instead of 1.27 for bench-llama-136m at 4 layers, fp32), which
    # took its cgroup peak above stock ZeRO-Offload's (3.82 against 3.54 GiB; without the overlap 2.88,
    # docs/bench/placements/, 4 GiB cap). Without it the engine steps each held chunk in place in the tier
    # (memascend_engine.dram_tier.in_dram).
    dram_job = replace(job, overlap_optimizer=False,
                       checkpoint_offload="dram" if job.checkpointing == "offload" else job.checkpoint_offload)
    base = estimate(dram_job, hw, "memascend")
    tier, items, traffic = memascend_tier(dram_job, hw, base, None)
    items += kept_heap_items(dram_job, hw, layer_trims)
    keep = [i for i in base.items if i.tier != "nvme"]
    ckpt = dram_job.checkpoint_offload if job.checkpointing == "offload" else None
    if param_device == PARAMS_FROM_TIER:
        return Priced("dram", "memascend", "DRAM tier holds every byte", True, tier=tier, checkpoint_offload=ckpt,
                      overlap_optimizer=False, est=_derived(base, "memascend", keep + items,
                                                            replace(traffic, read_bytes={}, write_bytes={})))
    c = Context(job, hw, "memascend")
    params_bytes = tier["params_bytes"]
    tier = {**tier, "params_bytes": 0, "params_share": 0.0}
    items = [i for i in items if i.key != "host/dram_tier/params"]
    # No parameter swapper without offload_param nvme: its pool goes. With one rank ZeRO-3 gathers nothing
    # (runtime/zero/partition_parameters.py all_gather_coalesced: a partition world of 1 returns
    # _no_gather_coalesced, the module computes on the partition itself); with more, the gathered modules take about
    # what the pool held.
    keep = [i for i in keep if i.key != "host/param_swap_pool" or base.world_size > 1]
    no_ssd = replace(traffic, read_bytes={}, write_bytes={}, dram_fetch_bytes=0,
                     formula="no SSD traffic: the parameters resident, every optimizer chunk and gradient in the tier")
    on_gpu = _item("gpu/params_partition", "parameter partitions", "gpu", c.E * c.ns,
                   "runtime/zero/stage3.py _create_fp16_partitions_with_defragmentation: lp_param_buffer",
                   f"Ns {c.ns:,} x {c.E} B")
    if hw.num_gpus and param_device in (None, "none"):
        est = _derived(base, "memascend", keep + items + [on_gpu], no_ssd)
        if param_device == "none" or est.gpu_peak_bytes <= hw.gpu_mem_gib * GiB:
            return Priced("dram", "memascend", "DRAM tier holds the optimizer, parameters on the GPU", True, est=est,
                          tier=tier, devices=("none", "nvme"), checkpoint_offload=ckpt, overlap_optimizer=False,
                          layer_trims=layer_trims)
    pinned = "mlock" if hw.num_gpus else None
    params = _item("host/params_in_dram", "parameter partitions (offload_param cpu)" if hw.num_gpus else
                   "parameter partitions (no offload_param: host memory on the CPU accelerator)", "host",
                   params_bytes, "runtime/zero/stage3.py _create_param_groups_fp16_flat_cpu_memory (line 906)"
                   if hw.num_gpus else "runtime/zero/partition_parameters.py _partition_param (ds_tensor)",
                   f"the partitions the region would hold: {params_bytes:,} B", pinned=pinned)
    if hw.num_gpus:  # the parameters come from DRAM for every fetch, forward and backward
        fetch = 2 * max(1, job.grad_accum_steps) * c.E * c.ns
        return Priced("dram", "memascend", "DRAM tier holds the optimizer, offload_param cpu", True, tier=tier,
                      est=_derived(base, "memascend", keep + items + [params], replace(no_ssd, dram_fetch_bytes=fetch)),
                      devices=("cpu", "nvme"), checkpoint_offload=ckpt, overlap_optimizer=False,
                      layer_trims=layer_trims)
    return Priced("dram", "memascend", "DRAM tier holds the optimizer, parameters resident", True, tier=tier,
                  est=_derived(base, "memascend", keep + items + [params], no_ssd), devices=("none", "nvme"),
                  checkpoint_offload=ckpt, overlap_optimizer=False, layer_trims=layer_trims)


def memascend_placements(job: JobSpec, hw: HardwareSpec, ms: Estimate, headroom_hw: HardwareSpec,
                         budget_rank: int) -> list[Priced]:
    """memascend's dram row (memascend_dram_row) and split row (the tier at `budget_rank` bytes per rank over the
    all-SSD estimate). The dram row trims the heap after every layer where the heap kept between them would not fit
    beside the headroom and the trimmed one does (kept_heap_items)."""
    dram = memascend_dram_row(job, hw)
    if not check(dram.est, headroom_hw).fits:
        trimmed = memascend_dram_row(job, hw, layer_trims=True)
        if check(trimmed.est, headroom_hw).fits:
            kept = dram.est.node_host_peak_bytes - trimmed.est.node_host_peak_bytes
            trimmed.note = f"heap trimmed after every layer: kept between them its {kept / GiB:.2f} GiB would not " \
                           "fit beside the headroom"
            dram = trimmed
    rows = [dram]
    full = dram.tier["full_bytes"]  # the parameters, chunks and gradients the tier would hold at the region's place
    split = Priced("split", "memascend", "DRAM tier + region", True)
    if budget_rank >= full:
        split.note = "the DRAM holds all of it: see dram"
    elif budget_rank <= 0:
        split.note = "no DRAM left beyond the all-SSD placement's peak and the headroom"
    else:
        tier, items, traffic = memascend_tier(job, hw, ms, budget_rank)
        split.est = _derived(ms, "memascend", ms.items + items, traffic)
        split.tier = tier
    rows.append(split)
    return rows


SPLIT_PREFETCH_BUG = (
    "DeepSpeed's NVMe prefetch can queue one parameter twice and then fails on its second swap buffer "
    "(runtime/zero/partitioned_param_coordinator.py:678-690, runtime/swap_tensor/partitioned_param_swapper.py:185-186; "
    "a partial max_in_cpu's stock run failed so at step 2)")
"""Why stock's split runs without prefetch. With offload_param nvme and a partial max_in_cpu the parameters kept in
DRAM are not 'on nvme' (partitioned_param_coordinator.py:444-463), so the prefetch gathers them freely, and the NVMe
look-ahead (up to twice the elements in flight and the free swap buffers, lines 682-684) reaches the NVMe-resident
tail of the model with every buffer free. It appends each use whose partition is still NOT_AVAILABLE without
skipping one it took (line 685-686); the LM head's forward and backward uses are next to each other in the trace, so
swap_in gets it twice ('param 38 already assigned swap buffer id 4': bench-llama-136m at 4 layers under a 2.75 GiB
cap, docs/bench/placements/bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-quiet/). The look-ahead runs only with
stage3_prefetch_bucket_size > 0 (lines 452, 487-488); a fetch swaps in the set of one module's parameters (line 364,
partition_parameters.py:1707-1718), each once. Reproduced on tiny-llama (docs/bench/micro/stock-split-nvme-prefetch-
tiny-llama.json, benchmarks/stock_split_prefetch.py): the LM head alone on NVMe fails at step 2 with prefetch and trains
without it, with the same losses; with the last layer on NVMe too (more distinct partitions ahead than swap buffers)
it trains either way. Read in DeepSpeed 0.19.8; no release is known to skip a parameter already taken."""


def stock_split(job: JobSpec, hw: HardwareSpec, tuned: Estimate, headroom_hw: HardwareSpec) -> Priced:
    """Tuned stock with offload_param nvme and the largest max_in_cpu whose peak leaves the headroom (whole leading
    sub-groups: ssd.params_in_dram), parameters kept in DRAM (host P3) and never fetched from the SSD. Where some
    parameters stay on NVMe the row runs without prefetch (stage3_prefetch_bucket_size 0: SPLIT_PREFETCH_BUG), each
    fetch waiting for its read: priced so on the CPU accelerator (_price_time); a GPU node's time model overlaps the
    fetches with compute, so there that row is not offered."""
    c = Context(job, hw, "tuned")
    row = Priced("split", "stock", "nvme + max_in_cpu", True)
    spare = (int(headroom_hw.usable_dram_gib * GiB) - tuned.node_host_peak_bytes) // max(1, tuned.ranks_per_node)
    target = params_in_dram(c.part.sub_group_numels, min(c.ns, max(0, spare // c.E)))
    for _ in range(8):  # P2 and the phases move a little with max_in_cpu: step down until the peak fits
        if target <= 0:
            row.note = "no DRAM left for max_in_cpu beyond the all-SSD placement's peak and the headroom"
            return row
        partial = target < c.ns
        if partial and hw.num_gpus:
            row.note = f"not offered: {SPLIT_PREFETCH_BUG}; without prefetch each fetch waits for its read, which " \
                       "the GPU time model does not price"
            return row
        knobs = replace(c.k, max_in_cpu=target, **({"prefetch_bucket_size": 0} if partial else {}))
        est = estimate(replace(job, knobs=knobs), hw, "stock")
        if check(est, headroom_hw).fits:
            row.est, row.max_in_cpu = est, target
            row.config = f"nvme + max_in_cpu {target:,}" + (", no prefetch" if partial else "")
            if partial:
                row.prefetch_bucket_size = 0
                row.note = f"stage3_prefetch_bucket_size 0: {SPLIT_PREFETCH_BUG}"
            return row
        target = params_in_dram(c.part.sub_group_numels, int(target * 0.9))
    row.note = "no max_in_cpu found whose peak leaves the headroom"
    return row


def _gpu_step(job: JobSpec, hw: HardwareSpec, est: Estimate, device: tm.Device) -> tm.StepTime:
    """No offload: the matmuls and one Adam pass over the GPU's memory (ADAM_HBM_BYTES_PER_ELEM), nothing else."""
    ga = max(1, job.grad_accum_steps)
    rank_tokens = job.micro_batch * job.seq_len * ga
    flops = sum(tm.phase_flops(job.model, tokens=rank_tokens, seq_len=job.seq_len, checkpointing=job.checkpointing,
                               chunked_loss=job.chunked_loss))
    key = next((k for k in GPU_HBM_GBPS if hw.gpu_name and k.lower() in hw.gpu_name.lower()), None)
    E = DTYPE_BYTES[job.dtype]
    per_elem = ADAM_HBM_BYTES_PER_ELEM + (E + 4) + (4 + E)
    adam = est.traffic.params_per_rank * per_elem / (1e9 * GPU_HBM_GBPS.get(key, DEFAULT_HBM_GBPS))
    compute = None if device.flops_per_s is None else flops / device.flops_per_s
    seconds = {"compute": compute, "GPU Adam": adam, "SSD read": 0.0, "SSD write": 0.0, "CPU Adam": 0.0,
               "host copies": 0.0, "PCIe": 0.0}
    tokens = rank_tokens * est.world_size
    if compute is None:
        return tm.StepTime("stock", seconds, None, tokens, "unknown", "compute, then Adam on the GPU", ["compute"])
    return tm.StepTime("stock", seconds, compute + adam, tokens, "compute" if compute >= adam else "GPU Adam",
                       "compute, then Adam on the GPU",
                       phase_s={tm.PHASE_FORWARD_BACKWARD: compute, tm.PHASE_OPTIMIZER: adam})


def _price_time(row: Priced, job: JobSpec, hw: HardwareSpec, device: tm.Device, read_gbps, write_gbps,
                duplex_io: bool = False) -> None:
    if row.est is None:
        return
    if row.placement == "gpu":
        row.time = _gpu_step(job, hw, row.est, device)
        return
    # Stock's rows run stock's code with tuned's knobs (without prefetch, stock's serial timing); memascend's its
    # bounded engine.
    key = "memascend" if row.engine == "memascend" else tm.timed_as("tuned", row.prefetch_bucket_size)
    if row.overlap_optimizer is not None:  # the row's own overlap (off in memascend's dram row)
        job = replace(job, overlap_optimizer=row.overlap_optimizer)
    row.time = tm.engine_times(job, {key: row.est}, device, read_gbps=read_gbps, write_gbps=write_gbps,
                               cpu_cores=hw.cpu_cores, duplex_io=duplex_io)[key]


def price_placements(job: JobSpec, hw: HardwareSpec, ests: dict[str, Estimate], device: tm.Device, *,
                     read_gbps: float | None, write_gbps: float | None, duplex_io: bool = False) -> PlacementPlan:
    """Every placement of `job` on `hw` for stock and memascend, from the all-SSD estimates `ests` (estimate_all: tuned
    and memascend), each checked against the node (the all-SSD rows as the plan's verdict checks them, the others with
    headroom_bytes left free) and timed (planner.time; `duplex_io`: reads and writes limited separately, as under
    bench --ssd-bandwidth); the fastest that fits recommended."""
    headroom = headroom_bytes(hw)
    roomy = _with_headroom(hw, headroom)
    tuned, ms = ests["tuned"], ests["memascend"]
    ranks = max(1, ms.ranks_per_node)
    budget_rank = (int(roomy.usable_dram_gib * GiB) - ms.node_host_peak_bytes) // ranks
    if job.host_budget_bytes is not None and ms.budget is not None:
        # --host-budget stays memascend's ceiling per rank: the tier takes what its windows leave of it.
        budget_rank = min(budget_rank, job.host_budget_bytes - ms.budget.total_bytes)
    rows = [gpu_placement(job, hw, tuned), stock_dram_placement(job, hw, tuned, roomy),
            *memascend_placements(job, hw, ms, roomy, budget_rank), stock_split(job, hw, tuned, roomy),
            Priced("ssd", "stock", "nvme (tuned knobs: max_in_cpu 0)", True, est=tuned),
            Priced("ssd", "memascend", "region (the engine today)", True, est=ms)]
    for r in rows:
        if r.est is not None:
            r.verdict = check(r.est, hw if r.placement == "ssd" else roomy)
        _price_time(r, job, hw, device, read_gbps, write_gbps, duplex_io)
    rows.sort(key=lambda r: (PLACEMENTS.index(r.placement), r.engine != "stock"))
    best, today = recommend(rows), recommend([r for r in rows if r.runnable])
    return PlacementPlan(rows, headroom, max(0, budget_rank) * ranks, best, today, why(best, today, rows, hw))


def _rank_key(r: Priced):
    """Fastest first; a step whose SSD rate is unknown by its lower bound; with no time at all, by the placement's
    order (fewer SSD bytes first); ties: what runs today, then the lower host peak."""
    t = r.time
    s = None if t is None else (t.step_s if t.step_s is not None else t.at_least_s)
    return (s is None, s or 0.0, PLACEMENTS.index(r.placement), not r.runnable, r.est.node_host_peak_bytes)


def recommend(rows: list[Priced]) -> Priced | None:
    """The fastest row that fits (_rank_key), None when none does."""
    fitting = [r for r in rows if r.fits]
    return min(fitting, key=_rank_key) if fitting else None


def who(r: Priced) -> str:
    """The row in words: its placement, the engine and its config."""
    return f"{r.placement} with {'stock DeepSpeed' if r.engine == 'stock' else 'memascend'} ({r.config})"


def step_words(r: Priced) -> str:
    """Its step time in words: s/step, tokens/s and what binds, or why it is unknown."""
    t = r.time
    if t is None or (t.step_s is None and t.at_least_s is None):
        return "time unknown (no compute rate)"
    if t.step_s is None:
        return f"at least {t.at_least_s:.3g} s/step (SSD rate unknown)"
    return f"{t.step_s:.3g} s/step, {t.tokens_per_s:,.0f} tokens/s, {t.binding} binds"


def why(best: Priced | None, today: Priced | None, rows: list[Priced], hw: HardwareSpec) -> str:
    """The recommendation in words: what, how fast, the headroom, and why this placement (what it keeps off the SSD
    and what it is faster than)."""
    if best is None:
        return "no placement fits: " + "; ".join(f"{r.placement}/{r.engine}: {r.binds}" for r in rows if r.est)
    e = best.est
    left = int(hw.usable_dram_gib * GiB) - e.node_host_peak_bytes
    text = f"{who(best)}: {step_words(best)}; {e.node_host_peak_bytes / GiB:,.1f} GiB host peak, {left / GiB:,.1f} " \
           f"GiB of DRAM left"
    state = sum(i.bytes for i in e.items if i.key in ("gpu/params_partition", "gpu/grad_partitions",
                                                      "gpu/master_fp32", "gpu/adam_moments")) * e.ranks_per_node
    if best.placement == "gpu":
        reason = f"the whole training state ({state / GiB:.1f} GiB) fits in GPU memory with the activations: no " \
                 "offload, no PCIe or SSD traffic"
    elif best.placement == "dram":
        reason = "the optimizer states fit in DRAM: no byte goes to the SSD"
    elif best.placement == "split":
        tier = best.tier or {}
        grads = f", {tier['gradients_share']:.0%} of the gradients" if tier.get("gradients_bytes") else ""
        held = (f"{tier['params_share']:.0%} of the parameters{grads} and {tier['optimizer_states_share']:.0%} of the "
                "optimizer states") if tier else "the parameters (max_in_cpu)"
        reason = f"DRAM holds {held}; the SSD moves the rest ({best.ssd_bytes / 1e9:,.1f} GB per step)"
    else:
        reason = "nothing that keeps more in DRAM or on the GPU fits"
    ssd = next((r for r in rows if r.placement == "ssd" and r.engine == "memascend"), None)
    if best is not ssd and ssd and ssd.fits and ssd.time and ssd.time.step_s and best.time and best.time.step_s:
        reason += f"; {ssd.time.step_s / best.time.step_s:,.1f}x the tokens/s of memascend with everything on the SSD"
    text += f". Why: {reason}"
    if not best.runnable:
        text += ". Planned: the engine does not run it yet"
        if today is not None:
            text += f"; today's fastest: {who(today)}, {step_words(today)}"
    return text
