"""How long one optimizer step takes per engine, and what binds it. Pure: no I/O, no probing.

A roofline per phase: each resource's time is its work divided by its rate, and the engine's overlap rules say which
times add and which run concurrently (the phase takes the longest of those). The SSD bytes come from the memory
model's SsdTraffic (planner.memory.ssd_traffic), never recomputed here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

GPU_BF16_DENSE_TFLOPS = {
    # Dense (no sparsity) bf16 tensor-core peaks, from each vendor datasheet; matched as substrings of the GPU name.
    "H200": 989.0,        # NVIDIA H200 Tensor Core GPU datasheet (SXM): 1,979 TFLOPS with sparsity
    "H100 PCIe": 756.0,   # NVIDIA H100 Tensor Core GPU datasheet (PCIe): 1,513 with sparsity
    "H100": 989.0,        # NVIDIA H100 Tensor Core GPU datasheet (SXM): 1,979 with sparsity
    "A100": 312.0,        # NVIDIA A100 Tensor Core GPU datasheet: bf16 312 TFLOPS (624 with sparsity)
    "L40S": 362.0,        # NVIDIA L40S datasheet: bf16 362.05 TFLOPS (733 with sparsity)
    "RTX 4090": 165.2,    # NVIDIA Ada Lovelace architecture whitepaper, appendix A: bf16, fp32 accumulate
    "A10": 125.0,         # NVIDIA A10 datasheet: bf16 125 TFLOPS (250 with sparsity)
    "L4": 121.0,          # NVIDIA L4 datasheet: bf16 121 TFLOPS (242 with sparsity)
}

GPU_ACHIEVED_FRACTION = 0.45
"""Model FLOPs utilisation of a well-fed dense transformer step: Narayanan et al. 2021 (Megatron-LM, SC'21) report 52%
of A100 peak, Chowdhery et al. 2022 (PaLM) 46% MFU; 0.45 leaves room for the smaller matmuls of fine-tuning."""

PCIE_GBPS = {
    # Host<->device GB/s per direction: the PCIe generation's x16 rate (PCI-SIG: Gen4 31.5, Gen5 63 GB/s) x 0.8 for
    # protocol overhead. H100 SXM / H200 hosts are Gen5; the rest Gen4.
    "H200": 50.0, "H100": 50.0, "A100": 25.0, "L40S": 25.0, "RTX 4090": 25.0, "A10": 25.0, "L4": 25.0,
}
DEFAULT_PCIE_GBPS = 25.0

CPU_ADAM_ELEMS_PER_S_PER_CORE = 0.84e9
"""DeepSpeedCPUAdam (deepspeed/ops/adam/cpu_adam.py, AVX-512 build) on fp32: 1.68e9 elements/s over 2 threads of an
AMD EPYC VM, 32 Mi elements, best of 3 steps (memascend's dev machine, 2026-11-25). Adam streams 28 B per element
through memory, so it scales with cores until DRAM bandwidth binds."""

CPU_ACHIEVED_FRACTION = 0.8
"""A plain transformers training step's fp32 GFLOP/s over the `memascend inspect --cpu-probe` matmul probe's (a
best-of-5 2048^3 matmul): the step's matmuls have other shapes (a chunk of tokens against the vocabulary, K = 130 in
the loss's weight gradient), and its norms, activations, softmax and attention are not matmuls. Measured by
benchmarks/cpu_step_rate.py (docs/bench/micro/cpu-step-rate-fp32.json, 2026-11-28, AMD EPYC VM, 2 cores, probe in
the same sitting): llama-3.2-1b at seq 1024 0.82, bench-llama-136m at seq 512 0.79; 0.81 in a sitting an hour
earlier. What DeepSpeed adds to the step is in the host terms below."""

THROTTLE_OVERLAP_BURST_S = 0.19
"""The longest burst one direction can make while the other waits, under a per-direction cgroup throttle, without
the waiting direction losing budget: block/blk-throttle.c keeps a direction's slice alive for a slice
(DFL_THROTL_SLICE_HD, HZ / 10 on a rotational queue such as the bench VM's virtio disk) after its last dispatch and
counts its budget over the elapsed time rounded up to whole slices (tg_within_bps_limit), so a gap of up to about two
slices costs nothing and a longer one starts a new slice with none. Measured by benchmarks/throttle_bursts.py
(docs/bench/micro/throttle-bursts.json, 400 MB/s each way): serial read-then-write bursts of 0.19 s or less take as
long as one direction, of 0.2 s or more as long as both."""

HOST_CPUS = ("AMD EPYC", "Intel(R) Xeon(R)")
"""The CPUs the per-CPU host terms below were fitted on, as /proc/cpuinfo names them (the prefix a machine's model name
starts with): the 2-core AMD EPYC and Intel Xeon VMs of the bench records. Host work is copies, norms and checksums
on the matmuls' cores, and its rate is the CPU's own: on the AMD EPYC VM memascend's host work took about half the
time it took on the Intel Xeon VM (the terms below), while neither the matmul probe nor the memory-bandwidth probe
orders the two machines that way (Intel: probe 315 GFLOP/s fp32, STREAM triad 24-26 GB/s; AMD: 126-200, 29-62). A
term fitted on one CPU whose runs on the other came within the validation's 15% is one value for both."""
DEFAULT_HOST_CPU = "AMD EPYC"
"""Whose terms price a CPU none was fitted on (the plan says so): the CPU the compute fraction and the CPU Adam rate
were measured on."""


def host_terms_of(cpu_model: str | None) -> tuple[str, bool]:
    """(the HOST_CPUS entry whose host terms price a CPU of `cpu_model`, whether they were fitted on that CPU). Pure."""
    found = next((c for c in HOST_CPUS if cpu_model and cpu_model.startswith(c)), None)
    return (found, True) if found else (DEFAULT_HOST_CPU, False)


STOCK_CPU_HOST_NS_PER_ELEMENT = {"backward": 6.1, "optimizer": 9.3}
"""Stock DeepSpeed's host work per optimizer element on its CPU accelerator beyond the matmuls, the SSD and Adam. In
backward: the gradient's copy into the reduce bucket, reduce_scatter_coalesced's torch.cat and gloo's copy of its
input, the partition's copy, its fp64 norm copy and the swap-out buffer copy (runtime/zero/stage3.py
__add_grad_to_ipg_bucket, __avg_scatter_grads, partition_grads, _constant_buffered_norm2); in the step: the
gradients' swap-in copy, unscale and clip, and the parameters' copy back (stage3.py step, unscale_and_clip_grads,
_reassign_or_swap_out_partitioned_parameters). Fitted on one sitting as (measured - modelled) phase seconds per
element: docs/bench/ssd-bound/bench-llama-136m-seq512-fp32-ssd400mbs-three-engines-clip10-budget1gib.json.gz
(AMD EPYC VM, 400 MB/s: backward +0.83 s, step +1.26 s over 136.3M elements, the compute at CPU_ACHIEVED_FRACTION); the
other stock sittings, on two VMs, throttled and not, are its validation (tests/unit/test_time_validation.py)."""

STOCK_CPU_OFFLOAD_HOST_NS_PER_ELEMENT = {"AMD EPYC": {"backward": 7.3, "optimizer": 0.5},
                                         "Intel(R) Xeon(R)": {"backward": 9.7, "optimizer": 1.0}}
"""The same for ZeRO-Offload (offload_optimizer device cpu, the plan's stock dram row), whose states never leave
DRAM, per HOST_CPUS: its step has no swap-in copy, only unscale and clip and the parameters' copy back from the fp32
partition (runtime/zero/stage3.py _prepare_sub_group skips the offloaded sub-groups,
_reassign_or_swap_out_partitioned_parameters copies fp32 into the parameter partition); in backward each partition's
norm and its copy into the pinned fp32 gradient (stage3.py partition_grads, _offload_grad_partition_at_boundary).
Fitted on one run per CPU as (measured - modelled) phase seconds per element with the compute at its sitting's matmul
probe: Intel, docs/bench/placements/bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-quiet/
placements-clip10-quiet-dram-overlap-on-off-cap4gib.json.gz, tuned (2026-12-06, quiet); AMD, the first quiet dram
sitting on that VM, docs/bench/placements/bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-dram-cap4gib-0925/
placements-clip10-dram-cap4gib-0925-sitting1.json.gz, tuned (2026-12-07 09:25). The other ZeRO-Offload runs of each
CPU validate it (tests/unit/test_time_validation.py)."""

MEMASCEND_CPU_HOST_NS_PER_ELEMENT = 17.8
"""memascend's host work per optimizer element on the CPU accelerator beyond the matmuls, the SSD and Adam, on the
thread that drives backward while the optimizer is overlapped with it: the gradient's reduce-scatter copy (gloo,
runtime/zero/stage3.py __avg_scatter_grads), the partition's norm and copy into the gradient stream
(engine/ds_internals/bounded_stage3.py partition_grads, _ma_norm), the overlapped optimizer's master copy and chunk
hand-offs (engine/overlap.py), CRC-32C of every region write and read (engine/direct_nvme.py) and the waits on
requests the pipeline could not hide (the model's own kernels beyond the probe's rate are CPU_ACHIEVED_FRACTION's). A
py-spy profile of an unthrottled step (2026-11-27, 100 Hz) had that thread 1.6 s a step in gradient partitioning and
the overlapped optimizer, 0.7 s blocked on region requests, 0.3 s in backward's epilogue. Fitted on one run:
docs/bench/ssd-bound/bench-llama-136m-seq512-fp32-unthrottled-three-engines-clip10-amd-counters.json.gz, memascend
(AMD EPYC VM, unthrottled: +2.5 s over 136.3M elements, the compute at CPU_ACHIEVED_FRACTION, its gradient writes
blocking: MEMASCEND_GRADIENT_WRITE_BLOCKING, and the window's serial share: MEMASCEND_OVERLAP_SERIAL_SHARE, which
also prices the prefetched reads before the window; 17.0 before that, 18.4 before the share, 19.2 before the writes
blocked); every other bench run validates it
(tests/unit/test_time_validation.py test_memascend_host_term_is_the_fit)."""

MEMASCEND_DRAM_HOST_NS_PER_ELEMENT = {"backward": 11.1, "optimizer": 1.6}
"""memascend's host work per optimizer element on the CPU accelerator in its dram row as recorded before the row kept
the parameters resident (they were fetched from the tier: planner.placement; the row today is priced with
ZeRO-Offload's passes, _host_seconds), beyond the matmuls and Adam: the tier holds every state, the optimizer not
overlapped, each held chunk stepped in place (memascend_engine.dram_tier in_dram). In backward: the gradient's
reduce-scatter copy, its norm and its copy into the held gradient key (engine/bounded.py GradientStream.write); in the
step: multi-piece chunks' masters and gradients into the pipeline's slots and the parameters back
(engine/optimizer_pipeline.py). Fitted on one run as (measured - modelled) phase seconds per element (median steps)
with the compute at its sitting's matmul probe: docs/bench/placements/
bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-dram-cap4gib-2245/placements-clip10-dram-cap4gib-2245-sitting1.json.gz,
memascend (Intel VM, 2026-12-06 22:45, quiet, a sitting at the machine's speed: matmul probe 322.7 GFLOP/s against the
cache's 315.4; 19.7 / 2.9 when fitted on the slow sitting of 21:03, whose probe ran 6% under the cache while stock
ZeRO-Offload ran 1.7x its normal step); the two sittings after it validate it. Only Intel VM records run that engine:
one value."""

MEMASCEND_WORKER_THREADS_HOST_NS_PER_ELEMENT = {"AMD EPYC": -9.0, "Intel(R) Xeon(R)": -3.3}
"""Today's engine's host work per element on the thread that drives backward with the optimizer overlapped, beyond
MEMASCEND_CPU_HOST_NS_PER_ELEMENT (fitted on the engine before its gradient norms went to a worker thread,
engine/ds_internals/bounded_stage3.py _NormWorker, whose counters.norms_on_worker marks the records since: with it
the writes' CRC-32C and the reads' verification run on the region store's threads, engine/direct_nvme.py, and a
single rank's reduce-scatter skips its copies; since, the optimizer's chunk step is one native pass, csrc/moments.h
adam_step_fused), per HOST_CPUS. Those moved work off that thread: the delta is negative. Records of engines before
(no norms_on_worker counter) are planned without it (JobSpec.norm_worker). Fitted on one run per CPU as the term that
makes its plan at its sitting's matmul probe its measured s/step: Intel, docs/bench/placements/
bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-quiet3/placements-clip10-quiet3-calibration-split-cap2.5gib.json.gz,
memascend (2026-12-07 00:50, quiet, the split at 2.5 GiB, probe 315.3 GFLOP/s against the cache's 315.4; 3.60
s/step), recorded before the sweep it planned; AMD, the first overlapped memascend run on that VM:
docs/bench/ssd-bound/bench-llama-136m-seq512-bf16-ssd400mbs-noclip-rounds-quiet6-round1.json.gz, memascend (2026-12-07
08:55, all on the SSD at 400 MB/s, bf16, fp32 moments). Each CPU's other memascend runs validate it
(tests/unit/test_time_validation.py)."""

MEMASCEND_GRADIENT_WRITE_BLOCKING = 0.56
"""The share of the last backward's gradient writes that memascend's backward waits for on the CPU accelerator with
the optimizer overlapped, where gradients stream to the region (clipping on: kept there for a redo, engine/overlap.py;
accumulated running sums). Each gradient goes out through the gradient ring (engine/bounded.py GradientStream.write:
4 slots of 8 MiB, planner.windows EngineWindows.gradient_slots), whose take() waits for the oldest slot's write when
the ring is full: a layer's gradients come at once, faster than the region takes them, and share the write budget
with the optimizer's write-behind (the engine's region_io write_wait_s). Fitted on one run as the share that makes its
plan at its sitting's matmul probe its measured s/step, 0.56 with the reads before the window overlapping its compute
in part (0.65 when they added to it, 1.01 before MEMASCEND_OVERLAP_SERIAL_SHARE). docs/bench/placements/
bench-llama-136m-l4-seq512-fp32-ssd400mbs-clip10-quiet/placements-clip10-quiet-cap-2.75GiB.json.gz, memascend (Intel
VM, 2026-12-06, quiet: the split at 2.75 GiB, clipping 10, 0.85 s of gradient writes a step at 400 MB/s; its plan was
-21% without the term, while the all-DRAM runs beside it, which write no gradient, were -4% to -13%); the sitting's
repeat and 2 GiB point, and later sweeps, validate it (tests/unit/test_time_validation.py)."""

MEMASCEND_OVERLAP_SERIAL_SHARE = 0.294
"""The share of the shorter side of memascend's overlap window (the last backward with Adam, the host work and the
gradient writes' wait on the thread that drives it, against the SSD reads and writes beside it) that adds to the
longer on the CPU accelerator: the region's completions, its checksum and verify threads run on the cores of the
matmuls (2 on this VM), so the two sides overlap only in part; the same share prices the parameter reads prefetched
beside the matmuls before the window (0.281 when those added to them). Fitted on one run as the share that makes its
plan at its sitting's matmul probe its measured s/step:
docs/bench/ssd-bound/bench-llama-136m-seq512-bf16-ssd400mbs-noclip-rounds-quiet-round1.json.gz, memascend (Intel
VM, 2026-12-06 17:15, quiet; bf16, every state on the SSD at 400 MB/s, no clipping: 5.76 s/step, planned 4.87
without the share); the sitting's other rounds and the placement sweeps validate it
(tests/unit/test_time_validation.py)."""

RESOURCES = ("compute", "SSD read", "SSD write", "CPU Adam", "host copies", "PCIe")
PHASE_FORWARD_BACKWARD, PHASE_OPTIMIZER = "forward+backward", "optimizer"


@dataclass(frozen=True)
class Device:
    """Where the model's matmuls run and how fast."""

    name: str
    flops_per_s: float | None
    """Achieved FLOP/s per rank; None = unknown (no GPU in the table and no CPU measurement)."""
    source: str
    gpu: bool
    pcie_bytes_per_s: float | None = None
    cpu_adam_elems_per_s_per_core: float | None = None
    """Measured on this box (planner.measured.time_rates); None: CPU_ADAM_ELEMS_PER_S_PER_CORE."""
    rates_source: str = ""
    """Where the PCIe and CPU Adam rates come from: the table and the constant, or a measurement on this GPU box."""
    host_cpu: str = DEFAULT_HOST_CPU
    """The HOST_CPUS entry whose host terms price the CPU accelerator's host work (host_terms_of)."""
    host_cpu_fitted: bool = True
    """Whether those terms were fitted on this CPU (False: another CPU's, the plan says so)."""


def gpu_device(gpu_name: str | None, *, measured_tflops: float | None = None, rates: dict | None = None) -> Device:
    """A GPU's achieved bf16 throughput: measured when given, else the table's dense peak x GPU_ACHIEVED_FRACTION.
    `rates`: the PCIe and CPU Adam rates measured on this GPU's box (planner.measured.time_rates), else the PCIe table
    and CPU_ADAM_ELEMS_PER_S_PER_CORE."""
    key = next((k for k in GPU_BF16_DENSE_TFLOPS if gpu_name and k.lower() in gpu_name.lower()), None)
    pcie = 1e9 * PCIE_GBPS.get(key, DEFAULT_PCIE_GBPS) if key else 1e9 * DEFAULT_PCIE_GBPS
    extra = {"rates_source": "PCIe table, CPU Adam constant"}
    if rates:
        pcie = rates["pcie_bytes_per_s"]
        extra = {"cpu_adam_elems_per_s_per_core": rates["cpu_adam_elems_per_s_per_core"],
                 "rates_source": rates["source"]}
    if measured_tflops:
        return Device(gpu_name or "GPU", measured_tflops * 1e12, "measured", True, pcie, **extra)
    if key is None:
        return Device(gpu_name or "GPU", None, "not in the GPU table (give a measurement)", True, pcie, **extra)
    return Device(gpu_name, GPU_BF16_DENSE_TFLOPS[key] * GPU_ACHIEVED_FRACTION * 1e12,
                  f"{key} datasheet {GPU_BF16_DENSE_TFLOPS[key]:g} TFLOPS x {GPU_ACHIEVED_FRACTION}", True, pcie,
                  **extra)


def cpu_device(gflops: float | None, source: str, cpu_model: str | None = None) -> Device:
    """The CPU as the compute device (DeepSpeed's CPU accelerator): its measured GFLOP/s, or unknown; its host work
    priced with the terms of `cpu_model`'s HOST_CPUS entry (host_terms_of)."""
    fitted_on, fitted = host_terms_of(cpu_model)
    return Device("CPU", gflops * 1e9 if gflops else None, source, False, host_cpu=fitted_on, host_cpu_fitted=fitted)


def phase_flops(model, *, tokens: int, seq_len: int, checkpointing: str,
                chunked_loss: bool = False) -> tuple[float, float]:
    """(forward, backward) FLOPs of one rank's micro-batches over `tokens` tokens of sequences of `seq_len`.

    Forward per token: 2 N (matmul parameters: the input embedding is a lookup, a tied LM head is a matmul) plus
    2 n_layer n_ctx d_attn for attention scores and values (Kaplan et al. 2020, table 1); backward twice the forward
    (ibid., C = 6N per token). Full activation recomputation adds one forward of the decoder layers (Korthikanti et
    al. 2022, "Reducing Activation Recomputation in Large Transformer Models", section 5), not of the LM head:
    transformers checkpoints each decoder layer (modeling_layers.py GradientCheckpointingLayer), and the head runs
    once; selective recomputation only the attention core (ibid., section 4). With memascend's chunked loss the LM
    head's backward runs inside forward (memascend_engine.chunked_loss: each chunk's gradients are made with its
    logits)."""
    n_matmul = model.num_params - (0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size)
    d_attn = model.num_attention_heads * model.head_dim_
    attention = 2.0 * model.num_hidden_layers * seq_len * d_attn * tokens
    head = 2.0 * model.vocab_size * model.hidden_size * tokens
    forward = 2.0 * n_matmul * tokens + attention
    recompute = {"none": 0.0, "selective": attention}.get(checkpointing, forward - head)
    head_backward = 2.0 * head if chunked_loss else 0.0
    return forward + head_backward, 2.0 * forward - head_backward + recompute


def step_flops(model, *, tokens: int, seq_len: int, checkpointing: str) -> float:
    """FLOPs of one rank's step over `tokens` tokens (phase_flops' forward + backward)."""
    return sum(phase_flops(model, tokens=tokens, seq_len=seq_len, checkpointing=checkpointing))


@dataclass
class StepTime:
    """One engine's step, resource by resource (seconds) and as the overlap rules combine them."""

    engine: str
    seconds: dict[str, float | None]
    """Each resource's busy time per step; None = its rate is unknown."""
    step_s: float | None
    tokens_per_step: int
    binding: str
    overlap: str
    unknown: list[str] = field(default_factory=list)
    at_least_s: float | None = None
    """With an SSD rate unknown: the step without that SSD time (step_s is then None: the SSD may well bind)."""
    phase_s: dict[str, float] = field(default_factory=dict)
    """The step's two phases: forward + backward, and what follows backward (with the optimizer overlapped, the
    time its I/O adds to the last backward counts there)."""

    @property
    def tokens_per_s(self) -> float | None:
        return None if not self.step_s else self.tokens_per_step / self.step_s

    def hours_for(self, tokens: int) -> float | None:
        t = self.tokens_per_s
        return None if not t else tokens / t / 3600.0

    def to_dict(self, tokens: int | None = None) -> dict:
        d = {"seconds_per_step": _r(self.step_s), "tokens_per_step": self.tokens_per_step,
             "tokens_per_s": _r(self.tokens_per_s), "binding": self.binding, "overlap": self.overlap,
             "resource_seconds": {k: _r(v) for k, v in self.seconds.items()}, "unknown": list(self.unknown),
             "seconds_per_step_at_least": _r(self.at_least_s),
             "phase_seconds": {k: _r(v) for k, v in self.phase_s.items()}}
        if tokens:
            d["tokens"] = tokens
            d["hours"] = _r(self.hours_for(tokens))
        return d


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _div(work: float, rate: float | None) -> float | None:
    if not work:
        return 0.0
    return None if not rate else work / rate


def step_time(engine: str, *, flops: float, traffic, device: Device, read_bytes_per_s: float | None,
              write_bytes_per_s: float | None, optimizer_elems: int, cpu_cores: int, tokens_per_step: int,
              pipelined_optimizer: bool = False, grad_accum: int = 1, elem_bytes: int = 2, duplex_io: bool = False,
              sub_group_numels: tuple[int, ...] = (), overlap_window: float = 0.0, tail_elems: int = 0,
              norm_worker: bool = True) -> StepTime:
    """The step time of `engine` (stock, tuned or memascend) for one rank.

    `duplex_io`: reads and writes have budgets of their own (`bench --ssd-bandwidth`: the kernel throttles each
    direction separately), so reads and writes that overlap (forward / backward's parameter reads and gradient
    writes, the optimizer's) take the longer of the two, and so do
    stock's serial swap-in / swap-out of the sub-groups whose write takes at most THROTTLE_OVERLAP_BURST_S
    (`sub_group_numels`: the partition elements of each of stock's optimizer sub-groups).

    Phases and overlap:
    - forward + backward: on a GPU the matmuls overlap the parameter fetches (DeepSpeed's prefetch of the next
      sub-modules, runtime/zero/partitioned_param_coordinator.py fetch_sub_module), the gradient and checkpoint
      writes and the host<->device copies; the phase takes the longest of them. On DeepSpeed's CPU accelerator
      they add up (see below).
    - optimizer: stock DeepSpeed swaps each sub-group in, steps it and swaps it out in turn
      (runtime/zero/stage3.py _optimizer_states_and_gradient_swap_in, step) unless pipeline_read / pipeline_write
      are set (runtime/swap_tensor/pipelined_optimizer_swapper.py swap_in/out_optimizer_state: async_swap_in /
      async_swap_out), which overlap the reads and writes of neighbouring sub-groups with Adam. memascend's
      optimizer (engine/optimizer_pipeline.py) keeps three chunk slots in flight: the next chunk's read ahead and the
      last chunk's write behind the current chunk's Adam. Reads and writes share one drive, so overlapped I/O takes
      read + write time (unless `duplex_io`).
    - memascend with the optimizer overlapped with backward (`overlap_window`: the last micro-batch's backward's
      share of the FLOPs, memascend_engine.overlap): each chunk is stepped as its gradients are reduced, so the
      optimizer's I/O runs beside that backward, with the transfers of the backward itself (its parameter fetch,
      checkpoint reads and gradient writes), and its Adam on the thread that drives it. The
      chunks of the `tail_elems` whose gradients come last (the input embedding: backward ends with it, and a tied
      LM head's gradient completes only then) have nothing left to hide behind: they are read, stepped and written
      after backward, their reads, Adam and writes pipelined with each other. Optimizer states kept in DRAM
      (`traffic.dram_state_elems`, memascend's planned DRAM tier) are stepped after backward too, in place.
    - parameters fetched from DRAM (`traffic.dram_fetch_bytes`: max_in_cpu, a DRAM placement) cost no SSD time but
      cross PCIe like the SSD's.
    """
    rd, wr = dict(traffic.read_bytes), dict(traffic.write_bytes)
    bounded = engine == "memascend"
    ga = max(1, grad_accum)
    grad_rd_bwd = rd.get("gradients", 0) * (ga - 1) // ga if bounded else 0
    fb_read = rd.get("params", 0) + rd.get("activation_checkpoints", 0) + grad_rd_bwd
    fb_write = wr.get("activation_checkpoints", 0) + wr.get("gradients", 0)
    opt_read = rd.get("optimizer_states", 0) + rd.get("gradients", 0) - grad_rd_bwd
    opt_write = wr.get("optimizer_states", 0) + wr.get("params", 0)

    compute = _div(flops, device.flops_per_s)
    fb_r, fb_w = _div(fb_read, read_bytes_per_s), _div(fb_write, write_bytes_per_s)
    op_r, op_w = _div(opt_read, read_bytes_per_s), _div(opt_write, write_bytes_per_s)
    adam = optimizer_elems / ((device.cpu_adam_elems_per_s_per_core or CPU_ADAM_ELEMS_PER_S_PER_CORE)
                              * max(1, cpu_cores))
    # The share of Adam over states kept in DRAM (SsdTraffic.dram_state_elems): stepped after backward.
    dram_elems = min(optimizer_elems, getattr(traffic, "dram_state_elems", 0))
    adam_dram = adam * dram_elems / optimizer_elems if optimizer_elems else 0.0
    # Host<->device: parameters up for every fetch, from the SSD or from DRAM, gradients down once per micro-batch
    # (GPU only).
    up = fb_read + getattr(traffic, "dram_fetch_bytes", 0)
    pcie = _div(up + elem_bytes * optimizer_elems * ga, device.pcie_bytes_per_s) if device.gpu else 0.0
    unknown = [name for name, v in (("compute", compute), ("SSD read", op_r), ("SSD write", op_w)) if v is None]

    def z(x):
        return x or 0.0

    # Gradient and checkpoint writes stream out while the next parameters are read: on one drive they share its
    # bandwidth, under a per-direction throttle each has its own.
    fb_io = max(z(fb_r), z(fb_w)) if duplex_io else z(fb_r) + z(fb_w)
    op_io = z(op_r) + z(op_w)
    host_fb, host_opt, host_window = (0.0, 0.0, 0.0) if device.gpu else _host_seconds(
        engine, optimizer_elems, all_in_dram=bool(optimizer_elems) and dram_elems >= optimizer_elems,
        overlapped=bounded and overlap_window > 0, norm_worker=norm_worker,
        params_from_tier=getattr(traffic, "dram_fetch_bytes", 0) > 0, cpu=device.host_cpu)
    if device.gpu:
        fb = max(z(compute), fb_io, z(pcie))
        overlap = "forward/backward: max(compute, SSD, PCIe)"
    elif engine == "tuned":
        # Tuned stock's parameter prefetch (runtime/zero/partitioned_param_coordinator.py fetch_sub_module, with the
        # buffers tuned sizes for it: planner.zero) keeps the next modules' reads in flight while the current ones
        # compute: the bench documents' forward + backward took compute + host passes, or the reads where longer.
        fb = max(z(compute) + host_fb, fb_io)
        overlap = "forward/backward: max(compute + host copies, SSD) (CPU accelerator)"
    else:
        # DeepSpeed's CPU accelerator: the parameter fetches block the module that needs them (the bench documents'
        # forward and backward phases grow by the fetch time, not by max(compute, I/O)), and the aio/io_uring
        # completions run on the cores that do the matmuls.
        fb = z(compute) + fb_io + host_fb
        overlap = "forward/backward: compute + SSD" + (" + host copies" if host_fb else "") + " (CPU accelerator)"
    if bounded and overlap_window > 0:
        w = min(1.0, overlap_window)
        t = min(1.0, tail_elems / optimizer_elems) if optimizer_elems else 0.0
        o_r, o_w, o_adam = z(op_r) * (1 - t), z(op_w) * (1 - t), (adam - adam_dram) * (1 - t)
        win_read, win_write = _window_bytes(traffic, ga, grad_rd_bwd)
        win_r, win_w = z(_div(win_read, read_bytes_per_s)), z(_div(win_write, write_bytes_per_s))
        pre_r, pre_w = z(fb_r) - win_r, z(fb_w) - win_w
        pre_io = max(pre_r, pre_w) if duplex_io else pre_r + pre_w
        if device.gpu:
            before = max(z(compute) * (1 - w), pre_io, z(pcie) * (1 - w))
            window_work = max(z(compute) * w + o_adam, z(pcie) * w)
        else:
            # Before the window, memascend's parameter prefetch (DeepSpeed's, stage3_prefetch_bucket_size, into the
            # pool's slots for prefetch_layers layers: planner.zero param_pool_plan) keeps the next layers' reads in
            # flight while a layer computes, as tuned's does; their completions share the matmuls' cores, so the two
            # overlap in part, as in the window (on the AMD EPYC VM 1.4 s of bf16 matmuls hid behind 3.3 s of reads:
            # 3.9-4.8 s/step). In the window the fetches block the layer that needs them, and Adam runs on the
            # thread that drives backward (memascend_engine.overlap): they add to the window's compute.
            before = _in_part(z(compute) * (1 - w), pre_io)
            # Backward waits for its gradients' writes where the ring is full (MEMASCEND_GRADIENT_WRITE_BLOCKING);
            # they still take the write budget beside it (io).
            window_work = z(compute) * w + win_r + o_adam + host_window + MEMASCEND_GRADIENT_WRITE_BLOCKING * win_w
        io = max(win_r + o_r, win_w + o_w) if duplex_io else win_r + win_w + o_r + o_w
        a_t = (adam - adam_dram) * t
        # DRAM-resident states have no SSD I/O to hide behind: stepped in place once backward is done (no second copy
        # of them for a redo, as the region's speculation keeps).
        tail = (max(z(op_r) * t, z(op_w) * t, a_t) if duplex_io else max((z(op_r) + z(op_w)) * t, a_t)) + adam_dram
        # The step is what precedes the last backward, the longer of (that backward + Adam) and the I/O beside it,
        # then the chunks whose gradients come last.
        # The two sides of the window overlap only in part on the CPU accelerator (MEMASCEND_OVERLAP_SERIAL_SHARE).
        fb, opt = before + (max(window_work, io) if device.gpu else _in_part(window_work, io)), tail
        overlap += "; optimizer: during the last backward, max(backward + Adam, SSD), then the embedding's chunks"
    elif bounded or pipelined_optimizer:
        # Tuned's host passes of the step run on the CPU while the pipelined swapper's reads and writes are in flight.
        opt = max(max(z(op_r), z(op_w)) if duplex_io else op_io, adam + host_opt)
        overlap += "; optimizer: max(" + ("SSD read, SSD write" if duplex_io else "SSD") + ", Adam" \
            + (" + host copies)" if host_opt else ")") + (" (separate read / write budgets)" if duplex_io else "")
    elif duplex_io and sub_group_numels:
        # Stock waits for each sub-group's swap-in and swap-out (runtime/swap_tensor/partitioned_optimizer_swapper.py
        # _swap_out_optimizer_state: aio_handle.wait()). A sub-group whose write burst is short enough
        # loses nothing to the wait (the idle direction keeps its budget); a longer one reads, then writes.
        opt = _serial_swaps(z(op_r), z(op_w), sub_group_numels) + adam + host_opt
        overlap += "; optimizer: per sub-group, SSD read then write (their max for short bursts) + Adam"
    else:
        opt = op_io + adam + host_opt
        overlap += "; optimizer: SSD read + Adam + SSD write"
    if host_opt and not (bounded or pipelined_optimizer):
        overlap += " + host copies"
    seconds = {"compute": compute, "SSD read": None if fb_r is None or op_r is None else fb_r + op_r,
               "SSD write": None if fb_w is None or op_w is None else fb_w + op_w, "CPU Adam": adam,
               "host copies": host_fb + host_opt + host_window, "PCIe": pcie if device.gpu else None}
    # Binding: the resource whose busy time is the largest share of the step.
    known = {k: v for k, v in seconds.items() if v is not None}
    if unknown:
        # An unknown rate may be the one that binds: no step time, only its lower bound without that resource.
        at_least = None if compute is None else fb + opt
        return StepTime(engine, seconds, None, tokens_per_step, "unknown", overlap, unknown, at_least)
    binding = max(known, key=lambda k: known[k])
    return StepTime(engine, seconds, fb + opt, tokens_per_step, binding, overlap, unknown,
                    phase_s={PHASE_FORWARD_BACKWARD: fb, PHASE_OPTIMIZER: opt})


def _window_bytes(traffic, ga: int, grad_rd_bwd: float) -> tuple[float, float]:
    """(read, written) bytes of memascend's last backward, by where each transfer happens rather than by its share of
    the FLOPs: each micro-batch fetches the parameters twice (forward, then recompute / backward: zero.py's traffic
    formula), writes its checkpoints in forward and reads them back in backward, and sends its gradients to the SSD in
    backward (the accumulated ones, `grad_rd_bwd`, read back in micro-batches 2..ga)."""
    rd, wr = traffic.read_bytes, traffic.write_bytes
    bwd_params = traffic.backward_param_read_bytes
    read = (rd.get("params", 0) / 2 if bwd_params is None else bwd_params) / ga \
        + rd.get("activation_checkpoints", 0) / ga + (grad_rd_bwd / (ga - 1) if ga > 1 else 0)
    return read, wr.get("gradients", 0) / ga


def _in_part(a: float, b: float) -> float:
    """Two sides that run beside each other on the CPU accelerator's cores: the longer, plus
    MEMASCEND_OVERLAP_SERIAL_SHARE of the shorter."""
    return max(a, b) + MEMASCEND_OVERLAP_SERIAL_SHARE * min(a, b)


def _host_seconds(engine: str, elems: int, *, all_in_dram: bool, overlapped: bool, norm_worker: bool = True,
                  params_from_tier: bool = True, cpu: str = DEFAULT_HOST_CPU) -> tuple[float, float, float]:
    """(backward, optimizer, overlap window) seconds of an engine's host work beyond the matmuls, the SSD and Adam on
    the CPU accelerator, on the cores of the matmuls. Stock's passes over each element (tuned stock runs the same
    stage3.py code): ZeRO-Offload's own where every state is in DRAM, none swapped; memascend's in the overlap window,
    with today's engine's delta (`norm_worker`: not for engines recorded before it), and its dram row's own (no
    overlap, every chunk stepped in place in the tier): with the parameters fetched from the tier
    (`params_from_tier`: runs recorded before the row kept them resident) MEMASCEND_DRAM_HOST_NS_PER_ELEMENT, with
    them resident ZeRO-Offload's passes, which bound its own: in backward each gradient's norm and one copy (into its
    held key, engine/bounded.py GradientStream.write, where stock copies into its fp32 partition), in the step no
    master, gradient or parameter copied (engine/optimizer_pipeline.py _bind: stepped where they live, where stock
    copies its fp32 partitions into the parameters)."""
    if engine in ("stock", "tuned"):
        ns = STOCK_CPU_OFFLOAD_HOST_NS_PER_ELEMENT[cpu] if all_in_dram else STOCK_CPU_HOST_NS_PER_ELEMENT
    elif overlapped:
        threads = MEMASCEND_WORKER_THREADS_HOST_NS_PER_ELEMENT[cpu] if norm_worker else 0.0
        window = MEMASCEND_CPU_HOST_NS_PER_ELEMENT + threads
        return 0.0, 0.0, elems * window * 1e-9
    elif all_in_dram:
        ns = MEMASCEND_DRAM_HOST_NS_PER_ELEMENT if params_from_tier else STOCK_CPU_OFFLOAD_HOST_NS_PER_ELEMENT[cpu]
    else:
        return 0.0, 0.0, 0.0
    return elems * ns["backward"] * 1e-9, elems * ns["optimizer"] * 1e-9, 0.0


def _serial_swaps(read_s: float, write_s: float, sub_group_numels: tuple[int, ...]) -> float:
    """Stock's optimizer I/O under a per-direction throttle: each sub-group's share of the reads and writes, the longer
    of the two where its write takes at most THROTTLE_OVERLAP_BURST_S, else their sum."""
    total = sum(sub_group_numels)
    out = 0.0
    for n in sub_group_numels:
        r, w = read_s * n / total, write_s * n / total
        out += max(r, w) if w <= THROTTLE_OVERLAP_BURST_S else r + w
    return out


def parse_tokens(text: str) -> int:
    """'50M', '2B', '1.5e9', '300000' -> a token count. Raises ValueError."""
    t = text.strip().upper().replace("_", "").replace(",", "")
    mult = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}.get(t[-1:], 1)
    value = float(t[:-1] if t[-1:] in "KMBGT" else t) * mult
    if value <= 0:
        raise ValueError(text)
    return int(value)


# Documents recorded before plan --json schema 2 key stock DeepSpeed as "baseline"; read them under today's name.
ENGINE_NAMES = {"baseline": "stock", "stock": "stock", "tuned": "tuned", "memascend": "memascend"}


def timed_as(engine: str, prefetch_bucket_size: int | None) -> str:
    """The engine whose step time a run of `engine` takes: stock's code without prefetch (stage3_prefetch_bucket_size
    0, stock's split: planner.placement.SPLIT_PREFETCH_BUG) waits for each module's fetch, stock's serial forward and
    backward (step_time), even with tuned's other knobs. Pure."""
    return "stock" if engine == "tuned" and prefetch_bucket_size == 0 else engine


def engine_times(job, ests: dict, device: Device, *, read_gbps: float | None, write_gbps: float | None,
                 cpu_cores: int, duplex_io: bool = False) -> dict[str, StepTime]:
    """Each engine's StepTime for `job`, from the memory model's estimates (`estimate_all`); `duplex_io`: the
    bandwidths are a per-direction throttle's (step_time). Pure."""
    from memascend_cli.planner.memory import DTYPE_BYTES

    ga = max(1, job.grad_accum_steps)
    out = {}
    for key, est in ests.items():
        if est.traffic is None:
            continue
        name = ENGINE_NAMES.get(key, key)
        # The ranks of a node share its drives, and on a CPU-only node its cores.
        ranks = max(1, est.ranks_per_node)
        dev = device if device.gpu or device.flops_per_s is None else \
            replace(device, flops_per_s=device.flops_per_s / ranks)
        rank_tokens = job.micro_batch * job.seq_len * ga
        fwd_flops, bwd_flops = phase_flops(job.model, tokens=rank_tokens, seq_len=job.seq_len,
                                           checkpointing=job.checkpointing, chunked_loss=job.chunked_loss)
        flops = fwd_flops + bwd_flops
        out[name] = step_time(
            name, flops=flops, traffic=est.traffic, device=dev,
            read_bytes_per_s=read_gbps * 1e9 / ranks if read_gbps else None,
            write_bytes_per_s=write_gbps * 1e9 / ranks if write_gbps else None,
            optimizer_elems=est.traffic.params_per_rank,
            cpu_cores=max(1, cpu_cores // ranks),
            tokens_per_step=rank_tokens * est.world_size,
            # The sub-groups and pipelining the engine runs with (tuned: memascend's knobs on the job's).
            pipelined_optimizer=est.pipelined_optimizer,
            grad_accum=ga, elem_bytes=DTYPE_BYTES[job.dtype], duplex_io=duplex_io,
            sub_group_numels=est.sub_group_numels,
            overlap_window=(bwd_flops / flops / ga
                            if name == "memascend" and job.streaming and job.overlap_optimizer else 0.0),
            tail_elems=job.model.vocab_size * job.model.hidden_size // max(1, est.world_size),
            norm_worker=job.norm_worker)
    return out


def time_document(times: dict[str, StepTime], device: Device, *, read_gbps: float | None, write_gbps: float | None,
                  tokens: int | None) -> dict:
    """The plan's `time` JSON key (docs/plan-json.md). Pure."""
    return {
        "device": {"name": device.name, "gflops": None if device.flops_per_s is None else
                   round(device.flops_per_s / 1e9, 1), "source": device.source, "gpu": device.gpu,
                   "host_terms": None if device.gpu else device.host_cpu,
                   "host_terms_fitted": None if device.gpu else device.host_cpu_fitted},
        "ssd_read_gbps": read_gbps, "ssd_write_gbps": write_gbps,
        "engines": {e: t.to_dict(tokens) for e, t in times.items()},
    }


SEARCH_MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
SEARCH_GRAD_ACCUM = (1, 2, 4, 8, 16)
SEARCH_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


def fastest(job, hw, device: Device, *, read_gbps: float | None, write_gbps: float | None,
            vary_context: bool = False) -> dict[str, dict | None]:
    """Per engine, the micro-batch x gradient accumulation (x context, with `vary_context`: powers of two up to the
    model's max_position_embeddings) with the most tokens/s among those that fit in memory (search.check). Empty
    where the compute rate or an SSD rate is unknown (the step time is), None for an engine where nothing fits. Pure."""
    from memascend_cli.planner.memory import estimate_all
    from memascend_cli.planner.search import check

    if device.flops_per_s is None or not read_gbps or not write_gbps:
        return {}
    limit = job.model.max_position_embeddings or max(SEARCH_SEQ_LENS)
    seqs = sorted({job.seq_len} | ({s for s in SEARCH_SEQ_LENS if s <= limit} if vary_context else set()))
    best: dict[str, dict | None] = {}
    for seq in seqs:
        for mb in SEARCH_MICRO_BATCHES:
            any_fit = False
            for ga in SEARCH_GRAD_ACCUM:
                cand = replace(job, seq_len=seq, micro_batch=mb, grad_accum_steps=ga)
                ests = estimate_all(cand, hw)
                fits = {ENGINE_NAMES.get(k, k): check(e, hw).fits for k, e in ests.items()}
                times = engine_times(cand, ests, device, read_gbps=read_gbps, write_gbps=write_gbps,
                                     cpu_cores=hw.cpu_cores)
                for e, t in times.items():
                    best.setdefault(e, None)
                    if not fits.get(e) or t.tokens_per_s is None:
                        continue
                    any_fit = True
                    if best[e] is None or t.tokens_per_s > best[e]["tokens_per_s"] * 1.001:
                        best[e] = {"micro_batch": mb, "grad_accum": ga, "seq_len": seq,
                                   "tokens_per_s": round(t.tokens_per_s, 4), "seconds_per_step": round(t.step_s, 4),
                                   "binding": t.binding}
            if not any_fit:
                break  # a larger micro-batch needs more memory still
    return best
