"""Every relative link of README.md and docs/*.md resolves: the file exists, and an ``#anchor``
names a heading of its page (GitHub's heading ids)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target); a target has no spaces (an optional "title" may follow).
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> str:
    """The page's text outside fenced and indented code blocks, inline code removed."""
    lines, fenced, previous_blank = [], False, True
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        indented = line.startswith("    ") and previous_blank
        if not fenced and not indented:
            lines.append(re.sub(r"`[^`]*`", "", line))
        previous_blank = not line.strip() or (indented and previous_blank)
    return "\n".join(lines)


def anchors(page: Path) -> set[str]:
    """GitHub's ids of the page's headings: lower case, punctuation dropped, spaces to dashes,
    a repeated id numbered."""
    seen: dict[str, int] = {}
    ids = set()
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        heading = re.match(r"#{1,6} (.*)", line)
        if fenced or heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        ids.add(slug if count == 0 else f"{slug}-{count}")
    return ids


def links(page: Path) -> list[str]:
    """The page's relative link targets."""
    found = LINK.findall(prose(page.read_text()))  # a link's text may span lines
    return [t for t in found if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_pages_have_links() -> None:
    # The checker finds links at all: the README links every docs page.
    readme_links = {target.split("#")[0] for target in links(ROOT / "README.md")}
    assert {f"docs/{page.name}" for page in PAGES[1:]} <= readme_links


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == []


def test_an_anchor_follows_github_ids() -> None:
    page = ROOT / "docs" / "configuration.md"
    assert {"several-processes---workers", "tls-and-auth"} <= anchors(page)


def test_ci_runs_the_readmes_test_command() -> None:
    # The README's "Two commands": one starts the service, one runs every test, and .ci/run
    # runs exactly the second, so CI and developers agree.
    section = (ROOT / "README.md").read_text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("#")[0].strip() for line in section.splitlines()]
    commands = [command for command in commands if command.startswith("./dev ")]
    assert commands == ["./dev serve", "./dev test"]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1] == f"exec {commands[1]}"
