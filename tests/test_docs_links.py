"""Every relative link of README.md and docs/*.md leads somewhere: the file
(or folder) exists, and a `#anchor` names a heading of the page it points at,
spelt as GitHub spells heading anchors.

The README's references moved to docs/ (issue 26); a page renamed, a
heading reworded or a file moved must not leave a reader at a dead link.
Pure text: no build, well under a second.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); the target has no spaces (none of ours do).
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `#include` there is no heading,
    a `[x](y)` there no link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lower-cased, every
    character but letters, digits, `_`, `-` and spaces dropped, spaces to `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page; repeated headings get -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(page.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(page: Path) -> list[str]:
    links = []
    for line in prose_lines(page.read_text()):
        for target in LINK.findall(CODE_SPAN.sub("``", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                links.append(target)
    return links


def test_the_pattern_finds_links_and_headings():
    readme = ROOT / "README.md"
    assert len(relative_links(readme)) >= 10
    assert "quick-start" in anchors(readme)
    # GitHub's spelling, checked on headings like ours.
    assert github_slug("`colibri` (Python) reference") == "colibri-python-reference"
    assert github_slug("Quantisation: 4-bit weights and an 8-bit KV cache") == \
        "quantisation-4-bit-weights-and-an-8-bit-kv-cache"
    assert github_slug("Running an encoder–decoder (Switch Transformers)") == \
        "running-an-encoderdecoder-switch-transformers"
    assert github_slug("Boot flow (cortex-m)") == "boot-flow-cortex-m"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_resolves(page):
    dead = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            dead.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            dead.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not dead, f"{page.relative_to(ROOT)}: dead links:\n  " + "\n  ".join(dead)
