"""The documentation's relative links resolve (issue 21): every file exists, every `#anchor` into
a Markdown file names one of its headings (GitHub's slugs), and the README stays a short page.

Links inside code blocks and inline code are not links and are not checked; absolute URLs are
not fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 220

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) or [text](target "title"); the text may hold inline code or nested brackets.
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def documents() -> list[Path]:
    named = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "infra" / "PRODUCTION.md"]
    named.append(ROOT / "benchmarks" / "HISTORY.md")
    return [*named, *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1) == fence:
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        lines.append((number, line))
    return lines


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link outside code."""
    found: list[tuple[int, str]] = []
    for number, line in prose_lines(text):
        prose = _INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)
        found.extend((number, m.group(1)) for m in _LINK.finditer(prose))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(document: Path, root: Path = ROOT) -> list[str]:
    problems: list[str] = []
    for number, target in links(document.read_text(encoding="utf-8")):
        if _EXTERNAL.match(target):
            continue
        where = f"{document.relative_to(root)}:{number}: {target}"
        path_part, _, anchor = target.partition("#")
        if path_part.startswith("/"):
            problems.append(f"{where}: use a relative link")
            continue
        resolved = (document.parent / path_part).resolve() if path_part else document
        if not resolved.exists():
            problems.append(f"{where}: no such file")
        elif not resolved.is_relative_to(root):
            problems.append(f"{where}: outside the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: no heading with anchor #{anchor} in {resolved.name}")
    return problems


def test_the_documents_exist() -> None:
    missing = [str(path.relative_to(ROOT)) for path in documents() if not path.is_file()]
    assert not missing, missing
    assert len(documents()) > 5, "docs/ holds the reference pages"


@pytest.mark.parametrize("document", documents(), ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_resolve(document: Path) -> None:
    assert broken_links(document) == []


def test_readme_is_a_short_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines (< {README_MAX_LINES}): move reference text to docs/"
    )


def test_the_checker_finds_broken_links_and_anchors(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A `code` heading: with punctuation!\n\n## Twice\n\n## Twice\n\n"
        "[ok](#a-code-heading-with-punctuation) [ok](#twice-1) [bad](#nowhere)\n"
        "`[not a link](missing.md)`\n\n```\n[not a link](missing.md)\n```\n"
        "[gone](missing.md) [ext](https://example.com/x)\n",
        encoding="utf-8",
    )
    found = [target for _, target in links(page.read_text(encoding="utf-8"))]
    assert found == [
        "#a-code-heading-with-punctuation",
        "#twice-1",
        "#nowhere",
        "missing.md",
        "https://example.com/x",
    ]
    assert anchors(page) == {"a-code-heading-with-punctuation", "twice", "twice-1"}
    assert slug("The Kafka source: batch size and lost offsets") == (
        "the-kafka-source-batch-size-and-lost-offsets"
    )
    assert slug("Version fencing, in commit order") == "version-fencing-in-commit-order"
    assert broken_links(page, tmp_path) == [
        "page.md:7: #nowhere: no heading with anchor #nowhere in page.md",
        "page.md:13: missing.md: no such file",
    ]
