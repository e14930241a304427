"""Ending a process that ran DeepSpeed: results are flushed first, then the process exits without interpreter
teardown.

At teardown the destructors of DeepSpeed's and torch's native objects (gloo process groups, the async-I/O thread
pools) run in an unspecified order with their threads still alive; stock DeepSpeed runs were seen to abort there
("terminate called without an active exception", SIGABRT) after every result was written. Everything a process
must leave behind (result files, checkpoints, logs) is written and closed explicitly before this is called, so
skipping teardown loses nothing and keeps the exit status the run earned.
"""

from __future__ import annotations

import os
import sys


def exit_after_flush(code: int) -> None:
    """Flush stdout/stderr and end the process with `code`, skipping interpreter teardown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: nothing left to flush
            pass
    os._exit(code)
