"""The README and docs/ as the tests read them: their code blocks, each with the marker
(an HTML comment on the line before it, invisible on the rendered page) that says what the
block is: `<!-- fragment -->` for a part of a config, `<!-- quickstart: NAME -->` for a step
of the README's quickstart."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(
    r"^(?:<!--\s*(?P<marker>[^>]*?)\s*-->\n)?```(?P<lang>[\w-]*)\n(?P<text>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository's root
    line: int  # of the opening fence
    lang: str
    marker: str  # "" when the block has none
    text: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """Every page a reader is pointed to: the README and each page of docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _BLOCK.finditer(text):
        fence = match.start("lang") - 3
        found.append(
            Block(
                page=str(page.relative_to(ROOT)),
                line=text.count("\n", 0, fence) + 1,
                lang=match.group("lang"),
                marker=match.group("marker") or "",
                text=match.group("text"),
            )
        )
    return found


def marked(page: Path, marker: str) -> Block:
    """The one block of a page with this marker."""
    found = [b for b in blocks(page) if b.marker == marker]
    assert len(found) == 1, f"{page.name}: {len(found)} blocks marked {marker!r}"
    return found[0]
