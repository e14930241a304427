"""The shape of the results pages: prose wrapped to WIDTH columns, GitHub's heading anchors, tables of contents.
Pure text in, text out; stdlib only (scripts/results.py imports it)."""

from __future__ import annotations

import re

WIDTH = 120
"""Prose lines are wrapped to this many columns; a table row or a word longer than that stays whole."""

# A word that would turn a continuation line into a list item, heading, quote, table, fence, HTML block or setext
# underline: a line is never broken before one.
_OPENS_BLOCK = re.compile(r"(?:[-+*]|[-=]+|#{1,6}|\d{1,9}[.)])$|[>|<]|```|~~~")
_LIST_MARKER = re.compile(r"\s*(?:[-*+] |\d+\. )?")
_HEADING = re.compile(r"(#{1,6}) (.*)")


def _wrap_line(line: str) -> list[str]:
    """One prose line as lines of at most WIDTH columns; a list item's continuation lines indented under its text."""
    if len(line) <= WIDTH:
        return [line]
    lead = _LIST_MARKER.match(line).group(0)
    indent = " " * len(lead)
    words = line[len(lead):].split(" ")
    out, cur = [], lead + words[0]
    for w in words[1:]:
        if not w or _OPENS_BLOCK.match(w) or len(cur) + 1 + len(w) <= WIDTH or not cur.strip():
            cur += " " + w
        else:
            out.append(cur.rstrip())
            cur = indent + w
    return out + [cur.rstrip()]


def wrap(text: str) -> str:
    """`text` with every prose line wrapped (markdown renders it the same); headings, table rows and fenced blocks
    are left as they are."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or line.startswith(("```", "|", "#")):
            out.append(line)
        else:
            out.extend(_wrap_line(line))
    return "\n".join(out)


def headings(text: str) -> list[tuple[int, str]]:
    """(level, text) of every markdown heading of `text` outside fenced blocks, in order."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else _HEADING.fullmatch(line)
        if m:
            out.append((len(m.group(1)), m.group(2)))
    return out


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens (before de-duplication)."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def anchors(text: str) -> list[str]:
    """The anchor of each heading of `text`, in order; a repeated one gets -1, -2, ... as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = []
    for _, title in headings(text):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.append(base if n == 0 else f"{base}-{n}")
    return out


def contents(text: str, levels: tuple[int, ...] = (2, 3)) -> list[str]:
    """A table of contents of `text`'s headings of `levels`: one linked line each, nested by level."""
    top = min(levels)
    return [f"{'  ' * (level - top)}- [{title}](#{anchor})"
            for (level, title), anchor in zip(headings(text), anchors(text)) if level in levels]
