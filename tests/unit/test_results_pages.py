"""The results pages a reader navigates: docs/results.md short, with a table of contents linking every topic page
beside it (docs/results/*.md); headings in words; lines that read; every link lands. And the pure text functions that
shape them (scripts/results_markdown.py)."""

import glob
import os
import re
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FRONT = os.path.join(REPO, "docs", "results.md")
LONGEST_LINE = 400  # a table row may exceed the prose width, never this
SCREEN_LINES = 50
# A file of the repository as a heading: a folder's name and a file's, or one of the tree's top folders.
PATH = re.compile(r"[\w.-]+/[\w./-]*\.(json|gz|md|py|yaml|sh)\b"
                  r"|\b(docs|scripts|benchmarks|tests|memascend_cli|engine)/")

sys.path.insert(0, os.path.join(REPO, "scripts"))
import results  # noqa: E402
from results_markdown import WIDTH, anchors, contents, headings, slug, wrap  # noqa: E402


def _pages() -> dict[str, str]:
    paths = [FRONT] + sorted(glob.glob(os.path.join(REPO, "docs", "results", "*.md")))
    out = {}
    for path in paths:
        with open(path) as f:
            out[path] = f.read()
    return out


def test_the_front_page_is_short_with_contents_linking_every_topic_page():
    pages = _pages()
    front = pages[FRONT]
    assert len(front.encode()) <= results.MAX_BYTES
    assert (2, "Contents") in headings(front) and (2, "Today's headline") in headings(front)
    for topic in results.TOPICS:
        page = os.path.join(REPO, "docs", "results", f"{topic.name}.md")
        assert page in pages, f"{topic.name}: no page"
        assert f"](results/{topic.name}.md)" in front, f"{topic.name}: not linked from docs/results.md"
    assert len(pages) == len(results.TOPICS) + 1  # no page left over from a topic that is gone


@pytest.mark.parametrize("path", sorted(_pages()), ids=lambda p: os.path.relpath(p, REPO))
def test_a_page_reads_headings_in_words_no_line_too_long_contents_when_longer_than_a_screen(path):
    text = _pages()[path]
    for _, title in headings(text):
        assert not PATH.search(title), f"a file path as a heading: {title}"
    long = [(n, len(line)) for n, line in enumerate(text.split("\n"), 1) if len(line) > LONGEST_LINE]
    assert not long, f"lines over {LONGEST_LINE} characters (line, length): {long}"
    if text.count("\n") > SCREEN_LINES:
        assert (2, "Contents") in headings(text)


def test_every_link_of_the_pages_lands_on_a_page_and_a_heading_it_has():
    pages = _pages()
    checked = 0
    for path, text in pages.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            assert os.path.exists(dest), f"{os.path.relpath(path, REPO)}: {target}: no such file"
            if anchor and dest.endswith(".md"):
                with open(dest) as f:
                    assert anchor in anchors(f.read()), f"{os.path.relpath(path, REPO)}: {target}: no such heading"
            checked += 1
    assert checked > len(results.TOPICS)  # the front page's contents at least


def test_prose_wraps_at_the_width_and_never_starts_a_line_that_opens_a_block():
    line = "- " + " ".join(["word"] * 40) + " - 3 + 1. # > | `code span` " + " ".join(["more"] * 30)
    out = wrap(line).split("\n")
    assert len(out) > 1 and all(len(x) <= WIDTH for x in out)
    assert " ".join(x.strip() for x in out) == line  # the same words, so markdown renders it the same
    assert all(x.startswith("  ") for x in out[1:])  # a list item's continuation stays in the item
    for x in out[1:]:
        first = x.split()[0]
        assert first not in ("-", "+", "*", "#", "1.") and not first.startswith((">", "|")), x


def test_tables_headings_and_fenced_blocks_are_left_whole():
    row = "| " + " | ".join(["cell"] * 60) + " |"
    fenced = "```bash\n" + "x " * 100 + "\n```"
    heading = "## " + "word " * 40
    text = "\n".join([row, fenced, heading.rstrip()])
    assert wrap(text) == text


def test_anchors_are_githubs_with_repeats_numbered():
    text = "# Page\n## Stock zero.Init: heap kept, 2026-11-28\n### Today's `plan`\n```\n# not a heading\n```\n" \
           "## Today's plan\n"
    assert slug("Context sweep: seq 512 / 2048, fp32") == "context-sweep-seq-512--2048-fp32"
    assert anchors(text) == ["page", "stock-zeroinit-heap-kept-2026-11-28", "todays-plan", "todays-plan-1"]
    assert contents(text) == ["- [Stock zero.Init: heap kept, 2026-11-28](#stock-zeroinit-heap-kept-2026-11-28)",
                              "  - [Today's `plan`](#todays-plan)", "- [Today's plan](#todays-plan-1)"]


def test_a_wrapped_page_renders_as_the_unwrapped_one():
    """CommonMark (rich's markdown-it-py) shows the wrapped text as it shows the one-line text: no list, heading,
    quote, fence or HTML block appears where a line was broken, and code spans and links stay whole."""
    from markdown_it import MarkdownIt

    words = " ".join(f"w{i}" for i in range(30))
    # Each word that opens a block where a line starts, placed where a greedy wrap would break before it.
    openers = ["-", "+", "*", "#", "###", ">", "|", "1.", "2)", "===", "---", "```", "~~~", "<div>"]
    text = "\n\n".join([f"{'a' * (WIDTH - 1)} {w} b" for w in openers]
                       + [f"- {'a' * (WIDTH - 3)} {w} b" for w in openers]
                       + [f"A paragraph {words} `memascend bench --model m --seq-len 512` [a link](#a-heading) {words}",
                          "| a | table |\n|---|---:|\n| " + words + " | " + words + " |"])
    md = MarkdownIt("commonmark").enable("table")

    def shown(t: str) -> str:
        return re.sub(r"\s+", " ", md.render(t))

    assert wrap(text) != text and shown(wrap(text)) == shown(text)
