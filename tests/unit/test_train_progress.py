"""What `memascend train` says between the launch and the end (memascend_cli/run/train_progress.py): a line per setup
phase with its time, the first step whatever log_every is, and a heartbeat within a minute of silence."""

from __future__ import annotations

import json

import pytest

from memascend_cli.run.train_progress import (
    FIRST_PHASE,
    SETUP_HEARTBEAT_S,
    TRAIN_HEARTBEAT_S,
    Tracker,
    eta_s,
    fmt_duration,
    heartbeat_due,
    tokens_per_s,
)

T0 = 1_000_000.0


def progress(step: int, at: float, *, tokens_seen: int, s: float = 30.0, total: int = 5) -> dict:
    return {"event": "progress", "time": at, "step": step, "total_steps": total, "loss": 2.5, "s_per_step": s,
            "tokens_per_s": 1000.0, "tokens_seen": tokens_seen}


def test_durations_read_at_a_glance():
    assert [fmt_duration(s) for s in (0.2, 42.4, 59.6, 185, 3600 + 185, -3)] == \
        ["0 s", "42 s", "1m00s", "3m05s", "1h03m", "0 s"]


def test_heartbeat_comes_sooner_during_setup():
    assert not heartbeat_due(T0 + SETUP_HEARTBEAT_S - 0.1, T0, in_setup=True)
    assert heartbeat_due(T0 + SETUP_HEARTBEAT_S, T0, in_setup=True)
    assert not heartbeat_due(T0 + SETUP_HEARTBEAT_S, T0, in_setup=False)
    assert heartbeat_due(T0 + TRAIN_HEARTBEAT_S, T0, in_setup=False)
    # The targets: the first line within 30 s of the launch, no gap of a minute, with the CLI polling every 0.5 s.
    assert SETUP_HEARTBEAT_S + 0.5 < 30 and TRAIN_HEARTBEAT_S + 0.5 < 60


def test_rate_and_eta_leave_out_the_first_step():
    first = progress(1, T0, tokens_seen=4096, s=100.0)  # DeepSpeed's warm-up makes the first step slow
    last = progress(3, T0 + 60, tokens_seen=4096 * 3)
    assert tokens_per_s(first, last) == pytest.approx(2 * 4096 / 60)
    assert tokens_per_s(first, first) == 1000.0  # the first step's own rate while it is the only one
    assert eta_s(first, last, 5, T0 + 60) == pytest.approx(60.0)  # 2 steps left at 30 s
    assert eta_s(first, last, 5, T0 + 70) == pytest.approx(50.0)  # 10 s into step 4
    assert eta_s(first, last, 5, T0 + 200) == pytest.approx(30.0)  # an overdue step counts as done, no more
    assert eta_s(first, first, 5, T0) == pytest.approx(400.0)  # 4 steps at the first step's 100 s
    assert eta_s(first, progress(5, T0 + 120, tokens_seen=0), 5, T0 + 130) == 0.0


def test_a_setup_phase_line_with_its_time_and_a_still_line_while_it_lasts():
    t = Tracker(launched=T0, log_every=10)
    assert t.heartbeat(T0 + 5) is None
    assert t.heartbeat(T0 + SETUP_HEARTBEAT_S) == f"still {FIRST_PHASE} (20 s)"
    t.said(T0 + SETUP_HEARTBEAT_S)
    assert t.feed({"event": "phase", "phase": "starting DeepSpeed", "time": T0 + 24}) == \
        [f"setup: {FIRST_PHASE} took 24 s"]
    t.said(T0 + 24.5)
    assert t.feed({"event": "phase", "phase": "writing parameters to the region", "time": T0 + 30}) == \
        ["setup: starting DeepSpeed took 6 s"]
    t.said(T0 + 30.5)
    assert t.heartbeat(T0 + 50) is None
    assert t.heartbeat(T0 + 51) == "still writing parameters to the region (21 s)"
    assert t.status(T0 + 95) == "writing parameters to the region (1m05s)"


def test_the_first_step_is_shown_whatever_log_every_says_then_heartbeats_carry_rate_and_eta():
    t = Tracker(launched=T0, log_every=10)
    t.feed({"event": "phase", "phase": "initializing DeepSpeed", "time": T0 + 100})
    assert t.feed({"event": "start", "time": T0 + 130, "total_steps": 5}) == \
        ["setup: initializing DeepSpeed took 30 s"]
    assert t.in_setup and t.phase == "running the first step"
    lines = t.feed(progress(1, T0 + 170, tokens_seen=4000, s=40.0))
    assert lines == ["setup: running the first step took 40 s (setup 2m50s in all)",
                     "step 1/5: loss 2.5000, 40.0 s, 1,000 tok/s (then a line every 10 steps)"]
    assert not t.in_setup and [p for p, _ in t.setup_times] == [FIRST_PHASE, "initializing DeepSpeed",
                                                                  "running the first step"]
    t.said(T0 + 170)
    assert t.feed(progress(2, T0 + 200, tokens_seen=8000)) == []  # later unlogged steps: no line
    assert t.heartbeat(T0 + 170 + TRAIN_HEARTBEAT_S - 1) is None
    # 4000 tokens in the 30 s after the first step; 3 steps of 30 s left, 20 s into the first of them.
    assert t.heartbeat(T0 + 170 + TRAIN_HEARTBEAT_S) == "still training: step 2/5 done, 133 tok/s, ETA 1m10s"
    # A save or a validation in the run is named while it lasts; training resumes after its record.
    t.feed({"event": "phase", "phase": "saving a checkpoint", "step": 2, "time": T0 + 201})
    assert t.heartbeat(T0 + 260) == "still saving a checkpoint (59 s)"
    t.feed({"event": "checkpoint", "step": 2, "path": "/run/checkpoints/step-0000002", "time": T0 + 262})
    assert t.heartbeat(T0 + 262).startswith("still training: step 2/5 done")


def test_a_logged_first_step_is_not_shown_twice():
    t = Tracker(launched=T0)
    t.feed({"event": "start", "time": T0 + 10, "total_steps": 3})
    step = {**progress(1, T0 + 20, tokens_seen=100), "event": "step"}
    assert t.feed(step) == ["setup: running the first step took 10 s (setup 20 s in all)"]  # its metrics line shows it


def test_a_resumed_run_times_loading_the_checkpoint():
    t = Tracker(launched=T0)
    t.feed({"event": "phase", "phase": "loading the checkpoint", "time": T0 + 50})
    assert t.feed({"event": "resumed", "step": 10, "time": T0 + 58}) == ["setup: loading the checkpoint took 8 s"]
    assert t.feed(progress(11, T0 + 70, tokens_seen=0, total=20))[-1].startswith("step 11/20: ")


def test_the_live_view_prints_plain_lines_and_heartbeats_when_not_on_a_terminal(tmp_path, capsys):
    from memascend_cli.run.live import LiveView

    metrics = tmp_path / "metrics.jsonl"
    now = [T0]
    view = LiveView(str(metrics), log_every=10, clock=lambda: now[0])

    def append(*records):
        with open(metrics, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    with view:
        now[0] = T0 + SETUP_HEARTBEAT_S
        view.poll()  # nothing written yet: the launcher is still starting the ranks
        append({"event": "phase", "phase": "starting DeepSpeed", "time": T0 + 25})
        now[0] = T0 + 25.5
        view.poll()
        append({"event": "start", "time": T0 + 40, "total_steps": 5}, progress(1, T0 + 70, tokens_seen=4000))
        now[0] = T0 + 70.5
        view.poll()
        now[0] = T0 + 70.5 + TRAIN_HEARTBEAT_S
        view.poll()
    assert capsys.readouterr().err.splitlines() == [
        f"still {FIRST_PHASE} (20 s)",
        f"setup: {FIRST_PHASE} took 25 s",
        "setup: starting DeepSpeed took 15 s",
        "setup: running the first step took 30 s (setup 1m10s in all)",
        "step 1/5: loss 2.5000, 30.0 s, 1,000 tok/s (then a line every 10 steps)",
        "still training: step 1/5 done, 1,000 tok/s, ETA 1m30s"]
    assert view.latest["event"] == "progress"  # where an OOM kill under --dram-cap finds the run


def test_on_a_terminal_the_phases_print_above_the_bar_and_the_current_one_stands_under_it(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from memascend_cli import console
    from memascend_cli.run.live import LiveView

    screen = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=screen, force_terminal=True, width=80, color_system=None))
    metrics = tmp_path / "metrics.jsonl"
    phase = {"event": "phase", "phase": "writing parameters to the region", "time": T0 + 5}
    metrics.write_text(json.dumps(phase) + "\n")
    now = [T0]
    with LiveView(str(metrics), clock=lambda: now[0]) as view:
        now[0] = T0 + 30
        view.poll()
        assert view.stats.plain == "writing parameters to the region (25 s)"
        with open(metrics, "a") as f:
            f.write(json.dumps(progress(1, T0 + 40, tokens_seen=10)) + "\n")
        view.poll()
        assert view.stats.plain == "loss 2.5000  1,000 tok/s"
    assert "setup: starting the ranks took 5 s" in screen.getvalue()
    assert "step 1/5: loss 2.5000" in screen.getvalue() and "still" not in screen.getvalue()
