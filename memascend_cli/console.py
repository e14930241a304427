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
