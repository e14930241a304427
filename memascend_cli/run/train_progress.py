"""What `memascend train` says between the launch and the end besides its metrics lines: one line per setup phase with
its time, the first step whatever log_every is, and a heartbeat (the phase, or the step, tokens/s and ETA) whenever
nothing was said for a while, so a log never goes silent for minutes (a model's setup and a slow step each take
minutes on a CPU).

Pure: the live view (run/live.py) feeds a Tracker the rank's metrics.jsonl records (engine/train_worker.py writes a
`phase` record as rank 0 starts each part of its work and a `progress` record for every step it does not log) and the
time, and prints the lines it returns. Times are wall-clock seconds (time.time()), as the records' `time`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SETUP_HEARTBEAT_S = 20.0
"""Before the first step: a `still <phase>` line after this long without a line. The first one comes within 30 s
of the launch: DeepSpeed's launcher and the rank import torch and DeepSpeed before the rank can say anything."""
TRAIN_HEARTBEAT_S = 50.0
"""From the first step on: a heartbeat after this long without a line; with the CLI's 0.5 s poll no gap between
two lines reaches a minute."""
FIRST_PHASE = "starting the ranks"
"""What the run does from the launch until rank 0 writes its first record."""
FIRST_STEP = "running the first step"
"""The phase from the `start` (or `resumed`) record to the first step's record: DeepSpeed's first step also sets up
its buffers, so it is timed as the last part of the setup."""


def fmt_duration(seconds: float) -> str:
    """`42 s`, `3m05s`, `2h03m`: a time for a person to read. Pure."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt_rate(tokens_per_s: float) -> str:
    """`950`, `12.3k` tokens per second. Pure."""
    return f"{tokens_per_s / 1000:.1f}k" if tokens_per_s >= 10_000 else f"{tokens_per_s:,.0f}"


def heartbeat_due(now: float, last_line: float, *, in_setup: bool) -> bool:
    """Whether the silence since the last line (at `last_line`) calls for a heartbeat now. Pure."""
    return now - last_line >= (SETUP_HEARTBEAT_S if in_setup else TRAIN_HEARTBEAT_S)


def tokens_per_s(first: dict, last: dict) -> float:
    """This launch's training rate: the tokens of the steps after the first over their time (the first step includes
    DeepSpeed's warm-up), or the first step's own rate while it is the only one. Pure."""
    if last["step"] > first["step"] and last["time"] > first["time"]:
        return (last["tokens_seen"] - first["tokens_seen"]) / (last["time"] - first["time"])
    return last.get("tokens_per_s") or 0.0


def eta_s(first: dict, last: dict, total: int, now: float) -> float:
    """Seconds to the last step: the steps left at the mean time of the steps after the first (the first one alone
    while there is no other), less the time already spent on the step under way. Pure."""
    done = last["step"] - first["step"]
    per_step = (last["time"] - first["time"]) / done if done > 0 else (first.get("s_per_step") or 0.0)
    left = (total - last["step"]) * per_step
    return max(0.0, left - min(max(0.0, now - last["time"]), per_step))


def first_step_line(rec: dict, total: int | None, log_every: int) -> str:
    """The first step's line, also when log_every does not log it. Pure."""
    text = f"step {rec['step']}/{total or '?'}: loss {rec['loss']:.4f}, {rec.get('s_per_step') or 0.0:.1f} s, " \
           f"{fmt_rate(rec.get('tokens_per_s') or 0.0)} tok/s"
    if log_every > 1:
        text += f" (then a line every {log_every} steps)"
    return text


@dataclass(slots=True)
class Tracker:
    """The lines of one launch beyond the metrics lines. `feed` takes each metrics.jsonl record, `heartbeat` is asked
    at every poll, `said` is told of every line printed (whoever printed it); each returns what to print."""

    launched: float
    """When the launch began (wall clock)."""
    log_every: int = 1
    phase: str = FIRST_PHASE
    """What rank 0 does now."""
    phase_since: float = 0.0
    in_setup: bool = True
    """True until the first step's record."""
    last_line: float = 0.0
    total: int | None = None
    first: dict | None = None
    """The first step record of this launch (`step` or `progress`)."""
    last: dict | None = None
    """The newest step record."""
    setup_times: list[tuple[str, float]] = field(default_factory=list)
    """(phase, seconds) of each setup phase ended so far."""

    def __post_init__(self):
        self.phase_since = self.last_line = self.launched

    def said(self, now: float) -> None:
        self.last_line = max(self.last_line, now)

    def feed(self, rec: dict) -> list[str]:
        """The lines `rec` calls for beside its own metrics line: the end of a setup phase, the first step when no
        metrics line shows it (a `progress` record)."""
        kind, at = rec.get("event"), rec.get("time", self.phase_since)
        if rec.get("total_steps") is not None:
            self.total = rec["total_steps"]
        if kind == "phase":
            return self._begin(rec["phase"], at)
        if kind in ("start", "resumed"):
            return self._begin(FIRST_STEP, at)
        if kind in ("checkpoint", "eval") and not self.in_setup:
            self.phase, self.phase_since = "training", at  # a save or a validation in the run ended
        if kind not in ("step", "progress"):
            return []
        self.last = rec
        if self.first is not None:
            self.phase, self.phase_since = "training", at
            return []
        self.first = rec
        lines = self._begin("training", at)
        return lines + ([first_step_line(rec, self.total, self.log_every)] if kind == "progress" else [])

    def _begin(self, phase: str, at: float) -> list[str]:
        """Rank 0 moved on to `phase` at `at`: a line with the time of the setup phase that ended."""
        lines = []
        if self.in_setup:
            took = max(0.0, at - self.phase_since)
            self.setup_times.append((self.phase, took))
            text = f"setup: {self.phase} took {fmt_duration(took)}"
            if phase == "training":
                self.in_setup = False
                text += f" (setup {fmt_duration(at - self.launched)} in all)"
            lines.append(text)
        self.phase, self.phase_since = phase, at
        return lines

    def heartbeat(self, now: float) -> str | None:
        """A `still ...` line when nothing was said for a while, else None."""
        if not heartbeat_due(now, self.last_line, in_setup=self.in_setup):
            return None
        if self.phase != "training" or self.last is None or self.first is None:
            return f"still {self.phase} ({fmt_duration(now - self.phase_since)})"
        text = f"still training: step {self.last['step']}/{self.total or '?'} done, " \
               f"{fmt_rate(tokens_per_s(self.first, self.last))} tok/s"
        if self.total is not None:
            text += f", ETA {fmt_duration(eta_s(self.first, self.last, self.total, now))}"
        return text

    def status(self, now: float) -> str:
        """The current setup phase and its time so far, for the line under a terminal's progress bar."""
        return f"{self.phase} ({fmt_duration(now - self.phase_since)})"
