"""The README stays a page a user reads in five minutes: small, usage first, its two quick-start commands first, its
links alive (the reference lives in docs/)."""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _readme() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        return f.read()


def _code_lines(text: str) -> list[str]:
    inside, out = False, []
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside and line.strip():
            out.append(line)
    return out


def test_small_and_mostly_usage():
    text = _readme()
    lines = text.splitlines()
    assert len(text.encode()) <= 15 * 1024
    assert max(len(line) for line in lines) <= 200
    assert len(_code_lines(text)) >= 0.25 * len(lines)  # commands and their output


def test_the_quick_start_comes_first():
    first = _code_lines(_readme())[:2]
    assert first[0].startswith("bash scripts/bootstrap.sh plan") and first[1].startswith("bash scripts/bootstrap.sh test")


def test_links_reach_files_and_the_reference_pages():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _readme())
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert {"docs/architecture.md", "docs/cli.md"} <= set(local)
    missing = [link for link in local if not os.path.exists(os.path.join(REPO, link))]
    assert missing == []
