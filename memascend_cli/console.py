"""Stdout carries data (tables, JSON); stderr carries commentary (progress, warnings, errors)."""

from __future__ import annotations

import json
import sys

from rich.console import Console

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False)


def print_json(data) -> None:
    """Machine-readable output: plain JSON on stdout, no colour, stable key order."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {message}")


def step_progress(console):
    """The progress bar of long jobs (train, bench): description, bar, n/total, elapsed, ETA; <= 80 columns."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column

    description = TextColumn("{task.description}", table_column=Column(max_width=26, no_wrap=True, overflow="ellipsis"))
    return Progress(description, BarColumn(bar_width=20), MofNCompleteColumn(),
                    TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(), TextColumn("eta"),
                    TimeRemainingColumn(compact=True), console=console, expand=False)
