"""The SSD: space per rank and bytes moved per optimizer step. Pure: stdlib only."""

from __future__ import annotations

from memascend_cli.planner.breakdown import Item, SsdTraffic
from memascend_cli.planner.context import Context
from memascend_cli.planner.job import MOMENT_BYTES
from memascend_cli.planner.zero import AIO_ALIGNED_BYTES, PAGE_BYTES, partition_numel, template_partitions


SPECULATIVE_STATES_KEY = "nvme/optimizer_states_speculative"
"""The item of the overlap's second set of optimizer states (memascend_engine.overlap)."""


def state_bytes_per_elem(c: Context) -> int:
    """SSD bytes of the fp32 master and the two Adam moments per element: 12, or 8 with memascend's bf16 moments
    (EngineOptions.optimizer_moments; stock keeps fp32 states, optimizer_utils.py)."""
    return 4 + 2 * (MOMENT_BYTES[c.job.optimizer_moments] if c.bounded else 4)


def nvme_items(c: Context) -> list[Item]:
    """SSD bytes per rank: the swapped parameters (E B), fp32 master + Adam moments (12 B) and fp32 gradients (4 B) per
    element, plus checkpoint copies."""
    part, E = c.part, c.E
    align = PAGE_BYTES if c.memascend else AIO_ALIGNED_BYTES * max(1, c.k.intra_op_parallelism)
    params = part.aligned_sum("params", -(-c.min_aio_bytes // E), E, align)
    opt = part.aligned_sum("groups", 0 if c.bounded else -(-c.min_aio_bytes // c.M), 4, align)
    where = "region extents" if c.memascend else "swap files"
    states = state_bytes_per_elem(c)
    moments = "exp_avg + exp_avg_sq" if states == 12 else "bf16 exp_avg + exp_avg_sq"
    if c.params_hold_master:  # optimizer_pipeline.OptimizerPipeline.params_hold_master (engine): no master extent
        states = states - E  # bf16: a 2 B residual (OptimizerPipeline.split)
        label = f"{moments} (fp32 master: the parameters" + (")" if E == 4 else " + a 2 B residual)")
    else:
        label = f"fp32 master + {moments}"
    items = [
        Item("nvme/params", f"parameters ({where})", "nvme", params, "steady", "", 0,
             "sum A(partition x E) over swappable params", "runtime/swap_tensor/partitioned_param_swapper.py"),
        Item("nvme/optimizer_states", label, "nvme", states * opt // 4, "steady", "", 0,
             f"{states} B x swappable sub-group elements", "runtime/swap_tensor/optimizer_utils.py"),
        Item("nvme/gradients", "fp32 gradients", "nvme", opt, "steady", "", 0,
             "4 B x swappable sub-group elements",
             "runtime/zero/stage3.py _offload_grad_partition_at_boundary (line 1453)"),
    ]
    if c.overlap and c.params_hold_master:
        items.append(Item(SPECULATIVE_STATES_KEY, "speculative moments + shadow parameters", "nvme",
                          states * opt // 4 + params, "steady", "", 0,
                          f"{states} B x sub-group elements + the parameters again: the overlap's second extent set",
                          "memascend_engine.overlap (the old states stay until step() commits)"))
    elif c.overlap:
        items.append(Item(SPECULATIVE_STATES_KEY, "speculative master + moments", "nvme",
                          states * opt // 4, "steady", "", 0,
                          f"{states} B x sub-group elements: the overlap's second extent set",
                          "memascend_engine.overlap (the old states stay until step() commits)"))
    if c.job.checkpoint_copies:
        items.append(Item("nvme/checkpoints", f"checkpoint copies ({c.job.checkpoint_copies})", "nvme",
                          c.job.checkpoint_copies * 3 * opt, "steady", "", 0,
                          "copies x 12 B/param (optimizer folder without gradients)",
                          "runtime/engine.py save: copytree of the swap folder without gradients (lines 4946-4948)"))
    return items


TIED_EXTRA_FETCHES = 1
"""A tied embedding is used three times a micro-batch, at the embedding and the LM head in forward and once more in
backward, and is released after each (runtime/zero/partitioned_param_coordinator.py release_sub_module with
stage3_max_reuse_distance 0): one fetch more than a layer's."""


def _tied_swapped(c: Context, swapped: int) -> int:
    """Swapped elements of a tied embedding's partition (0 if untied or kept in DRAM)."""
    n = partition_numel(c.m.vocab_size * c.m.hidden_size, max(1, c.world))
    return min(swapped, n) if c.m.tie_word_embeddings and n >= c.min_swap_numel else 0


def param_fetch_bytes(c: Context, swapped: int, in_cpu: int = 0) -> tuple[int, int]:
    """(forward, backward) parameter bytes read per micro-batch: every swapped partition once each way, a tied
    embedding once more (TIED_EXTRA_FETCHES, counted in forward); `in_cpu`: the elements max_in_cpu keeps in DRAM (never
    fetched: the first sub-groups, the embedding first).

    A checkpointed layer's recomputed forward runs right before its backward, and that backward finds the parameters
    the recompute fetched still resident: measured, tuned stock reads 24.2 B/param per fp32 step at 8 layers, seq 512
    (12 B Adam states + 4 B gradients + 2 x 4 B parameters; docs/bench/ssd-bound/). memascend's pool holds
    prefetch_layers layers (zero.param_pool_plan): the last ones of forward are still there for the first ones of
    backward."""
    E = c.E
    tied = _tied_swapped(c, swapped) if in_cpu == 0 else 0
    if not c.memascend:
        return E * (swapped + TIED_EXTRA_FETCHES * tied), E * swapped
    # With the master taken from the parameters (fp32, the overlap) the swapper keeps a partition released in
    # backward until its gradient's offer (engine/ds_internals/swapper.py _keeps_for_master): the tied embedding,
    # released after the LM head's backward, is still there for the embedding's.
    forward = E * (swapped + (0 if c.master_from_params else TIED_EXTRA_FETCHES) * tied)
    layer = sum(n for n, _ in template_partitions(c.m, c.world)[1] if n >= c.min_swap_numel)
    kept = min(c.prefetch_layers, c.m.num_hidden_layers, swapped // max(1, layer)) * layer
    return forward, E * (swapped - kept)


def ssd_traffic(c: Context) -> SsdTraffic:
    """SSD bytes per optimizer step, steady state (the first step reads no Adam moments).

    Stock DeepSpeed (runtime/zero/stage3.py _offload_grad_partition_at_boundary, optimizer_utils.py): fp32 gradients
    written and read back (4 + 4 B), fp32 master + exp_avg + exp_avg_sq read and written (12 + 12 B), 16-bit params
    written back (E B) and fetched for forward, backward (and recompute). The bounded engine writes and reads the
    gradient once in its training dtype (G + G B) instead (Lin et al., "Memory-Optimized Offloading: Enabling LLM
    Fine-Tuning on Memory-Constrained Hardware")."""
    job, part, E, G = c.job, c.part, c.E, c.G
    ga = job.grad_accum_steps
    # Swapped partition elements; the leading sub-groups that fit in max_in_cpu stay in DRAM (host P3) and are never
    # fetched nor written back (params_in_dram). The engine's own knobs decide it: tuned and memascend run with
    # max_in_cpu 0 whatever the job's stock knobs say (zero.memascend_knobs).
    in_cpu = params_in_dram(c.part.sub_group_numels, c.k.max_in_cpu)
    swapped = max(0, part.aligned_sum("params", -(-c.min_aio_bytes // E), 1, 1) - in_cpu)
    opt = part.aligned_sum("groups", 0 if c.bounded else -(-c.min_aio_bytes // c.M), 1, 1)
    states = state_bytes_per_elem(c)
    fwd, bwd = param_fetch_bytes(c, swapped, in_cpu)
    # The DRAM-resident partitions are still fetched to the compute device once each way per micro-batch.
    dram_fetch = ga * 2 * E * in_cpu
    read = {"params": ga * (fwd + bwd), "optimizer_states": states * opt}
    write = {"optimizer_states": states * opt, "params": E * swapped}
    held = 0
    if c.bounded:
        # Each micro-batch writes its gradient; later micro-batches read the running sum back first. Partitions held
        # in the DRAM accumulation window (zero.EngineWindows.accumulation_bytes) go to the SSD once, at the boundary.
        held = min(opt, c.windows.accumulation_bytes // G) if c.holds_gradients else 0
        read["gradients"] = write["gradients"] = G * (held + (opt - held) * ga)
        grad = (f"gradients {G} B x {ga} micro-batch(es) each way" if not held else
                f"gradients {G} B each way, x {ga} for the {opt - held:,} elements beyond the DRAM window")
        if c.overlap:
            # The last micro-batch's gradients are stepped in DRAM as they are reduced (memascend_engine.overlap):
            # the optimizer reads none back; kept for a possible redo, they go to the DRAM window, else the SSD.
            read["gradients"] = G * (opt - held) * (ga - 1)
            write["gradients"] = G * (opt - held) * (ga if c.overlap_keeps_grads else ga - 1)
            grad += "; the last micro-batch's stepped during backward" + (
                ", kept for a redo (clipping on)" if c.overlap_keeps_grads else ", never on the SSD")
        if c.master_from_params:
            # The parameter partitions are the master's exact copy (bf16: its upper halves); the speculation copies
            # them from the partitions backward drops (memascend_engine.overlap Speculator.released) instead of
            # reading them.
            read["optimizer_states"] -= E * opt
            grad += ("; the fp32 master taken from the parameters backward fetched" if E == 4 else
                     "; the master's upper halves taken from the parameters backward fetched")
        if c.params_hold_master:
            # The parameters written back hold the master (OptimizerPipeline.params_hold_master): fp32 all of it, none
            # beside them; bf16 its upper halves, a 2 B residual beside them (OptimizerPipeline.split).
            write["optimizer_states"] -= E * opt
            grad += "; no master written beside the parameters" if E == 4 else "; the master's 2 B residual beside them"
    else:
        read["gradients"] = 4 * opt
        write["gradients"] = 4 * opt
        grad = "fp32 gradients 4 B each way"
    if c.ssd_checkpoints:
        layer = job.micro_batch * job.seq_len * c.m.hidden_size * E
        read["activation_checkpoints"] = write["activation_checkpoints"] = ga * c.m.num_hidden_layers * layer
    n = max(1, c.ns)
    ckpt = read.get("activation_checkpoints", 0) / n
    grad_read = 0 if c.overlap else G * opt
    grad_write = (G * (opt - held) if c.overlap_keeps_grads else 0) if c.overlap else G * opt
    master_read = (4 - E) * opt if c.master_from_params else 4 * opt
    master_write = (4 - E) * opt if c.params_hold_master else 4 * opt
    minimum = ((E * swapped + bwd + grad_read + states * opt - 4 * opt + master_read) / n + ckpt,
               (E * swapped + grad_write + states * opt - 4 * opt + master_write) / n + ckpt)
    roofline = ((ga * (fwd + bwd) + (states - (E if c.master_from_params else 0)) * opt) / n, states * opt / n)
    per = max(1, E * swapped)
    fetched = f"params {(fwd + bwd) / per:.2f} fetches x {E} B read ({fwd / per:.2f} forward, {bwd / per:.2f} backward)"
    return SsdTraffic(read, write, params_per_rank=c.ns,
                      formula=f"{fetched}, {E} B written; optimizer {states} B each way; {grad}",
                      minimum_per_param=minimum, roofline_per_param=roofline, backward_param_read_bytes=ga * bwd,
                      dram_fetch_bytes=dram_fetch)


def params_in_dram(sub_group_numels: tuple[int, ...], max_in_cpu: int) -> int:
    """Partition elements stock DeepSpeed keeps in DRAM with offload_param nvme: the leading sub-groups that fit whole
    in max_in_cpu (runtime/zero/stage3.py _create_fp16_partitions_with_defragmentation, lines 978-996: a sub-group gets
    the flat CPU buffer only while flat_offset + its elements fit; the rest swap, even if the buffer has room)."""
    kept = 0
    for n in sub_group_numels:
        if kept + n > max_in_cpu:
            break
        kept += n
    return kept
