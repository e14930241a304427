"""Text users read says the fact, not where a developer found it: no references to notes outside the repository, to
internal issue numbers or to the targets an issue set. An upstream project's issue ("DeepSpeed issue 3062") is a citation
users can follow and stays. Scans every tracked file (every file under the repository where there is no .git)."""

from __future__ import annotations

import functools
import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Split so that this file does not match itself.
PATTERNS = {
    "a developer's notes outside the repository": re.compile("shared" + "/docs"),
    "an internal issue number": re.compile(r"(?<!DeepSpeed )\b" + "issues?" + r" #?\d+", re.IGNORECASE),
    "an issue's bar": re.compile(r"\bthe " + r"bars?\b", re.IGNORECASE),
}
SKIP_DIRS = {".git", ".venv", ".torch_ext", "__pycache__", "node_modules", "build", "dist"}


def tracked_files() -> list[str]:
    p = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False)
    if p.returncode == 0 and p.stdout:
        return [f for f in p.stdout.decode().split("\0") if f]
    found = []  # a copy without .git (a device machine gets the working tree only)
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        found += [os.path.relpath(os.path.join(root, f), REPO) for f in files]
    return found


def text_of(path: str) -> str | None:
    try:
        with open(os.path.join(REPO, path), "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None  # binary (images, gzip)
    return data.decode("utf-8", errors="replace")


def test_the_patterns_find_what_they_forbid_and_spare_upstream_citations():
    issue, bar = "issue", "bar"  # the examples are built, so that this file does not hold them
    assert PATTERNS["an internal issue number"].search(f"as {issue} 61 asks")
    assert PATTERNS["an internal issue number"].search(f"{issue.title()}s #12")
    assert not PATTERNS["an internal issue number"].search(f"(DeepSpeed {issue} 3062)")
    assert PATTERNS["an issue's bar"].search(f"The {bar}: 2x") and PATTERNS["an issue's bar"].search(f"the {bar}s' outcome")
    assert not PATTERNS["an issue's bar"].search(f"the {bar}rier")


@functools.cache
def tracked_text() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(path, lines) of every tracked text file, read once for all the patterns."""
    return tuple((path, tuple(text.splitlines())) for path in tracked_files() if (text := text_of(path)) is not None)


@pytest.mark.parametrize("what", sorted(PATTERNS))
def test_no_tracked_file_holds(what):
    hits = [f"{path}:{n}: {line.strip()[:120]}" for path, lines in tracked_text()
            for n, line in enumerate(lines, 1) if PATTERNS[what].search(line)]
    assert not hits, f"{what}:\n" + "\n".join(hits[:20])
