"""User-facing errors: one `error:` line plus a `hint:` line, never a traceback.

Exit codes follow fitcheck-llm's convention so `memascend plan ... && memascend train ...` guards a
launch: 0 fits / success, 1 does not fit / operation failed, 2 bad input.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_BAD_INPUT = 2
EXIT_STOPPED = 75
"""`train`: stopped early by SIGTERM, SIGHUP or --stop-after, with a complete checkpoint to --resume from
(sysexits.h EX_TEMPFAIL: a temporary failure, to be retried; a scheduler script can requeue on it)."""

EXIT_CODES_HELP = "Exit codes: 0 success (plan: the job fits), 1 does not fit or the operation failed, 2 bad input."
"""The line every command's --help ends with."""


class MemascendError(Exception):
    """An expected failure with a one-line message and an optional one-line fix."""

    exit_code = EXIT_FAIL

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class BadInput(MemascendError):
    """The user gave something we cannot use (unknown name, malformed size, missing file)."""

    exit_code = EXIT_BAD_INPUT


class PresetNotFound(BadInput):
    """No preset and no local file matches the given name."""


class PlanInfeasible(MemascendError):
    """The requested job does not fit the machine."""


class SSDNotReady(MemascendError):
    """The SSD region is missing, too small, unprepared or unsafe."""


def did_you_mean(name: str, choices: list[str], cutoff: float = 0.6) -> str | None:
    """Closest match of `name` among `choices`, for hints on typos (a higher cutoff suggests less)."""
    import difflib

    close = difflib.get_close_matches(name.lower(), choices, n=1, cutoff=cutoff)
    return close[0] if close else None
