"""The documentation as the tests that hold its figures to the build read
it: README.md and every page of docs/.

The README's references moved to docs/ (issue 26), and the next figure may
move again; a test that reads one file would then pass on a figure no page
states any more. These read every page, so a figure is held to the build
wherever it stands, and a test that no longer finds it fails.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))


def doc_lines() -> list[str]:
    """Every line of every page, as written (table rows are one line each)."""
    return [line for page in PAGES for line in page.read_text().splitlines()]


def doc_text() -> str:
    """Every page with its wrapped lines joined by single spaces (so a phrase
    broken across two lines reads as one), one page a line: a phrase never
    runs from one page into the next."""
    return "\n".join(" ".join(page.read_text().split()) for page in PAGES)
