"""Every link between the README and the pages of docs/ leads somewhere: the file exists
and, when the link names a section, the page has a heading of that name."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs import pages

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)


def anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken(page: Path) -> list[str]:
    problems = []
    text = page.read_text(encoding="utf-8")
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # another site
        path, _, section = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            problems.append(f"{page.name}: {target}: no such file")
        elif section and section not in {anchor(h) for h in HEADING.findall(linked.read_text())}:
            problems.append(f"{page.name}: {target}: no such section")
    return problems


def test_every_link_leads_to_a_page_and_section() -> None:
    problems = [problem for page in pages() for problem in broken(page)]
    assert not problems, "\n".join(problems)


def test_anchors_are_githubs() -> None:
    assert anchor("Anthropic Messages: `POST /v1/messages`") == "anthropic-messages-post-v1messages"
    assert anchor("Admin actions reach the whole fleet") == "admin-actions-reach-the-whole-fleet"


def test_a_broken_link_is_noticed(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page.write_text("[a](other.md#a-section) [b](other.md#gone) [c](missing.md) [d](#top)\n# Top\n")
    assert broken(page) == [
        "page.md: other.md#gone: no such section",
        "page.md: missing.md: no such file",
    ]
