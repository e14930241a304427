"""The live view of a running `memascend train` on stderr, fed by the run's metrics.jsonl: a Rich progress bar
with ETA and a line of figures (loss, lr, tokens/s, host memory, SSD traffic), events above it; one plain line per
record when stderr is not a terminal. Both also show each setup phase with its time and the first step; plain lines
add a heartbeat when nothing was said for a while (run/train_progress.py). Everything fits 80 columns."""

from __future__ import annotations

import json
import time

from memascend_cli.run.train_progress import Tracker, fmt_rate


class LiveView:
    """The live view on stderr, fed by metrics.jsonl: on a terminal a progress bar (steps, elapsed, ETA)
    with a line of figures under it, events printed above it; otherwise one plain line per record.
    Everything fits 80 columns."""

    def __init__(self, path: str, start_offset: int = 0, log_every: int = 1, clock=time.time):
        self.path, self.offset = path, start_offset
        self.clock = clock
        self.tracker = Tracker(launched=clock(), log_every=log_every)
        """The setup phases, the first step and the heartbeat (created as the launch begins)."""
        self.last: dict | None = None
        self.latest: dict | None = None
        """The last record of any kind (where a killed run stood)."""
        self.events: list[dict] = []
        self.live = None
        self.progress = None
        self.task = None
        self.buffer = ""

    def __enter__(self):
        from memascend_cli.console import err

        if err.is_terminal:
            from rich.console import Group
            from rich.live import Live
            from rich.text import Text

            from memascend_cli.console import step_progress

            self.progress = step_progress(err)
            self.task = self.progress.add_task("train", total=None)
            self.stats = Text("starting the ranks", style="dim")
            self.live = Live(Group(self.progress, self.stats), console=err, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)
        return False

    def poll(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except OSError:  # not written yet: the ranks are starting (the heartbeat still says so)
            chunk = ""
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            self._show(rec)
        now = self.clock()
        if self.live is None:
            beat = self.tracker.heartbeat(now)
            if beat is not None:
                self._say(beat)
        elif self.tracker.in_setup:
            self.stats.plain = self.tracker.status(now)  # the progress bar's own clock shows the run is alive

    def _say(self, text: str) -> None:
        """One line: above the progress bar on a terminal, else plain; soft_wrap keeps it (paths too) on one line."""
        from memascend_cli.console import err

        (self.live.console if self.live is not None else err).print(text, highlight=False, soft_wrap=True)
        self.tracker.said(self.clock())

    def _show(self, rec: dict) -> None:
        for line in self.tracker.feed(rec):
            self._say(line)
        kind = rec.get("event")
        self.latest = {**rec, "total_steps": rec.get("total_steps", (self.latest or {}).get("total_steps"))}
        if kind in ("start", "resumed") and self.progress is not None:
            total = rec.get("total_steps")
            self.progress.update(self.task, total=total, completed=rec.get("step", 0))
            self.progress.reset(self.task, total=total, completed=rec.get("step", 0))
        if kind in ("step", "progress") and self.progress is not None:
            self.progress.update(self.task, completed=rec["step"], total=rec.get("total_steps"))
            self.stats.plain = format_stats(rec) if kind == "step" else format_progress(rec)
        if kind == "step":
            self.last = rec
            if self.progress is None:
                self._say(format_step(rec))
            return
        if kind in ("checkpoint", "eval", "export"):  # a stop: run_launch's line names its checkpoint
            self.events.append(rec)
            self._say(format_event(rec))

    def summary(self) -> None:
        self.poll()


def format_stats(r: dict, sep: str = "  ") -> str:
    """The figures under the progress bar: loss, lr, tokens/s, host memory (node), SSD GB/s read/written."""
    lr = f"{r['lr']:.1e}".replace("e-0", "e-").replace("e+0", "e")
    return sep.join((f"loss {r['loss']:.4f}", f"lr {lr}", f"{fmt_rate(r['tokens_per_s'])} tok/s",
                     f"host {r['host_rss_gib']:.1f} GiB", f"SSD {_gbps(r['ssd_read_gbps'])}/{_gbps(r['ssd_write_gbps'])} GB/s"))


def format_progress(r: dict) -> str:
    """The figures under the progress bar for a step log_every does not log: loss and tokens/s."""
    return f"loss {r['loss']:.4f}  {fmt_rate(r['tokens_per_s'])} tok/s"


def _gbps(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def format_step(r: dict) -> str:
    """One plain line per step when stderr is not a terminal (logs, CI): `step/total figures`, 80 columns."""
    return f"{r['step']}/{r.get('total_steps', '?')} " + format_stats(r, " ")


def format_event(e: dict) -> str:
    kind = e.get("event")
    if kind == "checkpoint":
        return f"checkpoint: step {e['step']} -> {e['path']}"
    if kind == "export":
        return f"final model: {e['path']} (from_pretrained loads it)"
    if kind == "eval":
        return f"validation loss at step {e['step']}: {e['loss']:.4f}"
    return json.dumps(e)
