"""The fp32 masters, Adam states and counters of a ZeRO-3 engine, for memascend's own run checkpoints
(memascend_engine.run_checkpoint) and DeepSpeed's checkpoint API (checkpoint_api), on the stock and memascend paths.

Reads DeepSpeedZeroOptimizer_Stage3's fields (deepspeed/runtime/zero/stage3.py: fp32_partitioned_groups_flat,
fp16_partitioned_groups_flat_numel, optimizer_swapper, _swappable_optimizer_subgroup, ...) and DeepSpeedCPUAdam's
op (deepspeed/ops/adam/cpu_adam.py ds_opt_adam, opt_id); :func:`zero3_optimizer`, the way in, checks the version.
"""

from __future__ import annotations

from memascend_engine.ds_internals.version import check_version


def zero3_optimizer(engine):
    """The engine's ZeRO stage-3 optimizer; raises RuntimeError for any other stage or an untested DeepSpeed."""
    check_version()
    opt = engine.optimizer
    if not hasattr(opt, "fp32_partitioned_groups_flat"):
        raise RuntimeError("memascend checkpoints need a ZeRO stage-3 optimizer (zero_optimization.stage 3)")
    return opt


ADAM_STATES = ("exp_avg", "exp_avg_sq")
"""The moment tensors of Adam-family optimizers (DeepSpeedCPUAdam, torch AdamW)."""


class SubgroupState:
    """Sub-group i's fp32 master partition and Adam state, swapped in from the SSD for the duration of a `with`.

    ``write_back=False``: released without a write (the SSD copy is untouched; used to save a checkpoint).
    ``write_back=True``: after the block the master goes to the model partitions (copy or swap-out, as ``step()``
    does after the update) and the state is swapped out (used to load a checkpoint).
    """

    def __init__(self, engine, i: int, *, write_back: bool):
        self.opt = zero3_optimizer(engine)
        self.i = i
        self.write_back = write_back
        self.fp32 = self.opt.fp32_partitioned_groups_flat[i]
        self.swap = bool(getattr(self.opt, "swap_optimizer", False)) and self.opt._swappable_optimizer_subgroup(i)

    def __enter__(self) -> SubgroupState:
        if self.swap:
            self.opt.optimizer_swapper.swap_in_optimizer_state(parameter=self.fp32)
        return self

    @property
    def state(self) -> dict:
        """The inner optimizer's state of this sub-group (with write_back, created empty when missing)."""
        if self.write_back:
            return self.opt.optimizer.state.setdefault(self.fp32, {})
        return self.opt.optimizer.state.get(self.fp32, {})

    def __exit__(self, *exc) -> None:
        if self.write_back and exc[0] is None:
            self.opt._reassign_or_swap_out_partitioned_parameters(self.i)
            if self.swap:
                self.opt.optimizer_swapper.swap_out_optimizer_state(parameter=self.fp32)
        elif self.swap:
            self.opt.optimizer_swapper.release_swap_buffers(parameter=self.fp32)


class OptimizerStateAccess:
    """The fp32 master and Adam states of a ZeRO-3 engine, group by group, for memascend's own checkpoints.

    Groups are DeepSpeed's sub-groups on the stock path and memascend's chunks with the bounded engine; either way
    ``read(i)`` gives ``(step, {"fp32", "exp_avg", "exp_avg_sq"})`` (no moments before the first step) and
    ``write(i, step, tensors)`` restores them and the model-dtype parameters derived from the master.
    """

    def __init__(self, engine):
        self.opt = zero3_optimizer(engine)
        self.bounded = bool(getattr(self.opt, "_ma_bounded", False))

    @property
    def num_groups(self) -> int:
        return len(self.opt._ma_chunks) if self.bounded else len(self.opt.fp32_partitioned_groups_flat)

    def numel(self, i: int) -> int:
        if self.bounded:
            return int(self.opt._ma_chunks[i].numel)
        return int(self.opt.fp16_partitioned_groups_flat_numel[i])

    def subgroup_of(self, i: int) -> tuple[int, int]:
        """(DeepSpeed sub-group, first element inside it) of group i (a chunk's sub-group and offset)."""
        if not self.bounded:
            return i, 0
        if not hasattr(self, "_offsets"):
            self._offsets, running = [], {}
            for c in self.opt._ma_chunks:
                self._offsets.append(running.get(c.sub_group, 0))
                running[c.sub_group] = self._offsets[-1] + int(c.numel)
        return int(self.opt._ma_chunks[i].sub_group), self._offsets[i]

    def subgroups(self) -> list[tuple[str, int]]:
        """(ds_id, numel) of every DeepSpeed sub-group (the ds_id names its swap files)."""
        return [(str(f.ds_id), int(n)) for f, n in zip(self.opt.fp32_partitioned_groups_flat,
                                                      self.opt.fp16_partitioned_groups_flat_numel)]

    def _step_state(self, i: int) -> dict:
        g = self.opt._ma_chunks[i].sub_group if self.bounded else i
        return self.opt.optimizer.state.setdefault(self.opt.fp32_partitioned_groups_flat[g], {})

    def read(self, i: int) -> tuple[int | None, dict]:
        if self.bounded:
            step = self._step_state(i).get("step")
            return (None if step is None else int(step)), self.opt._ma_pipeline.read_state(i)
        with SubgroupState(EngineRef(self.opt), i, write_back=False) as sg:
            state = sg.state
            tensors = {"fp32": sg.fp32.data.clone()}
            tensors.update({n: state[n].detach().clone() for n in ADAM_STATES if n in state})
            step = state.get("step")
            return (None if step is None else int(step.item() if hasattr(step, "item") else step)), tensors

    def write(self, i: int, step: int | None, tensors: dict) -> None:
        if self.bounded:
            if step is None:
                tensors = {"fp32": tensors["fp32"]}
            self.opt._ma_spec_invalidate()
            self.opt._ma_pipeline.write_state(i, tensors)
            if step is not None:
                self._step_state(i)["step"] = step
            return
        with SubgroupState(EngineRef(self.opt), i, write_back=True) as sg:
            sg.fp32.data.copy_(tensors["fp32"])
            st = sg.state
            if step is not None:
                # Same keys and order as DeepSpeedCPUAdam's lazy init, so the swapper registers the moment tensors
                # exactly as after a first real step.
                st["step"] = step
                for n in ADAM_STATES:
                    if n in st and st[n].numel() == tensors[n].numel():
                        st[n].data.copy_(tensors[n])
                    else:
                        st[n] = tensors[n].clone()


class EngineRef:
    """Stands in for a DeepSpeed engine where only `.optimizer` is needed."""

    def __init__(self, opt):
        self.optimizer = opt


def optimizer_lrs(engine) -> list[float]:
    return [g["lr"] for g in zero3_optimizer(engine).optimizer.param_groups]


def set_optimizer_lrs(engine, lrs: list[float]) -> None:
    for g, lr in zip(zero3_optimizer(engine).optimizer.param_groups, lrs):
        g["lr"] = lr


def loss_scaler_state(engine) -> dict:
    """The fp16 loss scaler's plain attributes (scale, counters), {} without one."""
    scaler = getattr(zero3_optimizer(engine), "loss_scaler", None)
    if scaler is None:
        return {}
    return {k: v for k, v in vars(scaler).items() if isinstance(v, (int, float, bool)) and not k.startswith("_")}


def set_loss_scaler_state(engine, state: dict) -> None:
    scaler = getattr(zero3_optimizer(engine), "loss_scaler", None)
    for k, v in state.items():
        if scaler is not None and hasattr(scaler, k):
            setattr(scaler, k, v)


ENGINE_COUNTERS = ("global_steps", "global_samples", "micro_steps", "skipped_steps")


def engine_counters(engine) -> dict:
    return {k: int(getattr(engine, k)) for k in ENGINE_COUNTERS}


def set_engine_counters(engine, counters: dict) -> None:
    for k, v in counters.items():
        if k in ENGINE_COUNTERS:
            setattr(engine, k, v)


def prime_cpu_adam(engine, step: int) -> None:
    """Replay DeepSpeedCPUAdam's C++ step counter to `step`.

    The C++ op keeps beta^t as a running float product (csrc/includes/cpu_adam.h IncrementStep); a fresh op asked
    for step k+1 computes pow(beta, k+1) instead, which differs in the last bits and breaks bit-exact resume.
    Calling it once per step 1..k on a one-element scratch tensor rebuilds the same running product.
    """
    import torch

    inner = zero3_optimizer(engine).optimizer
    op = getattr(inner, "ds_opt_adam", None)
    if op is None or step <= 0 or not inner.param_groups:
        return
    group = inner.param_groups[0]
    p, g, m, v = (torch.zeros(1, dtype=torch.float32) for _ in range(4))
    beta1, beta2 = group["betas"]
    for s in range(1, step + 1):
        op.adam_update(inner.opt_id, s, group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                       group["bias_correction"], p, g, m, v)


def invalidate_secondary_tensors(engine) -> None:
    """Drop ZeRO++ secondary partitions after the primary ones were rewritten."""
    opt = zero3_optimizer(engine)
    if hasattr(opt, "invalidate_secondary_tensor"):
        opt.invalidate_secondary_tensor()
