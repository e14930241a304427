"""What `memascend launch` shows while the program runs and at its end, beyond the engine's closing lines: a line per
step of the first engaged rank, read from the lines the engine appends (RUN/status/<pid>.steps.jsonl,
engine/launch_steps.py), and the plan of the job DeepSpeed sized (the `job` of the rank's record; the sequence length
from the batches its forward saw), estimated by the same planner `plan` and `train` use.

The program's own output shares the terminal, so progress is plain lines (a Rich bar would be torn by it), one per
PRINT_INTERVAL_S at most. Stdlib only.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from memascend_cli.run import anyprogram

PRINT_INTERVAL_S = 2.0
"""At most one progress line per this many seconds (the first and last steps are always shown)."""


def read_new_lines(path: str, offset: int) -> tuple[list[dict], int]:
    """The complete JSON lines of `path` after byte `offset`, and the offset after them (a line still being
    written waits for the next call)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return [], offset
    end = chunk.rfind(b"\n") + 1
    out = []
    for line in chunk[:end].splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out, offset + end


def _gib(b: int) -> str:
    return f"{b / (1 << 30):.2f} GiB"


def format_step(rec: dict, total: int | None, prev: dict | None) -> str:
    """One progress line (the CLI tags it `step`): step/total, loss, s/step, sequence length, host RSS, SSD GB/s
    read/written over the step. Pure."""
    parts = [f"{rec['step']}/{total or '?'}"]
    if rec.get("loss") is not None:
        parts.append(f"loss {rec['loss']:.4f}")
    s = rec.get("s_per_step") or 0.0
    parts.append(f"{s:.2f} s/step")
    if rec.get("seq_len"):
        parts.append(f"seq {rec['seq_len']}")
    if rec.get("rss_bytes"):
        parts.append(f"host {_gib(rec['rss_bytes'])}")
    if rec.get("read_bytes") is not None and s > 0:
        r0, w0 = (prev.get("read_bytes") or 0, prev.get("written_bytes") or 0) if prev else (0, 0)
        parts.append(f"SSD {(rec['read_bytes'] - r0) / s / 1e9:.2f}/{(rec['written_bytes'] - w0) / s / 1e9:.2f} GB/s")
    return "  ".join(parts)


def step_summary(steps: list[dict]) -> str:
    """`N steps, X s/step (median after the first), last loss L`. Pure."""
    times = sorted(r["s_per_step"] for r in steps[1:] if r.get("s_per_step") is not None) or \
        [r["s_per_step"] for r in steps if r.get("s_per_step") is not None]
    text = f"{len(steps)} step{'s' if len(steps) != 1 else ''}"
    if times:
        text += f", {times[len(times) // 2]:.2f} s/step"
    if steps and steps[-1].get("loss") is not None:
        text += f", last loss {steps[-1]['loss']:.4f}"
    return text


class NotPlanned(Exception):
    """Why the plan of a launched job cannot be estimated (said in one line instead of a number)."""


def job_spec(job: dict, model, seq_len: int | None, env: dict | None = None):
    """The planner's JobSpec for the job DeepSpeed sized (the record's `job`) with `model` (a ModelSpec) at
    `seq_len`: the ZeRO settings are the ones DeepSpeed received, memascend's knobs included. Raises NotPlanned when
    the sequence length is unknown. Pure."""
    from memascend_cli.planner import zero
    from memascend_cli.planner.job import JobSpec

    if not seq_len:
        raise NotPlanned("the sequence length is unknown (the engine's forward saw no batch with a sequence "
                         "dimension yet)")
    knobs = zero.from_ds_config({"zero_optimization": job.get("zero_optimization") or {},
                                 "aio": job.get("aio") or {}}, env)
    return JobSpec(model=model, seq_len=int(seq_len), micro_batch=int(job["micro_batch"]),
                   grad_accum_steps=int(job.get("grad_accum") or 1), dtype=job["dtype"],
                   ranks_per_node=int(job.get("ranks_per_node") or 1),
                   checkpointing="full" if job.get("checkpointing") else "none",
                   deepspeed_version=job["deepspeed_version"], knobs=knobs, param_buffer_size_auto=False,
                   zero_init=bool(job.get("zero_init")), launcher_processes=0)


def model_for(job: dict, *, config_path: str | None, model: str | None):
    """The ModelSpec to plan with: --model when given, else the config.json the rank wrote. Raises NotPlanned."""
    from memascend_cli.errors import MemascendError
    from memascend_cli.models import load_config_json, load_model

    try:
        if model is not None:
            return load_model(model)
        if config_path is not None and os.path.exists(config_path):
            return load_config_json(config_path)
    except MemascendError as exc:
        raise NotPlanned(f"the model cannot be planned ({exc.message}); give --model") from None
    raise NotPlanned(f"the model ({job.get('num_params', 0) / 1e6:.1f}M parameters) has no Hugging Face config; give "
                     "--model with a preset or config.json")


def describe(job: dict, spec, seq_len: int) -> str:
    """The job in a few words, as the plan line names it. Pure."""
    ckpt = {True: "checkpointing", False: "no checkpointing", None: "checkpointing unknown (planned without)"}
    return (f"{spec.num_params / 1e6:.1f}M params, seq {seq_len}, micro-batch {job['micro_batch']}, {job['dtype']}, "
            f"{ckpt[job.get('checkpointing')]}, {job.get('world_size', 1)} rank(s)")


def estimate_peak(job: dict, spec, seq_len: int | None, hw) -> int:
    """The planner's host peak of one memascend rank for this job (bytes). Raises NotPlanned."""
    from dataclasses import replace

    from memascend_cli.errors import MemascendError
    from memascend_cli.planner.memory import estimate

    try:
        spec_job = job_spec(job, spec, seq_len)
        ranks = spec_job.ranks_per_node or 1
        hw = replace(hw, num_nodes=max(1, int(job.get("world_size") or 1) // ranks))
        return estimate(spec_job, hw, "memascend").host_peak_bytes
    except MemascendError as exc:
        raise NotPlanned(exc.message) from None


@dataclass
class Rank:
    """What the CLI has read of one process: its record and step lines."""

    record: dict
    steps: list[dict] = field(default_factory=list)
    offset: int = 0


class Progress:
    """Follows the status folder: prints a step line of the first engaged rank now and then, and the plan once the
    job and its sequence length are known. `say` prints one line (stderr)."""

    def __init__(self, status_dir: str, *, model: str | None, say, hardware=None, clock=time.monotonic):
        self.status_dir, self.model, self.say, self.clock = status_dir, model, say, clock
        self.hardware = hardware
        """A HardwareSpec, or None: probed at the first plan."""
        self.ranks: dict[int, Rank] = {}
        self.shown: tuple[int, int] | None = None
        """(pid, step) of the last progress line."""
        self.t_shown = float("-inf")
        self.plan: tuple[str, str] | None = None
        """(level, text) of the plan line once decided."""
        self.planned_bytes: int | None = None
        self.broken = False

    def tick(self, final: bool = False) -> None:
        """poll() for the command: a record this CLI cannot follow ends the progress lines with one note, never the
        command."""
        if self.broken:
            return
        try:
            self.poll(final)
        except Exception as exc:  # noqa: BLE001 - the program runs on; its closing lines still come
            self.broken = True
            self.say("warn", f"progress lines stopped: {type(exc).__name__}: {exc}")

    def poll(self, final: bool = False) -> None:
        """Read what the ranks wrote since the last call; print the plan once and a step line when due."""
        for rec in anyprogram.read_records(self.status_dir):
            pid = rec.get("pid")
            if pid is None:
                continue
            rank = self.ranks.setdefault(pid, Rank(rec))
            rank.record = rec
            new, rank.offset = read_new_lines(anyprogram.steps_path(self.status_dir, pid), rank.offset)
            rank.steps += new
        main = self.main_rank()
        if main is None or not main.steps:
            return
        if self.plan is None:
            self.plan = self._plan(main)
            self.say(*self.plan)
        last = main.steps[-1]
        key = (main.record["pid"], last["step"])
        if key != self.shown and (final or len(main.steps) == 1 or self.clock() - self.t_shown >= PRINT_INTERVAL_S):
            prev = main.steps[-2] if len(main.steps) > 1 else None
            who = anyprogram.who(main.record)
            self.say("step", f"{who}: {format_step(last, (main.record.get('job') or {}).get('total_steps'), prev)}")
            self.shown, self.t_shown = key, self.clock()

    def main_rank(self) -> Rank | None:
        """The engaged process with the lowest rank that logs steps."""
        engaged = [r for r in self.ranks.values() if r.record.get("job")]
        engaged.sort(key=lambda r: (r.record.get("rank") is None, r.record.get("rank") or 0, r.record.get("pid", 0)))
        return engaged[0] if engaged else None

    def _plan(self, rank: Rank) -> tuple[str, str]:
        job = rank.record["job"]
        seq = max((s.get("seq_len") or 0 for s in rank.steps), default=0) or None
        try:
            spec = model_for(job, config_path=anyprogram.model_config_path(self.status_dir, rank.record["pid"]),
                             model=self.model)
            if self.hardware is None:
                from memascend_cli.hardware import inventory_to_spec, probe

                self.hardware = inventory_to_spec(probe())
            self.planned_bytes = estimate_peak(job, spec, seq, self.hardware)
        except NotPlanned as exc:
            return "warn", f"plan: not estimated: {exc}"
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a record this CLI cannot read: the run goes on
            return "warn", f"plan: not estimated: {type(exc).__name__}: {exc}"
        return "plan", (f"plan: {_gib(self.planned_bytes)} host memory per rank with the memascend engine "
                        f"({describe(job, spec, seq)}; the program's own data and tools come on top)")

    def closing(self) -> list[tuple[str, str]]:
        """One line per rank that logged steps: steps, s/step, last loss, and its peak RSS against the plan."""
        lines = []
        order = sorted(self.ranks.values(), key=lambda r: (r.record.get("rank") is None, r.record.get("rank") or 0))
        for rank in order:
            if rank.record.get("progress_error"):  # the rank's engine watch failed; the program ran on
                lines.append(("warn", f"{anyprogram.who(rank.record)}: no step lines: {rank.record['progress_error']}"))
            if not rank.steps:
                continue
            text = f"{anyprogram.who(rank.record)}: {step_summary(rank.steps)}"
            hwm = rank.record.get("vm_hwm_bytes")
            if hwm:
                text += f"; peak RSS {_gib(hwm)}"
                if self.planned_bytes:
                    text += f", plan {_gib(self.planned_bytes)} ({100 * (self.planned_bytes - hwm) / hwm:+.1f}%)"
            lines.append(("ok", text))
        return lines
